"""Whole rounds on the runner's engine as a session runs them (runner_rounds: the default and each variant of it,
phases timed, medians after warm-up), the same rounds untimed (untimed_rounds: what the host waits), and where their
time goes: the device's timeline (device_timeline) and the host's functions (host_profile)."""

from __future__ import annotations

import statistics
from pathlib import Path

from ..harness import clock, host_loop_us, median_gap_ms
from .profiler import activity_kinds, profiled_spans, timeline_gaps, timeline_mark


# runner_rounds' ratios of the default round to a variant's: (name, variant, the figure compared)
RATIOS_TO_VARIANTS = (("walk_device_per_host", "host_walk", "round_ms"),
                      ("queue_per_no_queue", "no_queue", "step_wall_ms"),
                      ("draft_ahead_per_not", "not_drafted_ahead", "loop_wall_ms"),
                      ("verify_ahead_per_not", "not_verified_ahead", "loop_wall_ms"),
                      ("launch_ahead_per_not", "not_ahead", "loop_wall_ms"),
                      ("drafter_compiled_per_not", "drafter_uncompiled", "draft"))


def runner_rounds(pair, engine, runner, prompt: list[int], rounds_tokens: int, method: str = "ddtree",
                  tree_scoring: str = "marginal") -> dict:
    """Whole rounds as a session runs them on the runner's engine (phases timed, no records), median of 12 after 2
    warm-up rounds (the drafter's graphs are captured in those); host time apart: the tree phase (top-k to the host,
    best-first build; the selector's scores to the host) + the runner's own host work (inputs, path). The drafter
    (its family's proposer): the static path (CUDA graphs; what a session takes on CUDA), then the same rounds with
    the dynamic one, then with the static one and the acceptance walk on the host (`round_budget_64_host_walk`:
    follow_tree and a staged path, as before the walk on the device; `walk_device_per_host`) and, for DDTree's
    marginal tree, the tree built on the device and on the host whatever the default (`round_budget_64_device_tree`:
    DeviceTree, the runner's inputs written by the device; `round_budget_64_host_tree`: build_tree, launched ahead;
    `tree_device_per_host`, of the loop_wall_ms), and with each round drafting at its start instead of queuing the
    next round's draft before its record's reads (`round_budget_64_no_queue`; `queue_per_no_queue`, of the
    step_wall_ms), and with each verify graph launched after its tree is staged (`round_budget_64_not_ahead`; the
    default launches it ahead: `launch_ahead_per_not`, of the loop_wall_ms), and with the static drafter's pieces
    not compiled (`round_budget_64_drafter_uncompiled`; `drafter_compiled_per_not`, of the draft phase); where
    the runner holds budget 128's trees, DDTree's marginal rounds at 128 too (`round_budget_128`). The default's
    device timeline (device_timeline: idle gaps a round, from a profile). DDTree at budget 64 (`tree_scoring`), or `method` dflash / dflash2 (the chains). Each variant's
    `step_wall_ms` (a phase-timed round from one step's start to the next) and `loop_wall_ms` (untimed_rounds: the
    same session's next rounds without phase timing) are what the host waits."""
    out: dict = {}
    variants = [("round_budget_64", True, "device", {"timeline": True}),
                ("round_budget_64_dynamic_draft", False, "device", {}),
                ("round_budget_64_host_walk", True, "host", {}),
                ("round_budget_64_no_queue", True, "device", {"queue_draft": False}),
                ("round_budget_64_not_drafted_ahead", True, "device", {"draft_ahead": False, "timeline": True}),
                ("round_budget_64_not_verified_ahead", True, "device", {"verify_ahead": False, "timeline": True}),
                ("round_budget_64_not_ahead", True, "device", {"launch_ahead": False}),
                ("round_budget_64_drafter_uncompiled", True, "device", {"drafter_compile": False})]
    if method == "ddtree" and tree_scoring == "marginal":
        variants += [("round_budget_64_device_tree", True, "device", {"tree_on_device": True}),
                     ("round_budget_64_host_tree", True, "device", {"tree_on_device": False})]
        if engine.tree_size >= 129:  # the runner has a slot for budget 128's trees (--budgets 128)
            variants.append(("round_budget_128", True, "device", {"budget": 128, "timeline": True}))
    default_walk = engine.walk
    try:
        for key, static, walk, options in variants:
            engine.walk = walk
            out[key] = _round_variant(pair, engine, runner, prompt, rounds_tokens, method, tree_scoring, static,
                                      **options)
    finally:  # the engine's own walk back, whatever a variant raised
        engine.walk = default_walk
    default = out["round_budget_64"]
    default["draft_dynamic_per_static"] = out["round_budget_64_dynamic_draft"]["draft"] / default["draft"]
    for name, variant, figure in RATIOS_TO_VARIANTS:  # the default round over each variant's, by the figure it moves
        default[name] = default[figure] / out[f"round_budget_64_{variant}"][figure]
    if "round_budget_64_device_tree" in out:  # of what the host waits a round, phases untimed (where they ran)
        device, host = (out[f"round_budget_64_{k}_tree"]["loop_wall_ms"] for k in ("device", "host"))
        default["tree_device_per_host"] = device / host if device and host else None
    return out


def _round_variant(pair, engine, runner, prompt: list[int], rounds_tokens: int, method: str, tree_scoring: str,
                   static: bool, tree_on_device: bool | None = None, queue_draft: bool | None = None,
                   launch_ahead: bool | None = None, drafter_compile: bool | None = None, timeline: bool = False,
                   budget: int = 64, draft_ahead: bool = True, verify_ahead: bool = True) -> dict:
    """One of runner_rounds' variants: 14 rounds on the engine as it is set, the first two warm-up, per-phase
    medians, the host's speed just after them (host_loop_us), the round as the host sees it and the draft path;
    with `timeline`, the device's idle time in the next untimed rounds (device_timeline)."""
    from ...engine.proposers import make_proposer
    from ...engine.session import DecodeSession

    options = {"compile": drafter_compile} if static else {}
    proposer = make_proposer(pair.drafter, pair.target, static=static, **options)
    session = DecodeSession.of(pair, budget=budget, max_new_tokens=rounds_tokens, engine=engine, record=False,
                               time_phases=True, proposer=proposer, method=method, tree_scoring=tree_scoring,
                               tree_on_device=tree_on_device, queue_draft=queue_draft, launch_ahead=launch_ahead,
                               draft_ahead=draft_ahead, verify_ahead=verify_ahead)
    session.prefill(prompt_ids=prompt)
    assert session.cache is runner, "the runner made above has room for these rounds"
    runner.host_ms.clear()
    phases: dict[str, list[float]] = {"draft": [], "tree": [], "verify_commit": [], "host": [], "host_tree": [],
                                      "host_runner": [], "host_draft": []}
    kept, starts = [], []
    for r in range(14):
        starts.append(clock())
        step = session.step()
        t = step.timings_ms
        if r >= 2:  # warm-up rounds (the drafter's graphs are captured in the first two)
            phases["draft"].append(t["draft"])
            phases["tree"].append(t["tree"])
            phases["verify_commit"].append(t["verify"] + t["commit"])
            # the host's own time in a round: the tree's making (on the device: the builder's launch) and the
            # runner's (the verify's inputs and launch, the walk's and the commit's); the next draft's launch apart
            phases["host_tree"].append(session.scheduler.tree_builder.host_ms if session.scheduler.tree_on_device
                                          else t["tree"])
            phases["host_runner"].append(runner.host_ms[-1])
            phases["host"].append(phases["host_tree"][-1] + phases["host_runner"][-1])
            phases["host_draft"].append(getattr(proposer.runner, "host_ms", 0.0))
            kept.append(step.kept)
    out = {k: statistics.median(v) for k, v in phases.items()}
    out["round_ms"] = sum(out[k] for k in ("draft", "tree", "verify_commit"))
    # the host's speed right after the rounds (between them it would be in step_wall_ms)
    out["host_loop_us"] = statistics.median(host_loop_us() for _ in range(12))
    # a round as the host sees it, from one step's start to the next's (what the phases leave out included:
    # the record's reads after the commit)
    out["step_wall_ms"] = median_gap_ms(starts[2:])
    out["loop_wall_ms"] = untimed_rounds(session)
    if timeline:
        out["device_timeline"] = device_timeline(session, loop_wall_ms=out["loop_wall_ms"])
        out["host_profile"] = host_profile(session)
    out.update(draft_path=proposer.path, draft_ahead=session.scheduler.draft_ahead,
               verify_ahead=session.scheduler.verify_ahead, verified_ahead=session.scheduler.verified_ahead,
               queue_error=session.scheduler.queue_error,
               method=method, tree_scoring=tree_scoring, mean_kept=sum(kept) / len(kept),
               draft_capture_s=proposer.runner.capture_s if proposer.runner is not None else None)
    return out


def untimed_rounds(session, rounds: int = 8) -> float | None:
    """The median wall time of a round of `session` with its phases untimed (no records, no waits between the
    phases: the device's walk overlaps the commit with the host's read), from one step's start to the next's, over
    up to `rounds` more rounds (None when fewer than 3 fit in its max new tokens)."""
    session.time_phases = False
    starts = []
    try:
        while len(starts) < rounds and not session.done:
            starts.append(clock())
            session.step()
    finally:
        session.time_phases = True
    return median_gap_ms(starts) if len(starts) >= 3 else None


def host_profile(session, rounds: int = 6, top: int = 20) -> dict:
    """Where the host's time goes in `rounds` more untimed rounds of `session` (cProfile, whose own cost per Python
    call inflates the Python functions' figures): the functions with the most time of their own, µs a round, the
    waits for the device (synchronize, a tensor's read) among them, so the launches' and the Python's cost apart."""
    import cProfile
    import pstats

    if session.done:
        return {"error": "no rounds left in the session"}
    before = len(session.history)
    profile = cProfile.Profile()
    profile.runcall(untimed_rounds, session, rounds)
    n = len(session.history) - before
    if n < 1:
        return {"error": "no round ran"}
    stats = pstats.Stats(profile).stats  # {(file, line, name): (primitive calls, calls, own s, cumulative s, callers)}
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return {"rounds": n, "own_us_per_round": sum(v[2] for v in stats.values()) * 1e6 / n,
            "top": [{"fn": f"{Path(f).name}:{line}:{name}", "calls_per_round": round(v[1] / n, 2),
                     "own_us_per_round": round(v[2] * 1e6 / n, 1), "cum_us_per_round": round(v[3] * 1e6 / n, 1)}
                    for (f, line, name), v in rows]}


def device_timeline(session, rounds: int = 8, loop_wall_ms: float | None = None) -> dict:
    """Issue #31's "gap between rounds on the device's timeline": up to `rounds` more rounds of `session` untimed (as
    untimed_rounds runs them) under torch.profiler's CUDA activity, and from the device's kernels, copies and sets
    its busy time and idle gaps per round (timeline_gaps) and what they are (activity_kinds). The profiler's own cost
    per launch is in the gaps too, so they are an upper bound; `loop_wall_ms` (the same session's unprofiled round)
    minus the busy time is the idle time without it. Two rounds run under the profiler first and are left out: the
    profiler's start (its first launches are slow, and the device runs dry while it starts), then after its wait
    one round that refills what the rounds queue ahead of their read (the next draft, tree and verify: a wait
    drains them, and the device would idle while the host queues them again), so the figures are a steady round's.
    Then the drafter's pass alone (`draft`: the same figures for passes at the session's context, no new rows). On a
    CPU (--smoke) the host's torch ops stand in for the device's activities: the code path, not figures."""
    if session.done:
        return {"error": "no rounds left in the session"}
    counted = []

    def refilled_rounds():  # the warm-up's wait drained what the rounds queue ahead: one round refills it first
        untimed_rounds(session, 1)
        timeline_mark(session.pair.device)  # the counted rounds' device work starts here (queued behind the refill, not waited for)
        counted.append(len(session.history))
        untimed_rounds(session, rounds)

    spans = profiled_spans(refilled_rounds, session.pair.device, warmup=lambda: untimed_rounds(session, 1))
    n = len(session.history) - counted[0] if counted else 0
    if isinstance(spans, str) or n < 3 or not spans:
        return {"error": spans if isinstance(spans, str) else f"{n} rounds, {len(spans)} device events seen"}
    out = {"rounds": n, "device_events": len(spans), **timeline_gaps(spans, n), "kinds": activity_kinds(spans, n)}
    if loop_wall_ms:  # the same rounds' wall time unprofiled: the device's idle time without the profiler's cost
        out["idle_unprofiled_us_per_round"] = (loop_wall_ms - out["busy_ms_per_round"]) * 1e3
    passes = 8
    draft = profiled_spans(lambda: [session.proposer.propose(session.generated[-1], session.committed_len, None,
                                                             session.block_size) for _ in range(passes)],
                           session.pair.device)
    out["draft"] = ({"error": draft} if isinstance(draft, str) else
                    {"passes": passes, "device_events": len(draft), **timeline_gaps(draft, passes, listed=8),
                     "kinds": activity_kinds(draft, passes, top=16)})
    return out

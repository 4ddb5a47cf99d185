"""--ui: the web page's Step at real shapes on the runner (page.actions + page.views through a ModelHost, as
`app.py --engine runner` runs it), its check against the reference, the first Step after a new prompt, a long
session's Step, and the bare round beside them (issue #13's targets)."""

from __future__ import annotations

import statistics
from dataclasses import asdict

import torch

from .config import BenchConfig
from ..harness import clock, phase_medians, timed_call, timer
from .memory import peak_memory_gib
from .models import build_drafter, build_target, pair_of
from .profiler import activity_kinds, profiled_spans, timeline_gaps
from .targets import ui_targets


UI_TEXT = "def area(r):\n    return 3.14159 * r * r\n\n"


def ui_prompt(tokens: int, salt: int = 0) -> str:
    """A text of exactly `tokens` bytes (the bench tokenizer's tokens), different for each salt."""
    text = f"# prompt {salt}\n" + UI_TEXT * (tokens // len(UI_TEXT) + 1)
    return text[:tokens]


@torch.no_grad()
def ui_speed(bench: BenchConfig, layers: int, dtype: torch.dtype, budget: int = 64, prompt_len: int = 600,
             steps: int = 12, long_round: int = 100) -> dict:
    """The web page's Step at real shapes: actions.step (the round, records, trace) + render_views (every view)
    through a ModelHost on the runner engine, as `app.py --engine runner` runs it; the page then checks the
    round against the reference (actions.check + render_check), timed apart. A Step is timed as the page runs it:
    the device is waited for once its views are made (a round queues the next round's draft, which the views'
    making overlaps), so `step_ms` is the host's round and `render_ms` the views and any device work left. Next to
    them: the first Step after a new prompt (in a fresh tab: engines built and CUDA graphs captured; and in a tab
    that has run: its engines kept) against that session's prefill, and the bare round (DecodeSession.step alone,
    no records, as `--fast` times it). Targets (issue #13): a Step <= 1.3x the bare round + 10 ms; the first Step
    after a new prompt <= 2x its prefill. Then the same tab goes on to round `long_round`: the Step there
    (`long_step_ms`, `long_render_ms`, `long_ui_step_ms`: medians of its last 5 Steps), what a long session's
    page costs where the views draw the whole output and every round so far."""
    from ...page import actions
    from ...page.state import TabState, read_settings
    from ...page.views import render_check, render_views

    host, sync, build_s = page_host(bench, layers, dtype, budget)
    pair = host.pair
    block = pair.drafter.block_size
    max_new = (max(steps, long_round) + 4) * block  # room for every round below, however much they accept
    controls = lambda prompt: dict(prompt=prompt, budget=budget, block_size=block, max_new_tokens=max_new,  # noqa: E731
                                   verify="exact", method="ddtree")  # the Step tab's, by name

    def ui_step(tab, prompt):
        """(step ms, render ms) of one page Step: the round shown, the check left for after."""
        s = clock()
        actions.step(host, tab, read_settings(host, controls(prompt)), check=False)
        m = clock()
        render_views(host, tab)
        sync()
        return (m - s) * 1e3, (clock() - m) * 1e3

    def ui_check(tab):
        return timed_call(lambda: render_check(host, actions.check(host, tab)), sync)[1]

    out: dict = {"layers": layers, "dtype": str(dtype).removeprefix("torch."), "budget": budget,
                 "prompt_tokens": prompt_len, "steps": steps, "build_s": build_s, "load_warmup_s": host.warmup_s}
    tab = TabState()
    step_ms, render_ms = ui_step(tab, ui_prompt(prompt_len, 0))  # a fresh tab: engines made, graphs captured
    out["first_step_cold_ms"] = step_ms + render_ms
    out["first_step_cold_prefill_ms"] = tab.session.prefill_ms
    out["first_check_cold_ms"] = ui_check(tab)
    samples: dict[str, list[float]] = {"step": [], "render": [], "ui_step": [], "check": []}
    for _ in range(steps):
        step_ms, render_ms = ui_step(tab, ui_prompt(prompt_len, 0))
        for key, ms in (("step", step_ms), ("render", render_ms), ("ui_step", step_ms + render_ms)):
            samples[key].append(ms)
        samples["check"].append(ui_check(tab))
    out.update(session_figures(tab.session))
    for key, values in samples.items():
        out[f"{key}_ms"] = statistics.median(values)
    out["step_profile"] = step_profile(tab, lambda: ui_step(tab, ui_prompt(prompt_len, 0)))
    out.update(long_steps(tab, ui_step, ui_check, lambda: ui_prompt(prompt_len, 0), long_round))
    out["long_step_profile"] = step_profile(tab, lambda: ui_step(tab, ui_prompt(prompt_len, 0)))

    # a new prompt in the same tab: its engines are kept
    step_ms, render_ms = ui_step(tab, ui_prompt(prompt_len, 1))
    out["first_step_ms"] = step_ms + render_ms
    out["prefill_ms"] = tab.session.prefill_ms
    out["first_check_ms"] = ui_check(tab)
    out.update(against_reference(tab.trace))

    # the independent check (transformers' forward) over the tokens shown, its own time
    s = clock()
    actions.check_transformers(host, tab)
    result, seconds = tab.session.check_transformers()
    out["independent_check"] = {"tokens": len(result.ids), "ms": seconds * 1e3,
                                "agrees": tuple(result.ids) == tuple(tab.session.generated[:len(result.ids)]),
                                "wall_ms": (clock() - s) * 1e3}
    out.update(bare_rounds(pair, budget, max_new, list(ui_prompt(prompt_len, 2).encode()), steps, sync))
    out.update(ui_targets(out))
    if bench.cuda:
        out["peak_memory_GiB"] = peak_memory_gib(bench)
        del pair, host, tab
        torch.cuda.empty_cache()
    return out


def against_reference(trace) -> dict:
    """Whether the tab's output equals its reference, and where it does not, the divergence's token, margin, verdict
    and the measured noise (bf16 at random weights: near-ties, said, never hidden)."""
    out = {"output_identical_to_reference": trace.first_divergence is None and not trace.reference_pending}
    if trace.first_divergence is not None:
        out["divergence"] = {"token": trace.first_divergence, "margin": trace.divergence_margin,
                             "verdict": trace.divergence_verdict, "noise": trace.numerical_noise}
    return out


def long_steps(tab, ui_step, ui_check, prompt, long_round: int, timed: int = 5) -> dict:
    """ui_speed's tab stepped on (each Step checked, as the page does) to round `long_round`, its last `timed` Steps
    timed: medians of the Step, the views and both; {} where the session ended first."""
    samples = []
    while len(tab.trace.steps) < long_round and not tab.session.done:
        samples.append(ui_step(tab, prompt()))
        ui_check(tab)
    if len(tab.trace.steps) < long_round or len(samples) < timed:
        return {}
    step_ms, render_ms = (statistics.median(col) for col in zip(*samples[-timed:]))
    records = tab.session.history[-timed:]  # where the Step's time went: the rounds' phases (device) or the host
    return {"long_round": len(tab.trace.steps), "long_step_ms": step_ms, "long_render_ms": render_ms,
            "long_token_texts": len(tab.trace.token_texts),  # the ids the trace names (random weights: many)
            "long_ui_step_ms": statistics.median(a + b for a, b in samples[-timed:]),
            "long_round_phases_ms": phase_medians(records)}


def step_profile(tab, step) -> dict | str:
    """One more page Step under the profiler: its round's number and lengths (committed tokens, the runner's and the
    drafter's key buckets), the device's busy and idle time (timeline_gaps) and its activities by kind: a long
    session's Step set beside an early one tells the device's growth from the host's."""
    session = tab.session
    spans = profiled_spans(step, session.pair.device)
    if isinstance(spans, str) or not spans:
        return spans or "no device activity"
    runner, drafter = session.target_engine.runner, session.proposer.runner
    return {"round": len(session.history), "committed": int(runner.committed),
            "runner_slots": sorted(str(k) for k in runner._slots),
            "drafter_max_len": getattr(drafter, "max_len", None), "gaps": timeline_gaps(spans, 1, listed=8),
            "kinds": activity_kinds(spans, 1, top=16)}


def page_host(bench: BenchConfig, layers: int, dtype: torch.dtype, budget: int):
    """(a page's ModelHost on the runner engine holding the 27B-shaped pair, its device sync, seconds to build the
    models): what the page's load does (ModelHost._load: the runner's compile and a first round, here at `budget`),
    before any Step."""
    from ...engine.cache import cache_layout
    from ...engine.verify import device_sync
    from ...page.host import ModelHost
    from ...render.cache_view import cache_layout_table

    t0 = clock()
    target = build_target(bench, layers, dtype)
    drafter = build_drafter(bench, target, dtype)
    build_s = clock() - t0
    pair = pair_of(bench, target, drafter, dtype)
    host = ModelHost(None, None, str(dtype).removeprefix("torch."), bench.device, engine="runner")
    host.pair, host.layout, host.stage = pair, cache_layout_table(cache_layout(target, pair.layer_types)), "ready"
    host.warmup_s = host.warm(pair, budget)
    return host, device_sync(target, drafter), build_s


def session_figures(session) -> dict:
    """What ui_speed reports of the page session after its Steps: the rounds' median phases (the first round apart:
    its draft ran the drafter at a new shape first), each round's draft, acceptance, the reference's cost, the
    runner's forms and the drafter's path."""
    records = session.history[1:]
    proposer = session.proposer  # the page's default: the static drafter (CUDA graphs) on one GPU
    return {"round_phases_ms": phase_medians(records),
            "draft_ms_per_round": [r.timings_ms["draft"] for r in session.history],  # steady, or a spike per shape?
            "mean_acceptance": session.mean_acceptance,
            "reference_ms_per_token": session.greedy_seconds * 1e3 / max(1, len(session.generated)),
            "reference": session.reference,
            "runner_options": asdict(session.target_engine.runner.forms),
            "draft_path": proposer.path,
            "draft_capture_s": proposer.runner.capture_s if proposer.runner is not None else None}


def bare_rounds(pair, budget: int, max_new: int, prompt_ids: list[int], steps: int, sync) -> dict:
    """The bare round: DecodeSession.step alone on the runner (phases timed), without records and with them (the tree
    where the session builds it by default, and recorded with the host's tree: `bare_round_recorded_host_tree_ms`);
    the median ms of `steps` rounds after 2 warm-up rounds (graph capture, the drafter's first shapes)."""
    from ...engine.session import DecodeSession

    out = {}
    for key, record, on_device in (("bare_round_ms", False, None), ("bare_round_recorded_ms", True, None),
                                   ("bare_round_recorded_host_tree_ms", True, False)):
        session = DecodeSession.of(pair, budget=budget, max_new_tokens=max_new, engine="runner", record=record,
                                   time_phases=True, tree_on_device=on_device)
        session.prefill(prompt_ids=prompt_ids)
        out[key] = timer(sync)(session.step, repeats=steps, warmup=2)  # warm-up: graph capture, the first shapes
        del session
    return out

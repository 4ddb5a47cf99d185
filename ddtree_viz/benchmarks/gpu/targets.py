"""Every figure against its issue's target, with its ratio and whether it is met: the bf16 runner's (issue #18:
fast_targets; issue #67: round_targets), DFlash2's, the quantized targets' (QUANTIZED_LIMITS, PEAK_LIMIT), exactness's
and the page's (issue #13)."""

from __future__ import annotations

from .config import FORMAT_NAMES


def _target(ms: float, of: float, limit: float, of_name: str) -> dict:
    return {"ms": ms, "ratio": ms / of, "of": of_name, "target": f"<= {limit}x", "met": ms <= limit * of}


def _untargeted(ms: float, of: float, of_name: str) -> dict:
    return {"ms": ms, "ratio": ms / of, "of": of_name, "target": None, "met": None}


def fast_targets(fast: dict, bound_ms: float, draft_ms: float, draft_pass: dict | None = None) -> dict:
    """Issue #18's targets, each figure with its ratio and whether it is met (exactness is added by cli.measure)."""
    step = fast["greedy_step_ms"]
    verify = {row["budget"]: row["verify_ms"] for row in fast["budgets"]}
    rnd = fast["round_budget_64"]
    out = {"greedy_step": _target(step, bound_ms, 1.3, "weight-read bound")}
    for budget, limit in ((64, 1.15), (128, 1.4)):
        if budget in verify:
            out[f"verify_{budget}"] = _target(verify[budget], step, limit, "runner greedy step")
    out["draft_in_round"] = {"ms": rnd["draft"], "ratio": rnd["draft"] / step, "of": "runner greedy step",
                             "target": "<= 3 ms", "met": rnd["draft"] <= 3.0, "path": rnd.get("draft_path"),
                             "isolated_draft_ms": draft_ms,
                             "dynamic_in_round_ms": fast.get("round_budget_64_dynamic_draft", {}).get("draft"),
                             "isolated_static_ms": (draft_pass or {}).get("static_ms"),
                             "isolated_dynamic_ms": (draft_pass or {}).get("dynamic_ms")}
    out["round_64"] = _target(rnd["round_ms"], step, 1.5, "runner greedy step")
    out["host_per_round"] = {"ms": rnd["host"], "target": "< 0.5 ms", "met": rnd["host"] < 0.5}
    prefill = fast["prefill"].get("prefill_2048_ms")
    if prefill is not None:
        out["prefill_2048"] = {"ms": prefill, "target": "<= 400 ms", "met": prefill <= 400.0,
                               "fla_active": fast["prefill"]["kernels"]["fla_active"]}
    if "dflash2" in fast and "error" not in fast["dflash2"]:
        out.update(dflash2_targets(fast["dflash2"], step, rnd, draft_pass))
    out["issue_67"] = round_targets(fast, bound_ms)
    return out


def round_targets(fast: dict, bound_ms: float) -> dict:
    """Issue #67's bf16 targets from the same figures: the greedy step <= 1.12x its bound, verify at 64 <= 1.10x and
    at 128 <= 1.25x the step, the round at budget 64 <= 1.18x and at 128 <= 1.35x, host time in a round <= 0.1 ms,
    the device's stalls <= 50 µs a round (device_timeline: its gaps over 10 µs, the one between rounds among them)."""
    step = fast["greedy_step_ms"]
    verify = {row["budget"]: row["verify_ms"] for row in fast["budgets"]}
    out = {"greedy_step": _target(step, bound_ms, 1.12, "weight-read bound")}
    if "greedy_step_chained_ms" in fast:  # the same step with no read between steps: the device's share of it
        out["greedy_step"].update(chained_ms=fast["greedy_step_chained_ms"],
                                  chained_ratio=fast["greedy_step_chained_per_bound"])
    for budget, limit in ((64, 1.10), (128, 1.25)):
        if budget in verify:
            out[f"verify_{budget}"] = _target(verify[budget], step, limit, "runner greedy step")
    for budget, limit in ((64, 1.18), (128, 1.35)):
        if f"round_budget_{budget}" in fast:
            out[f"round_{budget}"] = _target(fast[f"round_budget_{budget}"]["round_ms"], step, limit, "runner greedy step")
    chained = fast.get("greedy_step_chained_ms")
    for key in ("verify_64", "verify_128", "round_64", "round_128"):  # beside the step chained: its host launch apart (section 27)
        if key in out and chained:
            out[key]["ratio_chained"] = out[key]["ms"] / chained
    host = fast["round_budget_64"]["host"]
    out["host_per_round"] = {"ms": host, "target": "<= 0.1 ms", "met": host <= 0.1,
                             "host_loop_us": fast["round_budget_64"].get("host_loop_us")}
    timeline = fast["round_budget_64"].get("device_timeline", {})
    if "stall_us_per_round" in timeline:  # every stall of a round, the one between rounds among them
        stalls = timeline["stall_us_per_round"]
        out["device_stalls_per_round"] = {"us": stalls, "target": "<= 50 us", "met": stalls <= 50,
                                          "stalls_per_round": timeline["stalls_per_round"],
                                          "spacing_us_per_round": timeline["spacing_us_per_round"],
                                          "idle_unprofiled_us_per_round": timeline.get("idle_unprofiled_us_per_round")}
    return out


def dflash2_targets(d2: dict, step: float, rnd: dict, draft_pass: dict | None) -> dict:
    """Issue #28 item 7's targets, each beside DFlash 1's figure of the same run: the DFlash2 drafter's static pass
    at block 8 <= 3.0 ms (issue #67; DFlash 1's at block 16 beside it), its selector round at budget 64 <= 1.3x the runner's
    greedy step (DFlash 1's marginal round beside it)."""
    passes, sel = d2["drafter_pass"], d2["selector"]["round_budget_64"]
    static = passes.get("static_ms")
    out = {"dflash2_draft_pass": {"ms": static, "target": "<= 3.0 ms", "met": static is not None and static <= 3.0,
                                  "block": d2["block"], "path": passes["contexts"]["512"].get("static", {}).get("path"),
                                  "dynamic_ms": passes.get("dynamic_ms"), "in_round_ms": sel["draft"],
                                  "dflash_static_ms": (draft_pass or {}).get("static_ms"), "dflash_in_round_ms": rnd["draft"]}}
    out["dflash2_round_64"] = {**_target(sel["round_ms"], step, 1.3, "runner greedy step"),
                               "tree_scoring": "selector", "draft_path": sel["draft_path"], "host_ms": sel["host"],
                               "dflash_round_ms": rnd["round_ms"], "dflash_ratio": rnd["round_ms"] / step,
                               "dflash2_chain_round_ms": d2["chain"]["round_budget_64"]["round_ms"]}
    return out


# Issue #67's limits for the quantized targets: the step over its own weight-read bound, verify at budget 64 and a
# whole round at 64 over that step (None: the issue sets none for that format)
QUANTIZED_LIMITS = {"fp8": {"step": 1.25, "verify_64": 1.25, "round_64": 1.35},
                    "int4": {"step": 1.4, "verify_64": None, "round_64": 1.4}}


def quantized_targets(f: dict, weights: str) -> dict:
    """Issue #67's targets from quantized_speed's figures (`weights` "fp8" or "int4", the keys' prefix): FP8's step
    <= 1.25x its own bound, verify at 64 <= 1.25x and a round at 64 <= 1.35x that step, the peak at 4,096 tokens and
    budget 64 <= 36 GB; 4-bit's step <= 1.4x its bound, a round at 64 <= 1.4x its step, the peak of a 4k-context
    session with its drafter <= 22 GiB (a 24 GB card), the 16k-context peak beside it (QUANTIZED_LIMITS,
    PEAK_LIMIT)."""
    name, step, limits = FORMAT_NAMES[weights], f["greedy_step_ms"], QUANTIZED_LIMITS[weights]
    chained = f.get("greedy_step_chained_ms")  # the step with no read between steps: the device's share of it
    out = {f"{weights}_step": {**_target(step, f["weight_read_bound_ms"], limits["step"], f"{name} weight-read bound"),
                               "bf16_step_ms": f["bf16_greedy_step_ms"], "chained_ms": chained,
                               "chained_ratio": chained / f["weight_read_bound_ms"] if chained else None}}
    verify = {row["budget"]: row["verify_ms"] for row in f["budgets"]}
    if 64 in verify:
        out[f"{weights}_verify_64"] = (_target(verify[64], step, limits["verify_64"], f"{name} runner greedy step")
                                       if limits["verify_64"] else _untargeted(verify[64], step, f"{name} runner greedy step"))
    out[f"{weights}_round_64"] = _target(f["round_budget_64"]["round_ms"], step, limits["round_64"],
                                         f"{name} runner greedy step")
    return {**out, **peak_targets(f, weights)}


def peak_targets(f: dict, weights: str) -> dict:
    """The sessions' peaks of quantized_speed's figures (at the 4k and the long context, where measured) against
    PEAK_LIMIT: all a --long-only run has."""
    out = {}
    for key in ("peak_memory", "peak_memory_long"):
        peak = f.get(key)
        if peak is None:
            continue
        out[f"{weights}_{key}"] = {"GB": peak.get("peak_models_alone_GB"), "GiB": peak.get("peak_models_alone_GiB"),
                                   "of": "the two models alone + the session", "raw_peak_GB": peak.get("peak_GB"),
                                   "target": peak["target"], "met": peak.get("met"), "context": peak["context"],
                                   "budget": peak["budget"], "cap_GB": peak.get("cap_GB", f["memory_cap_GB"]),
                                   "card_GB": f.get("card_GB")}
    return out


def exactness_target(results: list[dict]) -> dict:
    """Issue #18's exactness target: the runner's DDTree == its greedy (and its greedy == transformers') in every
    float32 run at real widths."""
    return {"runs": len(results), "identical": sum(r["identical"] for r in results),
            "target": "every fp32 run identical", "met": bool(results) and all(r["identical"] for r in results)}


def ui_targets(out: dict) -> dict:
    """Issue #13's targets from ui_speed's figures: a Step <= 1.3x the bare round + 10 ms; the first Step after a
    new prompt <= 2x its prefill."""
    target_ms = 1.3 * out["bare_round_ms"] + 10
    per_prefill = out["first_step_ms"] / out["prefill_ms"]
    return {"ui_step_target_ms": target_ms, "ui_step_per_bare_round": out["ui_step_ms"] / out["bare_round_ms"],
            "ui_step_target_met": out["ui_step_ms"] <= target_ms, "first_step_per_prefill": per_prefill,
            "first_step_target_met": per_prefill <= 2,
            "first_step_cold_per_prefill": out["first_step_cold_ms"] / out["first_step_cold_prefill_ms"],
            "long_ui_step_per_bare_round": (out["long_ui_step_ms"] / out["bare_round_ms"]
                                            if "long_ui_step_ms" in out else None)}

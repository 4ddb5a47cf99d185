"""--fp8 / --int4 (issue #29 items 2 and 5, and its W4A16): the target with quantized weights made at random on the
runner, under the memory cap of the card it stands for: its own weight-read bound, greedy step, verify, rounds at
budget 64, the peak of a session and each GEMM (quantized_speed); beside bf16 after it is freed, or alone in the
process (--quantized-only: quantized_alone). Each format's GEMMs come from its own module (GEMMS)."""

from __future__ import annotations

import traceback
from dataclasses import asdict

import torch

from .config import BenchConfig
from .fp8 import fp8_gemms
from ..harness import clock, progress, timer
from .harness import copy_bandwidth
from .int4 import int4_gemms
from .memory import (LONG_CONTEXT, PEAK_LIMIT, allocated_gib, free_cuda, live_blocks, memory_cap, model_bytes, peak_gib,
                     quantized_memory_cap, quantized_peak_memory, weight_bytes_of)
from .models import build_drafter, build_quantized_target, pair_of, target_config
from .rounds import runner_rounds
from .runner import bench_runner, greedy_step_chained, greedy_stepper
from .targets import peak_targets, quantized_targets


GEMMS = {"fp8": fp8_gemms, "int4": int4_gemms}  # each format's GEMMs of a layer, timed (QUANTIZED's names)


@torch.no_grad()
def quantized_alone(bench: BenchConfig, layers: int, dtype: torch.dtype, budgets: list[int],
                    saved=lambda part: None) -> dict:
    """--quantized-only: each --fp8 / --int4 target measured with no bf16 target built before it in this process, as
    a user's process holds it (the quantized target, its drafter and the session; and for a device call's time
    limit). The drafter is built against the target's config, bf16, or with --int4-drafter its Linears 4-bit too
    (int4.quantize_linears: the same groups of 128). The trees' shapes come from random log-probs where the bf16
    run drafts them from a prompt's features: a tree's size, not its tokens, sets a verify's cost."""
    from types import SimpleNamespace

    from ...engine.verify import device_sync

    cfg = target_config(bench, layers)
    drafter = build_drafter(bench, SimpleNamespace(config=cfg), dtype)
    if bench.int4_drafter:
        quantize_drafter_int4(drafter)
    sync = device_sync(drafter)
    bandwidth = copy_bandwidth(timer(sync), bench.device, gib=0.25 if bench.smoke else 4.0)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, cfg.vocab_size, (512,), generator=gen).tolist()
    logprobs = torch.log_softmax(4 * torch.randn(drafter.block_size - 1, cfg.vocab_size, generator=gen), -1)
    out: dict = {"copy_bandwidth_TBps": bandwidth / 1e12, "quantized_only": True,
                 "drafter": {"weights": "int4" if bench.int4_drafter else str(dtype).removeprefix("torch."),
                             "GiB": model_bytes(drafter) / 2**30},
                 "fast": {"targets": {}}}
    for weights in bench.quantized:
        args = (layers, dtype, budgets, drafter, prompt, logprobs.to(bench.device), bandwidth,
                {"budgets": [], "greedy_step_ms": None})  # no bf16 figures beside these
        quantized_phase(bench, out["fast"], weights, args, lambda: saved(out))
    return out


def quantized_phase(bench: BenchConfig, fast: dict, weights: str, args: tuple, saved) -> None:
    """One quantized target's figures (quantized_speed_or_error over `args`) into fast[weights] as they come, marked
    "partial" until the phase ends, `saved()` after each of its parts: a run cut by a device call's time limit (an
    interrupt, not an exception) keeps in its report the step, verifies and rounds measured before the cut. Then
    its targets into fast["targets"]."""
    part = fast[weights] = {"partial": True}
    done = quantized_speed_or_error(bench, weights, *args, out=part, saved=saved)
    if "error" not in done:
        done.pop("partial")
        fast["targets"].update(quantized_targets(done, weights) if "greedy_step_ms" in done  # --long-only: no step
                               else peak_targets(done, weights))
    fast[weights] = done
    saved()


def long_context_peak(bench: BenchConfig, pair, weights: str, cap_gb) -> dict:
    """The session's peak at LONG_CONTEXT tokens (twice --fp8-context on a CPU), budget 64, measured uncapped: the
    figure asked for is the peak itself; under the card's cap an out-of-memory says only "more", and the
    allocator's fragmentation after the earlier phases would count against the session. With --long-capped under
    the cap instead (whether a card of that size runs it: best in a process of its own, --quantized-only), the
    allocator's history recorded, so that an out-of-memory says where the memory was (`live_blocks`). The cap
    comes back after."""
    free_cuda(bench)
    context = LONG_CONTEXT if bench.cuda else 2 * bench.fp8_context
    cap = cap_gb if bench.long_capped else None
    memory_cap(bench, cap)
    traced = bench.cuda and cap is not None  # under the cap: where the memory is, should it run out
    if traced:
        torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
    try:
        peak = quantized_peak_memory(bench, pair, context, budget=64, limit=PEAK_LIMIT[weights])
    except torch.OutOfMemoryError as exc:  # a figure of its own: the 4k figures and the GEMMs still count
        peak = {"context": context, "budget": 64, "target": PEAK_LIMIT[weights][1], "met": False,
                "error": f"out of memory: {str(exc).splitlines()[0]}", "peak_GiB": peak_gib(bench),
                "live_blocks": live_blocks(torch.cuda.memory._snapshot()) if traced else None}
        free_cuda(bench)
    finally:
        if traced:
            torch.cuda.memory._record_memory_history(enabled=None)
    peak["cap_GB"] = cap
    memory_cap(bench, cap_gb)
    progress(f"{weights}_peak_memory_long", peak)
    return peak


def long_alone(bench: BenchConfig, pair, weights: str, out: dict, saved) -> dict:
    """--long-only: the long session's peak (long_context_peak, under the cap) and nothing else; the cap lifted."""
    out["peak_memory_long"] = long_context_peak(bench, pair, weights, out["memory_cap_GB"])
    (saved or (lambda: None))()
    memory_cap(bench, None)
    return out


def quantize_drafter_int4(drafter) -> None:
    """--int4-drafter: the drafter's Linears 4-bit, in place (what a 24 GB card holds beside the 4-bit target), as
    a user's --draft-weights int4 makes it (models.quantize_drafter)."""
    from ...engine.models import quantize_drafter

    quantize_drafter(drafter, "int4", next(drafter.parameters()).dtype)


def quantized_speed_or_error(bench: BenchConfig, *args, out: dict | None = None, saved=None) -> dict:
    """quantized_speed, or what broke (traceback on stderr; the cap lifted) beside what it measured before (its
    memory trail among them): the bf16 figures still come back. `out`: the dict it fills as it goes, `saved()`
    called after each of its parts (quantized_speed)."""
    out = {} if out is None else out
    try:
        return quantized_speed(bench, *args, out=out, saved=saved)
    except Exception as exc:  # noqa: BLE001 - e.g. out of memory under the cap: that is a finding, reported
        traceback.print_exc()
        memory_cap(bench, None)
        return {**out, "error": f"{type(exc).__name__}: {str(exc)[:500]}"}


@torch.no_grad()
def quantized_speed(bench: BenchConfig, weights: str, layers: int, dtype: torch.dtype, budgets: list[int], drafter,
                    prompt: list[int], logprobs, bandwidth: float, bf16: dict, out: dict | None = None,
                    saved=None) -> dict:
    """Issue #29 items 2 and 5, after the bf16 target is freed: the same shapes with quantized weights made at
    random (`weights` "fp8" or "int4": build_quantized_target) under the process's memory cap (bench.cap_gb), on the
    runner with the forms of the bf16 run: its weight-read bound (the quantized bytes + scales + the bf16 rest at
    the copy bandwidth measured before), the greedy step, each budget's verify, whole rounds at budget 64 (the same
    bf16 drafter), the peak memory of a session at a `bench.fp8_context`-token prompt and budget 64
    (quantized_peak_memory), for FP8 the GEMMs one by one (fp8_gemms), each beside the bf16 run's figure; the step
    chained and its kernels by kind (greedy_step_chained). `saved()`, where given, after the step, verifies and
    rounds, after each peak and at the end: a run cut by a device call's time limit (an interrupt, not an
    exception) keeps in its report what it measured before the cut."""
    from ...engine.engines import RunnerEngine
    from ...engine.tree import DraftTree
    from ...engine.verify import device_sync

    out = {} if out is None else out
    out.update(quantized_memory_cap(bench, weights, drafter))
    t0 = clock()
    target = build_quantized_target(bench, layers, dtype, weights, trail=out.setdefault("build_trail_GiB", {}))
    out.update(build_s=clock() - t0, build_peak_GiB=peak_gib(bench), weights=weight_bytes_of(target))
    progress(f"{weights}_built", {k: out[k] for k in ("leftover_GiB", "drafter_GiB", "build_trail_GiB",
                                                      "build_peak_GiB", "memory_cap_GB")})
    out["weight_read_bound_ms"] = bound_ms = out["weights"]["bytes"] / bandwidth * 1e3
    sync = device_sync(target, drafter)
    timed = timer(sync)
    pair = pair_of(bench, target, drafter, dtype)
    if bench.long_only and weights == "int4":  # the long session in a process that ran nothing before it
        return long_alone(bench, pair, weights, out, saved)
    root = int(logprobs.argmax(-1)[0])
    sizes = sorted({1, drafter.block_size, *(b + 1 for b in budgets)})
    start = clock()
    runner, out["graphs_error"] = bench_runner(target, len(prompt) + 2048, sizes, drafter.target_layer_ids,
                                               bench.runner_forms())
    trail = out.setdefault("runner_trail_GiB", {})  # allocated after each stage: where a runner's memory goes
    trail["runner"] = allocated_gib(bench)
    logits, _ = runner.prefill(prompt)
    trail["prefill"] = allocated_gib(bench)
    for size in sizes:
        runner.slot_for(size)
        trail[f"slot_{size}"] = allocated_gib(bench)
    out.update(options=asdict(runner.forms), graphs=runner.graphs, compile_error=runner.compile_error,
               capture_s=clock() - start, blas=dict(runner.blas))
    rounds_tokens = 16 * drafter.block_size
    engine = RunnerEngine(target, drafter.target_layer_ids, tree_size=max(sizes), block_size=drafter.block_size,
                          max_new_tokens=rounds_tokens, runner=runner)
    out["greedy_step_ms"] = step = timed(greedy_stepper(engine, int(logits.argmax())), repeats=30)
    out.update(greedy_step_chained(runner, timed, int(logits.argmax())))  # and where the FP8 step's time goes
    bf16_verify = {row["budget"]: row["verify_ms"] for row in bf16["budgets"]}
    out["budgets"] = []
    for budget in budgets:
        tree = DraftTree.from_logprobs(root, logprobs, budget)
        ms = timed(lambda: runner.forward(tree), repeats=20)
        out["budgets"].append({"budget": budget, "positions": len(tree), "verify_ms": ms, "verify_per_step": ms / step,
                               "bf16_verify_ms": bf16_verify.get(budget)})
    out.update(runner_rounds(pair, engine, runner, prompt, rounds_tokens))
    bf16_step = bf16["greedy_step_ms"]  # None with --quantized-only (no bf16 target measured in this process)
    out.update(greedy_step_per_bound=step / bound_ms, bf16_greedy_step_ms=bf16_step,
               greedy_step_vs_bf16=step / bf16_step if bf16_step else None)
    progress(weights, {k: v for k, v in out.items() if k != "blas"})
    save = saved or (lambda: None)
    save()
    del engine, runner
    free_cuda(bench)
    out["peak_memory"] = quantized_peak_memory(bench, pair, bench.fp8_context, budget=64, limit=PEAK_LIMIT[weights])
    progress(f"{weights}_peak_memory", out["peak_memory"])
    save()
    if weights == "int4":  # issue #67: the 4-bit session at a long context too (what a 24 GB card leaves for it)
        out["peak_memory_long"] = long_context_peak(bench, pair, weights, out["memory_cap_GB"])
        save()
    out["gemms"] = GEMMS[weights](bench, target, timer(sync))
    del pair, target
    free_cuda(bench)
    memory_cap(bench, None)
    return out

"""The one timing harness of gpu_bench: every figure it reports is timed here.

A run of fn is timed on the host's clock (time.perf_counter) from its launch to the end of the device's work, waited
for with `sync` (engine.verify.device_sync of the measured models: every CUDA device their weights live on; on a CPU
the wall clock alone). `timed_call` times one run, `samples_ms` repeated runs after warm-up runs, `timer` their median
(what most figures are); `per_call_us` a call inside a CUDA graph of many (launch cost out, as in the runner). Beside
them: the copy bandwidth a weight-read bound divides by, the host's own speed (host_loop_us), the medians of rounds'
phases, and the progress lines that keep each part's figures in the log as they are measured."""

from __future__ import annotations

import json
import statistics
import time
from typing import Any, Callable

import torch

from .config import BenchConfig


def timed_call(fn: Callable[[], Any], sync: Callable[[], None]) -> tuple[Any, float]:
    """(fn()'s result, its milliseconds): from its launch to the end of its device work (`sync` waits for it). The
    device should be idle at the start: the caller syncs first where something may still run."""
    start = time.perf_counter()
    result = fn()
    sync()
    return result, (time.perf_counter() - start) * 1e3


def samples_ms(fn: Callable[[], Any], sync: Callable[[], None], repeats: int, warmup: int = 0) -> list[float]:
    """The milliseconds of `repeats` runs of fn (timed_call each), after `warmup` runs untimed and one wait."""
    for _ in range(warmup):
        fn()
    sync()
    return [timed_call(fn, sync)[1] for _ in range(repeats)]


def timer(sync):
    """``timed(fn, repeats=10, warmup=2)``: the median milliseconds of fn() (samples_ms), each run waited for with
    ``sync`` (``engine.verify.device_sync`` of the measured models: every CUDA device their weights live on)."""

    def timed(fn, repeats: int = 10, warmup: int = 2) -> float:
        return statistics.median(samples_ms(fn, sync, repeats, warmup))

    return timed


def phase_medians(records) -> dict[str, float]:
    """Rounds' timings (StepRecord.timings_ms: draft, tree, verify, commit), the median of each phase."""
    return {k: statistics.median(r.timings_ms[k] for r in records) for k in records[0].timings_ms}


def per_call_us(bench: BenchConfig, timed, calls: int, fn) -> float | str:
    """Microseconds a call of fn: on CUDA `calls` calls captured in one CUDA graph and replayed (launch cost out, as
    in the runner), elsewhere timed eagerly; why, where it cannot run."""
    try:
        if not bench.cuda:
            return round(timed(fn, repeats=5) * 1e3, 2)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        return round(timed(graph.replay, repeats=10) * 1e3 / calls, 2)
    except Exception as exc:  # a form that cannot run here
        return f"{type(exc).__name__}: {str(exc)[:300]}"


def copy_bandwidth(timed, device, gib: float = 4.0) -> float:
    """Bytes read + written per second by a copy on ``device`` (one that ``timed`` waits for)."""
    n = int(gib * 2**30) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src), repeats=10)
    return 2 * n * 2 / (ms / 1e3)


def median_gap_ms(starts: list[float]) -> float:
    """The median milliseconds from one round's start (perf_counter) to the next's."""
    return statistics.median(b - a for a, b in zip(starts, starts[1:])) * 1e3


def host_loop_us() -> float:
    """The host's own speed now: µs for a fixed pure-Python loop (2,000 multiplies and adds). The H200 machines'
    hosts moved it 0.9-1.7x within one process (docs/lab/NOTEBOOK.md section 31), and every host figure (a launch, a
    round's host time) moves with it, so each is reported beside it."""
    start = time.perf_counter()
    sum(i * i for i in range(2000))
    return (time.perf_counter() - start) * 1e6


STARTED = time.perf_counter()  # the script's start, for progress lines' `at_s`


def progress(name: str, figures: dict) -> None:
    """A part's figures on stdout as soon as they are measured (a run stopped by a time limit keeps them), with the
    seconds since the script started (`at_s`: what a device call's time limit leaves for the rest)."""
    print(json.dumps({name: figures, "at_s": round(time.perf_counter() - STARTED, 1)}, default=str), flush=True)

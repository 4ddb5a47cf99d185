"""The one timing harness of the benchmarks (bench, page_bench, gpu_bench): every figure they time is timed here.

A run of fn is timed on the host's clock (time.perf_counter) from its launch to the end of its work, waited for with
`sync` (engine.verify.device_sync of the measured models: every CUDA device their weights live on; on a CPU nothing
to wait for, `no_sync`). `timed_call` times one run, `samples_ms` repeated runs after warm-up runs, `timer` their
median (what most figures are), `median_ms` the median of figures already taken. Beside them: the host's own speed
(host_loop_us), the medians of rounds' phases, the gap between rounds, and the progress lines that keep each part's
figures in the log as they are measured. What only a GPU can time (a call inside a CUDA graph, the copy bandwidth)
is gpu/harness.py's. (page_bench's browser figures are timed in the browser, by performance.now in its scripts:
no Python clock sees the frame that paints.)"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any, Callable


def clock() -> float:
    """The harness's clock, seconds (time.perf_counter: one clock for every process of a machine): for timestamps (a
    round's start, a turn of the model's lock, a click) and spans timed_call cannot wrap. The benchmarks read no
    other (tests/test_structure.py)."""
    return time.perf_counter()


def no_sync() -> None:
    """`sync` where there is no device work to wait for (a CPU, or what runs on the host alone)."""


def median_ms(values) -> float | None:
    """The median of the figures given that were taken (None left out); None when none was."""
    taken = [v for v in values if v is not None]
    return statistics.median(taken) if taken else None


def timed_call(fn: Callable[[], Any], sync: Callable[[], None]) -> tuple[Any, float]:
    """(fn()'s result, its milliseconds): from its launch to the end of its device work (`sync` waits for it). The
    device should be idle at the start: the caller syncs first where something may still run."""
    start = clock()
    result = fn()
    sync()
    return result, (clock() - start) * 1e3


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


def median_gap_ms(starts: list[float]) -> float:
    """The median milliseconds from one round's start (perf_counter) to the next's."""
    return statistics.median(b - a for a, b in zip(starts, starts[1:])) * 1e3


def host_loop_us() -> float:
    """The host's own speed now: µs for a fixed pure-Python loop (2,000 multiplies and adds). The H200 machines'
    hosts moved it 0.9-1.7x within one process (docs/lab/NOTEBOOK.md section 31), and every host figure (a launch, a
    round's host time) moves with it, so each is reported beside it."""
    start = clock()
    sum(i * i for i in range(2000))
    return (clock() - start) * 1e6


STARTED = clock()  # the script's start, for progress lines' `at_s`


def progress(name: str, figures: dict) -> None:
    """A part's figures on stdout as soon as they are measured (a run stopped by a time limit keeps them), with the
    seconds since the script started (`at_s`: what a device call's time limit leaves for the rest)."""
    print(json.dumps({name: figures, "at_s": round(clock() - STARTED, 1)}, default=str), flush=True)

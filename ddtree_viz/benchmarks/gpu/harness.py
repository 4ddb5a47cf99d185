"""What only a GPU can time, over the benchmarks' one harness (benchmarks/harness.py: timed_call, samples_ms, timer's
medians, host_loop_us, the progress lines): `per_call_us`, a call inside a CUDA graph of many (launch cost out, as
in the runner), and `copy_bandwidth`, what a weight-read bound divides by."""

from __future__ import annotations

import torch

from .config import BenchConfig


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

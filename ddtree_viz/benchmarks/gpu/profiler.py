"""The device's timeline through torch.profiler: the activities while a function runs (profiled_spans, cut at a
mark after its warm-up: timeline_mark), their busy time, idle gaps and stalls per round (timeline_gaps) and what they
are by kind (activity_kinds). --no-profiler (PROFILER) leaves every timeline out."""

from __future__ import annotations

import torch


PROFILER = [True]  # --no-profiler: no torch.profiler timelines (kineto crashed a process once: section 38)


TIMELINE_START = "ddtree_viz.timeline_start"  # profiled_spans' mark after its warm-up (on a CPU's timeline)


def on_cuda(device) -> bool:
    """Whether the work profiled runs on a CUDA device (not whether the machine has one: a --smoke run on a GPU's
    machine is a CPU's)."""
    return torch.device(device).type == "cuda"


def timeline_mark(device) -> None:
    """A mark on the profiled timeline (profiled_spans keeps what comes after the last one): for work on CUDA a spin
    kernel of a few cycles queued on the stream (the device's clock, nothing waited for), on a CPU a named host
    range."""
    from torch.profiler import record_function

    if on_cuda(device):
        torch.cuda._sleep(100)
    else:
        with record_function(TIMELINE_START):
            pass


def profiled_spans(fn, device, warmup=None) -> list[tuple[float, float, str]] | str:
    """The device's activities (start µs, end µs, name) while fn() runs under torch.profiler's CUDA activity, the
    device waited for at the end (for work on a CPU, `device`: the host's torch ops); or why not (a profiler that cannot run here,
    or what fn raised). `warmup()`, if given, runs under the profiler first, the device waited for, and its
    activities are left out: those up to the last mark (timeline_mark: one made after the wait, and any fn makes)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    if not PROFILER[0]:
        return "not profiled (--no-profiler)"
    cuda = on_cuda(device)
    kind = DeviceType.CUDA if cuda else DeviceType.CPU
    try:
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            if warmup is not None:
                warmup()
                if cuda:
                    torch.cuda.synchronize()
                timeline_mark(device)
            fn()
            if cuda:
                torch.cuda.synchronize()
        spans = [(e.start_ns() / 1e3, (e.start_ns() + e.duration_ns()) / 1e3, e.name())
                 for e in prof.profiler.kineto_results.events() if e.device_type() == kind]
        if warmup is not None:
            marks = [end for _, end, name in spans if name == TIMELINE_START or "spin_kernel" in name]
            spans = [span for span in spans if not marks or span[0] >= max(marks)]
        return spans
    except Exception as exc:  # say why; the measurements around it come back
        return f"{type(exc).__name__}: {exc}"


def activity_kinds(spans: list[tuple[float, float, str]], rounds: int, top: int = 24) -> list[dict]:
    """The device's activities by kind (their name's first 60 characters), the `top` by time: calls and µs a round,
    what a round's ~1,700 kernels are made of (where fusing would take kernels and their spacing away)."""
    kinds: dict[str, list[float]] = {}
    for start, end, name in spans:
        kind = kinds.setdefault(name[:60], [0, 0.0])
        kind[0] += 1
        kind[1] += end - start
    ranked = sorted(kinds.items(), key=lambda item: -item[1][1])[:top]
    return [{"kind": name, "calls_per_round": calls / rounds, "us_per_round": us / rounds} for name, (calls, us) in ranked]


def timeline_gaps(spans: list[tuple[float, float, str]], rounds: int, stall_us: float = 10.0, listed: int = 24) -> dict:
    """From the device's activities (start µs, end µs, name), over `rounds` rounds: the span from the first start to
    the last end, the busy time (the union of the activities) and the idle time between them, per round; the idle
    split into the spacing of back-to-back kernels (gaps up to `stall_us`: a CUDA graph's kernels start about a
    microsecond apart) and stalls (longer gaps: the device waiting for the host), and the first `listed` stalls in
    timeline order, each with the activity that ends before it and the one that starts after it."""
    spans = sorted(spans)
    busy, gaps = 0.0, []
    seg_start, seg_end, last = spans[0][0], spans[0][1], spans[0][2]
    for start, end, name in spans[1:]:
        if start > seg_end:
            busy += seg_end - seg_start
            gaps.append((start - seg_end, last, name))
            seg_start = start
        if end >= seg_end:
            seg_end, last = end, name
    busy += seg_end - seg_start
    span = seg_end - spans[0][0]
    stalls = [g for g in gaps if g[0] > stall_us]
    return {"span_ms_per_round": span / rounds / 1e3, "busy_ms_per_round": busy / rounds / 1e3,
            "idle_us_per_round": (span - busy) / rounds,
            "spacing_us_per_round": sum(g[0] for g in gaps if g[0] <= stall_us) / rounds,
            "stall_us_per_round": sum(g[0] for g in stalls) / rounds, "stalls_per_round": len(stalls) / rounds,
            "stalls": [{"us": round(us, 1), "after": a[:80], "before": b[:80]} for us, a, b in stalls[:listed]]}

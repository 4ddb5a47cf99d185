"""Programmatic dependent launch (PDL) of the runner's one-row FP8 products and its add + norm launches
(RunnerForms.pdl).

A kernel launched with PDL (Hopper and later; CUDA graphs keep the launch's programmatic edge) may start while the
kernel before it in the stream still runs: its programs become resident as soon as every program of that kernel
has started and said so, and wait in the kernel (griddepcontrol.wait) until it has finished and its writes are
visible. At a greedy step the device then no longer idles between a norm and the product after it, or a product
and the norm after it, while the next kernel is launched and its programs are placed; and the one-row FP8 product
reads its first weight tile before it waits. On H200s at Qwen3.6-27B shapes the FP8 greedy step, chained, went
from 9.51 to 9.34 ms and, on another machine, from 9.69 to 9.52 (docs/lab/NOTEBOOK.md section 35). Launching the
one-step GDN kernel early as well gave 9.49 ms, the product alone without the norms 9.66: only these pairs launch
early. A bf16 runner has no one-row FP8 product; its add + norms launch early all the same.

The rules a kernel launched this way keeps (tests/test_pdl.py checks the outputs bit-equal with and without): it
lets the next kernel launch at its start (gdc_launch_dependents); before its wait it reads nothing but weights
(never written while a pass runs) and writes nothing; everything else comes after the wait, which returns once the
kernel before has finished (and so, through that kernel's own wait, every kernel before it).

The runner turns it on around its passes (`early`); everything else (transformers' forward, a drafter's runner,
the bench's lone products) launches as before.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import torch

CHOICES = ("auto", "on", "off")  # the runner's part "pdl" (runner/options.py PARTS)
_EARLY: ContextVar[bool] = ContextVar("ddtree_viz_pdl", default=False)


def available(device: torch.device) -> bool:
    """Whether kernels can launch early on `device`: a CUDA device of compute capability 9.0 or later (none without
    a GPU, so none in Triton's interpreter)."""
    return (device.type == "cuda" and torch.cuda.is_available()
            and torch.cuda.get_device_capability(device if device.index is not None else None)[0] >= 9)


def resolve(option: str, device: torch.device, triton: bool) -> str:
    """What `option` (the runner's part "pdl") means on `device` (`triton`: Triton imports): "auto" is on where
    kernels can launch early, else off; "on" where they cannot is a ValueError."""
    if option not in CHOICES:
        raise ValueError(f"pdl must be one of {', '.join(CHOICES)}, not {option!r}")
    can = triton and available(device)
    if option == "on" and not can:
        raise ValueError("pdl='on' needs Triton and a CUDA device of compute capability 9.0 or later")
    return "on" if option == "on" or (option == "auto" and can) else "off"


@contextmanager
def early(on: bool):
    """Inside: the kernels that take it launch early (`keywords`), where `on`."""
    token = _EARLY.set(on)
    try:
        yield
    finally:
        _EARLY.reset(token)


def keywords(x: torch.Tensor) -> dict:
    """A launch's extra keywords for a kernel with a `PDL` constexpr: PDL=True and Triton's launch_pdl inside `early`
    on a CUDA tensor, else none (the kernel's default: no PDL, no wait)."""
    return {"PDL": True, "launch_pdl": True} if _EARLY.get() and x.is_cuda else {}

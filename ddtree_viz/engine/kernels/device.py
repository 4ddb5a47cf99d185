"""Where a kernel can run: whether Triton imports, whether its interpreter runs kernels on CPU tensors, and what a
one-launch option ("auto", "torch" or "triton": the runner's parts gdn_step, commit, gdn_prep and norm) means on a
device. Every op's dispatch asks here; nothing here imports Triton.
"""

from __future__ import annotations

import importlib.util
import os

import torch

# gdn_step, commit, gdn_prep and norm (each a piece in one launch, or not): auto is triton on CUDA where Triton imports
ONE_LAUNCH_CHOICES = ("auto", "torch", "triton")


def triton_available() -> bool:
    """Triton importable (CUDA builds of torch ship it; the CPU build and CI do not)."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """TRITON_INTERPRET=1: kernels run on CPU tensors in Triton's interpreter (tests without a GPU)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def triton_runs(device: torch.device) -> bool:
    """Whether a Triton kernel can run on `device`: Triton imports, and the device is CUDA or the interpreter is on."""
    return triton_available() and (device.type == "cuda" or interpreting())


def needs_triton(name: str, option: str, device: torch.device) -> None:
    """A ValueError naming the option where `option` (a Triton form) cannot run on `device`."""
    if not triton_runs(device):
        raise ValueError(f"{name}={option!r} needs Triton and a CUDA device (or TRITON_INTERPRET=1)")


def device_error(exc: BaseException) -> bool:
    """Whether an exception is the device's own: out of memory, or a CUDA error (an illegal address, a launch
    failure: sticky, every later call on the device fails). Such an error must reach the caller: a fallback that
    catches it (compile off, a graph's capture given up for the eager path) only moves the failure to a later call
    that has nothing to do with it."""
    if isinstance(exc, (torch.OutOfMemoryError, torch.AcceleratorError)):
        return True
    return "CUDA error" in str(exc) or "out of memory" in str(exc)


def resolve_step(option: str, device: torch.device, name: str = "gdn_step") -> str:
    """What `option` (a name of ONE_LAUNCH_CHOICES: the runner's part `name`: gdn_step, commit, gdn_prep or norm)
    means on `device`: auto is triton on CUDA where Triton imports, else torch; triton where it cannot run is a
    ValueError."""
    if option not in ONE_LAUNCH_CHOICES:
        raise ValueError(f"{name} must be one of {', '.join(ONE_LAUNCH_CHOICES)}, not {option!r}")
    if option == "auto":
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    if option == "triton":
        needs_triton(name, option, device)
    return option

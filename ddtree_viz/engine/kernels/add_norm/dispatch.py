"""The choice of a layer's residual add and norm (RMSNorm after it; RunnerForms.norm): triton_norm.py's launch
where it takes the model's rows and matches naive.add_rms_norm here, else the torch piece."""

from __future__ import annotations

from typing import Callable

import torch

from ..device import device_error
from .naive import add_rms_norm


def choose_norm(option: str, device: torch.device, dtype: torch.dtype,
                width: int) -> tuple[Callable | None, str | None]:
    """A layer's residual add and norm for a resolved option (device.resolve_step): (triton_norm's launch, None) where
    it takes the model's rows (`width` columns) and gives naive.add_rms_norm's sum and, to a rounding, its norm, on
    three rows of 1,000 columns in the model's dtype; (None, why) where it cannot (the piece runs); (None, None)
    for "torch"."""
    if option != "triton":
        return None, None
    try:
        from .triton_norm import WIDEST, add_rms_norm_triton

        if width > WIDEST:
            return None, f"the add and norm: rows of {width} columns, wider than the launch's {WIDEST}"

        gen = torch.Generator().manual_seed(0)
        x, y = (torch.randn(1, 3, 1000, generator=gen).to(device, dtype) for _ in range(2))
        scale = (1 + 0.1 * torch.randn(1000, generator=gen)).to(device)
        got, want = add_rms_norm_triton(x, y, scale, 1e-6), add_rms_norm(x, y, scale, 1e-6)
        torch.testing.assert_close(got[0], want[0], atol=0, rtol=0)
        torch.testing.assert_close(got[1], want[1])  # the dtype's tolerance: a rounding apart at most
        return add_rms_norm_triton, None
    except Exception as exc:
        if device_error(exc):  # the device's failure, not a form that cannot run here: raised
            raise
        return None, f"the add and norm: {type(exc).__name__}: {str(exc)[:500]}"

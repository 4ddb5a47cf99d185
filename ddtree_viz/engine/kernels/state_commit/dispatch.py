"""The choice of the commit's recurrent update (RunnerForms.commit): triton_commit.py's one launch where it runs
here and matches closed_form.commit_recurrent, else the torch form."""

from __future__ import annotations

from typing import Callable

import torch

from ..device import device_error
from .closed_form import commit_recurrent


def choose_commit(option: str, device: torch.device) -> tuple[Callable | None, str | None]:
    """The commit's recurrent update for a resolved option (device.resolve_step): (triton_commit's kernel, None) where
    it runs here and matches closed_form.commit_recurrent on a small commit (two layers, grouped keys, a path of 3 of
    4 padded steps); (None, why) where it cannot (the torch piece runs); (None, None) for "torch"."""
    if option != "triton":
        return None, None
    try:
        from .triton_commit import commit_recurrent_triton

        gen = torch.Generator().manual_seed(0)
        rec = torch.randn(2, 4, 16, 32, generator=gen).to(device)
        k, g = torch.randn(2, 5, 2, 16, generator=gen).to(device), -torch.rand(2, 5, 4, generator=gen).to(device)
        delta = torch.randn(2, 5, 4, 32, generator=gen).to(device)
        path, steps, length = (torch.tensor(x, device=device) for x in ([0, 2, 3, 3], [0, 1, 2, 3], 3))
        want = rec.clone()
        commit_recurrent(want, k, g, delta, path, steps, length)
        commit_recurrent_triton(rec, k, g, delta, path, steps, length)
        torch.testing.assert_close(rec, want, atol=1e-4, rtol=1e-4)
        return commit_recurrent_triton, None
    except Exception as exc:
        if device_error(exc):  # the device's failure, not a form that cannot run here: raised
            raise
        return None, f"the commit: {type(exc).__name__}: {str(exc)[:500]}"

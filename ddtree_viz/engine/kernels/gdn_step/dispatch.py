"""The choice of the one-node core's and the tree prep's forms (RunnerForms.gdn_step, gdn_prep): triton_step.py's
launch where it runs here and matches its reference (naive.py) on this layer's own weights, else the torch pieces.

`weights` below is a GDN layer's tensors as engine/fused.py's GDNWeights holds them: conv_weight [C, kernel], A_log,
dt_bias [H], norm_weight [V] and dims (key_dim, head_k, head_v, rep, eps). A check that cannot run or differs raises;
`choose_*` turns that into (None, why), since a kernel that cannot run here must not stop the runner.
"""

from __future__ import annotations

import random
from typing import Callable

import torch

from .... import treeops
from ..device import device_error
from .naive import gdn_prep, gdn_step_reference


def prep_keywords(dims: dict) -> dict:
    """gdn_prep_triton's keywords from GDNWeights.dims."""
    return {name: dims[name] for name in ("key_dim", "head_k", "head_v", "rep")}


def held(got, want, dtype: torch.dtype) -> None:
    """A one-launch piece's outputs against the torch form's: within 1e-4 in fp32, a rounding (2e-2) in bf16/fp16."""
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for x, y in zip(got, want):
        torch.testing.assert_close(x.float(), y.float(), atol=tol, rtol=tol)


def check_step(kernel: Callable, device: torch.device, weights) -> None:
    """The one-node core `kernel` against gdn_step_reference on this device, on this layer's weights and random
    inputs at its widths (a root's window: the committed conv inputs and the node's own); raises if it cannot run or
    differs (by more than a rounding of the model's dtype)."""
    w, gen = weights, torch.Generator().manual_seed(0)
    dtype, d = w.conv_weight.dtype, w.dims
    H, (C, kw) = w.A_log.shape[0], w.conv_weight.shape
    u, z, b, a = (torch.randn(1, n, generator=gen).to(device, dtype) for n in (C, H * d["head_v"], H, H))
    conv_state = torch.randn(C, kw, generator=gen).to(device, dtype)
    state = torch.randn(H, d["head_k"], d["head_v"], generator=gen).to(device)
    gather = torch.arange(1, kw + 1, device=device)[None]  # a root's window
    args = (u, z, b, a, conv_state, state, gather, w.conv_weight, w.A_log, w.dt_bias, w.norm_weight)
    got = kernel(*args, **d)
    want = list(gdn_step_reference(*args, **d))
    want[1] = want[1][:, :: d["rep"]]  # k at its key heads
    held(got, want, dtype)


def check_prep(kernel: Callable, device: torch.device, weights) -> None:
    """A tree's prep `kernel` against gdn_prep (q, k at their key heads) on this layer's weights and random inputs
    over a random 9-node tree's conv windows; raises if it cannot run or differs by more than a rounding of the
    model's dtype."""
    w, gen, rng = weights, torch.Generator().manual_seed(0), random.Random(0)
    dtype, d = w.conv_weight.dtype, w.dims
    H, (C, kw) = w.A_log.shape[0], w.conv_weight.shape
    parents = treeops.check_parents([-1] + [rng.randrange(i) for i in range(1, 9)])
    gather = torch.from_numpy(treeops.conv_gather(parents, treeops.depths_of(parents), kw)).to(device)
    u, b, a = (torch.randn(9, n, generator=gen).to(device, dtype) for n in (C, H, H))
    conv_state = torch.randn(C, kw, generator=gen).to(device, dtype)
    got = kernel(u, b, a, conv_state, gather, w.conv_weight, w.A_log, w.dt_bias, **prep_keywords(d))
    want = gdn_prep(u, b, a, conv_state, w.conv_weight, gather, w.A_log, w.dt_bias, d["key_dim"], d["head_k"],
                    d["head_v"], 1)
    held(got, want, dtype)


def _checked(name: str, check: Callable, device: torch.device, weights, what: str):
    try:
        from . import triton_step

        kernel = getattr(triton_step, name)
        check(kernel, device, weights)
        return kernel, None
    except Exception as exc:
        if device_error(exc):  # the device's failure, not a form that cannot run here: raised
            raise
        return None, f"{what}: {type(exc).__name__}: {str(exc)[:500]}"


def choose_step(option: str, device: torch.device, weights) -> tuple[Callable | None, str | None]:
    """The one-node core for a resolved option (device.resolve_step): (gdn_step_triton, None) where it runs here and
    passes check_step; (None, why) where it does not (the torch pieces run); (None, None) for "torch"."""
    if option != "triton":
        return None, None
    return _checked("gdn_step_triton", check_step, device, weights, "the one-node step")


def choose_prep(option: str, device: torch.device, weights) -> tuple[Callable | None, str | None]:
    """A tree's prep for a resolved option, as choose_step: (gdn_prep_triton, None), (None, why) or (None, None)."""
    if option != "triton":
        return None, None
    return _checked("gdn_prep_triton", check_prep, device, weights, "the tree's prep")

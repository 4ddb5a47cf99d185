"""The one-node form of the tree delta rule: one token of the gated delta rule (a greedy step, T = 1).

The same function runs eagerly and inside torch.compile (engine/fused.py's gdn_core); only the lowering of its
two matrix-vector products differs: einsums (BLAS) when eager, so a CPU's numbers stay what they were, and
reductions when compiled, which inductor fuses with the decay (a few kernels, no state copy).
"""

from __future__ import annotations

import torch


def _contract(state: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """sum over K of state [H, K, V] * x [H, K] -> [H, V]."""
    if torch.compiler.is_compiling():
        return (state * x[:, :, None]).sum(1)
    return torch.einsum("hkv,hk->hv", state, x)


def delta_rule_step(q, k, v, g, beta, state):
    """One token of the gated delta rule (q, k [1, H, K], v [1, H, V], g, beta [1, H], state [H, K, V], fp32): the
    output [1, H, V] and delta [1, H, V], without touching the state (the commit applies S' = e^g S + k delta^T)."""
    decayed = state * g[0].exp()[:, None, None]  # [H, K, V]
    delta = beta[0][:, None] * (v[0] - _contract(decayed, k[0]))
    out = _contract(decayed, q[0]) + (q[0] * k[0]).sum(-1, keepdim=True) * delta
    return out[None], delta[None]

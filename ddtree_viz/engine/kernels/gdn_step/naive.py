"""A GDN layer's pieces between its projections and out_proj, in torch: the reference the one-launch kernels of
triton_step.py are held to, and the torch form the runner runs (eagerly on a CPU, through torch.compile on CUDA:
engine/fused.py's Pieces). Each is a pure function of tensors and numbers.

    tree_conv        the causal conv where each node's window follows its parent chain, then SiLU
    l2norm           q and k's normalisation
    gdn_prep         tree conv, l2 norms, gates: q, k, v, g, beta for the delta rule (gdn_prep_triton's reference)
    delta_rule_step  one token of the gated delta rule (T = 1: a greedy step)
    gated_norm       the gated RMSNorm after the rule (transformers' Qwen3_5RMSNormGated)
    gdn_step_reference  the one-node core: gdn_prep, delta_rule_step, gated_norm (gdn_step_triton's reference)

delta_rule_step runs eagerly and inside torch.compile alike; only the lowering of its two matrix-vector products
differs: einsums (BLAS) when eager, so a CPU's numbers stay what they were, and reductions when compiled, which
inductor fuses with the decay (a few kernels, no state copy). Shapes: docs/ARCHITECTURE.md's letters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def tree_conv(u: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, gather: torch.Tensor) -> torch.Tensor:
    """Depthwise causal conv where each node's window follows its parent chain, then SiLU.

    u: [T, C] raw conv inputs; conv_state: [C, kernel] committed raw inputs (oldest first); weight: [C, kernel];
    gather: [T, kernel] (positions in cat(conv_state^T, u): engine/gdn_tree.py's TreeIndex.conv_gather). Time-major
    throughout: the windows are whole rows of cat(conv_state^T, u), gathered along dim 0."""
    n, kernel = gather.shape
    ext = torch.cat([conv_state.t().to(weight.dtype), u.to(weight.dtype)])  # [kernel + T, C]
    windows = ext.index_select(0, gather.view(-1)).view(n, kernel, -1)  # [T, kernel, C]
    out = (windows * weight.t()).sum(1)  # [T, C]
    return F.silu(out).to(u.dtype)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gdn_prep(u, b, a, conv_state, conv_weight, gather, A_log, dt_bias, key_dim: int, head_k: int, head_v: int,
             rep: int):
    """engine/gdn_tree.py's gdn_inputs between the projections and the delta rule: tree conv, l2 norms, gates. u
    [T, C], b, a [T, H]; conv_state, conv_weight [C, kernel]; gather [T, kernel]. Returns q, k [T, H, K], v [T, H, V],
    g, beta [T, H], all fp32 (q and k repeated to the value heads where rep > 1; rep = 1 keeps the Hk key heads)."""
    n = u.shape[0]
    mixed = tree_conv(u, conv_state, conv_weight, gather)
    qk = l2norm(mixed[:, : 2 * key_dim].reshape(n, 2, -1, head_k).float())  # queries, keys: [T, 2, Hk, K]
    v = mixed[:, 2 * key_dim :].reshape(n, -1, head_v).float()
    q, k = qk[:, 0] / (head_k**0.5), qk[:, 1]
    beta = b.sigmoid().float()
    g = (-A_log.float().exp() * F.softplus(a.float() + dt_bias)).float()
    if rep > 1:
        q, k = q.repeat_interleave(rep, dim=1), k.repeat_interleave(rep, dim=1)
    return q, k, v, g, beta


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


def gated_norm(core, z, norm_weight, head_v: int, eps: float):
    """transformers' Qwen3_5RMSNormGated (engine/gdn_tree.py's gdn_output before out_proj): normalise in fp32, scale
    in the model's dtype, gate by SiLU(z) in fp32. core [T, H, V] fp32, z [T, H*V] -> [T, H*V] in z's dtype."""
    n = core.shape[0]
    x = core.to(z.dtype).reshape(-1, head_v).float()
    x = norm_weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(z.dtype)
    return (x * F.silu(z.reshape(-1, head_v).float())).to(z.dtype).reshape(n, -1)


def gdn_step_reference(u, z, b, a, conv_state, state, gather, conv_weight, A_log, dt_bias, norm_weight, *,
                       key_dim: int, head_k: int, head_v: int, rep: int, eps: float):
    """The one-node core in torch, with gdn_step_triton's arguments: u [1, C], z [1, H*V], b, a [1, H]; conv_state
    [C, kernel]; state [H, K, V] fp32 (read only); gather [1, kernel]. Returns (o [1, H*V] in z's dtype, k [1, H, K]
    (repeated to the value heads), g [1, H], delta [1, H, V])."""
    q, k, v, g, beta = gdn_prep(u, b, a, conv_state, conv_weight, gather, A_log, dt_bias, key_dim, head_k, head_v, rep)
    core, delta = delta_rule_step(q, k, v, g, beta, state)
    return gated_norm(core, z, norm_weight, head_v, eps), k, g, delta

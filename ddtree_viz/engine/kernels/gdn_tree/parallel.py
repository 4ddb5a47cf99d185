"""The parallel torch form of the tree delta rule: every node of a tree at once (batched GEMMs, one solve).

With G_n = g_n + G_p(n) (path sum of g over the node's ancestors-or-self) and the ancestor mask M, per value head
(naive.py's recurrence, solved for all nodes together):

    (I + A) delta = beta * (v - exp(G) K S_c),   A[i, j] = beta_i exp(G_i - G_j) k_i.k_j  (j strict ancestor of i)
    O = exp(G) Q S_c + (M * exp(G_i - G_j) * Q K^T) delta

Nodes are numbered parents first, so A is strictly lower triangular: one unit-triangular solve. The state after
any node a (used to commit the accepted path) is

    S_a = exp(G_a) S_c + sum_{j in path(a)} exp(G_a - G_j) k_j delta_j^T.

The form is split where a GPU takes over: `tree_delta_rule_parts` (all parallel work) then `tree_solve` (the
sequential part, which triton_solve.py does in Triton). Shapes: docs/ARCHITECTURE.md's letters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TreeMasks:
    """The per-tree tensors every GDN layer of one pass shares (built once per pass)."""

    anc_float: torch.Tensor  # [T, T] fp32 ancestor-or-self
    off_path: torch.Tensor  # [T, T] fp32: 0 on the path (ancestor-or-self), -inf elsewhere

    @classmethod
    def of(cls, ancestors: torch.Tensor) -> "TreeMasks":
        anc = ancestors.to(torch.float32)
        return cls(anc, torch.zeros_like(anc).masked_fill_(~ancestors, float("-inf")))


def tree_delta_rule(q, k, v, g, beta, state, ancestors, masks: TreeMasks | None = None):
    """Parallel tree form. q, k: [T, H, K] (or [T, Hk, K]: see tree_delta_rule_parts); v: [T, H, V]; g, beta: [T, H];
    state: [H, K, V]; all fp32; ancestors: [T, T] bool. `masks` (TreeMasks.of(ancestors)) may be passed in to share
    it between layers.

    Returns the outputs o [T, H, V] and delta [T, H, V] (enough to rebuild the state after any node)."""
    m = masks if masks is not None else TreeMasks.of(ancestors)
    return tree_delta_rule_masked(q, k, v, g, beta, state, m.anc_float, m.off_path)


def tree_delta_rule_masked(q, k, v, g, beta, state, anc_float, off_path):
    """`tree_delta_rule` on the two mask tensors of TreeMasks (tensors only: the form torch.compile takes)."""
    return tree_solve(*tree_delta_rule_parts(q, k, v, g, beta, state, anc_float, off_path))


def tree_delta_rule_parts(q, k, v, g, beta, state, anc_float, off_path):
    """The parallel part of the tree form (batched GEMMs and elementwise work): the system and the output's pieces,

        A    [H, T, T]  beta_i exp(G_i - G_j) k_i.k_j on the path (strictly lower once the solve reads it)
        Qd   [H, T, T]  exp(G_i - G_j) q_i.k_j on the path (ancestor-or-self)
        rhs  [H, T, V]  beta * (v - exp(G) K S_c)
        base [H, T, V]  exp(G) Q S_c

    so that (I + A) delta = rhs and o = base + Qd delta (`tree_solve`, or triton_solve.py on a GPU).
    q, k may keep their Hk key heads ([T, Hk, K], Hk dividing H; value heads h*rep .. h*rep+rep-1 share key head
    h): q.k and k.k are then computed once per key head, and q S_c, k S_c as one GEMM per key head over its value
    heads' states side by side (the same numbers as with repeated heads: bitwise on an H200, 5-13 us less a layer)."""
    n, Hk, K = q.shape
    H, V = v.shape[1], v.shape[2]
    rep = H // Hk
    G = (anc_float @ g).t()  # [H, T] path sums
    qk = torch.cat([q, k], dim=0).transpose(0, 1)  # [Hk, 2T, K] head-major: queries then keys
    vh, bh = v.transpose(0, 1), beta.t()
    decay = (G[:, :, None] - G[:, None, :] + off_path).exp()  # [H, T, T] exp(G_i - G_j) on the path, 0 off it
    dots = qk @ qk[:, n:].transpose(1, 2)  # [Hk, 2T, T]: q.k and k.k
    if rep == 1:
        proj = qk @ state  # [H, 2T, V]: q S_c and k S_c
    else:
        dots = dots.repeat_interleave(rep, dim=0)  # [H, 2T, T]
        side = state.view(Hk, rep, K, V).transpose(1, 2).reshape(Hk, K, rep * V)  # [Hk, K, rep V]
        proj = (qk @ side).view(Hk, 2 * n, rep, V).transpose(1, 2).reshape(H, 2 * n, V)
    # [H, T, T] lower triangular (decay is 0 off the path); the solve reads the strict lower part only
    A = bh[:, :, None] * dots[:, n:] * decay
    eG = G.exp()[:, :, None]
    rhs = bh[:, :, None] * (vh - eG * proj[:, n:])
    return A, dots[:, :n] * decay, rhs, eG * proj[:, :n]


def tree_solve(A, Qd, rhs, base):
    """(I + A) delta = rhs (A's strict lower part; nodes parents first, so one unit-triangular solve), o = base +
    Qd delta. Shapes as `tree_delta_rule_parts` gives them; returns o, delta [T, H, V]."""
    delta = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    out = base + Qd @ delta
    return out.transpose(0, 1), delta.transpose(0, 1)


def solve_steps(anc_float: torch.Tensor) -> torch.Tensor:
    """The level-by-level solve's repetitions for a tree (triton_solve.py): its depth - 1, counted on the device from
    the ancestor-or-self mask [T, T] (a node's row sums to its depth + 1). [] int32, at least 0."""
    return (anc_float.sum(1).amax() - 2).clamp(min=0).to(torch.int32)


def state_after(path: list[int], k, g, delta, state) -> torch.Tensor:
    """State after the chain `path` (root first) from the committed `state`, using delta from tree_delta_rule.
    k: [T, H, K]; g: [T, H]; delta: [T, H, V]; state: [H, K, V] -> [H, K, V]."""
    idx = torch.tensor(path, dtype=torch.long, device=k.device)
    G = g.index_select(0, idx).cumsum(0)  # [P, H]
    w = (G[-1] - G).exp()  # [P, H]  exp(G_a - G_j)
    kp = k.index_select(0, idx) * w[:, :, None]  # [P, H, K]
    grown = torch.bmm(kp.permute(1, 2, 0), delta.index_select(0, idx).transpose(0, 1))  # [H, K, V]: sum_j k_j delta_j^T
    return grown.addcmul_(G[-1].exp()[:, None, None], state)

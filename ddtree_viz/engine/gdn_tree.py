"""Tree-exact Gated DeltaNet: every tree node sees exactly its own root-to-node path.

Per value head, with the committed state S_c (K x V, fp32) and per-token q, k (L2-normalised, q scaled by
K^-1/2), v, g (log decay, <= 0) and beta, a chain runs

    S_t = exp(g_t) S_{t-1};  delta_t = beta_t (v_t - S_t^T k_t);  S_t += k_t delta_t^T;  o_t = S_t^T q_t.

On a tree the previous state is the *parent's*: S_n = step(S_p(n)), S_p(root) = S_c. The conv window of a
node is (u_n, u_p(n), u_p(p(n)), ...) continuing into the committed conv-state columns past the root.

Two forms live here and are tested against each other and against transformers' own layer:
- `tree_delta_rule_reference`: walk each node's path and run the recurrence, slow and obviously correct.
- `tree_delta_rule`: the parallel form. With G_n = g_n + G_p(n) (path sum of g) and the ancestor mask M,
      (I + A) delta = beta * (v - exp(G) K S_c),   A[i, j] = beta_i exp(G_i - G_j) k_i.k_j  (j strict ancestor of i)
      O = exp(G) Q S_c + (M * exp(G_i - G_j) * Q K^T) delta
  Nodes are numbered parents first, so A is strictly lower triangular: one unit-triangular solve.
  The state after any node a (used to commit the accepted path) is
      S_a = exp(G_a) S_c + sum_{j in path(a)} exp(G_a - G_j) k_j delta_j^T.

Dimension letters: the project's one legend (docs/ARCHITECTURE.md repeats it), used in every shape comment.
    T   tree positions of one verify pass (root first, parents before children)
    P   positions of one path, root first (the accepted path)
    H   value heads of a GDN layer (q and k are repeated from Hk key heads to H)
    Hk  key heads of a GDN layer, before that repeat
    K   key head dim;  V  value head dim
    C   conv channels of a GDN layer: q, k and v before the split (2 Hk K + H V)
    D   the target's hidden size
    L   decoder layers: Lg GDN layers, La attention layers
    F   drafter context features (the hidden states of its target layers, concatenated)
    B   batch, always 1 where it appears (transformers' cache tensors, hidden states)
Other sizes are spelled out: kernel (conv width), vocab, max_len, kv_heads, head_dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import treeops

# ----------------------------------------------------------------------------------------------------------
# Tree indexing
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TreeIndex:
    """Index tensors for one tree on one device, shared by every GDN layer of a pass."""

    parents: tuple[int, ...]
    ancestors: torch.Tensor  # [T, T] bool, ancestor-or-self
    conv_gather: torch.Tensor  # [T, kernel] long: time positions in (committed conv inputs, u) forming each window
    masks: TreeMasks | None = None  # the delta rule's masks (None: built per call)

    @classmethod
    def build(cls, parents: tuple[int, ...] | list[int], kernel: int, device) -> "TreeIndex":
        parents = treeops.check_parents(parents)
        anc = torch.from_numpy(treeops.ancestor_matrix(parents)).to(device)
        gather = treeops.conv_gather(parents, treeops.depths_of(parents), kernel)
        return cls(parents, anc, torch.from_numpy(gather).to(device), TreeMasks.of(anc))


# ----------------------------------------------------------------------------------------------------------
# Causal conv along parent chains
# ----------------------------------------------------------------------------------------------------------


def tree_conv(u: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, gather: torch.Tensor) -> torch.Tensor:
    """Depthwise causal conv where each node's window follows its parent chain, then SiLU.

    u: [T, C] raw conv inputs; conv_state: [C, kernel] committed raw inputs (oldest first); weight: [C, kernel].
    Time-major throughout: the windows are whole rows of cat(conv_state^T, u), gathered along dim 0."""
    n, kernel = gather.shape
    ext = torch.cat([conv_state.t().to(weight.dtype), u.to(weight.dtype)])  # [kernel + T, C]
    windows = ext.index_select(0, gather.view(-1)).view(n, kernel, -1)  # [T, kernel, C]
    out = (windows * weight.t()).sum(1)  # [T, C]
    return F.silu(out).to(u.dtype)


def tree_conv_reference(u: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, parents) -> torch.Tensor:
    """Per node: gather the window by walking parent pointers, then F.conv1d on it. Shapes as tree_conv."""
    kernel = weight.shape[1]
    outs = []
    for pos in range(u.shape[0]):
        chain, node = [], pos
        while node >= 0 and len(chain) < kernel:
            chain.append(u[node])
            node = parents[node]
        window = [conv_state[:, kernel - 1 - i] for i in range(kernel - len(chain))][::-1] + chain[::-1]
        x = torch.stack(window, dim=1).to(weight.dtype)  # [C, kernel] oldest first
        y = F.conv1d(x[None], weight[:, None, :], groups=x.shape[0])[0, :, -1]
        outs.append(F.silu(y).to(u.dtype))
    return torch.stack(outs)


def path_conv_state(u: torch.Tensor, conv_state: torch.Tensor, gather_row: torch.Tensor) -> torch.Tensor:
    """The conv state after committing the path ending at a node: the last `kernel` raw inputs along it.
    u: [T, C]; conv_state: [C, kernel]; gather_row: [kernel] (one row of TreeIndex.conv_gather) -> [C, kernel]."""
    ext = torch.cat([conv_state, u.to(conv_state.dtype).t()], dim=1)
    return ext.index_select(1, gather_row)


# ----------------------------------------------------------------------------------------------------------
# Gated delta rule over a tree
# ----------------------------------------------------------------------------------------------------------


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
    """Parallel tree form. q, k: [T, H, K]; v: [T, H, V]; g, beta: [T, H]; state: [H, K, V]; all fp32.
    `masks` (TreeMasks.of(ancestors)) may be passed in to share it between layers.

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

    so that (I + A) delta = rhs and o = base + Qd delta (`tree_solve`, or kernels/tree_solve.py on a GPU).
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
    """The level-by-level solve's repetitions for a tree (kernels/tree_solve.py): its depth - 1, counted on the
    device from the ancestor-or-self mask [T, T] (a node's row sums to its depth + 1). [] int32, at least 0."""
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


def tree_delta_rule_reference(q, k, v, g, beta, state, parents):
    """Per node: run the gated delta rule along its own root-to-node path. Returns o [T, H, V]."""
    outs = []
    for pos in range(q.shape[0]):
        path, node = [], pos
        while node >= 0:
            path.append(node)
            node = parents[node]
        s = state.clone()
        for t in reversed(path):
            s = s * g[t].exp()[:, None, None]
            delta = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", s, k[t]))
            s = s + k[t][:, :, None] * delta[:, None, :]
        outs.append(torch.einsum("hkv,hk->hv", s, q[pos]))
    return torch.stack(outs)


def replay_state(path: list[int], k, v, g, beta, state) -> torch.Tensor:
    """The recurrence itself along `path`: the obviously-correct twin of `state_after`. Shapes as there -> [H, K, V]."""
    s = state.clone()
    for t in path:
        s = s * g[t].exp()[:, None, None]
        delta = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", s, k[t]))
        s = s + k[t][:, :, None] * delta[:, None, :]
    return s


# ----------------------------------------------------------------------------------------------------------
# A whole Gated DeltaNet layer (transformers' Qwen3_5GatedDeltaNet weights) over a tree
# ----------------------------------------------------------------------------------------------------------


@dataclass
class GDNTreeStash:
    """What the verify pass keeps per GDN layer so the commit needs no new projections."""

    u: torch.Tensor  # [T, C] raw conv inputs
    k: torch.Tensor  # [T, H, K] fp32, normalised
    v: torch.Tensor  # [T, H, V] fp32
    g: torch.Tensor  # [T, H] fp32
    beta: torch.Tensor  # [T, H] fp32
    delta: torch.Tensor | None  # [T, H, V] fp32 (fast form only)


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gdn_inputs(layer, hidden: torch.Tensor, conv_state: torch.Tensor, index: TreeIndex | None, parents,
               projections=None, repeat_heads: bool = True):
    """Projections + tree conv + the per-token q, k, v, g, beta exactly as transformers computes them.

    hidden: [T, D] (batch of one, already normed). `projections`: (u, z, b, a) already computed (the static
    runner's fused GEMM, engine/fused.py), else the layer's four projections run here. Returns (u [T, C],
    z [T, H, V], q, k [T, H, K], v [T, H, V], g, beta [T, H]) with q/k/v/g/beta fp32; with repeat_heads=False
    q and k keep their Hk key heads ([T, Hk, K], for a consumer that reads grouped heads in place)."""
    n = hidden.shape[0]
    if projections is None:
        projections = (layer.in_proj_qkv(hidden), layer.in_proj_z(hidden), layer.in_proj_b(hidden),
                       layer.in_proj_a(hidden))
    u, z, b, a = projections  # u: [T, C]
    z = z.reshape(n, -1, layer.head_v_dim)
    weight = layer.conv1d.weight.squeeze(1)
    if index is not None:
        mixed = tree_conv(u, conv_state, weight, index.conv_gather)
    else:
        mixed = tree_conv_reference(u, conv_state, weight, parents)
    qk = mixed[:, : 2 * layer.key_dim].reshape(n, 2, -1, layer.head_k_dim).float()  # queries, keys: [T, 2, Hk, K]
    qk = _l2norm(qk)
    value = mixed[:, 2 * layer.key_dim :].reshape(n, -1, layer.head_v_dim)
    q, k = qk[:, 0] / (layer.head_k_dim**0.5), qk[:, 1]
    beta = b.sigmoid()
    g = -layer.A_log.float().exp() * F.softplus(a.float() + layer.dt_bias)
    rep = layer.num_v_heads // layer.num_k_heads
    if rep > 1 and repeat_heads:  # grouped value heads: each key head serves `rep` consecutive value heads
        q = q.repeat_interleave(rep, dim=1)
        k = k.repeat_interleave(rep, dim=1)
    return u, z, q, k, value.float(), g.float(), beta.float()


def gdn_output(layer, core: torch.Tensor, z: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Gated RMSNorm with z, then out_proj. core, z: [T, H, V] (core fp32) -> [T, D]."""
    n = core.shape[0]
    core = core.to(dtype).reshape(-1, layer.head_v_dim)
    out = layer.norm(core, z.reshape(-1, layer.head_v_dim)).reshape(n, -1)
    return layer.out_proj(out)


def tree_gdn_forward(layer, hidden, conv_state, recurrent_state, index: TreeIndex):
    """Fast tree-exact GDN layer. hidden: [B=1, T, D]; conv_state: [B=1, C, kernel]; recurrent_state:
    [B=1, H, K, V]. Returns (output [B=1, T, D], stash). The cache itself is not touched."""
    x = hidden[0]
    u, z, q, k, v, g, beta = gdn_inputs(layer, x, conv_state[0], index, None)
    core, delta = tree_delta_rule(q, k, v, g, beta, recurrent_state[0].float(), index.ancestors, index.masks)
    out = gdn_output(layer, core, z, hidden.dtype)
    return out[None], GDNTreeStash(u, k, v, g, beta, delta)


def tree_gdn_forward_reference(layer, hidden, conv_state, recurrent_state, parents):
    """Slow tree-exact GDN layer: windows by parent walking, recurrence along each node's path. Shapes as
    tree_gdn_forward."""
    x = hidden[0]
    u, z, q, k, v, g, beta = gdn_inputs(layer, x, conv_state[0], None, parents)
    core = tree_delta_rule_reference(q, k, v, g, beta, recurrent_state[0].float(), parents)
    out = gdn_output(layer, core, z, hidden.dtype)
    return out[None], GDNTreeStash(u, k, v, g, beta, None)


def commit_gdn_state(stash: GDNTreeStash, path: list[int], conv_state, recurrent_state, index: TreeIndex):
    """New (conv_state, recurrent_state) after committing the accepted `path` (P tree positions, root first).
    conv_state: [B=1, C, kernel]; recurrent_state: [B=1, H, K, V]; both returned in the same shapes and dtypes."""
    last = path[-1]
    new_conv = path_conv_state(stash.u, conv_state[0], index.conv_gather[last])[None]
    if stash.delta is not None:
        new_rec = state_after(path, stash.k, stash.g, stash.delta, recurrent_state[0].float())
    else:
        new_rec = replay_state(path, stash.k, stash.v, stash.g, stash.beta, recurrent_state[0].float())
    return new_conv.to(conv_state.dtype), new_rec[None].to(recurrent_state.dtype)

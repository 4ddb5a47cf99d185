"""Tree-exact Gated DeltaNet layers: every tree node sees exactly its own root-to-node path.

The layer around the tree delta rule (whose forms live in engine/kernels/gdn_tree/): the tree's index (ancestor mask,
conv windows), the causal conv along parent chains (a node's window is (u_n, u_p(n), u_p(p(n)), ...) continuing
into the committed conv-state columns past the root), a whole GDN layer of transformers' weights over a tree
(`tree_gdn_forward`, with the parallel delta rule; `tree_gdn_forward_reference`, with the per-path recurrence),
and the commit of an accepted path's conv and recurrent state. verify.py swaps these layers into transformers'
forward; the static runner uses the index (the conv, the norms and gates are engine/kernels/gdn_step/naive.py's
pieces, imported here and by engine/fused.py).

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
from .kernels.gdn_step.naive import l2norm, tree_conv
from .kernels.gdn_tree.naive import replay_state, tree_delta_rule_reference
from .kernels.gdn_tree.parallel import TreeMasks, state_after, tree_delta_rule

# ----------------------------------------------------------------------------------------------------------
# Tree indexing
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TreeIndex:
    """Index tensors for one tree on one device, shared by every GDN layer of a pass."""

    parents: tuple[int, ...]
    ancestors: torch.Tensor  # [T, T] bool, ancestor-or-self
    conv_gather: torch.Tensor  # [T, kernel] long: time positions in (committed conv inputs, u) forming each window
    masks: TreeMasks | None = None  # the parallel delta rule's masks (None: built per call)

    @classmethod
    def build(cls, parents: tuple[int, ...] | list[int], kernel: int, device) -> "TreeIndex":
        parents = treeops.check_parents(parents)
        anc = torch.from_numpy(treeops.ancestor_matrix(parents)).to(device)
        gather = treeops.conv_gather(parents, treeops.depths_of(parents), kernel)
        return cls(parents, anc, torch.from_numpy(gather).to(device), TreeMasks.of(anc))


# ----------------------------------------------------------------------------------------------------------
# Causal conv along parent chains (tree_conv itself, the fast form: kernels/gdn_step/naive.py)
# ----------------------------------------------------------------------------------------------------------


def tree_conv_reference(u: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, parents) -> torch.Tensor:
    """Per node: gather the window by walking parent pointers, then F.conv1d on it. Shapes as tree_conv's."""
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


def gdn_inputs(layer, hidden: torch.Tensor, conv_state: torch.Tensor, index: TreeIndex | None, parents):
    """Projections + tree conv (by the index's windows, or by walking `parents` when index is None) + the per-token
    q, k, v, g, beta exactly as transformers computes them (kernels/gdn_step/naive.py's gdn_prep is its pure twin, for
    the static runner). hidden: [T, D] (batch of one, already normed). Returns (u [T, C], z [T, H, V], q, k [T, H, K],
    v [T, H, V], g, beta [T, H]) with q/k/v/g/beta fp32."""
    n = hidden.shape[0]
    u, z, b, a = (layer.in_proj_qkv(hidden), layer.in_proj_z(hidden), layer.in_proj_b(hidden), layer.in_proj_a(hidden))
    z = z.reshape(n, -1, layer.head_v_dim)
    weight = layer.conv1d.weight.squeeze(1)
    if index is not None:
        mixed = tree_conv(u, conv_state, weight, index.conv_gather)
    else:
        mixed = tree_conv_reference(u, conv_state, weight, parents)
    qk = mixed[:, : 2 * layer.key_dim].reshape(n, 2, -1, layer.head_k_dim).float()  # queries, keys: [T, 2, Hk, K]
    qk = l2norm(qk)
    value = mixed[:, 2 * layer.key_dim :].reshape(n, -1, layer.head_v_dim)
    q, k = qk[:, 0] / (layer.head_k_dim**0.5), qk[:, 1]
    beta = b.sigmoid()
    g = -layer.A_log.float().exp() * F.softplus(a.float() + layer.dt_bias)
    rep = layer.num_v_heads // layer.num_k_heads
    if rep > 1:  # grouped value heads: each key head serves `rep` consecutive value heads
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

"""The runner's layers: what a CUDA graph captures, each layer kind written once from engine/fused.py's pure
pieces (compiled or not: `Pieces`, gpt-fast's habit, one function either way).

    forward(slot):  tokens [T], positions [T], ancestor mask [T, T], conv windows [T, kernel]
                    -> logits [T, vocab] (fp32), the drafter's context features [T, F] and the GDN layers' stash.
                    Attention rows of the tree are written at committed .. committed+T-1 and each row sees the
                    committed prefix plus its ancestors, over the slot's length bucket; GDN layers run the tree
                    delta rule's form (gdn_forms.py, over kernels/gdn_tree/) and leave the state untouched (their
                    per-node k, g, delta and raw conv inputs are the stash, for the commit).
    commit(slot):   attention rows moved into place, every GDN layer's recurrent state advanced along the path at
                    once (closed form of kernels/gdn_tree/parallel.state_after) and its conv window taken at the path's
                    last node; committed += length, on the device.
    walk(slot):     the target's choices [T] -> the accepted path, its length and the bonus token
                    (tree.follow_on_device over the staged tree), written into the commit's inputs on the device.

StaticModel holds what the pieces read of each layer (taken once, by layer position) and the forms chosen for
this runner (autotune.Forms); the state it reads and writes is buffers.State.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...errors import ModelLoadError
from .. import fused as fz
from ..kernels import pdl
from ..fused import ATTENTION_PROJECTIONS, GDN_PROJECTIONS, MLP_PROJECTIONS, GDNWeights, Pieces, fuse_linears
from ..tree import follow_on_device
from ..weights.plain import FusedLinear
from .buffers import Slot, State

# the norms the pieces compute (zero-centred RMSNorm: x / rms(x) * (1 + w), the scale precomputed in fp32)
NORM_KINDS = ("Qwen3_5RMSNorm", "Qwen3_5TextRMSNorm", "Qwen3_5MoeRMSNorm")


def gate_up(fused: FusedLinear, x: torch.Tensor, form: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The MLP's gate and up projections of x [..., T, D] from their fused weight (GATE_UP_FORMS): one GEMM, one GEMM
    per half of the weight (its rows: views, no copy), or one GEMM over x's rows padded with zeros to a multiple of
    16 (the padding's outputs dropped). The same products; the kernels cuBLAS picks differ by shape."""
    if form == "split":
        rows = fused.sizes[0]
        return F.linear(x, fused.weight[:rows]), F.linear(x, fused.weight[rows:])
    if form == "padded":
        T = x.shape[-2]
        y = F.linear(F.pad(x, (0, 0, 0, -T % 16)), fused.weight)
        return y[..., :T, :].split(fused.sizes, dim=-1)
    return fused(x)


class StaticModel:
    """The target's layers over the runner's static state: forward, commit and walk of a slot (the module
    docstring). `pieces` is replaced by uncompiled ones where the compiled are refused; `gate_up_form` is set per
    capture by autotune.Tuner."""

    def __init__(self, target, layers, gdn: dict, state: State, forms, *, fused: bool, attention: str, pdl_on: bool,
                 pieces: Pieces, gate_up_form: str, feature_layer_ids: list[int], max_path: int, max_len: int):
        self.target, self.layers, self.state = target, layers, state
        self.rule, self.commit_kernel, self.norm_kernel = forms.rule, forms.commit, forms.norm
        self.attention, self.pdl_on, self.pieces, self.gate_up_form = attention, pdl_on, pieces, gate_up_form
        self.feature_layer_ids, self.max_path = feature_layer_ids, max_path
        self.cols = torch.arange(max_len, device=state.committed_t.device)
        self.steps = torch.arange(max_path, device=state.committed_t.device)
        self._layer_weights(gdn, fused)

    def _layer_weights(self, gdn, fused: bool) -> None:
        """What the pieces read of each layer, taken once: the norms (`norms`), each GDN layer's weights, whether an
        MLP's activation is SiLU, and the fused projections (None where a group is not fusable, e.g. a MoE block's
        MLP). Kept by layer position, not module identity, so that a deep copy of the runner (a forked session's)
        reads its own."""
        norms = {(len(self.layers), "input"): self.target.model.norm}  # the final norm: the input norm of "layer L"
        for i, layer in enumerate(self.layers):
            norms[i, "input"], norms[i, "post"] = layer.input_layernorm, layer.post_attention_layernorm
            if i not in gdn:
                norms[i, "q"], norms[i, "k"] = layer.self_attn.q_norm, layer.self_attn.k_norm
        odd = sorted({type(m).__name__ for m in norms.values() if type(m).__name__ not in NORM_KINDS})
        if odd:
            raise ModelLoadError(f"the static runner is written for Qwen3.5 hybrid targets: norms {', '.join(odd)}")
        # (layer, input | post | q | k) -> (scale, eps): Qwen3.5's zero-centred RMSNorm scales by 1 + w, in fp32
        self.norms = {key: (1.0 + m.weight.detach().float(), m.eps) for key, m in norms.items()}
        self.gdn_weights = {i: GDNWeights.of(m) for i, m in gdn.items()}
        self.silu = {i: type(getattr(layer.mlp, "act_fn", None)).__name__ in ("SiLUActivation", "SiLU")
                     for i, layer in enumerate(self.layers)}
        self.fused: dict[tuple[int, str], object] = {}
        if fused:
            for i, layer in enumerate(self.layers):
                mixer = (layer.linear_attn, GDN_PROJECTIONS) if i in gdn else (layer.self_attn, ATTENTION_PROJECTIONS)
                self.fused[i, "mixer"] = fuse_linears(*mixer)
                self.fused[i, "mlp"] = fuse_linears(layer.mlp, MLP_PROJECTIONS)

    def forward(self, slot: Slot):
        """_pass, its one-row FP8 products and add + norm launches launched early where RunnerForms.pdl is on."""
        with pdl.early(self.pdl_on):
            return self._pass(slot)

    def _pass(self, slot: Slot):
        """One pass over the slot's tree (what a CUDA graph captures): (logits [T, vocab] fp32, features [T, F] or
        None, the GDN layers' stash for the commit: u [Lg, T, C], k, g, delta [Lg, T, H, .]). Each layer's closing
        residual add is one piece with the next norm."""
        T, p, s = slot.size, self.pieces, self.state
        x = self.target.get_input_embeddings()(slot.ids)[None]  # [1, T, D]
        cos, sin = self.target.model.rotary_emb(x, slot.pos.view(1, 1, T).expand(3, 1, T))
        tree_cols, mask = self._attention_mask(slot)
        gdn_core = self.rule.at(slot.anc, p)  # the tree delta rule's core for this pass, shared by every GDN layer
        p.mark(x, 1, cos, 1, sin, 1, mask, 2, mask, 3)
        feats, stash = {}, []
        h = p(fz.rms_norm)(x, *self.norms[0, "input"])
        for i, layer in enumerate(self.layers):
            if i in s.conv:
                out, parts = self._gdn(i, layer.linear_attn, h, slot.gather, gdn_core)
                stash.append(parts)
            else:
                out = self._attention(i, layer.self_attn, h, cos, sin, mask, tree_cols, slot.cols)
            x, h = self._add_norm(x, out, self.norms[i, "post"])
            x, h = self._add_norm(x, self._mlp(i, layer.mlp, h), self.norms[i + 1, "input"])  # L: the final norm
            if i in self.feature_layer_ids:
                feats[i] = x[0]
        logits = self.target.get_output_embeddings()(h)[0].float()
        features = torch.cat([feats[i] for i in self.feature_layer_ids], dim=-1) if feats else None
        stacked = tuple(torch.stack(parts) for parts in zip(*stash))  # u [Lg, T, C], k, g, delta [Lg, T, H, .]
        return logits, features, stacked

    def _attention_mask(self, slot: Slot):
        """(the tree's cache rows [T], mask [1, 1, rep*T, cols]): one row per (query head of a KV group, node), the
        committed prefix plus the node's ancestors; eager wants True = not attended, SDPA True = attended."""
        committed_t = self.state.committed_t
        cols = self.cols[: slot.cols]
        tree_cols = committed_t + cols[: slot.size]
        visible = (cols < committed_t)[None].expand(slot.size, slot.cols).clone()
        visible.index_copy_(1, tree_cols, slot.anc)
        mask = (visible if self.attention == "sdpa" else ~visible).repeat(self.state.rep, 1)[None, None]
        return tree_cols, mask

    def _add_norm(self, x, y, norm):
        """A residual add and the norm after it (`norm`: (scale, eps) of `norms`): (x + y, norm(x + y)), in one
        launch where RunnerForms.norm is triton (kernels/add_norm/triton_norm.py), else the piece."""
        if self.norm_kernel is not None:
            return self.norm_kernel(x, y, *norm)
        return self.pieces(fz.add_rms_norm)(x, y, *norm)

    def _gdn(self, i, gdn, h, gather, core):
        """One GDN layer: its projections (one GEMM where fused), the pass's core (gdn_forms.py: conv,
        gates, the tree delta rule, gated norm), out_proj. h [1, T, D] -> ([1, T, D], its stash (u, k, g, delta))."""
        x = h[0]
        fused = self.fused.get((i, "mixer"))
        u, z, b, a = fused(x) if fused is not None else (gdn.in_proj_qkv(x), gdn.in_proj_z(x), gdn.in_proj_b(x),
                                                          gdn.in_proj_a(x))
        self.pieces.mark(u, 0, z, 0, b, 0, a, 0, gather, 0)
        o, k, g, delta = core(u, z, b, a, self.state.conv[i], self.state.rec[i], gather, self.gdn_weights[i])
        return gdn.out_proj(o)[None], (u, k, g, delta)

    def _attention(self, i, attn, h, cos, sin, mask, tree_cols, n_cols):
        """Gated attention over the length bucket: projections, the q/k norms + rope + gate split (a piece), the
        cache write, scores and softmax (a piece) or SDPA, the output gate (a piece), o_proj. Grouped heads without
        copying K/V: query heads h*rep .. h*rep+rep-1 share KV head h. Plain matmuls and an fp32 softmax over the
        static cache: a fused SDPA kernel with a mask costs ~0.13 ms per layer here. mask: as _attention_mask's."""
        p = self.pieces
        fused = self.fused.get((i, "mixer"))
        qg, k, v = fused(h) if fused is not None else (attn.q_proj(h), attn.k_proj(h), attn.v_proj(h))
        keys, values = self.state.keys[i], self.state.values[i]
        kvh = keys.shape[1]
        p.mark(qg, 1, k, 1, v, 1)
        (q_scale, q_eps), (k_scale, k_eps) = self.norms[i, "q"], self.norms[i, "k"]
        q, k, v, gate = p(fz.attention_prep)(qg, k, v, q_scale, k_scale, q_eps, k_eps, cos, sin, attn.head_dim, kvh)
        keys.index_copy_(2, tree_cols, k.to(keys.dtype))
        values.index_copy_(2, tree_cols, v.to(values.dtype))
        keys, values = keys[:, :, :n_cols], values[:, :, :n_cols]
        if self.attention == "sdpa":
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=attn.scaling)
        else:
            scores = q @ keys.transpose(-1, -2)
            p.mark(scores, 2, scores, 3)
            o = p(fz.masked_softmax)(scores, mask, attn.scaling) @ values
        p.mark(o, 2, gate, 1)
        return attn.o_proj(p(fz.gate_heads)(o, gate, kvh * self.state.rep))

    def _mlp(self, i, mlp, x):
        """The MLP: gate and up in one GEMM where fused, SiLU * up a piece; the module itself where not fusable."""
        fused = self.fused.get((i, "mlp"))
        if fused is None:
            return mlp(x)
        gate, up = gate_up(fused, x, self.gate_up_form) if isinstance(fused, FusedLinear) else fused(x)
        if not self.silu[i]:
            return mlp.down_proj(mlp.act_fn(gate) * up)
        self.pieces.mark(gate, 1, up, 1)
        return mlp.down_proj(self.pieces(fz.silu_mul)(gate, up))

    def commit(self, slot: Slot) -> None:
        """The accepted path's attention rows moved into place and every GDN layer's state advanced along it (one
        piece, fused.commit_state; or the recurrent states by triton_commit's launch and the conv windows a piece);
        committed += length, on the device."""
        s = self.state
        c = s.committed_t
        src, dst = c + slot.path, c + self.steps
        for buf in (s.keys_all, s.values_all):  # every attention layer at once
            buf.index_copy_(2, dst, buf.index_select(2, src))
        u, k, g, delta = slot.out[2]  # every GDN layer at once: [Lg, T, ...]
        self.pieces.mark(u, 1, k, 1, g, 1, delta, 1, slot.gather, 0)
        if self.commit_kernel is not None:  # the recurrent states in one launch, the conv windows a piece
            self.commit_kernel(s.rec_all, k, g, delta, slot.path, self.steps, slot.length)
            self.pieces(fz.commit_conv)(s.conv_all, u, slot.gather, slot.last)
        else:
            self.pieces(fz.commit_state)(s.rec_all, s.conv_all, u, k, g, delta, slot.path, self.steps,
                                         slot.length, slot.gather, slot.last)
        c.add_(slot.length)

    def walk(self, slot: Slot) -> None:
        """The acceptance walk over the staged tree and the target's choices (tree.follow_on_device) into commit_in,
        and with the bonus token into walk_out, on the device."""
        walk, bonus = follow_on_device(slot.parents, slot.pos - slot.pos[0], slot.ids, slot.choice, self.max_path)
        slot.commit_in.copy_(walk)
        slot.walk_out[:-1].copy_(walk)
        slot.walk_out[-1:].copy_(bonus[None])

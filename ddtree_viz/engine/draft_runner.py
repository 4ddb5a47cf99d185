"""The drafter's static path: preallocated K/V, one shape-static draft function, CUDA graphs on a GPU.

The dynamic drafter (drafter.py, DFlashDrafter.forward with a DraftKVCache) is the reference: each round it
concatenates the new context rows onto every layer's cache, cuts sliding layers back to their window and builds
masks for whatever length that leaves. Every shape changes every round, so nothing can be captured, and at
Qwen3.6-27B shapes the eager pass costs 6-12 ms a round against a weight-read bound near 1.5 ms. StaticDrafter
keeps the same arithmetic over fixed shapes:

    keys / values   [layers, kv_heads, max_len, head_dim]: row r holds the context position r (the proposer's
                    context positions are 0, 1, 2, ...), post-norm, post-RoPE, as the dynamic cache holds them
    draft(P, L, K)  the round's new context features (padded to P rows; padding rows are zero and masked out),
                    the block [root, MASK * (L-1)] -> log-probs [L-1, vocab] fp32. Inside: the noise embedding
                    (the target's embeddings), fc + hidden_norm of the new rows, every layer with the new rows' and
                    the block's K/V written at their positions (index_copy_ by position), attention over the first
                    K rows (a length bucket, K >= committed + L), drafter norm, the target's lm_head over the
                    drafted positions, log_softmax; then the family's extra outputs (drafter.extra_outputs:
                    DFlash2's candidate selector: top-K ids, unary, root and pair scores and their conditionals). A
                    family's layer changes (DFlash2's convolutions around each sublayer, over the block only) come
                    through the layer's hooks (attention_input, attention_output, mlp_block), the ones its dynamic
                    forward uses.

The mask is built on the device from positions, layer by layer kind, exactly as the dynamic drafter's: a key
is visible when it is a committed context row or a row of this block, and, for a causal layer, not ahead of the
query; for a sliding layer, less than `window` positions back (and ahead, when not causal). A sliding layer
therefore sees the same keys as the dynamic one that evicted the rows outside its window: eviction drops only
rows no later block can see. Padding rows (past committed + L) are masked, and the next round overwrites them
(and the block's rows) with its own context rows before anything can see them.

Inputs live in preallocated device tensors, filled before a replay: the new rows' features (copied on the
device) and, in one host-to-device copy from a (pinned, on CUDA) staging buffer, the block's token ids [root,
MASK...], `start` (the first new row's position) and `committed` (context rows once they are in).
On CUDA one graph is captured per (P, L, K) on first use, all in one memory pool; elsewhere (`graphs=False`, the
CPU) the same function runs eagerly, so the CPU tests exercise it. A round whose new rows exceed P (the first
round after a prefill, when the prompt's rows arrive at once) has all but its last P rows' K/V written first,
CONTEXT_CHUNK rows at a time (_write_context: a row's K/V depend on that row alone), then runs the padded
function on the last P rows as any round does: a 16k-token prompt never makes activations of 16k rows.

Dimension letters: P = padded new context rows, L = block length (root + drafted depths), K = key length
bucket, F = context feature width, H = hidden size, V = vocabulary.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .backends import sdpa_backends
from .drafter import DFlashDecoderLayer, apply_rope, qwen3_rms_norm, rope_cos_sin
from .fused import Pieces, compiler_failure, silu_mul

ATTENTION_KINDS = ("eager", "sdpa")
# context rows a pass of the context writer projects at once (_write_context): a 16k-token prompt's first round
# then holds a chunk's activations (under 100 MB at Qwen3.6-27B's widths), not the prompt's (~1 GB, in allocations of up
# to 320 MiB that a 24 GB card's fragmented memory could not place: docs/lab/NOTEBOOK.md section 51)
CONTEXT_CHUNK = 2048


def static_blocker(drafter, target) -> str | None:
    """Why the static path cannot run this drafter (None when it can): it needs the drafter, the target's input
    embeddings and its lm_head whole on one device, with no dispatch hooks."""
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    if embed is None or head is None:
        return "the target has no input embeddings or no lm_head"
    if any(getattr(m, "_hf_hook", None) is not None for mod in (drafter, embed, head) for m in mod.modules()):
        return "the drafter, the embeddings or the lm_head are dispatched by a device_map (hooks)"
    devices = {p.device for mod in (drafter, embed, head) for p in mod.parameters()}
    if len(devices) != 1:
        return f"the drafter, the embeddings and the lm_head are on several devices ({sorted(map(str, devices))})"
    if next(iter(devices)).type == "meta":
        return "the drafter's weights are on the meta device"
    return None


# -- the pieces: the small kernels between the GEMMs as functions of tensors and numbers (fused.Pieces: through
# torch.compile with `compile`, by default where the graphs run on CUDA; as they are otherwise; the same arithmetic
# as the drafter's modules, tests/test_draft_runner.py)

def qk_prep(q, k, q_weight, k_weight, q_eps: float, k_eps: float, cos, sin, heads: int, kv_heads: int,
            head_dim: int):
    """Queries and keys as attention reads them: q [1, L, heads * d] (the block's), k [1, N, kv_heads * d] (the new
    context rows, then the block's) -> each head's RMSNorm, [1, heads, L, d] / [1, kv_heads, N, d], RoPE (cos / sin
    [1, 1, N, d]; the queries at the last L positions)."""
    L, N = q.shape[1], k.shape[1]
    q = qwen3_rms_norm(q.view(1, L, heads, head_dim), q_weight, q_eps).transpose(1, 2)
    return apply_rope(q, cos[:, :, N - L:], sin[:, :, N - L:]), k_prep(k, k_weight, k_eps, cos, sin, kv_heads, head_dim)


def k_prep(k, k_weight, k_eps: float, cos, sin, kv_heads: int, head_dim: int):
    """Keys as attention reads them: k [1, N, kv_heads * d] -> each head's RMSNorm, [1, kv_heads, N, d], RoPE."""
    k = qwen3_rms_norm(k.view(1, k.shape[1], kv_heads, head_dim), k_weight, k_eps).transpose(1, 2)
    return apply_rope(k, cos, sin)


def attention_probs(scores, mask, scale: float, dtype: torch.dtype):
    """fp32 scores [.., K] -> the softmax over the visible keys (mask True) of the scaled scores, in `dtype`."""
    return (scores * scale).masked_fill(~mask, float("-inf")).softmax(-1).to(dtype)


def add_norm(x, y, weight, eps: float):
    """A residual add and the RMSNorm after it: (x + y, norm(x + y))."""
    x = x + y
    return x, qwen3_rms_norm(x, weight, eps)


def plain_layers(drafter) -> bool:
    """Whether every layer is DFlash's own (no family hooks, SiLU MLP): their norms and MLP can run as pieces, each
    residual add fused with the norm after it."""
    hooks = ("attention_input", "attention_output", "mlp_block")
    own = all(getattr(type(layer), h) is getattr(DFlashDecoderLayer, h) for layer in drafter.layers for h in hooks)
    return own and drafter.config.hidden_act in ("silu", "swish")


def length_buckets(max_len: int) -> list[int]:
    """Key lengths a pass attends over: powers of two from 256 up to max_len, and max_len."""
    return sorted({min(max_len, 2 ** k) for k in range(8, max(9, max_len.bit_length() + 1))})


@dataclass
class _Slot:
    """One captured shape: P padded new rows, block length L, key bucket K; its output buffer and its graph."""

    pad: int
    block: int
    cols: int
    out: tuple[torch.Tensor, ...] | None = None
    graph: object = None


def context_cache_shape(config, max_len: int) -> tuple[int, int, int, int]:
    """The static drafter's keys (and values) for contexts of up to `max_len` rows, rounded up to 256: [layers,
    KV heads, rows, head_dim] (the memory plan reads it too)."""
    rows = -(-int(max_len) // 256) * 256
    return (config.num_hidden_layers, config.num_key_value_heads, rows, config.head_dim)


class StaticDrafter:
    """Preallocated drafter state for one proposer (one sequence at a time) and the static draft function.

    `max_len` rows of K/V per layer; `ensure(n)` rebuilds the buffers larger (the rows written so far copied,
    the graphs dropped) when a sequence needs more. `graphs` None: on CUDA; `compile` None: where the graphs are."""

    def __init__(self, drafter, target, *, max_len: int, graphs: bool | None = None, attention: str = "eager",
                 compile: bool | None = None):
        blocker = static_blocker(drafter, target)
        if blocker is not None:
            raise ValueError(f"the static drafter cannot run here: {blocker}")
        if attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION_KINDS)}, not {attention!r}")
        self.drafter, self.target = drafter, target
        self.embed, self.lm_head = target.get_input_embeddings(), target.get_output_embeddings()
        c = drafter.config
        self.config = c
        self.device, self.dtype = drafter.activations
        self.graphs = (self.device.type == "cuda") if graphs is None else bool(graphs)
        self.attention = attention
        # the pieces compiled (None: where the graphs run on CUDA; a compiler that cannot run turns it off, _pass)
        self.pieces = Pieces(self.graphs and self.device.type == "cuda" if compile is None else bool(compile))
        self.compile_error: str | None = None  # why compile was turned off (_pass), where it was
        self.plain = plain_layers(drafter)
        self.n_layers, self.n_heads, self.n_kv, self.head_dim = (c.num_hidden_layers, c.num_attention_heads,
                                                                 c.num_key_value_heads, c.head_dim)
        self.rep = self.n_heads // self.n_kv  # query heads per KV head
        self.mask_token_id = int(c.mask_token_id)
        # layers of one kind (causal, window) share a mask
        self.kinds = list(zip(c.layer_causal, c.layer_windows))
        self.length = 0  # context rows written: positions 0 .. length-1
        self.unsettled = False  # a queued draft's context length not yet known on the host (draft_queued)
        self.capture_s = 0.0  # time spent capturing graphs so far
        self.eager_passes = 0  # passes run eagerly (graphs off)
        self.replays = 0
        self.host_ms = 0.0  # the host's time in the last draft (its inputs' copies, the graph's launch or the pass)
        self._alloc(int(max_len))
        self._feats: dict[int, torch.Tensor] = {}  # P -> [P, F] new rows (zero padding)
        # L -> [L + 2] int64 on the device: the block's ids (root, then MASK), start, committed; and its host
        # staging buffer (pinned on CUDA) with the event after its last copy
        self._block: dict[int, tuple] = {}

    def _alloc(self, max_len: int) -> None:
        shape = context_cache_shape(self.config, max_len)
        self.max_len = shape[2]
        self.keys = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.values = torch.zeros_like(self.keys)
        self._cols = torch.arange(self.max_len, device=self.device)
        self.buckets = length_buckets(self.max_len)
        self._slots: dict[tuple[int, int, int], _Slot] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.graphs else None

    def ensure(self, max_len: int) -> None:
        """Room for `max_len` rows (context + block + padding): larger buffers if needed, rows so far kept."""
        if max_len <= self.max_len:
            return
        keys, values, n = self.keys, self.values, self.length
        self._alloc(max(max_len, 2 * self.max_len))
        self.keys[:, :, :n].copy_(keys[:, :, :n])
        self.values[:, :, :n].copy_(values[:, :, :n])

    def reset(self) -> None:
        """A new sequence: no context rows (the buffers and graphs stay; stale rows are never visible)."""
        self.length, self.unsettled = 0, False

    # -- the static function ------------------------------------------------------------------------------

    def _masks(self, q_pos: torch.Tensor, cols: int, block: int) -> dict:
        """Per layer kind (causal, window): bool [1, 1, rep*L, K], True = visible (grouped query rows: query head
        h*rep + r of block row l is row r*L + l)."""
        key_pos = self._cols[:cols]
        ahead = q_pos[:, None] - key_pos[None, :]  # [L, K]: how far back each key is
        valid = (key_pos < q_pos[0] + block)[None, :].expand(block, cols)  # committed rows and the block's own
        masks = {}
        for causal, window in set(self.kinds):
            visible = valid
            if causal:
                visible = visible & (ahead >= 0)
            if window is not None:
                visible = visible & (ahead < window)
                if not causal:
                    visible = visible & (-ahead < window)
            masks[causal, window] = visible.repeat(self.rep, 1)[None, None]
        return masks

    def _write_context(self, feats: torch.Tensor, start: int) -> None:
        """Context rows feats [n, F] at positions start .. start+n-1: each layer's K/V written as _draft writes a
        new row's (fc and hidden_norm, k_proj, k_norm and RoPE, v_proj: a row's K/V depend on that row alone),
        CONTEXT_CHUNK rows at a time, eagerly. For the rows of a prompt before its last block's worth (draft)."""
        d = self.drafter
        for lo in range(0, feats.shape[0], CONTEXT_CHUNK):
            rows = feats[lo:lo + CONTEXT_CHUNK]
            pos = start + lo + self._cols[:rows.shape[0]]
            cos, sin = rope_cos_sin(pos[None], self.head_dim, self.config.rope_theta, self.dtype)
            x_ctx = d.hidden_norm(d.fc(rows[None]))  # [1, n, H]
            for i, layer in enumerate(d.layers):
                attn = layer.self_attn
                k = k_prep(attn.k_proj(x_ctx), attn.k_norm.weight, attn.k_norm.eps, cos, sin, self.n_kv, self.head_dim)
                v = attn.v_proj(x_ctx).view(1, -1, self.n_kv, self.head_dim).transpose(1, 2)
                self.keys[i].index_copy_(1, pos, k[0])
                self.values[i].index_copy_(1, pos, v[0])

    def _draft(self, feats: torch.Tensor, block: torch.Tensor, cols: int) -> tuple[torch.Tensor, ...]:
        """feats [P, F] new context rows (rows past committed - start are padding), block [L + 2]: the block's ids,
        start, committed; writes K/V rows start .. start+P-1 and committed .. committed+L-1. (log-probs [L-1, V]
        fp32, then the family's extra outputs: DFlash2's candidate selector, drafter.extra_outputs). Plain layers
        (plain_layers) run their norms and MLP as pieces, each residual add with the norm after it; a family's
        layers go through their hooks."""
        d, p = self.drafter, self.pieces
        P, L = feats.shape[0], block.shape[0] - 2
        ids, start, committed = block[:L], block[L], block[L + 1]
        ctx_pos = start + self._cols[:P]
        q_pos = committed + self._cols[:L]
        cos, sin = rope_cos_sin(torch.cat([ctx_pos, q_pos])[None], self.head_dim, self.config.rope_theta, self.dtype)
        x_ctx = d.hidden_norm(d.fc(feats[None]))  # [1, P, H]
        x = self.embed(ids)[None].to(self.dtype)  # [1, L, H]: the noise embedding
        masks = self._masks(q_pos, cols, L)
        p.mark(x_ctx, 1, cos, 2, sin, 2)
        h, norms = None, None
        if self.plain:  # the first layer's input norm now; each later one (and the final norm) with its residual add
            first = d.layers[0].input_layernorm
            h = p(qwen3_rms_norm)(x, first.weight, first.eps)
            norms = [layer.input_layernorm for layer in d.layers[1:]] + [d.norm]
        for i, layer in enumerate(d.layers):
            state = None
            if not self.plain:
                h, state = layer.attention_input(x)  # DFlash2: convolved over the block (drafter.py's hooks)
            o = self._attention(i, layer.self_attn, h, x_ctx, cos, sin, masks[self.kinds[i]], ctx_pos, q_pos, cols)
            if self.plain:
                post, mlp = layer.post_attention_layernorm, layer.mlp
                x, h = p(add_norm)(x, o, post.weight, post.eps)
                x, h = p(add_norm)(x, mlp.down_proj(p(silu_mul)(mlp.gate_proj(h), mlp.up_proj(h))), norms[i].weight,
                                   norms[i].eps)
            else:
                x = x + layer.attention_output(o, state)
                x = x + layer.mlp_block(x)
        hidden = (h if self.plain else d.norm(x))[0, 1:]
        logits = d.compute_logits(self.lm_head(hidden))
        return (torch.log_softmax(logits, dim=-1), *d.extra_outputs(hidden, logits, ids[0]))

    def _attention(self, i: int, attn, h, x_ctx, cos, sin, mask, ctx_pos, q_pos, cols: int) -> torch.Tensor:
        """One layer's attention over the block (h [1, L, H]) with the new context rows (x_ctx [1, P, H]): their
        K/V written at their positions, the block's over the padding rows it overlaps, then the first `cols` rows
        read in place with the query heads grouped by KV head; o_proj's output [1, L, H]."""
        p, P, L = self.pieces, x_ctx.shape[1], h.shape[1]
        both = torch.cat([x_ctx, h], dim=1)
        q, k = p(qk_prep)(attn.q_proj(h), attn.k_proj(both), attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.eps,
                          attn.k_norm.eps, cos, sin, self.n_heads, self.n_kv, self.head_dim)
        v = attn.v_proj(both).view(1, P + L, self.n_kv, self.head_dim).transpose(1, 2)
        keys, values = self.keys[i][None], self.values[i][None]
        keys.index_copy_(2, ctx_pos, k[:, :, :P])
        values.index_copy_(2, ctx_pos, v[:, :, :P])
        keys.index_copy_(2, q_pos, k[:, :, P:])
        values.index_copy_(2, q_pos, v[:, :, P:])
        keys, values = keys[:, :, :cols], values[:, :, :cols]
        qg = q.reshape(1, self.n_kv, self.rep * L, self.head_dim)  # grouped heads, K/V read in place
        scale = self.head_dim ** -0.5
        if self.attention == "sdpa":
            o = F.scaled_dot_product_attention(qg, keys, values, attn_mask=mask, scale=scale)
        else:  # fp32 scores and softmax, the probabilities back in the model's dtype for the values
            scores = qg.float() @ keys.float().transpose(-1, -2)
            p.mark(scores, 3, mask, 3)
            o = p(attention_probs)(scores, mask, scale, values.dtype) @ values
        o = o.reshape(1, self.n_heads, L, self.head_dim).transpose(1, 2).reshape(1, L, -1)
        return attn.o_proj(o)

    def _pass(self, feats: torch.Tensor, block: torch.Tensor, cols: int) -> tuple[torch.Tensor, ...]:
        """_draft run now (eagerly, or a graph's warm-up). Where its pieces are compiled and the compiler cannot run
        here (inductor without a C++ compiler on a CPU, a Triton that fails), compile is turned off (`compile_error`
        says why) and the pass runs with the pieces as they are: it writes the same rows from the same inputs."""
        try:
            return self._draft(feats, block, cols)
        except Exception as exc:  # noqa: BLE001 - any compiler failure; an error of the pass itself raises below
            if not self.pieces.compile or not compiler_failure(exc):
                raise
            self.compile_error = f"{type(exc).__name__}: {str(exc)[:300]}"
            self.pieces = Pieces(False)
            return self._draft(feats, block, cols)

    # -- slots and graphs ---------------------------------------------------------------------------------

    def _inputs(self, pad: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
        feats = self._feats.get(pad)
        if feats is None:
            width = self.drafter.fc.in_features
            feats = self._feats[pad] = torch.zeros(pad, width, dtype=self.dtype, device=self.device)
        if block not in self._block:
            cuda = self.device.type == "cuda"
            stage = torch.full((block + 2,), self.mask_token_id, dtype=torch.long, pin_memory=cuda)
            self._block[block] = (torch.empty(block + 2, dtype=torch.long, device=self.device).copy_(stage), stage,
                                  torch.cuda.Event() if cuda else None)
        return feats, self._block[block][0]

    def _fill_block(self, block: int, root: int, start: int, committed: int) -> None:
        """One host-to-device copy of the block's ids, start and committed (the staging buffer is reused once its
        last copy is done)."""
        device_in, stage, copied = self._block[block]
        if copied is not None:
            copied.synchronize()
        host = stage.numpy()
        host[0], host[block], host[block + 1] = root, start, committed
        device_in.copy_(stage, non_blocking=True)
        if copied is not None:
            copied.record()

    def bucket(self, need: int) -> int:
        fitting = [b for b in self.buckets if b >= need]
        if not fitting:
            raise ValueError(f"the static drafter's max_len {self.max_len} is full ({need} rows needed)")
        return fitting[0]

    def _run_slot(self, pad: int, block: int, cols: int) -> tuple[torch.Tensor, ...]:
        """Run (replay, or capture on first use and replay) the slot for these shapes; inputs already filled."""
        key = (pad, block, cols)
        slot = self._slots.get(key)
        feats, block_in = self._inputs(pad, block)
        if not self.graphs:
            self.eager_passes += 1
            with sdpa_backends(self.device):
                return self._pass(feats, block_in, cols)
        if slot is None:
            # the warm-up runs and the capture read and write only this round's rows, from the inputs already
            # filled: they leave the state as the replay below will (no copy of the state needed)
            start = time.perf_counter()
            slot = _Slot(pad, block, cols)
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with sdpa_backends(self.device):
                with torch.cuda.stream(stream):
                    for _ in range(2):
                        self._pass(feats, block_in, cols)
                torch.cuda.current_stream(self.device).wait_stream(stream)
                slot.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(slot.graph, pool=self._pool):
                    slot.out = self._draft(feats, block_in, cols)
            self._slots[key] = slot
            self.capture_s += time.perf_counter() - start
        slot.graph.replay()
        self.replays += 1
        return slot.out

    # -- public API ---------------------------------------------------------------------------------------

    @torch.no_grad()
    def propose(self, root_token_id: int, committed_len: int, new_features: torch.Tensor | None,
                block_size: int) -> torch.Tensor:
        """The round's new context rows (positions length .. committed_len-1) and the block at committed_len:
        log-probs [block_size - 1, vocab] fp32 (a fresh tensor)."""
        return self.draft(root_token_id, committed_len, new_features, block_size)[0]

    @torch.no_grad()
    def draft(self, root_token_id: int, committed_len: int, new_features: torch.Tensor | None,
              block_size: int) -> tuple[torch.Tensor, ...]:
        """propose's log-probs, then the family's extra outputs (DFlash2: the candidate selector's ids, unary, root
        and pair scores, drafter.extra_outputs), all fresh tensors on the device."""
        begun = time.perf_counter()
        start = self.length
        n = 0 if new_features is None else int(new_features.shape[0])
        if self.unsettled or start + n != committed_len:
            raise RuntimeError(f"drafter context out of step: {start} cached + {n} new != {committed_len}"
                               + (" (a queued draft's context not settled)" if self.unsettled else ""))
        pad = block_size  # a round's accepted path fits in the block
        cols = self._room(start, max(n, pad), block_size)  # room for every new row before any is written
        feats, _ = self._inputs(pad, block_size)
        if n > pad:  # more new rows than a round brings (a prompt's): all but the last pad rows written first
            older = n - pad
            self._write_context(new_features[:older].to(self.device, self.dtype), start)
            new_features, start, n = new_features[older:], start + older, pad  # the same key bucket as before
        self._fill_block(block_size, int(root_token_id), start, committed_len)
        if n:
            feats[:n].copy_(new_features)
        if n < pad:
            feats[n:].zero_()
        out = tuple(t.clone() for t in self._run_slot(pad, block_size, cols))  # the graph's buffers: the next replay's
        self.length = committed_len
        self.host_ms = (time.perf_counter() - begun) * 1e3
        return out

    @torch.no_grad()
    def draft_queued(self, root: torch.Tensor, committed: torch.Tensor, features: torch.Tensor,
                     block_size: int) -> tuple[torch.Tensor, ...]:
        """draft, its inputs where the device has them and the host does not yet (a walk queued and not read,
        engines.QueuedWalk): the root token and the committed length ([] int64 tensors), the new context rows
        `features` [at least block_size, F] (the accepted path's, padded with any rows, its first block_size taken:
        rows past the path take positions the block's own K/V overwrite before anything reads them, as the zero
        padding of `draft`; a path is never longer than the block). The key bucket is the one `draft` takes for a
        round's padded rows, so the same function runs on the same inputs. The context is unsettled until
        `settle(committed_len)` says its length; no draft before."""
        begun = time.perf_counter()
        start, pad = self.length, block_size
        if self.unsettled or features.shape[0] < pad:
            raise RuntimeError(f"a queued draft needs a settled context and {pad} rows of features "
                               f"(unsettled: {self.unsettled}, {features.shape[0]} rows)")
        cols = self._room(start, pad, block_size)
        feats, block_in = self._inputs(pad, block_size)
        self._fill_block(block_size, 0, start, 0)  # the host's part (start); the root and committed from the device
        block_in[:1].copy_(root.view(1))
        block_in[block_size + 1:].copy_(committed.view(1))
        feats.copy_(features[:pad])
        out = tuple(t.clone() for t in self._run_slot(pad, block_size, cols))
        self.unsettled = True
        self.host_ms = (time.perf_counter() - begun) * 1e3
        return out

    def settle(self, committed_len: int) -> None:
        """The context's length once the host knows it (after draft_queued)."""
        self.length, self.unsettled = int(committed_len), False

    def _room(self, start: int, rows: int, block_size: int) -> int:
        """The key bucket of a pass whose new rows start at `start`, `rows` of them at most (a round's: the padded
        block), room made for them. Bounded by the padded rows, not the accepted count, so that a draft whose count
        only the device knows (draft_queued) takes the bucket a draft from the host (draft) takes."""
        self.ensure(start + rows + 2 * block_size)
        return self.bucket(start + rows + block_size)

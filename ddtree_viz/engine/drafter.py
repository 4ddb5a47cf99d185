"""DFlash block drafter (arXiv 2602.06036, z-lab/dflash ``dflash/model.py``), written from scratch.

The drafter is a few Qwen3-style decoder layers with no embedding and no lm_head of its own: the
caller embeds the block with the target's embeddings and applies the target's lm_head to our output.
Queries come from the block ("noise") states only; keys/values come from the projected target
context features *and* the block. Only context K/V are ever cached.

Per layer (`layer_types`): a `full_attention` layer sees every context row and the whole block (bidirectional);
a `sliding_attention` layer sees only keys less than `sliding_window` positions back, and is causal inside the
block (a block position sees itself and the positions before it). That is how the published Qwen3.6 drafters
were trained ("causal SWA layers": z-lab/dflash's model.py, vLLM's and SGLang's DFlash layers resolve it the same
way); an explicit `is_causal` (top level) or `dflash_config.causal` makes every layer causal or bidirectional
instead. Running sliding layers as full attention, or bidirectional, gives another drafter, whose acceptance
collapses. The cache keeps only the `sliding_window - 1` newest context rows of a sliding layer: older ones can
never be seen again by a later block (its positions only grow).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ddtree_viz.engine.weights import load as weight_load, registry as weights
from ddtree_viz.engine.backends import sdpa_backends
from ddtree_viz.errors import ModelLoadError, PairingError
from ddtree_viz.trace import MAX_DEPTH
from ddtree_viz.words import plural

# a round's tree is at most block_size - 1 deep, and a trace holds trees up to trace.MAX_DEPTH deep
MAX_BLOCK_SIZE = MAX_DEPTH + 1

LAYER_TYPES = ("full_attention", "sliding_attention")
_ACTIVATIONS = {"silu": F.silu, "swish": F.silu, "gelu": F.gelu, "relu": F.relu,
                "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Target layers whose outputs feed the drafter: evenly spaced from 1 to L-3 (z-lab default)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = (num_target_layers - 3) - 1
    return [int(round(1 + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def extract_context_features(hidden_states: Sequence[Tensor], layer_ids: Sequence[int]) -> Tensor:
    """Concatenate the outputs of ``layer_ids`` (``hidden_states[0]`` is the embedding output)."""
    device = hidden_states[layer_ids[0] + 1].device
    return torch.cat([hidden_states[i + 1].to(device) for i in layer_ids], dim=-1)


# ----------------------------------------------------------------------------------- config
@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    attention_bias: bool
    hidden_act: str
    layer_types: tuple[str, ...]
    sliding_window: int | None
    num_target_layers: int
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    # every layer causal (True) or bidirectional (False) over the block, from `is_causal` or `dflash_config.causal`;
    # None: by layer type (sliding layers causal, full layers bidirectional): see layer_causal
    is_causal: bool | None = None
    # compute_logits: the lm_head's logits times output_multiplier, then tanh soft-capped at final_logit_softcapping
    # (None: not applied); DFlash2 drafters carry them, a DFlash 1 checkpoint may too
    output_multiplier: float | None = None
    final_logit_softcapping: float | None = None

    @property
    def layer_causal(self) -> tuple[bool, ...]:
        """Per layer: causal inside the block? An explicit is_causal decides for all layers; else sliding layers are
        causal and full-attention layers bidirectional (z-lab's, vLLM's and SGLang's DFlash defaults)."""
        if self.is_causal is not None:
            return (self.is_causal,) * self.num_hidden_layers
        return tuple(t == "sliding_attention" for t in self.layer_types)

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Per layer: its sliding window (None: full attention)."""
        return tuple(self.sliding_window if t == "sliding_attention" else None for t in self.layer_types)

    @classmethod
    def from_dict(cls, d: dict) -> "DFlashConfig":
        try:
            config = cls._from_dict(d)
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:  # a value of the wrong kind
            raise ModelLoadError(f"Drafter config has a value of the wrong kind: {exc}.") from None
        sizes = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "vocab_size", "max_position_embeddings", "num_target_layers")
        for name in sizes:
            if getattr(config, name) < 1:
                raise ModelLoadError(f"Drafter config: {name} must be at least 1, got {getattr(config, name)}.")
        if config.block_size > MAX_BLOCK_SIZE:
            raise ModelLoadError(f"Drafter block_size must be at most {MAX_BLOCK_SIZE}, got {config.block_size}.")
        for name in ("output_multiplier", "final_logit_softcapping"):
            value = getattr(config, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ModelLoadError(f"Drafter config: {name} must be a positive number or absent, got {value}.")
        return config

    @classmethod
    def _from_dict(cls, d: dict) -> "DFlashConfig":
        if not isinstance(d, dict):
            raise ModelLoadError(f"Drafter config must be a JSON object, got {type(d).__name__}.")
        dflash = d.get("dflash_config") or {}

        def need(key: str, value: Any = None) -> Any:
            value = d.get(key) if value is None else value
            if value is None:
                raise ModelLoadError(f"Drafter config.json is missing the required key '{key}'.")
            return value

        n_layers = int(need("num_hidden_layers"))
        n_heads = int(need("num_attention_heads"))
        # Qwen3Config: absent -> 32, explicit null -> num_attention_heads.
        n_kv = d.get("num_key_value_heads", 32)
        n_kv = n_heads if n_kv is None else int(n_kv)
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ModelLoadError(f"Drafter uses rope_type '{rope_type}'; only the default RoPE is supported.")
        rope_theta = d.get("rope_theta", rope.get("rope_theta", 10000.0))
        block_top, block_dflash = d.get("block_size"), dflash.get("block_size")
        if block_top is not None and block_dflash is not None and int(block_top) != int(block_dflash):
            raise ModelLoadError(f"Drafter config disagrees on block_size: top level {block_top}, "
                                 f"dflash_config {block_dflash}.")
        block_size = int(need("dflash_config.block_size", block_dflash if block_dflash is not None else block_top))
        mask_token_id = int(need("dflash_config.mask_token_id", dflash.get("mask_token_id", d.get("mask_token_id"))))
        num_target_layers = int(need("num_target_layers"))
        layer_ids = dflash.get("target_layer_ids", d.get("target_layer_ids"))
        if layer_ids is None:
            layer_ids = build_target_layer_ids(num_target_layers, n_layers)
        layer_types = tuple(d.get("layer_types") or ("full_attention",) * n_layers)
        if len(layer_types) != n_layers or any(t not in LAYER_TYPES for t in layer_types):
            raise ModelLoadError(f"Drafter layer_types {list(layer_types)} must list {plural(n_layers, 'entry')} "
                                 f"from {list(LAYER_TYPES)}.")
        hidden_act = d.get("hidden_act", "silu")
        if hidden_act not in _ACTIVATIONS:
            raise ModelLoadError(f"Drafter hidden_act '{hidden_act}' is not supported ({sorted(_ACTIVATIONS)}).")
        if block_size < 2:
            raise ModelLoadError(f"Drafter block_size must be at least 2, got {block_size}.")
        window = d.get("sliding_window")
        if "sliding_attention" in layer_types:
            # Never ask use_sliding_window: Qwen3Config's gate that drops the window unless it is set would turn
            # these layers into full attention without a word.
            if isinstance(window, bool) or not isinstance(window, int) or window < 1:
                raise ModelLoadError(f"Drafter layer_types has sliding_attention layers but sliding_window is "
                                     f"{window!r}; it must be a positive whole number.")
        is_causal = d.get("is_causal", dflash.get("is_causal", dflash.get("causal")))
        scales = {k: d.get(k, dflash.get(k)) for k in ("output_multiplier", "final_logit_softcapping")}
        if is_causal is not None and not isinstance(is_causal, bool):
            raise ModelLoadError(f"Drafter is_causal must be true, false or absent, not {is_causal!r}.")
        return cls(
            hidden_size=int(need("hidden_size")), intermediate_size=int(need("intermediate_size")),
            num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=n_kv,
            head_dim=int(d.get("head_dim") or 128), vocab_size=int(need("vocab_size")),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)), rope_theta=float(rope_theta),
            max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
            attention_bias=bool(d.get("attention_bias", False)), hidden_act=hidden_act,
            layer_types=layer_types, sliding_window=None if window is None else int(window),
            num_target_layers=num_target_layers, block_size=block_size, mask_token_id=mask_token_id,
            target_layer_ids=tuple(int(i) for i in layer_ids), is_causal=is_causal,
            **{k: None if v is None else float(v) for k, v in scales.items()},
        )

    @classmethod
    def from_file(cls, path: str | Path) -> "DFlashConfig":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ModelLoadError(f"Drafter config not found: {path}") from None
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
            raise ModelLoadError(f"Drafter config {path} is not readable JSON: {e}") from None
        return cls.from_dict(data)

    def to_dict(self) -> dict:
        d = asdict(self)
        dflash = {k: d.pop(k) for k in ("block_size", "mask_token_id", "target_layer_ids")}
        dflash["target_layer_ids"] = list(dflash["target_layer_ids"])
        d["layer_types"] = list(self.layer_types)
        for key in ("is_causal", "output_multiplier", "final_logit_softcapping"):
            if d[key] is None:
                del d[key]
        # Qwen3Config drops sliding_window unless use_sliding_window is set.
        d["use_sliding_window"] = "sliding_attention" in self.layer_types
        d["rope_parameters"] = {"rope_theta": self.rope_theta, "rope_type": "default"}
        return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", **d,
                "block_size": self.block_size, "dflash_config": dflash}


# ------------------------------------------------------------------------------------ cache
class DraftKVCache:
    """Per draft layer K/V of the *context features* only (never the block), post-norm, post-RoPE.

    `positions` [B, seq_length] holds every context position seen so far (what `seq_length` counts); each layer
    holds the newest rows of that sequence: all of them for a full-attention layer, at most `window - 1` for a
    sliding layer (`evict`, after each forward: a later block sits at higher positions and can see no older row)."""

    def __init__(self, num_layers: int, windows: Sequence[int | None] | None = None):
        self._kv: list[tuple[Tensor, Tensor] | None] = [None] * num_layers
        self.windows = tuple(windows) if windows is not None else (None,) * num_layers
        self.positions: Tensor | None = None  # [B, seq_length] positions of the context rows seen

    @property
    def seq_length(self) -> int:
        return 0 if self.positions is None else self.positions.shape[-1]

    def rows(self, idx: int) -> int:
        """Context rows layer `idx` holds (the newest ones)."""
        kv = self._kv[idx]
        return 0 if kv is None else kv[0].shape[2]

    def layer_positions(self, idx: int) -> Tensor | None:
        """[B, rows(idx)] positions of layer idx's rows."""
        return None if self.positions is None else self.positions[:, self.seq_length - self.rows(idx):]

    def evict(self) -> None:
        """Drop the rows of sliding layers that no later block can see: a block starts after the newest context
        position p, so a row is visible only if its position > p + 1 - window. Positions that do not increase
        (no caller of the drafter makes such) are left alone."""
        if self.positions is None or self.seq_length == 0:
            return
        pos = self.positions
        if pos.shape[-1] > 1 and not bool((pos[:, 1:] > pos[:, :-1]).all()):
            return
        newest = pos[:, -1:]
        for idx, window in enumerate(self.windows):
            if window is None or self._kv[idx] is None:
                continue
            held = self.layer_positions(idx)
            keep = int((held > newest + 1 - window).all(0).sum())  # a suffix, as positions increase
            if keep < held.shape[-1]:
                k, v = self._kv[idx]
                self._kv[idx] = (k[:, :, k.shape[2] - keep:], v[:, :, v.shape[2] - keep:])

    def crop(self, length: int) -> None:
        """Keep the first ``length`` context positions. A sliding layer that has already dropped rows a block
        after ``length`` could see cannot be cropped back there (ValueError)."""
        if length < 0:
            raise ValueError(f"crop length must be >= 0, got {length}")
        if length >= self.seq_length:
            return
        for idx, window in enumerate(self.windows):
            kv = self._kv[idx]
            if kv is None:
                continue
            first = self.seq_length - self.rows(idx)  # index of the layer's oldest row in the whole sequence
            if window is not None and 0 < first and length > 0:
                newest = self.positions[:, length - 1]
                if bool((self.positions[:, first - 1] > newest + 1 - window).any()):
                    raise ValueError(f"cannot crop draft layer {idx} to {length} positions: it has dropped rows "
                                     f"older than its window of {window} that a block there could see")
            keep = max(0, length - first)
            self._kv[idx] = (kv[0][:, :, :keep], kv[1][:, :, :keep])
        self.positions = self.positions[:, :length]

    def layer_tensors(self) -> list[tuple[Tensor, Tensor]]:
        return [kv for kv in self._kv if kv is not None]

    def _layer(self, idx: int) -> tuple[Tensor, Tensor] | None:
        return self._kv[idx]

    def _set_layer(self, idx: int, k: Tensor, v: Tensor) -> None:
        self._kv[idx] = (k, v)


# ------------------------------------------------------------------------------------ model
class RMSNorm(nn.Module):
    """Qwen3RMSNorm: normalise in float32, cast back, multiply by the weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return qwen3_rms_norm(x, self.weight, self.eps)


def qwen3_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm's arithmetic as a function of tensors (the static drafter's compiled pieces call it too)."""
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Standard (non-M) RoPE tables for ``positions`` [B, N] -> cos, sin [B, 1, N, head_dim]."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float()
                                / head_dim))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class DFlashAttention(nn.Module):
    def __init__(self, c: DFlashConfig, layer_idx: int):
        super().__init__()
        self.layer_idx, self.head_dim = layer_idx, c.head_dim
        self.n_heads, self.n_kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=c.attention_bias)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(self, x: Tensor, x_ctx: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor | None,
                cache: DraftKVCache | None) -> Tensor:
        B, L, _ = x.shape
        C = x_ctx.shape[1]
        cos, sin = rope  # over [new ctx, block] positions
        q = self.q_norm(self.q_proj(x).view(B, L, self.n_heads, self.head_dim)).transpose(1, 2)
        k = self.k_proj(torch.cat([x_ctx, x], dim=1)).view(B, C + L, self.n_kv_heads, self.head_dim)
        v = self.v_proj(torch.cat([x_ctx, x], dim=1)).view(B, C + L, self.n_kv_heads, self.head_dim)
        k, v = self.k_norm(k).transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rope(q, cos[:, :, C:], sin[:, :, C:]), apply_rope(k, cos, sin)
        if cache is not None:
            past = cache._layer(self.layer_idx)
            k_ctx, v_ctx = k[:, :, :C], v[:, :, :C]
            if past is not None:
                k_ctx, v_ctx = torch.cat([past[0], k_ctx], dim=2), torch.cat([past[1], v_ctx], dim=2)
            cache._set_layer(self.layer_idx, k_ctx, v_ctx)
            k, v = torch.cat([k_ctx, k[:, :, C:]], dim=2), torch.cat([v_ctx, v[:, :, C:]], dim=2)
        groups = self.n_heads // self.n_kv_heads  # GQA: repeat each K/V head for its query heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(B, L, -1))


class DFlashMLP(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
        self.act = _ACTIVATIONS[c.hidden_act]

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, c: DFlashConfig, layer_idx: int):
        super().__init__()
        self.self_attn = DFlashAttention(c, layer_idx)
        self.mlp = DFlashMLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    # A family's sublayer hooks (DFlash2 wraps each sublayer in its convolutions): the dynamic forward below and the
    # static drafter (draft_runner.py) both go through them, so a family changes its layer in one place.
    def attention_input(self, x: Tensor) -> tuple[Tensor, Any]:
        """The attention's input (its queries and the block's keys and values) and what attention_output needs."""
        return self.input_layernorm(x), None

    def attention_output(self, y: Tensor, state: Any) -> Tensor:
        """The attention's output (after o_proj) as added to the residual."""
        return y

    def mlp_block(self, x: Tensor) -> Tensor:
        """The MLP sublayer's contribution to the residual."""
        return self.mlp(self.post_attention_layernorm(x))

    def forward(self, x, x_ctx, rope, mask, cache):
        # The context features enter every layer as they left hidden_norm (no input_layernorm).
        h, state = self.attention_input(x)
        x = x + self.attention_output(self.self_attn(h, x_ctx, rope, mask, cache), state)
        return x + self.mlp_block(x)


class DFlashDrafter(nn.Module):
    """A drafter family is this class or a subclass (engine/dflash2.py): its `family` name (traces record it), its
    config class, its decoder layer, and what it adds after the layers."""

    family = "dflash"
    config_class = DFlashConfig
    layer_class = DFlashDecoderLayer

    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.config = config
        self.target_layer_ids = list(config.target_layer_ids)
        self.block_size, self.mask_token_id = config.block_size, config.mask_token_id
        self.layers = nn.ModuleList(self.layer_class(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.fc = nn.Linear(len(self.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    # ---- construction / IO
    @classmethod
    def from_config_meta(cls, config: DFlashConfig) -> "DFlashDrafter":
        """Build without allocating or initialising weights (parameters live on the meta device)."""
        with torch.device("meta"):
            return cls(config)

    @classmethod
    def from_pretrained(cls, path: str | Path, *, dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu", keep_quantized: bool = False) -> "DFlashDrafter":
        """The drafter of a folder (config.json + safetensors, bf16 or the official FP8 layout), checked against its
        config. A quantized checkpoint (FP8, 4-bit pack-quantized) is dequantized at load, or with `keep_quantized`
        each converted Linear keeps the checkpoint's weights as stored (its format's kept module: fp8.Fp8Linear, e4m3
        bytes and scales, half of bf16's memory; int4_common.Int4Linear, packed parts, a quarter; their GEMMs on
        CUDA)."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = Path(path)
        if not path.is_dir():
            raise ModelLoadError(f"Drafter directory not found: {path}")
        config = cls.config_class.from_file(path / "config.json")
        files = ([path / "model.safetensors"] if (path / "model.safetensors").is_file()
                 else weight_load.checkpoint_files(path, "drafter"))  # the index's shards, checked, else *.safetensors
        state: dict[str, Tensor] = {}
        for f in files:
            try:
                state.update(load_file(str(f), device=str(device)))
            except (OSError, SafetensorError) as e:
                raise ModelLoadError(f"Could not read drafter weights {f}: {e}") from None
        spec = weights.spec_of(json.loads((path / "config.json").read_text(encoding="utf-8")), "drafter")
        kept: dict | None = {} if keep_quantized and spec is not None else None
        # a quantized layout dequantized here, in float32, then cast (engine/weights/); plain weights as they are
        state = weights.format_of(spec).state(state, state.__getitem__, spec, dtype, "drafter", keep=kept)
        cls.check_fields(config, state)
        model = cls.from_config_meta(config)
        expected = {k: tuple(p.shape) for k, p in model.state_dict().items()}
        missing = sorted(expected.keys() - state.keys())
        unexpected = sorted(state.keys() - expected.keys())
        misshaped = [f"{k} {tuple(state[k].shape)} != {expected[k]}" for k in sorted(expected.keys() & state.keys())
                     if tuple(state[k].shape) != expected[k]]
        problems = [f"{name}: {', '.join(items[:5])}{' ...' if len(items) > 5 else ''} ({len(items)} in all)"
                    for name, items in (("missing", missing), ("unexpected", unexpected),
                                        ("wrong shape", misshaped)) if items]
        if problems:
            raise ModelLoadError(f"Drafter weights in {path} do not match its config.json; " + "; ".join(problems))
        model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, assign=True)
        if kept:
            weight_load.keep_linears(model, kept, f"drafter {path}")
        model.weight_format = spec.label(dtype, kept=bool(kept)) if spec is not None else None  # draft_precision
        return model.eval()

    @classmethod
    def check_fields(cls, config: DFlashConfig, state: dict[str, Tensor]) -> None:
        """Config fields that disagree with the weights, refused naming the field (a family with such fields
        overrides this; DFlash 1's sizes show up as mis-shaped weights)."""

    def extra_outputs(self, hidden: Tensor, logits: Tensor, root: Tensor | int) -> tuple[Tensor, ...]:
        """What this family drafts beside its log-probs, as device tensors of fixed shapes (so that the static
        drafter's CUDA graph captures them): nothing for DFlash; DFlash2's candidate selector (dflash2.py).
        hidden [D, H]: the normed output at the drafted depths; logits [D, vocab]: compute_logits'."""
        return ()

    def compute_logits(self, logits: Tensor) -> Tensor:
        """The drafter's logits from the lm_head's (float32): times output_multiplier, then tanh soft-capped at
        final_logit_softcapping, each where the config sets it."""
        logits = logits.float()
        if self.config.output_multiplier is not None:
            logits = logits * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def save_pretrained(self, path: str | Path) -> None:
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(self.config.to_dict(), indent=2) + "\n", encoding="utf-8")
        save_file({k: v.detach().contiguous() for k, v in self.state_dict().items()},
                  str(path / "model.safetensors"), metadata={"format": "pt"})

    @property
    def activations(self) -> tuple[torch.device, torch.dtype]:
        """Where the drafter computes and in which dtype: its first parameter's that is not part of a kept quantized
        weight (weights.KEPT: Fp8Linear and Int4Linear keep the checkpoint's tensors; they compute in their input's
        dtype)."""
        kept = {id(p) for m in self.modules() if isinstance(m, weights.KEPT)
                for p in m.parameters() if p is not m.bias}
        p = next(p for p in self.parameters() if id(p) not in kept)
        return p.device, p.dtype

    def new_cache(self) -> DraftKVCache:
        return DraftKVCache(self.config.num_hidden_layers, self.config.layer_windows)

    # ---- forward
    @staticmethod
    def _layer_mask(q_pos: Tensor, key_pos: Tensor, causal: bool, window: int | None) -> Tensor | None:
        """Bool mask [B,1,L,K] (True = visible) for queries at q_pos [B,L] over keys at key_pos [B,K] (context
        rows, then the block itself), or None when everything is visible. Causal: a key at a later position is
        hidden. Window: a key `window` or more positions away is hidden (back; and ahead when not causal)."""
        if not causal and window is None:
            return None
        ahead = q_pos[:, :, None] - key_pos[:, None, :]  # [B, L, K]: how far back each key is
        visible = torch.ones_like(ahead, dtype=torch.bool)
        if causal:
            visible &= ahead >= 0
        if window is not None:
            visible &= ahead < window
            if not causal:
                visible &= -ahead < window
        return visible[:, None]

    def forward(self, noise_embedding: Tensor, target_hidden: Tensor, position_ids: Tensor,
                cache: DraftKVCache | None = None, attention_mask: Tensor | None = None) -> Tensor:
        B, L, H = noise_embedding.shape
        C = target_hidden.shape[1]
        if target_hidden.shape[-1] != len(self.target_layer_ids) * H:
            raise ValueError(f"target_hidden has {target_hidden.shape[-1]} features, expected "
                             f"{len(self.target_layer_ids)} layers x {H}.")
        if position_ids.dim() == 1:
            position_ids = position_ids[None]
        position_ids = position_ids.expand(B, -1)
        if position_ids.shape[-1] != C + L:
            raise ValueError(f"position_ids covers {position_ids.shape[-1]} rows, expected {C} context + {L} block.")
        x_ctx = self.hidden_norm(self.fc(target_hidden))
        rope = rope_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta, noise_embedding.dtype)

        new_pos, q_pos = position_ids[:, :C], position_ids[:, C:]
        masks = {}  # one per (causal, window, cached rows): layers of one kind share theirs
        x = noise_embedding
        with sdpa_backends(x.device):  # on CUDA: no cuDNN plan per context length (engine/backends.py)
            for i, layer in enumerate(self.layers):
                causal, window = self.config.layer_causal[i], self.config.layer_windows[i]
                past = cache.layer_positions(i) if cache is not None else None
                key = (causal, window, 0 if past is None else past.shape[-1])
                if key not in masks:
                    key_pos = torch.cat(([] if past is None else [past.expand(B, -1)]) + [new_pos, q_pos], dim=1)
                    masks[key] = self._combine(attention_mask, self._layer_mask(q_pos, key_pos, causal, window),
                                               key_pos.shape[-1])
                x = layer(x, x_ctx, rope, masks[key], cache)
        if cache is not None:
            seen = new_pos if cache.positions is None else torch.cat([cache.positions.expand(B, -1), new_pos], dim=1)
            cache.positions = seen
            cache.evict()
        return self.norm(x)

    @staticmethod
    def _combine(attention_mask: Tensor | None, layer_mask: Tensor | None, keys: int) -> Tensor | None:
        """The caller's mask (bool or additive, over the whole context + block) cut to this layer's last `keys`
        key columns (a sliding layer's cache holds only the newest rows), combined with the layer's own."""
        if attention_mask is not None:
            attention_mask = attention_mask[..., attention_mask.shape[-1] - keys:]
        if layer_mask is None:
            return attention_mask
        if attention_mask is None:
            return layer_mask
        if attention_mask.dtype == torch.bool:
            return attention_mask & layer_mask
        return attention_mask.masked_fill(~layer_mask, float("-inf"))


def validate_pairing(drafter: DFlashConfig, target_config: Any) -> None:
    """Raise PairingError unless the drafter can run on top of the target described by ``target_config``."""
    d = getattr(drafter, "config", drafter)
    t = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    t_hidden, t_vocab, t_layers = (getattr(t, k, None) for k in ("hidden_size", "vocab_size", "num_hidden_layers"))
    if d.hidden_size != t_hidden:
        raise PairingError(f"Hidden size mismatch: drafter {d.hidden_size}, target {t_hidden}.")
    if d.vocab_size != t_vocab:
        raise PairingError(f"Vocabulary size mismatch: drafter {d.vocab_size}, target {t_vocab}.")
    if d.num_target_layers != t_layers:
        raise PairingError(f"Drafter was trained on a {d.num_target_layers}-layer target; "
                           f"this target has {plural(t_layers, 'layer')}.")
    bad = [i for i in d.target_layer_ids if not 0 <= i < t_layers]
    if bad:
        raise PairingError(f"Drafter target_layer_ids {bad} are outside the target's layers 0..{t_layers - 1}.")
    if not 0 <= d.mask_token_id < t_vocab:
        raise PairingError(f"Drafter mask_token_id {d.mask_token_id} is outside the target vocabulary "
                           f"(size {t_vocab}).")

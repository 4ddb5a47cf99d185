"""DFlash block drafter (arXiv 2602.06036, z-lab/dflash ``dflash/model.py``), written from scratch.

The drafter is a few Qwen3-style decoder layers with no embedding and no lm_head of its own: the
caller embeds the block with the target's embeddings and applies the target's lm_head to our output.
Queries come from the block ("noise") states only; keys/values come from the projected target
context features *and* the block, attention is non-causal. Only context K/V are ever cached.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ddtree_viz.engine.backends import sdpa_backends
from ddtree_viz.errors import ModelLoadError, PairingError

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

    @classmethod
    def from_dict(cls, d: dict) -> "DFlashConfig":
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
            raise ModelLoadError(f"Drafter layer_types {list(layer_types)} must list {n_layers} entries "
                                 f"from {list(LAYER_TYPES)}.")
        hidden_act = d.get("hidden_act", "silu")
        if hidden_act not in _ACTIVATIONS:
            raise ModelLoadError(f"Drafter hidden_act '{hidden_act}' is not supported ({sorted(_ACTIVATIONS)}).")
        if block_size < 2:
            raise ModelLoadError(f"Drafter block_size must be at least 2, got {block_size}.")
        window = d.get("sliding_window")
        return cls(
            hidden_size=int(need("hidden_size")), intermediate_size=int(need("intermediate_size")),
            num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=n_kv,
            head_dim=int(d.get("head_dim") or 128), vocab_size=int(need("vocab_size")),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)), rope_theta=float(rope_theta),
            max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
            attention_bias=bool(d.get("attention_bias", False)), hidden_act=hidden_act,
            layer_types=layer_types, sliding_window=None if window is None else int(window),
            num_target_layers=num_target_layers, block_size=block_size, mask_token_id=mask_token_id,
            target_layer_ids=tuple(int(i) for i in layer_ids),
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
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ModelLoadError(f"Drafter config {path} is not readable JSON: {e}") from None
        return cls.from_dict(data)

    def to_dict(self) -> dict:
        d = asdict(self)
        dflash = {k: d.pop(k) for k in ("block_size", "mask_token_id", "target_layer_ids")}
        dflash["target_layer_ids"] = list(dflash["target_layer_ids"])
        d["layer_types"] = list(self.layer_types)
        # Qwen3Config drops sliding_window unless use_sliding_window is set.
        d["use_sliding_window"] = "sliding_attention" in self.layer_types
        d["rope_parameters"] = {"rope_theta": self.rope_theta, "rope_type": "default"}
        return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", **d,
                "block_size": self.block_size, "dflash_config": dflash}


# ------------------------------------------------------------------------------------ cache
class DraftKVCache:
    """Per draft layer K/V of the *context features* only (never the block), post-norm, post-RoPE."""

    def __init__(self, num_layers: int):
        self._kv: list[tuple[Tensor, Tensor] | None] = [None] * num_layers
        self.positions: Tensor | None = None  # [B, seq_length] positions of the stored rows

    @property
    def seq_length(self) -> int:
        return 0 if self.positions is None else self.positions.shape[-1]

    def crop(self, length: int) -> None:
        """Keep the first ``length`` context positions."""
        if length < 0:
            raise ValueError(f"crop length must be >= 0, got {length}")
        self._kv = [None if kv is None else (kv[0][:, :, :length], kv[1][:, :, :length]) for kv in self._kv]
        if self.positions is not None:
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
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


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

    def forward(self, x, x_ctx, rope, mask, cache):
        # The context features enter every layer as they left hidden_norm (no input_layernorm).
        x = x + self.self_attn(self.input_layernorm(x), x_ctx, rope, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.config = config
        self.target_layer_ids = list(config.target_layer_ids)
        self.block_size, self.mask_token_id = config.block_size, config.mask_token_id
        self.layers = nn.ModuleList(DFlashDecoderLayer(config, i) for i in range(config.num_hidden_layers))
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
                        device: str | torch.device = "cpu") -> "DFlashDrafter":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = Path(path)
        if not path.is_dir():
            raise ModelLoadError(f"Drafter directory not found: {path}")
        config = DFlashConfig.from_file(path / "config.json")
        index = path / "model.safetensors.index.json"
        if (path / "model.safetensors").is_file():
            files = [path / "model.safetensors"]
        elif index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise ModelLoadError(f"Drafter weight index {index} is unreadable: {e!r}") from None
            files = [path / f for f in sorted(set(weight_map.values()))]
        else:
            files = sorted(path.glob("*.safetensors"))
        if not files:
            raise ModelLoadError(f"No drafter weights in {path} (expected model.safetensors "
                                 f"or model.safetensors.index.json).")
        state: dict[str, Tensor] = {}
        for f in files:
            try:
                state.update(load_file(str(f), device=str(device)))
            except (OSError, SafetensorError) as e:
                raise ModelLoadError(f"Could not read drafter weights {f}: {e}") from None
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
        return model.eval()

    def save_pretrained(self, path: str | Path) -> None:
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(self.config.to_dict(), indent=2) + "\n", encoding="utf-8")
        save_file({k: v.detach().contiguous() for k, v in self.state_dict().items()},
                  str(path / "model.safetensors"), metadata={"format": "pt"})

    def new_cache(self) -> DraftKVCache:
        return DraftKVCache(self.config.num_hidden_layers)

    # ---- forward
    def _sliding_mask(self, q_pos: Tensor, ctx_pos: Tensor, L: int) -> Tensor:
        """Bool mask [B,1,L,ctx+L], True = visible: context keys more than a window back are hidden."""
        visible_ctx = ctx_pos[:, None, :] > q_pos[:, :, None] - self.config.sliding_window
        block = torch.ones(q_pos.shape[0], L, L, dtype=torch.bool, device=q_pos.device)
        return torch.cat([visible_ctx, block], dim=-1)[:, None]

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

        ctx_pos = position_ids[:, :C]
        if cache is not None and cache.positions is not None:
            ctx_pos = torch.cat([cache.positions.expand(B, -1), ctx_pos], dim=1)
        masks = {"full_attention": attention_mask, "sliding_attention": attention_mask}
        if self.config.sliding_window is not None and "sliding_attention" in self.config.layer_types:
            window = self._sliding_mask(position_ids[:, C:], ctx_pos, L)
            if attention_mask is None:
                masks["sliding_attention"] = window
            elif attention_mask.dtype == torch.bool:
                masks["sliding_attention"] = attention_mask & window
            else:
                masks["sliding_attention"] = attention_mask.masked_fill(~window, float("-inf"))

        x = noise_embedding
        with sdpa_backends(x.device):  # on CUDA: no cuDNN plan per context length (engine/backends.py)
            for layer, kind in zip(self.layers, self.config.layer_types):
                x = layer(x, x_ctx, rope, masks[kind], cache)
        if cache is not None:
            cache.positions = ctx_pos
        return self.norm(x)


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
                           f"this target has {t_layers} layers.")
    bad = [i for i in d.target_layer_ids if not 0 <= i < t_layers]
    if bad:
        raise PairingError(f"Drafter target_layer_ids {bad} are outside the target's layers 0..{t_layers - 1}.")
    if not 0 <= d.mask_token_id < t_vocab:
        raise PairingError(f"Drafter mask_token_id {d.mask_token_id} is outside the target vocabulary "
                           f"(size {t_vocab}).")

"""The target's cache: per-layer inspection, KV compaction and the Gated DeltaNet state commit."""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer, LinearAttentionLayer

from ..errors import ModelLoadError
from ..trace import LayerCache, TensorInfo
from .gdn_tree import GDNTreeStash, TreeIndex, commit_gdn_state


def layer_types(config) -> list[str]:
    """'linear_attention' / 'full_attention' per decoder layer (pure-attention models have no layer_types)."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = getattr(config, "layer_types", None)
    return list(types) if types else ["full_attention"] * config.num_hidden_layers


def new_cache(target) -> DynamicCache:
    """A DynamicCache laid out for the target (GDN layers get conv/recurrent state), checked to be one we can
    verify trees on: full-attention KV layers and linear-attention state layers only."""
    cache = DynamicCache(config=target.config)
    for idx, layer in enumerate(cache.layers):
        if isinstance(layer, DynamicSlidingWindowLayer) or type(layer) not in (DynamicLayer, LinearAttentionLayer):
            raise ModelLoadError(
                f"layer {idx} uses a {type(layer).__name__} cache; DDTree verification here supports full-attention "
                "and Gated DeltaNet layers only (no sliding-window or mixed layers)"
            )
    return cache


class BufferLayer(DynamicLayer):
    """A full-attention layer's cache that writes into given buffers ([1, kv_heads, max_len, head_dim], the
    runner's own) instead of growing a tensor of its own: a prefill through transformers' forward then leaves its
    keys and values where the runner reads them, with no second copy (1 GB at 16k tokens of a 27B target) and no
    torch.cat transient a chunk. `keys` / `values` are the buffers' first `length` rows, as DynamicLayer's are."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self._buffers, self.length = (keys, values), 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.is_initialized = key_states.device, True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, self.length = self.length, self.length + key_states.shape[-2]
        if self.length > self._buffers[0].shape[-2]:
            raise ValueError(f"{self.length} positions do not fit a buffer of {self._buffers[0].shape[-2]}")
        for buffer, states in zip(self._buffers, (key_states, value_states)):
            buffer[:, :, start:self.length].copy_(states)
        self.keys, self.values = (buffer[:, :, :self.length] for buffer in self._buffers)
        return self.keys, self.values


def prefill_cache(target, keys: dict[int, torch.Tensor], values: dict[int, torch.Tensor]) -> DynamicCache:
    """new_cache(target) with each full-attention layer i writing into keys[i] / values[i] (BufferLayer)."""
    cache = new_cache(target)
    for i in keys:
        cache.layers[i] = BufferLayer(keys[i], values[i])
    return cache


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _info(name: str, t: torch.Tensor) -> TensorInfo:
    return TensorInfo(name, tuple(int(s) for s in t.shape), _dtype_name(t.dtype))


def snapshot(cache: DynamicCache, types: list[str]) -> tuple[LayerCache, ...]:
    """What each layer holds now: tensor names, shapes, dtypes, bytes, KV rows."""
    out = []
    for idx, layer in enumerate(cache.layers):
        tensors: list[torch.Tensor] = []
        infos: list[TensorInfo] = []
        kv_length = None
        if isinstance(layer, LinearAttentionLayer):
            for name, t in (("conv_state", layer.conv_states[0]), ("recurrent_state", layer.recurrent_states[0])):
                if t is not None:
                    tensors.append(t)
                    infos.append(_info(name, t))
        elif getattr(layer, "keys", None) is not None:
            tensors = [layer.keys, layer.values]
            infos = [_info("keys", layer.keys), _info("values", layer.values)]
            kv_length = int(layer.keys.shape[-2]) if layer.keys.dim() == 4 else 0
        else:
            kv_length = 0
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        out.append(LayerCache(idx, types[idx], type(layer).__name__, tuple(infos), int(nbytes), kv_length))
    return tuple(out)


@torch.no_grad()
def cache_layout(target, types: list[str]) -> tuple[LayerCache, ...]:
    """The per-layer cache layout, measured on a one-token prefill (what the page shows before step 1)."""
    cache = new_cache(target)
    device = target.get_input_embeddings().weight.device
    target(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), cache=cache, use_cache=True, logits_to_keep=1)
    return snapshot(cache, types)


def compact_kv(cache: DynamicCache, tree_len: int, accepted: list[int]) -> None:
    """Attention layers: keep the committed prefix plus the accepted tree rows, in path order, contiguous."""
    for layer in cache.layers:
        if isinstance(layer, LinearAttentionLayer) or getattr(layer, "keys", None) is None:
            continue
        past = layer.keys.shape[-2] - tree_len
        keep = torch.tensor(accepted, dtype=torch.long, device=layer.keys.device) + past
        layer.keys = torch.cat([layer.keys[..., :past, :], layer.keys.index_select(-2, keep)], dim=-2)
        layer.values = torch.cat([layer.values[..., :past, :], layer.values.index_select(-2, keep)], dim=-2)


def commit_gdn(cache: DynamicCache, stash: dict[int, GDNTreeStash], index: dict, accepted: list[int]) -> None:
    """GDN layers: conv state = last raw inputs along the accepted path; recurrent state = the state after it."""
    for idx, layer_stash in stash.items():
        layer = cache.layers[idx]
        conv, rec = layer.conv_states[0], layer.recurrent_states[0]
        tree_index: TreeIndex = index[conv.device]
        new_conv, new_rec = commit_gdn_state(layer_stash, accepted, conv, rec, tree_index)
        conv.copy_(new_conv)
        rec.copy_(new_rec)


def state_distance(a: DynamicCache, b: DynamicCache) -> list[float | None]:
    """Per layer, max |a - b| over the recurrent state (GDN layers) or None (attention layers)."""
    out: list[float | None] = []
    for la, lb in zip(a.layers, b.layers):
        if isinstance(la, LinearAttentionLayer):
            out.append(float((la.recurrent_states[0].float() - lb.recurrent_states[0].float()).abs().max()))
        else:
            out.append(None)
    return out

"""A target dispatched by accelerate (device_map, hooks, weights offloaded to disk and materialised only when a
layer runs) decodes exactly like the plain one: the tree-exact GDN stand-in fires the hooks of the weights it
reads directly (A_log, dt_bias, conv1d). The GPU split itself (issue 7) needs two GPUs."""

import pytest
import torch
from accelerate import dispatch_model
from transformers.cache_utils import LinearAttentionLayer

from ddtree_viz.engine.session import DecodeSession
from tests import tiny

PROMPT = "def f(x):\n"


@pytest.mark.parametrize("verify", ["exact", "naive"])
def test_offloaded_layers_decode_like_the_plain_target(tmp_path, verify):
    plain = tiny.tiny_pair("hybrid", seed=0)
    ref = DecodeSession.of(plain, budget=16, max_new_tokens=24, verify=verify)
    ref.prefill(PROMPT)
    ref.run()

    pair = tiny.tiny_pair("hybrid", seed=0)
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
                  "model.layers.1": "disk", "model.layers.2": "cpu", "model.layers.3": "disk", "model.norm": "cpu",
                  "lm_head": "cpu"}
    dispatch_model(pair.target, device_map=device_map, offload_dir=str(tmp_path))
    gdn = pair.target.model.layers[1].linear_attn
    assert gdn.A_log.device.type == "meta" and gdn.conv1d.weight.device.type == "meta"  # really offloaded
    session = DecodeSession.of(pair, budget=16, max_new_tokens=24, verify=verify)
    session.prefill(PROMPT)
    session.run()
    assert session.generated == ref.generated
    assert [r.accepted for r in session.history] == [r.accepted for r in ref.history]
    if verify == "exact":
        assert session.divergence() == (None, None)


def _split_devices():
    cases = [pytest.param(("cpu", "cpu"), id="cpu+cpu")]
    two_gpus = torch.cuda.is_available() and torch.cuda.device_count() >= 2
    cases.append(pytest.param(("cuda:0", "cuda:1"), id="cuda0+cuda1",
                              marks=pytest.mark.skipif(not two_gpus, reason="needs two CUDA GPUs (issue 7)")))
    return cases


@pytest.mark.parametrize("devices", _split_devices())
@pytest.mark.parametrize("verify", ["exact", "naive"])
def test_target_split_over_two_devices(devices, verify):
    """The target's layers split over two devices as device_map="auto" splits them (embeddings with the first
    half, norm and lm_head with the second, the drafter on the first): every layer computes on its own device
    in the tree pass too, each layer's cache stays there, and exact DDTree equals greedy."""
    first, second = devices
    pair = tiny.tiny_pair("hybrid", seed=0, layers=8)
    n = pair.target.config.num_hidden_layers
    device_map = {"model.embed_tokens": first, "model.rotary_emb": first, "model.norm": second, "lm_head": second,
                  **{f"model.layers.{i}": (first if i < n // 2 else second) for i in range(n)}}
    dispatch_model(pair.target, device_map=device_map)
    pair.drafter.to(first)

    seen: dict[int, set[str]] = {}

    def record(idx):
        def hook(_module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            seen.setdefault(idx, set()).add(str(hidden.device))
        return hook

    handles = []
    for idx, layer in enumerate(pair.target.model.layers):  # inside the layer: after accelerate moved the inputs
        handles.append(layer.input_layernorm.register_forward_pre_hook(record(idx), with_kwargs=True))
        handles.append(layer.mlp.register_forward_pre_hook(record(idx), with_kwargs=True))
    session = DecodeSession.of(pair, budget=16, max_new_tokens=24, verify=verify)
    session.prefill(PROMPT)
    session.run()
    for h in handles:
        h.remove()

    for idx in range(n):
        assert seen[idx] == {str(torch.device(device_map[f"model.layers.{idx}"]))}, (idx, seen[idx])
    for idx, layer in enumerate(session.cache.layers):
        if isinstance(layer, LinearAttentionLayer):
            held = [layer.conv_states[0], layer.recurrent_states[0]]
        else:
            held = [layer.keys, layer.values]
        assert held and all(t.device == torch.device(device_map[f"model.layers.{idx}"]) for t in held), idx
    assert len(session.generated) == 24
    if verify == "exact":
        assert session.divergence() == (None, None)

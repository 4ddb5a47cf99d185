"""A target dispatched by accelerate (device_map, hooks, weights offloaded to disk and materialised only when a
layer runs) decodes exactly like the plain one: the tree-exact GDN stand-in fires the hooks of the weights it
reads directly (A_log, dt_bias, conv1d). The GPU split itself (issue 7) needs two GPUs."""

import pytest
from accelerate import dispatch_model

import tiny
from ddtree_viz.engine.session import DecodeSession

PROMPT = "def f(x):\n"


@pytest.mark.parametrize("verify", ["exact", "naive"])
def test_offloaded_layers_decode_like_the_plain_target(tmp_path, verify):
    plain = tiny.tiny_pair("hybrid", seed=0)
    ref = DecodeSession(plain, budget=16, max_new_tokens=24, verify=verify)
    ref.prefill(PROMPT)
    ref.run()

    pair = tiny.tiny_pair("hybrid", seed=0)
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
                  "model.layers.1": "disk", "model.layers.2": "cpu", "model.layers.3": "disk", "model.norm": "cpu",
                  "lm_head": "cpu"}
    dispatch_model(pair.target, device_map=device_map, offload_dir=str(tmp_path))
    gdn = pair.target.model.layers[1].linear_attn
    assert gdn.A_log.device.type == "meta" and gdn.conv1d.weight.device.type == "meta"  # really offloaded
    session = DecodeSession(pair, budget=16, max_new_tokens=24, verify=verify)
    session.prefill(PROMPT)
    session.run()
    assert session.generated == ref.generated
    assert [r.accepted for r in session.history] == [r.accepted for r in ref.history]
    if verify == "exact":
        assert session.divergence() == (None, None)

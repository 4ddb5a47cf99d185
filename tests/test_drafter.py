"""DFlash drafter: equivalence with z-lab semantics, caching, IO, config and pairing checks."""

import json
import re
import math

import pytest
import torch

from ddtree_viz.engine.drafter import (
    DFlashConfig,
    DFlashDrafter,
    build_target_layer_ids,
    extract_context_features,
    validate_pairing,
)
from ddtree_viz.errors import ModelLoadError, PairingError
from ddtree_viz.configs import CONFIGS

REAL_CONFIG = CONFIGS / "qwen3.6-27b-dflash-config.json"


def tiny_config(layer_types=None, sliding_window=None, **over) -> DFlashConfig:
    n_layers = over.pop("num_hidden_layers", 3)
    d = {
        "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": n_layers,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 97,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 512,
        "num_target_layers": 8, "block_size": 4,
        "dflash_config": {"block_size": 4, "mask_token_id": 96, "target_layer_ids": [1, 4, 6]},
    }
    if layer_types is not None:
        d["layer_types"] = layer_types
    if sliding_window is not None:
        d["sliding_window"] = sliding_window
    d.update(over)
    return DFlashConfig.from_dict(d)


def random_drafter(config: DFlashConfig, seed: int = 0) -> DFlashDrafter:
    torch.manual_seed(seed)
    model = DFlashDrafter(config)
    with torch.no_grad():  # norms away from 1 so a missing weight multiply would show
        for name, p in model.named_parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p))
    return model.eval()


# --------------------------------------------------------------- independent reference (eager)
def reference_forward(model: DFlashDrafter, noise, target_hidden, position_ids):
    """z-lab semantics spelled out: K/V from the full context + block, no cache."""
    c, W = model.config, dict(model.named_parameters())

    def rms(x, w):
        return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + c.rms_norm_eps))

    def rope(x, pos):  # x [B, h, N, D], pos [B, N]
        half = c.head_dim // 2
        inv = c.rope_theta ** (-torch.arange(half, dtype=torch.float64) * 2 / c.head_dim)
        ang = (pos.double()[..., None] * inv)[:, None]
        cos, sin = ang.cos().float(), ang.sin().float()
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    B, L, _ = noise.shape
    C = target_hidden.shape[1]
    ctx = rms(target_hidden @ W["fc.weight"].T, W["hidden_norm.weight"])
    h = noise
    q_pos, k_pos = position_ids[:, C:], position_ids
    for i, kind in enumerate(c.layer_types):
        p = lambda n: W[f"layers.{i}.{n}"]  # noqa: E731
        x = rms(h, p("input_layernorm.weight"))
        both = torch.cat([ctx, x], dim=1)
        q = (x @ p("self_attn.q_proj.weight").T).view(B, L, c.num_attention_heads, c.head_dim)
        k = (both @ p("self_attn.k_proj.weight").T).view(B, C + L, c.num_key_value_heads, c.head_dim)
        v = (both @ p("self_attn.v_proj.weight").T).view(B, C + L, c.num_key_value_heads, c.head_dim)
        q = rope(rms(q, p("self_attn.q_norm.weight")).transpose(1, 2), q_pos)
        k = rope(rms(k, p("self_attn.k_norm.weight")).transpose(1, 2), k_pos)
        v = v.transpose(1, 2)
        g = c.num_attention_heads // c.num_key_value_heads
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(c.head_dim)
        # z-lab's mask: causal layers (sliding ones unless is_causal says otherwise) hide later keys; a sliding
        # window hides keys `window` or more positions back (and ahead, for a bidirectional layer)
        back = q_pos[:, :, None] - k_pos[:, None, :]
        causal = c.is_causal if c.is_causal is not None else kind == "sliding_attention"
        hidden = (back < 0) if causal else torch.zeros_like(back, dtype=torch.bool)
        if kind == "sliding_attention":
            hidden |= back >= c.sliding_window
            if not causal:
                hidden |= -back >= c.sliding_window
        scores = scores.masked_fill(hidden[:, None], float("-inf"))
        attn = scores.softmax(-1) @ v
        h = h + attn.transpose(1, 2).reshape(B, L, -1) @ p("self_attn.o_proj.weight").T
        x = rms(h, p("post_attention_layernorm.weight"))
        mlp = torch.nn.functional.silu(x @ p("mlp.gate_proj.weight").T) * (x @ p("mlp.up_proj.weight").T)
        h = h + mlp @ p("mlp.down_proj.weight").T
    return rms(h, W["norm.weight"])


CONFIGS = {
    "full": dict(),
    "sliding": dict(layer_types=["sliding_attention", "full_attention", "sliding_attention"], sliding_window=5),
}


def inputs(config, B, C, start, seed=1):
    g = torch.Generator().manual_seed(seed)
    H, L = config.hidden_size, config.block_size
    noise = torch.randn(B, L, H, generator=g)
    ctx = torch.randn(B, C, len(config.target_layer_ids) * H, generator=g)
    pos = torch.arange(start, start + C + L).expand(B, -1)
    return noise, ctx, pos


@pytest.mark.parametrize("kind", CONFIGS)
def test_forward_matches_reference_no_cache(kind):
    config = tiny_config(**CONFIGS[kind])
    model = random_drafter(config)
    noise, ctx, pos = inputs(config, B=2, C=11, start=0)
    with torch.no_grad():
        out = model(noise, ctx, pos)
        ref = reference_forward(model, noise, ctx, pos)
    assert out.shape == noise.shape
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_sliding_window_actually_masks():
    sliding = random_drafter(tiny_config(**CONFIGS["sliding"]))
    full = DFlashDrafter(tiny_config())
    full.load_state_dict(sliding.state_dict())
    noise, ctx, pos = inputs(sliding.config, B=1, C=11, start=0)
    with torch.no_grad():
        assert (sliding(noise, ctx, pos) - full(noise, ctx, pos)).abs().max() > 1e-3


@pytest.mark.parametrize("kind", CONFIGS)
def test_incremental_cache_matches_full_context(kind):
    """Decoder use: round r feeds only new context rows + the block; cache grows by context only."""
    config = tiny_config(**CONFIGS[kind])
    model = random_drafter(config)
    L, n = config.block_size, len(config.target_layer_ids) * config.hidden_size
    g = torch.Generator().manual_seed(7)
    all_ctx = torch.randn(1, 0, n)
    cache = model.new_cache()
    for new_rows in (7, 3, 1):  # prefill, then accepted lengths
        start = cache.seq_length
        new_ctx = torch.randn(1, new_rows, n, generator=g)
        all_ctx = torch.cat([all_ctx, new_ctx], dim=1)
        noise = torch.randn(1, L, config.hidden_size, generator=g)
        committed = all_ctx.shape[1]
        with torch.no_grad():
            out = model(noise, new_ctx, torch.arange(start, committed + L)[None], cache=cache)
            ref = reference_forward(model, noise, all_ctx, torch.arange(committed + L)[None])
            plain = model(noise, all_ctx, torch.arange(committed + L)[None])
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out, plain, atol=1e-5, rtol=1e-5)
        assert cache.seq_length == committed
        tensors = cache.layer_tensors()
        assert len(tensors) == config.num_hidden_layers
        # a full layer holds every context row, a sliding one the window - 1 newest (no later block sees older)
        rows = [committed if w is None else min(committed, w - 1) for w in config.layer_windows]
        assert [k.shape for k, _ in tensors] == [(1, config.num_key_value_heads, r, config.head_dim) for r in rows]
    if kind == "full":
        cache.crop(5)
        assert cache.seq_length == 5 and all(k.shape[2] == 5 == v.shape[2] for k, v in cache.layer_tensors())
    else:  # its sliding layers keep rows 7..10 (window 5), exactly what a block at 11 sees: a block at 10 would
        # also see row 6, dropped, so no crop back is possible; cropping to nothing is
        for length in (5, 10):
            with pytest.raises(ValueError, match="cannot crop draft layer 0"):
                cache.crop(length)
        cache.crop(0)
        assert cache.seq_length == 0 and all(k.shape[2] == 0 for k, _ in cache.layer_tensors())


def test_empty_new_context_and_attention_mask():
    config = tiny_config(**CONFIGS["sliding"])
    model = random_drafter(config)
    noise, ctx, pos = inputs(config, B=1, C=9, start=0)
    cache = model.new_cache()
    with torch.no_grad():
        model(noise, ctx, pos, cache=cache)  # prefill 9 rows
        out = model(noise, ctx[:, :0], pos[:, 9:], cache=cache)  # nothing new: C = 0
        ref = reference_forward(model, noise, ctx, pos)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        assert cache.seq_length == 9
        # An all-visible extra mask changes nothing (bool and additive forms).
        keep = torch.ones(1, 1, config.block_size, 9 + config.block_size, dtype=torch.bool)
        torch.testing.assert_close(model(noise, ctx, pos, attention_mask=keep), ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model(noise, ctx, pos, attention_mask=torch.zeros(keep.shape)), ref,
                                   atol=1e-5, rtol=1e-5)


def test_extract_context_features():
    hs = [torch.full((1, 2, 3), float(i)) for i in range(9)]  # 0 = embeddings, i = output of layer i-1
    feats = extract_context_features(hs, [1, 4, 6])
    assert feats.shape == (1, 2, 9)
    assert feats[0, 0].tolist() == [2.0] * 3 + [5.0] * 3 + [7.0] * 3


def test_build_target_layer_ids():
    assert build_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]
    assert build_target_layer_ids(8, 1) == [4]


# ----------------------------------------------------------------------------------- IO
def test_save_and_load_round_trip(tmp_path):
    config = tiny_config(**CONFIGS["sliding"])
    model = random_drafter(config)
    model.save_pretrained(tmp_path)
    loaded = DFlashDrafter.from_pretrained(tmp_path)
    assert loaded.config == config
    assert DFlashConfig.from_dict(config.to_dict()) == config
    noise, ctx, pos = inputs(config, B=1, C=6, start=0)
    with torch.no_grad():
        assert torch.equal(model(noise, ctx, pos), loaded(noise, ctx, pos))
    bf16 = DFlashDrafter.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert bf16.fc.weight.dtype == torch.bfloat16


def test_sharded_checkpoint(tmp_path):
    from safetensors.torch import load_file, save_file

    model = random_drafter(tiny_config())
    model.save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors").unlink()
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for fname, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(tmp_path / fname))
    index = {"weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    loaded = DFlashDrafter.from_pretrained(tmp_path)
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v)


def test_fixture_config_builds_on_meta():
    config = DFlashConfig.from_file(REAL_CONFIG)
    assert config.layer_types == ("sliding_attention",) * 4 + ("full_attention",)
    assert config.sliding_window == 2048
    assert config.target_layer_ids == (1, 16, 31, 46, 61)
    assert config.block_size == 16 and config.mask_token_id == 248070
    assert config.num_target_layers == 64
    model = DFlashDrafter.from_config_meta(config)
    assert model.fc.weight.is_meta and model.fc.weight.shape == (5120, 5 * 5120)
    assert model.layers[0].self_attn.k_proj.weight.shape == (8 * 128, 5120)
    assert model.target_layer_ids == [1, 16, 31, 46, 61] and model.block_size == 16
    assert model.mask_token_id == 248070
    assert DFlashConfig.from_dict(config.to_dict()) == config
    names = set(model.state_dict())
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.4.self_attn.q_norm.weight",
            "layers.0.mlp.down_proj.weight", "layers.2.post_attention_layernorm.weight"} <= names


def test_config_defaults_and_missing_keys():
    d = json.loads(REAL_CONFIG.read_text())
    for key in ("layer_types", "sliding_window", "rope_theta", "head_dim"):
        d.pop(key)
    d["dflash_config"].pop("target_layer_ids")
    d["rope_parameters"] = {"rope_theta": 5e6, "rope_type": "default"}
    c = DFlashConfig.from_dict(d)
    assert c.layer_types == ("full_attention",) * 5 and c.sliding_window is None
    assert c.rope_theta == 5e6 and c.head_dim == 128 and c.target_layer_ids == (1, 16, 31, 46, 61)
    for path in (("hidden_size",), ("dflash_config", "mask_token_id")):
        bad = json.loads(REAL_CONFIG.read_text())
        (bad[path[0]] if len(path) == 2 else bad).pop(path[-1])
        with pytest.raises(ModelLoadError, match=path[-1]):
            DFlashConfig.from_dict(bad)


def test_load_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        DFlashDrafter.from_pretrained(tmp_path / "nope")
    model = random_drafter(tiny_config())
    model.save_pretrained(tmp_path / "ok")

    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((tmp_path / "ok" / "config.json").read_text())
    with pytest.raises(ModelLoadError, match="no drafter weights in"):
        DFlashDrafter.from_pretrained(no_weights)
    # issue #64 class 4: an index whose weight_map is not names -> files, or names a path or a pipe, is refused by
    # name before any weight is read (a list or a number ended in a traceback; a pipe hung the load)
    import os
    for weight_map, words in (([1, 2], "must map each tensor name"), (7, "must map each tensor name"),
                              ({"w": ["a.safetensors"]}, "must map each tensor name"),
                              ({"w": "../ok/model.safetensors"}, "is a path, not a file of the folder"),
                              ({"w": "pipe.safetensors"}, "is not a regular file"),
                              ({"w": "absent.safetensors"}, "cannot be read")):
        (no_weights / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        if not (no_weights / "pipe.safetensors").exists():
            os.mkfifo(no_weights / "pipe.safetensors")
        with pytest.raises(ModelLoadError, match=re.escape(words)):
            DFlashDrafter.from_pretrained(no_weights)
    (no_weights / "model.safetensors.index.json").write_text("[" * 100_000)
    with pytest.raises(ModelLoadError, match="weight index .* is unreadable"):
        DFlashDrafter.from_pretrained(no_weights)

    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="JSON"):
        DFlashDrafter.from_pretrained(corrupt)

    no_config = tmp_path / "no_config"
    no_config.mkdir()
    with pytest.raises(ModelLoadError, match="config"):
        DFlashDrafter.from_pretrained(no_config)

    wrong = tmp_path / "wrong"
    d = model.config.to_dict()
    d["intermediate_size"] = 40
    wrong.mkdir()
    (wrong / "config.json").write_text(json.dumps(d))
    (wrong / "model.safetensors").write_bytes((tmp_path / "ok" / "model.safetensors").read_bytes())
    with pytest.raises(ModelLoadError, match=r"wrong shape.*mlp"):
        DFlashDrafter.from_pretrained(wrong)

    from safetensors.torch import save_file
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state.pop("fc.weight")
    state["lm_head.weight"] = torch.zeros(2, 2)
    save_file(state, str(tmp_path / "ok" / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"missing: fc.weight.*unexpected: lm_head.weight"):
        DFlashDrafter.from_pretrained(tmp_path / "ok")
    (tmp_path / "ok" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ModelLoadError, match="Could not read"):
        DFlashDrafter.from_pretrained(tmp_path / "ok")


# ------------------------------------------------------------------------------ pairing
def test_validate_pairing():
    from transformers import Qwen3Config
    from transformers.models.qwen3_5 import Qwen3_5Config, Qwen3_5TextConfig

    d = tiny_config()  # hidden 32, vocab 97, 8 target layers, ids [1, 4, 6], mask 96
    base = dict(hidden_size=32, vocab_size=97, num_hidden_layers=8, num_attention_heads=4)
    validate_pairing(d, Qwen3Config(**base))
    validate_pairing(d, Qwen3_5TextConfig(**base))
    validate_pairing(d, Qwen3_5Config(text_config=base))  # composite: text config is used
    validate_pairing(DFlashDrafter.from_config_meta(d), Qwen3Config(**base))

    with pytest.raises(PairingError, match=r"32.*64"):
        validate_pairing(d, Qwen3Config(**{**base, "hidden_size": 64}))
    with pytest.raises(PairingError, match=r"97.*120"):
        validate_pairing(d, Qwen3Config(**{**base, "vocab_size": 120}))
    with pytest.raises(PairingError, match=r"8.*6"):
        validate_pairing(d, Qwen3Config(**{**base, "num_hidden_layers": 6}))
    bad_ids = tiny_config(dflash_config={"block_size": 4, "mask_token_id": 96, "target_layer_ids": [1, 4, 8]})
    with pytest.raises(PairingError, match=r"\[8\]"):
        validate_pairing(bad_ids, Qwen3Config(**base))
    bad_mask = tiny_config(dflash_config={"block_size": 4, "mask_token_id": 97, "target_layer_ids": [1, 4, 6]})
    with pytest.raises(PairingError, match="mask_token_id 97"):
        validate_pairing(bad_mask, Qwen3Config(**base))


# ------------------------------------------------------------------------------ attention backend
def test_cuda_sdpa_leaves_cudnn_out_and_the_cpu_path_alone():
    """engine/backends.py: on CUDA the drafter's (and transformers') SDPA may use flash / memory-efficient / math
    but not cuDNN (a plan built per new context length: 18 ms of host time a call on an H200); on the CPU the
    context changes nothing, so CPU outputs stay bit for bit what they were."""
    from ddtree_viz.engine.backends import sdpa_backends

    flags = lambda: (torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled(),  # noqa: E731
                     torch.backends.cuda.mem_efficient_sdp_enabled(), torch.backends.cuda.math_sdp_enabled())
    before = flags()
    with sdpa_backends("cuda"):
        assert flags() == (False, True, True, True)
    assert flags() == before
    with sdpa_backends(torch.device("cpu")):
        assert flags() == before
    # the flags do reach CPU SDPA (its own flash kernel), hence a no-op off CUDA rather than the CUDA choice
    drafter = random_drafter(tiny_config())
    noise, ctx = torch.randn(1, 4, 32), torch.randn(1, 5, 96)
    with torch.no_grad(), sdpa_backends(noise.device):
        assert torch.equal(drafter(noise, ctx, torch.arange(9)), drafter(noise, ctx, torch.arange(9)))


# ------------------------------------------------------------- the published sliding-window drafter
def published_layout(tmp_path, window: int = 6, **over):
    """The Qwen3.6-27B-DFlash config.json as published (every field kept: architectures, model_type, top-level
    block_size, layer_types with four sliding layers + one full, sliding_window, dflash_config) at toy widths and
    a toy window, saved with random weights and loaded back the way `--draft DIR` loads it."""
    d = json.loads(REAL_CONFIG.read_text())
    d.update(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             vocab_size=97, num_target_layers=8, block_size=4, sliding_window=window,
             dflash_config={"block_size": 4, "mask_token_id": 96, "target_layer_ids": [1, 4, 6]}, **over)
    random_drafter(DFlashConfig.from_dict(d)).save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(d))  # the file as published, not our to_dict's
    return DFlashDrafter.from_pretrained(tmp_path)


def with_config(model: DFlashDrafter, **changes) -> DFlashDrafter:
    """The same weights under another attention layout."""
    other = DFlashDrafter(DFlashConfig.from_dict({**model.config.to_dict(), **changes})).eval()
    other.load_state_dict(model.state_dict())
    return other


def test_published_config_loads_with_its_sliding_window_layers(tmp_path):
    model = published_layout(tmp_path)
    c = model.config
    assert json.loads(REAL_CONFIG.read_text())["layer_types"] == list(c.layer_types)
    assert c.layer_types == ("sliding_attention",) * 4 + ("full_attention",) and c.sliding_window == 6
    assert c.layer_causal == (True,) * 4 + (False,)  # causal SWA layers, a bidirectional full layer
    assert c.layer_windows == (6,) * 4 + (None,)
    # Qwen3Config's gate (use_sliding_window false drops the window) is not ours: the layers keep their window
    assert published_layout(tmp_path / "gate", use_sliding_window=False).config.layer_windows == (6,) * 4 + (None,)
    with pytest.raises(ModelLoadError, match="sliding_window"):
        published_layout(tmp_path / "none", window=None)


def test_the_window_is_applied_beyond_its_length(tmp_path):
    """A context longer than the window changes the drafter's output against the same layers without a window;
    one that fits in the window does not. Running the sliding layers as full attention (no window, bidirectional)
    changes it even on a short context."""
    model = published_layout(tmp_path, window=6)  # block 4: a block at position p sees context back to p - 5
    no_window = with_config(model, sliding_window=10**6)
    as_full = with_config(model, layer_types=["full_attention"] * 5, sliding_window=None)
    with torch.no_grad():
        noise, ctx, pos = inputs(model.config, B=1, C=2, start=0)  # 2 context rows + the block: all within 6
        torch.testing.assert_close(model(noise, ctx, pos), no_window(noise, ctx, pos), atol=1e-6, rtol=1e-6)
        assert (model(noise, ctx, pos) - as_full(noise, ctx, pos)).abs().max() > 1e-3
        noise, ctx, pos = inputs(model.config, B=1, C=12, start=0)  # 12 context rows: the window cuts
        assert (model(noise, ctx, pos) - no_window(noise, ctx, pos)).abs().max() > 1e-3
        assert (model(noise, ctx, pos) - as_full(noise, ctx, pos)).abs().max() > 1e-3
        torch.testing.assert_close(model(noise, ctx, pos), reference_forward(model, noise, ctx, pos),
                                   atol=1e-5, rtol=1e-5)


def test_the_cache_across_rounds_respects_the_window(tmp_path):
    """Rounds of a decode (prefill, then the accepted rows each round): the cached drafter equals the drafter
    run on the whole context every round, and its sliding layers hold only window - 1 rows."""
    model = published_layout(tmp_path, window=6)
    c, L = model.config, model.config.block_size
    g = torch.Generator().manual_seed(3)
    n = len(c.target_layer_ids) * c.hidden_size
    cache, all_ctx = model.new_cache(), torch.zeros(1, 0, n)
    for new_rows in (9, 2, 4, 1, 3):
        new_ctx = torch.randn(1, new_rows, n, generator=g)
        all_ctx = torch.cat([all_ctx, new_ctx], dim=1)
        committed = all_ctx.shape[1]
        noise = torch.randn(1, L, c.hidden_size, generator=g)
        with torch.no_grad():
            out = model(noise, new_ctx, torch.arange(committed - new_rows, committed + L)[None], cache=cache)
            whole = model(noise, all_ctx, torch.arange(committed + L)[None])
        torch.testing.assert_close(out, whole, atol=1e-5, rtol=1e-5)
        assert [cache.rows(i) for i in range(5)] == [min(committed, 5)] * 4 + [committed]


def test_a_session_with_a_sliding_drafter_stays_exact():
    """DecodeSession with a sliding-window drafter on a prompt longer than its window: exact (output == greedy),
    and the proposer's cache holds window - 1 rows in its sliding layers."""
    from ddtree_viz.engine.models import ModelPair
    from ddtree_viz.engine.session import DecodeSession
    from tests import tiny

    target = tiny.target_model("hybrid", seed=0)
    d = tiny.drafter_config(target.config, block_size=4, layers=3).to_dict()
    d.update(layer_types=["sliding_attention", "sliding_attention", "full_attention"], sliding_window=8)
    torch.manual_seed(1)
    drafter = DFlashDrafter(DFlashConfig.from_dict(d)).eval()
    pair = ModelPair(target, tiny.byte_tokenizer(), drafter, "tiny", "tiny-swa", torch.float32, "cpu")
    session = DecodeSession.of(pair, budget=6, max_new_tokens=12)
    session.prefill("def window(longer_than_eight):\n")
    session.run()
    assert tuple(session.generated) == session.greedy().ids
    cache = session.proposer.cache
    assert cache.seq_length > 8 and [cache.rows(i) for i in range(3)] == [7, 7, cache.seq_length]

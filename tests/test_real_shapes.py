"""Qwen3.6-27B + its DFlash drafter at real shapes, built from the configs shipped in ddtree_viz/configs on the
meta device (no weights): the loading path's pairing checks, layer types and cache layout (48 GDN + 16 attention)."""

import json
from collections import Counter

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache, Qwen3_5TextConfig

from ddtree_viz.engine.cache import layer_types
from ddtree_viz.engine.drafter import DFlashConfig, DFlashDrafter, validate_pairing
from ddtree_viz.engine.models import _check_local
from ddtree_viz.engine.verify import gdn_modules
from ddtree_viz.errors import PairingError
from ddtree_viz.configs import CONFIGS


def target_config() -> Qwen3_5TextConfig:
    raw = json.loads((CONFIGS / "qwen3.6-27b-text-config.json").read_text())
    return Qwen3_5TextConfig(**{k: v for k, v in raw.items() if not k.startswith("_") and k not in ("model_type", "architectures")})


@pytest.fixture(scope="module")
def meta_target():
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(target_config())


def test_real_target_layout_on_meta(meta_target):
    assert type(meta_target).__name__ == "Qwen3_5ForCausalLM"
    params = sum(p.numel() for p in meta_target.parameters())
    assert 26.5e9 < params < 27.5e9  # 53.8 GB in bf16
    types = layer_types(meta_target.config)
    assert Counter(types) == {"linear_attention": 48, "full_attention": 16}
    assert types[:4] == ["linear_attention"] * 3 + ["full_attention"]
    gdn = gdn_modules(meta_target)  # every GDN layer is one the tree-exact verifier supports
    assert sorted(gdn) == [i for i, t in enumerate(types) if t == "linear_attention"]
    layer = gdn[0]
    assert (layer.num_k_heads, layer.num_v_heads, layer.head_k_dim, layer.head_v_dim) == (16, 48, 128, 128)
    assert layer.conv_dim == 2 * 16 * 128 + 48 * 128 and layer.conv_kernel_size == 4
    cache = DynamicCache(config=meta_target.config)
    assert Counter(type(entry).__name__ for entry in cache.layers) == {"LinearAttentionLayer": 48, "DynamicLayer": 16}


def test_real_drafter_pairs_with_the_real_target(meta_target):
    cfg = DFlashConfig.from_file(CONFIGS / "qwen3.6-27b-dflash-config.json")
    validate_pairing(cfg, meta_target.config)
    drafter = DFlashDrafter.from_config_meta(cfg)
    assert drafter.target_layer_ids == [1, 16, 31, 46, 61] and drafter.block_size == 16
    assert drafter.mask_token_id == 248070
    assert drafter.fc.weight.shape == (5120, 5 * 5120)
    assert sum(p.numel() for p in drafter.parameters()) > 1e9
    # the pairing check catches a drafter for another target
    wrong = DFlashConfig.from_dict({**cfg.to_dict(), "num_target_layers": 48,
                                    "dflash_config": {**cfg.to_dict()["dflash_config"], "target_layer_ids": [1, 16, 31, 46, 63]}})
    with pytest.raises(PairingError):
        validate_pairing(wrong, meta_target.config)


def test_hub_ids_and_local_dirs_are_told_apart(tmp_path):
    assert _check_local("Qwen/Qwen3.6-27B", "target") is None  # a hub id
    assert _check_local("z-lab/Qwen3.6-27B-DFlash", "drafter") is None
    (tmp_path / "config.json").write_text("{}")
    assert _check_local(str(tmp_path), "target") == tmp_path

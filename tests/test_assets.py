"""The embedded default pair in assets/: loads offline, has the hybrid shape, fits the size budget.

CPU only, no network (HF_HUB_OFFLINE is set before transformers is imported by these tests).
Exactness of DDTree against greedy on these assets lives with the engine's tests.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "assets"
TARGET = ASSETS / "tiny-qwen35-target"
DRAFT = ASSETS / "tiny-qwen35-dflash"
MAX_ASSETS_BYTES = 25 * 2**20


@pytest.fixture(scope="module")
def target():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(TARGET)).eval()


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TARGET))


@pytest.fixture(scope="module")
def drafter():
    from ddtree_viz.engine.drafter import DFlashDrafter

    return DFlashDrafter.from_pretrained(DRAFT)


def test_files_present_and_small():
    for d, names in ((TARGET, ("config.json", "generation_config.json", "model.safetensors.index.json")),
                     (DRAFT, ("config.json", "model.safetensors"))):
        for name in names + ("tokenizer.json", "tokenizer_config.json"):
            assert (d / name).is_file(), f"{d.name}/{name} missing"
    total = sum(p.stat().st_size for p in ASSETS.rglob("*") if p.is_file())
    assert total <= MAX_ASSETS_BYTES, f"assets/ is {total / 2**20:.2f} MiB, over 25 MiB"
    index = json.loads((TARGET / "model.safetensors.index.json").read_text())
    for shard in set(index["weight_map"].values()):  # the target's weights are sharded, each file < 8 MiB
        assert (TARGET / shard).stat().st_size < 8 * 2**20
    # one tokenizer for both directories
    assert (TARGET / "tokenizer.json").read_bytes() == (DRAFT / "tokenizer.json").read_bytes()


def test_target_config_is_hybrid_qwen35():
    from transformers import AutoConfig, Qwen3_5TextConfig

    cfg = AutoConfig.from_pretrained(str(TARGET))
    assert isinstance(cfg, Qwen3_5TextConfig) and cfg.model_type == "qwen3_5_text"
    assert cfg.architectures == ["Qwen3_5ForCausalLM"]
    n = cfg.num_hidden_layers
    assert n >= 8 and n % 4 == 0
    assert cfg.layer_types == ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]
    assert cfg.linear_num_value_heads > cfg.linear_num_key_heads
    assert cfg.linear_num_value_heads % cfg.linear_num_key_heads == 0
    rope = cfg.rope_parameters
    assert rope["partial_rotary_factor"] == 0.25
    rotary_dim = int(cfg.head_dim * rope["partial_rotary_factor"])
    assert sum(rope["mrope_section"]) == rotary_dim // 2
    assert rope["mrope_interleaved"] is True


def test_target_loads_offline(target):
    from transformers import Qwen3_5ForCausalLM

    assert isinstance(target, Qwen3_5ForCausalLM)
    assert target.dtype == torch.float32  # config dtype float32: the default load is float32
    kinds = [type(layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn).__name__
             for layer in target.model.layers]
    assert kinds.count("Qwen3_5GatedDeltaNet") == 3 * kinds.count("Qwen3_5Attention")
    # weights are stored as bfloat16 values: float32 parameters round-trip through bf16 exactly
    p = target.model.layers[0].linear_attn.in_proj_qkv.weight
    assert torch.equal(p, p.to(torch.bfloat16).float())


def test_tokenizer_special_tokens_and_round_trip(tokenizer, drafter):
    from transformers import AutoTokenizer

    assert tokenizer.eos_token == "<|endoftext|>"
    assert tokenizer.convert_tokens_to_ids("<|MASK|>") == drafter.config.mask_token_id
    assert tokenizer.mask_token_id == drafter.config.mask_token_id
    assert tokenizer.eos_token_id != drafter.config.mask_token_id
    assert len(tokenizer) == drafter.config.vocab_size
    text = 'def f(x):\r\n\t"""Doc ünïcode ✓ 😀."""\n    return {x: [1, 2.5e-3]}  # trailing   \n\n\n'
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert tokenizer(text)["input_ids"] == ids  # no BOS/EOS added
    assert tokenizer("<|endoftext|><|MASK|>", add_special_tokens=False)["input_ids"] == [
        tokenizer.eos_token_id, tokenizer.mask_token_id]
    other = AutoTokenizer.from_pretrained(str(DRAFT))
    assert other(text, add_special_tokens=False)["input_ids"] == ids


def test_drafter_pairs_with_target(target, drafter):
    from ddtree_viz.engine.drafter import DFlashConfig, validate_pairing

    cfg = DFlashConfig.from_file(DRAFT / "config.json")
    raw = json.loads((DRAFT / "config.json").read_text())
    assert raw["dflash_config"]["block_size"] == cfg.block_size and 8 <= cfg.block_size <= 16
    assert 1 <= cfg.num_hidden_layers <= 3
    validate_pairing(cfg, target.config)
    assert cfg.hidden_size == target.config.hidden_size
    assert cfg.num_target_layers == target.config.num_hidden_layers
    # the last layer's hidden_states entry is the final-normed output: the drafter never reads it
    assert max(cfg.target_layer_ids) < target.config.num_hidden_layers - 1


def test_trained_pair_drafts_the_targets_greedy_tokens(target, tokenizer, drafter):
    """DFlash blocks anchored along the target's greedy continuations of code prompts: the trained
    drafter's first draft token is the target's next greedy token most of the time (chance: 1/4096)."""
    from ddtree_viz.train.distill import block_batch, drafter_logits, target_features

    prompts = ("import os\nimport sys\n\n\ndef main(argv):\n    parser = argparse.ArgumentParser()\n",
               "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
               "def read_config(path):\n    with open(path) as f:\n")
    B = drafter.block_size
    hits = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            seq = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False)
            assert seq.shape[1] == ids.shape[1] + 40  # no end of text: every prompt gives 25 blocks
            feats = target_features(target, seq, drafter.target_layer_ids)
            # anchor a = the last committed token; context = features of positions < a
            anchors = torch.arange(ids.shape[1], seq.shape[1] - B + 1)[None]
            blocks, labels, pos, mask = block_batch(seq, anchors, B, drafter.mask_token_id)
            pred = drafter_logits(drafter, target, feats, blocks, pos, mask).argmax(-1)
        hits.append((pred == labels).reshape(-1, B)[:, 1:].float())
    hit = torch.cat(hits)
    assert hit[:, 0].mean().item() >= 0.5, [h[:, 0].mean().item() for h in hits]
    assert hit.mean().item() >= 0.3, [h.mean().item() for h in hits]


def test_training_block_batch_matches_single_block_inference():
    """The many-anchors-per-sequence training pass equals one drafter call per block."""
    from ddtree_viz.engine.drafter import DFlashConfig, DFlashDrafter
    from ddtree_viz.train.distill import block_batch

    torch.manual_seed(0)
    cfg = DFlashConfig.from_dict({
        "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 50, "num_target_layers": 4,
        "dflash_config": {"block_size": 4, "mask_token_id": 1, "target_layer_ids": [0, 2]}})
    d = DFlashDrafter(cfg).eval()
    emb = torch.nn.Embedding(50, 32)
    ids = torch.randint(2, 50, (1, 20))
    feats = torch.randn(1, 20, 64)
    anchors = torch.tensor([[3, 7, 8, 15]])
    bi, lab, pos, mask = block_batch(ids, anchors, 4, 1)
    with torch.no_grad():
        multi = d(emb(bi), feats, pos, attention_mask=mask).reshape(4, 4, -1)
        for k, a in enumerate(anchors[0].tolist()):
            block = torch.tensor([[int(ids[0, a]), 1, 1, 1]])
            single = d(emb(block), feats[:, :a], torch.arange(a + 4)[None])[0]
            torch.testing.assert_close(single, multi[k], rtol=1e-5, atol=1e-5)
            assert lab[0, 4 * k:4 * k + 4].tolist() == [-100] + ids[0, a + 1:a + 4].tolist()


@pytest.mark.parametrize("budget", [4, 32])
def test_exact_ddtree_equals_greedy_on_the_embedded_pair(budget):
    """Invariant 1 on the shipped models: the trained drafter drafts for real (acceptance > 1) and the output
    is the target's own greedy output, token for token."""
    from ddtree_viz.engine.models import load_pair
    from ddtree_viz.engine.session import DecodeSession

    pair = load_pair()
    for prompt in ("class Stack:\n    def __init__(self):\n", "for i, line in enumerate(lines):\n"):
        session = DecodeSession.of(pair, budget=budget, max_new_tokens=48)
        session.prefill(prompt)
        session.run()
        assert session.divergence() == (None, None)
        assert tuple(session.generated) == session.greedy().ids
        assert session.mean_acceptance > 1.5

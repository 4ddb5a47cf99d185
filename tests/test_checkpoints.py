"""The published checkpoint layouts load as they are.

Qwen3.6-27B is published as a `Qwen3_5ForConditionalGeneration` checkpoint: config.json with text_config +
vision_config, the language model's weights under model.language_model.*, a vision tower under model.visual.* and
a multi-token-prediction head under mtp.*, in several safetensors shards. Here a tiny model is saved in exactly that
layout and decoded through `run --target DIR --chat`: only the text model is loaded (parameter count reported and
checked; no vision module exists in memory), and DDTree's output equals the ConditionalGeneration model's own
greedy generation from the same templated prompt.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from transformers import Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration

from ddtree_viz import cli
from ddtree_viz.engine.drafter import DFlashDrafter
from ddtree_viz.engine.models import checkpoint_info, load_pair
from ddtree_viz.engine.prompts import PromptSpec, encode
from ddtree_viz.trace import Trace
from tests import tiny

VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4, temporal_patch_size=2,
              spatial_merge_size=2, out_hidden_size=64, in_channels=3)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """(target dir, drafter dir, the in-memory ConditionalGeneration model, its text model's parameter count)."""
    root = tmp_path_factory.mktemp("published")
    text = tiny.hybrid_config(vocab_size=tiny.CHAT_VOCAB)
    config = Qwen3_5Config(text_config=text.to_dict(), vision_config=VISION, tie_word_embeddings=False)
    torch.manual_seed(5)
    model = Qwen3_5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)  # clear argmaxes, as tests/tiny.py does
    target_dir = root / "Qwen3.6-tiny"
    model.save_pretrained(target_dir, max_shard_size="300KB")  # sharded, with model.safetensors.index.json
    tiny.chat_tokenizer().save_pretrained(target_dir)
    # the MTP head the published checkpoints carry beside the language model, in a shard of its own
    mtp = {"mtp.fc.weight": torch.randn(text.hidden_size, 2 * text.hidden_size),
           "mtp.norm.weight": torch.ones(text.hidden_size)}
    save_file(mtp, str(target_dir / "model-mtp.safetensors"), metadata={"format": "pt"})
    index_path = target_dir / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"].update({k: "model-mtp.safetensors" for k in mtp})
    index_path.write_text(json.dumps(index))
    torch.manual_seed(6)
    drafter = DFlashDrafter(tiny.drafter_config(text)).eval()
    drafter.save_pretrained(root / "drafter")
    with torch.device("meta"):
        text_params = sum(p.numel() for p in Qwen3_5ForCausalLM(text).parameters())
    return target_dir, root / "drafter", model, text_params


def test_the_layout_is_the_published_one(published):
    target_dir, _, model, text_params = published
    config = json.loads((target_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"] and config["model_type"] == "qwen3_5"
    assert "text_config" in config and "vision_config" in config
    weight_map = json.loads((target_dir / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(weight_map.values())) > 2
    assert any(k.startswith("model.language_model.layers.") for k in weight_map)
    assert any(k.startswith("model.visual.") for k in weight_map) and "lm_head.weight" in weight_map
    info = checkpoint_info(target_dir)
    vision = sum(p.numel() for n, p in model.named_parameters() if n.startswith("model.visual."))
    assert info.parameters == sum(p.numel() for p in model.parameters()) + 2 * 64 * 64 + 64
    assert info.parts == {"vision tower": vision, "MTP head": 2 * 64 * 64 + 64}
    assert info.parameters - vision - info.parts["MTP head"] == text_params


def test_only_the_text_model_is_loaded(published):
    target_dir, drafter_dir, model, text_params = published
    pair = load_pair(str(target_dir), str(drafter_dir))
    assert type(pair.target).__name__ == "Qwen3_5ForCausalLM"
    names = [n for n, _ in pair.target.named_modules()] + [n for n, _ in pair.target.named_parameters()]
    assert not any("visual" in n or "vision" in n or n.startswith("mtp") for n in names)
    assert pair.target_parameters == text_params
    # the language model's weights arrived under their new names, unchanged
    loaded, original = pair.target.state_dict(), model.state_dict()
    for name in ("model.embed_tokens.weight", "model.layers.0.linear_attn.in_proj_qkv.weight",
                 "model.layers.3.self_attn.q_proj.weight", "model.norm.weight", "lm_head.weight"):
        source = name if name == "lm_head.weight" else name.replace("model.", "model.language_model.", 1)
        assert torch.equal(loaded[name], original[source]), name
    line = pair.parameters_line()
    assert line.startswith(f"target parameters loaded: {text_params:,} of the checkpoint's ")
    assert "not loaded: vision tower" in line and "MTP head" in line


def test_run_decodes_the_published_layout_exactly(published, capsys, tmp_path):
    """`run --target DIR --chat --thinking off`: the loaded parameter count is printed, and the output equals the
    ConditionalGeneration model's own greedy generation from the same templated prompt (invariant 1)."""
    target_dir, drafter_dir, model, text_params = published
    trace_path = tmp_path / "t.json"
    rc = cli.main(["run", "--target", str(target_dir), "--draft", str(drafter_dir), "--chat", "--thinking", "off",
                   "--prompt", "Write a function.", "--max-new-tokens", "12", "--budget", "6", "--trace", str(trace_path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert f"target parameters loaded: {text_params:,} of the checkpoint's" in out and "vision tower" in out
    assert "identical to greedy for 12 tokens" in out
    trace = Trace.load(trace_path)
    ids = encode(tiny.chat_tokenizer(), PromptSpec(text="Write a function.", chat=True, thinking=False)).ids
    assert trace.prompt_ids == ids
    with torch.no_grad():
        generated = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, min_new_tokens=12,
                                   eos_token_id=None, pad_token_id=0)
    assert list(trace.output_ids) == generated[0, len(ids):].tolist()

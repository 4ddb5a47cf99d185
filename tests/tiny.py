"""Tiny real transformers models for the tests: a qwen3_5 hybrid (3 GDN : 1 attention, grouped value heads,
partial rotary, M-RoPE), a pure-attention Qwen3, a byte-level tokenizer and a DFlash drafter. Random weights,
float32, built in milliseconds, nothing downloaded."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM, Qwen3_5ForCausalLM, Qwen3_5TextConfig

from ddtree_viz.engine.drafter import DFlashConfig, DFlashDrafter
from ddtree_viz.engine.models import ModelPair

EOS, MASK = "<|endoftext|>", "<|MASK|>"


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """One token per byte (256) + end-of-text + mask: round-trips any text."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    vocab[EOS], vocab[MASK] = 256, 257
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS, MASK])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, mask_token=MASK)


VOCAB = 258
EOS_ID, MASK_ID = 256, 257

# A Qwen-style chat template (the markers and the thinking switch of Qwen3 / Qwen3.5 / Qwen3.6's templates, in
# Jinja string literals as theirs are): thinking off closes an empty think block, on (or unset) opens one.
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
QWEN_STYLE_TEMPLATE = (
    r"{%- for m in messages %}"
    r"{%- if m.role == 'system' and not loop.first %}{{- raise_exception('System message must be at the beginning.') }}{%- endif %}"
    r"{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}"
    r"{%- endfor %}"
    r"{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
    r"{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}"
    r"{%- else %}{{- '<think>\n' }}{%- endif %}{%- endif %}"
)
CHAT_VOCAB = 260  # the byte tokenizer's 258 + <|im_start|> + <|im_end|>


def chat_tokenizer(template: str | None = QWEN_STYLE_TEMPLATE) -> PreTrainedTokenizerFast:
    """The byte tokenizer + <|im_start|> / <|im_end|> as special tokens (ids 258, 259) + a chat template."""
    tok = byte_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
    tok.chat_template = template
    return tok


def hybrid_config(layers: int = 4, hidden: int = 64, **over) -> Qwen3_5TextConfig:
    cfg = dict(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, full_attention_interval=4,
        eos_token_id=EOS_ID, tie_word_embeddings=False, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [1, 1, 0], "mrope_interleaved": True},
    )
    cfg.update(over)
    return Qwen3_5TextConfig(**cfg)


def attention_config(layers: int = 3, hidden: int = 64) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, eos_token_id=EOS_ID, max_position_embeddings=4096,
    )


def _sharpen(model: torch.nn.Module, scale: float) -> None:
    """Random models have nearly flat logits; scaling the lm_head gives clear argmaxes (fewer near-ties)."""
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)


def target_model(kind: str = "hybrid", seed: int = 0, **over) -> torch.nn.Module:
    torch.manual_seed(seed)
    if kind == "hybrid":
        config = hybrid_config(**over)
        model = Qwen3_5ForCausalLM(config)
    elif kind == "attention":
        config = attention_config(**over)
        model = Qwen3ForCausalLM(config)
    else:
        raise ValueError(kind)
    config._attn_implementation = "sdpa"
    _sharpen(model, 4.0)
    return model.eval()


def drafter_config(target_config, block_size: int = 8, layers: int = 1, layer_ids=None) -> DFlashConfig:
    vocab = target_config.vocab_size
    n = target_config.num_hidden_layers
    return DFlashConfig.from_dict({
        "hidden_size": target_config.hidden_size, "intermediate_size": 2 * target_config.hidden_size,
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": vocab, "num_target_layers": n, "block_size": block_size,
        "dflash_config": {"block_size": block_size, "mask_token_id": MASK_ID,
                          "target_layer_ids": layer_ids if layer_ids is not None else [1, n - 2]},
    })


def drafter_model(target, seed: int = 1, block_size: int = 8) -> DFlashDrafter:
    torch.manual_seed(seed)
    return DFlashDrafter(drafter_config(target.config, block_size)).eval()


def tiny_pair(kind: str = "hybrid", seed: int = 0, block_size: int = 8, **over) -> ModelPair:
    target = target_model(kind, seed, **over)
    return ModelPair(target, byte_tokenizer(), drafter_model(target, seed + 1, block_size), f"tiny-{kind}", "tiny-dflash",
                     torch.float32, "cpu")


def chat_pair(seed: int = 0, block_size: int = 8) -> ModelPair:
    """A hybrid pair whose tokenizer carries the Qwen-style chat template (vocabulary CHAT_VOCAB)."""
    target = target_model("hybrid", seed, vocab_size=CHAT_VOCAB)
    return ModelPair(target, chat_tokenizer(), drafter_model(target, seed + 1, block_size), "tiny-chat", "tiny-dflash",
                     torch.float32, "cpu")


def save_pair(pair: ModelPair, root: Path) -> tuple[Path, Path]:
    """Write the pair as real model directories (config.json, safetensors, tokenizer)."""
    target_dir, draft_dir = root / "target", root / "draft"
    pair.target.save_pretrained(target_dir)
    pair.tokenizer.save_pretrained(target_dir)
    pair.drafter.save_pretrained(draft_dir)
    return target_dir, draft_dir


def edit_checkpoint(directory: Path, change) -> None:
    """Apply change(state, config) to a saved model directory in place (its model.safetensors and config.json)."""
    import json

    from safetensors.torch import load_file, save_file

    state = load_file(str(directory / "model.safetensors"))
    config = json.loads((directory / "config.json").read_text())
    change(state, config)
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config))


def assert_same_weights(loaded: dict, expected: dict) -> None:
    """Two state dicts with the same names and every tensor equal, bit for bit (the loaders' tests)."""
    assert loaded.keys() == expected.keys()
    for name in expected:
        assert torch.equal(loaded[name], expected[name]), name


def run_quantized(target: Path, draft: Path, engine: str, tmp_path: Path, capsys, *extra: str) -> tuple[str, object]:
    """`run --target DIR --draft DIR` (16 new tokens, budget 8, on `engine`, with `extra` flags) with a trace: its
    printed output, checked to be identical to greedy, and the trace."""
    from ddtree_viz import cli
    from ddtree_viz.trace import Trace

    trace_path = tmp_path / "t.json"
    rc = cli.main(["run", "--target", str(target), "--draft", str(draft), "--prompt", "def f(x):",
                   "--max-new-tokens", "16", "--budget", "8", "--engine", engine, "--trace", str(trace_path), *extra])
    out = capsys.readouterr().out
    assert rc == 0 and "output identical to greedy for" in out
    return out, Trace.load(trace_path)


def greedy_ids(model: torch.nn.Module, prompt: list[int], new: int) -> list[int]:
    """The model's own greedy generation (transformers' generate, no end of text) of `new` tokens after `prompt`."""
    with torch.no_grad():
        out = model.generate(torch.tensor([list(prompt)]), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def assert_generated_by(trace, reference: torch.nn.Module) -> None:
    """The trace's output is the reference model's own greedy generation from its prompt, up to where it ended (at
    least 8 tokens; a run may stop early at an end-of-text token)."""
    n = len(trace.output_ids)
    assert n >= 8 and list(trace.output_ids) == greedy_ids(reference, trace.prompt_ids, 16)[:n]


RUNNER_PROMPT, RUNNER_NEW = list(b"def fibonacci(n):"), 24


def kept_runner(target: Path, draft: Path, fused: bool):
    """A quantized pair loaded with its weights kept (its own: fusing rewires them) and a StaticRunner over its
    target, torch forms, eager, projections fused or not: (pair, runner)."""
    from ddtree_viz.engine.models import load_pair
    from ddtree_viz.engine.runner import StaticRunner

    pair = load_pair(str(target), str(draft), keep_quantized=True)
    runner = StaticRunner(pair.target, max_len=256, sizes=(1, 9), feature_layer_ids=pair.drafter.target_layer_ids,
                          forms={"gdn_kernel": "torch", "fused": fused, "compile": False, "blas": "default"})
    return pair, runner


def assert_parameters_counted(pair: ModelPair, reference: torch.nn.Module) -> None:
    """A quantized target's parameters counted as its plain model's, loaded (kept: each weight's out x in, not its
    words and scales) and on disk (packed words eight parameters a word; scales, zero points, group indices none), so
    the parameters line says how many and no 'of the checkpoint's' beside it."""
    n = sum(p.numel() for p in reference.parameters())
    assert pair.target_parameters == n
    assert pair.parameters_line().startswith(f"target parameters loaded: {n:,}")
    assert "of the checkpoint's" not in pair.parameters_line()


def assert_kept_drafter_drafts_as_plain(kept: ModelPair, plain: ModelPair) -> None:
    """A drafter with quantized weights kept drafts the trees of the same drafter dequantized at load, node for node
    and log-prob for log-prob (float32 on a CPU); through the static drafter (the function its CUDA graphs capture)
    the same trees, log-probs within 1e-5."""
    from ddtree_viz.engine.proposers import DFlashProposer
    from ddtree_viz.engine.session import DecodeSession

    trees = []
    for pair, static in ((kept, False), (kept, True), (plain, False)):  # static: the CUDA graphs' path
        proposer = DFlashProposer(pair.drafter, pair.target, static=static)
        session = DecodeSession.of(pair, budget=8, max_new_tokens=12, engine="transformers", proposer=proposer)
        session.prefill(prompt_ids=list(b"def fibonacci(n):"))
        trees.append([[(n.token_id, n.parent, n.logprob) for n in r.nodes] for r in session.run()])
    assert trees[0] == trees[2] and len(trees[0]) > 1
    assert [[t[:2] for t in tree] for tree in trees[1]] == [[t[:2] for t in tree] for tree in trees[2]]
    assert max(abs(a[2] - b[2]) for x, y in zip(trees[1], trees[2]) for a, b in zip(x, y)) < 1e-5


def assert_runner_decodes_as(pair: ModelPair, runner, reference: torch.nn.Module) -> None:
    """The static runner's greedy on `pair`'s target after RUNNER_PROMPT equals the reference model's own greedy
    token for token, and its DDTree (the pair's drafter, budget 8) too, up to the end of text where it stops."""
    from ddtree_viz.engine.engines import RunnerEngine
    from ddtree_viz.engine.reference import EngineGreedy
    from ddtree_viz.engine.session import DecodeSession

    prompt, new = RUNNER_PROMPT, RUNNER_NEW
    want = greedy_ids(reference, prompt, new)

    engine = lambda size: RunnerEngine(pair.target, pair.drafter.target_layer_ids, tree_size=size,  # noqa: E731
                                       block_size=pair.drafter.block_size, max_new_tokens=new, runner=runner)
    assert list(EngineGreedy(engine(1), prompt, set()).extend_to(new).ids) == want
    session = DecodeSession.of(pair, budget=8, max_new_tokens=new, engine=engine(9), record=False)
    session.prefill(prompt_ids=prompt)
    session.run()
    stop = want.index(EOS_ID) + 1 if EOS_ID in want else new  # the session stops at end of text
    assert session.generated == want[:stop] and stop > 16


def embedded_host():
    """The page's ModelHost on the embedded default pair and the page's default engine, loaded (not in the
    background): what a served page holds, for tests that drive page/ without gradio."""
    from ddtree_viz.page.host import ModelHost

    host = ModelHost(None, None, "float32", "cpu")
    host.start(background=False)
    assert host.ready, host.error
    return host

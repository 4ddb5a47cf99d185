"""The training pipeline's data handling (ddtree_viz/train): corpus splits, per-split token streams, drafter
anchors over prompts of several lengths, and a few real drafter steps on a tiny target. CPU, seconds."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from ddtree_viz.train import corpus
from ddtree_viz.train.corpus import Doc, build_corpus, split_of, tokenizer_texts, write_corpus


def _bucket(relpath: str) -> int:
    return int(hashlib.sha256(relpath.encode()).hexdigest()[:8], 16) % 100


def _name(prefix: str, want) -> str:
    """The first ``{prefix}{i}.py`` whose hash bucket satisfies ``want``."""
    return next(f"{prefix}{i}.py" for i in range(10_000) if want(_bucket(f"{prefix}{i}.py")))


def test_split_of_library_and_test_files():
    # library files: eval below 5 (the held-out set the figures are measured on), draft 5..9, train from 10
    for bucket, split in ((lambda h: h < 5, "eval"), (lambda h: 5 <= h < 10, "draft"), (lambda h: h >= 10, "train")):
        assert split_of(_name("json/m", bucket)) == split
    # regression-suite files are never held out for evaluation: draft below 10, else train
    for d in ("test/", "ctypes/test/", "idlelib/idle_test/", "pkg/tests/"):
        assert split_of(_name(d + "t", lambda h: h < 5)) == "draft"
        assert split_of(_name(d + "t", lambda h: h >= 10)) == "train"
    # a file merely named like a test directory is library code
    assert corpus.source_of("test.py") == "lib" and corpus.source_of("unittest/test.py") == "lib"
    assert corpus.source_of("unittest/test/test_case.py") == "test"


def test_build_corpus_walks_sources_and_skips(tmp_path):
    files = {
        "a.py": "x = 1\n", "pkg/b.py": "y = 2\n", "test/test_a.py": "assert True\n", "pkg/tests/t.py": "z = 3\n",
        "site-packages/dep.py": "no\n", "__pycache__/c.py": "no\n", "notes.txt": "no\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "latin.py").write_bytes(b"s = '\xe9'\n")  # not UTF-8
    docs, manifest = build_corpus(tmp_path)
    assert [d.path for d in docs] == ["a.py", "pkg/b.py", "pkg/tests/t.py", "test/test_a.py"]
    assert [d.source for d in docs] == ["lib", "lib", "test", "test"]
    assert all(d.text == files[d.path] for d in docs)
    assert manifest["skipped_not_utf8"] == ["latin.py"]
    assert sum(c["files"] for c in manifest["counts"].values()) == 4
    # the tokenizer never sees held-out or test files
    assert tokenizer_texts(docs) == [d.text for d in docs if d.source == "lib" and d.split != "eval"]


def test_tokenize_corpus_writes_one_stream_per_split(tmp_path):
    from ddtree_viz.train.data import load_tokens, tokenize_corpus
    from ddtree_viz.train.tokenizer import load_tokenizer, save_tokenizer, train_tokenizer

    paths = [_name("lib/e", lambda h: h < 5), _name("lib/d", lambda h: 5 <= h < 10), _name("lib/r", lambda h: h >= 10),
             _name("test/d", lambda h: h < 10), _name("test/r", lambda h: h >= 10)]
    docs = [Doc(p, split_of(p), f"def f{i}(x):\n    return x + {i}\n") for i, p in enumerate(sorted(paths))]
    assert {d.split for d in docs} == {"train", "draft", "eval"}
    write_corpus(docs, {"note": "test"}, tmp_path)
    save_tokenizer(train_tokenizer(tokenizer_texts(docs), vocab_size=300), tmp_path / "tokenizer")
    stats = tokenize_corpus(tmp_path)
    tokens = load_tokens(tmp_path)
    tok = load_tokenizer(tmp_path / "tokenizer")
    for split in corpus.SPLITS:
        stream, offsets = tokens[split], tokens[f"{split}_doc_offsets"]
        texts = [d.text for d in docs if d.split == split]
        assert stats[f"{split}_tokens"] == stream.size and len(offsets) == len(texts)
        ends = list(offsets[1:]) + [stream.size]
        for text, start, end in zip(texts, offsets, ends):
            assert stream[end - 1] == 0  # every file ends with <|endoftext|>
            assert tok.decode(stream[start:end - 1].tolist()) == text


def test_sample_anchors_start_after_each_prompt():
    from ddtree_viz.train.distill import sample_anchors

    gen = np.random.default_rng(0)
    lens = np.array([8, 64, 16, 32, 8])
    a = sample_anchors(lens, last=100, count=20, gen=gen)
    assert a.shape == (5, 20)
    for row, p in zip(a, lens):
        assert row.min() >= p and row.max() <= 100
        assert (np.diff(row) > 0).all()  # distinct and sorted
    with pytest.raises(ValueError):
        sample_anchors(np.array([90]), last=100, count=20, gen=gen)  # not enough room for 20 anchors


def test_drafter_training_steps_on_a_tiny_target(tmp_path):
    """Real steps of the block-diffusion objective on greedy data with two prompt lengths; the saved drafter
    loads with the project's loader and pairs with the target."""
    from ddtree_viz.engine.drafter import DFlashDrafter, validate_pairing
    from ddtree_viz.train.distill import greedy_generate, train_drafter

    from .tiny import MASK_ID, target_model

    target = target_model("hybrid", seed=0)
    torch.manual_seed(0)
    prompts = [torch.randint(0, 256, (4, n)) for n in (4, 12)]
    greedy = torch.cat([greedy_generate(target, p, 36 - p.shape[1], batch=4) for p in prompts])
    assert greedy.shape == (8, 36)
    prompt_lens = torch.tensor([4] * 4 + [12] * 4)
    summary = train_drafter(target, greedy, prompt_lens, tmp_path / "draft", torch.device("cpu"), num_layers=1,
                            block_size=4, batch=4, anchors=6, steps=3, warmup=1, target_layer_ids=(0, 2),
                            mask_token_id=MASK_ID)
    assert summary["steps"] == 3 and summary["prompt_lens"] == [4, 12]
    assert np.isfinite(summary["final"]["ce"])
    drafter = DFlashDrafter.from_pretrained(tmp_path / "draft")
    assert drafter.block_size == 4 and drafter.mask_token_id == MASK_ID
    validate_pairing(drafter.config, target.config)


def test_dflash2_drafter_training_steps_on_a_tiny_target(tmp_path):
    """The same objective for a DFlash2 drafter, its selector trained beside it (distill.selector_loss); it starts as
    the identity convolution, each packed block convolved on its own, and saves in the published layout."""
    from ddtree_viz.engine.dflash2 import DFlash2Drafter
    from ddtree_viz.engine.drafter import validate_pairing
    from ddtree_viz.train.distill import greedy_generate, train_drafter

    from .tiny import MASK_ID, target_model

    target = target_model("hybrid", seed=0)
    torch.manual_seed(0)
    greedy = greedy_generate(target, torch.randint(0, 256, (8, 6)), 30, batch=8)
    fields = {"conv_group_size": 16, "conv_kernel_size": 2, "selector_rank": 8, "selector_top_k": 16}
    summary = train_drafter(target, greedy, torch.tensor([6] * 8), tmp_path / "draft", torch.device("cpu"),
                            num_layers=1, block_size=4, batch=4, anchors=6, steps=3, warmup=1, target_layer_ids=(0, 2),
                            mask_token_id=MASK_ID, dflash2=fields)
    assert summary["steps"] == 3 and np.isfinite(summary["final"]["ce"])
    drafter = DFlash2Drafter.from_pretrained(tmp_path / "draft")
    assert drafter.config.selector_top_k == 16 and drafter.block_size == 4
    validate_pairing(drafter.config, target.config)
    # packed blocks convolve alone: a row of two blocks gives each block's own convolution
    conv = drafter.layers[0].attention_conv.float()
    conv.segment = 4
    x = torch.randn(1, 8, conv.base_kernel.shape[-1])
    both = conv.prepare(x)[0]
    assert torch.allclose(both[:, 4:], conv.prepare(x[:, 4:])[0], atol=1e-6)
    conv.segment = None
    assert not torch.allclose(conv.prepare(x)[0][:, 4:], both[:, 4:], atol=1e-6)


def test_selector_loss_counts_the_positions_whose_true_token_is_a_candidate():
    """selector_loss: cross-entropy over the K candidates of S_t(true previous token, b), at block positions past
    the root whose true token the drafter ranked in its top-K; the selector's weights get its gradient."""
    from ddtree_viz.engine.dflash2 import DFlash2Drafter
    from ddtree_viz.train.distill import drafter_config, init_drafter_, selector_loss

    from .tiny import MASK_ID, target_model

    target = target_model("hybrid", seed=0)
    cfg = drafter_config(target.config, num_layers=1, block_size=4, mask_token_id=MASK_ID, target_layer_ids=(0, 2),
                         intermediate_size=64, head_dim=16, dflash2={"conv_group_size": 16, "conv_kernel_size": 2,
                                                                   "selector_rank": 4, "selector_top_k": 3})
    drafter = DFlash2Drafter(cfg)
    torch.manual_seed(0)
    init_drafter_(drafter)
    assert torch.equal(drafter.layers[0].mlp_conv.base_kernel[:, 0], torch.ones(2, 64))  # the identity at the start
    labels = torch.randint(0, 256, (2, 8))
    labels[:, ::4] = -100  # block entries 0: the roots
    block_ids = torch.full((2, 8), MASK_ID)
    block_ids[:, ::4] = torch.randint(0, 256, (2, 2))
    logits = torch.randn(2, 8, 258)
    logits.scatter_(2, labels.clamp(min=0)[..., None], 50.0)  # every true token the drafter's best candidate
    logits[:, 3] = torch.randn(258)  # but at one position
    loss, count = selector_loss(drafter, torch.randn(2, 8, 64), logits, block_ids, labels, 4)
    assert count == 2 * 6 - 2 + int((torch.topk(logits[:, 3], 3).indices == labels[:, 3, None]).any(-1).sum())
    loss.backward()
    assert drafter.candidate_selector.successor_codebook.grad.abs().sum() > 0


def test_a_dflash2_drafter_warm_starts_from_a_dflash_drafter(tmp_path):
    """`--family dflash2 --init-draft <a DFlash drafter>`: the DFlash2 drafter starts with every weight the two
    share (fc, norms, the first layers' attention and MLP), the convolutions as the identity and a fresh selector,
    then trains; a DFlash drafter of other widths is refused, naming the weight."""
    from ddtree_viz.engine.dflash2 import DFlash2Drafter
    from ddtree_viz.train.distill import drafter_config, greedy_generate, train_drafter, warm_start_dflash2

    from .tiny import MASK_ID, target_model

    target = target_model("hybrid", seed=0)
    torch.manual_seed(0)
    greedy = greedy_generate(target, torch.randint(0, 256, (8, 6)), 30, batch=8)
    common = dict(batch=4, anchors=6, steps=2, warmup=1, target_layer_ids=(0, 2), mask_token_id=MASK_ID)
    train_drafter(target, greedy, torch.tensor([6] * 8), tmp_path / "d1", torch.device("cpu"), num_layers=2,
                  block_size=4, **common)
    fields = {"conv_group_size": 16, "conv_kernel_size": 2, "selector_rank": 8, "selector_top_k": 16}
    cfg = drafter_config(target.config, num_layers=1, block_size=4, mask_token_id=MASK_ID, target_layer_ids=(0, 2),
                         dflash2=fields)
    warm = warm_start_dflash2(cfg, tmp_path / "d1", torch.device("cpu")).state_dict()
    from ddtree_viz.engine.drafter import DFlashDrafter

    source = DFlashDrafter.from_pretrained(tmp_path / "d1", dtype=torch.float32).state_dict()
    shared = [k for k in warm if k in source]
    assert "fc.weight" in shared and "layers.0.mlp.down_proj.weight" in shared
    assert not any(k.startswith("layers.1.") for k in warm)  # the DFlash drafter's second layer is left out
    assert all(torch.equal(warm[k], source[k]) for k in shared)
    base = warm["layers.0.attention_conv.base_kernel"]  # [2, k, H]: the identity tap at offset 0
    assert torch.equal(base[:, 0], torch.ones_like(base[:, 0])) and not base[:, 1:].any()
    summary = train_drafter(target, greedy, torch.tensor([6] * 8), tmp_path / "d2", torch.device("cpu"), num_layers=1,
                            block_size=4, init_from=tmp_path / "d1", dflash2=fields, **common)
    assert summary["steps"] == 2 and DFlash2Drafter.from_pretrained(tmp_path / "d2").config.selector_rank == 8
    wide = drafter_config(target.config, num_layers=1, block_size=4, mask_token_id=MASK_ID, target_layer_ids=(0, 2),
                          intermediate_size=96, dflash2=fields)
    with pytest.raises(ValueError, match="layers.0.mlp"):
        warm_start_dflash2(wide, tmp_path / "d1", torch.device("cpu"))

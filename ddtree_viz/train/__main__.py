"""``python -m ddtree_viz.train SUBCOMMAND ...``: build the embedded target + DFlash drafter.

Reproduce the shipped assets (docs/EMBEDDED.md has the figures):

    # CPU machine with CPython 3.11.7 (its stdlib is the corpus) -> .train/
    python -m ddtree_viz.train prepare --data .train
    # GPU pass 1 (one H200 was used): target, greedy data, drafter from scratch -> run1/
    python -m ddtree_viz.train gpu --data .train --out run1 --steps 1000 \
        --n-seqs 16384 --gen-batch 4096 --new-tokens 256 --drafter-steps 13059
    # GPU pass 2: new greedy data, drafter continued -> run2/
    python -m ddtree_viz.train gpu --data .train --out run2 --target-dir run1/target \
        --init-draft run1/draft --seed 1 --n-seqs 32768 --gen-batch 8192 --new-tokens 256 \
        --draft-lr 1e-3 --drafter-steps 12382
    # evaluate, assemble assets/, check through the engine
    python -m ddtree_viz.train eval --data .train --target run1/target --draft run2/draft
    python -m ddtree_viz.train assets --data .train --target run1/target --draft run2/draft --out assets
    python -m ddtree_viz.train engine-eval --data .train
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from .data import log, pick_device, seed_everything

TARGET_ASSET = "tiny-qwen35-target"
DRAFT_ASSET = "tiny-qwen35-dflash"


def cmd_corpus(a) -> None:
    from .corpus import build_corpus, write_corpus

    docs, manifest = build_corpus(a.stdlib)
    path = write_corpus(docs, manifest, a.data)
    parts = ", ".join(f"{k} {c['files']} files / {c['chars']:,} chars" for k, c in manifest["counts"].items())
    log(f"corpus: {manifest['files']} files ({parts}), python {manifest['python']} -> {path}")


def cmd_tokenizer(a) -> None:
    from .corpus import read_corpus, tokenizer_texts
    from .tokenizer import save_tokenizer, train_tokenizer

    docs = read_corpus(a.data)
    tok = train_tokenizer(tokenizer_texts(docs), vocab_size=a.vocab_size)
    save_tokenizer(tok, Path(a.data) / "tokenizer")
    bad = [d.path for d in docs if tok.decode(tok.encode(d.text).ids) != d.text]
    log(f"tokenizer: vocab {tok.get_vocab_size()}, round-trip failures: {len(bad)} {bad[:3]}")
    if bad:
        sys.exit(1)


def cmd_tokenize(a) -> None:
    from .data import tokenize_corpus

    log("tokens:", tokenize_corpus(a.data))


def cmd_prepare(a) -> None:
    cmd_corpus(a)
    cmd_tokenizer(a)
    cmd_tokenize(a)


def _setup_torch(device) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 (target/features/generation)
    torch.backends.cudnn.allow_tf32 = False


def cmd_target(a) -> dict:
    from .data import load_tokens
    from .target import train_target
    from .tokenizer import load_tokenizer

    seed_everything(a.seed)
    device = pick_device(a.device)
    _setup_torch(device)
    tokens = load_tokens(a.data)
    vocab = load_tokenizer(Path(a.data) / "tokenizer").get_vocab_size()
    summary = train_target(tokens, vocab, a.out, device, seed=a.seed, seq_len=a.seq_len, batch=a.batch, lr=a.lr,
                           steps=a.steps, time_budget_s=a.time_budget, eval_every=a.eval_every,
                           max_steps=a.max_steps, doc_start_frac=a.doc_start_frac)
    _write_summary(a, "target", summary)
    return summary


def _write_summary(a, key: str, value) -> None:
    """Collect stage summaries in one JSON file (``--summary``), one key per stage."""
    path = getattr(a, "summary", None)
    if not path:
        return
    path = Path(path)
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = value
    path.write_text(json.dumps(data, indent=2) + "\n")


def _greedy(a, target, tokens, tok):
    """The target's greedy continuations of prompts from ``--prompt-split``, one group per prompt length;
    every sequence is ``max(prompt lengths) + new tokens`` long. Returns (tokens [N, T], prompt lengths [N])."""
    import torch

    from .distill import greedy_generate, newline_token_ids, sample_prompts

    lens = [int(x) for x in a.prompt_lens.split(",")]
    total = max(lens) + a.new_tokens
    newlines = newline_token_ids(tok)
    stream, offsets = tokens[a.prompt_split], tokens[f"{a.prompt_split}_doc_offsets"]
    t0 = time.time()
    seqs, prompt_lens = [], []
    for i, n in enumerate(lens):
        count = a.n_seqs // len(lens) + (i < a.n_seqs % len(lens))
        prompts = torch.from_numpy(sample_prompts(stream, offsets, count, n, newlines, a.seed * 1000 + i))
        seqs.append(greedy_generate(target, prompts, total - n, batch=a.gen_batch))
        prompt_lens.append(torch.full((count,), n, dtype=torch.long))
    greedy, prompt_lens = torch.cat(seqs), torch.cat(prompt_lens)
    wall = time.time() - t0
    log(f"greedy: {greedy.shape[0]} sequences of {total} tokens (prompts of {lens} tokens from the "
        f"{a.prompt_split} split) in {wall:.0f}s")
    _write_summary(a, "greedy", {"sequences": int(greedy.shape[0]), "prompt_lens": lens, "seq_len": total,
                                 "wall_s": wall, "prompts": f"{a.prompt_split}-split windows starting after a "
                                                            "newline token"})
    return greedy, prompt_lens


def cmd_generate(a) -> None:
    import torch

    from .data import load_tokens
    from .target import load_target
    from .tokenizer import load_tokenizer

    seed_everything(a.seed)
    device = pick_device(a.device)
    _setup_torch(device)
    target = load_target(a.target, device)
    greedy, prompt_lens = _greedy(a, target, load_tokens(a.data), load_tokenizer(Path(a.data) / "tokenizer"))
    torch.save({"tokens": greedy.to(torch.int16), "prompt_lens": prompt_lens.to(torch.int16)}, a.greedy)


def cmd_drafter(a, target=None, greedy=None, prompt_lens=None) -> dict:
    import torch

    from .distill import train_drafter
    from .target import load_target

    seed_everything(a.seed)
    device = pick_device(a.device)
    _setup_torch(device)
    if target is None:
        target = load_target(a.target, device)
    if greedy is None:
        blob = torch.load(a.greedy)
        greedy, prompt_lens = blob["tokens"].long(), blob["prompt_lens"].long()
    summary = train_drafter(target, greedy.long(), prompt_lens, a.draft_out, device, seed=a.seed,
                         num_layers=a.draft_layers, block_size=a.block_size, batch=a.draft_batch,
                         anchors=a.anchors, lr=a.draft_lr, gamma=a.gamma, steps=a.drafter_steps,
                         time_budget_s=a.drafter_time_budget,
                         target_layer_ids=tuple(int(x) for x in a.target_layer_ids.split(",")),
                         precompute_features=device.type == "cuda",
                         deadline=getattr(a, "drafter_deadline", None), init_from=a.init_draft,
                         warmup=a.draft_warmup)
    _write_summary(a, "drafter", summary)
    return summary


def cmd_eval(a, target=None, drafter=None) -> dict:
    from ddtree_viz.engine.drafter import DFlashDrafter

    from .data import load_tokens
    from .evaluate import evaluate_pair
    from .target import load_target
    from .tokenizer import load_tokenizer

    import torch

    device = pick_device(a.device)
    _setup_torch(device)
    if device.type == "cpu":
        torch.set_num_threads(max(1, torch.get_num_threads()))
    target = target or load_target(a.target, device)
    drafter = drafter or DFlashDrafter.from_pretrained(a.draft, dtype=torch.float32, device=device)
    tok = load_tokenizer(Path(a.data) / "tokenizer")
    res = evaluate_pair(target, drafter, tok, load_tokens(a.data), n_prompts=a.n_prompts, new_tokens=a.eval_new_tokens,
                        out_json=a.out_json)
    _write_summary(a, "eval", res)
    for s in res["samples"]:
        print("=" * 30, "PROMPT", "=" * 30)
        print(s["prompt"])
        print("-" * 30, "GREEDY CONTINUATION", "-" * 30)
        print(s["continuation"])
    print(json.dumps({k: v for k, v in res.items() if k != "samples"}, indent=2))
    return res


def cmd_engine_eval(a) -> dict:
    import torch

    from .data import load_tokens
    from .evaluate import engine_acceptance
    from .tokenizer import load_tokenizer

    torch.set_num_threads(max(1, torch.get_num_threads()))
    res = engine_acceptance(load_tokens(a.data), load_tokenizer(Path(a.data) / "tokenizer"),
                            budgets=[int(b) for b in a.budgets.split(",")], new_tokens=a.eval_new_tokens,
                            n_prompts=a.n_prompts, target=a.target, draft=a.draft)
    print(json.dumps(res, indent=2))
    if a.out_json:
        Path(a.out_json).write_text(json.dumps(res, indent=2) + "\n")
    return res


def cmd_gpu(a) -> None:
    """Everything that wants the accelerator, in one process: target, greedy data, drafter, eval."""
    import torch

    from ddtree_viz.engine.drafter import DFlashDrafter

    from .data import load_tokens
    from .target import load_target
    from .tokenizer import load_tokenizer

    t_start = time.time()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    device = pick_device(a.device)
    import platform

    import transformers

    hw = {"device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
          "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
          "argv": sys.argv[1:]}
    log("hardware/software:", hw)
    if a.summary is None:
        a.summary = str(out / "summary.json")
    _write_summary(a, "run", hw)
    a.out = str(out / "target")
    if a.target_dir:
        a.out = a.target_dir
        log("target: reusing", a.out)
    elif a.skip_target:
        log("target: reusing", a.out)
    else:
        cmd_target(a)
    target = load_target(a.out, device)  # the bf16-rounded weights, computed in float32
    for p in target.parameters():
        p.requires_grad_(False)
    tokens = load_tokens(a.data)
    tok = load_tokenizer(Path(a.data) / "tokenizer")
    seed_everything(a.seed)
    greedy, prompt_lens = _greedy(a, target, tokens, tok)
    a.draft_out = str(out / "draft")
    if a.wall_budget is not None:  # leave time for the final evaluation and the copy back
        a.drafter_deadline = t_start + a.wall_budget - a.eval_reserve
    cmd_drafter(a, target=target, greedy=greedy, prompt_lens=prompt_lens)
    drafter = DFlashDrafter.from_pretrained(out / "draft", dtype=torch.float32, device=device)
    a.out_json = None
    cmd_eval(a, target=target, drafter=drafter)
    hw["wall_s"] = time.time() - t_start
    _write_summary(a, "run", hw)
    log(f"gpu pipeline done in {hw['wall_s']:.0f}s")


def cmd_assets(a) -> None:
    """Assemble assets/<target>/ and assets/<draft>/ (configs, weights, tokenizer files)."""
    from .target import write_sharded

    out = Path(a.out)
    tdir, ddir = out / TARGET_ASSET, out / DRAFT_ASSET
    for d in (tdir, ddir):
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
    for f in ("config.json", "generation_config.json"):
        shutil.copyfile(Path(a.target) / f, tdir / f)
    write_sharded(Path(a.target) / "model.safetensors", tdir)  # shards under 8 MiB each
    for f in ("config.json", "model.safetensors"):
        shutil.copyfile(Path(a.draft) / f, ddir / f)
    for d in (tdir, ddir):
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(Path(a.data) / "tokenizer" / f, d / f)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    log(f"assets written: {tdir}, {ddir}; total {total / 2**20:.2f} MiB")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m ddtree_viz.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp, data=True):
        if data:
            sp.add_argument("--data", default=".train", help="corpus / tokenizer / tokens folder")
        sp.add_argument("--device", default="auto")
        sp.add_argument("--seed", type=int, default=0)
        sp.add_argument("--summary", default=None, help="JSON file collecting the stages' summaries")

    def target_args(sp):
        sp.add_argument("--seq-len", type=int, default=1024)
        sp.add_argument("--batch", type=int, default=32)
        sp.add_argument("--lr", type=float, default=2e-3)
        sp.add_argument("--steps", type=int, default=None, help="target steps (reproducible form)")
        sp.add_argument("--time-budget", type=float, default=None, help="target seconds (sets the steps)")
        sp.add_argument("--eval-every", type=int, default=250)
        sp.add_argument("--doc-start-frac", type=float, default=0.0,
                        help="share of each target batch whose windows start at a file's beginning (shipped: 0)")
        sp.add_argument("--max-steps", type=int, default=1300, help="cap when --time-budget sets the steps")

    def greedy_args(sp):
        sp.add_argument("--n-seqs", type=int, default=8192)
        sp.add_argument("--prompt-lens", default="8,16,32,64", help="one group of prompts per length")
        sp.add_argument("--prompt-split", default="draft", choices=("draft", "train"),
                        help="where the prompts come from (draft: text the target never trained on)")
        sp.add_argument("--new-tokens", type=int, default=256)
        sp.add_argument("--gen-batch", type=int, default=2048)

    def drafter_args(sp):
        sp.add_argument("--draft-layers", type=int, default=3)
        sp.add_argument("--block-size", type=int, default=16)
        sp.add_argument("--target-layer-ids", default="1,3,5,6")
        sp.add_argument("--draft-batch", type=int, default=32)
        sp.add_argument("--anchors", type=int, default=32)
        sp.add_argument("--draft-lr", type=float, default=2e-3)
        sp.add_argument("--gamma", type=float, default=7.0)
        sp.add_argument("--drafter-steps", type=int, default=None)
        sp.add_argument("--drafter-time-budget", type=float, default=None)
        sp.add_argument("--init-draft", default=None, help="continue from this drafter's weights")
        sp.add_argument("--draft-warmup", type=int, default=30)

    def eval_args(sp):
        sp.add_argument("--n-prompts", type=int, default=32)
        sp.add_argument("--eval-new-tokens", type=int, default=256)

    sp = sub.add_parser("corpus", help="build corpus.jsonl.xz from this interpreter's stdlib")
    common(sp)
    sp.add_argument("--stdlib", default=None)
    sp.set_defaults(fn=cmd_corpus)
    sp = sub.add_parser("tokenizer", help="train the byte-level BPE tokenizer")
    common(sp)
    sp.add_argument("--vocab-size", type=int, default=4096)
    sp.set_defaults(fn=cmd_tokenizer)
    sp = sub.add_parser("tokenize", help="encode the corpus -> tokens.npz")
    common(sp)
    sp.set_defaults(fn=cmd_tokenize)
    sp = sub.add_parser("prepare", help="corpus + tokenizer + tokenize")
    common(sp)
    sp.add_argument("--stdlib", default=None)
    sp.add_argument("--vocab-size", type=int, default=4096)
    sp.set_defaults(fn=cmd_prepare)
    sp = sub.add_parser("target", help="train the target")
    common(sp)
    target_args(sp)
    sp.add_argument("--out", required=True)
    sp.set_defaults(fn=cmd_target)
    sp = sub.add_parser("generate", help="greedy continuations of train prompts")
    common(sp)
    greedy_args(sp)
    sp.add_argument("--target", required=True)
    sp.add_argument("--greedy", required=True, help="output .pt")
    sp.set_defaults(fn=cmd_generate)
    sp = sub.add_parser("drafter", help="train the DFlash drafter on greedy continuations")
    common(sp)
    greedy_args(sp)
    drafter_args(sp)
    sp.add_argument("--target", required=True)
    sp.add_argument("--greedy", required=True)
    sp.add_argument("--draft-out", required=True)
    sp.set_defaults(fn=cmd_drafter)
    sp = sub.add_parser("eval", help="held-out loss, samples, simulated DDTree/DFlash acceptance")
    common(sp)
    eval_args(sp)
    sp.add_argument("--target", required=True)
    sp.add_argument("--draft", required=True)
    sp.add_argument("--out-json", default=None)
    sp.set_defaults(fn=cmd_eval)
    sp = sub.add_parser("engine-eval", help="the same held-out prompts through ddtree_viz.engine (exact DDTree)")
    common(sp)
    eval_args(sp)
    sp.add_argument("--budgets", default="4,8,16,32,64,128")
    sp.add_argument("--target", default=None, help="default: the embedded assets")
    sp.add_argument("--draft", default=None)
    sp.add_argument("--out-json", default=None)
    sp.set_defaults(fn=cmd_engine_eval)
    sp = sub.add_parser("gpu", help="target + greedy data + drafter + eval in one process")
    common(sp)
    target_args(sp)
    greedy_args(sp)
    drafter_args(sp)
    eval_args(sp)
    sp.add_argument("--out", required=True)
    sp.add_argument("--skip-target", action="store_true", help="reuse OUT/target")
    sp.add_argument("--target-dir", default=None, help="reuse this trained target instead of training one")
    sp.add_argument("--wall-budget", type=float, default=None, help="seconds for the whole command")
    sp.add_argument("--eval-reserve", type=float, default=75.0, help="seconds kept for eval at the end")
    sp.set_defaults(fn=cmd_gpu)
    sp = sub.add_parser("assets", help="assemble assets/ from trained dirs + tokenizer")
    sp.add_argument("--data", default=".train")
    sp.add_argument("--target", required=True)
    sp.add_argument("--draft", required=True)
    sp.add_argument("--out", default="assets")
    sp.set_defaults(fn=cmd_assets)
    a = p.parse_args(argv)
    a.fn(a)


if __name__ == "__main__":
    main()

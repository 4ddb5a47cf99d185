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
from dataclasses import dataclass, fields, replace
from pathlib import Path

from .data import log, pick_device, seed_everything

TARGET_ASSET = "tiny-qwen35-target"
DRAFT_ASSET = "tiny-qwen35-dflash"


# ------------------------------------------------------------------------------------------------------------
# What each stage reads from the command line: fields named as the arguments' dests (``_config`` fills them)
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """Every stage: the prepared data folder, the device, the seed, the JSON file collecting the summaries."""

    data: str = ".train"
    device: str = "auto"
    seed: int = 0
    summary: str | None = None

    def write_summary(self, key: str, value) -> None:
        """Collect stage summaries in one JSON file (``--summary``), one key per stage."""
        if not self.summary:
            return
        path = Path(self.summary)
        data = json.loads(path.read_text()) if path.exists() else {}
        data[key] = value
        path.write_text(json.dumps(data, indent=2) + "\n")


@dataclass(frozen=True)
class PrepareConfig:
    stdlib: str | None = None
    vocab_size: int = 4096


@dataclass(frozen=True)
class TargetConfig:
    seq_len: int
    batch: int
    lr: float
    steps: int | None
    time_budget: float | None
    eval_every: int
    doc_start_frac: float
    max_steps: int


@dataclass(frozen=True)
class GreedyConfig:
    n_seqs: int
    prompt_lens: tuple[int, ...]
    prompt_split: str
    new_tokens: int
    gen_batch: int


# a DFlash2 drafter for the embedded target (hidden 256): its dflash_config fields (`drafter --family dflash2`)
DFLASH2_FIELDS = {"conv_group_size": 16, "conv_kernel_size": 2, "selector_rank": 64, "selector_top_k": 16}


@dataclass(frozen=True)
class DrafterConfig:
    draft_layers: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    draft_batch: int
    anchors: int
    draft_lr: float
    gamma: float
    drafter_steps: int | None
    drafter_time_budget: float | None
    init_draft: str | None
    draft_warmup: int
    family: str = "dflash"
    selector_rank: int = DFLASH2_FIELDS["selector_rank"]
    precompute_features: bool = False


@dataclass(frozen=True)
class EvalConfig:
    n_prompts: int
    eval_new_tokens: int


@dataclass(frozen=True)
class GpuConfig:
    skip_target: bool
    target_dir: str | None
    wall_budget: float | None
    eval_reserve: float


def _config(cls, a: argparse.Namespace):
    """``cls`` from the parsed arguments: each field from the argument of its name, or the field's default where
    the subcommand has no such argument."""
    return cls(**{f.name: getattr(a, f.name) for f in fields(cls) if hasattr(a, f.name)})


def _ints(text: str) -> tuple[int, ...]:
    """``"8,16,32"`` -> ``(8, 16, 32)`` (argparse type of the comma-separated options)."""
    return tuple(int(x) for x in text.split(","))


# ------------------------------------------------------------------------------------------------------------
# The stages
# ------------------------------------------------------------------------------------------------------------


def cmd_corpus(run: Run, cfg: PrepareConfig) -> None:
    from .corpus import build_corpus, write_corpus

    docs, manifest = build_corpus(cfg.stdlib)
    path = write_corpus(docs, manifest, run.data)
    parts = ", ".join(f"{k} {c['files']} files / {c['chars']:,} chars" for k, c in manifest["counts"].items())
    log(f"corpus: {manifest['files']} files ({parts}), python {manifest['python']} -> {path}")


def cmd_tokenizer(run: Run, cfg: PrepareConfig) -> None:
    from .corpus import read_corpus, tokenizer_texts
    from .tokenizer import save_tokenizer, train_tokenizer

    docs = read_corpus(run.data)
    tok = train_tokenizer(tokenizer_texts(docs), vocab_size=cfg.vocab_size)
    save_tokenizer(tok, Path(run.data) / "tokenizer")
    bad = [d.path for d in docs if tok.decode(tok.encode(d.text).ids) != d.text]
    log(f"tokenizer: vocab {tok.get_vocab_size()}, round-trip failures: {len(bad)} {bad[:3]}")
    if bad:
        sys.exit(1)


def cmd_tokenize(run: Run) -> None:
    from .data import tokenize_corpus

    log("tokens:", tokenize_corpus(run.data))


def cmd_prepare(run: Run, cfg: PrepareConfig) -> None:
    cmd_corpus(run, cfg)
    cmd_tokenizer(run, cfg)
    cmd_tokenize(run)


def _setup_torch(device) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 (target/features/generation)
    torch.backends.cudnn.allow_tf32 = False


def cmd_target(run: Run, cfg: TargetConfig, out: str) -> dict:
    from .data import load_tokens
    from .target import train_target
    from .tokenizer import load_tokenizer

    seed_everything(run.seed)
    device = pick_device(run.device)
    _setup_torch(device)
    tokens = load_tokens(run.data)
    vocab = load_tokenizer(Path(run.data) / "tokenizer").get_vocab_size()
    summary = train_target(tokens, vocab, out, device, seed=run.seed, seq_len=cfg.seq_len, batch=cfg.batch, lr=cfg.lr,
                           steps=cfg.steps, time_budget_s=cfg.time_budget, eval_every=cfg.eval_every,
                           max_steps=cfg.max_steps, doc_start_frac=cfg.doc_start_frac)
    run.write_summary("target", summary)
    return summary


def _greedy(run: Run, cfg: GreedyConfig, target, tokens, tok):
    """The target's greedy continuations of prompts from ``--prompt-split``, one group per prompt length;
    every sequence is ``max(prompt lengths) + new tokens`` long. Returns (tokens [N, T], prompt lengths [N])."""
    import torch

    from .distill import greedy_generate, newline_token_ids, sample_prompts

    lens = list(cfg.prompt_lens)
    total = max(lens) + cfg.new_tokens
    newlines = newline_token_ids(tok)
    stream, offsets = tokens[cfg.prompt_split], tokens[f"{cfg.prompt_split}_doc_offsets"]
    t0 = time.time()
    seqs, prompt_lens = [], []
    for i, n in enumerate(lens):
        count = cfg.n_seqs // len(lens) + (i < cfg.n_seqs % len(lens))
        prompts = torch.from_numpy(sample_prompts(stream, offsets, count, n, newlines, run.seed * 1000 + i))
        seqs.append(greedy_generate(target, prompts, total - n, batch=cfg.gen_batch))
        prompt_lens.append(torch.full((count,), n, dtype=torch.long))
    greedy, prompt_lens = torch.cat(seqs), torch.cat(prompt_lens)
    wall = time.time() - t0
    log(f"greedy: {greedy.shape[0]} sequences of {total} tokens (prompts of {lens} tokens from the "
        f"{cfg.prompt_split} split) in {wall:.0f}s")
    run.write_summary("greedy", {"sequences": int(greedy.shape[0]), "prompt_lens": lens, "seq_len": total,
                                 "wall_s": wall, "prompts": f"{cfg.prompt_split}-split windows starting after a "
                                                            "newline token"})
    return greedy, prompt_lens


def cmd_generate(run: Run, cfg: GreedyConfig, target: str, out: str) -> None:
    """Greedy continuations by the target in the folder ``target``, saved to ``out`` (.pt)."""
    import torch

    from .data import load_tokens
    from .target import load_target
    from .tokenizer import load_tokenizer

    seed_everything(run.seed)
    device = pick_device(run.device)
    _setup_torch(device)
    model = load_target(target, device)
    greedy, prompt_lens = _greedy(run, cfg, model, load_tokens(run.data), load_tokenizer(Path(run.data) / "tokenizer"))
    torch.save({"tokens": greedy.to(torch.int16), "prompt_lens": prompt_lens.to(torch.int16)}, out)


def cmd_drafter(run: Run, cfg: DrafterConfig, out: str, target, greedy, deadline: float | None = None) -> dict:
    """Train the drafter into ``out``. ``target``: the target model, or its folder; ``greedy``: the pair (tokens,
    prompt lengths) of ``_greedy``, or the .pt file of ``generate``. ``deadline``: the wall-clock time by which a
    time-budgeted training ends."""
    import torch

    from .distill import train_drafter
    from .target import load_target

    seed_everything(run.seed)
    device = pick_device(run.device)
    _setup_torch(device)
    if isinstance(target, (str, Path)):
        target = load_target(target, device)
    if isinstance(greedy, (str, Path)):
        blob = torch.load(greedy)
        greedy = blob["tokens"].long(), blob["prompt_lens"].long()
    greedy, prompt_lens = greedy
    summary = train_drafter(target, greedy.long(), prompt_lens, out, device, seed=run.seed,
                            num_layers=cfg.draft_layers, block_size=cfg.block_size, batch=cfg.draft_batch,
                            anchors=cfg.anchors, lr=cfg.draft_lr, gamma=cfg.gamma, steps=cfg.drafter_steps,
                            time_budget_s=cfg.drafter_time_budget, target_layer_ids=cfg.target_layer_ids,
                            precompute_features=cfg.precompute_features or device.type == "cuda",
                            deadline=deadline,
                            init_from=cfg.init_draft, warmup=cfg.draft_warmup,
                            dflash2={**DFLASH2_FIELDS, "selector_rank": cfg.selector_rank}
                            if cfg.family == "dflash2" else None)
    run.write_summary("drafter", summary)
    return summary


def cmd_eval(run: Run, cfg: EvalConfig, target, drafter, out_json: str | None = None) -> dict:
    """Held-out figures of the pair; ``target`` and ``drafter``: the models, or their folders."""
    from ddtree_viz.engine.models import drafter_class

    from .data import load_tokens
    from .evaluate import evaluate_pair
    from .target import load_target
    from .tokenizer import load_tokenizer

    import torch

    device = pick_device(run.device)
    _setup_torch(device)
    if device.type == "cpu":
        torch.set_num_threads(max(1, torch.get_num_threads()))
    if isinstance(target, (str, Path)):
        target = load_target(target, device)
    if isinstance(drafter, (str, Path)):
        drafter = drafter_class(Path(drafter)).from_pretrained(drafter, dtype=torch.float32, device=device)
    tok = load_tokenizer(Path(run.data) / "tokenizer")
    res = evaluate_pair(target, drafter, tok, load_tokens(run.data), n_prompts=cfg.n_prompts,
                        new_tokens=cfg.eval_new_tokens, out_json=out_json)
    run.write_summary("eval", res)
    for s in res["samples"]:
        print("=" * 30, "PROMPT", "=" * 30)
        print(s["prompt"])
        print("-" * 30, "GREEDY CONTINUATION", "-" * 30)
        print(s["continuation"])
    print(json.dumps({k: v for k, v in res.items() if k != "samples"}, indent=2))
    return res


def cmd_engine_eval(run: Run, cfg: EvalConfig, budgets: tuple[int, ...], target: str | None, draft: str | None,
                    out_json: str | None) -> dict:
    import torch

    from .data import load_tokens
    from .evaluate import engine_acceptance
    from .tokenizer import load_tokenizer

    torch.set_num_threads(max(1, torch.get_num_threads()))
    res = engine_acceptance(load_tokens(run.data), load_tokenizer(Path(run.data) / "tokenizer"),
                            budgets=list(budgets), new_tokens=cfg.eval_new_tokens,
                            n_prompts=cfg.n_prompts, target=target, draft=draft)
    print(json.dumps(res, indent=2))
    if out_json:
        Path(out_json).write_text(json.dumps(res, indent=2) + "\n")
    return res


def cmd_gpu(run: Run, gpu: GpuConfig, target_cfg: TargetConfig, greedy_cfg: GreedyConfig, drafter_cfg: DrafterConfig,
            eval_cfg: EvalConfig, out: str) -> None:
    """Everything that wants the accelerator, in one process: target, greedy data, drafter, eval, into ``out``."""
    import torch

    from ddtree_viz.engine.models import drafter_class

    from .data import load_tokens
    from .target import load_target
    from .tokenizer import load_tokenizer

    t_start = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    device = pick_device(run.device)
    import platform

    import transformers

    hw = {"device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
          "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
          "argv": sys.argv[1:]}
    log("hardware/software:", hw)
    if run.summary is None:
        run = replace(run, summary=str(out / "summary.json"))
    run.write_summary("run", hw)
    target_dir = gpu.target_dir or str(out / "target")
    if gpu.target_dir or gpu.skip_target:
        log("target: reusing", target_dir)
    else:
        cmd_target(run, target_cfg, target_dir)
    target = load_target(target_dir, device)  # the bf16-rounded weights, computed in float32
    for p in target.parameters():
        p.requires_grad_(False)
    tokens = load_tokens(run.data)
    tok = load_tokenizer(Path(run.data) / "tokenizer")
    seed_everything(run.seed)
    greedy = _greedy(run, greedy_cfg, target, tokens, tok)
    # leave time for the final evaluation and the copy back
    deadline = t_start + gpu.wall_budget - gpu.eval_reserve if gpu.wall_budget is not None else None
    cmd_drafter(run, drafter_cfg, str(out / "draft"), target, greedy, deadline=deadline)
    drafter = drafter_class(out / "draft").from_pretrained(out / "draft", dtype=torch.float32, device=device)
    cmd_eval(run, eval_cfg, target, drafter)
    hw["wall_s"] = time.time() - t_start
    run.write_summary("run", hw)
    log(f"gpu pipeline done in {hw['wall_s']:.0f}s")


def cmd_assets(data: str, target: str, draft: str, out: str) -> None:
    """Assemble assets/<target>/ and assets/<draft>/ (configs, weights, tokenizer files)."""
    from .target import write_sharded

    out = Path(out)
    tdir = _fresh_dir(out / TARGET_ASSET)
    for f in ("config.json", "generation_config.json"):
        shutil.copyfile(Path(target) / f, tdir / f)
    write_sharded(Path(target) / "model.safetensors", tdir)  # shards under 8 MiB each
    ddir = _drafter_asset(draft, out / DRAFT_ASSET)
    for d in (tdir, ddir):
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(Path(data) / "tokenizer" / f, d / f)
    log(f"assets written: {tdir}, {ddir}; total {_mib(out):.2f} MiB")


def cmd_draft_asset(draft: str, out: str, name: str) -> None:
    """One more drafter beside the embedded target: assets/<name>/ with its config and weights (a drafter reads the
    target's tokenizer, so none is copied); the target and the other drafter stay as they are."""
    ddir = _drafter_asset(draft, Path(out) / name)
    log(f"drafter asset written: {ddir}; assets total {_mib(Path(out)):.2f} MiB")


def _fresh_dir(d: Path) -> Path:
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return d


def _drafter_asset(draft: str, ddir: Path) -> Path:
    """`ddir` made anew with the drafter's config and weights."""
    _fresh_dir(ddir)
    for f in ("config.json", "model.safetensors"):
        shutil.copyfile(Path(draft) / f, ddir / f)
    return ddir


def _mib(out: Path) -> float:
    return sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 2**20


def run_command(a: argparse.Namespace) -> None:
    """The one place where the parsed arguments become the stages' configs, and the subcommand runs."""
    run = _config(Run, a)
    commands = {
        "corpus": lambda: cmd_corpus(run, _config(PrepareConfig, a)),
        "tokenizer": lambda: cmd_tokenizer(run, _config(PrepareConfig, a)),
        "tokenize": lambda: cmd_tokenize(run),
        "prepare": lambda: cmd_prepare(run, _config(PrepareConfig, a)),
        "target": lambda: cmd_target(run, _config(TargetConfig, a), a.out),
        "generate": lambda: cmd_generate(run, _config(GreedyConfig, a), a.target, a.greedy),
        "drafter": lambda: cmd_drafter(run, _config(DrafterConfig, a), a.draft_out, a.target, a.greedy),
        "eval": lambda: cmd_eval(run, _config(EvalConfig, a), a.target, a.draft, a.out_json),
        "engine-eval": lambda: cmd_engine_eval(run, _config(EvalConfig, a), a.budgets, a.target, a.draft, a.out_json),
        "gpu": lambda: cmd_gpu(run, _config(GpuConfig, a), _config(TargetConfig, a), _config(GreedyConfig, a),
                               _config(DrafterConfig, a), _config(EvalConfig, a), a.out),
        "assets": lambda: cmd_assets(run.data, a.target, a.draft, a.out),
        "draft-asset": lambda: cmd_draft_asset(a.draft, a.out, a.name),
    }
    commands[a.cmd]()


def _common(sp, data=True):
    """The options of every stage: the data folder, the device, the seed, the summary file."""
    if data:
        sp.add_argument("--data", default=".train", help="corpus / tokenizer / tokens folder")
    sp.add_argument("--device", default="auto")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--summary", default=None, help="JSON file collecting the stages' summaries")


def _target_args(sp):
    """The options of training the target."""
    sp.add_argument("--seq-len", type=int, default=1024)
    sp.add_argument("--batch", type=int, default=32)
    sp.add_argument("--lr", type=float, default=2e-3)
    sp.add_argument("--steps", type=int, default=None, help="target steps (reproducible form)")
    sp.add_argument("--time-budget", type=float, default=None, help="target seconds (sets the steps)")
    sp.add_argument("--eval-every", type=int, default=250)
    sp.add_argument("--doc-start-frac", type=float, default=0.0,
                    help="share of each target batch whose windows start at a file's beginning (shipped: 0)")
    sp.add_argument("--max-steps", type=int, default=1300, help="cap when --time-budget sets the steps")


def _greedy_args(sp):
    """The options of the target's greedy continuations (the drafter's data)."""
    sp.add_argument("--n-seqs", type=int, default=8192)
    sp.add_argument("--prompt-lens", type=_ints, default="8,16,32,64", help="one group of prompts per length")
    sp.add_argument("--prompt-split", default="draft", choices=("draft", "train"),
                    help="where the prompts come from (draft: text the target never trained on)")
    sp.add_argument("--new-tokens", type=int, default=256)
    sp.add_argument("--gen-batch", type=int, default=2048)


def _drafter_args(sp):
    """The options of training the drafter."""
    sp.add_argument("--draft-layers", type=int, default=3)
    sp.add_argument("--block-size", type=int, default=16)
    sp.add_argument("--target-layer-ids", type=_ints, default="1,3,5,6")
    sp.add_argument("--draft-batch", type=int, default=32)
    sp.add_argument("--anchors", type=int, default=32)
    sp.add_argument("--draft-lr", type=float, default=2e-3)
    sp.add_argument("--gamma", type=float, default=7.0)
    sp.add_argument("--drafter-steps", type=int, default=None)
    sp.add_argument("--drafter-time-budget", type=float, default=None)
    sp.add_argument("--init-draft", default=None,
                    help="continue from this drafter's weights (with --family dflash2, a DFlash drafter's folder "
                         "warm-starts the DFlash2 drafter: shared weights copied, convolutions identity, selector new)")
    sp.add_argument("--draft-warmup", type=int, default=30)
    sp.add_argument("--family", choices=("dflash", "dflash2"), default="dflash",
                    help="dflash2: a DFlash2 drafter (convolutions and candidate selector, DFLASH2_FIELDS)")
    sp.add_argument("--precompute-features", action="store_true",
                    help="the target's context features of every sequence once, before training (always on CUDA; on "
                         "a CPU it saves the target's forward per step when steps x batch exceed the sequences)")
    sp.add_argument("--selector-rank", type=int, default=DFLASH2_FIELDS["selector_rank"],
                    help="a DFlash2 drafter's candidate selector rank (default %(default)s)")


def _eval_args(sp):
    """The options of evaluating the pair."""
    sp.add_argument("--n-prompts", type=int, default=32)
    sp.add_argument("--eval-new-tokens", type=int, default=256)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ddtree_viz.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    sp = sub.add_parser("corpus", help="build corpus.jsonl.xz from this interpreter's stdlib")
    _common(sp)
    sp.add_argument("--stdlib", default=None)
    sp = sub.add_parser("tokenizer", help="train the byte-level BPE tokenizer")
    _common(sp)
    sp.add_argument("--vocab-size", type=int, default=4096)
    sp = sub.add_parser("tokenize", help="encode the corpus -> tokens.npz")
    _common(sp)
    sp = sub.add_parser("prepare", help="corpus + tokenizer + tokenize")
    _common(sp)
    sp.add_argument("--stdlib", default=None)
    sp.add_argument("--vocab-size", type=int, default=4096)
    sp = sub.add_parser("target", help="train the target")
    _common(sp)
    _target_args(sp)
    sp.add_argument("--out", required=True)
    sp = sub.add_parser("generate", help="greedy continuations of train prompts")
    _common(sp)
    _greedy_args(sp)
    sp.add_argument("--target", required=True)
    sp.add_argument("--greedy", required=True, help="output .pt")
    sp = sub.add_parser("drafter", help="train the DFlash drafter on greedy continuations")
    _common(sp)
    _greedy_args(sp)
    _drafter_args(sp)
    sp.add_argument("--target", required=True)
    sp.add_argument("--greedy", required=True)
    sp.add_argument("--draft-out", required=True)
    sp = sub.add_parser("eval", help="held-out loss, samples, simulated DDTree/DFlash acceptance")
    _common(sp)
    _eval_args(sp)
    sp.add_argument("--target", required=True)
    sp.add_argument("--draft", required=True)
    sp.add_argument("--out-json", default=None)
    sp = sub.add_parser("engine-eval", help="the same held-out prompts through ddtree_viz.engine (exact DDTree)")
    _common(sp)
    _eval_args(sp)
    sp.add_argument("--budgets", type=_ints, default="4,8,16,32,64,128")
    sp.add_argument("--target", default=None, help="default: the embedded assets")
    sp.add_argument("--draft", default=None)
    sp.add_argument("--out-json", default=None)
    sp = sub.add_parser("gpu", help="target + greedy data + drafter + eval in one process")
    _common(sp)
    _target_args(sp)
    _greedy_args(sp)
    _drafter_args(sp)
    _eval_args(sp)
    sp.add_argument("--out", required=True)
    sp.add_argument("--skip-target", action="store_true", help="reuse OUT/target")
    sp.add_argument("--target-dir", default=None, help="reuse this trained target instead of training one")
    sp.add_argument("--wall-budget", type=float, default=None, help="seconds for the whole command")
    sp.add_argument("--eval-reserve", type=float, default=75.0, help="seconds kept for eval at the end")
    sp = sub.add_parser("assets", help="assemble assets/ from trained dirs + tokenizer")
    sp.add_argument("--data", default=".train")
    sp.add_argument("--target", required=True)
    sp.add_argument("--draft", required=True)
    sp.add_argument("--out", default="assets")
    sp = sub.add_parser("draft-asset", help="add one more drafter beside the embedded target in assets/")
    sp.add_argument("--draft", required=True)
    sp.add_argument("--name", default="tiny-qwen35-dflash2")
    sp.add_argument("--out", default="assets")
    return p


def main(argv=None) -> None:
    run_command(build_parser().parse_args(argv))

if __name__ == "__main__":
    main()

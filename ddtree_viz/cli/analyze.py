"""`analyze`: many prompts, one report. Every prompt of a prompt file decoded into DIR (ddtree_viz/promptset: THE
prompt-set loop, the summary from the written traces only, the report), one process or one of N under
`accelerate launch --num_processes N -m ddtree_viz analyze ...` (each decodes its share; the main process merges).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from ..errors import InputError
from ..options import DFLASH, whole_number
from ..promptset.files import BOTH, SET_METHODS, item_spec, prepare_dir, read_prompts, run_settings, write_json
from .common import (add_decode_args, add_model_args, add_sampling_args, add_scoring_arg, check_settings,
                     decode_settings, load_models)

CHAT_NEEDED = "chat prompts ({'messages': [...]}) need the target's chat template: add --chat"


def add_parser(sub) -> None:
    an = sub.add_parser(
        "analyze", help="decode a prompt set; one summary and one self-contained report of where drafts diverge",
        description="Decode every prompt of FILE (plain text, one prompt per blank-line-separated block; or JSONL with "
                    "{'prompt': ...} per line; or a shipped set: heldout-code, docstring-first, instructions), write "
                    "one trace per prompt (DIR/traces/NNNN.json), DIR/summary.json, DIR/report.html and its figures. "
                    "Several processes: accelerate launch --num_processes N -m ddtree_viz analyze ... splits the "
                    "prompts; the main process merges.")
    an.add_argument("--prompts", required=True, metavar="FILE", help="the prompt file (or a shipped set's name)")
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
    an.add_argument("--method", default="ddtree", choices=SET_METHODS,
                    help="default: ddtree; both: every prompt with DDTree (traces/NNNN.json) and with the DFlash chain "
                         "(traces/NNNN.dflash.json), the same settings otherwise; summary.json's 'dflash' holds the "
                         "chain's figures")
    add_model_args(an)
    add_decode_args(an)
    add_scoring_arg(an)
    add_sampling_args(an)
    an.set_defaults(handler=command)


class Progress:
    """One line on stderr, redrawn: prompts done, tokens/s, ETA."""

    def __init__(self, total: int, label: str = "", stream=sys.stderr):
        self.total, self.label, self.stream = total, label, stream
        self.done = self.tokens = 0
        self.start = time.perf_counter()
        self.tty = getattr(stream, "isatty", lambda: False)()

    def update(self, tokens: int = 0) -> None:
        self.done += 1
        self.tokens += tokens
        elapsed = time.perf_counter() - self.start
        rate = self.tokens / elapsed if elapsed > 0 else 0.0
        eta = elapsed / self.done * (self.total - self.done) if self.done else 0.0
        width = 24
        filled = int(width * self.done / max(self.total, 1))
        line = (f"{self.label}[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} prompts  "
                f"{rate:.1f} tok/s  ETA {int(eta) // 60}:{int(eta) % 60:02d}")
        self.stream.write(("\r" + line) if self.tty else (line + "\n"))
        if self.tty and self.done == self.total:
            self.stream.write("\n")
        self.stream.flush()


def command(args) -> int:
    """One process, or one of N under `accelerate launch`."""
    items = _check(args)
    out = Path(args.out)
    state = _distributed_state(args.device)
    main = state is None or state.is_main_process
    if main:
        prepare_dir(out, args.resume, args.force, main=True)
        write_json(out / "prompts.json", {"file": str(args.prompts), "prompts": items, "settings": _settings(args)})
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
    if failure is not None:
        raise InputError(failure)
    if failures:
        raise InputError(f"{failures} other process(es) failed (their error above): no report written")
    if not main:
        return 130 if interrupted else 0
    from ..promptset.summary import write_outputs

    try:
        summary = write_outputs(out, budgets=args.budgets)
    except OSError as exc:
        raise InputError(f"cannot write the report into {out}: {exc.strerror or exc}") from None
    _print_summary(summary, out)
    if interrupted:
        print(f"interrupted: the report covers the {summary['prompts']} prompts done; --resume goes on",
              file=sys.stderr)
        return 130
    return 0


def _check(args) -> list[dict]:
    """The prompt set, read, and every option checked before any model work (nothing written yet)."""
    from ..engine.prompts import parse_thinking

    items = read_prompts(args.prompts)
    if not args.chat and any("messages" in it for it in items):
        raise InputError(CHAT_NEEDED)
    thinking = parse_thinking(args.thinking)
    for item in items[:1]:  # the chat options themselves (--thinking without --chat, ...), before any model work
        item_spec({"prompt": "x"} if "messages" in item else item, args.chat, args.system, thinking)
    if args.budgets and any(b < 1 for b in args.budgets):
        raise InputError("--budgets must be whole numbers of at least 1")
    check_settings(args)
    return items


def _decode(args, items: list[dict], out: Path, state) -> None:
    """This process's share of the prompts decoded into DIR (promptset.decode.decode_set), a progress line on
    stderr. analyze decodes on the reference path (transformers' forward); --method both: DDTree, then the chain."""
    from ..engine.prompts import has_chat_template, parse_thinking
    from ..promptset.decode import decode_set

    mine, label, rank = items, "", 0
    if state is not None:
        with state.split_between_processes(items) as share:
            mine = list(share)
        rank, label = state.process_index, f"[{state.process_index}/{state.num_processes}] "
    gpu = state.local_process_index if state is not None and args.device == "cuda" else None  # a GPU per process
    pair = load_models(args, gpu)
    if args.chat and not has_chat_template(pair.tokenizer):
        raise InputError("--chat: the target's tokenizer has no chat template (the embedded pair has none)")
    thinking = parse_thinking(args.thinking)
    settings = decode_settings(args, method="ddtree" if args.method == BOTH else args.method, engine="transformers")
    progress = Progress(len(mine), label)
    for done in decode_set(pair, mine, out, settings, lambda item: item_spec(item, args.chat, args.system, thinking),
                           both=args.method == BOTH, resume=args.resume, process=rank):
        progress.update(done.tokens)


def _print_summary(summary: dict, out: Path) -> None:
    n, total = summary["prompts"], summary["prompts_total"]
    print(f"{n} of {total} prompts decoded ({len(summary['failed'])} failed); mean acceptance "
          f"{_fmt(summary['mean_acceptance'])} tokens kept per round over {summary['rounds']} rounds; identical to greedy "
          f"{summary['identical_prompts']}/{n}")
    chain = summary.get(DFLASH)
    if chain is not None:
        print(f"DFlash chain on the same prompts: {chain['prompts']} decoded ({len(chain['failed'])} failed); mean "
              f"acceptance {_fmt(chain['mean_acceptance'])} tokens kept per round over {chain['rounds']} rounds; identical "
              f"to greedy {chain['identical_prompts']}/{chain['prompts']}")
    print(f"summary: {out / 'summary.json'}\nreport: {out / 'report.html'}")


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _settings(args) -> dict:
    """The run's settings as prompts.json keeps them."""
    return run_settings(args.budget, args.max_new_tokens, args.dtype, args.device, args.budgets, args.method,
                        args.block_size, args.temperature, args.top_k, args.top_p, args.seed, args.tree_scoring)


def _failures(state, failure: str | None) -> int:
    """How many other processes failed (each says why on its own stderr): all of them wait here, so one process's
    write failure ends every process with a clear error, not one crashed and the others at a broken barrier."""
    if state is None:
        return 0
    from accelerate.utils import gather_object

    flags = gather_object([failure is not None])
    return sum(flags) - (failure is not None)


def _distributed_state(device: str = "cpu"):
    """accelerate's PartialState when launched as several processes (accelerate launch / torchrun), else None.
    On the CPU (--device cpu, or no GPU) the processes talk through gloo."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    import torch
    from accelerate import PartialState

    return PartialState(cpu=device == "cpu" or not torch.cuda.is_available())

"""`analyze`: many prompts, one report. Decode every prompt of a prompt file, write one ordinary trace per prompt
(DIR/traces/NNNN.json, replayable), then DIR/summary.json and DIR/report.html (+ its figures as SVG and PDF).

The summary is computed ONLY from the traces written in DIR (`summarize(DIR)`), so a resumed run, an interrupted
run and a run split over several processes (`accelerate launch --num_processes N -m ddtree_viz analyze ...`: each
process decodes its share of the prompts, the main process merges) all give their figures one way. Every figure
comes from ddtree_viz/analysis.py.

Files in DIR:
  prompts.json            the prompt set as read (index, source, prompt or messages) and the run's settings
  traces/NNNN.json        prompt NNNN's trace (trace.py's contract)
  traces/NNNN.error.json  prompt NNNN failed: {index, error, kind}
  traces/NNNN.meta.json   prompt NNNN's wall time and the process that decoded it (not part of the figures)
  traces/NNNN.dflash.json (and .dflash.error.json, .dflash.meta.json) with --method both: the DFlash chain's
                          decode of prompt NNNN, the same settings otherwise (NNNN.json is then DDTree's)
  summary.json            the figures (the contract in docs/ARCHITECTURE.md); with --method both the chain's under
                          "dflash", the same keys
  report.html             self-contained (no network), figures inline
  figures/*.svg, *.pdf    the report's figures

`read_report` reads such a directory's files (or the same files uploaded to the page, by name) with every trace
validated (Trace.load) and the other files checked: the web page's Analyze tab shows the report from it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import analysis
from .errors import DDTreeVizError, InputError, TraceError
from .trace import MAX_TEXT_CHARS, MAX_TRACE_BYTES, Trace, check_text, parse_json

PROMPTS_DIR = Path(__file__).parent / "prompts"
SUMMARY_VERSION = 1
TOP_MISSES = 20
EXAMPLES_PER_MISS = 5
POSITION_BINS = 4  # acceptance by position in the generation: the generation cut in this many equal parts
CHAT_NEEDED = "chat prompts ({'messages': [...]}) need the target's chat template: add --chat"
DFLASH = "dflash"  # --method both: the side of the DFlash chain (traces/NNNN.dflash.json, summary["dflash"])
METHODS = ("ddtree", "dflash", "both")


# ----------------------------------------------------------------------------------------------------------
# The prompt file
# ----------------------------------------------------------------------------------------------------------


def read_prompts(path: str | Path) -> list[dict[str, Any]]:
    """[{index, prompt | messages, source}] from a prompt file: JSONL (one object a line with 'prompt': str or
    'messages': [...]; a file named *.jsonl, or whose first non-blank character is '{') or plain text (one prompt
    per blank-line-separated block). A bare name of a shipped set (e.g. 'heldout-code') is found in
    ddtree_viz/prompts/."""
    p = Path(path)
    if not p.exists() and not p.is_absolute() and len(p.parts) == 1:
        for cand in (PROMPTS_DIR / p.name, *sorted(PROMPTS_DIR.glob(p.name + ".*"))):
            if cand.is_file() and cand.suffix in (".txt", ".jsonl"):
                p = cand
                break
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"prompt file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read prompt file {path}: {exc}") from None
    items: list[dict[str, Any]] = []
    if p.suffix == ".jsonl" or text.lstrip().startswith("{"):
        for no, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path} line {no}: not JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise InputError(f"{path} line {no}: expected an object with 'prompt' or 'messages'")
            source = obj.get("source") if isinstance(obj.get("source"), str) else f"{p.name}:{no}"
            if isinstance(obj.get("prompt"), str) and obj["prompt"]:
                items.append({"index": len(items), "prompt": obj["prompt"], "source": source})
            elif isinstance(obj.get("messages"), list) and obj["messages"]:
                items.append({"index": len(items), "messages": obj["messages"], "source": source})
            else:
                raise InputError(f"{path} line {no}: expected a non-empty 'prompt' (text) or 'messages' (list)")
    else:
        for block in re.split(r"\n[ \t]*\n", text.replace("\r\n", "\n")):
            block = block.strip("\n")
            if block.strip():
                items.append({"index": len(items), "prompt": block, "source": f"{p.name} block {len(items) + 1}"})
    if not items:
        raise InputError(f"prompt file {path} holds no prompts")
    return items


def trace_path(out: Path, index: int, kind: str = "", side: str = "") -> Path:
    """DIR/traces/NNNN[.side][.kind].json: kind "" (the trace), "error" or "meta"; side "" (the run's method, DDTree
    with --method both) or DFLASH (the chain of --method both)."""
    return out / "traces" / (f"{index:04d}{'.' + side if side else ''}{'.' + kind if kind else ''}.json")


def sides_of(method: str) -> list[tuple[str, str]]:
    """[(method decoded, side)] for --method: one side, or (--method both) DDTree's and the DFlash chain's."""
    return [("ddtree", ""), ("dflash", DFLASH)] if method == "both" else [(method, "")]


# ----------------------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------------------


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


def prepare_dir(out: Path, resume: bool, force: bool, main: bool) -> None:
    """An existing non-empty DIR is refused unless --resume (keep its traces) or --force (start afresh)."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a directory")
    if out.exists() and any(out.iterdir()) and not (resume or force):
        raise InputError(f"{out} already exists: give --resume to skip the prompts whose traces exist, or --force "
                         "to start again")
    if main and force and not resume and out.exists():
        for name in ("traces", "figures", "summary.json", "report.html", "prompts.json"):
            target = out / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    (out / "traces").mkdir(parents=True, exist_ok=True)


def prompt_spec(item: dict, args):
    """One prompt of the set as the engine takes it: raw text, or (--chat) the text as the user's message or the
    item's messages, through the tokenizer's chat template (engine/prompts.py)."""
    from .engine.prompts import PromptSpec, check_spec, parse_thinking

    messages = tuple((m.get("role"), m.get("content")) for m in item.get("messages", ()))
    return check_spec(PromptSpec(text=item.get("prompt", ""), messages=messages, chat=bool(args.chat),
                                 system=getattr(args, "system", None), thinking=parse_thinking(args.thinking)))


def decode_one(pair, item: dict, args, method: str | None = None) -> Trace:
    """One prompt decoded with `method` (default: args.method), the run's other settings."""
    from .engine.sampling import Sampler
    from .engine.session import DecodeSession

    method = method or args.method
    session = DecodeSession(pair, budget=args.budget, max_new_tokens=args.max_new_tokens, method=method,
                            block_size=args.block_size, engine=getattr(args, "engine", "transformers"),
                            sampler=Sampler(args.temperature, args.top_k, args.top_p, args.seed))
    session.prefill(spec=prompt_spec(item, args))
    session.run()
    return session.to_trace(with_greedy=True)


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)


def record_failure(out: Path, index: int, exc: BaseException, side: str = "") -> None:
    """traces/NNNN.error.json for a prompt that failed (too long, out of memory, a bug): its error in one line."""
    if type(exc).__name__ == "OutOfMemoryError" or isinstance(exc, DDTreeVizError):
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    else:
        message = f"{type(exc).__name__}: {exc}"
    _write_json(trace_path(out, index, "error", side), {"index": index, "error": message, "kind": type(exc).__name__})


def run_prompts(pair, items: list[dict], out: Path, args, rank: int = 0, label: str = "") -> tuple[int, bool]:
    """Decode `items` into out/traces/ (with --method both, each prompt with DDTree and then the DFlash chain),
    skipping each trace that exists when args.resume. A decode that fails is recorded with its error and the run
    goes on. Returns (prompts decoded now, interrupted)."""
    progress = Progress(len(items), label)
    done, interrupted = 0, False
    sides = sides_of(args.method)
    for item in items:
        i = item["index"]
        tokens, decoded = 0, False
        for method, side in sides:
            dest = trace_path(out, i, side=side)
            if getattr(args, "resume", False) and dest.exists():
                continue
            trace_path(out, i, "error", side).unlink(missing_ok=True)
            start = time.perf_counter()
            try:
                trace = decode_one(pair, item, args, method)
                tmp = dest.with_name(dest.name + ".tmp")
                trace.save(tmp)
                os.replace(tmp, dest)
                tokens += len(trace.output_ids)
            except KeyboardInterrupt:
                interrupted = True
                break
            except Exception as exc:  # a failed prompt (too long, out of memory, a bug) is recorded; the run goes on
                record_failure(out, i, exc, side)
            _write_json(trace_path(out, i, "meta", side), {"index": i, "wall_s": round(time.perf_counter() - start, 3),
                                                           "process": rank})
            decoded = True
        if interrupted:
            break
        done += decoded
        progress.update(tokens)
    return done, interrupted


def cmd_analyze(args) -> int:
    """The `analyze` command (cli.py parses). One process, or one of N under `accelerate launch`."""
    from .cli import _check_settings, _quiet_transformers

    items = read_prompts(args.prompts)
    if not args.chat and any("messages" in it for it in items):
        raise InputError(CHAT_NEEDED)
    for item in items[:1]:  # the chat options themselves (--thinking without --chat, ...), before any model work
        prompt_spec({"prompt": "x"} if "messages" in item else item, args)
    if args.budgets and any(b < 1 for b in args.budgets):
        raise InputError("--budgets must be whole numbers of at least 1")
    _check_settings(args)
    out = Path(args.out)
    state = _distributed_state(args.device)
    main = state is None or state.is_main_process
    if main:
        prepare_dir(out, args.resume, args.force, main=True)
        _write_json(out / "prompts.json", {"file": str(args.prompts), "prompts": items, "settings": _settings(args)})
    if state is not None:
        state.wait_for_everyone()
        if not main:
            (out / "traces").mkdir(parents=True, exist_ok=True)
    _quiet_transformers(args.verbose)
    mine, label, rank = items, "", 0
    if state is not None:
        with state.split_between_processes(items) as share:
            mine = list(share)
        rank, label = state.process_index, f"[{state.process_index}/{state.num_processes}] "
    pair = _load_pair(args, state)
    if args.chat:
        from .engine.prompts import has_chat_template

        if not has_chat_template(pair.tokenizer):
            raise InputError("--chat: the target's tokenizer has no chat template (the embedded pair has none)")
    interrupted = False
    try:
        _, interrupted = run_prompts(pair, mine, out, args, rank, label)
    except KeyboardInterrupt:
        interrupted = True
    if state is not None:
        state.wait_for_everyone()
    if not main:
        return 130 if interrupted else 0
    summary = write_outputs(out, budgets=args.budgets)
    n, total = summary["prompts"], summary["prompts_total"]
    print(f"{n} of {total} prompts decoded ({len(summary['failed'])} failed); mean acceptance "
          f"{_fmt(summary['mean_acceptance'])} tokens per round over {summary['rounds']} rounds; identical to greedy "
          f"{summary['identical_prompts']}/{n}")
    chain = summary.get(DFLASH)
    if chain is not None:
        print(f"DFlash chain on the same prompts: {chain['prompts']} decoded ({len(chain['failed'])} failed); mean "
              f"acceptance {_fmt(chain['mean_acceptance'])} tokens per round over {chain['rounds']} rounds; identical "
              f"to greedy {chain['identical_prompts']}/{chain['prompts']}")
    print(f"summary: {out / 'summary.json'}\nreport: {out / 'report.html'}")
    if interrupted:
        print(f"interrupted: the report covers the {n} prompts done; --resume goes on", file=sys.stderr)
        return 130
    return 0


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def run_settings(budget: int, max_new_tokens: int, dtype: str, device: str, budgets=(), method: str = "ddtree",
                 block_size: int | None = None, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int = 0) -> dict:
    """A run's settings as prompts.json keeps them (analyze's, or a prompt set run from the page)."""
    return {"budget": budget, "budgets": list(budgets or []), "max_new_tokens": max_new_tokens, "method": method,
            "block_size": block_size, "dtype": dtype, "device": device, "temperature": temperature, "top_k": top_k,
            "top_p": top_p, "seed": seed}


def _settings(args) -> dict:
    return run_settings(args.budget, args.max_new_tokens, args.dtype, args.device, args.budgets, args.method,
                        args.block_size, args.temperature, args.top_k, args.top_p, args.seed)


def _distributed_state(device: str = "cpu"):
    """accelerate's PartialState when launched as several processes (accelerate launch / torchrun), else None.
    On the CPU (--device cpu, or no GPU) the processes talk through gloo."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    import torch
    from accelerate import PartialState

    return PartialState(cpu=device == "cpu" or not torch.cuda.is_available())


def _load_pair(args, state):
    from .engine.models import check_embedded, load_pair

    if args.target is None:
        check_embedded(draft_too=args.draft is None)
    if state is not None and args.device == "cuda":
        import torch

        torch.cuda.set_device(state.local_process_index)  # each process on its own GPU
    return load_pair(args.target, args.draft, dtype=args.dtype, device=args.device)


# ----------------------------------------------------------------------------------------------------------
# The summary: from the written traces only
# ----------------------------------------------------------------------------------------------------------


TRACE_NAME = re.compile(r"(\d{1,6})(?:\.(" + DFLASH + r"))?(?:\.(error|meta))?\.json")
MAX_SMALL_BYTES = 1 << 20  # an error or meta record
MAX_REPORT_TRACES = 4096  # trace files of one report (2048 prompts with --method both)


@dataclass
class Report:
    """A report's files as read: the prompt set (prompts.json; [] without it), per side ("" = the run's method,
    DDTree with --method both; DFLASH = the chain of --method both) the traces, error records and metas by prompt
    index, and every trace's name in DIR ("traces/0000.json") -> its file. `summary` is summary.json as written
    (None without it): the figures are always computed again from the traces."""

    items: list[dict] = field(default_factory=list)
    traces: dict[str, dict[int, Trace]] = field(default_factory=lambda: {"": {}})
    errors: dict[str, dict[int, dict]] = field(default_factory=lambda: {"": {}})
    metas: dict[str, dict[int, dict]] = field(default_factory=lambda: {"": {}})
    files: dict[str, Path] = field(default_factory=dict)
    summary: dict | None = None
    budgets: list[int] | None = None  # the run's --budgets (prompts.json's settings; None: every budget, or unknown)

    @property
    def sides(self) -> list[str]:
        """"" and, when the report has any of the chain's files (--method both), DFLASH."""
        return [""] + ([DFLASH] if self.traces.get(DFLASH) or self.errors.get(DFLASH) else [])


def report_files(out: str | Path) -> dict[str, Path]:
    """A report directory's files by the names read_report takes: summary.json, prompts.json, traces/<NNNN...>.json
    (other files are not read; more than 3 x MAX_REPORT_TRACES of them is a TraceError)."""
    out = Path(out)
    files = {name: out / name for name in ("summary.json", "prompts.json") if (out / name).is_file()}
    if (out / "traces").is_dir():
        found = []
        for entry in os.scandir(out / "traces"):
            if TRACE_NAME.fullmatch(entry.name) and entry.is_file():
                found.append(entry.name)
                if len(found) > 3 * MAX_REPORT_TRACES:  # traces, error and meta records
                    raise TraceError(f"the report has more than {3 * MAX_REPORT_TRACES:,} files in traces/")
        for name in sorted(found):
            files[f"traces/{name}"] = out / "traces" / name
    return files


def read_report(files: dict[str, Path], names: bool = False, max_bytes: int | None = None) -> Report:
    """The report held by `files` (report_files' names -> paths): every trace validated (Trace.load), the prompt
    set, error and meta records checked for their types (a clear TraceError naming the file otherwise), at most
    MAX_REPORT_TRACES traces and (max_bytes) that many bytes in all. names=True: messages call each file by its
    name in the report, never by its path (the page's uploads)."""
    traced = [n for n in files if n.startswith("traces/")]
    if sum(1 for n in traced if not n.endswith((".error.json", ".meta.json"))) > MAX_REPORT_TRACES:
        raise TraceError(f"the report has more than {MAX_REPORT_TRACES:,} trace files; at most that many are read")
    if max_bytes is not None:
        total = 0
        for path in files.values():
            try:
                total += Path(path).stat().st_size
            except OSError:
                pass
        if total > max_bytes:
            raise TraceError(f"the report's files hold {total:,} bytes; at most {max_bytes // 2**20} MiB are read")
    report = Report()

    def shown(name: str) -> str:
        return name if names else str(files[name])

    if "prompts.json" in files:
        data = _small_json(files["prompts.json"], shown("prompts.json"), MAX_TRACE_BYTES)
        report.items = _check_items(data.get("prompts") if isinstance(data, dict) else None, shown("prompts.json"))
        budgets = (data.get("settings") or {}).get("budgets") if isinstance(data.get("settings"), dict) else None
        if isinstance(budgets, list) and budgets and len(budgets) <= 4096 and all(
                isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= 1 << 20 for b in budgets):
            report.budgets = budgets
    if "summary.json" in files:
        data = _small_json(files["summary.json"], shown("summary.json"), MAX_TRACE_BYTES)
        if not isinstance(data, dict):
            raise TraceError(f"{shown('summary.json')} is not a summary (expected a JSON object)")
        report.summary = data
    for name in sorted(traced):
        m = TRACE_NAME.fullmatch(name[len("traces/"):])
        if not m:
            continue
        i, side, kind = int(m.group(1)), m.group(2) or "", m.group(3)
        for table in (report.traces, report.errors, report.metas):
            table.setdefault(side, {})
        if kind is None:
            try:
                report.traces[side][i] = Trace.load(files[name], name=shown(name))
            except TraceError as exc:  # say which of the report's traces
                raise TraceError(str(exc) if shown(name) in str(exc) else f"{shown(name)}: {exc}") from None
            report.files[name] = Path(files[name])
            continue
        record = _small_json(files[name], shown(name), MAX_SMALL_BYTES)
        if not isinstance(record, dict):
            raise TraceError(f"{shown(name)} is not an {kind} record (expected a JSON object)")
        if kind == "error":
            report.errors[side][i] = {"index": i, "error": check_text(str(record.get("error", "")), shown(name),
                                                                       MAX_TEXT_CHARS)}
        else:
            wall = record.get("wall_s")
            ok = isinstance(wall, (int, float)) and not isinstance(wall, bool) and 0 <= wall < 1e9
            report.metas[side][i] = {"index": i, **({"wall_s": float(wall)} if ok else {}),
                                     **({"process": record["process"]} if isinstance(record.get("process"), int)
                                        and not isinstance(record.get("process"), bool) else {})}
    return report


def _small_json(path: Path, shown: str, limit: int):
    try:
        size = Path(path).stat().st_size
        if size > limit:
            raise TraceError(f"{shown} is {size:,} bytes; at most {limit:,} are read")
        with open(path, "rb") as f:
            text = f.read(limit + 1).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise TraceError(f"cannot read {shown}: {reason}") from None
    try:
        return parse_json(text, shown)
    except TraceError as exc:
        raise TraceError(str(exc).replace(f"the {shown}", shown)) from None


def _check_items(items, shown: str) -> list[dict]:
    """prompts.json's prompt list: only what the report shows is kept (index, source, prompt text), checked."""
    if not isinstance(items, list):
        raise TraceError(f"{shown}: 'prompts' is not a list of prompts")
    kept = []
    for k, item in enumerate(items):
        if not isinstance(item, dict):
            raise TraceError(f"{shown}: prompt {k} is not an object")
        entry = {"index": k}
        for key in ("source", "prompt"):
            if isinstance(item.get(key), str):
                entry[key] = check_text(item[key], f"{shown}: prompt {k}'s {key}")
        if "messages" in item and "prompt" not in entry and isinstance(item["messages"], list):
            entry["prompt"] = check_text(" / ".join(str(m.get("content", "")) for m in item["messages"][:8]
                                                    if isinstance(m, dict))[:MAX_TEXT_CHARS],
                                         f"{shown}: prompt {k}'s messages")
        kept.append(entry)
    return kept


def load_dir(out: str | Path) -> Report:
    """The report as written in DIR (read_report over report_files)."""
    return read_report(report_files(out))


def _text(trace: Trace, token_id: int | None) -> str | None:
    if token_id is None:
        return None
    return trace.token_texts.get(str(token_id), f"<{token_id}>")


def _out_index(trace: Trace, step, depth: int) -> int:
    """Index into output_ids of the token the round chose at `depth` (0 = its root)."""
    return step.committed_len - len(trace.prompt_ids) + depth


def summarize(out: str | Path, budgets: list[int] | None = None) -> dict[str, Any]:
    """summary.json's figures from the traces in DIR (analysis.py's functions over all rounds pooled)."""
    return summarize_report(load_dir(out), budgets)


def summarize_report(report: Report, budgets: list[int] | None = None) -> dict[str, Any]:
    """The summary of a report as read: its run's method at the top level and, with --method both, the DFlash
    chain's figures on the same prompts under "dflash" (the same keys)."""
    summary = _summarize_side(report, budgets, "")
    if DFLASH in report.sides:
        summary[DFLASH] = _summarize_side(report, budgets, DFLASH)
    return summary


def _summarize_side(report: Report, budgets: list[int] | None, side: str) -> dict[str, Any]:
    items, traces, errors = report.items, report.traces.get(side, {}), report.errors.get(side, {})
    order = sorted(traces)
    steps = [s for i in order for s in traces[i].steps]
    first = traces[order[0]] if order else None
    block = first.settings.get("block_size") if first else None
    budget = first.settings.get("budget") if first else None
    method = first.settings.get("method", "ddtree") if first else "ddtree"
    rounds = len(steps)
    hist = analysis.acceptance_histogram(steps, block) if steps else []
    curve = analysis.session_budget_curve(steps) if steps else {}
    wanted = sorted(set(budgets)) if budgets else sorted(curve)
    budget_curve = {str(b): curve[min(b, max(curve))] / rounds for b in wanted} if curve else {}
    identical = sum(1 for i in order if traces[i].greedy_ids is not None and traces[i].first_divergence is None)

    per_prompt, misses, examples, ranks = [], Counter(), {}, Counter()
    by_pos: list[list[int]] = [[] for _ in range(POSITION_BINS)]
    for i in order:
        t = traces[i]
        name = trace_path(Path("."), i, side=side).as_posix()
        acc = [s.acceptance for s in t.steps]
        per_prompt.append({"index": i, "file": name, "source": _source(items, i), "rounds": len(t.steps),
                           "tokens": len(t.output_ids),
                           "mean_acceptance": sum(acc) / len(acc) if acc else None,
                           "first_divergence": t.first_divergence,
                           "identical_to_greedy": None if t.greedy_ids is None else t.first_divergence is None})
        max_new = max(int(t.settings.get("max_new_tokens") or 1), 1)
        for k, s in enumerate(t.steps):
            where = min(POSITION_BINS - 1, max(0, _out_index(t, s, 0)) * POSITION_BINS // max_new)
            by_pos[where].append(s.acceptance)
            stop = analysis.stop_info(s, block)
            rank = stop["target_draft_rank"]
            ranks["block end" if rank is None else str(rank)] += 1
            if stop["reason"] == analysis.STOP_BLOCK_END:
                continue
            key = (stop["drafter_top_id"], stop["target_token_id"])
            misses[key] += 1
            ex = examples.setdefault(key, [])
            if len(ex) < EXAMPLES_PER_MISS:
                at = _out_index(t, s, stop["depth"])
                ex.append({"file": name, "index": i, "round": k, "depth": stop["depth"], "reason": stop["reason"],
                           "before": "".join(_text(t, x) for x in t.output_ids[max(0, at - 12):at]),
                           "after": "".join(_text(t, x) for x in t.output_ids[at + 1:at + 6])})
            misses_texts = examples.setdefault(("texts",) + key, [])
            if not misses_texts:
                misses_texts.append((_text(t, key[0]), _text(t, key[1])))
    top = []
    for (draft_id, target_id), n in sorted(misses.items(), key=lambda kv: (-kv[1], str(kv[0])))[:TOP_MISSES]:
        dt, tt = examples[("texts", draft_id, target_id)][0]
        top.append({"drafter_token_id": draft_id, "drafter_token": dt, "target_token_id": target_id,
                    "target_token": tt, "count": n, "examples": examples[(draft_id, target_id)]})
    width = None
    if first:
        width = max(int(first.settings.get("max_new_tokens") or 1), 1) / POSITION_BINS
    positions = []
    for b, vals in enumerate(by_pos):
        lo = int(b * width) if width else b
        hi = int((b + 1) * width) - 1 if width else b
        positions.append({"from": lo, "to": hi, "rounds": len(vals),
                          "mean_acceptance": sum(vals) / len(vals) if vals else None})
    n = len(order)
    return {
        "summary_version": SUMMARY_VERSION,
        "prompts": n,
        "prompts_total": max(len(items), n + len(errors)),
        "rounds": rounds,
        "generated_tokens": sum(len(traces[i].output_ids) for i in order),
        "mean_acceptance": sum(s.acceptance for s in steps) / rounds if rounds else None,
        "acceptance_histogram": {str(k + 1): v for k, v in enumerate(hist)},
        "per_depth_acceptance": analysis.per_depth_acceptance(steps, block) if steps else [],
        "per_depth_counts": [list(c) for c in analysis.per_depth_counts(steps, block)] if steps else [],
        "budget_curve": budget_curve,
        "budget_curve_caveat": analysis.curve_caveat(method),
        "identical_to_greedy": identical / n if n else None,
        "identical_prompts": identical,
        "stop_rank_histogram": dict(sorted(ranks.items(), key=lambda kv: _rank_key(kv[0]))),
        "acceptance_by_position": positions,
        "per_prompt": per_prompt,
        "failed": [{"index": i, "source": _source(items, i), "error": errors[i].get("error")}
                   for i in sorted(errors) if i not in traces],
        "top_misses": top,
        "settings": dict(first.settings) if first else {},
        "model": {"target": first.target, "draft": first.draft} if first else {},
    }


def _rank_key(k: str):
    return (0, int(k)) if k.isdigit() else (1, k)


def _source(items: list[dict], i: int) -> str | None:
    return items[i].get("source") if 0 <= i < len(items) else None


def write_outputs(out: str | Path, budgets: list[int] | None = None) -> dict[str, Any]:
    """summary.json, report.html and figures/ from the traces in DIR; returns the summary."""
    from .render.report import write_report

    out = Path(out)
    report = load_dir(out)
    summary = summarize_report(report, budgets)
    _write_json(out / "summary.json", summary)
    write_report(out, summary, report.items, report.metas)
    return summary

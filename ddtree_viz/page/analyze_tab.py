"""The Analyze tab: a report written by `analyze`, read back from a directory or uploaded (its figures computed
again from its validated traces), a prompt set run on the page's model into the tab's own report, a round of a
report opened in the Step tab as a replay, and the report's misses as misses.jsonl (write_misses_file)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..options import DFLASH
from ..promptset.decode import decode_set
from ..promptset.files import PROMPTS_DIR, read_prompts, run_settings, write_json
from ..promptset.misses import miss_rows, report_misses, set_name, write_misses
from ..promptset.report import MAX_REPORT_TRACES, TRACE_NAME, read_report, report_files
from ..promptset.summary import summarize_report
from ..engine.prompts import PromptSpec, check_spec
from ..errors import InputError
from ..options import MAX_BUDGET, DecodeSettings, check_int
from ..render import report as report_view
from ..render.text import esc, shorten
from ..trace import MAX_ROUNDS
from ..words import plural
from .actions import load_replay, move
from .host import ModelHost
from .state import MAX_UPLOAD_BYTES, LoadedReport, TabState, check_prompt_chars, prompt_spec

MAX_REPORT_BYTES = 128 * 1024 * 1024  # a report's files together (a directory's or the uploads)
MAX_PATH_CHARS = 4096  # the directory box


@dataclass(frozen=True)
class ReportDirs:
    """Which directories the Analyze tab reads when typed in: none (allowed=False: a page shared beyond this machine,
    where anyone could probe the server's files), those under `root` (relative paths from it), or any."""

    allowed: bool = True
    root: str | None = None

    def label(self) -> str:
        if not self.allowed:
            return "Report directory on the server: off (this page is reachable beyond this machine; start it with " \
                   "--report-root DIR to read reports under DIR)"
        where = f" under {self.root}" if self.root is not None else ""
        return f"Report directory on the server{where} (analyze --out DIR)"


def load_report_dir(tab: TabState, text, dirs: ReportDirs = ReportDirs()) -> TabState:
    """The Analyze tab's 'Load directory': a report directory the server can read, as typed (~ expanded; under
    dirs.root when set, relative paths from it). It must be a directory holding summary.json and traces/; anything
    else is an InputError that names it as typed."""
    if not dirs.allowed:
        raise InputError("this page reads no directories typed in (it is reachable beyond this machine): upload the "
                         "report's files, or start the page with --report-root DIR")
    if not isinstance(text, str) or not text.strip():
        raise InputError("type the path of a report directory (the --out DIR of an analyze run)")
    text = text.strip()
    shown = _named(text)
    if len(text) > MAX_PATH_CHARS or "\0" in text:
        raise InputError(f"not a directory path: {shown}")
    try:
        folder = Path(text).expanduser()
        if dirs.root is not None:
            root = Path(dirs.root).expanduser().resolve()
            folder = (root / folder).resolve()  # an absolute path stays itself; symbolic links followed
            if not folder.is_relative_to(root):
                raise InputError(f"{shown} is not under the page's report root ({_named(dirs.root)})")
        if not folder.is_dir():
            raise InputError(f"{shown} is not a directory the server can read")
        if not (folder / "summary.json").is_file():
            raise InputError(f"{shown} has no summary.json: it is not a report directory (analyze --out DIR writes one)")
        if not (folder / "traces").is_dir():
            raise InputError(f"{shown} has no traces/ folder: it is not a report directory")
        files = report_files(folder)
        if dirs.root is not None:
            _inside_root(files, root, shown)
    except RuntimeError:  # Path.resolve over a symbolic link loop (Python < 3.13)
        raise InputError(f"cannot read {shown}: a symbolic link loop") from None
    except OSError as exc:  # a name too long, a permission denied on the way, a link loop
        raise InputError(f"cannot read {shown}: {exc.strerror or type(exc).__name__}") from None
    loaded = _read_report(files, name=text)
    tab.show_report(loaded)
    return tab


def _inside_root(files: dict[str, Path], root: Path, shown: str) -> None:
    """Each of a report's files under the page's report root: a symbolic link in the report that leads out of it
    is refused (named by its place in the report), not followed."""
    for name, path in files.items():
        if not path.resolve().is_relative_to(root):
            raise InputError(f"{shown}: {name} leads out of the page's report root (a symbolic link): not read")


def load_report_upload(tab: TabState, paths) -> TabState:
    """The Analyze tab's upload: summary.json, prompts.json (optional) and the traces/ files of a report, each at
    most MAX_UPLOAD_BYTES, together at most MAX_REPORT_BYTES. Files are known by their own names (0000.json,
    0000.dflash.json, 0000.error.json, ...); other files (report.html, figures) are left out and said so. They are
    copied to the tab's own folder (gradio deletes its copies of uploads after a while; a round opened later reads
    them there). Messages name the files as uploaded, never the server's paths."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    paths = [p for p in (paths or []) if p]
    if not paths:
        raise InputError("upload a report's summary.json and its traces (traces/*.json)")
    if len(paths) > 3 * MAX_REPORT_TRACES + 2:
        raise InputError(f"{plural(len(paths), 'file')}: a report upload takes at most {3 * MAX_REPORT_TRACES + 2:,}")
    names: dict[str, Path] = {}
    ignored = 0
    total = 0
    for p in paths:
        base = os.path.basename(str(p))
        shown = _named(base, 80)
        if base in ("summary.json", "prompts.json"):
            name = base
        elif TRACE_NAME.fullmatch(base):
            name = f"traces/{base}"
        else:
            ignored += 1
            continue
        if name in names:
            raise InputError(f"two uploaded files are named {shown}: upload one report at a time")
        try:
            size = Path(p).stat().st_size
        except OSError:
            raise InputError(f"cannot read the uploaded file {shown}") from None
        if size > MAX_UPLOAD_BYTES:
            raise InputError(f"{shown} is {plural(size, 'byte')}; an uploaded file may be at most "
                             f"{MAX_UPLOAD_BYTES // 2**20} MB")
        total += size
        if total > MAX_REPORT_BYTES:
            raise InputError(f"the uploaded files hold more than {MAX_REPORT_BYTES // 2**20} MB; a report upload may "
                             "hold at most that much")
        names[name] = Path(p)
    if "summary.json" not in names:
        raise InputError("the upload has no summary.json: upload a report's summary.json with its traces/*.json")
    if not any(n.startswith("traces/") for n in names):
        raise InputError("the upload has no traces (traces/0000.json, ...): upload them with summary.json")
    note = (f"{plural(ignored, 'other uploaded file')} left out (only summary.json, prompts.json and traces/*.json "
            "are read)" if ignored else "")
    folder = tab.report_folder()  # a new folder: the report on screen keeps its own files until this one is shown
    try:
        files = _keep_uploads(names, folder)
        loaded = _read_report(files, name=f"{len(names)} uploaded files", note=note)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    tab.show_report(dataclasses.replace(loaded, folder=folder))
    return tab


def _keep_uploads(names: dict[str, Path], folder: Path) -> dict[str, Path]:
    """The uploaded files copied into `folder` under their names in the report (gradio deletes its own copies)."""
    (folder / "traces").mkdir()
    files = {}
    try:
        for name, src in names.items():
            shutil.copyfile(src, folder / name)
            files[name] = folder / name
    except OSError as exc:
        raise InputError(f"cannot keep the uploaded files: {exc.strerror or type(exc).__name__}") from None
    return files


PAGE_SET_MAX_PROMPTS = 32  # a prompt set run from the page: at most this many prompts (the CLI's analyze: any)
PAGE_SET_MAX_TOKENS = 256  # ... and new tokens a prompt
SET_DONE = "done: "  # run_prompt_set's last line: the set is over and its report is on the tab


def prompt_sets() -> list[str]:
    """The shipped prompt sets (ddtree_viz/prompts/) the Analyze tab can run, by name."""
    return sorted(p.stem for p in PROMPTS_DIR.iterdir() if p.suffix in (".txt", ".jsonl"))


def default_prompt_set() -> str | None:
    """The set the page offers first: the held-out code prompts (never seen in training), else the first."""
    names = prompt_sets()
    return "heldout-code" if "heldout-code" in names else (names[0] if names else None)


def _set_spec(host: ModelHost, item: dict, chat, system, thinking) -> PromptSpec:
    """One prompt of a set as the Step tab's chat controls say: text, or a conversation (needs the template)."""
    if "messages" not in item:
        return prompt_spec(host, item["prompt"], chat, system, thinking)
    if not chat:
        raise InputError("a chat prompt ({'messages': [...]}) needs the chat template: switch 'Chat template' on")
    messages = item["messages"]
    if not all(isinstance(m, dict) for m in messages):
        raise InputError("each message must be an object with 'role' and 'content'")
    spec = prompt_spec(host, "", True, system, thinking)
    return check_spec(dataclasses.replace(spec, messages=tuple((m.get("role"), m.get("content")) for m in messages)))


def _check_set_sizes(host: ModelHost, name: str, items: list[dict]) -> None:
    """Each prompt of the set within the page's prompt size (state.check_prompt_chars), named by its place in the
    user's own file."""
    for k, item in enumerate(items, 1):
        chars = len(item.get("prompt", "")) + sum(len(str(m.get("content", ""))) for m in item.get("messages", ())
                                                  if isinstance(m, dict))
        check_prompt_chars(host, chars, f"prompt {k} of {name}")


def _set_items(source, upload) -> tuple[str, list[dict]]:
    """The set's name as the page shows it and its prompts: an uploaded prompt file (a path; it wins) or a shipped
    set by name."""
    if upload:
        path = Path(upload)
        if not path.is_file() or path.stat().st_size > MAX_UPLOAD_BYTES:
            raise InputError(f"the prompt file must be a file of at most {MAX_UPLOAD_BYTES // (1024 * 1024)} MB")
        return _named(path.name), read_prompts(path, shown=_named(path.name))  # never the server's temp path
    if source not in prompt_sets():
        raise InputError(f"no prompt set named {_named(source or '')}: choose one of {', '.join(prompt_sets())}")
    return source, read_prompts(source)


def run_prompt_set(host: ModelHost, tab: TabState, source, upload, budget, max_new_tokens, limit, chat=False,
                   system="", thinking=True):
    """The Analyze tab's 'Run the set': the first `limit` prompts of a shipped set (`source`, by name) or of an
    uploaded prompt file (`upload`, a path; it wins), each decoded with DDTree (exact, greedy) and checked against
    greedy as `analyze` does, into a new folder of this tab (a report directory: prompts.json, traces/,
    summary.json), then shown in the tab in place of the report before (whose files stay until then). A generator:
    it yields a progress line after each prompt, and last SET_DONE + the report's note. The model is taken round by
    round (other tabs' Steps go in between); the tab's Stop (`tab.set_stop`) ends it after the round going on, and
    the report covers the prompts done. A prompt that fails is recorded with its error and the set goes on. One set
    per tab at a time (a second call while one runs is refused); a tab closed meanwhile ends it quietly."""
    budget = check_int("budget", budget, 1, MAX_BUDGET)
    max_new = check_int("max new tokens", max_new_tokens, 1, PAGE_SET_MAX_TOKENS)
    limit = check_int("prompts", limit, 1, PAGE_SET_MAX_PROMPTS)
    if not tab.set_running.acquire(blocking=False):
        raise InputError("a prompt set is already running in this tab: wait for it to finish, or press Stop")
    try:
        name, items = _set_items(source, upload)
        items = items[:limit]
        pair = host.require()
        _check_set_sizes(host, name, items)  # before the model lock: a huge prompt is refused, not tokenized
        tab.set_stop.clear()
        out = tab.report_folder()
        try:
            spec_of = lambda item: _set_spec(host, item, chat, system, thinking)  # noqa: E731
            yield from _decode_set_here(host, tab, pair, (name, items, spec_of), out, (budget, max_new))
        except BaseException:
            shutil.rmtree(out, ignore_errors=True)
            if tab.closed:
                return  # the tab went: its files with it, nothing to show or say
            raise
    finally:
        tab.set_running.release()


def _decode_set_here(host: ModelHost, tab: TabState, pair, the_set: tuple, out: Path, sizes: tuple[int, int]):
    """run_prompt_set's decoding into `out`, then the report shown (progress lines yielded). the_set: its name, its
    items and how an item becomes a PromptSpec."""
    (name, items, spec_of), (budget, max_new) = the_set, sizes
    (out / "traces").mkdir()
    asked = run_settings(budget, max_new, dtype=host.args[2], device=host.args[3])
    write_json(out / "prompts.json", {"file": name, "prompts": items, "settings": asked})
    settings = DecodeSettings(budget=budget, max_new_tokens=max_new, engine=host.engine)  # DDTree, exact, greedy
    start, tokens, done = time.perf_counter(), 0, 0
    # process 0 (the page is one process): each prompt's wall time is written, as analyze writes it (the report's
    # "wall s" read "-" for a set run here)
    for p in decode_set(pair, items, out, settings, spec_of, stop=tab.set_stop.is_set,
                        lock=host.lock, keep_engines=True, process=0):
        tokens, done = tokens + p.tokens, p.done
        elapsed = time.perf_counter() - start
        eta = elapsed / done * (len(items) - done)
        yield (f"{done} of {plural(len(items), 'prompt')}, {tokens / elapsed:.1f} tokens/s, "
               f"about {int(eta) // 60}:{int(eta) % 60:02d} left")
    if tab.closed:
        raise InputError("the tab was closed")  # run_prompt_set ends quietly
    stopped = tab.set_stop.is_set() and done < len(items)
    if done == 0:
        raise InputError("stopped before the first prompt was done: nothing to show")
    note = f"run on this page: {done} of {plural(len(items), 'prompt')}" + (" (stopped)" if stopped else "")
    loaded = _read_report(report_files(out), f"{name} (run here)", note)  # the summary, from the traces once
    write_json(out / "summary.json", _plain(loaded.summary))  # a report directory like analyze's
    tab.show_report(dataclasses.replace(loaded, folder=out))
    yield SET_DONE + note


def _read_report(files: dict[str, Path], name: str, note: str = "") -> LoadedReport:
    """Read and validate a report's files (analyze.read_report: every trace through Trace.load), compute its figures
    again from the traces (at summary.json's budgets) and build its body with page links."""
    report = read_report(files, names=True, max_bytes=MAX_REPORT_BYTES)
    if not any(report.traces.values()) and not any(report.errors.values()):
        raise InputError("the report has no traces and no error records in traces/: nothing to show (a run that "
                         "has not finished its first prompt?)")
    written = report.summary or {}
    # the budgets the run asked for (prompts.json), else those summary.json's curve was written at
    summary = summarize_report(report, report.budgets if "prompts.json" in files else _budgets(written))
    notes = [note] if note else []
    if "prompts.json" not in files:
        notes.append("no prompts.json: the prompts' text and sources are not shown")
    if written and _comparable(_plain(summary), "prompts.json" in files) != _comparable(written, "prompts.json"
                                                                                         in files, summary):
        notes.append("summary.json differs from what its traces give (a run still going, or an edited file): the "
                     "figures shown are computed from the traces")
    svgs = report_view.figures(summary, "svg")
    the_set = set_name(report)
    rows = tuple(miss_rows(report, the_set))  # what `analyze --misses` writes for this report, and the download
    body = report_view.report_body(summary, svgs, report.items, report.metas, link=report_view.page_round_link,
                                   files=False, misses=report_misses(report, rows))
    return LoadedReport(name=name, summary=summary, html='<div class="ddv-report">' + body + "</div>",
                        files=dict(report.files), note="; ".join(notes), misses=rows, set_name=the_set)


def _comparable(summary: dict, whole: bool, like: dict | None = None) -> dict:
    """A summary as it can be held against summary.json: whole (prompts.json read), all of it; without prompts.json,
    less what only prompts.json gives (each prompt's source and text) and the budget curve at the budgets `like`
    (the one computed) has. Never the speed-up study (`speedup`: measured timings that analyze adds from
    speedup.json, not a figure of the traces), which every default report has."""
    if not isinstance(summary, dict):
        return summary
    out = {k: v for k, v in summary.items() if k != "speedup"}
    if whole:
        return out
    if isinstance(out.get("per_prompt"), list):
        out["per_prompt"] = [{k: v for k, v in p.items() if k not in ("source", "prompt")} if isinstance(p, dict)
                             else p for p in out["per_prompt"]]
    if like is not None and isinstance(out.get("budget_curve"), dict) and isinstance(like.get("budget_curve"), dict):
        out["budget_curve"] = {k: v for k, v in out["budget_curve"].items() if str(k) in map(str, like["budget_curve"])}
    if isinstance(out.get(DFLASH), dict):
        out[DFLASH] = _comparable(out[DFLASH], whole, like.get(DFLASH) if isinstance(like, dict) else None)
    return out


def _budgets(summary: dict) -> list[int] | None:
    """The budgets summary.json's budget curve was written at (its keys), or None (every budget) when unreadable."""
    curve = summary.get("budget_curve")
    if not isinstance(curve, dict) or not curve or len(curve) > MAX_BUDGET:
        return None
    try:
        budgets = [int(k) for k in curve]
    except (TypeError, ValueError):
        return None
    return budgets if all(1 <= b <= MAX_BUDGET for b in budgets) else None


def _plain(summary: dict) -> dict:
    """The summary as summary.json holds it (JSON types: tuples as lists)."""
    import json

    return json.loads(json.dumps(summary))


def _named(text: str, limit: int = 120) -> str:
    """A name from the user or a file (a typed path, an uploaded file's name) for a message or the page: one line,
    at most `limit` characters, HTML-escaped."""
    return esc(shorten("".join(" " if ord(c) < 32 or ord(c) == 127 else c for c in str(text)), limit))


def report_status(tab: TabState | None) -> str:
    """The Analyze tab's line over the report (HTML, escaped)."""
    r = tab.report if tab is not None else None
    if r is None:
        return ("<p>Load a report written by <code>analyze</code> (a directory on the server, or its files uploaded): "
                "its figures and tables as report.html shows them; click a trace's round (top misses, misses by "
                "prompt, prompts) to open it in the <b>Step</b> tab (replay, no model needed); download its misses "
                "as <code>analyze --misses</code> writes them.</p>")
    s = r.summary
    sides = [s] + ([s[DFLASH]] if DFLASH in s else [])
    figures = "; ".join(f"{esc(report_view.side_label(x))}: mean acceptance "
                        f"{'-' if x['mean_acceptance'] is None else format(x['mean_acceptance'], '.2f')} over "
                        f"{plural(x['rounds'], 'round')}" for x in sides)
    line = (f"<p><b>Report:</b> {_named(r.name)} — {s['prompts']} of {plural(s['prompts_total'], 'prompt')}; "
            f"{figures}. Click a trace's round (top misses, misses by prompt, prompts) to open it in the <b>Step</b> "
            "tab.</p>")
    return line + (f"<p><i>Note:</i> {esc(r.note)}</p>" if r.note else "")


def report_html(tab: TabState) -> str:
    return tab.report.html if tab.report is not None else ""


def write_misses_file(tab: TabState) -> Path:
    """The Analyze tab's 'Download misses (.jsonl)': the report's misses as `analyze --misses` writes them (the same
    rows, promptset/misses.py's, through the same writer: docs/MISSES.md), in the tab's own folder (its earlier
    file deleted). Named after the set: misses-<set>.jsonl (misses.jsonl without prompts.json). A report without a
    miss gives an empty file."""
    report = tab.report
    if report is None:
        raise InputError("no report loaded: load a report directory, upload one or run a prompt set first")
    name = report.set_name[:64]  # safe characters only (files.set_dirname); a file name's length
    path = tab.new_folder("misses") / (f"misses-{name}.jsonl" if name else "misses.jsonl")
    try:
        write_misses(path, iter(report.misses))
    except OSError as exc:
        raise InputError(f"cannot write the misses file: {exc.strerror or type(exc).__name__}") from None
    return path


def open_report_round(tab: TabState, file, k) -> TabState:
    """A round of the Analyze tab's report in the step view: the trace replayed (actions.load_replay, no model) at round
    k (0-based). `file`: a trace's name in the report ("traces/0000.json"); nothing else is opened."""
    report = tab.report
    if report is None:
        raise InputError("no report loaded: load a report directory or upload one in the Analyze tab first")
    path = report.files.get(file) if isinstance(file, str) else None
    if path is None:
        raise InputError(f"{_named(str(file), 80)} is not a trace of the loaded report")
    k = check_int("round", k, 0, MAX_ROUNDS - 1)
    load_replay(tab, str(path), name=file)
    return move(tab, to=k)


def open_report_click(tab: TabState, value) -> TabState:
    """A click on a round link of the report ('traces/0000.json|3|nonce', from the page's script)."""
    parts = str(value or "").rsplit("|", 2)
    if len(parts) != 3:
        raise InputError("not a round of the report")
    try:
        k = int(parts[1])
    except ValueError:
        raise InputError("not a round of the report") from None
    return open_report_round(tab, parts[0], k)

"""A report directory read back: its files by name (report_files), every trace validated (Trace.load) and the
other records checked for their types (read_report). The page's Analyze tab shows a report from it, from a
directory or from the same files uploaded."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TraceError
from ..words import plural
from ..files import read_limited
from ..options import DFLASH, PRECISION_B
from ..trace import MAX_TEXT_CHARS, MAX_TRACE_BYTES, Trace, check_text, parse_json


TRACE_NAME = re.compile(r"(\d{1,6})(?:\.(" + DFLASH + "|" + PRECISION_B + r"))?(?:\.(error|meta))?\.json")
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
    set_file: str | None = None  # the prompt set as the run named it (prompts.json's "file": --prompts SET)

    @property
    def sides(self) -> list[str]:
        """"" and, when the report has any of its files, DFLASH (--method both) and PRECISION_B (a precision audit)."""
        return [""] + [s for s in (DFLASH, PRECISION_B) if self.traces.get(s) or self.errors.get(s)]


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
            raise TraceError(f"the report's files hold {plural(total, 'byte')}; at most {max_bytes // 2**20} MiB are read")
    report = Report()

    def shown(name: str) -> str:
        return name if names else str(files[name])

    if "prompts.json" in files:
        data = _small_json(files["prompts.json"], shown("prompts.json"), MAX_TRACE_BYTES)
        report.items = _check_items(data.get("prompts") if isinstance(data, dict) else None, shown("prompts.json"))
        report.set_file = _set_file(data.get("file"))
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


def _set_file(value) -> str | None:
    """prompts.json's "file" (the set as the run named it), or None where it is not a short valid string: it only
    names the set in misses.jsonl, so a bad one leaves the set unnamed rather than refusing the report."""
    if not isinstance(value, str) or len(value) > 4096:
        return None
    try:
        return check_text(value, "prompts.json")
    except TraceError:
        return None


def _small_json(path: Path, shown: str, limit: int):
    text = read_limited(path, limit, "file", shown=shown, error=TraceError,
                        too_large=lambda size: f"{shown} is {plural(size, 'byte')}; at most {limit:,} are read")
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

"""Where the drafter misses, as data (issue #68 item 2): one JSON line per round whose walk stopped short of the
block, from a report's traces (analysis.stop_info: the same figures the round inspector shows). The schema is
docs/MISSES.md's; its version is MISSES_VERSION. Every line is strict JSON (a non-finite number is null)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .. import analysis
from ..trace import Trace
from .files import set_dirname
from .report import Report

MISSES_VERSION = 1


def set_name(report: Report) -> str:
    """The set's name in the rows of a report read back: its prompt set as analyze names the set's folder
    (files.set_dirname of prompts.json's "file", what `analyze --misses` writes for it); "" without prompts.json."""
    return set_dirname(report.set_file) if report.set_file else ""


def miss_rows(report: Report, set_name: str = "") -> Iterator[dict[str, Any]]:
    """The report's misses, prompt by prompt, round by round ('block end' rounds missed nothing: left out)."""
    for side in report.sides:
        traces = report.traces.get(side, {})
        for index in sorted(traces):
            yield from trace_misses(traces[index], index, side, set_name)


def trace_name(index: int, side: str = "") -> str:
    """A trace's name in the report ("traces/0003.json", "traces/0003.dflash.json"): the rows' `trace`."""
    return f"traces/{index:04d}{'.' + side if side else ''}.json"


def trace_misses(trace: Trace, index: int, side: str = "", set_name: str = "") -> Iterator[dict[str, Any]]:
    block = trace.settings.get("block_size")
    name = trace_name(index, side)
    for k, step in enumerate(trace.steps):
        info = analysis.stop_info(step, block)
        if info["reason"] == analysis.STOP_BLOCK_END:
            continue
        # the target's token follows the root (output position committed_len - prompt) and the accepted drafts
        position = step.committed_len - len(trace.prompt_ids) + len(step.accepted)
        rank = info["target_draft_rank"]
        yield {
            "version": MISSES_VERSION, "set": set_name, "index": index, "side": side or trace.settings.get("method"),
            "trace": name, "round": k + 1, "context_len": len(trace.prompt_ids) + position,
            "output_position": position, "depth": info["depth"], "reason": info["reason"],
            "target_token_id": info["target_token_id"], "target_prob": _finite(info["target_prob"]),
            "drafter_top": [[int(t), _finite(lp)] for t, lp in analysis.draft_row(step, info["depth"])],
            "target_draft_rank": rank if isinstance(rank, int) else None,
            "target_drafted": isinstance(rank, int),
            "target_draft_logprob": _finite(info["target_draft_logprob"]),
            "tree_rank": info["sibling_rank"], "kept": step.kept, "cut": step.cut,
        }


def report_misses(report: Report, rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows (miss_rows' for this report) by trace, as the report lists them (render/report.py's
    miss_rounds_html): every trace of the report, misses or not, with its prompt's index, its method, its rounds,
    and for each miss the row's round, depth, reason, target's probability and draft rank, with the target's token
    and the drafter's first choice there as text (the trace's own token texts)."""
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_trace.setdefault(row["trace"], []).append(row)
    out = []
    for side in report.sides:
        for index, trace in sorted(report.traces.get(side, {}).items()):
            name = trace_name(index, side)
            out.append({"trace": name, "index": index, "side": side or trace.settings.get("method"),
                        "rounds": len(trace.steps),
                        "misses": [_listed(trace, row) for row in by_trace.get(name, ())]})
    return out


def _listed(trace: Trace, row: dict[str, Any]) -> dict[str, Any]:
    """One row as the report lists it: its figures and the two tokens' text."""
    top = row["drafter_top"]
    return {"round": row["round"], "depth": row["depth"], "reason": row["reason"],
            "target_token": _text(trace, row["target_token_id"]), "target_prob": row["target_prob"],
            "drafter_token": _text(trace, top[0][0]) if top else None,
            "target_draft_rank": row["target_draft_rank"]}


def _text(trace: Trace, token_id: int) -> str:
    return trace.token_texts.get(str(token_id), f"<{token_id}>")


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def write_misses(path: str | Path, rows: Iterator[dict[str, Any]]) -> int:
    """The rows as JSON lines (strict: allow_nan off), written whole or not at all. Returns how many."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n

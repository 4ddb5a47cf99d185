"""Where the drafter misses, as data (issue #68 item 2): one JSON line per round whose walk stopped short of the
block, from a report's traces (analysis.stop_info: the same figures the round inspector shows). The schema is
docs/MISSES.md's; its version is MISSES_VERSION. Every line is strict JSON (a non-finite number is null)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import analysis
from ..trace import Trace
from .report import Report

MISSES_VERSION = 1


def miss_rows(report: Report, set_name: str = "") -> Iterator[dict[str, Any]]:
    """The report's misses, prompt by prompt, round by round ('block end' rounds missed nothing: left out)."""
    for side in report.sides:
        traces = report.traces.get(side, {})
        for index in sorted(traces):
            yield from trace_misses(traces[index], index, side, set_name)


def trace_misses(trace: Trace, index: int, side: str = "", set_name: str = "") -> Iterator[dict[str, Any]]:
    block = trace.settings.get("block_size")
    name = f"traces/{index:04d}{'.' + side if side else ''}.json"
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

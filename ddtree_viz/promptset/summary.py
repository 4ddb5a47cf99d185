"""summary.json's figures, computed only from a report's traces (analysis.py's functions over all rounds pooled),
and the report written from them (summary.json, report.html, figures/). The contract is docs/ARCHITECTURE.md's."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from .. import analysis
from ..options import DFLASH, PRECISION_B
from ..trace import Trace
from .files import trace_path, write_json
from .report import Report, load_dir

SUMMARY_VERSION = 1
TOP_MISSES = 20
EXAMPLES_PER_MISS = 5
POSITION_BINS = 4  # acceptance by position in the generation: the generation cut in this many equal parts


def summarize(out: str | Path, budgets: list[int] | None = None) -> dict[str, Any]:
    """summary.json's figures from the traces in DIR (analysis.py's functions over all rounds pooled)."""
    return summarize_report(load_dir(out), budgets)


def summarize_report(report: Report, budgets: list[int] | None = None) -> dict[str, Any]:
    """The summary of a report as read: its run's method at the top level and, with --method both, the DFlash
    chain's figures on the same prompts under "dflash" (the same keys)."""
    summary = _summarize_side(report, budgets, "")
    if DFLASH in report.sides:
        summary[DFLASH] = _summarize_side(report, budgets, DFLASH)
    if PRECISION_B in report.sides:
        summary[PRECISION_B] = _summarize_side(report, budgets, PRECISION_B)
        summary["precision_audit"] = precision_audit(report, summary, summary[PRECISION_B])
    return summary


def precision_audit(report: Report, a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The same prompts with two precisions (configuration A: the run's; B: --target-b / --draft-b / --dtype-b): each
    side's precision, mean acceptance, acceptance by depth, budget curve and decode tokens/s side by side, and per
    prompt where the two targets' greedy decodings part (the output index, each side's token and its target's
    margin there: analysis.greedy_part)."""
    ta, tb = report.traces.get("", {}), report.traces.get(PRECISION_B, {})
    both = sorted(ta.keys() & tb.keys())
    parts = []
    for i in both:
        part = analysis.greedy_part(ta[i], tb[i])
        for who, t in (("a", ta[i]), ("b", tb[i])):
            tok = part[f"{who}_token_id"]
            part[f"{who}_token"] = None if tok is None else _text(t, tok)
        parts.append({"index": i, "file_a": _name(i, ""), "file_b": _name(i, PRECISION_B), **part})
    parted = [p for p in parts if p["part_at"] is not None]

    def side(summary: dict[str, Any], traces: dict[int, Trace]) -> dict[str, Any]:
        settings = summary.get("settings") or {}
        return {"target": (summary.get("model") or {}).get("target"), "draft": (summary.get("model") or {}).get("draft"),
                "target_precision": settings.get("target_precision", settings.get("dtype")),
                "draft_precision": settings.get("draft_precision", settings.get("dtype")),
                "mean_acceptance": summary["mean_acceptance"], "per_depth_acceptance": summary["per_depth_acceptance"],
                "budget_curve": summary["budget_curve"], "decode_tok_s": analysis.decode_tok_s(traces.values()),
                "warning": analysis.acceptance_warning(summary["mean_acceptance"], summary["rounds"])}

    return {"a": side(a, ta), "b": side(b, tb), "prompts_compared": len(parts), "prompts_parted": len(parted),
            "first_part": min((p["part_at"] for p in parted), default=None), "per_prompt": parts}


def write_outputs(out: str | Path, budgets: list[int] | None = None, supplements: bool = False) -> dict[str, Any]:
    """summary.json, report.html and figures/ from the traces in DIR; returns the summary. `supplements`: also each
    prompt's session as one HTML file (write_supplements), linked from the report. The report lists every miss
    (misses.py: the rows `analyze --misses` writes), each linked to its round."""
    from ..render.report import write_report
    from .misses import miss_rows, report_misses

    out = Path(out)
    report = load_dir(out)
    sessions = write_supplements(out, report) if supplements else None
    summary = summarize_report(report, budgets)
    study = out / "speedup.json"  # the speed-up study (promptset/speedup.py), when analyze ran it first
    if study.is_file():
        try:
            summary["speedup"] = json.loads(study.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            pass  # the study's own file, written just before: unreadable only if something else broke it
    write_json(out / "summary.json", summary)
    write_report(out, summary, report.items, report.metas, supplements=sessions,
                 misses=report_misses(report, miss_rows(report)))
    return summary


def supplement_path(index: int) -> str:
    """A prompt's session file in the report ("supplements/0000.html")."""
    return f"supplements/{index:04d}.html"


def write_supplements(out: Path, report: Report) -> dict[str, str | None]:
    """DIR/supplements/NNNN.html: each traced prompt's session (the run's method) as one self-contained HTML file
    (render/supplement.py). Returns trace name ("traces/0000.json") -> its file's name, or None for a session past the
    file's bound (not written; `export --session --rounds` thins it)."""
    from ..errors import InputError
    from ..render.supplement import write_supplement

    (out / "supplements").mkdir(exist_ok=True)
    made: dict[str, str | None] = {}
    for i, trace in sorted(report.traces.get("", {}).items()):
        name = supplement_path(i)
        try:
            write_supplement(trace, out / name)
        except InputError:  # past the bound: the report says so where the link would be
            (out / name).unlink(missing_ok=True)
            name = None
        made[_name(i, "")] = name
    return made


def _summarize_side(report: Report, budgets: list[int] | None, side: str) -> dict[str, Any]:
    """One side's figures (side "": the run's method; DFLASH: the chain of --method both), keys in the contract's
    order."""
    items, traces, errors = report.items, report.traces.get(side, {}), report.errors.get(side, {})
    order = sorted(traces)
    steps = [s for i in order for s in traces[i].steps]
    first = traces[order[0]] if order else None
    block = first.settings.get("block_size") if first else None
    method = first.settings.get("method", "ddtree") if first else "ddtree"
    rounds, n = len(steps), len(order)
    hist = analysis.acceptance_histogram(steps, block) if steps else []
    identical = sum(1 for i in order if traces[i].identical)  # (an invalid trace, NaN logits: not identical)
    ranks, top = _stops(traces, order, side, block)
    return {
        "summary_version": SUMMARY_VERSION,
        "prompts": n,
        "prompts_total": max(len(items), n + len(errors)),
        "rounds": rounds,
        "generated_tokens": sum(len(traces[i].output_ids) for i in order),
        "mean_acceptance": sum(s.kept for s in steps) / rounds if rounds else None,  # tokens kept (StepRecord.kept)
        "acceptance_histogram": {str(k + 1): v for k, v in enumerate(hist)},
        "per_depth_acceptance": analysis.per_depth_acceptance(steps, block) if steps else [],
        "per_depth_counts": [list(c) for c in analysis.per_depth_counts(steps, block)] if steps else [],
        "budget_curve": _budget_curve(steps, budgets),
        "budget_curve_caveat": analysis.curve_caveat(method),
        "identical_to_greedy": identical / n if n else None,
        "identical_prompts": identical,
        "stop_rank_histogram": dict(sorted(ranks.items(), key=lambda kv: _rank_key(kv[0]))),
        "acceptance_by_position": _by_position(traces, order),
        "per_prompt": [_prompt_row(items, i, traces[i], side) for i in order],
        "failed": [{"index": i, "source": _source(items, i), "error": errors[i].get("error")}
                   for i in sorted(errors) if i not in traces],
        "top_misses": top,
        "settings": dict(first.settings) if first else {},
        "model": {"target": first.target, "draft": first.draft} if first else {},
    }


def _budget_curve(steps, budgets: list[int] | None) -> dict[str, float]:
    """Mean tokens gained per round at each budget (the asked ones, or every budget of the curve)."""
    curve = analysis.session_budget_curve(steps) if steps else {}
    wanted = sorted(set(budgets)) if budgets else sorted(curve)
    return {str(b): curve[min(b, max(curve))] / len(steps) for b in wanted} if curve else {}


def _name(i: int, side: str) -> str:
    """A trace's name in the report ("traces/0000.json")."""
    return trace_path(Path("."), i, side=side).as_posix()


def _prompt_row(items: list[dict], i: int, t: Trace, side: str) -> dict[str, Any]:
    acc = [s.kept for s in t.steps]
    return {"index": i, "file": _name(i, side), "source": _source(items, i), "rounds": len(t.steps),
            "tokens": len(t.output_ids), "mean_acceptance": sum(acc) / len(acc) if acc else None,
            "first_divergence": t.first_divergence,
            "identical_to_greedy": t.identical}


def _by_position(traces: dict[int, Trace], order: list[int]) -> list[dict[str, Any]]:
    """Acceptance by where the round started in the generation: POSITION_BINS equal parts of max_new_tokens (the
    first trace's width names the bins)."""
    by_pos: list[list[int]] = [[] for _ in range(POSITION_BINS)]
    for i in order:
        t = traces[i]
        max_new = max(int(t.settings.get("max_new_tokens") or 1), 1)
        for s in t.steps:
            by_pos[min(POSITION_BINS - 1, max(0, _out_index(t, s, 0)) * POSITION_BINS // max_new)].append(s.kept)
    width = max(int(traces[order[0]].settings.get("max_new_tokens") or 1), 1) / POSITION_BINS if order else None
    positions = []
    for b, vals in enumerate(by_pos):
        lo = int(b * width) if width else b
        hi = int((b + 1) * width) - 1 if width else b
        positions.append({"from": lo, "to": hi, "rounds": len(vals),
                          "mean_acceptance": sum(vals) / len(vals) if vals else None})
    return positions


def _stops(traces: dict[int, Trace], order: list[int], side: str, block) -> tuple[Counter, list[dict]]:
    """Where the walks stopped: the target's token's rank among the drafter's candidates (every round), and the
    TOP_MISSES most frequent (drafter's top, target's token) pairs with up to EXAMPLES_PER_MISS examples each
    (rounds that accepted every drafted depth left out)."""
    ranks, misses, examples, texts = Counter(), Counter(), {}, {}
    for i in order:
        t = traces[i]
        for k, s in enumerate(t.steps):
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
                ex.append({"file": _name(i, side), "index": i, "round": k, "depth": stop["depth"],
                           "reason": stop["reason"],
                           "before": "".join(_text(t, x) for x in t.output_ids[max(0, at - 12):at]),
                           "after": "".join(_text(t, x) for x in t.output_ids[at + 1:at + 6])})
            texts.setdefault(key, (_text(t, key[0]), _text(t, key[1])))
    top = []
    for (draft_id, target_id), n in sorted(misses.items(), key=lambda kv: (-kv[1], str(kv[0])))[:TOP_MISSES]:
        dt, tt = texts[(draft_id, target_id)]
        top.append({"drafter_token_id": draft_id, "drafter_token": dt, "target_token_id": target_id,
                    "target_token": tt, "count": n, "examples": examples[(draft_id, target_id)]})
    return ranks, top


def _text(trace: Trace, token_id: int | None) -> str | None:
    if token_id is None:
        return None
    return trace.token_texts.get(str(token_id), f"<{token_id}>")


def _out_index(trace: Trace, step, depth: int) -> int:
    """Index into output_ids of the token the round chose at `depth` (0 = its root)."""
    return step.committed_len - len(trace.prompt_ids) + depth


def _rank_key(k: str):
    return (0, int(k)) if k.isdigit() else (1, k)


def _source(items: list[dict], i: int) -> str | None:
    return items[i].get("source") if 0 <= i < len(items) else None

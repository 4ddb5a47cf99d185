"""Acceptance per round and session statistics."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from .. import analysis
from ..options import CHAINS, REFERENCE_NAMES
from ..speedup import degenerate
from ..trace import StepRecord, Trace, reference_of, sampling_label, verdict_text
from .budget_view import budget_line, rates_line
from .figure import FigureSpec, title_axis_px
from .scheme import PAGE_SCHEME, Scheme
from ..words import plural
from .text import esc, plotly_text

TIMING_PHASES = ("draft", "tree", "verify", "commit")  # the parts of a round that records time (timings_ms)
ACCEPTANCE_TITLE = "Tokens kept per round (accepted drafts + bonus, as output)"


def acceptance_figure(steps: Sequence[StepRecord], **options) -> go.Figure:
    """acceptance_spec(steps, **options) as a checked plotly go.Figure."""
    return acceptance_spec(steps, **options).figure()


def acceptance_spec(steps: Sequence[StepRecord], *, title: str | None = None, scheme: Scheme = PAGE_SCHEME,
                    legend: bool = True) -> FigureSpec:
    """Bars: tokens kept per round (StepRecord.kept: accepted drafts + the bonus, cut where the session stopped); a
    dashed mean line. A cut round's hover says how many the walk accepted and how many were kept. Plain data
    (figure.FigureSpec)."""
    x = [s.index + 1 for s in steps]  # rounds are shown 1-based
    y = [s.kept for s in steps]
    hover = [f"round {s.index + 1}: {_kept_words(s)}<br>"
             f"tree {plural(len(s.nodes), 'position')}, deepest accepted depth {s.nodes[s.accepted[-1]].depth}"
             for s in steps]
    data = [dict(type="bar", x=x, y=y, marker=dict(color=scheme.bar), hovertext=hover, hoverinfo="text",
                 name="tokens per round")]
    if steps:
        mean = sum(y) / len(y)
        data.append(dict(type="scatter", x=[x[0] - 0.5, x[-1] + 0.5], y=[mean, mean], mode="lines",
                         name=f"mean {mean:.2f}", line=dict(color=scheme.mean, dash="dash", width=2),
                         hoverinfo="name"))
    xaxis = dict(title=dict(text="round"))
    if len(steps) <= 40:
        xaxis["dtick"] = 1
    yaxis = dict(title=dict(text="tokens"), rangemode="tozero")
    if max(y, default=0) <= 8:  # whole tokens; past 8 a label a token crowds the 320 px axis (the default ticks)
        yaxis["dtick"] = 1
    return FigureSpec(data, dict(
        title=dict(text=plotly_text(title) if title is not None else ACCEPTANCE_TITLE, font=dict(size=14)),
        xaxis=xaxis, yaxis=yaxis,
        # margins that hold the tick labels and axis titles (figure.title_axis_px: drawn once)
        height=320, margin=dict(l=title_axis_px([max(y, default=0)]), r=20, t=50, b=70),
        plot_bgcolor="white",
        legend=dict(orientation="h", yanchor="bottom", y=1.0, x=1, xanchor="right"), bargap=0.2,
        **({} if legend else {"showlegend": False}),
    ))


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _kept_words(s: StepRecord) -> str:
    walk = f"{plural(s.acceptance - 1, 'accepted draft')} + bonus = {plural(s.acceptance, 'token')}"
    return f"the walk accepted {walk}; {s.kept} kept (the session stopped there)" if s.cut else walk


def stats_summary(trace: Trace, greedy_tok_s: float | None = None, ddtree_tok_s: float | None = None) -> dict:
    """Session statistics (all decode-round numbers; prefill is not timed in the records).

    rounds; generated_tokens (prefill token included); mean_acceptance (mean StepRecord.kept: drafts + bonus as
    committed, a round cut at max new tokens / end of text counting what it kept); tokens_per_target_forward (tokens the rounds actually
    added / rounds); mean_accepted_drafts; max_acceptance; mean_tree_size; mean_ms per phase (draft, tree,
    verify, commit) and mean_round_ms; round_tok_s (tokens the rounds added / their summed time: excludes
    prefill and greedy); greedy_tok_s / ddtree_tok_s / speedup when measured and passed in; method, verify,
    budget, sampling ('greedy' or e.g. 'sampling (T 0.7, seed 5)'), identical_to_greedy / first_divergence
    (compared with the target's own decoding: greedy, or sampled with the same seed)."""
    steps = trace.steps
    added = acc = [s.kept for s in steps]
    mean_ms = {p: _mean([float(s.timings_ms[p]) for s in steps if p in s.timings_ms]) for p in TIMING_PHASES}
    round_ms = [sum(float(v) for v in s.timings_ms.values()) for s in steps]
    total_s = sum(round_ms) / 1e3
    out = {
        "rounds": len(steps),
        "generated_tokens": len(trace.output_ids),
        "mean_acceptance": _mean(acc),
        "mean_accepted_drafts": _mean([a - 1 for a in acc]),
        "max_acceptance": max(acc, default=None),
        "tokens_per_target_forward": sum(added) / len(steps) if steps else None,
        "mean_tree_size": _mean([len(s.nodes) for s in steps]),
        "mean_ms": mean_ms,
        "mean_round_ms": _mean(round_ms),
        "round_tok_s": sum(added) / total_s if total_s > 0 else None,
        "greedy_tok_s": greedy_tok_s,
        "ddtree_tok_s": ddtree_tok_s,
        "speedup": ddtree_tok_s / greedy_tok_s if greedy_tok_s and ddtree_tok_s else None,
        "method": trace.settings.get("method", steps[0].method if steps else None),
        "verify": trace.settings.get("verify", steps[0].verify if steps else None),
        "budget": trace.settings.get("budget"),
        "sampling": sampling_label(trace.settings),
        "identical_to_greedy": trace.identical,
        # the reference's tokens so far where it has not reached the end of the output (a live page's check under
        # way or stopped): an identical output is then known only that far
        "checked": len(trace.greedy_ids or ()) if trace.reference_pending else None,
        "invalid": trace.invalid,  # why the comparison proves nothing (NaN logits), or None
        "first_divergence": trace.first_divergence,
        "degenerate": degenerate(trace.output_ids),  # why the output looks like a loop (speedup.py), or None
        # acceptance by depth and the budget that would have done (ddtree_viz.analysis.session_analysis)
        **analysis.session_analysis(steps, trace.settings.get("block_size")),
        "reference": reference_of(trace.settings) if trace.greedy_ids is not None else None,
        "reference_ms": trace.reference_ms or None,
        "verdict": verdict_text(trace),
    }
    return out


def _num(v, nd: int = 2) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return esc(str(v)).replace("|", "&#124;")


def stats_markdown(summary: dict, extra: Sequence[tuple[str, str]] = ()) -> str:
    """A Markdown table of a stats_summary (values escaped), then the `extra` (label, Markdown) rows. Each time
    says what it measures: engine time (the model work of the rounds, as the records time it) or wall time."""
    ms = summary.get("mean_ms") or {}
    naive = summary.get("verify") == "naive"
    rows = [
        ("method / verify", f"{_num(summary.get('method'))} / {_num(summary.get('verify'))}"
         + (" (known-wrong flattened tree)" if naive else "")),
        ("budget", _num(summary.get("budget"))),
        ("target's choice", _num(summary.get("sampling", "greedy"))),
        ("rounds (target forwards after prefill)", _num(summary.get("rounds"))),
        ("generated tokens", _num(summary.get("generated_tokens"))),
        ("mean acceptance (tokens kept per round: drafts + bonus)", _num(summary.get("mean_acceptance"))),
        ("tokens per target forward", _num(summary.get("tokens_per_target_forward"))),
        ("max acceptance", _num(summary.get("max_acceptance"))),
        ("mean tree size", _num(summary.get("mean_tree_size"), 1)),
        ("engine time per round, mean (draft + tree + verify + commit)", f"{_num(summary.get('mean_round_ms'))} ms"),
        ("engine time per phase: draft / tree / verify / commit",
         " / ".join(_num(ms.get(p)) for p in TIMING_PHASES) + " ms"),
        ("decode tokens/s (engine time of the rounds only)", _num(summary.get("round_tok_s"), 1)),
    ]
    where = summary.get("reference")
    if where is not None:
        rows.append(("reference decoded on (its time is not in the rounds')",
                     _num(REFERENCE_NAMES.get(where, where)) + (f", {_num(summary['reference_ms'], 0)} ms"
                                                                if summary.get("reference_ms") else "")))
    if summary.get("greedy_tok_s") is not None or summary.get("ddtree_tok_s") is not None:
        method = {"dflash": "DFlash", "dflash2": "DFlash2"}.get(summary.get("method"), "DDTree")
        sampled = summary.get("sampling", "greedy") != "greedy"
        ref, over = (("the target's own sampling", "the target's own sampling") if sampled else ("greedy", "greedy"))
        rows += [(f"{ref} tokens/s (the reference's model time, prefill included)", _num(summary.get("greedy_tok_s"), 1)),
                 (f"{method} tokens/s (engine time, prefill included)", _num(summary.get("ddtree_tok_s"), 1)),
                 (f"speedup over {over} (both model time only, none of the page's own work)",
                  _num(summary.get("speedup")) + ("×" if summary.get("speedup") else ""))]
    if summary.get("degenerate"):  # beside the throughput: a loop drafts easily and decodes fast
        rows.append(("⚠ output looks degenerate (its tokens/s is no speed-up)", _num(summary["degenerate"])))
    if summary.get("acceptance_histogram"):
        unit = "chain length" if summary.get("method") in CHAINS else "budget"
        rows += [("rounds by accepted drafts kept (0, 1, 2, ...; a cut round at what it kept)", " ".join(map(str, summary["acceptance_histogram"]))),
                 ("P(accepted ≥ d, given accepted ≥ d−1 and depth ≥ d)", rates_line(summary["per_depth_acceptance"])),
                 (f"tokens by {unit} (same rounds; "
                  + ("as recorded: naive rounds are not exact)" if naive else "exact per round)"),
                  budget_line({int(b): v for b, v in summary["budget_curve"].items()}))]
    same = summary.get("identical_to_greedy")
    ref = "greedy" if summary.get("sampling", "greedy") == "greedy" else "the target's own sampling (same seed)"
    verdict = f": {_num(summary['verdict'])}" if summary.get("verdict") else ""
    no = (f"no: INVALID, {_num(summary['invalid'])}" if summary.get("invalid") else
          f"no (diverges at token {_num(summary.get('first_divergence'))}{verdict})")
    yes = "yes"
    if same and summary.get("checked") is not None:  # never a 'yes' the reference has not reached
        yes = (f"unknown: identical for the first {_num(summary['checked'])} of {_num(summary.get('generated_tokens'))} "
               "tokens, the rest not checked")
    rows.append((f"identical to {ref}", "–" if same is None else (yes if same else no)))
    rows += list(extra)
    warning = analysis.acceptance_warning(summary.get("mean_acceptance"), summary.get("rounds") or 0)
    loud = f"**⚠ Warning:** {esc(warning)}\n\n" if warning and (summary.get("rounds") or 0) >= WARN_ROUNDS else ""
    return loud + "| statistic | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows) + "\n"


WARN_ROUNDS = 8  # a session's mean acceptance of about 1.0 is warned of from this many rounds (fewer: too few to say)

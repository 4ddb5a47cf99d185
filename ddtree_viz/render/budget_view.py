"""The budget that would have done, and acceptance by depth: small plotly charts of ddtree_viz.analysis's figures.

- `budget_figure(steps, k)`: round k's budget curve (tokens gained under every budget up to its own, exact) beside
  the session's (summed over rounds 1..k), with the caveat that later rounds would have started elsewhere.
- `depth_figure(steps, block_size)`: the acceptance-length histogram and the per-depth conditional acceptance
  P(accepted >= d | accepted >= d-1, tree depth >= d).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence

import plotly.graph_objects as go

from .. import analysis
from ..options import CHAINS
from ..trace import StepRecord
from .figure import FigureSpec, title_axis_px
from .scheme import PAGE_SCHEME, Scheme
from .text import plotly_text as esc
from ..words import plural


CAVEAT_CHARS = 80  # characters per line of the budget curve's caveat


def _two_panels(left: str, right: str) -> dict:
    """The layout of make_subplots(rows=1, cols=2, subplot_titles=(left, right), horizontal_spacing=0.12), written
    out (make_subplots costs more than a DDTree round of the embedded pair; tests/test_render.py holds them equal)."""
    def title(text: str, x: float) -> dict:
        return dict(font=dict(size=16), showarrow=False, text=text, x=x, xanchor="center", xref="paper", y=1.0,
                    yanchor="bottom", yref="paper")

    return dict(xaxis=dict(anchor="y", domain=[0.0, 0.44]), yaxis=dict(anchor="x", domain=[0.0, 1.0]),
                xaxis2=dict(anchor="y2", domain=[0.56, 1.0]), yaxis2=dict(anchor="x2", domain=[0.0, 1.0]),
                annotations=[title(left, 0.22), title(right, 0.78)])


def budget_figure(steps: Sequence[StepRecord], k: int | None = None, **options) -> go.Figure:
    """budget_spec(steps, k, **options) as a checked plotly go.Figure."""
    return budget_spec(steps, k, **options).figure()


def budget_spec(steps: Sequence[StepRecord], k: int | None = None, *, scheme: Scheme = PAGE_SCHEME,
                title: str | None = None) -> FigureSpec:
    """Left: round k's curve (budget -> tokens gained); right: the session's, summed over rounds 1..k. (What that
    buys in speed on this machine is the speed-up panel's: render/speedup_view.py.) Plain data (figure.FigureSpec)."""
    steps = list(steps)
    k = len(steps) - 1 if k is None else k
    step = steps[k]
    unit = "chain length" if step.method in CHAINS else "budget"
    curve = analysis.recorded_curve(step)
    total = analysis.session_budget_curve(steps[: k + 1])
    layout = _two_panels(f"round {k + 1}", f"rounds 1..{k + 1} summed")
    data = []
    for col, c, name in ((1, curve, f"round {k + 1}"), (2, total, "session")):
        xs = sorted(c)
        trace = dict(type="scatter", x=xs, y=[c[b] for b in xs], mode="lines+markers" if len(xs) <= 64 else "lines",
                     line=dict(color=scheme.path if col == 1 else scheme.bar, width=2, shape="hv"),
                     marker=dict(size=4), name=name,
                     hovertemplate=f"{unit} %{{x}}: %{{y}} tokens<extra>{esc(name)}</extra>")
        if col == 2:
            trace.update(xaxis="x2", yaxis="y2")
        data.append(trace)
        suffix = "" if col == 1 else "2"
        layout["xaxis" + suffix].update(title=dict(text=unit), **_budget_axis(xs))
        layout["yaxis" + suffix].update(title=dict(text="tokens gained"), rangemode="tozero")
    exact = "" if analysis.curve_is_exact(step) else " Naive verify: the same choices, not a naive round's."
    # plotly does not wrap text: the caveat in lines that fit a half-width panel, under the axis titles
    lines = textwrap.wrap(analysis.curve_caveat(step.method) + exact, CAVEAT_CHARS)
    layout.update(
        title=dict(text=esc(title) if title is not None else f"The {unit} that would have done", font=dict(size=14)),
        height=250 + 13 * len(lines), plot_bgcolor="white",
        # the left margin holds the tick labels ("2.5", "120") and the axis title (figure.title_axis_px: drawn once)
        margin=dict(l=title_axis_px(["2.5", max(total.values(), default=0)]),
                    r=20, t=60, b=50 + 13 * len(lines)),
        showlegend=False,
        annotations=layout["annotations"] + [dict(
            text="<br>".join(esc(line) for line in lines), xref="paper", yref="paper", x=0, y=0, yshift=-42,
            yanchor="top", align="left", showarrow=False, xanchor="left", font=dict(size=10, color=scheme.text_muted))],
    )
    return FigureSpec(data, layout)


def _budget_axis(xs: list[int]) -> dict:
    """The budget axis of a curve at budgets `xs`: linear up to 64, else logarithmic, starting a little left of the
    first budget so that its tick label ("1") clears the tokens axis's "0" at the corner (a line with no markers
    leaves plotly.js no pad: the two sat on each other, issue #65)."""
    if max(xs, default=1) <= 64:
        return dict(type="linear")
    lo, hi = math.log10(min(xs)), math.log10(max(xs))
    return dict(type="log", range=[lo - 0.06 * (hi - lo), hi + 0.02 * (hi - lo)])


def depth_figure(steps: Sequence[StepRecord], block_size: int | None = None, **options) -> go.Figure:
    """depth_spec(steps, block_size, **options) as a checked plotly go.Figure."""
    return depth_spec(steps, block_size, **options).figure()


def depth_spec(steps: Sequence[StepRecord], block_size: int | None = None, *, scheme: Scheme = PAGE_SCHEME,
               title: str | None = None) -> FigureSpec:
    """Left: rounds by accepted drafts kept (a cut round at what it kept); right: per-depth conditional acceptance (bars, with n/m in the hover).
    Plain data (figure.FigureSpec)."""
    hist = analysis.acceptance_histogram(steps, block_size)
    counts = analysis.per_depth_counts(steps, block_size)
    # the right panel's full definition is in its hover text and docs/INSPECTOR.md: P(accepted ≥ d | accepted ≥ d−1,
    # tree depth ≥ d); the title stays short enough not to run into the left one at half the page's width
    layout = _two_panels("rounds by accepted drafts kept", "P(≥ d accepted | ≥ d−1)")
    depths = list(range(1, len(counts) + 1))
    data = [
        # the hovers' words made here (plural), not by plotly's templates ("1 rounds")
        dict(type="bar", x=list(range(len(hist))), y=hist, marker=dict(color=scheme.bar), name="rounds",
             hovertext=[f"{plural(x, 'accepted draft')} kept: {plural(n, 'round')}" for x, n in enumerate(hist)],
             hoverinfo="text"),
        dict(type="bar", x=depths, y=[p / r if r else None for p, r in counts], marker=dict(color=scheme.path),
             hovertext=[f"depth {d}: {p} of {plural(r, 'round')} (accepted ≥ d−1, tree depth ≥ d)"
                        + (f" = {p / r:.2f}" if r else "") for d, (p, r) in zip(depths, counts)],
             hoverinfo="text", name="conditional acceptance", xaxis="x2", yaxis="y2"),
    ]
    layout["xaxis"].update(title=dict(text="accepted drafts"), **({"dtick": 1} if len(hist) <= 20 else {}))
    layout["xaxis2"].update(title=dict(text="depth d"), **({"dtick": 1} if len(counts) <= 20 else {}))
    layout["yaxis"].update(title=dict(text="rounds"), rangemode="tozero")
    layout["yaxis2"].update(title=dict(text="probability"), range=[0, 1.05])
    layout.update(title=dict(text=esc(title) if title is not None else "Acceptance by depth", font=dict(size=14)),
                  # margins that hold the tick labels ("0.5") and axis titles (figure.title_axis_px: drawn once)
                  height=300, margin=dict(l=title_axis_px(["0.25", max(hist, default=0)]), r=20, t=60,
                                          b=70), plot_bgcolor="white", showlegend=False)
    return FigureSpec(data, layout)


def budget_line(curve: dict[int, int]) -> str:
    """A compact text form of a budget curve: the budgets where it steps up, e.g. '1:40 2:52 4:61 ... 32:70'."""
    if not curve:
        return "-"
    keys = sorted(curve)
    marks = [b for i, b in enumerate(keys) if i == 0 or curve[b] != curve[keys[i - 1]]]
    if keys[-1] not in marks:
        marks.append(keys[-1])
    return " ".join(f"{b}:{curve[b]}" for b in marks)


def rates_line(rates: list[float | None]) -> str:
    return " ".join(f"d{d}:{'-' if r is None else f'{r:.2f}'}" for d, r in enumerate(rates, start=1))

"""The verify pass's attention mask as a heatmap: which keys each tree position sees."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ..trace import StepRecord
from . import style
from .text import plotly_text, shorten, visible

MAX_TICKS = 64  # beyond this many tree positions, label every k-th one
# A mask figure (the page's, and every export's) shows at most this many tree positions: the first ones, which
# form a whole subtree because positions are numbered parents first (invariant 6). The mask grows as the square
# of the tree; this is the page's largest budget (512) + the root, so every round the page makes shows whole, and
# a larger one (a trace from `run --budget 4096`) says how many positions it leaves out.
MAX_POSITIONS = 513


def shown_positions(step: StepRecord, limit: int | None = MAX_POSITIONS) -> int:
    """How many tree positions a mask figure of this round shows."""
    return len(step.nodes) if limit is None else min(len(step.nodes), limit)


def cut_note(step: StepRecord, shown: int) -> str:
    """'' or ' (first 256 of 4097 tree positions)' for a figure that shows only part of the mask."""
    return "" if shown >= len(step.nodes) else f" (first {shown} of {len(step.nodes)} tree positions)"


def ancestor_mask(step: StepRecord, limit: int | None = None) -> np.ndarray:
    """[T, T] 0/1: row i sees column j when j is i or one of its ancestors (the tree part of the mask); only the
    first `limit` positions when given (a whole subtree: parents come first)."""
    n = shown_positions(step, limit)
    vis = np.zeros((n, n), dtype=np.int8)
    for node in step.nodes[:n]:
        if node.parent >= 0:
            vis[node.id, : node.id] = vis[node.parent, : node.id]
        vis[node.id, node.id] = 1
    return vis


def verify_mask(step: StepRecord, limit: int | None = None) -> np.ndarray:
    """[T, 1 + T] 0/1: column 0 is the committed prefix as one band (always visible), then tree positions (the first
    `limit` of them when given)."""
    vis = ancestor_mask(step, limit)
    return np.concatenate([np.ones((vis.shape[0], 1), dtype=np.int8), vis], axis=1)


def _tick_labels(step: StepRecord, accepted: set[int], mark: bool, label_chars: int, n: int) -> list[str]:
    out = []
    for node in step.nodes[:n]:
        tick = "✓ " if mark and node.id in accepted else ""
        out.append(f"{tick}{node.id}:{plotly_text(shorten(visible(node.token), label_chars))}")
    return out


def mask_figure(step: StepRecord, *, show_accepted: bool = True, label_chars: int = 8,
                title: str | None = None, height: int | None = None, max_positions: int | None = MAX_POSITIONS) -> go.Figure:
    """Heatmap of the verify mask: rows = tree positions (queries), columns = ["prefix (N tokens)"] + tree
    positions (keys); 1 = visible (dark), 0 = masked. Axis labels 'position:token' (visible whitespace,
    escaped; the position makes every label unique, so they serve as categories). Accepted rows are outlined
    in vermillion and their labels start with '✓' (show_accepted=False for the drafted phase). At most
    `max_positions` tree positions are drawn (the first ones); the default title says when some are left out."""
    n = shown_positions(step, max_positions)
    z = verify_mask(step, n)
    accepted = {a for a in step.accepted if a < n} if show_accepted else set()
    rows = _tick_labels(step, accepted, show_accepted, label_chars, n)
    cols = [f"prefix ({step.committed_len} tokens)"] + _tick_labels(step, set(), False, label_chars, n)
    heat = dict(
        type="heatmap", z=z, x=cols, y=rows, zmin=0, zmax=1, showscale=False, xgap=1 if n <= 64 else 0,
        ygap=1 if n <= 64 else 0, colorscale=[[0.0, style.MASK_HIDDEN], [1.0, style.MASK_VISIBLE]],
        hovertemplate="query %{y}<br>key %{x}<br>visible: %{z}<extra></extra>",
    )
    fig = go.Figure(data=[heat])
    fig.update_layout(
        title=dict(text=plotly_text(title) if title is not None else
                   f"Verify mask, round {step.index + 1}: each tree position sees the prefix + its ancestors"
                   + cut_note(step, n), font=dict(size=14)),
        xaxis=dict(type="category", tickangle=-60, side="top", title="keys", showgrid=False, nticks=MAX_TICKS),
        yaxis=dict(type="category", autorange="reversed", title="queries (tree positions)", showgrid=False,
                   nticks=MAX_TICKS),
        height=height or int(min(max(360, 140 + 16 * n), 1600)), margin=dict(l=20, r=20, t=120, b=20),
        plot_bgcolor="white",
    )
    # all outlines in one update: add_shape per row re-validates every shape so far, which made this quadratic in
    # the path's length (a 500-deep path took 38 s)
    fig.update_layout(shapes=[dict(type="rect", x0=-0.5, x1=n + 0.5, y0=r - 0.5, y1=r + 0.5,
                                   line=dict(color=style.PATH_COLOR, width=2)) for r in sorted(accepted)])
    return fig

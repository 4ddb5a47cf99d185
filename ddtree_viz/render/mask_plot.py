"""The verify pass's attention mask as a heatmap: which keys each tree position sees."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ..trace import StepRecord
from . import style
from .figure import FigureSpec
from .text import esc, shorten, visible

MAX_TICKS = 64  # beyond this many tree positions, label every k-th one


def ancestor_mask(step: StepRecord) -> np.ndarray:
    """[T, T] 0/1: row i sees column j when j is i or one of its ancestors (the tree part of the mask)."""
    n = len(step.nodes)
    vis = np.zeros((n, n), dtype=np.int8)
    for node in step.nodes:
        if node.parent >= 0:
            vis[node.id, : node.id] = vis[node.parent, : node.id]
        vis[node.id, node.id] = 1
    return vis


def verify_mask(step: StepRecord) -> np.ndarray:
    """[T, 1 + T] 0/1: column 0 is the committed prefix as one band (always visible), then tree positions."""
    vis = ancestor_mask(step)
    return np.concatenate([np.ones((vis.shape[0], 1), dtype=np.int8), vis], axis=1)


def _tick_labels(step: StepRecord, accepted: set[int], mark: bool, label_chars: int) -> list[str]:
    out = []
    for node in step.nodes:
        tick = "✓ " if mark and node.id in accepted else ""
        out.append(f"{tick}{node.id}:{esc(shorten(visible(node.token), label_chars))}")
    return out


def mask_figure(step: StepRecord, **options) -> go.Figure:
    """mask_spec(step, **options) as a checked plotly go.Figure."""
    return mask_spec(step, **options).figure()


def mask_spec(step: StepRecord, *, show_accepted: bool = True, label_chars: int = 8,
              title: str | None = None, height: int | None = None) -> FigureSpec:
    """Heatmap (as plain data: figure.FigureSpec) of the verify mask: rows = tree positions (queries), columns = ["prefix (N tokens)"] + tree
    positions (keys); 1 = visible (dark), 0 = masked. Axis labels 'position:token' (visible whitespace,
    escaped; the position makes every label unique, so they serve as categories). Accepted rows are outlined
    in vermillion and their labels start with '✓' (show_accepted=False for the drafted phase)."""
    z = verify_mask(step)
    n = len(step.nodes)
    accepted = set(step.accepted) if show_accepted else set()
    rows = _tick_labels(step, accepted, show_accepted, label_chars)
    cols = [f"prefix ({step.committed_len} tokens)"] + _tick_labels(step, set(), False, label_chars)
    heat = dict(
        type="heatmap", z=z, x=cols, y=rows, zmin=0, zmax=1, showscale=False, xgap=1 if n <= 64 else 0,
        ygap=1 if n <= 64 else 0, colorscale=[[0.0, style.MASK_HIDDEN], [1.0, style.MASK_VISIBLE]],
        hovertemplate="query %{y}<br>key %{x}<br>visible: %{z}<extra></extra>",
    )
    shapes = [dict(type="rect", x0=-0.5, x1=n + 0.5, y0=r - 0.5, y1=r + 0.5, line=dict(color=style.PATH_COLOR, width=2))
              for r in sorted(accepted)]
    return FigureSpec([heat], dict(
        title=dict(text=esc(title) if title is not None else
                   f"Verify mask, round {step.index + 1}: each tree position sees the prefix + its ancestors",
                   font=dict(size=14)),
        xaxis=dict(type="category", tickangle=-60, side="top", title=dict(text="keys"), showgrid=False,
                   nticks=MAX_TICKS),
        yaxis=dict(type="category", autorange="reversed", title=dict(text="queries (tree positions)"), showgrid=False,
                   nticks=MAX_TICKS),
        height=height or int(min(max(360, 140 + 16 * n), 1600)), margin=dict(l=20, r=20, t=120, b=20),
        plot_bgcolor="white", **({"shapes": shapes} if shapes else {}),
    ))

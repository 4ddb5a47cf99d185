"""The verify pass's attention mask as a heatmap: which keys each tree position sees."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ..trace import StepRecord
from ..treeops import ancestor_matrix
from . import style
from .figure import FigureSpec, label_px, title_axis_px
from ..words import plural
from .scheme import PAGE_SCHEME, Scheme
from .text import plotly_text as esc, shorten, visible

MAX_TICKS = style.MASK_MAX_TICKS
# The page's mask labels fewer keys and queries than it has (every n-th, plotly.js's choice; the hover names each):
# a column label rotated on a ~440 px wide plot needs ~18 px, a row label ~15 px of the figure's height (a row is
# 16 px up to the figure's 1600 px cap: every row labelled until then). Each label drawn is measured by plotly.js in
# the browser (a layout of the page), so labels no one can read cost time too: at budget 128, 64 keys overlapped.
KEY_TICKS = 24
ROW_TICK_PX = 15
# A mask figure (the page's, and every export's) shows at most this many tree positions: the first ones, which
# form a whole subtree because positions are numbered parents first (invariant 6). The mask grows as the square
# of the tree; this is the page's largest budget (512) + the root, so every round the page makes shows whole, and
# a larger one (a trace from `run --budget 4096`) says how many positions it leaves out.
MAX_POSITIONS = 513


def shown_positions(step: StepRecord, limit: int | None = MAX_POSITIONS) -> int:
    """How many tree positions a mask of this round shows (all of them: limit=None)."""
    return len(step.nodes) if limit is None else min(len(step.nodes), limit)


def cut_note(step: StepRecord, shown: int) -> str:
    """'' or ' (first 513 of 4097 tree positions)' for a figure that shows only part of the mask."""
    return "" if shown >= len(step.nodes) else f" (first {shown} of {len(step.nodes)} tree positions)"


def ancestor_mask(step: StepRecord, limit: int | None = MAX_POSITIONS) -> np.ndarray:
    """[T, T] 0/1: row i sees column j when j is i or one of its ancestors (the tree part of the mask), over the
    first `limit` positions (a whole subtree: parents come first; limit=None: all)."""
    n = shown_positions(step, limit)
    return ancestor_matrix([node.parent for node in step.nodes[:n]]).astype(np.int8)


def verify_mask(step: StepRecord, limit: int | None = MAX_POSITIONS) -> np.ndarray:
    """[T, 1 + T] 0/1: column 0 is the committed prefix as one band (always visible), then tree positions (the first
    `limit`; limit=None: all)."""
    vis = ancestor_mask(step, limit)
    return np.concatenate([np.ones((vis.shape[0], 1), dtype=np.int8), vis], axis=1)


def tick_labels(step: StepRecord, *, show: str = "text", label_chars: int = style.MASK_LABEL_CHARS,
                verified: bool = True, limit: int | None = MAX_POSITIONS) -> tuple[list[str], list[str], list[int]]:
    """Row labels, column labels (the prefix band first) and the accepted rows of the mask, for the positions
    verify_mask shows. A label is 'position:token' (token text with visible whitespace, its id, or both: `show`);
    rows of the accepted path start with '✓ ' once verified. Unescaped: each backend escapes for its own format."""
    n = shown_positions(step, limit)
    accepted = [a for a in step.accepted if a < n] if verified else []

    def lab(node) -> str:
        text = shorten(visible(node.token), label_chars)
        body = {"text": text, "ids": str(node.token_id), "both": f"{text} {node.token_id}"}[show]
        return f"{node.id}:{body}"

    rows = [("✓ " if node.id in accepted else "") + lab(node) for node in step.nodes[:n]]
    cols = [f"prefix ({plural(step.committed_len, 'token')})"] + [lab(node) for node in step.nodes[:n]]
    return rows, cols, accepted


def default_title(step: StepRecord) -> str:
    return (f"Verify mask, round {step.index + 1}: each tree position sees the prefix + its ancestors"
            + cut_note(step, shown_positions(step)))


def page_title(step: StepRecord) -> str:
    """The page's title, short (clear of the toolbar at the top right); what the columns are goes under the mask
    (KEYS_NOTE)."""
    return f"Verify mask, round {step.index + 1}{cut_note(step, shown_positions(step))}"


KEYS_NOTE = "columns: keys (the prefix, then tree positions)"  # fits under a half-width mask (590 px)


def mask_figure(step: StepRecord, **options) -> go.Figure:
    """mask_spec(step, **options) as a checked plotly go.Figure."""
    return mask_spec(step, **options).figure()


def mask_spec(step: StepRecord, *, scheme: Scheme = PAGE_SCHEME, show_accepted: bool = True,
              label_chars: int = style.MASK_LABEL_CHARS, title: str | None = None, height: int | None = None,
              legend: bool = True) -> FigureSpec:
    """Heatmap (as plain data: figure.FigureSpec) of the verify mask: rows = tree positions (queries), columns = ["prefix (N tokens)"] + tree
    positions (keys); 1 = visible (dark), 0 = masked. Axis labels 'position:token' (visible whitespace,
    escaped; the position makes every label unique, so they serve as categories). Accepted rows are outlined
    in the path colour (one update, so linear in the path) and their labels start with '✓' (show_accepted=False for
    the drafted phase). At most MAX_POSITIONS positions (the default title says when some are left out).
    legend=False turns the (empty) legend off, as every exported figure does."""
    z = verify_mask(step)
    n = z.shape[0]
    rows, cols, accepted = tick_labels(step, label_chars=label_chars, verified=show_accepted)
    heat = dict(
        type="heatmap", z=z, x=[esc(c) for c in cols], y=[esc(r) for r in rows], zmin=0, zmax=1, showscale=False,
        xgap=1 if n <= 64 else 0, ygap=1 if n <= 64 else 0, colorscale=[[0.0, scheme.mask_off], [1.0, scheme.mask_on]],
        hovertemplate="query %{y}<br>key %{x}<br>visible: %{z}<extra></extra>",
    )
    shapes = [dict(type="rect", x0=-0.5, x1=n + 0.5, y0=r - 0.5, y1=r + 0.5, line=dict(color=scheme.path, width=2))
              for r in sorted(accepted)]
    # the title at the very top, left and short (the toolbar is at the right), the margin grown to hold it above the
    # rotated key labels, the keys named under the mask (the title sat on the labels, and the keys' own axis title
    # under the toolbar: issue #26); the left margin holds the query labels and their title, the right one the
    # last key label's slant (figure.label_px: drawn once)
    height = height or int(min(max(360, 190 + 16 * n), 1600))
    return FigureSpec([heat], dict(
        title=dict(text=esc(title) if title is not None else page_title(step), font=dict(size=14), yref="container",
                   y=1.0, yanchor="top", x=0.0, xanchor="left", pad=dict(t=8, l=8), automargin=True),
        xaxis=dict(type="category", tickangle=-60, side="top", showgrid=False, nticks=min(MAX_TICKS, KEY_TICKS),
                   automargin=True),
        yaxis=dict(type="category", autorange="reversed", title=dict(text="queries (tree positions)"), showgrid=False,
                   nticks=min(MAX_TICKS, max(8, (height - 190) // ROW_TICK_PX))),
        height=height, margin=dict(l=title_axis_px(rows, 10), r=20 + label_px(cols[-1:]) // 2, t=150, b=40),
        annotations=[dict(text=KEYS_NOTE, xref="paper", yref="paper", x=0, y=0, xanchor="left", yanchor="top",
                          yshift=-6, showarrow=False, font=dict(size=11, color="#555555"))],
        plot_bgcolor="white", **({"shapes": shapes} if shapes else {}), **({} if legend else {"showlegend": False}),
    ))

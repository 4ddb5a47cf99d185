"""The drafter's grid: depth x rank log-probs the best-first tree was built from (one DFlash pass), with the cells
the tree took, the accepted path and where the target's token sat at the depth the walk stopped.

`grid_data` is the one description every backend draws (the page's plotly heatmap here, matplotlib and TikZ in
mpl.py / tikz.py, the JSON export): x = depth 1..block-1, y = rank 0..k-1 (rank 0 on top), z = the drafter's
log-prob, a cell's label its token (visible whitespace, shortened). DDTree's heap spends its budget on the
highest path scores (sums of these log-probs), so the taken cells show where it went and why.
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from .. import analysis
from ..trace import StepRecord
from .figure import COLORBAR_PX, FigureSpec, bottom_legend, title_axis_px
from .figure import colorscale as figure_colorscale
from .scheme import PAGE_SCHEME, Scheme
from .text import TokenText, plotly_text as esc, lookup, shorten, token_texts_from_steps, visible

GRID_LABEL_CHARS = 6


@dataclass(frozen=True)
class GridCell:
    depth: int  # 1-based
    rank: int  # 0-based
    token_id: int
    token: str  # raw text (untrusted)
    label: str  # visible, shortened
    logprob: float
    taken: tuple[int, ...]  # tree positions holding this candidate (under different parents)
    on_path: bool  # the accepted path's node at this depth holds it


@dataclass(frozen=True)
class GridData:
    step_index: int
    depths: int  # rows of the drafter's distribution recorded (block - 1)
    k: int  # candidates per depth
    cells: tuple[GridCell, ...]  # depth-major
    path: tuple[tuple[int, int], ...]  # (depth, rank) of the accepted drafts, root excluded
    stop_depth: int  # len(accepted): where the target's token was not a child
    stop_rank: int | None  # its rank in the grid there (None: not in the grid, or past the block)
    stop_token: str  # the target's token there (raw text)
    stop_reason: str  # analysis.stop_info's reason
    logprob_range: tuple[float, float]

    def cell(self, depth: int, rank: int) -> GridCell:
        return self.cells[(depth - 1) * self.k + rank]


def grid_data(step: StepRecord, token_text: TokenText | None = None, label_chars: int = GRID_LABEL_CHARS) -> GridData:
    """The round's grid; ValueError when the round has none recorded (traces from before the grid existed, or
    sessions run without recording)."""
    if not step.draft_top_ids:
        raise ValueError(f"round {step.index + 1} has no drafter grid recorded (an older trace, or recording off)")
    text = lookup(token_text, token_texts_from_steps([step]))
    k = len(step.draft_top_ids[0])
    taken: dict[tuple[int, int], list[int]] = {}
    for n in step.nodes[1:]:
        taken.setdefault((n.depth, n.rank), []).append(n.id)
    path = tuple((step.nodes[a].depth, step.nodes[a].rank) for a in step.accepted[1:])
    cells = []
    for d, (ids, lps) in enumerate(zip(step.draft_top_ids, step.draft_top_logprobs), start=1):
        for r, (tid, lp) in enumerate(zip(ids, lps)):
            raw = text(tid)
            cells.append(GridCell(d, r, tid, raw, shorten(visible(raw), label_chars), float(lp),
                                  tuple(taken.get((d, r), ())), (d, r) in path))
    stop = analysis.stop_info(step)
    rank = stop["target_draft_rank"]
    in_grid = isinstance(rank, int) and rank < k and stop["depth"] <= len(step.draft_top_ids)
    lps = [c.logprob for c in cells]
    return GridData(step.index, len(step.draft_top_ids), k, tuple(cells), path, stop["depth"],
                    rank if in_grid else None, text(step.bonus_token_id), stop["reason"],
                    (min(lps), max(lps)) if lps else (-1.0, 0.0))


def default_title(g: GridData) -> str:
    return (f"Drafter's grid, round {g.step_index + 1}: log-prob by depth and rank (top {g.k}); "
            f"taken cells outlined, accepted path in vermillion")


def stop_note(g: GridData) -> str:
    """One line on where the walk stopped, as the grid shows it."""
    where = f"depth {g.stop_depth}"
    who = f"target's token {visible(g.stop_token)!s}"
    if g.stop_depth > g.depths:
        return f"walk accepted every drafted depth; the {who} is the bonus after the block"
    why = STOP_WORDS.get(g.stop_reason, g.stop_reason)
    if g.stop_rank is not None:
        return f"walk stopped at {where}: the {who} is the drafter's rank {g.stop_rank}; {why}"
    return f"walk stopped at {where}: the {who} is outside the drafter's top {g.k} there; {why}"


# why the walk stopped, as a clause (analysis.stop_info's reasons; "tree ended" is the one name for a leaf)
STOP_WORDS = {analysis.STOP_TREE_ENDED: "tree ended (the last accepted node has no child: the budget ran out there)",
              analysis.STOP_NOT_TAKEN: "drafted, not taken (the tree did not take it under the last accepted node)",
              analysis.STOP_NOT_DRAFTED: "not drafted (not among the drafter's candidates at that depth)"}


def grid_figure(g: GridData, **options) -> go.Figure:
    """grid_spec(g, **options) as a checked plotly go.Figure."""
    return grid_spec(g, **options).figure()


def grid_spec(g: GridData, *, scheme: Scheme = PAGE_SCHEME, title: str | None = None, cmin: float | None = None,
              cmax: float | None = None, height: int | None = None, legend: bool = True) -> FigureSpec:
    """Heatmap (as plain data: figure.FigureSpec) of the grid (x = depth, y = rank, rank 0 on top), token labels in
    the cells (escaped), an outline on every cell the tree took (its count in the corner when several parents took
    it), the accepted path's cells outlined and joined across the column gaps, the target's token at the stop depth
    outlined dotted when the drafter had it in the grid. Outlines, not markers: a ring, the path's line and an X
    drawn over the cells hid their tokens, the accepted row's most of all (issue #65)."""
    lo, hi = g.logprob_range
    z = [[g.cell(d, r).logprob for d in range(1, g.depths + 1)] for r in range(g.k)]
    labels = [[esc(_cell_text(g.cell(d, r))) for d in range(1, g.depths + 1)] for r in range(g.k)]
    hover = [[_hover(g.cell(d, r)) for d in range(1, g.depths + 1)] for r in range(g.k)]
    xs = list(range(1, g.depths + 1))
    data: list[dict] = [dict(
        type="heatmap", z=z, x=xs, y=list(range(g.k)), text=labels, texttemplate="%{text}", textfont=dict(size=9),
        hovertext=hover, hoverinfo="text", colorscale=figure_colorscale(scheme.colorscale), zmin=lo if cmin is None else cmin,
        zmax=hi if cmax is None else cmax, xgap=1, ygap=1, showscale=legend,
        # the colour bar's title beside it, turned: above it, it sat on the top tick's label
        colorbar=dict(title=dict(text="drafter log-prob", side="right"), thickness=12), name="grid",
    )]
    taken = [c for c in g.cells if c.taken]
    shares = [c for c in taken if len(c.taken) > 1]
    if shares:  # the count against the cell's right edge, clear of its token (centred, cut shorter: _cell_text)
        data.append(dict(
            type="scatter", x=[c.depth + 0.43 for c in shares], y=[c.rank for c in shares], mode="text",
            text=[f"×{len(c.taken)}" for c in shares], textposition="middle left",
            textfont=dict(size=8, color=scheme.rejected), hoverinfo="skip", showlegend=False, name="taken ×n"))
    if len(g.path) > 1:  # the path's cells joined across the column gaps, off their tokens
        joins_x: list[float | None] = []
        joins_y: list[float | None] = []
        for (d, r), (d2, r2) in zip(g.path, g.path[1:]):
            joins_x += [d + 0.49, d2 - 0.49, None]
            joins_y += [r, r2, None]
        data.append(dict(type="scatter", x=joins_x, y=joins_y, mode="lines", line=dict(color=scheme.path, width=3),
                         hoverinfo="skip", showlegend=False, name="accepted path"))
    shapes = _outlines(taken, 0.45, dict(color=scheme.rejected, width=1.5), "taken by the tree (×n: under n parents)")
    shapes += _outlines([g.cell(d, r) for d, r in g.path], 0.5, dict(color=scheme.path, width=3), "accepted path")
    if g.stop_rank is not None:
        shapes += _outlines([g.cell(g.stop_depth, g.stop_rank)], 0.5, dict(color=scheme.path, width=3, dash="dot"),
                            "target's token where the walk stopped (dotted)")
    return FigureSpec(data, dict(
        title=dict(text=esc(title) if title is not None else default_title(g), font=dict(size=13)),
        xaxis=dict(title=dict(text="depth"), dtick=1, range=[0.4, g.depths + 0.6], zeroline=False, showgrid=False),
        yaxis=dict(title=dict(text="drafter rank"), range=[g.k - 0.5, -0.5], **({"dtick": 1} if g.k <= 20 else {}),
                   zeroline=False, showgrid=False),
        # margins that hold the rank labels and their title, the colour bar, the depth title and the legend under
        # it (figure.COLORBAR_PX: drawn once)
        height=height or int(min(max(300, 120 + 26 * g.k), 900)),
        margin=dict(l=title_axis_px([g.k - 1], 10), r=COLORBAR_PX if legend else 20, t=50,
                    b=105 if legend else 60),
        plot_bgcolor="white", hovermode="closest", showlegend=legend, shapes=shapes,
        legend=bottom_legend(),  # under the depth title, in the margin (figure.bottom_legend)
        annotations=[dict(text=esc(stop_note(g)), xref="paper", yref="paper", x=0, y=1.0, yanchor="bottom",
                          showarrow=False, font=dict(size=10, color=scheme.text_muted))],
    ))


def _cell_text(c: GridCell) -> str:
    """A cell's token, two characters shorter where its count (×n) shares the cell."""
    return shorten(c.label, GRID_LABEL_CHARS - 2) if len(c.taken) > 1 else c.label


def _outlines(cells, half: float, line: dict, name: str) -> list[dict]:
    """An outline `half` a cell out from each cell's centre, the first in the legend as `name`."""
    return [dict(type="rect", xref="x", yref="y", x0=c.depth - half, x1=c.depth + half, y0=c.rank - half * 0.96,
                 y1=c.rank + half * 0.96, line=line, layer="above", name=name, legendgroup=name, showlegend=k == 0)
            for k, c in enumerate(cells)]


def _hover(c: GridCell) -> str:
    taken = f"taken by the tree at {'position' if len(c.taken) == 1 else 'positions'} {', '.join(map(str, c.taken))}" \
        if c.taken else "not taken"
    path = " · on the accepted path" if c.on_path else ""
    return (f"<b>{esc(visible(c.token))}</b> (id {c.token_id})<br>depth {c.depth} · rank {c.rank} · log-prob "
            f"{c.logprob:.3f}<br>{taken}{path}")

"""The draft tree as a plotly figure, drawn from the shared TreeLayout."""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from . import style
from .figure import COLORBAR_PX, FigureSpec, bottom_legend, text_px
from .figure import colorscale as figure_colorscale
from .label_fit import fitting
from .layout import (
    DRAW_ORDER, EDGE_KINDS, EDGE_NAME, PHASES, LayoutNode, TreeLayout, edges_of, for_phase, legend_name, path_label_at,
    path_outlined,
)
from .scheme import PAGE_SCHEME, Scheme, edge_color, fixed_fill, outline_color
from ..words import plural
from .text import TokenText, lookup, plotly_text as esc, visible

EDGE_LINE = {"edge": (style.EDGE_WIDTH, "solid"), "path": (style.PATH_EDGE_WIDTH, "solid"), "bonus": (2, "dash")}
# the accepted path's edges toggle with the accepted nodes and have no legend entry of their own: "accepted path"
# was in the legend twice (issue #26)
EDGE_GROUP = {"edge": "", "path": "accepted", "bonus": "bonus edge"}
ROW_PX = 38  # a row of the tree: a node (16 px) and the label above it (~17 px with its rank) and a gap
TOP_PX = 100  # the top margin: the title (gradio's Plot makes it at least 100 px under a title)
BOTTOM_PX = 110  # the bottom margin: depth ticks, the axis title, then the legend (two lines when narrow)
LEGEND_ROW_PX = 29  # a line of the legend, when a narrow figure's legend wraps to more than two (_legend_rows)
LABEL_ROOM = 0.75  # columns right of the deepest node: its label, centred on it, stays off the colour bar
MAX_HEIGHT = 3600
LABEL_FONT = 11  # px: a node's label (its rank a subscript)
LABEL_PX_TALL = 14.5  # px: a label's height as drawn (with its rank)
THINNED = "depth · labels thinned ({shown} of {total} shown): hover for all"  # the depth axis when some are left out


def _fmt(v: float | None, nd: int = 3) -> str:
    return "–" if v is None else f"{v:.{nd}f}"


def node_hover(n: LayoutNode, phase: str, argmax_text=None) -> str:
    """Hover text for one node: everything escaped (token text is untrusted)."""
    lines = [f"<b>{esc(visible(n.token))}</b>  (id {n.token_id})"]
    if n.synthetic:
        sampled = f" (its sample, p {_fmt(n.choice_prob)})" if n.choice_prob is not None else ""
        lines.append(f"bonus: the target's own token after the accepted path{sampled}, depth {n.depth}")
    else:
        rank = "root" if n.rank < 0 else f"r{n.rank}"
        lines.append(f"position {n.id} · depth {n.depth} · rank {rank}")
        if n.logprob is not None:
            lines.append(f"drafter log-prob {_fmt(n.logprob)} · path {_fmt(n.score)}")
    def target_line(what: str, token_id: int, stored_text, note: str) -> str:
        text = argmax_text(token_id) if argmax_text is not None else stored_text
        shown = f" {esc(visible(text))}" if text is not None else ""
        return f"target {what}: id {token_id}{shown}{note}"

    if phase == "verified" and n.argmax is not None:
        margin = f" (margin {_fmt(n.target_margin, 2)})" if n.target_margin is not None else ""
        lines.append(target_line("argmax", n.argmax, n.argmax_token, margin))
    if phase == "verified" and n.choice is not None:
        prob = f" (p {_fmt(n.choice_prob)})" if n.choice_prob is not None else ""
        lines.append(target_line("sample", n.choice, n.choice_token, prob))
    if phase == "verified" and n.parent_top_k:
        lines.append(parent_line(n, argmax_text))
    if phase == "verified" and n.role not in ("other", "root"):
        lines.append(style.ROLE_NAME[n.role])
    return "<br>".join(lines)


def parent_line(n: LayoutNode, argmax_text=None) -> str:
    """The node inspector's short form: how likely the target found this token at the parent, and what it chose
    there (escaped)."""
    if n.parent_choice == n.token_id:
        where = "its choice"
    else:
        text = argmax_text(n.parent_choice) if argmax_text is not None else n.parent_choice_token
        where = f"it chose {esc(visible(text or ''))} (id {n.parent_choice})"
    p = f"p {_fmt(n.parent_prob)}" if n.parent_prob is not None else f"outside its top-{n.parent_top_k}"
    return f"target at the parent: {p} · {where}"


# plotly.js puts a label "middle right" of its marker at the same distance whatever the symbol: a diamond's tips and
# a star's points reach past a circle's edge, and a label beside them touched them (issue #65). A no-break space
# (one that SVG does not collapse) first moves it clear.
BESIDE_PAD = "\u00a0"
PADDED = frozenset({"first_rejected", "bonus"})


def _node_text(n: LayoutNode, ranks: bool = True, beside: bool = False) -> str:
    rank = f" <sub>r{n.rank}</sub>" if ranks and n.rank >= 0 else ""
    pad = BESIDE_PAD if beside and n.role in PADDED else ""
    return pad + esc(n.label) + rank


def _beside_px(n: LayoutNode) -> float:
    """Px from a node's centre to where its label beside it starts (plotly.js's gap, and BESIDE_PAD's width)."""
    return _marker_size(n) / 2 + 2 + (text_px(BESIDE_PAD, LABEL_FONT) if n.role in PADDED else 0)


def _edge_trace(layout: TreeLayout, kind: str, scheme: Scheme) -> dict:
    """One line trace for every edge of one edge_kind (plotly breaks the line at each None)."""
    xs: list[float | None] = []
    ys: list[float | None] = []
    for e in edges_of(layout, kind):
        a, b = layout.node(e.parent), layout.node(e.child)
        xs += [a.x, b.x, None]
        ys += [a.y, b.y, None]
    width, dash = EDGE_LINE[kind]
    name = EDGE_NAME[kind]
    return dict(type="scatter", x=xs, y=ys, mode="lines", line=dict(color=edge_color(scheme, kind), width=width, dash=dash),
                hoverinfo="skip", name=name, showlegend=kind == "bonus", legendgroup=EDGE_GROUP[kind])


# traces are plain dicts (figure.FigureSpec): the page sends them as they are, go.Figure validates them once
def _node_trace(nodes: list[LayoutNode], role: str, phase: str, argmax_text, show_text: bool, scheme: Scheme,
                ranks: bool, labelled: set[int] | None = None, position: str = "top center") -> dict:
    fill = fixed_fill(scheme, role)
    marker: dict = dict(color=fill) if fill is not None else dict(color=[n.logprob for n in nodes], coloraxis="coloraxis")
    line_color = [outline_color(scheme, role, n.on_path) for n in nodes]
    line_width = [style.PATH_OUTLINE_WIDTH if path_outlined(role, n.on_path) else 1 for n in nodes]
    marker.update(symbol=style.ROLE_SYMBOL[role], size=style.NODE_SIZE + (4 if role == "bonus" else 0),
                  line=dict(color=line_color, width=line_width))
    return dict(
        type="scatter", x=[n.x for n in nodes], y=[n.y for n in nodes], mode="markers+text" if show_text else "markers",
        text=[_node_text(n, ranks, position == "middle right") if labelled is None or n.id in labelled else ""
              for n in nodes],
        textposition=position, textfont=dict(size=LABEL_FONT),
        hovertext=[node_hover(n, phase, argmax_text) for n in nodes], hoverinfo="text",
        customdata=[n.id for n in nodes], marker=marker, name=legend_name(role, phase), legendgroup=role,
    )


def default_title(layout: TreeLayout) -> str:
    head = f"Round {layout.step_index + 1} · {plural(layout.total_nodes, 'tree position')}"
    if layout.hidden:
        head += f" ({layout.hidden} hidden)"
    if layout.phase == "drafted":
        return head + " · drafted (before verification)"
    gained = len(layout.accepted)
    mode = " · NAIVE verify (known-wrong)" if layout.verify == "naive" else ""
    walk = f"accepted {plural(gained - 1, 'draft')} + bonus = {plural(gained, 'token')}"
    if layout.kept is not None:  # the session stopped inside this walk (max new tokens, end of text)
        walk += f", {layout.kept} kept: the session stopped there"
    return f"{head} · {walk}{mode}"


def tree_figure(layout: TreeLayout, **options) -> go.Figure:
    """tree_spec(layout, **options) as a checked plotly go.Figure."""
    return tree_spec(layout, **options).figure()


def tree_spec(
    layout: TreeLayout, *, title: str | None = None, scheme: Scheme = PAGE_SCHEME, colorscale: str | None = None,
    phase: str | None = None, token_text: TokenText | None = None, show_text: bool = True,
    cmin: float | None = None, cmax: float | None = None, height: int | None = None, ranks: bool = True,
    path_label: bool = False, legend: bool = True, width: int | None = None,
) -> FigureSpec:
    """Plotly figure (as plain data: figure.FigureSpec) of a TreeLayout: token text on each node (rank as a small
    'rN' unless ranks=False), fill = drafter log-prob (colour bar), accepted path as thick edges and node outlines
    in the scheme's path colour, the first rejected candidates as diamonds with dark outlines, the bonus token as
    a star on a dashed edge. phase "drafted" shows the tree as the drafter built it (no verification marks);
    default: the layout's phase. token_text (id -> text) names the target's argmax in the hover; cmin/cmax pin the
    colour range (e.g. the same over all rounds); colorscale overrides the scheme's. path_label writes "accepted
    path" along the path's first edge; legend=False hides the legend and the colour bar. `width`: the px the figure
    is drawn across (None: not known): the labels that would run into another label or node are left to the hover
    (labelled), the depth axis's title says so, and the first and last columns get room for theirs."""
    phase = layout.phase if phase is None else phase
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, not {phase!r}")
    layout = for_phase(layout, phase)
    argmax_text = lookup(token_text, {n.token_id: n.token for n in layout.nodes}) if token_text is not None else None
    frame = _Frame.of(layout, height, width, ranks, legend)
    shown = labelled(layout, frame, ranks) if show_text and width else None

    kinds = EDGE_KINDS if phase == "verified" else ("edge",)
    traces = [_edge_trace(layout, kind, scheme) for kind in kinds]
    for role in DRAW_ORDER:
        nodes = [n for n in layout.nodes if n.role == role]
        if nodes:
            traces.append(_node_trace(nodes, role, phase, argmax_text, show_text, scheme, ranks, shown,
                                      "middle right" if frame.beside else "top center"))

    lo, hi = layout.logprob_range
    spec = FigureSpec(traces, dict(
        title=dict(text="<br>".join(esc(line) for line in title.split("\n")) if title is not None
                   else default_title(layout), font=dict(size=14)),  # a line break in a title: a new line
        # the colour bar's title beside it, turned: above it, its last line sat on the top tick's label ("0")
        coloraxis=dict(colorscale=figure_colorscale(colorscale or scheme.colorscale), cmin=lo if cmin is None else cmin,
                       cmax=hi if cmax is None else cmax,
                       colorbar=dict(title=dict(text="drafter log-prob", side="right"), thickness=14)),
        plot_bgcolor="white", hovermode="closest", **frame.layout(layout, shown),
    ))
    if path_label:
        _add_path_label(spec, layout, scheme)
    if not legend:
        spec.layout["coloraxis"]["showscale"] = False
        spec.layout["showlegend"] = False
    return spec


@dataclass(frozen=True)
class _Frame:
    """Where the figure puts things, in px once its width is known: ROW_PX a row (a label above its node clears
    the node on the row above: `·to r4` drew as `·t● r4` at ~25 px a row), room right of the deepest column for its
    label (the bonus star's sat under the colour bar's title), and the legend in the bottom margin, under the depth
    axis's title (it sat on it in short figures: a legend placed in plot fractions moves with the figure's height);
    the right margin holds the colour bar (figure.COLORBAR_PX: drawn once)."""

    width: int | None
    height: int
    right: int  # the right margin (px)
    x_range: tuple[float, float]
    y_range: tuple[float, float]  # top, bottom (rows grow downward)
    beside: bool = False  # labels beside their nodes (else above them)
    bottom: int = BOTTOM_PX  # the bottom margin (px)
    left: int = 20

    @classmethod
    def of(cls, layout: TreeLayout, height: int | None, width: int | None, ranks: bool, legend: bool) -> "_Frame":
        rows = layout.height
        right = COLORBAR_PX if legend else 20
        # a narrow figure's legend wraps to a third line or more: a bottom margin that holds it (else plotly.js
        # grows the margin, drawing the figure twice, and the nodes move off the places their labels were fitted to)
        lines = _legend_rows(layout, width - cls.left - right) if width and legend else 2
        bottom = BOTTOM_PX + LEGEND_ROW_PX * max(0, lines - 2)
        height = height or int(min(max(360, TOP_PX + bottom + ROW_PX * (rows + 0.6)), MAX_HEIGHT))
        y_range = (-0.9, rows - 1 + 0.5)
        # labels beside their nodes where the rows are too close for a label above each node (a tall tree at
        # MAX_HEIGHT), as the matplotlib export does (mpl.tree_style)
        row_px = (height - TOP_PX - bottom) / (y_range[1] - y_range[0])
        beside = bool(width) and row_px < style.NODE_SIZE + LABEL_PX_TALL + 2
        x_range = (-0.5, layout.width - 1 + LABEL_ROOM)
        if width:
            x_range = _label_room(layout, width - cls.left - right, ranks, beside)
        return cls(width, height, right, x_range, y_range, beside, bottom)

    @property
    def area(self) -> tuple[float, float, float, float]:
        """The plot's box in px (what plotly.js clips the nodes and their labels to)."""
        return (self.left, TOP_PX, (self.width or 0) - self.right, self.height - self.bottom)

    def px(self, x: float, y: float) -> tuple[float, float]:
        """A point of the axes in px from the figure's top left corner."""
        left, top, right, bottom = self.area
        (x0, x1), (y0, y1) = self.x_range, self.y_range
        return left + (x - x0) / (x1 - x0) * (right - left), top + (y - y0) / (y1 - y0) * (bottom - top)

    def layout(self, layout: TreeLayout, shown: set[int] | None) -> dict:
        """Axes, height, margins and legend; the depth axis's title says when labels were left to the hover."""
        thinned = shown is not None and len(shown) < len(layout.nodes)
        depth = THINNED.format(shown=len(shown), total=len(layout.nodes)) if thinned else "depth"
        return dict(
            xaxis=dict(title=dict(text=depth), dtick=1, range=list(self.x_range), zeroline=False, showgrid=True),
            # rows grow downward; the top row's label has room above it
            yaxis=dict(range=[self.y_range[1], self.y_range[0]], showticklabels=False, zeroline=False,
                       showgrid=False),
            height=self.height, margin=dict(l=self.left, r=self.right, t=TOP_PX, b=self.bottom),
            legend=bottom_legend(),
        )


def _legend_rows(layout: TreeLayout, plot_px: float) -> int:
    """The lines plotly.js wraps the legend to across `plot_px`: its entries in trace order (the bonus edge, then the
    roles in DRAW_ORDER), each its symbol (~40 px) and its name (12 px text)."""
    names = [EDGE_NAME["bonus"]] if layout.phase == "verified" else []
    names += [legend_name(role, layout.phase) for role in DRAW_ORDER if layout.by_role(role)]
    lines, used = 1, 0.0
    for name in names:
        item = 44 + text_px(name, 12)
        if used and used + item > plot_px:
            lines, used = lines + 1, 0.0
        used += item
    return lines


def _marker_size(n: LayoutNode) -> int:
    return style.NODE_SIZE + (4 if n.role == "bonus" else 0)


def label_width(n: LayoutNode, ranks: bool) -> float:
    """The px a node's label takes across (figure.text_px's estimate; its rank a subscript of ~8 px)."""
    rank = 4 + text_px(f"r{n.rank}", 8) if ranks and n.rank >= 0 else 0
    return text_px(n.label, LABEL_FONT) + rank


def _label_room(layout: TreeLayout, plot_px: float, ranks: bool, beside: bool) -> tuple[float, float]:
    """The depth axis's range: half a column left of the root and LABEL_ROOM right of the deepest column, or more
    where their labels (centred on their nodes, or `beside` them) need it, at `plot_px` across."""
    cols = layout.width - 1
    if cols <= 0 or plot_px <= 0:
        return -0.5, cols + LABEL_ROOM

    def need(depth: int, part: float) -> float:
        return max((label_width(n, ranks) * part + 3 + (_beside_px(n) if beside else 0)
                    for n in layout.nodes if n.depth == depth), default=0)

    need_left, need_right = (0.0 if beside else need(0, 0.5)), need(cols, 1.0 if beside else 0.5)
    left, right = 0.5, LABEL_ROOM
    for _ in range(4):  # the room is in columns, a column's px depends on the room: a few rounds settle it
        col = plot_px / (cols + left + right)
        left, right = max(0.5, need_left / col), max(LABEL_ROOM, need_right / col)
    return -left, cols + right


def labelled(layout: TreeLayout, frame: _Frame, ranks: bool) -> set[int]:
    """The nodes whose labels are drawn at the frame's width: the root, the accepted path, the bonus, the first
    rejected by rank, then the rest in tree order (best-first: the drafter's likeliest first), each where its label
    fits (label_fit.fitting: inside the plot, clear of the labels before it and of every other node)."""
    spots = {n.id: frame.px(n.x, n.y) for n in layout.nodes}
    markers = []
    for n in layout.nodes:
        (x, y), half = spots[n.id], _marker_size(n) * (0.67 if n.role == "bonus" else 0.5) + 0.5  # a star's points
        markers.append((n.id, (x - half, y - half, x + half, y + half)))
    path = {node_id: k for k, node_id in enumerate(layout.accepted)}
    first = {"root": 0, "accepted": 1, "bonus": 2, "first_rejected": 3}

    def order(n: LayoutNode):
        return first.get(n.role, 4), path.get(n.id, 0), n.rank if n.role == "first_rejected" else 0, n.id

    labels = []
    for n in sorted(layout.nodes, key=order):
        (x, y), w = spots[n.id], label_width(n, ranks)
        tall = LABEL_PX_TALL if ranks and n.rank >= 0 else 13
        if frame.beside:  # plotly.js's "middle right": the text a few px right of the marker, centred on it
            left = x + _beside_px(n)
            labels.append((n.id, (left, y - tall / 2, left + w, y + tall / 2)))
        else:  # "top center": the text's foot a px over the marker
            bottom = y - _marker_size(n) / 2 - 1
            labels.append((n.id, (x - w / 2, bottom - tall, x + w / 2, bottom)))
    return fitting(labels, markers, frame.area)


def _add_path_label(spec: FigureSpec, layout: TreeLayout, scheme: Scheme) -> None:
    """'accepted path' (or 'bonus') in italics under the middle of the path's first edge."""
    spot = path_label_at(layout)
    if spot is None:
        return
    a, b, text = spot
    spec.layout.setdefault("annotations", []).append(dict(
        x=(a.x + b.x) / 2, y=(a.y + b.y) / 2, text=text, showarrow=False, yshift=-11,
        font=dict(color=scheme.path, size=10, style="italic")))

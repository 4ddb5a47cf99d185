"""The draft tree as a plotly figure, drawn from the shared TreeLayout."""

from __future__ import annotations

import plotly.graph_objects as go

from . import style
from .figure import FigureSpec
from .figure import colorscale as figure_colorscale
from .layout import PHASES, LayoutNode, TreeLayout, for_phase
from .text import TokenText, esc, lookup, visible

ROLE_ORDER = ("other", "first_rejected", "accepted", "root", "bonus")  # drawing order: path on top


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
    if phase == "verified" and n.argmax is not None:
        text = argmax_text(n.argmax) if argmax_text is not None else n.argmax_token
        shown = f" {esc(visible(text))}" if text is not None else ""
        margin = f" (margin {_fmt(n.target_margin, 2)})" if n.target_margin is not None else ""
        lines.append(f"target argmax: id {n.argmax}{shown}{margin}")
    if phase == "verified" and n.choice is not None:
        text = argmax_text(n.choice) if argmax_text is not None else n.choice_token
        shown = f" {esc(visible(text))}" if text is not None else ""
        prob = f" (p {_fmt(n.choice_prob)})" if n.choice_prob is not None else ""
        lines.append(f"target sample: id {n.choice}{shown}{prob}")
    if phase == "verified" and n.role not in ("other", "root"):
        lines.append(style.ROLE_NAME[n.role])
    return "<br>".join(lines)


def _node_text(n: LayoutNode) -> str:
    rank = f" <sub>r{n.rank}</sub>" if n.rank >= 0 else ""
    return esc(n.label) + rank


def _edge_trace(layout: TreeLayout, edges, name: str, color: str, width: float, dash: str = "solid") -> dict:
    xs: list[float | None] = []
    ys: list[float | None] = []
    for e in edges:
        a, b = layout.node(e.parent), layout.node(e.child)
        xs += [a.x, b.x, None]
        ys += [a.y, b.y, None]
    return dict(type="scatter", x=xs, y=ys, mode="lines", line=dict(color=color, width=width, dash=dash),
                hoverinfo="skip", name=name, showlegend=name != "", legendgroup=name)


# traces are plain dicts (figure.FigureSpec): the page sends them as they are, go.Figure validates them once
def _node_trace(nodes: list[LayoutNode], role: str, phase: str, argmax_text, show_text: bool) -> dict:
    on_path = [n.on_path for n in nodes]
    if role in ("root", "bonus"):
        fill: object = style.BONUS_FILL if role == "bonus" else style.NEUTRAL_FILL
        marker = dict(color=fill)
    else:
        marker = dict(color=[n.logprob for n in nodes], coloraxis="coloraxis")
    line_color = [style.PATH_COLOR if p or role == "bonus" else
                  (style.REJECTED_COLOR if role == "first_rejected" else "#444444") for p in on_path]
    line_width = [style.PATH_OUTLINE_WIDTH if p or role == "bonus" else 1 for p in on_path]
    marker.update(symbol=style.ROLE_SYMBOL[role], size=style.NODE_SIZE + (4 if role == "bonus" else 0),
                  line=dict(color=line_color, width=line_width))
    name = style.ROLE_NAME[role] if phase == "verified" else ("root" if role == "root" else "drafted")
    return dict(
        type="scatter", x=[n.x for n in nodes], y=[n.y for n in nodes], mode="markers+text" if show_text else "markers",
        text=[_node_text(n) for n in nodes], textposition="top center", textfont=dict(size=11),
        hovertext=[node_hover(n, phase, argmax_text) for n in nodes], hoverinfo="text",
        customdata=[n.id for n in nodes], marker=marker, name=name, legendgroup=role,
    )


def default_title(layout: TreeLayout) -> str:
    head = f"Round {layout.step_index + 1} · {layout.total_nodes} tree positions"
    if layout.hidden:
        head += f" ({layout.hidden} hidden)"
    if layout.phase == "drafted":
        return head + " · drafted (before verification)"
    gained = len(layout.accepted)
    mode = " · NAIVE verify (known-wrong)" if layout.verify == "naive" else ""
    return f"{head} · accepted {gained - 1} draft(s) + bonus = {gained} token(s){mode}"


def tree_figure(layout: TreeLayout, **options) -> go.Figure:
    """tree_spec(layout, **options) as a checked plotly go.Figure."""
    return tree_spec(layout, **options).figure()


def tree_spec(
    layout: TreeLayout, *, title: str | None = None, colorscale: str = style.DEFAULT_COLORSCALE,
    phase: str | None = None, token_text: TokenText | None = None, show_text: bool = True,
    cmin: float | None = None, cmax: float | None = None, height: int | None = None,
) -> FigureSpec:
    """Plotly figure (as plain data: figure.FigureSpec) of a TreeLayout: token text on each node (rank as a small 'rN'), fill = drafter
    log-prob (colour bar), accepted path as thick vermillion edges and node outlines, the first rejected
    candidates as diamonds with black outlines, the bonus token as a star on a dashed edge. phase
    "drafted" shows the tree as the drafter built it (no verification marks); default: the layout's phase.
    token_text (id -> text) names the target's argmax in the hover; cmin/cmax pin the colour range (e.g.
    the same over all rounds)."""
    phase = layout.phase if phase is None else phase
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, not {phase!r}")
    layout = for_phase(layout, phase)
    argmax_text = lookup(token_text, {n.token_id: n.token for n in layout.nodes}) if token_text is not None else None

    normal = [e for e in layout.edges if not e.on_path and not e.synthetic]
    traces = [_edge_trace(layout, normal, "", style.EDGE_COLOR, style.EDGE_WIDTH)]
    if phase == "verified":
        path = [e for e in layout.edges if e.on_path]
        bonus = [e for e in layout.edges if e.synthetic]
        traces.append(_edge_trace(layout, path, "accepted path", style.PATH_COLOR, style.PATH_EDGE_WIDTH))
        traces.append(_edge_trace(layout, bonus, "bonus edge", style.PATH_COLOR, 2, dash="dash"))
    for role in ROLE_ORDER:
        nodes = [n for n in layout.nodes if n.role == role]
        if nodes:
            traces.append(_node_trace(nodes, role, phase, argmax_text, show_text))

    lo, hi = layout.logprob_range
    rows = layout.height
    return FigureSpec(traces, dict(
        title=dict(text=esc(title) if title is not None else default_title(layout), font=dict(size=14)),
        coloraxis=dict(colorscale=figure_colorscale(colorscale), cmin=lo if cmin is None else cmin, cmax=hi if cmax is None else cmax,
                       colorbar=dict(title=dict(text="drafter<br>log-prob"), thickness=14)),
        xaxis=dict(title=dict(text="depth"), dtick=1, range=[-0.5, layout.width - 0.3], zeroline=False, showgrid=True),
        yaxis=dict(autorange="reversed", showticklabels=False, zeroline=False, showgrid=False),
        height=height or int(min(max(360, 60 + 30 * rows), 2400)),
        margin=dict(l=20, r=20, t=50, b=40), plot_bgcolor="white", hovermode="closest",
        legend=dict(orientation="h", yanchor="top", y=-0.08, x=0),
    ))

"""THE tree layout: one StepRecord in, positions + labels + roles + colour values out.

Every backend draws from this (the page's plotly figure, and the TikZ/SVG/PDF exporters), so they agree; the
rules they share about what a layout means live here too: which edges are drawn as the accepted path
(edge_kind), where the path's label goes (path_label_at), the legend's entries and names (legend_entries),
and the order nodes are drawn in (DRAW_ORDER).

Coordinates: x = depth (root 0). y = row, growing downward (rank 0 on top): a tidy layered layout where
each leaf gets its own row in depth-first order (children by rank, the synthetic bonus node last), and
each inner node sits midway between its first and last child. Every subtree therefore owns a
contiguous band of rows, disjoint from its siblings' bands: no two nodes overlap, every parent is one
column left of its children. Backends with y pointing up negate y.

Roles (verified phase):
    root            tree position 0 (the previous round's bonus token, already committed)
    accepted        on the accepted path, root excluded (drafts the target agreed with)
    first_rejected  the children of the last accepted node: the drafter's candidates where the walk
                    stopped, all rejected (none when the last accepted node is a leaf)
    bonus           a synthetic node hanging off the last accepted node: the target's own token there
    other           every other drafted node
In the drafted phase (before verification) only "root" and "other" exist, there is no bonus node,
nothing is on the path and no target argmax (or sample) is shown; node positions are the same as in the verified
phase (the bonus row stays empty), so the picture does not jump between phases.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import networkx as nx

from .. import analysis
from ..options import PHASES  # noqa: F401 - the phases this layout draws
from ..trace import StepRecord
from . import style
from .text import TokenText, lookup, shorten, visible

ROLES = ("root", "accepted", "first_rejected", "bonus", "other")  # also the legend's order
DRAW_ORDER = ("other", "first_rejected", "accepted", "root", "bonus")  # nodes drawn in this order: path on top
EDGE_KINDS = ("edge", "path", "bonus")  # see edge_kind; plotly draws them in this order
EDGE_NAME = {"edge": "", "path": "accepted path", "bonus": "bonus edge"}  # legend names of edge kinds
PATH_LABEL = {"path": "accepted path", "bonus": "bonus"}  # the label written along the path's first edge
DEFAULT_LABEL_CHARS = 12


@dataclass(frozen=True)
class LayoutNode:
    id: int  # tree position; the synthetic bonus node gets len(step.nodes)
    parent: int  # -1 for the root
    x: float
    y: float
    depth: int
    token_id: int
    token: str  # raw token text (untrusted: escape for HTML/LaTeX/XML)
    label: str  # visible(token), shortened to the layout's label length
    rank: int  # drafter rank at its depth (-1 for the root and the bonus node)
    logprob: float | None  # drafter log-prob: THE colour value (None for root and bonus: neutral colour)
    score: float | None  # sum of drafter log-probs root -> node (the best-first tree's priority)
    argmax: int | None  # target's argmax at this position (None: drafted phase, or the bonus node)
    argmax_token: str | None  # its text when known
    target_margin: float | None  # target's top-1 minus top-2 logit here, when recorded
    role: str
    on_path: bool  # root or accepted
    synthetic: bool = False  # True only for the bonus node
    # sampling (T > 0): the target's sampled token here (the walk follows it) and its probability under the
    # filtered tempered distribution; on the bonus node, its own token's. None when greedy or not verified.
    choice: int | None = None
    choice_token: str | None = None
    choice_prob: float | None = None
    # the target at this node's parent (its recorded top-k): this token's probability there (None: outside the
    # top-k, or not recorded: parent_top_k 0) and the target's choice there (what the walk wanted at this depth)
    parent_prob: float | None = None
    parent_top_k: int = 0
    parent_choice: int | None = None
    parent_choice_token: str | None = None

    @property
    def color_value(self) -> float | None:
        return self.logprob


@dataclass(frozen=True)
class LayoutEdge:
    parent: int
    child: int
    on_path: bool  # both ends on the accepted path
    synthetic: bool = False  # the edge to the bonus node


@dataclass(frozen=True)
class TreeLayout:
    step_index: int
    phase: str  # "drafted" | "verified"
    method: str
    verify: str
    committed_len: int
    nodes: tuple[LayoutNode, ...]  # tree order (parents before children), bonus last
    edges: tuple[LayoutEdge, ...]
    accepted: tuple[int, ...]  # () in the drafted phase
    bonus_id: int | None  # id of the synthetic bonus node, len(step.nodes) (None in the drafted phase)
    bonus_token_id: int | None
    total_nodes: int  # tree positions in the record (root included)
    hidden: int  # tree positions hidden by the filters
    max_depth: int | None
    min_logprob: float | None
    logprob_range: tuple[float, float]  # (min, max) drafter log-prob over the shown nodes
    kept: int | None = None  # tokens the round added to the output, where fewer than its walk's (a cut round)
    _index: dict[int, int] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {n.id: i for i, n in enumerate(self.nodes)})

    def node(self, node_id: int) -> LayoutNode:
        return self.nodes[self._index[node_id]]

    def __contains__(self, node_id: int) -> bool:
        return node_id in self._index

    @property
    def width(self) -> float:
        """Columns spanned (max x + 1)."""
        return max(n.x for n in self.nodes) + 1

    @property
    def height(self) -> float:
        """Rows spanned (max y + 1)."""
        return max(n.y for n in self.nodes) + 1

    def by_role(self, role: str) -> tuple[LayoutNode, ...]:
        return tuple(n for n in self.nodes if n.role == role)


def edge_kind(edge: LayoutEdge) -> str:
    """'bonus' for the edge to the bonus node, 'path' for an accepted-path edge, 'edge' for any other."""
    if edge.synthetic:
        return "bonus"
    return "path" if edge.on_path else "edge"


def edges_of(layout: TreeLayout, kind: str) -> list[LayoutEdge]:
    """The layout's edges of one edge_kind, in layout order."""
    return [e for e in layout.edges if edge_kind(e) == kind]


def path_label_at(layout: TreeLayout) -> tuple[LayoutNode, LayoutNode, str] | None:
    """Where the path's label goes and what it says: the two ends of the first accepted-path edge and 'accepted
    path', else those of the bonus edge and 'bonus'; None in the drafted phase."""
    spots = path_label_spots(layout)
    return spots[0] if spots else None


def path_label_spots(layout: TreeLayout) -> list[tuple[LayoutNode, LayoutNode, str]]:
    """Every edge the path's label may go along, the most wanted first: the accepted path's edges in order
    ('accepted path'), else the bonus edge ('bonus'); none in the drafted phase. A backend that can measure what it
    drew takes the first where the label is clear of the nodes and their labels (mpl.tree_figure_mpl)."""
    if layout.phase != "verified":
        return []
    for kind in ("path", "bonus"):
        edges = edges_of(layout, kind)
        if edges:
            return [(layout.node(e.parent), layout.node(e.child), PATH_LABEL[kind]) for e in edges]
    return []


def path_outlined(role: str, on_path: bool) -> bool:
    """Whether a node's marker wears the path's outline: on the accepted path, or the bonus."""
    return on_path or role == "bonus"


def legend_name(role: str, phase: str) -> str:
    """A role's name in legends: style.ROLE_NAME once verified; before that every drafted node is 'drafted'."""
    if phase == "verified":
        return style.ROLE_NAME[role]
    return "root" if role == "root" else "drafted"


@dataclass(frozen=True)
class LegendEntry:
    role: str
    name: str
    on_path: bool  # its marker wears the path's outline (the accepted nodes, and the root once verified)


def legend_entries(layout: TreeLayout) -> tuple[LegendEntry, ...]:
    """One marker legend entry per role the layout shows, in ROLES order."""
    verified = layout.phase == "verified"
    return tuple(LegendEntry(role, legend_name(role, layout.phase), role == "accepted" or (role == "root" and verified))
                 for role in ROLES if layout.by_role(role))


def _shown(step: StepRecord, on_path: set[int], max_depth: int | None, min_logprob: float | None) -> list[bool]:
    """Per tree position: kept by the filters? Hidden nodes take their subtrees with them; the accepted
    path is never hidden."""
    keep = [True] * len(step.nodes)
    for n in step.nodes[1:]:  # parents precede children
        if n.id in on_path:
            continue
        ok = keep[n.parent]
        ok = ok and (max_depth is None or n.depth <= max_depth)
        ok = ok and (min_logprob is None or n.logprob >= min_logprob)
        keep[n.id] = ok
    return keep


def _tidy_rows(g: nx.DiGraph, root: int, order_key) -> dict[int, float]:
    """Leaves on consecutive rows in depth-first order (children sorted by order_key); inner nodes midway
    between their first and last child. Iterative, so deep chains do not hit the recursion limit."""
    y: dict[int, float] = {}
    next_row = 0
    stack: list[tuple[int, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        kids = sorted(g.successors(node), key=order_key)
        if not kids:
            y[node] = float(next_row)
            next_row += 1
        elif done:
            y[node] = (y[kids[0]] + y[kids[-1]]) / 2.0
        else:
            stack.append((node, True))
            stack.extend((k, False) for k in reversed(kids))
    return y


def tree_layout(
    step: StepRecord, *, max_depth: int | None = None, min_logprob: float | None = None,
    phase: str = "verified", token_text: TokenText | None = None, label_chars: int = DEFAULT_LABEL_CHARS,
) -> TreeLayout:
    """Lay out one round's tree (see the module docstring for coordinates and roles).

    max_depth / min_logprob hide drafted nodes deeper than max_depth or with a drafter log-prob below
    min_logprob (and their subtrees), never the accepted path. token_text (callable or mapping id -> text)
    names the bonus token and the target's argmax; without it, ids seen in the tree are named from their
    nodes and others show as '⟨id⟩'."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, not {phase!r}")
    nodes = step.nodes
    n_tree = len(nodes)
    text = lookup(token_text, {n.token_id: n.token for n in nodes})
    accepted = tuple(step.accepted)
    on_path = set(accepted)
    last = accepted[-1]
    keep = _shown(step, on_path, max_depth, min_logprob)

    g = nx.DiGraph()
    g.add_nodes_from(n.id for n in nodes if keep[n.id])
    g.add_edges_from((n.parent, n.id) for n in nodes[1:] if keep[n.id])
    bonus_id = n_tree
    g.add_edge(last, bonus_id)
    rank_of = {n.id: n.rank for n in nodes}
    rows = _tidy_rows(g, 0, lambda i: (i == bonus_id, rank_of.get(i, 0), i))

    scores = [0.0] * n_tree
    for n in nodes[1:]:
        scores[n.id] = scores[n.parent] + n.logprob
    margins = step.target_margin if len(step.target_margin) == n_tree else None
    sampled = len(step.target_choice) == n_tree
    probs = step.target_prob if len(step.target_prob) == n_tree else None
    tops = [dict(analysis.target_top(step, i)) for i in range(n_tree)] if step.target_top_ids else None
    choices = step.choices

    out: list[LayoutNode] = []
    for n in nodes:
        if not keep[n.id]:
            continue
        if n.id == 0:
            role = "root"
        elif n.id in on_path:
            role = "accepted"
        elif n.parent == last:
            role = "first_rejected"
        else:
            role = "other"
        out.append(LayoutNode(
            id=n.id, parent=n.parent, x=float(n.depth), y=rows[n.id], depth=n.depth, token_id=n.token_id,
            token=n.token, label=shorten(visible(n.token), label_chars), rank=n.rank,
            logprob=None if n.id == 0 else float(n.logprob), score=None if n.id == 0 else scores[n.id],
            argmax=step.target_argmax[n.id], argmax_token=text(step.target_argmax[n.id]),
            target_margin=margins[n.id] if margins else None, role=role, on_path=n.id in on_path,
            choice=step.target_choice[n.id] if sampled else None,
            choice_token=text(step.target_choice[n.id]) if sampled else None,
            choice_prob=probs[n.id] if probs else None,
            **_parent_view(n, tops, choices, text),
        ))
    bonus_text = text(step.bonus_token_id)
    out.append(LayoutNode(
        id=bonus_id, parent=last, x=float(nodes[last].depth + 1), y=rows[bonus_id], depth=nodes[last].depth + 1,
        token_id=step.bonus_token_id, token=bonus_text, label=shorten(visible(bonus_text), label_chars), rank=-1,
        logprob=None, score=None, argmax=None, argmax_token=None, target_margin=None, role="bonus", on_path=False,
        synthetic=True, choice_prob=probs[last] if probs else None,
        **_parent_view(dataclasses.replace(nodes[last], parent=last, token_id=step.bonus_token_id), tops, choices, text),
    ))
    edges = [LayoutEdge(n.parent, n.id, n.on_path) for n in out if n.parent >= 0 and not n.synthetic]
    edges.append(LayoutEdge(last, bonus_id, False, synthetic=True))
    lps = [n.logprob for n in out if n.logprob is not None]
    layout = TreeLayout(
        step_index=step.index, phase="verified", method=step.method, verify=step.verify,
        committed_len=step.committed_len, nodes=tuple(out), edges=tuple(edges), accepted=accepted,
        bonus_id=bonus_id, bonus_token_id=step.bonus_token_id, total_nodes=n_tree, hidden=keep.count(False),
        max_depth=max_depth, min_logprob=min_logprob,
        logprob_range=(min(lps), max(lps)) if lps else (-1.0, 0.0), kept=step.kept if step.cut else None,
    )
    return for_phase(layout, phase)


def _parent_view(node, tops, choices, text) -> dict:
    """LayoutNode fields for what the target thought at the node's parent (none for the root, or unrecorded)."""
    if node.parent < 0 or tops is None:
        return {}
    top = tops[node.parent]
    choice = choices[node.parent]
    return dict(parent_prob=top.get(node.token_id), parent_top_k=len(top), parent_choice=choice,
                parent_choice_token=text(choice))


def for_phase(layout: TreeLayout, phase: str) -> TreeLayout:
    """The same layout as seen in `phase`: "drafted" strips everything verification decided (roles other
    than root/other, the path, the bonus node, the target's argmax); positions are unchanged."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, not {phase!r}")
    if phase == layout.phase:
        return layout
    if layout.phase == "drafted":
        raise ValueError("a drafted-phase layout has no verification data: lay out with phase='verified'")
    nodes = tuple(
        dataclasses.replace(n, role="root" if n.id == 0 else "other", on_path=False, argmax=None, argmax_token=None,
                            target_margin=None, choice=None, choice_token=None, choice_prob=None, parent_prob=None,
                            parent_top_k=0, parent_choice=None, parent_choice_token=None)
        for n in layout.nodes if not n.synthetic
    )
    edges = tuple(dataclasses.replace(e, on_path=False) for e in layout.edges if not e.synthetic)
    return dataclasses.replace(layout, phase="drafted", nodes=nodes, edges=edges, accepted=(), bonus_id=None,
                               bonus_token_id=None)


def node_colors(layout: TreeLayout, colorscale: str = "Viridis", cmin: float | None = None,
                cmax: float | None = None, neutral: str | None = None, bonus: str | None = None) -> dict[int, str]:
    """id -> 'rgb(r, g, b)' fill colour, the same mapping plotly's colour axis applies (for vector backends)."""
    from plotly.colors import get_colorscale, sample_colorscale

    lo, hi = layout.logprob_range
    lo = lo if cmin is None else cmin
    hi = hi if cmax is None else cmax
    scale = get_colorscale(colorscale)
    coloured = [n for n in layout.nodes if n.logprob is not None]
    ts = [0.5 if hi <= lo else min(max((n.logprob - lo) / (hi - lo), 0.0), 1.0) for n in coloured]
    # one call for every node: plotly validates the scale on each call, which cost ~0.2 ms a node
    sampled = dict(zip((n.id for n in coloured), sample_colorscale(scale, ts) if ts else []))
    out: dict[int, str] = {}
    for n in layout.nodes:
        if n.logprob is None:
            out[n.id] = (bonus or style.BONUS_FILL) if n.synthetic else (neutral or style.NEUTRAL_FILL)
        else:
            out[n.id] = sampled[n.id]
    return out

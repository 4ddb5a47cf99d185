"""matplotlib backend: SVG, PDF and PNG with no browser (plotly's static export needs Chromium; this does not).

Drawn from the same TreeLayout as the page's plotly figure: same positions (x = depth, y = row, downward),
labels (layout labels: visible whitespace), role markers (square root, circles, diamonds for the first
rejected candidates, star for the bonus), fills (layout.node_colors over the same colour scale and range).

Fonts: DejaVu Sans / DejaVu Sans Mono, which ship inside matplotlib, so output does not depend on the
machine's fonts. PDF: one page, TrueType (Type 42) fonts embedded. SVG: text stays `<text>` elements
(searchable, selectable, editable) and the glyphs used are embedded as subset fonts in an @font-face data URL.
PNG: exactly round(width x dpi) x round(height x dpi) pixels. PDF and SVG are byte-for-byte reproducible
(no timestamps, fixed ids). Token text never goes through mathtext ($ is just a dollar sign).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import io
import math
import re
import textwrap
import threading
import warnings
import xml.etree.ElementTree as ET
from dataclasses import dataclass

# Figures are built with matplotlib.figure.Figure directly (no pyplot): no GUI backend, no global figure list.
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection
from matplotlib.colors import ListedColormap, Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.path import Path as MplPath
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import Bbox

from . import paper, style
from .layout import DRAW_ORDER, EDGE_NAME, TreeLayout, edge_kind, edges_of, legend_entries, path_label_spots, path_outlined
from .scheme import Scheme, edge_color, fixed_fill, outline_color, scale_samples
from .text import shorten

SANS = ["DejaVu Sans"]
MONO = ["DejaVu Sans Mono", "DejaVu Sans"]  # per-glyph fallback: Mono lacks a few symbols
RC = {
    "svg.fonttype": "none", "pdf.fonttype": 42, "ps.fonttype": 42, "text.parse_math": False, "text.usetex": False,
    "font.family": SANS, "font.size": 8, "svg.hashsalt": "ddtree-viz", "axes.unicode_minus": True,
    "savefig.transparent": False, "figure.facecolor": "white", "pdf.compression": 6,
}
MARKER = {"root": "s", "accepted": "o", "first_rejected": "D", "bonus": "*", "other": "o"}
MARKER_SIZE = {"root": 7.5, "accepted": 8.5, "first_rejected": 7.0, "bonus": 14.0, "other": 8.5}  # points
# how far a marker reaches from its centre, in its size: circles, squares and stars half of it, a diamond (a square
# turned 45 degrees) half its diagonal (labels placed half a size away touched the diamonds' tips, issue #65)
REACH = {"s": 0.5, "o": 0.5, "*": 0.5, "D": 0.5 * 2 ** 0.5}
_LOCK = threading.Lock()  # rc_context is process-global: one export at a time (the page serves many tabs)


@contextlib.contextmanager
def rendering():
    """Hold while building and saving a figure: this module's rc settings (embedded fonts, no mathtext)."""
    import matplotlib

    with _LOCK, matplotlib.rc_context(RC):
        yield


@dataclass(frozen=True)
class Page:
    """What every matplotlib export shares: size, resolution, title and caption."""

    width: float  # inches
    height: float
    dpi: int
    title: str | None
    caption: str | None
    legend: bool = True


def caption_lines(caption: str | None, width: float) -> list[str]:
    return textwrap.wrap(_plain(caption), max(40, int(width * 15))) if caption else []


def _figure(page: Page):
    """(figure, host): the host (the figure, or its top part when there is a caption) takes the axes, colour bar
    and legend under constrained layout; the caption gets a strip of its own below, so they never overlap."""
    fig = Figure(figsize=(page.width, page.height), dpi=page.dpi, layout="constrained")
    fig.get_layout_engine().set(w_pad=0.04, h_pad=0.04, hspace=0.0, wspace=0.0)
    lines = caption_lines(page.caption, page.width)
    if not lines:
        return fig, fig
    strip = min(0.16 * len(lines) + 0.12, page.height * 0.5)
    top, bottom = fig.subfigures(2, 1, height_ratios=[page.height - strip, strip])
    bottom.text(0.5, 0.5, "\n".join(lines), ha="center", va="center", fontsize=7.5, color="#222222",
                gid="ddt-caption")
    return fig, top


def _finish(ax, page: Page) -> None:
    if page.title:
        lines = textwrap.wrap(_plain(page.title), max(30, int(page.width * 12)))  # never wider than the figure
        ax.set_title("\n".join(lines), fontsize=9.5, loc="center", pad=8)


def _plain(text: str) -> str:
    """Titles and captions: control characters (newlines excepted) out; they cannot be drawn or written as XML."""
    return "".join(ch if ch == "\n" or ch.isprintable() else " " for ch in text)


@contextlib.contextmanager
def _quiet():
    """matplotlib's warnings about a glyph no font has (token text is anything) and a layout it could not fit."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*[Gg]lyph .* missing from.*")
        warnings.filterwarnings("ignore", message=r".*constrained_layout not applied.*")
        warnings.filterwarnings("ignore", message=r".*[Cc]onstrained ?layout.*")
        yield


def save(fig: Figure, fmt: str, page: Page, meta_title: str, embed_fonts: bool = True) -> bytes:
    """Render to bytes: one PDF page with embedded TrueType fonts; SVG with text as text (fonts embedded, unless
    `embed_fonts` is False: figures that embed theirs together, embed_svg_fonts_together); PNG at exactly the
    figure's pixel size."""
    meta_title = _plain(meta_title).replace("\n", " ")  # metadata is XML in an SVG: no control characters
    buf = io.BytesIO()
    with _quiet():
        if fmt == "pdf":
            fig.savefig(buf, format="pdf", dpi=page.dpi, metadata={
                "Title": meta_title, "Creator": "ddtree-viz", "Producer": "ddtree-viz (matplotlib)",
                "CreationDate": None, "ModDate": None})
        elif fmt == "svg":
            fig.savefig(buf, format="svg", dpi=page.dpi, metadata={
                "Title": meta_title, "Creator": "ddtree-viz", "Date": None})
        elif fmt == "png":
            fig.savefig(buf, format="png", dpi=page.dpi, metadata={"Title": meta_title, "Software": "ddtree-viz"})
        else:
            raise ValueError(f"matplotlib backend renders svg, pdf or png, not {fmt!r}")
    data = buf.getvalue()
    return embed_svg_fonts(data) if fmt == "svg" and embed_fonts else data


# ------------------------------------------------------------------------------------------------------------
# SVG fonts: keep text as text, embed the glyphs it uses
# ------------------------------------------------------------------------------------------------------------

_FAMILY = re.compile(r"font-family:\s*([^;\"]+)")
_WEIGHT = re.compile(r"font-weight:\s*([a-z0-9]+)")
_STYLE = re.compile(r"font-style:\s*([a-z]+)")


@functools.lru_cache(maxsize=64)
def _subset_font(path: str, text: str) -> str:
    """The font at `path` cut to the glyphs of `text`, as base64 TrueType. Kept for the process (the same bytes each
    time): a report's figures, and the figures of reports written again (analyze --resume, the page's Analyze tab,
    the tests), share their glyph sets, and subsetting DejaVu Sans costs ~0.3-1 s a call."""
    from fontTools import subset
    from fontTools.ttLib import TTFont

    font = TTFont(path, recalcTimestamp=False)  # no save-time timestamp: reproducible SVG bytes
    options = subset.Options()
    options.name_IDs = ["*"]
    options.notdef_outline = True
    options.layout_features = ["*"]
    options.drop_tables += ["FFTM"]
    sub = subset.Subsetter(options)
    sub.populate(text=text)
    sub.subset(font)
    out = io.BytesIO()
    font.save(out)
    return base64.b64encode(out.getvalue()).decode("ascii")


def embed_svg_fonts(svg: bytes) -> bytes:
    """Add an @font-face (subset TrueType, base64 data URL) for each font the SVG's <text> elements use, so the
    SVG looks the same on machines without DejaVu while its labels stay searchable text."""
    return embed_svg_fonts_together([svg])[0]


def embed_svg_fonts_together(svgs: list[bytes]) -> list[bytes]:
    """embed_svg_fonts for figures shown together (a report's): each font cut once to the glyphs of all of them
    (one subset a face instead of one a figure: ~0.7 s each for DejaVu Sans), each SVG given the faces it uses."""
    import logging

    logging.getLogger("fontTools.subset").setLevel(logging.ERROR)
    wanted = [_svg_fonts(svg) for svg in svgs]
    chars: dict[tuple[str, str, str], set[str]] = {}
    for faces in wanted:
        for face, used in faces.items():
            chars.setdefault(face, set()).update(used)
    css = {face: _font_face(face, text) for face, text in chars.items()}
    return [_with_faces(svg, [css[face] for face in sorted(faces) if css[face]]) for svg, faces in zip(svgs, wanted)]


def _svg_fonts(svg: bytes) -> dict[tuple[str, str, str], set[str]]:
    """The characters of the SVG's <text> elements by (family, weight, style)."""
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    wanted: dict[tuple[str, str, str], set[str]] = {}
    for el in root.iter(f"{ns}text"):
        style_attr = el.get("style", "")
        m = _FAMILY.search(style_attr)
        if not m:
            continue
        families = [f.strip().strip("'\"") for f in m.group(1).split(",")]
        weight = (_WEIGHT.search(style_attr) or [None, "normal"])[1]
        fstyle = (_STYLE.search(style_attr) or [None, "normal"])[1]
        chars = set("".join(el.itertext()))
        for fam in families:
            wanted.setdefault((fam, weight, fstyle), set()).update(chars)
    return wanted


def _font_face(face: tuple[str, str, str], chars: set[str]) -> str:
    """The @font-face rule of one (family, weight, style) cut to `chars` ("" for a family not found here: left to
    the viewer)."""
    from matplotlib.font_manager import FontProperties, findfont

    fam, weight, fstyle = face
    try:
        path = findfont(FontProperties(family=fam, weight=weight, style=fstyle), fallback_to_default=False)
    except Exception:  # noqa: BLE001 - a family we cannot find is left to the viewer
        return ""
    data = _subset_font(path, "".join(sorted(chars)) or " ")
    css_weight = "bold" if weight in ("bold", "700", "heavy", "black") else "normal"
    return (f"@font-face {{ font-family: '{fam}'; font-weight: {css_weight}; font-style: {fstyle}; "
            f"src: url(data:font/ttf;base64,{data}) format('truetype'); }}")


def _with_faces(svg: bytes, faces: list[str]) -> bytes:
    if not faces:
        return svg
    text = svg.decode("utf-8")
    css = "\n".join(faces)
    block = f'  <style type="text/css">{css}</style>\n'
    if "<defs>" in text:
        text = text.replace("<defs>\n", "<defs>\n" + block, 1) if "<defs>\n" in text else text.replace("<defs>", "<defs>" + block, 1)
    else:
        text = re.sub(r"(<svg[^>]*>)", lambda m: m.group(1) + "\n <defs>\n" + block + " </defs>", text, count=1)
    return text.encode("utf-8")


# ------------------------------------------------------------------------------------------------------------
# Tree
# ------------------------------------------------------------------------------------------------------------


def legend_columns(width: float) -> int:
    """Legend entries per row: about 2 in each (the longest, 'first rejected (drafter's candidates)')."""
    return max(1, min(4, int((width - 0.3) / 2.0)))


def legend_rows(width: float, entries: int = 6) -> int:
    return -(-entries // legend_columns(width))


MAX_PAGE_HEIGHT = paper.PAGE_HEIGHT_CM / paper.CM_PER_IN  # a tree's default height stays within a page (in), while
# its labels stay >= LABEL_MIN_PT
ROW_ABOVE = 0.42  # a row (in) with each label above its node and the rank under it
ROW_BESIDE = 0.15  # a row (in) with each label beside its node, on one line (7 pt)
LABEL_PT, LABEL_MIN_PT = paper.LABEL_SIZES[0], paper.MIN_LABEL_PT
MONO_EM = 0.602  # DejaVu Sans Mono's advance (em)
BAR_BELOW_IN = 5.0  # a figure narrower than this (a paper's column) has its colour bar under it, not beside it


def tree_margin(width: float) -> float:
    """Inches of a tree figure's width that are not depth columns: the colour bar beside it and its ticks (a wide
    figure), or the margins alone (a narrow one: its bar is under it)."""
    return 0.35 if width < BAR_BELOW_IN else 1.1


def _tree_extras(width: float, *, title: bool, caption: str | None, legend: bool) -> float:
    """Inches of a tree figure that are not rows: the depth axis, title, legend and caption."""
    h = 0.9 + (0.35 if title else 0) + (legend_rows(width) * 0.2 + 0.15 if legend else 0)
    h += 0.55 if width < BAR_BELOW_IN else 0  # the colour bar under the tree
    return h + (0.16 * len(caption_lines(caption, width)) + 0.12 if caption else 0)


def tree_size(layout: TreeLayout, width: float, *, title: bool, caption: str | None,
              legend: bool) -> tuple[float, float]:
    """Default figure height (inches) for a tree `width` inches wide (a paper's column by default: the export's
    width option): ROW_ABOVE a row (labels above the nodes) while that fits in MAX_PAGE_HEIGHT, else the labels beside
    the nodes (tree_style), rows as close as LABEL_MIN_PT text allows: a taller tree than that grows past the page
    (hide some with the filters). A tree too deep for its labels beside the nodes keeps them above, however tall
    (issue #65). It was 6 x 15 in for 33 nodes (issue #26)."""
    extras = _tree_extras(width, title=title, caption=caption, legend=legend)
    rows = layout.height
    h = ROW_ABOVE * rows + extras
    if h > MAX_PAGE_HEIGHT and _beside_fits(layout, width):
        dense = LABEL_MIN_PT * 1.35 / 72  # one line of the smallest label, and a gap
        h = max(MAX_PAGE_HEIGHT, dense * rows + extras) if ROW_BESIDE * rows + extras > MAX_PAGE_HEIGHT \
            else ROW_BESIDE * rows + extras
    return width, max(h, 2.4)


def _beside_fits(layout: TreeLayout, width: float) -> bool:
    """Whether a tree's whole labels and ranks fit beside their nodes, on one line, in its depth columns."""
    column = (width - tree_margin(width)) / (max(layout.width, 1) + 0.25)
    room = column - _beside_start(layout, 0.55) / 72
    return _chars_in(room, LABEL_MIN_PT) >= max(len(n.label) for n in layout.nodes) + 4


def _beside_start(layout: TreeLayout, scale: float) -> float:
    """Points from a node's centre to where a label beside it starts, for the widest marker in `layout` at `scale`
    (its outline at its thickest), and 1 pt kept clear at the column's end (_draw_nodes: its reach + 1.5 pt)."""
    roles = {n.role for n in layout.nodes}
    reach = max(MARKER_SIZE[r] * scale * REACH[MARKER[r]] + outline_width(r, True) / 2 for r in roles)
    return reach + 1.5 + 1.0


@dataclass(frozen=True)
class TreeStyle:
    """How a tree's nodes are labelled at a figure's size: above them (room for it) or beside them, one line."""

    beside: bool
    label_pt: float
    marker_scale: float  # of MARKER_SIZE
    label_chars: int | None  # labels cut to fit a depth column (None: as laid out)
    fits: bool = True  # False: even labels cut to MIN_CHARS at LABEL_MIN_PT overlap in a depth column
    column: float = 1.0  # in: a depth column
    row: float = ROW_ABOVE  # in: a row


MIN_CHARS = 3  # a label cut to fit keeps at least this many characters ('ab…')


def _chars_in(room: float, pt: float) -> int:
    """How many monospace characters at `pt` fit `room` inches."""
    return int(room / (MONO_EM * pt / 72) + 1e-9)


def tree_style(layout: TreeLayout, page: Page) -> TreeStyle:
    """The labels' placement, size and cut for the figure's size: above their nodes when the rows leave room
    (tree_size chose the height; a height set by hand gets the same treatment), at the largest of paper.LABEL_SIZES
    whose labels fit side by side in a row (paper.column_need), else cut to fit at the smallest; beside them otherwise,
    on one line, as large as the rows allow (7 pt) and smaller where a depth column is narrow."""
    rows, cols = layout.height, layout.width
    longest = max(len(n.label) for n in layout.nodes)
    points = [(n.x, n.y) for n in layout.nodes]

    def need(pt: float, chars: int) -> float:  # in: the depth column labels side by side need (paper.column_need)
        return paper.column_need(points, [min(len(n.label), chars) * MONO_EM * pt / 72 for n in layout.nodes], 0.06)

    pitch = (page.height - _tree_extras(page.width, title=bool(page.title), caption=page.caption,
                                        legend=page.legend)) / max(rows, 1)
    column = (page.width - tree_margin(page.width)) / (max(cols, 1) + 0.25)  # in: a depth column (the axes span cols + 0.25)
    at = dict(column=column, row=pitch)
    if pitch >= ROW_ABOVE * 0.9:
        for pt in paper.LABEL_SIZES:
            if need(pt, longest) <= column:
                return TreeStyle(False, pt, 1.0, None, **at)
        fit = [c for c in range(MIN_CHARS, longest) if need(LABEL_MIN_PT, c) <= column]
        return TreeStyle(False, LABEL_MIN_PT, 1.0, max(fit, default=MIN_CHARS), bool(fit), **at)
    top = max(LABEL_MIN_PT, min(7.0, pitch * 72 / 1.35))  # as large as the rows allow, smaller where a column is narrow
    scale = max(0.55, min(1.0, pitch * 72 * 0.8 / MARKER_SIZE["other"]))
    room = column - _beside_start(layout, scale) / 72
    pt = next((p for p in (top, 6.5, LABEL_MIN_PT) if p <= top and _chars_in(room, p) >= longest + 4), LABEL_MIN_PT)
    chars = _chars_in(room, pt)
    return TreeStyle(True, pt, scale, max(2, chars), chars >= 2, **at)


def tree_notes(layout: TreeLayout, page: Page, width, ranks: bool = True) -> list[str]:
    """What a tree figure says about its fit: labels cut (the most characters one kept), or too narrow even so; taller
    than a page."""
    tall = paper.too_tall(page.height * paper.CM_PER_IN)
    return _width_notes(layout, tree_style(layout, page), width, ranks) + ([tall] if tall else [])


def _width_notes(layout: TreeLayout, look: TreeStyle, width, ranks: bool) -> list[str]:
    if not look.fits:
        cols = max(layout.width, 1) + 0.25
        w = width_in(width)
        needed = tree_margin(w) + cols * (MIN_CHARS * MONO_EM * LABEL_MIN_PT / 72 + 0.06)
        return [paper.too_wide(width, needed * paper.CM_PER_IN)]
    kept = [len(_label_text(n, look, ranks)) - len(_rank_text(n, look, ranks)) for n in layout.nodes]
    cut = [k for k, n in zip(kept, layout.nodes) if k < len(n.label)]
    return [paper.cut_labels(width, max(cut))] if cut else []


def _rank_text(n, look: TreeStyle, ranks: bool) -> str:
    """A node's rank where it shares the label's line (beside its node): ' r3'."""
    return f" r{n.rank}" if look.beside and ranks and n.rank >= 0 else ""


def _label_text(n, look: TreeStyle, ranks: bool) -> str:
    """A node's label as drawn: cut to the depth column (look.label_chars, its rank's characters included beside)."""
    rank = _rank_text(n, look, ranks)
    if look.label_chars is None:
        return n.label + rank
    return shorten(n.label, max(1, look.label_chars - len(rank))) + rank


def tree_figure_mpl(layout: TreeLayout, fills: dict[int, str], scheme: Scheme, page: Page, *, cmin: float,
                    cmax: float, ranks: bool = True, path_label: bool = True) -> Figure:
    fig, host = _figure(page)
    ax = host.add_subplot()
    cols, rows = layout.width, layout.height

    _draw_edges(ax, layout, scheme)
    look = tree_style(layout, page)
    _draw_nodes(ax, layout, fills, scheme, ranks, look)

    ax.set_xlim(-0.5, cols - 0.5 + 0.25)
    ax.set_ylim(rows - 1 + 0.55, -0.6 if look.beside else -0.85)  # rows grow downward, as on the page
    ax.set_xticks(range(int(cols)))
    ax.set_xlabel("depth", fontsize=8)
    ax.tick_params(axis="x", labelsize=7, length=2)
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    ax.spines["bottom"].set_color("#999999")
    for x in range(int(cols)):
        ax.axvline(x, color="#eeeeee", lw=0.6, zorder=0)

    if any(n.logprob is not None for n in layout.nodes):
        cmap = ListedColormap(scale_samples(scheme.colorscale, 256))
        sm = ScalarMappable(norm=Normalize(cmin, cmax if cmax > cmin else cmin + 1e-6), cmap=cmap)
        if page.width < BAR_BELOW_IN:  # a column's figure: the depth columns take its whole width
            cb = host.colorbar(sm, ax=ax, location="bottom", fraction=0.04, pad=0.02, aspect=30, shrink=0.8)
        else:
            cb = host.colorbar(sm, ax=ax, fraction=0.035, pad=0.01, aspect=max(8, min(30, rows * 2.5)))
        if cb.solids is not None:
            cb.solids.set_rasterized(False)  # matplotlib rasterises long colour bars; keep the figure all vector
            cb.solids.set_edgecolor("face")  # no hairline seams between the bar's cells
        cb.set_label("drafter log-prob", fontsize=7)
        cb.ax.tick_params(labelsize=6)
        cb.outline.set_linewidth(0.4)
    if page.legend:
        _tree_legend(host, layout, scheme, page.width)
    _finish(ax, page)
    if path_label:
        _path_label(fig, ax, layout, scheme, look)
    return fig


def _path_label(fig: Figure, ax, layout: TreeLayout, scheme: Scheme, look: TreeStyle) -> None:
    """'accepted path' (or 'bonus') in italics beside the middle of a path edge (under or over it, or to a side;
    else further under or over, past the nodes' ranks and labels): the first such spot (layout.path_label_spots,
    in path order) where it is clear of every node, label and path edge, measured on the figure as laid out; none
    where nothing is clear (the legend names the path). Under the middle of the first edge it sat on the root and
    the first node's rank when the path ran straight (issue #65)."""
    with measuring(fig) as renderer:
        taken = [t.get_window_extent(renderer) for t in ax.texts]
        for n in layout.nodes:
            x, y = ax.transData.transform((n.x, n.y))
            r = marker_reach(n, look) * fig.dpi / 72
            taken.append(Bbox.from_extents(x - r, y - r, x + r, y + r))
        lines = [MplPath(ax.transData.transform([(layout.node(e.parent).x, layout.node(e.parent).y),
                                                 (layout.node(e.child).x, layout.node(e.child).y)]))
                 for e in layout.edges if edge_kind(e) != "edge"]
        near = ((0, -3, "center", "top"), (0, 3, "center", "bottom"), (4, 0, "left", "center"),
                (-4, 0, "right", "center"))
        far = ((0, -15, "center", "top"), (0, 16, "center", "bottom"))  # past the ranks under, the labels over
        for offsets in (near, far):
            if _path_label_at(ax, layout, scheme, offsets, (taken, lines, renderer)):
                return


@contextlib.contextmanager
def measuring(fig: Figure, max_pixels: float = 4e6):
    """A renderer that measures `fig` laid out as it will be saved (what it draws moved to its places), at a
    resolution of at most `max_pixels` (a box measured scales with it; an SVG of 100 x 100 in at 600 dpi would ask a
    raster of 14 GB), the figure's own dpi back after."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    dpi = fig.dpi
    fig.set_dpi(min(dpi, max(10.0, (max_pixels / (fig.get_figwidth() * fig.get_figheight())) ** 0.5)))
    try:
        with _quiet():
            fig.draw_without_rendering()
            yield FigureCanvasAgg(fig).get_renderer()
    finally:
        fig.set_dpi(dpi)


def _path_label_at(ax, layout: TreeLayout, scheme: Scheme, offsets, measured: tuple) -> bool:
    """The path's label at the first spot (a path edge's middle, in path order, moved by one of `offsets`, in
    points) inside the figure and clear of what is `measured` (the boxes taken, the path's lines, with the renderer
    that measured them); whether there was one."""
    fig, (taken, lines, renderer) = ax.get_figure(), measured
    for a, b, text in path_label_spots(layout):
        for dx, dy, ha, va in offsets:
            label = ax.annotate(text, ((a.x + b.x) / 2, (a.y + b.y) / 2), xytext=(dx, dy), textcoords="offset points",
                                ha=ha, va=va, fontsize=6.5, style="italic", color=scheme.path,
                                gid="ddt-path-label", zorder=4, annotation_clip=False)
            label.set_in_layout(False)
            box = label.get_window_extent(renderer)
            inside = fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1
            if inside and not any(box.overlaps(o) for o in taken) and not any(p.intersects_bbox(box) for p in lines):
                return True
            label.remove()
    return False


def _draw_edges(ax, layout: TreeLayout, scheme: Scheme) -> None:
    """Thin grey edges in one collection, then the accepted path's edges and the dashed bonus edge on top."""
    segs = [[(layout.node(e.parent).x, layout.node(e.parent).y), (layout.node(e.child).x, layout.node(e.child).y)]
            for e in edges_of(layout, "edge")]
    if segs:
        lc = LineCollection(segs, colors=edge_color(scheme, "edge"), linewidths=0.8, zorder=1)
        lc.set_gid("ddt-edges")
        ax.add_collection(lc)
    for e in layout.edges:
        kind = edge_kind(e)
        if kind == "edge":
            continue
        a, b = layout.node(e.parent), layout.node(e.child)
        if kind == "bonus":
            line = Line2D([a.x, b.x], [a.y, b.y], color=edge_color(scheme, kind), lw=1.3, ls=(0, (4, 2.5)), zorder=2,
                          gid="ddt-bonus-edge")
        else:
            line = Line2D([a.x, b.x], [a.y, b.y], color=edge_color(scheme, kind), lw=2.6, solid_capstyle="round",
                          zorder=2, gid=f"ddt-path-edge-{e.parent}-{e.child}")
        ax.add_line(line)


def outline_width(role: str, on_path: bool) -> float:
    """A node marker's outline, points: thick on the accepted path, the first rejected ones' a little thicker."""
    return 1.6 if path_outlined(role, on_path) else (0.9 if role == "first_rejected" else 0.5)


def marker_reach(node, look) -> float:
    """How far `node`'s marker reaches from its centre, in points, its outline included (REACH)."""
    return (MARKER_SIZE[node.role] * look.marker_scale * REACH[MARKER[node.role]]
            + outline_width(node.role, node.on_path) / 2)


def _draw_nodes(ax, layout: TreeLayout, fills: dict[int, str], scheme: Scheme, ranks: bool, look: TreeStyle) -> None:
    """One scatter per role in DRAW_ORDER, then each node's label: above it and its rank below, or (look.beside)
    beside it with its rank, one line."""
    for role in DRAW_ORDER:
        nodes = [n for n in layout.nodes if n.role == role]
        if not nodes:
            continue
        face = [fixed_fill(scheme, role) or fills[n.id] for n in nodes]
        edge = [outline_color(scheme, role, n.on_path) for n in nodes]
        lw = [outline_width(role, n.on_path) for n in nodes]
        sc = ax.scatter([n.x for n in nodes], [n.y for n in nodes], s=(MARKER_SIZE[role] * look.marker_scale) ** 2,
                        marker=MARKER[role], c=face, edgecolors=edge, linewidths=lw, zorder=3)
        sc.set_gid(f"ddt-nodes-{role}")
    # each label on a patch of the background over the edges it lies on: no line through its letters
    backing = dict(boxstyle="square,pad=0.08", facecolor=ax.get_facecolor(), edgecolor="none")
    for n in layout.nodes:
        at = (dict(xytext=(marker_reach(n, look) + 1.5, 0), ha="left", va="center") if look.beside else
              dict(xytext=(0, max(6.5, marker_reach(n, look) + 0.5)), ha="center", va="bottom"))  # above: past a star
        ax.annotate(_label_text(n, look, ranks), (n.x, n.y), textcoords="offset points", fontsize=look.label_pt,
                    family=MONO, gid=f"ddt-label-{n.id}", zorder=5, annotation_clip=False, bbox=backing, **at)
        if not look.beside and ranks and n.rank >= 0:  # (beside: the rank is in the label's line)
            ax.annotate(f"r{n.rank}", (n.x, n.y), xytext=(0, -6.5), textcoords="offset points", ha="center",
                        va="top", fontsize=5.5, color=scheme.text_muted, gid=f"ddt-rank-{n.id}", zorder=5)


def _tree_legend(host, layout: TreeLayout, scheme: Scheme, width: float) -> None:
    """The marker legend below the tree (the accepted entry drawn on a path edge), plus the bonus edge."""
    handles = []
    for entry in legend_entries(layout):
        role = entry.role
        face = fixed_fill(scheme, role) or "white"
        line = dict(color=scheme.path, lw=2.6) if role == "accepted" else dict(ls="")  # the path: marker on its edge
        handles.append(Line2D([], [], marker=MARKER[role], ms=MARKER_SIZE[role] * 0.8, mfc=face,
                              mec=outline_color(scheme, role, entry.on_path),
                              mew=1.2 if path_outlined(role, entry.on_path) else 0.6, label=entry.name, **line))
    if layout.phase == "verified":
        handles.append(Line2D([], [], color=scheme.path, lw=1.3, ls=(0, (4, 2.5)), label=EDGE_NAME["bonus"]))
    host.legend(handles=handles, loc="outside lower center", ncol=min(legend_columns(width), len(handles)),
                fontsize=6.5, frameon=False, handlelength=1.6, columnspacing=1.2)


# ------------------------------------------------------------------------------------------------------------
# Mask
# ------------------------------------------------------------------------------------------------------------

MAX_TICKS = style.MASK_MAX_TICKS


MASK_TICK_PT = 6
MASK_MARGIN_IN = 2.2  # a mask figure's width that is not cells: its row labels, axis label and margins


def mask_size(n: int, width: float, *, title: bool, caption: str | None) -> tuple[float, float]:
    """A mask `width` inches wide: its cells square, 0.16 in at most, the height they leave (at most 26 in)."""
    cell = mask_cell(n, width)
    return width, min(max(cell * n + 2.0 + (0.35 if title else 0) + 0.16 * len(caption_lines(caption, width)) + 0.12,
                          3.0), 26.0)


def mask_cell(n: int, width: float) -> float:
    """A mask's cell (in) at `width` inches: n tree positions and the prefix band across."""
    return max(0.0, min(0.16, (width - MASK_MARGIN_IN) / (n + 1)))


def mask_every(n: int, width: float) -> int:
    """A mask labels one position in this many: MAX_TICKS at most, and no closer than a line of its tick labels."""
    line = MASK_TICK_PT * 1.3 / 72
    return max(1, -(-n // MAX_TICKS), math.ceil(line / max(mask_cell(n, width), 1e-6) - 1e-9))


def mask_notes(n: int, width) -> list[str]:
    """What a mask figure says about its fit: labels thinned to fit, or cells too small to see."""
    w = width_in(width)
    if mask_cell(n, w) * paper.CM_PER_IN < 0.03:
        return [paper.too_wide(width, (MASK_MARGIN_IN + 0.03 / paper.CM_PER_IN * (n + 1)) * paper.CM_PER_IN)]
    every = mask_every(n, w)
    return [f"labels on one position in {every} to fit {paper.asked(width)} at {MASK_TICK_PT} pt"] \
        if every > max(1, -(-n // MAX_TICKS)) else []


def mask_figure_mpl(mask, row_labels: list[str], col_labels: list[str], accepted: list[int], scheme: Scheme,
                    page: Page) -> Figure:
    """Rows = tree positions (queries), columns = the committed prefix + tree positions (keys); dark = visible.
    Accepted rows outlined in the path colour, their labels starting with '✓'."""
    import numpy as np

    fig, host = _figure(page)
    ax = host.add_subplot()
    z = np.asarray(mask)
    n_rows, n_cols = z.shape
    # interpolation "none": PDF/SVG embed the mask's own cells (crisp at any zoom, fast), PNG draws them nearest
    ax.imshow(z, cmap=ListedColormap([scheme.mask_off, scheme.mask_on]), vmin=0, vmax=1, interpolation="none",
              aspect="equal")
    if n_rows <= 64:
        ax.set_xticks([x - 0.5 for x in range(1, n_cols)], minor=True)
        ax.set_yticks([y - 0.5 for y in range(1, n_rows)], minor=True)
        ax.grid(which="minor", color="white", lw=0.5)
        ax.tick_params(which="minor", length=0)
    every_r = every_c = mask_every(n_rows, page.width)
    ax.set_yticks(range(0, n_rows, every_r), [row_labels[i] for i in range(0, n_rows, every_r)], family=MONO,
                  fontsize=MASK_TICK_PT)
    ax.set_xticks(range(0, n_cols, every_c), [col_labels[i] for i in range(0, n_cols, every_c)], family=MONO,
                  fontsize=MASK_TICK_PT,
                  rotation=60, ha="left", rotation_mode="anchor")
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xlabel("keys", fontsize=7)
    ax.set_ylabel("queries (tree positions)", fontsize=7)
    ax.tick_params(length=1.5)
    for r in accepted:
        rect = Rectangle((-0.5, r - 0.5), n_cols, 1, fill=False, ec=scheme.path, lw=1.4, zorder=3)
        rect.set_gid(f"ddt-accepted-row-{r}")
        ax.add_patch(rect)
    for s in ax.spines.values():
        s.set_linewidth(0.4)
    _finish(ax, page)
    return fig


# ------------------------------------------------------------------------------------------------------------
# Acceptance per round
# ------------------------------------------------------------------------------------------------------------


def acceptance_figure_mpl(rounds: list[int], values: list[int], scheme: Scheme, page: Page) -> Figure:
    fig, host = _figure(page)
    ax = host.add_subplot()
    bars = ax.bar(rounds, values, width=0.8, color=scheme.bar, label="tokens per round", zorder=2)
    for r, bar in zip(rounds, bars):
        bar.set_gid(f"ddt-bar-{r}")
    if values:
        mean = sum(values) / len(values)
        ax.plot([rounds[0] - 0.5, rounds[-1] + 0.5], [mean, mean], color=scheme.mean, ls="--", lw=1.4,
                label=f"mean {mean:.2f}", gid="ddt-acceptance-mean", zorder=3)
    ax.set_xlabel("round", fontsize=8)
    ax.set_ylabel("tokens", fontsize=8)
    if len(rounds) <= 40 and len(rounds) * ACCEPTANCE_TICK_IN <= page.width - 1.0:  # each round's number fits
        ax.set_xticks(rounds)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    top = max(values, default=1)
    if top <= 16:
        ax.set_yticks(range(0, top + 1))
    ax.set_ylim(0, top + max(1.0, 0.3 * top))
    ax.tick_params(labelsize=7, length=2)
    ax.grid(axis="y", color="#eeeeee", lw=0.6, zorder=0)
    for side in ("right", "top"):
        ax.spines[side].set_visible(False)
    if page.legend:
        ax.legend(fontsize=7, frameon=False, loc="upper right")
    _finish(ax, page)
    return fig


ACCEPTANCE_TICK_IN = 0.22  # a round's number under its bar (up to 3 digits at 7 pt), with room around it


def acceptance_size(n: int, width: float, *, title: bool, caption: str | None) -> tuple[float, float]:
    return width, 2.8 + (0.3 if title else 0) + (0.16 * len(caption_lines(caption, width)) + 0.12 if caption else 0)


# ------------------------------------------------------------------------------------------------------------
# The drafter's grid
# ------------------------------------------------------------------------------------------------------------


GRID_MARGIN_IN = 2.0  # a grid figure's width that is not depth columns: rank ticks, axis label, colour bar


def grid_size(depths: int, k: int, width: float, *, title: bool, caption: str | None,
              note: str = "") -> tuple[float, float]:
    """A grid `width` inches wide, 0.26 in per rank row; its note's lines (wrapped to the width) and legend's rows."""
    h = 0.26 * k + 1.1 + (0.35 if title else 0) + 0.14 * len(note_lines(note, width)) + 0.18 * -(-3 // legend_columns(width))
    if caption:
        h += 0.16 * len(caption_lines(caption, width)) + 0.12
    return width, min(max(h, 2.4), 60.0)


def note_lines(note: str, width: float) -> list[str]:
    """A grid's note (where the walk stopped) wrapped to a figure `width` inches wide, at 7.5 pt."""
    return textwrap.wrap(_plain(note), max(30, int(width * 15))) if note else []


def grid_label(g, width: float) -> tuple[float, int | None, bool]:
    """(label size, labels cut to chars or None, fits): the largest of paper.LABEL_SIZES whose labels fit a cell of
    a grid `width` inches wide, else the smallest, its labels cut to the cell (MIN_CHARS at the least)."""
    room = (width - GRID_MARGIN_IN) / max(g.depths, 1) - 0.04
    longest = max((len(c.label) for c in g.cells), default=1)
    for pt in paper.LABEL_SIZES:
        if _chars_in(room, pt) >= longest:
            return pt, None, True
    chars = _chars_in(room, LABEL_MIN_PT)
    return LABEL_MIN_PT, max(MIN_CHARS, chars), chars >= MIN_CHARS


def grid_notes(g, width) -> list[str]:
    """What a grid figure says about its fit: labels cut (the most characters one kept), or too narrow even so."""
    pt, chars, fits = grid_label(g, width_in(width))
    if not fits:
        needed = GRID_MARGIN_IN + g.depths * (MIN_CHARS * MONO_EM * LABEL_MIN_PT / 72 + 0.04)
        return [paper.too_wide(width, needed * paper.CM_PER_IN)]
    cut = [len(shorten(c.label, chars)) for c in g.cells if chars is not None and len(c.label) > chars]
    return [paper.cut_labels(width, max(cut))] if cut else []


def width_in(width) -> float:
    """An export's width option ('column', 'full' or inches) in inches."""
    return paper.width_cm(width) / paper.CM_PER_IN


def grid_figure_mpl(g, scheme: Scheme, page: Page, *, cmin: float, cmax: float, note: str) -> Figure:
    """The grid (render.grid_view.GridData): cells coloured by log-prob on the scheme's scale, token labels in
    them (white on dark cells), taken cells framed (×n when several parents took one), the accepted path's cells
    outlined and joined, the target's token at the stop depth outlined dotted; `note` (where the walk stopped) under
    the axes."""
    import numpy as np

    fig, host = _figure(page)
    ax = host.add_subplot()
    z = np.array([[g.cell(d, r).logprob for d in range(1, g.depths + 1)] for r in range(g.k)])
    cmap = ListedColormap(scale_samples(scheme.colorscale, 256))
    norm = Normalize(cmin, cmax if cmax > cmin else cmin + 1e-6)
    ax.imshow(z, cmap=cmap, norm=norm, interpolation="none", aspect="auto",
              extent=(0.5, g.depths + 0.5, g.k - 0.5, -0.5))
    pt, chars, _ = grid_label(g, page.width)
    for c in g.cells:
        shade = (norm(c.logprob) - 0.5) * (1 if scheme.colorscale == "Greys" else -1)
        label = c.label if chars is None else shorten(c.label, chars)
        ax.text(c.depth, c.rank, label, ha="center", va="center", fontsize=pt, family=MONO,
                color="white" if shade > 0 else "black", gid=f"ddt-cell-{c.depth}-{c.rank}")
        if c.taken:
            ax.add_patch(Rectangle((c.depth - 0.47, c.rank - 0.45), 0.94, 0.9, fill=False, ec=scheme.rejected,
                                   lw=0.9, zorder=3, gid=f"ddt-taken-{c.depth}-{c.rank}"))
            if len(c.taken) > 1:
                ax.text(c.depth + 0.45, c.rank - 0.42, f"×{len(c.taken)}", ha="right", va="top", fontsize=4.5,
                        color="white" if norm(c.logprob) < 0.5 else "black", zorder=4)
    # the accepted path's cells outlined and joined across the column gaps, the stop's outlined dotted: a line, its
    # dots and an X drawn through the cells hid their tokens (issue #65, as on the page: grid_view.grid_spec)
    path = [(d, r) for d, r in g.path if r < g.k]  # a draft ranked past the recorded top k has no cell
    for d, r in path:
        ax.add_patch(Rectangle((d - 0.5, r - 0.48), 1.0, 0.96, fill=False, ec=scheme.path, lw=1.8, zorder=4,
                               gid=f"ddt-grid-path-{d}-{r}"))
    if len(path) > 1:
        joins = [[(d + 0.5, r), (d2 - 0.5, r2)] for (d, r), (d2, r2) in zip(path, path[1:])]
        lc = LineCollection(joins, colors=scheme.path, linewidths=1.8, zorder=4)
        lc.set_gid("ddt-grid-path-joins")
        ax.add_collection(lc)
    if g.stop_rank is not None:
        ax.add_patch(Rectangle((g.stop_depth - 0.5, g.stop_rank - 0.48), 1.0, 0.96, fill=False, ec=scheme.path,
                               lw=1.8, ls=(0, (1.2, 1.2)), zorder=5, gid="ddt-grid-stop"))
    ax.set_xticks(range(1, g.depths + 1))
    ax.set_yticks(range(g.k))
    ax.set_xlabel("\n".join(["depth", *note_lines(note, page.width)]), fontsize=7.5)
    ax.set_ylabel("drafter rank", fontsize=8)
    ax.tick_params(labelsize=7, length=2)
    if page.legend:
        sm = ScalarMappable(norm=norm, cmap=cmap)
        cb = host.colorbar(sm, ax=ax, fraction=0.035, pad=0.01)
        if cb.solids is not None:
            cb.solids.set_rasterized(False)
            cb.solids.set_edgecolor("face")
        cb.set_label("drafter log-prob", fontsize=7)
        cb.ax.tick_params(labelsize=6)
        cb.outline.set_linewidth(0.4)
        handles = [Rectangle((0, 0), 1, 1, fill=False, ec=scheme.rejected, lw=0.9, label="taken by the tree"),
                   Rectangle((0, 0), 1, 1, fill=False, ec=scheme.path, lw=1.8, label="accepted path"),
                   Rectangle((0, 0), 1, 1, fill=False, ec=scheme.path, lw=1.8, ls=(0, (1.2, 1.2)),
                             label="target's token at the stop")]
        host.legend(handles=handles, loc="outside lower center", ncol=min(3, legend_columns(page.width)), fontsize=6.5, frameon=False)
    _finish(ax, page)
    return fig

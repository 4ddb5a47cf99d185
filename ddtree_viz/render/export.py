"""Paper-ready export of one round of a trace: the draft tree (or the verify mask, or acceptance per round) as
SVG / PDF / PNG (matplotlib, no browser), TikZ, a self-contained interactive HTML page, or JSON.

    from ddtree_viz.render.export import export, export_figure, export_to_file
    svg = export_figure(trace, step=3, fmt="svg", colors="grayscale", max_depth=4)   # bytes
    export_to_file(trace, "fig/round3.tex", step="last", standalone=True)              # format from the suffix
    export(trace, 3, "tikz", width="full").size.describe()    # 'TikZ: 17.5 cm x 15.2 cm, 8 pt labels'

Paper figures (SVG, PDF, PNG, TikZ) are drawn at a paper's width: one column (8.5 cm) by default, the full text width,
or inches (render/paper.py); each says its size, and what did not fit, in its PrintSize.

`step` is the round as the page shows it: 1-based ("Round 1 of N" is the first), or "last". Every keyword is
an ExportOptions field and a `python -m ddtree_viz export` flag of the same name (min_logprob=-3 is
--min-logprob -3; show_title=False is --no-title; path_label / ranks / legend=False are --no-path-label, ...).

One layout feeds every backend: the tree comes from render.layout.tree_layout (positions, labels, roles), its
fills from layout.node_colors over the page's colour range (min drafter log-prob over the whole trace .. 0),
the default titles are the page's, and the HTML export *is* the page's plotly figure. So a figure exported from
a saved trace matches what the page showed for that round.
"""

from __future__ import annotations

import dataclasses
import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InputError, TraceError
from ..options import (COLOR_RANGES, DEFAULT_DPI, EXPORT_FIGURES, EXPORT_FORMATS, FIGURE_INCHES, PAPER_WIDTHS,
                       PAPER_WIDTHS_CM, SHOW_CHOICES)
from ..trace import SCHEMA_VERSION, StepRecord, Trace, step_from_dict, to_plain
from . import style
from .layout import PHASES, DEFAULT_LABEL_CHARS, TreeLayout, node_colors, tree_layout
from .mask_plot import default_title as _mask_title
from .mask_plot import mask_figure, shown_positions, tick_labels, verify_mask
from .paper import CM_PER_IN, PrintSize
from .scheme import SCHEME_NAMES, Scheme, get_scheme, hex_color
from .stats_view import ACCEPTANCE_TITLE, acceptance_figure
from .text import lookup, shorten, visible
from ..words import plural

FORMATS, FIGURES = EXPORT_FORMATS, EXPORT_FIGURES  # with PAPER_WIDTHS(_CM): the page reads them here
SUFFIXES = {".svg": "svg", ".pdf": "pdf", ".png": "png", ".tex": "tikz", ".tikz": "tikz", ".html": "html",
            ".htm": "html", ".json": "json"}
EXTENSION = {"svg": ".svg", "pdf": ".pdf", "png": ".png", "tikz": ".tex", "html": ".html", "json": ".json"}
MAX_PNG_PIXELS = 120_000_000
DEFAULT_PNG_PIXELS = 30_000_000  # the default dpi is lowered to keep a PNG under this (an explicit --dpi may go higher)
# SVG / PDF / PNG draw at most this many tree positions (the bonus included): matplotlib lays out every label, which
# takes seconds per thousand; a round of the page's largest budget (512) fits, a larger one is filtered first
MAX_FIGURE_POSITIONS = 1024
MASK_LABEL_CHARS = style.MASK_LABEL_CHARS  # the page's mask labels
EXPORT_FORMAT = "ddtree-viz round"  # the JSON export's "format" field


@dataclass(frozen=True)
class ExportOptions:
    """Everything an export can be asked for. Defaults give what the page shows for the round."""

    figure: str = "tree"  # tree | mask | acceptance (rounds 1..step, as on the page) | grid (the drafter's)
    phase: str = "verified"  # verified | drafted (the tree before verification: no path, no bonus)
    show: str = "text"  # node labels: token text (visible whitespace), token ids, or both
    colors: str = "colorblind"  # colorblind (the page's Okabe-Ito + viridis) | grayscale (print)
    min_logprob: float | None = None  # hide drafted nodes below this drafter log-prob (never the accepted path)
    max_depth: int | None = None  # hide drafted nodes deeper than this (never the accepted path)
    path_label: bool = True  # write "accepted path" along the path's first edge
    ranks: bool = True  # the drafter's rank under each node (r0, r1, ...)
    legend: bool = True  # marker legend + colour bar / colour key
    title: str | None = None  # None: the page's title for this figure
    show_title: bool = True
    caption: str | None = None
    label_chars: int | None = None  # cut labels to this many characters (default: 12 tree, 8 mask)
    color_range: str = "trace"  # trace: the page's (min log-prob over all rounds .. 0); round: this round's own
    dpi: int | None = None  # PNG resolution; None: 300, lowered for huge figures to stay under DEFAULT_PNG_PIXELS
    width: str | float | None = "column"  # a paper's column (8.5 cm), full (its text width, 17.5 cm), or inches
    height: float | None = None  # inches (default: sized to the figure at that width; TikZ: always)
    standalone: bool = False  # TikZ: a whole document that compiles alone, not a picture to \input

    def __post_init__(self) -> None:
        _choice("figure", self.figure, FIGURES)
        _choice("phase", self.phase, PHASES)
        _choice("show", self.show, SHOW_CHOICES)
        _choice("colors", self.colors, SCHEME_NAMES)
        _choice("color range", self.color_range, COLOR_RANGES)
        if self.max_depth is not None and (isinstance(self.max_depth, bool) or not isinstance(self.max_depth, int)
                                           or self.max_depth < 0):
            raise InputError(f"max depth must be a whole number >= 0, not {self.max_depth!r}")
        if self.min_logprob is not None and not (isinstance(self.min_logprob, (int, float)) and self.min_logprob == self.min_logprob):
            raise InputError(f"min log-prob must be a number, not {self.min_logprob!r}")
        if self.label_chars is not None and (not isinstance(self.label_chars, int) or self.label_chars < 1):
            raise InputError(f"label chars must be a whole number >= 1, not {self.label_chars!r}")
        lo, hi = FIGURE_INCHES
        if self.dpi is not None and (isinstance(self.dpi, bool) or not isinstance(self.dpi, int)
                                     or not 10 <= self.dpi <= 2400):
            raise InputError(f"dpi must be a whole number from 10 to 2400, not {self.dpi!r}")
        if isinstance(self.width, str) and self.width not in PAPER_WIDTHS:
            raise InputError(f"width must be {' or '.join(PAPER_WIDTHS)} or a number of inches, not {self.width!r}")
        for name in ("width", "height"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str) and not (
                    isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi):
                raise InputError(f"{name} must be from {lo:g} to {hi:g} inches, not {v!r}")

    def replace(self, **changes) -> "ExportOptions":
        return dataclasses.replace(self, **changes)


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InputError(f"{name} must be one of {', '.join(choices)}, not {value!r}")


def make_options(options: ExportOptions | None = None, **kwargs) -> ExportOptions:
    unknown = set(kwargs) - {f.name for f in dataclasses.fields(ExportOptions)}
    if unknown:
        raise TypeError(f"unknown export {'option' if len(unknown) == 1 else 'options'}: {', '.join(sorted(unknown))}")
    base = options or ExportOptions()
    return base.replace(**kwargs) if kwargs else base


# ------------------------------------------------------------------------------------------------------------
# Which round, which format
# ------------------------------------------------------------------------------------------------------------


def resolve_round(trace: Trace, step: int | str = "last") -> int:
    """The round as the page numbers it (1-based int or its text) or 'last' -> index into trace.steps.
    InputError naming the valid range when out of range."""
    n = len(trace.steps)
    if n == 0:
        raise InputError("the trace has no rounds to export (the session was prefilled but never stepped)")
    valid = f"this trace has {plural(n, 'round')}: use 1..{n} or 'last'"
    if isinstance(step, str):
        text = step.strip().lower()
        if text == "last":
            return n - 1
        try:
            step = int(text)
        except ValueError:
            raise InputError(f"step must be a round number or 'last', not {step!r} ({valid})") from None
    if isinstance(step, bool) or not isinstance(step, int):
        raise InputError(f"step must be a round number or 'last', not {step!r}")
    if not 1 <= step <= n:
        hint = " (rounds are numbered from 1, as on the page)" if step == 0 else ""
        raise InputError(f"step {step} is out of range{hint}: {valid}")
    return step - 1


def format_for(out: str | Path | None, fmt: str | None) -> str:
    """The format asked for, else the one the output file's suffix names."""
    if fmt is not None:
        _choice("format", fmt, FORMATS)
        return fmt
    suffix = Path(str(out)).suffix.lower() if out not in (None, "-") else ""
    if suffix in SUFFIXES:
        return SUFFIXES[suffix]
    raise InputError(f"cannot tell the format from {str(out)!r}: pass --format ({'|'.join(FORMATS)}) "
                     f"or use a suffix {', '.join(sorted(SUFFIXES))}")


def suggested_name(trace: Trace, k: int, fmt: str, figure: str = "tree") -> str:
    """A file name for a download: ddtree-round<N>-<figure>.<ext>."""
    return f"ddtree-round{k + 1}-{figure}{EXTENSION[fmt]}"


# ------------------------------------------------------------------------------------------------------------
# The shared pieces every backend draws from
# ------------------------------------------------------------------------------------------------------------


def token_text_of(trace: Trace):
    """id -> text from the trace's token_texts (every id a live session names), then the tree's own nodes."""
    texts = trace.token_texts
    return lookup(lambda i: texts.get(str(i)))


def page_color_range(trace: Trace) -> tuple[float, float]:
    """The page's colour range for tree fills: min drafter log-prob over every round .. 0 (page.views.render_views)."""
    lps = [n.logprob for s in trace.steps for n in s.nodes[1:]]
    return (min(lps) if lps else -1.0), 0.0


def relabel(layout: TreeLayout, show: str) -> TreeLayout:
    """The layout with each node's label as asked: text (the layout's own), ids, or both ('text id')."""
    if show == "text":
        return layout
    nodes = tuple(dataclasses.replace(n, label=str(n.token_id) if show == "ids" else f"{n.label} {n.token_id}")
                  for n in layout.nodes)
    return dataclasses.replace(layout, nodes=nodes)


@dataclass(frozen=True)
class TreeParts:
    layout: TreeLayout  # relabelled as asked
    fills: dict[int, str]  # id -> '#RRGGBB' (node_colors over the colour range)
    cmin: float
    cmax: float
    scheme: Scheme
    title: str | None  # None: no title
    caption: str | None


def tree_parts(trace: Trace, k: int, o: ExportOptions) -> TreeParts:
    step = trace.steps[k]
    chars = o.label_chars or DEFAULT_LABEL_CHARS
    layout = tree_layout(step, max_depth=o.max_depth, min_logprob=o.min_logprob, phase=o.phase,
                         token_text=token_text_of(trace), label_chars=chars)
    layout = relabel(layout, o.show)
    scheme = get_scheme(o.colors)
    cmin, cmax = page_color_range(trace) if o.color_range == "trace" else layout.logprob_range
    fills = {i: hex_color(c) for i, c in node_colors(layout, scheme.colorscale, cmin, cmax, scheme.neutral,
                                                     scheme.bonus).items()}
    from .tree_plot import default_title

    return TreeParts(layout, fills, cmin, cmax, scheme, _title(o, default_title(layout)), _caption(o))


def _title(o: ExportOptions, default: str) -> str | None:
    if not o.show_title:
        return None
    return o.title if o.title is not None else default


def _caption(o: ExportOptions) -> str | None:
    return o.caption if o.caption else None


def mask_labels(step: StepRecord, o: ExportOptions) -> tuple[list[str], list[str], list[int]]:
    """Row labels ('✓ ' for accepted rows in the verified phase), column labels (the prefix band first) and
    the accepted rows, as the page's mask shows them (unescaped: each backend escapes for its own format)."""
    return tick_labels(step, show=o.show, label_chars=o.label_chars or MASK_LABEL_CHARS, verified=o.phase == "verified")


@dataclass(frozen=True)
class GridParts:
    grid: Any  # render.grid_view.GridData
    fills: dict  # (depth, rank) -> '#RRGGBB' over the grid's own log-prob range, on the scheme's scale
    cmin: float
    cmax: float
    title: str | None
    note: str


def grid_parts(trace: Trace, k: int, o: ExportOptions) -> GridParts:
    """The drafter's grid of round k as every backend draws it; InputError when the round has none recorded."""
    from plotly.colors import get_colorscale, sample_colorscale

    from .grid_view import default_title, grid_data, stop_note

    try:
        g = grid_data(trace.steps[k], token_text_of(trace), o.label_chars or 6)
    except ValueError as exc:
        raise InputError(f"{exc}: export the tree instead") from None
    lo, hi = g.logprob_range
    scale = get_colorscale(get_scheme(o.colors).colorscale)
    fills = {(c.depth, c.rank): hex_color(sample_colorscale(
        scale, [0.5 if hi <= lo else min(max((c.logprob - lo) / (hi - lo), 0.0), 1.0)])[0]) for c in g.cells}
    return GridParts(g, fills, lo, hi, _title(o, default_title(g)), stop_note(g))


def _comment(trace: Trace, k: int, o: ExportOptions) -> str:
    s = trace.settings
    lines = [
        f"ddtree-viz export: {o.figure}, round {k + 1} of {len(trace.steps)}, phase {o.phase}, colours {o.colors}",
        f"target {visible(trace.target)}, draft {visible(trace.draft)}; method {s.get('method', '?')}, verify "
        f"{s.get('verify', '?')}, budget {s.get('budget', '?')}, block size {s.get('block_size', '?')}",
        f"prompt: {shorten(visible(trace.prompt), 80)}",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------------
# Entry points
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Exported:
    """An export's bytes and, for the paper formats (SVG, PDF, PNG, TikZ), its print size: PrintSize.describe() is the
    line the CLI prints and the page shows ('TikZ: 8.5 cm x 6.1 cm, 8 pt labels', and what did not fit)."""

    data: bytes
    size: PrintSize | None  # None for HTML and JSON


def export(trace: Trace, step: int | str = "last", fmt: str = "svg", options: ExportOptions | None = None,
           **kwargs) -> Exported:
    """One round of `trace` as `fmt` (text formats UTF-8) with its print size. `step`: 1-based round or 'last'.
    Keywords: ExportOptions fields. Raises InputError for a bad round or option."""
    _choice("format", fmt, FORMATS)
    o = make_options(options, **kwargs)
    k = resolve_round(trace, step)
    if fmt == "json":
        return Exported((json.dumps(round_json(trace, k, o), indent=1, ensure_ascii=False) + "\n").encode("utf-8"), None)
    if fmt == "html":
        return Exported(html_page(trace, k, o).encode("utf-8"), None)
    if fmt == "tikz":
        drawn = _tikz(trace, k, o)
        return Exported(drawn.text.encode("utf-8"), drawn.size)
    return Exported(*_matplotlib(trace, k, o, fmt))


def export_figure(trace: Trace, step: int | str = "last", fmt: str = "svg", options: ExportOptions | None = None,
                  **kwargs) -> bytes:
    """One round of `trace` as `fmt` bytes (export's, without the size)."""
    return export(trace, step, fmt, options, **kwargs).data


def export_to_file(trace: Trace, out: str | Path, step: int | str = "last", fmt: str | None = None,
                   options: ExportOptions | None = None, **kwargs) -> Path:
    """export_figure written to `out` (format from its suffix unless given). InputError if it cannot be written."""
    return _write(out, export(trace, step, format_for(out, fmt), options, **kwargs))[0]


def _write(out: str | Path, exported: Exported) -> tuple[Path, PrintSize | None]:
    path = Path(out)
    try:
        path.write_bytes(exported.data)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path, exported.size


# ------------------------------------------------------------------------------------------------------------
# SVG / PDF / PNG
# ------------------------------------------------------------------------------------------------------------


def _matplotlib(trace: Trace, k: int, o: ExportOptions, fmt: str) -> tuple[bytes, PrintSize]:
    """The figure's bytes and its print size (at the width asked for: mpl.width_in)."""
    from . import mpl

    step = trace.steps[k]
    scheme = get_scheme(o.colors)
    width = mpl.width_in(o.width)
    with mpl.rendering():
        if o.figure == "tree":
            parts = tree_parts(trace, k, o)
            shown = len(parts.layout.nodes)
            if shown > MAX_FIGURE_POSITIONS:
                raise InputError(
                    f"round {k + 1} would draw {shown} tree positions; an {fmt.upper()} figure draws at most "
                    f"{MAX_FIGURE_POSITIONS}: hide some with max depth / min log-prob (--max-depth, --min-logprob; the "
                    "accepted path always stays), or export html or json")
            size = mpl.tree_size(parts.layout, width, title=bool(parts.title), caption=parts.caption, legend=o.legend)
            page = _page(o, size, parts.title, parts.caption, fmt)
            fig = mpl.tree_figure_mpl(parts.layout, parts.fills, parts.scheme, page, cmin=parts.cmin, cmax=parts.cmax,
                                      ranks=o.ranks, path_label=o.path_label)
            meta = parts.title or f"ddtree-viz round {k + 1}"
            label_pt, notes = mpl.tree_style(parts.layout, page).label_pt, mpl.tree_notes(parts.layout, page, o.width,
                                                                                          o.ranks)
        elif o.figure == "mask":
            rows, cols, accepted = mask_labels(step, o)
            title = _title(o, _mask_title(step))
            page = _page(o, mpl.mask_size(len(rows), width, title=bool(title), caption=_caption(o)), title,
                         _caption(o), fmt)
            fig = mpl.mask_figure_mpl(verify_mask(step).tolist(), rows, cols, accepted, scheme, page)
            meta = title or f"ddtree-viz verify mask, round {k + 1}"
            label_pt, notes = mpl.MASK_TICK_PT, mpl.mask_notes(len(rows), o.width)
        elif o.figure == "grid":
            gp = grid_parts(trace, k, o)
            size = mpl.grid_size(gp.grid.depths, gp.grid.k, width, title=bool(gp.title), caption=_caption(o),
                                 note=gp.note)
            page = _page(o, size, gp.title, _caption(o), fmt)
            fig = mpl.grid_figure_mpl(gp.grid, scheme, page, cmin=gp.cmin, cmax=gp.cmax, note=gp.note)
            meta = gp.title or f"ddtree-viz drafter's grid, round {k + 1}"
            label_pt, notes = mpl.grid_label(gp.grid, page.width)[0], mpl.grid_notes(gp.grid, o.width)
        else:
            steps = trace.steps[: k + 1]
            title = _title(o, ACCEPTANCE_TITLE)
            page = _page(o, mpl.acceptance_size(len(steps), width, title=bool(title), caption=_caption(o)), title,
                         _caption(o), fmt)
            fig = mpl.acceptance_figure_mpl([s.index + 1 for s in steps], [s.kept for s in steps], scheme, page)
            meta = title or "ddtree-viz acceptance per round"
            label_pt, notes = 7, []
        data = mpl.save(fig, fmt, page, meta)
    return data, PrintSize(fmt.upper(), page.width * CM_PER_IN, page.height * CM_PER_IN, label_pt, tuple(notes))


def png_pixels(width: float, height: float, dpi: int) -> tuple[int, int]:
    """The PNG's exact size in pixels for a figure of width x height inches at dpi."""
    return round(width * dpi), round(height * dpi)


def _page(o: ExportOptions, default: tuple[float, float], title: str | None, caption: str | None, fmt: str):
    from . import mpl

    w = default[0]  # the width asked for (mpl.width_in)
    h = float(o.height) if o.height is not None else default[1]
    dpi = effective_dpi(o, w, h)
    if fmt == "png":
        px, py = png_pixels(w, h, dpi)
        if px * py > MAX_PNG_PIXELS:
            raise InputError(f"a {w:g} x {h:g} in PNG at {dpi} dpi would be {px} x {py} pixels (at most "
                             f"{MAX_PNG_PIXELS // 1_000_000} million): lower --dpi or the size, or export SVG/PDF (vector)")
        # matplotlib truncates width x dpi to whole pixels: nudge so it lands on the rounded size exactly
        w, h = (px + 1e-4) / dpi, (py + 1e-4) / dpi
    return mpl.Page(width=w, height=h, dpi=dpi, title=title, caption=caption, legend=o.legend)


def effective_dpi(o: ExportOptions, width: float, height: float) -> int:
    """The dpi asked for; by default 300, or less for a figure so large that its PNG would pass DEFAULT_PNG_PIXELS."""
    if o.dpi is not None:
        return o.dpi
    fit = int((DEFAULT_PNG_PIXELS / (width * height)) ** 0.5)
    return max(10, min(DEFAULT_DPI, fit))


# ------------------------------------------------------------------------------------------------------------
# TikZ
# ------------------------------------------------------------------------------------------------------------


def _tikz(trace: Trace, k: int, o: ExportOptions):
    """The picture (tikz.Drawn: its text and its print size), fitted to the width asked for."""
    from . import tikz, tikz_charts

    step = trace.steps[k]
    common = dict(standalone=o.standalone, width=o.width, comment=_comment(trace, k, o))
    if o.figure == "tree":
        p = tree_parts(trace, k, o)
        return tikz.tree_tikz(p.layout, p.fills, p.scheme, cmin=p.cmin, cmax=p.cmax, title=p.title, caption=p.caption,
                              ranks=o.ranks, path_label=o.path_label, legend=o.legend, **common)
    scheme = get_scheme(o.colors)
    if o.figure == "grid":
        gp = grid_parts(trace, k, o)
        return tikz_charts.grid_tikz(gp.grid, gp.fills, scheme, note=gp.note, title=gp.title, caption=_caption(o), **common)
    if o.figure == "mask":
        rows, cols, accepted = mask_labels(step, o)
        return tikz_charts.mask_tikz(verify_mask(step).tolist(), rows, cols, accepted, scheme,
                              title=_title(o, _mask_title(step)), caption=_caption(o), **common)
    steps = trace.steps[: k + 1]
    return tikz_charts.acceptance_tikz([s.index + 1 for s in steps], [s.kept for s in steps], scheme,
                                title=_title(o, ACCEPTANCE_TITLE), caption=_caption(o), **common)


# ------------------------------------------------------------------------------------------------------------
# HTML: the page's own plotly figure, plotly.js inlined, nothing loaded from anywhere
# ------------------------------------------------------------------------------------------------------------

# Belt and braces: the page would load nothing anyway, and this policy forbids it outright.
CSP = ("default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; "
       "img-src data: blob:; font-src data:; connect-src 'none'; base-uri 'none'; form-action 'none'")


def plotly_figure(trace: Trace, k: int, o: ExportOptions):
    """The page's plotly figure for this round and figure kind, drawn with the export's options."""
    from .tree_plot import tree_figure

    step = trace.steps[k]
    scheme = get_scheme(o.colors)
    if o.figure == "tree":
        p = tree_parts(trace, k, o)
        fig = tree_figure(p.layout, title=p.title or "", scheme=scheme, phase=o.phase, token_text=token_text_of(trace),
                          cmin=p.cmin, cmax=p.cmax, ranks=o.ranks, path_label=o.path_label, legend=o.legend)
    elif o.figure == "grid":
        from .grid_view import grid_figure

        gp = grid_parts(trace, k, o)
        fig = grid_figure(gp.grid, scheme=scheme, title=gp.title or "", legend=o.legend)
    elif o.figure == "mask":
        fig = mask_figure(step, scheme=scheme, show_accepted=o.phase == "verified",
                          title=_title(o, _mask_title(step)) or "", label_chars=o.label_chars or MASK_LABEL_CHARS,
                          legend=o.legend)
    else:
        fig = acceptance_figure(trace.steps[: k + 1], title=_title(o, ACCEPTANCE_TITLE) or "", scheme=scheme,
                                legend=o.legend)
    if o.width is not None and not isinstance(o.width, str):  # a paper's column or full width: the screen's instead
        fig.update_layout(width=int(o.width * 96))
    if o.height is not None:
        fig.update_layout(height=int(o.height * 96))
    return fig


def html_page(trace: Trace, k: int, o: ExportOptions) -> str:
    """A whole HTML document: the interactive figure with plotly.js inlined (no CDN), a caption and the round's
    provenance, all text escaped; a Content-Security-Policy that lets it load nothing from anywhere."""
    fig = plotly_figure(trace, k, o)
    name = Path(suggested_name(trace, k, "svg", o.figure)).stem
    div = fig.to_html(full_html=False, include_plotlyjs=True, include_mathjax=False, div_id=f"ddtree-{o.figure}",
                      config={"displaylogo": False, "responsive": True,
                              "toImageButtonOptions": {"format": "svg", "filename": name}})
    title = _title(o, f"ddtree-viz: round {k + 1} of {len(trace.steps)}") or f"ddtree-viz round {k + 1}"
    e = html.escape
    cap = f"<figcaption>{e(o.caption)}</figcaption>" if o.caption else ""
    s = trace.settings
    meta = (f"ddtree-viz export · {e(o.figure)} · round {k + 1} of {len(trace.steps)} · phase {e(o.phase)} · "
            f"target {e(visible(trace.target))} · draft {e(visible(trace.draft))} · method {e(str(s.get('method', '?')))} "
            f"· verify {e(str(s.get('verify', '?')))} · budget {e(str(s.get('budget', '?')))}")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{e(title)}</title>\n"
        "<style>body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}figure{margin:0}"
        "figcaption{margin-top:.6em;max-width:60em}.ddt-meta{color:#666;font-size:.85em}</style>\n"
        "</head>\n<body>\n<figure>\n" + div + "\n" + cap + "\n</figure>\n"
        f"<p class=\"ddt-meta\">{meta}</p>\n</body>\n</html>\n"
    )


# ------------------------------------------------------------------------------------------------------------
# JSON: the round's record and what is needed to read it alone
# ------------------------------------------------------------------------------------------------------------


def round_json(trace: Trace, k: int, o: ExportOptions) -> dict:
    """The round's StepRecord (as in the trace file) plus context: schema_version, the session's settings and
    models, the texts of every token id the round names, the options, and the drawn figure's data (the tree
    layout with positions, roles, labels and fill colours; the mask; or acceptance per round)."""
    step = trace.steps[k]
    text = token_text_of(trace)
    ids = sorted({n.token_id for n in step.nodes} | set(step.target_argmax) | set(step.target_choice)
                 | set(step.new_token_ids) | {step.bonus_token_id, step.root_token_id}
                 | {t for row in step.target_top_ids + step.draft_top_ids for t in row})
    node_text: dict[int, str] = {}
    for n in step.nodes:
        node_text.setdefault(n.token_id, n.token)
    tokens = {str(i): trace.token_texts.get(str(i), node_text[i] if i in node_text else text(i)) for i in ids}
    options = {f.name: getattr(o, f.name) for f in dataclasses.fields(ExportOptions)}
    p = tree_parts(trace, k, o)
    out: dict[str, Any] = {
        "format": EXPORT_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "round": k + 1,
        "rounds": len(trace.steps),
        "figure": o.figure,
        "phase": o.phase,
        "target": trace.target,
        "draft": trace.draft,
        "prompt": trace.prompt,
        "settings": to_plain(trace.settings),
        "options": options,
        "step": to_plain(step),
        "token_texts": tokens,
        "tree": {
            "title": p.title,
            "color_range": [p.cmin, p.cmax],
            "colorscale": p.scheme.colorscale,
            "hidden": p.layout.hidden,
            "nodes": [{"id": n.id, "parent": n.parent, "x": n.x, "y": n.y, "depth": n.depth, "role": n.role,
                       "on_path": n.on_path, "synthetic": n.synthetic, "token_id": n.token_id, "token": n.token,
                       "label": n.label, "rank": n.rank, "logprob": n.logprob, "fill": p.fills[n.id]}
                      for n in p.layout.nodes],
            "edges": [{"parent": e.parent, "child": e.child, "on_path": e.on_path, "synthetic": e.synthetic}
                      for e in p.layout.edges],
        },
    }
    if o.figure == "mask":
        out["mask"] = {"rows": "tree positions (queries)", "columns": "committed prefix, then tree positions (keys)",
                       "positions": shown_positions(step), "tree_positions": len(step.nodes),
                       "visible": verify_mask(step).tolist()}
    if o.figure == "acceptance":
        out["acceptance"] = [{"round": s.index + 1, "tokens": s.kept} for s in trace.steps[: k + 1]]
    if o.figure == "grid":
        gp = grid_parts(trace, k, o)
        out["grid"] = {"title": gp.title, "note": gp.note, "depths": gp.grid.depths, "k": gp.grid.k,
                       "color_range": [gp.cmin, gp.cmax],
                       "cells": [{"depth": c.depth, "rank": c.rank, "token_id": c.token_id, "token": c.token,
                                  "label": c.label, "logprob": c.logprob, "taken": list(c.taken), "on_path": c.on_path,
                                  "fill": gp.fills[(c.depth, c.rank)]} for c in gp.grid.cells],
                       "path": [list(p) for p in gp.grid.path],
                       "stop": {"depth": gp.grid.stop_depth, "rank": gp.grid.stop_rank}}
    out["analysis"] = round_analysis(step)
    return out


def round_analysis(step: StepRecord) -> dict:
    """Why the round stopped there (ddtree_viz.analysis): stop_info, the budget curve, and every node as the page's
    inspector shows it (JSON-ready: budget keys as strings, lists for tuples)."""
    from .. import analysis

    index = analysis.RoundIndex(step)  # one pass over the tree for every node's info
    return to_plain({
        "stop": analysis.stop_info(step),
        "budget_curve": {str(b): v for b, v in analysis.recorded_curve(step).items()},
        "budget_curve_exact": analysis.curve_is_exact(step),
        "nodes": [analysis.node_info(step, n.id, index) for n in step.nodes],
    })


def step_from_export(data: dict | str) -> StepRecord:
    """The StepRecord inside a JSON export (a dict or its text); TraceError when it is not one."""
    if isinstance(data, (str, bytes)):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise TraceError(f"not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise TraceError(f"not a ddtree-viz round export (no \"format\": \"{EXPORT_FORMAT}\")")
    version = data.get("schema_version")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise TraceError(f"the export has schema_version {version}, newer than this ddtree-viz understands "
                         f"({SCHEMA_VERSION})")
    return step_from_dict(data.get("step"), "step")


# ------------------------------------------------------------------------------------------------------------
# For the page: the round on screen, written to a fresh file with a meaningful name
# ------------------------------------------------------------------------------------------------------------


def export_round_file(trace: Trace | None, view: int, fmt: str, directory: str | Path | None = None,
                      **kwargs) -> Path:
    """export_round's file."""
    return export_round(trace, view, fmt, directory, **kwargs)[0]


def export_round(trace: Trace | None, view: int, fmt: str, directory: str | Path | None = None,
                 **kwargs) -> tuple[Path, PrintSize | None]:
    """Export the round the page shows (`view`: the page's 0-based round index) to
    <directory or a new temporary folder>/ddtree-round<N>-<figure>.<ext>; the file and its print size (None for HTML
    and JSON). InputError when there is nothing to export yet. Keywords: ExportOptions fields (the page passes phase,
    figure, show, colors, width, ...)."""
    import tempfile

    if trace is None or not trace.steps:
        raise InputError("nothing to export yet: step, run or replay a trace first")
    _choice("format", fmt, FORMATS)
    o = make_options(**kwargs)
    k = max(0, min(int(view), len(trace.steps) - 1))
    folder = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="ddtree-export-"))
    return _write(folder / suggested_name(trace, k, fmt, o.figure), export(trace, k + 1, fmt, o))


def optional_number(text: str | float | None, name: str, integer: bool = False) -> float | int | None:
    """A form field that may be blank: '' / None -> None, else the number (InputError naming the field)."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return None
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a number or blank, not {text!r}") from None
    if integer:
        if value != int(value):
            raise InputError(f"{name} must be a whole number or blank, not {text!r}")
        return int(value)
    return value

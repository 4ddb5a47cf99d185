"""TikZ backend: a `tikzpicture` to `\\input` into a paper, or (standalone=True) a document that compiles alone.

Drawn from the same TreeLayout as every other backend: a node's position is (layout x, layout y) in the
picture's own units (`x=` one depth column, `y=` one row, pointing down, both set once in the picture's
options), its fill the same colour the page's colour axis gives it (each an xcolor definition), its shape the
page's marker for its role.

Sized for a paper (render/paper.py, issue #65 item 4): each picture is fitted to a width (one column, 8.5 cm, by
default; the full text width; or any length) with its text at absolute sizes (\\fontsize: the same in a 10, 11 or
12 pt document): token labels at 8 pt, shrunk to 7 and 6 pt where the tree would not fit, and cut past that; the
legend at 7, ranks and ticks at 6, the title at 9, the caption at 8. The depth column and row (x=, y=) are chosen
for those sizes; the legend, title and caption are placed in centimetres under and over the tree. The picture's
size is measured from its contents (typewriter labels are 0.525 em a glyph), written in a comment ("% TikZ: 8.5 cm x
6.1 cm, 8 pt labels") and held by an invisible rectangle drawn first, so the picture is exactly that size; a
figure that does not fit says so there too (Drawn.size).

What the `\\input` variant needs in the preamble: `\\usepackage{tikz}` and `\\usetikzlibrary{shapes.geometric}`
(diamonds for the first rejected candidates, a star for the bonus token); `\\usepackage[T1]{fontenc}` is
recommended (typewriter glyphs for < > | " '). Everything else (colours, styles, the \\ddtuni helper) is
defined inside the picture, so nothing leaks into the document.

Token text is untrusted and shown with its whitespace visible: the page's visible glyphs become LaTeX
(space -> \\textvisiblespace, newline -> $\\hookleftarrow$, tab -> $\\rightarrow$, empty -> $\\emptyset$),
the ten specials `\\ { } _ % # & $ ^ ~` (and < > | " ' ` -) are escaped, Latin-1 / Latin Extended-A letters
stay as UTF-8, and any other character is written as \\ddtuni{HEX}{char}: the character itself in a Unicode (TU)
font (XeLaTeX, LuaLaTeX with fontspec), its code point (U+HEX) otherwise (pdfLaTeX, whose fonts lack it).
Labels are typewriter, and their ASCII specials are written as {\\charNN}: the real glyph (straight quotes, a
backslash) in OT1, T1 and TU alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from . import paper
from .layout import TreeLayout, edge_kind, legend_entries, path_label_at
from .scheme import Scheme, fixed_fill, hex_color, scale_samples
from .text import shorten

# ------------------------------------------------------------------------------------------------------------
# Escaping
# ------------------------------------------------------------------------------------------------------------

# ordinary text (titles, captions, legends): the ten specials and the characters OT1 fonts draw wrongly
_SPECIAL = {
    "\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "_": r"\_", "%": r"\%", "#": r"\#", "&": r"\&",
    "$": r"\$", "^": r"\textasciicircum{}", "~": r"\textasciitilde{}", "<": r"\textless{}", ">": r"\textgreater{}",
    "|": r"\textbar{}", '"': r"{\char34}", "`": r"\textasciigrave{}", "-": "-{}", "[": "{[}", "]": "{]}",
}
# token labels are typewriter (\ttfamily): its fonts have every ASCII glyph at its ASCII code in OT1, T1 and TU
# alike, so \char reaches the real glyph (a straight " and ', a real backslash) whatever the document's encoding
_SPECIAL_TT = {
    "\\": r"{\char92}", "{": r"{\char123}", "}": r"{\char125}", "_": r"{\char95}", "%": r"\%", "#": r"\#",
    "&": r"\&", "$": r"\$", "^": r"{\char94}", "~": r"{\char126}", "<": r"{\char60}", ">": r"{\char62}",
    "|": r"{\char124}", '"': r"{\char34}", "'": r"\textquotesingle{}", "`": r"{\char96}", "-": "{-}",
    "[": "{[}", "]": "{]}",
}
# the page's visible-whitespace glyphs (render.text.visible) and placeholders, in token labels
_LABEL_GLYPHS = {
    "·": r"\textvisiblespace{}", "⏎": r"\ensuremath{\hookleftarrow}", "⇥": r"\ensuremath{\rightarrow}",
    "∅": r"\ensuremath{\emptyset}", "…": r"\ldots{}", "⟨": r"\ensuremath{\langle}", "⟩": r"\ensuremath{\rangle}",
    "✓": r"\ensuremath{\surd}",
}
# the same glyphs in ordinary text (titles, captions, legends)
_TEXT_GLYPHS = {
    "·": r"\textperiodcentered{}", "…": r"\ldots{}", "–": "--", "—": "---", "×": r"\ensuremath{\times}",
    "≥": r"\ensuremath{\geq}", "≤": r"\ensuremath{\leq}", "✓": r"\ensuremath{\surd}", "⟨": r"\ensuremath{\langle}",
    "⟩": r"\ensuremath{\rangle}", "\n": " ", "\t": " ", "\r": " ",
}


def _char(ch: str, glyphs: dict[str, str], special: dict[str, str]) -> str:
    if ch in glyphs:
        return glyphs[ch]
    if ch in special:
        return special[ch]
    code = ord(ch)
    if code < 0x20 or code == 0x7F:  # control characters never reach TeX raw
        return rf"\textbackslash{{}}x{code:02x}"
    if code < 0x7F or 0xA1 <= code <= 0x17F:  # ASCII and Latin-1 / Latin Extended-A: every engine has them
        return ch
    if 0xD800 <= code <= 0xDFFF:  # a lone surrogate cannot even be written as UTF-8
        return rf"\textbackslash{{}}u{code:04x}"
    return rf"\ddtuni{{{code:04X}}}{{{ch}}}"


def latex_label(label: str) -> str:
    """A layout label (visible() text: '·' = space, '⏎' = newline, ...) -> LaTeX, every special escaped."""
    return "".join(_char(ch, _LABEL_GLYPHS, _SPECIAL_TT) for ch in label)


def latex_text(text: str) -> str:
    """Ordinary text (a title, a caption) -> LaTeX, every special escaped; newlines become spaces."""
    return "".join(_char(ch, _TEXT_GLYPHS, _SPECIAL) for ch in text)


# ------------------------------------------------------------------------------------------------------------
# Shared pieces
# ------------------------------------------------------------------------------------------------------------

# a character beyond Latin Extended-A: itself in a Unicode (TU) font, its code point otherwise (pdfLaTeX's fonts
# lack it, and its UTF-8 bytes are never typeset there, so there is no "Unicode character not set up" error)
DDTUNI = (r"\providecommand\ddtuni[2]{{\edef\ddtenc{\csname f@encoding\endcsname}\def\ddttu{TU}"
          r"\ifx\ddtenc\ddttu #2\else{\sffamily\fontsize{5}{6}\selectfont U+#1}\fi}}")

PREAMBLE_NOTE = (
    "% needs in the preamble: \\usepackage{tikz} \\usetikzlibrary{shapes.geometric}"
    " (recommended: \\usepackage[T1]{fontenc})\n"
)

# A document that compiles alone: the standalone class where installed (every full TeX Live, MiKTeX, Overleaf),
# else article with the picture shipped out on a page of its own size (minimal TeX installations).
STANDALONE_HEAD = r"""\IfFileExists{standalone.cls}{\def\ddtclass{standalone}}{\def\ddtclass{article}}
\def\ddtstandalone{standalone}
\ifx\ddtclass\ddtstandalone
  \documentclass[tikz,border=4pt]{standalone}
  \newcommand\ddtpage[1]{#1}
\else
  \documentclass{article}
  \newsavebox\ddtpagebox
  \newcommand\ddtpage[1]{\sbox\ddtpagebox{#1}%
    \ifdefined\pdfpagewidth
      \pdfpagewidth=\dimexpr\wd\ddtpagebox+8pt\relax \pdfpageheight=\dimexpr\ht\ddtpagebox+\dp\ddtpagebox+8pt\relax
    \else
      \pagewidth=\dimexpr\wd\ddtpagebox+8pt\relax \pageheight=\dimexpr\ht\ddtpagebox+\dp\ddtpagebox+8pt\relax
    \fi
    \hoffset=-1in \voffset=-1in
    \shipout\vbox{\kern4pt\hbox{\kern4pt\usebox\ddtpagebox\kern4pt}\kern4pt}}
\fi
\usepackage{tikz}
\usetikzlibrary{shapes.geometric}
\def\ddtlegacyfonts{\usepackage[T1]{fontenc}\IfFileExists{lmodern.sty}{\usepackage{lmodern}}{}}
\ifx\directlua\undefined
  \ifx\XeTeXrevision\undefined \ddtlegacyfonts % pdfLaTeX
  \else \usepackage{fontspec} % XeLaTeX: Unicode fonts
  \fi
\else % LuaLaTeX: Unicode fonts where luaotfload is installed
  \IfFileExists{luaotfload.sty}{\usepackage{fontspec}}{\ddtlegacyfonts}
\fi
\begin{document}
\ddtpage{%
"""
STANDALONE_TAIL = "}\n\\end{document}\n"



def _num(v: float) -> str:
    s = f"{v:.3f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def _cm(x: float, y: float) -> str:
    """A point in centimetres on the canvas (y up), whatever the picture's x= and y= are."""
    return f"({_num(x)}cm,{_num(y)}cm)"


def _font(family: str, pt: float) -> str:
    """A font at an absolute size (the same in a 10, 11 or 12 pt document): e.g. \\ttfamily at 8 pt."""
    return rf"\{family}\fontsize{{{_num(pt)}}}{{{_num(pt * 1.2)}}}\selectfont"


def _color_defs(colors: dict[str, str]) -> list[str]:
    return [rf"\definecolor{{{name}}}{{HTML}}{{{hex_color(c)[1:]}}}" for name, c in colors.items()]


def _header(opts: list[str], comment: str) -> list[str]:
    """The comment's lines, the preamble note and the picture's opening with its options."""
    header = [f"% {line}" for line in comment.splitlines()] if comment else []
    return header + [PREAMBLE_NOTE.rstrip("\n"), r"\begin{tikzpicture}[", "  " + ",\n  ".join(opts) + "]", DDTUNI]


TITLE_PT, CAPTION_PT, LEGEND_PT, SMALL_PT = 9, 8, 7, 6  # the picture's other text: title, caption, legend, ranks/ticks
_WHOLE_WORDS = r"execute at begin node={\hyphenpenalty=10000 \exhyphenpenalty=10000 }"  # wrapped, never hyphenated
TEXT_STYLES = [rf"ddt title/.style={{font={_font('sffamily', TITLE_PT)}, align=center, inner sep=0pt, {_WHOLE_WORDS}}}",
               rf"ddt caption/.style={{font={_font('sffamily', CAPTION_PT)}, align=left, inner sep=0pt, {_WHOLE_WORDS}}}"]


# ------------------------------------------------------------------------------------------------------------
# Sizes: what the picture's text measures (cm, paper.py's rules), and its frame
# ------------------------------------------------------------------------------------------------------------

# the width, in typewriter glyphs, of what latex_label writes for the page's wider glyphs; any other character is
# one glyph, a control character four (\x1b), a lone surrogate six (\ud800)
_WIDE_GLYPHS = {"⏎": 2.8, "⇥": 2.4, "∅": 1.3, "…": 3, "✓": 2}  # math glyphs are wider at small sizes
UNI_PT = 5  # \ddtuni's U+HEX under pdfLaTeX


def _char_pt(ch: str, pt: float) -> float:
    code = ord(ch)
    if ch in _WIDE_GLYPHS:
        return _WIDE_GLYPHS[ch] * paper.TT_EM * pt
    if ch in _LABEL_GLYPHS or ch in _SPECIAL_TT or 0x20 <= code < 0x7F or 0xA1 <= code <= 0x17F:
        return paper.TT_EM * pt
    if code < 0x20 or code == 0x7F or 0xD800 <= code <= 0xDFFF:
        return (4 if code < 0xD800 else 6) * paper.TT_EM * pt
    return max(pt, (2 + len(f"{code:04X}")) * 0.75 * UNI_PT)  # U+HEX in small sans (pdfLaTeX), the glyph (Unicode)


def label_pt(label: str, pt: float) -> float:
    r"""How wide latex_label(label) prints in typewriter at `pt`, in points (generous for the glyphs it draws
    otherwise: math symbols, \ddtuni)."""
    return sum(_char_pt(ch, pt) for ch in label)


def label_cm(label: str, pt: float, inner_pt: float = 1.0) -> float:
    """The width of a typewriter label node at `pt` (its inner sep on both sides), cm."""
    return (label_pt(label, pt) + 2 * inner_pt) * paper.CM_PER_PT


def cut_label(label: str, pt: float, glyphs: int) -> str:
    """`label` shortened (ending in '…') to at most `glyphs` typewriter glyphs wide at `pt`."""
    k, room = len(label), glyphs * paper.TT_EM * pt + 1e-9
    while k > 1 and label_pt(shorten(label, k), pt) > room:
        k -= 1
    return shorten(label, k)


def label_glyphs(label: str, pt: float) -> int:
    """label_pt in typewriter glyphs (rounded up)."""
    return math.ceil(label_pt(label, pt) / (paper.TT_EM * pt) - 1e-9)


@dataclass(frozen=True)
class Box:
    """A rectangle on the canvas, cm, y up."""

    x0: float
    y0: float  # bottom
    x1: float
    y1: float  # top

    @property
    def width(self) -> float:
        return self.x1 - self.x0

    @property
    def height(self) -> float:
        return self.y1 - self.y0


class Drawn(NamedTuple):
    """A picture's text and what it says about its size."""

    text: str
    size: paper.PrintSize


def _frame(box: Box, target_cm: float, title: str | None, caption: str | None) -> tuple[list[str], Box]:
    """The (title) above `box` and the (caption) below it, each wrapped to the picture's width (the box's, widened
    up to target_cm, about its middle, for a long one): their nodes, and the whole picture's box."""
    natural = max(paper.sans_cm(title or "", TITLE_PT), paper.sans_cm(caption or "", CAPTION_PT))
    grow = max(0.0, min(target_cm, natural) - box.width) / 2
    b = Box(box.x0 - grow, box.y0, box.x1 + grow, box.y1)
    out = []
    if title:
        out.append(rf"\node[ddt title, anchor=south, text width={_num(b.width)}cm] (title) at "
                   rf"{_cm((b.x0 + b.x1) / 2, b.y1 + 0.2)} {{{latex_text(title)}}};")
        b = Box(b.x0, b.y0, b.x1, b.y1 + 0.2 + paper.lines(title, TITLE_PT, b.width) * TITLE_PT * 1.2 * paper.CM_PER_PT)
    if caption:
        out.append(rf"\node[ddt caption, anchor=north west, text width={_num(b.width)}cm] (caption) at "
                   rf"{_cm(b.x0, b.y0 - 0.25)} {{{latex_text(caption)}}};")
        b = Box(b.x0, b.y0 - 0.25 - paper.lines(caption, CAPTION_PT, b.width) * CAPTION_PT * 1.2 * paper.CM_PER_PT,
                b.x1, b.y1)
    return out, b


def _sized(body: list[str], header: list[str], standalone: bool, box: Box, size: paper.PrintSize) -> Drawn:
    """The picture closed and wrapped (a whole document when standalone), its size said in a comment and set by an
    invisible rectangle first: the picture is that box wherever its contents stay inside it, as they are measured to."""
    frame = [f"% {size.describe()}", rf"\path {_cm(box.x0, box.y0)} rectangle {_cm(box.x1, box.y1)};"
             "  % the picture's size (an invisible rectangle)"]
    return Drawn(_wrap(frame + [b for b in body if b] + [r"\end{tikzpicture}"], header, standalone), size)


def _print_size(box: Box, label_pt: float | None, notes: list[str | None]) -> paper.PrintSize:
    return paper.PrintSize("TikZ", box.width, box.height, label_pt, tuple(n for n in notes if n))


def _wrap(body: list[str], header: list[str], standalone: bool) -> str:
    text = "\n".join(header + body) + "\n"
    if standalone:  # the picture's line ends in % there: no space after it on its page
        return ("% ddtree-viz: compiles alone with pdflatex, lualatex or xelatex\n" + STANDALONE_HEAD + text[:-1] + "%\n"
                + STANDALONE_TAIL)
    return text


# ------------------------------------------------------------------------------------------------------------
# Tree
# ------------------------------------------------------------------------------------------------------------

ROLE_STYLE = {"root": "ddt root", "accepted": "ddt accepted", "first_rejected": "ddt first rejected",
              "bonus": "ddt bonus", "other": "ddt other"}
EDGE_STYLE = {"edge": "ddt edge", "path": "ddt path edge", "bonus": "ddt bonus edge"}  # by layout.edge_kind
NODE_HALF_PT = {"root": 4.5, "accepted": 4.7, "first_rejected": 5.6, "bonus": 6.8, "other": 4.5}  # outline in
COLUMN_CM = (0.45, 2.5)  # a depth column (x=): at least, and the most a shallow tree spreads to
LABEL_GAP_CM = 0.12  # between two labels side by side
MIN_GLYPHS = 4  # a label cut to fit the width keeps at least one character and '…' (three glyphs wide in LaTeX)


@dataclass(frozen=True)
class TreeFit:
    """How a tree fits a width: its labels' size (and cut), its depth column and row (the picture's x= and y=)."""

    label_pt: int
    glyphs: int | None  # labels cut to at most this many glyphs (None: whole)
    column_cm: float
    row_cm: float
    fits: bool  # False: wider than asked even at MIN_LABEL_PT with labels cut to MIN_GLYPHS


def _labels(layout: TreeLayout, pt: float, glyphs: int | None) -> list[str]:
    return [n.label if glyphs is None else cut_label(n.label, pt, glyphs) for n in layout.nodes]


def _row_cm(pt: float, ranks: bool) -> float:
    """A row (y=): a node, its label above it and its rank under it, and room between the rows."""
    return (9.4 + 2 + pt + (1 + 0.8 * SMALL_PT if ranks else 0) + 2.5) * paper.CM_PER_PT


def _spans(layout: TreeLayout, labels: list[str], pt: float, ranks: bool, path_label: bool):
    """(x, half width in cm) of everything laid along a depth column: each node with its label and rank, and the
    path's label (at its edge's middle)."""
    pt_cm = paper.CM_PER_PT
    out = []
    for n, lab in zip(layout.nodes, labels):
        h = max(label_cm(lab, pt) / 2, NODE_HALF_PT[n.role] * pt_cm)
        if ranks and n.rank >= 0:
            h = max(h, paper.sans_cm(f"r{n.rank}", SMALL_PT) / 2 + pt_cm)
        out.append((n.x, h))
    spot = path_label_at(layout) if path_label else None
    if spot is not None:
        out.append(((spot[0].x + spot[1].x) / 2, paper.sans_cm(spot[2], SMALL_PT) / 2 + pt_cm))
    return out


def _column_need(layout: TreeLayout, labels: list[str], pt: float, ranks: bool) -> float:
    """The narrowest depth column (cm) at which nothing side by side in a row touches (paper.column_need): labels
    (LABEL_GAP_CM apart), ranks and markers (closer)."""
    points, pt_cm = [(n.x, n.y) for n in layout.nodes], paper.CM_PER_PT
    need = paper.column_need(points, [label_cm(lab, pt) for lab in labels], LABEL_GAP_CM)
    need = max(need, paper.column_need(points, [2 * NODE_HALF_PT[n.role] * pt_cm for n in layout.nodes], 0.03))
    if ranks:
        need = max(need, paper.column_need(points, [paper.sans_cm(f"r{n.rank}", SMALL_PT) if n.rank >= 0 else 0.0
                                                    for n in layout.nodes], 0.06))
    return need


def _extent(spans, u: float) -> tuple[float, float]:
    return min(x * u - h for x, h in spans), max(x * u + h for x, h in spans)


def fit_tree(layout: TreeLayout, target_cm: float, ranks: bool = True, path_label: bool = True) -> TreeFit:
    """The largest labels (paper.LABEL_SIZES, whole, then cut at the smallest) whose tree fits `target_cm`, its depth
    columns as wide as labels side by side in a row need; a shallow tree spreads to COLUMN_CM[1]."""
    def attempt(pt: int, glyphs: int | None):
        labels = _labels(layout, pt, glyphs)
        spans = _spans(layout, labels, pt, ranks, path_label)
        u = max(COLUMN_CM[0], _column_need(layout, labels, pt, ranks))
        lo, hi = _extent(spans, u)
        return spans, u, hi - lo <= target_cm + 1e-9

    def fitted(pt: int, glyphs: int | None, spans, u: float) -> TreeFit:
        def fits(v: float) -> bool:
            lo, hi = _extent(spans, v)
            return hi - lo <= target_cm + 1e-9

        low, high = u, max(u, COLUMN_CM[1])  # the widest column up to COLUMN_CM[1] that keeps the tree in the width
        if not fits(high):
            for _ in range(40):
                low, high = ((low + high) / 2, high) if fits((low + high) / 2) else (low, (low + high) / 2)
            high = low
        return TreeFit(pt, glyphs, high, _row_cm(pt, ranks), True)

    for pt in paper.LABEL_SIZES:
        spans, u, ok = attempt(pt, None)
        if ok:
            return fitted(pt, None, spans, u)
    pt = paper.MIN_LABEL_PT
    longest = max(label_glyphs(n.label, pt) for n in layout.nodes)
    lo, hi = MIN_GLYPHS, longest - 1  # cut: the most glyphs that fit (bisection; fewer glyphs, narrower)
    best = None
    while lo <= hi:
        mid = (lo + hi) // 2
        spans, u, ok = attempt(pt, mid)
        if ok:
            best, lo = (mid, spans, u), mid + 1
        else:
            hi = mid - 1
    if best is not None:
        return fitted(pt, best[0], best[1], best[2])
    glyphs = MIN_GLYPHS if longest > MIN_GLYPHS else None
    spans, u, _ = attempt(pt, glyphs)
    return TreeFit(pt, glyphs, u, _row_cm(pt, ranks), False)


def _tree_styles(fit: TreeFit) -> list[str]:
    return [
        f"x={_num(fit.column_cm)}cm", f"y=-{_num(fit.row_cm)}cm",  # y points down, as the layout's rows do
        "ddt node/.style={draw=ddtoutline, line width=0.4pt, inner sep=0pt, minimum size=8pt}",
        "ddt on path/.style={draw=ddtpath, line width=1.4pt}",
        "ddt root/.style={ddt node, rectangle, fill=ddtneutral, minimum size=7.5pt}",
        "ddt accepted/.style={ddt node, circle}",
        "ddt first rejected/.style={ddt node, diamond, minimum size=9.5pt, draw=ddtrejected, line width=0.8pt}",
        "ddt bonus/.style={ddt node, star, star points=5, star point ratio=2.2, minimum size=12pt, fill=ddtbonus, "
        "draw=ddtpath, line width=1pt}",
        "ddt other/.style={ddt node, circle}",
        rf"ddt label/.style={{font={_font('ttfamily', fit.label_pt)}, inner sep=1pt}}",
        rf"ddt rank/.style={{font={_font('sffamily', SMALL_PT)}, text=ddtmuted, inner sep=0.5pt}}",
        "ddt edge/.style={draw=ddtedge, line width=0.5pt}",
        "ddt path edge/.style={draw=ddtpath, line width=2pt}",
        "ddt bonus edge/.style={draw=ddtpath, line width=1pt, dashed}",
        rf"ddt path label/.style={{font={_font('sffamily', SMALL_PT)}\itshape, text=ddtpath, inner sep=1pt}}",
        *TEXT_STYLES,
        rf"ddt legend/.style={{font={_font('sffamily', LEGEND_PT)}, anchor=west, inner sep=1pt}}",
    ]


def tree_tikz(layout: TreeLayout, fills: dict[int, str], scheme: Scheme, *, cmin: float, cmax: float,
              title: str | None = None, caption: str | None = None, ranks: bool = True, path_label: bool = True,
              legend: bool = True, standalone: bool = False, width: str | float | None = "column",
              comment: str = "") -> Drawn:
    """One `tikzpicture` fitted to `width` (a paper's 'column', 'full', or inches: fit_tree): one `\\node` per layout
    node named (nID), edges drawn first (so filled nodes sit on top), accepted path edges with style `ddt path
    edge`, the bonus edge dashed. Title / caption are `\\node`s named (title) / (caption); the legend and colour key
    use `node`s on `\\path`s. Its size (and what did not fit) comes with it."""
    target = paper.width_cm(width)
    fit = fit_tree(layout, target, ranks, path_label)
    path_label = path_label and _path_label_fits(layout, fit)
    colors = {"ddtpath": scheme.path, "ddtedge": scheme.edge, "ddtrejected": scheme.rejected,
              "ddtoutline": scheme.outline, "ddtneutral": scheme.neutral, "ddtbonus": scheme.bonus,
              "ddtmuted": scheme.text_muted}
    fill_names = {}
    for n in layout.nodes:
        if fixed_fill(scheme, n.role) is None:  # filled by its log-prob
            fill_names[n.id] = f"ddtfill{n.id}"
            colors[fill_names[n.id]] = fills[n.id]
    header = _header(_tree_styles(fit), comment)
    body = _color_defs(colors)
    body += _tree_body(layout, fit, fill_names, ranks, path_label)

    labels = _labels(layout, fit.label_pt, fit.glyphs)
    lo, hi = _extent(_spans(layout, labels, fit.label_pt, ranks, path_label), fit.column_cm)
    top, bottom = _tree_rows(layout, fit, ranks, path_label)
    box = Box(lo, bottom, hi, top)
    if legend:
        lines, box = _tree_legend(layout, box, max(target, box.width), cmin, cmax, scheme)
        body += lines
    text, box = _frame(box, target, title, caption)
    size = _print_size(box, fit.label_pt, [None if fit.fits else paper.too_wide(width, box.width),
                                           _cut_note(width, labels, layout) if fit.fits and fit.glyphs else None,
                                           paper.too_tall(box.height)])
    return _sized(body + text, header, standalone, box, size)


def _path_label_fits(layout: TreeLayout, fit: TreeFit) -> bool:
    """Whether 'accepted path' fits along the path's first edge at the fitted spacing (else it is left out: the
    legend names the path, and a label longer than its edge lies over its neighbours)."""
    spot = path_label_at(layout)
    if spot is None:
        return False
    a, b, what = spot
    edge = math.hypot((b.x - a.x) * fit.column_cm, (b.y - a.y) * fit.row_cm)
    return paper.sans_cm(what, SMALL_PT) <= edge - 2 * NODE_HALF_PT["accepted"] * paper.CM_PER_PT


def _cut_note(width, labels: list[str], layout: TreeLayout) -> str | None:
    """The note of labels cut to fit, naming the most characters a cut one kept; None when none was cut."""
    cut = [len(a) for a, n in zip(labels, layout.nodes) if a != n.label]
    return paper.cut_labels(width, max(cut)) if cut else None


def _tree_body(layout: TreeLayout, fit: TreeFit, fill_names: dict[int, str], ranks: bool, path_label: bool) -> list[str]:
    """The edges (first, so the nodes are drawn over their ends), the path's label and the nodes."""
    body = ["% edges first, so the nodes are drawn over their ends"]
    for e in layout.edges:
        a, b = layout.node(e.parent), layout.node(e.child)
        body.append(rf"\draw[{EDGE_STYLE[edge_kind(e)]}] ({_num(a.x)},{_num(a.y)}) -- ({_num(b.x)},{_num(b.y)});")
    spot = path_label_at(layout) if path_label else None
    if spot is not None:
        a, b, what = spot
        body.append(rf"\path ({_num(a.x)},{_num(a.y)}) -- ({_num(b.x)},{_num(b.y)}) "
                    rf"node[midway, below=2pt, sloped, ddt path label] {{{what}}};")
    bonus = f"; the bonus node is (n{layout.bonus_id})" if layout.bonus_id is not None else ""
    body.append(f"% tree nodes, one per shown node, named (n<tree position>){bonus}")
    for n, label in zip(layout.nodes, _labels(layout, fit.label_pt, fit.glyphs)):
        style = [ROLE_STYLE[n.role]]
        if n.on_path:
            style.append("ddt on path")
        if n.id in fill_names:
            style.append(f"fill={fill_names[n.id]}")
        style.append(f"label={{[ddt label]above:{{{latex_label(label)}}}}}")
        if ranks and n.rank >= 0:
            style.append(f"label={{[ddt rank]below:r{n.rank}}}")
        body.append(rf"\node[{', '.join(style)}] (n{n.id}) at ({_num(n.x)},{_num(n.y)}) {{}};")
    return body


def _tree_rows(layout: TreeLayout, fit: TreeFit, ranks: bool, path_label: bool) -> tuple[float, float]:
    """The top and bottom (cm, y up) of the nodes with their labels above and ranks under, and the path's label."""
    pt_cm, p, u = paper.CM_PER_PT, fit.row_cm, fit.column_cm
    top = max(-n.y * p + (NODE_HALF_PT[n.role] + 2 + fit.label_pt) * pt_cm for n in layout.nodes)
    bottom = min(-n.y * p - (NODE_HALF_PT[n.role] + (1 + 0.8 * SMALL_PT if ranks and n.rank >= 0 else 0)) * pt_cm
                 for n in layout.nodes)
    spot = path_label_at(layout) if path_label else None
    if spot is not None:
        a, b, what = spot
        dx, dy = (b.x - a.x) * u, (b.y - a.y) * p
        sin = abs(dy) / max(math.hypot(dx, dy), 1e-9)
        low = -(a.y + b.y) / 2 * p - (3 + 1.2 * SMALL_PT) * pt_cm - paper.sans_cm(what, SMALL_PT) / 2 * sin
        bottom = min(bottom, low)
    return top, bottom


def _tree_legend(layout: TreeLayout, box: Box, room: float, cmin: float, cmax: float,
                 scheme: Scheme) -> tuple[list[str], Box]:
    """The marker legend under the tree, its entries in rows within `room` cm, and the colour key under it: their
    lines, and the box with them."""
    out = ["% legend and colour key (cm, under the tree)"]
    x, y, right = box.x0, box.y0 - 0.55, box.x1
    for entry in legend_entries(layout):
        wide = 0.5 + paper.sans_cm(entry.name, LEGEND_PT)
        if x > box.x0 and x + wide > box.x0 + room:
            x, y = box.x0, y - 0.5
        style = (ROLE_STYLE[entry.role] + (", ddt on path" if entry.on_path else "")
                 + (", fill=white" if fixed_fill(scheme, entry.role) is None else ""))
        out.append(rf"\path {_cm(x + 0.25, y)} node[{style}] {{}} {_cm(x + 0.5, y)} node[ddt legend] "
                   rf"{{{latex_text(entry.name)}}};")
        right = max(right, x + wide)
        x += wide + 0.3
    # colour key: five swatches of the colour scale, low log-prob left
    y -= 0.6
    out.append(rf"\path {_cm(box.x0, y)} node[ddt legend] {{drafter log-prob:}};")
    start = box.x0 + paper.sans_cm("drafter log-prob:", LEGEND_PT) + 0.15
    for i, c in enumerate(scale_samples(scheme.colorscale, 5)):
        v = cmin + (cmax - cmin) * i / 4
        x0 = start + 0.5 * i
        out.append(rf"\definecolor{{ddtkey{i}}}{{HTML}}{{{c[1:]}}}")
        out.append(rf"\path[fill=ddtkey{i}, draw=ddtoutline, line width=0.3pt] {_cm(x0, y - 0.18)} rectangle "
                   rf"{_cm(x0 + 0.45, y + 0.18)};")
        out.append(rf"\path {_cm(x0 + 0.225, y - 0.18)} node[ddt legend, anchor=north, font={_font('sffamily', SMALL_PT)}] "
                   rf"{{{v:.1f}}};")
    right = max(right, start + 0.5 * 4 + 0.45 + paper.sans_cm("-0.0", SMALL_PT) / 2)
    return out, Box(box.x0, y - 0.18 - (2 + 1.2 * SMALL_PT) * paper.CM_PER_PT, right, box.y1)

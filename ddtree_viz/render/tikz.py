"""TikZ backend: a `tikzpicture` to `\\input` into a paper, or (standalone=True) a document that compiles alone.

Drawn from the same TreeLayout as every other backend: a node's position is (layout x, layout y) in the
picture's own units (`x=` one depth column, `y=` one row, pointing down, both set once in the picture's
options so the whole figure scales from one place), its fill the same colour the page's colour axis gives
it (each an xcolor definition), its shape the page's marker for its role.

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

from .layout import TreeLayout, edge_kind, legend_entries, path_label_at
from .scheme import Scheme, fixed_fill, hex_color, scale_samples

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
          r"\ifx\ddtenc\ddttu #2\else{\sffamily\tiny U+#1}\fi}}")

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


def _color_defs(colors: dict[str, str]) -> list[str]:
    return [rf"\definecolor{{{name}}}{{HTML}}{{{hex_color(c)[1:]}}}" for name, c in colors.items()]


def _header(opts: list[str], comment: str) -> list[str]:
    """The comment's lines, the preamble note and the picture's opening with its options."""
    header = [f"% {line}" for line in comment.splitlines()] if comment else []
    return header + [PREAMBLE_NOTE.rstrip("\n"), r"\begin{tikzpicture}[", "  " + ",\n  ".join(opts) + "]", DDTUNI]


def _text_styles(width_cm: float) -> list[str]:
    """The styles of the (title) and (caption) nodes; captions wrap at width_cm."""
    return [r"ddt title/.style={font=\sffamily\small, align=center}",
            r"ddt caption/.style={font=\sffamily\footnotesize, align=left, text width=" + _num(width_cm) + "cm}"]


def _title_node(title: str | None, at: str) -> list[str]:
    """The (title) node, its bottom centred on `at` ('x,y'); nothing without a title."""
    return [rf"\node[ddt title, anchor=south] (title) at ({at}) {{{latex_text(title)}}};"] if title else []


def _caption_node(caption: str | None, at: str, shift: str = "") -> list[str]:
    """The (caption) node, its top left corner at `at` ('x,y'); nothing without a caption."""
    if not caption:
        return []
    return [rf"\node[ddt caption, anchor=north west{shift}] (caption) at ({at}) {{{latex_text(caption)}}};"]


def _end(body: list[str], header: list[str], standalone: bool) -> str:
    """The picture closed and wrapped (a whole document when standalone)."""
    return _wrap([b for b in body if b] + [r"\end{tikzpicture}"], header, standalone)


def _wrap(body: list[str], header: list[str], standalone: bool) -> str:
    text = "\n".join(header + body) + "\n"
    if standalone:
        return "% ddtree-viz: compiles alone with pdflatex, lualatex or xelatex\n" + STANDALONE_HEAD + text + STANDALONE_TAIL
    return text


# ------------------------------------------------------------------------------------------------------------
# Tree
# ------------------------------------------------------------------------------------------------------------

ROLE_STYLE = {"root": "ddt root", "accepted": "ddt accepted", "first_rejected": "ddt first rejected",
              "bonus": "ddt bonus", "other": "ddt other"}
EDGE_STYLE = {"edge": "ddt edge", "path": "ddt path edge", "bonus": "ddt bonus edge"}  # by layout.edge_kind


def tree_tikz(layout: TreeLayout, fills: dict[int, str], scheme: Scheme, *, cmin: float, cmax: float,
              title: str | None = None, caption: str | None = None, ranks: bool = True, path_label: bool = True,
              legend: bool = True, standalone: bool = False, x_unit_cm: float | None = None, y_unit_cm: float = 0.8,
              comment: str = "") -> str:
    """One `tikzpicture`: one `\\node` per layout node named (nID), edges drawn first (so filled nodes sit on
    top), accepted path edges with style `ddt path edge`, the bonus edge dashed. Title / caption are `\\node`s
    named (title) / (caption); the legend and colour key use `node`s on `\\path`s."""
    colors = {"ddtpath": scheme.path, "ddtedge": scheme.edge, "ddtrejected": scheme.rejected,
              "ddtoutline": scheme.outline, "ddtneutral": scheme.neutral, "ddtbonus": scheme.bonus,
              "ddtmuted": scheme.text_muted}
    fill_names = {}
    for n in layout.nodes:
        if fixed_fill(scheme, n.role) is None:  # filled by its log-prob
            fill_names[n.id] = f"ddtfill{n.id}"
            colors[fill_names[n.id]] = fills[n.id]
    cols, rows = layout.width, layout.height
    if x_unit_cm is None:  # one depth column: wide enough for the longest label (\scriptsize typewriter)
        x_unit_cm = max(1.6, 0.14 * max(len(n.label) for n in layout.nodes) + 0.5)
    opts = [
        f"x={_num(x_unit_cm)}cm", f"y=-{_num(y_unit_cm)}cm",  # y points down, as the layout's rows do
        "ddt node/.style={draw=ddtoutline, line width=0.4pt, inner sep=0pt, minimum size=8pt}",
        "ddt on path/.style={draw=ddtpath, line width=1.4pt}",
        "ddt root/.style={ddt node, rectangle, fill=ddtneutral, minimum size=7.5pt}",
        "ddt accepted/.style={ddt node, circle}",
        "ddt first rejected/.style={ddt node, diamond, minimum size=9.5pt, draw=ddtrejected, line width=0.8pt}",
        "ddt bonus/.style={ddt node, star, star points=5, star point ratio=2.2, minimum size=12pt, fill=ddtbonus, "
        "draw=ddtpath, line width=1pt}",
        "ddt other/.style={ddt node, circle}",
        r"ddt label/.style={font=\ttfamily\scriptsize, inner sep=1pt}",
        r"ddt rank/.style={font=\sffamily\tiny, text=ddtmuted, inner sep=0.5pt}",
        "ddt edge/.style={draw=ddtedge, line width=0.5pt}",
        "ddt path edge/.style={draw=ddtpath, line width=2pt}",
        "ddt bonus edge/.style={draw=ddtpath, line width=1pt, dashed}",
        r"ddt path label/.style={font=\sffamily\tiny\itshape, text=ddtpath, inner sep=1pt}",
        *_text_styles(max(cols, 3) * x_unit_cm),
        r"ddt legend/.style={font=\sffamily\tiny, anchor=west, inner sep=1pt}",
    ]
    header = _header(opts, comment)
    body = _color_defs(colors)

    body.append("% edges first, so the nodes are drawn over their ends")
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
    for n in layout.nodes:
        style = [ROLE_STYLE[n.role]]
        if n.on_path:
            style.append("ddt on path")
        if n.id in fill_names:
            style.append(f"fill={fill_names[n.id]}")
        style.append(f"label={{[ddt label]above:{{{latex_label(n.label)}}}}}")
        if ranks and n.rank >= 0:
            style.append(f"label={{[ddt rank]below:r{n.rank}}}")
        body.append(rf"\node[{', '.join(style)}] (n{n.id}) at ({_num(n.x)},{_num(n.y)}) {{}};")

    body += _title_node(title, f"{_num((cols - 1) / 2)},-0.9")
    bottom = rows - 1 + 0.8
    if legend:
        body.extend(_tree_legend(layout, bottom, cmin, cmax, scheme))
        bottom += 1.0 if layout.phase == "drafted" else 1.6
    body += _caption_node(caption, f"-0.2,{_num(bottom)}")
    return _end(body, header, standalone)


def _tree_legend(layout: TreeLayout, top: float, cmin: float, cmax: float, scheme: Scheme) -> list[str]:
    out = ["% legend and colour key"]
    x, y = -0.2, top
    for i, entry in enumerate(legend_entries(layout)):
        if i == 3:
            x, y = -0.2, y + 0.6
        style = (ROLE_STYLE[entry.role] + (", ddt on path" if entry.on_path else "")
                 + (", fill=white" if fixed_fill(scheme, entry.role) is None else ""))
        out.append(rf"\path ({_num(x)},{_num(y)}) node[{style}] {{}} ++(0.17,0) node[ddt legend] {{{latex_text(entry.name)}}};")
        x += 1.45 if entry.role != "first_rejected" else 2.1
    # colour key: five swatches of the colour scale, low log-prob left
    samples = scale_samples(scheme.colorscale, 5)
    y += 0.6
    out.append(rf"\path (-0.2,{_num(y)}) node[ddt legend] {{drafter log-prob:}};")
    for i, c in enumerate(samples):
        v = cmin + (cmax - cmin) * i / 4
        x0 = 0.75 + 0.42 * i
        out.append(rf"\definecolor{{ddtkey{i}}}{{HTML}}{{{c[1:]}}}")
        out.append(rf"\path[fill=ddtkey{i}, draw=ddtoutline, line width=0.3pt] ({_num(x0)},{_num(y - 0.18)}) rectangle "
                   rf"({_num(x0 + 0.4)},{_num(y + 0.18)});")
        out.append(rf"\path ({_num(x0 + 0.2)},{_num(y + 0.18)}) node[ddt legend, anchor=north] {{{v:.1f}}};")
    return out


# ------------------------------------------------------------------------------------------------------------
# Mask and acceptance (optional figures; drawn with plain TikZ, no pgfplots)
# ------------------------------------------------------------------------------------------------------------


def mask_tikz(mask, row_labels: list[str], col_labels: list[str], accepted: list[int], scheme: Scheme, *,
              title: str | None = None, caption: str | None = None, standalone: bool = False, cell_cm: float = 0.32,
              comment: str = "") -> str:
    """The verify mask: row i (a query) x column j (key; column 0 = the committed prefix) filled when visible;
    accepted rows outlined in the path colour. Labels are layout-style (visible) token labels."""
    n_rows, n_cols = len(row_labels), len(col_labels)
    opts = [f"x={_num(cell_cm)}cm", f"y=-{_num(cell_cm)}cm",
            r"ddt tick/.style={font=\ttfamily\tiny, inner sep=1pt}", *_text_styles(max(n_cols, 12) * cell_cm)]
    header = _header(opts, comment)
    body = _color_defs({"ddtmaskon": scheme.mask_on, "ddtmaskoff": scheme.mask_off, "ddtpath": scheme.path})
    body.append(rf"\fill[ddtmaskoff] (0,0) rectangle ({n_cols},{n_rows});")
    for i in range(n_rows):
        runs, j = [], 0
        while j < n_cols:  # one rectangle per run of visible cells
            if mask[i][j]:
                k = j
                while k < n_cols and mask[i][k]:
                    k += 1
                runs.append((j, k))
                j = k
            else:
                j += 1
        for a, b in runs:
            body.append(rf"\fill[ddtmaskon] ({a},{i}) rectangle ({b},{i + 1});")
    if n_rows <= 64:  # white cell borders (plain segments: `grid` steps in cm, not in the picture's units)
        lines = [f"({j},0) -- ({j},{n_rows})" for j in range(1, n_cols)] + [f"(0,{i}) -- ({n_cols},{i})" for i in range(1, n_rows)]
        body.append(r"\draw[white, line width=0.3pt] " + " ".join(lines) + ";")
    for r in accepted:
        body.append(rf"\draw[ddtpath, line width=1pt] (0,{r}) rectangle ({n_cols},{r + 1});")
    for i, lab in enumerate(row_labels):
        body.append(rf"\path (0,{_num(i + 0.5)}) node[ddt tick, anchor=east] {{{latex_label(lab)}}};")
    for j, lab in enumerate(col_labels):
        text = latex_text(lab) if j == 0 else latex_label(lab)
        body.append(rf"\path ({_num(j + 0.5)},0) node[ddt tick, anchor=west, rotate=60] {{{text}}};")
    above = max([len(c) for c in col_labels] + [4]) * 0.1 * 0.87 / cell_cm + 1.0  # clears the rotated column labels
    body += _title_node(title, f"{_num(n_cols / 2)},{_num(-above)}")
    body += _caption_node(caption, f"0,{n_rows + 0.8}")
    return _end(body, header, standalone)


def acceptance_tikz(rounds: list[int], values: list[int], scheme: Scheme, *, title: str | None = None,
                    caption: str | None = None, standalone: bool = False, comment: str = "") -> str:
    """Bars: tokens gained per round, and a dashed line at the mean (plain TikZ)."""
    top = max(values, default=1)
    bar_w = max(0.12, min(0.6, 12.0 / max(len(values), 1)))
    opts = [f"x={_num(bar_w)}cm", f"y={_num(min(0.6, 4.0 / max(top, 1)))}cm",
            r"ddt tick/.style={font=\sffamily\tiny, inner sep=1pt}", *_text_styles(max(len(values), 10) * bar_w)]
    header = _header(opts, comment)
    body = _color_defs({"ddtbar": scheme.bar, "ddtmean": scheme.mean})
    n = len(values)
    body.append(rf"\draw[gray, line width=0.4pt] (0,0) -- ({n},0);")
    body.append(rf"\draw[gray, line width=0.4pt] (0,0) -- (0,{top + 0.5});")
    step = 1 if top <= 16 else max(1, top // 8)
    for t in range(0, top + 1, step):
        body.append(rf"\path (0,{t}) node[ddt tick, anchor=east] {{{t}}};")
    every = 1 if n <= 40 else max(1, n // 20)
    for i, (r, v) in enumerate(zip(rounds, values)):
        body.append(rf"\fill[ddtbar] ({_num(i + 0.1)},0) rectangle ({_num(i + 0.9)},{v});")
        if i % every == 0:
            body.append(rf"\path ({_num(i + 0.5)},0) node[ddt tick, anchor=north] {{{r}}};")
    if values:
        mean = sum(values) / n
        body.append(rf"\draw[ddtmean, dashed, line width=1pt] (0,{_num(mean)}) -- ({n},{_num(mean)}) "
                    rf"node[ddt tick, anchor=west, text=ddtmean] {{mean {mean:.2f}}};")
    body.append(rf"\path ({_num(n / 2)},0) node[ddt tick, anchor=north, yshift=-8pt] {{round}};")
    body.append(rf"\path (0,{_num(top / 2)}) node[ddt tick, anchor=south, rotate=90, yshift=12pt] {{tokens}};")
    body += _title_node(title, f"{_num(n / 2)},{top + 0.7}")
    body += _caption_node(caption, "0,0", ", yshift=-22pt")
    return _end(body, header, standalone)



# ------------------------------------------------------------------------------------------------------------
# The drafter's grid
# ------------------------------------------------------------------------------------------------------------


def grid_tikz(g, fills: dict[tuple[int, int], str], scheme: Scheme, *, note: str, title: str | None = None,
              caption: str | None = None, standalone: bool = False, comment: str = "") -> str:
    """The drafter's grid (render.grid_view.GridData): one filled cell per (depth, rank) in `fills` colours, its
    token label inside (node ddtcell-D-R), taken cells framed, the accepted path through its cells, a cross on the
    target's token at the stop depth; `note` (where the walk stopped) below."""
    cell_x, cell_y = 1.3, 0.5
    opts = [f"x={_num(cell_x)}cm", f"y=-{_num(cell_y)}cm",
            r"ddt cell/.style={font=\ttfamily\tiny, inner sep=0.5pt}",
            r"ddt tick/.style={font=\sffamily\tiny, inner sep=1pt}", *_text_styles(max(g.depths, 6) * cell_x)]
    header = _header(opts, comment)
    colors = {"ddtpath": scheme.path, "ddtrejected": scheme.rejected, "ddtmuted": scheme.text_muted}
    names = {}
    for c in g.cells:
        names[(c.depth, c.rank)] = f"ddtg{c.depth}x{c.rank}"
        colors[names[(c.depth, c.rank)]] = fills[(c.depth, c.rank)]
    body = _color_defs(colors)
    body.append("% cells: x = depth, y = rank (rank 0 on top)")
    for c in g.cells:
        x0, y0 = c.depth - 0.5, c.rank - 0.5
        body.append(rf"\fill[{names[(c.depth, c.rank)]}] ({_num(x0)},{_num(y0)}) rectangle ({_num(x0 + 1)},{_num(y0 + 1)});")
        r, gg, b = (int(fills[(c.depth, c.rank)][i:i + 2], 16) for i in (1, 3, 5))
        text = "white" if 0.299 * r + 0.587 * gg + 0.114 * b < 128 else "black"
        body.append(rf"\node[ddt cell, text={text}] (ddtcell-{c.depth}-{c.rank}) at ({c.depth},{c.rank}) "
                    rf"{{{latex_label(c.label)}}};")
        if c.taken:
            times = rf" node[ddt tick, anchor=north east, text=ddtrejected] {{$\times${len(c.taken)}}}" if len(c.taken) > 1 else ""
            body.append(rf"\draw[ddtrejected, line width=0.6pt] ({_num(x0 + 0.04)},{_num(y0 + 0.06)}) rectangle "
                        rf"({_num(x0 + 0.96)},{_num(y0 + 0.94)}){times};")
    if g.path:
        body.append(r"\draw[ddtpath, line width=1.6pt] " + " -- ".join(f"({d},{r})" for d, r in g.path) + ";")
        for d, r in g.path:
            body.append(rf"\fill[ddtpath] ({d},{r}) circle (1.6pt);")
    if g.stop_rank is not None:
        d, r = g.stop_depth, g.stop_rank
        body.append(rf"\draw[ddtpath, line width=1.6pt] ({_num(d - 0.2)},{_num(r - 0.3)}) -- ({_num(d + 0.2)},{_num(r + 0.3)}) "
                    rf"({_num(d - 0.2)},{_num(r + 0.3)}) -- ({_num(d + 0.2)},{_num(r - 0.3)});")
    for d in range(1, g.depths + 1):
        body.append(rf"\path ({d},{_num(g.k - 0.5)}) node[ddt tick, anchor=north] {{{d}}};")
    for r in range(g.k):
        body.append(rf"\path (0.5,{r}) node[ddt tick, anchor=east] {{{r}}};")
    body.append(rf"\path ({_num((g.depths + 1) / 2)},{_num(g.k + 0.4)}) node[ddt tick, anchor=north] {{depth}};")
    body.append(rf"\path (0,{_num((g.k - 1) / 2)}) node[ddt tick, anchor=south, rotate=90, xshift=0pt, yshift=4pt] "
                r"{drafter rank};")
    body.append(rf"\node[ddt caption, anchor=north west, text=ddtmuted] at (0.5,{_num(g.k + 1.2)}) {{{latex_text(note)}}};")
    body += _title_node(title, f"{_num((g.depths + 1) / 2)},-0.9")
    body += _caption_node(caption, f"0.5,{_num(g.k + 2.2)}")
    return _end(body, header, standalone)

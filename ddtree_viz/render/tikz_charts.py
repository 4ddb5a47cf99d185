"""TikZ's other figures: the verify mask, acceptance per round and the drafter's grid, each fitted to a paper's width
the way render/tikz.py fits the tree (its escaping, fonts, sizes and frame; see its docstring)."""

from __future__ import annotations

import math

from . import paper
from .scheme import Scheme
from .tikz import (CAPTION_PT, LEGEND_PT, MIN_GLYPHS, SMALL_PT, TEXT_STYLES, Box, Drawn, _cm, _color_defs, _font, _frame, _header,
                   _num, _print_size, _sized, cut_label, label_cm, latex_label, latex_text)


# ------------------------------------------------------------------------------------------------------------
# Mask and acceptance (optional figures; drawn with plain TikZ, no pgfplots)
# ------------------------------------------------------------------------------------------------------------

MAX_CELL_CM, MIN_CELL_CM = 0.45, 0.03  # a mask's cell, at most and at least


def _mask_margins(row_labels: list[str], col_labels: list[str], pt: float, every: int = 1):
    """(cm left of the mask: its row labels; the columns' labels (turned 60 degrees: up and to the right) as
    (j + 0.5, cm right of that point) for each labelled column j)."""
    left = max(label_cm(r, pt) for i, r in enumerate(row_labels) if i % every == 0)
    return left, [(j + 0.5, label_cm(c, pt) * 0.5 + pt * paper.CM_PER_PT) for j, c in enumerate(col_labels)
                  if j % every == 0]


def _mask_cell(left: float, over, n_cols: int, target: float) -> float:
    """The largest cell that keeps the mask and its labels inside `target` cm."""
    return min([(target - left) / n_cols] + [(target - left - a) / j for j, a in over])


def _mask_fit(row_labels: list[str], col_labels: list[str], target: float) -> tuple[int, float, int, bool]:
    """(label size, cell cm, label every k-th position, fits): the largest labels whose rows fit a cell each with
    the mask inside `target`; else the smallest, on every k-th row and column."""
    for pt in paper.LABEL_SIZES:
        line = (pt + 1) * paper.CM_PER_PT
        cell = _mask_cell(*_mask_margins(row_labels, col_labels, pt), len(col_labels), target)
        if cell >= line:
            return pt, min(cell, MAX_CELL_CM), 1, True
    every = math.ceil(line / max(cell, MIN_CELL_CM))
    cell = _mask_cell(*_mask_margins(row_labels, col_labels, pt, every), len(col_labels), target)
    every = math.ceil(line / max(cell, MIN_CELL_CM))
    return pt, max(cell, MIN_CELL_CM), every, cell >= MIN_CELL_CM


def mask_tikz(mask, row_labels: list[str], col_labels: list[str], accepted: list[int], scheme: Scheme, *,
              title: str | None = None, caption: str | None = None, standalone: bool = False,
              width: str | float | None = "column", comment: str = "") -> Drawn:
    """The verify mask: row i (a query) x column j (key; column 0 = the committed prefix) filled when visible;
    accepted rows outlined in the path colour. Labels are layout-style (visible) token labels; the cells fit
    `width` (_mask_fit)."""
    n_rows, n_cols = len(row_labels), len(col_labels)
    target = paper.width_cm(width)
    pt, cell, every, fits = _mask_fit(row_labels, col_labels, target)
    opts = [f"x={_num(cell)}cm", f"y=-{_num(cell)}cm",
            rf"ddt tick/.style={{font={_font('ttfamily', pt)}, inner sep=1pt}}", *TEXT_STYLES]
    header = _header(opts, comment)
    body = _color_defs({"ddtmaskon": scheme.mask_on, "ddtmaskoff": scheme.mask_off, "ddtpath": scheme.path})
    body.append(rf"\fill[ddtmaskoff] (0,0) rectangle ({n_cols},{n_rows});")
    for i in range(n_rows):
        j = 0
        while j < n_cols:  # one rectangle per run of visible cells
            if mask[i][j]:
                k = j
                while k < n_cols and mask[i][k]:
                    k += 1
                body.append(rf"\fill[ddtmaskon] ({j},{i}) rectangle ({k},{i + 1});")
                j = k
            else:
                j += 1
    if n_rows <= 64 and cell >= 0.1:  # white cell borders (plain segments: `grid` steps in cm, not the picture's units)
        lines = [f"({j},0) -- ({j},{n_rows})" for j in range(1, n_cols)] + [f"(0,{i}) -- ({n_cols},{i})" for i in range(1, n_rows)]
        body.append(r"\draw[white, line width=0.3pt] " + " ".join(lines) + ";")
    for r in accepted:
        body.append(rf"\draw[ddtpath, line width=1pt] (0,{r}) rectangle ({n_cols},{r + 1});")
    for i, lab in enumerate(row_labels):
        if i % every == 0:
            body.append(rf"\path (0,{_num(i + 0.5)}) node[ddt tick, anchor=east] {{{latex_label(lab)}}};")
    for j, lab in enumerate(col_labels):
        if j % every == 0:
            text = latex_text(lab) if j == 0 else latex_label(lab)
            body.append(rf"\path ({_num(j + 0.5)},0) node[ddt tick, anchor=west, rotate=60] {{{text}}};")
    pt_cm = paper.CM_PER_PT
    left, over = _mask_margins(row_labels, col_labels, pt, every)
    up = max(label_cm(c, pt) for c in col_labels) * 0.87 + pt * pt_cm  # the turned column labels' top
    box = Box(-left, -n_rows * cell, max([n_cols * cell] + [j * cell + a for j, a in over]), up)
    text, box = _frame(box, target, title, caption)
    notes = [None if every == 1 else f"labels on one position in {every} to fit {paper.asked(width)} at {pt} pt",
             None if fits else paper.too_wide(width, box.width)]
    return _sized(body + text, header, standalone, box, _print_size(box, pt, notes))


def acceptance_tikz(rounds: list[int], values: list[int], scheme: Scheme, *, title: str | None = None,
                    caption: str | None = None, standalone: bool = False, width: str | float | None = "column",
                    comment: str = "") -> Drawn:
    """Bars: tokens gained per round, and a dashed line at the mean (plain TikZ), the bars fitted to `width`."""
    top, n, pt, pt_cm = max(values, default=1), len(values), LEGEND_PT + 1, paper.CM_PER_PT
    target = paper.width_cm(width)
    mean = sum(values) / n if values else 0.0
    left = paper.sans_cm(str(top), pt) + (2 + 1.2 * pt) * pt_cm + 0.15  # y ticks, and "tokens" turned up
    right = paper.sans_cm(f"mean {mean:.2f}", pt) + 0.1
    bar_w = min(0.6, max(0.02, (target - left - right) / max(n, 1)))
    unit = min(0.6, 4.0 / max(top, 1))
    opts = [f"x={_num(bar_w)}cm", f"y={_num(unit)}cm",
            rf"ddt tick/.style={{font={_font('sffamily', pt)}, inner sep=1pt}}", *TEXT_STYLES]
    header = _header(opts, comment)
    body = _color_defs({"ddtbar": scheme.bar, "ddtmean": scheme.mean})
    body.append(rf"\draw[gray, line width=0.4pt] (0,0) -- ({n},0);")
    body.append(rf"\draw[gray, line width=0.4pt] (0,0) -- (0,{top + 0.5});")
    step = max(1, math.ceil((pt + 2) * pt_cm / unit))
    for t in range(0, top + 1, step):
        body.append(rf"\path (0,{t}) node[ddt tick, anchor=east] {{{t}}};")
    every = max(1, math.ceil((paper.sans_cm(str(max(rounds, default=1)), pt) + 0.1) / bar_w))
    for i, (r, v) in enumerate(zip(rounds, values)):
        body.append(rf"\fill[ddtbar] ({_num(i + 0.1)},0) rectangle ({_num(i + 0.9)},{v});")
        if i % every == 0:
            body.append(rf"\path ({_num(i + 0.5)},0) node[ddt tick, anchor=north] {{{r}}};")
    if values:
        body.append(rf"\draw[ddtmean, dashed, line width=1pt] (0,{_num(mean)}) -- ({n},{_num(mean)}) "
                    rf"node[ddt tick, anchor=west, text=ddtmean] {{mean {mean:.2f}}};")
    line = 1.2 * pt * pt_cm + 2 * pt_cm
    body.append(rf"\path ({_num(n / 2)},0) node[ddt tick, anchor=north, yshift=-{_num(line / pt_cm)}pt] {{round}};")
    body.append(rf"\path ({_num(-(left - line - 0.05) / bar_w)},{_num(top / 2)}) node[ddt tick, anchor=south, rotate=90] "
                "{tokens};")
    box = Box(-left, -2 * line, n * bar_w + right, (top + 0.5) * unit + 0.1)
    text, box = _frame(box, target, title, caption)
    fits = (target - left - right) / max(n, 1) >= 0.02
    return _sized(body + text, header, standalone, box,
                  _print_size(box, pt, [None if fits else paper.too_wide(width, box.width)]))


# ------------------------------------------------------------------------------------------------------------
# The drafter's grid
# ------------------------------------------------------------------------------------------------------------


def _grid_fit(g, target: float, left: float) -> tuple[int, int | None, float, bool]:
    """(label size, labels cut to glyphs or None, depth column cm, fits): the largest labels that fit a cell with the
    grid inside `target`, else the smallest cut to what a cell holds."""
    room = (target - left) / max(g.depths, 1)
    for pt in paper.LABEL_SIZES:
        need = max((label_cm(c.label, pt) for c in g.cells), default=0.0) + 0.06
        if room >= need:
            return pt, None, min(room, max(need, 1.3)), True
    pt = paper.MIN_LABEL_PT
    glyphs = int((room - 0.06 - 2 * paper.CM_PER_PT) / (paper.TT_EM * pt * paper.CM_PER_PT))
    if glyphs >= MIN_GLYPHS:
        return pt, glyphs, room, True
    return pt, MIN_GLYPHS, (MIN_GLYPHS * paper.TT_EM * pt + 2) * paper.CM_PER_PT + 0.06, False


def grid_tikz(g, fills: dict[tuple[int, int], str], scheme: Scheme, *, note: str, title: str | None = None,
              caption: str | None = None, standalone: bool = False, width: str | float | None = "column",
              comment: str = "") -> Drawn:
    """The drafter's grid (render.grid_view.GridData): one filled cell per (depth, rank) in `fills` colours, its
    token label inside (node ddtcell-D-R), taken cells framed, the accepted path through its cells, a cross on the
    target's token at the stop depth; `note` (where the walk stopped) below. The cells fit `width` (_grid_fit)."""
    target, pt_cm = paper.width_cm(width), paper.CM_PER_PT
    left = paper.sans_cm(str(g.k - 1), SMALL_PT) + (3 + 1.2 * LEGEND_PT) * pt_cm + 0.1  # rank ticks, "drafter rank"
    pt, glyphs, cell_x, fits = _grid_fit(g, target, left)
    cell_y = max(0.42, (pt + 5) * pt_cm)
    opts = [f"x={_num(cell_x)}cm", f"y=-{_num(cell_y)}cm",
            rf"ddt cell/.style={{font={_font('ttfamily', pt)}, inner sep=0.5pt}}",
            rf"ddt tick/.style={{font={_font('sffamily', SMALL_PT)}, inner sep=1pt}}",
            rf"ddt axis/.style={{font={_font('sffamily', LEGEND_PT)}, inner sep=1pt}}", *TEXT_STYLES]
    header = _header(opts, comment)
    colors = {"ddtpath": scheme.path, "ddtrejected": scheme.rejected, "ddtmuted": scheme.text_muted}
    names = {}
    for c in g.cells:
        names[(c.depth, c.rank)] = f"ddtg{c.depth}x{c.rank}"
        colors[names[(c.depth, c.rank)]] = fills[(c.depth, c.rank)]
    body = _color_defs(colors) + _grid_cells(g, fills, names, glyphs)
    for d in range(1, g.depths + 1):
        body.append(rf"\path ({d},{_num(g.k - 0.5)}) node[ddt tick, anchor=north] {{{d}}};")
    for r in range(g.k):
        body.append(rf"\path (0.5,{r}) node[ddt tick, anchor=east] {{{r}}};")
    tick = (2 + 1.2 * SMALL_PT) * pt_cm
    body.append(rf"\path ({_num((g.depths + 1) / 2)},{_num(g.k - 0.5)}) node[ddt axis, anchor=north, "
                rf"yshift=-{_num(tick / pt_cm)}pt] {{depth}};")
    body.append(rf"\path {_cm(0.5 * cell_x - left, -(g.k - 1) / 2 * cell_y)} node[ddt axis, anchor=north, rotate=90] "
                r"{drafter rank};")
    bottom = -(g.k - 0.5) * cell_y - tick - (2 + 1.2 * LEGEND_PT) * pt_cm
    box = Box(0.5 * cell_x - left, bottom, (g.depths + 0.5) * cell_x, 0.5 * cell_y)
    body.append(rf"\node[ddt caption, anchor=north west, text=ddtmuted, text width={_num(box.width)}cm] at "
                rf"{_cm(box.x0, bottom - 0.15)} {{{latex_text(note)}}};")
    box = Box(box.x0, bottom - 0.15 - paper.lines(note, CAPTION_PT, box.width) * CAPTION_PT * 1.2 * pt_cm, box.x1, box.y1)
    text, box = _frame(box, target, title, caption)
    notes = [None if fits else paper.too_wide(width, box.width),
             _grid_cut_note(g, width, glyphs) if fits and glyphs else None]
    return _sized(body + text, header, standalone, box, _print_size(box, pt, notes))


def _grid_cut_note(g, width, glyphs: int) -> str | None:
    cut = [len(cut_label(c.label, paper.MIN_LABEL_PT, glyphs)) for c in g.cells
           if cut_label(c.label, paper.MIN_LABEL_PT, glyphs) != c.label]
    return paper.cut_labels(width, max(cut)) if cut else None


def _grid_cells(g, fills, names: dict, glyphs: int | None) -> list[str]:
    """The cells (x = depth, y = rank, rank 0 on top) with their labels, the taken ones framed, the path, the stop."""
    body = ["% cells: x = depth, y = rank (rank 0 on top)"]
    for c in g.cells:
        x0, y0 = c.depth - 0.5, c.rank - 0.5
        body.append(rf"\fill[{names[(c.depth, c.rank)]}] ({_num(x0)},{_num(y0)}) rectangle ({_num(x0 + 1)},{_num(y0 + 1)});")
        r, gg, b = (int(fills[(c.depth, c.rank)][i:i + 2], 16) for i in (1, 3, 5))
        text = "white" if 0.299 * r + 0.587 * gg + 0.114 * b < 128 else "black"
        label = c.label if glyphs is None else cut_label(c.label, paper.MIN_LABEL_PT, glyphs)
        body.append(rf"\node[ddt cell, text={text}] (ddtcell-{c.depth}-{c.rank}) at ({c.depth},{c.rank}) "
                    rf"{{{latex_label(label)}}};")
        if c.taken:
            times = rf" node[ddt tick, anchor=north east, text=ddtrejected] {{$\times${len(c.taken)}}}" if len(c.taken) > 1 else ""
            body.append(rf"\draw[ddtrejected, line width=0.6pt] ({_num(x0 + 0.04)},{_num(y0 + 0.06)}) rectangle "
                        rf"({_num(x0 + 0.96)},{_num(y0 + 0.94)}){times};")
    path = [(d, r) for d, r in g.path if r < g.k]  # a draft ranked past the recorded top k has no cell
    if path:
        body.append(r"\draw[ddtpath, line width=1.6pt] " + " -- ".join(f"({d},{r})" for d, r in path) + ";")
        for d, r in path:
            body.append(rf"\fill[ddtpath] ({d},{r}) circle (1.6pt);")
    if g.stop_rank is not None:
        d, r = g.stop_depth, g.stop_rank
        body.append(rf"\draw[ddtpath, line width=1.6pt] ({_num(d - 0.2)},{_num(r - 0.3)}) -- ({_num(d + 0.2)},{_num(r + 0.3)}) "
                    rf"({_num(d - 0.2)},{_num(r + 0.3)}) -- ({_num(d + 0.2)},{_num(r - 0.3)});")
    return body

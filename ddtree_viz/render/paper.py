"""Print sizes (issue #65 item 4): the width a paper gives an exported figure, the sizes its text prints at, and the
line every paper export says about itself ("TikZ: 8.5 cm x 6.1 cm, 8 pt labels").

A figure is drawn at a paper's width (options.PAPER_WIDTHS_CM: one column by default, the full text width, or any
length) with its token labels at LABEL_SIZES[0]; where they do not fit that width they shrink a point at a time down
to MIN_LABEL_PT, and past that the figure is drawn wider (TikZ) or its labels cut (matplotlib) and its PrintSize
says so, and what to do. Pure: the TikZ and matplotlib backends measure their own figures; this is what they share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..options import PAPER_WIDTHS_CM
from ..words import plural

CM_PER_IN = 2.54
CM_PER_PT = 2.54 / 72.27  # TeX's point (TikZ, \fontsize); matplotlib's is 1/72 in, 0.4% larger
LABEL_SIZES = (8, 7, 6)  # token labels: a paper's figure text (8 pt), shrunk no further than the last
MIN_LABEL_PT = LABEL_SIZES[-1]
PAGE_HEIGHT_CM = 22.9  # a page's text height (9 in, as matplotlib's tree): a taller figure says so
TT_EM = 0.535  # a typewriter glyph's width in em, generous (Latin Modern Mono: 0.525 at 10 pt, 0.531 at 8 pt and under)
SANS_EM = 0.56  # an average sans-serif glyph's width in em, on the generous side (Computer Modern Sans: ~0.5)


def width_cm(width: str | float | None) -> float:
    """An export's width option ('column', 'full' or inches; None: a column) in centimetres."""
    if width is None:
        return PAPER_WIDTHS_CM["column"]
    if isinstance(width, str):
        return PAPER_WIDTHS_CM[width]
    return float(width) * CM_PER_IN


def asked(width: str | float | None) -> str:
    """How the width asked for is named in a note: 'a column (8.5 cm)', 'the full width (17.5 cm)', '12 cm'."""
    cm = width_cm(width)
    if width is None or width == "column":
        return f"a column ({cm:g} cm)"
    if width == "full":
        return f"the full width ({cm:g} cm)"
    return f"{cm:.3g} cm"


def sans_cm(text: str, pt: float) -> float:
    """A generous width of `text` set in a sans-serif font at `pt` (cm)."""
    return len(text) * SANS_EM * pt * CM_PER_PT


def lines(text: str | None, pt: float, width: float) -> int:
    """A generous count of the lines `text` wraps to in `width` cm at `pt` sans (0 for no text)."""
    if not text:
        return 0
    return max(1, math.ceil(sans_cm(text, pt) * 1.08 / max(width, 1e-6) + 0.15))


def cm_text(cm: float) -> str:
    return f"{cm:.1f}"


@dataclass(frozen=True)
class PrintSize:
    """What a paper export says about itself: its size, the size of its labels and what did not fit."""

    fmt: str  # the file's kind, as said: TikZ, PDF, SVG, PNG
    width_cm: float
    height_cm: float
    label_pt: float | None  # its token labels' size (None: none drawn)
    notes: tuple[str, ...] = ()  # what does not fit the width (or a page) and what to do about it

    def describe(self) -> str:
        """'TikZ: 8.5 cm x 6.1 cm, 8 pt labels', then each note after a semicolon."""
        head = f"{self.fmt}: {cm_text(self.width_cm)} cm x {cm_text(self.height_cm)} cm"
        if self.label_pt is not None:
            head += f", {round(self.label_pt, 1):g} pt labels"
        return "; ".join((head, *self.notes))


def too_wide(width: str | float | None, needed_cm: float) -> str:
    """The note of a figure that does not fit the width asked for even at MIN_LABEL_PT."""
    wider = "" if width == "full" else "the full width (--width full), "
    return (f"does not fit {asked(width)} even at {MIN_LABEL_PT} pt labels (it needs {cm_text(needed_cm)} cm): "
            f"use {wider}fewer nodes (max depth, min log-prob) or shorter labels (--label-chars)")


def cut_labels(width: str | float | None, chars: int) -> str:
    """The note of a figure whose labels were cut to fit the width asked for."""
    wider = "" if width == "full" else "use the full width (--width full) or "
    return f"labels cut to {plural(chars, 'character')} to fit {asked(width)}: {wider}fewer nodes (max depth, min log-prob)"


def too_tall(height_cm: float) -> str | None:
    """The note of a figure taller than a page's text, or None."""
    if height_cm <= PAGE_HEIGHT_CM:
        return None
    return f"taller than a page ({PAGE_HEIGHT_CM:g} cm of text): hide nodes (max depth, min log-prob) to shorten it"


def column_need(points: list[tuple[float, float]], widths: list[float], gap: float = 0.0, band: float = 0.999) -> float:
    """The narrowest depth column (in the widths' unit) at which no two labels centred over their nodes touch: the
    most, over pairs of nodes less than `band` rows apart (their labels, or a label and a rank, side by side), of half
    of each label and `gap`, per depth column between them. Nodes at (depth column, row) `points`."""
    order = sorted(range(len(points)), key=lambda i: points[i][1])
    need = 0.0
    for at, i in enumerate(order):
        xi, yi = points[i]
        for j in order[at + 1:]:
            xj, yj = points[j]
            if yj - yi >= band:
                break
            if xj != xi:
                need = max(need, ((widths[i] + widths[j]) / 2 + gap) / abs(xj - xi))
    return need

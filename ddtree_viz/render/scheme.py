"""Colour schemes: the page's colour-blind-safe colours (style.py; PAGE_SCHEME), or grayscale for print.
Every backend (the page's plotly figures, matplotlib SVG/PDF/PNG, TikZ, HTML) reads its colours from one
Scheme, and the log-prob fill of each node always comes from layout.node_colors with the scheme's colour
scale, so a node has the same fill in every format and on the page. Which colour a node's outline, a fixed
fill or an edge takes is decided here, once, for every backend."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..options import SCHEME_NAMES
from . import style
from .layout import path_outlined



@dataclass(frozen=True)
class Scheme:
    name: str
    colorscale: str  # a plotly colour scale name (what the page's colour axis uses)
    path: str  # accepted path edges + outlines, bonus outline
    edge: str  # other edges
    rejected: str  # outline of the first rejected candidates
    outline: str  # outline of other nodes
    neutral: str  # fill of nodes without a drafter log-prob (root)
    bonus: str  # fill of the bonus node (the target's own token)
    mask_on: str
    mask_off: str
    bar: str
    mean: str
    text_muted: str


SCHEMES = {
    "colorblind": Scheme(
        name="colorblind", colorscale=style.DEFAULT_COLORSCALE, path=style.PATH_COLOR, edge=style.EDGE_COLOR,
        rejected=style.REJECTED_COLOR, outline="#444444", neutral=style.NEUTRAL_FILL, bonus=style.BONUS_FILL,
        mask_on=style.MASK_VISIBLE, mask_off=style.MASK_HIDDEN, bar=style.ATTENTION_COLOR, mean=style.PATH_COLOR,
        text_muted="#666666",
    ),
    # print: log-prob from white (unlikely) to black (confident); the path is black and thick, other edges thin grey
    "grayscale": Scheme(
        name="grayscale", colorscale=style.PRINT_COLORSCALE, path="#000000", edge="#a0a0a0", rejected="#000000",
        outline="#444444", neutral="#d9d9d9", bonus="#ffffff", mask_on="#404040", mask_off="#f2f2f2", bar="#707070",
        mean="#000000", text_muted="#555555",
    ),
}

PAGE_SCHEME = SCHEMES["colorblind"]  # what the page shows


def get_scheme(name: str) -> Scheme:
    try:
        return SCHEMES[name]
    except KeyError:
        raise ValueError(f"colour scheme must be one of {', '.join(SCHEME_NAMES)}, not {name!r}") from None


def outline_color(scheme: Scheme, role: str, on_path: bool) -> str:
    """A node marker's outline: the path colour on the accepted path and the bonus, black-ish for the first
    rejected candidates, grey otherwise."""
    if path_outlined(role, on_path):
        return scheme.path
    return scheme.rejected if role == "first_rejected" else scheme.outline


def fixed_fill(scheme: Scheme, role: str) -> str | None:
    """The fill of a role not coloured by drafter log-prob (root: neutral, bonus: the bonus colour); None for
    drafted nodes, whose fill is their log-prob's colour."""
    return {"root": scheme.neutral, "bonus": scheme.bonus}.get(role)


def edge_color(scheme: Scheme, kind: str) -> str:
    """An edge's colour by its layout.edge_kind: the path colour for accepted-path and bonus edges."""
    return scheme.edge if kind == "edge" else scheme.path


_RGB = re.compile(r"rgba?\(\s*([\d.]+)\s*,\s*([\d.]+)\s*,\s*([\d.]+)")


def rgb255(color: str) -> tuple[int, int, int]:
    """'#rrggbb' or 'rgb(r, g, b)' -> (r, g, b) in 0..255."""
    color = color.strip()
    if color.startswith("#") and len(color) == 7:
        return int(color[1:3], 16), int(color[3:5], 16), int(color[5:7], 16)
    m = _RGB.match(color)
    if m:
        return tuple(int(round(float(v))) for v in m.groups())  # type: ignore[return-value]
    raise ValueError(f"not a colour: {color!r}")


def hex_color(color: str) -> str:
    """Any colour node_colors / style.py produce -> '#RRGGBB' (upper case, as xcolor's HTML model wants)."""
    r, g, b = rgb255(color)
    return f"#{r:02X}{g:02X}{b:02X}"


def scale_samples(colorscale: str, n: int = 256) -> list[str]:
    """n evenly spaced '#RRGGBB' samples of a plotly colour scale (for matplotlib colour maps and colour keys)."""
    from plotly.colors import get_colorscale, sample_colorscale

    scale = get_colorscale(colorscale)
    return [hex_color(c) for c in sample_colorscale(scale, [i / (n - 1) for i in range(n)])]

"""A plotly figure as plain data: the page's fast path.

Every plotly renderer here builds its figure as a `FigureSpec` (the JSON plotly.js draws: a list of trace dicts and a
layout dict) and its `*_figure` twin wraps it in `go.Figure` for exports, scripts and tests. Building a `go.Figure`
runs plotly's validators over every property, which costs tens of milliseconds per figure (more than a whole
DDTree round of the embedded pair on a CPU); the page needs none of it, so it sends the spec's JSON straight to
the browser (`to_json`, which gradio's Plot calls). `tests/test_render.py` holds the two equal: the spec's JSON is
what `figure().to_json()` gives, so plotly still checks every property the page draws, in the tests.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

_TEMPLATES: dict[str, Any] = {}


def _template() -> Any:
    """plotly.py's default template as JSON (what go.Figure puts in every figure's layout), made once, with every
    axis's and colour bar's tick labels drawn as they fall (`ticklabeloverflow` "allow"). plotly.js's default for a
    linear axis, "hide past div", measures every tick label's box after drawing it, forcing a layout of the whole
    page each time (about 8% of a Step's browser time in a profile, issue #26). The page's figures leave room for
    their labels (automargin), so nothing changes on screen."""
    import plotly.io as pio

    name = pio.templates.default
    if name not in _TEMPLATES:
        template = pio.templates[name].to_plotly_json() if name else {}  # (a copy: plotly's to_plotly_json copies)
        layout, data = template.setdefault("layout", {}), template.setdefault("data", {})
        for axis in ("xaxis", "yaxis"):
            layout.setdefault(axis, {})["ticklabeloverflow"] = "allow"
        for trace, path in (("heatmap", ("colorbar",)), ("scatter", ("marker", "colorbar"))):
            entries = data.setdefault(trace, [{}])
            for entry in entries:
                node = entry
                for key in path:
                    node = node.setdefault(key, {})
                node["ticklabeloverflow"] = "allow"
        _TEMPLATES[name] = template
    return _TEMPLATES[name]


# Margins that already hold what a figure draws in them (tick labels, axis titles, the colour bar, a legend):
# plotly.js measures those after drawing the figure and, when they need more room than the layout's margins give,
# grows the margins and draws the whole figure again ("auto-margin": about 15% of the browser's time for a Step of
# the page, issue #26). Margins at least as wide as what it measures are kept as they are: one drawing. An estimate
# that falls short costs only the second drawing (the figure still grows its margins), never a label cut off.
COLORBAR_PX = 125  # right of the plot: the colour bar (thickness 12-14), its tick labels and its two-line title
TICK_CHAR_PX = 7.5  # a character of a 12 px tick label (plotly.js's default font), rounded up
AXIS_TITLE_PX = 34  # an axis title beside its tick labels, with plotly.js's gaps


def label_px(labels, font_size: int = 12) -> int:
    """The width in px a column of these tick labels takes (the longest, rounded up): the room a margin leaves for
    them beside an axis."""
    longest = max((len(str(label)) for label in labels), default=0)
    return int(longest * TICK_CHAR_PX * font_size / 12 + 0.999)


# Character widths of plotly.js's default font as Chromium draws it (Open Sans, else its fallback DejaVu Sans, the
# wider; measured at 11 px), in ems, rounded up: what text_px estimates a label's drawn width from.
_NARROW, _SEMI, _WIDE = set("'ijlI.,:;|!/\\J\u00b7 "), set("ft-()[]r\"`*_sz?"), set("mwMW%@\u2026\u2205")
_SYMBOL = set("\u23ce\u21e5=+<>#^~&")


def _char_em(ch: str) -> float:
    import unicodedata

    if ch in _NARROW:
        return 0.33
    if ch in _SEMI:
        return 0.53
    if ch in _WIDE or unicodedata.east_asian_width(ch) in "WF":
        return 1.0
    if ch in _SYMBOL:
        return 0.85
    return 0.8 if ch.isupper() else 0.65


def text_px(text: str, font_size: float) -> float:
    """An estimate of the width in px plotly.js draws `text` at `font_size` px (plain text: no markup), on the
    generous side (an estimate that falls short lets two labels touch)."""
    return sum(_char_em(ch) for ch in text) * font_size


def title_axis_px(labels, pad: int = 6) -> int:
    """The margin beside a titled axis: its title, its tick labels (`labels`: the widest ones it draws, label_px)
    and `pad` px."""
    return AXIS_TITLE_PX + label_px(labels) + pad


def bottom_legend() -> dict:
    """A horizontal legend at the figure's bottom edge, in the bottom margin (the figure leaves room for it: an axis
    title, then two lines of legend). A legend placed in fractions of the plot (y=-0.2) lands on the x axis's
    title whenever the figure is short (issue #26)."""
    return dict(orientation="h", yref="container", yanchor="bottom", y=0.0, x=0)


_COLORSCALES: dict[str, list] = {}


def colorscale(value: Any) -> Any:
    """A named colorscale ('Viridis', 'viridis_r', ...) as the explicit [[position, colour], ...] list plotly.py
    writes for it (plotly.js knows fewer names, and some with other stops); a list passes through."""
    if not isinstance(value, str):
        return value
    if value not in _COLORSCALES:
        from _plotly_utils.basevalidators import ColorscaleValidator  # what go.Figure coerces a name with

        _COLORSCALES[value] = [list(pair) for pair in ColorscaleValidator("colorscale", "coloraxis").validate_coerce(value)]
    return _COLORSCALES[value]


def _plain(value: Any) -> Any:
    """numpy arrays as plotly.js typed-array specs (base64, as plotly.py writes them), numpy scalars as numbers
    (json.dumps' `default`)."""
    if type(value).__name__ == "ndarray":
        from _plotly_utils.utils import to_typed_array_spec

        spec = to_typed_array_spec(value)
        if isinstance(spec, dict):
            return spec
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _finite(value: Any) -> Any:
    """NaN and ±inf become null (as plotly's own JSON encoder writes them)."""
    if hasattr(value, "tolist") and not isinstance(value, (list, tuple, dict, str)):
        value = value.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


@dataclass
class FigureSpec:
    """`data`: plotly trace dicts; `layout`: a plotly layout dict. JSON values, and numpy arrays (the mask)."""

    data: list[dict] = field(default_factory=list)
    layout: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        layout = self.layout
        if "template" not in layout:
            template = _template()
            if template is not None:
                layout = {**layout, "template": template}
        return {"data": self.data, "layout": layout}

    def to_json(self) -> str:
        """The figure's JSON for plotly.js (gradio's Plot sends what this returns)."""
        d = self.to_dict()
        try:
            return json.dumps(d, allow_nan=False, separators=(",", ":"), default=_plain)
        except ValueError:  # a NaN or an infinity somewhere: null, as plotly writes it
            return json.dumps(_finite(d), separators=(",", ":"))

    def figure(self):
        """The same figure as a checked plotly go.Figure (every property validated)."""
        import plotly.graph_objects as go

        return go.Figure(data=self.data, layout=self.to_dict()["layout"])


__all__ = ["AXIS_TITLE_PX", "COLORBAR_PX", "FigureSpec", "bottom_legend", "colorscale", "label_px", "text_px",
           "title_axis_px"]

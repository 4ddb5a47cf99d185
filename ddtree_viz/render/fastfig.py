"""Plotly figures from plain dicts, without plotly's per-property validation.

The page redraws its figures on every Step (the draft tree, the verify mask, the cache per layer, tokens per
round). Built through plotly's validating constructors (`go.Bar(...)`, `fig.update_layout(...)`,
`fig.add_shape(...)`), most of their cost was that validation: about four fifths of a Step's 33 ms of views at
budget 64 on a 600-token prompt. The renderers build their traces and layouts as plain dicts and hand them to
`figure`, which wraps them as they are; `tests/test_render.py` validates every page figure afterwards, so a
misspelt property still fails a test instead of being ignored by plotly.js.
"""

from __future__ import annotations

from collections.abc import Iterable

import plotly.graph_objects as go


def figure(data: Iterable[dict], layout: dict) -> go.Figure:
    """A go.Figure of these trace dicts (each with its "type") and this layout dict, unvalidated."""
    return go.Figure(data=list(data), layout=layout, _validate=False)


def colorscale(value):
    """A colour scale as plotly.js reads it: a name (which validation would have expanded, and which plotly.js
    may not know: it has a few scales of its own) becomes its [[position, colour], ...] list."""
    if isinstance(value, str):
        from plotly.colors import get_colorscale

        return [[float(p), c] for p, c in get_colorscale(value)]
    return value


def two_panels(titles: tuple[str, str], spacing: float = 0.12) -> dict:
    """Layout entries for two plots side by side, as `make_subplots(rows=1, cols=2, subplot_titles=titles,
    horizontal_spacing=spacing)` lays them out: axes x/y and x2/y2 on their domains, the titles as annotations
    (a dict to merge into the layout; put further annotations after its "annotations")."""
    width = (1 - spacing) / 2
    domains = ([0.0, width], [1 - width, 1.0])
    return dict(
        xaxis=dict(domain=domains[0], anchor="y"), yaxis=dict(domain=[0.0, 1.0], anchor="x"),
        xaxis2=dict(domain=domains[1], anchor="y2"), yaxis2=dict(domain=[0.0, 1.0], anchor="x2"),
        annotations=[dict(text=t, x=sum(d) / 2, y=1.0, xref="paper", yref="paper", xanchor="center", yanchor="bottom",
                          showarrow=False, font=dict(size=16)) for t, d in zip(titles, domains)],
    )


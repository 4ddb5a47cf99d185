"""Shared visual vocabulary: every backend (plotly now, vector exporters later) reads its colours and
marker shapes from here, so the page and the exported figures agree.

Colours follow the Okabe-Ito colour-blind-safe palette; log-probs use a perceptually uniform,
colour-blind-safe scale (viridis by default; cividis and greys also fit print)."""

from __future__ import annotations

DEFAULT_COLORSCALE = "Viridis"
PRINT_COLORSCALE = "Greys"

PATH_COLOR = "#D55E00"  # vermillion: accepted path edges, node outlines, bonus
REJECTED_COLOR = "#000000"  # outline of the first rejected candidates
EDGE_COLOR = "#9a9a9a"
NEUTRAL_FILL = "#dddddd"  # nodes with no drafter log-prob (root)
BONUS_FILL = "#F0E442"  # yellow: the target's own token (not drafted)
ATTENTION_COLOR = "#0072B2"  # blue: attention layers
GDN_COLOR = "#009E73"  # green: Gated DeltaNet layers
DIVERGE_COLOR = "#C0392B"  # red: differs from greedy
MASK_VISIBLE = "#31688e"
MASK_HIDDEN = "#f2f2f2"
MASK_MAX_TICKS = 64  # beyond this many tree positions, a mask labels every k-th one
MASK_LABEL_CHARS = 8  # a mask's token labels are cut to this many characters

ROLE_SYMBOL = {
    "root": "square",
    "accepted": "circle",
    "first_rejected": "diamond",  # filled, so its log-prob colour still shows
    "bonus": "star",
    "other": "circle",
}
ROLE_NAME = {
    "root": "root (last committed token)",
    "accepted": "accepted path",
    "first_rejected": "first rejected (drafter's candidates)",
    "bonus": "bonus (target's token)",
    "other": "drafted",
}
NODE_SIZE = 16
PATH_EDGE_WIDTH = 4
EDGE_WIDTH = 1
PATH_OUTLINE_WIDTH = 3

LAYER_TYPE_NAME = {"linear_attention": "GDN", "full_attention": "attention"}


def layer_type_name(raw: str) -> str:
    """'linear_attention' -> 'GDN', 'full_attention' -> 'attention', anything else as is."""
    return LAYER_TYPE_NAME.get(raw, raw)


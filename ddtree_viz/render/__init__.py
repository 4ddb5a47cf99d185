"""Pure renderers: records (ddtree_viz.trace) in, figures / text out. No gradio, torch or engine imports.

One layout (layout.tree_layout) feeds every tree backend, and layout.py holds the rules they share (which edges
are the accepted path, where the path label goes, legend entries, draw order); every renderer takes a colour
Scheme (scheme.py; the page's is the colour-blind one) and style.py holds the page's colours and markers."""

from .budget_view import budget_figure, depth_figure
from .cache_view import cache_figure, cache_layout_table, cache_table
from .diff_view import compare_with_greedy, output_vs_greedy_html, token_sources
from .compare_view import compare_html
from .divergence_view import divergence_html, divergence_rows
from .grid_view import grid_data, grid_figure
from .inspect_view import inspector_html, node_choices, stop_html
from .layout import LayoutEdge, LayoutNode, TreeLayout, for_phase, node_colors, tree_layout
from .mask_plot import mask_figure, verify_mask
from .stats_view import acceptance_figure, stats_markdown, stats_summary
from .text import esc, visible
from .tree_plot import tree_figure

__all__ = [
    "LayoutEdge", "LayoutNode", "TreeLayout", "acceptance_figure", "budget_figure", "compare_html", "depth_figure",
    "grid_data", "grid_figure", "inspector_html", "node_choices", "stop_html", "cache_figure", "cache_layout_table", "cache_table", "compare_with_greedy",
    "divergence_html", "divergence_rows", "esc", "for_phase", "mask_figure", "node_colors", "output_vs_greedy_html",
    "stats_markdown", "stats_summary", "token_sources", "tree_figure", "tree_layout", "verify_mask", "visible",
]

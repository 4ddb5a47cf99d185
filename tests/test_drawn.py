"""The page's figures as plotly.js draws them (issue #26.8): each FigureSpec drawn in headless Chromium by the same
plotly.js version gradio bundles, with gradio's own changes to a figure (gr.Plot: autosize, responsive, top margin at
least 100 px under a title, margins that grow), then the drawn boxes measured: no label under another node's marker,
no axis title on a legend or colour bar, no title on the rotated tick labels, each legend entry once. No app, no
model: a tiny pair's rounds, so these run in seconds."""

import json
from pathlib import Path

import plotly
import pytest

from ddtree_viz.engine.session import DecodeSession
from ddtree_viz.render.budget_view import budget_spec, depth_spec
from ddtree_viz.render.cache_view import cache_spec
from ddtree_viz.render.grid_view import grid_data, grid_spec
from ddtree_viz.render.layout import tree_layout
from ddtree_viz.render.mask_plot import mask_spec
from ddtree_viz.render.stats_view import acceptance_spec
from ddtree_viz.render.tree_plot import tree_spec
from tests.test_browser import ARGS, CHROMIUM, FIGURE_BOXES_JS, collisions, pytestmark, quad_overlap  # noqa: F401 - skipped where
# test_browser is
from tests.tiny import tiny_pair

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"

# what gradio's Plot does to a figure before Plotly.react (gradio/templates/frontend/assets/PlotlyPlot-*.js), and the
# boxes of what was drawn, by kind
DRAW_JS = """
async ([fig, width]) => {
  const div = document.getElementById('g');
  Plotly.purge(div);  // a new figure, as gradio's Plot draws each new figure into a new div (no state of the last)
  div.style.width = width + 'px';
  fig.config = {responsive: true, displayModeBar: true};
  fig.layout.autosize = true;
  fig.layout.margin = fig.layout.margin || {};
  if (fig.layout.title) fig.layout.margin.t = Math.max(100, fig.layout.margin.t || 0);
  fig.layout.margin.autoexpand = true;
  await Plotly.react(div, fig.data, fig.layout, fig.config);
  const box = (el) => { const r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const all = (sel) => [...div.querySelectorAll(sel)].filter((el) => {
    const r = el.getBoundingClientRect(); return r.width > 0 && r.height > 0; }).map(box);
  const markers = [...div.querySelectorAll('.scatterlayer .trace')].map((t, i) =>
    [...t.querySelectorAll('.points path.point')].map((p, j) => [i, j, ...box(p)])).flat();
  const labels = [...div.querySelectorAll('.scatterlayer .trace')].map((t, i) =>
    [...t.querySelectorAll('.text text')].map((p, j) => [i, j, ...box(p)])).flat();
  return {title: all('.gtitle'), xtitle: all('.g-xtitle'), ytitle: all('.g-ytitle'), legend: all('.legend .bg'),
          colorbar: all('.colorbar'), cbtitle: all('.colorbar .cbtitle'), modebar: all('.modebar'),
          xticks: all('.xaxislayer-above .xtick text'), markers, labels,
          legend_names: [...div.querySelectorAll('.legend .traces .legendtext')].map((t) => t.textContent),
          yticks: all('.yaxislayer-above .ytick text'),
          size: ['l', 'r', 't', 'b'].map((k) => div._fullLayout._size[k]),
          margin: ['l', 'r', 't', 'b'].map((k) => fig.layout.margin[k]),
          main: box(div.querySelector('.main-svg'))};
}
"""


@pytest.fixture(scope="module")
def draw():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.set_content("<html><body style='margin:0'><div id='g'></div></body></html>")
        page.add_script_tag(path=str(PLOTLY_JS))

        def drawn(spec, width: int = 1190) -> dict:
            return page.evaluate(DRAW_JS, [json.loads(spec.to_json()), width])

        drawn.page = page
        drawn.svg_page = browser.new_page(viewport={"width": 1500, "height": 1100})  # an export's SVG, shown alone
        yield drawn
        browser.close()


def decoded(budget: int, max_new_tokens: int):
    """A whole session's trace on the tiny hybrid pair (its random drafter's candidates are near uniform: wide
    columns of siblings)."""
    s = DecodeSession.of(tiny_pair("hybrid"), budget=budget, max_new_tokens=max_new_tokens)
    s.prefill("def f(x):\n")
    s.run()
    return s.to_trace()


@pytest.fixture(scope="module")
def trace():
    """Budget 32: wide columns of siblings."""
    return decoded(32, 24)


def overlap(a, b, slack: float = 0.5) -> bool:
    """Two boxes [left, top, right, bottom] overlap (by more than `slack` px each way)."""
    return min(a[2], b[2]) - max(a[0], b[0]) > slack and min(a[3], b[3]) - max(a[1], b[1]) > slack


def overlaps(boxes_a, boxes_b) -> list:
    return [(a, b) for a in boxes_a for b in boxes_b if overlap(a, b)]


def tallest_column_step(trace):
    """The round with the most siblings in one depth column."""
    def widest(step):
        depths = [n.depth for n in step.nodes]
        return max(depths.count(d) for d in set(depths))
    return max(trace.steps, key=widest)


@pytest.fixture(scope="module")
def oracle_trace():
    """Greedy's tokens drafted at ranks 0/1/2: long accepted paths, the bonus star in the deepest column."""
    from ddtree_viz.engine.oracle import OracleProposer
    from tests.test_exactness import greedy_ids

    pair = tiny_pair("hybrid")
    ids, greedy = greedy_ids(pair, "def f(x):\n")
    proposer = OracleProposer(greedy, len(ids), [0, 1, 2], pair.target.config.vocab_size)
    s = DecodeSession.of(pair, budget=32, max_new_tokens=24, proposer=proposer)
    s.prefill("def f(x):\n")
    s.run()
    return s.to_trace()


WIDTHS = (1190, 590)  # the tree's panel at 1500x1100; half of it (compare mode, the two-figure rows)


def test_tree_labels_clear_the_other_nodes_the_axis_title_and_the_colour_bar(draw, trace, oracle_trace):
    """Issue #26.8: in a tall column of siblings each label sat half under the next node's marker (`·to r4` drew as
    `·t● r4`); 'accepted path' was twice in the legend; the depth axis's title sat on the legend in short figures;
    the colour bar's title on the bonus star's label."""
    deepest = max(oracle_trace.steps, key=lambda s: max(n.depth for n in s.nodes))
    for step in (tallest_column_step(trace), deepest, oracle_trace.steps[0]):
        spec = tree_spec(tree_layout(step))
        for width in WIDTHS:
            d = draw(spec, width)
            assert d["labels"] and d["markers"]
            covered = [(label, m) for label in d["labels"] for m in d["markers"]
                       if label[:2] != m[:2] and overlap(label[2:], m[2:])]
            assert not covered, (step.index, width, covered[:3])
            labels = [label[2:] for label in d["labels"]]
            assert not overlaps(d["cbtitle"] + d["colorbar"], labels), (step.index, width)
            assert not overlaps(d["xtitle"] + d["xticks"], d["legend"]), (step.index, width)
            assert len(d["legend_names"]) == len(set(d["legend_names"])), d["legend_names"]


def test_mask_title_clears_the_key_labels_and_the_toolbar(draw, trace, oracle_trace):
    """Issue #26.8: the mask's title sat over its rotated prefix label, and the keys' axis title under the plotly
    toolbar (drawn here as gradio's Plot draws it on hover)."""
    for step in (tallest_column_step(trace), oracle_trace.steps[0]):
        for width in WIDTHS:
            d = draw(mask_spec(step), width)
            assert d["title"] and d["xticks"] and d["modebar"]
            assert not overlaps(d["title"] + d["xtitle"], d["xticks"]), (step.index, width)
            assert not overlaps(d["title"] + d["xtitle"], d["modebar"]), (step.index, width)


def test_cache_chart_layer_title_clears_its_legend(draw, trace):
    """Issue #26.8: the cache chart's 'layer' axis title sat on its legend."""
    for width in WIDTHS:
        d = draw(cache_spec(trace.steps[0]), width)
        assert d["legend"] and d["xtitle"]
        assert not overlaps(d["xtitle"] + d["xticks"], d["legend"]), width


def test_other_figures_keep_their_titles_off_their_legends(draw, trace, oracle_trace):
    """The grid, acceptance, budget and depth figures: axis titles off their legends, each legend entry once."""
    step = oracle_trace.steps[0]
    specs = (grid_spec(grid_data(step, None)), acceptance_spec(oracle_trace.steps), budget_spec(oracle_trace.steps),
             depth_spec(oracle_trace.steps, 16))
    for spec in specs:
        for width in WIDTHS:
            d = draw(spec, width)
            assert not overlaps(d["xtitle"], d["legend"]), (spec.layout.get("title"), width)
            assert len(d["legend_names"]) == len(set(d["legend_names"])), d["legend_names"]


@pytest.fixture(scope="module")
def big_trace():
    """Budget 128: a mask of 129 x 130 cells, the tree at its largest on the page's default budgets."""
    return decoded(128, 12)


def test_each_figure_is_laid_out_once_its_margins_hold_what_it_draws(draw, trace, oracle_trace, big_trace):
    """Issue #26.10: plotly.js measures the tick labels, axis titles, colour bar and legend it drew and, when the
    layout's margins are narrower than those, grows them and draws the whole figure a second time (~15% of the
    browser's time for a Step). Every page figure leaves margins that hold what it draws: the margins plotly.js
    ends with are the figure's own (one drawing), at the width each has on the page at 1500x1100 (the tree and the
    grid across it, the others in half-width columns), at budgets 32 and 128. (Compare mode's half-width trees,
    whose legend wraps to a third line: test_trees_at_the_pages_widths_label_what_fits_and_say_so.)"""
    steps = oracle_trace.steps
    full, half = WIDTHS
    for step in (tallest_column_step(trace), steps[0], big_trace.steps[0]):
        specs = {"tree": (tree_spec(tree_layout(step)), full), "grid": (grid_spec(grid_data(step, None)), full),
                 "mask": (mask_spec(step), half), "cache": (cache_spec(step), half)}
        if step is steps[0]:
            specs.update(acceptance=(acceptance_spec(steps), half), budget=(budget_spec(steps), half),
                         depth=(depth_spec(steps, 16), half))
        for name, (spec, width) in specs.items():
            d = draw(spec, width)
            grown = [abs(a - b) > 1 for a, b in zip(d["size"], d["margin"])]
            assert not any(grown), (name, len(step.nodes), width, d["margin"], d["size"])


def test_mask_labels_what_can_be_read_and_hovers_every_position(draw, big_trace):
    """Issue #26.10: at budget 128 the mask labelled 64 keys over ~440 px (rotated labels on top of each other), each
    measured by plotly.js in the browser. It labels at most 24 keys (mask_plot.KEY_TICKS) and a query every ~15
    px or more, drawn apart; the hover still names every position (the heatmap's categories are all the labels)."""
    from ddtree_viz.render.mask_plot import tick_labels

    step = big_trace.steps[0]
    assert len(step.nodes) > 100
    spec = mask_spec(step)
    rows, cols, _ = tick_labels(step)
    heat = spec.data[0]
    assert len(heat["y"]) == len(rows) == len(step.nodes) and len(heat["x"]) == len(cols) == len(step.nodes) + 1
    assert "%{x}" in heat["hovertemplate"] and "%{y}" in heat["hovertemplate"]
    d = draw(spec, 590)
    assert 4 <= len(d["xticks"]) <= 24, len(d["xticks"])
    assert 8 <= len(d["yticks"]) <= (spec.layout["height"] - 190) // 15 + 1, len(d["yticks"])
    tops = sorted(box[1] for box in d["yticks"])
    assert min(b - a for a, b in zip(tops, tops[1:])) >= 14  # rows labelled apart (a 12 px font)
    lefts = sorted(box[0] for box in d["xticks"])
    assert min(b - a for a, b in zip(lefts, lefts[1:])) >= 12  # keys labelled apart


def boxes_drawn(draw) -> list[dict]:
    """FIGURE_BOXES_JS on the figure `draw` drew last."""
    return draw.page.evaluate(FIGURE_BOXES_JS, "body")


@pytest.fixture(scope="module")
def chain_step():
    """A DFlash chain of 15 drafts (block 16), its tokens made words (' word7'): B's tree in compare mode, where a
    label is wider than a column of half the page."""
    import dataclasses

    s = DecodeSession.of(tiny_pair("hybrid", block_size=16), budget=16, max_new_tokens=16, method="dflash")
    s.prefill("def f(x):\n")
    step = s.step()
    assert max(n.depth for n in step.nodes) == 15
    return dataclasses.replace(step, nodes=tuple(dataclasses.replace(n, token=f" word{n.id}") for n in step.nodes))


def test_trees_at_the_pages_widths_label_what_fits_and_say_so(draw, trace, oracle_trace, big_trace, chain_step):
    """#65.3: at the widths the page draws the tree (alone, and in compare mode's half), no node label is on another
    or on a node, the axis and colour bar labels on nothing; a tree whose labels cannot all fit (budget 128, the
    chain in half the width) shows those that do, its depth axis saying so, and its hover still names every node.
    Drawn once: the margins hold the half-width figure's three lines of legend."""
    from ddtree_viz.page.views import TREE_PX, TREE_PX_COMPARE

    thinned = 0
    for step in (tallest_column_step(trace), oracle_trace.steps[0], big_trace.steps[0], chain_step):
        layout = tree_layout(step)
        for width, title in ((TREE_PX, None), (TREE_PX_COMPARE, "A: DDTree budget 128\nround 1 · 3 tokens")):
            spec = tree_spec(layout, width=width, title=title)
            d = draw(spec, width)
            drawn = boxes_drawn(draw)
            bad = collisions(drawn) + marker_clear(drawn)  # a label beside its own diamond too (issue #65)
            assert not bad, (step.index, width, len(bad), bad[:6])
            texts = [t for tr in spec.data if tr.get("text") for t in tr["text"]]
            assert len(texts) == len(layout.nodes) and all(tr.get("hovertext") for tr in spec.data[3:])
            shown = sum(1 for t in texts if t)
            axis = spec.layout["xaxis"]["title"]["text"]
            assert ("labels thinned" in axis) == (shown < len(texts)), (axis, shown, len(texts))
            thinned += shown < len(texts)
            assert [abs(a - b) <= 1 for a, b in zip(d["size"], d["margin"])] == [True] * 4, (width, d["size"])
    assert thinned  # the chain in half the page: some left to the hover


@pytest.fixture(scope="module")
def straight_trace():
    """The DFlash chain drafting greedy's tokens at rank 0: every draft accepted, the path one straight row."""
    from ddtree_viz.engine.oracle import OracleProposer
    from tests.test_exactness import greedy_ids

    pair = tiny_pair("hybrid")
    ids, greedy = greedy_ids(pair, "def f(x):\n")
    proposer = OracleProposer(greedy, len(ids), [0], pair.target.config.vocab_size)
    s = DecodeSession.of(pair, budget=8, max_new_tokens=16, proposer=proposer, method="dflash")
    s.prefill("def f(x):\n")
    s.run()
    return s.to_trace()


def test_exported_trees_and_grids_keep_their_labels_clear(draw, oracle_trace, trace, straight_trace):
    """#65.3: an exported tree's "accepted path" sat on the root, the first node and its rank where the path ran
    straight; the exported grid's path line, its dots and the stop's X lay on the accepted cells' tokens. As
    Chromium draws the SVG: no label on another or on a marker, and the path's label placed where it is clear."""
    from ddtree_viz.render import export as ex

    deepest = max(oracle_trace.steps, key=lambda s: max(n.depth for n in s.nodes))
    page = draw.svg_page
    for tr, step in ((straight_trace, straight_trace.steps[0]), (oracle_trace, deepest),
                     (trace, tallest_column_step(trace))):
        for figure in ("tree", "grid"):
            svg = ex.export_figure(tr, step.index + 1, "svg", figure=figure).decode()
            page.set_content(f"<html><body style='margin:0'><div id='fig'>{svg}</div></body></html>")
            figures = page.evaluate(FIGURE_BOXES_JS, "#fig")
            assert figures and (figures[0]["markers"] or figure == "grid"), figure  # (the grid: outlines, no markers)
            bad = collisions(figures)
            assert not bad, (figure, step.index, bad[:6])
            assert figure == "grid" or 'id="ddt-path-label"' in svg, step.index  # placed, not left out
            if figure == "tree":  # clear of every marker's outline by a hair, its own too (see marker_clear)
                bad = marker_clear(figures)
                assert not bad, (step.index, len(bad), bad[:6])


# Every edge of an exported tree that runs through a node label's letters, and whether the label lies on a patch of
# the background drawn after that edge (so the line stops at the label's box): {label, edge, backed}
EDGES_UNDER_LABELS_JS = r"""
(scope) => {
  const svg = document.querySelector(scope + ' svg');
  const screen = (el, p) => { const m = el.getScreenCTM(); return [m.a * p.x + m.c * p.y + m.e, m.b * p.x + m.d * p.y + m.f]; };
  const edges = [...svg.querySelectorAll('#ddt-edges path, [id^="ddt-path-edge-"] path, #ddt-bonus-edge path')].map((p) =>
    ({el: p, a: screen(p, p.getPointAtLength(0)), b: screen(p, p.getPointAtLength(p.getTotalLength()))}));
  const crosses = ({a, b}, r) => {  // the segment meets the box [x0, y0, x1, y1]
    const [x0, y0, x1, y1] = r;
    for (let i = 0; i <= 200; i++) {
      const x = a[0] + (b[0] - a[0]) * i / 200, y = a[1] + (b[1] - a[1]) * i / 200;
      if (x > x0 && x < x1 && y > y0 && y < y1) return true;
    }
    return false;
  };
  const out = [];
  svg.querySelectorAll('[id^="ddt-label-"]').forEach((g) => {
    const text = g.querySelector('text');
    if (!text || !text.textContent.trim()) return;
    // the letters' band: the text's box less a px at each end and a quarter of its height (the font's ascent and
    // descent, above and below the letters) at the top and the bottom
    const t = text.getBoundingClientRect(), h = t.bottom - t.top;
    const r = [t.left + 1, t.top + h / 4, t.right - 1, t.bottom - h / 4];
    const patch = [...g.querySelectorAll('path')].find((p) => {
      const q = p.getBoundingClientRect();
      return getComputedStyle(p).fill === 'rgb(255, 255, 255)' && q.left <= r[0] && q.top <= r[1] && q.right >= r[2] &&
        q.bottom >= r[3];
    });
    edges.filter((e) => crosses(e, r)).forEach((e) => out.push({label: text.textContent, edge: e.el.parentElement.id,
      backed: !!patch && !!(e.el.compareDocumentPosition(patch) & Node.DOCUMENT_POSITION_FOLLOWING)}));
  });
  return out;
}
"""


def test_no_edge_runs_through_an_exported_label(draw, trace, oracle_trace):
    """An exported tree's labels beside their nodes sit on the level of the edges that leave them (to a child in
    the same row, the path's next node): the line ran through the letters ("la r0" struck through on its way to
    its child). Each label an edge crosses lies on a patch of the background drawn after the edge."""
    from ddtree_viz.render import export as ex

    page, crossed = draw.svg_page, 0
    for tr, step in ((trace, tallest_column_step(trace)), (oracle_trace, oracle_trace.steps[0])):
        svg = ex.export_figure(tr, step.index + 1, "svg").decode()
        page.set_content(f"<html><body style='margin:0'><div id='fig'>{svg}</div></body></html>")
        found = page.evaluate(EDGES_UNDER_LABELS_JS, "#fig")
        assert [f for f in found if not f["backed"]] == [], step.index
        crossed += len(found)
    assert crossed  # (these trees have labels beside their nodes, with edges through them)


def widened(quad: list, px: float) -> list:
    """A convex quadrilateral (four corners) moved out from its centre by `px` to the left and to the right."""
    cx = sum(p[0] for p in quad) / 4
    return [[x + px * ((x > cx) - (x < cx)), y] for x, y in quad]


def marker_clear(figures: list[dict], px: float = 1.0) -> list[str]:
    """Each label level with a marker that comes within `px` of its shape to its left or right (its own node's
    included: an SVG
    export's labels and markers are not paired), by more than a quarter px. The shape (getBBox) leaves out the
    marker's outline, about half a point each way: at 6 pt the labels beside diamonds started half a size from the
    centre, on the diamond's tips (issue #65). (Not up or down: a text's box there is the font's whole ascent, above
    the letters.)"""
    at = lambda quad: [round(v) for v in (*quad[0], *quad[2])]  # noqa: E731 - its upright box, px
    middle = lambda quad: sum(p[1] for p in quad) / 4  # noqa: E731
    beside = lambda a, m: min(p[1] for p in m) <= middle(a) <= max(p[1] for p in m)  # noqa: E731 - level with it
    return [f"{fig['figure']}: {a['kind']} {a['text']!r} at {at(a['box'])} within {px} px of a marker at {at(m['box'])}"
            for fig in figures for a in fig["labels"] for m in fig["markers"]
            if beside(a["box"], m["box"]) and quad_overlap(a["box"], widened(m["box"], px)) > 0.25]


def test_report_bar_labels_fit_under_their_bars(draw):
    """#65.3: the Analyze tab's stop-rank chart drew up to 16 labels level whatever their length: "not drafted" ran
    into the ranks beside it. Level where they fit, else upright, else every n-th upright (and the last)."""
    from ddtree_viz.render import report

    page = draw.svg_page
    for n in (4, 16, 40, 120):
        ranks = {str(r): r % 5 + 1 for r in range(n - 1)} | {"not drafted": 3}
        svg = report.figure({"stop_rank_histogram": ranks}, "stop_rank").decode()
        page.set_content(f"<html><body style='margin:0'><div id='fig'>{svg}</div></body></html>")
        figures = page.evaluate(FIGURE_BOXES_JS, "#fig")
        texts = [label["text"] for label in figures[0]["labels"]]
        assert "not drafted" in texts and "0" in texts, n
        bad = collisions(figures)
        assert not bad, (n, bad[:6])

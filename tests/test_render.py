"""render/: pure functions from real engine records (tiny models, CPU) to figures and text."""

import dataclasses
from html.parser import HTMLParser
from pathlib import Path

import pytest

from ddtree_viz.engine.session import DecodeSession
from ddtree_viz.render import (
    acceptance_figure, cache_figure, cache_layout_table, cache_table, compare_with_greedy, divergence_html,
    divergence_rows, for_phase, mask_figure, node_colors, output_vs_greedy_html, stats_markdown, stats_summary,
    token_sources, tree_figure, tree_layout, verify_mask,
)
from ddtree_viz.render import style
from ddtree_viz.render.layout import DEFAULT_LABEL_CHARS
from ddtree_viz import analysis
from ddtree_viz.render.budget_view import budget_figure, depth_figure
from ddtree_viz.render.compare_view import compare_html
from ddtree_viz.render.style import DIVERGE_COLOR
from ddtree_viz.render.grid_view import grid_data, grid_figure
from ddtree_viz.render.inspect_view import inspector_html, node_choices, stop_html
from ddtree_viz.render.text import esc, lookup, shorten, token_texts_from_steps, unknown_token, visible
from ddtree_viz.render.tree_plot import node_hover
from ddtree_viz.trace import Trace
from ddtree_viz.engine.oracle import OracleProposer
from tests.test_exactness import greedy_ids, sibling_oracle
from tests.tiny import tiny_pair

PROMPT = "def f(x):\n"
EVIL = ("<script>alert(1)</script>", "<img src=x onerror=alert(1)>")


@pytest.fixture(scope="module")
def pair():
    return tiny_pair("hybrid")


@pytest.fixture(scope="module")
def plain(pair):
    """The tiny DFlash drafter: random, so mostly root-only acceptance; identical to greedy (exact)."""
    s = DecodeSession(pair, budget=16, max_new_tokens=24)
    s.prefill(PROMPT)
    s.run()
    return s.to_trace()


@pytest.fixture(scope="module")
def oracle(pair):
    """Drafts greedy's tokens at ranks 0/1/2: long accepted paths, first-rejected siblings, deep trees."""
    ids, greedy = greedy_ids(pair, PROMPT)
    proposer = OracleProposer(greedy, len(ids), [0, 1, 2], pair.target.config.vocab_size)
    s = DecodeSession(pair, budget=32, max_new_tokens=24, proposer=proposer)
    s.prefill(PROMPT)
    s.run()
    trace = s.to_trace()
    assert max(st.acceptance for st in trace.steps) >= 3
    return trace


@pytest.fixture(scope="module")
def naive(pair):
    """Naive (flattened-tree) verification with the true token at rank 1: diverges from greedy."""
    proposer, _ = sibling_oracle(pair, PROMPT)
    s = DecodeSession(pair, budget=16, max_new_tokens=24, verify="naive", proposer=proposer)
    s.prefill(PROMPT)
    s.run()
    trace = s.to_trace()
    assert trace.first_divergence is not None
    return trace


def rich_steps(trace):
    return [st for st in trace.steps if st.acceptance >= 2 and any(n.parent == st.accepted[-1] for n in st.nodes)]


def subtree(step, node_id):
    out, frontier = {node_id}, [node_id]
    while frontier:
        kids = [n.id for n in step.nodes if n.parent in frontier]
        out.update(kids)
        frontier = kids
    return out


def all_strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from all_strings(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from all_strings(v)


# ---------------------------------------------------------------------------------------------------------
# text helpers
# ---------------------------------------------------------------------------------------------------------


def test_visible_and_esc():
    assert visible(" a\tb\n") == "·a⇥b⏎"
    assert visible("\r\x00\x1b\x7f") == "\\x0d\\x00\\x1b\\x7f"
    assert visible("\u200b\u00a0") == "\\u200b\\u00a0"
    assert visible("") == "∅"
    assert visible("héllo€") == "héllo€"
    assert esc('<a href="x">\'&') == "&lt;a href=&quot;x&quot;&gt;&#x27;&amp;"


# ---------------------------------------------------------------------------------------------------------
# layout
# ---------------------------------------------------------------------------------------------------------


def test_layout_has_every_node_plus_the_bonus_and_the_accepted_path(oracle, plain):
    for step in oracle.steps + plain.steps:
        lay = tree_layout(step)
        real = [n for n in lay.nodes if not n.synthetic]
        bonus = [n for n in lay.nodes if n.synthetic]
        assert [n.id for n in real] == [n.id for n in step.nodes]
        assert len(bonus) == 1 and bonus[0].role == "bonus" and bonus[0].token_id == step.bonus_token_id
        assert bonus[0].parent == step.accepted[-1] and bonus[0].depth == step.nodes[step.accepted[-1]].depth + 1
        assert tuple(n.id for n in real if n.on_path) == step.accepted
        assert {n.id for n in real if n.role == "first_rejected"} == {
            n.id for n in step.nodes if n.parent == step.accepted[-1]}
        assert lay.node(0).role == "root"
        assert all(n.role == "accepted" for n in real if n.on_path and n.id != 0)
        for n in real:
            src = step.nodes[n.id]
            expected = (src.token_id, src.depth, src.rank, step.target_argmax[n.id])
            assert (n.token_id, n.depth, n.rank, n.argmax) == expected
            assert n.label == shorten(visible(src.token), DEFAULT_LABEL_CHARS)
        path_edges = {(e.parent, e.child) for e in lay.edges if e.on_path}
        assert path_edges == set(zip(step.accepted, step.accepted[1:]))


def test_layout_is_tidy_no_overlap_parents_left_of_children(oracle):
    for step in oracle.steps:
        lay = tree_layout(step)
        assert len({(n.x, n.y) for n in lay.nodes}) == len(lay.nodes)
        for n in lay.nodes:
            if n.parent >= 0:
                assert lay.node(n.parent).x == n.x - 1
        # sibling subtrees own disjoint row bands, ordered by rank
        for parent in step.nodes:
            kids = sorted((n for n in step.nodes if n.parent == parent.id), key=lambda n: n.rank)
            bands = []
            for k in kids:
                ys = [lay.node(i).y for i in subtree(step, k.id)]
                bands.append((min(ys), max(ys)))
            assert all(a[1] < b[0] for a, b in zip(bands, bands[1:]))


def test_filters_hide_nodes_but_never_the_accepted_path(oracle):
    step = max(oracle.steps, key=lambda s: (s.acceptance, len(s.nodes)))
    assert step.acceptance >= 3
    lay = tree_layout(step, max_depth=1)
    shown = {n.id for n in lay.nodes if not n.synthetic}
    assert set(step.accepted) <= shown
    assert all(step.nodes[i].depth <= 1 or i in step.accepted for i in shown)
    assert lay.hidden == len(step.nodes) - len(shown) > 0
    assert any(n.synthetic for n in lay.nodes)  # the bonus stays
    # log-prob filter: hides low-probability nodes and their subtrees, keeps the path
    cut = sorted(n.logprob for n in step.nodes[1:])[len(step.nodes) // 2]
    lay = tree_layout(step, min_logprob=cut)
    shown = {n.id for n in lay.nodes if not n.synthetic}
    assert set(step.accepted) <= shown
    for i in shown - set(step.accepted):
        assert step.nodes[i].logprob >= cut and step.nodes[i].parent in shown
    assert len({(n.x, n.y) for n in lay.nodes}) == len(lay.nodes)
    lay = tree_layout(step, min_logprob=0.0)  # hides every drafted node off the path
    assert {n.id for n in lay.nodes if not n.synthetic} == set(step.accepted)


def test_drafted_phase_strips_verification_and_keeps_positions(oracle):
    step = rich_steps(oracle)[0]
    verified = tree_layout(step)
    drafted = tree_layout(step, phase="drafted")
    assert drafted == for_phase(verified, "drafted")
    assert len(drafted.nodes) == len(step.nodes) and not any(n.synthetic for n in drafted.nodes)
    assert {n.role for n in drafted.nodes} == {"root", "other"}
    assert not any(n.on_path or n.argmax is not None for n in drafted.nodes)
    assert all((n.x, n.y) == (verified.node(n.id).x, verified.node(n.id).y) for n in drafted.nodes)


def test_layout_survives_a_json_round_trip(oracle):
    loaded = Trace.from_json(oracle.to_json())
    assert [tree_layout(s) for s in loaded.steps] == [tree_layout(s) for s in oracle.steps]


def test_node_colors_cover_every_node(oracle):
    lay = tree_layout(oracle.steps[0])
    colors = node_colors(lay)
    assert set(colors) == {n.id for n in lay.nodes}
    assert colors[0] == style.NEUTRAL_FILL and colors[lay.bonus_id] == style.BONUS_FILL
    assert all(c.startswith("rgb") for i, c in colors.items() if i not in (0, lay.bonus_id))


# ---------------------------------------------------------------------------------------------------------
# tree figure
# ---------------------------------------------------------------------------------------------------------


def node_traces(fig):
    return [t for t in fig.data if t.mode and "markers" in t.mode]


def test_tree_figure_shows_tokens_path_rejected_and_bonus(oracle):
    step = rich_steps(oracle)[0]
    lay = tree_layout(step)
    fig = tree_figure(lay)
    texts = [s for t in node_traces(fig) for s in t.text]
    for n in lay.nodes:
        assert any(s.startswith(esc(n.label)) for s in texts)
    assert sum(len(t.x) for t in node_traces(fig)) == len(lay.nodes)
    path = [t for t in fig.data if t.name == "accepted path" and t.mode == "lines"]
    assert len(path) == 1 and path[0].line.width == style.PATH_EDGE_WIDTH and path[0].line.color == style.PATH_COLOR
    assert sum(x is None for x in path[0].x) == step.acceptance - 1  # one segment per accepted edge
    on_path = [t for t in node_traces(fig) if t.name == style.ROLE_NAME["accepted"]][0]
    assert set(on_path.marker.line.width) == {style.PATH_OUTLINE_WIDTH}
    assert {t.marker.symbol for t in node_traces(fig)} >= {"star", "diamond", "square"}
    hovers = " ".join(h for t in node_traces(fig) for h in t.hovertext)
    assert "target argmax" in hovers and "rank" in hovers and "log-prob" in hovers
    assert fig.layout.coloraxis.colorbar is not None and fig.layout.coloraxis.colorscale


def test_tree_figure_drafted_phase_has_no_verification_marks(oracle):
    step = rich_steps(oracle)[0]
    fig = tree_figure(tree_layout(step), phase="drafted")
    assert not any(t.name in ("accepted path", "bonus edge") for t in fig.data)
    assert sum(len(t.x) for t in node_traces(fig)) == len(step.nodes)
    assert not any(t.marker.symbol in ("star", "diamond") for t in node_traces(fig))
    assert all(w == 1 for t in node_traces(fig) for w in t.marker.line.width)
    assert "target argmax" not in " ".join(h for t in node_traces(fig) for h in t.hovertext)


def test_tree_figure_token_text_names_the_argmax(oracle):
    step = oracle.steps[0]
    fig = tree_figure(tree_layout(step), token_text=lambda i: f"T{i}")
    hovers = " ".join(h for t in node_traces(fig) for h in t.hovertext)
    assert f"id {step.target_argmax[0]} T{step.target_argmax[0]}" in hovers


def test_budget_256_tree_lays_out_and_renders(pair):
    """A large tree renders whole: every position gets a distinct place (speed is measured in the bench)."""
    ids, greedy = greedy_ids(pair, PROMPT)
    proposer = OracleProposer(greedy, len(ids), [0, 1, 2], pair.target.config.vocab_size)
    s = DecodeSession(pair, budget=256, max_new_tokens=8, proposer=proposer)
    s.prefill(PROMPT)
    step = s.step()
    assert len(step.nodes) == 257
    layout = tree_layout(step)
    assert len({(n.x, n.y) for n in layout.nodes}) == len(layout.nodes)
    tree_figure(layout)
    assert mask_figure(step).data[0].z.shape == (257, 258)


# ---------------------------------------------------------------------------------------------------------
# mask, cache
# ---------------------------------------------------------------------------------------------------------


def test_mask_matches_the_ancestor_structure(oracle):
    step = max(oracle.steps, key=lambda s: len(s.nodes))
    fig = mask_figure(step)
    z = fig.data[0].z
    n = len(step.nodes)
    assert z.shape == (n, n + 1)
    assert (z[:, 0] == 1).all()
    for node in step.nodes:
        path, i = set(), node.id
        while i != -1:
            path.add(i)
            i = step.nodes[i].parent
        assert {j - 1 for j in range(1, n + 1) if z[node.id, j]} == path
    assert (verify_mask(step) == z).all()
    assert fig.data[0].x[0] == f"prefix ({step.committed_len} tokens)"
    assert len(set(fig.data[0].x)) == n + 1 and len(set(fig.data[0].y)) == n
    assert sum(label.startswith("✓") for label in fig.data[0].y) == step.acceptance
    assert len(fig.layout.shapes) == step.acceptance
    assert len(mask_figure(step, show_accepted=False).layout.shapes) == 0


def test_cache_table_rows_types_and_kv_lengths(oracle, naive, pair):
    n_layers = pair.target.config.num_hidden_layers
    for step in oracle.steps:
        rows = cache_table(step)
        assert [r["layer"] for r in rows] == list(range(n_layers))
        assert [r["type"] for r in rows] == ["GDN", "GDN", "GDN", "attention"]
        att = rows[3]
        assert att["KV before"] == step.committed_len
        assert att["KV after verify"] == step.committed_len + len(step.nodes)
        assert att["KV after commit"] == step.committed_len + step.acceptance
        assert att["what changed"] == f"+{len(step.nodes)} rows appended, compacted to +{step.acceptance}"
        assert "replaced by the accepted path" in rows[0]["what changed"]
        assert "keys (" in att["tensors"] and "recurrent_state (" in rows[0]["tensors"]
        assert rows[0]["KV length"] is None and rows[0]["naive state error"] is None
    rows = cache_table(naive.steps[0])
    assert "known-wrong" in rows[0]["what changed"] and rows[0]["naive state error"] > 0
    assert rows[3]["naive state error"] is None
    fig = cache_figure(naive.steps[0])
    assert any(t.yaxis == "y2" for t in fig.data)
    bars = [t for t in fig.data if t.type == "bar" and t.name.endswith("(after commit)")]
    assert {t.name for t in bars} == {"GDN (after commit)", "attention (after commit)"}
    layout_rows = cache_layout_table(oracle.steps[0].cache)
    assert [r["type"] for r in layout_rows] == ["GDN", "GDN", "GDN", "attention"]
    assert layout_rows[3]["KV length"] == oracle.steps[0].cache[3].kv_length


def test_cache_chart_bars_are_one_layer_wide_and_centred(oracle, naive):
    """Issue #17, point 1: every bar of every trace (ghost, GDN, attention) is BAR_WIDTH of a layer wide at its
    layer (plotly would infer a width from a trace's own x gaps: 4 layers for attention every 4th layer); the x
    axis spans the existing layers only and ticks on them. At 8 and at 64 layers."""
    from ddtree_viz.render.cache_view import BAR_WIDTH, layer_ticks

    for step in (oracle.steps[0], naive.steps[0]):
        fig = cache_figure(step)
        bars = [t for t in fig.data if t.type == "bar"]
        assert len(bars) == 3 and all(t.width == BAR_WIDTH for t in bars)
        layers = [r["layer"] for r in cache_table(step)]
        assert tuple(fig.layout.xaxis.range) == (-0.5, max(layers) + 0.5)
        assert tuple(fig.layout.xaxis.tickvals) == tuple(layers)
    deep = tiny_pair("hybrid", seed=0, layers=64)
    s = DecodeSession(deep, budget=8, max_new_tokens=4)
    s.prefill(PROMPT)
    fig = cache_figure(s.step())
    attention = [t for t in fig.data if t.name == "attention (after commit)"][0]
    assert tuple(attention.x) == tuple(range(3, 64, 4)) and attention.width == BAR_WIDTH
    assert tuple(fig.layout.xaxis.range) == (-0.5, 63.5)
    assert tuple(fig.layout.xaxis.tickvals) == tuple(range(0, 64, 4))  # 16 labels, existing layers
    assert layer_ticks(list(range(8)))["tickvals"] == list(range(8))


def test_cache_table_html_is_compact_grouped_and_escaped(oracle, naive):
    """Issue #17, point 2: the page's per-layer table is one row per layer at a few layers (header cells and short
    columns never wrap), a strip with one cell per layer whose hover gives its details; at many layers identical
    layers share a row; naive mode keeps its per-layer error (as a range when grouped); text escaped."""
    from ddtree_viz.render.cache_view import cache_table_html, layer_ranges

    assert layer_ranges([0, 1, 2, 4, 5, 6, 8]) == "0–2, 4–6, 8" and layer_ranges([]) == ""
    rows = cache_table(oracle.steps[0])
    html = cache_table_html(rows)
    assert html.count('class="ddv-layer-row"') == len(rows) and html.count('class="ddv-layer"') == len(rows)
    assert "white-space:nowrap;border-bottom:2px" in html  # headers on one line
    assert "naive" not in html  # no error column in exact mode
    naive_rows = cache_table(naive.steps[0])
    assert "naive: max |state − exact|" in cache_table_html(naive_rows)
    many = [dict(r, layer=i * len(naive_rows) + r["layer"]) for i in range(16) for r in naive_rows]  # 64 layers
    grouped = cache_table_html(many)
    assert grouped.count('class="ddv-layer-row"') == 2 and grouped.count('class="ddv-layer"') == 64
    assert "48 layers: 0–2, 4–6" in grouped and "16 layers: 3, 7, 11" in grouped and " – " in grouped
    evil = [dict(r, tensors=EVIL[0], **{"cache class": EVIL[1]}) for r in rows]
    out = cache_table_html(evil)
    assert "<script" not in out and "<img" not in out and "&lt;script&gt;" in out
    layout = cache_table_html(cache_layout_table(oracle.steps[0].cache))
    assert layout.count('class="ddv-layer-row"') == len(rows) and "bytes" in layout


def test_page_figures_as_plain_data_equal_the_checked_figures(oracle, naive):
    """Issue #17, point 3: the page sends FigureSpecs (plain plotly JSON, no validation); each one's JSON is what
    plotly's own go.Figure gives for the same figure (make_subplots' layout for the two-panel charts included), so
    plotly checks everything the page draws, here."""
    import json

    from ddtree_viz.render.budget_view import budget_spec, depth_spec
    from ddtree_viz.render.cache_view import cache_spec
    from ddtree_viz.render.grid_view import grid_data, grid_spec
    from ddtree_viz.render.mask_plot import mask_spec
    from ddtree_viz.render.stats_view import acceptance_spec
    from ddtree_viz.render.tree_plot import tree_spec

    for trace in (oracle, naive):
        step = rich_steps(trace)[0] if rich_steps(trace) else trace.steps[-1]
        specs = [tree_spec(tree_layout(step, phase=ph), phase=ph, cmin=-12.0, cmax=0.0) for ph in ("drafted", "verified")]
        specs += [mask_spec(step), mask_spec(step, show_accepted=False), cache_spec(step),
                  acceptance_spec(trace.steps), acceptance_spec([]), acceptance_spec(trace.steps, legend=False),
                  tree_spec(tree_layout(step), path_label=True, legend=False), mask_spec(step, legend=False),
                  budget_spec(trace.steps), budget_spec(trace.steps, 0), depth_spec(trace.steps),
                  depth_spec(trace.steps, 8)]
        if step.draft_top_ids:
            specs += [grid_spec(grid_data(step)), grid_spec(grid_data(step), legend=False, cmin=-9.0, cmax=0.0)]
        from ddtree_viz.render.cache_view import cache_table
        assert cache_spec(step, rows=cache_table(step)).to_json() == cache_spec(step).to_json()  # the page's rows
        for spec in specs:
            assert json.loads(spec.to_json()) == json.loads(spec.figure().to_json())
    from plotly.subplots import make_subplots

    from ddtree_viz.render.budget_view import _two_panels

    grid = json.loads(make_subplots(rows=1, cols=2, subplot_titles=("a", "b"), horizontal_spacing=0.12).to_json())
    grid["layout"].pop("template")
    assert grid["layout"] == json.loads(json.dumps(_two_panels("a", "b")))


# ---------------------------------------------------------------------------------------------------------
# output vs greedy
# ---------------------------------------------------------------------------------------------------------


def test_token_sources_follow_the_rounds(oracle):
    src = token_sources(oracle.steps, oracle.output_ids)
    assert [s.token_id for s in src] == list(oracle.output_ids)
    assert src[0].kind == "prefill"
    for step in oracle.steps:
        mine = [s for s in src if s.step == step.index]
        assert [s.token_id for s in mine] == list(step.new_token_ids)
        drafts = [s for s in mine if s.kind == "draft"]
        assert [s.depth for s in drafts] == [step.nodes[a].depth for a in step.accepted[1:]][: len(drafts)]


def test_identical_trace_says_so(oracle, plain):
    for trace in (oracle, plain):
        html = output_vs_greedy_html(trace, None)
        assert f"identical to greedy for {len(trace.output_ids)} tokens" in html
        assert "ddv-first" not in html and "known-wrong" not in html
        assert html.count('class="ddv-tok ') == len(trace.output_ids)
    html = output_vs_greedy_html(oracle, None, upto_step=0)
    assert f"identical to greedy for {1 + len(oracle.steps[0].new_token_ids)} tokens" in html


def test_diverging_naive_trace_is_marked(naive):
    k, margin = naive.first_divergence, naive.divergence_margin
    html = output_vs_greedy_html(naive, None)
    assert f"diverges at token {k} (greedy margin {margin:.3f})" in html
    assert "ddv-first" in html and style.DIVERGE_COLOR in html and "[greedy: " in html
    assert "known-wrong" in html and "naive" in html
    cmp = compare_with_greedy(naive)
    assert cmp.first_divergence == k and cmp.naive
    # scrubbed back to before the divergence: still identical
    upto = next(s.step for s in token_sources(naive.steps, naive.output_ids) if s.index == k) - 1
    assert "identical to greedy" in output_vs_greedy_html(naive, None, upto_step=upto)


def evil_trace(trace):
    """The same trace, but every token's text is hostile HTML."""
    names = {}
    steps = []
    for step in trace.steps:
        nodes = []
        for n in step.nodes:
            text = EVIL[n.token_id % 2]
            names[n.token_id] = text
            nodes.append(dataclasses.replace(n, token=text))
        steps.append(dataclasses.replace(step, nodes=tuple(nodes)))
    return dataclasses.replace(trace, steps=tuple(steps), prompt=EVIL[0]), (lambda i: EVIL[i % 2])


def assert_no_raw_html(strings):
    for s in strings:
        assert "<script" not in s.lower() and "<img" not in s.lower(), s


class TagCollector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)


def assert_only_our_tags(html):
    parser = TagCollector()
    parser.feed(html)
    assert parser.tags <= {"div", "span", "sub", "i", "b", "small", "code", "table", "thead", "tbody", "tr", "th", "td"}


def test_hostile_token_text_is_escaped_everywhere(naive, oracle):
    for trace in (naive, oracle):
        evil, text = evil_trace(trace)
        html = output_vs_greedy_html(evil, text)
        assert_no_raw_html([html])
        assert esc(visible(EVIL[0])) in html or esc(visible(EVIL[1])) in html
        assert_no_raw_html([divergence_html(divergence_rows(evil.steps, text))])
        assert_no_raw_html([stats_markdown(stats_summary(evil))])
        for step in evil.steps[:4]:
            lay = tree_layout(step, token_text=text)
            for fig in (tree_figure(lay, token_text=text), tree_figure(lay, phase="drafted"), mask_figure(step),
                        tree_figure(lay, title=EVIL[1]), tree_figure(lay, title=f"{EVIL[1]}\n{EVIL[0]}")):
                assert_no_raw_html(all_strings(fig.to_plotly_json()))
        assert_only_our_tags(html)
        assert_only_our_tags(divergence_html(divergence_rows(evil.steps, text)))


def test_html_made_by_the_model_renders_as_text(pair, naive):
    """The byte tokenizer round-trips any text: an output (and a greedy reference) spelling out HTML, and the
    special token '<|endoftext|>', come back as text, one span per token, no tags of their own."""
    tok = pair.tokenizer
    ids = tuple(tok(EVIL[0] + EVIL[1], add_special_tokens=False)["input_ids"]) + (tok.eos_token_id,)
    greedy = ids[:5] + tuple(tok("<b>", add_special_tokens=False)["input_ids"]) + ids[8:]
    trace = dataclasses.replace(naive, prompt=EVIL[0], output_ids=ids, greedy_ids=greedy, first_divergence=5,
                                divergence_margin=0.5, steps=())
    token_text = lambda i: tok.decode([i])  # noqa: E731
    html = output_vs_greedy_html(trace, token_text)
    assert_only_our_tags(html)
    assert html.count('class="ddv-tok ') == len(ids)
    assert "&lt;|endoftext|&gt;" in html and "[greedy: &lt;]" in html and "diverges at token 5" in html
    # and a live session whose prompt is HTML: its records render as text
    s = DecodeSession(pair, budget=8, max_new_tokens=6)
    s.prefill(EVIL[0] + EVIL[1])
    s.run()
    live = s.to_trace()
    assert_only_our_tags(output_vs_greedy_html(live, s.token_text))
    assert_only_our_tags(divergence_html(divergence_rows(live.steps, s.token_text)))


def test_trace_without_token_names_falls_back(oracle):
    bare = dataclasses.replace(oracle, greedy_ids=None, first_divergence=None)
    html = output_vs_greedy_html(bare)
    assert "no greedy reference" in html
    names = token_texts_from_steps(oracle.steps)
    assert all(names[n.token_id] == n.token for s in oracle.steps for n in s.nodes)


# ---------------------------------------------------------------------------------------------------------
# stats, divergence
# ---------------------------------------------------------------------------------------------------------


def test_acceptance_figure_and_stats(oracle):
    fig = acceptance_figure(oracle.steps)
    bars = [t for t in fig.data if t.type == "bar"]
    # #26.4: the bars count the tokens each round kept; the oracle's last round is cut by max new tokens (its walk
    # accepted more than it kept), and its hover says both (this assertion read s.acceptance, the walk, before)
    assert list(bars[0].y) == [len(s.new_token_ids) for s in oracle.steps]
    assert oracle.steps[-1].cut and oracle.steps[-1].kept < oracle.steps[-1].acceptance
    assert f"{oracle.steps[-1].kept} kept" in bars[0].hovertext[-1] and "walk accepted" in bars[0].hovertext[-1]
    assert list(bars[0].x) == [s.index + 1 for s in oracle.steps]  # 1-based on screen
    mean = sum(len(s.new_token_ids) for s in oracle.steps) / len(oracle.steps)
    line = [t for t in fig.data if t.type == "scatter"][0]
    assert list(line.y) == [mean, mean]
    summary = stats_summary(oracle, greedy_tok_s=10.0, ddtree_tok_s=25.0)
    assert summary["rounds"] == len(oracle.steps) and summary["mean_acceptance"] == pytest.approx(mean)
    assert summary["tokens_per_target_forward"] == pytest.approx((len(oracle.output_ids) - 1) / len(oracle.steps))
    assert summary["speedup"] == pytest.approx(2.5) and summary["identical_to_greedy"] is True
    assert set(summary["mean_ms"]) == {"draft", "tree", "verify", "commit"}
    md = stats_markdown(summary)
    assert "| mean acceptance" in md and "2.50×" in md
    assert acceptance_figure([]).data[0].y == ()


def test_divergence_rows_report_where_the_walk_stopped(oracle, naive):
    for trace in (oracle, naive):
        rows = divergence_rows(trace.steps, None)
        assert len(rows) == len(trace.steps)
        for row, step in zip(rows, trace.steps):
            assert row["round"] == step.index + 1
            assert row["depth"] == len(step.accepted)
            assert row["target_token_id"] == step.bonus_token_id
            kids = sorted((n for n in step.nodes if n.parent == step.accepted[-1]), key=lambda n: n.rank)
            assert [c["token_id"] for c in row["candidates"]] == [n.token_id for n in kids][:5]
            assert row["mismatch"] == bool(kids)
            assert row["target_in_candidates"] is False  # the walk would have continued otherwise
    assert any(r["candidates"] for r in divergence_rows(oracle.steps))
    html = divergence_html(divergence_rows(oracle.steps))
    assert html.count("<tr>") == len(oracle.steps) + 1


# ---------------------------------------------------------------------------------------------------------
# why did this round stop there: inspector, grid, budget curve, acceptance by depth, compare
# ---------------------------------------------------------------------------------------------------------


def test_hover_gives_the_inspectors_short_form(oracle):
    step = rich_steps(oracle)[0]
    lay = tree_layout(step)
    accepted = lay.node(step.accepted[1])
    assert accepted.parent_choice == accepted.token_id and accepted.parent_top_k == 5
    assert "target at the parent: p " in node_hover(accepted, "verified") and "its choice" in node_hover(accepted, "verified")
    rejected = next(n for n in lay.nodes if n.role == "first_rejected")
    hover = node_hover(rejected, "verified")
    assert "it chose" in hover and f"(id {rejected.parent_choice})" in hover
    assert rejected.parent_choice == step.bonus_token_id
    assert "target at the parent" not in node_hover(lay.node(0), "verified")
    assert all(n.parent_top_k == 0 for n in tree_layout(step, phase="drafted").nodes)


def test_grid_figure_marks_taken_cells_the_path_and_the_stop(oracle):
    step = rich_steps(oracle)[0]
    g = grid_data(step)
    assert g.depths == len(step.draft_top_ids) and g.k == len(step.draft_top_ids[0])
    assert g.path == tuple((step.nodes[a].depth, step.nodes[a].rank) for a in step.accepted[1:])
    assert {(c.depth, c.rank) for c in g.cells if c.taken} == {(n.depth, n.rank) for n in step.nodes[1:]}
    fig = grid_figure(g)
    heat = fig.data[0]
    assert heat.type == "heatmap" and len(heat.z) == g.k and len(heat.z[0]) == g.depths
    # the path, the taken cells and the stop are outlines (shapes, in the legend), not markers over the tokens
    names = [t.name for t in fig.data] + [s.name for s in fig.layout.shapes if s.showlegend]
    assert "accepted path" in names and any(n.startswith("taken") for n in names)
    assert not any(t.type == "scatter" and "markers" in t.mode for t in fig.data)
    stop = analysis.stop_info(step)
    if isinstance(stop["target_draft_rank"], int) and stop["target_draft_rank"] < g.k:
        assert "target's token where the walk stopped (dotted)" in names and g.stop_rank == stop["target_draft_rank"]
    with pytest.raises(ValueError, match="no drafter grid"):
        grid_data(dataclasses.replace(step, draft_top_ids=(), draft_top_logprobs=()))


def test_budget_and_depth_figures_are_the_analysis(oracle):
    steps = oracle.steps
    fig = budget_figure(steps, 2)
    assert list(fig.data[0].y) == [analysis.recorded_curve(steps[2])[b] for b in fig.data[0].x]
    total = analysis.session_budget_curve(steps[:3])
    assert list(fig.data[1].y) == [total[b] for b in fig.data[1].x]
    assert "later rounds elsewhere" in fig.layout.annotations[-1].text.replace("<br>", " ")
    fig = depth_figure(steps, oracle.settings["block_size"])
    assert list(fig.data[0].y) == analysis.acceptance_histogram(steps, oracle.settings["block_size"])
    rates = analysis.per_depth_acceptance(steps, oracle.settings["block_size"])
    assert list(fig.data[1].y) == rates and len(rates) == oracle.settings["block_size"] - 1


def test_inspector_stop_and_compare_escape_hostile_text(naive, oracle):
    for trace in (naive, oracle):
        evil, text = evil_trace(trace)
        for step in evil.steps[:3]:
            for node in (0, step.accepted[-1], len(step.nodes) - 1):
                html = inspector_html(step, node, text)
                assert_no_raw_html([html])
                assert_only_our_tags(html.replace("<p", "<div").replace("</p>", "</div>").replace("<caption", "<div"))
            assert_no_raw_html([stop_html(step, text)])
            assert_no_raw_html(all_strings(grid_figure(grid_data(step, text)).to_plotly_json()))
            assert [i for _, i in node_choices(step, text)] == list(range(len(step.nodes)))  # plain text: a selector
        html = compare_html(evil, dataclasses.replace(evil, settings={**evil.settings, "verify": "naive"}), text)
        assert_no_raw_html([html])
    assert "not in round" in inspector_html(oracle.steps[0], 999)


def test_compare_html_says_where_two_outputs_part(oracle, naive):
    html = compare_html(oracle, oracle)
    assert "identical" in html and html.count("identical to greedy") == 2
    other = dataclasses.replace(oracle, output_ids=oracle.output_ids[:3] + (oracle.output_ids[3] + 1,)
                                + oracle.output_ids[4:], first_divergence=3)
    html = compare_html(oracle, other)
    assert "part at token 3" in html and "DIVERGES from greedy at token 3" in html
    c = analysis.compare_outputs(oracle, other)
    assert c["part_at"] == 3 and c["b"]["identical"] is False and c["a"]["identical"] is True
    behind = dataclasses.replace(oracle, output_ids=oracle.output_ids[:5])
    assert analysis.compare_outputs(oracle, behind)["part_at"] is None  # a live side that is behind has not parted


def test_compare_marks_tokens_past_a_pending_reference_unchecked_not_wrong(oracle):
    """issue #64 class 6: in compare mode A's newest tokens were marked red (differing from greedy) while the live
    page's reference had not reached them yet; they are unchecked, and the verdict says so. A finished reference
    that ends early still marks what it does not cover."""
    pending = dataclasses.replace(oracle, greedy_ids=oracle.greedy_ids[:4], reference_pending=True,
                                  first_divergence=None)
    html = compare_html(pending, oracle)
    row_a = html.split('data-side="A"')[1].split('data-side="B"')[0]
    assert DIVERGE_COLOR not in row_a and "DIVERGES" not in html
    assert f"identical to greedy so far (checking tokens 4-{len(oracle.output_ids) - 1})" in html
    short = dataclasses.replace(oracle, greedy_ids=oracle.greedy_ids[:4], first_divergence=4)
    assert DIVERGE_COLOR in compare_html(short, oracle).split('data-side="A"')[1].split('data-side="B"')[0]


def test_render_is_pure_no_torch_gradio_or_engine():
    import subprocess
    import sys

    code = ("import sys, ddtree_viz.render; "
            "print([m for m in ('torch', 'gradio', 'transformers', 'ddtree_viz.engine') if m in sys.modules])")
    root = Path(__file__).resolve().parents[1]  # the checkout's package, installed or not
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_stats_carry_the_session_analysis(oracle):
    summary = stats_summary(oracle)
    block = oracle.settings["block_size"]
    assert summary["acceptance_histogram"] == analysis.acceptance_histogram(oracle.steps, block)
    assert summary["per_depth_acceptance"] == analysis.per_depth_acceptance(oracle.steps, block)
    assert summary["budget_curve"]["32"] == sum(s.kept for s in oracle.steps)  # #26.4: kept, was the walk
    md = stats_markdown(summary)
    rows = [ln for ln in md.splitlines() if ln.startswith("|")]
    assert all(ln.count("|") == 3 for ln in rows), rows  # no stray pipe splits a row
    assert "rounds by accepted drafts" in md and "tokens by budget" in md


def test_page_figures_are_valid_plotly_though_built_unvalidated(oracle, naive):
    """render/figure.py builds the page's figures as plain data without plotly's validation (most of a Step's
    render time); validated afterwards, every one of them is accepted as it is, property for property."""
    import plotly.graph_objects as go

    from ddtree_viz.render.cache_view import cache_figure
    from ddtree_viz.render.layout import tree_layout
    from ddtree_viz.render.mask_plot import mask_figure
    from ddtree_viz.render.stats_view import acceptance_figure
    from ddtree_viz.render.tree_plot import tree_figure

    for trace in (oracle, naive):
        step = rich_steps(trace)[0] if rich_steps(trace) else trace.steps[-1]
        figures = [mask_figure(step), mask_figure(step, show_accepted=False, legend=False), cache_figure(step),
                   acceptance_figure(trace.steps), acceptance_figure(trace.steps, legend=False)]
        for phase in ("drafted", "verified"):
            layout = tree_layout(step, phase=phase)
            figures += [tree_figure(layout, phase=phase), tree_figure(layout, phase=phase, legend=False, path_label=True)]
        for fig in figures:
            go.Figure(fig.to_plotly_json())  # validates every property; raises on any plotly does not know
    from ddtree_viz.render.figure import FigureSpec

    with pytest.raises(ValueError, match="colr"):  # what the check above would catch
        FigureSpec([dict(type="bar", x=[1], colr="red")], {}).figure()
    assert any(t.get("yaxis") == "y2" for t in cache_figure(naive.steps[-1]).to_plotly_json()["data"])


def test_output_strip_wraps_between_tokens_and_gives_plain_text(oracle):
    """Issue #26.1: every token its own box (a line breaks between any two, though visible whitespace leaves no
    space in their text), and the output's own text beside it to copy; compare mode's rows too."""
    text = lambda i: f" to{i}\n"  # noqa: E731 - spaces and newlines: shown as '·' and '⏎' in the boxes
    html = output_vs_greedy_html(oracle, text)
    assert html.count("display:inline-block") >= len(oracle.output_ids)
    assert 'class="ddv-plain-text"' in html and esc("".join(text(i) for i in oracle.output_ids)) in html
    assert_only_our_tags(html)
    html = compare_html(oracle, oracle, text)
    assert html.count('class="ddv-plain-text"') == 2 and html.count("display:inline-block") >= 2 * len(oracle.output_ids)


def test_words_say_what_happened(oracle, naive):
    """#26.7: the grid's note for a target token outside the drafter's top k; one name, 'tree ended'; naive stats
    never say 'exact per round'; sampled stats say 'the target's own sampling'; compare mode's round past one
    side's end; a top miss whose two tokens are the same says why it is a miss."""
    from ddtree_viz.render.grid_view import stop_note
    from ddtree_viz.render.report import misses_html
    from ddtree_viz.render.stats_view import stats_markdown, stats_summary

    g = dataclasses.replace(grid_data(oracle.steps[0]), stop_rank=None, stop_reason=analysis.STOP_TREE_ENDED,
                            stop_depth=2, stop_token="be")
    note = stop_note(g)
    assert "is tree ended" not in note and f"outside the drafter's top {g.k}" in note and "tree ended (" in note
    rows = divergence_rows(oracle.steps, None)
    assert "tree exhausted" not in divergence_html(rows)
    md = stats_markdown({**stats_summary(naive), "acceptance_histogram": [1], "per_depth_acceptance": [],
                         "budget_curve": {"1": 1}})
    assert "exact per round" not in md and "naive rounds are not exact" in md
    md = stats_markdown({**stats_summary(oracle), "sampling": "sampling (T 0.7, seed 5)", "greedy_tok_s": 10.0,
                         "ddtree_tok_s": 20.0, "speedup": 2.0})
    assert "greedy tokens/s" not in md and "speedup over greedy" not in md
    assert "the target's own sampling tokens/s" in md and "speedup over the target's own sampling" in md
    short = dataclasses.replace(oracle, steps=oracle.steps[:3], output_ids=oracle.output_ids[:1 + sum(
        len(s.new_token_ids) for s in oracle.steps[:3])], greedy_ids=None, first_divergence=None)
    html = compare_html(short, oracle, view=len(oracle.steps) - 1)
    assert f"showing round {len(oracle.steps)} (A finished at round 3" in html and "of each" not in html
    miss = {"count": 2, "drafter_token_id": 5, "drafter_token": "be", "target_token_id": 5, "target_token": "be",
            "examples": []}
    assert "the same token" in misses_html({"top_misses": [miss]})
    assert "the same token" not in misses_html({"top_misses": [{**miss, "target_token_id": 6}]})


def test_lookup_names_from_the_tokenizer_then_the_fallback_made_when_first_needed():
    """text.lookup: the tokenizer's text first; a fallback given as a function (a whole session's node texts, which
    the output strip and the divergence table name ids from) is made once, at the first id the tokenizer cannot
    name, and not at all while it names every id; then the placeholder."""
    made = []

    def fallback():
        made.append(1)
        return {7: "seven"}

    text = lookup({1: "one"}, fallback)
    assert text(1) == "one" and made == []
    assert (text(7), text(8), text(7)) == ("seven", unknown_token(8), "seven") and made == [1]
    assert lookup(None, {7: "seven"})(7) == "seven" and lookup(None)(3) == unknown_token(3)
    assert lookup(lambda i: 1 / 0)(5) == unknown_token(5)  # a tokenizer failing on one id


def test_counts_are_worded_by_their_number():
    """issue #65 item 7: '1 drafted tokens' and other plurals."""
    from ddtree_viz.words import plural  # (the lowest layer: every layer words its counts with it)

    assert [plural(n, "drafted token") for n in (0, 1, 2, 1000)] == [
        "0 drafted tokens", "1 drafted token", "2 drafted tokens", "1,000 drafted tokens"]
    assert plural(1, "match", "matches") == "1 match" and plural(3, "match", "matches") == "3 matches"


def test_a_round_cut_by_max_new_tokens_says_so_in_its_tree(pair):
    """issue #64 class 6: a round cut by the token cap showed its whole walk (16 tokens) where 7 were kept, and its
    tree did not mark the cut: the title now says how many of the walk's tokens were kept."""
    from ddtree_viz.engine.session import DecodeSession
    from ddtree_viz.render.layout import tree_layout
    from ddtree_viz.render.tree_plot import default_title

    ids, reference = greedy_ids(pair, PROMPT)
    session = DecodeSession(pair, budget=8, max_new_tokens=6,
                            proposer=OracleProposer(reference, len(ids), [0], pair.target.config.vocab_size))
    session.prefill(PROMPT)
    session.run()
    cut = [s for s in session.history if s.cut]
    assert cut, "the oracle's long walks must overrun max new tokens"
    step = cut[-1]
    title = default_title(tree_layout(step))
    assert f"bonus = {step.acceptance} tokens, {step.kept} kept: the session stopped there" in title, title
    whole = next((s for s in session.history if not s.cut), None)
    assert whole is None or "kept" not in default_title(tree_layout(whole))
    assert "kept" not in default_title(tree_layout(step, phase="drafted"))


def test_misses_by_prompt_link_each_round_escape_their_tokens_and_stop_at_the_cap(monkeypatch):
    """render/report.py's miss_rounds_html on hand-made groups: a trace with a session file links its rounds there
    (#round=N), one without links its trace (or the page's Step tab); token text in a tooltip is escaped (quotes
    too); the method column only with several methods; past MAX_MISS_LINKS the counts alone, and how many more."""
    from ddtree_viz.render import report as rv

    evil = '<img src=x onerror=alert(1)>" onclick="y'

    def miss(k):
        return {"round": k, "depth": 2, "reason": "not drafted", "target_token": evil, "target_prob": 0.5,
                "drafter_token": "a b", "target_draft_rank": None}

    groups = [{"trace": "traces/0000.json", "index": 0, "side": "ddtree", "rounds": 5, "misses": [miss(2), miss(4)]},
              {"trace": "traces/0001.json", "index": 1, "side": "ddtree", "rounds": 3, "misses": [miss(1), miss(3)]}]
    html = rv.miss_rounds_html(groups, supplements={"traces/0000.json": "supplements/0000.html",
                                                    "traces/0001.json": None})
    assert '<a class="round session-round" href="supplements/0000.html#round=4" data-file="traces/0000.json" ' \
           'data-round="3" title="round 4: depth 2 (not drafted); the target&#x27;s &lt;img·src=x·onerror=alert(1)' \
           '&gt;&quot;·onclick=&quot;y (p 0.50), the drafter&#x27;s first choice a·b">4</a>' in html
    assert '<a class=round href="traces/0001.json#round=3" data-file="traces/0001.json" data-round="2" title=' in html
    assert "<img" not in html and 'onclick="' not in html and "<th>method</th>" not in html
    page = rv.miss_rounds_html([*groups, {**groups[0], "side": "dflash", "trace": "traces/0000.dflash.json"}],
                               rv.page_round_link)
    assert page.count('class="round ddv-open-round" href="#" role=button') == 6 and "<th>method</th>" in page
    monkeypatch.setattr(rv, "MAX_MISS_LINKS", 3)
    capped = rv.miss_rounds_html(groups)
    assert capped.count("<a class=round") == 3 and "… 1 more in misses.jsonl" in capped
    assert capped.count("<td>2</td>") == 2  # every trace's count, links or not

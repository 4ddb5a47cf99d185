"""A whole session as one self-contained HTML file (issue #68 item 1; render/supplement.py, docs/EXPORT.md), made from
sessions the engine recorded: opened from a file:// URL in headless Chromium with every request that is not the
file itself refused, stepped round by round with the keyboard and held to the trace (node count, accepted path,
first divergence, the tree's rows and the mask against the Python ones), deep links; its size against the 5 MB
bound; hostile token text; the command line's errors; the page's button."""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest

from ddtree_viz import analysis, cli
from ddtree_viz.engine.oracle import OracleProposer
from ddtree_viz.engine.session import DecodeSession
from ddtree_viz.errors import InputError
from ddtree_viz.page import actions
from ddtree_viz.page.state import TabState
from ddtree_viz.render import supplement as sp
from ddtree_viz.render.diff_view import compare_with_greedy
from ddtree_viz.render.layout import tree_layout
from ddtree_viz.render.mask_plot import verify_mask
from ddtree_viz.render.text import visible
from ddtree_viz.render.tree_plot import default_title
from ddtree_viz.trace import Trace
from tests.test_browser import ARGS, CHROMIUM
from tests.test_exactness import greedy_ids
from tests.tiny import tiny_pair

PROMPT = "def f(x):\n"
HELD_OUT = Path(__file__).resolve().parents[1] / "ddtree_viz" / "prompts" / "heldout-code.jsonl"
browser_only = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                  reason="Debian's chromium is not installed (bash .ci/run installs it)")


# ---------------------------------------------------------------------------------------------------------
# Sessions the engine recorded, and longer ones made from their rounds
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pair():
    return tiny_pair("hybrid")


@pytest.fixture(scope="module")
def naive(pair):
    """A naive-mode session on the tiny hybrid pair with oracle drafts (greedy's tokens at ranks 0-2): long accepted
    paths, first-rejected siblings, and the flattened tree's bug, so the output leaves greedy at some round."""
    ids, greedy = greedy_ids(pair, PROMPT)
    s = DecodeSession.of(pair, budget=16, max_new_tokens=30, verify="naive", engine="transformers",
                         proposer=OracleProposer(greedy, len(ids), [1, 0, 2], pair.target.config.vocab_size, seed=3))
    s.prefill(PROMPT)
    s.run()
    t = s.to_trace()
    assert t.first_divergence is not None and len(t.steps) >= 4
    assert 0 < sum(1 for k in range(len(t.steps)) if _shown(t, k) > t.first_divergence) < len(t.steps)
    return t


def _shown(trace: Trace, k: int) -> int:
    """Output tokens through round k (0-based): the prefill's and the rounds' kept."""
    return min(len(trace.output_ids), 1 + sum(s.kept for s in trace.steps[: k + 1]))


def tiled(trace: Trace, tokens: int) -> Trace:
    """A longer session made of a real one's rounds, repeated in order until the output holds `tokens` tokens: each
    round's own tree, walk, cache and records, re-rooted at the token the round before ended on, the output their
    tokens (identical to a reference made the same way). Validated as any trace is (Trace.from_json)."""
    steps, out, committed = [], [trace.output_ids[0]], len(trace.prompt_ids)
    while len(out) < tokens:
        s = trace.steps[len(steps) % len(trace.steps)]
        nodes = (dataclasses.replace(s.nodes[0], token_id=out[-1] if steps else out[0]),) + s.nodes[1:]
        new = ([s.nodes[a].token_id for a in s.accepted[1:]] + [s.bonus_token_id])[: tokens - len(out)]
        steps.append(dataclasses.replace(s, index=len(steps), committed_len=committed, nodes=nodes,
                                         root_token_id=nodes[0].token_id, new_token_ids=tuple(new)))
        out += new
        committed += len(s.accepted)
    made = dataclasses.replace(trace, steps=tuple(steps), output_ids=tuple(out), greedy_ids=tuple(out),
                               first_divergence=None, divergence_margin=None, divergence_verdict=None,
                               settings={**trace.settings, "max_new_tokens": tokens})
    return Trace.from_json(made.to_json())


@pytest.fixture(scope="module")
def real512():
    """A real 512-token session of the embedded pair at budget 128 on a held-out prompt (about 10 s on a CPU)."""
    from ddtree_viz.engine.models import load_pair

    prompt = json.loads(HELD_OUT.read_text(encoding="utf-8").splitlines()[1])["prompt"]
    s = DecodeSession.of(load_pair(), budget=128, max_new_tokens=512)
    s.prefill(prompt)
    s.run()
    t = s.to_trace()
    assert len(t.output_ids) == 512 and t.settings["budget"] == 128 and t.greedy_ids is not None
    return t


# ---------------------------------------------------------------------------------------------------------
# (b) The bound
# ---------------------------------------------------------------------------------------------------------


def test_a_512_token_session_at_budget_128_is_under_5_mb(real512, tmp_path):
    """The real session as recorded (41 rounds: its rounds' acceptance as they came), and a harder one, synthetic
    from real trees: a 512-token session made of the same session's first 8 rounds repeated (`tiled`; the opening,
    where the drafter is weakest: 2 tokens a round, so 256 rounds of 129-position trees). Both under 5 MB (4.88 and
    4.99 MB when this was written), plotly.js, the data and the page's script inlined once."""
    sizes = {}
    for name, trace in (("recorded", real512), ("opening, tiled", tiled(
            dataclasses.replace(real512, steps=real512.steps[:8]), 512))):
        assert len(trace.output_ids) == 512 and all(len(s.nodes) == 129 for s in trace.steps[:-1])
        path, size = sp.write_supplement(trace, tmp_path / "s.html")
        sizes[name] = (len(trace.steps), size)
        text = path.read_text(encoding="utf-8")
        assert size < 5_000_000 and size == len(text.encode("utf-8"))
        # three scripts: the session's data, plotly.js, the page's script (which draws every round from the data)
        assert text.count("<script") == 3 and text.count('<script type="application/json" id="ddt-data">') == 1
        assert text.count(sp.plotly_js()) == 1 and text.count(sp.page_script()) == 1
    print(f"supplement sizes (rounds, bytes): {sizes}")
    assert sizes["opening, tiled"][0] > 2 * sizes["recorded"][0]


@pytest.fixture(scope="module")
def big(pair):
    """512 tokens of the tiny pair's budget-128 trees (its random drafter keeps under 2 tokens a round: about 300
    rounds), `tiled` from a real session of it: past 5 MB."""
    s = DecodeSession.of(pair, budget=128, max_new_tokens=12)
    s.prefill(PROMPT)
    s.run()
    return tiled(s.to_trace(), 512)


def test_a_session_past_the_bound_is_refused_with_its_size_or_thinned(big, tmp_path, capsys):
    """export --session refuses a session past 5 MB, giving the size it would have and rounds that fit; --rounds
    with those writes a file under the bound holding just them."""
    src = tmp_path / "big.json"
    big.save(src)
    out = tmp_path / "s.html"
    assert cli.main(["export", "--trace", str(src), "--session", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    m = re.search(r"would be ([\d,]+) bytes \(([\d.]+) MB\), over the 5 MB bound.*--rounds (1-(\d+))", err)
    assert m and not out.exists(), err
    size = int(m.group(1).replace(",", ""))
    assert size == len(sp.supplement_html(big, limit=None).encode("utf-8")) > 5_000_000
    fits = int(m.group(4))
    assert 1 < fits < len(big.steps)
    assert cli.main(["export", "--trace", str(src), "--session", "--rounds", m.group(3), "--out", str(out)]) == 0
    assert f"rounds 1-{fits} of {len(big.steps)}" in capsys.readouterr().out
    data = embedded(out.read_text(encoding="utf-8"))
    assert out.stat().st_size < 5_000_000 and len(data["steps"]) == fits and data["rounds_total"] == len(big.steps)


# ---------------------------------------------------------------------------------------------------------
# The data
# ---------------------------------------------------------------------------------------------------------


def embedded(text: str) -> dict:
    """The session's JSON as the file holds it."""
    m = re.search(r'<script type="application/json" id="ddt-data">(.*?)</script>', text, re.S)
    return json.loads(m.group(1))


def test_pack_ints_round_trips_and_refuses_negatives():
    values = [0, 1, 31, 32, 1023, 1024, 2**31 - 1, 5, 0]
    text = sp.pack_ints(values)
    assert sp.unpack_ints(text) == values and set(text) <= set(sp.ALPHABET)
    assert len(sp.pack_ints([31])) == 1 and len(sp.pack_ints([32])) == 2
    with pytest.raises(ValueError):
        sp.pack_ints([-1])
    with pytest.raises(ValueError):
        sp.unpack_ints(sp.pack_ints([40])[:1])
    assert [sp.zigzag(v) for v in (0, -1, 1, -2, 2)] == [0, 1, 2, 3, 4]


def unlike_ddtree(trace: Trace) -> Trace:
    """The trace with every round's ranks and log-probs changed so that a rank is not the count of a node's earlier
    siblings and a depth and rank do not name one candidate (as a tree scored otherwise could have it): the data
    then writes ranks, tokens and log-probs per node."""
    def node(n):
        if n.id == 0:
            return n
        return dataclasses.replace(n, rank=n.rank + 3 * (n.id % 2), logprob=n.logprob - 0.37 * (n.id % 3))
    return dataclasses.replace(trace, steps=tuple(dataclasses.replace(s, nodes=tuple(map(node, s.nodes)))
                                                  for s in trace.steps))


def test_the_data_holds_every_round_as_recorded(naive, real512):
    """Decoded the way supplement.js decodes it, each round gives back its tree (parents, ranks, tokens, log-probs to
    a hundredth), path, bonus and committed length; the output and the reference through the last round. DDTree's
    trees take the short form (ranks implied, candidates by depth and rank), others the long one."""
    for trace in (naive, real512, unlike_ddtree(naive)):
        data = sp.session_data(trace)
        assert all(("r" not in r and "g" in r) == (trace in (naive, real512)) for r in data["steps"])
        ids = sp.unpack_ints(data["ids"])
        assert [ids[i] for i in sp.unpack_ints(data["out"])] == list(trace.output_ids)
        assert [ids[i] for i in sp.unpack_ints(data["ref"])] == list(trace.greedy_ids)[: len(trace.output_ids)]
        assert data["kept"] == [s.kept for s in trace.steps] and data["first_divergence"] == trace.first_divergence
        for r, step in zip(data["steps"], trace.steps, strict=True):
            got = decode_round(r, ids)
            assert [g[:3] for g in got] == [(n.parent, n.rank, n.token_id) for n in step.nodes]
            assert all(abs(g[3] - n.logprob) <= 0.005 + 1e-9 for g, n in zip(got, step.nodes))
            assert (r["a"], ids[r["b"]], r["c"]) == (list(step.accepted), step.bonus_token_id, step.committed_len)
            assert data["reasons"][r["s"][0]] == analysis.stop_info(step)["reason"]


def decode_round(r: dict, ids: list[int]) -> list[tuple]:
    moves, parents, depths, ranks, kids = sp.unpack_ints(r["p"]), [-1], [0], [-1], Counter()
    for i in range(1, r["n"]):
        move = moves[i - 1]
        parents.append((parents[-1] if i > 1 else 0) + (-(move + 1) // 2 if move % 2 else move // 2))
        depths.append(depths[parents[i]] + 1)
        ranks.append(kids[parents[i]])  # without "r": a node's rank is the count of its earlier siblings
        kids[parents[i]] += 1
    if "r" in r:
        ranks = [v - 1 for v in sp.unpack_ints(r["r"])]
    if "g" in r:
        g, at, table = sp.unpack_ints(r["g"]), 0, []
        while at < len(g):
            row, width, at, above = [], g[at], at + 1, 0
            for _ in range(width):
                t, at = g[at], at + 1
                if t:
                    above, at = above + g[at], at + 1
                row.append((t - 1, above) if t else None)
            table.append(row)
        cells = [table[depths[i] - 1][ranks[i]] for i in range(1, r["n"])]
    else:
        cells = list(zip(sp.unpack_ints(r["t"]), sp.unpack_ints(r["l"])))
    return [(-1, -1, ids[r["o"]], 0.0)] + [(parents[i], ranks[i], ids[cells[i - 1][0]], -cells[i - 1][1] / 100 + 0.0)
                                          for i in range(1, r["n"])]


# ---------------------------------------------------------------------------------------------------------
# (a) In Chromium, offline
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chromium():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


def open_offline(browser, url: str):
    """A new page at `url` (a file), every request that is not for a file: URL refused (and counted), the page's
    errors and dialogs kept."""
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    page.refused, page.errors, page.dialogs = [], [], []

    def route(r):
        if r.request.url.startswith("file:"):
            r.continue_()
        else:
            page.refused.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.on("console", lambda m: page.errors.append(m.text) if m.type == "error" else None)
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    page.goto(url)
    return page


def drawn(page, k: int) -> None:
    """Round k (as the page numbers it) drawn: the page says so once every figure's Plotly call has finished."""
    page.wait_for_function(f"document.body.dataset.drawn === '{k}'", timeout=30_000)


SEEN = """() => {
  const tree = document.getElementById('ddt-tree').data, head = document.getElementById('ddt-round-head');
  const nodes = {};
  tree.filter((t) => t.customdata).forEach((t) => t.customdata.forEach((id, j) => { nodes[id] = [t.name, t.x[j], t.y[j]]; }));
  return {nodes, title: document.getElementById('ddt-tree').layout.title.text,
          z: document.getElementById('ddt-mask').data[0].z, where: document.getElementById('ddt-where').textContent,
          head: [head.dataset.nodes, head.dataset.accepted, head.dataset.divergence],
          firsts: [...document.querySelectorAll('#ddt-tokens .ddt-first')].map((e) => e.dataset.index),
          summary: document.getElementById('ddt-summary').textContent,
          stop: document.getElementById('ddt-stop').textContent, hash: location.hash,
          tokens: document.querySelectorAll('#ddt-tokens .ddt-tok').length};
}"""


def check_round(page, trace: Trace, k: int) -> None:
    """What the page shows for round k (0-based) against the trace: every node where the Python layout puts it, the
    accepted path, the bonus, the mask, the first divergence (shown from the round whose output reaches it), the
    summary and the stop, the hash."""
    step, seen = trace.steps[k], page.evaluate(SEEN)
    layout = tree_layout(step)
    shown = _shown(trace, k)
    fd = trace.first_divergence if trace.first_divergence is not None and trace.first_divergence < shown else None
    assert seen["where"].startswith(f"Round {k + 1} of {len(trace.steps)}")
    assert seen["head"] == [str(len(step.nodes)), json.dumps(list(step.accepted), separators=(",", ":")),
                            "" if fd is None else str(fd)]
    nodes = seen["nodes"]
    assert len(nodes) == len(step.nodes) + 1  # the tree positions and the bonus star
    accepted = {int(i) for i, (name, _, _) in nodes.items() if name in ("accepted path", "root (last committed token)")}
    assert accepted == set(step.accepted) and nodes[str(len(step.nodes))][0] == "bonus (target's token)"
    assert {int(i): (x, y) for i, (_, x, y) in nodes.items()} == {n.id: (n.x, n.y) for n in layout.nodes}
    assert seen["title"] == default_title(layout)
    assert seen["z"] == verify_mask(step).tolist()
    assert seen["firsts"] == ([] if fd is None else [str(fd)])
    assert seen["summary"] == compare_with_greedy(trace, k).summary and seen["tokens"] == shown
    assert seen["stop"].startswith(f"Round {k + 1} stopped at depth {len(step.accepted)} after node {step.accepted[-1]}")
    assert seen["stop"].endswith(analysis.stop_info(step)["reason"] + ".")
    assert seen["hash"] == f"#round={k + 1}"


@browser_only
def test_every_round_steps_with_the_keyboard_offline_and_matches_the_trace(chromium, naive, tmp_path):
    path = tmp_path / "session.html"
    path.write_text(sp.supplement_html(naive), encoding="utf-8")
    page = open_offline(chromium, path.as_uri())
    try:
        n = len(naive.steps)
        drawn(page, 1)
        check_round(page, naive, 0)
        for k in range(1, n):
            page.keyboard.press("ArrowRight")
            drawn(page, k + 1)
            check_round(page, naive, k)
        page.keyboard.press("ArrowRight")  # past the last round: stays
        page.keyboard.press("ArrowLeft")
        drawn(page, n - 1)
        check_round(page, naive, n - 2)
        page.keyboard.press("Home")
        drawn(page, 1)
        page.emulate_media(media="print")  # the print stylesheet: the round, without the controls
        assert not page.is_visible("#ddt-nav") and page.is_visible("#ddt-tree .main-svg")
        assert page.pdf()[:5] == b"%PDF-"
        assert page.refused == [] and page.errors == [] and page.dialogs == []
    finally:
        page.close()


@browser_only
def test_trees_unlike_ddtrees_draw_from_their_own_ranks(chromium, naive, tmp_path):
    """A tree whose ranks and log-probs are written per node (unlike_ddtree) is drawn from them: every round held to
    the trace and the Python layout, as DDTree's."""
    other = unlike_ddtree(naive)
    path = tmp_path / "other.html"
    path.write_text(sp.supplement_html(other), encoding="utf-8")
    page = open_offline(chromium, path.as_uri())
    try:
        drawn(page, 1)
        for k in range(len(other.steps)):
            if k:
                page.keyboard.press("ArrowRight")
                drawn(page, k + 1)
            check_round(page, other, k)
        assert page.refused == [] and page.errors == []
    finally:
        page.close()


@browser_only
def test_round_n_in_the_address_opens_round_n_and_a_thinned_file_says_what_it_holds(chromium, naive, tmp_path):
    whole, thin = tmp_path / "whole.html", tmp_path / "thin.html"
    whole.write_text(sp.supplement_html(naive), encoding="utf-8")
    thin.write_text(sp.supplement_html(naive, rounds="2-3"), encoding="utf-8")
    page = open_offline(chromium, whole.as_uri() + "#round=3")
    try:
        drawn(page, 3)
        check_round(page, naive, 2)
        page.evaluate("location.hash = '#round=2'")  # an edited address follows too
        drawn(page, 2)
        check_round(page, naive, 1)
    finally:
        page.close()
    page = open_offline(chromium, thin.as_uri() + "#round=1")
    try:
        drawn(page, 2)  # round 1 is not in the file: its first round, and a note
        assert "Round 1 is not in this file (it holds rounds 2–3)" in page.inner_text("#ddt-note")
        check_round(page, naive, 1)
        page.keyboard.press("ArrowRight")
        drawn(page, 3)
        check_round(page, naive, 2)
        assert page.inner_text("#ddt-note") == "" and "(this file: 2–3)" in page.inner_text("#ddt-where")
        assert page.refused == [] and page.errors == []
    finally:
        page.close()


# ---------------------------------------------------------------------------------------------------------
# (c) Hostile token text
# ---------------------------------------------------------------------------------------------------------

EVIL = ["</script><script>window.__pwned = 1</script>", "<!--", "<img src=x onerror=\"window.__pwned = 2\">",
        "\"quoted\" 'single' &amp; &lt;", "\u202egnp.exe", "\u200f\u200e", "a\u2028b\u2029c", "</SCRIPT >",
        "<script>alert(1)</script>", "]]>--><!--<script>"]


INVALID = "</script >\n<!--<script>window.__pwned = 4</script> \u2028"  # free text: no visible() on its way


def hostile(trace: Trace) -> Trace:
    """Every token's text (the trees' and the token table's) replaced by hostile text; the prompt, the models' names
    and the trace's `invalid` note (text with whitespace, which the data carries as it is) too."""
    texts = {str(i): EVIL[i % len(EVIL)] for i in {int(k) for k in trace.token_texts}
             | {n.token_id for s in trace.steps for n in s.nodes} | set(trace.output_ids) | set(trace.greedy_ids)}
    # the tree drawn last shows every text, whichever token ids this machine's arithmetic put in it (by id alone, a
    # tree without an id of each residue lacked some: 1 mod 10's "<!--" on one machine)
    last = list(dict.fromkeys(n.token_id for n in trace.steps[-1].nodes))
    assert len(last) >= len(EVIL)
    texts.update({str(i): EVIL[j % len(EVIL)] for j, i in enumerate(last)})
    steps = tuple(dataclasses.replace(s, nodes=tuple(dataclasses.replace(n, token=texts[str(n.token_id)])
                                                    for n in s.nodes)) for s in trace.steps)
    return dataclasses.replace(trace, steps=steps, token_texts=texts, prompt="".join(EVIL),
                               target="</title><script>window.__pwned = 3</script>", draft="<b>draft\u202e</b>",
                               output_text="".join(EVIL), invalid=INVALID)


class Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: Counter = Counter()

    def handle_starttag(self, tag, attrs):
        self.tags[tag] += 1


def tags(text: str) -> Counter:
    parser = Tags()
    parser.feed(text)
    return parser.tags


def test_hostile_text_cannot_leave_its_place_in_the_file(naive):
    """The file parses to the same elements as the same session's with plain text (no script, image or comment
    added), the inline JSON holds no `<`, `>`, `&`, U+2028 or U+2029 and reads back to the visible texts."""
    evil = hostile(naive)
    text = sp.supplement_html(evil)
    assert tags(text) == tags(sp.supplement_html(naive)) and tags(text)["script"] == 3 and "img" not in tags(text)
    raw = re.search(r'id="ddt-data">(.*?)</script>', text, re.S).group(1)
    assert not set(raw) & {"<", ">", "&", "\u2028", "\u2029"}
    data = json.loads(raw)
    assert {visible(e) for e in EVIL} <= set(data["tokens"])
    assert "\u202e" not in text and "\u200f" not in text  # right-to-left marks show as their names: \u202e


@browser_only
def test_hostile_text_shows_literally_in_chromium(chromium, naive, tmp_path):
    evil = hostile(naive)
    path = tmp_path / "evil.html"
    path.write_text(sp.supplement_html(evil), encoding="utf-8")
    page = open_offline(chromium, path.as_uri())
    try:
        drawn(page, 1)
        for k in range(2, len(evil.steps) + 1):
            page.keyboard.press("ArrowRight")
            drawn(page, k)
        got = page.evaluate("""() => ({pwned: window.__pwned, imgs: document.querySelectorAll('img').length,
            scripts: document.querySelectorAll('script').length, tree: document.getElementById('ddt-tree').textContent,
            hover: document.getElementById('ddt-tree').data.map((t) => (t.hovertext || []).join('')).join(''),
            tokens: [...document.querySelectorAll('#ddt-tokens .ddt-tok')].map((e) => e.firstChild.textContent),
            titles: [...document.querySelectorAll('#ddt-tokens .ddt-tok')].map((e) => e.title).join(''),
            body: document.body.innerText, title: document.title})""")
        assert got["pwned"] is None and got["imgs"] == 0 and got["scripts"] == 3 and page.dialogs == []
        text = page.evaluate("(id) => document.getElementById(id).textContent", "ddt-plain")
        assert text == sp.shown_raw(evil.output_text)
        assert "</script><s…" in got["tree"] and "<!--" in got["tree"]  # labels (cut to 12) and mask labels
        # the hover as plotly gets it: its three entities, which it draws as the characters
        assert "&lt;/script&gt;&lt;script&gt;window.__pwned·=·1&lt;/script&gt;" in got["hover"]
        assert visible(EVIL[0]) in got["tokens"] and visible(EVIL[2]) in got["tokens"]
        assert visible(EVIL[4]) in got["tokens"] and "\\u202egnp.exe" in got["body"] and "\u202e" not in got["body"]
        assert visible(EVIL[3]) in got["tokens"]  # as typed, not escaped twice
        assert page.text_content("#ddt-summary") == f"comparison with greedy INVALID: {INVALID}"
        assert "</title><script>window.__pwned·=·3</script>" in got["title"]
        assert page.refused == [] and page.errors == []
    finally:
        page.close()


# ---------------------------------------------------------------------------------------------------------
# (d) The command line
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trace_file(naive, tmp_path_factory):
    path = tmp_path_factory.mktemp("supp") / "trace.json"
    naive.save(path)
    return path


@pytest.mark.parametrize("rounds, words", [
    ("1..3", "--rounds must be A-B (e.g. 1-20), A-last or one round N, not '1..3'"),
    ("a-b", "--rounds must be A-B"), ("", "--rounds must be A-B"), ("2-", "--rounds must be A-B"),
    ("3-1", "--rounds 3-1 runs backwards"),
    ("0-2", "--rounds 0-2 is out of range (rounds are numbered from 1, as on the page)"),
    ("1-99", "--rounds 1-99 is out of range: this trace has {n} rounds: use A-B within 1-{n}"),
    ("99", "--rounds 99-99 is out of range"),
])
def test_bad_rounds_are_clear_errors(trace_file, naive, tmp_path, capsys, rounds, words):
    out = tmp_path / "s.html"
    assert cli.main(["export", "--trace", str(trace_file), "--session", "--rounds", rounds, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words.format(n=len(naive.steps)) in err and not out.exists()


def test_rounds_and_outputs_the_command_line_takes_and_refuses(trace_file, naive, tmp_path, capsys):
    n = len(naive.steps)
    out = tmp_path / "s.html"
    assert cli.main(["export", "--trace", str(trace_file), "--session", "--rounds", "2-last", "--out", str(out)]) == 0
    assert f"rounds 2-{n} of {n} written to {out}" in capsys.readouterr().out
    assert [r["i"] for r in embedded(out.read_text(encoding="utf-8"))["steps"]] == list(range(1, n))
    assert cli.main(["export", "--trace", str(trace_file), "--session", "--rounds", "2", "--out", str(out)]) == 0
    assert len(embedded(out.read_text(encoding="utf-8"))["steps"]) == 1
    capsys.readouterr()
    refusals = [
        (["--session", "--out", str(tmp_path / "missing" / "s.html")], "missing does not exist"),
        (["--session", "--out", str(tmp_path)], "it is a directory"),
        (["--session", "--out", str(tmp_path / ("x" * 300 + ".html"))], "file systems take at most 255"),
        (["--session", "--out", str(tmp_path / "s.svg")], "--session writes one HTML file, not svg"),
        (["--session", "--format", "json", "--out", str(out)], "--session writes one HTML file, not json"),
        (["--rounds", "1-2", "--out", str(tmp_path / "r.svg")], "--rounds thins a session supplement: add --session"),
    ]
    for args, words in refusals:
        assert cli.main(["export", "--trace", str(trace_file), *args]) == 2, args
        assert words in capsys.readouterr().err, args
    assert cli.main(["export", "--trace", str(tmp_path / "nope.json"), "--session", "--out", str(out)]) == 2
    assert "error: " in capsys.readouterr().err


def test_session_to_standard_output(trace_file, naive, capfdbinary):
    assert cli.main(["export", "--trace", str(trace_file), "--session", "--out", "-"]) == 0
    assert capfdbinary.readouterr().out == sp.supplement_html(naive).encode("utf-8")


def test_parse_rounds_forms():
    assert sp.parse_rounds(None, 5) == range(5) and sp.parse_rounds(" 2 - 4 ", 5) == range(1, 4)
    assert sp.parse_rounds("3", 5) == range(2, 3) and sp.parse_rounds("4-LAST", 5) == range(3, 5)
    assert sp.parse_rounds(range(1, 3), 5) == range(1, 3)
    with pytest.raises(InputError, match="no rounds to show"):
        sp.parse_rounds("1-2", 0)


# ---------------------------------------------------------------------------------------------------------
# The page's button
# ---------------------------------------------------------------------------------------------------------


def test_the_pages_session_download_writes_the_tabs_session(trace_file, naive, big):
    tab = actions.load_replay(TabState(), str(trace_file))
    path = actions.write_supplement(tab)
    assert path.name == f"ddtree-session-{len(naive.steps)}-rounds.html" and path.parent.name == "supplement"
    assert path.read_text(encoding="utf-8") == sp.supplement_html(tab.trace)
    again = actions.write_supplement(tab)  # the tab's earlier file goes
    assert again == path and len(list(path.parent.iterdir())) == 1
    with pytest.raises(InputError, match="nothing to save yet"):
        actions.write_supplement(TabState())
    tab.trace = big
    with pytest.raises(InputError, match=r"would be [\d,]+ bytes .* From the page: download the trace, then "
                                         r"`python -m ddtree_viz export --trace TRACE.json --session --rounds A-B"):
        actions.write_supplement(tab)


def test_the_served_button_offers_the_file_to_its_own_browser_only(trace_file, naive):
    """Over HTTP, as the page's 'Download session (.html)' does it: the file is the supplement of the replayed trace,
    served to the browser that made it and to no other (tabfiles.py)."""
    import httpx
    from gradio_client import Client, handle_file

    from tests.test_app import serve

    proc, url = serve("--replay", str(trace_file))
    try:
        owner = Client(url, verbose=False, download_files=False)
        other = Client(url, verbose=False)
        owner.predict("verified", handle_file(str(trace_file)), api_name="/replay")
        got = owner.predict(api_name="/download_session")
        link = got["value"]["url"] if "value" in got else got["url"]
        assert httpx.get(link).status_code == 404 and httpx.get(link, cookies=other.cookies).status_code == 404
        mine = httpx.get(link, cookies=owner.cookies)
        assert mine.status_code == 200 and mine.content == sp.supplement_html(naive).encode("utf-8")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# ---------------------------------------------------------------------------------------------------------
# analyze --supplements: each prompt's session beside the report, linked from it
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory):
    """analyze --supplements --misses on two prompts of the embedded pair: the report directory (its misses file,
    misses.jsonl, beside it)."""
    base = tmp_path_factory.mktemp("analyze-supplements")
    (base / "p.txt").write_text("def add(a, b):\n\nclass Point:\n    pass\n", encoding="utf-8")
    out = base / "out"
    assert cli.main(["analyze", "--prompts", str(base / "p.txt"), "--out", str(out), "--max-new-tokens", "8",
                     "--budget", "8", "--no-speedup", "--supplements", "--misses", str(base / "misses.jsonl")]) == 0
    return out


def test_analyze_writes_each_prompts_session_and_the_report_links_it(analyzed):
    from ddtree_viz.render.report import prompts_html

    out = analyzed
    report = (out / "report.html").read_text(encoding="utf-8")
    links = re.findall(r'<a class=session href="(supplements/(\d{4})\.html)#round=1">', report)
    assert [i for _, i in links] == ["0000", "0001"]
    for name, i in links:
        trace = Trace.load(out / "traces" / f"{i}.json")
        assert (out / name).read_text(encoding="utf-8") == sp.supplement_html(trace)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    table = prompts_html(summary, supplements={"traces/0000.json": None})  # a session past the bound: no link
    assert "over 5 MB" in table and "session (HTML)" in table and table.count("<a class=session") == 0
    assert "session (HTML)" not in prompts_html(summary)  # without --supplements: no column


@browser_only
def test_a_miss_in_the_report_opens_its_round_in_the_prompts_session_file(chromium, analyzed):
    """Issue #68 item 2: report.html, opened from file:// with every other request refused, lists each miss of
    misses.jsonl as a link; a click opens the prompt's session file at that round (#round=N), which shows round N
    of the trace: the round whose walk left the target (misses.jsonl's row, held to the trace)."""
    rows = [json.loads(line) for line in (analyzed.parent / "misses.jsonl").read_text(encoding="utf-8").splitlines()]
    row = max(rows, key=lambda r: (r["round"], r["trace"]))  # a round past the first, where there is one
    trace = Trace.load(analyzed / row["trace"])
    step = trace.steps[row["round"] - 1]
    assert row["round"] > 1 and row["depth"] == len(step.accepted)
    assert analysis.stop_info(step, trace.settings["block_size"])["reason"] == row["reason"]
    page = open_offline(chromium, (analyzed / "report.html").as_uri())
    try:
        link = page.locator(f"#miss-rounds a.session-round[data-file='{row['trace']}']"
                            f"[data-round='{row['round'] - 1}']")
        assert link.count() == 1 and link.inner_text() == str(row["round"])
        assert f"depth {row['depth']} ({row['reason']})" in link.get_attribute("title")
        link.click()
        page.wait_for_url(f"**/supplements/{row['index']:04d}.html#round={row['round']}", timeout=30_000)
        drawn(page, row["round"])
        check_round(page, trace, row["round"] - 1)  # its stop: at the miss's depth, for the miss's reason
        assert page.refused == [] and page.errors == [] and page.dialogs == []
    finally:
        page.close()

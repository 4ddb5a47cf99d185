"""Words for numbers and names (issue #65 item 7): every count said with its noun goes through ddtree_viz.words, so
that the page, the CLI, the reports and the exports never say '1 drafted tokens' or '2 round' at counts 0, 1 and 2
(sessions, rounds and checks made to have those counts, every text they show scanned); a trace upload's error names
the file as uploaded, its base name only, escaped."""

import re
import pytest

from ddtree_viz.cli import main
from ddtree_viz.errors import TraceError
from ddtree_viz.page import actions
from ddtree_viz.page.host import ModelHost
from ddtree_viz.page.progress import CheckProgress, Pace, status_line
from ddtree_viz.page.state import SETTINGS, TabState, read_settings
from ddtree_viz.page.views import render_check, render_views
from ddtree_viz.prompts import DEFAULT_PROMPTS
from ddtree_viz.words import numbered, plural

NOUNS = ("token", "round", "node", "layer", "prompt", "position", "draft", "file", "byte", "character", "entry",
         "row", "message", "pass", "weight", "value", "thread", "turn", "step", "miss", "sequence", "candidate")
PLURALS = {"entry": "entries", "pass": "passes", "miss": "misses"}
_many = "|".join(PLURALS.get(n, n + "s") for n in NOUNS)
_one = "|".join(NOUNS)
# a count, at most one word between it and its noun ("1 drafted tokens": not "depth 2 after node 3"), not part of a
# bigger number or a range
_between = r"(?:(?!(?:after|at|of|in|on|to|the|for|from|per|and|or|by|a)\b)[a-z]+ )?"
ONE_WITH_PLURAL = re.compile(rf"(?<![\w.,/–-])1 {_between}(?:{_many})\b(?![/-])")
MANY_WITH_SINGULAR = re.compile(rf"(?<![\w.,/–-])(?:0|[2-9]|[1-9][\d,]*\d) {_between}(?:{_one})\b(?![/-]|s\b)")


def bad_plurals(text: str) -> list[str]:
    """Each '1 ...s' and 'N ...' (N != 1, singular) in `text`, tags and entities taken out."""
    text = re.sub(r"<[^>]+>|&#?\w+;", " ", text)
    return [m.group(0) for pattern in (ONE_WITH_PLURAL, MANY_WITH_SINGULAR) for m in pattern.finditer(text)]


def test_plural_and_numbered_say_counts_as_people_do():
    assert [plural(n, "drafted token") for n in (0, 1, 2)] == ["0 drafted tokens", "1 drafted token",
                                                                "2 drafted tokens"]
    assert (plural(1, "entry"), plural(2, "entry"), plural(3, "pass"), plural(1_024, "tree position")) == (
        "1 entry", "2 entries", "3 passes", "1,024 tree positions")
    assert plural(2, "child", "children") == "2 children"
    assert (numbered("token", 5, 5), numbered("token", 5, 8), numbered("round", 1, 1_200)) == (
        "token 5", "tokens 5–8", "rounds 1–1,200")
    # and the checker below finds what it is for, and only that
    assert bad_plurals("accepted 1 drafted tokens") == ["1 drafted tokens"]
    assert bad_plurals("over 2 round, 0 position") == ["2 round", "0 position"]
    assert bad_plurals("1 token, 2 tokens, 0 rounds, 12.5 tokens/s, rounds 1–2 of 2, top-1 token, 1,024 tokens, "
                       "<b>1</b> token, 3 accepted drafts, depth 2 after node 3") == []


@pytest.fixture(scope="module")
def host():
    h = ModelHost(None, None, "float32", "cpu")  # the embedded pair: its drafts are accepted, 0, 1 or 2 of them
    h.start(background=False)
    assert h.ready, h.error
    return h


def _texts(host, tab) -> list[str]:
    """Every text the page shows of the tab, at every round: each view's words and each figure's JSON (titles,
    hovers, axes), and the check's."""
    out = []
    for k in range(len(tab.trace.steps)):
        tab.view = k
        views = render_views(host, tab, "verified")
        out += [v.to_json() if hasattr(v, "to_json") else str(v) for v in views.values() if v is not None]
        out += [str(v) for v in render_check(host, tab).values() if v is not None]
    return out


SESSIONS = [  # (max new tokens, budget, block size, method, compare): rounds gaining 1, 2 and 3 tokens, cut rounds
    (1, 8, 4, "ddtree", False), (2, 1, 2, "dflash", False), (3, 2, 3, "ddtree", True), (48, 8, 3, "ddtree", False)]


@pytest.mark.parametrize("max_new, budget, block, method, compare", SESSIONS)
def test_no_count_on_the_page_says_the_wrong_plural(host, max_new, budget, block, method, compare):
    tab = TabState()
    s = read_settings(host, {**SETTINGS, "prompt": DEFAULT_PROMPTS[2], "budget": budget, "block_size": block,
                             "max_new_tokens": max_new, "verify": "exact", "method": method, "compare_on": compare,
                             "compare_budget": 1, "compare_block_size": 2})
    for tab in actions.run_rounds(host, tab, s):
        pass
    tab = actions.check_transformers(host, tab)
    texts = _texts(host, tab) if tab.trace.steps else [str(v) for v in render_views(host, tab).values()]
    gained = {st.acceptance - 1 for st in tab.trace.steps}
    assert [bad for text in texts for bad in bad_plurals(text)] == [], gained
    assert max_new < 48 or {0, 1, 2} <= gained, gained  # rounds that accepted 0, 1 and 2 drafts


def test_a_checks_words_count_right(host):
    pace = Pace(0.02, 40)
    for done, total in ((0, 1), (1, 1), (0, 2), (1, 2), (2, 2)):
        for running, stopped in ((False, False), (True, False), (False, True)):
            line = status_line(CheckProgress("the reference (runner)", done, total, 0.5, pace, running, stopped))
            assert bad_plurals(line) == [], line
    one_left = status_line(CheckProgress("the reference", 1, 2, None, None, stopped=True))
    assert "token 2 was not checked, so whether it equals it is unknown (no verdict on it)" in one_left


def test_no_count_in_the_cli_says_the_wrong_plural(tmp_path, capsys):
    trace = tmp_path / "t.json"
    assert main(["run", "--prompt", "def add(a, b):\n", "--max-new-tokens", "2", "--budget", "1", "--block-size", "2",
                 "--trace", str(trace)]) == 0
    assert main(["replay", "--print", "--round", "1", str(trace)]) == 0
    assert main(["export", "--trace", str(trace), "--figure", "tree", "--format", "svg", "--out",
                 str(tmp_path / "t.svg")]) == 0
    assert main(["export", "--trace", str(trace), "--session", "--out", str(tmp_path / "s.html")]) == 0
    session = (tmp_path / "s.html").read_text(encoding="utf-8")
    (tmp_path / "p.txt").write_text("def add(a, b):\n", encoding="utf-8")
    assert main(["analyze", "--prompts", str(tmp_path / "p.txt"), "--out", str(tmp_path / "r"), "--max-new-tokens",
                 "2", "--budget", "1", "--no-speedup"]) == 0
    out = capsys.readouterr()
    report = (tmp_path / "r" / "report.html").read_text(encoding="utf-8")
    report = re.sub(r"<script.*?</script>|<svg.*?</svg>", " ", report, flags=re.S)  # (figures: tested as drawn)
    session = re.sub(r"<script.*?</script>", " ", session, flags=re.S)
    assert bad_plurals(out.out + out.err) == [] and bad_plurals(report) == [] and bad_plurals(session) == []
    assert "1 prompt" in out.out and "1 of 1 prompt decoded" in out.out


@pytest.mark.parametrize("content", [b"not json", b"[1, 2]", b'{"schema_version": 1}', b'{"prompt": "\xff\xfe"}'])
def test_a_trace_upload_error_names_the_file_by_its_base_name_escaped(host, tmp_path, content):
    """The error of a bad upload names the file as uploaded (gradio keeps its base name: the page passes only that),
    never the server's folder; in the status line its markup shows as typed."""
    upload = tmp_path / "gradio" / "0123abcd" / "my <b>trace & co.json"
    upload.parent.mkdir(parents=True)
    upload.write_bytes(content)
    tab = TabState()
    with pytest.raises(TraceError) as refused:
        actions.load_replay(tab, str(upload), name=upload.name)
    said = str(refused.value)
    assert "trace file my <b>trace & co.json" in said
    assert str(tmp_path) not in said and "0123abcd" not in said
    tab.notice = said  # what the page's handler does with it (wiring.errors_in_status)
    status = render_views(host, tab).status
    assert "my &#60;b&#62;trace &#38; co.json" in status and "<b>trace" not in status


def test_a_name_inside_the_message_is_not_taken_for_the_file_named(tmp_path):
    """The file's name occurring in the message (a file called 'trace.json' or 'JSON') is no reason to leave the
    file unnamed: the message says 'trace file NAME' whatever the name."""
    from ddtree_viz.trace import load_any

    bad = tmp_path / "x.json"
    bad.write_text("not json", encoding="utf-8")
    for name in ("JSON", "trace", "valid"):
        with pytest.raises(TraceError, match=rf"^trace file {name}: the trace is not valid JSON"):
            load_any(bad, name=name)
    with pytest.raises(TraceError, match=r"^trace file not found: gone.json$"):
        load_any(tmp_path / "gone.json", name="gone.json")


def test_every_panel_has_a_title_in_words(host):
    """Each figure and HTML panel of the Step tab has a title (a Plot's label, a heading line) that says what it
    shows, not an internal name: no 'spec', 'html', 'verify pass' alone, or the view's own name."""
    from ddtree_viz.page.views import COMPARE_HEADING, STATS_HEADING, STOP_HEADING
    from ddtree_viz.page.web.step_tab import HEADINGS, LAYOUT_TITLE, TITLES

    titles = {**TITLES, **HEADINGS, "layout_accordion": LAYOUT_TITLE, "stop_html": STOP_HEADING,
              "compare_html": COMPARE_HEADING, "stats_table": STATS_HEADING}
    assert {"tree_spec", "tree_b_spec", "grid_spec", "mask_spec", "cache_chart_spec", "acceptance_spec", "depth_spec",
            "budget_spec", "cache_html", "diff_html", "divergence"} <= set(titles)
    for name, title in titles.items():
        words = re.sub(r"[*(),:]", " ", title).split()
        assert len(words) >= 5 and name not in title and "spec" not in words, (name, title)
    assert "accepted path in vermillion" in TITLES["tree_spec"]
    # the HTML panels' headings are on the page with them
    tab = TabState()
    s = read_settings(host, {**SETTINGS, "prompt": "def add(a, b):\n", "budget": 4, "block_size": 4,
                             "max_new_tokens": 4, "verify": "exact", "method": "ddtree", "compare_on": True})
    views = render_views(host, actions.step(host, tab, s), "verified")
    assert STOP_HEADING in views.stop and COMPARE_HEADING in views.compare and views.stats.startswith(STATS_HEADING)

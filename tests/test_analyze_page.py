"""The page's Analyze tab through ddtree_viz/page/analyze_tab.py (what its callbacks call), on a report written by a
real `analyze --method both` run on the embedded pair: a directory or its uploaded files, shown with the figures its
traces give; bad directories and uploads refused clearly (never naming a server path); a round link opens that
round in the step view as a replay (no model)."""

import json
import os
import re
import shutil
import uuid
from pathlib import Path

import pytest

from ddtree_viz.page import actions
from ddtree_viz.page.analyze_tab import (PAGE_SET_MAX_PROMPTS, PAGE_SET_MAX_TOKENS, ReportDirs, load_report_dir,
                                         load_report_upload, open_report_click, open_report_round, report_html,
                                         report_status, run_prompt_set, write_misses_file)
from ddtree_viz.page.host import ModelHost
from tests import tiny
from ddtree_viz.page.state import MAX_UPLOAD_BYTES, TabState
from ddtree_viz.page.views import render_views
from ddtree_viz import analysis
from ddtree_viz.cli import main
from ddtree_viz.errors import InputError, TraceError
from ddtree_viz.trace import Trace

PROMPTS = "def add(a, b):\n\nclass Point:\n    def __init__(self, x, y):\n"
SETTINGS = ["--max-new-tokens", "8", "--budget", "8", "--no-speedup"]  # the study: tests/test_speedup.py


def write_report(base: Path) -> Path:
    """analyze --method both on two prompts of the embedded pair: DIR with summary.json, traces/, report.html; and
    beside DIR the CLI's misses file (misses.jsonl, analyze --misses)."""
    (base / "p.txt").write_text(PROMPTS, encoding="utf-8")
    out = base / "report"
    assert main(["analyze", "--prompts", str(base / "p.txt"), "--out", str(out), *SETTINGS, "--method", "both",
                 "--misses", str(base / "misses.jsonl")]) == 0
    return out


MISS_LINK = re.compile(r'<a class="round ddv-open-round" href="#" role=button data-file="([^"]+)" '
                       r'data-round="(\d+)" title="round (\d+): depth (\d+) [^"]*">(\d+)</a>')


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    return write_report(tmp_path_factory.mktemp("analyze-page"))


@pytest.fixture(scope="module")
def no_model():
    host = ModelHost(None, None, "float32", "cpu")
    host.stage, host.replay_only = "not loaded", True
    return host


def uploaded(files: list[Path], root: Path) -> list[str]:
    """The files as gradio hands uploads to a handler: each in a folder of its own, under its own name."""
    paths = []
    for f in files:
        folder = root / uuid.uuid4().hex
        folder.mkdir(parents=True)
        shutil.copy(f, folder / f.name)
        paths.append(str(folder / f.name))
    return paths


def test_a_report_directory_shows_the_figures_of_its_traces(report_dir):
    tab = load_report_dir(TabState(), str(report_dir))
    written = json.loads((report_dir / "summary.json").read_text())
    r = tab.report
    assert json.loads(json.dumps(r.summary)) == written and "dflash" in written  # both sides, from the traces
    assert r.note == ""  # summary.json agrees with its traces
    html = report_html(tab)
    assert html.count("<figure id=\"fig-") == 5 and html.count("<svg") == 5
    assert 'id="series-0"' in html and 'id="series-1"' in html  # acceptance by depth: DDTree's and the chain's
    assert "<table id=headline>" in html and "<th>DDTree budget 8</th><th>DFlash chain</th>" in html
    assert "<table id=misses>" in html and "<table id=prompts class=sortable>" in html
    # every prompt's two traces are links that open a round, and only the report's traces are openable
    for side in (written, written["dflash"]):
        for p in side["per_prompt"]:
            assert f'class="round ddv-open-round" href="#" role=button data-file="{p["file"]}" data-round="0"' in html
    assert set(r.files) == {f"traces/{i:04d}{s}.json" for i in (0, 1) for s in ("", ".dflash")}
    status = report_status(tab)
    for side in (written, written["dflash"]):
        assert f"mean acceptance {side['mean_acceptance']:.2f} over {side['rounds']} rounds" in status
    assert "DDTree budget 8" in status and "DFlash chain" in status and str(report_dir) in status
    # typed with a trailing slash and ~ for home, the same report
    home = Path.home()
    if report_dir.is_relative_to(home):
        again = load_report_dir(TabState(), "~/" + str(report_dir.relative_to(home)) + "/")
        assert again.report.summary == r.summary


def test_a_miss_or_a_prompt_opens_its_round_in_the_step_view(report_dir, no_model):
    tab = load_report_dir(TabState(), str(report_dir))
    summary = tab.report.summary
    miss = summary["top_misses"][0]["examples"][0]
    tab = open_report_round(tab, miss["file"], miss["round"])
    trace = Trace.load(report_dir / miss["file"])
    assert tab.replay and tab.session is None and tab.view == miss["round"]
    assert tab.trace.output_ids == trace.output_ids and len(tab.trace.steps) == len(trace.steps)
    views = render_views(no_model, tab)
    assert views.status.startswith(f"Round {miss['round'] + 1} of {len(trace.steps)} (replay of a saved trace")
    assert views.tree_spec is not None and views.stop  # the round's tree and where its walk stopped
    assert tab.report is not None  # the report stays loaded
    # the page's click: 'file|round|nonce' (a prompt's DFlash chain trace, its last round)
    chain = summary["dflash"]["per_prompt"][1]
    n = len(Trace.load(report_dir / chain["file"]).steps)
    tab = open_report_click(tab, f"{chain['file']}|{n - 1}|1712345")
    assert render_views(no_model, tab).status.startswith(f"Round {n} of {n} (replay")
    assert tab.trace.settings["method"] == "dflash"
    # a round past the end shows the last one; a Reset in the step view keeps the report
    tab = open_report_round(tab, "traces/0000.json", 5000)
    assert tab.view == len(tab.trace.steps) - 1
    actions.reset(tab)
    assert tab.trace is None and tab.report is not None


def test_the_report_links_every_miss_to_its_round(report_dir, no_model):
    """Issue #68 item 2: the page's report lists every miss of misses.jsonl by prompt, each a link whose round is
    that miss's round in its trace (a round whose walk left the target), and the link opens that round."""
    tab = load_report_dir(TabState(), str(report_dir))
    body = report_html(tab)
    table = body[body.index("<table id=miss-rounds"):]
    table = table[:table.index("</table>")]
    links = MISS_LINK.findall(table)
    rows = [json.loads(line) for line in (report_dir.parent / "misses.jsonl").read_text().splitlines()]
    assert rows and [(f, int(k) + 1) for f, k, *_ in links] == [(r["trace"], r["round"]) for r in rows]
    for (file, k, said, depth, text), row in zip(links, rows):
        trace = Trace.load(report_dir / file)
        step = trace.steps[int(k)]
        assert int(said) == int(text) == int(k) + 1 and int(depth) == row["depth"] == len(step.accepted)
        stop = analysis.stop_info(step, trace.settings["block_size"])
        assert stop["reason"] == row["reason"] != analysis.STOP_BLOCK_END
        assert stop["target_token_id"] == row["target_token_id"] == step.bonus_token_id
    # every trace has its row (its count of misses), with or without one
    counts = re.findall(r'<tr data-file="([^"]+)"><td data-v="\d+">\d+</td><td>\w+</td><td>(\d+)</td><td>(\d+)</td>',
                        table)
    assert sorted(f for f, _, _ in counts) == sorted(tab.report.files)
    for file, rounds, n in counts:
        assert int(rounds) == len(Trace.load(report_dir / file).steps)
        assert int(n) == sum(r["trace"] == file for r in rows)
    # a miss's link opens its round in the step view
    file, k = links[-1][:2]
    tab = open_report_click(tab, f"{file}|{k}|1")
    assert render_views(no_model, tab).status.startswith(f"Round {int(k) + 1} of {len(tab.trace.steps)} (replay")


def test_the_misses_download_is_the_clis_file_and_each_tabs_own(report_dir, tmp_path):
    """'Download misses (.jsonl)': the bytes `analyze --misses` wrote for the same report (the same rows, the same
    writer), in the tab's own folder; another tab's file is its own; a new download replaces the tab's last."""
    with pytest.raises(InputError, match="no report loaded"):
        write_misses_file(TabState())
    cli = (report_dir.parent / "misses.jsonl").read_bytes()
    a, b = load_report_dir(TabState(), str(report_dir)), TabState()
    try:
        path = write_misses_file(a)
        assert path.name == "misses-p.jsonl" and path.read_bytes() == cli  # the set: p.txt, as the CLI names it
        assert path.is_relative_to(a.folder) and path.parent.name == "misses"
        assert write_misses_file(a) == path and list(path.parent.iterdir()) == [path]
        # another tab, the same report uploaded without prompts.json: its own file, the set unnamed
        files = [report_dir / "summary.json", *sorted((report_dir / "traces").glob("*.json"))]
        load_report_upload(b, uploaded(files, tmp_path / "gradio"))
        other = write_misses_file(b)
        assert other.name == "misses.jsonl" and other.is_relative_to(b.folder) and not other.is_relative_to(a.folder)
        assert [json.loads(x) for x in other.read_text().splitlines()] == [
            {**json.loads(x), "set": ""} for x in cli.decode().splitlines()]
        assert path.read_bytes() == cli  # the first tab's file untouched
    finally:
        a.free()
        b.free()
    # the set's name comes from prompts.json: in safe characters in the file's name; a bad one leaves it unnamed
    odd = tmp_path / "odd"
    shutil.copytree(report_dir, odd)
    for given, name in (("../../<b> x.txt", "misses-b-x.jsonl"), ("x" * 5000, "misses.jsonl"), (["p"], "misses.jsonl"),
                        ("\ud800", "misses.jsonl")):
        prompts = json.loads((odd / "prompts.json").read_text())
        (odd / "prompts.json").write_text(json.dumps({**prompts, "file": given}))
        tab = load_report_dir(TabState(), str(odd))
        try:
            path = write_misses_file(tab)
            assert path.name == name and path.parent == tab.folder / "misses"
            assert {json.loads(x)["set"] for x in path.read_text().splitlines()} == {name[7:-6]}
        finally:
            tab.free()


def test_only_the_reports_own_traces_open(report_dir, tmp_path):
    with pytest.raises(InputError, match="no report loaded"):
        open_report_round(TabState(), "traces/0000.json", 0)
    tab = load_report_dir(TabState(), str(report_dir))
    outside = tmp_path / "t.json"
    shutil.copy(report_dir / "traces" / "0000.json", outside)
    for name in ("traces/0007.json", "../report/traces/0000.json", str(outside), "summary.json", "traces/0000.meta.json",
                 None, 3):
        with pytest.raises(InputError, match="not a trace of the loaded report"):
            open_report_round(tab, name, 0)
    for value in ("", "traces/0000.json", "traces/0000.json|x|1", "traces/0000.json|-1|1"):
        with pytest.raises(InputError):
            open_report_click(tab, value)


def test_bad_directories_are_refused_clearly(report_dir, tmp_path):
    tab = TabState()
    for text, message in (("", "type the path"), ("   ", "type the path"), (None, "type the path"),
                          (str(tmp_path / "nowhere"), "is not a directory the server can read"),
                          (str(report_dir / "summary.json"), "is not a directory"),
                          (str(tmp_path), "has no summary.json"), ("x" * 5000, "not a directory path"),
                          ("a\0b", "not a directory path")):
        with pytest.raises(InputError, match=message):
            load_report_dir(tab, text)
    assert tab.report is None
    # summary.json without traces/
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(report_dir / "summary.json", bare / "summary.json")
    with pytest.raises(InputError, match="has no traces/ folder"):
        load_report_dir(tab, str(bare))
    # the typed text comes back escaped
    hostile = tmp_path / "<b>x</b>"
    with pytest.raises(InputError) as err:
        load_report_dir(tab, str(hostile))
    assert "&lt;b&gt;x&lt;/b&gt;" in str(err.value) and "<b>" not in str(err.value)
    # a corrupt trace, an unreadable summary, a bad prompt list: refused naming the file in the report, not its path
    for name, text, message in (("traces/0001.json", '{"schema_version": 1', "traces/0001.json"),
                                ("traces/0001.dflash.json", json.dumps({"steps": "many"}), "traces/0001.dflash.json"),
                                ("summary.json", "[1, 2", "summary.json"),
                                ("prompts.json", json.dumps({"prompts": 5}), "prompts.json"),
                                ("traces/0000.meta.json", "[" * 100 + "]" * 100, "traces/0000.meta.json")):
        broken = tmp_path / f"broken-{uuid.uuid4().hex}"
        shutil.copytree(report_dir, broken)
        (broken / name).write_text(text)
        with pytest.raises(TraceError, match=message) as err:
            load_report_dir(tab, str(broken))
        assert str(tmp_path) not in str(err.value)
    assert tab.report is None


def test_untrusted_text_in_a_report_is_escaped(report_dir, tmp_path):
    """Token texts, prompts and sources come from files: every one shows as text."""
    hostile = tmp_path / "hostile"
    shutil.copytree(report_dir, hostile)
    evil = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    for f in (hostile / "traces").glob("*.json"):
        if f.name.count(".") == 1 or f.name.endswith(".dflash.json"):
            data = json.loads(f.read_text())
            data["token_texts"] = {k: evil + '" onfocus="z' for k in data["token_texts"]}  # the misses' tooltips too
            f.write_text(json.dumps(data))
    prompts = json.loads((hostile / "prompts.json").read_text())
    for item in prompts["prompts"]:
        item["prompt"], item["source"] = evil, evil + '" onmouseover="x'
    (hostile / "prompts.json").write_text(json.dumps(prompts))
    tab = load_report_dir(TabState(), str(hostile))
    html = report_html(tab)
    assert "<script" not in html and "<img" not in html and "onmouseover=\"x" not in html and 'onfocus="z' not in html
    assert "&quot;·onfocus=&quot;z" in html[html.index("<table id=miss-rounds"):]
    assert "&lt;script&gt;" in html and "&lt;img" in html


def test_an_uploaded_report_is_the_same_report_and_outlives_gradios_copies(report_dir, tmp_path, no_model):
    files = [report_dir / "summary.json", report_dir / "prompts.json", report_dir / "report.html",
             *sorted((report_dir / "traces").glob("*.json")), *sorted((report_dir / "figures").glob("*.svg"))]
    gradio = tmp_path / "gradio"
    paths = uploaded(files, gradio)
    tab = load_report_upload(TabState(), paths)
    try:
        assert tab.report.summary == load_report_dir(TabState(), str(report_dir)).report.summary
        assert "6 other uploaded files left out" in tab.report.note  # report.html and five figures
        assert str(gradio) not in report_status(tab) + report_html(tab)
        # gradio deletes its copies of uploads after a while: the round opens from the tab's own copy
        shutil.rmtree(gradio)
        tab = open_report_round(tab, "traces/0001.dflash.json", 1)
        assert render_views(no_model, tab).status.startswith("Round 2 of ")
        kept = tab.folder
        assert kept is not None and (tab.report.folder / "traces" / "0001.dflash.json").is_file()
        assert tab.report.folder.parent == kept
    finally:
        tab.free()
    assert tab.report is None and not kept.exists()  # the tab's files go with it


def test_bad_uploads_are_refused_clearly(report_dir, tmp_path):
    tab = TabState()
    root = tmp_path / "gradio"
    traces = sorted((report_dir / "traces").glob("*.json"))
    for paths, message in (([], "upload a report"), (None, "upload a report"),
                           (uploaded(traces, root), "no summary.json"),
                           (uploaded([report_dir / "summary.json"], root), "no traces"),
                           (uploaded([report_dir / "summary.json", traces[0], traces[0]], root), "two uploaded files")):
        with pytest.raises(InputError, match=message) as err:
            load_report_upload(tab, paths)
        assert str(root) not in str(err.value)
    # a file over the page's upload bound
    big = tmp_path / "big" / "0005.json"
    big.parent.mkdir()
    with open(big, "wb") as f:
        f.truncate(MAX_UPLOAD_BYTES + 1)
    with pytest.raises(InputError, match="0005.json is .* bytes; an uploaded file may be at most 16 MB"):
        load_report_upload(tab, uploaded([report_dir / "summary.json", big], root))
    # a corrupt trace among the uploads: named as uploaded, never by the server's path
    bad = tmp_path / "bad" / "0001.json"
    bad.parent.mkdir()
    bad.write_text('{"schema_version": 1, "steps": 3}')
    with pytest.raises(TraceError, match="traces/0001.json") as err:
        load_report_upload(tab, uploaded([report_dir / "summary.json", traces[0], bad], root))
    assert str(root) not in str(err.value) and str(tmp_path) not in str(err.value)
    assert tab.report is None
    if tab.folder is not None:
        tab.free()


def test_report_loading_holds_no_model(report_dir):
    """The Analyze tab works in replay mode (no model) and its reader imports no torch."""
    import subprocess
    import sys

    code = ("import sys; from ddtree_viz.promptset.report import read_report, report_files; "
            "from ddtree_viz.promptset.summary import summarize_report; "
            f"summarize_report(read_report(report_files({str(report_dir)!r}))); "
            "print([m for m in ('torch', 'transformers', 'gradio') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.stdout.strip() == "[]"


def test_which_directories_a_page_reads(report_dir, tmp_path):
    """A page reachable beyond this machine (--share, another --host) reads no typed directory unless started with
    --report-root DIR; then only directories under DIR (relative paths from it; links that lead out refused)."""
    from ddtree_viz.page.web.app import build_parser, report_dirs

    def dirs(*argv):
        return report_dirs(build_parser().parse_args(list(argv)))

    assert dirs() == ReportDirs(allowed=True) and dirs("--host", "localhost").allowed
    assert not dirs("--share").allowed and not dirs("--host", "0.0.0.0").allowed
    assert dirs("--share", "--report-root", str(tmp_path)) == ReportDirs(allowed=True, root=str(tmp_path))
    with pytest.raises(InputError, match="reads no directories typed in"):
        load_report_dir(TabState(), str(report_dir), dirs("--share"))
    root = tmp_path / "runs"
    shutil.copytree(report_dir, root / "heldout")
    (root / "elsewhere").symlink_to(report_dir, target_is_directory=True)
    under = ReportDirs(allowed=True, root=str(root))
    assert load_report_dir(TabState(), "heldout", under).report.summary["prompts"] == 2
    assert load_report_dir(TabState(), str(root / "heldout"), under).report is not None
    for text in (str(report_dir), "../../", "elsewhere", "heldout/../../"):
        with pytest.raises(InputError, match="is not under the page's report root"):
            load_report_dir(TabState(), text, under)


# -- a prompt set run from the page (run_prompt_set) -----------------------------------------------------------


@pytest.fixture(scope="module")
def embedded():
    return tiny.embedded_host()


def test_the_pages_set_run_shows_done_with_its_report_not_before(embedded):
    """The page's 'Run the set' (as the app wires it): a progress line in the status after each prompt, then the
    report and its status in one update. The run's last line ("done: run on this page: ...") was shown as progress
    first, so the status said the set was done while the old report was still on screen (a browser test read the
    old table under the new status on a loaded machine)."""
    import gradio as gr

    from ddtree_viz.page.web.app import build_app

    demo = build_app(embedded)
    run = next(f for f in demo.fns.values() if f.api_name == "prompt_set")
    status = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "ddv-report-status")
    values = dict(source="heldout-code", upload=None, budget=8, max_new_tokens=8, limit=2, chat=False, system="",
                  thinking=True)
    updates = list(run.fn(TabState(), gr.Request(session_hash="set-run-test"), **values))
    shown = [u[status] for u in updates]
    assert len(updates) == 3 and all("Running the set: " in s and "done" not in s for s in shown[:-1]), shown
    assert "run on this page: 2 of 2 prompts" in shown[-1] and len(updates[-1]) > 2  # the report's views too


def test_a_prompt_set_runs_on_the_page_into_the_tabs_report(embedded):
    tab = TabState()
    lines = list(run_prompt_set(embedded, tab, "heldout-code", None, 8, 8, 2))
    assert lines[0].startswith("1 of 2 prompts") and lines[1].startswith("2 of 2 prompts")
    assert lines[-1] == "done: run on this page: 2 of 2 prompts"
    r = tab.report
    assert r.summary["prompts"] == 2 and r.summary["identical_prompts"] == 2 and r.summary["failed"] == []
    assert r.summary["generated_tokens"] == 16 and r.name == "heldout-code (run here)"
    assert "run on this page" in report_status(tab)
    folder = tab.report.folder
    assert sorted(p.name for p in (folder / "traces").iterdir()) == ["0000.json", "0000.meta.json", "0001.json",
                                                                  "0001.meta.json"]  # each with its wall time
    assert json.loads((folder / "summary.json").read_text())["prompts"] == 2
    # its rounds open in the step view like any report's
    t = open_report_click(tab, "traces/0001.json|0|1")
    assert t.replay and t.trace is not None and len(t.trace.steps) >= 1
    tab.free()  # the tab goes: its files with it
    assert not folder.exists()


def test_stop_keeps_the_prompts_done(embedded):
    tab = TabState()
    run = run_prompt_set(embedded, tab, "heldout-code", None, 8, 8, 4)
    assert next(run).startswith("1 of 4")
    tab.set_stop.set()  # the Stop button
    assert list(run) == ["done: run on this page: 1 of 4 prompts (stopped)"]
    assert tab.report.summary["prompts"] == 1


def test_a_prompt_sets_reference_takes_the_model_a_token_a_turn_and_hears_stop(embedded, tmp_path):
    """decode_set's reference (each prompt's check against greedy) takes the page's model lock a token a turn, so
    another tab's Step goes in between, and a Stop between two of its tokens leaves the prompt out: it took the lock
    once for every token of the prompt (a 256-token prompt held every other tab up for seconds)."""
    from ddtree_viz.engine.prompts import PromptSpec
    from ddtree_viz.options import DecodeSettings
    from ddtree_viz.promptset.decode import decode_set
    from ddtree_viz.promptset.files import trace_path

    turns = []

    class Turns:  # the host's lock, counted
        def __enter__(self):
            embedded.lock.__enter__()
            turns.append(1)

        def __exit__(self, *exc):
            embedded.lock.__exit__(*exc)

    items = [{"index": 0, "prompt": "def add(a, b):\n"}]
    settings = DecodeSettings(budget=8, max_new_tokens=24, engine=embedded.engine)
    spec_of = lambda item: PromptSpec(text=item["prompt"])  # noqa: E731
    (tmp_path / "a" / "traces").mkdir(parents=True)
    assert [p.tokens for p in decode_set(embedded.pair, items, tmp_path / "a", settings, spec_of, lock=Turns())] == [24]
    trace = Trace.load(trace_path(tmp_path / "a", 0))
    assert trace.greedy_ids == trace.output_ids and trace.first_divergence is None
    # the prefill, each round, each of the reference's tokens, the trace
    assert len(turns) == 1 + len(trace.steps) + len(trace.greedy_ids) + 1, (len(turns), len(trace.steps))
    turns.clear()
    stop = lambda: len(turns) >= 1 + len(trace.steps) + 3  # noqa: E731  (Stop once 3 of the reference's tokens are in)
    (tmp_path / "b" / "traces").mkdir(parents=True)
    assert list(decode_set(embedded.pair, items, tmp_path / "b", settings, spec_of, lock=Turns(), stop=stop)) == []
    assert not trace_path(tmp_path / "b", 0).exists() and len(turns) == 1 + len(trace.steps) + 3


def test_prompt_set_input_is_checked_and_a_failing_prompt_is_recorded(embedded, tmp_path):
    tab = TabState()
    for bad, match in [(dict(limit=0), "prompts"), (dict(limit=PAGE_SET_MAX_PROMPTS + 1), "prompts"),
                       (dict(budget=0), "budget"), (dict(max_new=PAGE_SET_MAX_TOKENS + 1), "max new tokens"),
                       (dict(source="../../etc/passwd"), "no prompt set named")]:
        args = dict(source="heldout-code", upload=None, budget=8, max_new=8, limit=2) | bad
        with pytest.raises(InputError, match=match):
            list(run_prompt_set(embedded, tab, args["source"], args["upload"], args["budget"], args["max_new"],
                                   args["limit"]))
    bad_file = tmp_path / "bad.jsonl"
    bad_file.write_text('{"nope": 1}\n', encoding="utf-8")
    with pytest.raises(InputError, match="line 1"):
        list(run_prompt_set(embedded, tab, None, str(bad_file), 8, 8, 2))
    assert tab.report is None  # nothing was run, nothing shown
    # an uploaded set: a chat prompt without the chat template fails alone; the text prompt is decoded
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"prompt": "def f(x):\\n"}\n{"messages": [{"role": "user", "content": "hi"}]}\n', encoding="utf-8")
    lines = list(run_prompt_set(embedded, tab, None, str(mixed), 8, 8, 5))
    assert lines[-1] == "done: run on this page: 2 of 2 prompts"
    s = tab.report.summary
    assert s["prompts"] == 1 and len(s["failed"]) == 1 and "chat template" in s["failed"][0]["error"]
    assert tab.report.name == "mixed.jsonl (run here)"


# -- the second hostile probe (#27 item 4) --------------------------------------------------------------------------


def test_a_refused_upload_leaves_the_report_on_screen_and_its_files(report_dir, tmp_path):
    """D1: an upload (refused or not) writes into a new folder; the report still shown keeps opening its own traces."""
    root = tmp_path / "gradio"
    traces = sorted((report_dir / "traces").glob("*.json"))
    tab = load_report_upload(TabState(), uploaded([report_dir / "summary.json", *traces], root))
    first = Trace.load(report_dir / "traces" / "0000.json")
    other = tmp_path / "other" / "0000.json"  # report B: its trace 0000 is A's trace 0001
    other.parent.mkdir()
    shutil.copy(report_dir / "traces" / "0001.json", other)
    bad = tmp_path / "bad" / "0001.json"
    bad.parent.mkdir()
    bad.write_text('{"schema_version": 1, "steps": 3}')
    with pytest.raises(TraceError):
        load_report_upload(tab, uploaded([report_dir / "summary.json", other, bad], root))
    assert open_report_round(tab, "traces/0000.json", 0).trace.output_ids == first.output_ids
    # a report accepted in its place: the old copy goes, the new one opens
    old = tab.report.folder
    tab = load_report_upload(tab, uploaded([report_dir / "summary.json", other], root))
    assert not old.exists() and tab.report.folder.is_dir()
    assert open_report_round(tab, "traces/0000.json", 0).trace.output_ids != first.output_ids
    folders = list(tab.folder.iterdir())
    assert folders == [tab.report.folder]  # the refused upload's copy went too
    tab.free()


def _set_file(tmp_path, *prompts) -> str:
    path = tmp_path / uuid.uuid4().hex / "set.txt"
    path.parent.mkdir()
    path.write_text("\n\n".join(prompts) + "\n", encoding="utf-8")
    return str(path)


def test_a_new_prompt_set_leaves_the_report_on_screen_its_files(embedded, tmp_path):
    """D1: during a new set, the report shown opens its own rounds; one set per tab at a time (D2)."""
    tab = TabState()
    list(run_prompt_set(embedded, tab, None, _set_file(tmp_path, "def add(a, b):", "import os"), 8, 8, 2))
    before = Trace.load(tab.report.files["traces/0000.json"])
    run = run_prompt_set(embedded, tab, None, _set_file(tmp_path, "class Point:", "while True:"), 8, 8, 2)
    assert next(run).startswith("1 of 2")
    opened = open_report_round(tab, "traces/0000.json", 0).trace
    assert opened.prompt_ids == before.prompt_ids and opened.output_ids == before.output_ids
    # D2: a second set on the same tab while this one runs is refused, and this one goes on unharmed
    with pytest.raises(InputError, match="already running in this tab"):
        next(run_prompt_set(embedded, tab, "heldout-code", None, 8, 8, 2))
    assert list(run)[-1] == "done: run on this page: 2 of 2 prompts"
    assert tab.report.summary["prompts"] == 2 and len(list(tab.folder.iterdir())) == 1
    assert Trace.load(tab.report.files["traces/0000.json"]).prompt_ids != before.prompt_ids
    tab.free()


def test_closing_the_tab_during_a_prompt_set_ends_it_quietly(embedded):
    """D11: the tab goes (its files with it) while its set runs: the set ends with no error."""
    tab = TabState()
    run = run_prompt_set(embedded, tab, "heldout-code", None, 8, 8, 3)
    assert next(run).startswith("1 of 3")
    tab.free()
    assert list(run) == [] and tab.report is None


def test_huge_prompts_are_refused_before_the_model_lock(embedded, tmp_path):
    """D3: a prompt (or a set's prompt) that cannot fit the target is refused at once, naming the user's input,
    without taking the model lock; D4: a prompt file's errors name the upload, never the server's path."""
    from ddtree_viz.page.state import read_settings

    limit = embedded.max_prompt_chars()
    assert limit is not None and limit < 1 << 20
    values = dict(prompt="x" * (limit + 1), budget=8, block_size=16, max_new_tokens=8, verify="exact", method="ddtree")
    with embedded.lock:  # another tab holds the model: the refusal does not wait for it
        with pytest.raises(InputError, match=r"the prompt is [\d,]+ characters; the page takes at most"):
            read_settings(embedded, values)
        path = _set_file(tmp_path, "def f(x):", "y" * (limit + 1))
        with pytest.raises(InputError, match=r"prompt 2 of set.txt is [\d,]+ characters") as err:
            next(run_prompt_set(embedded, TabState(), None, path, 8, 8, 2))
        assert "prompts.json" not in str(err.value)
    bad = tmp_path / "gradio" / "8b0d" / "bad.jsonl"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"prompt": 1}\n', encoding="utf-8")
    with pytest.raises(InputError, match="bad.jsonl line 1") as err:
        next(run_prompt_set(embedded, TabState(), None, str(bad), 8, 8, 2))
    assert str(tmp_path) not in str(err.value)
    bad.write_bytes(b"\xff\xfe not text")
    with pytest.raises(InputError, match="bad.jsonl") as err:
        next(run_prompt_set(embedded, TabState(), None, str(bad), 8, 8, 2))
    assert str(tmp_path) not in str(err.value)


def test_links_out_of_the_report_root_and_loops_are_refused(report_dir, tmp_path):
    """D5: under --report-root, a link inside the report that leads out is refused; D6: a link loop is a clear
    error that names no server path."""
    root = tmp_path / "runs"
    shutil.copytree(report_dir, root / "r")
    secret = tmp_path / "secret.json"
    shutil.copy(report_dir / "summary.json", secret)
    (root / "r" / "summary.json").unlink()
    (root / "r" / "summary.json").symlink_to(secret)
    under = ReportDirs(allowed=True, root=str(root))
    with pytest.raises(InputError, match="summary.json leads out of the page's report root"):
        load_report_dir(TabState(), "r", under)
    (root / "r" / "summary.json").unlink()
    shutil.copy(report_dir / "summary.json", root / "r" / "summary.json")
    (root / "r" / "traces" / "0000.json").unlink()
    (root / "r" / "traces" / "0000.json").symlink_to(report_dir / "traces" / "0000.json")
    with pytest.raises(InputError, match="traces/0000.json leads out"):
        load_report_dir(TabState(), "r", under)
    (root / "loop").symlink_to(root / "loop")
    for dirs in (under, ReportDirs()):
        with pytest.raises(InputError, match="cannot read|not a directory") as err:
            load_report_dir(TabState(), str(root / "loop") if dirs.root is None else "loop", dirs)
        assert str(tmp_path) not in str(err.value).replace(str(root / "loop"), "") or dirs.root is None


def test_a_default_report_with_its_speedup_study_is_not_called_different(report_dir, tmp_path):
    """issue #64 class 6: analyze's default report holds the speed-up study in summary.json (from speedup.json,
    measured, not a figure of the traces): the tab said "summary.json differs" on every such report."""
    for keep_prompts in (True, False):
        copy = tmp_path / f"study-{keep_prompts}"
        shutil.copytree(report_dir, copy)
        if not keep_prompts:
            (copy / "prompts.json").unlink()
        summary = json.loads((copy / "summary.json").read_text())
        summary["speedup"] = {"greedy_ms": 10.0, "budgets": {"4": {"predicted_speedup": 1.5}}}
        (copy / "summary.json").write_text(json.dumps(summary))
        assert "summary.json differs" not in load_report_dir(TabState(), str(copy)).report.note
        summary["prompts"] += 1  # a figure of the traces edited: still noted
        (copy / "summary.json").write_text(json.dumps(summary))
        assert "summary.json differs" in load_report_dir(TabState(), str(copy)).report.note


def test_a_summary_that_disagrees_with_its_traces_is_noted_and_an_empty_report_refused(report_dir, tmp_path):
    """D10: without prompts.json a made-up summary.json loaded with no note; an empty report read '0 of 0 prompts'."""
    plain = tmp_path / "plain"
    shutil.copytree(report_dir, plain)
    (plain / "prompts.json").unlink()
    tab = load_report_dir(TabState(), str(plain))
    assert "summary.json differs" not in tab.report.note  # the same report, less its prompts' text
    summary = json.loads((plain / "summary.json").read_text())
    summary["budget_curve"] = {k: 9.99 for k in summary["budget_curve"]}
    (plain / "summary.json").write_text(json.dumps(summary))
    tab = load_report_dir(TabState(), str(plain))
    assert "summary.json differs from what its traces give" in tab.report.note
    assert "no prompts.json" in tab.report.note
    for name in os.listdir(plain / "traces"):
        os.unlink(plain / "traces" / name)
    summary["prompts"] = 3
    (plain / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(InputError, match="no traces and no error records"):
        load_report_dir(tab, str(plain))
    assert tab.report is not None and tab.report.name == str(plain)  # the report before stays

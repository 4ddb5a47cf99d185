"""`analyze` on the embedded pair (issue #15): the prompt file, summary.json recomputed from the written traces,
resume / force / a failed prompt / Ctrl-C, the report offline in Chromium, and two CPU processes (gloo, through
accelerate launch) giving the same summary as one. Tiny settings: a few prompts, a few tokens."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from ddtree_viz import analysis
from ddtree_viz.promptset.files import read_prompts
from ddtree_viz.promptset.summary import summarize
from ddtree_viz.cli import main
from ddtree_viz.errors import InputError
from ddtree_viz.trace import Trace

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
SETTINGS = ["--max-new-tokens", "6", "--budget", "8", "--no-speedup"]  # the study: tests/test_speedup.py
PROMPTS = "def add(a, b):\n\nclass Point:\n    def __init__(self, x, y):\n\n" + "x = 1\n" * 1200 + "\n"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def analyze(*args) -> int:
    return main(["analyze", *map(str, args)])


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """Three prompts: two decode, the third is too long for the target and fails; the run goes on."""
    base = tmp_path_factory.mktemp("analyze")
    (base / "p.txt").write_text(PROMPTS, encoding="utf-8")
    assert analyze("--prompts", base / "p.txt", "--out", base / "out", *SETTINGS, "--budgets", 1, 2, 4, 8) == 0
    return base


def test_prompt_files(tmp_path):
    (tmp_path / "a.txt").write_text("one\nline two\n\n\n  \nthree\n", encoding="utf-8")
    assert [p["prompt"] for p in read_prompts(tmp_path / "a.txt")] == ["one\nline two", "three"]
    (tmp_path / "b.jsonl").write_text('{"prompt": "x = "}\n\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    got = read_prompts(tmp_path / "b.jsonl")
    assert got[0]["prompt"] == "x = " and got[1]["messages"][0]["content"] == "hi"
    (tmp_path / "c.jsonl").write_text('{"prompt": "x"}\n{"text": "y"}\n')
    with pytest.raises(InputError, match="line 2"):
        read_prompts(tmp_path / "c.jsonl")
    for name in ("heldout-code", "docstring-first", "instructions"):  # the shipped sets, by name
        assert 8 <= len(read_prompts(name)) <= 32
    # chat prompts are accepted by the reader and refused clearly by the command without --chat
    assert analyze("--prompts", tmp_path / "b.jsonl", "--out", tmp_path / "o") == 2
    assert not (tmp_path / "o").exists()
    # --chat on a tokenizer without a template (the embedded pair): a clear refusal, no report
    assert analyze("--prompts", tmp_path / "b.jsonl", "--out", tmp_path / "o2", "--chat", *SETTINGS) == 2


def test_chat_prompt_sets_decode_through_the_template(tmp_path):
    """--chat on a target with a Qwen-style template: text and messages prompts go through apply_chat_template
    and decode exactly as its greedy; the traces record the conversation."""
    from tests import tiny

    target, draft = tiny.save_pair(tiny.chat_pair(seed=4), tmp_path / "models")
    (tmp_path / "c.jsonl").write_text('{"prompt": "hi"}\n{"messages": [{"role": "user", "content": "x = 1"}]}\n')
    out = tmp_path / "out"
    assert analyze("--prompts", tmp_path / "c.jsonl", "--out", out, "--target", target, "--draft", draft, "--chat",
                   "--thinking", "off", *SETTINGS) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["prompts"] == 2 and summary["identical_to_greedy"] == 1.0
    traces = [Trace.load(out / "traces" / f"{i:04d}.json") for i in (0, 1)]
    assert all(t.chat_template and t.thinking is False for t in traces)
    assert traces[1].messages[0]["content"] == "x = 1" and all(t.first_divergence is None for t in traces)


def check_against_traces(summary: dict, out: Path, suffix: str = "") -> None:
    """Every figure of one side of a summary recomputed here from its written traces (DIR/traces/NNNN{suffix}.json:
    prompts 0 and 1 decode, prompt 2 fails)."""
    traces = [Trace.load(out / "traces" / f"{i:04d}{suffix}.json") for i in (0, 1)]
    steps = [s for t in traces for s in t.steps]
    assert summary["prompts"] == 2 and summary["prompts_total"] == 3
    assert summary["rounds"] == len(steps) > 0
    assert summary["generated_tokens"] == sum(len(t.output_ids) for t in traces) == 12
    # #26.4: mean acceptance counts the tokens each round kept (StepRecord.kept; was len(accepted), the walk, which
    # counted what max new tokens threw away); the histogram counts the same (issue #64 class 6: it counted the
    # walk, so its mean and the headline disagreed)
    kept = [s.kept for s in steps]
    assert summary["mean_acceptance"] == pytest.approx(sum(kept) / len(kept))
    counts = Counter(kept)
    hist = {int(k): v for k, v in summary["acceptance_histogram"].items() if v}
    assert hist == dict(counts)
    assert sum(k * v for k, v in hist.items()) / sum(hist.values()) == pytest.approx(summary["mean_acceptance"])
    # per depth: rounds past depth d over rounds that reached it with a tree that deep
    for d, p in enumerate(summary["per_depth_acceptance"], 1):
        reached = [s for s in steps if len(s.accepted) - 1 >= d - 1 and max(n.depth for n in s.nodes) >= d]
        passed = [s for s in reached if len(s.accepted) - 1 >= d]
        assert p == (pytest.approx(len(passed) / len(reached)) if reached else None)
    # the budget curve at the asked budgets, from each round's recorded counterfactual
    for b in (1, 2, 4, 8):
        want = sum(min(s.kept, analysis.recorded_curve(s)[min(b, max(analysis.recorded_curve(s)))])
                   for s in steps) / len(steps)  # a cut round: at most what it kept
        assert summary["budget_curve"][str(b)] == pytest.approx(want)
    assert set(summary["budget_curve"]) == {"1", "2", "4", "8"}
    ident = [t.first_divergence is None for t in traces]
    assert summary["identical_to_greedy"] == sum(ident) / 2 and all(ident)  # invariant 1
    rows = summary["per_prompt"]
    assert [r["file"] for r in rows] == [f"traces/0000{suffix}.json", f"traces/0001{suffix}.json"]
    for r, t in zip(rows, traces):
        assert r["rounds"] == len(t.steps)
        assert r["mean_acceptance"] == pytest.approx(sum(s.kept for s in t.steps) / len(t.steps))
    assert sum(summary["stop_rank_histogram"].values()) == len(steps)
    assert sum(m["count"] for m in summary["top_misses"]) == sum(
        1 for s in steps if analysis.stop_info(s, 16)["reason"] != analysis.STOP_BLOCK_END)
    for m in summary["top_misses"]:
        for ex in m["examples"]:  # each example names a round whose walk stopped on that pair
            step = Trace.load(out / ex["file"]).steps[ex["round"]]
            stop = analysis.stop_info(step, 16)
            assert (stop["drafter_top_id"], stop["target_token_id"]) == (m["drafter_token_id"], m["target_token_id"])
    # the failed prompt is recorded with its error
    assert summary["failed"][0]["index"] == 2 and "tokens" in summary["failed"][0]["error"]
    return traces


def test_summary_agrees_with_the_traces(run_dir):
    out = run_dir / "out"
    summary = json.loads((out / "summary.json").read_text())
    check_against_traces(summary, out)
    assert summary["budget_curve"]["8"] == pytest.approx(summary["mean_acceptance"])  # the run's own budget
    assert "dflash" not in summary
    assert summarize(out, [1, 2, 4, 8]) == summary  # the same function, again from the files
    for name in ("acceptance_histogram", "per_depth_acceptance", "budget_curve", "stop_rank", "acceptance_by_position"):
        assert (out / "figures" / f"{name}.svg").read_bytes().lstrip().startswith(b"<?xml")
        assert (out / "figures" / f"{name}.pdf").read_bytes().startswith(b"%PDF")


@pytest.fixture(scope="module")
def both_dir(run_dir):
    """The same three prompts with --method both: DDTree (traces/NNNN.json) and the DFlash chain
    (traces/NNNN.dflash.json), the same settings otherwise."""
    out = run_dir / "both"
    assert analyze("--prompts", run_dir / "p.txt", "--out", out, *SETTINGS, "--budgets", 1, 2, 4, 8,
                   "--method", "both") == 0
    return out


def test_method_both_summaries_agree_with_their_traces(run_dir, both_dir):
    out = both_dir
    summary = json.loads((out / "summary.json").read_text())
    chain = summary.pop("dflash")
    # the DDTree side keeps the contract: the top-level keys, and the very figures of a DDTree-only run
    assert summary == json.loads((run_dir / "out" / "summary.json").read_text())
    check_against_traces(summary, out)
    # the chain's side: the same keys, every figure from its own traces
    assert set(chain) == set(summary)
    traces = check_against_traces(chain, out, ".dflash")
    assert chain["settings"]["method"] == "dflash" and summary["settings"]["method"] == "ddtree"
    assert all(n.depth == k for t in traces for s in t.steps for k, n in enumerate(s.nodes))  # chains
    assert (out / "traces" / "0002.error.json").exists() and (out / "traces" / "0002.dflash.error.json").exists()
    assert summarize(out, [1, 2, 4, 8]) == {**summary, "dflash": chain}  # again from the files


def test_method_both_report_shows_both_curves(both_dir):
    from ddtree_viz.render.report import side_label

    summary = json.loads((both_dir / "summary.json").read_text())
    text = (both_dir / "report.html").read_text()
    svg = (both_dir / "figures" / "per_depth_acceptance.svg").read_text()
    assert svg[svg.find("<svg"):] in text  # the report holds the figure as written
    # one series per side, each with a marker per depth that has a value, and both named in the legend
    for k, side in enumerate((summary, summary["dflash"])):
        group = re.search(rf'<g id="series-{k}">(.*?)</g>\s*(<g id="series|<g id="patch)', svg, re.S)
        assert group, k
        assert group.group(1).count("<use ") == sum(p is not None for p in side["per_depth_acceptance"])
    assert not re.search(r'<g id="series-2">', svg)
    assert "DDTree budget 8" in svg and "DFlash chain" in svg
    # the headline table: both methods side by side
    head = re.search(r"<table id=headline>(.*?)</table>", text, re.S).group(1)
    assert "<th>DDTree budget 8</th><th>DFlash chain</th>" in head
    row = re.search(r"<tr><th>mean acceptance[^<]*</th><td>([^<]*)</td><td>([^<]*)</td></tr>", head)
    assert row.groups() == (f"{summary['mean_acceptance']:.2f}", f"{summary['dflash']['mean_acceptance']:.2f}")
    assert re.search(r"<tr><th>wall time per prompt \(mean\)</th><td>[0-9.]+ s</td><td>[0-9.]+ s</td></tr>", head)
    # the per-prompt table links both traces of each prompt
    assert 'data-file="traces/0001.dflash.json"' in text and "DFlash mean acceptance" in text
    assert side_label(summary) == "DDTree budget 8" and side_label(summary["dflash"]) == "DFlash chain"


def test_method_both_resumes_each_side(both_dir, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(both_dir, out)
    before = json.loads((out / "summary.json").read_text())
    (out / "traces" / "0001.dflash.json").unlink()
    kept = {name: (out / "traces" / name).read_bytes() for name in ("0000.meta.json", "0000.dflash.meta.json",
                                                                    "0001.meta.json")}
    assert analyze("--prompts", both_dir.parent / "p.txt", "--out", out, *SETTINGS, "--budgets", 1, 2, 4, 8,
                   "--method", "both", "--resume") == 0
    assert {name: (out / "traces" / name).read_bytes() for name in kept} == kept  # only the missing side decoded
    assert (out / "traces" / "0001.dflash.json").exists()
    assert json.loads((out / "summary.json").read_text()) == before


def test_existing_dir_resume_and_force(run_dir, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(run_dir / "out", out)
    # refused without --resume / --force, nothing touched
    before = (out / "summary.json").read_bytes()
    assert analyze("--prompts", run_dir / "p.txt", "--out", out, *SETTINGS) == 2
    assert (out / "summary.json").read_bytes() == before
    # --resume: the kept trace is not decoded again, the missing one is
    (out / "traces" / "0001.json").unlink()
    kept = (out / "traces" / "0000.meta.json").read_bytes()
    assert analyze("--prompts", run_dir / "p.txt", "--out", out, *SETTINGS, "--resume", "--budgets", 1, 2, 4, 8) == 0
    assert (out / "traces" / "0000.meta.json").read_bytes() == kept
    assert (out / "traces" / "0001.json").exists()
    assert json.loads((out / "summary.json").read_text()) == json.loads(before)  # same traces, same figures
    # --force: starts again (a stale file in traces/ is gone)
    (out / "traces" / "0007.json").write_text("{}")
    p1 = tmp_path / "one.txt"
    p1.write_text("def add(a, b):\n")
    assert analyze("--prompts", p1, "--out", out, "--max-new-tokens", 3, "--budget", 4, "--force") == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["prompts"] == summary["prompts_total"] == 1 and not (out / "traces" / "0007.json").exists()


def test_resume_keeps_only_what_this_run_made(run_dir, tmp_path, capsys):
    """issue #64 class 3: --resume into a folder made from other prompts, settings or models. prompts.json is the
    manifest; other settings or models are refused (exit 2, what differs named); a prompt that differs at its index
    and a stray trace (an index not in the set) are moved to unmatched/ and said, the set's prompt decoded again; a
    folder without a manifest is refused. The summary counts only this run's traces."""
    out = tmp_path / "out"
    shutil.copytree(run_dir / "out", out)
    before = json.loads((out / "summary.json").read_text())
    shutil.copy(out / "traces" / "0000.json", out / "traces" / "0099.json")  # a stray from elsewhere
    capsys.readouterr()
    assert analyze("--prompts", run_dir / "p.txt", "--out", out, *SETTINGS, "--resume", "--budgets", 1, 2, 4, 8) == 0
    err = capsys.readouterr().err
    assert "resume: traces/0099.json: prompt 99 is not in this set: moved to unmatched/" in err, err
    assert (out / "unmatched" / "0099.json").exists() and not (out / "traces" / "0099.json").exists()
    assert json.loads((out / "summary.json").read_text()) == before  # the stray is not counted
    for flags, words in ((["--max-new-tokens", "5", "--budget", "8", "--no-speedup"], "max_new_tokens: 6 -> 5"),
                         ([*SETTINGS, "--temperature", "0.5"], "temperature: 0.0 -> 0.5"),
                         ([*SETTINGS, "--draft", "dflash2"], "other models (draft: 'embedded' -> 'dflash2')")):
        assert analyze("--prompts", run_dir / "p.txt", "--out", out, *flags, "--resume") == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --resume: DIR's traces were made with other") and words in err, err
    assert json.loads((out / "summary.json").read_text()) == before  # nothing touched by the refusals
    # another set: its first prompt differs, its second is the same
    other = tmp_path / "other.txt"
    first, *rest = PROMPTS.split("\n\n")
    other.write_text("\n\n".join(["def sub(a, b):", *rest]), encoding="utf-8")
    kept = (out / "traces" / "0001.json").read_bytes()
    assert analyze("--prompts", other, "--out", out, *SETTINGS, "--resume") == 0
    err = capsys.readouterr().err
    assert "traces/0000.json: prompt 0 differs from the one it was made for" in err and "0001" not in err, err
    assert Trace.load(out / "traces" / "0000.json").prompt == "def sub(a, b):"
    assert (out / "traces" / "0001.json").read_bytes() == kept and (out / "unmatched" / "0000.json").exists()
    (out / "prompts.json").unlink()
    assert analyze("--prompts", other, "--out", out, *SETTINGS, "--resume") == 2
    assert "has no prompts.json" in capsys.readouterr().err


def test_misses_file_agrees_with_the_traces_it_came_from(both_dir, tmp_path, capsys):
    """issue #68 item 2: `analyze --misses F` (here over a resumed --method both report: nothing decoded again)
    writes one strict JSON line per round whose walk stopped short of the block, and each agrees with its trace:
    the round, the depth the path left the target, the target's token at that output position, the drafter's
    candidates at that depth (rank and log-prob), whether and where the target's token was drafted."""
    from ddtree_viz import analysis

    out = tmp_path / "out"
    shutil.copytree(both_dir, out)
    misses = tmp_path / "misses.jsonl"
    assert analyze("--prompts", both_dir.parent / "p.txt", "--out", out, *SETTINGS, "--budgets", 1, 2, 4, 8,
                   "--method", "both", "--resume", "--misses", misses, "--supplements") == 0
    text = misses.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert f"misses: {len(lines)} rounds" in capsys.readouterr().out
    # strict JSON lines: one object a line, no NaN / Infinity, every key of docs/MISSES.md's table and no other
    assert text.endswith("\n") and "\r" not in text and all(line.strip() == line and line for line in lines)
    rows = [json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c}")) for line in lines]
    doc = (ROOT / "docs" / "MISSES.md").read_text(encoding="utf-8")
    schema = doc[doc.index("## Schema"):]
    schema = schema[:schema.index("\n## ")]
    keys = {k for cell in re.findall(r"^\| (`[^|]+`) \|", schema, re.M) for k in re.findall(r"`(\w+)`", cell)}
    assert len(keys) == 19 and all(isinstance(r, dict) and set(r) == keys for r in rows)
    assert all(json.dumps(r, ensure_ascii=False, allow_nan=False) == line for r, line in zip(rows, lines))
    assert rows and {r["side"] for r in rows} == {"ddtree", "dflash"} and all(r["version"] == 1 for r in rows)
    assert {r["set"] for r in rows} == {"p"}  # the set's name as analyze names its folder (p.txt)
    expected = 0
    for name in sorted(os.listdir(out / "traces")):
        if name.endswith(".json") and name.count(".") in (1, 2) and not name.endswith(("meta.json", "error.json")):
            t = Trace.load(out / "traces" / name)
            expected += sum(analysis.stop_info(s, t.settings["block_size"])["reason"] != analysis.STOP_BLOCK_END
                            for s in t.steps)
    assert len(rows) == expected
    for r in rows:
        t = Trace.load(out / r["trace"])
        step = t.steps[r["round"] - 1]
        assert r["depth"] == len(step.accepted) and r["target_token_id"] == step.bonus_token_id
        stop = analysis.stop_info(step, t.settings["block_size"])
        assert r["reason"] == stop["reason"] != analysis.STOP_BLOCK_END and r["tree_rank"] == stop["sibling_rank"]
        assert (r["target_prob"], r["target_draft_logprob"]) == (stop["target_prob"], stop["target_draft_logprob"])
        assert (r["kept"], r["cut"], r["index"]) == (step.kept, step.cut, int(r["trace"][7:11]))
        assert r["context_len"] == len(t.prompt_ids) + r["output_position"]
        if not r["cut"]:
            assert t.output_ids[r["output_position"]] == r["target_token_id"]
        assert r["drafter_top"] == [[i, lp] for i, lp in analysis.draft_row(step, r["depth"])]
        if r["target_drafted"]:
            assert r["drafter_top"][r["target_draft_rank"]][0] == r["target_token_id"]
        else:
            assert r["target_token_id"] not in [i for i, _ in r["drafter_top"]] and r["target_draft_rank"] is None
    check_miss_links(out, rows)
    # docs/MISSES.md's loader, as written there, turns the file into training pairs
    loader: dict = {}
    exec(re.search(r"```python\n(.*?)```", doc, re.S).group(1), loader)
    pairs = list(loader["drafter_pairs"](out, misses))
    assert [(len(c), tok, d) for c, tok, d in pairs] == [(r["context_len"], r["target_token_id"], r["depth"])
                                                         for r in rows]
    # a misses file that cannot be written is refused before any work
    assert analyze("--prompts", both_dir.parent / "p.txt", "--out", tmp_path / "o2", *SETTINGS,
                   "--misses", tmp_path / "no" / "m.jsonl") == 2
    assert "cannot write misses file" in capsys.readouterr().err and not (tmp_path / "o2").exists()


def check_miss_links(out: Path, rows: list[dict]) -> None:
    """report.html lists every miss of misses.jsonl by prompt, each a link to its round: DDTree's in the prompt's
    session file (analyze --supplements: supplements/NNNN.html#round=N), the DFlash chain's (no session file) in
    its trace; the linked round is the miss's round in its trace (its walk left the target there). The top misses'
    examples link their session file's round too."""
    report = (out / "report.html").read_text(encoding="utf-8")
    table = report[report.index("<table id=miss-rounds"):]
    table = table[:table.index("</table>")]
    links = re.findall(r'<a class="?round[ "]?(session-round")? href="([^"#]+)#round=(\d+)" data-file="([^"]+)" '
                       r'data-round="(\d+)" title="round (\d+): [^"]*">(\d+)</a>', table)
    assert [(file, int(n)) for _, _, n, file, *_ in links] == [(r["trace"], r["round"]) for r in rows]
    for session, href, n, file, k, said, text in links:
        assert int(n) == int(k) + 1 == int(said) == int(text)
        index = int(file[len("traces/"):][:4])
        assert href == (f"supplements/{index:04d}.html" if file.count(".") == 1 else file) and bool(session) == (
            file.count(".") == 1)
        t = Trace.load(out / file)
        assert analysis.stop_info(t.steps[int(k)], t.settings["block_size"])["reason"] != analysis.STOP_BLOCK_END
    top = re.findall(r'<a class="round session-round" href="supplements/(\d{4})\.html#round=(\d+)" '
                     r'data-file="traces/(\d{4})\.json" data-round="(\d+)">session</a>',
                     report[report.index("<table id=misses>"):report.index("<table id=miss-rounds")])
    assert top and all(a == b and int(n) == int(k) + 1 for a, n, b, k in top)


def test_resume_decodes_a_truncated_trace_again_and_a_write_failure_is_an_error(run_dir, tmp_path, capsys):
    """#27 D12: --resume over a truncated trace stopped with an error (it was kept as done): it is decoded again; a
    trace that cannot be written (nor its error record) ended in a traceback: error: ..., exit 2."""
    out = tmp_path / "out"
    shutil.copytree(run_dir / "out", out)
    before = json.loads((out / "summary.json").read_text())
    whole = (out / "traces" / "0001.json").read_bytes()
    (out / "traces" / "0001.json").write_bytes(whole[: len(whole) // 2])
    assert analyze("--prompts", run_dir / "p.txt", "--out", out, *SETTINGS, "--resume", "--budgets", 1, 2, 4, 8) == 0
    assert Trace.load(out / "traces" / "0001.json").output_ids == Trace.from_json(whole).output_ids
    assert json.loads((out / "summary.json").read_text()) == before
    capsys.readouterr()
    (out / "traces" / "0001.json").unlink()
    for blocked in ("0001.json.tmp", "0001.error.json.tmp"):  # a folder where the file goes: the write fails
        (out / "traces" / blocked).mkdir()
    assert analyze("--prompts", run_dir / "p.txt", "--out", out, *SETTINGS, "--resume") == 2
    err = capsys.readouterr().err  # the progress line, then the error on a line of its own
    assert err.splitlines()[-1].startswith(f"error: cannot write into {out}") and "Traceback" not in err, err


def test_progress_writes_to_the_stderr_of_the_moment():
    """Progress's stream is sys.stderr when it starts, not when cli/analyze.py was imported: a redirect_stderr is
    followed (analyze in a test process failed with "I/O operation on closed file" once another test, whose
    captured stderr was closed since, had imported the module)."""
    import contextlib
    import io

    from ddtree_viz.cli.analyze import Progress

    with contextlib.redirect_stderr(io.StringIO()) as err:
        Progress(2).update(5)
    assert "1/2 prompts" in err.getvalue()


def test_ctrl_c_keeps_what_is_done(tmp_path):
    """Ctrl-C once the first trace is written: the prompts done are kept and summarised (16 prompts of 32 tokens:
    seconds of work left after the first)."""
    names = ["add", "sub", "mul", "div", "mod", "pow", "neg", "inv", "min", "max", "abs", "avg", "sum", "len", "cat", "rev"]
    (tmp_path / "p.txt").write_text("\n\n".join(f"def {name}(a, b):" for name in names) + "\n")
    out = tmp_path / "out"
    proc = subprocess.Popen([PY, "-m", "ddtree_viz", "analyze", "--prompts", str(tmp_path / "p.txt"), "--out",
                             str(out), "--max-new-tokens", "32", "--budget", "8", "--no-speedup"], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # as from a terminal: a test run started in the background (`cmd &` in a script) ignores
                            # SIGINT, its children inherit that, and Python then installs no KeyboardInterrupt
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while not (out / "traces" / "0000.json").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert 1 <= summary["prompts"] < len(names) and summary["prompts_total"] == len(names)
    assert (out / "report.html").exists()


def test_report_opens_offline_in_chromium(run_dir):
    from tests.test_browser import ARGS, CHROMIUM

    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed")
    from playwright.sync_api import sync_playwright

    report = run_dir / "out" / "report.html"
    text = report.read_text()
    assert not re.search(r"(src|href|url)\s*[=(]\s*[\"']?\s*(https?:)?//", text)  # namespaces only, nothing to fetch
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(offline=True)
        requests = []
        context.on("request", lambda r: requests.append(r.url))
        page = context.new_page()
        page.goto(report.as_uri())
        assert page.locator("figure svg").count() == 5
        box = page.locator("#fig-acceptance_histogram svg").bounding_box()
        assert box["width"] > 200 and box["height"] > 100
        assert page.locator("#prompts tbody tr").count() == 2
        assert page.locator("#failed tr").count() == 2
        # sortable: by mean acceptance, twice reverses
        page.locator("#prompts th", has_text="mean acceptance").click()
        first = page.locator("#prompts tbody tr td").first.inner_text()
        page.locator("#prompts th", has_text="mean acceptance").click()
        assert page.locator("#prompts tbody tr td").first.inner_text() != first or len(set(
            page.locator("#prompts tbody tr td:nth-child(6)").all_inner_texts())) == 1
        links = page.locator("a.round")
        assert links.count() >= 2 and links.first.get_attribute("href").startswith("traces/")
        browser.close()
    assert [u for u in requests if not u.startswith("file://")] == []


def test_two_processes_merge_to_the_single_process_summary(both_dir, tmp_path):
    """accelerate launch, 2 CPU processes (gloo), --method both: each decodes both methods on its share; the merged
    summary (both sides) equals one process's. (accelerate's --cpu launcher starts one process and leaves more to
    MPI; its torchrun launcher, --multi_gpu, starts N, and analyze's PartialState(cpu=True) joins them through
    gloo.)"""
    shutil.copy(both_dir.parent / "p.txt", tmp_path / "p.txt")
    cmd = [PY, "-m", "accelerate.commands.launch", "--num_processes", "2", "--multi_gpu", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "ddtree_viz", "analyze",
           "--prompts", str(tmp_path / "p.txt"), "--out", str(tmp_path / "out"), *SETTINGS,
           "--budgets", "1", "2", "4", "8", "--method", "both"]
    res = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    merged = json.loads((tmp_path / "out" / "summary.json").read_text())
    single = json.loads((both_dir / "summary.json").read_text())
    assert merged == single and "dflash" in merged
    for suffix in ("", ".dflash"):
        procs = {json.loads((tmp_path / "out" / "traces" / f"{i:04d}{suffix}.meta.json").read_text())["process"]
                 for i in range(3)}
        assert procs == {0, 1}  # the prompts really were split


def test_a_write_failure_in_one_process_is_a_clear_error_in_every_process(tmp_path):
    """#27 D12: under accelerate launch a process that could not write its trace crashed with a traceback and left
    the others at a broken barrier (another traceback): each process now says what went wrong in one line. (The
    launcher, torchrun, still reports a failed child its own way.)"""
    (tmp_path / "p.txt").write_text("def add(a, b):\n\nclass Point:\n    pass\n\nimport os\n", encoding="utf-8")
    traces = tmp_path / "out" / "traces"
    for blocked in ("0002.json.tmp", "0002.error.json.tmp"):  # process 1's prompt cannot be written
        (traces / blocked).mkdir(parents=True)
    cmd = [PY, "-m", "accelerate.commands.launch", "--num_processes", "2", "--multi_gpu", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "ddtree_viz", "analyze",
           "--prompts", str(tmp_path / "p.txt"), "--out", str(tmp_path / "out"), "--max-new-tokens", "3",
           "--budget", "4", "--resume"]
    res = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0
    assert f"error: cannot write into {tmp_path / 'out'}: Is a directory" in res.stderr, res.stderr[-3000:]
    assert "error: 1 other process(es) failed" in res.stderr
    assert "ddtree_viz/" not in res.stderr.replace("-m ddtree_viz", "")  # no traceback through this package


def test_report_renderer_is_pure():
    code = ("import sys, ddtree_viz.render.report; "
            "print([m for m in ('torch', 'gradio', 'transformers', 'ddtree_viz.engine') if m in sys.modules])")
    out = subprocess.run([PY, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

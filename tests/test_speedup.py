"""Does the tree beat the chain, and at which budget (issue #30): the speed-up model on hand-made records, the cost
cache, the papers' prompt sets (HumanEval from the real package, hub rows from a local file), the degenerate-output
flag, the papers' table, and `analyze`'s whole study on the embedded pair (real runs checking the prediction)."""

import csv
import io
import json
import re
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddtree_viz import speedup
from ddtree_viz.cli import main
from ddtree_viz.errors import InputError
from ddtree_viz.promptset.files import read_prompts
from ddtree_viz.promptset.sources import rows_to_items
from ddtree_viz.render.table import table_csv, table_latex
from ddtree_viz.trace import StepRecord

ROOT = Path(__file__).resolve().parents[1]


def _step(accepted, size, kept=None, method="ddtree"):
    """A round whose accepted path has tree positions `accepted` (root first) in a tree of `size` nodes (the root
    apart): only what the counterfactual reads."""
    return StepRecord(index=0, committed_len=0, root_token_id=0, nodes=(), target_argmax=tuple(range(size + 1)),
                      accepted=tuple(accepted), bonus_token_id=0, timings_ms={}, cache=(),
                      new_token_ids=tuple(range(kept if kept is not None else len(accepted))), method=method)


def _cost(total, first=None):
    return speedup.RoundCost(draft=total / 4, tree=0.0, verify=total / 2, commit=total / 4, host=0.0, total=total,
                             rounds=3, first=total if first is None else first)


def _table(rounds: dict[int, float], greedy_ms=10.0, chain=12.0):
    return speedup.CostTable(key="k", device="cpu", device_name="test cpu", engine="runner", block_size=8,
                             greedy_ms=greedy_ms, rounds={b: _cost(c) for b, c in rounds.items()},
                             chain=_cost(chain) if chain else None, measured_at="2026-12-01T00:00:00+00:00")


def test_prediction_from_counterfactuals_and_costs():
    # round 1: path at tree positions 0, 1, 3, 6 -> gains under b=1: 2, b=2: 2, b=4: 3, b=8: 4
    # round 2: path 0, 2 -> b=1: 1, b>=2: 2
    steps = [_step((0, 1, 3, 6), 8), _step((0, 2), 8)]
    costs = _table({1: 11.0, 2: 12.0, 4: 14.0, 8: 20.0})
    p = speedup.predict(steps, costs, chain_tau=2.5)
    assert {b: p.budgets[b].tau for b in p.budgets} == {1: 1.5, 2: 2.0, 4: 2.5, 8: 3.0}
    for b, c in {1: 11.0, 2: 12.0, 4: 14.0, 8: 20.0}.items():
        assert p.budgets[b].speedup == pytest.approx(p.budgets[b].tau * 10.0 / c)
        assert p.budgets[b].tokens_per_s == pytest.approx(1e3 * p.budgets[b].tau / c)
    # S: 1.364, 1.667, 1.786, 1.5 -> best 4; chain 2.5 * 10 / 12 = 2.083 beats them all: no break-even budget
    assert p.best_budget == 4 and p.chain.speedup == pytest.approx(2.5 * 10 / 12)
    assert p.break_even_budget is None
    p = speedup.predict(steps, costs, chain_tau=1.7)  # chain 1.417: the tree still wins at 4 and 8
    assert p.break_even_budget == 8 and p.best_budget == 4
    assert speedup.validation_budgets(p) == [2, 4, 8]
    # budgets past the rounds' own are not predicted (the counterfactual knows nothing there)
    assert 16 not in speedup.predict(steps, _table({8: 20.0, 16: 30.0})).budgets
    # a round cut by max new tokens counts what it kept
    cut = speedup.predict([_step((0, 1, 3, 6), 8, kept=2)], costs)
    assert cut.budgets[8].tau == 2.0
    with pytest.raises(InputError, match="no exact DDTree rounds"):
        speedup.predict([_step((0, 1), 1, method="dflash")], costs)


def test_a_decodes_first_round_is_spread_over_its_rounds():
    """A decode's first round drafts over the prompt's rows too (RoundCost.first): with `new_tokens`, predict spreads
    its extra time over the decode's new_tokens / tau rounds, the chain's too; without, a steady round's cost."""
    steps = [_step((0, 1, 3, 6), 8), _step((0, 2), 8)]  # tau 3.0 at budget 8
    costs = speedup.CostTable(**{**_table({8: 20.0}).__dict__, "rounds": {8: _cost(20.0, first=50.0)},
                                 "chain": _cost(12.0, first=42.0)})
    steady, decode = speedup.predict(steps, costs, 2.0), speedup.predict(steps, costs, 2.0, new_tokens=60)
    assert steady.budgets[8].round_ms == 20.0 and steady.new_tokens is None
    # 60 tokens at 3 a round: 20 rounds, the first 30 ms longer: 1.5 ms a round
    assert decode.budgets[8].round_ms == pytest.approx(21.5) and decode.new_tokens == 60
    assert decode.budgets[8].tokens_per_s == pytest.approx(60 / (19 * 20.0 + 50.0) * 1e3)
    assert decode.chain.round_ms == pytest.approx(12.0 + 30.0 * 2.0 / 60)
    # a decode shorter than a round: its one round is its first
    assert speedup.predict(steps, costs, new_tokens=2).budgets[8].round_ms == pytest.approx(50.0)
    assert speedup.new_tokens_per_decode(steps, 2) == 3.0 and speedup.new_tokens_per_decode([], 2) is None


def test_cost_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(speedup.CACHE_ENV, str(tmp_path / "c"))
    table = _table({1: 5.0, 2: 6.0})
    assert speedup.cached_costs("k") is None
    path = speedup.save_costs(table)
    assert path == tmp_path / "c" / "costs.json"
    assert speedup.cached_costs("k") == table and speedup.cached_costs("other") is None
    other = speedup.CostTable(**{**table.__dict__, "key": "other", "greedy_ms": 3.0})
    speedup.save_costs(other)
    assert speedup.cached_costs("k") == table and speedup.cached_costs("other").greedy_ms == 3.0
    for junk in ("{", "[]", json.dumps({"version": 1, "tables": {"k": {"rounds": 3}}})):  # only a cache
        path.write_text(junk)
        assert speedup.cached_costs("k") is None
    speedup.save_costs(table)  # a broken cache is replaced, not a crash
    assert speedup.cached_costs("k") == table


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d.update(greedy_ms=0), "greedy_ms must be > 0"),
    (lambda d: d.update(greedy_ms=float("nan")), "greedy_ms must be a finite number"),
    (lambda d: d.update(greedy_ms="5"), "greedy_ms must be a finite number"),
    (lambda d: d["rounds"]["1"].update(total=0.0), "a total > 0 ms"),
    (lambda d: d["rounds"]["1"].update(first=0.0), "a first round > 0 ms"),
    (lambda d: d["rounds"]["1"].update(verify=-1.0), "phases >= 0 ms"),
    (lambda d: d["rounds"]["1"].update(draft=float("inf")), "draft must be a finite number"),
    (lambda d: d["rounds"]["1"].update(rounds=0), "whole rounds >= 1"),
    (lambda d: d["rounds"]["1"].pop("commit"), "missing ['commit']"),
    (lambda d: d.update(extra=1), "unknown ['extra']"),
    (lambda d: d.update(rounds={}), "non-empty object"),
    (lambda d: d.update(rounds={"0": d["rounds"]["1"]}), "budget must be a whole number >= 1"),
    (lambda d: d.update(rounds={"x": d["rounds"]["1"]}), "budget must be a whole number >= 1"),
    (lambda d: d.update(block_size=True), "block_size must be a whole number"),
    (lambda d: d.update(device=3), "must be text"),
])
def test_a_bad_cache_entry_is_refused_by_name_and_measured_again(tmp_path, monkeypatch, mutate, words):
    """issue #64 class 3: a cache entry is checked on read (finite, positive, this version's keys); a bad one is
    not used (the caller measures again and says why), and nothing the cache writes is bare NaN / Infinity."""
    monkeypatch.setenv(speedup.CACHE_ENV, str(tmp_path))
    table = _table({1: 5.0, 2: 6.0})
    entry = json.loads(json.dumps(table.to_dict()))
    mutate(entry)
    with pytest.raises(InputError, match=re.escape(words)):
        speedup.CostTable.from_dict(entry)
    path = speedup.cache_path()
    path.write_text(json.dumps({"version": speedup.CACHE_VERSION, "tables": {"k": entry}}))
    notes: list[str] = []
    assert speedup.cached_costs("k", notes=notes) is None and words in notes[0]
    speedup.save_costs(table)  # measured again: the entry replaced, the file strict JSON
    json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"bare {c} in the cache"))
    assert speedup.cached_costs("k") == table


def test_degenerate_outputs():
    assert speedup.degenerate([7] * 20).startswith("one token is 20 of 20")
    assert "4-grams repeat" in speedup.degenerate([1, 2, 3, 4, 5] * 6)
    assert speedup.degenerate(list(range(40))) is None
    assert speedup.degenerate([7] * 5) is None  # too short to judge


def test_humaneval_from_the_real_package():
    items = read_prompts("humaneval:3")
    assert [it["source"] for it in items] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert "def has_close_elements" in items[0]["prompt"] and items[0]["category"] == "humaneval"
    assert len(read_prompts("humaneval")) == 164
    for bad in ("humaneval:0", "humaneval:x"):
        with pytest.raises(InputError, match="whole number"):
            read_prompts(bad)


def test_hub_rows_from_a_local_file(tmp_path):
    """The hub's row shapes (GSM8K's question, MT-Bench's turns + category, Alpaca's instruction + input), read from
    a local file through the same mapping as a hub download; the hub itself refused in seconds when offline."""
    (tmp_path / "gsm8k.jsonl").write_text(
        json.dumps({"question": "Tom has 3 apples.", "answer": "3"}) + "\n"
        + json.dumps({"question": "Two plus two?", "answer": "4"}) + "\n")
    items = read_prompts(f"hf:{tmp_path / 'gsm8k.jsonl'}")
    assert [it["prompt"] for it in items] == ["Tom has 3 apples.", "Two plus two?"]
    (tmp_path / "mt.json").write_text(json.dumps([{"prompt": ["Write a poem.", "Shorter."], "category": "writing"},
                                                  {"prompt": ["Solve x+1=2."], "category": "math"}]))
    items = read_prompts(f"hf:{tmp_path / 'mt.json'}")
    assert [(it["prompt"], it["category"]) for it in items] == [("Write a poem.", "writing"), ("Solve x+1=2.", "math")]
    alpaca = rows_to_items([{"instruction": "Translate.", "input": "bonjour", "output": "hello"}], "instruction", "a")
    assert alpaca[0]["prompt"] == "Translate.\n\nbonjour"
    with pytest.raises(InputError, match="no prompt text"):
        rows_to_items([{"answer": "4"}], None, "x")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "ddtree_viz", "analyze", "--prompts", "hf:gsm8k", "--out",
                        str(tmp_path / "o")], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "error:" in r.stderr and "Traceback" not in r.stderr
    assert "datasets" in r.stderr or "offline" in r.stderr
    assert time.monotonic() - start < 60 and not (tmp_path / "o").exists()


def test_table_escapes_and_marks_predictions():
    rows = [dict(benchmark="a&b_%$#{}", method="greedy", speedup=1.0, tau=1.0, measured=True),
            dict(benchmark="a&b_%$#{}", method="DDTree (b=4)", speedup=1.5, tau=2.25, measured=False)]
    tex = table_latex(rows, "caption with 50% & _under")
    assert r"a\&b\_\%\$\#\{\}" in tex and "a&b" not in tex and r"50\% \& \_under" in tex
    assert r"\toprule" in tex and r"\bottomrule" in tex and tex.count(r"$^\dagger$") == 3  # 2 cells + the note
    parsed = list(csv.DictReader(io.StringIO(table_csv(rows))))
    assert parsed[1] == {"benchmark": "a&b_%$#{}", "method": "DDTree (b=4)", "speedup": "1.500", "tau": "2.250",
                         "measured": "predicted"}


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory):
    """analyze on two shipped sets of the embedded pair, tiny settings: the costs measured (a fresh cache), the
    prediction checked by real runs at budgets 2 and 4 (4 = the run's own budget)."""
    base = tmp_path_factory.mktemp("speedup")
    old = os.environ.get(speedup.CACHE_ENV)
    os.environ[speedup.CACHE_ENV] = str(base / "cache")
    try:
        code = main(["analyze", "--prompts", str(_two_prompts(base, "code")), str(_two_prompts(base, "text")),
                     "--out", str(base / "out"), "--max-new-tokens", "8", "--budget", "4", "--cost-rounds", "2",
                     "--validate", "2", "4"])
    finally:
        os.environ.pop(speedup.CACHE_ENV) if old is None else os.environ.__setitem__(speedup.CACHE_ENV, old)
    assert code == 0
    return base


def _two_prompts(base: Path, name: str) -> Path:
    path = base / f"{name}.txt"
    path.write_text({"code": "def add(a, b):\n\nclass Point:\n", "text": "import os\n\ndef main():\n"}[name])
    return path


def test_analyze_writes_the_speedup_contract(study_dir):
    out = study_dir / "out"
    for name in ("code", "text"):
        s = json.loads((out / name / "speedup.json").read_text())
        assert {"device", "engine", "greedy_ms", "budgets", "best_budget", "break_even_budget", "chain",
                "validation"} <= set(s)
        assert set(s["budgets"]) == {"1", "2", "4"} and s["best_budget"] in (1, 2, 4)
        for p in s["budgets"].values():
            assert p["round_ms"] > 0 and p["predicted_speedup"] == pytest.approx(p["tau"] * s["greedy_ms"]
                                                                                   / p["round_ms"])
        assert s["chain"]["tau"] >= 1 and s["chain"]["round_ms"] > 0
        rows = {r["budget"]: r for r in s["validation"]}
        assert set(rows) == {2, 4} and all(r["identical_to_greedy"] for r in rows.values())
        # at the run's own budget the real run visits the same states as the traces: the same tokens per round
        assert rows[4]["measured_tau"] == pytest.approx(rows[4]["predicted_tau"])
        assert rows[4]["error"] == pytest.approx(rows[4]["predicted_tokens_per_s"]
                                                 / rows[4]["measured_tokens_per_s"] - 1)
    settings = json.loads((out / "code" / "prompts.json").read_text())["settings"]
    assert settings["chat_template"] is False and settings["thinking"] is None  # recorded per set
    top = json.loads((out / "speedup.json").read_text())
    assert set(top["sets"]) == {"code", "text"}
    table = list(csv.DictReader(io.StringIO((out / "table.csv").read_text())))
    assert [(r["benchmark"], r["method"].split(" (")[0]) for r in table] == [
        (b, m) for b in ("code", "text") for m in ("greedy", "DFlash chain", "DDTree")]
    for r in table:  # DDTree's row is measured when its best budget was among the validated ones, else predicted
        best = json.loads((out / r["benchmark"] / "speedup.json").read_text())["best_budget"]
        ran = not r["method"].startswith("DDTree") or best in (2, 4)
        assert r["measured"] == ("yes" if ran else "predicted")
    assert r"\toprule" in (out / "table.tex").read_text()
    # the report shows the study: its section, the best budget, predicted vs measured
    report = (out / "code" / "report.html").read_text()
    assert "Speed-up by budget" in report and "measured tok/s" in report
    code = json.loads((out / "code" / "speedup.json").read_text())
    assert json.loads((out / "code" / "summary.json").read_text())["speedup"] == code


def test_second_set_uses_the_cached_costs(study_dir):
    s = [json.loads((study_dir / "out" / n / "speedup.json").read_text()) for n in ("code", "text")]
    assert s[0]["costs_cached"] is False and s[1]["costs_cached"] is True
    assert s[0]["costs"] == s[1]["costs"]


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="no TeX on this machine")
def test_table_compiles(study_dir, tmp_path):
    shutil.copy(study_dir / "out" / "table.tex", tmp_path / "table.tex")
    (tmp_path / "doc.tex").write_text("\\documentclass{article}\\usepackage{booktabs}\\begin{document}"
                                      "\\input{table.tex}\\end{document}\n")
    r = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:]


def _walked(path, bonus, top1, kept=None, **over):
    """A DDTree round whose accepted path holds the target's tokens `path` (depths 1..a, one node a depth) and the
    bonus `bonus`, over a drafter grid whose top-1 at depth d is top1[d - 1] (a second candidate beside it)."""
    from ddtree_viz.trace import TreeNode

    nodes = (TreeNode(0, -1, 0, 1, "r", 0.0, -1),) + tuple(
        TreeNode(d, d - 1, d, t, str(t), -0.5, 0) for d, t in enumerate(path, start=1))
    walk = len(path) + 1
    fields = dict(draft_top_ids=tuple((t, 999) for t in top1), draft_top_logprobs=tuple((-0.1, -3.0) for _ in top1))
    return StepRecord(index=0, committed_len=0, root_token_id=1, nodes=nodes, target_argmax=(0,) * len(nodes),
                      accepted=tuple(range(len(nodes))), bonus_token_id=bonus, timings_ms={}, cache=(),
                      new_token_ids=tuple(range(walk if kept is None else kept)), **{**fields, **over})


def test_the_chains_tokens_from_a_tree_round():
    """issue #65 item 6: what the DFlash chain (the drafter's top-1 at each drafted depth) would have gained in the
    same round, from the target's tokens the round verified: exact at the first mismatch or a full block, a lower
    bound where the tree's path ended while the chain's top-1 still matched, capped at what a cut or last round
    kept; nothing for rounds that cannot say."""
    from ddtree_viz.analysis import chain_gain

    assert chain_gain(_walked([5, 6], 7, [5, 9, 7, 1])) == (2, True)  # mismatch at depth 2: one draft + t_2
    assert chain_gain(_walked([5, 6], 7, [8, 6, 7, 1])) == (1, True)  # at depth 1: the bonus alone
    assert chain_gain(_walked([5, 6], 7, [5, 6])) == (3, True)  # every drafted depth accepted: the block
    assert chain_gain(_walked([5], 6, [5, 6, 8, 9])) == (3, False)  # t_1, t_2 matched; depth 3 never verified
    assert chain_gain(_walked([5], 6, [5, 6, 8, 9], kept=1)) == (1, True)  # cut: what it kept
    assert chain_gain(_walked([5], 6, [5, 6, 8, 9]), final=True) == (2, True)  # the session stopped there
    assert chain_gain(_walked([5, 6], 7, [5, 9, 7, 1], kept=1)) == (1, True)
    for other in (dict(verify="naive"), dict(method="dflash"), dict(selector_pair=(0.0, 0.0, 0.0)),
                  dict(draft_top_ids=(), draft_top_logprobs=())):
        assert chain_gain(_walked([5, 6], 7, [5, 9, 7, 1], **other)) is None, other


def test_a_sessions_speedup_with_the_chain_and_break_even():
    """The page's study (speedup.session_speedup): predict's S(b) and best budget, the chain's point from the same
    rounds (at its drafted length, a lower bound counted), the break-even budget over greedy (S >= 1)."""
    steps = [_walked([5, 6, 7, 8], 9, [5, 6, 1, 1, 1, 1, 1]),  # chain: 3 tokens, exact
             _walked([5], 6, [5, 6, 1, 1, 1, 1, 1])]  # chain: at least 3
    costs = _table({1: 11.0, 2: 12.0, 4: 14.0, 8: 40.0}, greedy_ms=10.0, chain=12.0)
    study = speedup.session_speedup(steps, costs, budget=4)
    p = study.prediction
    # a session is one decode: its first round over the tokens it made
    assert p == speedup.predict(steps, costs, chain_tau=3.0, new_tokens=7) and p.chain.tau == 3.0
    assert study.chain_at_least == 1 and study.chain_nodes == 7 and study.chain_why is None
    assert study.reach == 4 and study.unreached == [8] and 8 not in p.budgets
    # S: 1.5*10/11 = 1.36, 2*10/12 = 1.67, 3*10/14 = 2.14 (best 4); break-even over greedy: 4
    assert p.best_budget == 4 and study.pays_up_to == 4
    slow = speedup.session_speedup(steps, _table({1: 11.0, 2: 12.0, 4: 40.0}), budget=4)
    assert slow.prediction.best_budget == 2 and slow.pays_up_to == 2  # 3 * 10 / 40 = 0.75 < 1 at 4
    never = speedup.session_speedup(steps, _table({1: 30.0, 2: 30.0, 4: 40.0}), budget=4)
    assert never.pays_up_to is None
    assert speedup.session_speedup(steps, _table({1: 11.0}, chain=None), budget=4).chain_why.startswith("the cost")
    nogrid = [_walked([5], 6, [5, 6], draft_top_ids=(), draft_top_logprobs=())]
    assert "not recorded" in speedup.session_speedup(nogrid, costs, budget=1).chain_why
    with pytest.raises(InputError, match="no exact DDTree rounds"):
        speedup.session_speedup([_walked([5], 6, [5, 6], verify="naive")], costs, budget=1)


def test_the_panel_draws_and_says_the_studys_own_figures():
    """render/speedup_view.py: every number drawn or written is the study's (S per budget, the chain's point at its
    drafted length, the session's budget, the break-even ring); text escaped; the no-costs state gives the command."""
    from ddtree_viz.render.speedup_view import pays_html, pays_missing_html, pays_spec

    steps = [_walked([5, 6, 7, 8], 9, [5, 6, 1, 1, 1, 1, 1]), _walked([5], 6, [5, 6, 1, 1, 1, 1, 1])]
    costs = _table({1: 11.0, 2: 12.0, 4: 14.0, 8: 40.0})
    costs = speedup.CostTable(**{**costs.__dict__, "device_name": "<b>cpu</b>"})
    study = speedup.session_speedup(steps, costs, budget=4)
    spec = pays_spec(study)
    by = {t["name"]: t for t in spec.data}
    curve = by["predicted S(b), DDTree"]
    assert curve["x"] == [1, 2, 4] and curve["y"] == [study.prediction.budgets[b].speedup for b in (1, 2, 4)]
    assert by["DFlash chain (at least)"]["x"] == [7] and by["DFlash chain (at least)"]["y"] == [2.5]
    assert by["this session's budget (4)"]["x"] == [4, 4]
    assert by["break-even budget (4)"]["x"] == [4]
    assert json.loads(spec.to_json()) == json.loads(spec.figure().to_json())  # plotly checks every property
    text = pays_html(study, first=1, last=2, device=costs.device_name)
    assert "&lt;b&gt;cpu&lt;/b&gt;" in text and "<b>cpu</b>" not in text
    assert "2 exact DDTree rounds" in text and "rounds 1–2" in text and "prediction" in text.lower()
    assert f"S = {study.prediction.budgets[4].speedup:.2f}×" in text and "at least <b>4</b>" in text
    assert "at least 2.50×" in text and "Measured budgets 8" in text
    pts = study.prediction.budgets
    assert "S ≥ 1 at budgets " + ", ".join(str(b) for b in sorted(pts) if pts[b].speedup >= 1) + "." in text
    beats = [str(b) for b in sorted(pts) if pts[b].speedup >= study.prediction.chain.speedup]
    assert beats == ["4"] and "as fast as the chain at <b>budget 4</b> (perhaps fewer" in text
    missing = pays_missing_html("no costs <here>", "OMP_NUM_THREADS=1 python -m ddtree_viz bench --costs --x '<a>'")
    assert "no costs &lt;here&gt;" in missing and "<code>OMP_NUM_THREADS=1 python -m ddtree_viz bench --costs" in missing
    assert "&#x27;&lt;a&gt;&#x27;" in missing


def test_degenerate_output_is_flagged_beside_the_page_throughput():
    """The page's stats table: a looping output gets a warning row beside the tokens/s rows."""
    from ddtree_viz.render.stats_view import stats_markdown

    base = dict(rounds=9, mean_acceptance=3.0, greedy_tok_s=10.0, ddtree_tok_s=30.0, speedup=3.0)
    assert "degenerate" not in stats_markdown({**base, "degenerate": None})
    table = stats_markdown({**base, "degenerate": speedup.degenerate([5] * 20)})
    assert "output looks degenerate" in table and "one token is 20 of 20" in table


def test_report_shows_the_study_per_category_escaped():
    """analyze's report: the speed-up section with a table per category of the prompts (names escaped: a report is
    untrusted input), and nothing from a study that is not one."""
    from ddtree_viz.render.report import speedup_html

    study = {"budgets": {"4": {"tau": 2.0, "round_ms": 10.0, "predicted_tokens_per_s": 200.0, "predicted_speedup": 1.5}},
             "best_budget": 4, "break_even_budget": 4, "engine": "runner", "device_name": "cpu", "greedy_ms": 7.5,
             "validation": [], "categories": {"<b>math</b>": {"rounds": 3, "best_budget": 4, "break_even_budget": 4,
                                                             "budgets": {"4": {"predicted_speedup": 1.25}}}}}
    got = speedup_html(study)
    assert "&lt;b&gt;math&lt;/b&gt;" in got and "<b>math</b>" not in got and "1.25" in got
    assert speedup_html({"budgets": "x"}) == "" and speedup_html(None) == ""


def _runner_shapes(session) -> tuple:
    """The runners a session decodes on and the shapes they have captured: (target runner, its slots, the static
    drafter's slots)."""
    runner = session.target_engine.runner
    drafter = getattr(session.proposer, "runner", None)
    return runner, set(runner._slots), set(getattr(drafter, "_slots", {}))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_timed_pass_replays_what_the_warm_up_captured(device):
    """costs.warm_up: on a GPU every prompt decoded once, the longest first, so the timed pass of the speed-up's
    validation replays graphs (no runner rebuilt for a longer prompt, no shape captured while timed: an H100's
    validation, timed cold, measured rounds 31-33% slower than their cost); on a CPU nothing to warm (no decode)."""
    import torch

    from ddtree_viz.engine import costs
    from ddtree_viz.engine.models import load_pair

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (CUDA graphs)")
    pair = load_pair(device=device)
    prompts = [pair.tokenizer(text)["input_ids"] for text in
               ("def f(x):\n", "import os\n\n\ndef walk(root):\n    for name in os.listdir(root):\n" * 6, "class A:\n")]
    session = costs._session(pair, "ddtree", 16, None, "runner", 24, costs.GREEDY, time_phases=False)
    decoded = []

    def decode(ids):
        decoded.append(len(ids))
        session.prefill(prompt_ids=ids)
        while not session.done:
            session.step()

    costs.warm_up(pair, prompts, decode)
    if device == "cpu":
        assert decoded == []
        return
    assert decoded == sorted(map(len, prompts), reverse=True)
    warmed = _runner_shapes(session)
    for ids in prompts:
        decode(ids)
        assert _runner_shapes(session) == warmed  # the same runner, nothing captured in the timed pass

"""Issue #64, class 2: a target whose logits hold NaN decoded '!!!!', and the CLI and the page called it identical to
greedy (its reference, made from the same NaN logits, chose the same token). A tiny real hybrid saved to disk with
one weight set to NaN, loaded through the user's path (`run --target DIR`, `load_pair`), no mock: every round and the
reference see NaN logits, and the comparison is reported invalid, with its reason, never identical. The same pair
with finite weights still reads identical. (Non-finite quantization scales are refused at load: test_fp8.py,
test_int4.py, test_int4_formats.py, test_dflash2.py.)"""

from __future__ import annotations

import math

import pytest

from ddtree_viz import cli
from ddtree_viz.analysis import compare_outputs
from ddtree_viz.engine.models import load_pair
from ddtree_viz.engine.session import DecodeSession
from ddtree_viz.render.diff_view import compare_with_greedy, output_vs_greedy_html
from ddtree_viz.render.stats_view import stats_markdown, stats_summary
from tests import tiny

PROMPT = "def f(x):"
REASON = "hold NaN or inf"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """(target dir with a NaN weight, its drafter dir, the finite target dir)."""
    root = tmp_path_factory.mktemp("nonfinite")
    target, draft = tiny.save_pair(tiny.tiny_pair("hybrid"), root / "finite")
    nan_target, _ = tiny.save_pair(tiny.tiny_pair("hybrid"), root / "nan")
    tiny.edit_checkpoint(nan_target, lambda state, config: state["model.layers.0.mlp.up_proj.weight"].__setitem__(
        (0, 0), math.nan))
    return nan_target, draft, target


@pytest.mark.parametrize("engine", ["transformers", "runner"])
def test_run_with_nan_logits_says_invalid_and_why_never_identical(dirs, capsys, engine):
    nan_target, draft, _ = dirs
    rc = cli.main(["run", "--target", str(nan_target), "--draft", str(draft), "--prompt", PROMPT,
                   "--max-new-tokens", "8", "--budget", "4", "--engine", engine])
    out = capsys.readouterr().out
    assert rc == 0
    assert "output identical to" not in out
    line = next(x for x in out.splitlines() if "INVALID" in x)
    assert line.startswith("comparison with greedy INVALID (matches, proving nothing): round 0's verify logits")
    assert REASON in line and "the reference's logits at generated token 0" in line


def _session(target, draft) -> DecodeSession:
    pair = load_pair(str(target), str(draft))
    session = DecodeSession.of(pair, budget=4, max_new_tokens=8, engine="transformers")
    session.prefill(PROMPT)
    session.run()
    return session


def test_the_trace_the_page_and_show_say_invalid(dirs):
    nan_target, draft, target = dirs
    trace = _session(nan_target, draft).to_trace()
    assert trace.output_ids == trace.greedy_ids and trace.first_divergence is None  # '!!!!' both sides
    assert REASON in trace.invalid and trace.identical is False and trace.divergence_verdict is None
    cmp = compare_with_greedy(trace)
    assert cmp.summary.startswith("comparison with greedy INVALID: round 0's verify logits") and "identical" not in cmp.summary
    assert "#1a7f37" not in output_vs_greedy_html(trace)  # not drawn green
    summary = stats_summary(trace)
    assert summary["identical_to_greedy"] is False and REASON in summary["invalid"]
    assert "| identical to greedy | no: INVALID, round 0" in stats_markdown(summary)
    sides = compare_outputs(trace, trace)
    assert sides["a"]["identical"] is False and REASON in sides["a"]["invalid"]

    finite = _session(target, draft).to_trace()  # the same pair with finite weights: still identical
    assert finite.invalid is None and finite.identical is True
    assert compare_with_greedy(finite).summary.startswith("identical to greedy for 8 tokens")

"""A check's progress, estimate and Stop (issue #65 item 5), with no browser: the estimate's arithmetic from a
measured pace, a reference decoded a few tokens at a time equal to one call (tokens, margins, noise), and the page's
check stopped part way: what it reached, no verdict on the rest. The page itself: tests/test_browser.py."""

from types import SimpleNamespace

import pytest

from ddtree_viz.engine.reference import GreedyReference
from ddtree_viz.errors import InputError
from ddtree_viz.page import actions
from ddtree_viz.page.host import ModelHost
from ddtree_viz.page.progress import (FIRST_CHUNK, Pace, chunk_tokens, duration, estimate_s, pace_of, progress_of,
                                      status_line)
from ddtree_viz.page.state import SETTINGS, TabState, read_settings
from ddtree_viz.page.views import render_check
from tests.tiny import tiny_pair


def reference(ids, prompt=10, prefill=0.5, tokens=0.3, shared=False):
    """What a check reads of a session.GreedyReference: its ids, prompt and time split."""
    return SimpleNamespace(ids=list(ids), prompt_ids=list(range(prompt)), prefill_seconds=prefill, token_seconds=tokens,
                           shared_prefill=shared)


def test_the_estimate_is_the_measured_pace_times_the_tokens_left():
    # 4 tokens: the first from the prefill (0.5 s over a 10-token prompt), 3 after it in 0.3 s
    pace = pace_of(reference([7, 8, 9, 10]), "here")
    assert pace.token_s == pytest.approx(0.1) and pace.tokens == 3 and pace.prefill_s == pytest.approx(0.05)
    assert estimate_s(pace, 20) == pytest.approx(2.0)  # prefilled: 20 steps of 0.1 s
    # not prefilled yet: a 40-token prompt at 0.05 s a prompt token gives the first token, 19 steps after it
    assert estimate_s(pace, 20, prompt_tokens=40, prefilled=False) == pytest.approx(2.0 + 1.9)
    assert estimate_s(pace, 0) == 0.0 and estimate_s(None, 5) is None
    # a reference that started from the session's prefill measured no prefill: none to estimate one with
    shared = pace_of(reference([7, 8, 9], shared=True, tokens=0.4), "here")
    assert shared.prefill_s is None and shared.token_s == pytest.approx(0.2)
    assert estimate_s(shared, 3, 40, prefilled=False) is None and estimate_s(shared, 3) == pytest.approx(0.6)
    assert pace_of(reference([7]), "here") is None  # one token: only the prefill, no pace yet


def test_a_check_decodes_about_its_interval_at_a_time_and_words_its_estimate():
    pace = Pace(token_s=0.02, tokens=50, where="on this machine by an earlier check")
    assert chunk_tokens(pace, 0.5) == 25 and chunk_tokens(Pace(2.0, 3), 0.5) == 1 and chunk_tokens(None, 0.5) == FIRST_CHUNK
    assert (duration(0.4), duration(8.2), duration(200)) == ("under a second", "about 9 s", "about 4 min")
    p = progress_of(reference(range(37), tokens=0.72), "transformers", 64, pace, 10, running=True)
    assert (p.done, p.total, p.left_s) == (37, 64, pytest.approx(27 * 0.02))
    line = status_line(p)
    assert "Checking against transformers: 37 / 64 tokens" in line and "an estimate: 20 ms a token" in line
    stopped = status_line(SimpleNamespace(**{**p.__dict__, "stopped": True}))
    assert "Stopped:" in stopped and "tokens 38–64 were not checked" in stopped and "unknown" in stopped
    unknown = progress_of(None, "transformers", 64, None, 10, running=True)
    assert unknown.left_s is None and "no estimate yet" in status_line(unknown)


def test_a_reference_decoded_a_few_tokens_at_a_time_is_the_one_call_reference():
    pair = tiny_pair("hybrid", seed=0)
    ids = pair.tokenizer("def fibonacci(n):\n    return", add_special_tokens=False)["input_ids"]
    candidates = GreedyReference(pair.target, ids, pair.eos_token_ids).extend_to(24).ids
    whole = GreedyReference(pair.target, ids, pair.eos_token_ids).extend_to(24, candidates)
    steps = GreedyReference(pair.target, ids, pair.eos_token_ids)
    seen = []
    while len(steps.ids) < 24 and not steps.finished:
        seen.append(len(steps.extend_to(24, candidates, most=5).ids))
    assert seen[:3] == [5, 10, 15]
    part = steps.result()
    assert (part.ids, part.margins, part.noise, part.noise_positions) == (
        whole.ids, whole.margins, whole.noise, whole.noise_positions)
    assert steps.prefill_seconds > 0 and steps.token_seconds > 0


@pytest.fixture(scope="module")
def host():
    h = ModelHost(None, None, "float32", "cpu")  # the embedded pair, on the runner
    h.start(background=False)
    assert h.ready, h.error
    return h


def test_a_stopped_check_says_what_it_reached_and_gives_no_verdict_on_the_rest(host):
    tab = TabState()
    run = read_settings(host, {**SETTINGS, "prompt": "def fibonacci(n):\n", "budget": 32, "block_size": 16,
                               "max_new_tokens": 96, "verify": "exact", "method": "ddtree"})
    for _ in actions.run_rounds(host, tab, run, check=False):
        pass
    n = len(tab.session.generated)
    seen = []
    for _ in actions.check_rounds(host, tab, min_interval=0.0):  # a redraw after every few tokens
        seen.append(tab.checking.done if tab.checking is not None else None)
        if len(seen) == 3:
            actions.stop(tab)
    done = tab.checking.done
    assert tab.checking.stopped and 0 < done < n and seen[1] < seen[2]
    views = render_check(host, tab)
    assert f"reached {done} / {n} tokens" in views.status and "unknown" in views.status
    assert "the check was stopped" in views.diff_html and f"for {n} tokens" not in views.diff_html
    assert f"| identical to greedy | unknown: identical for the first {done} of {n} tokens" in views.stats
    # the next Step's check goes on from there to the verdict (the Step itself: the session has finished)
    with pytest.raises(InputError, match="finished"):
        actions.step(host, tab, run, check=False)
    tab = actions.check(host, tab)
    assert tab.checking is None and not tab.trace.reference_pending and tab.trace.identical
    # the check against transformers, stopped part way: what it reached, no claim on the whole output
    for i, _ in enumerate(actions.check_rounds(host, tab, independent=True, min_interval=0.0)):
        if i == 2:
            actions.stop(tab)
    assert tab.checking.stopped and tab.checking.independent and "**agrees**" not in tab.independent
    reached = tab.checking.done
    assert f"**stopped** at {reached} / {n} tokens" in tab.independent and "not checked" in tab.independent
    assert "Check vs transformers" in render_check(host, tab).status  # how to go on
    tab = actions.check_transformers(host, tab)  # again: on from there to its verdict
    assert "**agrees**" in tab.independent and tab.checking is None


def test_stop_ends_a_run_at_its_next_round_and_the_check_after_it(host):
    """Stop during a Run: the rounds so far are shown and the Run ends; the check chained after it stops before
    it decodes (nothing claimed on the tokens); the next Run goes on to the end and is checked."""
    tab = TabState()
    run = read_settings(host, {**SETTINGS, "prompt": "import os\n", "budget": 8, "block_size": 16,
                               "max_new_tokens": 200, "verify": "exact", "method": "ddtree"})
    shown = []
    for t in actions.run_rounds(host, tab, run, check=False):
        shown.append(len(t.trace.steps))
        if len(shown) == 2:
            actions.stop(tab)
    assert shown == [1, 2, 2] and not tab.session.done
    for _ in actions.check_rounds(host, tab):
        pass
    n = len(tab.session.generated)
    assert tab.checking.stopped and tab.trace.reference_pending
    assert f"reached {tab.checking.done} / {n} tokens" in render_check(host, tab).status
    for _ in actions.run_rounds(host, tab, run, check=False):
        pass
    tab = actions.check(host, tab)
    assert tab.session.done and tab.checking is None and tab.trace.identical and not tab.trace.reference_pending

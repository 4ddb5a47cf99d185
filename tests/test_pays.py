"""Does the tree pay here (issue #65 item 6): the Step tab's speed-up panel on the embedded pair on a CPU, through
ddtree_viz/page/ as the app calls it. The chain's count from a tree round against real chain rounds from the same
state; the panel without this machine's costs (the command that measures them) and with them (every figure drawn
the session's rounds x the cached costs, worked out here from the rounds themselves); Back, compare mode, a
replay and a chain session."""

import copy
import html

import pytest
import torch

from ddtree_viz import analysis, speedup
from ddtree_viz.engine.costs import measure_costs
from ddtree_viz.page import actions
from ddtree_viz.page.state import TabState, read_settings
from ddtree_viz.page.views import render_views
from tests import tiny

VALUES = dict(prompt="def fibonacci(n):\n", budget=16, block_size=16, max_new_tokens=48, verify="exact",
              method="ddtree")


@pytest.fixture(scope="module")
def host():
    return tiny.embedded_host()


def test_the_chains_count_from_a_tree_round_is_a_real_chain_rounds(host):
    """analysis.chain_gain against the DFlash chain itself: before every DDTree round the session is forked and the
    fork steps as the chain from that same state. Where the count is exact it equals the chain round's tokens;
    where it is a lower bound, the chain round gained at least that."""
    from ddtree_viz.engine.session import DecodeSession

    pair = host.pair
    session = DecodeSession.of(pair, budget=8, max_new_tokens=32, engine="transformers")
    session.prefill("def fibonacci(n):\n")
    exact = bounded = 0
    while not session.done:
        # the session's whole state, the models shared (a new memo each time: deepcopy adds its copies to it)
        chain = copy.deepcopy(session, {id(x): x for x in (pair, pair.target, pair.drafter, pair.tokenizer)})
        as_chain(chain)
        real = chain.step().kept
        gain, is_exact = analysis.chain_gain(session.step(), final=session.done)
        if is_exact:
            assert gain == real
            exact += 1
        else:
            assert gain <= real
            bounded += 1
    assert exact >= 3, (exact, bounded)


def as_chain(session) -> None:
    """The session's next rounds as the DFlash chain's: its method and the shape every part builds (session.shape,
    held by the scheduler and the recorder too)."""
    from ddtree_viz.engine.shapes import shape_for

    shape = shape_for("dflash", session.tree_scoring)
    session.method, session.shape, session.scheduler.shape, session.recorder.shape = "dflash", shape, shape, shape


def _drawn(views) -> dict:
    return {t["name"]: t for t in views.pays_spec.data}


def test_the_panel_says_how_to_measure_then_draws_the_sessions_speedup(host, tmp_path, monkeypatch):
    monkeypatch.setenv(speedup.CACHE_ENV, str(tmp_path / "cache"))
    tab = TabState()
    for _ in range(4):
        tab = actions.step(host, tab, read_settings(host, VALUES))
    assert not tab.session.done  # (no round is the last: check_drawn counts the chain's as a going session's)
    before = render_views(host, tab)
    # no costs for this pair, engine and device: no figure, the command that measures them
    command = host.costs_command(16, 16)
    assert before.pays_spec is None and "No speed-up estimate yet" in before.pays_html
    assert html.escape(command) in before.pays_html
    assert command.startswith(f"OMP_NUM_THREADS={torch.get_num_threads()} python -m ddtree_viz bench --costs ")
    assert f"--engine {host.exact_engine} --block-size 16 --budget 16" in command
    ids = host.pair.tokenizer.encode(VALUES["prompt"])
    table = measure_costs(host.pair, ids, [1, 4, 16], engine=host.exact_engine, block_size=16, rounds=2)
    speedup.save_costs(table)
    shown = render_views(host, tab)
    check_drawn(shown, tab.trace.steps, table, budget=16)
    assert "4 exact DDTree rounds" in shown.pays_html and "rounds 1–4" in shown.pays_html
    made = sum(st.kept for st in tab.trace.steps)  # the first round spread over the tokens the rounds made
    assert f"counts this decode's first round (it drafts over the prompt's rows too) spread over the {made} tokens" \
        in shown.pays_html
    # Back: the rounds up to the one on screen
    back = render_views(host, actions.move(tab, delta=-1))
    check_drawn(back, tab.trace.steps[:3], table, budget=16)
    assert "3 exact DDTree rounds" in back.pays_html
    # a replay's rounds came from some machine: nothing predicted, and it says why
    replay = actions.load_replay(TabState(), str(actions.write_trace(tab)))
    v = render_views(host, replay)
    assert v.pays_spec is None and "replayed trace" in v.pays_html


def check_drawn(views, steps, table, budget: int) -> None:
    """The panel's figure and words hold the session's own S(b), worked out here from its rounds and the costs:
    tau(b) = tokens the rounds would have gained under b / rounds, S(b) = tau(b) x greedy step / round cost(b), the
    round's cost with the decode's first round spread over the tokens its rounds made (N / tau(b) rounds)."""
    n, made = len(steps), sum(step.kept for step in steps)
    curve = analysis.session_budget_curve(steps)

    def cost(c, tau: float) -> float:
        return c.total + (c.first - c.total) * tau / made

    expected = {b: curve[b] / n * table.greedy_ms / cost(c, curve[b] / n) for b, c in sorted(table.rounds.items())}
    drawn = _drawn(views)
    s = drawn["predicted S(b), DDTree"]
    assert s["x"] == list(expected) and s["y"] == pytest.approx(list(expected.values()))
    assert drawn[f"this session's budget ({budget})"]["x"] == [budget, budget]
    # the chain's point: its tokens per round from the same rounds, at its 15 drafted tokens
    gains = [analysis.chain_gain(step) for step in steps]
    chain = next(t for name, t in drawn.items() if name.startswith("DFlash chain"))
    assert chain["x"] == [15]
    chain_tau = sum(g for g, _ in gains) / n
    assert chain["y"] == pytest.approx([chain_tau * table.greedy_ms / cost(table.chain, chain_tau)])
    assert ("DFlash chain (at least)" in drawn) == any(not exact for _, exact in gains)
    # break-even: the largest budget from the best one up with S >= 1 (no ring where there is none)
    best = max(expected, key=lambda b: (expected[b], -b))
    even = [b for b in expected if b >= best and expected[b] >= 1.0]
    rings = [name for name in drawn if name.startswith("break-even")]
    assert rings == ([f"break-even budget ({max(even)})"] if even else [])
    assert f"S = {expected[budget]:.2f}×" in views.pays_html and f"{chain['y'][0]:.2f}×" in views.pays_html


def test_compare_mode_shows_as_rounds_and_a_chain_session_says_why(host, tmp_path, monkeypatch):
    """Compare mode: the panel is configuration A's (it says so); a session of the DFlash chain has no budget to
    predict over, and says so rather than draw."""
    monkeypatch.setenv(speedup.CACHE_ENV, str(tmp_path / "cache"))
    values = {**VALUES, "budget": 4, "compare_on": True, "compare_method": "dflash"}
    tab = actions.step(host, TabState(), read_settings(host, values))
    tab = actions.step(host, tab, read_settings(host, values))
    v = render_views(host, tab)
    assert v.pays_spec is None and html.escape(host.costs_command(16, 4)) in v.pays_html
    ids = host.pair.tokenizer.encode(VALUES["prompt"])
    table = measure_costs(host.pair, ids, [1, 4], engine=host.exact_engine, block_size=16, rounds=2)
    speedup.save_costs(table)
    v = render_views(host, tab)
    check_drawn(v, tab.trace.steps, table, budget=4)
    assert "configuration A" in v.pays_html
    chain = actions.step(host, TabState(), read_settings(host, {**VALUES, "method": "dflash"}))
    v = render_views(host, chain)
    assert v.pays_spec is None and "DFlash chain" in v.pays_html and "Method: ddtree" in v.pays_html

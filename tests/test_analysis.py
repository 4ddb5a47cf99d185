"""Record-level analysis (ddtree_viz/analysis.py) on real rounds, float32 on the CPU.

The budget curve is a counterfactual: from one verified round it claims what every smaller budget would have
gained. Here it is checked against actual rounds: from the same state (a fresh session at the prefill, or a copy
of a session mid-run sharing the models), a round verified at budget b gains exactly budget_curve[b], for trees
with long accepted paths at random ranks (oracle drafter), greedy and sampled, for the DFlash chain by chain
length, and on the embedded pair.
"""

import copy
import dataclasses
import gc
import json
import random

import numpy as np
import pytest
import torch

from ddtree_viz import analysis
from ddtree_viz.engine.oracle import OracleProposer
from ddtree_viz.engine.sampling import Sampler
from ddtree_viz.engine.reference import greedy_decode
from ddtree_viz.engine.session import DecodeSession
from ddtree_viz.errors import TraceError
from ddtree_viz.trace import StepRecord, Trace, TreeNode, to_plain
from tests.tiny import tiny_pair

PROMPTS = ["def fibonacci(n):\n", "The quick brown fox", "x = [i * i for i in range(10)]\n# "]
MAX_NEW = 40


@pytest.fixture(scope="module")
def hybrid():
    return tiny_pair("hybrid", seed=0)


@pytest.fixture(scope="module")
def embedded():
    from ddtree_viz.engine.models import load_pair

    return load_pair()


def oracle_session(pair, prompt, budget, ranks, sampler=Sampler(), seed=0, **kw):
    ids = pair.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    reference = greedy_decode(pair.target, ids, MAX_NEW, pair.eos_token_ids, sampler=sampler).ids
    oracle = OracleProposer(reference, len(ids), ranks, pair.target.config.vocab_size, seed=seed)
    session = DecodeSession.of(pair, budget=budget, max_new_tokens=MAX_NEW, proposer=oracle, sampler=sampler, **kw)
    session.prefill(prompt)
    return session


def fork(session):
    """A copy of the session's whole state (caches, drafter context, the oracle's random state) sharing the
    models: the same state, verified again under other settings."""
    pair = session.pair
    shared = {id(x): x for x in (pair, pair.target, pair.drafter, pair.tokenizer) if x is not None}
    return copy.deepcopy(session, shared)


def check_curve_against_rounds(session, rounds, budgets=None, chain=False):
    """Step `session` `rounds` times; before each round, verify the same round from a fork at every smaller
    budget (chain: block size b + 1) and compare its tokens gained with the full round's budget curve."""
    checked = 0
    for _ in range(rounds):
        if session.done:
            break
        forks = {}
        top = session.block_size - 1 if chain else session.budget
        for b in budgets or range(1, top):
            other = fork(session)
            if chain:
                other.block_size = b + 1
            else:
                other.budget = b
            forks[b] = other.step()
        full = session.step()
        curve = analysis.recorded_curve(full)
        assert sorted(curve) == list(range(1, top + 1)) and curve[top] == full.acceptance
        assert curve == analysis.budget_curve(full, top)
        for b, small in forks.items():
            # the smaller tree is the prefix of the larger one in pop order: nodes 0..b
            assert [n.token_id for n in small.nodes] == [n.token_id for n in full.nodes[: len(small.nodes)]]
            assert small.acceptance == curve[b], (b, small.accepted, full.accepted)
            checked += small.acceptance != full.acceptance
    return checked


@pytest.mark.parametrize("seed", range(4))
def test_the_budget_curve_is_an_actual_round_at_each_smaller_budget(hybrid, seed):
    rng = np.random.default_rng(seed)
    ranks = [int(r) for r in rng.integers(0, 4, size=5)]  # where the true token sits among the drafter's candidates
    session = oracle_session(hybrid, PROMPTS[seed % 3], budget=24, ranks=ranks, seed=seed)
    differing = check_curve_against_rounds(session, rounds=3)
    assert differing > 0  # some smaller budget did gain less: the comparison can fail


@pytest.mark.parametrize("sampler", [Sampler(0.8, seed=3), Sampler(1.0, top_k=20, seed=4)])
def test_the_budget_curve_holds_when_sampling(hybrid, sampler):
    """The choice at a node depends on its path and its position only (the noise is keyed by position)."""
    session = oracle_session(hybrid, PROMPTS[1], budget=16, ranks=[0, 2, 1], sampler=sampler, seed=1)
    check_curve_against_rounds(session, rounds=2)


def test_the_chain_curve_is_by_chain_length(hybrid):
    session = oracle_session(hybrid, PROMPTS[2], budget=8, ranks=[0, 0, 0, 1], method="dflash")
    check_curve_against_rounds(session, rounds=3, chain=True)


def test_the_budget_curve_on_the_embedded_pair(embedded):
    prompt = "def read_config(path):\n"
    session = DecodeSession.of(embedded, budget=16, max_new_tokens=48)
    session.prefill(prompt)
    check_curve_against_rounds(session, rounds=2, budgets=[1, 2, 3, 4, 6, 8, 12, 15])
    # and from the prefill state with sessions of their own
    fresh = {b: DecodeSession.of(embedded, budget=b, max_new_tokens=48) for b in (1, 3, 7, 16)}
    rounds = {}
    for b, s in fresh.items():
        s.prefill(prompt)
        rounds[b] = s.step()
    curve = analysis.recorded_curve(rounds[16])
    assert all(rounds[b].acceptance == curve[b] for b in fresh)


# -- session figures ------------------------------------------------------------------------------------


def record(accepted, depths, parents=None, method="ddtree"):
    """A plain round record with the given accepted path and node depths (a chain when parents is None)."""
    parents = parents or [-1] + list(range(len(depths) - 1))
    nodes = tuple(TreeNode(i, p, d, 10 + i, f"t{i}", -1.0 * i, 0 if i else -1)
                  for i, (p, d) in enumerate(zip(parents, depths)))
    return StepRecord(index=0, committed_len=5, root_token_id=10, nodes=nodes, target_argmax=(0,) * len(nodes),
                      accepted=tuple(accepted), bonus_token_id=1, timings_ms={}, cache=(), method=method)


def test_histogram_and_per_depth_acceptance_follow_their_definitions():
    steps = [
        record([0, 1, 2], [0, 1, 2, 3]),  # 2 drafts accepted, tree 3 deep
        record([0], [0, 1, 2, 3]),  # none accepted
        record([0, 1], [0, 1]),  # 1 accepted, tree 1 deep: does not count at depth 2
        record([0, 1, 2, 3], [0, 1, 2, 3]),  # 3 accepted
    ]
    assert analysis.acceptance_histogram(steps, block_size=5) == [1, 1, 1, 1, 0]
    counts = analysis.per_depth_counts(steps, block_size=5)
    # d=1: >=1 accepted of all 4 with depth >= 1; d=2: 2 of the 2 with >=1 accepted and depth >= 2 (round 3 is
    # 1 deep); d=3: 1 of 2; d=4: none reached
    assert counts == [(3, 4), (2, 2), (1, 2), (0, 0)]
    assert analysis.per_depth_acceptance(steps, block_size=5) == [0.75, 1.0, 0.5, None]
    assert analysis.acceptance_histogram(steps) == [1, 1, 1, 1]  # block unknown: up to the deepest tree


def test_per_round_figures_are_computed_once_per_record_and_read_only(monkeypatch):
    """A page redraws its session-wide views from every round at every Step: each record's curve and tree depth
    are computed once (analysis._per_round), keyed by the record itself (an equal record made apart computes its
    own), shared read-only, and never keep a record alive (a closed tab's rounds go)."""
    calls = []
    monkeypatch.setattr(analysis, "budget_curve", lambda step: calls.append(step) or {1: 1, 2: len(step.accepted)})
    steps = [record([0, 1, 2], [0, 1, 2, 3]), record([0], [0, 1, 2, 3])]
    for _ in range(3):
        assert analysis.session_budget_curve(steps) == {1: 2, 2: 4}
        assert [analysis.tree_depth(s) for s in steps] == [3, 3]
    assert calls == steps  # once each
    twin = record([0, 1, 2], [0, 1, 2, 3])
    assert twin == steps[0] and analysis.recorded_curve(twin) == {1: 1, 2: 3} and calls[-1] is twin
    with pytest.raises(TypeError):
        analysis.recorded_curve(twin)[1] = 5
    held = len(analysis._MEMO)
    del steps, twin, calls
    gc.collect()
    assert len(analysis._MEMO) <= held - 5  # the three records' curves and depths (the twin's depth never asked)


def test_the_session_curve_is_the_rounds_curves_summed_budget_by_budget():
    """session_budget_curve (the rounds' curves summed as arrays, grouped by length) against the definition: at
    every b, each round's capped curve at b, or past its end what it holds there; rounds of several tree sizes,
    rounds the session stopped inside, a round with no curve, and a budget past every round's and short of it."""
    rng = random.Random(3)
    steps = []
    for i in range(40):
        size = rng.choice([2, 5, 9, 17])
        path = [0] + list(range(1, rng.randrange(1, size) + 1))
        step = record(path, list(range(size)))
        if i % 7 == 3:  # stopped inside its walk: kept one token
            step = dataclasses.replace(step, new_token_ids=(7,))
        if i == 11:  # a tree of the root alone: an empty curve, holding what it kept
            step = record([0], [0])
            assert analysis.recorded_curve(step) == {} and step.kept == 1
        steps.append(step)

    def at(step, b):
        curve = {k: min(v, step.kept) for k, v in analysis.recorded_curve(step).items()}
        return curve[b] if b in curve else (curve[max(curve)] if curve else step.kept)

    for budget in (None, 6, 30):
        total = analysis.session_budget_curve(steps, budget)
        top = budget or max(max(analysis.recorded_curve(s), default=0) for s in steps)
        assert sorted(total) == list(range(1, top + 1))
        assert all(total[b] == sum(at(s, b) for s in steps) for b in total)
    assert analysis.session_budget_curve([]) == {}


def test_session_figures_on_a_real_session(hybrid):
    session = oracle_session(hybrid, PROMPTS[0], budget=12, ranks=[0, 1, 0, 2])
    session.run()
    steps = session.history
    hist = analysis.acceptance_histogram(steps, session.block_size)
    assert len(hist) == session.block_size and sum(hist) == len(steps)
    # by tokens kept: the histogram's mean is the headline's tokens per round, a cut last round at what it kept
    assert steps[-1].cut, "the session should end inside a walk (the case the histogram once counted uncut)"
    assert sum(n * c for n, c in enumerate(hist)) == sum(s.kept - 1 for s in steps) < sum(s.acceptance - 1 for s in steps)
    assert sum((n + 1) * c for n, c in enumerate(hist)) / sum(hist) == sum(s.kept for s in steps) / len(steps)
    rates = analysis.per_depth_acceptance(steps, session.block_size)
    assert len(rates) == session.block_size - 1 and all(r is None or 0 <= r <= 1 for r in rates)
    total = analysis.session_budget_curve(steps)
    assert total[12] == sum(s.kept for s in steps)  # #26.4: kept, was the walk
    assert all(total[b] <= total[b + 1] for b in range(1, 12)) and total[1] >= len(steps)
    summary = analysis.session_analysis(steps, session.block_size)
    json.dumps(summary)
    assert summary["budget_curve"]["12"] == total[12] and summary["budget_curve_exact"]


# -- why did the round stop there ---------------------------------------------------------------------------


def test_stop_info_names_each_reason(hybrid):
    # the true token always at rank 5: a budget of 4 never drafts it (grid k = 4); 12 drafts it but the
    # root's best-first budget goes down rank 0's subtree first
    cases = [
        (dict(budget=4, ranks=[5]), analysis.STOP_NOT_DRAFTED),
        (dict(budget=12, ranks=[5]), analysis.STOP_NOT_TAKEN),
        (dict(budget=1, ranks=[0]), analysis.STOP_TREE_ENDED),
        (dict(budget=64, ranks=[0]), analysis.STOP_BLOCK_END),
    ]
    for kw, reason in cases:
        session = oracle_session(hybrid, PROMPTS[0], **kw)
        step = session.step()
        info = analysis.stop_info(step)
        assert info["reason"] == reason, (kw, info)
        assert info["depth"] == step.acceptance and info["target_token_id"] == step.bonus_token_id
        assert info["sibling_rank"] is None  # an exact walk stops only where no child holds the choice
        if reason == analysis.STOP_NOT_DRAFTED:
            assert info["target_draft_rank"] == analysis.NOT_DRAFTED and info["target_vocab_rank"] == 5
        if reason == analysis.STOP_NOT_TAKEN:
            assert info["target_draft_rank"] == 5 and info["siblings"]
            assert info["drafter_top_id"] == step.draft_top_ids[info["depth"] - 1][0]
        if reason == analysis.STOP_BLOCK_END:
            assert info["target_draft_rank"] is None and step.acceptance == session.block_size


def test_target_top_k_is_the_targets_distribution_at_each_node(hybrid):
    session = oracle_session(hybrid, PROMPTS[1], budget=8, ranks=[1, 0])
    root = session.generated[-1]
    step = session.step()
    assert len(step.target_top_ids) == len(step.nodes) and all(len(r) == 5 for r in step.target_top_ids)
    assert [r[0] for r in step.target_top_ids] == list(step.target_argmax)
    # the root's top-k against the target's own forward over prompt + root
    ids = torch.tensor([session.prompt_ids + [root]])
    probs = torch.softmax(hybrid.target(input_ids=ids).logits[0, -1].float(), -1)
    top = torch.topk(probs, 5)
    assert list(step.target_top_ids[0]) == top.indices.tolist()
    assert np.allclose(step.target_top_probs[0], top.values.tolist(), atol=1e-4)
    # the drafter's grid: k = min(budget, cap) per drafted depth, sorted, holding every tree node at its rank
    assert len(step.draft_top_ids) == session.block_size - 1 and all(len(r) == 8 for r in step.draft_top_ids)
    assert all(list(r) == sorted(r, reverse=True) for r in step.draft_top_logprobs)
    for n in step.nodes[1:]:
        assert step.draft_top_ids[n.depth - 1][n.rank] == n.token_id
    # the node inspector's view of an accepted node and of a rejected sibling
    acc = analysis.node_info(step, step.accepted[1])
    assert acc["node_is_choice"] and acc["accepted"] and acc["path"] == [0, step.accepted[1]]
    assert acc["target_choice_at_parent"] == acc["token_id"] == acc["target_top"][0][0]
    assert acc["choice_sibling_rank"] == 1  # ranks [1, 0]: depth 1 holds the true token at rank 1
    assert acc["choice_draft_rank"] == 1 and acc["draft_rank"] == 1
    assert acc["target_margin_at_parent"] == step.target_margin[0] > 0
    other = analysis.node_info(step, next(n.id for n in step.nodes if n.depth == 1 and n.rank == 0))
    assert not other["node_is_choice"] and other["choice_sibling_rank"] == 1
    assert other["target_prob_of_node"] is None or other["target_prob_of_node"] < acc["target_top"][0][1]
    root_info = analysis.node_info(step, 0)
    assert root_info["target_top"] == [] and root_info["target_choice_here"] == step.choices[0]


def test_nothing_extra_without_recording(hybrid):
    session = oracle_session(hybrid, PROMPTS[0], budget=8, ranks=[0], record=False)
    step = session.step()
    assert not step.target_top_ids and not step.draft_top_ids and not step.budget_curve
    assert analysis.recorded_curve(step)[8] == step.acceptance  # computed from the path when not recorded


def test_traces_carry_the_new_fields_and_old_ones_still_load(hybrid, tmp_path):
    session = oracle_session(hybrid, PROMPTS[0], budget=6, ranks=[0, 1])
    session.run(max_steps=2)
    trace = session.to_trace()
    data = json.loads(trace.to_json())
    step = data["steps"][0]
    assert set(step["budget_curve"]) == {str(b) for b in range(1, 7)}
    assert Trace.from_json(trace.to_json()) == trace
    for names in (("target_top_ids", "target_top_probs"), ("draft_top_ids", "draft_top_logprobs"), ("budget_curve",)):
        old = json.loads(trace.to_json())
        for s in old["steps"]:
            for name in names:
                del s[name]
        Trace.from_json(json.dumps(old))  # written before these fields existed: loads
    bad = json.loads(trace.to_json())
    bad["steps"][0]["target_top_probs"] = bad["steps"][0]["target_top_probs"][:-1]
    with pytest.raises(TraceError, match="target_top_probs"):
        Trace.from_json(json.dumps(bad))
    bad = json.loads(trace.to_json())
    bad["steps"][0]["budget_curve"] = {"one": 1}
    with pytest.raises(TraceError, match="budget_curve"):
        Trace.from_json(json.dumps(bad))
    assert to_plain(trace.steps[0])["budget_curve"] == step["budget_curve"]

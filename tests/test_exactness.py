"""Invariants 1, 3 and 4 on real (tiny, random-weight) transformers models, float32 on the CPU.

1. exact mode output == the target's own greedy output, token for token;
3. after every round the committed cache == greedy's cache after the same tokens (KV rows, conv, recurrent);
4. naive mode reproduces the flattened-tree bug on a hybrid target and is harmless on a pure-attention one.
"""

import pytest
import torch
from transformers import DynamicCache

from ddtree_viz.engine.oracle import OracleProposer
from ddtree_viz.engine.reference import greedy_decode
from ddtree_viz.engine.session import DecodeSession
from tests.tiny import tiny_pair

# These invariants are checked on transformers' forward with the tree-exact GDN swapped in (the reference path).
# Sessions default to the fastest exact engine (the static runner on a hybrid target), so the engine is named here;
# the runner's own checks are in tests/test_runner.py.
ENGINE = "transformers"
PROMPTS = ["def fibonacci(n):\n", "The quick brown fox", "x = [i * i for i in range(10)]\n# "]
MAX_NEW = 40


@pytest.fixture(scope="module")
def hybrid():
    return tiny_pair("hybrid", seed=0)


@pytest.fixture(scope="module")
def attention():
    return tiny_pair("attention", seed=0)


def greedy_ids(pair, prompt):
    ids = pair.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return ids, greedy_decode(pair.target, ids, MAX_NEW, pair.eos_token_ids).ids


@pytest.mark.parametrize("budget", [1, 4, 16, 64])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_exact_ddtree_equals_greedy_with_the_dflash_drafter(hybrid, budget, prompt):
    session = DecodeSession.of(hybrid, budget=budget, max_new_tokens=MAX_NEW, engine=ENGINE)
    session.prefill(prompt)
    session.run()
    assert session.divergence() == (None, None)
    assert tuple(session.generated) == session.greedy().ids


ORACLE_RANKS = [[0], [1], [0, 2, 1, 0], [3, 0]]


@pytest.mark.parametrize("budget", [1, 4, 16, 64])
@pytest.mark.parametrize("ranks", ORACLE_RANKS)
def test_exact_ddtree_equals_greedy_with_an_oracle_drafter(hybrid, budget, ranks):
    prompt = PROMPTS[0]
    ids, greedy = greedy_ids(hybrid, prompt)
    oracle = OracleProposer(greedy, len(ids), ranks, hybrid.target.config.vocab_size)
    session = DecodeSession.of(hybrid, budget=budget, max_new_tokens=MAX_NEW, proposer=oracle, engine=ENGINE)
    session.prefill(prompt)
    session.run()
    assert tuple(session.generated) == greedy
    # the oracle's true token is inside the tree whenever the budget reaches it: long paths get accepted
    if budget >= 16:  # the true token sits in the tree, so every round accepts drafts, deep ones at rank 0
        assert min(r.acceptance for r in session.history[:-1]) >= 2
        if ranks == [0]:
            assert session.mean_acceptance >= 5


def greedy_cache_feed(pair, cache, tokens):
    with torch.no_grad():
        for t in tokens:
            pair.target(input_ids=torch.tensor([[t]]), cache=cache, use_cache=True)


def assert_caches_equal(ours, theirs, prefix_len):
    for idx, (a, b) in enumerate(zip(ours.layers, theirs.layers)):
        if hasattr(a, "recurrent_states"):
            torch.testing.assert_close(a.conv_states[0], b.conv_states[0], atol=1e-5, rtol=1e-4, msg=f"conv layer {idx}")
            torch.testing.assert_close(a.recurrent_states[0], b.recurrent_states[0], atol=1e-5, rtol=1e-4, msg=f"state layer {idx}")
        else:
            assert a.keys.shape[-2] == b.keys.shape[-2] == prefix_len
            torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-4, msg=f"keys layer {idx}")
            torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=1e-4, msg=f"values layer {idx}")


@pytest.mark.parametrize("method,budget,ranks", [("ddtree", 16, [0, 1]), ("ddtree", 64, [2, 0]), ("dflash", 1, [0])])
def test_committed_cache_equals_greedy_cache_after_every_round(hybrid, method, budget, ranks):
    prompt = PROMPTS[1]
    ids, greedy = greedy_ids(hybrid, prompt)
    oracle = OracleProposer(greedy, len(ids), ranks, hybrid.target.config.vocab_size, seed=7)
    session = DecodeSession.of(hybrid, budget=budget, max_new_tokens=MAX_NEW, proposer=oracle, method=method, engine=ENGINE)
    session.prefill(prompt)
    ref = DynamicCache(config=hybrid.target.config)
    with torch.no_grad():
        hybrid.target(input_ids=torch.tensor([ids]), cache=ref, use_cache=True)
    fed = 0
    while not session.done:
        record = session.step()
        committed = session.committed_len - len(ids)  # generated tokens now inside the target cache
        greedy_cache_feed(hybrid, ref, session.generated[fed:committed])
        fed = committed
        assert_caches_equal(session.cache, ref, session.committed_len)
        assert record.cache[0].type == "linear_attention" and record.cache[3].type == "full_attention"
        assert record.cache[3].kv_length == session.committed_len
        assert record.cache_before_commit[3].kv_length == record.committed_len + len(record.nodes)
    assert tuple(session.generated) == greedy


def test_fast_and_reference_gdn_give_the_same_rounds(hybrid):
    records = []
    for reference in (False, True):
        session = DecodeSession.of(hybrid, budget=12, max_new_tokens=24, reference_gdn=reference, engine=ENGINE)
        session.prefill(PROMPTS[2])
        session.run()
        records.append([(r.accepted, r.target_argmax, r.bonus_token_id) for r in session.history])
    assert records[0] == records[1]


def test_dflash_chain_equals_greedy(hybrid):
    session = DecodeSession.of(hybrid, method="dflash", max_new_tokens=MAX_NEW, engine=ENGINE)
    session.prefill(PROMPTS[0])
    session.run()
    assert tuple(session.generated) == session.greedy().ids
    assert all(len(r.nodes) == session.block_size for r in session.history)


def sibling_oracle(pair, prompt, ranks=(1,)):
    """True token always at rank 1: its rank-0 sibling comes first in the flattened tree, so a flattened GDN
    pass lets the sibling leak into the true branch's state."""
    ids, greedy = greedy_ids(pair, prompt)
    return OracleProposer(greedy, len(ids), list(ranks), pair.target.config.vocab_size, seed=3), greedy


def test_naive_mode_diverges_on_a_hybrid_target(hybrid):
    oracle, greedy = sibling_oracle(hybrid, PROMPTS[0])
    naive = DecodeSession.of(hybrid, budget=16, max_new_tokens=MAX_NEW, verify="naive", proposer=oracle, engine=ENGINE)
    naive.prefill(PROMPTS[0])
    naive.run()
    index, margin = naive.divergence()
    assert index is not None and tuple(naive.generated) != greedy
    assert margin is not None and margin >= 0
    assert all(r.verify == "naive" for r in naive.history)
    # same drafts, exact mode: identical
    oracle, _ = sibling_oracle(hybrid, PROMPTS[0])
    exact = DecodeSession.of(hybrid, budget=16, max_new_tokens=MAX_NEW, proposer=oracle, engine=ENGINE)
    exact.prefill(PROMPTS[0])
    exact.run()
    assert tuple(exact.generated) == greedy


@pytest.mark.parametrize("verify", ["naive", "exact"])
def test_pure_attention_target_is_exact_in_both_modes(attention, verify):
    oracle, greedy = sibling_oracle(attention, PROMPTS[0])
    session = DecodeSession.of(attention, budget=16, max_new_tokens=MAX_NEW, verify=verify, proposer=oracle, engine=ENGINE)
    session.prefill(PROMPTS[0])
    session.run()
    assert tuple(session.generated) == greedy
    random_drafts = DecodeSession.of(attention, budget=8, max_new_tokens=MAX_NEW, verify=verify, engine=ENGINE)
    random_drafts.prefill(PROMPTS[1])
    random_drafts.run()
    assert random_drafts.divergence() == (None, None)


def test_stops_at_max_new_tokens_and_counts_tokens(hybrid):
    session = DecodeSession.of(hybrid, budget=8, max_new_tokens=7, engine=ENGINE)
    session.prefill(PROMPTS[0])
    session.run()
    assert len(session.generated) == 7 and session.done
    assert 1 + sum(len(r.new_token_ids) for r in session.history) == 7


def test_naive_mode_reports_how_far_its_state_drifts(hybrid):
    oracle, _ = sibling_oracle(hybrid, PROMPTS[0])
    naive = DecodeSession.of(hybrid, budget=16, max_new_tokens=16, verify="naive", proposer=oracle, engine=ENGINE)
    naive.prefill(PROMPTS[0])
    record = naive.step()
    errors = record.naive_state_error
    assert len(errors) == hybrid.target.config.num_hidden_layers
    assert errors[3] is None  # attention layer: nothing recurrent
    assert max(e for e in errors if e is not None) > 1e-3  # the flattened tree leaked into the state
    exact = DecodeSession.of(hybrid, budget=16, max_new_tokens=16, engine=ENGINE)
    exact.prefill(PROMPTS[0])
    assert exact.step().naive_state_error == ()


def test_records_how_the_drafter_ranked_the_bonus_token(hybrid):
    ids, greedy = greedy_ids(hybrid, PROMPTS[0])
    ranks = [3, 0, 2]
    oracle = OracleProposer(greedy, len(ids), ranks, hybrid.target.config.vocab_size)
    session = DecodeSession.of(hybrid, budget=2, max_new_tokens=20, proposer=oracle, engine=ENGINE)
    session.prefill(PROMPTS[0])
    session.run()
    for r in session.history[:-1]:
        position = r.committed_len + len(r.accepted)  # where the bonus token sits
        assert r.bonus_draft_rank == ranks[position % len(ranks)]
        assert r.bonus_draft_logprob is not None and r.bonus_draft_logprob < 0


@pytest.mark.parametrize("engine", ["transformers", "runner"])
def test_records_the_targets_margin_and_top_tokens_at_each_position(hybrid, engine):
    """A round's target_margin (the gap between the target's two best logits) and its top tokens at each tree
    position, against the target's own forward over the prompt and the round's chain (DFlash's tree is a chain, so
    a plain causal pass sees what the verify saw), on both engines."""
    session = DecodeSession.of(hybrid, budget=4, max_new_tokens=12, method="dflash", engine=engine)
    session.prefill(PROMPTS[0])
    prompt_ids = list(session.prompt_ids)
    record = session.step()
    chain = [n.token_id for n in record.nodes]  # the root (the prefill's token) first
    with torch.no_grad():
        logits = hybrid.target(torch.tensor([prompt_ids + chain])).logits[0, -len(chain):].float()
    top = torch.topk(logits, 5, dim=-1)
    margins = top.values[:, 0] - top.values[:, 1]
    torch.testing.assert_close(torch.tensor(record.target_margin), margins, rtol=0, atol=1e-4)
    assert [list(row[:2]) for row in record.target_top_ids] == top.indices[:, :2].tolist()

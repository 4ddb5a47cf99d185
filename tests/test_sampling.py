"""Sampling (T > 0) with position-keyed noise (engine/sampling.py, docs/SAMPLING.md), float32 on the CPU.

Invariant 1 at T > 0: DDTree (exact) == the target's own position-keyed sampling with the same seed, token for
token, on the tiny hybrid and on the embedded pair; the sampler draws correct samples (chi-square against
softmax(logits / T)); seeds reproduce and differ; T -> 0 is greedy; naive mode still shows the hybrid-cache bug.
"""

import math

import pytest
import torch

from ddtree_viz.engine.engines import RunnerEngine
from ddtree_viz.engine.oracle import OracleProposer
from ddtree_viz.engine.sampling import GREEDY, NOISE_SCHEME, Sampler, gumbel_noise, mix32
from ddtree_viz.engine.reference import EngineGreedy, GreedyReference, greedy_decode
from ddtree_viz.engine.session import DecodeSession
from ddtree_viz.errors import InputError
from ddtree_viz.trace import Trace, is_sampled, sampling_flags, sampling_label
from tests.tiny import tiny_pair

PROMPTS = ["def fibonacci(n):\n", "The quick brown fox"]
MAX_NEW = 32
SAMPLERS = [Sampler(0.7, seed=2), Sampler(1.0, seed=3), Sampler(1.0, top_k=20, top_p=0.9, seed=4),
            Sampler(1.5, top_p=0.8, seed=5)]  # seeds whose samples run to MAX_NEW tokens on both prompts


@pytest.fixture(scope="module")
def hybrid():
    return tiny_pair("hybrid", seed=0)


@pytest.fixture(scope="module")
def embedded():
    from ddtree_viz.engine.models import load_pair

    return load_pair()


def prompt_ids(pair, prompt):
    return pair.tokenizer(prompt, add_special_tokens=False)["input_ids"]


def sampled(pair, prompt, sampler, n=MAX_NEW):
    return greedy_decode(pair.target, prompt_ids(pair, prompt), n, pair.eos_token_ids, sampler=sampler).ids


def decode(pair, prompt, sampler, **kw):
    session = DecodeSession.of(pair, max_new_tokens=kw.pop("max_new_tokens", MAX_NEW), sampler=sampler, **kw)
    session.prefill(prompt)
    session.run()
    return session


# -- the noise and the sampler ------------------------------------------------------------------------------


def lowbias32(x: int) -> int:
    """The hash as published (Python integers): the specification mix32 must match bit for bit."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_the_hash_is_lowbias32_bit_for_bit():
    values = [0, 1, 2, 3, 255, 65535, 65536, 2**31 - 1, 2**31, 0xDEADBEEF, 2**32 - 1] + list(range(1000, 5000, 7))
    assert mix32(torch.tensor(values)).tolist() == [lowbias32(v) for v in values]


def test_noise_depends_on_seed_and_position_only():
    a = gumbel_noise(5, torch.tensor([10, 11, 10]), 300)
    assert torch.equal(a[0], a[2]) and not torch.equal(a[0], a[1])
    assert torch.equal(a[1], gumbel_noise(5, torch.tensor([11]), 300)[0])  # not on the batch it came in
    assert not torch.equal(a[0], gumbel_noise(6, torch.tensor([10]), 300)[0])
    many = gumbel_noise(0, torch.arange(64), 4096).double()
    assert abs(float(many.mean()) - 0.5772) < 0.01 and abs(float(many.std()) - math.pi / math.sqrt(6)) < 0.01


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])


@pytest.mark.parametrize("sampler", [Sampler(0.8), Sampler(1.0, top_k=5), Sampler(1.3, top_p=0.7)],
                         ids=["T0.8", "T1-topk5", "T1.3-topp0.7"])
def test_frequencies_at_one_position_match_the_filtered_softmax(sampler):
    """The token chosen at one position over seeds 0..2999 (a fixed set: the test cannot flake) is distributed
    as softmax(filtered(logits / T)); filtered tokens never come up. 99.99% of chi-square(7) lies below 27.9."""
    seeds = range(3000)
    tokens = torch.stack([Sampler(sampler.temperature, sampler.top_k, sampler.top_p, s).choose(LOGITS[None], [17])[0]
                          for s in seeds])
    counts = torch.bincount(tokens, minlength=len(LOGITS)).double()
    probs = torch.softmax(sampler.tempered(LOGITS[None])[0], -1).double()
    kept = probs > 0
    assert counts[~kept].sum() == 0
    assert chi_square(counts[kept], probs[kept]) < 30
    assert 0 < kept.sum() <= (sampler.top_k or len(LOGITS))
    # along the positions of one seed, too (the noise of each position is a fresh draw)
    along = sampler.choose(LOGITS[None].expand(3000, -1), torch.arange(3000))
    assert chi_square(torch.bincount(along, minlength=len(LOGITS)).double()[kept], probs[kept]) < 30


def test_filters_keep_the_smallest_top_p_set_and_the_top_k():
    z = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    probs = torch.softmax(z, -1)[0]
    p = float(probs[0] + probs[1]) - 1e-4  # the two best reach p; the third is not needed
    assert torch.isfinite(Sampler(1.0, top_p=p).tempered(z)[0]).tolist() == [True, True, False, False, False]
    assert torch.isfinite(Sampler(1.0, top_k=3).tempered(z)[0]).tolist() == [True, True, True, False, False]
    assert torch.isfinite(Sampler(1.0, top_p=1e-9).tempered(z)[0]).sum() == 1  # the best token always stays
    tied = torch.tensor([[1.0, 1.0, 0.0]])
    assert torch.isfinite(Sampler(1.0, top_k=1).tempered(tied)[0]).tolist() == [True, True, False]  # ties kept


def test_greedy_sampler_is_the_argmax_path():
    logits = torch.randn(5, 50)
    assert torch.equal(GREEDY.scores(logits, [0] * 5), logits)
    assert torch.equal(GREEDY.choose(logits, range(5)), logits.argmax(-1))
    assert GREEDY.settings == dict(temperature=0.0, top_k=0, top_p=1.0, seed=0, noise=None)


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.1), dict(temperature=float("nan")), dict(temperature="1"),
                                    dict(temperature=1, top_k=-1), dict(temperature=1, top_k=2.5),
                                    dict(temperature=1, top_p=0), dict(temperature=1, top_p=1.2),
                                    dict(temperature=1, seed=-1), dict(temperature=1, seed=2**32),
                                    dict(temperature=1, seed=True)])
def test_bad_sampling_settings_are_input_errors(kwargs):
    with pytest.raises(InputError):
        Sampler(**kwargs)


# -- DDTree == the target's own sampling ------------------------------------------------------------------


@pytest.mark.parametrize("budget", [1, 4, 16, 64])
@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: sampling_label(s.settings))
def test_ddtree_equals_the_targets_own_sampling_with_an_oracle_drafter(hybrid, sampler, budget):
    """The oracle drafts the reference's sampled tokens at ranks 0, 0, 1, ..., so long paths are accepted: DDTree's
    walk chooses with the same noise at the same positions as plain decoding, token for token."""
    prompt = PROMPTS[0]
    reference = sampled(hybrid, prompt, sampler)
    assert len(reference) == MAX_NEW
    oracle = OracleProposer(reference, len(prompt_ids(hybrid, prompt)), [0, 0, 1], hybrid.target.config.vocab_size)
    session = decode(hybrid, prompt, sampler, budget=budget, proposer=oracle)
    assert tuple(session.generated) == reference
    assert session.divergence() == (None, None)
    if budget >= 16:
        assert session.mean_acceptance > 3


@pytest.mark.parametrize("budget", [4, 32])
@pytest.mark.parametrize("sampler", SAMPLERS[:3], ids=lambda s: sampling_label(s.settings))
def test_ddtree_and_dflash_equal_the_targets_own_sampling_with_the_dflash_drafter(hybrid, sampler, budget):
    for prompt in PROMPTS:
        reference = sampled(hybrid, prompt, sampler)
        for method in ("ddtree", "dflash"):
            session = decode(hybrid, prompt, sampler, budget=budget, method=method)
            assert tuple(session.generated) == reference, method


def test_the_walk_follows_the_sample_and_records_it(hybrid):
    sampler = SAMPLERS[2]
    prompt = PROMPTS[1]
    reference = sampled(hybrid, prompt, sampler)
    oracle = OracleProposer(reference, len(prompt_ids(hybrid, prompt)), [1, 0], hybrid.target.config.vocab_size)
    session = decode(hybrid, prompt, sampler, budget=16, proposer=oracle)
    assert any(r.target_choice != r.target_argmax for r in session.history)  # sampling changed some choices
    for r in session.history:
        n = len(r.nodes)
        assert len(r.target_choice) == len(r.target_prob) == n and r.choices == r.target_choice
        assert r.bonus_token_id == r.target_choice[r.accepted[-1]]
        for a, b in zip(r.accepted, r.accepted[1:]):  # each accepted child holds its parent's sampled token
            assert r.nodes[b].token_id == r.target_choice[a]
        assert all(0 < p <= 1 for p in r.target_prob)
    trace = session.to_trace()
    assert trace.settings["temperature"] == 1.0 and trace.settings["top_k"] == 20 and trace.settings["top_p"] == 0.9
    assert trace.settings["seed"] == 4 and trace.settings["noise"] == NOISE_SCHEME
    assert trace.greedy_ids == reference and trace.first_divergence is None
    again = Trace.from_json(trace.to_json())
    assert again == trace and is_sampled(again.settings)
    assert sampling_flags(again.settings) == "--temperature 1 --top-k 20 --top-p 0.9 --seed 4"


def test_the_probability_recorded_is_the_samplers(hybrid):
    sampler = Sampler(0.9, top_k=30, seed=8)
    session = DecodeSession.of(hybrid, budget=8, max_new_tokens=MAX_NEW, sampler=sampler)
    session.prefill(PROMPTS[0])
    record = session.step()
    ids = torch.tensor([prompt_ids(hybrid, PROMPTS[0]) + [record.root_token_id]])  # the root's logits, afresh
    with torch.no_grad():
        logits = hybrid.target(input_ids=ids).logits[0, -1:].float()
    dist = torch.softmax(sampler.tempered(logits), -1)[0]
    root_choice = record.target_choice[0]
    assert math.isclose(record.target_prob[0], float(dist[root_choice]), rel_tol=1e-4)
    assert root_choice == int(sampler.choose(logits, [record.committed_len + 1])[0])


def test_same_seed_same_output_other_seeds_other_outputs(hybrid):
    runs = {seed: tuple(decode(hybrid, PROMPTS[0], Sampler(1.0, seed=seed), budget=8).generated) for seed in (11, 12, 13)}
    assert tuple(decode(hybrid, PROMPTS[0], Sampler(1.0, seed=11), budget=8).generated) == runs[11]
    assert len(set(runs.values())) == 3


def test_a_vanishing_temperature_is_greedy(hybrid):
    for prompt in PROMPTS:
        ids = prompt_ids(hybrid, prompt)
        greedy = GreedyReference(hybrid.target, ids, hybrid.eos_token_ids).extend_to(MAX_NEW)
        assert min(greedy.margins) > 1e-3  # no near-tie that noise x 1e-6 could flip
        for seed in (0, 1):
            session = decode(hybrid, prompt, Sampler(1e-6, seed=seed), budget=8)
            assert tuple(session.generated) == greedy.ids
        assert sampled(hybrid, prompt, Sampler(2.0, top_k=1, seed=5)) == greedy.ids  # one token left: the argmax


def test_sampling_through_the_engine_and_the_runner_equals_transformers(hybrid):
    sampler = SAMPLERS[1]
    ids = prompt_ids(hybrid, PROMPTS[0])
    reference = sampled(hybrid, PROMPTS[0], sampler)
    engine = RunnerEngine(hybrid.target, hybrid.drafter.target_layer_ids, tree_size=17, block_size=8, max_new_tokens=MAX_NEW)
    assert EngineGreedy(engine, ids, hybrid.eos_token_ids, sampler=sampler).extend_to(MAX_NEW).ids == reference
    oracle = OracleProposer(reference, len(ids), [0, 1], hybrid.target.config.vocab_size)
    session = decode(hybrid, PROMPTS[0], sampler, budget=16, proposer=oracle, engine="runner", record=False)
    assert tuple(session.generated) == reference and session.mean_acceptance > 3


def test_naive_mode_still_diverges_when_sampling(hybrid):
    """The true (sampled) token always at rank 1: its rank-0 sibling leaks into its GDN state in a flattened pass."""
    sampler = SAMPLERS[0]
    reference = sampled(hybrid, PROMPTS[0], sampler, n=40)
    n = len(prompt_ids(hybrid, PROMPTS[0]))
    runs = {}
    for verify in ("naive", "exact"):
        oracle = OracleProposer(reference, n, [1], hybrid.target.config.vocab_size, seed=3)
        runs[verify] = decode(hybrid, PROMPTS[0], sampler, budget=16, max_new_tokens=40, verify=verify, proposer=oracle)
    assert tuple(runs["exact"].generated) == reference
    index, _ = runs["naive"].divergence()
    assert index is not None and tuple(runs["naive"].generated) != reference


# -- the embedded pair ------------------------------------------------------------------------------------


_TARGETS_OWN: dict = {}  # (prompt, sampler, n) -> the embedded target's own sampled ids, the same at every budget


def targets_own(pair, prompt, sampler, n):
    """sampled(): transformers' forward token by token, made once for both budgets of the test below (~1 s each)."""
    key = (prompt, sampler, n)
    if key not in _TARGETS_OWN:
        _TARGETS_OWN[key] = sampled(pair, prompt, sampler, n)
    return _TARGETS_OWN[key]


@pytest.mark.parametrize("budget", [4, 32])
@pytest.mark.parametrize("sampler", [Sampler(0.7, seed=1), Sampler(1.0, seed=2), Sampler(1.0, top_p=0.9, seed=7)],
                         ids=lambda s: sampling_label(s.settings))
def test_ddtree_equals_the_targets_own_sampling_on_the_embedded_pair(embedded, sampler, budget):
    """The trained drafter drafts for real (acceptance > 1 even when sampling) and the output is the target's own
    sampled output (transformers' forward, same seed), token for token."""
    for prompt in ("class Stack:\n    def __init__(self):\n", "for i, line in enumerate(lines):\n"):
        session = decode(embedded, prompt, sampler, budget=budget, max_new_tokens=48)
        assert session.divergence() == (None, None)
        assert tuple(session.generated) == targets_own(embedded, prompt, sampler, 48)
        assert session.mean_acceptance > 1.2


def test_seeds_on_the_embedded_pair(embedded):
    prompt = "def read_config(path):\n    with open(path) as f:\n"
    outputs = [tuple(decode(embedded, prompt, Sampler(1.0, seed=s), budget=16).generated) for s in (1, 2, 1)]
    assert outputs[0] == outputs[2] and outputs[0] != outputs[1]


# -- what the renderers make of a sampled session ---------------------------------------------------------


def test_sampled_records_render_the_sample_and_escape_its_text(hybrid):
    from ddtree_viz.render.diff_view import output_vs_greedy_html
    from ddtree_viz.render.divergence_view import divergence_html, divergence_rows
    from ddtree_viz.render.layout import tree_layout
    from ddtree_viz.render.stats_view import stats_markdown, stats_summary
    from ddtree_viz.render.text import esc
    from ddtree_viz.render.tree_plot import tree_figure
    from tests.test_render import EVIL, all_strings, assert_no_raw_html, assert_only_our_tags, evil_trace

    sampler = SAMPLERS[2]
    reference = sampled(hybrid, PROMPTS[1], sampler)
    oracle = OracleProposer(reference, len(prompt_ids(hybrid, PROMPTS[1])), [1, 0], hybrid.target.config.vocab_size)
    trace = decode(hybrid, PROMPTS[1], sampler, budget=16, proposer=oracle).to_trace()
    step = next(s for s in trace.steps if s.target_choice != s.target_argmax)
    hover = all_strings(tree_figure(tree_layout(step)).to_plotly_json())
    assert any("target sample: id" in h and "(p 0." in h for h in hover)
    assert any("its sample, p" in h for h in hover)  # the bonus node
    drafted = all_strings(tree_figure(tree_layout(step, phase="drafted")).to_plotly_json())
    assert not any("target sample" in h for h in drafted)
    html = output_vs_greedy_html(trace)
    assert "identical to sampled reference for 32 tokens" in html and "T 1, top-k 20, top-p 0.9, seed 4" in html
    assert esc("bonus token (target's sample)") in html and "argmax" not in html
    assert "sampled at p 0." in divergence_html(divergence_rows(trace.steps))
    assert "sampling (T 1, top-k 20, top-p 0.9, seed 4)" in stats_markdown(stats_summary(trace))
    evil, text = evil_trace(trace)
    for s in evil.steps[:4]:
        assert_no_raw_html(all_strings(tree_figure(tree_layout(s, token_text=text), token_text=text).to_plotly_json()))
    hostile = output_vs_greedy_html(evil, text)
    assert_no_raw_html([hostile])
    assert_only_our_tags(hostile)
    assert_only_our_tags(divergence_html(divergence_rows(evil.steps, text)))
    assert any("target sample: id" in h and EVIL[0] not in h for h in
               all_strings(tree_figure(tree_layout(evil.steps[0], token_text=text), token_text=text).to_plotly_json()))


def test_old_traces_without_sampling_fields_load_as_greedy(hybrid):
    """Traces written before sampling existed have no target_choice / target_prob / sampling settings: they load,
    and read as greedy. A sampled step with a wrong-length target_choice is refused."""
    import json

    from ddtree_viz.errors import TraceError

    session = decode(hybrid, PROMPTS[0], GREEDY, budget=4, max_new_tokens=8)
    data = json.loads(session.to_trace().to_json())
    for key in ("temperature", "top_k", "top_p", "seed", "noise"):
        del data["settings"][key]
    for step in data["steps"]:
        del step["target_choice"], step["target_prob"]
    old = Trace.from_json(json.dumps(data))
    assert sampling_label(old.settings) == "greedy" and all(s.choices == s.target_argmax for s in old.steps)
    data["steps"][0]["target_choice"] = [1]
    with pytest.raises(TraceError, match="target_choice has 1 entry for"):
        Trace.from_json(json.dumps(data))

"""The reference a session is compared with, and the verdict on a divergence (docs/EXACTNESS.md, "Noise or bug").

- A runner session's reference decodes on a second static runner that starts from a copy of the session's state
  after the prefill; it equals transformers' own greedy (float32), and transformers' forward stays available as
  the independent check (`reference="transformers"`, `check_transformers()`), with its own time.
- The reference measures its own numerical noise (a multi-position pass against the one-token passes over the
  same prefixes); a divergence is 'noise' when the reference's margin there is at most that noise, else
  'mismatch'. Both cases are forced: a float32 naive (known-wrong) run is a mismatch, a bf16 near-tie is noise.
"""

import pytest
import torch

from ddtree_viz.engine.engines import RunnerEngine, TransformersEngine
from ddtree_viz.engine.models import ModelPair
from ddtree_viz.engine.oracle import OracleProposer
from ddtree_viz.engine.reference import GreedyReference, greedy_decode
from ddtree_viz.engine.session import DecodeSession
from ddtree_viz.engine.timing import PhaseClock
from ddtree_viz.engine.tree import build_chain, one_node
from ddtree_viz.trace import Trace, verdict_text
from tests.tiny import tiny_pair

PROMPT = "def fibonacci(n):\n    return"
NEW = 32


@pytest.fixture(scope="module")
def pair():
    return tiny_pair("hybrid", seed=0)


def prompt_ids(pair, text=PROMPT):
    return pair.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_runner_reference_starts_from_a_copy_of_the_session_state(pair):
    """No second prefill: right after the session's prefill the reference's runner holds the same committed state
    in its own tensors; its tokens equal transformers' own greedy; its time is kept apart from the rounds'."""
    session = DecodeSession.of(pair, budget=8, max_new_tokens=NEW, engine="runner")
    session.prefill(PROMPT)
    ref_engine = session.reference_engine
    assert isinstance(ref_engine, RunnerEngine) and ref_engine is not session.target_engine
    mine, theirs = session.target_engine.runner, ref_engine.runner
    assert theirs is not mine and theirs.committed == mine.committed == len(prompt_ids(pair))
    n = mine.committed
    for a, b in ((mine.keys_all[:, :, :n], theirs.keys_all[:, :, :n]), (mine.conv_all, theirs.conv_all),
                 (mine.rec_all, theirs.rec_all)):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    session.run()
    expected = greedy_decode(pair.target, prompt_ids(pair), NEW, pair.eos_token_ids).ids
    assert session.greedy().ids == expected == tuple(session.generated)
    assert session.settings["reference"] == "runner" and session.greedy_seconds > 0
    trace = session.to_trace()
    assert trace.settings["reference"] == "runner" and trace.reference_ms > 0 and not trace.reference_pending
    assert trace.first_divergence is None and trace.divergence_verdict is None


def test_transformers_reference_and_the_independent_check(pair):
    """reference='transformers' runs transformers' own forward whatever the engine; check_transformers() runs it
    beside an engine reference, up to the tokens generated, and reports its own time."""
    session = DecodeSession.of(pair, budget=8, max_new_tokens=NEW, engine="runner", reference="transformers")
    session.prefill(PROMPT)
    assert session.reference_engine is None and session.settings["reference"] == "transformers"
    session.run(max_steps=3)
    assert session.greedy(len(session.generated)).ids == tuple(session.generated)
    engine_ref = DecodeSession.of(pair, budget=8, max_new_tokens=NEW, engine="runner")
    engine_ref.prefill(PROMPT)
    engine_ref.run(max_steps=3)
    result, seconds = engine_ref.check_transformers()
    assert result.ids == tuple(engine_ref.generated) and seconds > 0
    assert engine_ref.check_transformers()[1] == seconds  # nothing new to decode: no time spent
    with pytest.raises(Exception, match="reference"):
        DecodeSession.of(pair, engine="runner", reference="sideways")


@pytest.mark.parametrize("kind", ["transformers", "runner"])
def test_a_discarded_pass_leaves_the_state_as_it_was(pair, kind):
    """The noise control's multi-position pass is forgotten: the next one-token step gives the same logits,
    bit for bit, as without it."""
    ids = prompt_ids(pair)

    def engine():
        if kind == "runner":
            return RunnerEngine(pair.target, None, tree_size=8, block_size=8, max_new_tokens=16)
        return TransformersEngine(pair.target, None)

    plain, probed = engine(), engine()
    token = int(plain.prefill(ids)[0].argmax())
    probed.prefill(ids)
    tree_pass = probed.forward(build_chain(token, [5, 6, 7], [0.0] * 3))
    probed.discard(tree_pass)
    a, b = plain.forward(one_node(token)), probed.forward(one_node(token))
    assert torch.equal(a.logits, b.logits)
    plain.commit(a, [0])
    probed.commit(b, [0])
    assert torch.equal(plain.forward(one_node(3)).logits, probed.forward(one_node(3)).logits)


def test_the_reference_measures_its_own_noise_without_changing_its_tokens(pair):
    """Given a session's tokens, the reference runs chain passes beside its one-token steps: the noise it reports
    is tiny in float32, comes from many positions, and its tokens are those it decodes without the control."""
    ids = prompt_ids(pair)
    plain = GreedyReference(pair.target, ids, pair.eos_token_ids).extend_to(NEW)
    ref = GreedyReference(pair.target, ids, pair.eos_token_ids)
    probed = ref.extend_to(NEW, candidates=plain.ids)
    assert probed.ids == plain.ids and probed.margins == plain.margins
    assert probed.noise is not None and probed.noise < 1e-3 and probed.noise_positions >= NEW // 2
    assert plain.noise is None and plain.noise_positions == 0  # no candidates: no control passes


def sibling_oracle(pair, ids, new):
    """The true token always at rank 1 (tests/test_exactness.py): a flattened GDN pass leaks its rank-0 sibling."""
    greedy = greedy_decode(pair.target, ids, new, pair.eos_token_ids).ids
    return OracleProposer(greedy, len(ids), [1], pair.target.config.vocab_size, seed=3)


def test_a_wrong_verify_in_float32_is_a_mismatch(pair, tmp_path):
    """Naive verification (the known-wrong flattened tree) in float32: the output leaves greedy where greedy's
    margin is far beyond the run's measured noise: 'beyond numerical noise: mismatch', in the trace too."""
    ids = prompt_ids(pair)
    session = DecodeSession.of(pair, budget=16, max_new_tokens=40, verify="naive", proposer=sibling_oracle(pair, ids, 40))
    session.prefill(PROMPT)
    session.run()
    check = session.divergence_check()
    assert check.index is not None and check.verdict == "mismatch"
    assert check.noise is not None and check.noise < 1e-3 < check.margin and check.noise_positions > 0
    assert check.drift is not None and check.drift_positions >= 1  # the rounds before it, compared with greedy
    path = tmp_path / "naive.json"
    session.to_trace().save(path)
    trace = Trace.load(path)
    assert trace.divergence_verdict == "mismatch" and trace.numerical_noise == check.noise
    assert verdict_text(trace).startswith("beyond numerical noise: mismatch (margin ")


@pytest.mark.parametrize("verify", ["exact", "naive"])
def test_the_drift_kept_between_checks_is_the_drift_compared_afresh(pair, verify):
    """A page checks twice a Step (the round shown against the reference as far as it has decoded, then extended):
    the rounds compared in full are kept between checks (check.ReferenceCheck._drift_done). At every check the drift
    and its count equal a comparison of every round from scratch; a session that leaves the reference (naive
    verification) included, where the limit stops at the divergence."""
    ids = prompt_ids(pair)
    session = DecodeSession.of(pair, budget=16, max_new_tokens=40, verify=verify, proposer=sibling_oracle(pair, ids, 40))
    session.prefill(PROMPT)
    seen = []
    while not session.done:
        session.step()
        for extend in (False, True):
            check = session.divergence_check(extend)
            kept = session.check._drift_done
            session.check._drift_done = (None, 0, (), 0)  # from scratch
            afresh = session.divergence_check(extend)
            assert (check.drift, check.drift_positions) == (afresh.drift, afresh.drift_positions)
            session.check._drift_done = kept
            seen.append(check.drift_positions)
    if verify == "exact":
        assert kept[1] > 1 and max(seen) > 1  # rounds were kept, and compared
    else:  # it leaves the reference early: the rounds before the divergence compared
        assert check.index is not None and max(seen) >= 1


def named_ids(session, trace) -> set[int]:
    """Every token id a trace of this session names, from its definition (trace.token_texts's docstring)."""
    ids = set(session.prompt_ids) | set(session.generated) | set(trace.greedy_ids or ())
    for r in session.history:
        ids |= set(r.target_argmax) | set(r.target_choice) | {node.token_id for node in r.nodes}
        ids |= {t for row in r.target_top_ids + r.draft_top_ids for t in row}
    return ids


def test_the_token_texts_kept_as_ids_appear_are_every_id_the_trace_names(pair):
    """to_trace's token texts are kept as the ids appear (DecodeSession._token_texts: a long session's Step no longer
    decodes and sorts every id again). At every check, as a page makes them (the round shown, then the reference
    extended), and through a second prompt on the same session, they are exactly the ids the trace names, each with
    its own text; an earlier trace keeps the texts it was made with."""
    session = DecodeSession.of(pair, budget=16, max_new_tokens=24)
    for text in (PROMPT, "class Stack:\n    def push(self, item):"):
        session.prefill(text)
        traces = []
        while not session.done:
            session.step()
            for extend in (False, True):
                trace = session.to_trace(extend=extend)
                assert set(map(int, trace.token_texts)) == named_ids(session, trace)
                assert all(trace.token_texts[str(i)] == session.token_text(i) for i in named_ids(session, trace))
                traces.append((trace, dict(trace.token_texts)))
        assert len(traces) > 4
        assert all(trace.token_texts == texts for trace, texts in traces)


def test_an_exact_tie_is_noise_whatever_was_measured():
    """A divergence where the reference's top two are equal (margin 0: bf16 logits over a large vocabulary tie
    often) is noise with or without a noise measurement; any other margin needs one, and is judged against it."""
    from ddtree_viz.engine.check import verdict
    from ddtree_viz.trace import VERDICT_MISMATCH, VERDICT_NOISE, verdict_words

    assert verdict(0.0, None) == verdict(0.0, 1e-3) == verdict(1e-3, 1e-3) == VERDICT_NOISE
    assert verdict(0.01, None) is None and verdict(None, 1e-3) is None and verdict(0.01, 1e-3) == VERDICT_MISMATCH
    assert "exact tie" in verdict_words(verdict(0.0, None), 0.0, None, 0)
    assert "exact tie" not in verdict_words(VERDICT_NOISE, 1e-3, 1e-3, 4)


def near_tie_pair(seed=4, flatten=0.25, dtype=torch.bfloat16):
    """The tiny hybrid with flatter logits (near-ties are common), in bf16."""
    pair = tiny_pair("hybrid", seed=seed)
    with torch.no_grad():
        pair.target.get_output_embeddings().weight.mul_(flatten)
    return ModelPair(pair.target.to(dtype), pair.tokenizer, pair.drafter.to(dtype), "near-tie", "d", dtype, "cpu")


def test_a_bf16_near_tie_is_numerical_noise():
    """bf16 on the CPU, tree passes against transformers' one-token forward: the output leaves greedy where the
    top two logits tie within bf16 rounding; the verdict is 'within numerical noise'. The same run in float32
    does not diverge at all."""
    pair = near_tie_pair()
    session = DecodeSession.of(pair, budget=32, max_new_tokens=24, engine="transformers")
    session.prefill("def f(x):\n    return")
    session.run()
    check = session.divergence_check()
    assert check.index is not None and check.verdict == "noise", check
    assert check.margin <= check.noise < 0.05 and check.noise_positions > 0
    assert verdict_text(session.to_trace()).startswith("within numerical noise (margin ")
    exact = near_tie_pair(dtype=torch.float32)
    control = DecodeSession.of(exact, budget=32, max_new_tokens=24, engine="transformers")
    control.prefill("def f(x):\n    return")
    control.run()
    assert control.divergence_check().index is None


def test_phase_clock_on_the_cpu_keeps_the_wall_clock():
    waits = []
    clock = PhaseClock(lambda: waits.append(1))
    for name in ("draft", "tree", "verify", "commit"):
        clock.lap(name)
    times = clock.times()
    assert list(times) == ["draft", "tree", "verify", "commit"] and all(t >= 0 for t in times.values())
    assert len(waits) == 4  # a device wait before every reading, as before

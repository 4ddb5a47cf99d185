"""The drafter's static path (engine/draft_runner.py) against the dynamic drafter, its reference.

The dynamic drafter (DFlashDrafter over a DraftKVCache: cat, evict, a mask per length) is the slow obviously
correct version, itself tested against z-lab's semantics in test_drafter.py. The static path (preallocated K/V
by position, padded new rows, a key-length bucket, masks from positions) must give the same log-probs (float32
on a CPU: within 1e-5, the same argmax) round after round, on drafters whose sliding windows are shorter than
the context (eviction there, masking here), and DecodeSessions drafting through either must build the same
trees and decode greedy's tokens. DFlash2 drafters too: their convolutions and candidate selector run inside the
static function (the same top-K candidates, unary and pair scores as the dynamic drafter's). On a GPU the captured
graphs are compared with both."""

import copy
import dataclasses
import shutil

import pytest
import torch

from ddtree_viz.engine.dflash2 import DFlash2Config, DFlash2Drafter
from ddtree_viz.engine import draft_runner
from ddtree_viz.engine.draft_runner import StaticDrafter, length_buckets, static_blocker
from ddtree_viz.engine.drafter import DFlashConfig, DFlashDrafter
from ddtree_viz.engine.models import ModelPair
from ddtree_viz.engine.proposers import DFlash2Proposer, DFlashProposer, Proposer, make_proposer
from ddtree_viz.engine.session import DecodeSession
from tests import tiny

ATOL = 1e-5
SCORE_TOL = 1e-4  # selector scores: sums over the rank of products of unit-size codebooks (tens), float32

# drafter layer layouts over the tiny hybrid target (block 4); every window is shorter than the contexts below
LAYOUTS = {
    "full": dict(),
    "sliding causal, window 6": dict(layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                                     sliding_window=6),
    "sliding bidirectional, window 3 < block": dict(layer_types=["sliding_attention", "full_attention",
                                                                 "sliding_attention"], sliding_window=3,
                                                    is_causal=False),
    "all causal, window 5": dict(layer_types=["sliding_attention"] * 3, sliding_window=5, is_causal=True),
}


@pytest.fixture(scope="module")
def target():
    return tiny.target_model("hybrid", seed=0)


def drafter_for(target, block_size: int = 4, seed: int = 1, **layout) -> DFlashDrafter:
    d = tiny.drafter_config(target.config, block_size=block_size, layers=3).to_dict()
    d.update(layout)
    torch.manual_seed(seed)
    model = DFlashDrafter(DFlashConfig.from_dict(d)).eval()
    with torch.no_grad():  # norms away from 1, larger weights: sharper, more varied attention
        for name, p in model.named_parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if "norm" in name else 0.15 * torch.randn_like(p))
    return model


def dflash2_for(target, block_size: int = 4, seed: int = 1, kernel: int = 2, **layout) -> DFlash2Drafter:
    """A DFlash2 drafter over the tiny target: drafter_for's weights, convolutions near the identity (a base tap of
    about 1 at offset 0) and codebooks large enough that the pair scores reorder the candidates."""
    d = tiny.drafter_config(target.config, block_size=block_size, layers=3).to_dict()
    d.update(layout, architectures=["DFlash2DraftModel"])
    d["dflash_config"].update(conv_group_size=16, conv_kernel_size=kernel, selector_rank=8, selector_top_k=6)
    torch.manual_seed(seed)
    model = DFlash2Drafter(DFlash2Config.from_dict(d)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p) if "norm" in name else
                    torch.randn_like(p) if "codebook" in name else 0.15 * torch.randn_like(p))
        for layer in model.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                conv.base_kernel[:, 0] += 1.0
    return model


def same_scores(sa, sb, where: str) -> None:
    """Two selector scorings: the same candidates, scores within SCORE_TOL of their largest (a float32 sum's error
    scales with its terms, not with the one result: a score near zero of terms of tens)."""
    assert torch.equal(sa.ids, sb.ids), where
    for name in ("unary", "root", "pair"):
        got = getattr(sa, name)
        scale = max(float(got.abs().max()), 1.0) if got.numel() else 1.0
        torch.testing.assert_close(getattr(sb, name), getattr(sa, name), atol=SCORE_TOL * scale, rtol=SCORE_TOL,
                                   msg=lambda m: f"{where}, {name}: {m}")


def same_selection(a, b, where: str) -> None:
    """Two proposers' selector scores of their last proposal (same_scores)."""
    same_scores(a.selector_scores(), b.selector_scores(), where)


def rounds(drafter, target, new_rows, block_sizes=None, seed=0, proposers=None, check_rows=True):
    """Drive a dynamic and a static proposer through the same rounds (new context rows, a root each); every
    round's log-probs must agree."""
    dyn, st = proposers or (make_proposer(drafter, target, static=False), make_proposer(drafter, target, static=True))
    gen = torch.Generator().manual_seed(seed)
    width = drafter.fc.in_features
    committed = dyn.cache.seq_length
    for r, n in enumerate(new_rows):
        block = drafter.block_size if block_sizes is None else block_sizes[r % len(block_sizes)]
        feats = torch.randn(n, width, generator=gen)
        committed += n
        root = int(torch.randint(0, tiny.VOCAB - 2, (1,), generator=gen))
        a = dyn.propose(root, committed, feats, block)
        b = st.propose(root, committed, feats, block)
        assert a.shape == b.shape == (block - 1, tiny.VOCAB) and b.dtype == torch.float32
        torch.testing.assert_close(b, a, atol=ATOL, rtol=ATOL, msg=lambda m: f"round {r}: {m}")
        assert torch.equal(a.argmax(-1), b.argmax(-1)), f"round {r}"
        if dyn.selector:
            same_selection(dyn, st, f"round {r}")
    if check_rows:  # the static K/V rows are the dynamic cache's (a sliding layer's: its newest rows)
        runner = st.runner
        for i in range(drafter.config.num_hidden_layers):
            k, v = dyn.cache._layer(i)
            rows = k.shape[2]
            torch.testing.assert_close(runner.keys[i][:, committed - rows:committed], k[0], atol=ATOL, rtol=ATOL)
            torch.testing.assert_close(runner.values[i][:, committed - rows:committed], v[0], atol=ATOL, rtol=ATOL)
    return dyn, st


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_static_equals_dynamic_over_rounds(target, layout, attention):
    """A prompt's rows (more than a block: the eager unpadded shape), then rounds of 1..block new rows (the padded
    shape), an empty one, and the context growing well past every window."""
    drafter = drafter_for(target, **LAYOUTS[layout])
    dyn = DFlashProposer(drafter, target, static=False)
    st = DFlashProposer(drafter, target, static=True, attention=attention)
    assert st.path == "static eager" and dyn.path == "dynamic"
    rounds(drafter, target, [9, 2, 4, 1, 3, 0, 4, 4, 1, 2, 3], proposers=(dyn, st))
    assert st.runner.eager_passes == 11 and st.runner.replays == 0  # no graphs on a CPU
    windows = [w for w in drafter.config.layer_windows if w is not None]
    if windows:  # the dynamic cache really evicted: the static path matched it by masking
        assert min(dyn.cache.rows(i) for i in range(3)) < dyn.cache.seq_length


@pytest.mark.parametrize("family", ["dflash", "dflash2"])
def test_a_prompt_s_rows_written_a_chunk_at_a_time_equal_one_pass(target, monkeypatch, family):
    """The first round after a prefill writes the prompt's rows before its last block's worth by the context
    writer, CONTEXT_CHUNK rows at a time (a 16k-token prompt on a 24 GB card: no activations of 16k rows). Chunks
    of 3 over a 23-row prompt (8 chunks, the last one short): every K/V row and each round's log-probs equal the
    dynamic drafter's, which takes the prompt in one pass."""
    monkeypatch.setattr(draft_runner, "CONTEXT_CHUNK", 3)
    drafter = drafter_for(target) if family == "dflash" else dflash2_for(target)
    kind = DFlashProposer if family == "dflash" else DFlash2Proposer
    dyn, st = kind(drafter, target, static=False), kind(drafter, target, static=True)
    rounds(drafter, target, [23, 2, 4, 1], proposers=(dyn, st))
    assert st.runner.length == 30 and st.runner.eager_passes == 4  # one padded pass a round, none of 23 rows


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="torch.compile's CPU backend (inductor) needs a C++ compiler: none on PATH")
@pytest.mark.parametrize("family", ["dflash", "dflash2"])
def test_compiled_pieces_equal_the_dynamic_drafter(target, family):
    """StaticDrafter(compile=True) (opt-in; inductor's C++ backend here): the pieces between the GEMMs
    (q/k norms and RoPE, the softmax; for DFlash's own layers also their norms, residual adds and SiLU MLP) compiled,
    the same log-probs and K/V rows as the dynamic drafter round after round; the prompt's rows (an unpadded shape),
    the padded rounds and a larger key bucket all through the graphs compiled in the first two rounds."""
    from torch._dynamo.utils import counters

    make = drafter_for if family == "dflash" else dflash2_for
    drafter = make(target, **LAYOUTS["sliding causal, window 6"])
    dyn = make_proposer(drafter, target, static=False)
    st = make_proposer(drafter, target, static=True)
    st.runner = StaticDrafter(drafter, target, max_len=256, compile=True)
    assert st.runner.pieces.compile and st.runner.plain == (family == "dflash")
    rounds(drafter, target, [9, 2], proposers=(dyn, st))
    made = counters["stats"]["unique_graphs"]
    rounds(drafter, target, [4, 1, 3, 0, 4, 4, 1, 2, 3] + [4] * 60, proposers=(dyn, st))  # past 256 keys
    assert st.runner.max_len > 256  # the buffers grew: the last rounds attended over a larger key bucket
    assert counters["stats"]["unique_graphs"] == made  # nothing compiled after the first two rounds


def test_a_compiler_that_cannot_run_turns_compile_off(target, monkeypatch):
    """StaticDrafter(compile=True) where torch.compile fails (no C++ compiler, a broken Triton): the pass runs with
    the pieces as they are, compile_error says why, and the rounds are the dynamic drafter's."""
    from ddtree_viz.engine import fused

    def broken(fn):
        def fails(*args, **kwargs):
            raise RuntimeError("no C++ compiler here")
        return fails

    monkeypatch.setattr(fused, "compiled", broken)
    drafter = drafter_for(target)
    dyn, st = make_proposer(drafter, target, static=False), make_proposer(drafter, target, static=True)
    st.runner = StaticDrafter(drafter, target, max_len=256, compile=True)
    rounds(drafter, target, [9, 2, 4], proposers=(dyn, st))
    assert not st.runner.pieces.compile and "no C++ compiler here" in st.runner.compile_error


def test_running_out_of_memory_is_not_a_compiler_that_cannot_run(target, monkeypatch):
    """An out-of-memory (or a CUDA error) raised through the compiled pieces is the pass's own: it reaches the
    caller and compile stays on, where a compiler's failure turns compile off (the test above). Under a 24 GB
    card's cap an out-of-memory must not read as "the compiler cannot run here" and run the pass again."""
    from ddtree_viz.engine import fused

    def short_of_memory(fn):
        def fails(*args, **kwargs):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 48.00 MiB")
        return fails

    monkeypatch.setattr(fused, "compiled", short_of_memory)
    drafter = drafter_for(target)
    st = make_proposer(drafter, target, static=True)
    st.runner = StaticDrafter(drafter, target, max_len=256, compile=True)
    with pytest.raises(torch.OutOfMemoryError):
        st.propose(3, 9, torch.randn(9, drafter.fc.in_features), drafter.block_size)
    assert st.runner.pieces.compile and st.runner.compile_error is None
    assert [fused.compiler_failure(e) for e in (RuntimeError("no C++ compiler here"), torch.OutOfMemoryError("x"),
                                                RuntimeError("CUDA error: an illegal memory access was encountered"))
            ] == [True, False, False]


def test_a_block_shorter_than_the_drafters(target):
    """A session may draft fewer depths than the drafter's block (--block-size): other (pad, block) shapes, and a
    round whose new rows exceed this block (the eager shape)."""
    drafter = drafter_for(target, block_size=6, **LAYOUTS["sliding causal, window 6"])
    rounds(drafter, target, [5, 3, 6, 2, 1, 4, 2], block_sizes=[3, 3, 6, 3, 2, 6, 4])


DFLASH2_LAYOUTS = ["full", "sliding causal, window 6", "all causal, window 5"]


@pytest.mark.parametrize("kernel", [2, 3])
@pytest.mark.parametrize("layout", DFLASH2_LAYOUTS)
def test_dflash2_static_equals_dynamic_over_rounds(target, layout, kernel):
    """DFlash2 (issue #28 item 7): the convolutions around each sublayer and the candidate selector inside the static
    function; every round (the prompt's rows first: the eager unpadded shape; then the padded one; contexts past
    the windows) gives the dynamic drafter's log-probs, top-K candidates, unary and pair scores."""
    drafter = dflash2_for(target, kernel=kernel, **LAYOUTS[layout])
    dyn, st = rounds(drafter, target, [9, 2, 4, 1, 3, 0, 4, 4, 1, 2, 3])
    assert isinstance(st, DFlash2Proposer) and st.path == "static eager" and st.runner.eager_passes == 11
    scores = st.selector_scores()
    assert scores.ids.shape == (3, 6) and scores.pair.shape == (2, 6, 6) and scores.root.shape == (6,)
    assert bool((scores.pair.argmax(-1) != 0).any())  # the pair term reorders the unary order somewhere


def test_dflash2_with_a_block_shorter_than_the_drafters(target):
    drafter = dflash2_for(target, block_size=6, **LAYOUTS["sliding causal, window 6"])
    rounds(drafter, target, [5, 3, 6, 2, 1, 4, 2], block_sizes=[3, 3, 6, 3, 2, 6, 4])


@pytest.mark.parametrize("family", ["dflash", "dflash2"])
def test_the_static_function_reads_nothing_back_to_the_host(target, family):
    """What a CUDA graph's capture refuses, found on a CPU: under FakeTensorMode (shapes, no data) any op that reads
    a device value on the host (.item(), indexing by a 0-d tensor, nonzero) raises; the whole static function,
    DFlash2's convolutions and candidate selector included, runs there (the CUDA-graph tests need a GPU)."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

    make = drafter_for if family == "dflash" else dflash2_for
    runner = StaticDrafter(make(target, **LAYOUTS["sliding causal, window 6"]), target, max_len=256)
    feats, block = runner._inputs(4, 4)
    runner._fill_block(4, 5, 0, 0)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        with pytest.raises(DataDependentOutputException):  # the check sees a host read
            torch.zeros(10, 3)[mode.from_tensor(torch.tensor(3))]
        out = runner._draft(mode.from_tensor(feats), mode.from_tensor(block), 256)
    selector = [(3, 6), (3, 6), (6,), (2, 6, 6), (6,), (2, 6, 6)]  # ids, unary, root, pair and their conditionals
    assert [tuple(t.shape) for t in out] == [(3, tiny.VOCAB)] + (selector if family == "dflash2" else [])


def test_reset_and_a_new_prompt_reuse_the_buffers(target):
    """After reset the stale rows of the last sequence stay in the buffers; none of them may be seen."""
    drafter = drafter_for(target, **LAYOUTS["sliding causal, window 6"])
    dyn, st = rounds(drafter, target, [12, 4, 3, 4, 2])
    runner = st.runner
    for p in (dyn, st):
        p.reset()
    assert st.runner is runner and runner.length == 0
    rounds(drafter, target, [3, 1, 4, 2, 4], seed=5, proposers=(dyn, st))  # shorter: stale rows past its end
    for p in (dyn, st):
        p.reset()
    rounds(drafter, target, [2, 4, 4, 4, 4, 4, 4, 1], seed=6, proposers=(dyn, st))


def test_the_buffers_grow_when_a_sequence_needs_more(target):
    """Room made as needed: rows so far copied into larger buffers, the bucket list rebuilt; same log-probs."""
    drafter = drafter_for(target, **LAYOUTS["sliding causal, window 6"])
    st = DFlashProposer(drafter, target, static=True)
    st.reserve(40)
    dyn = DFlashProposer(drafter, target, static=False)
    rounds(drafter, target, [30] + [4] * 60, proposers=(dyn, st))
    assert st.runner.max_len == 512 and st.runner.buckets == length_buckets(512) == [256, 512]
    assert st.runner.buckets[0] == 256 and st.runner.buckets[-1] == st.runner.max_len


def test_the_context_must_stay_in_step(target):
    drafter = drafter_for(target)
    st = DFlashProposer(drafter, target, static=True)
    st.propose(3, 5, torch.zeros(5, drafter.fc.in_features), 4)
    with pytest.raises(RuntimeError, match="out of step"):
        st.propose(3, 9, torch.zeros(2, drafter.fc.in_features), 4)


def test_which_path_drafts(target):
    """On a CPU the default is the dynamic path (the reference's arithmetic stays as it was); static=True runs
    the static function eagerly; a drafter that is not whole on one device with the embeddings and lm_head falls
    back to the dynamic path by default and refuses static=True."""
    drafter = drafter_for(target)
    assert DFlashProposer(drafter, target).path == "dynamic"
    assert DFlashProposer(drafter, target, static=False).path == "dynamic"
    assert DFlashProposer(drafter, target, static=True).path == "static eager"
    assert static_blocker(drafter, target) is None

    split = copy.deepcopy(target)
    split.lm_head = torch.nn.Linear(split.config.hidden_size, split.config.vocab_size, bias=False, device="meta")
    assert "several devices" in static_blocker(drafter, split)
    assert DFlashProposer(drafter, split).path == "dynamic"
    with pytest.raises(ValueError, match="several devices"):
        DFlashProposer(drafter, split, static=True)
    with pytest.raises(ValueError, match="several devices"):
        StaticDrafter(drafter, split, max_len=64)

    hooked = copy.deepcopy(drafter)
    hooked.layers[0]._hf_hook = object()  # what accelerate's dispatch leaves on a module
    assert "device_map" in static_blocker(hooked, target)
    assert DFlashProposer(hooked, target).path == "dynamic"
    with pytest.raises(ValueError, match="attention"):
        StaticDrafter(drafter, target, max_len=64, attention="flash")


# ----------------------------------------------------------------------------------------------------------
# Whole sessions: the same trees through either path
# ----------------------------------------------------------------------------------------------------------


class Recording(Proposer):
    """A proposer that keeps every log-prob tensor its inner proposer returns."""

    def __init__(self, inner):
        self.inner, self.outputs = inner, []
        self.block_size, self.feature_layer_ids = inner.block_size, inner.feature_layer_ids

    def reset(self):
        self.inner.reset()

    def reserve(self, length):
        self.inner.reserve(length)

    def propose(self, *args):
        out = self.inner.propose(*args)
        self.outputs.append(out.clone())
        return out


class RecordingSelector(Recording):
    """Recording for a DFlash2 proposer: the selector's scores of each round too (the ones its tree was built from)."""

    selector = True

    def __init__(self, inner):
        super().__init__(inner)
        self.family, self.scores = inner.family, []

    def selector_scores(self):
        scores = self.inner.selector_scores()
        self.scores.append(scores)
        return scores


def sessions_agree(pair, prompts, *, method="ddtree", engine="transformers", budget=12, max_new=24, tree_scoring="marginal",
                   **static_kw):
    """Two sessions (dynamic / static drafter) over the prompts, one after the other on the same session (a new
    prompt resets the proposer): same log-probs each round (a DFlash2 drafter: the same selector scores), same
    trees, same output, and that output is greedy's."""
    runs = {}
    for static in (False, True):
        inner = make_proposer(pair.drafter, pair.target, static=static, **static_kw)
        proposer = (RecordingSelector if inner.selector else Recording)(inner)
        session = DecodeSession.of(pair, budget=budget, max_new_tokens=max_new, method=method, engine=engine,
                                   proposer=proposer, tree_scoring=tree_scoring)
        outs = []
        for prompt in prompts:
            session.prefill(prompt)
            session.run()
            assert tuple(session.generated) == session.greedy().ids  # exact whatever drafts
            outs.append((list(session.generated), [(r.accepted, tuple(n.token_id for n in r.nodes),
                                                    tuple(n.parent for n in r.nodes)) for r in session.history]))
        runs[static] = (outs, proposer.outputs, proposer.inner, getattr(proposer, "scores", []))
    (dyn_outs, dyn_lp, _, dyn_sel), (st_outs, st_lp, st, st_sel) = runs[False], runs[True]
    assert st.path.startswith("static") and st.runner is not None
    assert len(dyn_lp) == len(st_lp) > len(prompts)
    for r, (a, b) in enumerate(zip(dyn_lp, st_lp)):
        torch.testing.assert_close(b, a, atol=ATOL, rtol=ATOL, msg=lambda m: f"propose {r}: {m}")
        assert torch.equal(a.argmax(-1), b.argmax(-1))
    assert len(dyn_sel) == len(st_sel) and (len(st_sel) > len(prompts)) == (method == "dflash2" or tree_scoring == "selector")
    for r, (a, b) in enumerate(zip(dyn_sel, st_sel)):
        same_scores(a, b, f"round {r}")
    assert st_outs == dyn_outs  # the same trees, walks and outputs, round by round
    return st


PROMPTS = ["def window(longer_than_eight):\n    return [x for x in", "import os\n", "class A:\n    def f(self):"]


@pytest.fixture(scope="module")
def swa_pair(target):
    """The tiny hybrid with a drafter of causal sliding layers (window 8) and a full one (block 4)."""
    drafter = drafter_for(target, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                          sliding_window=8)
    return ModelPair(target, tiny.byte_tokenizer(), drafter, "tiny", "tiny-swa", torch.float32, "cpu")


@pytest.mark.parametrize("method", ["ddtree", "dflash"])
@pytest.mark.parametrize("engine", ["transformers", "runner"])
def test_sessions_with_a_sliding_drafter_agree(swa_pair, method, engine):
    st = sessions_agree(swa_pair, PROMPTS, method=method, engine=engine)
    assert st.runner.length > 8  # contexts longer than the window


@pytest.fixture(scope="module")
def dflash2_pair(target):
    """The tiny hybrid with a DFlash2 drafter of causal sliding layers (window 8) and a full one (block 4)."""
    drafter = dflash2_for(target, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                          sliding_window=8)
    return ModelPair(target, tiny.byte_tokenizer(), drafter, "tiny", "tiny-dflash2", torch.float32, "cpu")


@pytest.mark.parametrize("method, scoring", [("ddtree", "selector"), ("ddtree", "marginal"), ("dflash2", "marginal")])
def test_dflash2_sessions_on_the_runner_engine_agree(dflash2_pair, method, scoring):
    """The runner engine with a DFlash2 drafter drafting on the static path: DDTree under both scorings and the
    DFlash2 chain build the dynamic drafter's trees round by round and decode greedy's tokens."""
    st = sessions_agree(dflash2_pair, PROMPTS, method=method, engine="runner", tree_scoring=scoring)
    assert isinstance(st, DFlash2Proposer) and st.runner.length > 8


@pytest.mark.parametrize("method, scoring", [("ddtree", "selector"), ("dflash2", "marginal")])
def test_a_dflash2_draft_queued_before_the_walk_is_read(dflash2_pair, method, scoring):
    """A DFlash2 drafter's next draft queued from the walk's result on the device (DecodeSession's draft_ahead)
    brings its selector's scores with it: the rounds and records of the draft queued after the walk's read, over
    prompts one after the other (a new prompt resets the queued context)."""
    runs = {}
    for ahead in (False, True):
        proposer = make_proposer(dflash2_pair.drafter, dflash2_pair.target, static=True)
        session = DecodeSession.of(dflash2_pair, budget=12, max_new_tokens=24, method=method, engine="runner",
                                   proposer=proposer, tree_scoring=scoring, time_phases=False, draft_ahead=ahead)
        session.target_engine.walk = "device"  # a CPU walks on the host by default
        records = []
        for prompt in PROMPTS:
            session.prefill(prompt)
            session.run()
            assert tuple(session.generated) == session.greedy().ids
            records += [dataclasses.replace(r, timings_ms={}) for r in session.history]
        assert session.scheduler.draft_ahead == ahead
        runs[ahead] = records
    assert runs[True] == runs[False]


def test_a_forked_session_drafts_as_the_original(swa_pair):
    """A deep copy of a session (tests/test_analysis.py forks them to replay a round at other budgets) keeps its
    own static drafter state, the staging buffers' views included: both go on identically."""
    session = DecodeSession.of(swa_pair, budget=8, max_new_tokens=30, engine="runner", record=False,
                               proposer=DFlashProposer(swa_pair.drafter, swa_pair.target, static=True))
    session.prefill(PROMPTS[0])
    session.step()
    session.step()
    p = swa_pair
    other = copy.deepcopy(session, {id(x): x for x in (p, p.target, p.drafter, p.tokenizer)})
    assert other.proposer.runner is not session.proposer.runner
    for _ in range(3):
        a, b = session.step(), other.step()
        assert (a.accepted, a.new_token_ids) == (b.accepted, b.new_token_ids)
    assert other.generated == session.generated


@pytest.fixture(scope="module")
def embedded():
    from ddtree_viz.engine.models import load_pair

    return load_pair()


@pytest.mark.parametrize("method", ["ddtree", "dflash"])
def test_sessions_on_the_embedded_pair_agree(embedded, method):
    prompts = ["def read_config(path):\n    with open(path) as f:\n", "import os\n\n\ndef walk(root):\n"]
    sessions_agree(embedded, prompts, method=method, engine="runner", budget=32, max_new=40)


def test_the_embedded_pair_with_sdpa_attention(embedded):
    sessions_agree(embedded, ["for i in range(10):\n"], engine="runner", budget=16, max_new=24, attention="sdpa")


# ----------------------------------------------------------------------------------------------------------
# CUDA graphs
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_cuda_graphs_equal_the_eager_static_and_the_dynamic_paths(attention):
    """On a GPU (float32): graphs captured per (pad, block, bucket), replayed; each round equals the same static
    function run eagerly and the dynamic drafter; a session drafting through the graphs equals greedy and
    builds the dynamic session's trees."""
    target = tiny.target_model("hybrid", seed=0)
    drafter = drafter_for(target, **LAYOUTS["sliding causal, window 6"]).to("cuda")
    target.to("cuda")
    graphed = graphs_agree_over_rounds(DFlashProposer, drafter, target, attention=attention)
    runner = graphed.runner
    assert runner.graphs and runner.replays == 76 and runner.eager_passes == 0 and runner.capture_s > 0
    # the buffers grew from 256 to 512 rows at 251 rows (the graphs dropped), then one graph per bucket met
    assert runner.max_len == 512 and {key[2] for key in runner._slots} == {256, 512}

    pair = ModelPair(target, tiny.byte_tokenizer(), drafter, "tiny", "tiny-swa", torch.float32, "cuda")
    st = sessions_agree(pair, PROMPTS, engine="runner")
    assert st.path == "static graphs" and st.runner.replays > 0


def graphs_agree_over_rounds(proposer, drafter, target, after_round=None, **options):
    """76 rounds (past the first bucket of 256 rows) drafted three ways, `proposer`'s CUDA graphs, the same static
    function run eagerly and the dynamic drafter: the same log-probs each round (`after_round(r, graphed, eager,
    dyn)` checks more). Returns the graphed proposer."""
    graphed = proposer(drafter, target, **options)
    assert graphed.path == "static graphs"
    eager = proposer(drafter, target, static=True, graphs=False, **options)
    dyn = proposer(drafter, target, static=False)
    gen = torch.Generator().manual_seed(0)
    committed = 0
    for r, n in enumerate([9, 2, 4, 1, 3, 4] + [4] * 70):
        feats = torch.randn(n, drafter.fc.in_features, generator=gen).cuda()
        committed += n
        outs = [p.propose(r % 200, committed, feats, 4) for p in (graphed, eager, dyn)]
        torch.testing.assert_close(outs[0], outs[1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(outs[0], outs[2], atol=1e-4, rtol=1e-4)
        if after_round is not None:
            after_round(r, graphed, eager, dyn)
    return graphed


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")
@pytest.mark.parametrize("family", ["dflash", "dflash2"])
def test_compiled_pieces_in_cuda_graphs_equal_the_dynamic_drafter(family):
    """On a GPU (float32), CUDA's default: the pieces compiled (Triton) and captured in the graphs, round after round
    the log-probs of the uncompiled graphs and of the dynamic drafter; nothing compiles after the first rounds."""
    from torch._dynamo.utils import counters

    target = tiny.target_model("hybrid", seed=0)
    make, proposer = (drafter_for, DFlashProposer) if family == "dflash" else (dflash2_for, DFlash2Proposer)
    drafter = make(target, **LAYOUTS["sliding causal, window 6"]).to("cuda")
    target.to("cuda")
    made = []

    def count(r, *_):
        if r == 2:
            made.append(counters["stats"]["unique_graphs"])

    graphed = graphs_agree_over_rounds(proposer, drafter, target, after_round=count)
    runner = graphed.runner
    assert runner.pieces.compile and runner.compile_error is None and runner.replays == 76 and runner.eager_passes == 0
    assert counters["stats"]["unique_graphs"] == made[0]  # the larger key bucket (512) too: no recompile


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")
def test_cuda_graphs_of_a_dflash2_drafter_equal_the_eager_static_and_the_dynamic_paths():
    """On a GPU (float32): the DFlash2 drafter's graphs (convolutions and candidate selector captured) give, round
    after round, the log-probs and the selector's candidates and scores of the same function run eagerly and of the
    dynamic drafter; sessions on the runner engine under both scorings and the DFlash2 chain equal greedy."""
    target = tiny.target_model("hybrid", seed=0)
    drafter = dflash2_for(target, **LAYOUTS["sliding causal, window 6"]).to("cuda")
    target.to("cuda")
    def selections_agree(r, graphed, eager, dyn):
        same_selection(eager, graphed, f"round {r}, graphs vs eager")
        same_selection(dyn, graphed, f"round {r}, graphs vs dynamic")

    graphed = graphs_agree_over_rounds(DFlash2Proposer, drafter, target, after_round=selections_agree)
    runner = graphed.runner
    assert runner.graphs and runner.replays == 76 and runner.eager_passes == 0

    pair = ModelPair(target, tiny.byte_tokenizer(), drafter, "tiny", "tiny-dflash2", torch.float32, "cuda")
    for method, scoring in (("ddtree", "selector"), ("ddtree", "marginal"), ("dflash2", "marginal")):
        st = sessions_agree(pair, PROMPTS, method=method, engine="runner", tree_scoring=scoring)
        assert st.path == "static graphs" and st.runner.replays > 0


def test_a_device_error_is_told_from_a_form_that_cannot_run():
    """kernels.device.device_error, which every fallback asks before it falls back (a graph's capture, compile, a
    Triton form's probe): out of memory and CUDA errors (sticky: every later call fails) are the device's and are
    raised; any other error is the form's, and the torch path runs instead."""
    from ddtree_viz.engine.fused import compiler_failure
    from ddtree_viz.engine.kernels.device import device_error

    assert device_error(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert device_error(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert device_error(torch.AcceleratorError("an illegal memory access was encountered"))
    assert not device_error(RuntimeError("Triton Error [CUDA]: invalid argument in the compiler"))
    assert not device_error(ValueError("no C++ compiler")) and compiler_failure(ValueError("no C++ compiler"))

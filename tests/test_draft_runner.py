"""The drafter's static path (engine/draft_runner.py) against the dynamic drafter, its reference.

The dynamic drafter (DFlashDrafter over a DraftKVCache: cat, evict, a mask per length) is the slow obviously
correct version, itself tested against z-lab's semantics in test_drafter.py. The static path (preallocated K/V
by position, padded new rows, a key-length bucket, masks from positions) must give the same log-probs (float32
on a CPU: within 1e-5, the same argmax) round after round, on drafters whose sliding windows are shorter than
the context (eviction there, masking here), and DecodeSessions drafting through either must build the same
trees and decode greedy's tokens. On a GPU the captured graphs are compared with both."""

import copy

import pytest
import torch

from ddtree_viz.engine.draft_runner import StaticDrafter, length_buckets, static_blocker
from ddtree_viz.engine.drafter import DFlashConfig, DFlashDrafter
from ddtree_viz.engine.models import ModelPair
from ddtree_viz.engine.session import DecodeSession, DFlashProposer
from tests import tiny

ATOL = 1e-5

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


def rounds(drafter, target, new_rows, block_sizes=None, seed=0, proposers=None, check_rows=True):
    """Drive a dynamic and a static proposer through the same rounds (new context rows, a root each); every
    round's log-probs must agree."""
    dyn, st = proposers or (DFlashProposer(drafter, target, static=False),
                            DFlashProposer(drafter, target, static=True))
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


def test_a_block_shorter_than_the_drafters(target):
    """A session may draft fewer depths than the drafter's block (--block-size): other (pad, block) shapes, and a
    round whose new rows exceed this block (the eager shape)."""
    drafter = drafter_for(target, block_size=6, **LAYOUTS["sliding causal, window 6"])
    rounds(drafter, target, [5, 3, 6, 2, 1, 4, 2], block_sizes=[3, 3, 6, 3, 2, 6, 4])


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


class Recording:
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


def sessions_agree(pair, prompts, *, method="ddtree", engine="transformers", budget=12, max_new=24, **static_kw):
    """Two sessions (dynamic / static drafter) over the prompts, one after the other on the same session (a new
    prompt resets the proposer): same log-probs each round, same trees, same output, and that output is greedy's."""
    runs = {}
    for static in (False, True):
        proposer = Recording(DFlashProposer(pair.drafter, pair.target, static=static, **static_kw))
        session = DecodeSession(pair, budget=budget, max_new_tokens=max_new, method=method, engine=engine,
                                proposer=proposer)
        outs = []
        for prompt in prompts:
            session.prefill(prompt)
            session.run()
            assert tuple(session.generated) == session.greedy().ids  # exact whatever drafts
            outs.append((list(session.generated), [(r.accepted, tuple(n.token_id for n in r.nodes),
                                                    tuple(n.parent for n in r.nodes)) for r in session.history]))
        runs[static] = (outs, proposer.outputs, proposer.inner)
    (dyn_outs, dyn_lp, _), (st_outs, st_lp, st) = runs[False], runs[True]
    assert st.path.startswith("static") and st.runner is not None
    assert len(dyn_lp) == len(st_lp) > len(prompts)
    for r, (a, b) in enumerate(zip(dyn_lp, st_lp)):
        torch.testing.assert_close(b, a, atol=ATOL, rtol=ATOL, msg=lambda m: f"propose {r}: {m}")
        assert torch.equal(a.argmax(-1), b.argmax(-1))
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


def test_a_forked_session_drafts_as_the_original(swa_pair):
    """A deep copy of a session (tests/test_analysis.py forks them to replay a round at other budgets) keeps its
    own static drafter state, the staging buffers' views included: both go on identically."""
    session = DecodeSession(swa_pair, budget=8, max_new_tokens=30, engine="runner", record=False,
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
    graphed = DFlashProposer(drafter, target, attention=attention)
    assert graphed.path == "static graphs"
    eager = DFlashProposer(drafter, target, static=True, graphs=False, attention=attention)
    dyn = DFlashProposer(drafter, target, static=False)
    gen = torch.Generator().manual_seed(0)
    committed = 0
    for r, n in enumerate([9, 2, 4, 1, 3, 4] + [4] * 70):  # past the first bucket of 256 rows
        feats = torch.randn(n, drafter.fc.in_features, generator=gen).cuda()
        committed += n
        outs = [p.propose(r % 200, committed, feats, 4) for p in (graphed, eager, dyn)]
        torch.testing.assert_close(outs[0], outs[1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(outs[0], outs[2], atol=1e-4, rtol=1e-4)
    runner = graphed.runner
    assert runner.graphs and runner.replays == 75 and runner.eager_passes == 1 and runner.capture_s > 0
    # the buffers grew from 256 to 512 rows at 251 rows (the graphs dropped), then one graph per bucket met
    assert runner.max_len == 512 and {key[2] for key in runner._slots} == {256, 512}

    pair = ModelPair(target, tiny.byte_tokenizer(), drafter, "tiny", "tiny-swa", torch.float32, "cuda")
    st = sessions_agree(pair, PROMPTS, engine="runner")
    assert st.path == "static graphs" and st.runner.replays > 0

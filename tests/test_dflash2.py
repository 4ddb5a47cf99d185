"""DFlash2 drafters (engine/dflash2.py), float32 on the CPU: loading the published layout, the convolution and the
selector against their formulas written out by hand, the selector tree (best-first vs brute force, the budget
counterfactual against real rounds), and invariant 1 (exact == greedy, and == the seeded sampling reference at T > 0)
for DDTree under both scorings and for the DFlash2 chain, on both engines, through load_pair (the user's path).

The z-lab reference code for DFlash2 is not in any copy we can read (../shared/REFERENCE.md names it; the stored
snapshot of z-lab/dflash predates it), so the formulas are checked here against independent loop-by-loop versions of
REFERENCE.md's equations.
"""

import copy
import dataclasses
import heapq
import itertools
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from ddtree_viz import analysis
from ddtree_viz.configs import CONFIGS
from ddtree_viz.engine.dflash2 import DFlash2Config, DFlash2Drafter, GroupedDynamicCausalConv, SelectorScores
from ddtree_viz.engine.drafter import DFlashConfig, DFlashDrafter
from ddtree_viz.engine.models import EMBEDDED_DRAFT, EMBEDDED_TARGET, load_pair
from ddtree_viz.engine.sampling import Sampler
from ddtree_viz.engine.proposers import DFlash2Proposer
from ddtree_viz.engine.reference import greedy_decode
from ddtree_viz.engine.session import DecodeSession
from ddtree_viz.engine.tree import build_selector_tree, selector_chain
from ddtree_viz.errors import InputError, ModelLoadError
from ddtree_viz.trace import Trace
from tests.tiny import save_pair, tiny_pair

PROMPTS = ["def fibonacci(n):\n", "The quick brown fox"]
MAX_NEW = 24
DFLASH2_FIELDS = {"conv_group_size": 16, "conv_kernel_size": 2, "selector_rank": 8, "selector_top_k": 6}


# -- building a DFlash2 checkpoint in the published layout ---------------------------------------------------


def dflash2_state(drafter: DFlashDrafter, fields: dict, seed: int, conv: float, pair: float) -> dict:
    """A DFlash2 state dict over a DFlash drafter's weights: the convolutions near the identity (base tap 1 at
    offset 0, `conv` the size of the rest), the selector's codebooks of size `pair` (0: pair scores = unary)."""
    g = torch.Generator().manual_seed(seed)
    H, V = drafter.config.hidden_size, drafter.config.vocab_size
    k, R = fields["conv_kernel_size"], fields["selector_rank"]
    state = {n: t.detach().clone() for n, t in drafter.state_dict().items()}
    for i in range(drafter.config.num_hidden_layers):
        for name in ("attention_conv", "mlp_conv"):
            base = conv * torch.randn(2, k, H, generator=g)
            base[:, 0] += 1.0
            state[f"layers.{i}.{name}.base_kernel"] = base
            state[f"layers.{i}.{name}.kernel_projection.weight"] = conv * torch.randn(
                2 * k * (H // fields["conv_group_size"]), H, generator=g) / H ** 0.5
    state["candidate_selector.hidden_projection.weight"] = torch.randn(R, H, generator=g) / H ** 0.5
    state["candidate_selector.predecessor_codebook"] = pair * torch.randn(V, R, generator=g)
    state["candidate_selector.successor_codebook"] = pair * torch.randn(V, R, generator=g)
    return state


def write_dflash2(drafter: DFlashDrafter, path, fields=DFLASH2_FIELDS, seed=0, conv=0.05, pair=0.5, config_over=None):
    """A DFlash2 checkpoint directory (config.json + model.safetensors, the published names) from a DFlash drafter."""
    config = drafter.config.to_dict()
    config["architectures"] = ["DFlash2DraftModel"]
    config["dflash_config"].update(fields)
    config.update(config_over or {})
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file({n: t.contiguous() for n, t in dflash2_state(drafter, fields, seed, conv, pair).items()},
              str(path / "model.safetensors"))
    return path


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    """A tiny hybrid target and a DFlash2 drafter written to disk: (target dir, DFlash2 dir)."""
    root = tmp_path_factory.mktemp("dflash2")
    pair = tiny_pair("hybrid", seed=0)
    target_dir, draft_dir = save_pair(pair, root)
    return target_dir, write_dflash2(pair.drafter, root / "draft2", seed=1, conv=0.3, pair=1.0)


@pytest.fixture(scope="module")
def tiny2(tiny_dirs):
    return load_pair(str(tiny_dirs[0]), str(tiny_dirs[1]))


@pytest.fixture(scope="module")
def embedded_dir(tmp_path_factory):
    """The embedded drafter's weights in the DFlash2 layout (a drafter that drafts well: acceptance is real)."""
    drafter = DFlashDrafter.from_pretrained(EMBEDDED_DRAFT)
    fields = dict(DFLASH2_FIELDS, selector_top_k=8)
    return write_dflash2(drafter, tmp_path_factory.mktemp("emb2") / "draft2", fields, seed=2, conv=0.02, pair=0.3)


@pytest.fixture(scope="module")
def embedded2(embedded_dir):
    return load_pair(str(EMBEDDED_TARGET), str(embedded_dir))


def decode(pair, prompt, **kw):
    session = DecodeSession.of(pair, max_new_tokens=kw.pop("max_new_tokens", MAX_NEW), **kw)
    session.prefill(prompt)
    session.run()
    return session


_REFERENCES: dict = {}  # (id(pair), prompt, sampler, n) -> (pair, ids): the pair kept, so its id is never reused


def reference(pair, prompt, sampler=Sampler(), n=MAX_NEW):
    """The target's own decoding (transformers' forward, token by token), made once for the module's pairs: the
    parametrized cases below compare several methods and engines with the same reference (~1-2 s each)."""
    key = (id(pair), prompt, sampler, n)
    if key not in _REFERENCES:
        ids = pair.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        _REFERENCES[key] = (pair, list(greedy_decode(pair.target, ids, n, pair.eos_token_ids, sampler=sampler).ids))
    return list(_REFERENCES[key][1])


# -- loading ---------------------------------------------------------------------------------------------------


def test_loads_the_published_layout_through_load_pair(tiny2, tiny_dirs):
    drafter = tiny2.drafter
    assert isinstance(drafter, DFlash2Drafter) and drafter.family == "dflash2"
    names = set(load_file(str(tiny_dirs[1] / "model.safetensors")))
    assert names == set(drafter.state_dict())
    for key in ("layers.0.attention_conv.base_kernel", "layers.0.mlp_conv.kernel_projection.weight",
                "candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook",
                "candidate_selector.hidden_projection.weight"):
        assert key in names
    assert drafter.config.selector_top_k == 6 and drafter.config.conv_group_size == 16
    assert drafter.layers[0].attention_conv.base_kernel.shape == (2, 2, 64)
    assert drafter.layers[0].attention_conv.kernel_projection.weight.shape == (2 * 2 * 64 // 16, 64)


def test_the_published_config_reads_with_its_fields():
    config = json.loads((CONFIGS / "qwen3.8-27b-dflash2-config.json").read_text())
    c = DFlash2Config.from_dict(config)
    assert (c.block_size, c.conv_group_size, c.conv_kernel_size, c.selector_rank, c.selector_top_k) == (8, 16, 2, 256, 16)
    assert c.layer_windows == (2048,) * 5 and c.to_dict()["architectures"] == ["DFlash2DraftModel"]
    assert DFlash2Config.from_dict(c.to_dict()) == c
    meta = DFlash2Drafter.from_config_meta(c)
    assert tuple(meta.layers[4].mlp_conv.kernel_projection.weight.shape) == (2 * 2 * 5120 // 16, 5120)
    assert tuple(meta.candidate_selector.predecessor_codebook.shape) == (248320, 256)


def rewrite(src, dst, *, config=None, drop=(), add=None, reshape=None):
    """A copy of checkpoint `src` with config changes and weights dropped, added or replaced."""
    dst.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((src / "config.json").read_text())
    for key, value in (config or {}).items():
        (cfg["dflash_config"] if key in DFLASH2_FIELDS or key == "block_size" else cfg)[key] = value
        if key == "block_size":
            cfg[key] = value
    (dst / "config.json").write_text(json.dumps(cfg))
    state = load_file(str(src / "model.safetensors"))
    for name in drop:
        del state[name]
    state.update(add or {})
    state.update(reshape or {})
    save_file(state, str(dst / "model.safetensors"))
    return dst


@pytest.mark.parametrize("change, words", [
    (dict(drop=["layers.0.mlp_conv.base_kernel"]), ["missing", "layers.0.mlp_conv.base_kernel"]),
    (dict(drop=["candidate_selector.successor_codebook"]), ["missing", "candidate_selector.successor_codebook"]),
    (dict(add={"candidate_selector.extra": torch.zeros(3)}), ["unexpected", "candidate_selector.extra"]),
    (dict(reshape={"candidate_selector.predecessor_codebook": torch.zeros(258, 4)}),
     ["wrong shape", "candidate_selector.predecessor_codebook"]),
    (dict(config={"selector_rank": 16}), ["dflash_config.selector_rank", "hidden_projection"]),
    (dict(config={"conv_kernel_size": 3}), ["dflash_config.conv_kernel_size", "base_kernel"]),
    (dict(config={"conv_group_size": 32}), ["dflash_config.conv_group_size", "kernel_projection"]),
    (dict(config={"conv_group_size": 7}), ["dflash_config.conv_group_size 7 does not divide hidden_size 64"]),
    (dict(config={"selector_top_k": 300}), ["dflash_config.selector_top_k 300", "vocab_size 258"]),
    (dict(config={"selector_top_k": 0}), ["dflash_config.selector_top_k", ">= 1"]),
    (dict(config={"selector_rank": None}), ["missing dflash_config.selector_rank"]),
    (dict(config={"block_size": 1}), ["block_size", "at least 2"]),
    (dict(config={"final_logit_softcapping": -1}), ["final_logit_softcapping"]),
])
def test_bad_checkpoints_are_refused_naming_the_weight_or_field(tiny_dirs, tmp_path, change, words):
    bad = rewrite(tiny_dirs[1], tmp_path / "bad", **change)
    with pytest.raises(ModelLoadError) as err:
        load_pair(str(tiny_dirs[0]), str(bad))
    assert all(w in str(err.value) for w in words), str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name, value, words", [
    ("candidate_selector.predecessor_codebook", float("nan"), "1 non-finite value (NaN; the first at [3, 5])"),
    ("candidate_selector.successor_codebook", float("-inf"), "1 non-finite value (inf; the first at [3, 5])"),
])
def test_a_codebook_holding_nan_or_inf_is_refused_naming_it(tiny_dirs, tmp_path, name, value, words):
    """Issue #64: a NaN in a codebook made every pair score NaN, loaded silently. Refused at load, by name."""
    codebook = load_file(str(tiny_dirs[1] / "model.safetensors"))[name].clone()
    codebook[3, 5] = value
    bad = rewrite(tiny_dirs[1], tmp_path / "bad", reshape={name: codebook})
    with pytest.raises(ModelLoadError) as err:
        load_pair(str(tiny_dirs[0]), str(bad))
    assert f"drafter tensor {name} holds {words}" in str(err.value) and "download it again" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_dflash1_checkpoint_loads_as_before_and_honours_the_logit_fields(tmp_path):
    pair = tiny_pair("hybrid", seed=0)
    target_dir, draft_dir = save_pair(pair, tmp_path)
    plain = load_pair(str(target_dir), str(draft_dir))
    assert type(plain.drafter) is DFlashDrafter and plain.drafter.family == "dflash"
    scaled_dir = rewrite(draft_dir, tmp_path / "scaled", config={"output_multiplier": 0.5, "final_logit_softcapping": 3.0})
    scaled = load_pair(str(target_dir), str(scaled_dir))
    assert scaled.drafter.config.output_multiplier == 0.5 and scaled.drafter.config.final_logit_softcapping == 3.0
    logits = torch.randn(3, 258) * 20
    assert torch.allclose(scaled.drafter.compute_logits(logits), 3.0 * torch.tanh(logits * 0.5 / 3.0))
    assert torch.equal(plain.drafter.compute_logits(logits), logits)
    ids = pair.tokenizer(PROMPTS[0], add_special_tokens=False)["input_ids"]
    a, b = (DecodeSession.of(p, engine="transformers") for p in (plain, scaled))
    for s in (a, b):
        s.prefill(prompt_ids=ids)
    la = a.proposer.propose(a.generated[-1], a.committed_len, a.features, a.block_size)
    lb = b.proposer.propose(b.generated[-1], b.committed_len, b.features, b.block_size)
    # the same hidden states through a monotone logit map: other log-probs, the same best candidate
    assert not torch.allclose(la, lb) and torch.equal(la.argmax(-1), lb.argmax(-1))
    with pytest.raises(ModelLoadError, match="output_multiplier"):
        load_pair(str(target_dir), str(rewrite(draft_dir, tmp_path / "neg", config={"output_multiplier": 0})))


# -- the formulas, on hand-made numbers ------------------------------------------------------------------------


def conv_by_hand(base, proj, x, group, s):
    """REFERENCE.md's convolution, one number at a time: out[t, c] = sum_o (base[s, o, c] + dyn[t, s, o, c // g])
    * x[t - o, c], taps from the normed input `x`, zero before the block's start."""
    L, H = x.shape
    k = base.shape[1]
    dyn = (x @ proj.T).view(L, 2, k, H // group)
    out = torch.zeros(L, H, dtype=torch.float64)
    for t in range(L):
        for c in range(H):
            for o in range(k):
                if t - o >= 0:
                    out[t, c] += (base[s, o, c] + dyn[t, s, o, c // group]) * x[t - o, c]
    return out


def test_the_convolution_follows_the_formula():
    torch.manual_seed(0)
    H, k, g, L = 8, 3, 4, 5
    conv = GroupedDynamicCausalConv(H, k, g).double()
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    x, y = torch.randn(1, L, H, dtype=torch.float64), torch.randn(1, L, H, dtype=torch.float64)
    before, after = conv.prepare(x)
    w = conv.kernel_projection.weight
    assert torch.allclose(before[0], conv_by_hand(conv.base_kernel, w, x[0], g, 0))
    # "after": the taps made from the sublayer's input x, applied to its output y
    base, dyn = conv.base_kernel, (x[0] @ w.T).view(L, 2, k, H // g)
    expect = torch.zeros(L, H, dtype=torch.float64)
    for t, c, o in itertools.product(range(L), range(H), range(k)):
        if t >= o:
            expect[t, c] += (base[1, o, c] + dyn[t, 1, o, c // g]) * y[0, t - o, c]
    assert torch.allclose(conv.finish(y, after)[0], expect)


def test_the_selector_follows_the_formula():
    torch.manual_seed(1)
    c = dict(hidden=6, vocab=11, rank=3)
    from ddtree_viz.engine.dflash2 import CandidateSelector

    sel = CandidateSelector(c["hidden"], c["vocab"], c["rank"])
    with torch.no_grad():
        for p in sel.parameters():
            p.normal_()
    D, K, root = 4, 3, 7
    hidden, logits = torch.randn(D, c["hidden"]), torch.randn(D, c["vocab"])
    sel.requires_grad_(False)
    s = sel(hidden, logits, root, K)
    P, Q, W = sel.predecessor_codebook, sel.successor_codebook, sel.hidden_projection.weight
    for t in range(D):
        ids = sorted(range(c["vocab"]), key=lambda v: -float(logits[t, v]))[:K]
        assert s.ids[t].tolist() == ids and torch.allclose(s.unary[t], logits[t, ids])
        preds = [root] if t == 0 else s.ids[t - 1].tolist()
        for i, a in enumerate(preds):
            for j, b in enumerate(ids):
                want = float(logits[t, b]) + float(((P[a] * (W @ hidden[t])) * Q[b]).sum())
                got = s.root[j] if t == 0 else s.pair[t - 1, i, j]
                assert abs(float(got) - want) < 1e-4


# -- the selector tree ------------------------------------------------------------------------------------------


def random_scores(rng, D, K):
    root, pair = rng.normal(size=K), rng.normal(size=(D - 1, K, K)) * 2
    s = SelectorScores.of(torch.tensor(rng.permutation(100)[:D * K].reshape(D, K)), torch.zeros(D, K),
                       torch.tensor(root), torch.tensor(pair))
    return [t.numpy() for t in s.conditional()], s.ids.numpy()


def all_prefixes(cond_root, cond_pair, D, K):
    """Every path of candidates (brute force) with its score: the sum of the selector's log-probs along it."""
    out = {}
    for depth in range(1, D + 1):
        for path in itertools.product(range(K), repeat=depth):
            score = cond_root[path[0]] + sum(cond_pair[d - 1][path[d - 1], path[d]] for d in range(1, depth))
            out[path] = score
    return out


@pytest.mark.parametrize("D, K, budget", [(3, 3, 5), (4, 3, 20), (3, 4, 40), (2, 5, 30), (4, 2, 30)])
def test_best_first_equals_brute_force(D, K, budget):
    rng = np.random.default_rng(D * 10 + K)
    (cond_root, cond_pair), ids = random_scores(rng, D, K)
    tree = build_selector_tree(5, cond_root, cond_pair, ids, budget)
    scores = all_prefixes(cond_root, cond_pair, D, K)
    best = sorted(scores.values(), reverse=True)[:budget]
    got = []
    for pos in range(1, len(tree)):
        path = tuple(tree.ranks[p] for p in tree.path_to(pos)[1:])
        assert abs(sum(tree.logprobs[p] for p in tree.path_to(pos)[1:]) - scores[path]) < 1e-9
        assert tree.token_ids[pos] == ids[len(path) - 1][path[-1]]
        got.append(scores[path])
    assert len(got) == min(budget, len(scores))
    assert np.allclose(sorted(got, reverse=True), best)
    # a smaller budget's tree is a prefix of this one (the budget counterfactual)
    for b in range(1, budget):
        small = build_selector_tree(5, cond_root, cond_pair, ids, b)
        assert small.token_ids == tree.token_ids[:len(small)] and small.parents == tree.parents[:len(small)]


def test_selector_chain_is_the_greedy_walk_and_samples_with_noise():
    rng = np.random.default_rng(3)
    (cond_root, cond_pair), ids = random_scores(rng, 4, 3)
    chain = selector_chain(9, cond_root, cond_pair, ids)
    j = int(np.argmax(cond_root))
    walk = [j]
    for d in range(3):
        j = int(np.argmax(cond_pair[d][j]))
        walk.append(j)
    assert list(chain.ranks[1:]) == walk and list(chain.token_ids[1:]) == [ids[d][w] for d, w in enumerate(walk)]
    noise = np.zeros((4, 3))
    noise[0, (walk[0] + 1) % 3] = 100.0  # noise that overrides the scores picks another first candidate
    assert selector_chain(9, cond_root, cond_pair, ids, noise, 1.0).ranks[1] == (walk[0] + 1) % 3


# -- sessions: refused with a DFlash 1 drafter, exact with a DFlash2 one ----------------------------------------


def test_selector_and_dflash2_need_a_dflash2_drafter():
    pair = tiny_pair("hybrid", seed=0)
    with pytest.raises(InputError, match="tree scoring selector needs a DFlash2 drafter"):
        DecodeSession.of(pair, tree_scoring="selector", engine="transformers")
    with pytest.raises(InputError, match="method dflash2 .* needs a DFlash2 drafter"):
        DecodeSession.of(pair, method="dflash2", engine="transformers")
    with pytest.raises(InputError, match="tree scoring must be one of marginal, selector"):
        DecodeSession.of(pair, tree_scoring="joint", engine="transformers")


@pytest.mark.parametrize("engine", ["transformers", "runner"])
@pytest.mark.parametrize("method, scoring, budget", [("ddtree", "marginal", 16), ("ddtree", "selector", 16),
                                                     ("ddtree", "selector", 3), ("dflash2", "marginal", 16)])
def test_exact_equals_greedy_on_a_tiny_dflash2(tiny2, engine, method, scoring, budget):
    """Invariant 1 with a DFlash2 drafter loaded through load_pair."""
    for prompt in PROMPTS:
        session = decode(tiny2, prompt, method=method, tree_scoring=scoring, budget=budget, engine=engine)
        assert isinstance(session.proposer, DFlash2Proposer)
        assert session.generated == reference(tiny2, prompt)
        assert session.settings["tree_scoring"] == scoring and session.settings["drafter_family"] == "dflash2"


@pytest.mark.parametrize("engine", ["transformers", "runner"])
@pytest.mark.parametrize("method, scoring", [("ddtree", "selector"), ("dflash2", "marginal"), ("ddtree", "marginal")])
def test_sampled_equals_the_seeded_reference(embedded2, engine, method, scoring):
    """Invariant 1 at T > 0 on the embedded target with the DFlash2 drafter."""
    sampler = Sampler(0.8, top_k=40, seed=5)
    prompt = "def read_config(path):\n"
    session = decode(embedded2, prompt, method=method, tree_scoring=scoring, budget=16, engine=engine, sampler=sampler,
                     max_new_tokens=40)
    assert session.generated == reference(embedded2, prompt, sampler, 40)
    assert session.mean_acceptance > 1.2  # the drafter drafts: rounds keep more than the bonus


@pytest.mark.parametrize("method, scoring", [("ddtree", "selector"), ("dflash2", "marginal")])
def test_exact_equals_greedy_on_the_embedded_target(embedded2, method, scoring):
    prompt = "import os\n\ndef main():\n"
    session = decode(embedded2, prompt, method=method, tree_scoring=scoring, budget=32, max_new_tokens=48)
    assert session.generated == reference(embedded2, prompt, n=48)
    assert session.mean_acceptance > 2


@pytest.mark.parametrize("engine", ["transformers", "runner"])
@pytest.mark.parametrize("method, scoring, temperature", [("ddtree", "marginal", 0.0), ("ddtree", "selector", 0.8),
                                                          ("dflash2", "marginal", 0.8)])
def test_the_next_draft_queued_early_changes_no_round(embedded2, engine, method, scoring, temperature):
    """A round may queue the next round's draft (the DFlash2 selector's scores with it) as soon as its tokens are
    known, before the host waits for its record's reads (the default where that costs no wait: untimed rounds, or
    rounds timed by CUDA events; asked for here on a CPU's timed rounds too): the same rounds and records, field for field, as rounds that draft at their
    start; a timed round's "draft" phase is then its queued draft's. A new prompt drops a queued draft; the last
    round queues none."""
    runs = []
    for timed, queue in ((True, None), (True, True), (False, None)):  # a CPU's timed rounds queue only if asked
        session = DecodeSession.of(embedded2, budget=16, max_new_tokens=MAX_NEW, method=method, tree_scoring=scoring,
                                   engine=engine, time_phases=timed, queue_draft=queue,
                                   sampler=Sampler(temperature, top_k=40, seed=3))
        queues = session.scheduler.queues_draft
        assert queues == (queue or not timed)
        session.prefill(PROMPTS[1])
        session.step()
        assert (session.scheduler.pending is not None) == queues  # a draft queued for a prompt about to be replaced
        session.prefill(PROMPTS[0])
        queued = []
        while not session.done:
            session.step()
            queued.append(session.scheduler.pending is not None)
        assert queued == [queues] * (len(queued) - 1) + [False] and len(queued) > 2
        runs.append(session)
    first = runs[0]
    assert first.mean_acceptance > 1.2
    for other in runs[1:]:
        assert other.generated == first.generated
        assert [dataclasses.replace(r, timings_ms={}) for r in other.history] == \
            [dataclasses.replace(r, timings_ms={}) for r in first.history]
    phases = ["draft", "tree", "verify", "commit"]
    assert all(list(r.timings_ms) == phases for run in runs[:2] for r in run.history)
    assert all(r.timings_ms == {} for r in runs[2].history)
    assert all(r.draft_top_ids and r.target_top_ids and r.bonus_draft_logprob is not None for r in first.history)


def test_a_queued_draft_that_fails_loses_nothing(embedded2):
    """A queued draft that raises (here the drafter's input rejected once, as short memory would be) is not
    queued: its round's record and state stand, the next round drafts again, and the output is the target's own.
    A failure that persists is raised by the next step, before anything of that round moves."""
    session = DecodeSession.of(embedded2, budget=16, max_new_tokens=MAX_NEW, engine="runner", record=False)
    real, calls = session.proposer.propose, []

    def failing_once(root, committed_len, features, block_size):
        calls.append(committed_len)
        if len(calls) == 2:  # the first queued draft
            raise RuntimeError("CUDA out of memory (injected)")
        return real(root, committed_len, features, block_size)

    session.proposer.propose = failing_once
    session.prefill(PROMPTS[0])
    first = session.step()
    assert session.scheduler.pending is None and len(session.history) == 1 and calls == [calls[0], calls[0] + len(first.accepted)]
    session.run()
    assert session.generated == reference(embedded2, PROMPTS[0])
    session.prefill(PROMPTS[1])
    session.proposer.propose = lambda *a: (_ for _ in ()).throw(RuntimeError("CUDA out of memory (injected)"))
    with pytest.raises(RuntimeError, match="out of memory"):
        session.step()
    assert session.history == [] and session.committed_len == len(session.prompt_ids)


def test_identity_convolutions_and_no_pair_term_give_dflash1s_drafts(tmp_path):
    """With identity convolutions and zero codebooks, DFlash2 is DFlash: the same log-probs, and the selector tree
    (pair scores = unary over the top-K) is the marginal tree whenever the budget keeps to the top-K."""
    pair = tiny_pair("hybrid", seed=0)
    target_dir, draft_dir = save_pair(pair, tmp_path)
    d2 = write_dflash2(pair.drafter, tmp_path / "d2", dict(DFLASH2_FIELDS, selector_top_k=8), conv=0.0, pair=0.0)
    one, two = load_pair(str(target_dir), str(draft_dir)), load_pair(str(target_dir), str(d2))
    a = decode(one, PROMPTS[0], budget=8, engine="transformers", max_new_tokens=12)
    b = decode(two, PROMPTS[0], budget=8, engine="transformers", tree_scoring="selector", max_new_tokens=12)
    assert [s.nodes for s in a.history] != [] and [[n.token_id for n in s.nodes] for s in a.history] == \
        [[n.token_id for n in s.nodes] for s in b.history]


# -- the budget counterfactual against real rounds ---------------------------------------------------------------


def fork(session):
    pair = session.pair
    shared = {id(x): x for x in (pair, pair.target, pair.drafter, pair.tokenizer) if x is not None}
    return copy.deepcopy(session, shared)


def test_the_selector_budget_curve_is_an_actual_round_at_each_smaller_budget(embedded2):
    session = DecodeSession.of(embedded2, budget=16, max_new_tokens=48, tree_scoring="selector", engine="transformers")
    session.prefill("def read_config(path):\n")
    differing = 0
    for _ in range(3):
        forks = {}
        for b in (1, 2, 3, 5, 8, 12):
            other = fork(session)
            other.budget = b
            forks[b] = other.step()
        full = session.step()
        curve = analysis.recorded_curve(full)
        for b, small in forks.items():
            assert [n.token_id for n in small.nodes] == [n.token_id for n in full.nodes[:len(small.nodes)]]
            assert small.acceptance == curve[b], (b, small.accepted, full.accepted)
            differing += small.acceptance != full.acceptance
    assert differing > 0


# -- traces ---------------------------------------------------------------------------------------------------


def test_traces_record_the_family_and_the_scoring_and_older_ones_replay(tiny2, tmp_path):
    session = decode(tiny2, PROMPTS[1], tree_scoring="selector", budget=8, engine="transformers", max_new_tokens=8)
    path = tmp_path / "t.json"
    session.to_trace().save(path)
    trace = Trace.load(path)
    assert trace.settings["tree_scoring"] == "selector" and trace.settings["drafter_family"] == "dflash2"
    data = json.loads(path.read_text())
    for key in ("tree_scoring", "drafter_family"):
        del data["settings"][key]
    old = Trace.from_json(json.dumps(data))
    assert old.tree_scoring == "marginal" and old.drafter_family == "dflash"
    data["settings"]["tree_scoring"] = "joint"
    with pytest.raises(Exception, match="tree_scoring"):
        Trace.from_json(json.dumps(data))


# -- the command line and the page -------------------------------------------------------------------------------


def test_run_takes_tree_scoring_and_refuses_selector_with_dflash1(tiny_dirs, tmp_path, capsys):
    from ddtree_viz.cli import main

    target, draft2 = map(str, tiny_dirs)
    trace = tmp_path / "t.json"
    assert main(["run", "--target", target, "--draft", draft2, "--prompt", PROMPTS[0], "--tree-scoring", "selector",
                 "--budget", "8", "--max-new-tokens", "8", "--trace", str(trace), "--compare", "method=dflash2"]) == 0
    out = capsys.readouterr().out
    assert "DDTree (selector scoring)" in out and "IDENTICAL" in out.upper()
    saved = json.loads(trace.read_text())
    assert saved["a"]["settings"]["tree_scoring"] == "selector" and saved["b"]["settings"]["method"] == "dflash2"
    assert main(["run", "--target", target, "--draft", str(tiny_dirs[0].parent / "draft"), "--prompt", "x",
                 "--tree-scoring", "selector", "--max-new-tokens", "4"]) == 2
    assert "error: tree scoring selector needs a DFlash2 drafter" in capsys.readouterr().err


def test_analyze_takes_tree_scoring(tiny_dirs, tmp_path, capsys):
    """In the test process, as the other CLI tests (a subprocess imports torch and transformers again)."""
    from ddtree_viz.cli import main

    (tmp_path / "p.txt").write_text("def f(x):\n\nclass A:\n")
    out = tmp_path / "out"
    rc = main(["analyze", "--target", str(tiny_dirs[0]), "--draft", str(tiny_dirs[1]), "--prompts", str(tmp_path / "p.txt"),
               "--out", str(out), "--budget", "8", "--max-new-tokens", "6", "--tree-scoring", "selector"])
    assert rc == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["tree_scoring"] == "selector" and summary["identical_to_greedy"] == 1.0


def test_the_page_reads_the_scoring_and_says_why_selector_needs_dflash2(tiny_dirs):
    from ddtree_viz.page import actions
    from ddtree_viz.page.host import ModelHost
    from ddtree_viz.page.state import TabState, read_settings

    base = dict(prompt="def f(x):\n", budget=8, block_size=8, max_new_tokens=6, verify="exact", method="ddtree")
    one = ModelHost(str(tiny_dirs[0]), str(tiny_dirs[0].parent / "draft"), "float32", "cpu", engine="transformers")
    one.start(background=False)
    with pytest.raises(InputError, match="tree scoring selector needs a DFlash2 drafter"):
        actions.step(one, TabState(), read_settings(one, {**base, "tree_scoring": "selector"}))
    with pytest.raises(InputError, match="tree scoring must be one of"):
        read_settings(one, {**base, "tree_scoring": "joint"})
    two = ModelHost(str(tiny_dirs[0]), str(tiny_dirs[1]), "float32", "cpu", engine="transformers")
    two.start(background=False)
    compare = dict(compare_on=True, compare_method="ddtree", compare_tree_scoring="selector", compare_budget=8,
                   compare_block_size=8, compare_engine="same", compare_dtype="same")
    tab = actions.step(two, TabState(), read_settings(two, {**base, **compare}))
    assert tab.session.tree_scoring == "marginal" and tab.other.tree_scoring == "selector"
    assert tab.other.settings["drafter_family"] == "dflash2"


def test_rounds_record_each_nodes_unary_and_pair_score_and_the_inspector_shows_them(tiny2, tmp_path):
    from ddtree_viz.render.inspect_view import inspector_html

    session = DecodeSession.of(tiny2, tree_scoring="selector", budget=12, engine="transformers", max_new_tokens=8)
    session.prefill(PROMPTS[0])
    step = session.step()
    scores = session.proposer.selector_scores()
    assert len(step.selector_unary) == len(step.selector_pair) == len(step.nodes)
    for node in step.nodes[1:]:
        j, d = node.rank, node.depth
        assert step.selector_unary[node.id] == round(float(scores.unary[d - 1, j]), 3)
        i = step.nodes[node.parent].rank
        want = scores.root[j] if d == 1 else scores.pair[d - 2, i, j]
        assert step.selector_pair[node.id] == round(float(want), 3)
        # the node's log-prob is the selector's: log_softmax over the K successors of its parent's token
        row = scores.root if d == 1 else scores.pair[d - 2, i]
        assert abs(node.logprob - float(torch.log_softmax(row, -1)[j])) < 1e-5
    html = inspector_html(step, 1)
    assert f"unary {step.selector_unary[1]:.3f}, pair {step.selector_pair[1]:.3f}" in html
    assert "pair scores from the parent (this node and its siblings in the tree)" in html
    siblings = analysis.node_info(step, 1)["selector_siblings"]
    assert [t for t, _ in siblings] == sorted((n.token_id for n in step.nodes if n.parent == 0),
                                              key=lambda t: -step.selector_pair[[n.token_id for n in step.nodes].index(t)])
    path = tmp_path / "t.json"
    session.to_trace().save(path)
    assert Trace.load(path).steps[0].selector_pair == step.selector_pair
    marginal = decode(tiny2, PROMPTS[0], budget=12, engine="transformers", max_new_tokens=4)
    assert marginal.history[0].selector_pair == () and "selector:" not in inspector_html(marginal.history[0], 1)


def test_the_chains_noise_is_the_targets_noise_at_its_candidates():
    from ddtree_viz.engine.sampling import gumbel_noise, gumbel_noise_at

    positions = torch.tensor([5, 6, 7, 2**33 + 1])
    ids = torch.tensor([[0, 9, 257], [3, 3, 1], [256, 100, 7], [1, 2, 4]])
    assert torch.equal(gumbel_noise_at(11, positions, ids), gumbel_noise(11, positions, 258).gather(1, ids))


def test_the_static_drafter_runs_dflash2_and_auto_takes_the_dynamic_path_on_a_cpu(tiny2):
    """The static drafter takes DFlash2 (its convolutions and selector in the shape-static function: equalities in
    tests/test_draft_runner.py); on a CPU `auto` keeps the dynamic path, as for DFlash 1."""
    proposer = DFlash2Proposer(tiny2.drafter, tiny2.target)
    assert proposer.path == "dynamic" and proposer.static_blocker is None
    assert DFlash2Proposer(tiny2.drafter, tiny2.target, static=True).path == "static eager"


def test_engine_eval_reports_both_chains_and_both_scorings_for_a_dflash2(tiny_dirs):
    """`train engine-eval` on a DFlash2 drafter: the per-depth chain, the selector's chain, and DDTree under both
    scorings at each budget, every session checked against greedy (the held-out acceptance table of
    docs/EMBEDDED.md is made this way)."""
    import numpy as np

    from ddtree_viz.train.evaluate import engine_acceptance
    from tests.tiny import byte_tokenizer

    tok = byte_tokenizer()
    stream = np.array(tok("def f(x):\n    return x\n" * 40, add_special_tokens=False)["input_ids"], dtype=np.int64)
    tokens = {"eval": stream, "eval_doc_offsets": np.array([0, len(stream)])}
    out = engine_acceptance(tokens, tok, budgets=[4, 8], new_tokens=8, n_prompts=2, prompt_len=6,
                            target=str(tiny_dirs[0]), draft=str(tiny_dirs[1]))
    assert set(out) == {"chain", "dflash2-chain", "4", "8", "selector-4", "selector-8"}
    for key, row in out.items():
        assert row["divergences"] == [] and row["rounds"] > 0 and row["acceptance"] >= 1.0, (key, row)


def test_compare_mode_puts_the_embedded_dflash2_beside_the_embedded_dflash(tiny_dirs):
    """#28.6: the page offers both embedded drafters: A = DDTree over the DFlash drafter's marginals, B = the
    embedded DFlash2's selector tree (compare mode's 'B: drafter'); both outputs equal greedy, B's label names its
    drafter. Beside a target of the user's own, the embedded drafters are refused with a clear message."""
    from ddtree_viz.engine.models import EMBEDDED_DRAFTS
    from ddtree_viz.page import actions
    from ddtree_viz.page.host import ModelHost
    from ddtree_viz.page.state import TabState, read_settings
    from ddtree_viz.page.views import render_views

    assert (EMBEDDED_DRAFTS["dflash2"] / "model.safetensors").is_file()
    base = dict(prompt="def fibonacci(n):\n", budget=16, block_size=16, max_new_tokens=24, verify="exact",
                method="ddtree")
    compare = dict(compare_on=True, compare_method="ddtree", compare_tree_scoring="selector", compare_budget=16,
                   compare_block_size=16, compare_engine="same", compare_dtype="same", compare_drafter="dflash2")
    host = ModelHost(None, None, "float32", "cpu", engine="auto")
    host.start(background=False)
    tab = TabState()
    for tab in actions.run_rounds(host, tab, read_settings(host, {**base, **compare})):
        pass
    assert tab.trace.drafter_family == "dflash" and tab.other_trace.drafter_family == "dflash2"
    views = render_views(host, tab)
    assert views.compare.count("identical to greedy") == 2 and tab.session.generated == tab.other.generated
    assert "selector scoring), block 16, exact, dflash2 drafter" in views.status
    own = ModelHost(str(tiny_dirs[0]), str(tiny_dirs[1]), "float32", "cpu", engine="transformers")
    own.start(background=False)
    small = dict(base, budget=8, block_size=8, max_new_tokens=4)
    with pytest.raises(InputError, match="the embedded drafters go with the embedded target only"):
        actions.step(own, TabState(), read_settings(own, {**small, **compare, "compare_block_size": 8}))

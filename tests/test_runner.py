"""The static runner (the engine's fast GPU path) against transformers and against the engine's own verify,
float32 on the CPU without graphs (the same functions the CUDA graphs capture)."""

import dataclasses
import random
import time

import numpy as np
import pytest
import torch
from accelerate import dispatch_model
from transformers import DynamicCache

from ddtree_viz.engine.gdn_tree import TreeIndex
from ddtree_viz.engine.oracle import OracleProposer
from ddtree_viz.treeops import conv_gather, conv_gather_reference
from ddtree_viz.engine.engines import RunnerEngine
from ddtree_viz.engine.launch import device_word
from ddtree_viz.engine.runner import StaticRunner
from ddtree_viz.engine.proposers import DFlashProposer
from ddtree_viz.engine.reference import EngineGreedy, GreedyReference
from ddtree_viz.engine.scheduler import Stage
from ddtree_viz.engine.session import DecodeSession
from ddtree_viz.engine.tree import DraftTree, follow_tree, one_node
from ddtree_viz.engine.verify import EXACT, verify_tree
from ddtree_viz.errors import ModelLoadError
from tests.test_gdn_tree import random_tree
from tests.tiny import tiny_pair

PROMPT = "def fibonacci(n):\n    return"
NEW = 40


@pytest.fixture(scope="module")
def pair():
    return tiny_pair("hybrid", seed=0, layers=8)


@pytest.fixture(scope="module")
def greedy(pair):
    prompt = pair.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    return prompt, GreedyReference(pair.target, prompt, set()).extend_to(NEW)


def make_runner(pair, sizes=(1, 17)):
    return StaticRunner(pair.target, max_len=256, sizes=sizes, feature_layer_ids=pair.drafter.target_layer_ids)


def runner_greedy(runner, prompt, new):
    """Greedy decoding through the runner (one-node trees), as the engine interface runs it."""
    engine = RunnerEngine(runner.target, runner.feature_layer_ids, tree_size=1, block_size=runner.max_path,
                          max_new_tokens=new, runner=runner)
    return list(EngineGreedy(engine, prompt, set()).extend_to(new).ids)


def runner_ddtree(pair, runner, proposer, prompt, new, budget, tree_on_device=None):
    """A DecodeSession on this runner, recording off (the tree where the session puts it, unless `tree_on_device`
    says): (generated ids, tokens gained per round)."""
    engine = RunnerEngine(runner.target, runner.feature_layer_ids, tree_size=budget + 1, block_size=proposer.block_size,
                          max_new_tokens=new, runner=runner)
    session = DecodeSession.of(pair, budget=budget, max_new_tokens=new, proposer=proposer, engine=engine, record=False,
                               tree_on_device=tree_on_device)
    session.prefill(prompt_ids=prompt)
    session.run()
    return session.generated, [r.acceptance for r in session.history]


def on_cuda():
    """The 8-layer tiny hybrid pair on the GPU, the test prompt's ids and a runner (CUDA graphs) for trees of 1 and 17."""
    pair = tiny_pair("hybrid", seed=0, layers=8)
    pair.target.to("cuda")
    pair.drafter.to("cuda")
    prompt = pair.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    return pair, prompt, StaticRunner(pair.target, max_len=256, sizes=(1, 17),
                                      feature_layer_ids=pair.drafter.target_layer_ids)


def tree_from_parents(parents, rng) -> DraftTree:
    depths = []
    for p in parents:
        depths.append(0 if p < 0 else depths[p] + 1)
    tokens = [rng.randrange(256) for _ in parents]
    return DraftTree(tuple(tokens), tuple(parents), tuple(depths), tuple([0] * len(parents)), tuple([0.0] * len(parents)))


def test_conv_windows_match_the_tree_index():
    rng = random.Random(0)
    for n, depth in [(1, 0), (2, 1), (9, 3), (20, 8), (33, 2)]:
        parents = random_tree(n, depth, rng)
        depths = tree_from_parents(parents, rng).depths
        for kernel in (2, 4):
            expect = conv_gather_reference(parents, kernel)
            assert np.array_equal(conv_gather(parents, depths, kernel), expect)


def test_staged_inputs_are_the_padded_trees(pair):
    """The round's host work writes a tree's inputs straight into the slot's staging buffers: they must equal
    what the padded tree gives through treeops (token ids, committed + depth, conv windows, ancestor mask;
    padding = inert children of the root), and the commit's path, last node and length."""
    from ddtree_viz.treeops import ancestor_matrix

    runner = make_runner(pair, sizes=(1, 9, 33))
    runner.prefill(list(range(7)))
    rng = random.Random(3)
    for n, depth in [(1, 0), (2, 1), (9, 3), (5, 4), (20, 8), (33, 2), (30, 12)]:
        tree = tree_from_parents(random_tree(n, depth, rng), rng)
        logits, _, slot = runner.forward(tree)
        T, pad = slot.size, slot.size - n
        parents, depths = tree.parents + (0,) * pad, tree.depths + (1,) * pad
        assert slot.ids.tolist() == list(tree.token_ids) + [0] * pad
        assert slot.pos.tolist() == [runner.committed + d for d in depths]
        assert np.array_equal(slot.gather.numpy(), conv_gather(parents, depths, runner.kernel))
        assert np.array_equal(slot.anc.numpy(), ancestor_matrix(parents))
        assert slot.parents.tolist() == list(tree.parents) + [-1] * pad  # the walk's: the padding no one's child
        leaf = max(range(n), key=lambda i: tree.depths[i])
        path = tree.path_to(leaf)
        runner.commit(slot, path)
        P = runner.max_path
        assert slot.path.tolist() == path + [path[-1]] * (P - len(path))
        assert slot.last.tolist() == [path[-1]] and int(slot.length) == len(path)
        runner.prefill(list(range(7)))


def test_inputs_written_by_the_device_are_the_staged_ones(pair):
    """forward_tensors (the tree as tensors, the slot's inputs written by tensor ops) against forward (staged on the
    host): the same inputs in every slot size, padded or not, and the same logits and features, bit for bit."""
    host, device = make_runner(pair, sizes=(1, 9, 33)), make_runner(pair, sizes=(1, 9, 33))
    host.prefill(list(range(7)))
    device.prefill(list(range(7)))
    rng = random.Random(4)
    for n, depth in [(1, 0), (2, 1), (9, 3), (5, 4), (20, 8), (33, 2), (30, 12)]:
        tree = tree_from_parents(random_tree(n, depth, rng), rng)
        logits, feats, slot = host.forward(tree)
        got_logits, got_feats, got = device.forward_tensors(*(torch.tensor(v) for v in (tree.token_ids, tree.parents,
                                                                                          tree.depths)))
        assert got.size == slot.size and torch.equal(got.inputs, slot.inputs) and torch.equal(got.anc, slot.anc)
        assert torch.equal(got_logits, logits) and torch.equal(got_feats, feats)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")
def test_static_tree_tensors_are_staged_by_a_graph_of_their_own():
    """forward_tensors(static=True) on a runner with graphs: the slot's inputs written by one captured graph from
    tensors rewritten in place (as DeviceTreeBuilder's outputs are) equal the host's staging, and the logits too,
    for each tree and each committed length (read by the graph from the device); captured once for the slot."""
    pair, _, device = on_cuda()
    host = StaticRunner(pair.target, max_len=256, sizes=(1, 17), feature_layer_ids=pair.drafter.target_layer_ids)
    rng = random.Random(5)
    tensors = [torch.zeros(12, dtype=torch.long, device="cuda") for _ in range(3)]  # ids, parents, depths
    graphs = set()
    for committed, depth in [(7, 3), (7, 8), (11, 1), (11, 5)]:
        host.prefill(list(range(committed)))
        device.prefill(list(range(committed)))
        tree = tree_from_parents(random_tree(12, depth, rng), rng)
        for t, values in zip(tensors, (tree.token_ids, tree.parents, tree.depths)):
            t.copy_(torch.tensor(values))
        logits, _, slot = host.forward(tree)
        got_logits, _, got = device.forward_tensors(*tensors, static=True)
        graphs.add(id(got.tree_graph))
        assert got.tree_graph is not None and got.size == slot.size == 17
        assert torch.equal(got.inputs, slot.inputs) and torch.equal(got.anc, slot.anc)
        assert torch.equal(got_logits, logits)
    assert len(graphs) == 1


def test_runner_greedy_equals_transformers_greedy(pair, greedy):
    prompt, ref = greedy
    assert runner_greedy(make_runner(pair), prompt, NEW) == list(ref.ids)


@pytest.mark.parametrize("budget", [1, 4, 16, 40])  # 4: trees padded to a larger slot; 40: a slot added on demand
@pytest.mark.parametrize("ranks", [[0], [1], [0, 2, 1]])
def test_runner_ddtree_equals_greedy(pair, greedy, budget, ranks):
    prompt, ref = greedy
    oracle = OracleProposer(ref.ids, len(prompt), ranks, pair.target.config.vocab_size, block_size=8)
    out, rounds = runner_ddtree(pair, make_runner(pair), oracle, prompt, NEW, budget)
    assert out == list(ref.ids)
    if budget > 1 and ranks == [0]:
        assert max(rounds) > 2  # long accepted paths really happened


def test_runner_ddtree_with_the_dflash_drafter(pair, greedy):
    prompt, ref = greedy
    out, _ = runner_ddtree(pair, make_runner(pair), DFlashProposer(pair.drafter, pair.target), prompt, NEW, 16)
    assert out == list(ref.ids)


def test_runner_state_equals_greedy_cache(pair, greedy):
    """After DDTree rounds the committed state is what transformers' own one-token steps leave."""
    prompt, ref = greedy
    runner = make_runner(pair)
    oracle = OracleProposer(ref.ids, len(prompt), [0, 1], pair.target.config.vocab_size, block_size=8)
    out, rounds = runner_ddtree(pair, runner, oracle, prompt, 24, 16)
    committed = runner.committed - len(prompt)  # the last bonus token is not in the cache yet
    cache = DynamicCache(config=pair.target.config)
    pair.target(input_ids=torch.tensor([prompt + out[:committed]]), cache=cache, use_cache=True)
    state = runner.state()
    for i, layer in enumerate(cache.layers):
        if "conv" in state[i]:
            torch.testing.assert_close(state[i]["conv"], layer.conv_states[0][0], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(state[i]["recurrent"], layer.recurrent_states[0][0].float(), atol=1e-5, rtol=1e-4)
        else:
            torch.testing.assert_close(state[i]["keys"], layer.keys, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(state[i]["values"], layer.values, atol=1e-5, rtol=1e-4)


def test_the_walk_on_the_device_commits_what_the_host_walk_commits(pair, greedy):
    """Runner.commit_walk (the walk on the device, then the commit, one read back) against follow_tree + commit on a
    second runner, round after round: the same path, bonus and committed state, bit for bit. The target's choices
    are its argmax with some nodes' parents made to choose them (deep paths), the padding's token the root's
    choice (trees of 1..23 nodes, depths 0..6, in slots of 33: never accepted)."""
    prompt, _ = greedy
    rng = random.Random(3)
    host, device = make_runner(pair, sizes=(1, 33)), make_runner(pair, sizes=(1, 33))
    host.prefill(prompt)
    device.prefill(prompt)
    for _ in range(6):
        depth = rng.randrange(0, 7)
        tree = tree_from_parents(random_tree(rng.randrange(depth + 1, 24), depth, rng), rng)
        logits, _, slot = host.forward(tree)
        _, _, device_slot = device.forward(tree)
        choice = logits.argmax(-1)
        for i in range(1, len(tree)):
            if rng.random() < 0.7:
                choice[tree.parents[i]] = tree.token_ids[i]
        device_slot.choice.fill_(int(choice[0]))  # a stale choice under the padding must not matter either
        device_slot.ids[len(tree):] = int(choice[0])
        accepted, bonus = follow_tree(tree, choice.tolist())
        host.commit(slot, accepted)
        assert device.commit_walk(device_slot, choice) == (accepted, bonus)
        assert device.committed == host.committed
        mine = device.state()
        for i, theirs in host.state().items():
            assert all(torch.equal(mine[i][key], theirs[key]) for key in theirs)


def test_runner_tree_pass_equals_the_engine_verify(pair, greedy):
    """Logits and drafter features of one tree pass: runner == transformers' forward with the tree-exact GDN."""
    prompt, _ = greedy
    rng = random.Random(1)
    tree = tree_from_parents(random_tree(23, 6, rng), rng)
    runner = make_runner(pair, sizes=(1, 33))
    runner.prefill(prompt)
    logits, feats, _ = runner.forward(tree)
    cache = DynamicCache(config=pair.target.config)
    pair.target(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
    result = verify_tree(pair.target, cache, tree, len(prompt), EXACT, want_hidden=True)
    torch.testing.assert_close(logits, result.logits, atol=1e-4, rtol=1e-4)
    expect = torch.cat([result.hidden_states[i + 1][0] for i in pair.drafter.target_layer_ids], dim=-1)
    torch.testing.assert_close(feats, expect, atol=1e-4, rtol=1e-4)


def test_runner_refuses_what_it_cannot_run(pair, tmp_path):
    with pytest.raises(ModelLoadError, match="hybrid"):
        StaticRunner(tiny_pair("attention").target, max_len=64)
    split = tiny_pair("hybrid", seed=0)
    dispatch_model(split.target, device_map={"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers": "cpu",
                                             "model.norm": "cpu", "lm_head": "disk"}, offload_dir=str(tmp_path))
    with pytest.raises(ModelLoadError, match="one device"):
        StaticRunner(split.target, max_len=64)
    runner = StaticRunner(pair.target, max_len=40)
    with pytest.raises(ValueError, match="no room"):
        runner.prefill(list(range(20)))
    runner.prefill(list(range(5)))
    with pytest.raises(ValueError, match="accepted path"):
        runner.commit(runner.forward(one_node(3))[2], [])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")
def test_runner_with_cuda_graphs_equals_greedy():
    """The captured graphs replay the same functions: greedy == transformers' greedy, DDTree == greedy (the walk's
    graph every round; the tree's graph and the inputs written by the device with tree_on_device)."""
    pair, prompt, runner = on_cuda()
    ref = GreedyReference(pair.target, prompt, set()).extend_to(NEW)
    assert runner.graphs
    assert runner_greedy(runner, prompt, NEW) == list(ref.ids)
    for budget, ranks in [(4, [0]), (16, [1]), (16, [0, 2, 1]), (40, [0])]:
        oracle = OracleProposer(ref.ids, len(prompt), ranks, pair.target.config.vocab_size, block_size=8)
        assert runner_ddtree(pair, runner, oracle, prompt, NEW, budget)[0] == list(ref.ids)
    out, _ = runner_ddtree(pair, runner, DFlashProposer(pair.drafter, pair.target), prompt, NEW, 16)
    assert out == list(ref.ids)
    oracle = OracleProposer(ref.ids, len(prompt), [0, 1], pair.target.config.vocab_size, block_size=8)
    for where in (True, False):  # the tree's graph and its inputs' graph (the default on a GPU), and the host's
        assert runner_ddtree(pair, runner, oracle, prompt, NEW, 16, tree_on_device=where)[0] == list(ref.ids)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")
def test_recorded_rounds_build_their_tree_on_the_device_by_default():
    """The page's rounds (records kept) on one GPU build DDTree's marginal tree on the device by default
    (_tree_where; docs/lab/NOTEBOOK.md section 21), with the same records, tree for tree, as the host's tree."""
    pair, prompt, runner = on_cuda()
    histories = []
    for where in (None, False):
        proposer = DFlashProposer(pair.drafter, pair.target)
        engine = RunnerEngine(runner.target, runner.feature_layer_ids, tree_size=17, block_size=proposer.block_size,
                              max_new_tokens=NEW, runner=runner)
        session = DecodeSession.of(pair, budget=16, max_new_tokens=NEW, proposer=proposer, engine=engine,
                                   tree_on_device=where)
        assert session.record and session.scheduler.tree_on_device == (where is None)
        session.prefill(prompt_ids=prompt)
        session.run()
        histories.append([dataclasses.replace(r, timings_ms={}) for r in session.history])
    assert histories[0] == histories[1] and len(histories[0]) > 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs, pinned copies)")
@pytest.mark.parametrize("record", [False, True])
def test_rounds_verified_ahead_on_the_gpu_give_the_same_rounds(record):
    """On one GPU (the defaults: the device's tree and walk, the static drafter, drafts and verifies queued ahead)
    the rounds and records equal those of rounds that verify after the read, tree for tree, while the host is slow
    between a walk's read and its tree's (the device then runs the next tree's copy to the host first: the two
    trees' copies must not share buffers); recorded rounds (the page's: phases timed by CUDA events) keep every
    phase's time. A first session runs before the two compared (a process's first draft differs from the next
    ones' in its log-probs' last bits, ahead or not)."""
    pair, prompt, runner = on_cuda()
    runs = {}
    for ahead in (None, False, True):
        proposer = DFlashProposer(pair.drafter, pair.target)
        engine = RunnerEngine(runner.target, runner.feature_layer_ids, tree_size=17, block_size=proposer.block_size,
                              max_new_tokens=NEW, runner=runner)
        session = DecodeSession.of(pair, budget=16, max_new_tokens=NEW, proposer=proposer, engine=engine, record=record,
                                   verify_ahead=bool(ahead))
        session.prefill(prompt_ids=prompt)
        session.step()
        settle = proposer.settle

        def slow_settle(committed, settle=settle):
            time.sleep(0.01)  # the host late: the device goes on to the next draft, tree and its copy
            settle(committed)

        proposer.settle = slow_settle
        session.run()
        assert session.scheduler.verify_ahead == bool(ahead) and (session.scheduler.verified_ahead > 2) == bool(ahead)
        if record:
            assert all({"draft", "tree", "verify", "commit"} <= set(r.timings_ms) for r in session.history)
        runs[ahead] = [dataclasses.replace(r, timings_ms={}) for r in session.history]
    assert runs[True] == runs[False] and len(runs[False]) > 3


def test_one_step_delta_rule_equals_the_recurrence():
    from ddtree_viz.engine.kernels.gdn_step.naive import delta_rule_step
    from ddtree_viz.engine.kernels.gdn_tree.naive import replay_state, tree_delta_rule_reference

    gen = torch.Generator().manual_seed(0)
    H, K, V = 3, 4, 5
    q, k = (torch.nn.functional.normalize(torch.randn(1, H, K, generator=gen), dim=-1) for _ in range(2))
    v = torch.randn(1, H, V, generator=gen)
    g, beta = -torch.rand(1, H, generator=gen), torch.rand(1, H, generator=gen)
    state = torch.randn(H, K, V, generator=gen)
    out, delta = delta_rule_step(q, k, v, g, beta, state)
    torch.testing.assert_close(out, tree_delta_rule_reference(q, k, v, g, beta, state, [-1]))
    after = g[0].exp()[:, None, None] * state + k[0][:, :, None] * delta[0][:, None, :]
    torch.testing.assert_close(after, replay_state([0], k, v, g, beta, state))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs, stream memory operations)")
def test_verify_graphs_launched_ahead_give_the_same_rounds(monkeypatch):
    """engine/launch.py: each round's verify graph queued before its tree (behind a device word the forward
    writes after staging) gives the same rounds as the graph launched after staging; a launch that no forward
    takes (a tree that fails, a tree too large for the launched slot, a prefill) is let go, nothing hangs, and the
    next rounds are still exact."""
    import faulthandler

    faulthandler.dump_traceback_later(240, exit=True)  # a hang (a word never written) fails the run, not blocks it
    pair, prompt, runner = on_cuda()
    try:
        runs = {}
        for ahead in (False, True):
            before = runner.passes_launched_ahead
            runs[ahead] = runner_session(pair, runner, prompt, launch_ahead=ahead)
            runs[ahead].run()
            assert runner.passes_launched_ahead - before == (len(runs[True].history) if ahead else 0)
        assert runner.launch_error is None
        assert runs[True].generated == runs[False].generated
        assert [r.accepted for r in runs[True].history] == [r.accepted for r in runs[False].history]

        session = runner_session(pair, runner, prompt, launch_ahead=True)
        session.step()
        a_tree_fails(session, monkeypatch, launched=True)
        engine = session.target_engine
        assert engine.launch_ahead(1)  # the one-node slot launched, then a 17-node tree: its own slot, run after
        session.run()
        assert session.generated == runs[False].generated
        assert engine.launch_ahead(17)
        session.prefill(prompt_ids=prompt)  # a new prompt lets the pending launch go
        session.run()
        assert session.generated == runs[False].generated
    finally:
        runner.release_ahead()  # a failure above must not leave a launch pending (the report would wait on it)
        faulthandler.cancel_dump_traceback_later()


def a_tree_fails(session, monkeypatch, launched: bool = False) -> None:
    """One step whose tree fails after the draft (`launched`: once the verify was launched ahead): it raises."""

    def fails(root, logprobs, at, before_wait=None):
        if launched:
            before_wait()
        raise RuntimeError("a tree that cannot be built")

    monkeypatch.setattr(session.shape, "build", fails)
    with pytest.raises(RuntimeError, match="cannot be built"):
        session.step()
    monkeypatch.undo()


def runner_session(pair, runner, prompt, budget=16, **options):
    """A DecodeSession of DDTree with the DFlash drafter on this runner, recording off, prefilled."""
    proposer = DFlashProposer(pair.drafter, pair.target)
    engine = RunnerEngine(runner.target, runner.feature_layer_ids, tree_size=budget + 1,
                          block_size=proposer.block_size, max_new_tokens=NEW, runner=runner)
    session = DecodeSession.of(pair, budget=budget, max_new_tokens=NEW, proposer=proposer, engine=engine, record=False,
                               **options)
    session.prefill(prompt_ids=prompt)
    return session


@pytest.mark.parametrize("record", [False, True])
def test_a_round_that_fails_before_its_commit_loses_nothing(pair, greedy, monkeypatch, record):
    """A round whose tree fails after its draft was taken (the queued one, records off; or made in the round) leaves
    the session as it was: the next step takes the same draft (the proposer's context has moved on and cannot draft
    it again) and the run ends identical to greedy."""
    prompt, ref = greedy
    session = runner_session(pair, make_runner(pair), prompt)
    session.record = session.time_phases = record
    session.step()
    a_tree_fails(session, monkeypatch)
    assert len(session.history) == 1
    session.run()
    assert session.generated == list(ref.ids)[:len(session.generated)] and len(session.generated) == NEW


def test_launching_ahead_on_the_cpu_changes_nothing(pair, greedy):
    """Where nothing can be launched ahead (no CUDA graphs) a session asked to runs its rounds as before; the hook
    the launch hangs on (to_host's before_wait) runs once, after the copies and before the host has the tree."""
    from ddtree_viz.engine.tree import to_host

    prompt, ref = greedy
    runner = make_runner(pair)
    sessions = []
    for ahead in (True, False):  # one after the other: they share the runner
        sessions.append(runner_session(pair, runner, prompt, launch_ahead=ahead))
        sessions[-1].run()
    assert sessions[0].generated == sessions[1].generated == list(ref.ids)[:len(sessions[0].generated)]
    assert runner.passes_launched_ahead == 0
    calls = []
    assert to_host(torch.arange(3), before_wait=lambda: calls.append(1))[0].tolist() == [0, 1, 2] and calls == [1]


@pytest.mark.parametrize("method", ["ddtree", "dflash"])
def test_session_on_the_runner_matches_the_transformers_engine(pair, method):
    """DecodeSession(engine="runner"): the same rounds, records and cache layout as the transformers engine."""
    from ddtree_viz.engine.session import DecodeSession

    runs = {}
    for engine in ("transformers", "runner"):
        session = DecodeSession.of(pair, budget=16, max_new_tokens=NEW, method=method, engine=engine)
        session.prefill(PROMPT)
        session.run()
        runs[engine] = session
    a, b = runs["transformers"], runs["runner"]
    assert b.generated == a.generated and b.divergence() == (None, None)
    assert [r.accepted for r in b.history] == [r.accepted for r in a.history]
    assert [r.target_argmax for r in b.history] == [r.target_argmax for r in a.history]
    assert b.settings["engine"] == "runner"
    for ra, rb in [(a.history[-1], b.history[-1]), (a.history[0], b.history[0])]:
        assert rb.cache == ra.cache and rb.cache_before_commit == ra.cache_before_commit
    assert b.prefill_cache == a.prefill_cache
    trace = b.to_trace()
    assert trace.settings["engine"] == "runner" and trace.first_divergence is None
    assert type(trace).from_json(trace.to_json()).settings["engine"] == "runner"


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_tree_built_on_the_device_gives_the_same_rounds(pair, temperature):
    """The walk on the device, then also Overlap(tree_on_device=True) (DDTree's marginal tree by tensor ops,
    the runner's inputs written by the device, the tree read back after the walk), on the runner: the same
    rounds, tree for tree, and records as the host's walk and tree, greedy and sampled; refused where it does not
    apply."""
    from ddtree_viz.engine.sampling import Sampler
    from ddtree_viz.engine.session import DecodeSession
    from ddtree_viz.errors import InputError

    runs = []
    for on_device, walk in ((False, "host"), (False, "device"), (True, "device")):  # a CPU walks on the host
        session = DecodeSession.of(pair, budget=12, max_new_tokens=NEW, engine="runner", tree_on_device=on_device,
                                   sampler=Sampler(temperature=temperature, seed=5))
        assert session.target_engine.walk == "host"
        session.target_engine.walk = walk
        session.prefill(PROMPT)
        session.run()
        runs.append(session)
    host = runs[0]
    for device in runs[1:]:
        assert device.generated == host.generated and device.divergence() == (None, None)
        untimed = [dataclasses.replace(r, timings_ms={}) for r in device.history]
        assert untimed == [dataclasses.replace(r, timings_ms={}) for r in host.history]
    if temperature == 0:  # (the random drafter rarely matches a sampled choice)
        assert max(r.acceptance for r in device.history) > 1  # deep enough to walk past the root
    for kwargs in ({"engine": "transformers"}, {"engine": "runner", "method": "dflash"}):
        with pytest.raises(InputError, match="tree_on_device"):
            DecodeSession.of(pair, budget=12, max_new_tokens=NEW, tree_on_device=True, **kwargs)
        # where it does not apply (or here, a CPU: no GPU for the default), the default builds on the host
        assert not DecodeSession.of(pair, budget=12, max_new_tokens=NEW, record=False, **kwargs).scheduler.tree_on_device
    assert not DecodeSession.of(pair, budget=12, max_new_tokens=NEW, engine="runner",
                                record=False).scheduler.tree_on_device


def ahead_session(pair, draft_ahead: bool, verify_ahead: bool, **options) -> DecodeSession:
    """A session on the runner, the static drafter and the device's tree and walk (a CPU walks on the host by
    default), drafting (and verifying) ahead or not, prefilled."""
    proposer = DFlashProposer(pair.drafter, pair.target, static=True)
    session = DecodeSession.of(pair, budget=12, max_new_tokens=NEW, engine="runner", proposer=proposer,
                               tree_on_device=True, time_phases=False, draft_ahead=draft_ahead,
                               verify_ahead=verify_ahead, **options)
    session.target_engine.walk = "device"
    session.prefill(PROMPT)
    return session


@pytest.mark.parametrize("record", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_draft_queued_before_the_walk_is_read_gives_the_same_rounds(pair, greedy, temperature, record):
    """Overlap(draft_ahead): each round's next draft queued before the host reads the walk, from what the
    device holds (the bonus token, the committed length, the path's features padded: engines.QueuedWalk), gives the
    rounds and records of the draft queued after the read, tree for tree (the static drafter on both sides; the
    device's tree and walk), greedy and sampled, recorded (the bonus token's rank read on the device) or not; and
    so does verify_ahead (the next round's tree, rooted at the walk's bonus token on the device, and its verify
    queued behind that draft), taken by every round after the first but the last ones, whose round could end the
    output by its length. A queued draft that fails leaves the next step to draft from the host's values."""
    from ddtree_viz.engine.sampling import Sampler

    runs = {}
    for ahead in ((False, False), (True, False), (True, True)):
        session = ahead_session(pair, *ahead, record=record, sampler=Sampler(temperature=temperature, seed=5))
        scheduler = session.scheduler
        assert not scheduler.draft_ahead  # no static drafter before the first draft
        session.step()
        assert scheduler.draft_ahead == ahead[0]
        assert scheduler.verify_ahead == ahead[1]
        assert scheduler.stage is (Stage.VERIFIED if ahead[1] else Stage.DRAFTED)
        assert not session.proposer.runner.unsettled
        session.run()
        runs[ahead] = session
    before = runs[False, False]
    for ahead, after in runs.items():
        assert after.generated == before.generated and after.divergence() == (None, None)
        untimed = [dataclasses.replace(r, timings_ms={}) for r in after.history]
        assert untimed == [dataclasses.replace(r, timings_ms={}) for r in before.history]
        # every round after the first verified ahead, but where the one before could end the output by its length
        # (the output's length then + a block's tokens reach max new tokens)
        lengths = np.cumsum([1] + [len(r.new_token_ids) for r in after.history])
        expected = sum(lengths[r - 1] + after.block_size < NEW for r in range(1, len(after.history)))
        assert after.scheduler.verified_ahead == (expected if ahead[1] else 0) and (expected > 2 or not ahead[1])
    after = runs[True, True]
    if temperature == 0:
        assert after.generated == list(greedy[1].ids)[:len(after.generated)]
        assert max(r.acceptance for r in after.history) > 1  # deep enough for the padded features to matter
    if record:
        assert any(r.bonus_draft_rank is not None for r in after.history)

    session = runs[True, False]
    session.prefill(PROMPT)
    session.step()
    runner = session.proposer.runner

    def fails(*args, **kwargs):
        raise RuntimeError("a draft that cannot run")

    runner.draft_queued = fails
    session.step()  # the walk is read, the next draft not queued, the drafter's context where it was
    assert session.scheduler.stage is Stage.IDLE and not runner.unsettled
    del runner.draft_queued
    session.run()
    assert session.generated == before.generated

    # a next verify that cannot be queued: the round stands, the next step builds and verifies its own tree
    session = runs[True, True]
    session.prefill(PROMPT)
    session.step()
    engine = session.target_engine
    forward_tensors = engine.forward_tensors

    def refuses_ahead(tree, ahead=False):
        if ahead:
            raise RuntimeError("no room ahead")
        return forward_tensors(tree)

    engine.forward_tensors = refuses_ahead
    session.step()
    assert session.scheduler.stage is Stage.DRAFTED and "no room ahead" in session.scheduler.queue_error
    del engine.forward_tensors
    session.run()
    assert session.generated == before.generated and session.scheduler.verified_ahead > 2


def test_chained_greedy_steps_decode_greedys_tokens(pair, greedy):
    """The bench's greedy step with no read between steps (benchmarks/gpu/runner.py chained_greedy_stepper: each
    one-node tree's token the last step's choice on the device, forward_tensors and queue_walk) decodes greedy's tokens, and
    the runner's state after them is the host-read greedy's."""
    from ddtree_viz.benchmarks.gpu.runner import chained_greedy_stepper

    prompt, ref = greedy
    runner, host = make_runner(pair), make_runner(pair)
    logits, _ = runner.prefill(prompt)
    step, tokens = chained_greedy_stepper(runner, int(logits.argmax()))
    for _ in range(NEW - 1):
        step()
    assert [int(logits.argmax())] + tokens() == list(ref.ids)
    assert runner_greedy(host, prompt, NEW) == list(ref.ids)  # its last token is decoded, not committed
    assert runner.committed == host.committed == len(prompt) + NEW - 1
    torch.testing.assert_close(runner.rec_all, host.rec_all, atol=0, rtol=0)
    torch.testing.assert_close(runner.keys_all[:, :, :runner.committed], host.keys_all[:, :, :host.committed],
                               atol=0, rtol=0)


def test_session_runner_engine_refuses_naive_mode(pair):
    from ddtree_viz.engine.session import DecodeSession
    from ddtree_viz.errors import InputError

    with pytest.raises(InputError, match="naive"):
        DecodeSession.of(pair, verify="naive", engine="runner")
    with pytest.raises(InputError, match="engine"):
        DecodeSession.of(pair, engine="fast")


def test_runner_crosses_attention_length_buckets(pair):
    """Passes attend over the smallest length bucket that holds the sequence; crossing buckets changes nothing."""
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 256, (230,), generator=gen).tolist()
    ref = GreedyReference(pair.target, prompt, set()).extend_to(60)
    runner = StaticRunner(pair.target, max_len=1024, sizes=(1, 17), feature_layer_ids=pair.drafter.target_layer_ids)
    assert runner.buckets == [256, 512, 1024]
    assert runner_greedy(runner, prompt, 60) == list(ref.ids)
    oracle = OracleProposer(ref.ids, len(prompt), [0, 1], pair.target.config.vocab_size, block_size=8)
    assert runner_ddtree(pair, runner, oracle, prompt, 60, 16)[0] == list(ref.ids)
    assert {cols for _, cols in runner._slots} == {256, 512}


def test_default_engine_is_the_fastest_exact_engine_that_applies(pair):
    """Issue #17: one rule (engines.default_engine) picks the engine when none is named ("auto"): the runner for exact
    rounds on a Qwen3.5 hybrid on one device; transformers' forward for naive rounds, the reference GDN, pure-attention
    targets and targets split by a device_map. DecodeSession, run, bench and the page all default to it."""
    from ddtree_viz.cli import run as cli
    from ddtree_viz.engine.engines import ENGINE_CHOICES, default_engine, engine_for, runner_blocker

    assert default_engine(pair.target) == "runner" and runner_blocker(pair.target) is None
    assert default_engine(pair.target, "naive") == "transformers"
    assert default_engine(pair.target, EXACT, reference_gdn=True) == "transformers"
    attention = tiny_pair("attention", seed=0)
    assert default_engine(attention.target) == "transformers" and "Gated DeltaNet" in runner_blocker(attention.target)
    split = tiny_pair("hybrid", seed=0, layers=8).target
    dispatch_model(split, device_map={"model.embed_tokens": "cpu", "model.layers": "cpu", "model.norm": "cpu",
                                      "model.rotary_emb": "cpu", "lm_head": "cpu"}, force_hooks=True)
    assert default_engine(split) == "transformers" and "device_map" in runner_blocker(split)
    assert engine_for("auto", "exact", pair.target) == "runner" and engine_for("auto", "naive", pair.target) == "transformers"
    assert engine_for("runner", "naive") == "transformers" and engine_for("transformers", "exact") == "transformers"
    assert cli.ENGINE_CHOICES == ENGINE_CHOICES  # cli/run.py's choices (options', torch-free) are the engines'
    session = DecodeSession.of(pair, budget=8, max_new_tokens=12)
    assert session.engine == "runner" and session.settings["engine"] == "runner"
    assert DecodeSession.of(pair, verify="naive").engine == "transformers"
    assert DecodeSession.of(attention, budget=8).engine == "transformers"
    session.prefill(PROMPT)
    session.run()
    assert session.divergence() == (None, None)


def test_fused_projections_share_storage_and_change_nothing():
    """Fused projections (engine/fused.py): each original weight becomes a view of the fused matrix (no byte
    duplicated), transformers' own forward is bitwise unchanged, and fusing twice reuses the first."""
    from ddtree_viz.engine.fused import GDN_PROJECTIONS, MLP_PROJECTIONS, fuse_linears

    target = tiny_pair("hybrid", seed=2).target
    ids = torch.tensor([list(range(3, 20))])
    before = target(input_ids=ids).logits
    gdn = target.model.layers[0].linear_attn
    params = sum(p.numel() for p in target.parameters())
    weights = [getattr(gdn, n).weight.detach().clone() for n in GDN_PROJECTIONS]
    fused = fuse_linears(gdn, GDN_PROJECTIONS)
    assert fused.weight.shape[0] == sum(w.shape[0] for w in weights) and fused.sizes == tuple(w.shape[0] for w in weights)
    torch.testing.assert_close(fused.weight, torch.cat(weights), rtol=0, atol=0)
    offset = 0
    for name, w in zip(GDN_PROJECTIONS, weights):
        assert getattr(gdn, name).weight.data_ptr() == fused.weight[offset].data_ptr()
        offset += w.shape[0]
    assert fuse_linears(gdn, GDN_PROJECTIONS) is fused
    assert fuse_linears(target.model.layers[0].mlp, ("gate_proj", "down_proj")) is None  # different input widths
    for layer in target.model.layers:
        fuse_linears(layer.mlp, MLP_PROJECTIONS)
    assert sum(p.numel() for p in target.parameters()) == params
    assert torch.equal(target(input_ids=ids).logits, before)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_runner_with_fused_projections_equals_greedy(attention):
    """The runner's GPU-side forms on the CPU (fused projections; SDPA over the bucket with a boolean mask):
    greedy == transformers' greedy, DDTree == greedy token for token, a tree pass == the engine's verify."""
    pair = tiny_pair("hybrid", seed=0, layers=8)  # its own: fusing rewires the weights
    prompt = pair.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    ref = GreedyReference(pair.target, prompt, set()).extend_to(NEW)
    forms = {"gdn_kernel": "torch", "fused": True, "attention": attention, "compile": False, "blas": "default",
             "gate_up": "fused", "gdn_step": "torch", "commit": "torch", "gdn_prep": "torch", "norm": "torch",
             "pdl": "off"}
    runner = StaticRunner(pair.target, max_len=256, sizes=(1, 17), feature_layer_ids=pair.drafter.target_layer_ids,
                          forms=forms)
    assert dataclasses.asdict(runner.forms) == forms and len(runner._fused) == 2 * len(runner.layers)
    assert all(f is not None for f in runner._fused.values())
    assert runner_greedy(runner, prompt, NEW) == list(ref.ids)
    oracle = OracleProposer(ref.ids, len(prompt), [0, 2, 1], pair.target.config.vocab_size, block_size=8)
    out, rounds = runner_ddtree(pair, runner, oracle, prompt, NEW, 16)
    assert out == list(ref.ids) and max(rounds) > 2
    rng = random.Random(1)
    tree = tree_from_parents(random_tree(17, 6, rng), rng)
    runner.prefill(prompt)
    logits, _, _ = runner.forward(tree)
    cache = DynamicCache(config=pair.target.config)
    pair.target(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True)
    result = verify_tree(pair.target, cache, tree, len(prompt), EXACT, want_hidden=False)
    torch.testing.assert_close(logits, result.logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("form", ["split", "padded"])
def test_the_mlps_gate_up_forms_compute_the_fused_gemm(form):
    """RunnerForms.gate_up: the MLP's gate and up projections as two GEMMs on the fused weight's halves, or as one
    over rows padded to a multiple of 16 (what "auto" may take on a GPU, timed per tree size and library), give a
    tree pass the fused GEMM's logits and features, and the runner's greedy and DDTree rounds stay greedy's."""
    pair = tiny_pair("hybrid", seed=0, layers=8)  # its own: fusing rewires the weights
    prompt = pair.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    ref = GreedyReference(pair.target, prompt, set()).extend_to(NEW)
    rng = random.Random(2)
    tree = tree_from_parents(random_tree(21, 6, rng), rng)  # 21 rows: 11 of padding to 32
    outs = []
    for gate_up in ("fused", form):
        forms = {"gdn_kernel": "torch", "fused": True, "attention": "eager", "compile": False, "blas": "default",
                 "gate_up": gate_up}
        runner = StaticRunner(pair.target, max_len=256, sizes=(1, 21), feature_layer_ids=pair.drafter.target_layer_ids,
                              forms=forms)
        assert runner._gate_up_form == gate_up and runner.forms.gate_up == gate_up
        runner.prefill(prompt)
        logits, feats, _ = runner.forward(tree)
        outs.append((logits.clone(), feats.clone()))
    for a, b in zip(*outs):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-6)
    assert runner_greedy(runner, prompt, NEW) == list(ref.ids)
    oracle = OracleProposer(ref.ids, len(prompt), [0, 2, 1], pair.target.config.vocab_size, block_size=8)
    out, rounds = runner_ddtree(pair, runner, oracle, prompt, NEW, 20)
    assert out == list(ref.ids) and max(rounds) > 2


def test_runner_options_on_the_cpu():
    """The defaults resolve to the torch forms on a CPU (bitwise what the runner computed before them); a Triton
    kernel asked for where it cannot run is a clear error."""
    from ddtree_viz.engine.kernels.device import interpreting, triton_available
    from ddtree_viz.engine.runner import RunnerForms

    cpu = torch.device("cpu")
    assert dataclasses.asdict(RunnerForms.of(None, cpu)) == {
        "gdn_kernel": "torch", "fused": False, "attention": "eager", "compile": False, "blas": "default",
        "gate_up": "fused", "gdn_step": "torch", "commit": "torch", "gdn_prep": "torch", "norm": "torch", "pdl": "off"}
    runner = make_runner(tiny_pair("hybrid", seed=0, layers=2))
    assert not runner.launch_ahead(17) and runner._ahead is None  # no graphs to launch ahead: the forward launches
    assert device_word(cpu) == (None, "no CUDA device")
    assert RunnerForms.of({"blas": "cublaslt"}, cpu).blas == "default"  # a CPU has one BLAS
    assert RunnerForms.of({"compile": True}, cpu).compile  # asked for: inductor's C++ backend (the compile tests)
    with pytest.raises(ValueError, match="attention"):
        RunnerForms.of({"attention": "flash"}, cpu)
    with pytest.raises(ValueError, match="gdn_kernel"):
        RunnerForms.of({"gdn_kernel": "cuda"}, cpu)
    with pytest.raises(ValueError, match="blas"):
        RunnerForms.of({"blas": "mkl"}, cpu)
    assert RunnerForms.of(None, cpu).gate_up == "fused"  # "auto" times forms in CUDA graphs: none here
    assert RunnerForms.of({"gate_up": "split"}, cpu).gate_up == "split"
    with pytest.raises(ValueError, match="gate_up"):
        RunnerForms.of({"gate_up": "halves"}, cpu)
    # ONE_LAUNCH_CHOICES' parts, each named in its error
    for one_launch in ("gdn_step", "commit", "gdn_prep", "norm"):
        with pytest.raises(ValueError, match=one_launch):
            RunnerForms.of({one_launch: "fast"}, cpu)
    assert RunnerForms.of(None, cpu).gdn_prep == RunnerForms.of(None, cpu).norm == "torch"  # auto: the pieces
    on_cuda = RunnerForms.of(None, torch.device("cuda"))
    assert on_cuda.gdn_step == on_cuda.gdn_prep == on_cuda.norm == ("triton" if triton_available() else "torch")
    if not (triton_available() and interpreting()):
        with pytest.raises(ValueError, match="Triton"):
            RunnerForms.of({"gdn_kernel": "triton-rule"}, cpu)
        with pytest.raises(ValueError, match="Triton"):
            RunnerForms.of({"gdn_step": "triton"}, cpu)
        with pytest.raises(ValueError, match="Triton"):
            RunnerForms.of({"gdn_prep": "triton"}, cpu)
        with pytest.raises(ValueError, match="Triton"):
            RunnerForms.of({"norm": "triton"}, cpu)


def test_runner_parts_by_name():
    """The runner's parts (PARTS) are forced by name: a name that is no part is refused with the parts named, a part
    forced to a form other than its default reaches the runner, and resolved forms resolve to themselves."""
    from ddtree_viz.engine.runner import PARTS, RunnerForms

    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="no runner part named gdn_kernels: the parts are gdn_kernel, fused, "):
        RunnerForms.of({"gdn_kernels": "torch"}, cpu)
    with pytest.raises(ValueError, match="fused must be one of None, True, False, not 'yes'"):
        RunnerForms.of({"fused": "yes"}, cpu)
    default = RunnerForms.of(None, cpu)
    assert RunnerForms.of(dataclasses.asdict(default), cpu) == default
    assert tuple(PARTS) == tuple(dataclasses.asdict(default))  # a part per form, in order
    assert default.gate_up == "fused"
    runner = StaticRunner(tiny_pair("hybrid", seed=0, layers=2).target, max_len=64, sizes=(1,), graphs=False,
                          forms={"gate_up": "split"})
    assert runner.forms.gate_up == runner._gate_up_form == "split"
    assert runner.forms == RunnerForms.of({"gate_up": "split"}, cpu)  # the other parts at their defaults
    assert RunnerForms.of(dataclasses.asdict(runner.forms), cpu) == runner.forms


def _compiled_against_eager(pair, device, prompt_len: int = 230, new: int = 60, gdn_kernel: str = "torch",
                            blas: str = "auto"):
    """The runner with its compiled pieces (RunnerForms.compile; tree delta rule `gdn_kernel`; GEMM library
    `blas`) against the eager runner with the torch forms and torch's default GEMMs, on one target: a tree pass's
    logits and features, the state after a commit, greedy == transformers' greedy and DDTree == greedy across tree
    sizes and length buckets (no graph compiled after the runner's construction); on CUDA, every tree size's
    graphs with the library asked for, or with the faster one of those "auto" timed."""
    from torch._dynamo.utils import counters

    from ddtree_viz.engine.runner import BLAS_LIBRARIES, GATE_UP_FORMS, pick_gate_up

    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 256, (prompt_len,), generator=gen).tolist()
    ref = GreedyReference(pair.target, prompt, set()).extend_to(new)
    kw = dict(max_len=1024, sizes=(1, 17), feature_layer_ids=pair.drafter.target_layer_ids)
    eager = StaticRunner(pair.target, forms={"gdn_kernel": "torch", "fused": True, "attention": "eager",
                                             "compile": False, "blas": "default", "gate_up": "fused",
                                             "gdn_step": "torch", "commit": "torch", "norm": "torch"}, **kw)
    graphs = counters["stats"]["unique_graphs"]
    runner = StaticRunner(pair.target, forms={"gdn_kernel": gdn_kernel, "fused": True, "attention": "eager",
                                              "compile": True, "blas": blas}, **kw)
    assert runner.compile_error is None and runner.forms.compile and runner.compile_s > 0
    assert runner.kernel_error is None and runner.forms.gdn_kernel == gdn_kernel
    want = "triton" if device == "cuda" else "torch"  # the step's core and the commit's update each one launch
    assert runner.forms.gdn_step == want and runner.forms.commit == want and runner.forms.norm == want
    assert runner.forms.gdn_prep == (want if runner.rule.takes_prep else "torch")  # a tree's prep one launch too
    # one graph per piece serves every layer (the one-node step and trees of any size apart): 8 pieces
    made = counters["stats"]["unique_graphs"] - graphs
    assert made <= 16, made
    rng = random.Random(1)
    tree = tree_from_parents(random_tree(23, 6, rng), rng)  # 23 nodes: a size the warm-up did not see (it ran 17)
    accepted = tree.path_to(len(tree) - 1)[:8]
    got = []
    for r in (eager, runner):
        r.prefill(prompt[:40])
        logits, feats, slot = r.forward(tree)
        logits, feats = logits.clone(), feats.clone()
        r.commit(slot, accepted)
        step, _, slot = r.forward(one_node(7))
        step = step.clone()
        r.commit(slot, [0])
        got.append((logits, feats, step, r.rec_all.clone(), r.conv_all.clone(), r.keys_all[:, :, : r.committed].clone()))
    for a, b in zip(*got):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    assert runner_greedy(runner, prompt, new) == list(ref.ids)
    for budget, ranks in [(16, [0, 2, 1]), (40, [0])]:  # 40: a tree size (and graph) added on demand
        oracle = OracleProposer(ref.ids, len(prompt), ranks, pair.target.config.vocab_size, block_size=8)
        out, rounds = runner_ddtree(pair, runner, oracle, prompt, new, budget)
        assert out == list(ref.ids) and max(rounds) > 2
    assert {cols for _, cols in runner._slots} >= {256, 512}  # the length buckets were crossed
    # nothing compiled after the construction but the SiLU piece for the strides of each gate+up form "auto" took
    # other than the fused GEMM's (at a size's first capture)
    forms = {pick_gate_up(timed) for timed in runner.gate_up_forms.values()} - {"fused"}
    assert made <= counters["stats"]["unique_graphs"] - graphs <= made + len(forms)
    sizes = {size for size, _ in runner._slots}
    if device == "cuda":
        assert set(runner.blas) == sizes
        assert {size for size, _ in runner.gate_up_forms} == sizes  # "auto": each form timed per size and library
        assert all(set(timed) == set(GATE_UP_FORMS) and min(timed.values()) > 0
                   for timed in runner.gate_up_forms.values())
        for size, chosen in runner.blas.items():
            if blas == "auto":  # both captured and replayed; the faster kept
                times = {name: chosen[f"{name}_ms"] for name in BLAS_LIBRARIES}
                assert all(ms > 0 for ms in times.values()) and chosen["library"] == min(times, key=times.get)
            else:
                assert chosen == {"library": blas}
    else:
        assert runner.blas == {} and runner.forms.blas == "default"
    return runner


def _cxx() -> str | None:
    import shutil

    return next((c for c in ("g++", "c++", "clang++") if shutil.which(c)), None)


@pytest.mark.skipif(_cxx() is None, reason="torch.compile's CPU backend (inductor) needs a C++ compiler: none on PATH")
def test_compiled_runner_equals_the_eager_runner():
    """Issue #18: the part compile forced on (inductor's C++ backend on the CPU) computes what the eager runner
    computes (fp32, 1e-5) and decodes the same tokens; greedy and DDTree == transformers' greedy."""
    _compiled_against_eager(tiny_pair("hybrid", seed=0, layers=8), "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs, Triton)")
def test_compiled_runner_with_cuda_graphs_equals_the_eager_runner():
    """The compiled pieces inside the captured CUDA graphs (the default on CUDA): the same checks."""
    from ddtree_viz.engine.runner import RunnerForms

    pair = tiny_pair("hybrid", seed=0, layers=8)
    pair.target.to("cuda")
    pair.drafter.to("cuda")
    assert RunnerForms.of(None, torch.device("cuda")).compile
    assert RunnerForms.of(None, torch.device("cuda")).gdn_kernel == "triton-rule"
    for kernel in ("torch", "triton-rule", "triton-solve"):
        runner = _compiled_against_eager(pair, "cuda", gdn_kernel=kernel)
    # a later runner of the model (a new session) takes each size's library from the first: no second measurement
    again = StaticRunner(pair.target, max_len=512, sizes=(1, 17), forms=dataclasses.asdict(runner.forms))
    again.prefill(list(range(9)))
    again.forward(one_node(3))
    assert again.blas[1] is runner.blas[1]
    for blas in ("cublas", "cublaslt"):  # each library's graphs (auto chose one above)
        _compiled_against_eager(pair, "cuda", gdn_kernel="triton-rule", blas=blas)


def test_the_runners_compile_setup_turns_compile_off_for_a_compiler_not_for_memory(pair, monkeypatch):
    """A compiler that cannot run leaves the runner's pieces uncompiled with compile_error saying why; running out
    of memory while they warm up (a 24 GB card's cap) is raised as it is, not taken for a compiler's failure."""
    from ddtree_viz.engine import fused
    from ddtree_viz.engine.runner import autotune

    monkeypatch.setattr(autotune, "_WARMED", set())  # warmed once a process: an earlier test's runner of this model

    def failing(exc):
        def compiled(fn):
            def fails(*args, **kwargs):
                raise exc
            return fails
        return compiled

    forms = {"gdn_kernel": "torch", "fused": True, "attention": "eager", "compile": True, "blas": "default"}
    monkeypatch.setattr(fused, "compiled", failing(RuntimeError("no C++ compiler here")))
    runner = StaticRunner(pair.target, max_len=256, sizes=(1, 17), forms=forms)
    assert not runner.forms.compile and "no C++ compiler here" in runner.compile_error
    monkeypatch.setattr(fused, "compiled", failing(torch.OutOfMemoryError("CUDA out of memory")))
    with pytest.raises(torch.OutOfMemoryError):
        StaticRunner(pair.target, max_len=256, sizes=(1, 17), forms=forms)


def test_warm_runner_compiles_only_where_the_runner_compiles():
    """The page's load builds a runner first where its construction compiles (CUDA), so the first Step does not
    pay the compile; on a CPU (compile off) and for a target the runner does not serve it does nothing."""
    from ddtree_viz.engine.engines import warm_runner
    from ddtree_viz.engine.runner import RunnerForms
    from tests import tiny

    hybrid = tiny.target_model("hybrid", seed=0)
    assert not RunnerForms.of(None, torch.device("cpu")).compile
    assert warm_runner(hybrid) == 0.0
    assert warm_runner(tiny.target_model("attention", seed=0)) == 0.0
    if torch.cuda.is_available():
        assert warm_runner(hybrid.cuda()) > 0.0


def test_warm_rounds_runs_a_short_session_of_the_settings_and_drops_it(pair):
    """warm_rounds (the page's load on a GPU) runs the settings' prefill, rounds and check, and changes nothing a
    session of the same settings computes afterwards."""
    from ddtree_viz.engine.session import warm_rounds
    from ddtree_viz.options import DecodeSettings

    settings = DecodeSettings(budget=8, max_new_tokens=12, engine="runner")
    prompt = pair.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    outputs = []
    for warm in (False, True):
        if warm:
            assert warm_rounds(pair, settings) > 0.0
        session = DecodeSession(pair, settings)
        session.prefill(prompt_ids=prompt)
        session.run()
        outputs.append(session.generated)
    assert outputs[0] == outputs[1] and len(outputs[0]) == 12


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Triton, CUDA graphs)")
def test_the_pages_first_step_after_load_compiles_nothing():
    """The page's load on a GPU runs a first round at its default settings (page/host.py, warm_rounds), so a new
    tab's first Step and check at those settings make no Triton kernel and no compiled graph (a fresh process's
    first Step took 8.9 s at 27B shapes before: docs/lab/NOTEBOOK.md section 22)."""
    import triton
    from ddtree_viz.page import actions
    from ddtree_viz.page.host import ModelHost
    from ddtree_viz.page.state import TabState, read_settings
    from ddtree_viz.prompts import DEFAULT_PROMPTS

    host = ModelHost(None, None, "bfloat16", "cuda", "runner")
    host.start(background=False)
    assert host.ready and host.warmup_s > 0.0, host.error
    made = []
    hook = triton.knobs.runtime.jit_post_compile_hook
    triton.knobs.runtime.jit_post_compile_hook = lambda **kw: made.append(kw["fn"].name)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    try:
        tab = TabState()
        values = dict(prompt=DEFAULT_PROMPTS[2], budget=32, block_size=host.pair.drafter.block_size, max_new_tokens=64,
                      verify="exact", method="ddtree")  # the Step tab's defaults
        for _ in range(2):
            actions.step(host, tab, read_settings(host, values), check=False)
            actions.check(host, tab)
    finally:
        triton.knobs.runtime.jit_post_compile_hook = hook
    assert made == [] and torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
    assert len(tab.session.history) == 2


def _doubled(x):
    return x * 2


def test_compiled_pieces_hold_many_models_in_one_process():
    """Issue #27 item 2: the compiled pieces are shared by every runner of a process, each model adding graphs of its
    own (what dynamo cannot make symbolic: ranks, dtypes, constants); with fullgraph, dynamo's default limit of 8
    graphs a function is a hard error, so a runner built after a few others refused to compile (test_tree_kernel
    after the other GPU test files). Twelve kinds of input through one compiled piece all run compiled."""
    from ddtree_viz.engine import fused

    piece = fused.compiled(_doubled)
    for rank in range(1, 13):
        x = torch.ones((2,) * rank)
        assert torch.equal(piece(x), x * 2)


def test_prefill_features_are_transformers_hidden_states():
    """The prefill keeps the drafter's context features by hooks (not every layer's hidden state: 2.7 GB at 4,096
    tokens of a 27B model): the same tensors as output_hidden_states=True's [i + 1], the last layer's after the
    final norm."""
    target = tiny_pair("hybrid", seed=0, layers=8).target
    ids, prompt = [1, 6, 7], list(range(3, 40))
    _, feats = StaticRunner(target, max_len=256, sizes=(1,), feature_layer_ids=ids).prefill(prompt)
    with torch.no_grad():
        hidden = target(input_ids=torch.tensor([prompt]), output_hidden_states=True).hidden_states
    assert torch.equal(feats, torch.cat([hidden[i + 1][0] for i in ids], dim=-1))


def test_a_prefill_in_chunks_is_the_prefill_in_one_forward(monkeypatch):
    """A long prompt's prefill runs in chunks of runner.PREFILL_CHUNK tokens, the cache carried between them (a
    prefill's transients a chunk's: a 16k prompt on a 4-bit 27B fits a 24 GB card). In float32 the chunks give what
    one forward gives: the last position's logits, the drafter's features, and every layer's committed state, and
    the decode after it."""
    from ddtree_viz.engine.runner import core as runner_module  # where prefill reads it

    target = tiny_pair("hybrid", seed=0, layers=8).target
    ids, prompt = [1, 6, 7], list(range(3, 40))
    whole = StaticRunner(target, max_len=256, sizes=(1,), feature_layer_ids=ids)
    logits, feats = whole.prefill(prompt)
    monkeypatch.setattr(runner_module, "PREFILL_CHUNK", 5)  # 37 tokens: seven chunks and a partial one
    chunked = StaticRunner(target, max_len=256, sizes=(1,), feature_layer_ids=ids)
    logits_c, feats_c = chunked.prefill(prompt)
    torch.testing.assert_close(logits_c, logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(feats_c, feats, rtol=1e-5, atol=1e-5)
    for name in ("rec_all", "conv_all", "keys_all", "values_all"):
        torch.testing.assert_close(getattr(chunked, name), getattr(whole, name), rtol=1e-5, atol=1e-5, msg=name)
    assert chunked.committed == whole.committed == len(prompt)


def test_the_prefill_writes_transformers_cache_into_the_runners_buffers():
    """The prefill's attention layers write into the runner's own key / value buffers (cache.BufferLayer: no second
    copy of the cache at 16k tokens), chunk by chunk: the rows are transformers' own cache of the same forward, the
    GDN states too, and rows past the prompt are untouched."""
    from ddtree_viz.engine.cache import new_cache
    from ddtree_viz.engine.runner import core as runner_module  # where prefill reads it

    target = tiny_pair("hybrid", seed=0, layers=8).target
    prompt = list(range(3, 40))
    reference = new_cache(target)
    with torch.no_grad():
        target(input_ids=torch.tensor([prompt]), cache=reference, use_cache=True)
    for chunk in (runner_module.PREFILL_CHUNK, 5):
        runner_module.PREFILL_CHUNK, kept = chunk, runner_module.PREFILL_CHUNK
        try:
            runner = StaticRunner(target, max_len=256, sizes=(1,))
            runner.keys_all.fill_(7.0)
            runner.prefill(prompt)
        finally:
            runner_module.PREFILL_CHUNK = kept
        n = len(prompt)
        for i, layer in enumerate(reference.layers):
            if i in runner.buffers.conv:
                torch.testing.assert_close(runner.buffers.rec[i], layer.recurrent_states[0][0].to(runner.buffers.rec[i].dtype))
                continue
            torch.testing.assert_close(runner.buffers.keys[i][:, :, :n], layer.keys, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(runner.buffers.values[i][:, :, :n], layer.values, rtol=1e-5, atol=1e-5)
            assert bool((runner.buffers.keys[i][:, :, n:] == 7.0).all()), "rows past the prompt were written"


def test_a_buffer_layer_refuses_rows_past_its_buffer():
    from ddtree_viz.engine.cache import BufferLayer

    layer = BufferLayer(torch.zeros(1, 2, 4, 3), torch.zeros(1, 2, 4, 3))
    keys, _ = layer.update(torch.ones(1, 2, 3, 3), torch.ones(1, 2, 3, 3))
    assert keys.shape[-2] == 3 and layer.get_seq_length() == 3
    with pytest.raises(ValueError, match="do not fit"):
        layer.update(torch.ones(1, 2, 2, 3), torch.ones(1, 2, 2, 3))


def test_a_captures_warm_up_changes_only_what_the_state_copy_restores(pair, greedy):
    """A new slot's capture (and the compile warm-up) runs forwards and commits on the live state and restores
    State.copy's tensors after: the GDN layers' conv windows and recurrent states and the committed length, not
    the attention rows (at a 16k prompt 1.06 GiB more at the 27B's shapes, what a 24 GB card ran out on). The warm-up
    writes only attention rows past the committed ones: after it and the restore, every committed row, window and
    state is as before, and the rows past them did change (the warm-up wrote there, so this test sees its writes)."""
    from ddtree_viz.engine.runner.buffers import State
    from ddtree_viz.engine.runner.capture import warm_up

    prompt, ref = greedy
    runner = make_runner(pair)
    oracle = OracleProposer(ref.ids, len(prompt), [0, 1], pair.target.config.vocab_size, block_size=8)
    runner_ddtree(pair, runner, oracle, prompt, 24, 16)
    s, c = runner.buffers, runner.committed
    before = [t.clone() for t in (s.keys_all, s.values_all, s.conv_all, s.rec_all, s.committed_t)]
    slot = runner._new_slot(17, runner.buckets[-1])
    saved = s.copy()
    with torch.no_grad():  # (as the capture runs: Runner._add_slot)
        warm_up(slot, runner.model)
    State.restore(saved)
    after = (s.keys_all, s.values_all, s.conv_all, s.rec_all, s.committed_t)
    for old, new in zip(before[:2], after[:2]):
        assert torch.equal(old[:, :, :c], new[:, :, :c]) and not torch.equal(old[:, :, c:], new[:, :, c:])
    assert all(torch.equal(old, new) for old, new in zip(before[2:], after[2:]))

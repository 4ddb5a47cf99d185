"""The draft tree: best-first == the budget highest-scoring prefixes; mask, positions, acceptance walk."""

import itertools

import numpy as np
import pytest
import torch

from ddtree_viz.engine.tree import DraftTree, build_chain, build_tree, follow_tree, tree_on_device, verify_inputs


def candidates(depth: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(depth, 50)) * 2
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    order = np.argsort(-logp, axis=-1)[:, :k]
    return np.take_along_axis(logp, order, -1), order


@pytest.mark.parametrize("budget", [1, 2, 7, 20, 60])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_best_first_picks_the_highest_scoring_prefixes(budget, seed):
    depth, k = 4, min(budget, 6)
    lp, ids = candidates(depth, k, seed)
    tree = build_tree(99, lp, ids, budget)
    # brute force: every rank path of length 1..depth with ranks < k, scored by its summed log-probs
    scores = sorted(
        (sum(lp[d, r] for d, r in enumerate(ranks)) for n in range(1, depth + 1) for ranks in itertools.product(range(k), repeat=n)),
        reverse=True,
    )
    got = sorted((sum(tree.logprobs[p] for p in tree.path_to(pos)) for pos in range(1, len(tree))), reverse=True)
    assert len(tree) == 1 + min(budget, len(scores))
    np.testing.assert_allclose(got, scores[: len(got)], rtol=1e-9)
    for pos in range(1, len(tree)):  # prefix-closed, parents first, depth/rank/token consistent
        parent = tree.parents[pos]
        assert 0 <= parent < pos and tree.depths[pos] == tree.depths[parent] + 1
        assert tree.token_ids[pos] == ids[tree.depths[pos] - 1, tree.ranks[pos]]
        assert tree.logprobs[pos] == pytest.approx(lp[tree.depths[pos] - 1, tree.ranks[pos]])
    assert tree.token_ids[0] == 99 and tree.parents[0] == -1


def build_tree_reference(root_token_id, top_logprobs, top_token_ids, budget):
    """build_tree written plainly (numpy scalars, the score carried in each heap entry, a node's score its parent's
    plus its own log-prob): the twin the faster one must equal node for node."""
    import heapq

    from ddtree_viz.engine.tree import DraftTree

    depth_limit, k = top_logprobs.shape
    token_ids, parents, depths, ranks, logprobs = [root_token_id], [-1], [0], [-1], [0.0]
    if budget <= 0 or depth_limit == 0 or k == 0:
        return DraftTree(tuple(token_ids), tuple(parents), tuple(depths), tuple(ranks), tuple(logprobs))
    lp = top_logprobs.astype(np.float64)
    heap = [(-lp[0, 0], (0,), 0, 1, 0, lp[0, 0], 0.0)]
    while heap and len(token_ids) - 1 < budget:
        _, rank_path, parent, depth, rank, score, above = heapq.heappop(heap)
        pos = len(token_ids)
        token_ids.append(int(top_token_ids[depth - 1, rank]))
        parents.append(parent)
        depths.append(depth)
        ranks.append(rank)
        logprobs.append(float(lp[depth - 1, rank]))
        if rank + 1 < k:
            s = above + lp[depth - 1, rank + 1]
            heapq.heappush(heap, (-s, rank_path[:-1] + (rank + 1,), parent, depth, rank + 1, s, above))
        if depth < depth_limit:
            s = score + lp[depth, 0]
            heapq.heappush(heap, (-s, rank_path + (0,), pos, depth + 1, 0, s, score))
    return DraftTree(tuple(token_ids), tuple(parents), tuple(depths), tuple(ranks), tuple(logprobs))


@pytest.mark.parametrize("seed", range(6))
def test_build_tree_equals_its_reference_twin(seed):
    """The host-side build (every round) against the version first written, node for node: float32 log-probs as
    the drafter gives them, many ties (rounded log-probs: the rank path decides), -inf candidates, every budget."""
    rng = np.random.default_rng(seed)
    for depth, k, budget in [(15, 64, 64), (15, 128, 128), (7, 16, 16), (3, 5, 200), (1, 4, 3), (15, 1, 30)]:
        logits = rng.normal(size=(depth, 300)) * rng.choice([0.5, 3.0])
        lp = np.sort(logits - np.log(np.exp(logits).sum(-1, keepdims=True)), axis=-1)[:, ::-1][:, :k]
        lp = lp.astype(np.float32)
        ids = rng.integers(0, 1000, size=(depth, k))
        variants = [lp, np.round(lp, 1), np.where(np.arange(k) >= k // 2, -np.inf, lp).astype(np.float32)]
        for values in variants:
            for b in (0, 1, budget // 3, budget):
                want = build_tree_reference(11, values, ids, b)
                assert build_tree(11, values, ids, b) == want


@pytest.mark.parametrize("seed", range(4))
def test_the_tree_built_on_the_device_is_build_trees(seed):
    """tree_on_device (tensor ops where the log-probs are, no host read) against build_tree, node for node: float32
    log-probs, many ties (rounded: the rank path decides, also across depths), -inf candidates, every budget size
    up to more than all paths, through DraftTree.from_logprobs as a session calls it."""
    rng = np.random.default_rng(100 + seed)
    for depth, k, budget in [(15, 64, 64), (8, 16, 128), (3, 4, 200), (1, 4, 3), (15, 1, 30), (4, 3, 7)]:
        logits = torch.tensor(rng.normal(size=(depth, max(k, 2))) * rng.choice([0.5, 3.0]), dtype=torch.float32)
        logp = torch.log_softmax(logits, -1)
        for values in (logp, torch.round(logp, decimals=1), torch.round(logp * 2) / 2,
                       logp.masked_fill(torch.rand(logp.shape, generator=torch.Generator().manual_seed(seed)) < 0.97,
                                        -torch.inf)):
            for b in (0, 1, 2, budget // 3, budget):
                want = DraftTree.from_logprobs(11, values, b)
                got = DraftTree.from_logprobs(11, values, b, on_device=True)
                assert got == want, (depth, k, b)
    assert len(tree_on_device(torch.zeros(2, 3), 100)[0]) == 1 + 3 + 9


def test_depth_is_capped_by_the_drafted_rows():
    lp, ids = candidates(3, 1, 0)
    tree = build_tree(5, lp, ids, budget=50)
    assert len(tree) == 4 and max(tree.depths) == 3  # a chain: one candidate per depth


def test_mask_positions_and_walk():
    lp, ids = candidates(3, 3, 4)
    tree = build_tree(7, lp, ids, budget=8)
    visible = tree.ancestors()
    for i in range(len(tree)):
        assert set(np.flatnonzero(visible[i])) == set(tree.path_to(i))
    input_ids, position_ids, mask = verify_inputs(tree, committed_len=5, dtype=torch.float32, device="cpu")
    assert input_ids[0].tolist() == list(tree.token_ids)
    assert position_ids[0].tolist() == [5 + d for d in tree.depths]
    assert mask.shape == (1, 1, len(tree), 5 + len(tree))
    assert (mask[0, 0, :, :5] == 0).all()  # the committed prefix is visible to all
    assert ((mask[0, 0, :, 5:] == 0).numpy() == visible).all()
    # walk: target argmax picks the deepest path through rank-0 children, then a token not in the tree
    leaf = max(range(len(tree)), key=lambda p: (tree.depths[p], -p))
    path = tree.path_to(leaf)
    argmax = [-1] * len(tree)
    for a, b in zip(path, path[1:]):
        argmax[a] = tree.token_ids[b]
    argmax[leaf] = 12345
    accepted, bonus = follow_tree(tree, argmax)
    assert accepted == path and bonus == 12345


def test_chain():
    chain = build_chain(3, [4, 5, 6], [-0.1, -0.2, -0.3])
    assert chain.parents == (-1, 0, 1, 2) and chain.depths == (0, 1, 2, 3)
    accepted, bonus = follow_tree(chain, [4, 5, 9, 0])
    assert accepted == [0, 1, 2] and bonus == 9


def _random_tree(rng, n: int, vocab: int):
    """A tree of n nodes in join order (each parent before its children), tokens from a small vocabulary so
    siblings share tokens (treeops.follow then takes the later sibling)."""
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)]
    depths = [0]
    for i in range(1, n):
        depths.append(depths[parents[i]] + 1)
    return parents, depths, [int(t) for t in rng.integers(0, vocab, n)]


@pytest.mark.parametrize("seed", range(40))
def test_the_walk_on_the_device_is_treeops_follow(seed):
    """follow_on_device (tensor ops, nothing read back) against the host's walk, node for node: random trees with
    shared sibling tokens, the target's choices drawn to follow the tree deep, a padded tail of orphan nodes whose
    token is the root's choice (the runner's inert padding must never be accepted)."""
    from ddtree_viz import treeops
    from ddtree_viz.engine.tree import follow_on_device

    rng = np.random.default_rng(seed)
    n, vocab, pad = int(rng.integers(1, 40)), int(rng.integers(2, 6)), int(rng.integers(0, 5))
    parents, depths, tokens = _random_tree(rng, n, vocab)
    choice = [int(t) for t in rng.integers(0, vocab, n + pad)]
    for i in range(1, n):  # mostly follow a node: deep accepted paths, not just the root
        if rng.random() < 0.6:
            choice[parents[i]] = tokens[i]
    accepted, bonus = treeops.follow(parents, tokens, choice[:n])
    max_path = max(depths) + 1 + int(rng.integers(0, 3))
    walk, got_bonus = follow_on_device(torch.tensor(parents + [-1] * pad), torch.tensor(depths + [1] * pad),
                                       torch.tensor(tokens + [choice[0]] * pad), torch.tensor(choice), max_path)
    L = len(accepted)
    assert walk.tolist() == accepted + [accepted[-1]] * (max_path - L) + [accepted[-1], L]
    assert int(got_bonus) == bonus


def test_the_walk_on_the_device_takes_the_later_of_two_matching_siblings():
    from ddtree_viz.engine.tree import follow_on_device

    # root 0 -> 1 (token 5), 2 (token 5), 1 -> 3 (token 7); the target chose 5 at the root and 7 after node 1
    walk, bonus = follow_on_device(torch.tensor([-1, 0, 0, 1]), torch.tensor([0, 1, 1, 2]), torch.tensor([9, 5, 5, 7]),
                                   torch.tensor([5, 7, 8, 3]), 4)
    assert walk.tolist() == [0, 2, 2, 2, 2, 2] and int(bonus) == 8


@pytest.mark.parametrize("seed", range(12))
def test_the_trees_inputs_on_the_device_are_treeops(seed):
    """tree_inputs_on_device (tensor ops) against treeops.ancestor_matrix and treeops.conv_gather: random trees,
    padded with children of the root as the runner pads them, conv kernels 2 to 5."""
    from ddtree_viz import treeops
    from ddtree_viz.engine.tree import tree_inputs_on_device

    rng = np.random.default_rng(100 + seed)
    n, pad, kernel = int(rng.integers(1, 40)), int(rng.integers(0, 6)), int(rng.integers(2, 6))
    parents, depths, _ = _random_tree(rng, n, 4)
    parents, depths = parents + [0] * pad, depths + [1] * pad
    anc, gather = tree_inputs_on_device(torch.tensor(parents), torch.tensor(depths), kernel, max(depths) + int(seed % 3))
    assert np.array_equal(anc.numpy(), treeops.ancestor_matrix(parents))
    assert np.array_equal(gather.numpy(), treeops.conv_gather(parents, depths, kernel))
    chain = int(rng.integers(1, 130))  # a chain as deep as its bound (the mask's squarings reach exactly that far)
    parents, depths = [-1] + list(range(chain - 1)), list(range(chain))
    anc, gather = tree_inputs_on_device(torch.tensor(parents), torch.tensor(depths), kernel, chain - 1)
    assert np.array_equal(anc.numpy(), treeops.ancestor_matrix(parents))
    assert np.array_equal(gather.numpy(), treeops.conv_gather(parents, depths, kernel))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (the CUDA graph)"))])
def test_the_tree_builders_trees_are_build_trees(device):
    """DeviceTreeBuilder (a CUDA graph on a GPU, replayed with new log-probs and roots; eager elsewhere) builds
    build_tree's trees, node for node, call after call."""
    from ddtree_viz.engine.tree import DeviceTreeBuilder

    builder = DeviceTreeBuilder(budget=20)
    gen = torch.Generator().manual_seed(0)
    for call in range(4):
        logprobs = torch.log_softmax(torch.randn(7, 300, generator=gen) * 3, dim=-1)
        if call == 2:
            logprobs = logprobs.round(decimals=1)  # ties
        got = builder(11 + call, logprobs.to(device)).to_host()
        values, ids = (t.cpu() for t in torch.topk(logprobs.to(device), 20, dim=-1))  # that device's order of ties
        assert got == build_tree(11 + call, values.numpy(), ids.numpy(), 20)
    assert builder.error is None and (builder.graph is not None) == (device == "cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CUDA graph's warm-up and capture)")
def test_the_tree_builders_capture_warms_up_on_the_calls_log_probs():
    """The capture's warm-up builds from this call's log-probs, not from uninitialised memory: with the allocator's
    free blocks left full of NaN (as the 16k session's were: docs/lab/NOTEBOOK.md section 54), a new shape is
    captured, its tree is build_tree's, and its inputs hold the call's log-probs."""
    from ddtree_viz.engine.tree import DeviceTreeBuilder

    logprobs = torch.log_softmax(torch.randn(15, 4000, generator=torch.Generator().manual_seed(1)) * 3, -1).cuda()
    garbage = [torch.full((15, 4000), torch.nan, device="cuda") for _ in range(8)]
    del garbage  # their blocks back in the allocator, NaN inside
    builder = DeviceTreeBuilder(budget=64)
    got = builder(7, logprobs).to_host()
    values, ids = (t.cpu() for t in torch.topk(logprobs, 64, dim=-1))
    assert builder.graph is not None and builder.error is None
    assert torch.equal(builder._logprobs, logprobs) and got == build_tree(7, values.numpy(), ids.numpy(), 64)


def test_the_device_tree_ops_read_nothing_back_to_the_host():
    """What the runner's CUDA graphs hold (the tree build, its inputs, the walk), under FakeTensorMode as
    tests/test_draft_runner.py runs the static drafter: any op that reads a device value on the host raises (a 0-d
    tensor as an index did, and every runner capture failed on the H200 in session 9)."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

    from ddtree_viz.engine.tree import DeviceTree, follow_on_device, tree_inputs_on_device

    parents, depths = torch.tensor([-1, 0, 0, 1, -1]), torch.tensor([0, 1, 1, 2, 1])
    logprobs = torch.log_softmax(torch.randn(5, 40, generator=torch.Generator().manual_seed(0)), -1)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = mode.from_tensor
        with pytest.raises(DataDependentOutputException):  # the check sees a host read
            fake(depths)[fake(depths).argmax()]
        walk, bonus = follow_on_device(fake(parents), fake(depths), fake(torch.tensor([9, 5, 5, 7, 5])),
                                       fake(torch.tensor([5, 7, 8, 3, 1])), 4)
        anc, gather = tree_inputs_on_device(fake(parents.clamp(min=0)), fake(depths), 4, 3)
        tree = DeviceTree.from_logprobs(fake(torch.tensor([3])), fake(logprobs), 20)
    assert tuple(walk.shape) == (6,) and tuple(bonus.shape) == () and tuple(anc.shape) == (5, 5)
    assert tuple(gather.shape) == (5, 4) and len(tree) == 21

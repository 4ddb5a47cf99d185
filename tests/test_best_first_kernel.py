"""engine/kernels/best_first/triton_best_first.py: DDTree's best-first tree in one Triton program against build_tree,
node for node (float32 log-probs, ties decided by the rank path across depths, -inf candidates, every budget up to more
than all paths), and against tree_on_device's tensors. Triton's interpreter without a GPU, skipped without Triton:
tests/kernel_env.py."""

import numpy as np
import pytest
import torch

from tests.kernel_env import CUDA, DEVICE, triton  # noqa: F401 (first: Triton set up before any kernel)

from ddtree_viz.engine.kernels.best_first.triton_best_first import MAX_BUDGET, best_first_triton, node_count
from ddtree_viz.engine.tree import DeviceTree, DraftTree, build_tree, tree_on_device


def log_prob_sets(depth: int, k: int, seed: int) -> list[torch.Tensor]:
    """[depth, k] log-probs four ways: as they come, rounded twice (many ties: the rank path decides), mostly -inf."""
    rng = np.random.default_rng(seed)
    logits = torch.tensor(rng.normal(size=(depth, max(k, 2))) * rng.choice([0.5, 3.0]), dtype=torch.float32)
    logp = torch.log_softmax(logits, -1)
    holes = torch.rand(logp.shape, generator=torch.Generator().manual_seed(seed)) < 0.97
    return [logp, torch.round(logp, decimals=1), torch.round(logp * 2) / 2, logp.masked_fill(holes, -torch.inf)]


@pytest.mark.parametrize("depth, k, budget", [(15, 64, 64), (8, 16, 128), (3, 4, 200), (1, 4, 3), (15, 1, 30),
                                              (4, 3, 7), (15, 300, 256)])
def test_the_kernel_builds_build_trees_tree(depth, k, budget):
    for seed, values in enumerate(log_prob_sets(depth, k, depth * 7 + k)):
        values = values.to(DEVICE)
        for b in sorted({1, 2, budget // 3 or 1, budget}):
            top, ids = torch.topk(values, min(b, values.shape[-1]), dim=-1)  # that device's order of tied tokens
            for mine, theirs in zip(best_first_triton(top, b), tree_on_device(top, b)):
                assert torch.equal(mine, theirs), (depth, k, b, seed)
            want = build_tree(11, top.cpu().numpy(), ids.cpu().numpy(), b)
            assert DeviceTree.from_logprobs(11, values, b, kernel=True).to_host() == want, (depth, k, b, seed)


def test_every_warp_count_builds_the_same_tree():
    """The program's warps (gpu_bench times them) change where its reductions run, not the tree."""
    for values in log_prob_sets(15, 64, 3)[:2]:
        top = torch.topk(values.to(DEVICE), 64, dim=-1).values
        want = tree_on_device(top, 64)
        for warps in (1, 2, 4, 8):
            assert all(torch.equal(a, b) for a, b in zip(best_first_triton(top, 64, warps=warps), want)), warps


def test_the_tree_size_and_what_the_kernel_refuses():
    assert node_count(2, 3, 100) == 1 + 3 + 9 == len(tree_on_device(torch.zeros(2, 3), 100)[0])
    assert node_count(15, 64, 64) == 65 and node_count(1, 4, 3) == 4
    top = torch.zeros(3, 4, device=DEVICE)
    for budget in (0, MAX_BUDGET + 1):
        with pytest.raises(ValueError, match="budget"):
            best_first_triton(top, budget)
    # the default takes the kernel on CUDA only; an empty tree or a larger budget takes the tensor ops
    assert DeviceTree.from_logprobs(3, torch.zeros(3, 4), 0, kernel=True).to_host() == DraftTree.from_logprobs(
        3, torch.zeros(3, 4), 0)


@pytest.mark.parametrize("holes", ["all", "a depth", "scattered"])
def test_nan_log_probs_build_a_tree_of_real_nodes(holes):
    """NaN log-probs (a drafter's NaN output, or the uninitialised memory a graph's warm-up once built from:
    docs/lab/NOTEBOOK.md section 54) give NaN scores that no comparison picks. The kernel then pops a real entry
    all the same (the smallest rank path among them): every node past the root has a parent before it, a depth of
    1 or more and a rank in range, never the depth 0 of no entry, whose log-prob was read a row before the tensor
    (an illegal address on the GPU: the 16k session's fault)."""
    depth, k, budget = 6, 8, 40
    top = torch.topk(torch.log_softmax(torch.randn(depth, k, generator=torch.Generator().manual_seed(5)), -1), k).values
    nan = torch.full_like(top, torch.nan)
    top = {"all": nan, "a depth": torch.cat([top[:2], nan[2:3], top[3:]]),
           "scattered": top.masked_fill(torch.rand(top.shape, generator=torch.Generator().manual_seed(6)) < 0.3,
                                        torch.nan)}[holes].to(DEVICE)
    parents, depths, ranks, _ = (t.cpu() for t in best_first_triton(top, budget))
    n = node_count(depth, k, budget)
    assert parents.shape[0] == n and (parents[0], depths[0], ranks[0]) == (-1, 0, -1)
    index = torch.arange(1, n)
    assert ((parents[1:] >= 0) & (parents[1:] < index)).all() and (depths[1:] >= 1).all()
    assert ((ranks[1:] >= 0) & (ranks[1:] < k)).all() and (depths[1:] == depths[parents[1:]] + 1).all()

"""The level-by-level tree solve in Triton (engine/kernels/tree_solve.py) against gdn_tree.tree_solve (cuBLAS's
triangular solve) and the per-path recurrence, at toy and real widths, on random trees and chains of 1 .. 129
positions, with the repetition count taken from the device (gdn_tree.solve_steps); then the static runner with it:
DDTree == greedy.

Without a GPU the kernel runs in Triton's interpreter on CPU tensors (TRITON_INTERPRET=1, set before the kernel
module is imported). Skipped where Triton is not installed (CI: the CPU build of torch has none)."""

import os
import random

import pytest
import torch

pytest.importorskip("triton")
CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

from ddtree_viz.engine.gdn_tree import (  # noqa: E402
    TreeIndex, solve_steps, tree_delta_rule_parts, tree_delta_rule_reference, tree_solve,
)
from ddtree_viz.engine.kernels.tree_solve import tree_solve_triton  # noqa: E402
from tests.test_gdn_tree import random_tree  # noqa: E402
from tests.test_tree_kernel import inputs  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"

CASES = [  # (T, tree depth, H, K, V)
    (1, 0, 2, 4, 16), (2, 1, 3, 4, 16), (17, 5, 4, 16, 16), (17, 16, 2, 12, 40), (40, 20, 2, 16, 48),
    (65, 9, 4, 128, 128), (65, 15, 2, 128, 128), (129, 12, 2, 128, 128), (129, 128, 1, 128, 128),  # last: a chain
]


def parts_of(parents, H, K, V, seed, strong=False):
    q, k, v, g, beta, state = inputs(parents, H, H, K, V, seed, strong)
    masks = TreeIndex.build(parents, 4, DEVICE).masks
    parts = tree_delta_rule_parts(q, k, v, g, beta, state, masks.anc_float, masks.off_path)
    return (q, k, v, g, beta, state), parts, solve_steps(masks.anc_float)


@pytest.mark.parametrize("T, depth, H, K, V", CASES)
def test_kernel_equals_the_triangular_solve_and_the_reference(T, depth, H, K, V):
    parents = random_tree(T, depth, random.Random(T * 5 + depth))
    args, parts, steps = parts_of(parents, H, K, V, seed=T + depth)
    assert int(steps) == max(depth - 1, 0)
    o, delta = tree_solve_triton(*parts, steps)
    o_torch, delta_torch = tree_solve(*parts)
    torch.testing.assert_close(o, o_torch, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(delta, delta_torch, atol=2e-5, rtol=1e-4)
    ref = tree_delta_rule_reference(*(x.cpu() for x in args), parents)
    torch.testing.assert_close(o.cpu(), ref, atol=2e-5, rtol=1e-4)


def test_too_few_steps_is_wrong_so_the_count_matters():
    """One repetition short of the depth leaves the deepest nodes unsolved: the count is not decoration (on the
    least damped system, where a missing level's term is not small)."""
    parents = random_tree(33, 8, random.Random(1))
    _, parts, steps = parts_of(parents, 2, 16, 16, seed=4, strong=True)
    want = tree_solve(*parts)[1]
    assert torch.allclose(tree_solve_triton(*parts, steps)[1], want, atol=2e-5, rtol=1e-4)
    assert not torch.allclose(tree_solve_triton(*parts, steps - 1)[1], want, atol=1e-3, rtol=1e-3)


def test_least_damped_system_on_a_deep_tree():
    """g = 0, beta ~ 1 and nearly parallel keys: the system's entries near 1. The level-by-level solve forms no
    powers of A, so it stays as accurate as the substitution."""
    parents = random_tree(65, 15, random.Random(3))
    args, parts, steps = parts_of(parents, 2, 128, 128, seed=9, strong=True)
    o, delta = tree_solve_triton(*parts, steps)
    ref = tree_delta_rule_reference(*(x.cpu() for x in args), parents)
    torch.testing.assert_close(o.cpu(), ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(delta, tree_solve(*parts)[1], atol=2e-5, rtol=1e-4)


def test_kernel_refuses_bad_shapes():
    parents = random_tree(9, 3, random.Random(1))
    _, (A, Qd, rhs, base), steps = parts_of(parents, 2, 16, 16, seed=2)
    with pytest.raises(ValueError, match="shapes"):
        tree_solve_triton(A[:, :, :4], Qd, rhs, base, steps)
    big = torch.zeros(1, 130, 130, device=DEVICE)
    with pytest.raises(ValueError, match="at most 129"):
        tree_solve_triton(big, big, torch.zeros(1, 130, 16, device=DEVICE), torch.zeros(1, 130, 16, device=DEVICE),
                          steps)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU: all 48 heads of a Qwen3.6-27B GDN layer")
def test_kernel_at_qwen36_27b_shapes_on_the_gpu():
    for T in (2, 17, 65, 129):
        parents = random_tree(T, min(T - 1, 15), random.Random(T))
        _, parts, steps = parts_of(parents, 48, 128, 128, seed=T)
        for got, want in zip(tree_solve_triton(*parts, steps), tree_solve(*parts)):
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_runner_with_the_tree_solve_equals_greedy():
    """The static runner with the Triton tree solve (eager pieces; on a GPU inside CUDA graphs, on a CPU through
    the interpreter): greedy == transformers' greedy and DDTree == greedy, token for token (fp32); its tree pass
    matches the torch form's. The compiled pieces around the kernel: tests/test_runner.py's CUDA test."""
    from ddtree_viz.engine.oracle import OracleProposer
    from ddtree_viz.engine.runner import RunnerOptions, StaticRunner
    from ddtree_viz.engine.session import GreedyReference
    from tests.test_runner import PROMPT, runner_ddtree, runner_greedy, tree_from_parents
    from tests.tiny import tiny_pair

    pair = tiny_pair("hybrid", seed=0, layers=8)
    pair.target.to(DEVICE)
    pair.drafter.to(DEVICE)
    prompt = pair.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    new = 24
    ref = list(GreedyReference(pair.target, prompt, set()).extend_to(new).ids)
    kw = dict(max_len=256, sizes=(1, 17), feature_layer_ids=pair.drafter.target_layer_ids)
    options = RunnerOptions("triton-solve", True, "eager", False)
    runner = StaticRunner(pair.target, options=options, **kw)
    assert runner._solve is not None and runner.kernel_error is None and runner.options.gdn_kernel == "triton-solve"
    torch_form = StaticRunner(pair.target, options=RunnerOptions("torch", True, "eager", False), **kw)
    rng = random.Random(2)
    tree = tree_from_parents(random_tree(17, 6, rng), rng)
    passes = []
    for r in (torch_form, runner):
        r.prefill(prompt)
        logits, feats, slot = r.forward(tree)
        passes.append((logits.clone(), feats.clone()))
    for a, b in zip(*passes):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    assert runner_greedy(runner, prompt, new) == ref
    oracle = OracleProposer(ref, len(prompt), [0, 2, 1], pair.target.config.vocab_size, block_size=8)
    out, rounds = runner_ddtree(pair, runner, oracle, prompt, new, 16)
    assert out == ref and max(rounds) > 2

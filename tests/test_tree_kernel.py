"""The fused Triton tree delta rule (engine/kernels/tree_gdn.py) against the per-path recurrence
(tree_delta_rule_reference) and the torch parallel form (tree_delta_rule), at toy and real widths (K = V = 128),
on random trees of 1 .. 129 positions; then the static runner with the kernel: DDTree == greedy.

Without a GPU the kernel runs in Triton's interpreter on CPU tensors (TRITON_INTERPRET=1, set here before the
kernel module is imported). Skipped where Triton is not installed (CI: the CPU build of torch has none)."""

import os
import random

import pytest
import torch

pytest.importorskip("triton")
CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

from ddtree_viz.engine.gdn_tree import TreeIndex, tree_delta_rule, tree_delta_rule_reference  # noqa: E402
from ddtree_viz.engine.kernels.tree_gdn import tree_delta_rule_triton  # noqa: E402
from tests.test_gdn_tree import random_tree  # noqa: E402

DEVICE = "cuda" if CUDA else "cpu"


def inputs(parents, H, Hq, K, V, seed, strong=False):
    """Random delta-rule inputs like a GDN layer's: q, k L2-normalised (q scaled by K^-1/2), g <= 0, beta in (0, 1).
    strong: nearly parallel keys, no decay and beta near 1, the least damped case (the triangular system's
    entries near 1, so every term of the blocked inverse counts)."""
    gen = torch.Generator().manual_seed(seed)
    n = len(parents)
    q = torch.nn.functional.normalize(torch.randn(n, Hq, K, generator=gen), dim=-1) / K**0.5
    k = torch.randn(n, Hq, K, generator=gen)
    if strong:
        k = torch.randn(1, Hq, K, generator=gen) + 0.2 * k
    k = torch.nn.functional.normalize(k, dim=-1)
    v, state = torch.randn(n, H, V, generator=gen), torch.randn(H, K, V, generator=gen)
    if strong:
        g, beta = torch.zeros(n, H), 0.9 + 0.1 * torch.rand(n, H, generator=gen)
    else:
        g, beta = -2 * torch.rand(n, H, generator=gen), torch.rand(n, H, generator=gen)
    return [x.to(DEVICE) for x in (q, k, v, g, beta, state)]


CASES = [  # (T, tree depth, H, Hq, K, V): toy widths, odd widths (masked), real widths with grouped heads
    (1, 0, 3, 3, 4, 5), (2, 1, 3, 1, 4, 5), (17, 5, 4, 2, 16, 16), (17, 16, 2, 2, 12, 40),
    (1, 0, 4, 2, 128, 128), (2, 1, 4, 2, 128, 128), (17, 6, 4, 2, 128, 128), (65, 9, 4, 2, 128, 128),
    (129, 12, 4, 2, 128, 128), (129, 128, 2, 1, 128, 128),  # the last: one chain of 129
]


@pytest.mark.parametrize("T, depth, H, Hq, K, V", CASES)
def test_kernel_equals_the_reference_and_the_torch_form(T, depth, H, Hq, K, V):
    parents = random_tree(T, depth, random.Random(T * 7 + depth))
    q, k, v, g, beta, state = inputs(parents, H, Hq, K, V, seed=T + depth)
    anc = TreeIndex.build(parents, 4, DEVICE).ancestors
    o, delta = tree_delta_rule_triton(q, k, v, g, beta, state, anc)
    qr, kr = q.repeat_interleave(H // Hq, 1), k.repeat_interleave(H // Hq, 1)  # what the torch forms take
    o_torch, delta_torch = tree_delta_rule(qr, kr, v, g, beta, state, anc)
    torch.testing.assert_close(o, o_torch, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(delta, delta_torch, atol=2e-5, rtol=1e-4)
    ref = tree_delta_rule_reference(qr.cpu(), kr.cpu(), v.cpu(), g.cpu(), beta.cpu(), state.cpu(), parents)
    torch.testing.assert_close(o.cpu(), ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("block_t", [16, 32])
def test_kernel_without_decay_and_strong_beta(block_t):
    """The least damped system (g = 0, beta ~ 1) on a deep tree: the blocked inverse still matches."""
    parents = random_tree(40, 20, random.Random(3))
    q, k, v, g, beta, state = inputs(parents, 2, 2, 16, 16, seed=9, strong=True)
    anc = TreeIndex.build(parents, 4, DEVICE).ancestors
    o, delta = tree_delta_rule_triton(q, k, v, g, beta, state, anc, block_t=block_t)
    ref = tree_delta_rule_reference(*(x.cpu() for x in (q, k, v, g, beta, state)), parents)
    torch.testing.assert_close(o.cpu(), ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(delta, tree_delta_rule(q, k, v, g, beta, state, anc)[1], atol=2e-5, rtol=1e-4)


def test_kernel_reads_strided_inputs_and_refuses_bad_shapes():
    parents = random_tree(9, 3, random.Random(1))
    q, k, v, g, beta, state = inputs(parents, 2, 2, 16, 16, seed=2)
    anc = TreeIndex.build(parents, 4, DEVICE).ancestors
    wide = torch.randn(9, 2, 40, device=DEVICE)
    wide[:, :, 8:24] = v  # v as a strided view, as the conv's split leaves it
    o, delta = tree_delta_rule_triton(q, k, wide[:, :, 8:24], g.t().contiguous().t(), beta, state, anc)
    expect = tree_delta_rule(q, k, v, g, beta, state, anc)
    torch.testing.assert_close(o, expect[0], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(delta, expect[1], atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="shapes"):
        tree_delta_rule_triton(q, k, v[:, :1], g, beta, state, anc)
    with pytest.raises(ValueError, match="block_t"):
        tree_delta_rule_triton(q, k, v, g, beta, state, anc, block_t=8)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU: all 48 heads of a Qwen3.6-27B GDN layer, compiled")
def test_kernel_at_qwen36_27b_shapes_on_the_gpu():
    for T in (1, 17, 65, 129):
        parents = random_tree(T, min(T - 1, 15), random.Random(T))
        q, k, v, g, beta, state = inputs(parents, 48, 16, 128, 128, seed=T)
        anc = TreeIndex.build(parents, 4, DEVICE).ancestors
        o, delta = tree_delta_rule_triton(q, k, v, g, beta, state, anc)
        expect = tree_delta_rule(q.repeat_interleave(3, 1), k.repeat_interleave(3, 1), v, g, beta, state, anc)
        torch.testing.assert_close(o, expect[0], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(delta, expect[1], atol=2e-5, rtol=1e-4)


def test_runner_with_the_kernel_equals_greedy():
    """The static runner with the kernel for trees and the one-node step (fused projections, both attention
    forms): its greedy == transformers' greedy and its DDTree == greedy, token for token (fp32). On a GPU with
    CUDA graphs; on a CPU through the interpreter."""
    from ddtree_viz.engine.oracle import OracleProposer
    from ddtree_viz.engine.runner import RunnerOptions, StaticRunner
    from ddtree_viz.engine.session import GreedyReference
    from tests.test_runner import PROMPT, runner_ddtree, runner_greedy
    from tests.tiny import tiny_pair

    pair = tiny_pair("hybrid", seed=0, layers=8)
    pair.target.to(DEVICE)
    pair.drafter.to(DEVICE)
    prompt = pair.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    new = 24
    ref = list(GreedyReference(pair.target, prompt, set()).extend_to(new).ids)
    for options in (RunnerOptions("triton", True, "eager"), RunnerOptions("triton-tree", True, "sdpa")):
        runner = StaticRunner(pair.target, max_len=256, sizes=(1, 17), feature_layer_ids=pair.drafter.target_layer_ids,
                              options=options)
        assert runner._tree_kernel is not None and runner.kernel_error is None
        assert runner.options == options.resolve(torch.device(DEVICE))  # compile: on with CUDA (the kernel between)
        assert runner_greedy(runner, prompt, new) == ref
        oracle = OracleProposer(ref, len(prompt), [0, 2, 1], pair.target.config.vocab_size, block_size=8)
        out, rounds = runner_ddtree(pair, runner, oracle, prompt, new, 16)
        assert out == ref and max(rounds) > 2

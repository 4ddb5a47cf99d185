"""The Triton kernels of the tree delta rule against the per-path recurrence (tree_delta_rule_reference) and the torch
forms, at toy and real widths (K = V = 128), on random trees and chains of 1 .. 129 positions: the tree solve
(engine/kernels/gdn_tree/triton_solve.py) against parallel.tree_solve (cuBLAS's triangular solve), with its
repetition count from the device (parallel.solve_steps); the whole rule in two launches (tree_rule_triton, the CUDA
default) against the torch form and the reference, from grouped key heads. Then the static runner with each:
DDTree == greedy.

Triton's interpreter without a GPU, skipped without Triton: tests/kernel_env.py."""

import random
from dataclasses import replace

import pytest
import torch

from tests.kernel_env import CUDA, DEVICE, triton  # noqa: F401 (first: Triton set up before any kernel)

import triton.language as tl

from ddtree_viz.engine.kernels.gdn_tree.naive import tree_delta_rule_reference
from ddtree_viz.engine.kernels.gdn_tree.parallel import (
    solve_steps, tree_delta_rule_masked, tree_delta_rule_parts, tree_solve,
)
from ddtree_viz.engine.kernels.gdn_tree.triton_solve import _split, tree_rule_triton, tree_solve_triton
from ddtree_viz.engine.gdn_tree import TreeIndex
from tests.test_gdn_tree import random_tree


@triton.jit
def split_kernel(x_ptr, hi_ptr, lo_ptr, N: tl.constexpr, PRECISION: tl.constexpr):
    """_split's parts of N values (test_the_tf32_split_rounds_to_nearest_and_is_exact)."""
    i = tl.arange(0, N)
    hi, lo = _split(tl.load(x_ptr + i), PRECISION)
    tl.store(hi_ptr + i, hi)
    tl.store(lo_ptr + i, lo)


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


def test_runner_with_the_kernel_equals_greedy():
    """The static runner with the whole rule in two launches (fused projections, both attention forms), and with
    the tree solve: its greedy == transformers' greedy and its DDTree == greedy, token for token
    (fp32). On a GPU with CUDA graphs; on a CPU through the interpreter."""
    from ddtree_viz.engine.oracle import OracleProposer
    from ddtree_viz.engine.runner import RunnerForms, StaticRunner
    from ddtree_viz.engine.reference import GreedyReference
    from tests.test_runner import PROMPT, runner_ddtree, runner_greedy
    from tests.tiny import tiny_pair

    pair = tiny_pair("hybrid", seed=0, layers=8)
    pair.target.to(DEVICE)
    pair.drafter.to(DEVICE)
    prompt = pair.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    new = 24
    ref = list(GreedyReference(pair.target, prompt, set()).extend_to(new).ids)
    for forms in ({"gdn_kernel": "triton-solve", "fused": True, "attention": "eager"},
                  {"gdn_kernel": "triton-rule", "fused": True, "attention": "sdpa"},
                  {"gdn_kernel": "triton-rule", "fused": True, "attention": "eager"}):
        # the tree solve and the whole rule of kernels/gdn_tree/triton_solve.py (both attention forms)
        runner = StaticRunner(pair.target, max_len=256, sizes=(1, 17), feature_layer_ids=pair.drafter.target_layer_ids,
                              forms=forms)
        assert runner.rule.kernel is not None and runner.kernel_error is None
        want = RunnerForms.of(forms, torch.device(DEVICE))  # compile: on with CUDA (the kernel between)
        if not runner.rule.takes_prep:  # the tree's prep in one launch only where the form takes q, k at key heads
            want = replace(want, gdn_prep="torch")
        assert runner.forms == want
        assert runner_greedy(runner, prompt, new) == ref
        oracle = OracleProposer(ref, len(prompt), [0, 2, 1], pair.target.config.vocab_size, block_size=8)
        out, rounds = runner_ddtree(pair, runner, oracle, prompt, new, 16)
        assert out == ref and max(rounds) > 2


# -- the tree solve (kernels/gdn_tree/triton_solve.py) ----------------------------------------------------------------

SOLVE_CASES = [  # (T, tree depth, H, K, V)
    (1, 0, 2, 4, 16), (2, 1, 3, 4, 16), (17, 5, 4, 16, 16), (17, 16, 2, 12, 40), (40, 20, 2, 16, 48),
    (65, 9, 4, 128, 128), (65, 15, 2, 128, 128), (129, 12, 2, 128, 128), (129, 128, 1, 128, 128),  # last: a chain
]


def parts_of(parents, H, K, V, seed, strong=False):
    q, k, v, g, beta, state = inputs(parents, H, H, K, V, seed, strong)
    masks = TreeIndex.build(parents, 4, DEVICE).masks
    parts = tree_delta_rule_parts(q, k, v, g, beta, state, masks.anc_float, masks.off_path)
    return (q, k, v, g, beta, state), parts, solve_steps(masks.anc_float)


@pytest.mark.parametrize("T, depth, H, K, V", SOLVE_CASES)
def test_solve_equals_the_triangular_solve_and_the_reference(T, depth, H, K, V):
    parents = random_tree(T, depth, random.Random(T * 5 + depth))
    args, parts, steps = parts_of(parents, H, K, V, seed=T + depth)
    assert int(steps) == max(depth - 1, 0)
    o, delta = tree_solve_triton(*parts, steps)
    o_torch, delta_torch = tree_solve(*parts)
    torch.testing.assert_close(o, o_torch, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(delta, delta_torch, atol=2e-5, rtol=1e-4)
    ref = tree_delta_rule_reference(*(x.cpu() for x in args), parents)
    torch.testing.assert_close(o.cpu(), ref, atol=2e-5, rtol=1e-4)


def test_solve_with_too_few_steps_is_wrong_so_the_count_matters():
    """One repetition short of the depth leaves the deepest nodes unsolved: the count is not decoration (on the
    least damped system, where a missing level's term is not small)."""
    parents = random_tree(33, 8, random.Random(1))
    _, parts, steps = parts_of(parents, 2, 16, 16, seed=4, strong=True)
    want = tree_solve(*parts)[1]
    assert torch.allclose(tree_solve_triton(*parts, steps)[1], want, atol=2e-5, rtol=1e-4)
    assert not torch.allclose(tree_solve_triton(*parts, steps - 1)[1], want, atol=1e-3, rtol=1e-3)


def test_solve_on_the_least_damped_system_of_a_deep_tree():
    """g = 0, beta ~ 1 and nearly parallel keys: the system's entries near 1. The level-by-level solve forms no
    powers of A, so it stays as accurate as the substitution."""
    parents = random_tree(65, 15, random.Random(3))
    args, parts, steps = parts_of(parents, 2, 128, 128, seed=9, strong=True)
    o, delta = tree_solve_triton(*parts, steps)
    ref = tree_delta_rule_reference(*(x.cpu() for x in args), parents)
    torch.testing.assert_close(o.cpu(), ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(delta, tree_solve(*parts)[1], atol=2e-5, rtol=1e-4)


def test_solve_refuses_bad_shapes():
    parents = random_tree(9, 3, random.Random(1))
    _, (A, Qd, rhs, base), steps = parts_of(parents, 2, 16, 16, seed=2)
    with pytest.raises(ValueError, match="shapes"):
        tree_solve_triton(A[:, :, :4], Qd, rhs, base, steps)
    big = torch.zeros(1, 130, 130, device=DEVICE)
    with pytest.raises(ValueError, match="at most 129"):
        tree_solve_triton(big, big, torch.zeros(1, 130, 16, device=DEVICE), torch.zeros(1, 130, 16, device=DEVICE),
                          steps)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU: all 48 heads of a Qwen3.6-27B GDN layer")
def test_solve_at_qwen36_27b_shapes_on_the_gpu():
    for T in (2, 17, 65, 129):
        parents = random_tree(T, min(T - 1, 15), random.Random(T))
        _, parts, steps = parts_of(parents, 48, 128, 128, seed=T)
        for got, want in zip(tree_solve_triton(*parts, steps), tree_solve(*parts)):
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


# -- the whole rule in two launches (kernels/gdn_tree/triton_solve.py: tree_rule_triton) -------------------------------

RULE_CASES = [  # (T, tree depth, H, Hk, K, V): grouped key heads, odd widths (masked), real widths, a chain
    (1, 0, 2, 1, 16, 16), (2, 1, 3, 1, 16, 16), (17, 5, 4, 2, 16, 16), (17, 16, 2, 2, 12, 40), (40, 20, 6, 2, 48, 48),
    (65, 9, 4, 2, 128, 128), (129, 12, 2, 1, 128, 128), (129, 128, 1, 1, 128, 128),
]


def rule_inputs(parents, H, Hk, K, V, seed, strong=False):
    args = inputs(parents, H, Hk, K, V, seed, strong)
    masks = TreeIndex.build(parents, 4, DEVICE).masks
    return args, masks, solve_steps(masks.anc_float)


@pytest.mark.parametrize("T, depth, H, Hk, K, V", RULE_CASES)
def test_rule_equals_the_torch_form_and_the_reference(T, depth, H, Hk, K, V):
    parents = random_tree(T, depth, random.Random(T * 3 + depth))
    (q, k, v, g, beta, state), masks, steps = rule_inputs(parents, H, Hk, K, V, seed=T * 2 + depth)
    o, delta = tree_rule_triton(q, k, v, g, beta, state, masks.anc_float, steps)
    o_torch, delta_torch = tree_delta_rule_masked(q, k, v, g, beta, state, masks.anc_float, masks.off_path)
    torch.testing.assert_close(o, o_torch, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(delta, delta_torch, atol=2e-5, rtol=1e-4)
    rep = H // Hk
    ref = tree_delta_rule_reference(*(x.repeat_interleave(rep, dim=1).cpu() for x in (q, k)),
                                    *(x.cpu() for x in (v, g, beta, state)), parents)
    torch.testing.assert_close(o.cpu(), ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("T", [40, 65, 129])
def test_rule_is_the_same_at_every_tile(T):
    """The parts kernel's rows a program (one block of 16 .. every row), the rule kernel's value columns a program
    and its solve's rows a block (16 .. the whole tile: forward substitution by blocks, or the level repetition over
    every row) change how the work is split, not the result; so does each fp32-accurate precision of the products
    (our TF32 split, Triton's, CUDA-core fp32: one fp32 product each in Triton's interpreter)."""
    parents = random_tree(T, 9, random.Random(T))
    (q, k, v, g, beta, state), masks, steps = rule_inputs(parents, 3, 1, 128, 128, seed=T)
    o_torch, delta_torch = tree_delta_rule_masked(q, k, v, g, beta, state, masks.anc_float, masks.off_path)
    for block_r, block_v, block_s, blocked_from, precision in [
            (16, 16, 16, 0, "tf32x3"), (32, 64, 32, 3, "tf32x3"), (128, 32, 128, 3, "tf32x3"),
            (16, 16, 64, 3, "tf32x3"), (16, 16, 16, 99, "tf32x3"),  # 99: no tree this deep
            (None, None, None, 0, "tf32x3"),  # by blocks at every depth: the repetition over every row not built
            (None, None, None, None, "triton-tf32x3"), (None, None, None, None, "ieee"),
            (None, None, None, None, "tf32x3")]:  # the tables' choices
        o, delta = tree_rule_triton(q, k, v, g, beta, state, masks.anc_float, steps, block_r=block_r, block_v=block_v,
                                    block_s=block_s, blocked_from=blocked_from, precision=precision)
        torch.testing.assert_close(o, o_torch, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(delta, delta_torch, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("T, H, Hk", [(17, 6, 2), (65, 6, 2), (129, 3, 1)])
def test_parts_by_key_head_equal_the_parts_by_value_head(T, H, Hk):
    """The parts kernel with a program per key head (its value heads' q.k and k.k made once: `group`) writes the
    A, Qd and G a program per value head writes, at each of its rows a program; and the whole rule with it equals
    the torch form."""
    from ddtree_viz.engine.kernels.gdn_tree.triton_solve import tree_parts_triton

    parents = random_tree(T, 9, random.Random(T + 1))
    (q, k, v, g, beta, state), masks, steps = rule_inputs(parents, H, Hk, 128, 128, seed=T + 1)

    def written(A, Qd, G):  # the root's row is Qd[:, 0, 0] alone (the rest of row 0 is never read)
        return A[:, 1:], Qd[:, 1:], Qd[:, 0, 0], G

    by_value = written(*tree_parts_triton(q, k, g, beta, masks.anc_float, H, group=False))
    for block_r in (16, 32, None):
        grouped = written(*tree_parts_triton(q, k, g, beta, masks.anc_float, H, group=True, block_r=block_r))
        for got, want in zip(grouped, by_value):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    o_torch, delta_torch = tree_delta_rule_masked(q, k, v, g, beta, state, masks.anc_float, masks.off_path)
    for got, want in zip(tree_rule_triton(q, k, v, g, beta, state, masks.anc_float, steps, group=True),
                         (o_torch, delta_torch)):
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_rule_on_the_least_damped_system_and_with_too_few_steps():
    """g = 0, beta ~ 1, nearly parallel keys: as accurate as the substitution; one repetition short is wrong (the
    level repetition over every row; by blocks each block repeats as often as its own chains need)."""
    parents = random_tree(65, 15, random.Random(3))
    (q, k, v, g, beta, state), masks, steps = rule_inputs(parents, 2, 1, 128, 128, seed=9, strong=True)
    o, delta = tree_rule_triton(q, k, v, g, beta, state, masks.anc_float, steps)
    ref = tree_delta_rule_reference(*(x.repeat_interleave(2, dim=1).cpu() for x in (q, k)),
                                    *(x.cpu() for x in (v, g, beta, state)), parents)
    torch.testing.assert_close(o.cpu(), ref, atol=2e-5, rtol=1e-4)
    short = tree_rule_triton(q, k, v, g, beta, state, masks.anc_float, steps - 1, block_s=128)[1]
    assert not torch.allclose(short, delta, atol=1e-3, rtol=1e-3)
    for block_s in (16, 32):  # forward substitution by blocks: as accurate
        torch.testing.assert_close(tree_rule_triton(q, k, v, g, beta, state, masks.anc_float, steps,
                                                    block_s=block_s, blocked_from=0)[0].cpu(), ref,
                                   atol=2e-5, rtol=1e-4)
    # by blocks, each block's levels one repetition short of what its own chains need: wrong
    short = tree_rule_triton(q, k, v, g, beta, state, masks.anc_float, steps.clamp(max=1), block_s=32,
                             blocked_from=0)
    assert not torch.allclose(short[1], delta, atol=1e-3, rtol=1e-3)


def test_rule_reads_strided_inputs_and_refuses_bad_shapes():
    """q and k as views of one [T, 2, Hk, K] tensor (as gdn_prep makes them), v a view: the same numbers. Shapes
    that do not fit and a precision the kernels do not have: refused, saying why."""
    parents = random_tree(17, 5, random.Random(2))
    (q, k, v, g, beta, state), masks, steps = rule_inputs(parents, 4, 2, 16, 16, seed=5)
    qk = torch.stack([q, k], dim=1)
    wide = torch.cat([v, v], dim=2)[:, :, :16]
    got = tree_rule_triton(qk[:, 0], qk[:, 1], wide, g, beta, state, masks.anc_float, steps)
    want = tree_rule_triton(q, k, v.contiguous(), g, beta, state, masks.anc_float, steps)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    with pytest.raises(ValueError, match="shapes"):
        tree_rule_triton(q, k[:, :1], v, g, beta, state, masks.anc_float, steps)
    with pytest.raises(ValueError, match="precision 'bf16x3': one of tf32x3, triton-tf32x3, tf32, ieee"):
        tree_rule_triton(q, k, v, g, beta, state, masks.anc_float, steps, precision="bf16x3")
    big = torch.zeros(130, 1, 16, device=DEVICE)
    with pytest.raises(ValueError, match="at most 129"):
        tree_rule_triton(big, big, big, torch.zeros(130, 1, device=DEVICE), torch.zeros(130, 1, device=DEVICE),
                         torch.zeros(1, 16, 16, device=DEVICE), torch.zeros(130, 130, device=DEVICE), steps)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU: all 48 value heads (16 key heads) of a Qwen3.6-27B GDN layer")
def test_rule_at_qwen36_27b_shapes_on_the_gpu():
    for T in (2, 17, 65, 129):
        parents = random_tree(T, min(T - 1, 15), random.Random(T))
        (q, k, v, g, beta, state), masks, steps = rule_inputs(parents, 48, 16, 128, 128, seed=T)
        want = tree_delta_rule_masked(q, k, v, g, beta, state, masks.anc_float, masks.off_path)
        for group in (False, True):  # the parts kernel by value head and by key head
            for got, ref in zip(tree_rule_triton(q, k, v, g, beta, state, masks.anc_float, steps, group=group), want):
                torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-4)
        # the products' precisions on the tensor cores: the split (default) and Triton's as accurate as CUDA-core
        # fp32; one TF32 product is not (so the split is what makes the default accurate)
        errors = {p: max(float((a - b).abs().max()) for a, b in zip(
            tree_rule_triton(q, k, v, g, beta, state, masks.anc_float, steps, precision=p), want))
            for p in ("tf32x3", "triton-tf32x3", "ieee", "tf32")}
        assert max(errors["tf32x3"], errors["triton-tf32x3"]) <= 2 * errors["ieee"] + 1e-6, errors
        for ours, tritons in zip(tree_rule_triton(q, k, v, g, beta, state, masks.anc_float, steps),
                                 tree_rule_triton(q, k, v, g, beta, state, masks.anc_float, steps,
                                                  precision="triton-tf32x3")):
            torch.testing.assert_close(ours, tritons, atol=1e-6, rtol=0)  # the same split, in the same order
        if T > 2:
            assert errors["tf32"] > 20 * errors["tf32x3"], errors


def test_the_tf32_split_rounds_to_nearest_and_is_exact():
    """_split's parts of fp32 values of every magnitude and sign: hi has TF32's 10 mantissa bits (the other 13
    clear), hi + lo is x exactly, and hi is x rounded to nearest (|lo| at most half a TF32 unit, 2^-11 |x|: cutting
    the bits instead would leave up to 2^-10 |x|); infinities stay and zero splits into zeros."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=gen) * torch.exp2(torch.randint(-60, 60, (4096,), generator=gen).float())
    x[:4] = torch.tensor([0.0, float("inf"), float("-inf"), 1.0 + 2.0**-11])  # the last: a tie, rounded up
    x = x.to(DEVICE)
    hi, lo = torch.empty_like(x), torch.empty_like(x)
    split_kernel[(1,)](x, hi, lo, N=x.numel(), PRECISION="tf32x3")
    assert int((hi.view(torch.int32) & 0x1FFF).abs().sum()) == 0
    finite = torch.isfinite(x)
    assert torch.equal((hi + lo)[finite], x[finite])
    assert bool((lo[finite].abs() <= x[finite].abs() * 2.0**-11).all())
    assert hi[:4].tolist() == [0.0, float("inf"), float("-inf"), 1.0 + 2.0**-10] and lo[0] == 0
    split_kernel[(1,)](x, hi, lo, N=x.numel(), PRECISION="ieee")  # other precisions: x unsplit
    assert torch.equal(hi, x) and torch.equal(lo, x)

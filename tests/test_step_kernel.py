"""The one-node GDN core in one Triton launch (engine/kernels/gdn_step/triton_step.py, RunnerForms.gdn_step="triton")
against the torch core it replaces (gdn_step/naive.py's gdn_step_reference = fused.gdn_core at T = 1: tree conv, l2
norms, gates, the one-step delta rule, gated norm), in float32 and bfloat16, grouped and ungrouped heads, any window
the conv may read; the committed state untouched; bad shapes refused; dispatch's choice and fallback. The commit's
recurrent update in one launch (engine/kernels/state_commit/triton_commit.py, RunnerForms.commit="triton") against
its torch form (closed_form.commit_recurrent) and the step-by-step reference. The runner with both decodes greedy's
tokens.

Triton's interpreter without a GPU, skipped without Triton: tests/kernel_env.py."""

import pytest
import torch

from tests.kernel_env import CUDA, DEVICE, triton  # noqa: F401 (first: Triton set up before any kernel)

from ddtree_viz.engine.fused import GDNWeights, Pieces
from ddtree_viz.engine.gdn_forms import TorchForm, check_one_node, check_prep, choose, d_prep, step_core, torch_core
from ddtree_viz.engine.gdn_tree import TreeIndex
from ddtree_viz.engine.kernels.add_norm.triton_norm import add_rms_norm_triton
from ddtree_viz.engine.kernels.device import resolve_step
from ddtree_viz.engine.kernels.gdn_step.naive import gdn_prep
from ddtree_viz.engine.kernels.gdn_step.triton_step import gdn_prep_triton, gdn_step_triton
from ddtree_viz.engine.kernels.state_commit.closed_form import commit_recurrent
from ddtree_viz.engine.kernels.state_commit.dispatch import choose_commit
from ddtree_viz.engine.kernels.state_commit.naive import commit_recurrent_reference
from ddtree_viz.engine.kernels.state_commit.triton_commit import commit_recurrent_triton
from tests.test_gdn_tree import random_tree


def layer_inputs(Hk, rep, K, V, kernel, dtype, seed, gather=None):
    """A GDN layer's one-node inputs and weights at these widths, as the runner passes them (GDNWeights), random:
    the projections' outputs u, z, b, a; the committed conv inputs and recurrent state; a window (`gather`, a
    root's by default: the last kernel - 1 committed columns, then the node's own input)."""
    gen = torch.Generator().manual_seed(seed)
    H, key_dim = Hk * rep, Hk * K
    C = 2 * key_dim + H * V

    def rand(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(DEVICE, dtype)

    w = GDNWeights(rand(C, kernel, scale=0.5), torch.rand(H, generator=gen).to(DEVICE) * 2 - 1, rand(H),
                   1 + rand(V, scale=0.1), dict(key_dim=key_dim, head_k=K, head_v=V, rep=rep, eps=1e-6))
    u, z, b, a = rand(1, C), rand(1, H * V), rand(1, H), rand(1, H, scale=3.0)
    conv_state = rand(C, kernel)
    state = torch.randn(H, K, V, generator=gen).to(DEVICE)
    if gather is None:
        gather = list(range(1, kernel + 1))
    return (u, z, b, a, conv_state, state, torch.tensor([gather], device=DEVICE)), w


def torch_one_node(args, w):
    """The torch core at T = 1 (eager), k at its key heads as the kernel keeps it."""
    o, k, g, delta = torch_core(Pieces(False), None, *args, w)
    return o, k[:, :: w.dims["rep"]], g, delta


CASES = [  # (Hk, rep, K, V, kernel, dtype)
    (2, 1, 16, 16, 4, torch.float32), (2, 3, 16, 32, 4, torch.float32), (1, 2, 32, 16, 3, torch.float32),
    (2, 3, 16, 32, 4, torch.bfloat16), (1, 4, 128, 128, 4, torch.bfloat16),
]


@pytest.mark.parametrize("Hk, rep, K, V, kernel, dtype", CASES)
def test_one_node_kernel_equals_the_torch_core(Hk, rep, K, V, kernel, dtype):
    args, w = layer_inputs(Hk, rep, K, V, kernel, dtype, seed=Hk + rep + K)
    state = args[5].clone()
    got = step_core(gdn_step_triton, *args, w)
    want = torch_one_node(args, w)
    # float32: the same arithmetic in another order of sums; bf16: the same roundings, so a value a rounding apart
    tol = dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for name, x, y in zip(("o", "k", "g", "delta"), got, want):
        assert x.shape == y.shape and x.dtype == y.dtype, name
        torch.testing.assert_close(x, y, **tol, msg=lambda m: f"{name}: {m}")
    assert torch.equal(args[5], state)  # the committed state is read, never written (the commit applies it)
    if dtype == torch.bfloat16:  # most outputs agree to the bit: only sums near a rounding boundary may differ
        assert (got[0] == want[0]).float().mean() > 0.9


def test_the_window_is_the_one_gather_names():
    """Any window of (committed conv inputs, the node's own) gives the torch conv's result: the kernel reads the
    window from `gather`, not a fixed one (a window of another node would be wrong)."""
    window = [0, 2, 4, 3]
    args, w = layer_inputs(2, 2, 16, 16, 4, torch.float32, seed=3, gather=window)
    got, want = step_core(gdn_step_triton, *args, w), torch_one_node(args, w)
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, atol=2e-5, rtol=2e-5)
    root, _ = layer_inputs(2, 2, 16, 16, 4, torch.float32, seed=3)
    assert not torch.allclose(step_core(gdn_step_triton, *root, w)[0], got[0])


def test_decay_and_gates_reach_the_output():
    """A changed gate input moves the output and g as the torch core does (so neither is dropped or fixed)."""
    args, w = layer_inputs(1, 2, 16, 16, 4, torch.float32, seed=5)
    base = step_core(gdn_step_triton, *args, w)
    a = args[3] + 1.0
    moved = list(args)
    moved[3] = a
    got, want = step_core(gdn_step_triton, *moved, w), torch_one_node(moved, w)
    assert not torch.allclose(got[2], base[2]) and not torch.allclose(got[0], base[0])
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, atol=2e-5, rtol=2e-5)


def test_one_node_kernel_refuses_what_it_cannot_take():
    args, w = layer_inputs(1, 1, 16, 16, 4, torch.float32, seed=1)
    two = list(args)
    two[0] = torch.cat([args[0], args[0]])
    with pytest.raises(ValueError, match="one node"):
        step_core(gdn_step_triton, *two, w)
    odd, w_odd = layer_inputs(1, 1, 12, 16, 4, torch.float32, seed=1)
    with pytest.raises(ValueError, match="power-of-two"):
        step_core(gdn_step_triton, *odd, w_odd)


def test_dispatch_resolves_checks_and_falls_back():
    """gdn_step: auto is triton on CUDA only; a bad name is refused; `choose` attaches the kernel where its check
    passes and keeps the form's own one-node core, saying why, where it does not."""
    from tests.tiny import tiny_pair

    assert resolve_step("auto", torch.device("cpu")) == "torch"
    assert resolve_step("auto", torch.device("cuda")) == ("triton" if triton is not None else "torch")
    with pytest.raises(ValueError, match="gdn_step"):
        resolve_step("fast", torch.device("cpu"))
    pair = tiny_pair("hybrid", seed=0, layers=4)
    pair.target.to(DEVICE)
    gdn = next(m for m in pair.target.modules() if hasattr(m, "A_log"))
    form, why = choose("torch", torch.device(DEVICE), gdn, "triton")
    assert why is None and form.one_node is gdn_step_triton
    anc = torch.ones(1, 1, dtype=torch.bool, device=DEVICE)
    assert form.at(anc, Pieces(False)).func is step_core
    assert choose("torch", torch.device(DEVICE), gdn, "torch")[0].one_node is None

    def wrong(*args, **kw):  # a one-node core that differs from the torch core: refused at construction
        o, k, g, delta = gdn_step_triton(*args, **kw)
        return o, k, g, delta + 1e-2

    with pytest.raises(AssertionError):
        check_one_node(wrong, torch.device(DEVICE), gdn)
    assert isinstance(TorchForm(), TorchForm) and TorchForm().one_node is None


def test_runner_with_the_one_node_kernel_decodes_greedy():
    """The static runner with gdn_step, commit, gdn_prep and norm "triton" (and each tree form beside them): its
    greedy == transformers' greedy and its DDTree == greedy, token for token (fp32)."""
    from ddtree_viz.engine.oracle import OracleProposer
    from ddtree_viz.engine.runner import StaticRunner
    from ddtree_viz.engine.reference import GreedyReference
    from tests.test_runner import PROMPT, runner_ddtree, runner_greedy
    from tests.tiny import tiny_pair

    pair = tiny_pair("hybrid", seed=0, layers=8)
    pair.target.to(DEVICE)
    pair.drafter.to(DEVICE)
    prompt = pair.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    new = 24
    ref = list(GreedyReference(pair.target, prompt, set()).extend_to(new).ids)
    for kernel in ("torch", "triton-rule"):
        forms = {"gdn_kernel": kernel, "fused": True, "attention": "eager", "gdn_step": "triton", "commit": "triton",
                 "gdn_prep": "triton", "norm": "triton"}
        runner = StaticRunner(pair.target, max_len=256, sizes=(1, 17), feature_layer_ids=pair.drafter.target_layer_ids,
                              forms=forms)
        assert runner.kernel_error is None and runner.forms.gdn_step == runner.forms.commit == "triton"
        assert runner.forms.norm == "triton" and runner._norm_kernel is add_rms_norm_triton
        assert runner.rule.one_node is gdn_step_triton and runner._commit_kernel is commit_recurrent_triton
        assert runner.rule.prep is (gdn_prep_triton if kernel == "triton-rule" else None)  # the torch core has none
        assert runner.forms.gdn_prep == ("triton" if kernel == "triton-rule" else "torch")
        assert runner_greedy(runner, prompt, new) == ref
        oracle = OracleProposer(ref, len(prompt), [0, 2, 1], pair.target.config.vocab_size, block_size=8)
        out, rounds = runner_ddtree(pair, runner, oracle, prompt, new, 16)
        assert out == ref and max(rounds) > 2


@pytest.mark.parametrize("T, Hk, rep, K, V, dtype", [
    (1, 2, 1, 16, 16, torch.float32), (9, 2, 3, 16, 32, torch.float32), (17, 1, 2, 32, 16, torch.bfloat16),
    (9, 2, 3, 16, 32, torch.bfloat16),
])
def test_tree_prep_kernel_equals_the_piece(T, Hk, rep, K, V, dtype):
    """A tree's conv (each node's window along its parent chain, into the committed columns), l2 norms and gates in
    one launch: gdn_step/naive.py's gdn_prep's q, k (at their key heads), v, g, beta, to the bit where the roundings
    allow."""
    import random

    args, w = layer_inputs(Hk, rep, K, V, 4, dtype, seed=T + rep)
    gen = torch.Generator().manual_seed(T)
    u, b, a = (torch.randn(T, n, generator=gen).to(DEVICE, dtype) for n in (args[0].shape[1], Hk * rep, Hk * rep))
    conv_state = args[4]
    gather = TreeIndex.build(random_tree(T, min(T - 1, 4), random.Random(T)), 4, DEVICE).conv_gather
    d = w.dims
    got = gdn_prep_triton(u, b, a, conv_state, gather, w.conv_weight, w.A_log, w.dt_bias, **d_prep(d))
    want = gdn_prep(u, b, a, conv_state, w.conv_weight, gather, w.A_log, w.dt_bias, d["key_dim"], d["head_k"],
                    d["head_v"], 1)
    tol = dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for name, x, y in zip(("q", "k", "v", "g", "beta"), got, want):
        assert x.shape == y.shape and x.dtype == y.dtype, name
        torch.testing.assert_close(x, y, **tol, msg=lambda m: f"{name}: {m}")
    if T > 1:  # the windows are the tree's: the root's window for every node is wrong
        root = gdn_prep_triton(u, b, a, conv_state, gather[:1].expand(T, -1), w.conv_weight, w.A_log, w.dt_bias,
                               **d_prep(d))
        assert not torch.allclose(root[2], got[2], atol=1e-3)


def test_tree_prep_is_checked_and_taken_by_the_forms_with_key_heads():
    """choose attaches the prep to triton-rule (q, k at their key heads), not to the torch form; a prep that differs
    from the piece is refused at construction."""
    from tests.tiny import tiny_pair

    pair = tiny_pair("hybrid", seed=0, layers=4)
    pair.target.to(DEVICE)
    gdn = next(m for m in pair.target.modules() if hasattr(m, "A_log"))
    form, why = choose("triton-rule", torch.device(DEVICE), gdn, "torch", "triton")
    assert why is None and form.prep is gdn_prep_triton
    assert choose("torch", torch.device(DEVICE), gdn, "torch", "triton")[0].prep is None

    def wrong(*args, **kw):
        q, k, v, g, beta = gdn_prep_triton(*args, **kw)
        return q, k, v, g + 1e-2, beta

    with pytest.raises(AssertionError):
        check_prep(wrong, torch.device(DEVICE), gdn)


def commit_inputs(Lg, T, H, Hs, K, V, seed):
    gen = torch.Generator().manual_seed(seed)
    rec = torch.randn(Lg, H, K, V, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(Lg, T, Hs, K, generator=gen), dim=-1)
    g, delta = -torch.rand(Lg, T, H, generator=gen), torch.randn(Lg, T, H, V, generator=gen)
    return [x.to(DEVICE) for x in (rec, k, g, delta)]


def committed_both(rec, k, g, delta, path, P):
    """The states after committing `path` (padded to P steps with its last node, as the runner pads it) by the
    kernel, by the torch form (closed_form.commit_recurrent) and by the step-by-step reference, held equal; returns
    that state and the commit's inputs (padded path, steps, length)."""
    padded = torch.tensor(path + [path[-1]] * (P - len(path)), device=DEVICE)
    steps, length = torch.arange(P, device=DEVICE), torch.tensor(len(path), device=DEVICE)
    want, got, ref = rec.clone(), rec.clone(), rec.clone()
    commit_recurrent(want, k, g, delta, padded, steps, length)
    commit_recurrent_triton(got, k, g, delta, padded, steps, length)
    commit_recurrent_reference(ref, k, g, delta, padded, steps, length)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(want, ref, atol=1e-5, rtol=1e-5)
    return want, padded, steps, length


@pytest.mark.parametrize("Lg, T, H, Hs, K, V, path", [
    (2, 1, 4, 4, 16, 32, [0]), (3, 9, 6, 2, 16, 64, [0, 3, 5, 8]), (1, 17, 2, 1, 32, 32, [0, 1, 2, 3, 4, 5, 6, 7]),
])
def test_commit_kernel_equals_the_torch_commit(Lg, T, H, Hs, K, V, path):
    """Every layer's state advanced along a path (keys at their value or key heads), padded to 8 steps with its last
    node as the runner pads it: the same states as closed_form.commit_recurrent and the reference; a path cut short
    is not."""
    rec, k, g, delta = commit_inputs(Lg, T, H, Hs, K, V, seed=T)
    want, padded, steps, length = committed_both(rec, k, g, delta, path, 8)
    if len(path) > 1:  # the length is read, not assumed: one step fewer moves the state
        short = rec.clone()
        commit_recurrent_triton(short, k, g, delta, padded, steps, length - 1)
        assert not torch.allclose(short, want, atol=1e-3)
    assert choose_commit("triton", torch.device(DEVICE)) == (commit_recurrent_triton, None)
    assert choose_commit("torch", torch.device(DEVICE)) == (None, None)
    with pytest.raises(ValueError, match="power-of-two"):
        commit_recurrent_triton(rec[..., :12, :], k[..., :12], g, delta, padded, steps, length)


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_kernels_at_qwen36_27b_shapes_on_the_gpu():
    """Qwen3.6-27B's GDN widths (16 key heads, 48 value heads, K = V = 128, conv 4): the one-node core in bf16 and
    fp32, and the commit of every layer's state (48 GDN layers, a path of 4 of 16 steps)."""
    for dtype in (torch.bfloat16, torch.float32):
        args, w = layer_inputs(16, 3, 128, 128, 4, dtype, seed=7)
        got, want = step_core(gdn_step_triton, *args, w), torch_one_node(args, w)
        tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
        for x, y in zip(got, want):
            torch.testing.assert_close(x, y, **tol)
    committed_both(*commit_inputs(48, 17, 48, 16, 128, 128, seed=2), [0, 1, 4, 9], 16)

"""Programmatic dependent launch (engine/kernels/pdl.py, RunnerForms.pdl): the option's meaning on each device, the
launch keywords only inside `early` and only for CUDA tensors (these two need no Triton). On a Hopper GPU: a chain
of the add + norm launch and one-row FP8 products (each reading the output of the one before) in a CUDA graph gives
the same bits launched early as launched after, replay after replay with new inputs (a kernel reading before its
wait would read the last replay's values); a runner over FP8 weights decodes the same tokens and logits with the
option on and off."""

import pytest
import torch

from ddtree_viz.engine.kernels import pdl
from ddtree_viz.engine.weights import fp8

# nothing here imports Triton at collection (the runner does): Triton's interpreter tests set it up first
# (tests/kernel_env.py), and these need none
BLOCK = (128, 128)
CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
HOPPER = CUDA and pdl.available(torch.device("cuda"))  # CI: no GPU


def test_the_option_resolves_per_device():
    from ddtree_viz.engine.runner import RunnerForms

    cpu = torch.device("cpu")
    assert pdl.resolve("auto", cpu, triton=True) == "off" and pdl.resolve("off", cpu, triton=True) == "off"
    with pytest.raises(ValueError, match="compute capability 9.0"):
        pdl.resolve("on", cpu, triton=True)
    with pytest.raises(ValueError, match="pdl must be one of"):
        pdl.resolve("early", cpu, triton=True)
    with pytest.raises(ValueError, match="pdl"):
        RunnerForms.of({"pdl": "yes"}, cpu)
    assert RunnerForms.of(None, cpu).pdl == "off"
    cuda = torch.device("cuda")
    assert pdl.resolve("auto", cuda, triton=False) == "off"  # the kernels that launch early are Triton's
    assert RunnerForms.of(None, cuda).pdl == ("on" if HOPPER else "off")


def test_the_keywords_only_inside_early_and_on_cuda():
    x = torch.zeros(2, device=DEVICE)
    assert pdl.keywords(x) == {}
    with pdl.early(True):
        assert pdl.keywords(x) == ({"PDL": True, "launch_pdl": True} if CUDA else {})
        assert pdl.keywords(torch.zeros(2)) == {}
        with pdl.early(False):
            assert pdl.keywords(x) == {}
        with pytest.raises(RuntimeError), pdl.early(False):
            raise RuntimeError("a pass that fails")
        assert pdl.keywords(x) == ({"PDL": True, "launch_pdl": True} if CUDA else {})  # reset after the error
    assert pdl.keywords(x) == {}


def _chain(x, weights, scales, norm_scale, plain):
    """A GDN layer's order at one row: norm, the in_proj-like product with plain rows riding, the out_proj-like
    split product, add + norm, the down-like product (each a one-row launch; the split ones sum in their launch)."""
    from ddtree_viz.engine.kernels.add_norm.triton_norm import add_rms_norm_triton
    from ddtree_viz.engine.kernels.fp8_gemm.triton_gemm import fp8_linear

    h, normed = add_rms_norm_triton(x, torch.zeros_like(x), norm_scale, 1e-6)
    u = fp8_linear(normed, weights[0], scales[0], BLOCK, plain=plain)
    o = fp8_linear(u[:, : weights[1].shape[1]], weights[1], scales[1], BLOCK)
    h, normed = add_rms_norm_triton(h, o, norm_scale, 1e-6)
    return h, u, fp8_linear(normed, weights[2], scales[2], BLOCK)


@pytest.mark.skipif(not HOPPER, reason="needs a CUDA GPU of compute capability 9.0 or later")
def test_a_chain_launched_early_gives_the_same_bits_in_a_cuda_graph():
    gen = torch.Generator().manual_seed(0)
    shapes = [(2048, 1024), (1024, 1792), (2048, 1024)]  # [N, K]: wide, narrow and long (split), wide
    weights, scales = zip(*(fp8.quantize(torch.randn(n, k, generator=gen) * 0.05, BLOCK) for n, k in shapes))
    weights, scales = [w.cuda() for w in weights], [s.cuda() for s in scales]
    plain = (torch.randn(64, 1024, generator=gen) * 0.05).cuda().to(torch.bfloat16)
    norm_scale = (1 + 0.1 * torch.randn(1024, generator=gen)).cuda()
    graphs, outs = {}, {}
    x = torch.zeros(1, 1024, device="cuda", dtype=torch.bfloat16)
    for on in (False, True):
        with pdl.early(on):
            _chain(x, weights, scales, norm_scale, plain)  # compiled before the capture
            torch.cuda.synchronize()
            graphs[on] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graphs[on]):
                outs[on] = _chain(x, weights, scales, norm_scale, plain)
    for seed in range(6):
        x.copy_(torch.randn(1, 1024, generator=torch.Generator().manual_seed(seed + 1)).to(x))
        got = {}
        for on in (False, True):
            graphs[on].replay()
            torch.cuda.synchronize()
            got[on] = [t.clone() for t in outs[on]]
        eager = _chain(x, weights, scales, norm_scale, plain)
        for a, b, c in zip(got[False], got[True], eager):
            assert torch.equal(a, b) and torch.equal(a, c)


@pytest.mark.skipif(not HOPPER, reason="needs a CUDA GPU of compute capability 9.0 or later")
def test_a_runner_over_fp8_weights_decodes_the_same_with_and_without():
    from tests.test_runner import PROMPT, runner_greedy
    from tests.tiny import tiny_pair
    from ddtree_viz.engine.runner import StaticRunner
    from ddtree_viz.engine.tree import DraftTree

    pair = tiny_pair("hybrid", seed=2, layers=8, hidden=256, linear_value_head_dim=16)
    assert fp8.quantize_linears(pair.target, BLOCK) > 0
    target = pair.target.to("cuda", torch.bfloat16)
    prompt = pair.tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    tree = DraftTree.chain_from_logprobs(prompt[-1], torch.randn(16, target.config.vocab_size).log_softmax(-1))
    tokens, logits = {}, {}
    for option in ("on", "off"):
        runner = StaticRunner(target, max_len=256, sizes=(1, 17), forms={"pdl": option})
        assert runner.graphs and runner.forms.pdl == option
        runner.prefill(prompt)
        logits[option] = runner.forward(tree)[0].clone()
        tokens[option] = runner_greedy(runner, prompt, 40)
    assert tokens["on"] == tokens["off"]
    assert torch.equal(logits["on"], logits["off"])

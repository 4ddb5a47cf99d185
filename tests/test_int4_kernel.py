"""The 4-bit GEMM (engine/int4_gemm.py) against the float32 product with the weights dequantized (engine/int4.py):
a decode step's one row, a tree verify's 17 to 129, a prefill's more; every layout the loader accepts (groups of
128 and of 32, per channel, activation order, asymmetric zero points packed along the rows), partial words, groups
and zero-point words at the edges. Triton's interpreter without a GPU, skipped without Triton: tests/kernel_env.py.

In the interpreter, float32 -> bfloat16 rounds toward zero (a GPU rounds to nearest even), so half-precision
results are held to a step of the output; float32 to the order of the sums."""

import pytest
import torch

from tests.kernel_env import CUDA, DEVICE, triton  # noqa: F401 (first: Triton set up before any kernel)

from ddtree_viz.engine import int4
from ddtree_viz.engine.int4_gemm import int4_linear

LAYOUTS = {  # name: (out, in, spec, activation order)
    "group128-sym": (64, 256, int4.Int4Spec(128, True), False),
    "group128-sym-partial": (72, 200, int4.Int4Spec(128, True), False),  # 200 = 25 words, a partial last group
    "group32-asym": (75, 136, int4.Int4Spec(32, False), False),  # 75 rows: the last zero-point word holds 3
    "channel-asym": (40, 96, int4.Int4Spec(0, False), False),
    "actorder-asym": (48, 160, int4.Int4Spec(32, False), True),
}


def quantized(name: str, seed: int) -> tuple[dict, int4.Int4Spec]:
    """A weight of the layout `name` in its parts (on DEVICE)."""
    out, inn, spec, actorder = LAYOUTS[name]
    gen = torch.Generator().manual_seed(seed)
    parts = int4.quantize(torch.randn(out, inn, generator=gen) * 0.05, spec)
    if actorder:  # a permuted column -> group map, as GPTQ's activation order stores it
        groups = parts["weight_scale"].shape[1]
        parts["weight_g_idx"] = (torch.randperm(inn, generator=gen) * groups // inn).to(torch.int32)
    return {k: v.to(DEVICE) for k, v in parts.items()}, spec


def reference(x: torch.Tensor, parts: dict, spec: int4.Int4Spec) -> torch.Tensor:
    """The dequantized model's product: (q - z) x scale in float32, rounded once to x's dtype."""
    w = int4.dequantize({k: v.cpu() for k, v in parts.items()}, spec).to(x.dtype).float()
    return x.float().cpu() @ w.T


def product(x: torch.Tensor, parts: dict, spec: int4.Int4Spec) -> torch.Tensor:
    return int4_linear(x, parts["weight_packed"], parts["weight_scale"], parts.get("weight_zero_point"),
                       parts.get("weight_g_idx"), spec.group or x.shape[-1])


@pytest.mark.parametrize("rows", [1, 2, 17, 65, 129, 200])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_int4_gemm_is_the_dequantized_product_in_float32(rows, layout):
    parts, spec = quantized(layout, rows)
    x = torch.randn(rows, LAYOUTS[layout][1], generator=torch.Generator().manual_seed(rows)).to(DEVICE)
    y = product(x, parts, spec)
    assert y.shape == (rows, LAYOUTS[layout][0]) and y.dtype == torch.float32
    torch.testing.assert_close(y.cpu(), reference(x, parts, spec), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_int4_gemm_in_half_precision(dtype):
    """Activations stay in their dtype: y in it, each weight rounded once to it; any leading shape."""
    parts, spec = quantized("group32-asym", 4)
    x = torch.randn(3, 5, 136, generator=torch.Generator().manual_seed(1)).to(dtype).to(DEVICE)
    y = product(x, parts, spec)
    ref = reference(x.reshape(-1, 136), parts, spec).reshape(3, 5, 75)
    assert y.shape == (3, 5, 75) and y.dtype == dtype
    step = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
    torch.testing.assert_close(y.float().cpu(), ref, rtol=2 * step, atol=2 * step * ref.abs().max().item())


def test_a_kept_linear_on_the_device_is_its_dequantized_linear():
    """int4.Int4Linear (what a kept checkpoint's Linears become) computes the dequantized weight's product, with
    its bias; a weight that does not fit the input is refused, not read out of bounds."""
    parts, spec = quantized("actorder-asym", 7)
    bias = torch.randn(48).to(DEVICE)
    module = int4.Int4Linear(parts, spec, bias)
    x = torch.randn(9, 160, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    torch.testing.assert_close(module(x).cpu(), reference(x, parts, spec) + bias.cpu(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="do not fit 152 inputs"):
        product(x[:, :152], parts, spec)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (CUDA graphs, the Triton GEMM)")
def test_runner_with_4bit_weights_in_cuda_graphs():
    """The runner's defaults on CUDA (CUDA graphs, compiled pieces, 4-bit projections through the Triton GEMM, each
    its own module) over 4-bit weights (groups of 128, symmetric), float32: greedy == transformers' greedy of the
    dequantized model, DDTree == that greedy (oracle drafts); a tree pass's logits equal the dequantized model's
    runner's to the order of the sums."""
    from tests.test_fp8_kernel import dequantized_twin
    from tests.test_runner import PROMPT, runner_ddtree, runner_greedy
    from tests.tiny import tiny_pair
    from ddtree_viz.engine import fp8
    from ddtree_viz.engine.oracle import OracleProposer
    from ddtree_viz.engine.runner import StaticRunner
    from ddtree_viz.engine.session import GreedyReference
    from ddtree_viz.engine.tree import DraftTree

    pair = tiny_pair("hybrid", seed=2, layers=8, hidden=256, linear_value_head_dim=16)
    assert int4.quantize_linears(pair.target, int4.Int4Spec(128, True), skip=fp8.NOT_CONVERTED) > 0
    pair.target.to("cuda")
    pair.drafter.to("cuda")
    twin = dequantized_twin(pair.target, torch.float32)
    prompt, new = pair.tokenizer(PROMPT, add_special_tokens=False)["input_ids"], 40
    ref = GreedyReference(twin, prompt, set()).extend_to(new)
    runner = StaticRunner(pair.target, max_len=256, sizes=(1, 17), feature_layer_ids=pair.drafter.target_layer_ids)
    assert runner.graphs and runner.options.fused and runner._fused[0, "mlp"] is None  # 4-bit: not fused
    assert runner_greedy(runner, prompt, new) == list(ref.ids)
    for budget, ranks in [(4, [0]), (16, [1]), (16, [0, 2, 1])]:
        oracle = OracleProposer(ref.ids, len(prompt), ranks, pair.target.config.vocab_size, block_size=8)
        assert runner_ddtree(pair, runner, oracle, prompt, new, budget)[0] == list(ref.ids)
    plain = StaticRunner(twin, max_len=256, sizes=(1, 17), feature_layer_ids=pair.drafter.target_layer_ids)
    tree = DraftTree.chain_from_logprobs(prompt[-1], torch.randn(16, pair.target.config.vocab_size).log_softmax(-1))
    logits = []
    for r in (runner, plain):
        r.prefill(prompt)
        logits.append(r.forward(tree)[0].clone())
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)

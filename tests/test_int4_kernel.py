"""The 4-bit GEMM (engine/kernels/int4_gemm/triton_gemm.py) against the float32 product with the weights dequantized
(engine/weights/int4_common.py): a decode step's one row, a tree verify's 17 to 129, a prefill's more; every layout the
loader accepts (groups of 128 and of 32, per channel, activation order, asymmetric zero points packed along the rows),
partial words, groups and zero-point words at the edges. Triton's interpreter without a GPU, skipped without Triton:
tests/kernel_env.py.

In the interpreter, float32 -> bfloat16 rounds toward zero (a GPU rounds to nearest even), so half-precision
results are held to a step of the output; float32 to the order of the sums."""

import pytest
import torch

from tests.kernel_env import CUDA, DEVICE, triton  # noqa: F401 (first: Triton set up before any kernel)

from ddtree_viz.engine.weights import int4_common as int4
from ddtree_viz.engine.kernels.int4_gemm.triton_gemm import Config, int4_linear

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


def assert_a_step_of_the_output(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """y in `dtype`, equal to the float32 reference to two steps of that dtype's rounding of the output."""
    step = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
    assert y.dtype == dtype
    torch.testing.assert_close(y.float().cpu(), ref, rtol=2 * step, atol=2 * step * ref.abs().max().item())


def product(x: torch.Tensor, parts: dict, spec: int4.Int4Spec, config: Config | None = None) -> torch.Tensor:
    return int4_linear(x, parts["weight_packed"], parts["weight_scale"], parts.get("weight_zero_point"),
                       parts.get("weight_g_idx"), spec.group or x.shape[-1], config)


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
    assert y.shape == (3, 5, 75)
    assert_a_step_of_the_output(y, ref, dtype)


CONFIGS = {"block_n_32": Config(block_n=32), "block_n_128_warps_8": Config(block_n=128, num_warps=8),
           "block_k_32_stages_2": Config(block_k=32, num_stages=2), "gemv": Config(block_k=32, gemv=True),
           "gemv_128": Config(block_n=128, block_k=32, num_warps=8, gemv=True),
           "gemv_k128_split_2": Config(block_n=16, block_k=128, gemv=True, split_k=2),
           # the word form: whole words a step, unpacked in registers; one group a step, several, and split inputs
           "words_k32": Config(block_n=32, block_k=32, words=True),
           "words_k128_split_2": Config(block_n=16, block_k=128, words=True, split_k=2),
           "words_k64_split_3_m32": Config(block_n=32, block_k=64, words=True, split_k=3, block_m=32),
           "words_k64_split_3_m32_half": Config(block_n=32, block_k=64, words=True, split_k=3, block_m=32, half=True),
           "words_k128_split_2_half": Config(block_n=16, block_k=128, words=True, split_k=2, half=True),
           # the word form's products a field at a time (16 words a step or more)
           "words_k128_split_2_fields": Config(block_n=16, block_k=128, words=True, split_k=2, fields=True),
           "words_k128_m32_fields_half": Config(block_n=32, block_k=128, words=True, block_m=32, fields=True,
                                                half=True),
           # the swapped form: the unpacked tile first, all rows of x a program (a block and a tail)
           "swap_k64_m64_tail16": Config(block_n=32, block_k=64, swap=True, block_m=64, tail=16),
           "swap_k128_m16_tail16_half": Config(block_n=64, block_k=128, swap=True, block_m=16, tail=16, half=True),
           "swap_k32_m32": Config(block_n=16, block_k=32, swap=True, block_m=32),
           # ... and the input split into slices (a narrow weight's 80 programs on an H100's 132 SMs), their float32
           # partials summed after; three slices of whole steps leave the last one short
           "swap_k64_m64_tail16_split_3": Config(block_n=32, block_k=64, swap=True, block_m=64, tail=16, split_k=3),
           "swap_k32_m32_split_2_half": Config(block_n=16, block_k=32, swap=True, block_m=32, split_k=2, half=True)}


@pytest.mark.parametrize("rows", [1, 3, 65])
@pytest.mark.parametrize("layout", ["group128-sym-partial", "group32-asym"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_every_config_computes_the_dequantized_product(rows, layout, config):
    """The bench's configs (other tiles, and the one-row kernel on the CUDA cores: x times the row's scale in float32,
    each weight exact, a row of x a program) compute the same product, to the order of the sums in float32."""
    parts, spec = quantized(layout, rows + 1)
    x = torch.randn(rows, LAYOUTS[layout][1], generator=torch.Generator().manual_seed(rows)).to(DEVICE)
    y = product(x, parts, spec, CONFIGS[config])
    torch.testing.assert_close(y.cpu(), reference(x, parts, spec), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_one_row_kernel_in_half_precision(dtype):
    """One row on the CUDA cores in bf16 / fp16 activations: the weight exact rather than rounded to the dtype (as
    fp8_gemm's one-row product), so the output is the rounded-weight product's to a step of the output."""
    parts, spec = quantized("group32-asym", 6)
    x = torch.randn(1, 136, generator=torch.Generator().manual_seed(3)).to(dtype).to(DEVICE)
    assert_a_step_of_the_output(product(x, parts, spec, CONFIGS["gemv"]), reference(x, parts, spec), dtype)


def test_the_one_row_kernel_refuses_activation_order_and_reads_groups_narrower_than_a_step():
    """Activation order is refused by the one-row kernel (word_groups), not misread; groups narrower than a step (32
    columns in steps of 64) are read a scale a word."""
    x = torch.randn(1, 160).to(DEVICE)
    parts, spec = quantized("actorder-asym", 1)
    with pytest.raises(ValueError, match="needs each word in one group"):
        product(x, parts, spec, CONFIGS["gemv"])
    parts, spec = quantized("group32-asym", 1)
    y = product(x[:, :136], parts, spec, Config(block_k=64, gemv=True))
    torch.testing.assert_close(y.cpu(), reference(x[:, :136], parts, spec), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("form", ["words_k64_split_3_m32_half", "words_k128_split_2_half", "gemv",
                                  "gemv_k128_split_2", "swap_k128_m16_tail16_half"])
def test_scales_in_the_activations_dtype(dtype, form):
    """A model's own scales (bf16 / fp16, as checkpoints store them) with its activations: the word form with `half`
    dequantizes in that dtype (q - z from the fields' bits, times the scale rounded once: the dequantized model's
    weight), over the interleaved tile (steps of 64 columns) and a field at a time (128: on a GPU the bfloat16
    pairs' inline PTX); the one-row form in float32 (on a GPU its LOP3's PTX); each gives the rounded-weight product
    to a step of the output. (bfloat16 runs the float32 form in the interpreter, whose int16 -> bfloat16 bitcast is
    wrong.)"""
    parts, spec = quantized("group32-asym", 9)
    parts["weight_scale"] = parts["weight_scale"].to(dtype)
    rows = 1 if form.startswith("gemv") else 17
    x = torch.randn(rows, 136, generator=torch.Generator().manual_seed(4)).to(dtype).to(DEVICE)
    assert_a_step_of_the_output(product(x, parts, spec, CONFIGS[form]), reference(x, parts, spec), dtype)


@pytest.mark.parametrize("rows", [17, 65, 129])
@pytest.mark.parametrize("layout", ["group128-sym", "group32-asym", "channel-asym"])
def test_the_swapped_forms_tiles_by_bulk_copies_give_the_same_product(rows, layout):
    """The swapped form (a verify's) reads x's and the words' tiles through tensor descriptors where the device has
    bulk copies (Triton's interpreter emulates them) and both are 16-byte aligned: the same product, bit for bit, as
    its loads by address (the rows past x's and the weight's edges, and a partial word column, zero either way);
    an x that does not start on 16 bytes, or words whose rows are not 16 bytes apart, take the loads by address."""
    from ddtree_viz.engine.kernels.tiles import bulk_copies, describable

    parts, spec = quantized(layout, rows)
    inn = LAYOUTS[layout][1]
    config = Config(block_n=32, block_k=64, swap=True, block_m=64 if rows < 129 else 128, tail=16 if rows > 64 else 0)
    x = torch.randn(rows, inn, generator=torch.Generator().manual_seed(rows)).to(DEVICE)
    moved = torch.empty(rows * inn + 1, device=DEVICE)[1:].view(rows, inn).copy_(x)  # 4 bytes past 16
    assert bulk_copies(x.device) and describable(x) and not describable(moved)
    assert describable(parts["weight_packed"]) == (inn % 32 == 0)  # 256 and 96 inputs: 128 and 48 bytes a row
    y = product(x, parts, spec, config)
    torch.testing.assert_close(y.cpu(), reference(x, parts, spec), rtol=1e-5, atol=1e-5)
    assert torch.equal(product(moved, parts, spec, config), y)


def test_the_benchs_other_configs_compute_the_same_product():
    """gpu_bench --int4 times int4_gemm.choose's config beside its neighbours and, at one row, the kernel on the CUDA
    cores (benchmarks/gpu/int4.py int4_configs) on the model's bf16 activations: each one runs and gives the dequantized
    product (to bf16's rounding of the output; float32 in the interpreter)."""
    from ddtree_viz.benchmarks.gpu.int4 import int4_configs
    from ddtree_viz.engine.kernels.int4_gemm import triton_gemm as int4_gemm

    parts, spec = quantized("group128-sym", 11)
    dtype = torch.bfloat16 if CUDA else torch.float32
    for rows in (1, 65):
        x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)).to(DEVICE, dtype)
        configs = int4_configs(int4_gemm, rows, 256, 128)
        assert configs["chosen"] == int4_gemm.choose(rows, 64, 256) and len(configs) >= 6
        assert any(c.gemv for c in configs.values()) == (rows == 1)
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
        for label, config in configs.items():
            torch.testing.assert_close(product(x, parts, spec, config).cpu().float(), reference(x, parts, spec),
                                       msg=label, **tol)


def test_every_launch_choose_picks_at_the_27bs_shapes_computes_the_product():
    """int4_gemm.choose's launch for each row count a session runs (a step, a DFlash block, a verify at budget 64
    and 128) and each of the 27B's output widths (narrow 5,120, between, wide 34,816), applied to a small product:
    each gives the dequantized product (a launch's tiles, steps and slices, not the product's size, differ)."""
    from ddtree_viz.engine.kernels.int4_gemm import table, triton_gemm as int4_gemm

    parts, spec = quantized("group128-sym", 13)
    dtype = torch.bfloat16 if CUDA else torch.float32
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    for rows in (1, 16, 65, 129):
        x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)).to(DEVICE, dtype)
        for n in (5120, 16384, 34816):
            config = int4_gemm.choose(rows, n, 5120)
            form = config.swap if rows > 16 else config.words or (rows == 1 and config.gemv)  # gemv: the table's
            assert form and (config.split_k == 1 or rows <= 16 or n <= table.NARROW), config
            torch.testing.assert_close(product(x, parts, spec, config).cpu().float(), reference(x, parts, spec),
                                       msg=f"{rows} rows, {n} outputs: {config}", **tol)


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


@pytest.mark.parametrize("symmetric", [True, False], ids=["sym", "asym"])
def test_fused_4bit_projections_split_as_their_parts(symmetric):
    """gate + up (MLP) as one 4-bit weight (fused.fuse_linears over Int4Linears): each output equals its own part's
    product; with zero points (packed 8 rows to a word) a part that is not a multiple of 8 rows ends its run, and
    parts in activation order are not fused at all."""
    from ddtree_viz.engine.fused import FusedRuns, fuse_linears

    spec = int4.Int4Spec(32, symmetric)
    gen = torch.Generator().manual_seed(5)
    gate, up = (int4.quantize(torch.randn(n, 96, generator=gen) * 0.05, spec) for n in (72, 60))
    mlp = torch.nn.Module()
    mlp.gate_proj, mlp.up_proj = (int4.Int4Linear({k: v.to(DEVICE) for k, v in p.items()}, spec) for p in (gate, up))
    fused = fuse_linears(mlp, ("gate_proj", "up_proj"))
    assert isinstance(fused, int4.FusedInt4Linear) and fused.packed.shape == (132, 12)
    assert (fused.zero is None) == symmetric and (symmetric or fused.zero.shape == (17, 3))
    x = torch.randn(9, 96, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    for y, parts in zip(fused(x), (gate, up)):
        torch.testing.assert_close(y.cpu(), reference(x, parts, spec), rtol=1e-5, atol=1e-5)
    swapped = torch.nn.Module()
    swapped.up_proj, swapped.gate_proj = (int4.Int4Linear({k: v.to(DEVICE) for k, v in p.items()}, spec)
                                          for p in (up, gate))
    again = fuse_linears(swapped, ("up_proj", "gate_proj"))
    assert isinstance(again, int4.FusedInt4Linear if symmetric else FusedRuns)  # 60 rows: not whole zero-point words
    ordered = torch.nn.Module()
    ordered.a, ordered.b = (int4.Int4Linear({**p, "weight_g_idx": torch.arange(96, dtype=torch.int32) // 32}, spec)
                            for p in (gate, up))
    assert fuse_linears(ordered, ("a", "b")) is None


def mix_schemes(target: torch.nn.Module) -> None:
    """Layers set apart as AutoRound's extra_config or GPTQ's dynamic set them (a symmetric group-128 target): layer
    1's up_proj in groups of 32 with zero points beside its symmetric gate_proj (their fused group split in two
    runs), and the lm_head in 4 bits (groups of 64, zero points)."""
    mlp = target.model.layers[1].mlp
    for owner, attr, weight, spec in ((mlp, "up_proj", mlp.up_proj.dequantized(), int4.Int4Spec(32, False)),
                                      (target, "lm_head", target.lm_head.weight.detach(), int4.Int4Spec(64, False))):
        setattr(owner, attr, int4.Int4Linear(int4.quantize(weight, spec), spec))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (CUDA graphs, the Triton GEMM)")
@pytest.mark.parametrize("schemes", ["uniform", "mixed"])
def test_runner_with_4bit_weights_in_cuda_graphs(schemes):
    """The runner's defaults on CUDA (CUDA graphs, compiled pieces, fused 4-bit projections through the Triton GEMM)
    over 4-bit weights (groups of 128, symmetric; mixed: with layers of other schemes, `mix_schemes`), float32:
    greedy == transformers' greedy of the dequantized model, DDTree == that greedy (oracle drafts); a tree pass's
    logits equal the dequantized model's runner's to the order of the sums."""
    from tests.test_fp8_kernel import assert_oracle_ddtree_is_greedy, assert_tree_pass_is_twins, dequantized_twin
    from tests.test_runner import PROMPT, runner_greedy
    from tests.tiny import tiny_pair
    from ddtree_viz.engine.weights import fp8
    from ddtree_viz.engine.runner import StaticRunner
    from ddtree_viz.engine.reference import GreedyReference

    pair = tiny_pair("hybrid", seed=2, layers=8, hidden=256, linear_value_head_dim=16)
    assert int4.quantize_linears(pair.target, int4.Int4Spec(128, True), skip=fp8.NOT_CONVERTED) > 0
    if schemes == "mixed":
        mix_schemes(pair.target)
    pair.target.to("cuda")
    pair.drafter.to("cuda")
    twin = dequantized_twin(pair.target, torch.float32)
    prompt, new = pair.tokenizer(PROMPT, add_special_tokens=False)["input_ids"], 40
    ref = GreedyReference(twin, prompt, set()).extend_to(new)
    runner = StaticRunner(pair.target, max_len=256, sizes=(1, 17), feature_layer_ids=pair.drafter.target_layer_ids)
    assert runner.graphs and runner.forms.fused and isinstance(runner._fused[0, "mlp"], int4.FusedInt4Linear)
    if schemes == "mixed":
        assert runner._fused[1, "mlp"].counts == (1, 1) and type(pair.target.lm_head) is int4.Int4Linear
    assert runner_greedy(runner, prompt, new) == list(ref.ids)
    assert_oracle_ddtree_is_greedy(pair, runner, prompt, ref.ids)
    assert_tree_pass_is_twins(pair, runner, twin, prompt)


def test_every_launch_of_the_measured_table_computes_the_product():
    """Each launch tuned.json holds (engine/kernels/int4_gemm/table.py: what choose takes at the 27B's shapes: the
    one-row form, `half`), applied to a small product with scales in the activations' dtype (bf16 on a GPU, where
    `half` dequantizes in it): the dequantized product to a step of the output; the last band's also at a
    prefill's 300 rows, which take it too."""
    from ddtree_viz.engine.kernels.int4_gemm import table

    if not table.SHIPPED.is_file():
        pytest.skip("no measured table shipped")
    parts, spec = quantized("group128-sym", 17)
    dtype = torch.bfloat16 if CUDA else torch.float32
    parts["weight_scale"] = parts["weight_scale"].to(dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    for name, launch in table.load(table.SHIPPED)["launches"].items():
        band = int(name.split(":")[0])
        # the last band's launch serves every longer pass too (a prefill's rows: table.band), several programs a column
        for rows in (band, 300) if name.startswith(f"{table.LAST_BAND}:") else (band,):
            x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)).to(DEVICE, dtype)
            torch.testing.assert_close(product(x, parts, spec, Config(**launch)).cpu().float(),
                                       reference(x, parts, spec), msg=f"{name} at {rows} rows", **tol)

"""The FP8 GEMM (engine/kernels/fp8_gemm/triton_gemm.py) against the float32 product with the weights dequantized
(engine/weights/fp8.py), for the runner's 1 to 129 rows, partial 128-blocks (dimensions that are not multiples of 128)
and fused projections. Triton's interpreter without a GPU, skipped without Triton: tests/kernel_env.py.

In the interpreter, float32 -> bfloat16 rounds toward zero (a GPU rounds to nearest even), so bfloat16 results
are held to a bfloat16 step of the output; float32 to the order of the sums."""

import dataclasses

import pytest
import torch

from tests.kernel_env import CUDA, DEVICE, triton  # noqa: F401 (first: Triton set up before any kernel)

from ddtree_viz.engine.weights import fp8
from ddtree_viz.engine.weights.registry import KEPT
from ddtree_viz.engine.kernels.fp8_gemm.triton_gemm import Config, bulk_copies, choose, fp8_linear
from ddtree_viz.engine.fused import fuse_linears

BLOCK = (128, 128)


def quantized(n: int, k: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    q, s = fp8.quantize(torch.randn(n, k, generator=gen) * 0.05, BLOCK)
    return q.to(DEVICE), s.to(DEVICE)


def reference(x, q, s) -> torch.Tensor:
    """The dequantized model's product: the weight e4m3 x scale in float32, rounded once to x's dtype."""
    w = fp8.dequantize(q.cpu(), s.cpu(), BLOCK).to(x.dtype).float()
    return x.float().cpu() @ w.T


@pytest.mark.parametrize("rows", [1, 2, 17, 40, 65, 96, 129, 160])  # 40, 96, 160: 32 + 16, 64 + 32, 128 + 32
@pytest.mark.parametrize("n, k", [(192, 320), (256, 128), (64, 200)])
def test_fp8_gemm_is_the_dequantized_product_in_float32(rows, n, k):
    q, s = quantized(n, k, rows)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(n)).to(DEVICE)
    y = fp8_linear(x, q, s, BLOCK)
    assert y.shape == (rows, n) and y.dtype == torch.float32
    torch.testing.assert_close(y.cpu(), reference(x, q, s), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 65, 129])
@pytest.mark.parametrize("config", [Config(16, 64, 3), Config(64, 128, 2, 8), Config(128, 64, 1, 8),
                                    Config(16, 128, 2, swap=True), Config(128, 64, 1, 8, swap=True),
                                    Config(64, 128, 3, 8, swap=True, tail=16), Config(32, 64, 1, tail=32),
                                    Config(1, 64, 3, 8, sum_in_launch=True, gemv=True), Config(1, 32, 1, gemv=True)],
                         ids=["split3", "split2-wide", "one-block", "swap-split2", "swap-one-block", "swap-tail-split3",
                              "tail", "gemv-split3", "gemv-32"])
def test_fp8_gemm_configs_compute_the_same_product(rows, config):
    """Every config (several row blocks, split-K with its float32 partial sums, 128-row weight tiles) gives the
    dequantized product; K = 1000 leaves a partial last block and an uneven last split."""
    q, s = quantized(320, 1000, rows)
    x = torch.randn(rows, 1000, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    torch.testing.assert_close(fp8_linear(x, q, s, BLOCK, config).cpu(), reference(x, q, s), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("config", [Config(16, 64, 4, sum_in_launch=True), Config(16, 64, 4),
                                    Config(64, 128, 8, 8, swap=True, tail=16, sum_in_launch=True),
                                    Config(64, 128, 8, 8, swap=True, tail=16),
                                    Config(1, 64, 4, 8, sum_in_launch=True, gemv=True), Config(1, 64, 4, gemv=True)],
                         ids=["decode-split4-in-launch", "decode-split4", "verify-tail-split8-in-launch",
                              "verify-tail-split8", "gemv-split4-in-launch", "gemv-split4"])
def test_a_split_product_adds_its_slices_in_order(config):
    """Split-K, the slices added in the product's launch (the last of a tile's programs to arrive) or by a second
    kernel: the product equals, bit for bit, its K slices' products made one at a time and added in order; the
    arrival counters are 0 again after, so a second launch (a graph's replay) gives the same."""
    from ddtree_viz.engine.kernels.fp8_gemm import triton_gemm as fp8_gemm
    from ddtree_viz.engine.kernels.fp8_gemm.triton_gemm import arrivals

    rows, k = (1, 1024) if config.block_m <= 16 else (65, 1024)
    q, s = quantized(320, k, 3)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    y = fp8_linear(x, q, s, BLOCK, config)
    step = k // config.split_k
    one = dataclasses.replace(config, split_k=1)
    slices = [fp8_linear(x[:, c:c + step].contiguous(), q[:, c:c + step].contiguous(),
                         s[:, c // 128:(c + step) // 128].contiguous(), BLOCK, one) for c in range(0, k, step)]
    expected = slices[0]
    for part in slices[1:]:
        expected = expected + part
    assert torch.equal(y, expected)
    assert (q.device, q.data_ptr()) in fp8_gemm._ARRIVALS or not config.sum_in_launch  # counted where asked
    assert not arrivals(q, 1).any()
    assert torch.equal(fp8_linear(x, q, s, BLOCK, config), y)


@pytest.mark.parametrize("config", [Config(16, 64, 4, 2, sum_in_launch=True), Config(16, 128, 1), Config(32, 64, 2),
                                    Config(1, 64, 4, 8, sum_in_launch=True, gemv=True)],
                         ids=["decode-split4", "wide-tiles", "swap-less-split2", "gemv-split4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_whole_weight_tiles_load_without_masks_to_the_same_bits(config, dtype):
    """A weight whose tiles are all whole (N and K multiples of the tiles: loaded without masks) gives, bit for
    bit, the first N columns of the same product over the weight with one more row (its last tile partial, every
    load masked)."""
    q, s = quantized(320, 1024, 5)
    extra = torch.cat([q, q[:1]])  # 321 rows: the same three 128-row scale blocks
    x = torch.randn(1 if config.block_m <= 16 else 20, 1024, generator=torch.Generator().manual_seed(6))
    x = x.to(dtype).to(DEVICE)
    whole, masked = fp8_linear(x, q, s, BLOCK, config), fp8_linear(x, extra, s, BLOCK, config)
    assert torch.equal(whole, masked[:, :320])


def test_the_chosen_config_splits_narrow_long_weights():
    """At one row K is split in the most parts (up to 8) that keep 6 steps of 128 columns each: the narrow
    products [5120, K] (down_proj, the out/o projections) eight ways, the wide ones (gate+up, in_proj, qkv; K = 5120)
    four (section 13's measured best, or within 2%); 17 rows split only the narrow ones. A verify's 65 and 129 rows are one
    program column of 64 + 16 and 128 + 16 rows, swapped, split as sections 13 and 29 measured fastest (or within
    4%): the narrow products 8 (40 programs), gate+up 2 (272 programs), in_proj and qkv 2 at 65 rows (two programs
    of 4 warps share an SM) and not at 129 (128 and 112 programs of 8 warps); their weight tiles by bulk copies
    where the device has them."""
    cuda132 = torch.device("cpu")  # (sm_count: 132, an H200's, off CUDA)
    assert choose(1, 5120, 17408, cuda132).split_k == 8 and choose(1, 5120, 6144, cuda132).split_k == 8
    assert [choose(16, n, 5120, cuda132).split_k for n in (34816, 16384, 14336)] == [4, 4, 4]
    assert [choose(17, n, 5120, cuda132).split_k for n in (34816, 16384, 14336, 5120)] == [1, 1, 1, 8]
    assert choose(16, 5120, 1024, cuda132).split_k == 1  # 8 steps: two splits would keep 4
    assert not choose(16, 5120, 6144, cuda132).swap and choose(17, 5120, 6144, cuda132).swap
    assert all(choose(rows, 5120, 6144, cuda132).sum_in_launch != (rows > 32) for rows in (1, 17, 65, 129))
    bulk = bulk_copies(cuda132)  # Triton's interpreter has bulk copies (TMA), as an H200 does; a CPU without it not
    assert choose(65, 16384, 5120, cuda132) == Config(64, 128, 2, 4, 3, swap=True, tail=16, tma=bulk)
    assert choose(129, 16384, 5120, cuda132) == Config(128, 128, 1, 8, 3, swap=True, tail=16, tma=bulk)
    assert not any(choose(rows, 16384, 5120, cuda132).tma for rows in (1, 16, 17, 32, 161))  # bulk copies: verify rows
    if CUDA:
        major = torch.cuda.get_device_capability()[0]
        assert choose(65, 16384, 5120, torch.device("cuda")).tma == bulk_copies(torch.device("cuda")) == (major >= 9)
    shapes = ((5120, 17408), (5120, 6144), (34816, 5120), (16384, 5120), (14336, 5120))
    assert [choose(65, n, k, cuda132).split_k for n, k in shapes] == [8, 8, 2, 2, 2]
    assert [choose(129, n, k, cuda132).split_k for n, k in shapes] == [8, 8, 2, 1, 1]
    assert {choose(65, n, k, cuda132).num_warps for n, k in shapes} == {4}
    assert {choose(129, n, k, cuda132).num_warps for n, k in shapes} == {8}
    assert choose(4096, 34816, 5120, cuda132) == Config(128, 128, 1, 8, 3)


def test_one_row_runs_on_the_cuda_cores_with_the_measured_splits():
    """A greedy step's products (one row) take the CUDA-core kernel: 64 weight rows a program, K split in the fewest
    parts that make 6 programs an SM (gate+up 2, in_proj and qkv 4, the narrow [5120, K] products 8), 8 warps but
    for gate+up (4 tiles an SM of its own: 4); two rows and more the tile kernel."""
    cuda132 = torch.device("cpu")
    shapes = ((34816, 5120), (16384, 5120), (14336, 5120), (5120, 6144), (5120, 17408))
    chosen = [choose(1, n, k, cuda132) for n, k in shapes]
    assert all(c.gemv and c.block_n == 64 and c.sum_in_launch for c in chosen)
    assert [(c.split_k, c.num_warps) for c in chosen] == [(2, 4), (4, 8), (4, 8), (8, 8), (8, 8)]
    assert choose(1, 5120, 1024, cuda132).split_k == 1  # 8 steps: two splits would keep 4
    assert not any(choose(rows, n, k, cuda132).gemv for rows in (2, 16, 65) for n, k in shapes)
    q, s = quantized(256, 256, 1)
    with pytest.raises(ValueError, match="straddle scale blocks"):  # one scale a tile: 256 rows span two blocks
        fp8_linear(torch.ones(1, 256).to(DEVICE), q, s, BLOCK, Config(1, 256, 1, gemv=True))


@pytest.mark.parametrize("config", [Config(1, 64, 1, gemv=True), Config(1, 64, 3, 8, sum_in_launch=True, gemv=True),
                                    Config(1, 64, 4, gemv=True)], ids=["gemv", "gemv-split3-in-launch", "gemv-split4"])
@pytest.mark.parametrize("k", [1000, 1024])
def test_plain_rows_ride_the_one_row_launch(config, k):
    """A plain weight's rows (an FP8 checkpoint's bf16 in_proj_b / in_proj_a) in the one-row launch: y's first
    columns are, bit for bit, the FP8 product alone; its last the plain product (two tiles, the second partial), as
    F.linear's to the order of the sums; the arrival counters 0 again after. Two rows (the tile kernel) and an FP8
    weight that is not a whole number of one-row tiles tall: the same two products side by side."""
    from ddtree_viz.engine.kernels.fp8_gemm.triton_gemm import arrivals, rides

    assert rides(config, 256) and not rides(config, 160) and not rides(choose(2, 256, k, torch.device("cpu")), 256)
    q, s = quantized(256, k, 11)
    plain = (torch.randn(96, k, generator=torch.Generator().manual_seed(12)) * 0.05).to(DEVICE)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(13)).to(DEVICE)
    y = fp8_linear(x, q, s, BLOCK, config, plain=plain)
    assert y.shape == (1, 352)
    assert torch.equal(y[:, :256], fp8_linear(x, q, s, BLOCK, config))
    torch.testing.assert_close(y[:, 256:].cpu(), x.cpu() @ plain.cpu().T, rtol=1e-5, atol=1e-5)
    assert not arrivals(q, 1).any() and torch.equal(fp8_linear(x, q, s, BLOCK, config, plain=plain), y)
    x2 = torch.cat([x, x])
    torch.testing.assert_close(fp8_linear(x2, q, s, BLOCK, plain=plain).cpu(), torch.cat([y, y]).cpu(), rtol=1e-5,
                               atol=1e-5)
    q160, s160 = q[:160].contiguous(), s[:2].contiguous()  # 2.5 one-row tiles
    torch.testing.assert_close(fp8_linear(x, q160, s160, BLOCK, config, plain=plain).cpu(),
                               torch.cat([y[:, :160], y[:, 256:]], dim=-1).cpu(), rtol=1e-5, atol=1e-5)
    for bad in (plain[:, :-1], plain.double()):
        with pytest.raises(ValueError, match="a plain weight"):
            fp8_linear(x, q, s, BLOCK, config, plain=bad)


def test_fused_runs_at_one_row_give_each_part_its_product():
    """An FP8 checkpoint's GDN projections (fused.fuse_linears: FP8 qkv and z, plain b and a; qkv not a whole number
    of scale blocks tall, a run of its own): at one row the plain run rides the FP8 run before it (one launch),
    every part's output as the part's own product; at several rows one product a run."""
    parts = {"in_proj_qkv": quantized(192, 256, 21), "in_proj_z": quantized(128, 256, 22)}
    gdn = torch.nn.Module()
    for name, (q, s) in parts.items():
        setattr(gdn, name, fp8.Fp8Linear(q, s, BLOCK))
    for name, seed in (("in_proj_b", 23), ("in_proj_a", 24)):
        linear = torch.nn.Linear(256, 48, bias=False)
        torch.nn.init.normal_(linear.weight, std=0.05, generator=torch.Generator().manual_seed(seed))
        setattr(gdn, name, linear.to(DEVICE))
    names = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
    fused = fuse_linears(gdn, names)
    assert [type(r).__name__ for r in fused.runs] == ["FusedFp8Linear", "FusedFp8Linear", "FusedLinear"]
    for rows in (1, 3):
        x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)).to(DEVICE)
        for name, y in zip(names, fused(x)):
            part = getattr(gdn, name)
            want = reference(x, *parts[name]) if name in parts else x.cpu() @ part.weight.detach().cpu().T
            torch.testing.assert_close(y.cpu(), want, rtol=1e-5, atol=1e-5)


def test_stages_fit_the_shared_memory():
    """A stage holds x's tile and the weight's: 129 float32 rows fit two on an H200 (three asked 288 KiB of its
    227), bfloat16 three; a 99 KiB card (RTX 4090, L40S) gets one for a verify, three for decode rows."""
    from ddtree_viz.engine.kernels.fp8_gemm.triton_gemm import stages
    h200, ada = 232_448, 101_376
    verify, decode = choose(129, 16384, 5120, torch.device("cpu")), choose(1, 16384, 5120, torch.device("cpu"))
    assert (stages(verify, 4, h200), stages(verify, 2, h200), stages(verify, 2, ada)) == (2, 3, 1)
    assert stages(decode, 2, ada) == stages(decode, 4, h200) == 3


@pytest.mark.parametrize("rows, blocks", [(33, (32, 16)), (48, (32, 16)), (49, (64, 0)), (64, (64, 0)),
                                          (65, (64, 16)), (96, (64, 32)), (97, (128, 0)), (129, (128, 16)),
                                          (160, (128, 32))])
def test_verify_rows_are_a_power_of_two_and_a_short_tail(rows, blocks):
    from ddtree_viz.engine.kernels.tiles import row_blocks
    assert row_blocks(rows) == blocks and sum(blocks) >= rows


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp8_gemm_in_half_precision(dtype):
    """Activations stay in their dtype: y in it, each product of the weight rounded once to it."""
    q, s = quantized(192, 320, 3)
    x = torch.randn(3, 5, 320, generator=torch.Generator().manual_seed(1)).to(dtype).to(DEVICE)
    y = fp8_linear(x, q, s, BLOCK)
    ref = reference(x.reshape(-1, 320), q, s).reshape(3, 5, 192)
    assert y.shape == (3, 5, 192) and y.dtype == dtype
    step = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -10
    torch.testing.assert_close(y.float().cpu(), ref, rtol=2 * step, atol=2 * step * ref.abs().max().item())


def test_fused_fp8_projections_split_as_their_parts():
    """gate + up (MLP) as one FP8 weight (fused.fuse_linears over Fp8Linears): each output equals its own part's
    product; parts that would share a scale block are not stacked (one GEMM each)."""
    gate, up = quantized(256, 192, 5), quantized(130, 192, 6)
    mlp = torch.nn.Module()
    mlp.gate_proj, mlp.up_proj = fp8.Fp8Linear(*gate, BLOCK), fp8.Fp8Linear(*up, BLOCK)
    fused = fuse_linears(mlp, ("gate_proj", "up_proj"))
    assert isinstance(fused, fp8.FusedFp8Linear) and fused.weight.shape == (386, 192)
    x = torch.randn(9, 192, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    y_gate, y_up = fused(x)
    torch.testing.assert_close(y_gate.cpu(), reference(x, *gate), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y_up.cpu(), reference(x, *up), rtol=1e-5, atol=1e-5)
    swapped = torch.nn.Module()
    swapped.up_proj, swapped.gate_proj = fp8.Fp8Linear(*up, BLOCK), fp8.Fp8Linear(*gate, BLOCK)
    assert fuse_linears(swapped, ("up_proj", "gate_proj")).counts == (1, 1)  # 130 rows: not whole 128-row blocks
    with pytest.raises(ValueError, match="not whole tiles"):
        fp8_linear(x, *gate, (32, 32))


def dequantized_twin(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of `model` with each kept quantized Linear (fp8.Fp8Linear, int4.Int4Linear) a plain Linear of its
    weight dequantized (float32 product, cast once): the function the quantized weights are held to."""
    import copy

    twin = copy.deepcopy(model)
    for name, m in list(twin.named_modules()):
        if isinstance(m, KEPT):
            weight = m.dequantized()
            plain = torch.nn.Linear(m.in_features, m.out_features, bias=False, device=weight.device, dtype=dtype)
            plain.weight.data.copy_(weight.to(dtype))
            parent, _, attr = name.rpartition(".")
            setattr(twin.get_submodule(parent), attr, plain)
    return twin


def assert_oracle_ddtree_is_greedy(pair, runner, prompt: list[int], ids: list[int]) -> None:
    """The runner's DDTree with oracle drafts (the right token at rank 0, at rank 1, and in a three-rank mix; budgets
    4 and 16) decodes `ids`, the greedy it is held to."""
    from tests.test_runner import runner_ddtree
    from ddtree_viz.engine.oracle import OracleProposer

    for budget, ranks in [(4, [0]), (16, [1]), (16, [0, 2, 1])]:
        oracle = OracleProposer(ids, len(prompt), ranks, pair.target.config.vocab_size, block_size=8)
        assert runner_ddtree(pair, runner, oracle, prompt, len(ids), budget)[0] == list(ids)


def assert_tree_pass_is_twins(pair, runner, twin, prompt: list[int]) -> None:
    """A tree pass (a 16-node chain of random log-probs) on the runner over quantized weights gives the logits of the
    same pass on a runner over their dequantized twin, to the order of the sums."""
    from ddtree_viz.engine.runner import StaticRunner
    from ddtree_viz.engine.tree import DraftTree

    plain = StaticRunner(twin, max_len=256, sizes=(1, 17), feature_layer_ids=pair.drafter.target_layer_ids)
    tree = DraftTree.chain_from_logprobs(prompt[-1], torch.randn(16, pair.target.config.vocab_size).log_softmax(-1))
    logits = []
    for r in (runner, plain):
        r.prefill(prompt)
        logits.append(r.forward(tree)[0].clone())
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (CUDA graphs, the Triton GEMM)")
def test_runner_with_fp8_weights_in_cuda_graphs():
    """The runner's defaults on CUDA (CUDA graphs, compiled pieces, fused FP8 projections through the Triton GEMM)
    over FP8 weights, float32: greedy == transformers' greedy of the dequantized model, DDTree == that greedy (oracle
    drafts, and an FP8 drafter's trees through its static CUDA graphs); a tree pass's logits equal the dequantized
    model's runner's to the order of the sums."""
    from tests.test_runner import PROMPT, runner_ddtree, runner_greedy
    from tests.tiny import tiny_pair
    from ddtree_viz.engine.kernels.fp8_gemm.triton_gemm import rides
    from ddtree_viz.engine.fused import FusedRuns
    from ddtree_viz.engine.runner import StaticRunner
    from ddtree_viz.engine.proposers import DFlashProposer
    from ddtree_viz.engine.reference import GreedyReference

    # in_proj_z 64 rows: one tile, so b and a ride; seed 2: no end-of-text in its 40 tokens (the session stops there)
    pair = tiny_pair("hybrid", seed=2, layers=8, hidden=256, linear_value_head_dim=16)
    assert fp8.quantize_linears(pair.target, BLOCK) > 0
    assert fp8.quantize_linears(pair.drafter, BLOCK, skip=()) > 0  # an FP8 drafter kept, in its static graphs
    pair.target.to("cuda")
    pair.drafter.to("cuda")
    twin = dequantized_twin(pair.target, torch.float32)
    prompt, new = pair.tokenizer(PROMPT, add_special_tokens=False)["input_ids"], 40
    ref = GreedyReference(twin, prompt, set()).extend_to(new)
    runner = StaticRunner(pair.target, max_len=256, sizes=(1, 17), feature_layer_ids=pair.drafter.target_layer_ids)
    assert runner.graphs and runner.forms.fused
    assert any(isinstance(f, fp8.FusedFp8Linear) for f in runner._fused.values())
    gdn = runner._fused[0, "mixer"]  # the bf16-kept in_proj_b / in_proj_a ride the FP8 in_proj_z's one-row launch
    n, k = gdn.runs[-2].weight.shape
    assert isinstance(gdn, FusedRuns) and rides(choose(1, n, k, torch.device("cuda")), n)
    assert runner_greedy(runner, prompt, new) == list(ref.ids)
    assert_oracle_ddtree_is_greedy(pair, runner, prompt, ref.ids)
    out, _ = runner_ddtree(pair, runner, DFlashProposer(pair.drafter, pair.target), prompt, new, 16)
    assert out == list(ref.ids)
    assert_tree_pass_is_twins(pair, runner, twin, prompt)


def test_the_benchs_other_configs_compute_the_same_product():
    """gpu_bench --fp8 times fp8_gemm.choose's config beside its neighbours (benchmarks/gpu/fp8.py gemm_configs) on the
    model's bf16 activations: each one runs and gives the dequantized product (to bf16's rounding of the output). In
    float32 the neighbour with 4 stages of 128-row tiles needs 306 KiB of shared memory, more than an H200 has; the
    bench never runs it in float32, and choose() never picks 4 stages."""
    from ddtree_viz.benchmarks.gpu.fp8 import gemm_configs
    from ddtree_viz.engine.kernels.fp8_gemm import triton_gemm as fp8_gemm

    q, s = quantized(256, 1024, 11)
    dtype = torch.bfloat16 if CUDA else torch.float32  # the interpreter (CPU) has no shared memory: float32 there
    for rows in (1, 65):
        x = torch.randn(rows, 1024, generator=torch.Generator().manual_seed(rows)).to(DEVICE, dtype)
        configs = gemm_configs(fp8_gemm, rows, q)
        assert configs["chosen"] == choose(rows, 256, 1024, q.device) and len(configs) >= 7
        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
        for label, config in configs.items():
            torch.testing.assert_close(fp8_linear(x, q, s, BLOCK, config).cpu().float(), reference(x, q, s),
                                       msg=label, **tol)


@pytest.mark.parametrize("rows", [1, 65, 129])
@pytest.mark.parametrize("config", [Config(64, 128, 3, 8, swap=True, tail=16, tma=True), Config(16, 64, 2, tma=True),
                                    Config(128, 128, 1, 8, swap=True, tail=16, tma=True)],
                         ids=["swap-tail-split3", "decode-split2", "verify-129"])
def test_bulk_copies_of_the_weight_and_x_give_the_same_product(rows, config):
    """The weight's and x's tiles by tensor descriptor (bulk tensor copies, TMA) give what the masked loads give,
    bit for bit: K = 1024 (16-byte rows) with N = 320 leaves the last 128-row tile partly outside the weight, and
    65 or 129 rows leave the last x tile partly outside x (both zero-filled). A weight whose rows are not 16-byte
    aligned (K = 1000), or an x that does not start on 16 bytes, takes the masked loads instead, with the same
    result."""
    from ddtree_viz.engine.kernels.fp8_gemm.triton_gemm import _operands

    for k, x_offset in ((1024, 0), (1000, 0), (1024, 1)):
        q, s = quantized(320, k, rows)
        flat = torch.randn(rows * k + x_offset, generator=torch.Generator().manual_seed(5)).to(DEVICE)
        x = flat[x_offset:].view(rows, k)  # x_offset 1: 4 bytes past an aligned start
        assert _operands(x, q, config)[3].tma == (k == 1024 and x_offset == 0)
        loads = fp8_linear(x, q, s, BLOCK, dataclasses.replace(config, tma=False))
        assert torch.equal(fp8_linear(x, q, s, BLOCK, config), loads)
        torch.testing.assert_close(loads.cpu(), reference(x, q, s), rtol=1e-5, atol=1e-5)

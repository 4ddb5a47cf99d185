"""A layer's residual add and the norm after it in one Triton launch (engine/kernels/add_norm/triton_norm.py,
RunnerForms.norm) against the piece it replaces (add_norm/naive.py's add_rms_norm): the sum to the bit, the norm to a
rounding, a row's result whatever rows share its launch, bad inputs refused, dispatch's choice. The runner with it
decodes greedy's tokens: tests/test_step_kernel.py (every one-launch option at once) and tests/test_runner.py (the
defaults on CUDA).

Triton's interpreter without a GPU (float32 and float16: its bfloat16 rounding is not the GPU's), skipped without
Triton: tests/kernel_env.py."""

import pytest
import torch

from tests.kernel_env import CUDA, DEVICE, triton  # noqa: F401 (first: Triton set up before any kernel)

from ddtree_viz.engine.kernels.add_norm.dispatch import choose_norm
from ddtree_viz.engine.kernels.add_norm.naive import add_rms_norm
from ddtree_viz.engine.kernels.add_norm.triton_norm import WIDEST, add_rms_norm_triton

DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if CUDA else [])


def inputs(shape, dtype, seed=0):
    """x, y (the residual stream and a product's output, y smaller, as in a layer) and a zero-centred scale 1 + w."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen).to(DEVICE, dtype)
    y = (0.3 * torch.randn(*shape, generator=gen)).to(DEVICE, dtype)
    return x, y, (1 + 0.1 * torch.randn(shape[-1], generator=gen)).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 256), (1, 65, 5120), (1, 3, 1000), (2, 5, 384), (1, 129, 96)])
def test_the_launch_is_the_piece(shape, dtype):
    """x + y bit for bit (the dtype's add: the exact sum rounded once); the norm the piece's to the dtype's
    tolerance (its sum of squares in another order), shaped as x."""
    x, y, scale = inputs(shape, dtype)
    total, out = add_rms_norm_triton(x, y, scale, 1e-6)
    want_total, want = add_rms_norm(x, y, scale, 1e-6)
    assert total.shape == out.shape == x.shape and total.dtype == out.dtype == dtype
    assert torch.equal(total, want_total)
    torch.testing.assert_close(out, want)
    if dtype == torch.float32:  # a rounding or two of float32 at most
        assert (out - want).abs().max() <= 4e-7 * want.abs().max()


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(dtype):
    """A program a row: a tree's row and the same row alone (a greedy step's) normalised by the same arithmetic,
    bit for bit, so the launch never makes a tree pass and a step differ where the piece would not."""
    x, y, scale = inputs((1, 17, 5120), dtype, seed=1)
    total, out = add_rms_norm_triton(x, y, scale, 1e-6)
    for r in (0, 7, 16):
        alone = add_rms_norm_triton(x[:, r:r + 1], y[:, r:r + 1], scale, 1e-6)
        assert torch.equal(alone[0], total[:, r:r + 1]) and torch.equal(alone[1], out[:, r:r + 1])


def test_non_contiguous_inputs_and_no_rows():
    """Views are read as their values (made contiguous first); no rows: empty outputs, no launch."""
    x, y, scale = inputs((1, 8, 512), torch.float32, seed=2)
    wide = torch.stack([y, y], dim=-1)[..., 0]  # a strided view with y's values
    torch.testing.assert_close(add_rms_norm_triton(x, wide, scale, 1e-6), add_rms_norm_triton(x, y, scale, 1e-6),
                               atol=0, rtol=0)
    total, out = add_rms_norm_triton(x[:, :0], y[:, :0], scale, 1e-6)
    assert total.shape == out.shape == (1, 0, 512)


def test_bad_inputs_are_refused():
    x, y, scale = inputs((1, 4, 256), torch.float32, seed=3)
    for bad in [(x, y[:, :3], scale), (x, y.half(), scale), (x, y, scale.half()), (x, y, scale[:128])]:
        with pytest.raises(ValueError, match="add_rms_norm_triton takes"):
            add_rms_norm_triton(*bad, 1e-6)
    wide = torch.zeros(1, 1, WIDEST + 1, device=DEVICE)
    with pytest.raises(ValueError, match=str(WIDEST)):
        add_rms_norm_triton(wide, wide, torch.ones(WIDEST + 1, device=DEVICE), 1e-6)


def test_dispatch_takes_the_launch_where_it_holds():
    """choose_norm: the launch for "triton" once it matched the piece here; the piece for "torch"; a model whose
    rows are wider than a program holds keeps the piece and says why."""
    device = torch.device(DEVICE)
    assert choose_norm("torch", device, torch.float32, 5120) == (None, None)
    assert choose_norm("triton", device, torch.float32, 5120) == (add_rms_norm_triton, None)
    kernel, why = choose_norm("triton", device, torch.float32, WIDEST * 2)
    assert kernel is None and "wider" in why and str(WIDEST) in why

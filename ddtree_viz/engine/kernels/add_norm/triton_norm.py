"""A layer's residual add and the RMSNorm after it in one Triton launch, a program a row (RunnerForms.norm).

naive.add_rms_norm, compiled, is what the runner ran between a layer's products: 128 launches a pass at Qwen3.6-27B
shapes, 2.2 us a call at one row and 3.4 at 65 in a CUDA graph on an H200 (this launch: 2.0 and 3.0; the greedy
step 0.2 ms faster with it, docs/lab/NOTEBOOK.md section 34). Here a program holds its whole row in registers:
it reads x and y once, writes x + y (in their dtype, as torch adds: the exact sum rounded once) and the norm of
that sum, Qwen3.5's zero-centred RMSNorm (float32: the row's mean
square, its reciprocal square root, times the fp32 scale 1 + w, rounded once to the dtype). The same function
as the piece; its sum of squares in another order, so a row's norm may differ from the piece's by a rounding
(float32: ~1e-7; tests/test_norm_kernel.py). A program a row whatever the rows, so a greedy step's row and a
tree's rows are normalised by the same arithmetic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import pdl

WIDEST = 16_384  # columns a program holds (5,120 at 27B: 20 a thread of its 8 warps); wider rows keep the piece


@triton.jit
def _add_rms_norm_kernel(x_ptr, y_ptr, scale_ptr, sum_ptr, out_ptr, D, eps, BLOCK: tl.constexpr,
                         PDL: tl.constexpr = False):
    """Row program_id(0) of [rows, D] x, y (contiguous): sum = x + y in their dtype; out = rms_norm(sum) x scale.
    PDL: launched behind the kernel before (kernels/pdl.py), x and y read after its wait."""
    at = tl.program_id(0).to(tl.int64) * D
    cols = tl.arange(0, BLOCK)
    inside = cols < D
    if PDL:  # launched behind the kernel before (kernels/pdl.py): the next may launch; x and y after the wait
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    x = tl.load(x_ptr + at + cols, mask=inside, other=0.0)
    y = tl.load(y_ptr + at + cols, mask=inside, other=0.0)
    s = (x.to(tl.float32) + y.to(tl.float32)).to(x.dtype)  # torch's add in x's dtype: the exact sum, rounded once
    tl.store(sum_ptr + at + cols, s, mask=inside)
    f = s.to(tl.float32)
    r = tl.math.rsqrt(tl.sum(f * f, axis=0) / D + eps)
    w = tl.load(scale_ptr + cols, mask=inside, other=0.0)
    tl.store(out_ptr + at + cols, (f * r * w).to(x.dtype), mask=inside)


def fits(x: torch.Tensor, y: torch.Tensor, scale: torch.Tensor) -> bool:
    """Whether the launch takes these: x and y of one shape and dtype, a float32 scale [D], D <= WIDEST."""
    D = x.shape[-1]
    return (x.shape == y.shape and x.dtype == y.dtype and scale.dtype == torch.float32 and scale.shape == (D,)
            and D <= WIDEST and x.device == y.device == scale.device)


def add_rms_norm_triton(x: torch.Tensor, y: torch.Tensor, scale: torch.Tensor, eps: float):
    """naive.add_rms_norm in one launch: (x + y, rms_norm(x + y, scale, eps)), each shaped as x."""
    if not fits(x, y, scale):
        raise ValueError(f"add_rms_norm_triton takes x, y of one shape and dtype and a float32 scale [D] with "
                         f"D <= {WIDEST}: x {tuple(x.shape)} {x.dtype}, y {tuple(y.shape)} {y.dtype}, scale "
                         f"{tuple(scale.shape)} {scale.dtype}")
    D = x.shape[-1]
    x, y = x.contiguous(), y.contiguous()
    total, out = torch.empty_like(x), torch.empty_like(x)
    rows = x.numel() // D
    if rows:
        block = triton.next_power_of_2(D)
        _add_rms_norm_kernel[(rows,)](x, y, scale, total, out, D, eps, BLOCK=block,
                                      num_warps=8 if block >= 4096 else 4, **pdl.keywords(x))
    return total, out

"""A GEMM that reads FP8 weights as they are stored (engine/fp8.py's layout): y = x (W x S)^T for the runner's
1 to 129 rows (a decode step, a tree verify at budget 128), the fp8 bytes and the block scales read from memory
and dequantized in registers, so a step reads about half of bf16's bytes.

The function computed is the dequantized model's (issue #29: activations stay in their dtype): each weight tile is
e4m3 -> float32, times its block's float32 scale, rounded once to the activations' dtype (the same rounding as
fp8.dequantize(...).to(dtype) at load), then multiplied with fp32 accumulation. So the runner with this kind and
the runner with the weights dequantized at load compute the same products, up to the order of the sums.

A program computes a [BLOCK_M, BLOCK_N] tile of y, walking the input dimension BLOCK_K columns at a time; BLOCK_K
divides the scale block's columns (128) and BLOCK_N its rows, so a tile needs one scale column and one scale per
row. Partial blocks (a dimension that is not a multiple of 128) are masked. Imported only where this kind is
chosen (Triton at the top: engine/fp8.py's `linear` imports it on a CUDA input); without a GPU it runs in Triton's
interpreter (TRITON_INTERPRET=1; tests/test_fp8_kernel.py). Called outside the runner's compiled pieces (between
them, as cuBLAS's GEMMs are), so torch.compile never traces it; CUDA graphs capture its launches as they capture
cuBLAS's (the runner's warm-up runs compile it first).

Shapes: x [M, K] (M <= 129 rows; float32, bfloat16 or float16), weight [N, K] float8_e4m3fn, scale
[ceil(N/bn), ceil(K/bk)] float32; returns y [M, N] in x's dtype.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

BLOCK_N, BLOCK_K = 64, 128
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's interpreter (CPU tensors: the tests)


@triton.jit
def _fp8_gemm(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, s_xm, s_wn, s_sn, s_ym,
              SB_N: tl.constexpr, SB_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """One [BLOCK_M, BLOCK_N] tile of y = x (W x S)^T; program (n block, m block)."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    mn, mm = rn < N, rm < M
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        mk = rk < K
        x = tl.load(x_ptr + rm[:, None] * s_xm + rk[None, :], mask=mm[:, None] & mk[None, :], other=0.0)
        w = tl.load(w_ptr + rn[:, None] * s_wn + rk[None, :], mask=mn[:, None] & mk[None, :], other=0.0)
        s = tl.load(s_ptr + (rn // SB_N) * s_sn + k0 // SB_K, mask=mn, other=0.0)  # one scale per row of the tile
        w = (w.to(tl.float32) * s[:, None]).to(x.dtype)  # the dequantized weight, rounded once to x's dtype
        if UPCAST:  # the interpreter's bf16 tl.dot is wrong (Triton 3.9): the same exact products in fp32
            acc += tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w), input_precision=PRECISION)
    tl.store(y_ptr + rm[:, None] * s_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=mm[:, None] & mn[None, :])


def fits(block: tuple[int, int]) -> bool:
    """Scale blocks this kernel's tiles divide (the official 128 x 128 does)."""
    return block[0] % BLOCK_N == 0 and block[1] % BLOCK_K == 0


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """y = x (weight x scale per block)^T for x [..., K] (the leading dimensions flattened to M rows)."""
    if not fits(block):
        raise ValueError(f"fp8_linear: scale blocks of {block} are not whole tiles of {BLOCK_N}x{BLOCK_K}")
    lead, K = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, K).contiguous()
    M, N = x2.shape[0], weight.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    block_m = max(16, triton.next_power_of_2(M)) if M <= 64 else 64
    grid = (triton.cdiv(N, BLOCK_N), triton.cdiv(M, block_m))
    _fp8_gemm[grid](x2, weight, scale, y, M, N, K, x2.stride(0), weight.stride(0), scale.stride(0), y.stride(0),
                    SB_N=block[0], SB_K=block[1], BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
                    PRECISION="ieee" if x.dtype == torch.float32 else "tf32", UPCAST=INTERPRETED)
    return y.reshape(*lead, N)

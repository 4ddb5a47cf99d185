"""A GEMM that reads FP8 weights as they are stored (engine/fp8.py's layout): y = x (W x S)^T for the runner's
1 to 129 rows (a decode step, a tree verify at budget 128), the fp8 bytes and the block scales read from memory
and dequantized in registers, so a step reads about half of bf16's bytes.

The function computed is the dequantized model's (issue #29: activations stay in their dtype): each weight tile is
e4m3 -> float32, times its block's float32 scale, rounded once to the activations' dtype (the same rounding as
fp8.dequantize(...).to(dtype) at load), then multiplied with fp32 accumulation. So the runner with this kind and
the runner with the weights dequantized at load compute the same products, up to the order of the sums.

A program computes a [BLOCK_M, BLOCK_N] tile of y, walking its share of the input dimension BLOCK_K columns at a
time; BLOCK_K divides the scale block's columns (128) and BLOCK_N its rows, so a tile needs one scale column and one
scale per row. Partial blocks (a dimension that is not a multiple of 128) are masked. `choose` picks the tiles from
the shape (`Config`): one row block for up to 128 rows (each weight byte read and dequantized once: the runner's
decode and tree verify), 128 weight rows a program past 32 rows, 128-row blocks past 128 rows (a prefill), and
split-K where the tiles alone would leave SMs
idle (a narrow, long weight such as down_proj [5120, 17408]: its partial sums in float32, added in a fixed order,
so the result does not depend on timing). The bench (`gpu_bench --fp8`, fp8_gemms) times other configs beside it. Imported only where this kind is
chosen (Triton at the top: engine/fp8.py's `linear` imports it on a CUDA input); without a GPU it runs in Triton's
interpreter (TRITON_INTERPRET=1; tests/test_fp8_kernel.py). Called outside the runner's compiled pieces (between
them, as cuBLAS's GEMMs are), so torch.compile never traces it; CUDA graphs capture its launches as they capture
cuBLAS's (the runner's warm-up runs compile it first).

Shapes: x [M, K] (M <= 129 rows; float32, bfloat16 or float16), weight [N, K] float8_e4m3fn, scale
[ceil(N/bn), ceil(K/bk)] float32; returns y [M, N] in x's dtype.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

BLOCK_K = 128
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's interpreter (CPU tensors: the tests)


@dataclass(frozen=True)
class Config:
    """A launch's tiles: rows of x (block_m) and of the weight (block_n) a program computes, split_k programs
    sharing the input dimension (partial sums in float32), and the program's warps and pipeline stages."""

    block_m: int
    block_n: int = 64
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


@triton.jit
def _fp8_gemm(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, s_xm, s_wn, s_sn, s_ym, K_SPLIT,
              SB_N: tl.constexpr, SB_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, PARTIAL: tl.constexpr):
    """One [BLOCK_M, BLOCK_N] tile of y = x (W x S)^T over input columns [k * K_SPLIT, (k + 1) * K_SPLIT); program
    (n block, m block, k). PARTIAL: y is float32 [split, M, N] (the k-th slice is this program's sum)."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    k_start = tl.program_id(2) * K_SPLIT
    mn, mm = rn < N, rm < M
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, tl.minimum(k_start + K_SPLIT, K), BLOCK_K):
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
    out = y_ptr + rm[:, None] * s_ym + rn[None, :]
    if PARTIAL:
        tl.store(out + tl.program_id(2) * M * N, acc, mask=mm[:, None] & mn[None, :])
    else:
        tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=mm[:, None] & mn[None, :])


def fits(block: tuple[int, int]) -> bool:
    """Scale blocks every config's tiles divide (the official 128 x 128 does)."""
    return block[0] % 128 == 0 and block[1] % BLOCK_K == 0


@functools.lru_cache(maxsize=8)
def sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def choose(M: int, N: int, K: int, device: torch.device) -> Config:
    """The config for an [M, K] x [N, K]^T product: the tiles (see the module's docstring), then split-K. Decode rows
    (M <= 32): a narrow product (fewer programs than SMs: [5120, K]) doubles its splits while the programs fill
    fewer than 3x the SMs and each split keeps at least 4 steps of BLOCK_K (8 splits for down_proj and the out/o
    projections: PERFORMANCE.md section 13 measured split 8 fastest, 10-16% under split 4, ~30% under 2); a
    wide one does not split (within 4% of its fastest either way). More rows: doubled while the programs fill fewer
    than the SMs and each split keeps 8 steps."""
    block_m = max(16, triton.next_power_of_2(M)) if M <= 128 else 128
    # a program reads all its rows of x for each BLOCK_N weight rows: 2 M / BLOCK_N times the weight's bytes in x
    # (from L2); past 32 rows 128-row weight tiles keep that at or under the weight's own (section 10: 65 rows,
    # 128 x 128 tiles 201 us against 253 us at 64 x 64)
    block_n = 64 if M <= 32 else 128
    programs = triton.cdiv(N, block_n) * triton.cdiv(M, block_m)
    sms, split = sm_count(device), 1
    if M <= 32:
        while programs < sms and programs * split < 3 * sms and K // (BLOCK_K * split * 2) >= 4:
            split *= 2
    else:
        while programs * split < sms and K // (BLOCK_K * split * 2) >= 8:
            split *= 2
    return Config(block_m, block_n, split, 4 if block_m <= 32 else 8, 3)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
               config: Config | None = None) -> torch.Tensor:
    """y = x (weight x scale per block)^T for x [..., K] (the leading dimensions flattened to M rows), with `config`
    (default: `choose`'s)."""
    if not fits(block):
        raise ValueError(f"fp8_linear: scale blocks of {block} are not whole tiles of 128x{BLOCK_K}")
    lead, K = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, K).contiguous()
    M, N = x2.shape[0], weight.shape[0]
    c = config or choose(M, N, K, x.device)
    k_split = triton.cdiv(triton.cdiv(K, BLOCK_K), c.split_k) * BLOCK_K  # whole BLOCK_K steps per split
    partial = c.split_k > 1
    y = (torch.empty(c.split_k, M, N, dtype=torch.float32, device=x.device) if partial
         else torch.empty(M, N, dtype=x.dtype, device=x.device))
    grid = (triton.cdiv(N, c.block_n), triton.cdiv(M, c.block_m), c.split_k)
    _fp8_gemm[grid](x2, weight, scale, y, M, N, K, x2.stride(0), weight.stride(0), scale.stride(0), N, k_split,
                    SB_N=block[0], SB_K=block[1], BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=BLOCK_K,
                    PRECISION="ieee" if x.dtype == torch.float32 else "tf32", UPCAST=INTERPRETED, PARTIAL=partial,
                    num_warps=c.num_warps, num_stages=c.num_stages)
    if partial:  # the splits' float32 sums added in a fixed order, rounded once
        y = y.sum(0).to(x.dtype)
    return y.reshape(*lead, N)

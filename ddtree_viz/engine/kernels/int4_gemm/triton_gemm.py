"""A GEMM that reads 4-bit weights as they are stored (engine/weights/int4_common.py's pack-quantized layout): y = x W^T with
W = (q - z) x scale unpacked in registers, so a 27B target keeps about a quarter of bf16's Linear bytes (a Qwen3.6-27B
W4A16 target in 17.7 GB with its bf16 embeddings and lm_head: one 24 GB card) and no dequantized copy of a weight is
ever made.

The function computed is the dequantized model's (issue #29: activations stay in their dtype): each weight tile is
(q - z) x scale in float32 (exact: a 4-bit integer times a bf16 / fp16 / fp32 scale), rounded once to the
activations' dtype (as int4.dequantize(...).to(dtype) at load rounds it), then multiplied with float32 accumulation;
a float32 product in IEEE float32 (no TF32). So the runner over kept 4-bit weights and the runner over the weights
dequantized at load compute the same products, up to the order of the sums.

Three forms. The word form (`Config.words`, what `choose` picks): a program a block_m x block_n tile of y, a step's
words loaded whole ([block_n, block_k / 8], each row's contiguous) and unpacked in registers, its scales (and zero
points) a group at a time (one group a step, or whole groups of a power-of-2 size), the input split into split_k
slices whose partial products are summed after in a fixed order (deterministic), so a decode step's few programs
do not each walk the whole input. The tile form, the first one (docs/lab/NOTEBOOK.md section 36), and the fallback
for what the word form cannot step (activation order, groups neither dividing nor divided by a step): each column's
word loaded where it lies and its field shifted out, each column's scale through its group index, so every layout
the loader accepts runs here unchanged: groups of any size, per channel, activation order (g_idx), asymmetric zero
points packed along the rows, partial words and groups at the edges (masked). On an H100 it ran the 27B's decode step
at 50x its weight-read bound: a down_proj's 80 programs walked 272 steps each. And for the bench to time
(`Config.gemv`), the one-row kernel on the CUDA cores: a word's eight fields against eight of x's columns, x times
the row's scale in float32 so each weight is exact (in bfloat16 a rounding of a weight apart from the tile form, the
noise the verdict rules measure; in float32 the same to the order of the sums), whole groups only.

Imported only where a kept 4-bit weight meets a CUDA input (dispatch.linear); without a GPU it runs in Triton's
interpreter (TRITON_INTERPRET=1; tests/test_int4_kernel.py). Shapes: x [..., K] (float32, bfloat16 or float16),
weight_packed [N, ceil(K/8)] int32, weight_scale [N, groups], weight_zero_point [ceil(N/8), groups] int32 or None,
g_idx [K] or None; returns y [..., N] in x's dtype.
"""

from __future__ import annotations

import os
import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's interpreter (CPU tensors: the tests)


@dataclass(frozen=True)
class Config:
    """A launch's tiles: rows of the weight a program computes (block_n), input columns a step (block_k, a multiple
    of 8: whole words), its warps and pipeline stages; gemv: one row of x a program on the CUDA cores (_int4_gemv:
    each word's eight fields against eight of x's columns, x times the row's scale in float32 and the weight exact,
    as fp8_gemm's one-row product; whole groups only: no activation order, block_k dividing the group)."""

    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3
    gemv: bool = False
    # the word form (_int4_words): a step's words loaded whole ([block_n, block_k / 8], each row's contiguous) and
    # unpacked in registers, its scales a group at a time; the input split into split_k slices, each slice's
    # partial product summed after (a second, deterministic reduction); block_m rows of x a program (0: block_m())
    words: bool = False
    split_k: int = 1
    block_m: int = 0


def choose(rows: int, n: int, k: int) -> Config:
    """The launch for an [rows, k] x [n, k]^T product, from gpu_bench --int4-tune on an H200 at the 27B's GEMMs
    (docs/bench/gpu-h200-2026-12-06-int4-tune.json; docs/lab/NOTEBOOK.md sections 39 and 40): the word form
    everywhere (the tile form ran 14-16x slower). Up to 16 rows (a step, a DFlash block) 64-row tiles of 256 columns,
    the input in four slices where the output is narrow (5,120 rows: out_proj, o_proj, down_proj) or wide (gate +
    up's 34,816), in one between (in_proj, q + k + v). A verify's rows in one slice (a slice's float32 partial
    products, held per GEMM in a verify's graph, took the 24 GB card past its cap at budget 128): up to 128 rows
    (budget 64's 65) one 128-row tile of 64 outputs and 8 warps, steps of 128 columns where the output is narrow and
    64 where it is wide (10-30% under 64-row tiles); past 128 rows (budget 128's 129) 128 x 128 tiles where it is
    wide (6-28% under), 64 x 128 where it is narrow (the fastest one-slice launch there)."""
    if rows <= 16:
        split = 1 if 8192 < n <= 20480 else 4
        return Config(block_n=64, block_k=256, num_warps=4, num_stages=3, words=True, split_k=split, block_m=16)
    wide = n > 8192
    if rows <= 128:
        return Config(block_n=64, block_k=64 if wide else 128, num_warps=8, num_stages=3, words=True, split_k=1,
                      block_m=128)
    return Config(block_n=128, block_k=64, num_warps=4, num_stages=3, words=True, split_k=1,
                  block_m=128 if wide else 64)


def word_groups(c: Config, group: int, k: int, g_idx: torch.Tensor | None) -> bool:
    """Whether the word form can read this layout: no activation order, and a step's columns either inside one group
    (block_k dividing it) or whole groups of a power-of-2 size (the group dividing block_k); each split's slice whole
    steps."""
    pow2 = group & (group - 1) == 0
    return (g_idx is None and c.block_k % 8 == 0 and (group % c.block_k == 0 or (pow2 and c.block_k % group == 0))
            and c.split_k >= 1)


def whole_groups(c: Config, group: int, g_idx: torch.Tensor | None) -> bool:
    """Whether each block_k columns of a step lie in one group (no activation order, block_k dividing the group):
    a scale and zero point a row for the step, the tile kernel's WHOLE form; what _int4_gemv needs."""
    return g_idx is None and group % c.block_k == 0 and c.block_k % 8 == 0


@triton.jit
def _int4_gemm(x_ptr, w_ptr, s_ptr, z_ptr, g_ptr, y_ptr, M, N, K, WORDS, GROUPS, stride_xm, stride_ym,
               GROUP: tl.constexpr, ASYM: tl.constexpr, GIDX: tl.constexpr, WHOLE: tl.constexpr,
               PRECISION: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rm < M, rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w_ok = col_ok[:, None] & k_ok[None, :]
        words = tl.load(w_ptr + rn[:, None] * WORDS + (rk // 8)[None, :], mask=w_ok, other=0)
        q = ((words >> ((rk % 8) * 4)[None, :]) & 0xF) - 8  # the field holds q + 8, the first in the low bits
        if WHOLE:  # the step's columns all in group k0 // GROUP: a scale (and zero point) a row
            group = k0 // GROUP
            if ASYM:
                zw = tl.load(z_ptr + (rn // 8) * GROUPS + group, mask=col_ok, other=0)
                q -= (((zw >> ((rn % 8) * 4)) & 0xF) - 8)[:, None]
            scale = tl.load(s_ptr + rn * GROUPS + group, mask=col_ok, other=0.0)[:, None]
        else:  # each column's group: its g_idx (activation order), or column // GROUP
            if GIDX:
                group = tl.load(g_ptr + rk, mask=k_ok, other=0)
            else:
                group = rk // GROUP
            if ASYM:  # zero points packed along the rows: row n's in word n // 8, bits 4 (n % 8) ..
                zw = tl.load(z_ptr + (rn // 8)[:, None] * GROUPS + group[None, :], mask=w_ok, other=0)
                q -= ((zw >> ((rn % 8) * 4)[:, None]) & 0xF) - 8
            scale = tl.load(s_ptr + rn[:, None] * GROUPS + group[None, :], mask=w_ok, other=0.0)
        w = (q.to(tl.float32) * scale.to(tl.float32)).to(x.dtype)  # exact in float32, rounded once
        if UPCAST:  # the interpreter's bf16 tl.dot is wrong (as in fp8_gemm): the same exact products in fp32
            x, w = x.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _int4_gemv(x_ptr, w_ptr, s_ptr, z_ptr, y_ptr, N, K, WORDS, GROUPS, stride_xm, stride_ym,
               GROUP: tl.constexpr, ASYM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    m = tl.program_id(0)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rw = tl.arange(0, BLOCK_K // 8)  # a step's words
    n_ok = rn < N
    acc = tl.zeros((BLOCK_N, BLOCK_K // 8), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w_col = k0 // 8 + rw
        words = tl.load(w_ptr + rn[:, None] * WORDS + w_col[None, :], mask=n_ok[:, None] & (w_col < WORDS)[None, :],
                        other=0)
        group = k0 // GROUP  # one group a step (whole_groups)
        scale = tl.load(s_ptr + rn * GROUPS + group, mask=n_ok, other=0.0).to(tl.float32)
        if ASYM:
            zw = tl.load(z_ptr + (rn // 8) * GROUPS + group, mask=n_ok, other=0)
            zero = (((zw >> ((rn % 8) * 4)) & 0xF) - 8).to(tl.float32)
        for i in tl.static_range(8):  # field i of each word: columns k0 + 8 w + i
            col = k0 + rw * 8 + i
            xs = tl.load(x_ptr + m * stride_xm + col, mask=col < K, other=0.0).to(tl.float32)
            q = (((words >> (4 * i)) & 0xF) - 8).to(tl.float32)
            if ASYM:
                q = q - zero[:, None]
            acc += q * (scale[:, None] * xs[None, :])
    tl.store(y_ptr + m * stride_ym + rn, tl.sum(acc, axis=1).to(y_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _int4_words(x_ptr, w_ptr, s_ptr, z_ptr, p_ptr, M, N, K, WORDS, GROUPS, stride_xm, SLICE,
                GROUP: tl.constexpr, ASYM: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    part = tl.program_id(2)
    row_ok, col_ok = rm < M, rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    shifts = tl.arange(0, 8) * 4  # field i of a word: bits 4i .. 4i + 3
    for step in range(0, SLICE, BLOCK_K):  # past K (the last slice's tail): all masked
        k0 = part * SLICE + step
        rw = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        words = tl.load(w_ptr + rn[:, None] * WORDS + rw[None, :], mask=col_ok[:, None] & (rw < WORDS)[None, :],
                        other=0)
        q = tl.reshape((words[:, :, None] >> shifts[None, None, :]) & 0xF, (BLOCK_N, BLOCK_K)) - 8
        if GROUP % BLOCK_K == 0:  # the step inside one group: a scale (and zero point) a row
            group = k0 // GROUP
            s_ok = col_ok & (k0 < K)
            scale = tl.load(s_ptr + rn * GROUPS + group, mask=s_ok, other=0.0).to(tl.float32)
            if ASYM:
                zw = tl.load(z_ptr + (rn // 8) * GROUPS + group, mask=s_ok, other=0)
                q -= (((zw >> ((rn % 8) * 4)) & 0xF) - 8)[:, None]
            w = q.to(tl.float32) * scale[:, None]
        else:  # BLOCK_K // GROUP whole groups a step
            gi = k0 // GROUP + tl.arange(0, BLOCK_K // GROUP)
            g_ok = col_ok[:, None] & (gi < GROUPS)[None, :]
            scale = tl.load(s_ptr + rn[:, None] * GROUPS + gi[None, :], mask=g_ok, other=0.0).to(tl.float32)
            q3 = tl.reshape(q, (BLOCK_N, BLOCK_K // GROUP, GROUP))
            if ASYM:
                zw = tl.load(z_ptr + (rn // 8)[:, None] * GROUPS + gi[None, :], mask=g_ok, other=0)
                q3 -= (((zw >> ((rn % 8) * 4)[:, None]) & 0xF) - 8)[:, :, None]
            w = tl.reshape(q3.to(tl.float32) * scale[:, :, None], (BLOCK_N, BLOCK_K))
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=row_ok[:, None] & (rk < K)[None, :], other=0.0)
        w = w.to(x.dtype)  # exact in float32, rounded once
        if UPCAST:
            x, w = x.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
    tl.store(p_ptr + part * M * N + rm[:, None] * N + rn[None, :], acc.to(p_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


def block_m(rows: int) -> int:
    """Rows of x a program takes: the tensor cores' 16 at least, 64 at most (a prefill's many rows in tiles)."""
    return min(64, max(16, triton.next_power_of_2(rows)))


def int4_linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
                g_idx: torch.Tensor | None, group: int, config: Config | None = None) -> torch.Tensor:
    """y = x W^T in x's dtype, W [N, K] = (q - z) x scale read from the packed layout (`group`: the columns a scale
    covers, K for per-channel scales; `g_idx` each column's group in its place, activation order); `config` the
    launch (`choose`'s by default)."""
    K, N = x.shape[-1], packed.shape[0]
    if packed.shape[1] != triton.cdiv(K, 8) or scale.shape[0] != N:
        raise ValueError(f"4-bit weight {list(packed.shape)} / scales {list(scale.shape)} do not fit {K} inputs")
    x2 = x.reshape(-1, K)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    c = config or choose(M, N, K)
    if c.words and not word_groups(c, group, K, g_idx):  # activation order, or groups the word form cannot step
        c = Config()
    whole = whole_groups(c, group, g_idx)
    if c.gemv and not whole:
        raise ValueError(f"the one-row kernel needs whole groups: group {group}, block_k {c.block_k}, "
                         f"activation order {g_idx is not None}")
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    launch = dict(num_warps=c.num_warps, num_stages=c.num_stages)
    z = packed if zero is None else zero  # (a pointer the kernel never reads when ASYM is off)
    if M and c.words:
        return _words(x2, packed, scale, zero, group, c, y, launch).reshape(*x.shape[:-1], N)
    if M and c.gemv:
        _int4_gemv[(M, triton.cdiv(N, c.block_n))](x2, packed, scale, z, y, N, K, packed.shape[1], scale.shape[1],
                                                   x2.stride(0), y.stride(0), GROUP=group, ASYM=zero is not None,
                                                   BLOCK_N=c.block_n, BLOCK_K=c.block_k, **launch)
    elif M:
        bm = block_m(M)
        _int4_gemm[(triton.cdiv(M, bm), triton.cdiv(N, c.block_n))](
            x2, packed, scale, z, packed if g_idx is None else g_idx, y, M, N, K, packed.shape[1], scale.shape[1],
            x2.stride(0), y.stride(0), GROUP=group, ASYM=zero is not None, GIDX=g_idx is not None,
            WHOLE=whole, PRECISION="ieee" if x.dtype == torch.float32 or INTERPRETED else "tf32", UPCAST=INTERPRETED,
            BLOCK_M=bm, BLOCK_N=c.block_n, BLOCK_K=c.block_k, **launch)
    return y.reshape(*x.shape[:-1], N)


def _words(x2: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, group: int,
           c: Config, y: torch.Tensor, launch: dict) -> torch.Tensor:
    """The word form's launch: split_k slices of the input (whole steps each), each slice's partial product in
    float32 and their sum in a fixed order (torch's sum over the slices), or with one slice the product cast in
    the store."""
    (M, K), N = x2.shape, packed.shape[0]
    slice_k = triton.cdiv(triton.cdiv(K, c.split_k), c.block_k) * c.block_k
    parts = triton.cdiv(K, slice_k)
    out = y if parts == 1 else torch.empty(parts, M, N, device=x2.device, dtype=torch.float32)
    bm = c.block_m or block_m(M)
    _int4_words[(triton.cdiv(M, bm), triton.cdiv(N, c.block_n), parts)](
        x2, packed, scale, packed if zero is None else zero, out, M, N, K, packed.shape[1], scale.shape[1],
        x2.stride(0), slice_k, GROUP=group, ASYM=zero is not None,
        PRECISION="ieee" if x2.dtype == torch.float32 or INTERPRETED else "tf32", UPCAST=INTERPRETED,
        BLOCK_M=bm, BLOCK_N=c.block_n, BLOCK_K=c.block_k, **launch)
    return y if parts == 1 else torch.sum(out, 0, out=None).to(y.dtype)

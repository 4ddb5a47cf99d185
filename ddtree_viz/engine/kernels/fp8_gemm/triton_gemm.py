"""A GEMM that reads FP8 weights as they are stored (engine/weights/fp8.py's layout): y = x (W x S)^T for the runner's
1 to 129 rows (a decode step, a tree verify at budget 128), the fp8 bytes and the block scales read from memory
and dequantized in registers, so a step reads about half of bf16's bytes.

The function computed is the dequantized model's (issue #29: activations stay in their dtype). From 2 rows on, each
weight tile is e4m3 -> float32, times its block's float32 scale, rounded once to the activations' dtype (the same
rounding as fp8.dequantize(...).to(dtype) at load), then multiplied with fp32 accumulation: the runner with this
kind and the runner with the weights dequantized at load compute the same products, up to the order of the sums.
One row (a greedy step; _fp8_gemv, on the CUDA cores) multiplies the tile's one scale into x's float32 columns
instead, so each weight is e4m3 -> float32 and one multiply-add: the same product with the weight exact rather
than rounded to the activations' dtype (in bfloat16 a rounding of a weight apart: the noise the verdict rules
measure; in float32 the same to the order of the sums).

A program computes a tile of y, BLOCK_M (+ a TAIL) rows of x by BLOCK_N rows of the weight (one row: a row of x,
`one_row`), walking its share of the input dimension BLOCK_K columns at a time; BLOCK_K divides the scale block's
columns (128) and BLOCK_N its rows, so a tile needs one scale column and one scale per row. Partial blocks (a
dimension that is not a multiple of 128) are masked. `choose` picks the tiles from the shape (`Config`): for a tree
verify all rows in one program column, so each weight tile is read and dequantized once, as a power-of-two block
plus a 16- or 32-row tail (the tensor cores then do 80 rows of work for 65, not 128); the products swapped (W x^T:
on Hopper the dequantized tile then feeds the tensor cores from registers); and split-K where the tiles alone would
leave SMs idle (a narrow, long weight such as down_proj [5120, 17408]: its partial sums in float32, added in a fixed
order, so the result does not depend on timing: at decode rows by the last of a tile's programs to arrive, in the
same launch; at a verify's by one more kernel); for a verify, the weight tiles loaded by Hopper's bulk tensor copies
(TMA) where the device has them, elsewhere by address, without masks where every tile is whole. The bench
(`gpu_bench --fp8`, fp8_gemms) times other configs beside the chosen one.

Imported only where this kind is chosen (Triton at the top: dispatch.py's `linear` imports it on a CUDA
input); without a GPU it runs in Triton's interpreter (TRITON_INTERPRET=1; tests/test_fp8_kernel.py). Called outside
the runner's compiled pieces (between them, as cuBLAS's GEMMs are), so torch.compile never traces it; CUDA graphs
capture its launches as they capture cuBLAS's (the runner's warm-up runs compile it first).

Shapes: x [M, K] (any M: a prefill's too; float32, bfloat16 or float16), weight [N, K] float8_e4m3fn, scale
[ceil(N/bn), ceil(K/bk)] float32; returns y [M, N] in x's dtype.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .. import pdl
from ..tiles import bulk_copies, row_blocks, row_operands, shared_memory

BLOCK_K = 128
SUM_BLOCK = 1024  # elements of y a program of _sum_splits adds
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's interpreter (CPU tensors: the tests)


@dataclass(frozen=True)
class Config:
    """A launch's tiles: rows of x (block_m) and of the weight (block_n) a program computes, split_k programs
    sharing the input dimension (partial sums in float32), the program's warps and pipeline stages, and whether the
    dequantized weight tile is the product's first operand (swap: y^T = W x^T, so on Hopper the tile goes from
    registers straight into the tensor cores' instruction instead of through shared memory); tail: 0, or the rows
    (16 or 32) a second product takes on the same dequantized tile, after the block's (a program covers
    block_m + tail rows of x); tma: the weight tiles loaded by the bulk tensor copies of Hopper and later (a
    tensor descriptor: no address arithmetic or masks in the program; the same tiles, zero-filled at the edges as
    the masked loads are, so the same products and sums); sum_in_launch: with split_k > 1, the split slices added
    by each tile's last program to arrive, in the product's own launch, rather than by a second kernel over all
    of y (_sum_splits): the same sums in the same order; gemv: a row of x a program, on the CUDA cores
    (_fp8_gemv: no tensor-core tile, no dequantized weight tile; block_m, swap, tail and tma unused)."""

    block_m: int
    block_n: int = 64
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    swap: bool = False
    tail: int = 0
    tma: bool = False
    sum_in_launch: bool = False
    gemv: bool = False


@triton.jit
def _fp8_gemm(x_ptr, xt_ptr, w_ptr, s_ptr, y_ptr, p_ptr, c_ptr, M, N, K, s_xm, s_wn, s_sn, s_ym, K_SPLIT,
              SB_N: tl.constexpr, SB_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr, SPLIT: tl.constexpr,
              SUM_IN_LAUNCH: tl.constexpr, SWAP: tl.constexpr, TAIL: tl.constexpr, TMA: tl.constexpr,
              EVEN: tl.constexpr):
    """One tile of y = x (W x S)^T, BLOCK_M + TAIL rows of x by BLOCK_N of the weight, over input columns
    [k * K_SPLIT, (k + 1) * K_SPLIT); program (n block, m block, k). The tail (0 or a power of two) is a second
    product on the same dequantized weight tile, so 65 rows cost 64 + 16 rows of tensor-core work rather than 128.
    SPLIT > 1: the program writes its float32 sum into its slice of p [SPLIT, M, N]; with SUM_IN_LAUNCH the tile's
    last program to arrive (its counter in c) then adds the SPLIT slices in order into y (_sum_tile), else
    _sum_splits does after. SWAP: each product computed transposed, W x^T (the same products and sums). TMA: w_ptr
    is a tensor descriptor of the weight with [BLOCK_N, BLOCK_K] tiles, x_ptr and xt_ptr of x with [BLOCK_M, BLOCK_K]
    and [TAIL, BLOCK_K] tiles (the rows past M and the columns past K zero-filled, as the masked loads give them:
    no address per element); else xt_ptr is unread. EVEN: N a multiple of BLOCK_N and K of K_SPLIT's whole steps,
    so every tile is whole and loaded without masks (x's rows keep theirs)."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m0 = tl.program_id(1) * (BLOCK_M + TAIL)
    rm = m0 + tl.arange(0, BLOCK_M)
    k_start = tl.program_id(2) * K_SPLIT
    acc = _zeros(BLOCK_M, BLOCK_N, SWAP)
    if TAIL > 0:
        rt = m0 + BLOCK_M + tl.arange(0, TAIL)
        acc_tail = _zeros(TAIL, BLOCK_N, SWAP)
    for k0 in range(k_start, tl.minimum(k_start + K_SPLIT, K), BLOCK_K):
        x, w = _tile(x_ptr, w_ptr, s_ptr, rm, rn, m0, tl.program_id(0) * BLOCK_N, k0, M, N, K, s_xm, s_wn, s_sn,
                     SB_N, SB_K, BLOCK_K, TMA, EVEN)
        acc = _mma(acc, x, w, SWAP, UPCAST, PRECISION)
        if TAIL > 0:
            xt = xt_ptr.load([m0 + BLOCK_M, k0]) if TMA else _x_rows(x_ptr, rt, k0, M, K, s_xm, BLOCK_K, EVEN)
            acc_tail = _mma(acc_tail, xt, w, SWAP, UPCAST, PRECISION)
    _store_out(y_ptr, p_ptr, acc, rm, rn, M, N, s_ym, SPLIT, SWAP)
    if TAIL > 0:
        _store_out(y_ptr, p_ptr, acc_tail, rt, rn, M, N, s_ym, SPLIT, SWAP)
    if SPLIT > 1 and SUM_IN_LAUNCH:
        if _last_to_arrive(c_ptr, SPLIT):
            _sum_tile(p_ptr, y_ptr, rm, rn, M, N, s_ym, SPLIT)
            if TAIL > 0:
                _sum_tile(p_ptr, y_ptr, rt, rn, M, N, s_ym, SPLIT)
            tl.store(_counter(c_ptr), 0)  # the tile's counter ready for the next launch


@triton.jit
def _fp8_gemv(x_ptr, w_ptr, s_ptr, y_ptr, p_ptr, c_ptr, M, N, K, s_xm, s_wn, s_sn, s_ym, K_SPLIT, q_ptr, s_qn, NQ,
              SB_N: tl.constexpr, SB_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              SPLIT: tl.constexpr, SUM_IN_LAUNCH: tl.constexpr, EVEN: tl.constexpr, PLAIN: tl.constexpr,
              PDL: tl.constexpr = False):
    """Row m of y = x (W x S)^T, BLOCK_N of its columns, over input columns [k * K_SPLIT, (k + 1) * K_SPLIT);
    program (n block, m, k). On the CUDA cores, for one row: BLOCK_N divides the scale block's rows and BLOCK_K its
    columns, so a tile has one scale, and it multiplies x's BLOCK_K columns (float32) instead of the tile's weights:
    each weight is e4m3 -> float32 and one fused multiply-add, y[n] += sum_k w[n, k] (x[k] s), where the tile
    kernel converts, scales and rounds every weight for the tensor cores (a one-row product then takes 1.04-1.13x a
    load-only loop's time over its weight, the tile kernel 1.1-1.4x; docs/lab/NOTEBOOK.md section 32). The same
    dequantized product, its weight exact (never rounded to x's dtype); the split's slices and their sums as the
    tile kernel's (SPLIT, SUM_IN_LAUNCH). PLAIN: a plain weight q [NQ, K] (x's dtype, no scales) rides the launch,
    its rows y's columns N to N + NQ, made by the programs past W's tiles (W a whole number of them tall): an FP8
    checkpoint's bf16 in_proj_b / in_proj_a beside its FP8 in_proj, one launch where two cuBLAS kernels were. PDL:
    launched behind the kernel before (kernels/pdl.py): the first weight tile and scale read before the wait for x."""
    n0 = tl.program_id(0) * BLOCK_N
    rn, rm = n0 + tl.arange(0, BLOCK_N), tl.program_id(1) + tl.arange(0, 1)
    k_start = tl.program_id(2) * K_SPLIT
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if PDL:  # launched behind the kernel before (kernels/pdl.py): the next may launch; x only after the wait below
        tl.extra.cuda.gdc_launch_dependents()
    if PLAIN and n0 >= N:  # the plain weight's rows rq, y's columns rn
        rq = n0 - N + tl.arange(0, BLOCK_N)
        if PDL:
            tl.extra.cuda.gdc_wait()
        for k0 in range(k_start, tl.minimum(k_start + K_SPLIT, K), BLOCK_K):
            x = _x_row(x_ptr + tl.program_id(1) * s_xm, k0, K, BLOCK_K, EVEN)
            acc += tl.sum(_w_tile(q_ptr, rq, k0, NQ, K, s_qn, BLOCK_K, False).to(tl.float32) * x[None, :], axis=1)
    else:
        k_first = k_start
        if PDL:  # the first weight tile and its scale read while the kernel before finishes, then its first step
            w0 = _w_tile(w_ptr, rn, k_start, N, K, s_wn, BLOCK_K, EVEN)
            s0 = tl.load(s_ptr + (n0 // SB_N) * s_sn + k_start // SB_K)
            tl.extra.cuda.gdc_wait()
            x0 = _x_row(x_ptr + tl.program_id(1) * s_xm, k_start, K, BLOCK_K, EVEN)
            acc += tl.sum(w0.to(tl.float32) * (x0 * s0)[None, :], axis=1)
            k_first = k_start + BLOCK_K
        for k0 in range(k_first, tl.minimum(k_start + K_SPLIT, K), BLOCK_K):
            s = tl.load(s_ptr + (n0 // SB_N) * s_sn + k0 // SB_K)
            x = _x_row(x_ptr + tl.program_id(1) * s_xm, k0, K, BLOCK_K, EVEN)
            w = _w_tile(w_ptr, rn, k0, N, K, s_wn, BLOCK_K, EVEN)
            acc += tl.sum(w.to(tl.float32) * (x * s)[None, :], axis=1)
    _store_out(y_ptr, p_ptr, acc[None, :], rm, rn, M, N + NQ, s_ym, SPLIT, False)
    if SPLIT > 1 and SUM_IN_LAUNCH:
        if _last_to_arrive(c_ptr, SPLIT):
            _sum_tile(p_ptr, y_ptr, rm, rn, M, N + NQ, s_ym, SPLIT)
            tl.store(_counter(c_ptr), 0)


@triton.jit
def _x_row(row_ptr, k0, K, BLOCK_K: tl.constexpr, EVEN: tl.constexpr):
    """One row of x, columns [k0, k0 + BLOCK_K), in float32 (0 past K, unless EVEN: K holds every step)."""
    rk = k0 + tl.arange(0, BLOCK_K)
    if EVEN:
        return tl.load(row_ptr + rk).to(tl.float32)
    else:
        return tl.load(row_ptr + rk, mask=rk < K, other=0.0).to(tl.float32)


@triton.jit
def _store_out(y_ptr, p_ptr, acc, rm, rn, M, N, s_ym, SPLIT: tl.constexpr, SWAP: tl.constexpr):
    """A program's rows rm, columns rn: into y (SPLIT 1), else into its float32 split slice of p [SPLIT, M, N]."""
    if SPLIT == 1:
        _store(y_ptr, acc, rm, rn, M, N, s_ym, SWAP)
    else:
        _store(p_ptr + tl.program_id(2) * M * N, acc, rm, rn, M, N, N, SWAP)


@triton.jit
def _counter(c_ptr):
    """The split-K arrival counter of this program's tile of y (program (n block, m block, k))."""
    return c_ptr + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)


@triton.jit
def _last_to_arrive(c_ptr, SPLIT: tl.constexpr):
    """Whether this program is the last of its tile's SPLIT to arrive. Every thread's slice is stored before the
    arrival is counted (the counter's add releases them at the device's scope; the last program's add acquires the
    other programs' slices)."""
    tl.debug_barrier()
    return tl.atomic_add(_counter(c_ptr), 1, sem="acq_rel", scope="gpu") == SPLIT - 1


@triton.jit
def _tile(x_ptr, w_ptr, s_ptr, rm, rn, m0, n0, k0, M, N, K, s_xm, s_wn, s_sn, SB_N: tl.constexpr,
          SB_K: tl.constexpr, BLOCK_K: tl.constexpr, TMA: tl.constexpr, EVEN: tl.constexpr):
    """(x's rows rm = m0 + [0, BLOCK_M), the weight's rows rn = n0 + [0, BLOCK_N) dequantized), columns
    [k0, k0 + BLOCK_K): each weight element e4m3 -> float32 times its row's block scale, rounded once to x's dtype.
    TMA: x_ptr and w_ptr tensor descriptors; EVEN: the weight tile whole, loaded without masks (x's rows keep
    theirs)."""
    if TMA:
        x, w = x_ptr.load([m0, k0]), w_ptr.load([n0, k0])
    else:
        x, w = _x_rows(x_ptr, rm, k0, M, K, s_xm, BLOCK_K, EVEN), _w_tile(w_ptr, rn, k0, N, K, s_wn, BLOCK_K, EVEN)
    if EVEN:  # one scale per row of the tile
        s = tl.load(s_ptr + (rn // SB_N) * s_sn + k0 // SB_K)
    else:
        s = tl.load(s_ptr + (rn // SB_N) * s_sn + k0 // SB_K, mask=rn < N, other=0.0)
    return x, (w.to(tl.float32) * s[:, None]).to(x.dtype)


@triton.jit
def _w_tile(w_ptr, rn, k0, N, K, s_wn, BLOCK_K: tl.constexpr, EVEN: tl.constexpr):
    """The weight's e4m3 rows rn, columns [k0, k0 + BLOCK_K) by address (0 past N or K, unless EVEN: whole)."""
    rk = k0 + tl.arange(0, BLOCK_K)
    if EVEN:
        return tl.load(w_ptr + rn[:, None] * s_wn + rk[None, :])
    else:
        return tl.load(w_ptr + rn[:, None] * s_wn + rk[None, :], mask=(rn < N)[:, None] & (rk < K)[None, :],
                       other=0.0)


@triton.jit
def _x_rows(x_ptr, rows, k0, M, K, s_xm, BLOCK_K: tl.constexpr, EVEN: tl.constexpr):
    """x's rows `rows` (0 past M), columns [k0, k0 + BLOCK_K) (0 past K, unless EVEN: K holds every step)."""
    rk = k0 + tl.arange(0, BLOCK_K)
    mk = tl.full([BLOCK_K], 1, tl.int1) if EVEN else rk < K
    return tl.load(x_ptr + rows[:, None] * s_xm + rk[None, :], mask=(rows < M)[:, None] & mk[None, :], other=0.0)


@triton.jit
def _zeros(ROWS: tl.constexpr, COLS: tl.constexpr, SWAP: tl.constexpr):
    """A float32 accumulator for ROWS rows of x by COLS of the weight (transposed if SWAP)."""
    if SWAP:
        return tl.zeros((COLS, ROWS), dtype=tl.float32)
    else:
        return tl.zeros((ROWS, COLS), dtype=tl.float32)


@triton.jit
def _mma(acc, x, w, SWAP: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """acc + x w^T (acc + w x^T if SWAP: on Hopper the weight, the first operand, stays in registers)."""
    if UPCAST:  # the interpreter's bf16 tl.dot is wrong (Triton 3.9): the same exact products in fp32 ("ieee")
        x, w = x.to(tl.float32), w.to(tl.float32)
    if SWAP:
        return acc + tl.dot(w, tl.trans(x), input_precision=PRECISION)
    else:
        return acc + tl.dot(x, tl.trans(w), input_precision=PRECISION)


@triton.jit
def _store(y_ptr, acc, rm, rn, M, N, s_ym, SWAP: tl.constexpr):
    """Rows rm, columns rn of y (y's dtype: a float32 split slice, or the output) from acc."""
    if SWAP:
        acc = tl.trans(acc)
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    tl.store(y_ptr + rm[:, None] * s_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _sum_splits(p_ptr, y_ptr, MN, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    """y = the SPLIT float32 slices of p [SPLIT, MN] added in order, rounded once to y's dtype (one pass)."""
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.load(p_ptr + r, mask=r < MN, other=0.0)
    for k in tl.static_range(1, SPLIT):
        acc += tl.load(p_ptr + k * MN + r, mask=r < MN, other=0.0)
    tl.store(y_ptr + r, acc.to(y_ptr.dtype.element_ty), mask=r < MN)


@triton.jit
def _sum_tile(p_ptr, y_ptr, rm, rn, M, N, s_ym, SPLIT: tl.constexpr):
    """Rows rm, columns rn of y = the SPLIT float32 slices of p [SPLIT, M, N] added in order (slice 0 first),
    rounded once to y's dtype. The slices are read from L2 (".cg"), where the other programs' stores are."""
    offs = rm[:, None] * N + rn[None, :]
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    acc = tl.load(p_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg")
    for k in tl.static_range(1, SPLIT):
        acc += tl.load(p_ptr + k * M * N + offs, mask=mask, other=0.0, cache_modifier=".cg")
    tl.store(y_ptr + rm[:, None] * s_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


def fits(block: tuple[int, int]) -> bool:
    """Scale blocks every config's tiles divide (the official 128 x 128 does)."""
    return block[0] % 128 == 0 and block[1] % BLOCK_K == 0


@functools.lru_cache(maxsize=8)
def sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def stages(c: Config, itemsize: int, shared: int) -> int:
    """c's pipeline stages, fewer where they would not fit in `shared` bytes: each stage holds a tile of x (rows x
    BLOCK_K in x's dtype) and one of the weight (fp8); 32 KiB stay for the rest (the scales, the transposed store).
    Float32 activations at 129 rows fit two stages on an H200; bfloat16 three."""
    per_stage = (c.block_m + c.tail) * BLOCK_K * itemsize + c.block_n * BLOCK_K
    return max(1, min(c.num_stages, (shared - 32_768) // per_stage))


def choose(M: int, N: int, K: int, device: torch.device) -> Config:
    """The config for an [M, K] x [N, K]^T product (docs/lab/NOTEBOOK.md section 13 measured each rule on an H200):
    - one row (a greedy step): `one_row`'s, on the CUDA cores;
    - 2 to 16 rows: 16 rows by 64 weight rows, K split in the most parts (up to 8) that keep 6 steps of
      BLOCK_K each (`splits`: 8 for down_proj and the out/o projections, 4 for in_proj, qkv and gate+up at K = 5120;
      the split in parts each program's bytes, so more of them are in flight: 3-11% faster at one row for the wide
      products, session 10's sweep);
    - 17 to 32 rows: 32 rows by 64, swapped (2-10% faster at 17 rows, 5-15% slower at one); a narrow product (fewer
      programs than SMs: [5120, K]) doubles its splits while the programs fill fewer than 3x the SMs and each split
      keeps 4 steps of BLOCK_K;
    - at both, a split product's slices added in its own launch (`sum_in_launch`: 1.2-2.3 us less a narrow product at
      1 and 17 rows than a second kernel, level for the wide ones; section 29);
    - tree verify (33 to 160 rows): all rows in one program column (`row_blocks`: 65 = 64 + a 16-row tail, 129 = 128
      + 16), so each weight tile is read and dequantized once; 128 weight rows, 8 warps, swapped; split-K by the
      fewest waves of programs each split's work takes (`waves`), each doubling charged 15% (partial sums written
      and added), 1 to 8 splits of at least 6 steps: in_proj and qkv 1 (128 and 112 programs: one wave), gate+up 2
      (272 programs: 3 waves against 2.5 at split 2), down_proj and the out/o projections 8 (40 programs); a block
      of 64 rows or fewer (33 to 96 rows) with 4 warps and split at least in two, since two of its programs share
      an SM (shared memory for both; at 65 rows in_proj and qkv 54.5 -> 40 us, gate+up 102 -> 95, down 57 -> 54;
      at 129 rows 8 warps and the splits above stay the fastest, section 29); the
      weight tiles by bulk tensor copies where the device has them (`bulk_copies`: 7-18% faster at 65 and 129 rows
      for gate+up, down and the out/o projections, level for in_proj and qkv; at one row no faster, session 11);
      the slices added by a second kernel (in the launch, each tile's last program adds 80 or 144 rows of 2 or 8
      slices at the launch's end: 5-24 us slower a product, section 29);
    - a prefill (more rows): 128 x 128 tiles, split while the programs fill fewer than the SMs."""
    sms, split = sm_count(device), 1
    if M == 1:
        return one_row(N, K, sms)
    if M <= 16:
        return Config(16, 64, splits(K)[-1], 4, 3, sum_in_launch=True)
    if M <= 32:
        programs = triton.cdiv(N, 64)
        while programs < sms and programs * split < 3 * sms and K // (BLOCK_K * split * 2) >= 4:
            split *= 2
        return Config(32, 64, split, 4, 3, swap=True, sum_in_launch=True)
    programs = triton.cdiv(N, 128)
    if M <= 160:
        main, tail = row_blocks(M)
        split = min(splits(K), key=lambda k: waves(programs, k, sms) * (1 + 0.15 * (k.bit_length() - 1)))
        if main <= 64:  # two programs share an SM: 4 warps each, and two splits at least (where K has room)
            split = max(split, 2) if 2 in splits(K) else split
            return Config(main, 128, split, 4, 3, swap=True, tail=tail, tma=bulk_copies(device))
        return Config(main, 128, split, 8, 3, swap=True, tail=tail, tma=bulk_copies(device))
    while programs * triton.cdiv(M, 128) * split < sms and K // (BLOCK_K * split * 2) >= 8:
        split *= 2
    return Config(128, 128, split, 8, 3)


def one_row(N: int, K: int, sms: int) -> Config:
    """A one-row product's config (_fp8_gemv; section 32's sweep of 48 a product on an H200): 64 weight rows a
    program; K split in the fewest parts (of `splits`) that make 6 programs an SM (gate+up 2, in_proj and qkv 4, the
    [5120, K] products 8: each the sweep's fastest); 8 warps, 4 where the weight alone has 4 tiles an SM (gate+up:
    47.6 against 50.7 us)."""
    tiles, options = triton.cdiv(N, 64), splits(K)
    split = next((k for k in options if tiles * k >= 6 * sms), options[-1])
    return Config(1, 64, split, 4 if tiles >= 4 * sms else 8, 3, sum_in_launch=True, gemv=True)


def _operands(x: torch.Tensor, weight: torch.Tensor, c: Config):
    """(the kernel's x, x tail and weight arguments, the config it runs with): where c asks for bulk copies and both
    allow them (tiles.row_operands), tensor descriptors of [block_m, BLOCK_K] tiles of x, [tail, BLOCK_K] of its
    tail rows and [block_n, BLOCK_K] of the weight; else the tensors themselves (x twice: the tail's argument
    unread) and c without them."""
    described = row_operands(x, weight, c.block_m, c.tail, BLOCK_K, [c.block_n, BLOCK_K]) if c.tma else None
    if described is not None:
        return *described, c
    return x, x, weight, dataclasses.replace(c, tma=False)


def splits(K: int) -> list[int]:
    """The split-K counts (1, 2, 4, 8) whose splits each keep at least 6 steps of BLOCK_K."""
    return [1] + [k for k in (2, 4, 8) if K // (BLOCK_K * k) >= 6]


def waves(programs: int, split: int, sms: int) -> float:
    """The waves of one-program-per-SM launches a product takes, in units of an unsplit program's time:
    ceil(programs x split / SMs) / split (a verify program holds an SM: 8 warps, a 128-row weight tile and its
    accumulators)."""
    return triton.cdiv(programs * split, sms) / split


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
               config: Config | None = None, plain: torch.Tensor | None = None) -> torch.Tensor:
    """y = x (weight x scale per block)^T for x [..., K] (the leading dimensions flattened to M rows), with `config`
    (default: `choose`'s). `plain`: a weight [NQ, K] of x's dtype whose product x plain^T follows in y's last NQ
    columns; in the same launch where the one-row kernel runs and the FP8 weight is a whole number of its tiles
    tall, else by F.linear beside it."""
    if not fits(block):
        raise ValueError(f"fp8_linear: scale blocks of {block} are not whole tiles of 128x{BLOCK_K}")
    lead, K = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, K).contiguous()
    M, N = x2.shape[0], weight.shape[0]
    c = config or choose(M, N, K, x.device)
    if c.gemv and block[0] % c.block_n:  # _fp8_gemv reads one scale a tile
        raise ValueError(f"fp8_linear: one-row tiles of {c.block_n} weight rows straddle scale blocks of {block}")
    if plain is not None and (plain.shape[1] != K or plain.dtype != x.dtype):
        raise ValueError(f"fp8_linear: a plain weight {tuple(plain.shape)} {plain.dtype} for x [{M}, {K}] {x.dtype}")
    if plain is not None and not rides(c, N):
        y = torch.cat((fp8_linear(x2, weight, scale, block, c), torch.nn.functional.linear(x2, plain)), dim=-1)
        return y.reshape(*lead, N + plain.shape[0])
    NQ = 0 if plain is None else plain.shape[0]
    x_arg, xt_arg, w_arg, c = (x2, x2, weight, c) if c.gemv else _operands(x2, weight, c)
    k_split = triton.cdiv(triton.cdiv(K, BLOCK_K), c.split_k) * BLOCK_K  # whole BLOCK_K steps per split
    tiles = triton.cdiv(N, c.block_n) + triton.cdiv(NQ, c.block_n)  # the plain rows' tiles after W's
    grid = (tiles, M if c.gemv else triton.cdiv(M, c.block_m + c.tail), c.split_k)
    y = torch.empty(M, N + NQ, dtype=x.dtype, device=x.device)
    partial = torch.empty(c.split_k, M, N + NQ, dtype=torch.float32, device=x.device) if c.split_k > 1 else y
    counters = arrivals(weight, grid[0] * grid[1]) if c.split_k > 1 and c.sum_in_launch else y
    args = (w_arg, scale, y, partial, counters, M, N, K, x2.stride(0), weight.stride(0), scale.stride(0), N + NQ,
            k_split)
    consts = dict(SB_N=block[0], SB_K=block[1], BLOCK_N=c.block_n, BLOCK_K=BLOCK_K, SPLIT=c.split_k,
                  SUM_IN_LAUNCH=c.sum_in_launch, EVEN=not c.tma and N % c.block_n == 0 and k_split * c.split_k == K,
                  num_warps=c.num_warps, num_stages=stages(c, x.element_size(), shared_memory(x.device)))
    if c.gemv:
        q = plain if plain is not None else weight  # (an unread pointer without plain rows)
        _fp8_gemv[grid](x_arg, *args, q, q.stride(0), NQ, PLAIN=plain is not None, **consts, **pdl.keywords(x))
    else:
        precision = "ieee" if x.dtype == torch.float32 or INTERPRETED else "tf32"
        _fp8_gemm[grid](x_arg, xt_arg, *args, BLOCK_M=c.block_m, PRECISION=precision, UPCAST=INTERPRETED, SWAP=c.swap,
                        TAIL=c.tail, TMA=c.tma, **consts)
    if c.split_k > 1 and not c.sum_in_launch:  # the splits' float32 sums added in a fixed order, rounded once
        _sum_splits[(triton.cdiv(M * (N + NQ), SUM_BLOCK),)](partial, y, M * (N + NQ), SPLIT=c.split_k,
                                                             BLOCK=SUM_BLOCK)
    return y.reshape(*lead, N + NQ)


def rides(c: Config, N: int) -> bool:
    """Whether a plain weight's rows ride an FP8 product's launch under `c`: the one-row kernel over an FP8 weight
    [N, K] that is a whole number of its tiles tall (the plain rows' tiles follow W's)."""
    return c.gemv and N % c.block_n == 0


_ARRIVALS: dict[tuple[torch.device, int], torch.Tensor] = {}
_OUTGROWN: list[torch.Tensor] = []  # counters a graph may still hold after a larger set replaced them


def arrivals(weight: torch.Tensor, tiles: int) -> torch.Tensor:
    """The split-K arrival counters of the products with `weight` (int32, one a tile of y; 0 between launches: a
    tile's last program sets its counter back). A set a weight, so products that may run at once on two streams
    (a drafter's and its target's) never share a counter, and a CUDA graph's launches keep theirs; never freed."""
    key = (weight.device, weight.data_ptr())
    counters = _ARRIVALS.get(key)
    if counters is None or counters.numel() < tiles:
        if counters is not None:
            _OUTGROWN.append(counters)
        counters = _ARRIVALS[key] = torch.zeros(tiles, dtype=torch.int32, device=weight.device)
    return counters

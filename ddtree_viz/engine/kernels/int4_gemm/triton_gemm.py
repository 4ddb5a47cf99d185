"""A GEMM that reads 4-bit weights as they are stored (engine/weights/int4_common.py's pack-quantized layout): y = x W^T with
W = (q - z) x scale unpacked in registers, so a 27B target keeps about a quarter of bf16's Linear bytes (a Qwen3.6-27B
W4A16 target in 17.7 GB with its bf16 embeddings and lm_head: one 24 GB card) and no dequantized copy of a weight is
ever made.

The function computed is the dequantized model's (issue #29: activations stay in their dtype): each weight is
(q - z) x scale (exact in float32: a 4-bit integer times a bf16 / fp16 / fp32 scale), rounded once to the
activations' dtype (as int4.dequantize(...).to(dtype) at load rounds it), then multiplied with float32 accumulation;
a float32 product in IEEE float32 (no TF32). So the runner over kept 4-bit weights and the runner over the weights
dequantized at load compute the same products, up to the order of the sums.

No field becomes a float through a conversion instruction (a quarter of the CUDA cores' rate on an H100, and what
bounded the forms before: NOTEBOOK section 47). A field f (q + 8) or'ed into the low mantissa bits of a float whose
ulp is 1 is that float plus f exactly (_magic: 2^23 in float32, 128 in bfloat16, 1,024 in float16), and two such
floats apart are q - z, exact.

Three forms. The word form (`Config.words`, what `choose` picks past one row): a program a block_m x block_n tile of
y on the tensor cores, a step's words loaded whole ([block_n, block_k / 8], each row's contiguous) and unpacked in
registers, its scales (and zero points) a row where the step lies in one group, else a word (each word in one
group), dequantized in float32 and cast, or (`Config.half`) in the activations' dtype where the scales are in it
too (the bf16 / fp16 product of exact q - z and the scale: the same one rounding); the input split into split_k slices whose partial
products are summed after in a fixed order (deterministic). The one-row form (`Config.gemv`, a decode step's): a row
of x a program on the CUDA cores, block_n rows of the weight, a step's words against their 8 x block_k / 8 columns
of x in float32, each word's sum times its scale (the weight exact: in bfloat16 a rounding of a weight apart from
the word form, the noise the verdict rules measure; in float32 the same to the order of the sums), sums a word
column reduced across lanes once at the end; split into slices as the word form. The tile form, the first one
(docs/lab/NOTEBOOK.md section 36), and the fallback for what the others cannot read (activation order, a group
inside a word): each column's word loaded where it lies and its field shifted out, each column's scale through its
group index, so every layout the loader accepts runs here unchanged: groups of any size, per channel, activation
order (g_idx), asymmetric zero points packed along the rows, partial words and groups at the edges (masked).

Imported only where a kept 4-bit weight meets a CUDA input (dispatch.linear); without a GPU it runs in Triton's
interpreter (TRITON_INTERPRET=1; tests/test_int4_kernel.py). Shapes: x [..., K] (float32, bfloat16 or float16),
weight_packed [N, ceil(K/8)] int32, weight_scale [N, groups], weight_zero_point [ceil(N/8), groups] int32 or None,
g_idx [K] or None; returns y [..., N] in x's dtype.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..tiles import bulk_copies, row_blocks, row_operands, shared_memory
from . import table

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's interpreter (CPU tensors: the tests)
ASM = tl.constexpr(not INTERPRETED)  # inline PTX (the interpreter runs none)


@dataclass(frozen=True)
class Config:
    """A launch's tiles: rows of the weight a program computes (block_n), input columns a step (block_k, a multiple
    of 8: whole words), its warps and pipeline stages; gemv: the one-row form (_int4_gemv: a row of x a program on
    the CUDA cores, the weight exact, split_k slices; each word in one group)."""

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
    # the word form's weights dequantized in the activations' dtype where the scales are in it too (`half`), not in
    # float32 and cast: the same weights, fewer instructions (chosen where the sweep measured it faster)
    half: bool = False
    # the word form's products a field at a time where a step has 16 words or more (fields i and i + 4 of every
    # word against x's columns 8 w + i, split out of its tile), not one product of the tile in its columns' order:
    # fewer instructions counted (NOTEBOOK section 47), yet the step at one row it ran in took 37.14 ms where the one
    # product's took 24.60 (an H100, NOTEBOOK section 50): taken only where a table measured it faster
    fields: bool = False
    # the swapped form (_int4_swap, a verify's): a program block_n rows of the weight by all block_m + tail rows of
    # x, each step's words unpacked once into the weight tile in its columns' order, the tile the products' first
    # operand (y^T = W x^T: on Hopper from registers into the tensor cores) against block_m rows of x, then the same
    # tile against the tail's; x's and the words' tiles by bulk copies where the device has them; one slice
    swap: bool = False
    tail: int = 0


def choose(rows: int, n: int, k: int) -> Config:
    """The launch for an [rows, k] x [n, k]^T product. The measured table (table.py, gpu_bench --int4-tune) comes
    first; these rules are for the shapes it lacks. Up to 16 rows (a step, a DFlash block) the word form, from
    gpu_bench --int4-tune on an H200 at the 27B's GEMMs (docs/bench/gpu-h200-2026-12-06-int4-tune.json;
    docs/lab/NOTEBOOK.md sections 39 and 40; the tile form ran 14-16x slower): 64-row tiles of 256 columns, the
    input in four slices where the output is narrow (5,120 rows: out_proj, o_proj, down_proj) or wide (gate + up's
    34,816), in one between (in_proj, q + k + v), one product a step (not `fields`: the step took 37.14 ms with
    it, 24.60 with one product; section 50). A verify's rows (17 to 160) the swapped form in one slice (a
    slice's float32 partial products, held per GEMM in a verify's graph, took a 24 GB card past its cap at budget
    128), the rows as a block and a tail (tiles.row_blocks: 65 = 64 + 16, 129 = 128 + 16), steps of 128 columns,
    dequantized in float32, 128 weight rows a program where the output is wide (8 warps past 96 rows) and 64 where
    it is narrow (4 warps): in sm_90a SASS 8.2-9.7 instructions a weight against the word form's 25.8 (gpu_bench
    --int4-sass; NOTEBOOK section 49); on an H100 the verify at budget 64 took 37.80 ms with it where the word
    form's took 47.88 (section 50). Past 160 rows (a prefill) the word form's 128 x 128 / 64 x 128 tiles. None names
    the one-row form or `half` (6.4-7.9 with the swapped form): taken only where the table measured them faster,
    since bfloat16's `_magic` cannot run in the interpreter. The shipped table (an H100's tune) has the one-row form
    for a step, 3-4x faster than these rules' word form: the 4-bit step 11.22 ms against 37.14 (section 51)."""
    measured = table.lookup(rows, n, k)
    if measured is not None:
        return Config(**measured)
    if rows <= 16:
        split = 1 if 8192 < n <= 20480 else 4
        return Config(block_n=64, block_k=256, num_warps=4, num_stages=3, words=True, split_k=split, block_m=16)
    wide = n > 8192
    if rows <= 160:
        main, tail = row_blocks(rows)
        return Config(block_n=128 if wide else 64, block_k=128, num_warps=8 if wide and main + tail > 96 else 4,
                      num_stages=3, swap=True, block_m=main, tail=tail)
    return Config(block_n=128, block_k=64, num_warps=4, num_stages=3, words=True, split_k=1,
                  block_m=128 if wide else 64)


def swap_stages(c: Config, itemsize: int, shared: int) -> int:
    """The swapped form's pipeline stages, fewer where they would not fit in `shared` bytes (tiles.shared_memory):
    each stage holds x's rows' tile (block_m + tail rows of block_k columns in x's dtype) and the words' (block_n x
    block_k / 2 bytes); 32 KiB stay for the rest (the dequantized tile's staging, the stores)."""
    per_stage = (c.block_m + c.tail) * c.block_k * itemsize + c.block_n * c.block_k // 2
    return max(1, min(c.num_stages, (shared - 32_768) // per_stage))


def word_groups(c: Config, group: int, k: int, g_idx: torch.Tensor | None) -> bool:
    """Whether the word form and the one-row form can read this layout: no activation order, each word inside one
    group (groups of a multiple of 8 columns, or one group a row), whole words a step."""
    return g_idx is None and c.block_k % 8 == 0 and (group % 8 == 0 or group >= k)


def whole_groups(c: Config, group: int, g_idx: torch.Tensor | None) -> bool:
    """Whether each block_k columns of a step lie in one group (no activation order, block_k dividing the group):
    a scale and zero point a row for the step, the tile kernel's WHOLE form."""
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
def _magic(f, HALF: tl.constexpr):
    """4-bit fields f (int32, 0 .. 15) as the floats MAGIC + f, exactly and without an integer-to-float conversion
    (a quarter-rate instruction): f in the low mantissa bits under an exponent whose ulp is 1 (float32 2^23 when
    HALF is 0, bfloat16 128 when 1, float16 1,024 when 2). Two of them apart are q - z, exact in each dtype."""
    if HALF == 1:
        return (f | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True)
    elif HALF == 2:
        return (f | 0x6400).to(tl.int16).to(tl.float16, bitcast=True)
    else:
        return (f | 0x4B000000).to(tl.float32, bitcast=True)


@triton.jit
def _step_scales(s_ptr, z_ptr, rn, n_ok, word, ok, k0, GROUPS, GROUP: tl.constexpr, ASYM: tl.constexpr,
                 BLOCK_K: tl.constexpr):
    """A step's scales and zero fields (int32; 8 for symmetric weights), broadcastable to its [block_n, block_k / 8]
    words: a row's where the step lies in one group, else a word's (each word in one group). Zero points are packed
    along the rows: row n's in word n // 8, bits 4 (n % 8) .."""
    if GROUP % BLOCK_K == 0:
        rows, cols, g_ok = rn[:, None], k0 // GROUP, n_ok[:, None] & (k0 < GROUPS * GROUP)
    else:
        rows, cols, g_ok = rn[:, None], word[None, :] * 8 // GROUP, ok
    scale = tl.load(s_ptr + rows * GROUPS + cols, mask=g_ok, other=0.0)
    if ASYM:
        zw = tl.load(z_ptr + (rows // 8) * GROUPS + cols, mask=g_ok, other=0)
        zero = (zw >> ((rows % 8) * 4)) & 0xF
    else:
        zero = rows * 0 + cols * 0 + 8
    return scale, zero


@triton.jit
def _field_columns(x):
    """x's step with its columns 8 w + 4 a + 2 b + c as the last three axes (a, b, c): the columns of fields (0, 4),
    (2, 6), (1, 5), (3, 7), each [..., words, 2] (a last), split in registers rather than loaded apart."""
    x0, x1 = tl.split(x)  # c
    x00, x01 = tl.split(x0)  # b
    x10, x11 = tl.split(x1)
    return x00, x01, x10, x11


@triton.jit
def _row_pair(acc, words, x, I: tl.constexpr, offset):
    """acc + fields I and I + 4 of each word times x's columns 8 w + I and 8 w + I + 4 (x [words, 2]): a word's
    sum, accumulated (an FFMA a weight). `offset`: _row_offset's."""
    xa, xb = tl.split(x)
    qa, qb = _field_pair_f32(words >> (4 * I), offset)
    acc += qa * xa[None, :]
    return acc + qb * xb[None, :]


@triton.jit
def _row_offset(zero):
    """What _field_pair_f32 takes off each field for its zero field (int32): on a GPU the bfloat16 pair
    (-(128 + z), -(128 + z)) as one word's bits, elsewhere the float32 2^23 + z."""
    if ASM:
        return (zero | 0xC300) * 0x10001
    else:
        return _magic(zero, 0)


@triton.jit
def _field_pair_f32(shifted, offset):
    """The low fields of each word's halves (bits 0-3 and 16-19: fields I and I + 4 of a word shifted by 4 I) less
    the zero field, as float32 q - z, exact. On a GPU both from one LOP3 (the pair of bfloat16 128 + f, Marlin's
    trick), one bfloat16x2 FMA (t x 1 - (128 + z): exact, an integer in [-15, 15]; sm_80 and later) and a shift and
    a mask (a bfloat16 is a float32's high half): 3.5 instructions a weight with the FFMA, not 4; in the interpreter,
    which runs no assembly, the float32 2^23 + f less 2^23 + z (_magic's)."""
    if ASM:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t, u, one; mov.b32 one, 0x3F803F80; lop3.b32 t, $2, 0x000F000F, 0x43004300, 0xEA; "
            "fma.rn.bf16x2 u, t, one, $3; shl.b32 $0, u, 16; and.b32 $1, u, 0xFFFF0000; }",
            "=r,=r,r,r", [shifted, offset], dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
    else:
        return _magic(shifted & 0xF, 0) - offset, _magic((shifted >> 16) & 0xF, 0) - offset


@triton.jit
def _int4_gemv(x_ptr, w_ptr, s_ptr, z_ptr, p_ptr, M, N, K, WORDS, GROUPS, stride_xm, SLICE,
               GROUP: tl.constexpr, ASYM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    m = tl.program_id(0)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    part = tl.program_id(2)
    n_ok = rn < N
    rw = tl.arange(0, BLOCK_K // 8)  # a step's words
    acc = tl.zeros((BLOCK_N, BLOCK_K // 8), dtype=tl.float32)  # a sum a word column: across lanes once, at the end
    for step in range(0, SLICE, BLOCK_K):  # past K (the last slice's tail): all masked
        k0 = part * SLICE + step
        word = k0 // 8 + rw
        ok = n_ok[:, None] & (word < WORDS)[None, :]
        words = tl.load(w_ptr + rn[:, None] * WORDS + word[None, :], mask=ok, other=0)
        scale, zero = _step_scales(s_ptr, z_ptr, rn, n_ok, word, ok, k0, GROUPS, GROUP, ASYM, BLOCK_K)
        offset = _row_offset(zero)
        col = k0 + rw[:, None] * 8 + tl.arange(0, 8)[None, :]  # field i of word w: column 8 w + i
        xs = tl.load(x_ptr + m * stride_xm + col, mask=col < K, other=0.0).to(tl.float32)
        x00, x01, x10, x11 = _field_columns(tl.reshape(xs, (BLOCK_K // 8, 2, 2, 2)))
        part_sum = _row_pair(tl.zeros((BLOCK_N, BLOCK_K // 8), dtype=tl.float32), words, x00, 0, offset)
        part_sum = _row_pair(part_sum, words, x01, 2, offset)
        part_sum = _row_pair(part_sum, words, x10, 1, offset)
        part_sum = _row_pair(part_sum, words, x11, 3, offset)
        acc += part_sum * scale.to(tl.float32)
    tl.store(p_ptr + part * M * N + m * N + rn, tl.sum(acc, axis=1).to(p_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _field_dot(acc, x, magic, offset, scale, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """acc + x W_i^T for one field of each word (`magic`: _magic's floats, in x's dtype where HALF, else float32):
    (q - z) x scale rounded once to x's dtype (in it where HALF: one rounding of the exact product; else in float32,
    exact, and cast)."""
    w = ((magic - offset) * scale.to(offset.dtype)).to(x.dtype)
    if UPCAST:
        x, w = x.to(tl.float32), w.to(tl.float32)
    return tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)


@triton.jit
def _field_pair(acc, x, words, I: tl.constexpr, offset, scale, HALF: tl.constexpr, PRECISION: tl.constexpr,
                UPCAST: tl.constexpr):
    """acc + the products of fields I and I + 4 (x's [rows, words, 2]: columns 8 w + I and 8 w + I + 4)."""
    xa, xb = tl.split(x)
    if ASM and HALF == 1:  # both fields as bfloat16 128 + f from one shift and one LOP3 (they lie 16 bits apart)
        ma, mb = tl.inline_asm_elementwise(
            "{ .reg .b32 t; lop3.b32 t, $2, 0x000F000F, 0x43004300, 0xEA; mov.b32 {$0, $1}, t; }", "=h,=h,r",
            [words >> (4 * I)], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=1)
        acc = _field_dot(acc, xa, ma, offset, scale, PRECISION, UPCAST)
        return _field_dot(acc, xb, mb, offset, scale, PRECISION, UPCAST)
    else:
        acc = _field_dot(acc, xa, _magic((words >> (4 * I)) & 0xF, HALF), offset, scale, PRECISION, UPCAST)
        return _field_dot(acc, xb, _magic((words >> (4 * I + 16)) & 0xF, HALF), offset, scale, PRECISION, UPCAST)


@triton.jit
def _int4_words(x_ptr, w_ptr, s_ptr, z_ptr, p_ptr, M, N, K, WORDS, GROUPS, stride_xm, SLICE,
                GROUP: tl.constexpr, ASYM: tl.constexpr, HALF: tl.constexpr, PRECISION: tl.constexpr,
                UPCAST: tl.constexpr, FIELDS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    part = tl.program_id(2)
    row_ok, col_ok = rm < M, rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, SLICE, BLOCK_K):  # past K (the last slice's tail): all masked
        k0 = part * SLICE + step
        word = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        ok = col_ok[:, None] & (word < WORDS)[None, :]
        words = tl.load(w_ptr + rn[:, None] * WORDS + word[None, :], mask=ok, other=0)
        scale, zero = _step_scales(s_ptr, z_ptr, rn, col_ok, word, ok, k0, GROUPS, GROUP, ASYM, BLOCK_K)
        offset = _magic(zero, HALF)
        rk = k0 + tl.arange(0, BLOCK_K)
        xs = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=row_ok[:, None] & (rk < K)[None, :],
                     other=0.0)
        if FIELDS and BLOCK_K >= 128:  # a product a field (columns 8 w + i: block_k / 8 >= 16, a tensor-core step)
            x00, x01, x10, x11 = _field_columns(tl.reshape(xs, (BLOCK_M, BLOCK_K // 8, 2, 2, 2)))
            acc = _field_pair(acc, x00, words, 0, offset, scale, HALF, PRECISION, UPCAST)  # (c, b) = (0, 0)
            acc = _field_pair(acc, x01, words, 2, offset, scale, HALF, PRECISION, UPCAST)
            acc = _field_pair(acc, x10, words, 1, offset, scale, HALF, PRECISION, UPCAST)
            acc = _field_pair(acc, x11, words, 3, offset, scale, HALF, PRECISION, UPCAST)
        else:  # the fields in their columns' order, one product
            fields = (words[:, :, None] >> (tl.arange(0, 8) * 4)[None, None, :]) & 0xF
            q = (_magic(fields, HALF) - offset[:, :, None]) * scale.to(offset.dtype)[:, :, None]
            w = tl.reshape(q, (BLOCK_N, BLOCK_K)).to(xs.dtype)
            if UPCAST:
                xs, w = xs.to(tl.float32), w.to(tl.float32)
            acc = tl.dot(xs, tl.trans(w), acc, input_precision=PRECISION)
    tl.store(p_ptr + part * M * N + rm[:, None] * N + rn[None, :], acc.to(p_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _int4_swap(x_ptr, xt_ptr, w_ptr, s_ptr, z_ptr, y_ptr, M, N, K, WORDS, GROUPS, stride_xm, stride_ym, SLICE,
               GROUP: tl.constexpr, ASYM: tl.constexpr, HALF: tl.constexpr, PRECISION: tl.constexpr,
               UPCAST: tl.constexpr, TMA: tl.constexpr, BLOCK_M: tl.constexpr, TAIL: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Rows n0 + [0, BLOCK_N) of y^T = W x^T for x's rows m0 + [0, BLOCK_M + TAIL) over the input's slice
    [k * SLICE, (k + 1) * SLICE), k = program_id(2) (one slice: all of K): each step's words unpacked once
    (_unpacked) and multiplied with BLOCK_M rows of x, then with the TAIL rows (0 or 16 / 32: 65 rows cost 80 rows
    of tensor-core work, not 128). With slices y_ptr is the float32 partials [slices, M, N] (stride_ym M's stride;
    their sum after: _swapped). TMA: x_ptr, xt_ptr and w_ptr tensor descriptors ([BLOCK_M, BLOCK_K], [TAIL,
    BLOCK_K] and [BLOCK_N, BLOCK_K / 8] tiles, zero past the edges), no address per element; else xt_ptr is unread
    and the tiles are loaded by address, masked."""
    n0 = tl.program_id(0) * BLOCK_N
    m0 = tl.program_id(1) * (BLOCK_M + TAIL)
    k_start = tl.program_id(2) * SLICE
    y_ptr += tl.program_id(2).to(tl.int64) * M * N  # this slice's partials (none but slice 0 with one slice)
    rn = n0 + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    rm = m0 + tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    if TAIL > 0:
        rt = m0 + BLOCK_M + tl.arange(0, TAIL)
        acc_t = tl.zeros((BLOCK_N, TAIL), dtype=tl.float32)
    for k0 in range(k_start, tl.minimum(k_start + SLICE, K), BLOCK_K):
        word = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        ok = n_ok[:, None] & (word < WORDS)[None, :]
        if TMA:
            words, x = w_ptr.load([n0, k0 // 8]), x_ptr.load([m0, k0])
        else:
            words = tl.load(w_ptr + rn[:, None] * WORDS + word[None, :], mask=ok, other=0)
            x = _x_tile(x_ptr, rm, k0, M, K, stride_xm, BLOCK_K)
        scale, zero = _step_scales(s_ptr, z_ptr, rn, n_ok, word, ok, k0, GROUPS, GROUP, ASYM, BLOCK_K)
        w = _unpacked(words, scale, zero, HALF, x.dtype, BLOCK_N, BLOCK_K)
        if UPCAST:  # the interpreter's bf16 tl.dot is wrong (as in the word form): the same exact products in fp32
            w, x = w.to(tl.float32), x.to(tl.float32)
        acc = tl.dot(w, tl.trans(x), acc, input_precision=PRECISION)
        if TAIL > 0:
            xt = xt_ptr.load([m0 + BLOCK_M, k0]) if TMA else _x_tile(x_ptr, rt, k0, M, K, stride_xm, BLOCK_K)
            acc_t = tl.dot(w, tl.trans(xt.to(w.dtype)), acc_t, input_precision=PRECISION)
    tl.store(y_ptr + rm[None, :] * stride_ym + rn[:, None], acc.to(y_ptr.dtype.element_ty),
             mask=n_ok[:, None] & (rm < M)[None, :])
    if TAIL > 0:
        tl.store(y_ptr + rt[None, :] * stride_ym + rn[:, None], acc_t.to(y_ptr.dtype.element_ty),
                 mask=n_ok[:, None] & (rt < M)[None, :])


@triton.jit
def _x_tile(x_ptr, rows, k0, M, K, stride_xm, BLOCK_K: tl.constexpr):
    """x's rows `rows`, columns [k0, k0 + BLOCK_K) by address (0 past M and K)."""
    rk = k0 + tl.arange(0, BLOCK_K)
    return tl.load(x_ptr + rows[:, None] * stride_xm + rk[None, :], mask=(rows < M)[:, None] & (rk < K)[None, :],
                   other=0.0)


@triton.jit
def _unpacked(words, scale, zero, HALF: tl.constexpr, dtype: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr):
    """A step's weight tile [BLOCK_N, BLOCK_K] in its columns' order from its words [BLOCK_N, BLOCK_K / 8]: field i
    of word w is column 8 w + i; (q - z) x scale rounded once to `dtype` (in it where HALF, else in float32, exact,
    and cast: _field_dot's). `scale` and `zero` (_step_scales') broadcast over the words."""
    f0, f1, f2, f3 = words & 0xF, (words >> 4) & 0xF, (words >> 8) & 0xF, (words >> 12) & 0xF
    f4, f5, f6, f7 = (words >> 16) & 0xF, (words >> 20) & 0xF, (words >> 24) & 0xF, (words >> 28) & 0xF
    # joined last axis first: [.., a, b, c] holds field 4 c + 2 b + a; permuted so the axes read field 4 c + 2 b + a
    # in order (c, b, a), then the words' axis and the fields' flatten into the columns
    fields = tl.join(tl.join(tl.join(f0, f1), tl.join(f2, f3)), tl.join(tl.join(f4, f5), tl.join(f6, f7)))
    offset = _magic(zero, HALF)[:, :, None, None, None]
    w = (_magic(fields, HALF) - offset) * scale.to(offset.dtype)[:, :, None, None, None]
    return tl.reshape(tl.permute(w.to(dtype), (0, 1, 4, 3, 2)), (BLOCK_N, BLOCK_K))


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
    if (c.words or c.gemv or c.swap) and not word_groups(c, group, K, g_idx):  # activation order, a group in a word
        if config is not None and c.gemv:
            raise ValueError(f"the one-row kernel needs each word in one group: group {group}, block_k {c.block_k}, "
                             f"activation order {g_idx is not None}")
        c = Config()  # the tile form reads every layout
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    launch = dict(num_warps=c.num_warps, num_stages=c.num_stages)
    if M and c.swap:
        return _swapped(x2, packed, scale, zero, group, c, y, launch).reshape(*x.shape[:-1], N)
    if M and (c.words or c.gemv):
        return _sliced(x2, packed, scale, zero, group, c, y, launch).reshape(*x.shape[:-1], N)
    if M:
        bm = block_m(M)
        _int4_gemm[(triton.cdiv(M, bm), triton.cdiv(N, c.block_n))](
            x2, packed, scale, packed if zero is None else zero, packed if g_idx is None else g_idx, y, M, N, K,
            packed.shape[1], scale.shape[1], x2.stride(0), y.stride(0), GROUP=group, ASYM=zero is not None,
            GIDX=g_idx is not None, WHOLE=whole_groups(c, group, g_idx), PRECISION=precision(x2), UPCAST=INTERPRETED,
            BLOCK_M=bm, BLOCK_N=c.block_n, BLOCK_K=c.block_k, **launch)
    return y.reshape(*x.shape[:-1], N)


def precision(x: torch.Tensor) -> str:
    """tl.dot's: IEEE float32 for float32 activations (and in the interpreter), else the tensor cores' own."""
    return "ieee" if x.dtype == torch.float32 or INTERPRETED else "tf32"


def half(x: torch.Tensor, scale: torch.Tensor) -> int:
    """The word form's dequantization dtype: x's where the scales are in it too (1 bfloat16, 2 float16: q - z and
    its product with the scale in that dtype, rounded once), else 0 (float32, then cast). The interpreter bitcasts
    int16 to bfloat16 wrongly (its bfloat16 is a float32 underneath): there bfloat16 takes the float32 form."""
    if scale.dtype != x.dtype or (INTERPRETED and x.dtype == torch.bfloat16):
        return 0
    return {torch.bfloat16: 1, torch.float16: 2}.get(x.dtype, 0)


def _slices(K: int, c: Config, y: torch.Tensor) -> tuple[int, int, torch.Tensor]:
    """split_k slices of whole steps over K: (columns a slice, slices, what the kernel writes: y itself with one
    slice, else the float32 partials [slices, M, N])."""
    slice_k = triton.cdiv(triton.cdiv(K, c.split_k), c.block_k) * c.block_k
    parts = triton.cdiv(K, slice_k)
    return slice_k, parts, y if parts == 1 else torch.empty(parts, *y.shape, device=y.device, dtype=torch.float32)


def _summed(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """y from what _slices' kernel wrote: itself, or the partials summed over the slices in a fixed order."""
    return y if out is y else torch.sum(out, 0).to(y.dtype)


def _swapped(x2: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, group: int,
             c: Config, y: torch.Tensor, launch: dict) -> torch.Tensor:
    """The swapped form's launch: a program a block_n rows of the weight by block_m + tail rows of x and a slice of
    the input (split_k slices of whole steps: their float32 partials summed in a fixed order after, as _sliced
    does); the tiles by tensor descriptors where the device has bulk copies and x and the words allow them
    (tiles.row_operands), else by address."""
    (M, K), N = x2.shape, packed.shape[0]
    rows = c.block_m + c.tail
    slice_k, parts, out = _slices(K, c, y)
    launch = dict(launch, num_stages=swap_stages(c, x2.element_size(), shared_memory(x2.device)))
    described = (row_operands(x2, packed, c.block_m, c.tail, c.block_k, [c.block_n, c.block_k // 8])
                 if bulk_copies(x2.device) else None)
    tma = described is not None
    x_arg, xt_arg, w_arg = described if tma else (x2, x2, packed)
    _int4_swap[(triton.cdiv(N, c.block_n), triton.cdiv(M, rows), parts)](
        x_arg, xt_arg, w_arg, scale, packed if zero is None else zero, out, M, N, K, packed.shape[1], scale.shape[1],
        x2.stride(0), out.stride(-2), slice_k, GROUP=group, ASYM=zero is not None,
        HALF=half(x2, scale) if c.half else 0, PRECISION=precision(x2), UPCAST=INTERPRETED, TMA=tma,
        BLOCK_M=c.block_m, TAIL=c.tail, BLOCK_N=c.block_n, BLOCK_K=c.block_k, **launch)
    return _summed(out, y)


def _sliced(x2: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, group: int,
            c: Config, y: torch.Tensor, launch: dict) -> torch.Tensor:
    """The word form's and the one-row form's launch: split_k slices of the input (whole steps each), each slice's
    partial product in float32 and their sum in a fixed order (torch's sum over the slices), or with one slice the
    product cast in the store."""
    (M, K), N = x2.shape, packed.shape[0]
    slice_k, parts, out = _slices(K, c, y)
    z = packed if zero is None else zero  # (a pointer the kernel never reads when ASYM is off)
    if c.gemv:
        _int4_gemv[(M, triton.cdiv(N, c.block_n), parts)](
            x2, packed, scale, z, out, M, N, K, packed.shape[1], scale.shape[1], x2.stride(0), slice_k, GROUP=group,
            ASYM=zero is not None, BLOCK_N=c.block_n, BLOCK_K=c.block_k, **launch)
    else:
        bm = c.block_m or block_m(M)
        _int4_words[(triton.cdiv(M, bm), triton.cdiv(N, c.block_n), parts)](
            x2, packed, scale, z, out, M, N, K, packed.shape[1], scale.shape[1], x2.stride(0), slice_k, GROUP=group,
            ASYM=zero is not None, HALF=half(x2, scale) if c.half else 0, PRECISION=precision(x2),
            UPCAST=INTERPRETED, FIELDS=c.fields, BLOCK_M=bm, BLOCK_N=c.block_n, BLOCK_K=c.block_k, **launch)
    return _summed(out, y)

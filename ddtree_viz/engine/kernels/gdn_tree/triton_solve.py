"""The tree delta rule in Triton (dispatch.py's forms "triton-solve" and "triton-rule"): its sequential part (the
unit-triangular solve and the output product) in one kernel, `tree_solve_triton`; and the whole rule in two
launches, `tree_rule_triton` (below).

parallel.tree_delta_rule_parts computes, per value head and with cuBLAS's batched GEMMs and fused elementwise
work (all parallel), the system and the output's pieces:

    A    [H, T, T]  beta_i exp(G_i - G_j) k_i.k_j for j an ancestor-or-self of i (the strict lower part is read)
    Qd   [H, T, T]  exp(G_i - G_j) q_i.k_j for j an ancestor-or-self of i, 0 elsewhere
    rhs  [H, T, V]  beta * (v - exp(G) K S_c)
    base [H, T, V]  exp(G) Q S_c

and what is left is  (I + A) delta = rhs,  o = base + Qd delta  (parallel.tree_solve does it with
torch.linalg.solve_triangular and a bmm). Here one launch does both, a program per (head, value-column block):

- The root (position 0) has no strict ancestor, so delta_0 = rhs_0, and it is eliminated from the other rows
  (rhs_i -= A_i0 delta_0). What remains has T - 1 rows: a power of two at budgets 64 and 128 (65 and 129 nodes),
  held whole in registers ([TP, TP] with TP = next power of two >= T - 1, at most 128).
- The remaining system is solved level by level: d <- rhs - A d, repeated (tree depth - 1) times. A node's
  strict ancestors are exactly the nodes above it on its path, so after m repetitions every node at depth <= m + 1
  holds its final value, computed by the forward-substitution formula from final values (no powers of A are
  formed, so nothing cancels: the system's conditioning is that of the substitution itself). The count comes
  from the device (`steps`, the tree's depth from its ancestor mask), so the launch is the same for every tree of
  a size and CUDA graphs replay it.
- In the whole rule's kernel (below), for trees of at least BLOCKED_FROM levels to repeat (by row tile: 2 at 129
  positions, 9 at 65), the solve goes by blocks of rows (`_solve_blocked`, forward substitution by blocks;
  SOLVE_BLOCK: 32 rows at 129 positions, 16 at 65): a block takes the final delta of the blocks before it, then
  repeats its own levels only as often as one of its nodes has strict ancestors inside it (from the ancestor
  mask). The repetition over all 128 rows costs (depth - 1) products of [128, 128] by [128, BV]; by blocks of 32
  it costs at most 6 off-diagonal products and (depth - 1) of [32, 32] a block, fewer where the block holds no
  long chain.
- Then o = base + Qd delta, the root's column as a rank-one term.

All arithmetic is fp32. The products are "tf32x3" by default: each fp32 product as three TF32 tensor-core products
(lo.hi + hi.lo, then hi.hi), which keeps fp32 accuracy (on an H200 at Qwen3.6-27B shapes its largest difference from
the torch form, 9.5e-7 at 65 positions, equals "ieee"'s) at 16 us a layer against 41 us for "ieee"'s CUDA-core
products and 47 us for cuBLAS's solve + bmm (docs/lab/NOTEBOOK.md section 6). The split is made here (_split, _dot_parts:
Triton's own order and rounding, without its NaN replacement; a factor used twice split once), and a launch whose
tiles are full (T = TP + 1: 65 and 129 positions) drops its masks (_below): 7-17% less a layer than Triton's split
with masks (section 25). In Triton's interpreter (tests on a CPU) every product is plain fp32.
Shapes (docs/ARCHITECTURE.md's letters): A, Qd [H, T, T]; rhs, base [H, T, V]; steps [] int. Returns o and delta
[T, H, V] fp32 (the layout the rest of the GDN layer reads).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_T = 129  # the root + 128 rows held in registers; larger trees take the torch form (dispatch.py)
BLOCK_V = {64: 16, 128: 64}  # value columns per program by row tile (measured on an H200; others take 16)
# the products' precision: "tf32x3" three TF32 tensor-core products per fp32 product, split here (_split,
# _dot_parts), fp32-accurate; "triton-tf32x3" the same split made by Triton (tl.dot's "tf32x3": the same numbers
# for finite inputs, but it also replaces NaNs in the small products and splits a factor again at each use); "tf32"
# one TF32 product (not fp32-accurate); "ieee" CUDA-core fp32 (docs/lab/NOTEBOOK.md sections 6 and 25)
PRECISION = "tf32x3"
PRECISIONS = ("tf32x3", "triton-tf32x3", "tf32", "ieee")


def _checked(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")
    return precision


@triton.jit
def _split(x, PRECISION: tl.constexpr):
    """For "tf32x3", x's two TF32 parts: hi, x rounded to TF32's 10 mantissa bits (to nearest, ties away from zero:
    half a unit of the 13 dropped bits added to the bits, then those bits cleared; infinities stay), and lo = x - hi,
    exact in fp32, which the tensor cores read to TF32 in turn. Other precisions: x unsplit (x, x)."""
    hi = x
    lo = x
    if PRECISION == "tf32x3":
        hi = ((x.to(tl.int32, bitcast=True) + 0x1000) & -0x2000).to(tl.float32, bitcast=True)
        lo = x - hi
    return hi, lo


@triton.jit
def _dot_parts(ah, al, bh, bl, acc, PRECISION: tl.constexpr):
    """acc + a b from both factors' _split parts (a factor used again is split once). For "tf32x3": lo.hi + hi.lo,
    then hi.hi, summed on the tensor cores from zero and added to acc after (the lo.lo product is below fp32's
    precision): Triton's "tf32x3" in the same order, so the same numbers for finite inputs, without its replacement
    of NaNs in the small products (a compare and a select an element of every product). acc itself never goes
    through the tensor cores, whose accumulation is not fp32's rounding (fed to them, it doubles the rule's largest
    difference from the torch form, measured). Other precisions: tl.dot's own (the parts are the factors)."""
    if PRECISION == "tf32x3":
        t = tl.dot(al, bh, tl.zeros(acc.shape, dtype=tl.float32), input_precision="tf32")
        t = tl.dot(ah, bl, t, input_precision="tf32")
        acc += tl.dot(ah, bh, t, input_precision="tf32")
    elif PRECISION == "triton-tf32x3":
        acc = tl.dot(ah, bh, acc, input_precision="tf32x3")
    else:
        acc = tl.dot(ah, bh, acc, input_precision=PRECISION)
    return acc


@triton.jit
def _dot(a, b, acc, PRECISION: tl.constexpr):
    """acc + a b in PRECISION."""
    ah, al = _split(a, PRECISION)
    bh, bl = _split(b, PRECISION)
    return _dot_parts(ah, al, bh, bl, acc, PRECISION)


@triton.jit
def _dot_pair(x, y, b, accx, accy, PRECISION: tl.constexpr):
    """(accx + x b, accy + y b): two products by one factor, split once."""
    bh, bl = _split(b, PRECISION)
    xh, xl = _split(x, PRECISION)
    yh, yl = _split(y, PRECISION)
    return _dot_parts(xh, xl, bh, bl, accx, PRECISION), _dot_parts(yh, yl, bh, bl, accy, PRECISION)


@triton.jit
def _below(idx, n, FULL: tl.constexpr):
    """The mask idx < n, or where the launch's tiles are full (FULL: T = TP + 1 and the widths multiples of their
    blocks) a constant true one, so the compiler drops the masks and the selects behind them."""
    m = idx < n
    if FULL:
        m = tl.full(idx.shape, 1, tl.int1)
    return m


@triton.jit
def _solve_rows(A_ptr, Qd_ptr, steps_ptr, o_ptr, delta_ptr, i_h, rows, mr, cv, mv, rhs, d0, base, base0,
                s_ah, s_at, s_qh, s_qt, s_ot, s_oh, s_dt, s_dh, PRECISION: tl.constexpr):
    """The solve and the output product for one head's block of value columns, given the right-hand side and the
    base of positions 1 .. TP (`rhs`, `base` [TP, BV]) and of the root (`d0` = its rhs, which is its delta since it
    has no strict ancestor, and `base0` [BV]); writes delta and o."""
    # the root is eliminated from every other row
    a0 = tl.load(A_ptr + i_h * s_ah + rows * s_at, mask=mr, other=0.0)  # [TP] A[i, 0]
    r = rhs - a0[:, None] * d0[None, :]
    strict = mr[:, None] & (rows[:, None] > rows[None, :])  # A's diagonal is not the system's (unit) diagonal
    A = tl.load(A_ptr + i_h * s_ah + rows[:, None] * s_at + rows[None, :], mask=strict, other=0.0)
    nh, nl = _split(-A, PRECISION)  # -A's parts, made once for every repetition
    d = r
    for _ in range(tl.load(steps_ptr)):  # one level of the tree per repetition
        dh, dl = _split(d, PRECISION)
        d = _dot_parts(nh, nl, dh, dl, r, PRECISION)
    _output(Qd_ptr, o_ptr, delta_ptr, i_h, rows, mr, cv, mv, d, d0, base, base0, s_qh, s_qt, s_ot, s_oh, s_dt, s_dh,
            PRECISION)


@triton.jit
def _output(Qd_ptr, o_ptr, delta_ptr, i_h, rows, mr, cv, mv, d, d0, base, base0, s_qh, s_qt, s_ot, s_oh, s_dt, s_dh,
            PRECISION: tl.constexpr):
    """delta (the root's `d0` [BV], positions 1 .. TP's `d` [TP, BV]) written, and o = base + Qd delta."""
    m2 = mr[:, None] & mv[None, :]
    tl.store(delta_ptr + i_h * s_dh + cv, d0, mask=mv)  # the root's row (position 0)
    tl.store(delta_ptr + rows[:, None] * s_dt + i_h * s_dh + cv[None, :], d, mask=m2)
    qd0 = tl.load(Qd_ptr + i_h * s_qh + rows * s_qt, mask=mr, other=0.0)  # [TP] Qd[i, 0]
    Qd = tl.load(Qd_ptr + i_h * s_qh + rows[:, None] * s_qt + rows[None, :], mask=mr[:, None] & mr[None, :], other=0.0)
    o = _dot(Qd, d, base + qd0[:, None] * d0[None, :], PRECISION)
    tl.store(o_ptr + rows[:, None] * s_ot + i_h * s_oh + cv[None, :], o, mask=m2)
    q00 = tl.load(Qd_ptr + i_h * s_qh)
    tl.store(o_ptr + i_h * s_oh + cv, base0 + q00 * d0, mask=mv)


@triton.jit
def _solve_blocked(A_ptr, Qd_ptr, anc_ptr, steps_ptr, o_ptr, delta_ptr, i_h, T, rows, mr, cv, mv, rhs, d0, base, base0,
                   s_ah, s_at, s_nt, s_ot, s_oh, s_dt, s_dh, TP: tl.constexpr, BS: tl.constexpr,
                   PRECISION: tl.constexpr, FULL: tl.constexpr):
    """_solve_rows by blocks of BS rows (forward substitution by blocks): block b's rows take the final delta of
    the blocks before it (A's off-diagonal blocks times theirs), then solve their own unit-triangular block by the
    level repetition, as often as a node of the block has strict ancestors inside it (at most `steps`). The rows
    go through the program's delta output (its own head and columns) between the blocks."""
    m2 = mr[:, None] & mv[None, :]
    a0 = tl.load(A_ptr + i_h * s_ah + rows * s_at, mask=mr, other=0.0)  # [TP] A[i, 0]: the root eliminated
    dcols = delta_ptr + i_h * s_dh + cv[None, :]
    tl.store(dcols + rows[:, None] * s_dt, rhs - a0[:, None] * d0[None, :], mask=m2)  # delta's rows hold the rhs
    steps = tl.load(steps_ptr)
    for b in tl.static_range(TP // BS):
        tl.debug_barrier()  # the rows stored so far seen by every thread of the program
        rb = 1 + b * BS + tl.arange(0, BS)
        mb = _below(rb, T, FULL)
        acc = tl.load(dcols + rb[:, None] * s_dt, mask=mb[:, None] & mv[None, :], other=0.0)
        for c in tl.static_range(b):  # the blocks before, final
            rc = 1 + c * BS + tl.arange(0, BS)
            mc = _below(rc, T, FULL)
            Abc = tl.load(A_ptr + i_h * s_ah + rb[:, None] * s_at + rc[None, :], mask=mb[:, None] & mc[None, :],
                          other=0.0)
            dc = tl.load(dcols + rc[:, None] * s_dt, mask=mc[:, None] & mv[None, :], other=0.0)
            acc = _dot(-Abc, dc, acc, PRECISION)
        strict = mb[:, None] & (rb[:, None] > rb[None, :])
        Abb = tl.load(A_ptr + i_h * s_ah + rb[:, None] * s_at + rb[None, :], mask=strict, other=0.0)
        inside = tl.load(anc_ptr + rb[:, None] * s_nt + rb[None, :], mask=strict, other=0.0)
        levels = tl.minimum(tl.max(tl.sum(inside, 1), 0).to(tl.int32), steps)
        nh, nl = _split(-Abb, PRECISION)  # -A_bb's parts, made once for every repetition
        d = acc
        for _ in range(levels):
            dh, dl = _split(d, PRECISION)
            d = _dot_parts(nh, nl, dh, dl, acc, PRECISION)
        tl.debug_barrier()  # every thread's loads of this block done before its rows are overwritten
        tl.store(dcols + rb[:, None] * s_dt, d, mask=mb[:, None] & mv[None, :])
    tl.debug_barrier()
    d = tl.load(dcols + rows[:, None] * s_dt, mask=m2, other=0.0)
    _output(Qd_ptr, o_ptr, delta_ptr, i_h, rows, mr, cv, mv, d, d0, base, base0, s_ah, s_at, s_ot, s_oh, s_dt, s_dh,
            PRECISION)


@triton.jit
def _tree_solve_kernel(
    A_ptr, Qd_ptr, rhs_ptr, base_ptr, steps_ptr, o_ptr, delta_ptr,
    T, V,
    s_ah, s_at, s_qh, s_qt, s_rh, s_rt, s_bh, s_bt, s_ot, s_oh, s_dt, s_dh,
    TP: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr,
):
    i_v, i_h = tl.program_id(0), tl.program_id(1)
    rows = 1 + tl.arange(0, TP)  # tree positions 1 .. TP; the root apart
    mr = rows < T
    cv = i_v * BV + tl.arange(0, BV)
    mv = cv < V
    m2 = mr[:, None] & mv[None, :]
    d0 = tl.load(rhs_ptr + i_h * s_rh + cv, mask=mv, other=0.0)  # [BV]
    r = tl.load(rhs_ptr + i_h * s_rh + rows[:, None] * s_rt + cv[None, :], mask=m2, other=0.0)
    b = tl.load(base_ptr + i_h * s_bh + rows[:, None] * s_bt + cv[None, :], mask=m2, other=0.0)
    b0 = tl.load(base_ptr + i_h * s_bh + cv, mask=mv, other=0.0)
    _solve_rows(A_ptr, Qd_ptr, steps_ptr, o_ptr, delta_ptr, i_h, rows, mr, cv, mv, r, d0, b, b0,
                s_ah, s_at, s_qh, s_qt, s_ot, s_oh, s_dt, s_dh, PRECISION)


def _last_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _row_tile(T: int) -> int:
    """The row tile: positions 1 .. T-1 (the root apart) as a power of two, at least 16."""
    return max(16, triton.next_power_of_2(max(T - 1, 1)))


def _tiles(T: int, V: int, block_v: int | None, table: dict[int, int]) -> tuple[int, int, int]:
    """(TP, BV, warps): the row tile (_row_tile), the value columns a program (`block_v`, else the measured `table`
    by row tile, else 16) and the warps a program."""
    TP = _row_tile(T)
    BV = max(16, min(block_v or table.get(TP, 16), triton.next_power_of_2(V)))
    return TP, BV, 8 if TP >= 128 else 4


def tree_solve_triton(A, Qd, rhs, base, steps, *, block_v: int | None = None, precision: str = PRECISION):
    """parallel.tree_solve in one kernel launch. A, Qd: [H, T, T]; rhs, base: [H, T, V]; all fp32; steps: [] int
    on the device, at least the tree's depth - 1 (parallel.solve_steps). T <= MAX_T. Returns o, delta [T, H, V]."""
    H, T, V = rhs.shape
    if A.shape != (H, T, T) or Qd.shape != (H, T, T) or base.shape != rhs.shape or T > MAX_T or steps.numel() != 1:
        raise ValueError(f"tree_solve_triton: shapes A {tuple(A.shape)} Qd {tuple(Qd.shape)} rhs {tuple(rhs.shape)} "
                         f"base {tuple(base.shape)} steps {tuple(steps.shape)} (at most {MAX_T} positions)")
    A, Qd, rhs, base = (_last_contiguous(x) for x in (A, Qd, rhs, base))
    steps = steps.reshape(()).to(torch.int32)
    o = torch.empty(T, H, V, dtype=torch.float32, device=rhs.device)
    delta = torch.empty_like(o)
    TP, BV, warps = _tiles(T, V, block_v, BLOCK_V)
    _tree_solve_kernel[(triton.cdiv(V, BV), H)](
        A, Qd, rhs, base, steps, o, delta,
        T, V,
        A.stride(0), A.stride(1), Qd.stride(0), Qd.stride(1), rhs.stride(0), rhs.stride(1), base.stride(0),
        base.stride(1), o.stride(0), o.stride(1), delta.stride(0), delta.stride(1),
        TP=TP, BV=BV, PRECISION=_checked(precision), num_warps=warps,
    )
    return o, delta


# ----------------------------------------------------------------------------------------------------------------
# The whole tree delta rule in two launches: the parallel part in Triton too
# ----------------------------------------------------------------------------------------------------------------
#
# parallel.tree_delta_rule_parts' GEMMs (q.k and k.k per key head, q S_c and k S_c per value head) and their
# elementwise epilogues (path decay, beta, exp(G)) were ~25 compiled kernels and cuBLAS calls, 35 us a layer at 65
# positions, twice the solve. Here they move into Triton: `_tree_parts_kernel` (a program per (block of rows,
# value head)) computes the path sums G, the products q.k and k.k on tensor cores (tf32x3, fp32-accurate) with the
# decay and beta applied, and writes A, Qd and G; `_tree_rule_kernel` (a program per (value-column block, value
# head)) computes q S_c and k S_c for its columns, forms rhs and base in registers (never written), then solves
# as `_tree_solve_kernel` does. q and k stay on their Hk key heads (value head h reads key head h // (H / Hk)).

BLOCK_K = 32  # key columns per tl.dot in the products over the key dimension
# value columns per program of _tree_rule_kernel by row tile (an H200 at Qwen3.6-27B shapes, us a layer at
# 65 / 129 positions: block 16 50.4 / 125.3, 32 39.0 / 116.1, 64 43.9 / 107.7, 128 82.1 / 175.9)
RULE_BLOCK_V = {64: 32, 128: 64}
# rows per program of _tree_parts_kernel by row tile (a program per (row block, value head): 192 programs at 65 and
# 129 positions where a program per head was 48, each walking every row)
PARTS_BLOCK_R = {64: 16, 128: 32}
# a program per (row block, key head) instead, its REP value heads' q.k and k.k made once (3 at Qwen3.6-27B's 48
# value heads on 16 key heads), by row tile, with its rows and warps a program. An H200 at those shapes, a tree of
# 15 levels, us a call by value head / by key head (rows a program, warps): at 65 positions 11.4 (16, 4) / 14.4
# (16, 8); at 129 27.3 (32, 4) / 22.3 (16, 8), the whole rule 74.2 / 70.0 (the latter with (16, 4): 23.8;
# docs/lab/NOTEBOOK.md section 22)
PARTS_GROUP = {128: True}
PARTS_GROUP_BLOCK_R = {64: 16, 128: 16}
PARTS_GROUP_WARPS = {128: 8}
# the solve's rows a block by row tile (_solve_blocked; a tile not here: one block, the level repetition over
# every row, as _solve_rows), taken where the tree's level count (`steps`) is at least BLOCKED_FROM's for the tile.
# An H200 at Qwen3.6-27B shapes, us a layer, over every row / by blocks of 16 / of 32 (gpu_bench's
# tree_forms.solve_by_depth; docs/lab/NOTEBOOK.md section 20): at 65 positions 28.1 / 31.5 / 31.7 at 1 level,
# 32.3 / 32.6 / 35.3 at 7, 36.9 / 34.6 / 39.9 at 11, 39.8 / 33.8 / 42.2 at 15; at 129 positions 76.2 / 84.2 / 75.5
# at 1, 79.4 / 85.1 / 76.5 at 2, 91.4 / 86.2 / 79.2 at 7, 111.4 / 88.1 / 81.0 at 15 (71.3 / 74.7 by blocks of 32 at
# 0 levels, section 19); a chain of 129: 375 / 109 / 120
SOLVE_BLOCK = {64: 16, 128: 32}
BLOCKED_FROM = {64: 9, 128: 2}


@triton.jit
def _qk_slice(q_ptr, k_ptr, rows, mr, cols, mc, i_k, s_qt, s_qh, s_kt, s_kh):
    """A slice of key columns `cols` of key head i_k's queries and keys: rows 1 .. TP ([TP, BK]) and the root's."""
    m2 = mr[:, None] & mc[None, :]
    qc = tl.load(q_ptr + rows[:, None] * s_qt + i_k * s_qh + cols[None, :], mask=m2, other=0.0)
    kc = tl.load(k_ptr + rows[:, None] * s_kt + i_k * s_kh + cols[None, :], mask=m2, other=0.0)
    q0 = tl.load(q_ptr + i_k * s_qh + cols, mask=mc, other=0.0)
    k0 = tl.load(k_ptr + i_k * s_kh + cols, mask=mc, other=0.0)
    return qc, kc, q0, k0


@triton.jit
def _tree_parts_kernel(
    q_ptr, k_ptr, g_ptr, beta_ptr, anc_ptr, A_ptr, Qd_ptr, G_ptr,
    T, K, REP,
    s_qt, s_qh, s_kt, s_kh, s_gt, s_bt, s_nt, s_ah, s_at, s_Gh,
    TP: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr, GROUP: tl.constexpr,
    FULL: tl.constexpr,
):
    """A block of rows of A, Qd and G for one value head (program (row block, value head)), or with GROUP for every
    value head of one key head (program (row block, key head)): the products q.k and k.k, which only the key head
    decides, made once for its REP value heads; then per value head its path sums, decay and beta."""
    i_r, i_p = tl.program_id(0), tl.program_id(1)
    i_k = i_p if GROUP else i_p // REP  # the key head the program's value heads read
    cols = 1 + tl.arange(0, TP)  # the system's columns: tree positions 1 .. TP (the root apart)
    mcol = _below(cols, T, FULL)
    rows = 1 + i_r * BR + tl.arange(0, BR)  # this program's block of rows
    mr = _below(rows, T, FULL)
    # q_i.k_j and k_i.k_j for the block's rows i against positions 1 .. T-1, and against the root's key (column 0)
    dkk = tl.zeros([BR, TP], dtype=tl.float32)
    dqk = tl.zeros([BR, TP], dtype=tl.float32)
    kk0 = tl.zeros([BR], dtype=tl.float32)
    qk0 = tl.zeros([BR], dtype=tl.float32)
    q0k0 = tl.zeros([BK], dtype=tl.float32)
    for c0 in range(0, K, BK):
        ci = c0 + tl.arange(0, BK)
        mc = _below(ci, K, FULL)
        qr, kr, q0, k0 = _qk_slice(q_ptr, k_ptr, rows, mr, ci, mc, i_k, s_qt, s_qh, s_kt, s_kh)
        kt = tl.trans(tl.load(k_ptr + cols[:, None] * s_kt + i_k * s_kh + ci[None, :],
                              mask=mcol[:, None] & mc[None, :], other=0.0))
        dkk, dqk = _dot_pair(kr, qr, kt, dkk, dqk, PRECISION)
        kk0 += tl.sum(kr * k0[None, :], 1)
        qk0 += tl.sum(qr * k0[None, :], 1)
        q0k0 += q0 * k0
    m2 = mr[:, None] & mcol[None, :]
    on_path = tl.load(anc_ptr + rows[:, None] * s_nt + cols[None, :], mask=m2, other=0.0) > 0
    first = i_r == 0  # the root's own entries, once
    for j in range(REP if GROUP else 1):
        i_h = i_k * REP + j if GROUP else i_p
        # G: path sums of g over each node's ancestors-or-self, for every column; the rows' values picked from
        # them exactly (a sum of one value and zeros), so a node's decay to itself is exp(0)
        G = tl.zeros([TP], dtype=tl.float32)
        for c0 in range(0, T, BK):
            ci = c0 + tl.arange(0, BK)
            mc = ci < T
            anc = tl.load(anc_ptr + cols[:, None] * s_nt + ci[None, :], mask=mcol[:, None] & mc[None, :], other=0.0)
            gc = tl.load(g_ptr + ci * s_gt + i_h, mask=mc, other=0.0)
            G += tl.sum(anc * gc[None, :], 1)
        Gr = tl.sum(tl.where(rows[:, None] == cols[None, :], G[None, :], 0.0), 1)
        G0 = tl.load(g_ptr + i_h)
        decay = tl.where(on_path, tl.exp(tl.where(on_path, Gr[:, None] - G[None, :], 0.0)), 0.0)
        decay0 = tl.exp(Gr - G0)  # every node descends from the root
        beta = tl.load(beta_ptr + rows * s_bt + i_h, mask=mr, other=0.0)
        tl.store(A_ptr + i_h * s_ah + rows[:, None] * s_at + cols[None, :], beta[:, None] * dkk * decay, mask=m2)
        tl.store(Qd_ptr + i_h * s_ah + rows[:, None] * s_at + cols[None, :], dqk * decay, mask=m2)
        tl.store(A_ptr + i_h * s_ah + rows * s_at, beta * kk0 * decay0, mask=mr)
        tl.store(Qd_ptr + i_h * s_ah + rows * s_at, qk0 * decay0, mask=mr)
        tl.store(G_ptr + i_h * s_Gh + rows, Gr, mask=mr)
        tl.store(Qd_ptr + i_h * s_ah, tl.sum(q0k0, 0), mask=first)
        tl.store(G_ptr + i_h * s_Gh, G0, mask=first)


@triton.jit
def _tree_rule_kernel(
    q_ptr, k_ptr, v_ptr, beta_ptr, state_ptr, A_ptr, Qd_ptr, G_ptr, anc_ptr, steps_ptr, o_ptr, delta_ptr,
    T, K, V, REP,
    s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_bt, s_sh, s_sk, s_ah, s_at, s_Gh, s_nt, s_ot, s_oh, s_dt, s_dh,
    TP: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr, BS: tl.constexpr, FROM: tl.constexpr,
    PRECISION: tl.constexpr, FULL: tl.constexpr,
):
    i_v, i_h = tl.program_id(0), tl.program_id(1)
    i_k = i_h // REP
    rows = 1 + tl.arange(0, TP)
    mr = _below(rows, T, FULL)
    cv = i_v * BV + tl.arange(0, BV)
    mv = _below(cv, V, FULL)
    m2 = mr[:, None] & mv[None, :]
    # q S_c and k S_c for this block of value columns (the root's row apart)
    qs = tl.zeros([TP, BV], dtype=tl.float32)
    ks = tl.zeros([TP, BV], dtype=tl.float32)
    qs0 = tl.zeros([BV], dtype=tl.float32)
    ks0 = tl.zeros([BV], dtype=tl.float32)
    for c0 in range(0, K, BK):
        cols = c0 + tl.arange(0, BK)
        mc = _below(cols, K, FULL)
        S = tl.load(state_ptr + i_h * s_sh + cols[:, None] * s_sk + cv[None, :], mask=mc[:, None] & mv[None, :],
                    other=0.0)
        qc, kc, q0, k0 = _qk_slice(q_ptr, k_ptr, rows, mr, cols, mc, i_k, s_qt, s_qh, s_kt, s_kh)
        qs, ks = _dot_pair(qc, kc, S, qs, ks, PRECISION)
        qs0 += tl.sum(q0[:, None] * S, 0)
        ks0 += tl.sum(k0[:, None] * S, 0)
    eG = tl.exp(tl.load(G_ptr + i_h * s_Gh + rows, mask=mr, other=0.0))
    eG0 = tl.exp(tl.load(G_ptr + i_h * s_Gh))
    beta = tl.load(beta_ptr + rows * s_bt + i_h, mask=mr, other=0.0)
    beta0 = tl.load(beta_ptr + i_h)
    v = tl.load(v_ptr + rows[:, None] * s_vt + i_h * s_vh + cv[None, :], mask=m2, other=0.0)
    v0 = tl.load(v_ptr + i_h * s_vh + cv, mask=mv, other=0.0)
    d0 = beta0 * (v0 - eG0 * ks0)  # the root's right-hand side, which is its delta
    rhs = beta[:, None] * (v - eG[:, None] * ks)
    blocked = False
    if BS < TP:
        # a deep enough tree (the count is the device's: one launch for all); FROM 0: always, and the level
        # repetition over every row is not compiled in at all
        blocked = (tl.load(steps_ptr) >= FROM) | (FROM == 0)
    if blocked:
        _solve_blocked(A_ptr, Qd_ptr, anc_ptr, steps_ptr, o_ptr, delta_ptr, i_h, T, rows, mr, cv, mv, rhs, d0,
                       eG[:, None] * qs, eG0 * qs0, s_ah, s_at, s_nt, s_ot, s_oh, s_dt, s_dh, TP, BS, PRECISION, FULL)
    else:
        _solve_rows(A_ptr, Qd_ptr, steps_ptr, o_ptr, delta_ptr, i_h, rows, mr, cv, mv, rhs, d0, eG[:, None] * qs,
                    eG0 * qs0, s_ah, s_at, s_ah, s_at, s_ot, s_oh, s_dt, s_dh, PRECISION)


def tree_rule_triton(q, k, v, g, beta, state, anc_float, steps, *, block_v: int | None = None,
                     block_r: int | None = None, block_s: int | None = None, blocked_from: int | None = None,
                     precision: str = PRECISION, warps: int | None = None, group: bool | None = None):
    """parallel.tree_delta_rule_masked in two launches (the parts, then the products with the state and the
    solve). q, k [T, Hk, K] (Hk dividing H); v [T, H, V]; g, beta [T, H]; state [H, K, V]; anc_float [T, T]
    (ancestor-or-self, nodes parents first); all fp32; steps: [] int on the device, at least the tree's depth - 1
    (parallel.solve_steps). T <= MAX_T. `block_s`: the solve's rows a block (SOLVE_BLOCK by row tile; the whole
    tile: one block, the level repetition over every row), taken where `steps` is at least `blocked_from`
    (BLOCKED_FROM by row tile; a shallower tree repeats its few levels over every row). `warps`: a program's in
    the solve's kernel (by row tile: 8 from 128 rows, else 4); `group`: the parts kernel's (tree_parts_triton).
    `precision`: the products' (PRECISIONS). Returns o, delta [T, H, V]."""
    T, Hk, K = k.shape
    H, V = v.shape[1], v.shape[2]
    if (q.shape != k.shape or v.shape[0] != T or H % Hk or g.shape != (T, H) or beta.shape != (T, H)
            or state.shape != (H, K, V) or anc_float.shape != (T, T) or T > MAX_T or steps.numel() != 1):
        raise ValueError(f"tree_rule_triton: shapes q {tuple(q.shape)} k {tuple(k.shape)} v {tuple(v.shape)} "
                         f"g {tuple(g.shape)} beta {tuple(beta.shape)} state {tuple(state.shape)} anc "
                         f"{tuple(anc_float.shape)} steps {tuple(steps.shape)} (at most {MAX_T} positions)")
    q, k, v, state, anc_float = (_last_contiguous(x) for x in (q, k, v, state, anc_float))
    g, beta = g.contiguous(), beta.contiguous()
    steps = steps.reshape(()).to(torch.int32)
    dev = v.device
    o = torch.empty(T, H, V, dtype=torch.float32, device=dev)
    delta = torch.empty_like(o)
    TP, BV, tile_warps = _tiles(T, V, block_v, RULE_BLOCK_V)
    BS = min(TP, max(16, triton.next_power_of_2(block_s or SOLVE_BLOCK.get(TP, TP))))
    FROM = int(BLOCKED_FROM.get(TP, 0) if blocked_from is None else blocked_from)
    A, Qd, G = tree_parts_triton(q, k, g, beta, anc_float, H, block_r=block_r, precision=precision, group=group)
    _tree_rule_kernel[(triton.cdiv(V, BV), H)](
        q, k, v, beta, state, A, Qd, G, anc_float, steps, o, delta,
        T, K, V, H // Hk,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), beta.stride(0),
        state.stride(0), state.stride(1), A.stride(0), A.stride(1), G.stride(0), anc_float.stride(0), o.stride(0),
        o.stride(1), delta.stride(0), delta.stride(1),
        TP=TP, BV=BV, BK=BLOCK_K, BS=BS, FROM=FROM, PRECISION=_checked(precision),
        FULL=T == TP + 1 and V % BV == 0 and K % BLOCK_K == 0,
        num_warps=warps or tile_warps,
    )
    return o, delta


def tree_parts_triton(q, k, g, beta, anc_float, H: int, *, block_r: int | None = None, precision: str = PRECISION,
                      warps: int | None = None, group: bool | None = None):
    """tree_rule_triton's first launch alone (`_tree_parts_kernel`): A, Qd [H, T, T] and the path sums G [H, T], from
    the inputs as tree_rule_triton has made them (last dimension contiguous; g and beta contiguous). `block_r`: rows
    a program (PARTS_BLOCK_R by row tile, PARTS_GROUP_BLOCK_R by key head); `warps`: a program's (4, or
    PARTS_GROUP_WARPS by key head); `group`: a program per key head, its value heads' products made once (PARTS_GROUP
    by row tile: from 129 positions), else a program per value head."""
    T, Hk, K = k.shape
    A = torch.empty(H, T, T, dtype=torch.float32, device=k.device)
    Qd = torch.empty_like(A)
    G = torch.empty(H, T, dtype=torch.float32, device=k.device)
    TP = _row_tile(T)
    grouped = PARTS_GROUP.get(TP, False) if group is None else bool(group)
    BR = min(TP, block_r or (PARTS_GROUP_BLOCK_R if grouped else PARTS_BLOCK_R).get(TP, 16))
    _tree_parts_kernel[(TP // BR, Hk if grouped else H)](
        q, k, g, beta, anc_float, A, Qd, G,
        T, K, H // Hk,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), g.stride(0), beta.stride(0), anc_float.stride(0),
        A.stride(0), A.stride(1), G.stride(0),
        TP=TP, BR=BR, BK=BLOCK_K, PRECISION=_checked(precision), GROUP=grouped, FULL=T == TP + 1 and K % BLOCK_K == 0,
        num_warps=warps or (PARTS_GROUP_WARPS.get(TP, 4) if grouped else 4),
    )
    return A, Qd, G

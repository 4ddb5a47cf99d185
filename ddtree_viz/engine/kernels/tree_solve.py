"""The tree delta rule's sequential part in one Triton kernel: the unit-triangular solve and the output product.

gdn_tree.tree_delta_rule_parts computes, per value head and with cuBLAS's batched GEMMs and fused elementwise
work (all parallel), the system and the output's pieces:

    A    [H, T, T]  beta_i exp(G_i - G_j) k_i.k_j for j an ancestor-or-self of i (the strict lower part is read)
    Qd   [H, T, T]  exp(G_i - G_j) q_i.k_j for j an ancestor-or-self of i, 0 elsewhere
    rhs  [H, T, V]  beta * (v - exp(G) K S_c)
    base [H, T, V]  exp(G) Q S_c

and what is left is  (I + A) delta = rhs,  o = base + Qd delta  (gdn_tree.tree_solve does it with
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
- Then o = base + Qd delta, the root's column as a rank-one term.

All arithmetic is fp32. tl.dot runs in "tf32x3" by default: each fp32 product as three TF32 tensor-core products
(hi.hi + hi.lo + lo.hi), which keeps fp32 accuracy (on an H200 at Qwen3.6-27B shapes its largest difference from the
torch form, 9.5e-7 at 65 positions, equals "ieee"'s) at 16 us a layer against 41 us for "ieee"'s CUDA-core
products and 47 us for cuBLAS's solve + bmm (docs/PERFORMANCE.md section 6). In Triton's interpreter (tests on a
CPU) every product is plain fp32.
Shapes (docs/ARCHITECTURE.md's letters): A, Qd [H, T, T]; rhs, base [H, T, V]; steps [] int. Returns o and delta
[T, H, V] fp32 (the layout the rest of the GDN layer reads).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_T = 129  # the root + 128 rows held in registers; larger trees take gdn_tree.tree_solve
BLOCK_V = {64: 16, 128: 64}  # value columns per program by row tile (measured on an H200; others take 16)
PRECISION = "tf32x3"  # tl.dot's input precision: three TF32 products per fp32 product, fp32-accurate (measured)


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
    # the root: no strict ancestor, so its delta is its right-hand side; eliminated from every other row
    d0 = tl.load(rhs_ptr + i_h * s_rh + cv, mask=mv, other=0.0)  # [BV]
    a0 = tl.load(A_ptr + i_h * s_ah + rows * s_at, mask=mr, other=0.0)  # [TP] A[i, 0]
    r = tl.load(rhs_ptr + i_h * s_rh + rows[:, None] * s_rt + cv[None, :], mask=m2, other=0.0)
    r = r - a0[:, None] * d0[None, :]
    strict = mr[:, None] & (rows[:, None] > rows[None, :])  # A's diagonal is not the system's (unit) diagonal
    A = tl.load(A_ptr + i_h * s_ah + rows[:, None] * s_at + rows[None, :], mask=strict, other=0.0)
    d = r
    for _ in range(tl.load(steps_ptr)):  # one level of the tree per repetition
        d = r - tl.dot(A, d, input_precision=PRECISION)
    tl.store(delta_ptr + i_h * s_dh + cv, d0, mask=mv)  # the root's row (position 0)
    tl.store(delta_ptr + rows[:, None] * s_dt + i_h * s_dh + cv[None, :], d, mask=m2)
    # o = base + Qd delta
    qd0 = tl.load(Qd_ptr + i_h * s_qh + rows * s_qt, mask=mr, other=0.0)  # [TP] Qd[i, 0]
    Qd = tl.load(Qd_ptr + i_h * s_qh + rows[:, None] * s_qt + rows[None, :], mask=mr[:, None] & mr[None, :], other=0.0)
    b = tl.load(base_ptr + i_h * s_bh + rows[:, None] * s_bt + cv[None, :], mask=m2, other=0.0)
    o = b + qd0[:, None] * d0[None, :] + tl.dot(Qd, d, input_precision=PRECISION)
    tl.store(o_ptr + rows[:, None] * s_ot + i_h * s_oh + cv[None, :], o, mask=m2)
    q00 = tl.load(Qd_ptr + i_h * s_qh)
    b0 = tl.load(base_ptr + i_h * s_bh + cv, mask=mv, other=0.0)
    tl.store(o_ptr + i_h * s_oh + cv, b0 + q00 * d0, mask=mv)


def _last_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def tree_solve_triton(A, Qd, rhs, base, steps, *, block_v: int | None = None, precision: str = PRECISION):
    """gdn_tree.tree_solve in one kernel launch. A, Qd: [H, T, T]; rhs, base: [H, T, V]; all fp32; steps: [] int
    on the device, at least the tree's depth - 1 (gdn_tree.solve_steps). T <= MAX_T. Returns o, delta [T, H, V]."""
    H, T, V = rhs.shape
    if A.shape != (H, T, T) or Qd.shape != (H, T, T) or base.shape != rhs.shape or T > MAX_T or steps.numel() != 1:
        raise ValueError(f"tree_solve_triton: shapes A {tuple(A.shape)} Qd {tuple(Qd.shape)} rhs {tuple(rhs.shape)} "
                         f"base {tuple(base.shape)} steps {tuple(steps.shape)} (at most {MAX_T} positions)")
    A, Qd, rhs, base = (_last_contiguous(x) for x in (A, Qd, rhs, base))
    steps = steps.reshape(()).to(torch.int32)
    o = torch.empty(T, H, V, dtype=torch.float32, device=rhs.device)
    delta = torch.empty_like(o)
    TP = max(16, triton.next_power_of_2(max(T - 1, 1)))
    BV = max(16, min(block_v or BLOCK_V.get(TP, 16), triton.next_power_of_2(V)))
    _tree_solve_kernel[(triton.cdiv(V, BV), H)](
        A, Qd, rhs, base, steps, o, delta,
        T, V,
        A.stride(0), A.stride(1), Qd.stride(0), Qd.stride(1), rhs.stride(0), rhs.stride(1), base.stride(0),
        base.stride(1), o.stride(0), o.stride(1), delta.stride(0), delta.stride(1),
        TP=TP, BV=BV, PRECISION=precision, num_warps=8 if TP >= 128 else 4,
    )
    return o, delta

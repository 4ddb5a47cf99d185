"""The tree-exact gated delta rule in one Triton kernel: parallel.tree_delta_rule, fused (the forms "triton" and
"triton-tree" of dispatch.py).

Per value head h, with path sums G = M g (M the ancestor-or-self mask, nodes numbered parents first):

    (I + A) delta = beta * (v - exp(G) K S_c),   A[i, j] = beta_i exp(G_i - G_j) k_i.k_j  (j strict ancestor of i)
    o = exp(G) Q S_c + (M * exp(G_i - G_j) * Q K^T) delta

The torch form launches ~25 kernels and two batched triangular solves per GDN layer; here one launch does it.
The grid is (value-column blocks, heads): columns of delta and o are independent (S_c's columns feed only their
own), so each program owns BV columns of one head and recomputes the T x T products it needs (cheap next to
Q S_c and K S_c). A program walks the tree positions in row blocks of BC (parents come first, so block b
depends only on blocks <= b):

    r_b  = beta_b (v_b - exp(G_b) k_b S_c) - sum_{c < b} A_bc delta_c         (off-diagonal blocks, read back)
    delta_b = (I + A_bb)^-1 r_b   with (I + A)^-1 = (I - A)(I + A^2)(I + A^4)...  (A_bb strictly lower: nilpotent,
                                  so log2(BC) - 1 squarings give the exact inverse; matrix products, no row loop;
                                  then one step of iterative refinement, which keeps fp32 accuracy when A's
                                  entries are near 1 and its powers cancel)
    o_b  = exp(G_b) q_b S_c + sum_{c <= b} (q_b k_c^T * decay_bc) delta_c

delta_b is written to the output and read back by later blocks of the same program (a barrier orders the two).
All arithmetic is fp32, and tl.dot runs in full fp32 (input_precision "ieee", not TF32) so that the kernel
agrees with the torch form to float rounding. q and k may have fewer heads than v (grouped heads: value head h
reads key head h // (H / Hq)), so the caller need not repeat them.

Shapes (docs/ARCHITECTURE.md's letters): q, k [T, Hq, K]; v [T, H, V]; g, beta [T, H]; state [H, K, V];
ancestors [T, T] bool (ancestor-or-self, lower triangular). Returns o, delta [T, H, V] fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_T = 16  # tree positions per row block (tl.dot needs >= 16)
BLOCK_V = 32  # value columns per program: H * V / BLOCK_V programs (192 at Qwen3.6-27B shapes)


@triton.jit
def _tree_delta_rule_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, anc_ptr, o_ptr, delta_ptr, G_ptr,
    T, K, V, QK_GROUP,
    s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_gt, s_gh, s_bt, s_bh, s_sh, s_sk, s_at, s_ot, s_oh, s_dt, s_dh, s_Gp,
    BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, LOG2_BC: tl.constexpr, PRECISION: tl.constexpr,
):
    i_v, i_h = tl.program_id(0), tl.program_id(1)
    i_hq = i_h // QK_GROUP
    pid = i_h * tl.num_programs(0) + i_v
    NB = tl.cdiv(T, BC)
    rc = tl.arange(0, BC)
    rk = tl.arange(0, BK)
    cv = i_v * BV + tl.arange(0, BV)
    mk, mv = rk < K, cv < V

    # path sums G_i = sum_{j ancestor-or-self of i} g_j, per row block, kept in this program's scratch row
    G_row = G_ptr + pid * s_Gp
    for b in range(0, NB):
        rb = b * BC + rc
        acc = tl.zeros([BC], dtype=tl.float32)
        for c in range(0, b + 1):
            cb = c * BC + rc
            m = tl.load(anc_ptr + rb[:, None] * s_at + cb[None, :], mask=(rb[:, None] < T) & (cb[None, :] < T), other=0)
            gc = tl.load(g_ptr + cb * s_gt + i_h * s_gh, mask=cb < T, other=0.0)
            acc += tl.sum(tl.where(m != 0, gc[None, :], 0.0), axis=1)
        tl.store(G_row + rb, acc)
    tl.debug_barrier()

    S = tl.load(state_ptr + i_h * s_sh + rk[:, None] * s_sk + cv[None, :], mask=mk[:, None] & mv[None, :], other=0.0)
    strict = rc[:, None] > rc[None, :]
    eye = tl.where(rc[:, None] == rc[None, :], 1.0, 0.0)
    for b in range(0, NB):
        rb = b * BC + rc
        mb = rb < T
        qb = tl.load(q_ptr + rb[:, None] * s_qt + i_hq * s_qh + rk[None, :], mask=mb[:, None] & mk[None, :], other=0.0)
        kb = tl.load(k_ptr + rb[:, None] * s_kt + i_hq * s_kh + rk[None, :], mask=mb[:, None] & mk[None, :], other=0.0)
        vb = tl.load(v_ptr + rb[:, None] * s_vt + i_h * s_vh + cv[None, :], mask=mb[:, None] & mv[None, :], other=0.0)
        bb = tl.load(beta_ptr + rb * s_bt + i_h * s_bh, mask=mb, other=0.0)
        Gb = tl.load(G_row + rb)
        eG = tl.exp(Gb)
        r = bb[:, None] * (vb - eG[:, None] * tl.dot(kb, S, input_precision=PRECISION))
        o = eG[:, None] * tl.dot(qb, S, input_precision=PRECISION)
        for c in range(0, b):  # earlier row blocks: their delta is final
            cb = c * BC + rc
            mc = cb < T
            kc = tl.load(k_ptr + cb[:, None] * s_kt + i_hq * s_kh + rk[None, :], mask=mc[:, None] & mk[None, :], other=0.0)
            dc = tl.load(delta_ptr + cb[:, None] * s_dt + i_h * s_dh + cv[None, :], mask=mc[:, None] & mv[None, :],
                         other=0.0)
            Gc = tl.load(G_row + cb)
            m = tl.load(anc_ptr + rb[:, None] * s_at + cb[None, :], mask=mb[:, None] & mc[None, :], other=0)
            decay = tl.exp(tl.where(m != 0, Gb[:, None] - Gc[None, :], float("-inf")))
            kct = tl.trans(kc)
            r -= tl.dot(bb[:, None] * tl.dot(kb, kct, input_precision=PRECISION) * decay, dc, input_precision=PRECISION)
            o += tl.dot(tl.dot(qb, kct, input_precision=PRECISION) * decay, dc, input_precision=PRECISION)
        # the diagonal block: decay over ancestor-or-self pairs inside it
        m = tl.load(anc_ptr + rb[:, None] * s_at + rb[None, :], mask=mb[:, None] & mb[None, :], other=0)
        decay = tl.exp(tl.where(m != 0, Gb[:, None] - Gb[None, :], float("-inf")))
        kbt = tl.trans(kb)
        A = tl.where(strict, bb[:, None] * tl.dot(kb, kbt, input_precision=PRECISION) * decay, 0.0)
        # (I + A)^-1 = (I - A)(I + A^2)(I + A^4)...(I + A^(BC/2)): A is strictly lower, so A^BC = 0
        inv = eye - A
        P = A
        for _ in tl.static_range(LOG2_BC - 1):
            P = tl.dot(P, P, input_precision=PRECISION)
            inv += tl.dot(inv, P, input_precision=PRECISION)
        d = tl.dot(inv, r, input_precision=PRECISION)
        # one step of iterative refinement: the powers of A cancel in fp32 when its entries are near 1 (nearly
        # parallel keys, beta ~ 1, little decay); the residual of the system itself corrects that
        d += tl.dot(inv, r - d - tl.dot(A, d, input_precision=PRECISION), input_precision=PRECISION)
        tl.store(delta_ptr + rb[:, None] * s_dt + i_h * s_dh + cv[None, :], d, mask=mb[:, None] & mv[None, :])
        tl.debug_barrier()  # later row blocks read this block's delta back
        o += tl.dot(tl.dot(qb, kbt, input_precision=PRECISION) * decay, d, input_precision=PRECISION)
        tl.store(o_ptr + rb[:, None] * s_ot + i_h * s_oh + cv[None, :], o, mask=mb[:, None] & mv[None, :])


def _last_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def tree_delta_rule_triton(q, k, v, g, beta, state, ancestors, *, block_t: int = BLOCK_T, block_v: int = BLOCK_V,
                           precision: str = "ieee"):
    """parallel.tree_delta_rule in one kernel launch. q, k: [T, Hq, K] (Hq divides H); v: [T, H, V]; g, beta: [T, H];
    state: [H, K, V]; all fp32. ancestors: [T, T] bool. Returns o, delta [T, H, V] fp32.

    `precision`: tl.dot's input_precision; "ieee" (full fp32, the default) keeps the torch form's numbers,
    "tf32x3" is a faster near-fp32 alternative to measure."""
    T, Hq, K = q.shape
    H, V = v.shape[1], v.shape[2]
    if H % Hq or k.shape != q.shape or state.shape != (H, K, V) or ancestors.shape != (T, T):
        raise ValueError(f"tree_delta_rule_triton: shapes q {tuple(q.shape)} k {tuple(k.shape)} v {tuple(v.shape)} "
                         f"state {tuple(state.shape)} ancestors {tuple(ancestors.shape)}")
    if block_t < 16 or block_t & (block_t - 1):
        raise ValueError("block_t must be a power of two >= 16")
    q, k, v, state = (_last_contiguous(x) for x in (q, k, v, state))
    anc = ancestors.contiguous().view(torch.uint8) if ancestors.dtype == torch.bool else (ancestors != 0).to(torch.uint8)
    o = torch.empty(T, H, V, dtype=torch.float32, device=v.device)
    delta = torch.empty_like(o)
    BK = max(16, triton.next_power_of_2(K))
    BV = max(16, min(block_v, triton.next_power_of_2(V)))
    NV = triton.cdiv(V, BV)
    G = torch.empty(H * NV, triton.cdiv(T, block_t) * block_t, dtype=torch.float32, device=v.device)  # scratch
    _tree_delta_rule_kernel[(NV, H)](
        q, k, v, g, beta, state, anc, o, delta, G,
        T, K, V, H // Hq,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), g.stride(1),
        beta.stride(0), beta.stride(1), state.stride(0), state.stride(1), anc.stride(0), o.stride(0), o.stride(1),
        delta.stride(0), delta.stride(1), G.stride(0),
        BC=block_t, BK=BK, BV=BV, LOG2_BC=block_t.bit_length() - 1, PRECISION=precision,
        num_warps=4,
    )
    return o, delta

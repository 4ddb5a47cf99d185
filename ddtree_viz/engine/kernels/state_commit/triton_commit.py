"""The commit's recurrent-state update for every GDN layer at once in one Triton launch (RunnerForms.commit).

closed_form.commit_recurrent advances each layer's state along the accepted path in its closed form,

    S <- e^{G_end} S + sum_{p < length} e^{G_end - G_p} k_p delta_p^T,    G_p = g_{path_0} + ... + g_{path_p},

as a batched matmul into a temporary and a pass that reads it, the state, and writes the state: at Qwen3.6-27B
shapes (48 layers x 48 heads of [128, 128] fp32, 151 MB) about 230 us a commit, compiled (docs/lab/NOTEBOOK.md
section 26).
Here each program holds a [K, BLOCK_V] tile of one layer's head and adds the path's terms to it, one rank-one
product a step (fp32; the steps past `length`, read on the device so that a CUDA graph serves every path, masked
off), then writes it back: the state read once and written once, 111 us for a path of one step on an H200, 161
for eight. The same sums in another order (tests/test_step_kernel.py).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

BLOCK_V = 32  # value columns a program (fewer where V has fewer factors of two); 4 warps (section 26: the fastest)


@triton.jit
def _commit_kernel(S_ptr, k_ptr, g_ptr, d_ptr, path_ptr, length_ptr, s_sl, s_sh, s_sk, s_kl, s_kt, s_kh, s_gl,
                   s_gt, s_dl, s_dt, s_dh, H, P, REP: tl.constexpr, K: tl.constexpr, BV: tl.constexpr,
                   PP: tl.constexpr):
    lh = tl.program_id(0)
    l, h = lh // H, lh % H
    ck = tl.arange(0, K)
    cv = tl.program_id(1) * BV + tl.arange(0, BV)
    cp = tl.arange(0, PP)
    length = tl.load(length_ptr)
    valid = (cp < length) & (cp < P)  # the path's steps (the padding after adds nothing)
    node = tl.load(path_ptr + cp, mask=valid, other=0)
    G = tl.cumsum(tl.load(g_ptr + l * s_gl + node * s_gt + h, mask=valid, other=0.0), 0)  # the path's decay sums
    end = tl.sum(tl.where(cp == PP - 1, G, 0.0), 0)
    w = tl.where(valid, tl.exp(end - G), 0.0)
    tile = S_ptr + l * s_sl + h * s_sh + ck[:, None] * s_sk + cv[None, :]
    acc = tl.exp(end) * tl.load(tile)
    for p in tl.static_range(PP):  # the path's terms, each a rank-one product (its loads independent of the sums)
        on = (p < length) & (p < P)
        at = tl.load(path_ptr + p, mask=on, other=0)
        kp = tl.load(k_ptr + l * s_kl + at * s_kt + (h // REP) * s_kh + ck, mask=on & (ck < K), other=0.0)
        d = tl.load(d_ptr + l * s_dl + at * s_dt + h * s_dh + cv, mask=on & (cv >= 0), other=0.0)
        acc += (kp * tl.sum(tl.where(cp == p, w, 0.0), 0))[:, None] * d[None, :]
    tl.store(tile, acc)


def commit_recurrent_triton(rec_all, k, g, delta, path, steps, length) -> None:
    """closed_form.commit_recurrent in one launch, in place: rec_all [Lg, H, K, V] fp32; k [Lg, T, H or Hk, K]; g
    [Lg, T, H]; delta [Lg, T, H, V]; path [P] (padded); steps [P] (unused: the kernel stops at `length`); length []."""
    Lg, H, K, V = rec_all.shape
    if K & (K - 1) or any(x.stride(-1) != 1 for x in (rec_all, k, g, delta)):
        raise ValueError(f"commit_recurrent_triton takes a power-of-two K ({K}) and unit strides along K, V and H")
    bv = math.gcd(V, BLOCK_V)  # value columns a program: a power of two that divides V
    P = path.shape[0]
    _commit_kernel[(Lg * H, V // bv)](rec_all, k, g, delta, path, length, *rec_all.stride()[:3], *k.stride()[:3],
                                      *g.stride()[:2], *delta.stride()[:3], H, P, REP=H // k.shape[2], K=K, BV=bv,
                                      PP=triton.next_power_of_2(P), num_warps=4)

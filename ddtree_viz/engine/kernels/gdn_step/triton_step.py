"""A GDN layer's one-node pass (a greedy step) between its projections and out_proj in one Triton launch; and for a
tree, its part before the delta rule (conv, l2 norms, gates) in one launch (`gdn_prep_triton`, below).

The torch form (naive.gdn_step_reference, compiled: engine/fused.py's gdn_core at T = 1) runs it as six kernels
a layer: the conv over the window, the l2 norms and gates, the one-step delta rule (two reductions), the gated norm;
at Qwen3.6-27B shapes ~17 us a layer and ~0.8 ms over a step's 48 GDN layers, with their spacing
(docs/lab/NOTEBOOK.md section 26). Here one program per value head does all of it from registers:

    window   the node's conv window by `gather` (its row: columns of (committed conv inputs, u), as tree_conv reads)
    conv     sum_j w_j x_j per channel, SiLU, for the head's q and k channels (its key head's) and its v channels
    q, k     l2-normalised (q / sqrt(K)); beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias)
    rule     S' = e^g S (S: the committed state [K, V], read once, not written: the commit applies it),
             delta = beta (v - S'^T k), o = S'^T q + (q.k) delta            (naive.delta_rule_step's arithmetic)
    norm     the gated RMSNorm over the head's V values, scaled, gated by SiLU(z)

with the torch form's roundings to the model's dtype where it rounds (each conv product and sum, the SiLU, beta,
the core before the norm, the normalised values and their scaling, the output), so the two differ only in the
order of fp32 sums (tests/test_step_kernel.py holds them together, in Triton's interpreter on a CPU and at 27B
shapes on a GPU): 4.8 us a layer on an H200. Returns what the commit keeps: k at its key heads [1, Hk, K], g [1, H],
delta [1, H, V] (fp32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rounded(x, DT: tl.constexpr):
    """x (fp32) rounded to the model's dtype where the torch form holds it there (a no-op for fp32), as fp32. To
    bf16 by its bits (to nearest, ties to even, as the hardware's conversion: Triton's interpreter truncates)."""
    if DT == tl.bfloat16:
        bits = x.to(tl.int32, bitcast=True)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) & -0x10000).to(tl.float32, bitcast=True)
    else:
        return x.to(DT).to(tl.float32)


@triton.jit
def _window_conv(u_ptr, cs_ptr, cw_ptr, gather_ptr, c, s_u, s_cs, s_cw, KW: tl.constexpr, DT: tl.constexpr):
    """tree_conv for one node's channels `c`: sum over its window (gather's row: < KW a committed conv column, KW + i
    the tree's node i's u) of weight * input, each product and the sum rounded to DT, then SiLU, rounded."""
    acc = tl.zeros(c.shape, tl.float32)
    for j in tl.static_range(KW):
        col = tl.load(gather_ptr + j)
        committed = tl.load(cs_ptr + c * s_cs + tl.minimum(col, KW - 1)).to(tl.float32)
        own = tl.load(u_ptr + tl.maximum(col - KW, 0) * s_u + c).to(tl.float32)
        x = tl.where(col < KW, committed, own)
        acc += _rounded(x * tl.load(cw_ptr + c * s_cw + j).to(tl.float32), DT)
    acc = _rounded(acc, DT)
    return _rounded(acc / (1.0 + tl.exp(-acc)), DT)


@triton.jit
def _l2normed(x):
    """x / |x|, as naive.l2norm (its eps under the root)."""
    return x * tl.rsqrt(tl.sum(x * x, 0) + 1e-6)


@triton.jit
def _gates(b_ptr, a_ptr, dt_ptr, A_log_ptr, h, DT: tl.constexpr):
    """A value head's beta = sigmoid(b) (rounded to DT, as the torch form's) and g = -exp(A_log) softplus(a +
    dt_bias), from the row's b and a."""
    beta = _rounded(1.0 / (1.0 + tl.exp(-tl.load(b_ptr + h).to(tl.float32))), DT)
    x = tl.load(a_ptr + h).to(tl.float32) + tl.load(dt_ptr + h).to(tl.float32)
    e = tl.exp(-tl.abs(x))  # softplus(x) = max(x, 0) + log1p(e^-|x|); log1p's series where log(1 + e) loses e
    soft = tl.maximum(x, 0.0) + tl.where(e < 1e-4, e * (1.0 - 0.5 * e), tl.log(1.0 + e))
    soft = tl.where(x > 20.0, x, soft)  # torch's threshold
    return beta, -tl.exp(tl.load(A_log_ptr + h).to(tl.float32)) * soft


@triton.jit
def _gdn_step_kernel(u_ptr, z_ptr, b_ptr, a_ptr, cs_ptr, cw_ptr, gather_ptr, A_log_ptr, dt_ptr, S_ptr, nw_ptr,
                     o_ptr, k_ptr, g_ptr, delta_ptr, s_cs, s_cw, s_sh, s_sk, q_scale, eps,
                     KEY_DIM: tl.constexpr, K: tl.constexpr, V: tl.constexpr, REP: tl.constexpr, KW: tl.constexpr,
                     DT: tl.constexpr, ROUND_SCALED: tl.constexpr):
    h = tl.program_id(0)
    hk = h // REP
    ck = tl.arange(0, K)
    cv = tl.arange(0, V)
    q = _window_conv(u_ptr, cs_ptr, cw_ptr, gather_ptr, hk * K + ck, 0, s_cs, s_cw, KW, DT)
    k = _window_conv(u_ptr, cs_ptr, cw_ptr, gather_ptr, KEY_DIM + hk * K + ck, 0, s_cs, s_cw, KW, DT)
    v = _window_conv(u_ptr, cs_ptr, cw_ptr, gather_ptr, 2 * KEY_DIM + h * V + cv, 0, s_cs, s_cw, KW, DT)
    q = _l2normed(q) / q_scale
    k = _l2normed(k)
    tl.store(k_ptr + hk * K + ck, k, mask=(ck < K) & (h % REP == 0))  # the key head's first value head writes it
    beta, g = _gates(b_ptr, a_ptr, dt_ptr, A_log_ptr, h, DT)
    tl.store(g_ptr + h, g)
    S = tl.load(S_ptr + h * s_sh + ck[:, None] * s_sk + cv[None, :]) * tl.exp(g)  # [K, V], decayed
    delta = beta * (v - tl.sum(S * k[:, None], 0))
    tl.store(delta_ptr + h * V + cv, delta)
    core = _rounded(tl.sum(S * q[:, None], 0) + tl.sum(q * k, 0) * delta, DT)
    normed = _rounded(core * tl.rsqrt(tl.sum(core * core, 0) / V + eps), DT)
    scaled = normed * tl.load(nw_ptr + cv).to(tl.float32)
    if ROUND_SCALED:  # the weight's and dtype's product is held in the model's dtype (bf16 * bf16)
        scaled = _rounded(scaled, DT)
    z = tl.load(z_ptr + h * V + cv).to(tl.float32)
    tl.store(o_ptr + h * V + cv, _rounded(scaled * (z / (1.0 + tl.exp(-z))), DT).to(DT))  # exact: rounded


@triton.jit
def _gdn_prep_kernel(u_ptr, b_ptr, a_ptr, cs_ptr, cw_ptr, gather_ptr, A_log_ptr, dt_ptr, q_ptr, k_ptr, v_ptr, g_ptr,
                     beta_ptr, s_u, s_b, s_a, s_cs, s_cw, q_scale, KEY_DIM: tl.constexpr, K: tl.constexpr,
                     V: tl.constexpr, HK: tl.constexpr, REP: tl.constexpr, KW: tl.constexpr, DT: tl.constexpr):
    t, hk = tl.program_id(0), tl.program_id(1)
    ck = tl.arange(0, K)
    cv = tl.arange(0, V)
    window = gather_ptr + t * KW
    q = _window_conv(u_ptr, cs_ptr, cw_ptr, window, hk * K + ck, s_u, s_cs, s_cw, KW, DT)
    k = _window_conv(u_ptr, cs_ptr, cw_ptr, window, KEY_DIM + hk * K + ck, s_u, s_cs, s_cw, KW, DT)
    tl.store(q_ptr + (t * HK + hk) * K + ck, _l2normed(q) / q_scale)
    tl.store(k_ptr + (t * HK + hk) * K + ck, _l2normed(k))
    for r in tl.static_range(REP):  # the key head's value heads
        h = hk * REP + r
        v = _window_conv(u_ptr, cs_ptr, cw_ptr, window, 2 * KEY_DIM + h * V + cv, s_u, s_cs, s_cw, KW, DT)
        tl.store(v_ptr + (t * HK * REP + h) * V + cv, v)
        beta, g = _gates(b_ptr + t * s_b, a_ptr + t * s_a, dt_ptr, A_log_ptr, h, DT)
        tl.store(beta_ptr + t * HK * REP + h, beta)
        tl.store(g_ptr + t * HK * REP + h, g)


_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def _row(x: torch.Tensor) -> torch.Tensor:
    """A one-row input with unit stride along its values (a fused GEMM's split outputs are)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def gdn_step_triton(u, z, b, a, conv_state, state, gather, conv_weight, A_log, dt_bias, norm_weight, *,
                    key_dim: int, head_k: int, head_v: int, rep: int, eps: float):
    """The one-node core (dispatch.choose_step's): u [1, C], z [1, H*V], b, a [1, H]; conv_state [C, kernel];
    state [H, K, V] fp32 (read only); gather [1, kernel]; the layer's weights as GDNWeights holds them. Returns
    (o [1, H*V] in z's dtype, k [1, Hk, K], g [1, H], delta [1, H, V]), naive.gdn_step_reference's outputs but for
    k, kept at its key heads (the commit repeats it)."""
    H, K, V, kw = state.shape[0], head_k, head_v, conv_weight.shape[1]
    if u.shape[0] != 1 or K & (K - 1) or V & (V - 1) or state.stride(2) != 1 or conv_state.stride(1) != 1:
        raise ValueError(f"gdn_step_triton takes one node, power-of-two head dims and row-major state (K={K}, V={V})")
    dev = u.device
    o = torch.empty(1, H * V, dtype=z.dtype, device=dev)
    k = torch.empty(1, H // rep, K, dtype=torch.float32, device=dev)
    g = torch.empty(1, H, dtype=torch.float32, device=dev)
    delta = torch.empty(1, H, V, dtype=torch.float32, device=dev)
    dt = _DTYPES[z.dtype]
    round_scaled = torch.promote_types(norm_weight.dtype, z.dtype) == z.dtype and z.dtype != torch.float32
    weight = conv_weight.contiguous()
    _gdn_step_kernel[(H,)](_row(u), _row(z), _row(b), _row(a), conv_state, weight, gather.contiguous(), A_log,
                           dt_bias, state, norm_weight, o, k, g, delta, conv_state.stride(0), weight.stride(0),
                           state.stride(0), state.stride(1), float(K) ** 0.5, float(eps), KEY_DIM=key_dim, K=K, V=V,
                           REP=rep, KW=kw, DT=dt, ROUND_SCALED=round_scaled, num_warps=4)
    return o, k, g, delta


def gdn_prep_triton(u, b, a, conv_state, gather, conv_weight, A_log, dt_bias, *, key_dim: int, head_k: int,
                    head_v: int, rep: int):
    """naive.gdn_prep (with q and k at their key heads) for a tree's T nodes in one launch (RunnerForms.gdn_prep):
    u [T, C], b, a [T, H]; conv_state [C, kernel]; gather [T, kernel] (TreeIndex.conv_gather's windows); the layer's
    weights as GDNWeights holds them. Returns q, k [T, Hk, K], v [T, H, V], g, beta [T, H], all fp32."""
    T, K, V, kw = u.shape[0], head_k, head_v, conv_weight.shape[1]
    Hk = key_dim // K
    if K & (K - 1) or V & (V - 1) or any(x.stride(1) != 1 for x in (u, b, a, conv_state)):
        raise ValueError(f"gdn_prep_triton takes power-of-two head dims and unit strides along channels (K={K}, V={V})")
    f32 = dict(dtype=torch.float32, device=u.device)
    q, k, v = torch.empty(T, Hk, K, **f32), torch.empty(T, Hk, K, **f32), torch.empty(T, Hk * rep, V, **f32)
    g, beta = torch.empty(T, Hk * rep, **f32), torch.empty(T, Hk * rep, **f32)
    weight = conv_weight.contiguous()
    _gdn_prep_kernel[(T, Hk)](u, b, a, conv_state, weight, gather.contiguous(), A_log, dt_bias, q, k, v, g, beta,
                              u.stride(0), b.stride(0), a.stride(0), conv_state.stride(0), weight.stride(0),
                              float(K) ** 0.5, KEY_DIM=key_dim, K=K, V=V, HK=Hk, REP=rep, KW=kw, DT=_DTYPES[u.dtype],
                              num_warps=4)
    return q, k, v, g, beta

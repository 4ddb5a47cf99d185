"""Fewer, larger GEMMs: projections that read the same input fused into one weight, built once.

A decode step is a few hundred thin GEMMs; each launch costs more than its share of the weight read when the
matrix is small (a GDN layer's in_proj_b / in_proj_a are 48 rows). Fusing the projections of one input makes
one GEMM of them:

    GDN        in_proj_qkv + in_proj_z + in_proj_b + in_proj_a   (hidden -> u, z, b, a)
    attention  q_proj (query + gate) + k_proj + v_proj
    MLP        gate_proj + up_proj

FP8 weights kept (engine/weights/fp8.py's Fp8Linear) fuse the same way, bytes and block scales stacked
(FusedFp8Linear, the Triton GEMM on CUDA), and so do 4-bit weights kept (engine/weights/int4_common.py's Int4Linear:
words, scales and zero points stacked, FusedInt4Linear); a group of two kinds (the official FP8 layout keeps
in_proj_b / in_proj_a in bf16) is one fused GEMM per run of one kind (FusedRuns). Each kind's rules (what fuses with
what, where a run must end, its fused form) are its weight format's fast layout (weights.registry.layout_of); this
module names none. Every fused kind is called alike: x -> the parts' outputs.

Memory: the fused weight *is* the storage. Each original Linear's weight becomes a Parameter viewing its rows of
the fused matrix, so the model (transformers' own forward, the prefill, the transformers engine) computes with
the same numbers and no byte is duplicated; building it copies one group at a time, so the transient cost is
one layer's projections, not a second model (+~50 GB at 27B). Fusing is idempotent: a group already fused (its
weights still view one fused matrix) is reused, so several runners on one target share it.

Fewer elementwise kernels: between its GEMMs a layer ran ~60 small kernels per token in eager PyTorch (norms
with their fp32 round trips, the GDN conv, l2 norms, gates, the one-step delta rule, rope, the softmax, SiLU, the
residual adds). The second half of this module holds those pieces as pure functions of tensors and numbers
(weights and state are arguments, never closures over modules); those that are a kernel's torch form (the norms,
the GDN prep, one-step rule and gated norm, the commit) live beside their kernel in engine/kernels/ and are
imported here, so that `compiled(fn)` (torch.compile, inductor,
no CUDA graphs of its own: the runner captures its own) fuses each into a few kernels and one compiled graph
serves every layer of a kind. The GEMMs stay outside them (cuBLAS, as before). The static runner calls these same
functions either way (`Pieces`): through torch.compile when `RunnerForms.compile` is on, as they are otherwise
(a CPU's numbers); tests/test_runner.py holds the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.qwen3_5.modeling_qwen3_5 import apply_rotary_pos_emb

# the kernels' torch forms: the pieces below are made of them, and the runner calls them as this module's (fz.<name>)
from .kernels.add_norm.naive import add_rms_norm, rms_norm  # noqa: F401
from .kernels.device import device_error
from .kernels.gdn_step.naive import delta_rule_step, gated_norm, gdn_prep
from .kernels.gdn_tree.parallel import tree_delta_rule_masked, tree_delta_rule_parts
from .kernels.state_commit.closed_form import commit_conv, commit_recurrent, commit_state  # noqa: F401
from .weights.plain import FusedLinear
from .weights.registry import layout_of

GDN_PROJECTIONS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj")
MLP_PROJECTIONS = ("gate_proj", "up_proj")


@dataclass(frozen=True)
class FusedRuns:
    """A group whose parts are not all of one kind (an FP8 checkpoint's bf16 in_proj_b / in_proj_a beside its FP8
    in_proj_qkv / in_proj_z) or do not stack in whole FP8 scale blocks: one fused GEMM per run of parts, the outputs
    in the parts' order; at one row on CUDA a last plain run in the launch of the run before it where that run's
    kind carries it (`ride`: the FP8 kind's, fp8.riding_linear)."""

    runs: tuple  # a fused kind (FusedLinear, FusedFp8Linear, FusedInt4Linear) for `counts[i]` consecutive parts each
    counts: tuple[int, ...]

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        *head, last, plain = self.runs
        if isinstance(plain, FusedLinear):
            y = last.ride(x, plain)
            if y is not None:  # one row on CUDA: the last plain run in the product's launch before it
                return tuple(y for run in head for y in run(x)) + y.split(last.sizes + plain.sizes, dim=-1)
        return tuple(y for run in self.runs for y in run(x))


def _kind(m: nn.Module):
    """What a part fuses with: plain bias-free Linears of one dtype, bias-free Fp8Linears of one scale block, or
    bias-free Int4Linears of one group size, zero-point scheme and scale dtype without activation order (each
    column's group its own): its layout's key (weights.registry.layout_of); None for anything else (quantised some
    other way, with a bias, hooked)."""
    if getattr(m, "_hf_hook", None) is not None or getattr(m, "bias", None) is not None:
        return None
    layout = layout_of(m)
    return None if layout is None else layout.key(m)


def fusable(owner: nn.Module, names: tuple[str, ...]) -> bool:
    """Bias-free Linears (plain, FP8- or 4-bit-kept) of one input width and device."""
    mods = [getattr(owner, n, None) for n in names]
    if any(m is None or _kind(m) is None for m in mods):
        return False
    return len({m.in_features for m in mods}) == 1 and len({next(m.parameters()).device for m in mods}) == 1


def _whole(m: nn.Module) -> bool:
    """Whether a part's rows end where its kind's stacked tensors' rows do: an FP8 part a whole number of scale
    blocks tall (a block would otherwise hold rows of two parts under one scale), a 4-bit part with zero points a
    multiple of 8 rows (they are packed 8 rows to a word): its layout's `whole`."""
    return layout_of(m).whole(m)


def _runs(mods) -> list[list[nn.Module]]:
    """Consecutive parts of one kind, a run broken after a part that is not `_whole`."""
    runs = [[mods[0]]]
    for m in mods[1:]:
        last = runs[-1][-1]
        if _kind(m) == _kind(last) and _whole(last):
            runs[-1].append(m)
        else:
            runs.append([m])
    return runs


def _views_of(storage: torch.Tensor, parts: list[torch.Tensor]) -> bool:
    """The parts are consecutive row blocks of `storage`, covering it."""
    offset, row = 0, storage.stride(0) * storage.element_size()
    for w in parts:
        if w.data_ptr() != storage.data_ptr() + offset * row or w.shape[0] + offset > storage.shape[0]:
            return False
        offset += w.shape[0]
    return offset == storage.shape[0]


def _still_fused(done, mods) -> bool:
    """`done` (a fused group made before) still is the storage of `mods`' weights (and scales, zero points)."""
    runs, counts = (done.runs, done.counts) if isinstance(done, FusedRuns) else ((done,), (len(mods),))
    start = 0
    for run, n in zip(runs, counts):
        part = mods[start:start + n]
        start += n
        for field, attr in run.STACKS.items():
            storage = getattr(run, field)
            if storage is not None and not _views_of(storage, [getattr(m, attr) for m in part]):
                return False
    return start == len(mods)


def _stack(mods, attr: str) -> torch.Tensor | None:
    """The parts' `attr` tensors stacked by rows into one new tensor, each part's `attr` then a Parameter viewing
    its rows of it (the old tensor freed): built one group at a time, no second copy of the model. None where the
    parts hold none (a symmetric 4-bit weight's zero points)."""
    parts = [getattr(m, attr) for m in mods]
    first = parts[0]
    if first is None:
        return None
    storage = torch.empty(sum(p.shape[0] for p in parts), first.shape[1], dtype=first.dtype, device=first.device)
    offset = 0
    for m, p in zip(mods, parts):
        n = p.shape[0]
        storage[offset : offset + n].copy_(p)
        setattr(m, attr, nn.Parameter(storage[offset : offset + n], requires_grad=p.requires_grad))
        offset += n
    return storage


def _fuse_run(mods):
    """One run of parts of one kind as its layout's fused kind, each of its STACKS stacked."""
    layout = layout_of(mods[0])
    stacked = {field: _stack(mods, attr) for field, attr in layout.fused.STACKS.items()}
    return layout.fuse(mods, stacked, tuple(m.out_features for m in mods))


@torch.no_grad()
def fuse_linears(owner: nn.Module, names: tuple[str, ...]):
    """Fuse `owner`'s Linears `names` (in this order) into one weight whose row blocks become their weights (FP8-kept
    parts: their bytes and their scales; 4-bit-kept: their words, scales and zero points); parts of two kinds, or
    quantized parts that do not stack whole (`_whole`), one fused weight per run (FusedRuns). Each is called as x ->
    the parts' outputs. None when they cannot be fused (see `fusable`)."""
    if not fusable(owner, names):
        return None
    mods = [getattr(owner, n) for n in names]
    done = getattr(owner, "_ddtree_fused", {}).get(names)
    if done is not None and _still_fused(done, mods):
        return done
    runs = _runs(mods)
    fused = (_fuse_run(mods) if len(runs) == 1
             else FusedRuns(tuple(_fuse_run(r) for r in runs), tuple(len(r) for r in runs)))
    owner.__dict__.setdefault("_ddtree_fused", {})[names] = fused  # not a submodule or buffer: no state_dict entry
    return fused


# ------------------------------------------------------------------------------------------------------------
# Fused elementwise pieces (torch.compile): pure functions, one compiled graph per kind of layer
# ------------------------------------------------------------------------------------------------------------

_COMPILED: dict = {}
RECOMPILE_LIMIT = 64  # graphs dynamo keeps per compiled piece (its default, 8, is a hard error with fullgraph)


def compiled(fn):
    """`fn` through torch.compile (inductor; fullgraph; no CUDA graphs of its own: the static runner captures
    its own), made once per process and shared by every runner and layer. Dynamo keeps a function's graphs
    guarded on its inputs' shapes, dtypes and strides, so every layer of a kind hits one graph; `dynamic` marks
    (`mark_tree_dims`) make the tree size and the attention length symbolic, so one graph serves every tree size
    and length bucket (and one, specialised, the one-node greedy step)."""
    c = _COMPILED.get(fn)
    if c is None:
        # fullgraph: past dynamo's recompile limit (8 graphs a function by default) a call RAISES instead of running
        # eager. One process may hold several models (the page's compare mode in another dtype, a test suite), each
        # with graphs of its own for every piece: allow enough that a real process never meets the limit
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        # split_reductions off: a norm or softmax of a few rows stays one kernel (not a split pass + a combine pass);
        # emulate_precision_casts: bf16 / fp16 intermediates rounded where eager rounds them (no kernel added), so
        # that the compiled forms stay as close to the eager ones as eager is to transformers' own forward
        c = _COMPILED[fn] = torch.compile(fn, fullgraph=True, dynamic=None,
                                          options={"split_reductions": False, "emulate_precision_casts": True})
    return c


def compiler_failure(exc: BaseException) -> bool:
    """Whether an error raised through the compiled pieces is the compiler's (no C++ compiler, a Triton that fails:
    the pieces may run as they are) and not the device's: running out of memory, or a CUDA error (an illegal
    address, a launch failure), is the pass's own and must reach the caller, not turn compile off and run again
    (under a 24 GB card's cap an out-of-memory would read as "the compiler cannot run here")."""
    return not device_error(exc)


def mark_dynamic(*dims) -> None:
    """(tensor, dim, ...) pairs: compile these dims symbolic (a tree's size, an attention length bucket), not one
    graph per value. Dims of size 1 stay static (the one-node step gets a graph of its own)."""
    for t, d in zip(dims[::2], dims[1::2]):
        if t is not None and t.shape[d] > 1:
            torch._dynamo.maybe_mark_dynamic(t, d)


@dataclass(frozen=True)
class Pieces:
    """How the runner calls the pieces below: the same plain functions, through torch.compile (`compile`) or as they
    are (gpt-fast's habit). `pieces(fn)` is the function to call; `pieces.mark(...)` marks dims dynamic (compiled
    only: `mark_dynamic`)."""

    compile: bool

    def __call__(self, fn):
        return compiled(fn) if self.compile else fn

    def mark(self, *dims) -> None:
        if self.compile:
            mark_dynamic(*dims)


@dataclass(frozen=True)
class GDNWeights:
    """A GDN layer's weights and sizes as the pieces take them (tensors and numbers, never the module)."""

    conv_weight: torch.Tensor  # [C, kernel]
    A_log: torch.Tensor  # [H]
    dt_bias: torch.Tensor  # [H]
    norm_weight: torch.Tensor  # [V] the gated norm's
    dims: dict  # key_dim, head_k, head_v, rep (H / Hk), eps: gdn_core's keywords

    @classmethod
    def of(cls, m: nn.Module) -> "GDNWeights":
        return cls(m.conv1d.weight.detach().squeeze(1), m.A_log.detach(), m.dt_bias.detach(), m.norm.weight.detach(),
                   dict(key_dim=m.key_dim, head_k=m.head_k_dim, head_v=m.head_v_dim,
                        rep=m.num_v_heads // m.num_k_heads, eps=m.norm.variance_epsilon))


def silu_mul(gate, up):
    """The MLP between its two GEMMs: SiLU(gate) * up."""
    return F.silu(gate) * up


def gdn_core(u, z, b, a, conv_state, conv_weight, gather, A_log, dt_bias, state, norm_weight, anc_float, off_path,
             key_dim: int, head_k: int, head_v: int, rep: int, eps: float):
    """A GDN layer between its projections and its out_proj: `gdn_prep`, the delta rule (one step when T = 1, else
    the parallel tree form on the pass's masks) and `gated_norm`. u [T, C], z [T, H*V], b, a [T, H] (projections);
    conv_state [C, kernel]; conv_weight [C, kernel]; gather [T, kernel]; state [H, K, V] fp32; anc_float, off_path
    [T, T] (None when T = 1). Returns (o [T, H*V] for out_proj, k [T, H, K], g [T, H], delta [T, H, V]); the
    state is not touched."""
    q, k, v, g, beta = gdn_prep(u, b, a, conv_state, conv_weight, gather, A_log, dt_bias, key_dim, head_k, head_v, rep)
    if u.shape[0] == 1:
        core, delta = delta_rule_step(q, k, v, g, beta, state)
    else:
        core, delta = tree_delta_rule_masked(q, k, v, g, beta, state, anc_float, off_path)
    return gated_norm(core, z, norm_weight, head_v, eps), k, g, delta


def gdn_tree_parts(u, b, a, conv_state, conv_weight, gather, A_log, dt_bias, state, anc_float, off_path,
                   key_dim: int, head_k: int, head_v: int):
    """`gdn_core` up to the tree solve, for the Triton solve (kernels/gdn_tree/triton_solve.py) to finish: `gdn_prep`
    (q and k on their key heads), then kernels/gdn_tree/parallel.py's tree_delta_rule_parts. Returns (A, Qd [H, T,
    T], rhs, base [H, T, V], k [T, Hk, K] (the commit repeats it), g [T, H])."""
    q, k, v, g, beta = gdn_prep(u, b, a, conv_state, conv_weight, gather, A_log, dt_bias, key_dim, head_k, head_v, 1)
    return (*tree_delta_rule_parts(q, k, v, g, beta, state, anc_float, off_path), k, g)


def attention_prep(qg, k, v, q_scale, k_scale, q_eps: float, k_eps: float, cos, sin, head_dim: int, kv_heads: int):
    """Gated attention between its q/k/v projections and the cache write: the query/gate split, the q and k norms,
    rope. qg [1, T, heads*2*head_dim]; k, v [1, T, kv_heads*head_dim]. Returns (q [1, kv_heads, rep*T, head_dim]
    (query heads of a KV group as rows), k, v [1, kv_heads, T, head_dim], gate [1, T, heads*head_dim])."""
    T = qg.shape[1]
    q, gate = torch.chunk(qg.view(1, T, -1, head_dim * 2), 2, dim=-1)
    gate = gate.reshape(1, T, -1)
    q = rms_norm(q, q_scale, q_eps).transpose(1, 2)
    k = rms_norm(k.view(1, T, -1, head_dim), k_scale, k_eps).transpose(1, 2)
    v = v.view(1, T, -1, head_dim).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    return q.reshape(1, kv_heads, -1, head_dim), k, v, gate


def masked_softmax(scores, mask, scale: float):
    """The eager attention's softmax: fp32, scaled, True in `mask` = not attended; back to the scores' dtype."""
    return (scores.float() * scale).masked_fill(mask, float("-inf")).softmax(-1).to(scores.dtype)


def gate_heads(o, gate, heads: int):
    """Attention's output heads back to [1, T, heads*head_dim], gated by sigmoid(gate) (before o_proj)."""
    T = gate.shape[1]
    return o.reshape(1, heads, T, o.shape[-1]).transpose(1, 2).reshape(1, T, -1) * torch.sigmoid(gate)

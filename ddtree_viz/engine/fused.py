"""Fewer, larger GEMMs: projections that read the same input fused into one weight, built once.

A decode step is a few hundred thin GEMMs; each launch costs more than its share of the weight read when the
matrix is small (a GDN layer's in_proj_b / in_proj_a are 48 rows). Fusing the projections of one input makes
one GEMM of them:

    GDN        in_proj_qkv + in_proj_z + in_proj_b + in_proj_a   (hidden -> u, z, b, a)
    attention  q_proj (query + gate) + k_proj + v_proj
    MLP        gate_proj + up_proj

Memory: the fused weight *is* the storage. Each original Linear's weight becomes a Parameter viewing its rows of
the fused matrix, so the model (transformers' own forward, the prefill, the transformers engine) computes with
the same numbers and no byte is duplicated; building it copies one group at a time, so the transient cost is
one layer's projections, not a second model (+~50 GB at 27B). Fusing is idempotent: a group already fused (its
weights still view one fused matrix) is reused, so several runners on one target share it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

GDN_PROJECTIONS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj")
MLP_PROJECTIONS = ("gate_proj", "up_proj")


@dataclass(frozen=True)
class FusedLinear:
    """One GEMM for several bias-free Linears of the same input: y = x W^T, split into their outputs."""

    weight: torch.Tensor  # [sum of out_features, in_features]
    sizes: tuple[int, ...]

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.nn.functional.linear(x, self.weight).split(self.sizes, dim=-1)


def fusable(owner: nn.Module, names: tuple[str, ...]) -> bool:
    """Plain bias-free Linears of one input width, dtype and device (quantised or hooked layers are left alone)."""
    mods = [getattr(owner, n, None) for n in names]
    if not all(type(m) is nn.Linear and m.bias is None for m in mods):
        return False
    w = [m.weight for m in mods]
    return (len({x.shape[1] for x in w}) == 1 and len({x.dtype for x in w}) == 1 and len({x.device for x in w}) == 1
            and all(getattr(m, "_hf_hook", None) is None for m in mods))


def _views_of(weight: torch.Tensor, mods) -> bool:
    offset, row = 0, weight.stride(0) * weight.element_size()
    for m in mods:
        w = m.weight
        if w.data_ptr() != weight.data_ptr() + offset * row or w.shape[0] + offset > weight.shape[0]:
            return False
        offset += w.shape[0]
    return offset == weight.shape[0]


@torch.no_grad()
def fuse_linears(owner: nn.Module, names: tuple[str, ...]) -> FusedLinear | None:
    """Fuse `owner`'s Linears `names` (in this order) into one weight whose row blocks become their weights.
    None when they cannot be fused (see `fusable`)."""
    if not fusable(owner, names):
        return None
    mods = [getattr(owner, n) for n in names]
    sizes = tuple(m.out_features for m in mods)
    done = getattr(owner, "_ddtree_fused", {}).get(names)
    if done is not None and _views_of(done.weight, mods):
        return done
    first = mods[0].weight
    weight = torch.empty(sum(sizes), first.shape[1], dtype=first.dtype, device=first.device)
    offset = 0
    for m, n in zip(mods, sizes):
        weight[offset : offset + n].copy_(m.weight)
        m.weight = nn.Parameter(weight[offset : offset + n], requires_grad=m.weight.requires_grad)  # frees the old
        offset += n
    fused = FusedLinear(weight, sizes)
    owner.__dict__.setdefault("_ddtree_fused", {})[names] = fused  # not a submodule or buffer: no state_dict entry
    return fused

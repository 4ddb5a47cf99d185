"""Linears quantized at load from plain weights (`--head-weights`: the target's lm_head; models.quantize_head), by
the name a user gives, each kind's quantizer and label in one table (the formats' own functions: fp8.quantize,
int4_common.quantize). A weight is quantized SLICE_ROWS rows at a time, so the float32 transient is one slice, not
the weight (a 27B's lm_head: 168 MB, not 5 GB); both kinds scale within a row or within 128-row blocks, so the
slices' parts stack to the whole weight's (tests/test_head_weights.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from . import fp8, int4_common as int4

SLICE_ROWS = 8192  # rows quantized at a time (a multiple of FP8's 128-row blocks)
INT4_GROUP = 128  # llm-compressor's W4A16 preset: symmetric, a scale per 128 columns of a row
FP8_BLOCK = (128, 128)  # the official FP8 layout's block scales
INT4_SPEC = int4.Int4Spec(INT4_GROUP, True)  # what --draft-weights and --head-weights int4 make
assert SLICE_ROWS % FP8_BLOCK[0] == 0, "a slice must be whole FP8 blocks"


@dataclass(frozen=True)
class AtLoad:
    """One kind: its label (as the target's precision says it) and how a weight [out, in] and its bias become the
    kind's kept Linear."""

    label: str
    make: Callable[[torch.Tensor, torch.Tensor | None, int], nn.Module]


def _int4(weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> nn.Module:
    parts = [int4.quantize(weight[lo:lo + rows], INT4_SPEC) for lo in range(0, weight.shape[0], rows)]
    whole = {name: torch.cat([p[name] for p in parts]) for name in ("weight_packed", "weight_scale")}
    whole["weight_shape"] = torch.tensor(list(weight.shape), dtype=torch.int64, device=parts[0]["weight_shape"].device)
    return int4.Int4Linear(whole, INT4_SPEC, bias)


def _fp8(weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> nn.Module:
    q, scale = zip(*(fp8.quantize(weight[lo:lo + rows], FP8_BLOCK) for lo in range(0, weight.shape[0], rows)))
    return fp8.Fp8Linear(torch.cat(q), torch.cat(scale), FP8_BLOCK, bias)


KINDS = {"int4": AtLoad(INT4_SPEC.scheme, _int4),
         "fp8": AtLoad(f"fp8-e4m3 block {FP8_BLOCK[0]}", _fp8)}


def quantized_linear(weight: torch.Tensor, bias: torch.Tensor | None, kind: str) -> tuple[nn.Module, str]:
    """(the kind's kept Linear of `weight`, its label), quantized SLICE_ROWS rows at a time."""
    at = KINDS[kind]
    return at.make(weight, bias, SLICE_ROWS), at.label

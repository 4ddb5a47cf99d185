"""The 4-bit GEMM's choice by device and shape: on a CUDA input where Triton imports, triton_gemm.py's launch (whose
`choose` picks the form and tiles from the rows, output and input widths: the word form, the tile form for what the
word form cannot step); elsewhere naive.py's dequantized product. engine/weights/int4_common.py's Int4Linear and
FusedInt4Linear compute through here.
"""

from __future__ import annotations

import functools

import torch

from .naive import int4_linear_reference


@functools.cache
def gemm_module():
    """triton_gemm.py (Triton at its top) where Triton imports, else None."""
    try:
        from . import triton_gemm
    except ImportError:
        return None
    return triton_gemm


def linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
           g_idx: torch.Tensor | None, group: int) -> torch.Tensor:
    """y = x W^T in x's dtype, W = (q - z) x scale from the packed parts (`group`: the columns a scale covers, x's
    width for one scale a row): the dequantized model's function. On CUDA the Triton GEMM reads the parts as stored;
    elsewhere naive.int4_linear_reference (on a CPU bit for bit the model dequantized at load)."""
    gemm = gemm_module() if x.is_cuda else None
    if gemm is not None:
        return gemm.int4_linear(x, packed, scale, zero, g_idx, group)
    return int4_linear_reference(x, packed, scale, zero, g_idx, group)

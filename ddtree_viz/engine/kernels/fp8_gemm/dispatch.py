"""The FP8 GEMM's choice by device and shape: on a CUDA input, where Triton imports and the scale block fits its
tiles, triton_gemm.py's launch (whose `choose` picks the tiles from the product's shape: rows, output and input
widths, the device's SMs and shared memory); elsewhere naive.py's dequantized product. engine/weights/fp8.py's
Fp8Linear and FusedFp8Linear compute through here.
"""

from __future__ import annotations

import torch

from .naive import fp8_linear_reference

_GEMM = None


def gemm_module():
    """triton_gemm.py (Triton at its top) where Triton imports, else None; imported once, on first use."""
    global _GEMM
    if _GEMM is None:
        try:
            from . import triton_gemm as module
        except ImportError:
            module = False
        _GEMM = module
    return _GEMM or None


def linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """y = x (weight x scale per block)^T in x's dtype: the dequantized model's function (the weight's float32
    product rounded once to x's dtype, as a load in that dtype rounds it; on CUDA at one row not rounded,
    triton_gemm's docstring). On CUDA the Triton GEMM reads the fp8 bytes and scales as stored (any number of rows:
    decode, tree verify, prefill); elsewhere (a CPU, no Triton) naive.fp8_linear_reference (on a CPU bit for bit the
    model dequantized at load)."""
    gemm = gemm_module() if x.is_cuda else None
    if gemm is not None and gemm.fits(block):
        return gemm.fp8_linear(x, weight, scale, block)
    return fp8_linear_reference(x, weight, scale, block)


def riding_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                  plain: torch.Tensor) -> torch.Tensor | None:
    """`linear`'s product and x plain^T (a plain weight of x's dtype) side by side in y, in one launch where the
    Triton GEMM's one-row kernel takes the plain rows (triton_gemm.rides); None elsewhere (the caller runs the two)."""
    gemm = gemm_module() if x.is_cuda and plain.dtype == x.dtype else None
    if gemm is None or not gemm.fits(block):
        return None
    K, N = x.shape[-1], weight.shape[0]
    if not gemm.rides(gemm.choose(x.numel() // K, N, K, x.device), N):
        return None
    return gemm.fp8_linear(x, weight, scale, block, plain=plain)

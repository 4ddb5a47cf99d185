"""The FP8 GEMM's reference: the weight dequantized (each e4m3 value times its block's float32 scale: the exact
product in float32), rounded once to the activations' dtype, then F.linear. It is the function the dequantized model
computes, and the form a CPU (or a machine without Triton) runs: on a CPU bit for bit the model dequantized at load.
Shapes: x [..., K]; weight [N, K] float8_e4m3fn; scale [ceil(N / block[0]), ceil(K / block[1])] float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def dequantize(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """weight x scale per block, in float32 (the exact product: an e4m3 value times a float32 scale)."""
    out, inn = weight.shape
    # a block taller or wider than the weight is one block that way: repeat no further than the weight reaches (a
    # weight_block_size of 10^9 allocated gigabytes before any check)
    rows, cols = min(block[0], out), min(block[1], inn)
    full = scale.float().repeat_interleave(rows, 0)[:out].repeat_interleave(cols, 1)[:, :inn]
    return weight.float() * full


def fp8_linear_reference(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                         block: tuple[int, int]) -> torch.Tensor:
    """y = x (weight x scale per block)^T in x's dtype: the weight dequantized for this call, rounded once to x's
    dtype, then F.linear."""
    return F.linear(x, dequantize(weight, scale, block).to(x.dtype))

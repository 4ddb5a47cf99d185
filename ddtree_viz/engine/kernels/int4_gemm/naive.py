"""The 4-bit GEMM's reference: the weight unpacked and dequantized ((q - z) x scale in float32: exact, a 4-bit integer
times a bf16 / fp16 / fp32 scale), rounded once to the activations' dtype, then F.linear. It is the function the
dequantized model computes, and the form a CPU (or a machine without Triton) runs: on a CPU bit for bit the model
dequantized at load (engine/weights/int4_common.py's dequantize is this one).

The words (compressed-tensors' pack-quantized layout, what every 4-bit format is read as): eight 4-bit fields an
int32 word, field i of word w in bits 4i .. 4i+3 holding q + 8 (q in [-8, 7]); a weight's words run along its
columns, its zero points' along its rows. Shapes: x [..., K]; packed [N, ceil(K / 8)] int32; scale [N, groups];
zero [ceil(N / 8), groups] int32 or None (symmetric); g_idx [K] (activation order) or None.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BITS = 4
PER_WORD = 32 // BITS
OFFSET = 1 << (BITS - 1)  # a field holds q + 8


def unpack(packed: torch.Tensor, count: int, dim: int) -> torch.Tensor:
    """int32 words -> their signed 4-bit values (int32), `count` of them along `dim` (1: a weight's columns, 0: its
    zero points' rows)."""
    shifts = torch.arange(PER_WORD, dtype=torch.int32, device=packed.device) * BITS
    if dim == 1:
        fields = (packed[:, :, None] >> shifts) & 0xF  # [rows, words, 8]
        return fields.reshape(packed.shape[0], -1)[:, :count] - OFFSET
    fields = (packed[:, None, :] >> shifts[None, :, None]) & 0xF  # [words, 8, cols]
    return fields.reshape(-1, packed.shape[1])[:count] - OFFSET


def dequantize_words(packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, g_idx: torch.Tensor | None,
                     group: int, shape: tuple[int, int]) -> torch.Tensor:
    """(q - z) x scale in float32 (exact), [out, in] = `shape`: each column's group its g_idx entry, else column //
    group (`group` 0: one group a row); z = 0 where `zero` is None (symmetric)."""
    out, inn = shape
    if g_idx is not None:
        groups = g_idx.long().to(packed.device)
    else:
        groups = torch.arange(inn, device=packed.device) // (group or inn)
    q = unpack(packed, inn, 1).float()
    if zero is not None:
        q = q - unpack(zero, out, 0).float()[:, groups]
    return q * scale.float()[:, groups]


def int4_linear_reference(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
                          g_idx: torch.Tensor | None, group: int) -> torch.Tensor:
    """y = x W^T in x's dtype, W dequantized for this call (float32, cast once to x's dtype), then F.linear.
    `group`: the columns a scale covers (x's width for one scale a row)."""
    weight = dequantize_words(packed, scale, zero, g_idx, group, (packed.shape[0], x.shape[-1]))
    return F.linear(x, weight.to(device=x.device, dtype=x.dtype))

"""A layer's residual add and the RMSNorm after it, in torch: the reference triton_norm.py is held to, and the form
a CPU runs (through torch.compile on CUDA where the launch is not taken: engine/fused.py's Pieces). Qwen3.5's
zero-centred RMSNorm: x / rms(x) * (1 + w), with the scale 1 + w precomputed in fp32."""

from __future__ import annotations

import torch.nn.functional as F


def rms_norm(x, scale, eps: float):
    """Qwen3.5's zero-centred RMSNorm (fp32 normalise, scale by 1 + w, cast back) with `scale` = 1 + w in fp32."""
    return (F.rms_norm(x.float(), (x.shape[-1],), eps=eps) * scale).type_as(x)


def add_rms_norm(x, y, scale, eps: float):
    """A residual add and the norm after it: (x + y, rms_norm(x + y))."""
    x = x + y
    return x, rms_norm(x, scale, eps)

"""Which fused attention kernel PyTorch's SDPA may use on a GPU, chosen on purpose.

On an H100/H200, `F.scaled_dot_product_attention` prefers the cuDNN backend for some shapes. cuDNN builds an
execution plan for every new shape, and that costs milliseconds of host time (18 ms a call measured on an H200
at Qwen3.6-27B drafter shapes, 5 calls a round): a drafter whose context grows every round, or transformers'
one-token forward whose KV length grows every token, meets a new shape on almost every call. FlashAttention and
the memory-efficient kernel take any length with no plan to build, and the math backend stays as the fallback
for what neither supports.

`sdpa_backends(device)` is that choice as a context manager on CUDA, and does nothing on any other device:
CPU arithmetic stays exactly what it was (the tests compare CPU outputs bit for bit).
"""

from __future__ import annotations

import contextlib

import torch

# in order of preference; cuDNN left out on purpose (a plan per new shape)
CUDA_SDPA_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


def sdpa_backends(device: torch.device | str | None):
    """A context in which SDPA on `device` uses CUDA_SDPA_BACKENDS only (a no-op off CUDA)."""
    if device is None or torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = [getattr(SDPBackend, name) for name in CUDA_SDPA_BACKENDS]
    try:
        return sdpa_kernel(backends, set_priority=True)
    except TypeError:  # older torch: no priority order, the list only enables them
        return sdpa_kernel(backends)


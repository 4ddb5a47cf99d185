"""Which fused attention kernel PyTorch's SDPA may use on a GPU, chosen on purpose.

On an H100/H200, `F.scaled_dot_product_attention` prefers the cuDNN backend for some shapes. cuDNN builds an
execution plan for every new shape, and that costs milliseconds of host time (18 ms a call measured on an H200
at Qwen3.6-27B drafter shapes, 5 calls a round): a drafter whose context grows every round, or transformers'
one-token forward whose KV length grows every token, meets a new shape on almost every call. FlashAttention and
the memory-efficient kernel take any length with no plan to build, and the math backend stays as the fallback
for what neither supports.

`sdpa_backends(device)` is that choice as a context manager on CUDA, and does nothing on any other device:
CPU arithmetic stays exactly what it was (the tests compare CPU outputs bit for bit).

The same rule for transformers' own kernel choice: its hybrid layers (Qwen3.5 / Qwen3.6's Gated DeltaNet) pick
flash-linear-attention's Triton kernels at import whenever `fla` imports, for every tensor, and Triton cannot read
CPU tensors. `kernels_follow_device` makes that choice per call: the package's kernel for CUDA tensors, the
layer's own torch form for any other (the CPU path then computes exactly what it computes without fla installed).
It runs at this module's import for the hybrids' modeling modules and again for each loaded target's modules.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys

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



# transformers' modeling modules whose layers pick a package's kernel at import (use_kernel_func_from_hub_with_fallback)
HYBRID_MODELING = ("transformers.models.qwen3_5.modeling_qwen3_5", "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
                   "transformers.models.qwen3_next.modeling_qwen3_next")
_FOLLOWS = "_ddtree_follows_device"


def kernels_follow_device(model: torch.nn.Module | None = None) -> int:
    """Make every package-kernel choice of the hybrids' modeling modules (and of `model`'s own modules) follow the
    tensors' device. Idempotent; returns how many functions it switched now."""
    names = set(HYBRID_MODELING)
    if model is not None:
        names |= {type(m).__module__ for m in model.modules()}
    switched = 0
    for name in sorted(names):
        if not name.startswith("transformers.models."):
            continue
        module = sys.modules.get(name)
        if module is None and name == HYBRID_MODELING[0]:  # the hybrid the runner serves; others when loaded
            module = importlib.import_module(name)
        if module is None:
            continue
        switched += _switch_module(module)
    return switched


def _switch_module(module) -> int:
    switched = 0
    for attr, fn in list(vars(module).items()):
        reference = getattr(fn, "__wrapped__", None)
        if not callable(fn) or reference is None or getattr(fn, _FOLLOWS, False) or not _is_kernel_fallback(fn):
            continue
        setattr(module, attr, by_device(fn, reference))
        switched += 1
    return switched


def _is_kernel_fallback(fn) -> bool:
    """A function made by transformers' use_kernel_func_from_hub_with_fallback (its wrapper's code lives there)."""
    code = getattr(fn, "__code__", None)
    return code is not None and code.co_filename.replace("\\", "/").endswith("integrations/hub_kernels.py")


def by_device(kernel, reference):
    """`kernel` (transformers' wrapper: the package's kernel when it imported) for CUDA tensors, `reference` (the
    layer's torch form) otherwise. The device is the first tensor argument's."""

    @functools.wraps(reference)
    def call(*args, **kwargs):
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        return (kernel if first is not None and first.is_cuda else reference)(*args, **kwargs)

    setattr(call, _FOLLOWS, True)
    call.kernel, call.reference = kernel, reference
    return call


kernels_follow_device()

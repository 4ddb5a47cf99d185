"""What the tensor-core GEMMs of the quantized formats (fp8_gemm, int4_gemm) share about their tiles: a tree
verify's rows as one block and a short tail, whether a device loads tiles by bulk tensor copies (TMA), and whether
a tensor may be read through a tensor descriptor. Nothing here imports Triton at module level.
"""

from __future__ import annotations

import functools

import torch

from .device import interpreting


def row_blocks(M: int) -> tuple[int, int]:
    """(main, tail): M rows as one power-of-two block and a tail of 16 or 32 rows (0: none), else one block: the
    tensor cores' work is main + tail rows, not the next power of two (65 rows: 80, not 128; 129: 144, not 256)."""
    main = 1 << (M.bit_length() - 1)
    if M == main:
        return main, 0
    tail = max(16, 1 << (M - main - 1).bit_length())
    return (main, tail) if tail <= 32 and tail < main else (2 * main, 0)


@functools.lru_cache(maxsize=8)
def bulk_copies(device: torch.device) -> bool:
    """Whether the device loads tiles by bulk tensor copies (TMA: compute capability 9.0 and later; Triton's
    interpreter emulates them) and this Triton has host tensor descriptors."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return interpreting() if device.type != "cuda" else torch.cuda.get_device_capability(device)[0] >= 9


@functools.lru_cache(maxsize=8)
def shared_memory(device: torch.device) -> int:
    """Bytes of shared memory a program may ask for: 232,448 on an H100 / H200 (also off CUDA: the interpreter),
    101,376 on an RTX 3090, RTX 4090 or L40S, 166,912 on an A100."""
    if device.type != "cuda":
        return 232_448
    return torch.cuda.get_device_properties(device).shared_memory_per_block_optin


def describable(*tensors: torch.Tensor) -> bool:
    """Whether each 2-D tensor can be read through a tensor descriptor: its rows contiguous, its start and its row
    stride in bytes multiples of 16."""
    return all(t.dim() == 2 and t.stride(1) == 1 and t.stride(0) * t.element_size() % 16 == 0
               and t.data_ptr() % 16 == 0 for t in tensors)


def descriptor(t: torch.Tensor, block: list[int]):
    """A host tensor descriptor of `t` in tiles of `block` (rows and columns past t's edges read as zeros)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(t, block)


def row_operands(x: torch.Tensor, weight: torch.Tensor, block_m: int, tail: int, x_cols: int, weight_block: list[int]):
    """(x's block, x's tail rows, the weight) as tensor descriptors of [block_m, x_cols], [tail, x_cols] and
    `weight_block` tiles (the tail's the block's where there is no tail: unread), the tree-verify forms' bulk
    copies; None where x or the weight cannot be described (`describable`): the caller loads by address."""
    if not describable(x, weight):
        return None
    x_arg = descriptor(x, [block_m, x_cols])
    return x_arg, descriptor(x, [tail, x_cols]) if tail else x_arg, descriptor(weight, weight_block)

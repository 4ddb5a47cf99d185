"""The best-first tree's choice by device and budget: the one-program kernel (triton_best_first.py) on CUDA where
Triton imports, for budgets up to its MAX_BUDGET; beam.py's tensor ops elsewhere on a device. (The host's heap loop,
naive.py, is engine/tree.py's build_tree: a records-on round's tree.)
"""

from __future__ import annotations

import torch

from ..device import triton_available
from .beam import tree_on_device


def device_tree_nodes(top_logprobs: torch.Tensor, budget: int, kernel: bool | None = None) -> tuple[torch.Tensor, ...]:
    """tree_on_device's nodes, by the best-first kernel (triton_best_first.py: naive.py's heap loop in one Triton
    program) or by tree_on_device's tensor ops. `kernel` None: the kernel on CUDA where Triton is installed, for
    budgets up to its MAX_BUDGET; True asks for it (Triton's interpreter runs it on CPU tensors)."""
    if kernel is None:
        kernel = top_logprobs.is_cuda and triton_available()
    if kernel and budget >= 1 and min(top_logprobs.shape) >= 1:  # (an empty tree: tree_on_device's root alone)
        from .triton_best_first import MAX_BUDGET, best_first_triton

        if budget <= MAX_BUDGET:
            return best_first_triton(top_logprobs, budget)
    return tree_on_device(top_logprobs, budget)

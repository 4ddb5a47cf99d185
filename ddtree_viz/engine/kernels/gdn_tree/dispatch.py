"""THE choice of the tree delta rule's form by device and tree size (the runner's part "gdn_kernel", resolved once per
runner), and the check that holds a Triton form to the torch form before it is used.

    torch         parallel.py's tree form (cuBLAS's triangular solve): a CPU's form, and every tree a Triton form
                  does not take (one node: the step; more than MAX_T positions)
    triton-rule   the whole rule in two launches (triton_solve.tree_rule_triton), q and k at their key heads; trees of
                  2 .. MAX_T positions. CUDA's default: the fastest verify at budgets 64 and 128 in every run but two
                  at 128 before its solve went by blocks (docs/lab/NOTEBOOK.md sections 6, 9, 19-20, 38, 42)
    triton-solve  parallel.py's parts in torch, the solve and output product in one launch
                  (triton_solve.tree_solve_triton); trees of 2 .. MAX_T positions

naive.py's per-path recurrence is the reference every form is tested against (tests/test_gdn_tree.py,
tests/test_tree_kernel.py). The forms that lost every measurement (the whole rule in one kernel: "triton" and
"triton-tree") were deleted (section 42). Triton is imported only when a Triton form is asked for.
"""

from __future__ import annotations

import random
from typing import Callable

import torch
import torch.nn.functional as F

from .... import treeops
from ..device import needs_triton, triton_available
from .parallel import TreeMasks, solve_steps, tree_delta_rule, tree_delta_rule_parts

GDN_KERNELS = ("auto", "torch", "triton-rule", "triton-solve")
TRITON_FORMS = ("triton-rule", "triton-solve")


def resolve_option(option: str, device: torch.device) -> str:
    """The form `option` (a name of GDN_KERNELS) means on `device`: "auto" is triton-rule on CUDA where Triton
    imports, else torch; a Triton form where Triton cannot run is a ValueError."""
    if option not in GDN_KERNELS:
        raise ValueError(f"gdn_kernel must be one of {', '.join(GDN_KERNELS)}, not {option!r}")
    if option == "auto":
        return "triton-rule" if device.type == "cuda" and triton_available() else "torch"
    if option != "torch":
        needs_triton("gdn_kernel", option, device)
    return option


def triton_kernel(name: str) -> tuple[Callable, int]:
    """A Triton form's launch (triton_solve's tree_rule_triton or tree_solve_triton, imported here) and the most
    positions it takes (MAX_T; larger trees and one node take the torch forms)."""
    from . import triton_solve

    kernels = {"triton-rule": triton_solve.tree_rule_triton, "triton-solve": triton_solve.tree_solve_triton}
    return kernels[name], triton_solve.MAX_T


def takes(max_t: int, positions: int) -> bool:
    """Whether a Triton form of at most `max_t` positions runs a tree of `positions` (else the torch form does)."""
    return 1 < positions <= max_t


def rule_of(name: str) -> Callable:
    """The form `name`'s tree delta rule alone, (q, k, v, g, beta, state, ancestors) -> (o, delta): q, k [T, Hk, K]
    (at their key heads); v [T, H, V]; g, beta [T, H]; state [H, K, V]; ancestors [T, T] bool. o, delta [T, H, V]."""
    if name == "torch":
        return tree_delta_rule
    kernel, _ = triton_kernel(name)

    def rule(q, k, v, g, beta, state, ancestors):
        masks = TreeMasks.of(ancestors)
        steps = solve_steps(masks.anc_float)
        if name == "triton-rule":
            return kernel(q, k, v, g, beta, state, masks.anc_float, steps)
        return kernel(*tree_delta_rule_parts(q, k, v, g, beta, state, masks.anc_float, masks.off_path), steps)

    return rule


def check(rule: Callable, device: torch.device, K: int, V: int) -> None:
    """`rule` (rule_of's) against the torch form on this device at these head dims (a random 17-node tree, two key
    heads serving four value heads: a Triton kernel compiles here); raises if it cannot run or differs."""
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    parents = [-1] + [rng.randrange(i) for i in range(1, 17)]
    anc = torch.from_numpy(treeops.ancestor_matrix(parents)).to(device)
    n = len(parents)
    q, k = (F.normalize(torch.randn(n, 2, K, generator=gen), dim=-1) for _ in range(2))
    v, state = torch.randn(n, 4, V, generator=gen), torch.randn(4, K, V, generator=gen)
    g, beta = -torch.rand(n, 4, generator=gen), torch.rand(n, 4, generator=gen)
    args = [x.to(device) for x in (q, k, v, g, beta, state)]
    repeated = [x.repeat_interleave(2, dim=1) for x in args[:2]] + args[2:]
    want = tree_delta_rule(*repeated, anc)
    for got, ref in zip(rule(*args, anc), want):
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)

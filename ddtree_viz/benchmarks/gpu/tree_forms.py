"""--tree-forms: the tree delta rule's forms, precisions and tiles swept one GDN layer at a time (torch, its parts,
cuBLAS's solve, the Triton solve and whole rule with each product precision, rows a program, rows a block, value
blocks and warps), each Triton form's largest difference from the torch form: where the kernels' defaults come from."""

from __future__ import annotations

import functools
import itertools
import random

import torch

from .config import BenchConfig
from ..harness import timer
from .harness import per_call_us


def tree_forms(bench: BenchConfig, target, sync, positions=(65, 129), calls: int = 48) -> dict:
    """The tree delta rule's forms, one GDN layer of ``target`` at a time, on random inputs of a tree of depth 15 with
    T = ``positions`` (budgets 64 and 128): microseconds per call of the torch form (compiled where the runner
    compiles), its parallel part (q, k repeated to the value heads and on their key heads) and its solve + output
    product (cuBLAS's, and the Triton kernel's with each product precision), the whole rule in Triton
    (tree_rule_triton; also with each count of rows a program of its parts kernel, `rule_triton_rows_R`, of rows a
    block of its solve, `rule_triton_solve_R`, and its products by Triton's own TF32 split, in one TF32 or in fp32,
    `rule_triton_triton-tf32x3` / `_tf32` / `_ieee`), each Triton form's largest difference from the torch form. On
    CUDA ``calls`` calls are captured in one CUDA graph and replayed (launch cost out, as in the runner); elsewhere
    they are timed eagerly. A form that cannot run here says why."""
    from ...engine import fused as fz
    from ...engine.kernels.device import triton_available
    from ...engine.kernels.gdn_tree.parallel import solve_steps, tree_delta_rule_masked, tree_delta_rule_parts, tree_solve
    from ...engine.gdn_tree import TreeIndex
    from ...engine.runner import RunnerForms
    from ...engine.verify import gdn_modules

    layer = next(iter(gdn_modules(target).values()))
    H, Hk, K, V = layer.num_v_heads, layer.num_k_heads, layer.head_k_dim, layer.head_v_dim
    dev = torch.device(bench.device)
    compiles = RunnerForms.of(None, dev).compile
    kernels = bench.cuda and triton_available()  # the Triton forms run here
    gen = torch.Generator().manual_seed(0)
    per_call = functools.partial(per_call_us, bench, timer(sync), calls)
    out: dict = {"heads": H, "key_heads": Hk, "K": K, "V": V, "calls_per_graph": calls if bench.cuda else None,
                 "compiled": compiles}
    for T in positions:
        parents = [-1] + [max(0, i - 1) if i <= 15 else random.Random(i).randrange(15) for i in range(1, T)]
        masks = TreeIndex.build(parents, 4, dev).masks
        q, k = (torch.nn.functional.normalize(torch.randn(T, Hk, K, generator=gen), dim=-1).to(dev) for _ in range(2))
        q = q / K**0.5
        v, state = torch.randn(T, H, V, generator=gen).to(dev), torch.randn(H, K, V, generator=gen).to(dev)
        g, beta = (-2 * torch.rand(T, H, generator=gen)).to(dev), torch.rand(T, H, generator=gen).to(dev)
        qr, kr = q.repeat_interleave(H // Hk, 1), k.repeat_interleave(H // Hk, 1)
        anc, off = masks.anc_float, masks.off_path
        form = fz.compiled(tree_delta_rule_masked) if compiles else tree_delta_rule_masked
        parts_fn = fz.compiled(tree_delta_rule_parts) if compiles else tree_delta_rule_parts
        want = form(qr, kr, v, g, beta, state, anc, off)
        parts = parts_fn(q, k, v, g, beta, state, anc, off)
        steps = solve_steps(anc)
        row = {"steps": int(steps),
               "torch_form_us": per_call(lambda: form(qr, kr, v, g, beta, state, anc, off)),
               "parts_repeated_heads_us": per_call(lambda: parts_fn(qr, kr, v, g, beta, state, anc, off)),
               "parts_key_heads_us": per_call(lambda: parts_fn(q, k, v, g, beta, state, anc, off)),
               "solve_cublas_us": per_call(lambda: tree_solve(*parts))}
        if not kernels:
            row["solve_triton_tf32x3"] = row["solve_triton_ieee"] = row["rule_triton"] = "needs Triton and a CUDA device"
        else:
            row.update(triton_forms(per_call, (q, k, v, g, beta, state, anc, steps), parts, want, T))
            row["solve_by_depth"] = solve_by_depth(per_call, (q, k, v, g, beta, state), T, dev)
            row["rule_tiles"] = rule_tiles(per_call, (q, k, v, g, beta, state, anc, steps), want, H)
        out[str(T)] = row
    return out


def triton_forms(per_call, args, parts, want, T: int) -> dict:
    """tree_forms' Triton rows for one tree: the solve and the whole rule with each product precision (tf32x3, our
    TF32 split, the default; triton-tf32x3 Triton's; tf32 one TF32 product, not fp32-accurate; ieee CUDA-core fp32;
    triton_solve.PRECISIONS), the whole rule with each count of rows a program of its parts kernel below T and of
    rows a block of its solve; each timed and its largest difference from `want` (the torch form). args: q, k (key
    heads), v, g, beta, state, anc_float, steps; parts: the torch form's parts."""
    from ...engine.kernels.gdn_tree.triton_solve import tree_rule_triton, tree_solve_triton

    steps = args[-1]
    forms = {f"solve_triton_{p}": functools.partial(tree_solve_triton, *parts, steps, precision=p)
             for p in ("tf32x3", "ieee")}
    # the whole rule in Triton (two launches), from grouped q/k heads
    forms["rule_triton"] = functools.partial(tree_rule_triton, *args)
    # the products' other precisions: Triton's own three-TF32 split, one TF32 product (what the split's fp32 accuracy
    # costs), CUDA-core fp32
    for precision in ("triton-tf32x3", "tf32", "ieee"):
        forms[f"rule_triton_{precision}"] = functools.partial(tree_rule_triton, *args, precision=precision)
    for rows in (16, 32, 64, 128):  # the parts kernel's rows a program (the default is PARTS_BLOCK_R's)
        if rows < T:
            forms[f"rule_triton_rows_{rows}"] = functools.partial(tree_rule_triton, *args, block_r=rows)
    for rows in (16, 32, 64, 128):  # the solve's rows a block (SOLVE_BLOCK's; 128: one block at every size)
        if rows < T:
            forms[f"rule_triton_solve_{rows}"] = functools.partial(tree_rule_triton, *args, block_s=rows)
    row = {}
    for key, fn in forms.items():
        row[f"{key}_us"] = per_call(fn)
        if not isinstance(row[f"{key}_us"], str):  # (a form that failed says why there)
            row[f"{key}_max_abs_diff"] = max(float((a - b).abs().max()) for a, b in zip(fn(), want))
    return row


def solve_by_depth(per_call, args, T: int, dev, depths=(2, 3, 4, 6, 8, 12, 16)) -> dict:
    """The whole rule in Triton at T positions on trees of each depth (a chain of `depth` nodes from the root, the
    rest children of random chain nodes), its solve over every row at once (`whole_us`) against by blocks of 16
    and 32 rows (`blocks_R_us`, taken whatever the depth): where SOLVE_BLOCK and BLOCKED_FROM come from."""
    from ...engine.kernels.gdn_tree.parallel import solve_steps
    from ...engine.kernels.gdn_tree.triton_solve import tree_rule_triton
    from ...engine.gdn_tree import TreeIndex

    out = {}
    for depth in depths:
        parents = [-1] + [i - 1 if i < depth else random.Random(i).randrange(depth) for i in range(1, T)]
        anc = TreeIndex.build(parents, 4, dev).masks.anc_float
        steps = solve_steps(anc)
        row = {"steps": int(steps), "whole_us": per_call(functools.partial(tree_rule_triton, *args, anc, steps,
                                                                              block_s=128))}
        for rows in (16, 32):
            if rows < T - 1:
                row[f"blocks_{rows}_us"] = per_call(functools.partial(tree_rule_triton, *args, anc, steps,
                                                                      block_s=rows, blocked_from=0))
        out[str(depth)] = row
    return out


def rule_tiles(per_call, args, want, H: int, block_v=(16, 32, 64, 128), warps=(4, 8, 16)) -> dict:
    """The whole rule in Triton by its launches' shapes: the parts kernel alone (`parts_us`, and with 2 / 8 warps a
    program; `parts_group_G_br_R_warps_W_us`: a program per value head (G 0) or per key head (G 1), R rows a
    program; `rule_group_G_us`: the whole rule with each, and its largest difference from the torch form), and the
    whole rule with each value-column block and warp count of its second kernel (`bv_B_warps_W_us`, each with its
    largest difference from the torch form `want`): where RULE_BLOCK_V and the warps by row tile come from. args: q,
    k (key heads), v, g, beta, state, anc_float, steps."""
    from ...engine.kernels.gdn_tree.triton_solve import tree_parts_triton, tree_rule_triton

    q, k, v, g, beta, state, anc, steps = args
    out = {"parts_us": per_call(functools.partial(tree_parts_triton, q, k, g, beta, anc, H))}
    for w in (2, 8):
        out[f"parts_warps_{w}_us"] = per_call(functools.partial(tree_parts_triton, q, k, g, beta, anc, H, warps=w))
    for group, block_r, w in itertools.product((False, True), (16, 32, 64), (4, 8)):  # by value head or key head
        out[f"parts_group_{int(group)}_br_{block_r}_warps_{w}_us"] = per_call(functools.partial(
            tree_parts_triton, q, k, g, beta, anc, H, group=group, block_r=block_r, warps=w))
    for group in (False, True):
        fn = functools.partial(tree_rule_triton, *args, group=group)
        out[f"rule_group_{int(group)}_us"] = per_call(fn)
        out[f"rule_group_{int(group)}_max_abs_diff"] = max(float((a - b).abs().max()) for a, b in zip(fn(), want))
    for bv in block_v:
        if bv > v.shape[-1]:
            continue
        for w in warps:
            fn = functools.partial(tree_rule_triton, *args, block_v=bv, warps=w)
            key = f"bv_{bv}_warps_{w}"
            out[f"{key}_us"] = per_call(fn)
            if not isinstance(out[f"{key}_us"], str):
                out[f"{key}_max_abs_diff"] = max(float((a - b).abs().max()) for a, b in zip(fn(), want))
    return out

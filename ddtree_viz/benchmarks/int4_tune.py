"""`gpu_bench --int4-tune`: engine/kernels/int4_gemm/triton_gemm.py's launches swept at the 27B's GEMMs, to choose
from one run.

Each GEMM of a layer as the runner runs it (gpu.layer_gemms of a small 4-bit target: the fused GDN in_proj, q + k + v
and gate + up, and the single out_proj, o_proj and down_proj), at the row counts a session runs (1: a decode step; 16:
a DFlash block; 65 / 129: a verify at budget 64 / 128), every candidate launch (`candidates`): the tile form as it is
today and the word form over its tiles and input splits. Each candidate's output is checked against the tile form's
(to bf16's rounding) before it is timed; a wrong or failing one is reported, never chosen.

Timing: `calls` products in one CUDA graph (gpu.per_call_us), each reading another copy of the weight, enough copies
that they do not fit the L2 cache together (a runner's layers each read their own weight; one weight timed over and
over would be served from L2). The bound beside each figure: the packed bytes (words, scales) at the copy bandwidth
measured in the same run."""

from __future__ import annotations

import dataclasses
import itertools
import math

import torch

ROWS = (1, 16, 65, 129)
L2_SPAN = 160e6  # bytes the copies of a weight span: over twice an H100's / H200's 50 / 60 MB L2


def candidates(kernel, rows: int) -> dict[str, object]:
    """The launches tried at `rows`: today's choice, and the word form's tiles and splits."""
    Config = kernel.Config
    out = {"tile_default": Config(), "chosen": kernel.choose(rows, 0, 0)}
    if rows <= 16:
        grid = itertools.product((16, 32, 64), (128, 256), (1, 2, 4), ((4, 3),), (16,))
    else:
        grid = itertools.product((64, 128), (64, 128), (1, 2), ((4, 3), (8, 3)), (64, 128))
    for bn, bk, split, (warps, stages), bm in grid:
        out[f"words_m{bm}_n{bn}_k{bk}_s{split}_w{warps}_p{stages}"] = Config(
            block_n=bn, block_k=bk, num_warps=warps, num_stages=stages, words=True, split_k=split, block_m=bm)
    return out


@torch.no_grad()
def tune(gemms: dict, per_call, bandwidth: float) -> dict:
    """Per GEMM of `gemms` (gpu.layer_gemms of a 4-bit target) and row count: every candidate's microseconds a call
    (`per_call(fn)`: gpu.per_call_us, a CUDA graph of calls), or why it failed, or its error against the tile form;
    the best, and the packed bytes' bound."""
    from ..engine.weights import int4_common as int4

    kernel = int4._gemm_module()
    out: dict = {}
    for name, g in gemms.items():
        fused = isinstance(g, int4.FusedInt4Linear)
        packed, scale = (g.packed, g.scale) if fused else (g.weight_packed, g.weight_scale)
        k = packed.shape[1] * int4.PER_WORD
        nbytes = packed.nbytes + scale.nbytes
        copies = [(packed.clone(), scale.clone()) for _ in range(max(1, math.ceil(L2_SPAN / nbytes)))]
        row: dict = {"shape": [packed.shape[0], k], "bytes": nbytes, "bound_us": nbytes / bandwidth * 1e6,
                     "copies": len(copies)}
        for m in ROWS:
            x = torch.randn(m, k, device=packed.device, dtype=scale.dtype)  # bf16 scales: the model's dtype
            ref = kernel.int4_linear(x, packed, scale, None, None, g.group, kernel.Config()).float()
            cells = {}
            for label, c in candidates(kernel, m).items():
                cells[label] = measure(kernel, x, copies, g.group, c, ref, per_call)
            timed_ok = {lb: v["us"] for lb, v in cells.items() if isinstance(v.get("us"), float)}
            best = min(timed_ok, key=timed_ok.get)
            row[str(m)] = {"best": best, "best_config": dataclasses.asdict(candidates(kernel, m)[best]),
                           "best_us": timed_ok[best], "tile_default_us": timed_ok.get("tile_default"),
                           "best_per_bound": timed_ok[best] / row["bound_us"], "cells": cells}
            print({name: {m: {"best": best, "us": timed_ok[best], "tile_us": timed_ok.get("tile_default"),
                              "bound_us": round(row["bound_us"], 1)}}}, flush=True)
        out[name] = row
        del copies
    return out


def measure(kernel, x, copies, group: int, c, ref, per_call) -> dict:
    """One candidate: its largest error against the tile form's output (relative to that output's largest), then
    its microseconds a call cycling through the copies; or why it cannot run."""
    try:
        y = kernel.int4_linear(x, *copies[0], None, None, group, c).float()
    except Exception as exc:  # noqa: BLE001 - a launch this shape refuses: reported
        return {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    err = float((y - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
    if not err < 2 ** -6:  # bf16 output rounding is 2^-8 of a value; sums in another order a few of those
        return {"error": f"off the tile form by {err:.3g} of its largest output"}
    cycle = itertools.cycle(copies)

    def call():
        w, s = next(cycle)
        kernel.int4_linear(x, w, s, None, None, group, c)

    return {"us": per_call(call), "rel_err": err}

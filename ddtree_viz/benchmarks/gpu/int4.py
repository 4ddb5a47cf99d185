"""The 4-bit weights' GEMMs (W4A16: engine/kernels/int4_gemm/) at the 27B's shapes: each GEMM of a layer beside cuBLAS's bf16
on the dequantized weight (int4_gemms, in speed.fast.int4), the chosen launch beside its neighbours (int4_configs), and
`--int4-tune`'s sweep of every candidate launch (int4_tune).

The sweep: each GEMM of a layer as the runner runs it (layer_gemms of a small 4-bit target: the fused GDN in_proj,
q + k + v and gate + up, and the single out_proj, o_proj and down_proj), at the row counts a session runs (1: a
decode step; 16: a DFlash block; 65 / 129: a verify at budget 64 / 128), every candidate launch (`candidates`): the
tile form as it is today and the word form over its tiles and input splits. Each candidate's output is checked
against the tile form's (to bf16's rounding) before it is timed; a wrong or failing one is reported, never chosen.
Timing: `calls` products in one CUDA graph (per_call_us), each reading another copy of the weight, enough copies
that they do not fit the L2 cache together (a runner's layers each read their own weight; one weight timed over and
over would be served from L2). The bound beside each figure: the packed bytes (words, scales) at the copy bandwidth
measured in the same run."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import asdict

import torch

from .config import BenchConfig
from ..harness import timer
from .harness import copy_bandwidth, per_call_us
from .models import build_quantized_target, layer_gemms
from ...engine.kernels.int4_gemm import table
from ...engine.kernels.tiles import row_blocks


def int4_gemms(bench: BenchConfig, target, timed, rows=(1, 17, 65, 129), calls: int = 24) -> dict:
    """fp8_gemms for the 4-bit target: each GEMM of a layer (layer_gemms) a call, the 4-bit GEMM (int4.linear, the
    config int4_gemm.choose picks) beside cuBLAS's bf16 GEMM on the dequantized weight, the packed bytes (words,
    scales, zero points) a call reads over its time, the same GEMM with zero points (`int4_asym_us`: AWQ's and
    asymmetric AutoRound / GPTQ files' form) where the target has none, and at 1, 65 and 129 rows other configs
    (`int4_configs`: other tiles, and at one row the kernel on the CUDA cores), to choose from one run."""
    from ...engine.weights import int4_common as int4

    per_call = functools.partial(per_call_us, bench, timed, calls)
    kernel = int4._gemm_module() if bench.cuda else None
    dtype, out = target.get_input_embeddings().weight.dtype, {}
    for name, g in layer_gemms(target, int4.FusedInt4Linear).items():
        fused = isinstance(g, int4.FusedInt4Linear)
        parts = packed_parts(g)
        k = g.in_features if not fused else parts[0].shape[1] * int4.PER_WORD  # (real widths: whole words)
        spec = int4.Int4Spec(g.group if g.group != k else 0, parts[2] is None)
        dense = int4.dequantize({"weight_packed": parts[0], "weight_scale": parts[1], "weight_shape": torch.tensor(
            [parts[0].shape[0], k]), **({"weight_zero_point": parts[2]} if parts[2] is not None else {})}, spec).to(dtype)
        nbytes = sum(t.numel() * t.element_size() for t in parts if t is not None)
        row: dict = {"shape": [parts[0].shape[0], k]}
        zero = None if parts[2] is not None else torch.randint(  # zero points, as an AWQ / asymmetric file has them
            -2 ** 31, 2 ** 31, (math.ceil(parts[0].shape[0] / int4.PER_WORD), parts[1].shape[1]), dtype=torch.int32,
            device=dense.device)
        for m in rows:
            x = torch.randn(m, k, device=dense.device, dtype=dtype)
            us = per_call(lambda: int4.linear(x, *parts, None, g.group))
            cell = row[str(m)] = {"int4_us": us, "bf16_us": per_call(lambda: torch.nn.functional.linear(x, dense))}
            if isinstance(us, float) and us > 0:
                cell["int4_TBps"] = nbytes / (us * 1e-6) / 1e12
            if zero is not None:  # the same product with zero points read too
                cell["int4_asym_us"] = per_call(lambda: int4.linear(x, parts[0], parts[1], zero, None, g.group))
            if kernel is not None and m in (1, 65, 129):
                cell["configs"] = {label: {"config": asdict(c), "us": per_call(
                    lambda: kernel.int4_linear(x, *parts, None, g.group, c))} for label, c in
                    int4_configs(kernel, m, k, g.group).items()}
        out[name] = row
        del dense
    return out


def int4_configs(kernel, m: int, k: int, group: int) -> dict:
    """int4_gemm's chosen config for an [m, k] product and its neighbours, one field changed each; at one row the
    kernel on the CUDA cores (two widths of a step) where the groups allow it."""
    c = kernel.choose(m, 0, k)
    alts = {"chosen": c, **{f"block_n_{n}": dataclasses.replace(c, block_n=n) for n in (32, 128) if n != c.block_n},
            "block_k_128": dataclasses.replace(c, block_k=128), "warps_8": dataclasses.replace(c, num_warps=8),
            "stages_2": dataclasses.replace(c, num_stages=2), "stages_4": dataclasses.replace(c, num_stages=4)}
    if m == 1:
        for bk, bn, warps in ((64, 64, 4), (128, 64, 4), (128, 128, 8), (128, 32, 2)):
            gemv = kernel.Config(block_n=bn, block_k=bk, num_warps=warps, gemv=True)
            if kernel.word_groups(gemv, group, k, None):
                alts[f"gemv_{bn}x{bk}_w{warps}"] = gemv
    return alts


@torch.no_grad()
def int4_tune(bench: BenchConfig, dtype: torch.dtype, saved=None, rows=None, narrow_only: bool = False) -> dict:
    """--int4-tune: a 4-layer 4-bit target at the 27B's widths (its layer kinds, each GEMM's shape), the copy
    bandwidth, and tune's sweep of the 4-bit GEMM's launches over them (at `rows`, default ROWS; with
    `narrow_only` the narrow GEMMs alone, table.NARROW)."""
    from ...engine.verify import device_sync
    from ...engine.weights import int4_common as int4

    if int4._gemm_module() is None:
        return {"error": "the 4-bit GEMM needs Triton, which this torch build lacks"}
    target = build_quantized_target(bench, 4, dtype, "int4")
    timed = timer(device_sync(target))
    bandwidth = copy_bandwidth(timed, bench.device, gib=0.25 if bench.smoke else 4.0)
    gemms = layer_gemms(target, int4.FusedInt4Linear)
    if narrow_only:
        gemms = {name: g for name, g in gemms.items() if gemm_shape(g)[0] <= table.NARROW}
    report = {"copy_bandwidth_TBps": bandwidth / 1e12, "gemms": {}}

    def cell_done(gemms_so_far):  # the report so far, after each GEMM and row count
        report["gemms"] = gemms_so_far
        if saved is not None:
            saved(report)

    report["gemms"] = tune(gemms, functools.partial(per_call_us, bench, timed, 24), bandwidth, cell_done,
                           rows=tuple(rows or ROWS))
    return report


# ------------------------------------------------------------------------------------------------------------
# --int4-tune: engine/kernels/int4_gemm/triton_gemm.py's launches swept at the 27B's GEMMs, to choose from one run
# ------------------------------------------------------------------------------------------------------------

ROWS = (1, 65, 129, 16)  # by what a session waits on most: a step, a verify at budget 64, at 128, a DFlash block
L2_SPAN = 160e6  # bytes the copies of a weight span: over twice an H100's / H200's 50 / 60 MB L2


def candidates(kernel, rows: int, n: int = 0, k: int = 0) -> dict[str, object]:
    """The launches tried at `rows` of an [n, k] weight: today's choice, the word form's tiles and splits (each with
    its weights dequantized in float32 and in the activations' dtype), at a verify's rows the swapped form's (rows
    of the weight a program, a step's columns, warps, the dequantization's dtype; for a narrow weight, table.NARROW,
    also narrower tiles and slices of the input), and at one row the one-row
    form's (rows of the weight a program, a step's columns, warps, input slices) beside the word form's launch of
    the rules."""
    Config = kernel.Config
    chosen = kernel.choose(rows, n, k)
    out = {"tile_default": Config(), "chosen": chosen}
    if chosen.words and chosen.block_k >= 128 and not chosen.fields:  # the products a field at a time beside it
        out["chosen_fields"] = dataclasses.replace(chosen, fields=True)
    if rows == 1:
        for split, half in itertools.product((1, 4), (False, True)):
            out[f"words_m16_n64_k256_s{split}_w4_p3{'_half' if half else ''}"] = Config(
                block_n=64, block_k=256, words=True, split_k=split, block_m=16, half=half)
        for bn, bk, warps, split in itertools.product((16, 32, 64), (128, 256, 512), (4, 8), (1, 2, 4, 8)):
            if bn * bk <= 4096 * warps:  # a step's fields a thread at most 128
                out[f"gemv_n{bn}_k{bk}_s{split}_w{warps}"] = Config(block_n=bn, block_k=bk, num_warps=warps,
                                                                     gemv=True, split_k=split)
        return out
    if rows <= 16:
        grid = itertools.product((16, 32, 64), (128, 256), (1, 2, 4), ((4, 3),), (16,), (False, True))
    else:  # one slice: table.py takes no other for a verify's rows of a weight wider than table.NARROW
        grid = [*itertools.product((64, 128), (64, 128), (1,), ((4, 3), (8, 3)), (64, 128), (False, True)),
                *itertools.product((256,), (64, 128), (1,), ((8, 3),), (64, 128), (False, True))]  # x read less
    for bn, bk, split, (warps, stages), bm, half in grid:
        out[f"words_m{bm}_n{bn}_k{bk}_s{split}_w{warps}_p{stages}{'_half' if half else ''}"] = Config(
            block_n=bn, block_k=bk, num_warps=warps, num_stages=stages, words=True, split_k=split, block_m=bm,
            half=half)
    if rows > 16:  # the swapped form: all rows a program as a block and a tail
        main, tail = row_blocks(rows)
        for bn, bk, warps, half in itertools.product((64, 128), (64, 128), (4, 8), (False, True)):
            out[f"swap_m{main}+{tail}_n{bn}_k{bk}_w{warps}{'_half' if half else ''}"] = Config(
                block_n=bn, block_k=bk, num_warps=warps, swap=True, block_m=main, tail=tail, half=half)
        if n <= table.NARROW:  # a narrow weight: more programs, by narrower tiles or slices of the input
            for bn, split, warps in itertools.product((32, 64), (1, 2, 4), (4, 8)):
                if (bn, split) != (64, 1):
                    out[f"swap_m{main}+{tail}_n{bn}_k128_s{split}_w{warps}_half"] = Config(
                        block_n=bn, block_k=128, num_warps=warps, swap=True, block_m=main, tail=tail, half=True,
                        split_k=split)
    return out


@torch.no_grad()
def gemm_shape(g) -> tuple[int, int]:
    """A 4-bit Linear's (or fused pair's) [n, k]."""
    from ...engine.weights import int4_common as int4

    packed = packed_parts(g)[0]
    return packed.shape[0], packed.shape[1] * int4.PER_WORD


def packed_parts(g) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A 4-bit Linear's (or fused pair's) words, scales and zero points (None: symmetric)."""
    from ...engine.weights import int4_common as int4

    if isinstance(g, int4.FusedInt4Linear):
        return g.packed, g.scale, g.zero
    return g.weight_packed, g.weight_scale, g.weight_zero_point


def tune(gemms: dict, per_call, bandwidth: float, saved=None, rows=ROWS) -> dict:
    """Per row count (`rows`' order) and GEMM of `gemms` (layer_gemms of a 4-bit target): every candidate's
    microseconds a call (`per_call(fn)`: per_call_us, a CUDA graph of calls), or why it failed, or its error against
    the tile form; the best, and the packed bytes' bound. `saved(out)` after each cell, so that a sweep stopped
    midway (a device call's limit) keeps every row count it finished, the step's first. Every GEMM's copies are
    held for the whole sweep (about L2_SPAN bytes each: ~1 GB for a layer's six)."""
    from ...engine.weights import int4_common as int4

    kernel = int4._gemm_module()
    out: dict = {}
    weights = {}
    for name, g in gemms.items():
        packed, scale, _ = packed_parts(g)
        nbytes = packed.nbytes + scale.nbytes
        weights[name] = [(packed.clone(), scale.clone()) for _ in range(max(1, math.ceil(L2_SPAN / nbytes)))]
        out[name] = {"shape": list(gemm_shape(g)), "bytes": nbytes,
                     "bound_us": nbytes / bandwidth * 1e6, "copies": len(weights[name])}
    for m in rows:
        for name, g in gemms.items():
            row, copies = out[name], weights[name]
            (n, k), packed = row["shape"], copies[0][0]
            x = torch.randn(m, k, device=packed.device, dtype=copies[0][1].dtype)  # bf16 scales: the model's dtype
            ref = kernel.int4_linear(x, *copies[0], None, None, g.group, kernel.Config()).float()
            launches = candidates(kernel, m, n, k)
            cells = {label: {**measure(kernel, x, copies, g.group, c, ref, per_call), "config": asdict(c)}
                     for label, c in launches.items()}
            timed_ok = {lb: v["us"] for lb, v in cells.items() if isinstance(v.get("us"), float)}
            best = min(timed_ok, key=timed_ok.get)
            row[str(m)] = {"best": best, "best_config": dataclasses.asdict(launches[best]),
                           "best_us": timed_ok[best], "tile_default_us": timed_ok.get("tile_default"),
                           "best_per_bound": timed_ok[best] / row["bound_us"], "cells": cells}
            print({name: {m: {"best": best, "us": timed_ok[best], "tile_us": timed_ok.get("tile_default"),
                              "bound_us": round(row["bound_us"], 1)}}}, flush=True)
            if saved is not None:
                saved(out)
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

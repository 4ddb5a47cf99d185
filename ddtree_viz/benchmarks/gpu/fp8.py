"""The FP8 weights' GEMMs (128 x 128 blocks: engine/kernels/fp8_gemm/) at the 27B's shapes: each GEMM of a layer beside
cuBLAS's bf16 on the dequantized weight (fp8_gemms, in speed.fast.fp8) and the chosen config beside its neighbours
(gemm_configs), to tune fp8_gemm.choose from one run."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import asdict

import torch

from .config import FP8_BLOCK, BenchConfig
from .harness import per_call_us
from .models import layer_gemms


def fp8_gemms(bench: BenchConfig, target, timed, rows=(1, 17, 65, 129), calls: int = 24) -> dict:
    """Each GEMM of a layer as the runner runs it (layer_gemms), microseconds a call (`per_call_us`: a CUDA graph of
    `calls` calls on a GPU) for each row count: FP8 (fp8.linear: the Triton GEMM with the config fp8_gemm.choose
    picks) beside cuBLAS's bf16 GEMM on the dequantized weight, the FP8 bytes a call reads over its time, and at 1,
    65 and 129 rows other configs beside the chosen one (`gemm_configs`), to tune `choose` from one run."""
    from ...engine.weights import fp8

    per_call = functools.partial(per_call_us, bench, timed, calls)
    weights = {name: ((g.weight, g.scale) if isinstance(g, fp8.FusedFp8Linear) else (g.weight, g.weight_scale_inv))
               for name, g in layer_gemms(target, fp8.FusedFp8Linear).items()}
    kernel = fp8._gemm_module() if bench.cuda else None  # other configs: where the Triton GEMM runs
    dtype, out = target.get_input_embeddings().weight.dtype, {}
    for name, (w, s) in weights.items():
        dense = fp8.dequantize(w, s, FP8_BLOCK).to(dtype)
        row: dict = {"shape": list(w.shape)}
        for m in rows:
            x = torch.randn(m, w.shape[1], device=w.device, dtype=dtype)
            us = per_call(lambda: fp8.linear(x, w, s, FP8_BLOCK))
            cell = row[str(m)] = {"fp8_us": us, "bf16_us": per_call(lambda: torch.nn.functional.linear(x, dense))}
            if isinstance(us, float) and us > 0:
                cell["fp8_TBps"] = (w.numel() + s.numel() * 4) / (us * 1e-6) / 1e12
            if kernel is not None and m in (1, 65, 129):
                cell["configs"] = {label: {"config": asdict(c), "us": per_call(lambda: kernel.fp8_linear(x, w, s, FP8_BLOCK, c))}
                                   for label, c in gemm_configs(kernel, m, w).items()}
        out[name] = row
        del dense
    return out


def gemm_configs(kernel, m: int, w) -> dict:
    """fp8_gemm's chosen config for an [m, K] x w^T product and its neighbours, one field changed each."""
    c = kernel.choose(m, w.shape[0], w.shape[1], w.device)
    alts = {"chosen": c, **{f"block_n_{n}": dataclasses.replace(c, block_n=n) for n in (32, 64, 128) if n != c.block_n},
            "split_x2": dataclasses.replace(c, split_k=2 * c.split_k),
            "warps_other": dataclasses.replace(c, num_warps=4 if c.num_warps == 8 else 8),  # 4 <-> 8; 2 -> 8
            "stages_2": dataclasses.replace(c, num_stages=2), "stages_4": dataclasses.replace(c, num_stages=4)}
    if c.gemv:  # one row on the CUDA cores against the tile kernel's decode config (2 to 16 rows)
        alts["tile"] = kernel.choose(2, w.shape[0], w.shape[1], w.device)
    else:
        alts["swap_other"] = dataclasses.replace(c, swap=not c.swap)
        alts["tma_other"] = dataclasses.replace(c, tma=not c.tma)  # the weight tiles by bulk copies or by loads
        # 256 weight rows a program: a verify's x (65 or 129 rows, from L2) read by half as many programs
        alts["block_n_256"] = dataclasses.replace(c, block_n=256, num_warps=8)
    if c.tail:
        alts["one_block"] = dataclasses.replace(c, block_m=2 * c.block_m, tail=0)
    if c.split_k > 1:
        alts["no_split"] = dataclasses.replace(c, split_k=1)
        alts["sum_other"] = dataclasses.replace(c, sum_in_launch=not c.sum_in_launch)  # in the launch or after
    return alts

"""--dflash2 (issue #28 item 7): the DFlash2 drafter (the shipped Qwen3.8-27B config's shapes, random weights) on
the runner beside DFlash 1 in the same run: its pass each way, whole rounds with the selector tree and its chain."""

from __future__ import annotations

import dataclasses

import torch

from .config import BenchConfig
from .drafter import drafter_pass
from .models import DFLASH2_CONFIG
from .rounds import runner_rounds


@torch.no_grad()
def dflash2_speed(bench: BenchConfig, pair, dflash2, engine, runner, prompt: list[int], rounds_tokens: int, token: int,
                  sync) -> dict:
    """Issue #28 item 7, beside DFlash 1 in the same run (same target, prompt and runner): the DFlash2 drafter (the
    shipped Qwen3.8-27B config's shapes, random weights) at its block (8). Its round's pass each way (drafter_pass:
    the static path's graph holds the convolutions and the candidate selector; target <= 3.0 ms, issue #67), whole
    rounds at budget 64 with the selector tree (target <= 1.3x the runner's greedy step) and the DFlash2 chain."""
    drafter, feats = dflash2
    pair2 = dataclasses.replace(pair, drafter=drafter, draft_name="DFlash2 shapes (random weights)")
    out: dict = {"config": DFLASH2_CONFIG, "block": drafter.block_size, "selector_top_k": drafter.top_k,
                 "selector_rank": drafter.config.selector_rank}
    out["drafter_pass"] = drafter_pass(pair.target, drafter, feats, token, sync, repeats=4 if bench.smoke else 20,
                                       limit_ms=3.0)
    out["selector"] = runner_rounds(pair2, engine, runner, prompt, rounds_tokens, tree_scoring="selector")
    out["chain"] = runner_rounds(pair2, engine, runner, prompt, rounds_tokens, method="dflash2")
    return out

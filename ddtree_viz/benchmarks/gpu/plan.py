"""The memory plan (`gpu_bench --memory-plan`, issue #67 item 1): what a session of the 27B keeps on its card,
computed on the meta device (no weights, no GPU, seconds on any machine), beside what the GPU runs measured.

Planned exactly: the two models' bytes (the target built as `build_quantized_target` builds it, the drafter as
`build_drafter` with `--int4-drafter`'s quantization, each on meta) and the session's lasting buffers: the runner's
committed state (`runner.buffers.State` at the room `RunnerEngine.room` gives a prompt) and the static drafter's
context cache (`StaticDrafter` at the room `DecodeSession.prefill` reserves); beside them the prefill's context features
(`context_features_shape`), which the session holds from its prefill until its first round's walk, and the state copy a
new tree size's capture holds while it warms up (`State.copy`): the first round's captures take it while the features
are held, so models + lasting + features + copy is the least the first round needs at once (`first_round_floor`; the
16k session's out-of-memory of docs/lab/NOTEBOOK.md section 55 came there). Not planned: what
else a session allocates on the way (the chunked prefill's activations, the CUDA graphs' pools, a verify's rows); the
plan says how much that was where a GPU run measured it (`quantized_peak_memory`'s session figure less the planned
buffers, and less the features too: whether they were held at the measured peak is not known)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from .config import BenchConfig
from .memory import PEAK_LIMIT, model_bytes

GIB = 2**30
SAME_MODELS_BYTES = 2**20  # a GPU run's models within a MiB of the plan's (its JSON keeps GiB as floats) are the same
CARD_24GB = 24e9 / GIB  # a "24 GB" card's bytes in GiB (22.35): what the 22 GiB goal leaves room under


@torch.no_grad()
def planned_models(bench: BenchConfig, weights: str, int4_drafter: bool, layers: int | None = None,
                   dtype: torch.dtype = torch.bfloat16):
    """The target (`weights` "bf16", "fp8" or "int4"; `layers` of them, None: the config's) and the drafter on the
    meta device, quantized as the GPU run quantizes them; returns (target, drafter)."""
    from .models import build_drafter, build_quantized_target, build_target
    from .quantized import quantize_drafter_int4

    meta = BenchConfig(**{**bench.__dict__, "device": "meta"})
    if weights == "bf16":
        target = build_target(meta, layers, dtype)
    else:
        target = build_quantized_target(meta, layers, dtype, weights)
    drafter = build_drafter(meta, target, dtype)
    if int4_drafter:
        quantize_drafter_int4(drafter)
    return target, drafter


def session_buffers(target, drafter, context: int, budget: int, max_new_tokens: int) -> dict:
    """The session's lasting buffers on the models' device (meta: their sizes only), as a session of `context`
    prompt tokens at `budget` makes them: the runner's state and the static drafter's context cache, bytes each;
    the prefill's context features, which the session holds from its prefill to its first round's walk; and the
    state copy (`State.copy`) a new tree size's capture holds while it warms up, which the first round's captures
    make while those features are held."""
    from ...engine.cache import layer_types
    from ...engine.draft_runner import context_cache_shape
    from ...engine.engines import RunnerEngine
    from ...engine.runner.core import context_features_shape
    from ...engine.runner.buffers import State
    from ...engine.shapes import shape_for
    from ...engine.verify import gdn_modules

    block = drafter.block_size
    tree_size = shape_for("ddtree").size(budget, block)  # a DDTree round's pass (DecodeSession's)
    engine = RunnerEngine(target, None, tree_size=tree_size, block_size=block, max_new_tokens=max_new_tokens)
    room = engine.room(context)
    gdn = gdn_modules(target)
    state = State(target.config, layer_types(target.config), gdn, next(iter(gdn.values())).conv_kernel_size, room,
                  target.get_input_embeddings().weight.dtype, target.get_input_embeddings().weight.device)
    runner_bytes = sum(t.numel() * t.element_size() for t in (state.keys_all, state.values_all, state.conv_all,
                                                              state.rec_all))
    capture_copy = sum(copy.numel() * copy.element_size() for _, copy in state.copy())  # (a capture's restore point)
    reserve = context + max_new_tokens + 2 * block  # DecodeSession.prefill's proposer.reserve
    shape = context_cache_shape(drafter.config, max(reserve, 256))  # (DFlashProposer._static_runner's)
    dtype_bytes = drafter.activations[1].itemsize
    ids = drafter.target_layer_ids  # (DFlashProposer.feature_layer_ids: the layers the session's runner keeps)
    features = math.prod(context_features_shape(target.config, ids, context)) * state.keys_all.element_size()
    return {"runner_max_len": room, "runner_state": runner_bytes, "drafter_max_len": shape[2],
            "drafter_cache": 2 * math.prod(shape) * dtype_bytes, "prefill_features": features,  # (keys and values)
            "capture_copy": capture_copy}


def memory_plan(bench: BenchConfig, weights: str, int4_drafter: bool, contexts=(4096, 16384), budget: int = 64,
                rounds: int = 6, measured: dict | None = None, layers: int | None = None) -> dict:
    """The plan in GiB: the models, and per context the session's lasting buffers and the planned total against
    the goal (PEAK_LIMIT) and a 24 GB card; with `measured` (a GPU run's `peak_memory` / `peak_memory_long` of the
    same weights, by context), what that run allocated beyond the plan (the session's transient share)."""
    target, drafter = planned_models(bench, weights, int4_drafter, layers)
    models = model_bytes(target, drafter)
    out: dict = {"weights": weights, "int4_drafter": int4_drafter, "budget": budget,
                 "head_weights": bench.head_weights if weights != "bf16" else None,
                 "target_GiB": model_bytes(target) / GIB, "drafter_GiB": model_bytes(drafter) / GIB,
                 "models_GiB": models / GIB, "contexts": []}
    max_new = (rounds + 2) * drafter.block_size  # quantized_peak_memory's session
    for context in contexts:
        buffers = session_buffers(target, drafter, context, budget, max_new)
        lasting = buffers["runner_state"] + buffers["drafter_cache"]
        row = {"context": context, "runner_max_len": buffers["runner_max_len"],
               "runner_state_GiB": buffers["runner_state"] / GIB,
               "drafter_max_len": buffers["drafter_max_len"], "drafter_cache_GiB": buffers["drafter_cache"] / GIB,
               "planned_GiB": (models + lasting) / GIB, "prefill_features_GiB": buffers["prefill_features"] / GIB,
               "capture_copy_GiB": buffers["capture_copy"] / GIB,
               "first_round_floor_GiB": (models + lasting + buffers["prefill_features"]
                                         + buffers["capture_copy"]) / GIB,
               "card_24GB_GiB": CARD_24GB}
        seen = (measured or {}).get(context)
        if seen is not None and abs(seen["model_bytes_GiB"] * GIB - models) > SAME_MODELS_BYTES:
            row["measured_not_beside"] = (f"the GPU run's models were {seen['model_bytes_GiB']:.2f} GiB, the plan's "
                                          f"{models / GIB:.2f}: other weights (a quantized head?), so its session "
                                          "figures are not set beside this plan")
        elif seen is not None:
            row["measured_models_GiB"] = seen["model_bytes_GiB"]
            row["measured_session_GiB"] = seen["session_GiB"]
            row["measured_peak_GiB"] = seen["peak_models_alone_GiB"]
            row["transient_GiB"] = seen["session_GiB"] - lasting / GIB  # allocated on the way, beyond the plan
            # less the prefill's features too (held through the prefill and the first round: at the peak if it
            # came then, which the run does not say)
            row["transient_past_features_GiB"] = row["transient_GiB"] - buffers["prefill_features"] / GIB
        out["contexts"].append(row)
    out["goal"] = PEAK_LIMIT.get(weights, (None, None))[1]
    return out


def measured_peaks(path: str | None, weights: str) -> dict:
    """A gpu_bench JSON's session peaks of `weights` by context (`peak_memory`, `peak_memory_long`: what
    quantized_peak_memory measured), {} without a file or where it has none."""
    if not path:
        return {}
    fast = json.loads(Path(path).read_text()).get("speed", {}).get("fast", {}).get(weights, {})
    peaks = (fast.get(name) for name in ("peak_memory", "peak_memory_long"))
    return {p["context"]: p for p in peaks if isinstance(p, dict) and "session_GiB" in p}


def memory_plans(bench: BenchConfig, weights: list[str], int4_drafter: bool, contexts, measured_from: str | None,
                 layers: int | None = None):
    """--memory-plan: the plan of each of `weights` (the 4-bit drafter only beside the 4-bit target), with a GPU
    run's measured peaks beside it where `measured_from` (its JSON) has them."""
    return {w: memory_plan(bench, w, int4_drafter and w == "int4", contexts,
                           measured=measured_peaks(measured_from, w), layers=layers) for w in weights}

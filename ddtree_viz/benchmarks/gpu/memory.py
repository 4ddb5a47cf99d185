"""Memory: the models' own bytes (model_bytes, each storage once) and what a decode step reads of the weights
(weight_bytes_of), the process's GPU memory cap and release between phases, and the quantized targets' peak: a
session as a user runs it, judged on the two models alone + the session (quantized_peak_memory, PEAK_LIMIT), and
where the memory is at an out-of-memory (live_blocks)."""

from __future__ import annotations

import gc
import itertools
from collections import Counter

import torch

from ..harness import clock
from .config import FP8_BLOCK, INT4_GROUP, BenchConfig


def model_bytes(*models) -> int:
    """Bytes the models' parameters and buffers hold, each storage once and whole (fused projections are views of
    one storage; a drafter shares the target's embedding and lm_head; a tensor cut from a padded one keeps its
    storage). A storage is told apart by its handle, not its address: meta tensors (the memory plan's) have none."""
    seen: dict[int, int] = {}
    for model in models:
        for t in itertools.chain(model.parameters(), model.buffers()):
            storage = t.untyped_storage()
            seen[storage._cdata] = storage.nbytes()
    return sum(seen.values())


def weight_bytes_of(target) -> dict:
    """What a decode step reads of the target: its quantized weights' bytes (FP8 e4m3 bytes; 4-bit words and zero
    points) and their scales, every other parameter (bf16 embeddings and lm_head, the modules left in bf16, norms);
    `bytes` their sum."""
    from ...engine.weights.registry import KEPT

    quantized = scale_bytes = 0
    for m in target.modules():
        if isinstance(m, KEPT):  # each kept kind says which of its tensors are the weight's, which its scales
            weight, scales = m.stored_bytes()
            quantized += weight
            scale_bytes += scales
    total = sum(p.numel() * p.element_size() for p in target.parameters())
    return {"bytes": total, "quantized_bytes": quantized, "scale_bytes": scale_bytes,
            "other_bytes": total - quantized - scale_bytes}


def memory_cap(bench: BenchConfig, gb: float | None) -> float | None:
    """Cap this process's GPU memory (torch's caching allocator: every tensor, CUDA graph pools included) at `gb` GB
    (None: lift the cap); the cap set."""
    if not bench.cuda:
        return None
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(1.0 if gb is None else min(1.0, gb * 1e9 / total), 0)
    return gb


def free_cuda(bench: BenchConfig) -> None:
    """Release what the last phase held: its reference cycles first (a runner, its engine and its graphs can keep
    one another, and with them their buffers, alive past `del`), then the allocator's cached blocks."""
    gc.collect()
    if bench.cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def allocated_gib(bench: BenchConfig) -> float | None:
    return torch.cuda.memory_allocated() / 2**30 if bench.cuda else None


def peak_gib(bench: BenchConfig) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if bench.cuda else None


def peak_memory_gib(bench: BenchConfig) -> dict[str, float] | None:
    if not bench.cuda:
        return None
    return {f"cuda:{d}": torch.cuda.max_memory_allocated(d) / 2**30 for d in range(torch.cuda.device_count())}


# the peak a session may reach (the two models alone + the session): FP8 the 36 GB (a 40 GB card); 4-bit
# 22 GB, what a 24 GB card leaves beside the CUDA context
PEAK_LIMIT = {"fp8": (36e9, "36 GB"), "int4": (22 * 2**30, "22 GiB")}  # (bytes, as the issue says it)


LONG_CONTEXT = 16384  # the 4-bit session's second peak (issue #67: "the peak at 4k and 16k context")


def quantized_memory_cap(bench: BenchConfig, weights: str, drafter) -> dict:
    """The cap of a quantized phase, set, and what it is made of. The cap stands for the card: this phase's target,
    its drafter and its session. What earlier phases of this process still hold (allocated beyond the drafter:
    compiled pieces' constants, cached graphs) is not the card's, so the cap is raised by exactly that much, and
    said (`leftover_GiB`)."""
    from ...engine.weights.load import expandable_segments

    free_cuda(bench)
    leftover = max(0, torch.cuda.memory_allocated() - model_bytes(drafter)) if bench.cuda else 0
    return {"weights": weights, "card_GB": bench.cap_gb(weights),
            "memory_cap_GB": memory_cap(bench, bench.cap_gb(weights) + leftover / 1e9), "leftover_GiB": leftover / 2**30,
            **({"block": list(FP8_BLOCK)} if weights == "fp8" else {"group": INT4_GROUP, "symmetric": True}),
            "expandable_segments": expandable_segments() if bench.cuda else None,
            "allocated_before_GiB": allocated_gib(bench), "drafter_GiB": model_bytes(drafter) / 2**30}


@torch.no_grad()
def quantized_peak_memory(bench: BenchConfig, pair, context: int, budget: int = 64, rounds: int = 6,
                          limit: tuple[float, str] = PEAK_LIMIT["fp8"]) -> dict:
    """Item 5: a session as a user runs it (DecodeSession on the runner engine: its runner sized for the prompt, CUDA
    graphs, the static drafter) on a `context`-token prompt at `budget`, `rounds` rounds; the peak GPU memory
    torch allocated (reset first: the models are resident, the rest is the session's) and what stays allocated.
    The target is judged on `peak_models_alone_GB`, what a process holding the two models alone would reach: their
    own bytes (`model_bytes`) plus the session's peak; the raw peak beside it also counts what the bench's earlier
    phases left allocated (`leftover_GiB`)."""
    from ...engine.proposers import make_proposer
    from ...engine.session import DecodeSession

    gen = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, pair.target.config.vocab_size, (context,), generator=gen).tolist()
    resident = torch.cuda.memory_allocated() if bench.cuda else None
    proposer = make_proposer(pair.drafter, pair.target, static=True)
    session = DecodeSession.of(pair, budget=budget, max_new_tokens=(rounds + 2) * pair.drafter.block_size,
                               engine="runner", record=False, proposer=proposer)
    start = clock()
    session.prefill(prompt_ids=prompt)
    prefill_s = clock() - start
    session.run(max_steps=rounds)
    out = {"context": context, "budget": budget, "rounds": len(session.history), "prefill_s": prefill_s,
           "runner_max_len": session.cache.max_len, "target": f"<= {limit[1]}"}
    if bench.cuda:
        peak, models = torch.cuda.max_memory_allocated(), model_bytes(pair.target, pair.drafter)
        out.update(peak_GB=peak / 1e9, peak_GiB=peak / 2**30, models_GiB=resident / 2**30,
                   session_GiB=(peak - resident) / 2**30, after_GiB=torch.cuda.memory_allocated() / 2**30,
                   reserved_peak_GiB=torch.cuda.max_memory_reserved() / 2**30, model_bytes_GiB=models / 2**30,
                   leftover_GiB=(resident - models) / 2**30, peak_models_alone_GB=(models + peak - resident) / 1e9,
                   peak_models_alone_GiB=(models + peak - resident) / 2**30, met=models + peak - resident <= limit[0])
    del session, proposer
    return out


OWN_FRAMES = ("ddtree_viz", "transformers", "fla")  # the frames that say which of our steps asked for memory


def live_blocks(snapshot: dict, top: int = 12, min_bytes: int = 16 * 2**20, own=OWN_FRAMES) -> list[dict]:
    """Where a process's memory is: the live allocations of `torch.cuda.memory._snapshot()` (history recorded with
    Python stacks) of at least `min_bytes`, grouped by size and by the innermost four frames of `own` (this package,
    transformers and fla) that made them ("?" where none did: the models' own storages, made before the recording),
    largest total first. What an out-of-memory under a card's cap leaves to read (section 51 found the 16k 4-bit
    session's in the first draft this way)."""
    groups: Counter[tuple[str, int]] = Counter()
    for segment in snapshot.get("segments", ()):
        for block in segment.get("blocks", ()):
            if block.get("state") != "active_allocated" or block.get("size", 0) < min_bytes:
                continue
            frames = [f for f in block.get("frames", ()) if any(k in f.get("filename", "") for k in own)]
            where = " < ".join(f"{f['filename'].rsplit('/', 1)[-1]}:{f['line']}:{f['name']}" for f in frames[:4])
            groups[where or "?", block["size"]] += 1
    rows = sorted(groups.items(), key=lambda kv: -kv[0][1] * kv[1])[:top]
    return [{"MiB": size / 2**20, "count": count, "made_by": where} for (where, size), count in rows]

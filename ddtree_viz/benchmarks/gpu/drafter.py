"""The drafter's pass of a round, each path side by side (DRAFT_PATHS: dynamic and eager, static with CUDA graphs,
SDPA, compiled pieces), against its target (issue #18: DFlash 1 at block 16 <= 3 ms; issue #67: DFlash2 at block 8)."""

from __future__ import annotations

import torch

from ..harness import timed_call, timer


DRAFT_PATHS = {  # drafter_pass: each path's proposer options (session.make_proposer: the drafter's family)
    "dynamic": dict(static=False),  # drafter.py over its DraftKVCache, eager: the reference
    "static": dict(static=True, compile=False),  # draft_runner.py: CUDA graphs on a GPU (eager on a CPU), eager
    # attention, its pieces not compiled
    "static_eager": dict(static=True, graphs=False),  # the same function without graphs
    "static_sdpa": dict(static=True, attention="sdpa"),  # graphs, SDPA for the attention
    "static_compiled": dict(static=True, compile=True),  # graphs, the pieces between the GEMMs compiled (CUDA's default)
}


@torch.no_grad()
def drafter_pass(target, drafter, feats, token: int, sync, contexts=(512, 2048), new_rows: int = 4,
                 repeats: int = 20, limit_ms: float = 3.0) -> dict:
    """The drafter's pass of a round, each way of DRAFT_PATHS side by side: a context of `c` rows (the prompt's
    features, repeated to c rows) drafted once (the prompt's pass: eager on every path), then rounds of `new_rows`
    new context rows + the block, timed (median of `repeats` after 2 warm-up rounds, which capture the graphs).
    Every path sees the same rounds; its last round's log-probs are compared with the dynamic path's. Ratios:
    `dynamic_per_static` (the graphs' speed-up) and each other path per the static one; the static pass against
    `limit_ms` (issue #18: DFlash 1 at block 16, 3 ms; issue #67: DFlash2 at block 8, with its selector, 3.0 ms)."""
    from ...engine.proposers import make_proposer

    timed = timer(sync)
    block = drafter.block_size
    out: dict = {"new_rows": new_rows, "block": block, "repeats": repeats, "contexts": {}}
    for c in contexts:
        ctx = feats.repeat(-(-c // feats.shape[0]), 1)[:c]
        row: dict = {}
        reference = None
        for name, options in DRAFT_PATHS.items():
            try:
                proposer = make_proposer(drafter, target, **options)
            except ValueError as exc:  # a split target: no static path
                row[name] = {"error": str(exc)}
                continue
            proposer.reserve(c + (repeats + 4) * new_rows + 2 * block)
            sync()
            first_ms = timed_call(lambda: proposer.propose(token, c, ctx, block), sync)[1]
            committed = c

            def one():
                nonlocal committed
                committed += new_rows
                return proposer.propose(token, committed, ctx[:new_rows], block)

            ms = timed(one, repeats=repeats)
            last = one()
            runner = proposer.runner
            entry = {"ms": ms, "first_pass_ms": first_ms, "path": proposer.path, "context_rows": committed,
                     "capture_s": runner.capture_s if runner is not None else None,
                     "compile_error": runner.compile_error if runner is not None else None,
                     "key_bucket": runner.bucket(committed + block) if runner is not None else None}
            if reference is None:
                reference = last
            else:
                entry["max_abs_logprob_diff_vs_dynamic"] = float((last - reference).abs().max())
                entry["argmax_agreement_vs_dynamic"] = float((last.argmax(-1) == reference.argmax(-1)).float().mean())
            row[name] = entry
            del proposer, runner, last
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        static = row.get("static", {}).get("ms")
        if static:
            for name in DRAFT_PATHS:
                if name != "static" and "ms" in row[name]:
                    row[f"{name}_per_static"] = row[name]["ms"] / static
        out["contexts"][str(c)] = row
    first = out["contexts"][str(contexts[0])]
    if "ms" in first.get("static", {}):
        out["static_ms"], out["dynamic_ms"] = first["static"]["ms"], first["dynamic"]["ms"]
        out["dynamic_per_static"] = first["dynamic_per_static"]
        out["target"], out["met"] = f"<= {limit_ms:g} ms", first["static"]["ms"] <= limit_ms
    return out

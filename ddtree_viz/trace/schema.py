"""The trace contract's constants (docs/ARCHITECTURE.md, "The trace contract"): the schema version, the names a
trace's kind and verdict take, and the input limits: what a trace may hold."""

from __future__ import annotations

from ..options import MAX_TOP_K  # noqa: F401 - a top-k row's entries (draft_top_ids, target_top_ids): a limit too

SCHEMA_VERSION = 1

# ------------------------------------------------------------------------------------------------------------
# Input limits: what a trace may hold (docs/ARCHITECTURE.md, "Input limits and refusals"). Every session the engine
# can record at its own limits fits (budget <= 4096: 4097 positions a round; max new tokens <= 8192: at most 8191
# rounds; drafter block size <= 256: depth <= 255); they bound what loading, the page and the exporters must handle.
# ------------------------------------------------------------------------------------------------------------

MAX_TRACE_BYTES = 64 * 1024 * 1024  # a trace file (UTF-8 JSON)
MAX_NESTING = 32  # JSON nesting (a trace needs 8: trace > steps > step > cache > layer > tensors > tensor > shape)
MAX_ROUNDS = 8192  # rounds (each adds at least one token; the engine's max new tokens is 8192)
MAX_NODES = 4097  # tree positions in one round (the engine's largest budget, 4096, + the root)
MAX_DEPTH = 255  # deepest tree position; an accepted path holds at most MAX_DEPTH + 1 positions
MAX_TOTAL_NODES = 400_000  # tree positions over all rounds
MAX_OUTPUT_TOKENS = 8192  # output_ids, greedy_ids, new_token_ids (the engine's max new tokens)
MAX_PROMPT_TOKENS = 1 << 20  # prompt_ids
MAX_TOKEN_ID = 2**31 - 1  # token ids are 0..MAX_TOKEN_ID
MAX_TOKEN_CHARS = 1024  # one token's text (nodes, token_texts)
MAX_TEXT_CHARS = 4 * 1024 * 1024  # prompt, output text, model names and any other string
MAX_LAYERS = 1024  # entries of a cache list
MAX_INT = 2**53  # any number in the file is within +-MAX_INT (integers: exact in every JSON reader)

COMPARE_KIND = "compare"  # a compare trace's `kind` (two sessions: records.CompareTrace)

VERDICT_NOISE, VERDICT_MISMATCH = "noise", "mismatch"  # a divergence's verdict (Trace.divergence_verdict)

# Longest list each field may hold (checked before its entries are read, so a huge list costs nothing).
LIST_LIMITS = {
    "steps": MAX_ROUNDS, "nodes": MAX_NODES, "target_argmax": MAX_NODES, "target_margin": MAX_NODES,
    "target_choice": MAX_NODES, "target_prob": MAX_NODES, "accepted": MAX_DEPTH + 1, "prompt_ids": MAX_PROMPT_TOKENS,
    "output_ids": MAX_OUTPUT_TOKENS, "greedy_ids": MAX_OUTPUT_TOKENS, "new_token_ids": MAX_OUTPUT_TOKENS,
    "cache": MAX_LAYERS, "cache_before_commit": MAX_LAYERS, "prefill_cache": MAX_LAYERS, "naive_state_error": MAX_LAYERS,
    "tensors": 16, "shape": 8, "token_texts": 2 * MAX_PROMPT_TOKENS, "timings_ms": 64, "settings": 256,
    "draft_top_ids": MAX_DEPTH, "draft_top_logprobs": MAX_DEPTH, "target_top_ids": MAX_NODES,
    "target_top_probs": MAX_NODES, "budget_curve": MAX_NODES, "messages": 4096, "selector_unary": MAX_NODES,
    "selector_pair": MAX_NODES,
}

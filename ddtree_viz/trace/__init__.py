"""Records: the plain data the engine yields and every renderer, exporter and replayer reads, and their checked JSON
(the trace contract of docs/ARCHITECTURE.md). Every name is imported from here (`from ddtree_viz.trace import Trace`);
the modules hold them by concern:

- schema.py: the schema version, a compare trace's kind, the verdicts' names and the input limits (MAX_*).
- records.py: the frozen dataclasses (TreeNode, TensorInfo, LayerCache, StepRecord, Trace, CompareTrace) and how
  they are read from JSON (Trace.load / from_json, load_any, step_from_dict, trace_from_dict).
- io.py: JSON text in and out with no knowledge of the records' meaning (dumps, parse_json, to_plain, check_text,
  a JSON value checked against a field's annotation).
- validation.py: a record against the invariants the engine guarantees (validate_step, validate).
- describe.py: what a trace says in words (verdict_text, verdict_words, reference_of, sampling_*).
"""

from .describe import (GREEDY_SAMPLING, is_sampled, reference_of, sampling_flags, sampling_label, sampling_of,
                       verdict_text, verdict_words)
from .io import check_text, dumps, parse_json, to_plain
from .records import (CompareTrace, LayerCache, StepRecord, TensorInfo, Trace, TreeNode, any_from_json, load_any,
                      step_from_dict, trace_from_dict)
from .schema import (COMPARE_KIND, LIST_LIMITS, MAX_DEPTH, MAX_INT, MAX_LAYERS, MAX_NESTING, MAX_NODES,
                     MAX_OUTPUT_TOKENS, MAX_PROMPT_TOKENS, MAX_ROUNDS, MAX_TEXT_CHARS, MAX_TOKEN_CHARS, MAX_TOKEN_ID,
                     MAX_TOP_K, MAX_TOTAL_NODES, MAX_TRACE_BYTES, SCHEMA_VERSION, VERDICT_MISMATCH, VERDICT_NOISE)
from .validation import LOGPROB_SLACK, validate, validate_step

__all__ = [
    "COMPARE_KIND", "GREEDY_SAMPLING", "LIST_LIMITS", "LOGPROB_SLACK", "MAX_DEPTH", "MAX_INT", "MAX_LAYERS",
    "MAX_NESTING", "MAX_NODES", "MAX_OUTPUT_TOKENS", "MAX_PROMPT_TOKENS", "MAX_ROUNDS", "MAX_TEXT_CHARS",
    "MAX_TOKEN_CHARS", "MAX_TOKEN_ID", "MAX_TOP_K", "MAX_TOTAL_NODES", "MAX_TRACE_BYTES", "SCHEMA_VERSION",
    "VERDICT_MISMATCH", "VERDICT_NOISE", "CompareTrace", "LayerCache", "StepRecord", "TensorInfo", "Trace", "TreeNode",
    "any_from_json", "check_text", "dumps", "is_sampled", "load_any", "parse_json", "reference_of", "sampling_flags",
    "sampling_label", "sampling_of", "step_from_dict", "to_plain", "trace_from_dict", "validate", "validate_step",
    "verdict_text", "verdict_words",
]

"""Records: the plain data the engine yields and every renderer, exporter and replayer reads.

Everything here is a frozen dataclass of ints, floats, strings, tuples and dicts of those, so a
session can be written to JSON and replayed later with no model loaded. The layout is the trace
contract of docs/ARCHITECTURE.md; fields may be added (readers ignore what they do not know), none renamed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import TraceError
from ..options import MARGINAL
from .io import build, dumps, named, parse_json, read_trace_text, to_plain
from .schema import COMPARE_KIND, SCHEMA_VERSION
from .validation import check_total_nodes, check_version, validate, validate_step


@dataclass(frozen=True)
class TreeNode:
    """One position of the verify pass. id 0 is the root (the previous round's bonus token)."""

    id: int
    parent: int  # -1 for the root
    depth: int  # root 0; a node at depth d drafts the token at committed_len + d
    token_id: int
    token: str  # decoded text of token_id (untrusted: escape before building HTML)
    logprob: float  # drafter log-prob of this token at its depth (0.0 for the root)
    rank: int  # rank of the token among the drafter's candidates at its depth (-1 for the root)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class LayerCache:
    """What one layer of the target's cache holds at a point in time."""

    layer: int
    type: str  # "linear_attention" (Gated DeltaNet: conv + recurrent state) or "full_attention" (key/value)
    cache_class: str
    tensors: tuple[TensorInfo, ...]
    bytes: int
    kv_length: int | None = None  # rows of keys/values (attention layers only)


@dataclass(frozen=True)
class StepRecord:
    """One DDTree (or DFlash chain) round: draft, build tree, verify, accept, commit."""

    index: int
    committed_len: int  # tokens in the target cache before the round; the root sits at this position
    root_token_id: int
    nodes: tuple[TreeNode, ...]
    target_argmax: tuple[int, ...]  # one per tree position, root first
    accepted: tuple[int, ...]  # tree positions on the accepted path, root first
    bonus_token_id: int  # the target's choice at the last accepted position
    timings_ms: dict[str, float]  # draft, tree, verify, commit
    cache: tuple[LayerCache, ...]  # after commit
    cache_before_commit: tuple[LayerCache, ...] = ()  # after the verify pass, before compaction
    new_token_ids: tuple[int, ...] = ()  # tokens this round added to the output (accepted drafts + bonus, clipped)
    target_margin: tuple[float, ...] = ()  # target's top-1 minus top-2 logit at each tree position
    method: str = "ddtree"  # "ddtree" or "dflash" (chain)
    verify: str = "exact"  # "exact" or "naive" (the known-wrong flattened-tree behaviour)
    # naive mode: per layer, max |committed recurrent state - the exact one after the same tokens| (None: attention)
    naive_state_error: tuple[float | None, ...] = ()
    # the target's choice where the walk stopped (the bonus) as the drafter saw it at that depth:
    # its rank and log-prob in the drafter's distribution (None when the depth is past the drafted block)
    bonus_draft_rank: int | None = None
    bonus_draft_logprob: float | None = None
    # sampling (T > 0) only, one per tree position: the target's position-keyed sample (the walk follows it, not
    # the argmax) and its probability under the filtered, tempered distribution. Empty when greedy.
    target_choice: tuple[int, ...] = ()
    target_prob: tuple[float, ...] = ()
    # {str(b): tokens the round would have gained under budget b}, b = 1..the round's own (for the DFlash chain:
    # chain length b); exact, see ddtree_viz/analysis.py. JSON keys are strings.
    budget_curve: dict[str, int] = dataclasses.field(default_factory=dict)
    # the drafter's grid the tree was built from: row d-1 = its top-k candidates at depth d (ids, log-probs
    # rounded to 3 decimals), best first; k = min(budget, the session's cap) (DFlash: the cap)
    draft_top_ids: tuple[tuple[int, ...], ...] = ()
    draft_top_logprobs: tuple[tuple[float, ...], ...] = ()
    # the target's top-k at each tree position, root first (ids, probabilities rounded to 4 decimals): under
    # softmax(logits) when greedy, under the filtered tempered distribution when sampling
    target_top_ids: tuple[tuple[int, ...], ...] = ()
    target_top_probs: tuple[tuple[float, ...], ...] = ()
    # a tree or chain built from a DFlash2 drafter's candidate selector, one per tree position (the root 0): the
    # node's unary score U_t(b) and its pair score S_t(parent's token, b) (rounded to 3 decimals). Else empty.
    selector_unary: tuple[float, ...] = ()
    selector_pair: tuple[float, ...] = ()

    @property
    def choices(self) -> tuple[int, ...]:
        """The target's choice at each tree position: its sample when sampling, else its argmax."""
        return self.target_choice or self.target_argmax

    @property
    def acceptance(self) -> int:
        """The walk's length: the accepted drafts + the bonus (the tree, the inspector, the histogram by accepted
        drafts). What the round kept can be fewer: see `kept`."""
        return len(self.accepted)

    @property
    def kept(self) -> int:
        """Tokens this round added to the output: its walk (acceptance) cut where the session stopped (max new
        tokens, end of text). Every acceptance figure counts these (a cut walk's tail was never output)."""
        return len(self.new_token_ids) if self.new_token_ids else len(self.accepted)

    @property
    def cut(self) -> bool:
        """The session stopped inside this round's walk: it kept fewer tokens than the walk accepted."""
        return self.kept < self.acceptance


@dataclass(frozen=True)
class Trace:
    """A whole session: settings, every round, the output and the greedy reference."""

    target: str
    draft: str
    prompt: str
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]  # generated tokens (prompt excluded)
    greedy_ids: tuple[int, ...] | None  # the target's own greedy continuation, same length budget
    first_divergence: int | None  # index into output_ids, or None when identical to greedy
    settings: dict[str, Any]  # budget, block_size, verify, dtype, max_new_tokens, method, device
    steps: tuple[StepRecord, ...]
    divergence_margin: float | None = None  # greedy top-1 minus top-2 logit at first_divergence
    output_text: str = ""
    token_texts: dict[str, str] = dataclasses.field(default_factory=dict)  # str(token id) -> text, every id named
    prefill_ms: float = 0.0
    prefill_cache: tuple[LayerCache, ...] = ()  # the target cache right after prefill (the layout before step 1)
    # noise or bug (docs/EXACTNESS.md): the reference's own numerical noise (max |margin of a multi-position pass
    # - margin of the one-token pass| over noise_positions compared positions), the tree passes' drift from the
    # reference before the divergence (max |margin difference| over drift_positions agreeing accepted
    # positions), and the verdict on the first divergence: "noise" (margin <= noise), "mismatch" or null
    numerical_noise: float | None = None
    noise_positions: int = 0
    tree_drift: float | None = None
    drift_positions: int = 0
    divergence_verdict: str | None = None
    reference_ms: float = 0.0  # time the reference has spent decoding (apart from the rounds')
    reference_pending: bool = False  # the reference has not reached the end of the output yet (live page)
    # why the comparison with the reference proves nothing (session.invalid_reason: a round's or the reference's
    # logits held NaN or inf); None: it stands. An invalid trace is never "identical to greedy" (`identical`)
    invalid: str | None = None
    # how the prompt was given (engine/prompts.py): with the chat template on, `prompt` is the templated text and
    # `messages` the conversation as given ({role, content}, the system prompt first); `thinking` is the template's
    # thinking switch as asked (None: the template's default). Raw-text prompts leave these at their defaults.
    messages: tuple[dict[str, str], ...] = ()
    chat_template: bool = False
    thinking: bool | None = None
    schema_version: int = SCHEMA_VERSION

    @property
    def identical(self) -> bool | None:
        """The output identical to its reference: None without a reference, False where the comparison is `invalid`
        (equal tokens chosen from NaN logits prove nothing)."""
        if self.greedy_ids is None:
            return None
        return self.first_divergence is None and self.invalid is None

    @property
    def tree_scoring(self) -> str:
        """How DDTree scored its nodes: "marginal" (traces from before DFlash2 say nothing: that) or "selector"."""
        return self.settings.get("tree_scoring", MARGINAL)

    @property
    def drafter_family(self) -> str:
        """The drafter's family: "dflash" (older traces say nothing: that) or "dflash2"."""
        return self.settings.get("drafter_family", "dflash")

    def to_json(self, indent: int | None = None) -> str:
        return dumps(to_plain(self), indent)

    @classmethod
    def from_json(cls, text: str | bytes) -> "Trace":
        """Parse, type-check and validate (TraceError naming the first problem)."""
        return trace_from_dict(parse_json(text, "trace"))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(indent=1), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path, name: str | None = None) -> "Trace":
        """Read, check and validate a trace file. `name`: how messages call the file (default: its path; the page
        passes the uploaded file's own name, never the server's temporary path)."""
        return named(lambda: cls.from_json(read_trace_text(path, name)), path, name)


@dataclass(frozen=True)
class CompareTrace:
    """Two sessions on the same prompt with different configurations, stepped in lockstep (the page's compare
    mode, `run --compare`): both recorded in full, so the comparison replays with no model. JSON: `{"schema_version",
    "kind": "compare", "a": <trace>, "b": <trace>}`."""

    a: Trace
    b: Trace
    kind: str = COMPARE_KIND
    schema_version: int = SCHEMA_VERSION

    def to_json(self, indent: int | None = None) -> str:
        return dumps(to_plain(self), indent)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(indent=1), encoding="utf-8")


def load_any(path: str | Path, name: str | None = None) -> Trace | CompareTrace:
    """A trace file or a compare trace file, checked and validated (TraceError naming the problem). `name`: how
    messages call the file (Trace.load)."""
    return named(lambda: any_from_json(read_trace_text(path, name)), path, name)


def any_from_json(text: str | bytes) -> Trace | CompareTrace:
    data = parse_json(text, "trace")
    if isinstance(data, dict) and data.get("kind") == COMPARE_KIND:
        check_version(data)
        for side in ("a", "b"):
            if side not in data:
                raise TraceError(f"the compare trace has no '{side}' trace")
        try:
            return CompareTrace(trace_from_dict(data["a"]), trace_from_dict(data["b"]))
        except TraceError as exc:
            raise TraceError(f"compare trace: {exc}") from None
    return trace_from_dict(data)


def _tensor(d, where):
    return build(TensorInfo, d, where, {})


def _layer(d, where):
    return build(LayerCache, d, where, {"tensors": _tensor})


def _node(d, where):
    return build(TreeNode, d, where, {})


def step_from_dict(d: Any, where: str = "step") -> StepRecord:
    """A StepRecord from its JSON form, type-checked and validated on its own (validate_step)."""
    step = build(
        StepRecord, d, where, {"nodes": _node, "cache": _layer, "cache_before_commit": _layer}
    )
    validate_step(step, where)
    return step


def trace_from_dict(data: Any) -> Trace:
    if not isinstance(data, dict):
        raise TraceError("the trace must be a JSON object")
    if data.get("kind") == COMPARE_KIND:
        raise TraceError("this is a compare trace (two sessions): open it with replay or the page")
    check_version(data)
    check_total_nodes(data.get("steps"), "trace")
    trace = build(Trace, data, "trace", {"steps": step_from_dict, "prefill_cache": _layer})
    for i, m in enumerate(trace.messages):
        if set(m) != {"role", "content"}:
            raise TraceError(f"trace.messages[{i}]: expected an object with 'role' and 'content' only")
    return validate(trace)

"""Records: the plain data the engine yields and every renderer, exporter and replayer reads.

Everything here is a frozen dataclass of ints, floats, strings, tuples and dicts of those, so a
session can be written to JSON and replayed later with no model loaded. The layout is the trace
contract of docs/ARCHITECTURE.md; fields may be added (readers ignore what they do not know), none renamed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .errors import TraceError
from .files import read_limited
from .words import plural
from .options import DRAFTER_FAMILIES, MARGINAL, MAX_TOP_K, METHODS, TREE_SCORINGS, VERIFY_MODES
from .treeops import check_parents, depths_of, follow, is_parent_chain

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
        return _named(lambda: cls.from_json(_read(path, name)), path, name)


COMPARE_KIND = "compare"


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
    return _named(lambda: any_from_json(_read(path, name)), path, name)


def _named(load: Callable[[], Any], path: str | Path, name: str | None) -> Any:
    """load(), its TraceError naming the file first when it does not already (a bad field deep in a trace said
    where in the trace, not which file: issue #64 class 7)."""
    shown = name if name is not None else str(path)
    try:
        return load()
    except TraceError as exc:
        # (the file reader's own messages name it already; a name that merely occurs in a message does not count)
        if f"trace file {shown}" in str(exc) or f"trace file not found: {shown}" in str(exc):
            raise
        raise TraceError(f"trace file {shown}: {exc}") from None


def any_from_json(text: str | bytes) -> Trace | CompareTrace:
    data = parse_json(text, "trace")
    if isinstance(data, dict) and data.get("kind") == COMPARE_KIND:
        _check_version(data)
        for side in ("a", "b"):
            if side not in data:
                raise TraceError(f"the compare trace has no '{side}' trace")
        try:
            return CompareTrace(trace_from_dict(data["a"]), trace_from_dict(data["b"]))
        except TraceError as exc:
            raise TraceError(f"compare trace: {exc}") from None
    return trace_from_dict(data)


def _read(path: str | Path, name: str | None = None) -> str:
    """A trace file's text: at most MAX_TRACE_BYTES, UTF-8; messages call it `name` (default: its path)."""
    shown = name if name is not None else str(path)
    return read_limited(path, MAX_TRACE_BYTES, "trace file", shown=shown, error=TraceError,
                        too_large=lambda size: f"trace file {shown} is {plural(size, 'byte')}; a trace may be at most "
                                               f"{MAX_TRACE_BYTES // 2**20} MiB ({MAX_TRACE_BYTES:,} bytes)")


def dumps(data: Any, indent: int | None = None) -> str:
    """JSON text (UTF-8 kept). With an indent, objects and lists of objects are laid out one entry a line, but a
    list of plain values (ids, probabilities, a top-k row) and an object of such (a node, a tensor, the timings)
    stay on one line: a line per number would make the file several times larger."""
    if indent is None:
        return json.dumps(data, ensure_ascii=False)
    return _dumps(data, indent, 0)


def _flat(value: Any) -> bool:
    """A plain value, a list of plain values, or an object of those: written on one line."""
    if isinstance(value, dict):
        return all(not isinstance(v, dict) and (not isinstance(v, list) or _flat(v)) for v in value.values())
    if isinstance(value, list):
        return not any(isinstance(v, (dict, list)) for v in value)
    return True


def _dumps(value: Any, indent: int, level: int) -> str:
    pad, inner = " " * (indent * level), " " * (indent * (level + 1))
    if isinstance(value, dict) and level > 0 and _flat(value):  # a node, a tensor, the timings: one line
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f"{inner}{json.dumps(str(k), ensure_ascii=False)}: {_dumps(v, indent, level + 1)}"
                 for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        if all(isinstance(v, list) and not any(isinstance(x, (dict, list)) for x in v) for v in value):
            rows = [inner + json.dumps(v, ensure_ascii=False, separators=(",", ":")) for v in value]
        else:
            rows = [inner + _dumps(v, indent, level + 1) for v in value]
        return "[\n" + ",\n".join(rows) + "\n" + pad + "]"
    if isinstance(value, list):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return json.dumps(value, ensure_ascii=False)


def parse_json(text: str | bytes, what: str = "trace") -> Any:
    """JSON text -> data, every failure a TraceError: too large, not JSON, a number too long to read, nesting too
    deep (json's own RecursionError, or more than MAX_NESTING levels)."""
    if len(text) > MAX_TRACE_BYTES:
        raise TraceError(f"the {what} is {plural(len(text), 'character')}; a trace may be at most "
                         f"{MAX_TRACE_BYTES // 2**20} MiB "
                         f"({MAX_TRACE_BYTES:,} bytes)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"the {what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise TraceError(f"the {what} is nested too deeply to read (at most {MAX_NESTING} levels)") from None
    except (ValueError, UnicodeDecodeError) as exc:  # e.g. an integer of more than 4300 digits
        raise TraceError(f"the {what} cannot be read: {str(exc).splitlines()[0]}") from None
    _check_nesting(data, what)
    return data


def _check_nesting(data: Any, what: str) -> None:
    stack = [(data, 1)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, (dict, list)):
            if level > MAX_NESTING:
                raise TraceError(f"the {what} is nested too deeply ({level} levels; at most {MAX_NESTING})")
            children = value.values() if isinstance(value, dict) else value
            stack.extend((v, level + 1) for v in children if isinstance(v, (dict, list)))


def to_plain(obj: Any) -> Any:
    """A record (or any nesting of records, tuples, dicts) as plain JSON-ready lists and dicts."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    return obj


def _show(value: Any) -> str:
    """A short, safe rendering of a bad value for a message."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        return f"an integer of {len(str(abs(value)))} digits"
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= 40 else text[:39] + "…"


def check_text(value: str, where: str, limit: int = MAX_TEXT_CHARS) -> str:
    """A string from a file: at most `limit` characters, valid Unicode (no unpaired surrogates, which JSON's
    \\uD800 escapes can make and nothing can encode)."""
    if len(value) > limit:
        raise TraceError(f"{where}: text of {plural(len(value), 'character')} (at most {limit})")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = ord(value[exc.start])
        raise TraceError(f"{where}: text holds an unpaired surrogate (U+{bad:04X}), which is not valid Unicode") from None
    return value


def _check_type(value: Any, annotation: str, where: str) -> Any:
    """Check a JSON value against a field annotation (the few forms records use); return it with lists
    turned into tuples. Raises TraceError naming the field."""
    annotation = annotation.strip()
    options = _split_top(annotation, "|")
    if len(options) > 1:
        if value is None and "None" in options:
            return None
        errors = []
        for option in (o for o in options if o != "None"):
            try:
                return _check_type(value, option, where)
            except TraceError as exc:
                errors.append(str(exc))
        if len(errors) == 1:  # one real option (X | None): its own message says what is wrong
            raise TraceError(errors[0] + (" (or null)" if "None" in options else ""))
        raise TraceError(f"{where}: expected {annotation}, got {_show(value)}")
    if annotation == "Any":
        return value
    if annotation == "bool":
        if not isinstance(value, bool):
            raise TraceError(f"{where}: expected true or false, got {_show(value)}")
        return value
    if annotation == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise TraceError(f"{where}: expected an integer, got {_show(value)}")
        if abs(value) > MAX_INT:
            raise TraceError(f"{where}: integer out of range ({_show(value)}; at most {MAX_INT} in size)")
        return value
    if annotation == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TraceError(f"{where}: expected a number, got {_show(value)}")
        number = float(value) if isinstance(value, float) or abs(value) <= MAX_INT else math.nan
        if not math.isfinite(number) and isinstance(value, float):
            raise TraceError(f"{where}: expected a finite number, got {_show(value)}")
        if not abs(number) <= MAX_INT:
            raise TraceError(f"{where}: number out of range ({_show(value)}; at most {MAX_INT:.3g} in size)")
        return number
    if annotation == "str":
        if not isinstance(value, str):
            raise TraceError(f"{where}: expected a string, got {_show(value)}")
        return check_text(value, where)
    if annotation.startswith("tuple[") and annotation.endswith(", ...]"):
        if not isinstance(value, list):
            raise TraceError(f"{where}: expected a list, got {_show(value)}")
        inner = annotation[len("tuple["):-len(", ...]")]
        if _plain_numbers(value, inner):  # the common case, at list speed (a report reads thousands of traces)
            return tuple(value)
        return tuple(_check_type(v, inner, f"{where}[{i}]") for i, v in enumerate(value))
    if annotation.startswith("dict["):
        if not isinstance(value, dict):
            raise TraceError(f"{where}: expected an object, got {_show(value)}")
        inner = _split_top(annotation[len("dict["):-1], ",")[1]
        return {check_text(k, f"{where} (a key)", MAX_TOKEN_CHARS): _check_type(v, inner, f"{where}.{k}")
                for k, v in value.items()}
    raise TypeError(f"unsupported annotation {annotation}")  # a bug in this module, not in the file


def _check_plain(value: Any, where: str) -> None:
    """A free-form value (settings): JSON scalars, lists and objects of them; integers and strings in range (no
    NaN / infinity, no unpaired surrogates)."""
    stack = [(value, where)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, int):
            _check_type(v, "int", at)
        elif isinstance(v, float):
            _check_type(v, "float", at)
        elif isinstance(v, str):
            check_text(v, at)
        elif isinstance(v, list):
            stack.extend((x, f"{at}[{i}]") for i, x in enumerate(v))
        elif isinstance(v, dict):
            for k, x in v.items():
                check_text(k, f"{at} (a key)", MAX_TOKEN_CHARS)
                stack.append((x, f"{at}.{k}"))


def _plain_numbers(values: list, inner: str) -> bool:
    """Whether every entry already is what _check_type would return for `inner` ("int": ints in range; "float":
    finite floats in range), so the list is checked without a call per entry. False: check entry by entry (which
    also says which entry is wrong)."""
    if inner == "int":
        return all(type(v) is int for v in values) and all(-MAX_INT <= v <= MAX_INT for v in values)
    if inner == "float":
        return all(type(v) is float for v in values) and all(-MAX_INT <= v <= MAX_INT for v in values)
    return False


@functools.lru_cache(maxsize=256)
def _split_top(text: str, sep: str) -> tuple[str, ...]:
    """Split on `sep` outside brackets (the few annotations records use: cached)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == sep and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return (*parts, cur.strip())


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


def _build(cls, data: Any, where: str, nested: dict[str, Any]):
    """Build dataclass `cls` from a JSON object, type-checking every field; clear errors."""
    if not isinstance(data, dict):
        raise TraceError(f"{where}: expected an object, got {type(data).__name__}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise TraceError(f"{where}: missing field '{f.name}'")
            continue
        value = data[f.name]
        limit = LIST_LIMITS.get(f.name)
        if limit is not None and isinstance(value, (list, dict)) and len(value) > limit:
            raise TraceError(f"{where}.{f.name}: {plural(len(value), 'entry')}; a trace may hold at most {limit} "
                             "(docs/ARCHITECTURE.md, input limits)")
        if f.name in nested:
            sub_cls = nested[f.name]
            if not isinstance(value, list):
                raise TraceError(f"{where}.{f.name}: expected a list")
            value = tuple(sub_cls(v, f"{where}.{f.name}[{i}]") for i, v in enumerate(value))
        else:
            value = _check_type(value, f.type, f"{where}.{f.name}")
        kwargs[f.name] = value
    return cls(**kwargs)


def _tensor(d, where):
    return _build(TensorInfo, d, where, {})


def _layer(d, where):
    return _build(LayerCache, d, where, {"tensors": _tensor})


def _node(d, where):
    return _build(TreeNode, d, where, {})


def step_from_dict(d: Any, where: str = "step") -> StepRecord:
    """A StepRecord from its JSON form, type-checked and validated on its own (validate_step)."""
    step = _build(
        StepRecord, d, where, {"nodes": _node, "cache": _layer, "cache_before_commit": _layer}
    )
    validate_step(step, where)
    return step


# ------------------------------------------------------------------------------------------------------------
# Validation: a record against the invariants the engine guarantees (the trace contract's "what load refuses")
# ------------------------------------------------------------------------------------------------------------

LOGPROB_SLACK = 1e-3  # a log-prob or probability may pass 0 / 1 by float rounding, no more


def _token_id(value: int, where: str) -> None:
    if not 0 <= value <= MAX_TOKEN_ID:
        raise TraceError(f"{where}: token id {value} is out of range (0..{MAX_TOKEN_ID})")


def _token_ids(values, where: str) -> None:
    for i, v in enumerate(values):
        if not 0 <= v <= MAX_TOKEN_ID:
            _token_id(v, f"{where}[{i}]")


def _at_least(value, lo, where: str, what: str = "") -> None:
    if value < lo:
        raise TraceError(f"{where}: {what or 'value'} {value} is below {lo}")


def validate_step(step: StepRecord, where: str = "step") -> None:
    """One round against the engine's invariants: a rooted tree numbered parents first (invariant 6), depths that
    follow the parents, per-position arrays of one entry per position, an accepted path that is a parent chain
    from the root and is where the target's choices lead, the bonus the target's choice at its end, the tokens
    the round added taken from that path, sizes within the limits, log-probs <= 0, probabilities in [0, 1].
    TraceError naming the first violation."""
    parents = _check_tree(step, where)
    _check_positions(step, where)
    _check_path(step, parents, where)
    _check_round_extras(step, where)


def _check_tree(step: StepRecord, where: str) -> list[int]:
    """The round's header and its tree: a root first, ids in order, parents before children, depths that follow
    the parents, the root holding the round's root token. Returns the parent list."""
    n = len(step.nodes)
    if n == 0 or step.nodes[0].parent != -1:
        raise TraceError(f"{where}: the first node must be the root (parent -1)")
    if n > MAX_NODES:
        raise TraceError(f"{where}.nodes: {n} tree positions; a round may hold at most {MAX_NODES}")
    _at_least(step.index, 0, f"{where}.index", "round index")
    _at_least(step.committed_len, 1, f"{where}.committed_len", "committed length")
    _token_id(step.root_token_id, f"{where}.root_token_id")
    _token_id(step.bonus_token_id, f"{where}.bonus_token_id")
    parents = []
    for i, node in enumerate(step.nodes):
        at = f"{where}.nodes[{i}]"
        if node.id != i:
            raise TraceError(f"{where}: node ids must be 0..{n - 1} in order (node {i} has id {node.id})")
        if i > 0 and not 0 <= node.parent < i:
            raise TraceError(f"{where}: node {i} has parent {node.parent}, which does not precede it")
        parents.append(node.parent)
        _token_id(node.token_id, f"{at}.token_id")
        check_text(node.token, f"{at}.token", MAX_TOKEN_CHARS)
        if i == 0:
            if node.rank != -1 or node.logprob != 0.0:
                raise TraceError(f"{at}: the root has rank -1 and log-prob 0, not rank {node.rank}, log-prob {node.logprob}")
        else:
            _at_least(node.rank, 0, f"{at}.rank", "rank")
            if node.logprob > LOGPROB_SLACK:
                raise TraceError(f"{at}.logprob: a log-prob is at most 0, not {node.logprob}")
    check_parents(parents)  # the same rule the engine's trees obey (invariant 6); checked above with clearer words
    depths = depths_of(parents)
    for i, node in enumerate(step.nodes):
        if node.depth != depths[i]:
            raise TraceError(f"{where}.nodes[{i}].depth: {node.depth}, but its parents put it at depth {depths[i]}")
        if depths[i] > MAX_DEPTH:
            raise TraceError(f"{where}.nodes[{i}]: depth {depths[i]}; a tree may be at most {MAX_DEPTH} deep")
    if step.nodes[0].token_id != step.root_token_id:
        raise TraceError(f"{where}: the root node holds token {step.nodes[0].token_id}, "
                         f"but root_token_id is {step.root_token_id}")
    return parents


def _check_positions(step: StepRecord, where: str) -> None:
    """The per-position arrays (one entry per tree position), the top-k rows (matching entry for entry, within
    MAX_TOP_K), log-probs <= 0, probabilities in [0, 1], and the budget curve's keys 1..B."""
    n = len(step.nodes)
    for name in ("target_argmax", "target_margin", "target_choice", "target_prob", "selector_unary", "selector_pair"):
        values = getattr(step, name)
        if len(values) != n and (name == "target_argmax" or values):
            raise TraceError(f"{where}: {name} has {plural(len(values), 'entry')} for {plural(n, 'node')}")
    _token_ids(step.target_argmax, f"{where}.target_argmax")
    _token_ids(step.target_choice, f"{where}.target_choice")
    for i, m in enumerate(step.target_margin):
        _at_least(m, 0.0, f"{where}.target_margin[{i}]", "a top-1 minus top-2 margin")
    for i, prob in enumerate(step.target_prob):
        if not -LOGPROB_SLACK <= prob <= 1 + LOGPROB_SLACK:
            raise TraceError(f"{where}.target_prob[{i}]: a probability is in [0, 1], not {prob}")
    if step.target_prob and not step.target_choice:
        raise TraceError(f"{where}: target_prob without target_choice")
    for ids_name, values_name, rows in (("draft_top_ids", "draft_top_logprobs", None),
                                        ("target_top_ids", "target_top_probs", n)):
        ids, values = getattr(step, ids_name), getattr(step, values_name)
        if rows is not None and ids and len(ids) != rows:
            raise TraceError(f"{where}: {ids_name} has {plural(len(ids), 'row')} for {plural(n, 'node')}")
        if len(values) != len(ids) or any(len(a) != len(b) for a, b in zip(ids, values)):
            raise TraceError(f"{where}: {values_name} does not match {ids_name} entry for entry")
        for r, row in enumerate(ids):
            if len(row) > MAX_TOP_K:
                raise TraceError(f"{where}.{ids_name}[{r}]: {plural(len(row), 'entry')}; a trace may hold at most "
                                 f"{MAX_TOP_K}")
            _token_ids(row, f"{where}.{ids_name}[{r}]")
    for r, row in enumerate(step.draft_top_logprobs):
        if any(v > LOGPROB_SLACK for v in row):
            raise TraceError(f"{where}.draft_top_logprobs[{r}]: a log-prob is at most 0")
    for r, row in enumerate(step.target_top_probs):
        if any(not -LOGPROB_SLACK <= v <= 1 + LOGPROB_SLACK for v in row):
            raise TraceError(f"{where}.target_top_probs[{r}]: a probability is in [0, 1]")
    if any(not k.isdigit() or not isinstance(v, int) or v < 0 for k, v in step.budget_curve.items()):
        raise TraceError(f"{where}: budget_curve must map budgets (whole numbers as strings) to token counts")
    if step.budget_curve and sorted(int(k) for k in step.budget_curve) != list(range(1, len(step.budget_curve) + 1)):
        raise TraceError(f"{where}.budget_curve: the budgets must be 1, 2, ..., {len(step.budget_curve)}, none missing")


def _check_path(step: StepRecord, parents: list[int], where: str) -> None:
    """The accepted path: from the root along parents, where the target's choices lead; the bonus the choice at
    its end; the tokens the round added taken from that path."""
    n = len(step.nodes)
    if not step.accepted or step.accepted[0] != 0 or any(not 0 <= a < n for a in step.accepted):
        raise TraceError(f"{where}: accepted path must start at the root and name existing nodes")
    if not is_parent_chain(parents, step.accepted):
        raise TraceError(f"{where}.accepted: {_show(list(step.accepted))} is not a path from the root "
                         "(each position must be a child of the one before it)")
    token_ids = [node.token_id for node in step.nodes]
    walked, bonus = follow(parents, token_ids, step.choices)
    if tuple(walked) != step.accepted:
        raise TraceError(f"{where}.accepted: {_show(list(step.accepted))}, but the target's choices lead along "
                         f"{_show(walked)}")
    if bonus != step.bonus_token_id:
        raise TraceError(f"{where}.bonus_token_id: {step.bonus_token_id}, but the target's choice at the last "
                         f"accepted position is {bonus}")
    gained = [token_ids[a] for a in step.accepted[1:]] + [step.bonus_token_id]
    if step.new_token_ids and tuple(gained[:len(step.new_token_ids)]) != step.new_token_ids:
        raise TraceError(f"{where}.new_token_ids: {_show(list(step.new_token_ids))} are not the accepted path's "
                         f"tokens and the bonus {_show(gained)}")


def _check_round_extras(step: StepRecord, where: str) -> None:
    """The round's method and verify mode, timings, the bonus's draft rank, the cache lists (one layer count) and
    the naive mode's state errors (one per layer)."""
    if step.method not in METHODS:
        raise TraceError(f"{where}.method: {_show(step.method)} (one of {', '.join(METHODS)})")
    if step.verify not in VERIFY_MODES:
        raise TraceError(f"{where}.verify: {_show(step.verify)} (one of {', '.join(VERIFY_MODES)})")
    if not isinstance(step.timings_ms, dict):
        raise TraceError(f"{where}: timings_ms must be an object")
    for name, ms in step.timings_ms.items():
        _at_least(ms, 0.0, f"{where}.timings_ms.{name}", "a time")
    if step.bonus_draft_rank is not None:
        _at_least(step.bonus_draft_rank, 0, f"{where}.bonus_draft_rank", "rank")
    if step.bonus_draft_logprob is not None and step.bonus_draft_logprob > LOGPROB_SLACK:
        raise TraceError(f"{where}.bonus_draft_logprob: a log-prob is at most 0, not {step.bonus_draft_logprob}")
    layers = 0
    for name in ("cache", "cache_before_commit"):
        _check_cache(getattr(step, name), f"{where}.{name}")
        layers = layers or len(getattr(step, name))
    if step.cache and step.cache_before_commit and len(step.cache) != len(step.cache_before_commit):
        raise TraceError(f"{where}: cache has {plural(len(step.cache), 'layer')}, cache_before_commit "
                         f"{len(step.cache_before_commit)}")
    if step.naive_state_error:
        if layers and len(step.naive_state_error) != layers:
            raise TraceError(f"{where}: naive_state_error has {plural(len(step.naive_state_error), 'entry')} for "
                             f"{plural(layers, 'layer')}")
        for i, e in enumerate(step.naive_state_error):
            if e is not None:
                _at_least(e, 0.0, f"{where}.naive_state_error[{i}]", "a distance")


def _check_cache(layers: tuple[LayerCache, ...], where: str) -> None:
    for j, layer in enumerate(layers):
        at = f"{where}[{j}]"
        if layer.layer != j:
            raise TraceError(f"{at}.layer: {layer.layer}, but the entries are layers 0, 1, ... in order")
        _at_least(layer.bytes, 0, f"{at}.bytes", "a size")
        if layer.kv_length is not None:
            _at_least(layer.kv_length, 0, f"{at}.kv_length", "a length")
        for t, tensor in enumerate(layer.tensors):
            for d, size in enumerate(tensor.shape):
                _at_least(size, 0, f"{at}.tensors[{t}].shape[{d}]", "a size")


# what the known settings may be (others are kept as they are: fields may be added within a schema version)
def _check_settings(settings: dict[str, Any], where: str) -> None:
    _check_plain(settings, where)

    def need(key, ok, what):
        if key in settings and not ok(settings[key]):
            raise TraceError(f"{where}.{key}: expected {what}, got {_show(settings[key])}")

    def whole(lo):
        return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= lo

    def number(lo, hi):
        return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and lo <= v <= hi

    need("budget", whole(1), "a whole number >= 1")
    need("block_size", lambda v: whole(2)(v) and v <= MAX_DEPTH + 1, f"a whole number from 2 to {MAX_DEPTH + 1}")
    need("max_new_tokens", whole(1), "a whole number >= 1")
    need("method", lambda v: v in METHODS, " or ".join(METHODS))
    need("tree_scoring", lambda v: v in TREE_SCORINGS, " or ".join(TREE_SCORINGS))
    need("drafter_family", lambda v: v in DRAFTER_FAMILIES, " or ".join(DRAFTER_FAMILIES))
    need("verify", lambda v: v in VERIFY_MODES, " or ".join(VERIFY_MODES))
    for key in ("dtype", "device", "engine", "reference"):
        need(key, lambda v: isinstance(v, str), "a string")
    need("temperature", number(0.0, 1e6), "a number >= 0")
    need("top_k", whole(0), "a whole number >= 0")
    need("top_p", lambda v: number(0.0, 1.0)(v) and v > 0, "a number in (0, 1]")
    need("seed", whole(0), "a whole number >= 0")
    need("noise", lambda v: v is None or isinstance(v, str), "a string or null")


def validate(trace: Trace) -> Trace:
    """The whole trace against its own invariants (those the engine guarantees, docs/ARCHITECTURE.md): each round
    (validate_step), rounds numbered 0, 1, ... in order, each starting where the previous one left the cache
    (committed length + its accepted path) from the token it ended on (its bonus), the output being the prefill's
    token plus what the rounds added, a first_divergence that is where output and reference first differ, cache
    lists of one entry per layer, sizes within the limits. Returns the trace; TraceError naming the first violation."""
    where = "trace"
    _check_fields(trace, where)
    _check_rounds(trace, where)
    _check_divergence(trace, where)
    return trace


def _check_fields(trace: Trace, where: str) -> None:
    """The trace's own fields: names, settings, token ids and texts, times, noise figures, the verdict's name,
    the total tree size, the output within max_new_tokens, the prefill's cache list."""
    for name in ("target", "draft"):
        check_text(getattr(trace, name), f"{where}.{name}", 4096)
    _check_settings(trace.settings, f"{where}.settings")
    _token_ids(trace.prompt_ids, f"{where}.prompt_ids")
    _token_ids(trace.output_ids, f"{where}.output_ids")
    if trace.greedy_ids is not None:
        _token_ids(trace.greedy_ids, f"{where}.greedy_ids")
    for key, text in trace.token_texts.items():
        check_text(text, f"{where}.token_texts.{key}", MAX_TOKEN_CHARS)
    _at_least(trace.prefill_ms, 0.0, f"{where}.prefill_ms", "a time")
    _at_least(trace.reference_ms, 0.0, f"{where}.reference_ms", "a time")
    for name in ("numerical_noise", "tree_drift"):
        if getattr(trace, name) is not None:
            _at_least(getattr(trace, name), 0.0, f"{where}.{name}", "a distance")
    for name in ("noise_positions", "drift_positions"):
        _at_least(getattr(trace, name), 0, f"{where}.{name}", "a count")
    if trace.invalid is not None:
        check_text(trace.invalid, f"{where}.invalid", 4096)
    if trace.divergence_verdict not in (None, VERDICT_NOISE, VERDICT_MISMATCH):
        raise TraceError(f"{where}.divergence_verdict: {_show(trace.divergence_verdict)} (one of null, "
                         f"{VERDICT_NOISE}, {VERDICT_MISMATCH})")
    _check_total_nodes([{"nodes": s.nodes} for s in trace.steps], where)
    max_new = trace.settings.get("max_new_tokens")
    if isinstance(max_new, int) and not isinstance(max_new, bool) and len(trace.output_ids) > max_new:
        raise TraceError(f"{where}.output_ids: {plural(len(trace.output_ids), 'token')}, more than its max_new_tokens "
                         f"{max_new}")
    _check_cache(trace.prefill_cache, f"{where}.prefill_cache")


def _check_rounds(trace: Trace, where: str) -> None:
    """The rounds in order, each starting where the previous one left the cache from the token it ended on, within
    the block size, cache lists of one layer count; the output the prefill's token plus what the rounds added."""
    block = trace.settings.get("block_size")
    layers = len(trace.prefill_cache)
    committed = len(trace.prompt_ids)
    made = 1  # output tokens the prefill and rounds account for; each round adds at least one
    exact = True  # every round says which tokens it added (new_token_ids), so the output is known exactly
    for i, step in enumerate(trace.steps):
        at = f"{where}.steps[{i}]"
        if step.index != i:
            raise TraceError(f"{at}.index: {step.index}, but rounds are numbered 0, 1, ... in order "
                             f"(this is round {i})")
        if i == 0:
            if not trace.prompt_ids:
                raise TraceError(f"{where}.prompt_ids: empty, but the trace has rounds")
            if not trace.output_ids:
                raise TraceError(f"{where}.output_ids: empty, but the trace has rounds (the prefill makes the first token)")
            if step.root_token_id != trace.output_ids[0]:
                raise TraceError(f"{at}.root_token_id: {step.root_token_id}, but round 1 starts from the prefill's "
                                 f"token, output_ids[0] = {trace.output_ids[0]}")
        else:
            before = trace.steps[i - 1]
            if step.root_token_id != before.bonus_token_id:
                raise TraceError(f"{at}.root_token_id: {step.root_token_id}, but round {i + 1} starts from round {i}'s "
                                 f"bonus token {before.bonus_token_id}")
            if before.new_token_ids and len(before.new_token_ids) < before.acceptance:
                raise TraceError(f"{where}.steps[{i - 1}].new_token_ids: cut short (the output ended), "
                                 "yet more rounds follow")
        if step.committed_len != committed:
            raise TraceError(f"{at}.committed_len: {step.committed_len}, but "
                             + (f"the prompt is {plural(committed, 'token')}" if i == 0 else
                                f"round {i} left {plural(committed, 'token')} in the cache "
                                f"({trace.steps[i - 1].committed_len} "
                                f"+ its accepted path of {trace.steps[i - 1].acceptance})"))
        if isinstance(block, int) and not isinstance(block, bool):
            deepest = max(node.depth for node in step.nodes)
            if deepest > block - 1:
                raise TraceError(f"{at}: a node at depth {deepest}, deeper than the block size {block} allows "
                                 f"({block - 1})")
        for name in ("cache", "cache_before_commit"):
            entries = len(getattr(step, name))
            if entries:
                layers = layers or entries
                if entries != layers:
                    raise TraceError(f"{at}.{name}: {plural(entries, 'layer')}, but the trace's cache lists have {layers}")
        if step.naive_state_error and layers and len(step.naive_state_error) != layers:
            raise TraceError(f"{at}: naive_state_error has {plural(len(step.naive_state_error), 'entry')} for "
                             f"{plural(layers, 'layer')}")
        committed += step.acceptance
        exact = exact and bool(step.new_token_ids)
        made += len(step.new_token_ids) if step.new_token_ids else 1
    if trace.steps:
        if exact:
            added = [t for s in trace.steps for t in s.new_token_ids]
            if list(trace.output_ids[1:]) != added:
                raise TraceError(f"{where}.output_ids: {plural(len(trace.output_ids), 'token')}, but they are not the "
                                 f"prefill's token followed by the {len(added)} the rounds added (new_token_ids)")
        elif len(trace.output_ids) < made:
            raise TraceError(f"{where}.output_ids: {plural(len(trace.output_ids), 'token')}, fewer than the {made} its "
                             "rounds "
                             "produced")


def _check_divergence(trace: Trace, where: str) -> None:
    """first_divergence (and the margin and verdict on it) where output and reference first differ. A reference
    still decoding (reference_pending: the live page) is compared as far as it goes."""
    out, ref, recorded = trace.output_ids, trace.greedy_ids, trace.first_divergence
    if ref is None:
        if recorded is not None:
            raise TraceError(f"{where}.first_divergence: {recorded}, but there is no reference (greedy_ids is null)")
        if trace.divergence_verdict is not None:
            raise TraceError(f"{where}.divergence_verdict: given, but there is no reference (greedy_ids is null)")
        return
    if trace.reference_pending:
        if len(ref) >= len(out):
            raise TraceError(f"{where}.reference_pending: true, but greedy_ids already covers the output")
        out = out[:len(ref)]
    common = min(len(out), len(ref))
    actual = next((i for i in range(common) if out[i] != ref[i]), None)
    if actual is None and len(out) != len(ref):
        actual = common
    if recorded != actual:
        said = "identical" if actual is None else f"first different at token {actual}"
        raise TraceError(f"{where}.first_divergence: {recorded}, but output_ids and greedy_ids are {said}")
    if actual is not None and actual == len(ref) < len(out):
        raise TraceError(f"{where}.greedy_ids: {plural(len(ref), 'token')}, all equal to the output's first ones, yet "
                         "the output "
                         "goes on (the reference stops early only at end of text, where the output stops too)")
    if actual is None:
        for name in ("divergence_margin", "divergence_verdict"):
            if getattr(trace, name) is not None:
                raise TraceError(f"{where}.{name}: given, but the output is identical to its reference")
    if trace.divergence_margin is not None:
        _at_least(trace.divergence_margin, 0.0, f"{where}.divergence_margin", "a margin")


VERDICT_NOISE, VERDICT_MISMATCH = "noise", "mismatch"


def verdict_text(trace: Trace) -> str | None:
    """The verdict on a trace's first divergence in words, with its evidence; None when nothing diverges."""
    if trace.first_divergence is None or trace.greedy_ids is None:
        return None
    return verdict_words(trace.divergence_verdict, trace.divergence_margin, trace.numerical_noise, trace.noise_positions)


def verdict_words(verdict: str | None, margin: float | None, noise: float | None, positions: int) -> str:
    """'within numerical noise (margin m <= noise n, ...)', 'beyond numerical noise: mismatch (...)', or why
    there is no verdict."""
    if verdict == VERDICT_NOISE and margin == 0.0:
        return "within numerical noise: an exact tie (the reference's top two choices are equal, margin 0)"
    if verdict == VERDICT_NOISE:
        return (f"within numerical noise (margin {margin:.3g} <= noise {noise:.3g}, measured over "
                f"{plural(positions, 'position')})")
    if verdict == VERDICT_MISMATCH:
        return (f"beyond numerical noise: mismatch (margin {margin:.3g} > noise {noise:.3g}, measured over "
                f"{plural(positions, 'position')})")
    if margin is None:
        return "no verdict: no reference margin there (the reference ended, or one token was left to choose)"
    return "no verdict yet: no numerical noise measured so far (it needs stretches of two or more tokens)"


def reference_of(settings: dict[str, Any]) -> str:
    """What a trace's reference ran on: 'runner' or 'transformers' (older traces: transformers' forward)."""
    return settings.get("reference", "transformers")


# Sampling settings (docs/SAMPLING.md): a trace without them (older, or greedy) was decoded greedily.
GREEDY_SAMPLING = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0, "noise": None}


def sampling_of(settings: dict[str, Any]) -> dict[str, Any]:
    """temperature, top_k, top_p, seed and noise scheme from a trace's settings (greedy where absent)."""
    return {key: settings.get(key, default) for key, default in GREEDY_SAMPLING.items()}


def is_sampled(settings: dict[str, Any]) -> bool:
    return bool(sampling_of(settings)["temperature"])


def sampling_label(settings: dict[str, Any]) -> str:
    """'greedy', or e.g. 'sampling (T 0.7, top-k 50, top-p 0.9, seed 5)' (filters that are off are left out)."""
    s = sampling_of(settings)
    if not s["temperature"]:
        return "greedy"
    parts = [f"T {s['temperature']:g}"]
    parts += [f"top-k {s['top_k']}"] if s["top_k"] else []
    parts += [f"top-p {s['top_p']:g}"] if s["top_p"] < 1 else []
    parts.append(f"seed {s['seed']}")
    return f"sampling ({', '.join(parts)})"


def sampling_flags(settings: dict[str, Any]) -> str:
    """The `run` options that reproduce the trace's choices, e.g. '--temperature 0.7 --top-p 0.9 --seed 5'."""
    s = sampling_of(settings)
    return (f"--temperature {s['temperature']:g} --top-k {s['top_k']} --top-p {s['top_p']:g} --seed {s['seed']}"
            if s["temperature"] else "--temperature 0")


def trace_from_dict(data: Any) -> Trace:
    if not isinstance(data, dict):
        raise TraceError("the trace must be a JSON object")
    if data.get("kind") == COMPARE_KIND:
        raise TraceError("this is a compare trace (two sessions): open it with replay or the page")
    _check_version(data)
    _check_total_nodes(data.get("steps"), "trace")
    trace = _build(Trace, data, "trace", {"steps": step_from_dict, "prefill_cache": _layer})
    for i, m in enumerate(trace.messages):
        if set(m) != {"role", "content"}:
            raise TraceError(f"trace.messages[{i}]: expected an object with 'role' and 'content' only")
    return validate(trace)


def _check_total_nodes(steps: Any, where: str) -> None:
    """MAX_TOTAL_NODES over the rounds' node lists as parsed, before any node is built and checked: a trace just
    past the limit is refused at once, not after validating all of it (validate checks the built trace again)."""
    if not isinstance(steps, list):
        return
    total = sum(len(s["nodes"]) for s in steps if isinstance(s, dict) and isinstance(s.get("nodes"), (list, tuple)))
    if total > MAX_TOTAL_NODES:
        raise TraceError(f"{where}: {total} tree positions over all rounds; a trace may hold at most {MAX_TOTAL_NODES}")


def _check_version(data: dict) -> None:
    version = data.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise TraceError("the trace has no integer 'schema_version': not a ddtree-viz trace")
    if version > SCHEMA_VERSION:
        raise TraceError(
            f"the trace has schema_version {version}, newer than this ddtree-viz understands "
            f"({SCHEMA_VERSION}); upgrade ddtree-viz to read it"
        )
    if version < 1:
        raise TraceError(f"unsupported schema_version {version}")

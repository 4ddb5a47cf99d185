"""Records: the plain data the engine yields and every renderer, exporter and replayer reads.

Everything here is a frozen dataclass of ints, floats, strings, tuples and dicts of those, so a
session can be written to JSON and replayed later with no model loaded. The layout is the trace
contract of docs/ARCHITECTURE.md; fields may be added (readers ignore what they do not know), none renamed.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import TraceError

SCHEMA_VERSION = 1


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

    @property
    def choices(self) -> tuple[int, ...]:
        """The target's choice at each tree position: its sample when sampling, else its argmax."""
        return self.target_choice or self.target_argmax

    @property
    def acceptance(self) -> int:
        """Tokens gained this round per target forward (accepted drafts + the bonus)."""
        return len(self.accepted)


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
    schema_version: int = SCHEMA_VERSION

    def to_json(self, indent: int | None = None) -> str:
        return dumps(to_plain(self), indent)

    @classmethod
    def from_json(cls, text: str) -> "Trace":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(f"the trace is not valid JSON: {exc}") from None
        return trace_from_dict(data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json(indent=1), encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> "Trace":
        return cls.from_json(_read(path))


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


def load_any(path: str | Path) -> Trace | CompareTrace:
    """A trace file or a compare trace file, checked (TraceError naming the problem)."""
    return any_from_json(_read(path))


def any_from_json(text: str) -> Trace | CompareTrace:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"the trace is not valid JSON: {exc}") from None
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


def _read(path: str | Path) -> str:
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"trace file not found: {path}")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"cannot read trace file {path}: {exc}") from None


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


def to_plain(obj: Any) -> Any:
    """A record (or any nesting of records, tuples, dicts) as plain JSON-ready lists and dicts."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    return obj


def _check_type(value: Any, annotation: str, where: str) -> Any:
    """Check a JSON value against a field annotation (the few forms records use); return it with lists
    turned into tuples. Raises TraceError naming the field."""
    annotation = annotation.strip()
    options = _split_top(annotation, "|")
    if len(options) > 1:
        if value is None and "None" in options:
            return None
        for option in (o for o in options if o != "None"):
            try:
                return _check_type(value, option, where)
            except TraceError:
                pass
        raise TraceError(f"{where}: expected {annotation}, got {json.dumps(value)[:40]}")
    if annotation == "Any":
        return value
    if annotation == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise TraceError(f"{where}: expected an integer, got {json.dumps(value)[:40]}")
        return value
    if annotation == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TraceError(f"{where}: expected a number, got {json.dumps(value)[:40]}")
        return float(value)
    if annotation == "str":
        if not isinstance(value, str):
            raise TraceError(f"{where}: expected a string, got {json.dumps(value)[:40]}")
        return value
    if annotation.startswith("tuple[") and annotation.endswith(", ...]"):
        if not isinstance(value, list):
            raise TraceError(f"{where}: expected a list, got {json.dumps(value)[:40]}")
        inner = annotation[len("tuple["):-len(", ...]")]
        return tuple(_check_type(v, inner, f"{where}[{i}]") for i, v in enumerate(value))
    if annotation.startswith("dict["):
        if not isinstance(value, dict):
            raise TraceError(f"{where}: expected an object, got {json.dumps(value)[:40]}")
        inner = _split_top(annotation[len("dict["):-1], ",")[1]
        return {k: _check_type(v, inner, f"{where}.{k}") for k, v in value.items()}
    raise TypeError(f"unsupported annotation {annotation}")  # a bug in this module, not in the file


def _split_top(text: str, sep: str) -> list[str]:
    """Split on `sep` outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == sep and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return parts + [cur.strip()]


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
    """A StepRecord from its JSON form, type-checked (TraceError on anything malformed)."""
    step = _build(
        StepRecord, d, where, {"nodes": _node, "cache": _layer, "cache_before_commit": _layer}
    )
    _check_step(step, where)
    return step


def _check_step(step: StepRecord, where: str) -> None:
    n = len(step.nodes)
    if n == 0 or step.nodes[0].parent != -1:
        raise TraceError(f"{where}: the first node must be the root (parent -1)")
    for i, node in enumerate(step.nodes):
        if node.id != i:
            raise TraceError(f"{where}: node ids must be 0..{n - 1} in order")
        if i > 0 and not 0 <= node.parent < i:
            raise TraceError(f"{where}: node {i} has parent {node.parent}, which does not precede it")
    for name in ("target_argmax", "target_choice", "target_prob"):
        values = getattr(step, name)
        if len(values) != n and (name == "target_argmax" or values):
            raise TraceError(f"{where}: {name} has {len(values)} entries for {n} nodes")
    for ids_name, values_name, rows in (("draft_top_ids", "draft_top_logprobs", None),
                                        ("target_top_ids", "target_top_probs", n)):
        ids, values = getattr(step, ids_name), getattr(step, values_name)
        if rows is not None and ids and len(ids) != rows:
            raise TraceError(f"{where}: {ids_name} has {len(ids)} rows for {n} nodes")
        if len(values) != len(ids) or any(len(a) != len(b) for a, b in zip(ids, values)):
            raise TraceError(f"{where}: {values_name} does not match {ids_name} entry for entry")
    if any(not k.isdigit() or not isinstance(v, int) for k, v in step.budget_curve.items()):
        raise TraceError(f"{where}: budget_curve must map budgets (whole numbers as strings) to token counts")
    if not step.accepted or step.accepted[0] != 0 or any(not 0 <= a < n for a in step.accepted):
        raise TraceError(f"{where}: accepted path must start at the root and name existing nodes")
    if not isinstance(step.timings_ms, dict):
        raise TraceError(f"{where}: timings_ms must be an object")


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
    return _build(Trace, data, "trace", {"steps": step_from_dict, "prefill_cache": _layer})


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

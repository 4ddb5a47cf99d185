"""A trace's JSON text, in and out, with no knowledge of the records' meaning: the writer's layout (dumps), the
reader (parse_json: size and nesting bounded), a file read within MAX_TRACE_BYTES, records as plain data (to_plain),
and a JSON value checked against a record field's annotation (check_type; build: a dataclass from a JSON object).
Every failure is a TraceError naming where it is."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path
from typing import Any, Callable

from ..words import plural
from ..errors import TraceError
from ..files import read_limited
from .schema import LIST_LIMITS, MAX_INT, MAX_NESTING, MAX_TEXT_CHARS, MAX_TOKEN_CHARS, MAX_TRACE_BYTES


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


def show(value: Any) -> str:
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


def check_type(value: Any, annotation: str, where: str) -> Any:
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
                return check_type(value, option, where)
            except TraceError as exc:
                errors.append(str(exc))
        if len(errors) == 1:  # one real option (X | None): its own message says what is wrong
            raise TraceError(errors[0] + (" (or null)" if "None" in options else ""))
        raise TraceError(f"{where}: expected {annotation}, got {show(value)}")
    if annotation == "Any":
        return value
    if annotation == "bool":
        if not isinstance(value, bool):
            raise TraceError(f"{where}: expected true or false, got {show(value)}")
        return value
    if annotation == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise TraceError(f"{where}: expected an integer, got {show(value)}")
        if abs(value) > MAX_INT:
            raise TraceError(f"{where}: integer out of range ({show(value)}; at most {MAX_INT} in size)")
        return value
    if annotation == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TraceError(f"{where}: expected a number, got {show(value)}")
        number = float(value) if isinstance(value, float) or abs(value) <= MAX_INT else math.nan
        if not math.isfinite(number) and isinstance(value, float):
            raise TraceError(f"{where}: expected a finite number, got {show(value)}")
        if not abs(number) <= MAX_INT:
            raise TraceError(f"{where}: number out of range ({show(value)}; at most {MAX_INT:.3g} in size)")
        return number
    if annotation == "str":
        if not isinstance(value, str):
            raise TraceError(f"{where}: expected a string, got {show(value)}")
        return check_text(value, where)
    if annotation.startswith("tuple[") and annotation.endswith(", ...]"):
        if not isinstance(value, list):
            raise TraceError(f"{where}: expected a list, got {show(value)}")
        inner = annotation[len("tuple["):-len(", ...]")]
        if _plain_numbers(value, inner):  # the common case, at list speed (a report reads thousands of traces)
            return tuple(value)
        return tuple(check_type(v, inner, f"{where}[{i}]") for i, v in enumerate(value))
    if annotation.startswith("dict["):
        if not isinstance(value, dict):
            raise TraceError(f"{where}: expected an object, got {show(value)}")
        inner = _split_top(annotation[len("dict["):-1], ",")[1]
        return {check_text(k, f"{where} (a key)", MAX_TOKEN_CHARS): check_type(v, inner, f"{where}.{k}")
                for k, v in value.items()}
    raise TypeError(f"unsupported annotation {annotation}")  # a bug in this module, not in the file


def check_plain(value: Any, where: str) -> None:
    """A free-form value (settings): JSON scalars, lists and objects of them; integers and strings in range (no
    NaN / infinity, no unpaired surrogates)."""
    stack = [(value, where)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, int):
            check_type(v, "int", at)
        elif isinstance(v, float):
            check_type(v, "float", at)
        elif isinstance(v, str):
            check_text(v, at)
        elif isinstance(v, list):
            stack.extend((x, f"{at}[{i}]") for i, x in enumerate(v))
        elif isinstance(v, dict):
            for k, x in v.items():
                check_text(k, f"{at} (a key)", MAX_TOKEN_CHARS)
                stack.append((x, f"{at}.{k}"))


def _plain_numbers(values: list, inner: str) -> bool:
    """Whether every entry already is what check_type would return for `inner` ("int": ints in range; "float":
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


def build(cls, data: Any, where: str, nested: dict[str, Any]):
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
            value = check_type(value, f.type, f"{where}.{f.name}")
        kwargs[f.name] = value
    return cls(**kwargs)


def read_trace_text(path: str | Path, name: str | None = None) -> str:
    """A trace file's text: at most MAX_TRACE_BYTES, UTF-8; messages call it `name` (default: its path)."""
    shown = name if name is not None else str(path)
    return read_limited(path, MAX_TRACE_BYTES, "trace file", shown=shown, error=TraceError,
                        too_large=lambda size: f"trace file {shown} is {plural(size, 'byte')}; a trace may be at most "
                                               f"{MAX_TRACE_BYTES // 2**20} MiB ({MAX_TRACE_BYTES:,} bytes)")


def named(load: Callable[[], Any], path: str | Path, name: str | None) -> Any:
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

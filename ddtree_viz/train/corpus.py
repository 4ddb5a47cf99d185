"""The training corpus: the Python standard library's own source, as installed with CPython.

How it is built (deterministic given the interpreter):
  * root = ``sysconfig.get_paths()["stdlib"]`` of the interpreter that runs the build (the shipped
    assets were built from CPython 3.11.7);
  * every ``*.py`` file below root, walked with ``os.walk`` and sorted by relative POSIX path;
  * skipped: any path with a directory component ``site-packages``, ``dist-packages``, ``test``,
    ``tests`` or ``idle_test`` (the regression suites), ``__pycache__``; files that are not valid
    UTF-8 (none in 3.11.7 once the tests are out);
  * text is the file's bytes decoded as UTF-8, unchanged (no newline or whitespace normalisation);
  * split: a file is held out for evaluation when ``sha256(relpath)`` read as an integer is
    ``< 5%`` of its range (``int(hexdigest[:8], 16) % 100 < 5``); everything else is train.

The result is written as xz-compressed JSON lines (one object per file: path, split, sha256,
text) plus a manifest with the interpreter version and counts, so it can be carried to a machine
whose own stdlib differs.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import platform
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})
HOLDOUT_PERCENT = 5


@dataclass(frozen=True)
class Doc:
    path: str
    split: str
    text: str


def split_of(relpath: str) -> str:
    h = int(hashlib.sha256(relpath.encode("utf-8")).hexdigest()[:8], 16)
    return "eval" if h % 100 < HOLDOUT_PERCENT else "train"


def iter_stdlib_files(root: str | Path) -> list[str]:
    root = Path(root)
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        if any(part in EXCLUDED_DIRS for part in rel_dir.parts):
            dirnames[:] = []
            continue
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)
        for name in filenames:
            if name.endswith(".py"):
                out.append((rel_dir / name).as_posix())
    return sorted(out)


def build_corpus(root: str | Path | None = None) -> tuple[list[Doc], dict]:
    root = Path(root or sysconfig.get_paths()["stdlib"])
    docs: list[Doc] = []
    skipped: list[str] = []
    for rel in iter_stdlib_files(root):
        data = (root / rel).read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            skipped.append(rel)
            continue
        docs.append(Doc(rel, split_of(rel), text))
    digest = hashlib.sha256()
    for d in docs:
        digest.update(d.path.encode() + b"\0" + d.text.encode("utf-8") + b"\0")
    manifest = {
        "source": "CPython standard library *.py (tests and site-packages excluded)",
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "stdlib_root": str(root),
        "excluded_dirs": sorted(EXCLUDED_DIRS),
        "holdout": f"int(sha256(relpath).hexdigest()[:8], 16) % 100 < {HOLDOUT_PERCENT}",
        "files": len(docs),
        "train_files": sum(d.split == "train" for d in docs),
        "eval_files": sum(d.split == "eval" for d in docs),
        "train_chars": sum(len(d.text) for d in docs if d.split == "train"),
        "eval_chars": sum(len(d.text) for d in docs if d.split == "eval"),
        "skipped_not_utf8": skipped,
        "sha256": digest.hexdigest(),
    }
    return docs, manifest


def write_corpus(docs: list[Doc], manifest: dict, out_dir: str | Path) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "corpus.jsonl.xz"
    with lzma.open(path, "wt", encoding="utf-8", preset=6) as f:
        for d in docs:
            f.write(json.dumps({"path": d.path, "split": d.split, "text": d.text}, ensure_ascii=False) + "\n")
    (out_dir / "corpus-manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return path


def read_corpus(path: str | Path) -> list[Doc]:
    path = Path(path)
    if path.is_dir():
        path = path / "corpus.jsonl.xz"
    with lzma.open(path, "rt", encoding="utf-8") as f:
        return [Doc(o["path"], o["split"], o["text"]) for o in map(json.loads, f)]

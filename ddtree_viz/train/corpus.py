"""The training corpus: the Python standard library's own source, as installed with CPython.

How it is built (deterministic given the interpreter):
  * root = ``sysconfig.get_paths()["stdlib"]`` of the interpreter that runs the build (the shipped
    assets were built from CPython 3.11.7);
  * every ``*.py`` file below root, walked with ``os.walk`` and sorted by relative POSIX path;
  * skipped: any path with a directory component ``site-packages``, ``dist-packages`` or
    ``__pycache__``; files that are not valid UTF-8 (a few encoding tests);
  * source: ``test`` for a path with a directory component ``test``, ``tests`` or ``idle_test``
    (the regression suites), ``lib`` for the rest (the library itself);
  * text is the file's bytes decoded as UTF-8, unchanged (no newline or whitespace normalisation);
  * split, from ``h = int(sha256(relpath).hexdigest()[:8], 16) % 100``: library files with
    ``h < 5`` are held out for evaluation (``eval``); library files with ``5 <= h < 10`` and test
    files with ``h < 10`` are ``draft``: prompts for the drafter's training data, which the target
    never trains on, so that the drafter learns how the target continues text it has not seen
    (as at run time); everything else is ``train`` (the target's training text). The tokenizer is
    trained on the library's ``train`` + ``draft`` files.

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

EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
TEST_DIRS = frozenset({"test", "tests", "idle_test"})
HOLDOUT_PERCENT = 5  # library files held out for evaluation
DRAFT_PERCENT = 5  # the next 5 % of library files: drafter prompts
TEST_DRAFT_PERCENT = 10  # test files for drafter prompts
SPLITS = ("train", "draft", "eval")


@dataclass(frozen=True)
class Doc:
    path: str
    split: str
    text: str

    @property
    def source(self) -> str:
        return source_of(self.path)


def source_of(relpath: str) -> str:
    return "test" if any(part in TEST_DIRS for part in relpath.split("/")[:-1]) else "lib"


def split_of(relpath: str) -> str:
    h = int(hashlib.sha256(relpath.encode("utf-8")).hexdigest()[:8], 16) % 100
    if source_of(relpath) == "test":
        return "draft" if h < TEST_DRAFT_PERCENT else "train"
    if h < HOLDOUT_PERCENT:
        return "eval"
    return "draft" if h < HOLDOUT_PERCENT + DRAFT_PERCENT else "train"


def tokenizer_texts(docs: list[Doc]) -> list[str]:
    """What the tokenizer is trained on: the library's files outside the evaluation split."""
    return [d.text for d in docs if d.source == "lib" and d.split != "eval"]


def corpus_counts(docs: list[Doc]) -> dict[str, dict[str, int]]:
    """Files and characters per ``source/split`` (``lib/train``, ``test/draft``, ...)."""
    counts: dict[str, dict[str, int]] = {}
    for d in docs:
        c = counts.setdefault(f"{d.source}/{d.split}", {"files": 0, "chars": 0})
        c["files"] += 1
        c["chars"] += len(d.text)
    return dict(sorted(counts.items()))


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
        "source": "CPython standard library *.py, regression tests included (site-packages excluded)",
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "stdlib_root": str(root),
        "excluded_dirs": sorted(EXCLUDED_DIRS),
        "test_dirs": sorted(TEST_DIRS),
        "splits": f"h = int(sha256(relpath).hexdigest()[:8], 16) % 100; library: eval h < {HOLDOUT_PERCENT}, "
                  f"draft h < {HOLDOUT_PERCENT + DRAFT_PERCENT}, else train; tests: draft h < {TEST_DRAFT_PERCENT}, "
                  "else train",
        "files": len(docs),
        "counts": corpus_counts(docs),
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

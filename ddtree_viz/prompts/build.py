"""Rebuild the shipped prompt sets from the interpreter's standard library (deterministic for CPython 3.11.7):
`python -m ddtree_viz.prompts.build`. Prompts are cut from the held-out (`eval`) split of the embedded pair's
corpus (ddtree_viz/train/corpus.py), which neither the target nor the drafter trained on."""

from __future__ import annotations

import json
import re
import sysconfig
from pathlib import Path

from ddtree_viz.train.corpus import iter_stdlib_files, split_of
from ddtree_viz.words import plural

HERE = Path(__file__).parent
PER_SET = 16
DEF = re.compile(r"^(\s*)def \w+\(.*\).*:\s*$")


def _functions(root: Path):
    """(relpath, line number, lines of one def: signature + body) for each one-line `def` in the eval split."""
    for rel in iter_stdlib_files(root):
        if split_of(rel) != "eval":
            continue
        try:
            lines = (root / rel).read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        for i, line in enumerate(lines):
            m = DEF.match(line)
            if m:
                indent = len(m.group(1))
                body = []
                for nxt in lines[i + 1:]:
                    if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                        break
                    body.append(nxt)
                yield rel, i + 1, [line[indent:]] + [b[indent:] if b.strip() else "" for b in body]


def build(root: str | Path | None = None) -> None:
    root = Path(root or sysconfig.get_paths()["stdlib"])
    code, doc, used_code, used_doc, sigs = [], [], set(), set(), set()
    for rel, no, fn in _functions(root):
        body = [b for b in fn[1:] if b.strip()]
        if len(body) < 3 or fn[0] in sigs:  # one of each signature (the codecs' many getregentry)
            continue
        head = body[0].strip()
        has_doc = head.startswith(('"""', "r\"\"\"", "'''"))
        if has_doc and len(doc) < PER_SET and rel not in used_doc:
            # the signature and the whole docstring: the model writes the body
            end = next((k for k, b in enumerate(fn[1:], 1) if k > 1 and ('"""' in b or "'''" in b)), None)
            if head.count('"""') + head.count("'''") >= 2:
                end = 1
            if end is not None and end <= 12:
                doc.append({"prompt": "\n".join(fn[:end + 1]) + "\n", "source": f"Lib/{rel}:{no}"})
                used_doc.add(rel)
                sigs.add(fn[0])
        elif not has_doc and len(code) < PER_SET and rel not in used_code:
            # the signature and the first two lines of the body: the model goes on
            cut = [fn[0]] + [b for b in fn[1:] if b.strip()][:2]
            code.append({"prompt": "\n".join(cut) + "\n", "source": f"Lib/{rel}:{no}"})
            used_code.add(rel)
            sigs.add(fn[0])
    for name, rows in (("heldout-code.jsonl", code), ("docstring-first.jsonl", doc)):
        with open(HERE / name, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        print(f"{name}: {plural(len(rows), 'prompt')}")


if __name__ == "__main__":
    build()

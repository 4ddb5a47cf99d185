"""Token streams, logging and small shared helpers of the training pipeline."""

from __future__ import annotations

import json
import math
import random
import sys
import time
from pathlib import Path

import numpy as np

_T0 = time.time()


def log(*parts) -> None:
    print(f"[{time.time() - _T0:7.1f}s]", *parts, flush=True)
    sys.stdout.flush()


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def pick_device(name: str = "auto"):
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def tokenize_corpus(data_dir: str | Path) -> dict:
    """Encode every document, append ``<|endoftext|>``, concatenate per split (train / draft / eval) ->
    ``tokens.npz``.

    Documents are in corpus order (sorted by path); the arrays are uint16 (vocab < 65536).
    """
    from .corpus import SPLITS, read_corpus
    from .tokenizer import EOS_TOKEN, load_tokenizer

    data_dir = Path(data_dir)
    tok = load_tokenizer(data_dir / "tokenizer")
    eos = tok.token_to_id(EOS_TOKEN)
    docs = read_corpus(data_dir)
    encs = tok.encode_batch([d.text for d in docs], add_special_tokens=False)
    streams: dict[str, list[np.ndarray]] = {k: [] for k in SPLITS}
    offsets: dict[str, list[int]] = {k: [] for k in SPLITS}
    sizes = dict.fromkeys(SPLITS, 0)
    for d, e in zip(docs, encs):
        ids = np.asarray(e.ids + [eos], dtype=np.uint16)
        offsets[d.split].append(sizes[d.split])
        sizes[d.split] += len(ids)
        streams[d.split].append(ids)
    arrays = {k: np.concatenate(v) for k, v in streams.items()}
    np.savez_compressed(data_dir / "tokens.npz", **arrays,
                        **{f"{k}_doc_offsets": np.asarray(v, dtype=np.int64) for k, v in offsets.items()})
    chars = sum(len(d.text) for d in docs)
    stats = {**{f"{k}_tokens": int(a.size) for k, a in arrays.items()},
             "chars_per_token": chars / max(1, sum(a.size for a in arrays.values()))}
    (data_dir / "tokens-stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return stats


def load_tokens(data_dir: str | Path) -> dict[str, np.ndarray]:
    z = np.load(Path(data_dir) / "tokens.npz")
    return {k: z[k] for k in z.files}


def line_start_offsets(stream: np.ndarray, doc_offsets: np.ndarray, newline_ids: set[int],
                       min_left: int, min_right: int) -> np.ndarray:
    """Offsets just after a token that ends in a newline, with room on both sides (prompt starts)."""
    is_nl = np.isin(stream, np.fromiter(newline_ids, dtype=np.int64))
    cand = np.nonzero(is_nl)[0] + 1
    cand = cand[(cand >= min_left) & (cand + min_right <= stream.size)]
    return cand


def cosine_lr(step: int, total: int, peak: float, warmup: int, floor_frac: float = 0.1) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor_frac + (1 - floor_frac) * 0.5 * (1 + math.cos(math.pi * t)))


class StepBudget:
    """Fix the number of optimisation steps from a wall-clock budget, measured on early steps.

    With ``steps`` given, that count is used as is (the reproducible form). Otherwise the mean time
    of steps ``probe_from..probe_to`` sets ``total = budget_s / mean`` (clamped), once, before the
    learning-rate schedule leaves warm-up.
    """

    def __init__(self, steps: int | None, budget_s: float | None, probe_from: int = 3, probe_to: int = 13,
                 min_steps: int = 50, max_steps: int = 100_000):
        if steps is None and budget_s is None:
            raise ValueError("give steps or a time budget")
        self.total = steps
        self.budget_s, self.probe_from, self.probe_to = budget_s, probe_from, probe_to
        self.min_steps, self.max_steps = min_steps, max_steps
        self._t_start = time.time()
        self._t_probe: float | None = None

    @property
    def provisional_total(self) -> int:
        return self.total if self.total is not None else self.max_steps

    def after_step(self, step: int, synchronize=None) -> None:
        if self.total is not None:
            return
        if step + 1 == self.probe_from:
            if synchronize:
                synchronize()
            self._t_probe = time.time()
        elif step + 1 == self.probe_to:
            if synchronize:
                synchronize()
            per_step = (time.time() - self._t_probe) / (self.probe_to - self.probe_from)
            remaining = self.budget_s - (time.time() - self._t_start)
            self.total = int(min(self.max_steps, max(self.min_steps, step + 1 + remaining / per_step)))
            log(f"step budget: {per_step * 1000:.1f} ms/step -> {self.total} steps in {self.budget_s:.0f}s")

"""Token streams, logging and small shared helpers of the training pipeline."""

from __future__ import annotations

import json
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

"""Byte-level BPE tokenizer trained on the corpus (a miniature of Qwen's tokenizer).

Pre-tokenisation is Qwen2/3's split regex followed by GPT-2 byte-to-unicode mapping; no
normaliser, so ``decode(encode(text)) == text`` for any text. Special tokens come first:
id 0 ``<|endoftext|>`` (end of text / eos / pad), id 1 ``<|MASK|>`` (the DFlash drafter's block
filler). Saved as ``tokenizer.json`` + ``tokenizer_config.json`` so that
``transformers.AutoTokenizer.from_pretrained(dir)`` loads it offline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

EOS_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|MASK|>"
SPECIAL_TOKENS = [EOS_TOKEN, MASK_TOKEN]
# Qwen2 / Qwen3 / Qwen3.5 pre-tokenizer split pattern.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.token_to_id(EOS_TOKEN) == 0 and tok.token_to_id(MASK_TOKEN) == 1
    return tok


def tokenizer_config(model_max_length: int = 2048) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "mask_token": MASK_TOKEN,
        "bos_token": None,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "padding_side": "left",
    }


def save_tokenizer(tok, out_dir: str | Path, model_max_length: int = 2048) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(model_max_length), indent=2) + "\n", encoding="utf-8")


def load_tokenizer(path: str | Path):
    """The raw ``tokenizers.Tokenizer`` (fast, no transformers import)."""
    from tokenizers import Tokenizer

    path = Path(path)
    return Tokenizer.from_file(str(path / "tokenizer.json" if path.is_dir() else path))

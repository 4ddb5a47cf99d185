"""Words for numbers, the one place a count meets its noun: '1 drafted token', '3 drafted tokens', '0 rounds'.
Every page, CLI line, report, export and user error that says a count with its noun says it through `plural`
(tests/test_words.py holds the call sites to it at counts 0, 1 and 2). Torch-free, the lowest layer: the records'
checks and the engine's errors use it too."""

from __future__ import annotations

import functools

# nouns whose plural is not the word + 's' (plural's `words`, where a call site does not give it)
IRREGULAR = {"entry": "entries", "child": "children", "batch": "batches", "pass": "passes", "match": "matches",
             "miss": "misses", "query": "queries", "index": "indices", "process": "processes"}


@functools.lru_cache(maxsize=65536)
def plural(n: int, word: str, words: str | None = None) -> str:
    """'1 drafted token', '3 drafted tokens', '1,024 tokens' (thousands marked). `words`: the plural where it is
    not IRREGULAR's or the last word + 's'."""
    return f"{n:,} {word if n == 1 else (words or noun_plural(word))}"


def noun_plural(word: str) -> str:
    """The plural of `word` (of its last word: 'tree position' -> 'tree positions', 'entry' -> 'entries')."""
    head, _, last = word.rpartition(" ")
    return (head + " " if head else "") + IRREGULAR.get(last, last + "s")


def numbered(word: str, first: int, last: int) -> str:
    """Items `first` to `last` by their numbers: 'token 5', 'tokens 5–8'."""
    return f"{word} {first:,}" if first == last else f"{noun_plural(word)} {first:,}–{last:,}"

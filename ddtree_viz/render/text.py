"""Shared text helpers: make token text visible and safe.

Token text is untrusted (it comes from a tokenizer and from whatever the model generated): every
renderer passes it through `visible` (so whitespace and control characters can be seen) and then escapes it
for its medium: `esc` for real HTML, `plotly_text` for plotly's labels, hover text and titles (plotly draws a
small HTML subset of its own); matplotlib (render.mpl) draws titles without control characters, so SVG stays XML;
TikZ has render.tikz.latex_text.
"""

from __future__ import annotations

import functools
import html
import unicodedata
from collections.abc import Callable, Mapping

TokenText = Callable[[int], str] | Mapping[int, str]

_SPECIAL = {" ": "·", "\n": "⏎", "\t": "⇥"}
EMPTY = "∅"  # what an empty token shows as


def _nonchar(code: int) -> bool:
    return (code & 0xFFFE) == 0xFFFE or 0xFDD0 <= code <= 0xFDEF


def _char(ch: str) -> str:
    if ch in _SPECIAL:
        return _SPECIAL[ch]
    code = ord(ch)
    cat = unicodedata.category(ch)
    if cat == "Cc":  # C0/C1 control characters (\r, \x00, \x1b, \x7f, ...)
        return f"\\x{code:02x}"
    if cat in ("Cf", "Cs", "Zl", "Zp") or (cat == "Zs" and ch != " ") or _nonchar(code):
        # invisible format chars (zero-width, BOM, bidi overrides), lone surrogates, odd spaces, noncharacters
        # (U+FFFE, U+FFFF, ...: never text, and not allowed in XML)
        return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
    return ch


def visible(token: str) -> str:
    """Token text with whitespace made visible: space '·', newline '⏎', tab '⇥', control chars '\\xNN',
    invisible format characters and unusual spaces '\\uNNNN'; an empty token is '∅'. (Cached: the page shows
    the same few thousand token texts on every Step.)"""
    if token == "":
        return EMPTY
    return "".join(_char(ch) for ch in token)


def esc(s: object) -> str:
    """HTML-escape anything (quotes included), for text and attribute values alike."""
    return html.escape(str(s), quote=True)


def plotly_text(s: object) -> str:
    """Text for plotly (labels, hover text, titles, tick labels): plotly reads `<br>`, `<b>`, `<sub>`, ... as
    markup and decodes only `&amp;` `&lt;` `&gt;` (and numeric references) among entities, drawing any other
    (`&quot;`) literally. So exactly `&`, `<` and `>` are escaped here; quotes stay as they are. The one helper
    for the plotly medium: every plotly figure's text goes through it."""
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def shorten(s: str, limit: int) -> str:
    """Cut to at most `limit` characters, ending in '…' when cut."""
    if limit <= 0 or len(s) <= limit:
        return s
    return s[: max(limit - 1, 1)] + "…"


def unknown_token(token_id: int) -> str:
    """Placeholder for a token whose text is not known (no tokenizer at hand)."""
    return f"⟨{token_id}⟩"


def lookup(token_text: TokenText | None,
           fallback: Mapping[int, str] | Callable[[], Mapping[int, str]] | None = None) -> Callable[[int], str]:
    """A callable id -> text from a callable, a mapping, or neither; ids it cannot name come from
    `fallback` (e.g. the texts a tree's nodes carry) and then from `unknown_token`. A callable fallback is made
    at the first id that needs it (a view over a whole session's records need not gather them every Step)."""
    names = None if callable(fallback) else (fallback or {})

    def text(token_id: int) -> str:
        nonlocal names
        if token_text is not None:
            try:
                value = token_text(token_id) if callable(token_text) else token_text.get(token_id)
            except Exception:  # a tokenizer failing on one id must not break a whole view
                value = None
            if value is not None:
                return str(value)
        if names is None:
            names = fallback()
        return names[token_id] if token_id in names else unknown_token(token_id)

    return text


def token_texts_from_steps(steps) -> dict[int, str]:
    """id -> text for every token that appears as a tree node in the given StepRecords (records carry text
    only for tree nodes; bonus / argmax / greedy ids outside the trees have none)."""
    out: dict[int, str] = {}
    for step in steps:
        for node in step.nodes:
            out.setdefault(node.token_id, node.token)
    return out

"""The prompt exactly as it went into the prefill, as escaped HTML: the templated text with its special tokens
marked (<|im_start|>, <|im_end|>, think tags), newlines and tabs shown, and a line on how it was given (raw text,
or chat template with its messages and thinking switch).

The text is untrusted (the user's messages, a template's output): every piece goes through `esc`.
"""

from __future__ import annotations

import re

from ..trace import Trace
from .text import esc, visible
from ..words import plural

# Chat-template markers as Qwen (and most chat templates) spell them: <|name|>, and Qwen3's think tags.
SPECIAL = re.compile(r"<\|[^|<>\s]{1,64}\|>|</?think>")


def _plain(text: str) -> str:
    """Ordinary text: spaces kept, a newline shown as ⏎ before the line break, other invisible characters named."""
    out = []
    for ch in text:
        if ch == "\n":
            out.append('<span class="ddv-ws">⏎</span>\n')
        elif ch == " ":
            out.append(" ")
        else:
            shown = visible(ch)
            out.append(esc(shown) if shown == ch else f'<span class="ddv-ws">{esc(shown)}</span>')
    return "".join(out)


def prompt_markup(text: str) -> str:
    """The prompt text as HTML (no wrapper): special tokens in <b class="ddv-special">, the rest escaped."""
    out, pos = [], 0
    for m in SPECIAL.finditer(text):
        out.append(_plain(text[pos:m.start()]))
        out.append(f'<b class="ddv-special">{esc(m.group())}</b>')
        pos = m.end()
    out.append(_plain(text[pos:]))
    return "".join(out)


def prompt_summary(trace: Trace) -> str:
    """One line: how the prompt was given and how many tokens it is."""
    n = len(trace.prompt_ids)
    if not trace.chat_template:
        return f"raw text (no chat template), {plural(n, 'token')}"
    roles = ", ".join(m.get("role", "?") for m in trace.messages)
    thinking = "template default" if trace.thinking is None else ("on" if trace.thinking else "off")
    return (f"chat template on: {plural(len(trace.messages), 'message')} ({roles}), "
            f"thinking {thinking}, {plural(n, 'token')}")


PROMPT_VIEW_EM = 8  # the prompt's box: about six lines, scrolling inside (a 1,800-token prompt put the tree 9,000 px down)


def prompt_html(trace: Trace | None) -> str:
    """The prefilled prompt with its summary line, in a box of bounded height that scrolls inside and can be dragged
    taller (issue #65 item 2); empty before anything was prefilled."""
    if trace is None:
        return ""
    return (f'<div class="ddv-prompt-view"><div><b>Prompt as prefilled</b> — {esc(prompt_summary(trace))}</div>'
            f'<pre class="ddv-prompt-text" style="white-space: pre-wrap; margin: 0.3em 0 0 0; max-height: '
            f'{PROMPT_VIEW_EM}em; overflow: auto; resize: vertical">{prompt_markup(trace.prompt)}</pre></div>')


__all__ = ["SPECIAL", "prompt_html", "prompt_markup", "prompt_summary"]

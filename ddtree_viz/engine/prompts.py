"""The one place a prompt becomes prompt ids: raw text, or a conversation through the tokenizer's chat template.

Chat models (Qwen3.6-27B among them) and their DFlash drafters were trained on chat-formatted text, and whether the
template's thinking block is open or closed changes what the target writes and how well the drafter follows it.
`encode(tokenizer, spec)` turns a `PromptSpec` (the text or messages, chat on/off, a system prompt, thinking on/off)
into `Encoded(ids, text)`: the token ids that go into the prefill and the exact text they spell (the templated
prompt, special tokens included). The CLI (`run`/`bench --chat`), the bench and the page all go through it.

Templates are rendered by transformers' `apply_chat_template` (sandboxed Jinja; never trust_remote_code).
`enable_thinking` is passed only to a template that reads it (Qwen3's and Qwen3.5/3.6's do), so other templates are
not handed a variable they do not know; asking for a thinking mode from a template without one is an error.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..words import plural
from ..files import read_limited

ROLES = ("system", "user", "assistant", "tool")
MAX_PROMPT_FILE_BYTES = 8 << 20  # a prompt file is text a person wrote; anything bigger is a mistake

Message = tuple[str, str]  # (role, content): hashable, so a PromptSpec compares and hashes as plain data


@dataclass(frozen=True)
class PromptSpec:
    """What the user asked to decode.

    `text`: the raw prompt (chat off), or the user message (chat on). `messages`: a whole conversation as
    (role, content) pairs, chat on only; when given it replaces `text`. `system`: a system prompt put first (chat
    on only). `thinking`: True / False for templates with a thinking switch (`enable_thinking`), None for the
    template's own default."""

    text: str = ""
    messages: tuple[Message, ...] = ()
    chat: bool = False
    system: str | None = None
    thinking: bool | None = None

    def conversation(self) -> list[dict[str, str]]:
        """The messages the template renders: the system prompt (if any), then the messages or the text as one
        user message."""
        turns = list(self.messages) if self.messages else [("user", self.text)]
        if self.system:
            turns.insert(0, ("system", self.system))
        return [{"role": role, "content": content} for role, content in turns]


@dataclass(frozen=True)
class Encoded:
    ids: tuple[int, ...]  # what goes into the prefill
    text: str  # the text those ids spell: the raw prompt, or the templated prompt with its special tokens


def chat_template_text(tokenizer) -> str | None:
    """The tokenizer's default chat template as text, or None when it has none."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: transformers uses 'default'
        template = template.get("default")
    return template if isinstance(template, str) and template.strip() else None


def has_chat_template(tokenizer) -> bool:
    return chat_template_text(tokenizer) is not None


def takes_thinking(tokenizer) -> bool:
    """Whether the chat template has a thinking switch (reads `enable_thinking`)."""
    template = chat_template_text(tokenizer)
    return template is not None and "enable_thinking" in template


def parse_thinking(value: str | bool | None) -> bool | None:
    """'on' / 'off' (the CLI's spelling), a bool, or None (the template's default)."""
    if value is None or isinstance(value, bool):
        return value
    if value in ("on", "off"):
        return value == "on"
    raise InputError(f"thinking must be 'on' or 'off', not {value!r}")


def check_prompt_text(prompt: str, what: str = "the prompt") -> None:
    """Text for the tokenizer must be valid Unicode: bytes that are not UTF-8 (they reach Python as lone surrogates,
    e.g. from a command line) or an unpaired surrogate (JSON's \\ud800, from the page's API) made the tokenizer fail
    with a TypeError."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(prompt[exc.start])
        kind = (f"the byte 0x{code - 0xDC00:02x}, which is not UTF-8" if 0xDC80 <= code <= 0xDCFF
                else f"an unpaired surrogate (U+{code:04X})")
        raise InputError(f"{what} is not valid text: character {exc.start} is {kind}") from None


def check_spec(spec: PromptSpec) -> PromptSpec:
    """Refuse a spec that cannot mean anything, before any model work. Returns it."""
    if not isinstance(spec.text, str) or not isinstance(spec.chat, bool):
        raise InputError("the prompt must be text")
    if spec.system is not None and not isinstance(spec.system, str):
        raise InputError("the system prompt must be text")
    check_prompt_text(spec.text)
    if spec.system is not None:
        check_prompt_text(spec.system, "the system prompt")
    for i, message in enumerate(spec.messages or ()):
        for part in message:
            if isinstance(part, str):
                check_prompt_text(part, f"message {i + 1}")
    if spec.thinking is not None and not isinstance(spec.thinking, bool):
        raise InputError(f"thinking must be on, off or unset, not {spec.thinking!r}")
    if not spec.chat:
        if spec.messages:
            raise InputError("a list of messages needs the chat template: add --chat (or switch 'Chat template' on)")
        if spec.system:
            raise InputError("a system prompt needs the chat template: add --chat (or switch 'Chat template' on)")
        if spec.thinking is not None:
            raise InputError("thinking on/off is a chat template setting: add --chat (or switch 'Chat template' on)")
        if spec.text == "":
            raise InputError("the prompt is empty: type some text to continue")
        return spec
    if spec.messages:
        check_messages([{"role": r, "content": c} for r, c in spec.messages])
        if spec.system and spec.messages[0][0] == "system":
            raise InputError("the messages already start with a system message: leave out the separate system prompt")
    elif spec.text == "":
        raise InputError("the message is empty: type some text to send")
    return spec


def check_messages(data, where: str = "the messages") -> tuple[Message, ...]:
    """A JSON list of {"role", "content"} objects as (role, content) pairs, or an InputError saying which entry
    is wrong and how."""
    if not isinstance(data, list):
        raise InputError(f"{where} must be a JSON list of {{\"role\": ..., \"content\": ...}} objects, "
                         f"not a {type(data).__name__}")
    if not data:
        raise InputError(f"{where} hold no message")
    out = []
    for i, m in enumerate(data, 1):
        if not isinstance(m, dict):
            raise InputError(f"message {i} of {where} must be an object with 'role' and 'content', "
                             f"not a {type(m).__name__}")
        extra = sorted(set(m) - {"role", "content"})
        if extra:
            raise InputError(f"message {i} of {where} has fields other than 'role' and 'content': {', '.join(extra)}")
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or role not in ROLES:
            raise InputError(f"message {i} of {where}: role must be one of {', '.join(ROLES)}, not {role!r}")
        if not isinstance(content, str):
            what = "missing" if "content" not in m else f"a {type(content).__name__}"
            raise InputError(f"message {i} of {where}: content must be a string (text only; images and other "
                             f"parts are not supported), not {what}")
        if role == "system" and i > 1:
            raise InputError(f"message {i} of {where}: a system message can only come first")
        out.append((role, content))
    return tuple(out)


def read_prompt_file(path: str | Path) -> str | tuple[Message, ...]:
    """A prompt file: plain text (returned as is), or a JSON list of messages (returned checked). A file whose
    text starts with '[' is read as JSON; a plain-text prompt that happens to start with '[' can be passed
    with --prompt instead."""
    path = Path(path)
    text = read_limited(path, MAX_PROMPT_FILE_BYTES, "prompt file",
                        too_large=lambda size: f"prompt file {path} is larger than {MAX_PROMPT_FILE_BYTES >> 20} MiB")
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"prompt file {path} starts with '[' but is not valid JSON ({exc}); a list of messages "
                             "looks like [{\"role\": \"user\", \"content\": \"...\"}]") from None
        return check_messages(data, f"prompt file {path}")
    if text == "":
        raise InputError(f"prompt file {path} is empty")
    return text


def spec_from_file(path: str | Path, *, chat: bool = False, system: str | None = None,
                   thinking: bool | None = None) -> PromptSpec:
    content = read_prompt_file(path)
    if isinstance(content, str):
        return check_spec(PromptSpec(text=content, chat=chat, system=system, thinking=thinking))
    return check_spec(PromptSpec(messages=content, chat=chat, system=system, thinking=thinking))


def render(tokenizer, spec: PromptSpec) -> str:
    """The templated prompt text (chat on): the conversation, then the assistant's turn opened."""
    if chat_template_text(tokenizer) is None:
        raise InputError("this tokenizer has no chat template: leave the chat template off (--chat) and give the "
                         "prompt as raw text, or use a target whose tokenizer ships one")
    kwargs = {}
    if spec.thinking is not None:
        if not takes_thinking(tokenizer):
            raise InputError("this tokenizer's chat template has no thinking switch (it never reads "
                             "enable_thinking): leave thinking unset")
        kwargs["enable_thinking"] = spec.thinking
    from jinja2 import TemplateError

    try:
        text = tokenizer.apply_chat_template(spec.conversation(), add_generation_prompt=True, tokenize=False, **kwargs)
    except TemplateError as exc:  # the template's own raise_exception(...) included
        raise InputError(f"the chat template refused these messages: {exc}") from None
    if not isinstance(text, str):
        raise InputError("the chat template did not render to text")
    return text


def encode(tokenizer, spec: PromptSpec) -> Encoded:
    """The prefill's token ids and the exact text they spell. Special tokens in a template (<|im_start|>, ...)
    are tokenised as the special tokens they name; no BOS or other token is added beyond what the text says (as
    `apply_chat_template(..., tokenize=True)` does)."""
    check_spec(spec)
    text = render(tokenizer, spec) if spec.chat else spec.text
    ids = tuple(int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"])
    if not ids:
        raise InputError("the prompt encodes to no tokens")
    return Encoded(ids, text)


__all__ = ["PromptSpec", "Encoded", "encode", "render", "check_spec", "check_prompt_text", "check_messages", "read_prompt_file",
           "spec_from_file", "has_chat_template", "takes_thinking", "chat_template_text", "parse_thinking", "ROLES"]


def max_prompt_chars(pair) -> int | None:
    """The most characters a prompt for `pair` can have and still fit its target's positions (no token spells more
    characters than the vocabulary's longest entry), or None when the tokenizer has no vocabulary to bound a token
    by. The page and `analyze` refuse a longer prompt before tokenizing it."""
    longest = _longest_token_chars(pair.tokenizer)
    return pair.max_positions * longest if longest else None


@functools.lru_cache(maxsize=8)
def _longest_token_chars(tokenizer) -> int:
    get_vocab = getattr(tokenizer, "get_vocab", None)
    return max((len(k) for k in (get_vocab() if callable(get_vocab) else ())), default=0)


def check_prompt_fits(pair, items: list[dict]) -> None:
    """Every prompt of a set (read_prompts' items) within max_prompt_chars, before any of them is decoded: a prompt
    that cannot fit fails at once, naming it, not after the others have run."""
    limit = max_prompt_chars(pair)
    if limit is None:
        return
    for item in items:
        chars = len(item.get("prompt", "")) + sum(len(m.get("content") or "") for m in item.get("messages", ())
                                                  if isinstance(m, dict) and isinstance(m.get("content"), str))
        if chars > limit:
            raise InputError(f"prompt {item['index'] + 1} ({item.get('source', 'of the set')}) is "
                             f"{plural(chars, 'character')}; it cannot fit the target's "
                             f"{plural(pair.max_positions, 'position')} (at most {plural(limit, 'character')}); "
                             "shorten it or leave it out")

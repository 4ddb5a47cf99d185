"""Chat prompts (engine/prompts.py): the templated ids are apply_chat_template's, the thinking switch changes them,
templates without a switch are never handed one, messages files are checked, and a session decodes exactly as
greedy on the templated ids, recording how the prompt was given."""

from __future__ import annotations

import json

import pytest

from ddtree_viz.engine.prompts import (
    PromptSpec, check_messages, encode, has_chat_template, read_prompt_file, render, spec_from_file, takes_thinking,
)
from ddtree_viz.engine.reference import greedy_decode
from ddtree_viz.engine.session import DecodeSession
from ddtree_viz.errors import InputError
from ddtree_viz.trace import Trace
from tests.tiny import CHAT_VOCAB, IM_END, IM_START, byte_tokenizer, chat_pair, chat_tokenizer

TOK = chat_tokenizer()
HELLO = [{"role": "user", "content": "Write a haiku."}]


def template_ids(tok, messages, **kwargs) -> tuple[int, ...]:
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return tuple(int(i) for i in ids)


def test_templated_ids_are_apply_chat_templates():
    for thinking, kwargs in ((None, {}), (True, {"enable_thinking": True}), (False, {"enable_thinking": False})):
        got = encode(TOK, PromptSpec(text="Write a haiku.", chat=True, thinking=thinking))
        assert got.ids == template_ids(TOK, HELLO, **kwargs)
        assert got.text == TOK.apply_chat_template(HELLO, add_generation_prompt=True, tokenize=False, **kwargs)
    # the markers are single special tokens, not spelled out byte by byte
    ids = encode(TOK, PromptSpec(text="hi", chat=True)).ids
    assert ids[0] == TOK.convert_tokens_to_ids(IM_START) and TOK.convert_tokens_to_ids(IM_END) in ids
    assert max(ids) < CHAT_VOCAB


def test_thinking_switch_changes_the_ids():
    on = encode(TOK, PromptSpec(text="hi", chat=True, thinking=True))
    off = encode(TOK, PromptSpec(text="hi", chat=True, thinking=False))
    default = encode(TOK, PromptSpec(text="hi", chat=True))
    assert on.ids != off.ids
    assert off.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert on.text.endswith("<|im_start|>assistant\n<think>\n")
    assert default == on  # this template thinks unless told not to, like Qwen3.5/3.6's


def test_raw_text_is_not_templated():
    got = encode(TOK, PromptSpec(text="def f(x):\n"))
    assert got.text == "def f(x):\n" and got.ids == tuple(TOK("def f(x):\n", add_special_tokens=False)["input_ids"])


def test_system_prompt_and_conversations():
    got = encode(TOK, PromptSpec(text="hi", chat=True, system="Be brief."))
    assert got.text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n")
    convo = (("user", "2+2?"), ("assistant", "4"), ("user", "and 3+3?"))
    got = encode(TOK, PromptSpec(messages=convo, chat=True, system="Be brief.", thinking=False))
    expected = [{"role": "system", "content": "Be brief."}] + [{"role": r, "content": c} for r, c in convo]
    assert got.ids == template_ids(TOK, expected, enable_thinking=False)
    with pytest.raises(InputError, match="already start with a system message"):
        encode(TOK, PromptSpec(messages=(("system", "a"), ("user", "b")), chat=True, system="c"))


def test_templates_without_a_thinking_switch():
    plain = (r"{%- for m in messages %}{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{%- endfor %}"
             r"{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}")
    tok = chat_tokenizer(plain)
    assert has_chat_template(tok) and not takes_thinking(tok) and takes_thinking(TOK)
    got = encode(tok, PromptSpec(text="hi", chat=True))
    assert got.text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert got.ids == template_ids(tok, [{"role": "user", "content": "hi"}])
    with pytest.raises(InputError, match="no thinking switch"):  # asked for, but the template would ignore it
        encode(tok, PromptSpec(text="hi", chat=True, thinking=False))


def test_clear_errors():
    with pytest.raises(InputError, match="no chat template"):
        encode(byte_tokenizer(), PromptSpec(text="hi", chat=True))
    assert not has_chat_template(byte_tokenizer())
    for spec, match in (
        (PromptSpec(text="hi", thinking=False), "thinking on/off is a chat template setting"),
        (PromptSpec(text="hi", system="x"), "system prompt needs the chat template"),
        (PromptSpec(messages=(("user", "x"),)), "list of messages needs the chat template"),
        (PromptSpec(text="", chat=True), "empty"),
        (PromptSpec(text=""), "empty"),
    ):
        with pytest.raises(InputError, match=match):
            encode(TOK, spec)
    # the template's own refusal (raise_exception) is an InputError too
    with pytest.raises(InputError, match="chat template refused"):
        render(TOK, PromptSpec(messages=(("user", "a"), ("system", "b")), chat=True))


@pytest.mark.parametrize("data, match", [
    ({"role": "user", "content": "x"}, "must be a JSON list"),
    ([], "no message"),
    (["hi"], "message 1 .* must be an object"),
    ([{"role": "robot", "content": "x"}], "message 1 .* role must be one of system, user, assistant, tool"),
    ([{"role": "user"}], "content must be a string .* not missing"),
    ([{"role": "user", "content": [{"type": "image"}]}], "content must be a string .* not a list"),
    ([{"role": "user", "content": "x", "name": "bob"}], "fields other than 'role' and 'content': name"),
    ([{"role": "user", "content": "x"}, {"role": "system", "content": "y"}], "message 2 .* system message can only come first"),
])
def test_bad_messages(data, match):
    with pytest.raises(InputError, match=match):
        check_messages(data)


def test_prompt_files(tmp_path):
    text = tmp_path / "p.txt"
    text.write_text("def f(x):\n", encoding="utf-8")
    assert read_prompt_file(text) == "def f(x):\n"
    msgs = tmp_path / "m.json"
    msgs.write_text(json.dumps([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]), encoding="utf-8")
    assert read_prompt_file(msgs) == (("system", "S"), ("user", "U"))
    spec = spec_from_file(msgs, chat=True, thinking=False)
    assert spec.messages == (("system", "S"), ("user", "U")) and spec.chat and spec.thinking is False
    with pytest.raises(InputError, match="needs the chat template"):
        spec_from_file(msgs)
    bad = tmp_path / "bad.json"
    bad.write_text('[{"role": "user", "content": "x"},]', encoding="utf-8")
    with pytest.raises(InputError, match="not valid JSON"):
        read_prompt_file(bad)
    with pytest.raises(InputError, match="not found"):
        read_prompt_file(tmp_path / "nope.txt")
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9")
    with pytest.raises(InputError, match="not UTF-8"):
        read_prompt_file(tmp_path / "latin1.txt")


def test_session_decodes_exactly_as_greedy_on_templated_ids():
    """Invariant 1 on a chat prompt: DDTree's output == the target's greedy output from the same templated ids;
    the trace records the messages, the template switch, the thinking flag and those ids."""
    pair = chat_pair(seed=3)
    spec = PromptSpec(text="Name three <b>colours</b>.", chat=True, system="Be brief.", thinking=False)
    session = DecodeSession.of(pair, budget=8, max_new_tokens=14)
    session.prefill(spec=spec)
    expected = encode(pair.tokenizer, spec)
    assert tuple(session.prompt_ids) == expected.ids and session.prompt == expected.text
    session.run()
    greedy = greedy_decode(pair.target, list(expected.ids), 14, pair.eos_token_ids)
    assert tuple(session.generated) == greedy.ids
    # thinking on is another prompt, hence (on this random model) another prefill
    other = encode(pair.tokenizer, PromptSpec(text=spec.text, chat=True, system="Be brief.", thinking=True))
    assert other.ids != expected.ids
    trace = Trace.from_json(session.to_trace().to_json())
    assert trace.chat_template is True and trace.thinking is False
    assert trace.messages == ({"role": "system", "content": "Be brief."},
                              {"role": "user", "content": "Name three <b>colours</b>."})
    assert trace.prompt_ids == expected.ids and trace.prompt == expected.text
    assert trace.first_divergence is None


def test_raw_trace_keeps_the_defaults_and_old_traces_load():
    pair = chat_pair(seed=1)
    session = DecodeSession.of(pair, budget=4, max_new_tokens=4)
    session.prefill(spec=PromptSpec(text="abc"))
    data = json.loads(session.to_trace().to_json())
    assert data["chat_template"] is False and data["messages"] == [] and data["thinking"] is None
    for key in ("chat_template", "messages", "thinking"):  # a trace written before these fields
        data.pop(key)
    assert Trace.from_json(json.dumps(data)).chat_template is False


def test_the_end_of_a_turn_ends_the_output():
    """A chat model's generation_config names the end of its turn (Qwen: <|im_end|>): it ends the output too."""
    pair = chat_pair(seed=1)
    im_end = pair.tokenizer.convert_tokens_to_ids(IM_END)
    assert im_end not in pair.eos_token_ids
    pair.target.generation_config.eos_token_id = [256, im_end]
    assert {256, im_end} <= pair.eos_token_ids


@pytest.mark.parametrize("key, value, words", [
    ("messages", [{"role": "user"}], "trace.messages\\[0\\]: expected an object with 'role' and 'content'"),
    ("messages", [{"role": 1, "content": "x"}], "trace.messages\\[0\\].role: expected a string"),
    ("chat_template", "yes", "trace.chat_template: expected true or false"),
    ("thinking", 0, "trace.thinking: expected"),
])
def test_trace_load_refuses_malformed_prompt_fields(key, value, words):
    from ddtree_viz.errors import TraceError

    pair = chat_pair(seed=1)
    session = DecodeSession.of(pair, budget=2, max_new_tokens=2)
    session.prefill(spec=PromptSpec(text="a", chat=True))
    data = json.loads(session.to_trace(with_greedy=False).to_json())
    data[key] = value
    with pytest.raises(TraceError, match=words):
        Trace.from_json(json.dumps(data))

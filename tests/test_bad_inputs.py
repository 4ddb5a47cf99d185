"""Bad inputs give clear errors: the right ddtree_viz.errors type AND a message naming the problem; afterwards the
same session / model pair still works."""

from __future__ import annotations

import copy
import json
import shutil

import pytest

from ddtree_viz.benchmarks.decode import run_bench
from ddtree_viz.engine.models import load_pair, parse_dtype, resolve_device
from ddtree_viz.engine.session import DecodeSession
from ddtree_viz.errors import DDTreeVizError, InputError, ModelLoadError, PairingError, TraceError
from ddtree_viz.trace import SCHEMA_VERSION, Trace
from tests import tiny


@pytest.fixture(scope="module")
def pair():
    return tiny.tiny_pair("hybrid")


@pytest.fixture(scope="module")
def saved(tmp_path_factory, pair):
    return tiny.save_pair(pair, tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def good_trace(pair) -> dict:
    session = DecodeSession(pair, budget=4, max_new_tokens=4)
    session.prefill("def f(x):")
    session.run()
    return json.loads(session.to_trace().to_json())


def _works(pair, **settings) -> None:
    """A good prefill + step on this pair (after an error elsewhere)."""
    session = DecodeSession(pair, budget=4, max_new_tokens=4, **settings)
    session.prefill("ok")
    record = session.step()
    assert record.acceptance >= 1


# ---------------------------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------------------------


def test_empty_prompt(pair):
    session = DecodeSession(pair, budget=4, max_new_tokens=4)
    for bad in ("", None):
        with pytest.raises(InputError, match="prompt is empty"):
            session.prefill(bad)
    with pytest.raises(InputError, match="no tokens"):
        session.prefill(prompt_ids=[])
    session.prefill("ok")
    assert session.step().acceptance >= 1


@pytest.mark.parametrize("budget, words", [(0, "between 1 and"), (-3, "between 1 and"), (10**9, "between 1 and"),
                                           (2.5, "whole number"), ("abc", "whole number"), (True, "whole number")])
def test_bad_budget(pair, budget, words):
    with pytest.raises(InputError, match=words) as exc:
        DecodeSession(pair, budget=budget)
    assert "budget" in str(exc.value)


@pytest.mark.parametrize("value", [0, -1, 10**9, 1.5, "ten"])
def test_bad_max_new_tokens(pair, value):
    with pytest.raises(InputError, match="max new tokens"):
        DecodeSession(pair, max_new_tokens=value)


@pytest.mark.parametrize("block_size", [1, 0, 9, 64])
def test_bad_block_size(pair, block_size):
    assert pair.drafter.block_size == 8
    with pytest.raises(InputError, match="block size must be between 2 and 8"):
        DecodeSession(pair, block_size=block_size)


def test_unknown_modes(pair):
    with pytest.raises(InputError, match="verify mode") as exc:
        DecodeSession(pair, verify="sloppy")
    assert "sloppy" in str(exc.value)
    with pytest.raises(InputError, match="method") as exc:
        DecodeSession(pair, method="beam")
    assert "beam" in str(exc.value)
    with pytest.raises(InputError, match="dtype") as exc:
        parse_dtype("float64")
    assert "float64" in str(exc.value)
    with pytest.raises(InputError, match="device") as exc:
        resolve_device("tpu")
    assert "tpu" in str(exc.value)
    _works(pair)


def test_unknown_dtype_and_device_via_load_pair(saved):
    target, draft = map(str, saved)
    with pytest.raises(InputError, match="dtype"):
        load_pair(target, draft, dtype="int8")
    with pytest.raises(InputError, match="device"):
        load_pair(target, draft, device="gpu0")


def test_cuda_without_gpu_is_an_input_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(InputError, match="no CUDA GPU"):
        resolve_device("cuda")


def test_step_before_prefill_and_after_done(pair):
    session = DecodeSession(pair, budget=4, max_new_tokens=3)
    with pytest.raises(InputError, match="prefill"):
        session.step()
    with pytest.raises(InputError, match="prefill"):
        session.greedy()
    session.prefill("abc")
    session.run()
    assert session.done
    with pytest.raises(InputError, match="finished"):
        session.step()
    session.prefill("again")  # the same session starts over cleanly
    assert session.step().acceptance >= 1


def test_overlong_prompt():
    small = tiny.tiny_pair("hybrid", max_position_embeddings=64)
    assert small.max_positions == 64
    session = DecodeSession(small, budget=4, max_new_tokens=8)
    session.prefill("short")
    first = session.step()
    with pytest.raises(InputError, match="the prompt is 100 tokens") as exc:
        session.prefill("x" * 100)
    assert "64 positions" in str(exc.value)
    # the failed prefill left the running session untouched
    assert session.prompt == "short" and len(session.history) == 1
    second = session.step()
    assert second.committed_len == first.committed_len + first.acceptance
    _works(small)


def test_bench_bad_inputs(pair):
    with pytest.raises(InputError, match="empty"):
        run_bench(pair, ["ok", ""], max_new_tokens=2, budget=2)
    with pytest.raises(InputError, match="at least one prompt"):
        run_bench(pair, [], max_new_tokens=2, budget=2)
    for repeats in (0, -1, 2.5, 10**6):
        with pytest.raises(InputError, match="repeats"):
            run_bench(pair, ["ok"], max_new_tokens=2, budget=2, repeats=repeats)
    with pytest.raises(InputError, match="budget"):
        run_bench(pair, ["ok"], max_new_tokens=2, budget=0)


# ---------------------------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------------------------


def test_missing_model_dirs(saved, tmp_path):
    target, draft = map(str, saved)
    with pytest.raises(ModelLoadError, match="target directory not found: /nonexistent/dir"):
        load_pair("/nonexistent/dir", draft)
    with pytest.raises(ModelLoadError, match="drafter directory not found"):
        load_pair(target, str(tmp_path / "no-drafter"))
    with pytest.raises(ModelLoadError, match="is a file, not a model directory"):
        load_pair(str(saved[0] / "config.json"), draft)
    assert load_pair(target, draft).drafter is not None  # still loads fine


def test_target_dir_without_config(saved, tmp_path):
    broken = tmp_path / "target"
    shutil.copytree(saved[0], broken)
    (broken / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="has no config.json"):
        load_pair(str(broken), str(saved[1]))


def test_drafter_dir_without_config(saved, tmp_path):
    broken = tmp_path / "draft"
    shutil.copytree(saved[1], broken)
    (broken / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="drafter directory .* has no config.json"):
        load_pair(str(saved[0]), str(broken))


def test_target_dir_with_bad_config(saved, tmp_path):
    broken = tmp_path / "target"
    shutil.copytree(saved[0], broken)
    (broken / "config.json").write_text("not json")
    with pytest.raises(ModelLoadError, match="not a valid JSON"):
        load_pair(str(broken), str(saved[1]))
    (broken / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="model_type"):
        load_pair(str(broken), str(saved[1]))


@pytest.mark.parametrize("change, words", [
    (lambda c: [1, 2, 3], "must be a JSON object, not a list"),
    (lambda c: {**c, "vocab_size": -5}, "vocab_size must be a whole number >= 1, not -5"),
    (lambda c: {**c, "hidden_size": 0}, "hidden_size must be a whole number >= 1"),
    (lambda c: {**c, "num_attention_heads": "four"}, "num_attention_heads must be a whole number >= 1"),
    (lambda c: {**c, "text_config": {"vocab_size": 2.5}}, "text_config.vocab_size"),
])
def test_target_config_of_the_wrong_shape(saved, tmp_path, change, words):
    """transformers failed on these deep inside (TypeError: argument after ** must be a mapping; a negative tensor
    dimension): the config is checked first (issue #19)."""
    broken = tmp_path / "target"
    shutil.copytree(saved[0], broken)
    good = json.loads((saved[0] / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps(change(good)))
    with pytest.raises(ModelLoadError, match=words):
        load_pair(str(broken), str(saved[1]))


@pytest.mark.parametrize("change, words", [
    (lambda c: {**c, "num_hidden_layers": "two"}, "wrong kind"),
    (lambda c: {**c, "vocab_size": -5}, "vocab_size must be at least 1"),
    (lambda c: {**c, "block_size": 300, "dflash_config": {**c["dflash_config"], "block_size": 300}},
     "block_size must be at most 256"),
])
def test_drafter_config_of_the_wrong_shape(saved, tmp_path, change, words):
    broken = tmp_path / "draft"
    shutil.copytree(saved[1], broken)
    good = json.loads((saved[1] / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps(change(good)))
    with pytest.raises(ModelLoadError, match=words):
        load_pair(str(saved[0]), str(broken))


@pytest.mark.parametrize("prompt, words", [("abc\udcff", "the byte 0xff, which is not UTF-8"),
                                           ("x\ud800y", "an unpaired surrogate \\(U\\+D800\\)")])
def test_prompt_that_is_not_valid_text(pair, prompt, words):
    """A lone surrogate made the tokenizer fail with a raw TypeError (in the page too)."""
    session = DecodeSession(pair, budget=4, max_new_tokens=4)
    with pytest.raises(InputError, match=words):
        session.prefill(prompt)
    session.prefill("ok")
    assert session.step().acceptance >= 1


def test_max_new_tokens_past_the_target_names_the_real_limit(pair):
    limit = pair.max_positions
    session = DecodeSession(pair, budget=4, max_new_tokens=min(limit, 8192))
    with pytest.raises(InputError, match=f"max new tokens {min(limit, 8192)} is too many for this target: it has "
                                         f"{limit:,} positions"):
        session.prefill("ok")


def test_target_dir_without_tokenizer(saved, tmp_path):
    broken = tmp_path / "target"
    shutil.copytree(saved[0], broken)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (broken / name).unlink()
    with pytest.raises(ModelLoadError, match="tokenizer"):
        load_pair(str(broken), str(saved[1]))


def test_drafter_with_corrupt_weights(saved, tmp_path):
    broken = tmp_path / "draft"
    shutil.copytree(saved[1], broken)
    (broken / "model.safetensors").write_bytes(b"not safetensors" * 4)
    with pytest.raises(ModelLoadError, match="drafter weights"):
        load_pair(str(saved[0]), str(broken))


def test_target_with_corrupt_weights(saved, tmp_path):
    broken = tmp_path / "target"
    shutil.copytree(saved[0], broken)
    (broken / "model.safetensors").write_bytes(b"garbage" * 8)
    with pytest.raises(ModelLoadError, match="cannot load target"):
        load_pair(str(broken), str(saved[1]))


def _drafter_dir(tmp_path, target_model):
    path = tmp_path / "mismatched-draft"
    tiny.drafter_model(target_model).save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("over, words", [
    (dict(hidden=32), "Hidden size mismatch: drafter 32, target 64"),
    (dict(layers=8), "8-layer target"),
])
def test_drafter_target_mismatch(saved, tmp_path, over, words):
    draft = _drafter_dir(tmp_path, tiny.target_model("hybrid", **over))
    with pytest.raises(PairingError) as exc:
        load_pair(str(saved[0]), draft)
    assert words in str(exc.value)
    assert load_pair(str(saved[0]), str(saved[1])).drafter is not None


def test_drafter_vocab_mismatch(saved, tmp_path):
    target_dir = tmp_path / "big-vocab-target"
    target = tiny.target_model("hybrid", vocab_size=300)
    target.save_pretrained(target_dir)
    tiny.byte_tokenizer().save_pretrained(target_dir)
    with pytest.raises(PairingError, match="Vocabulary size mismatch: drafter 258, target 300"):
        load_pair(str(target_dir), str(saved[1]))


# ---------------------------------------------------------------------------------------------------------------
# Traces
# ---------------------------------------------------------------------------------------------------------------


def test_good_trace_round_trips(good_trace):
    trace = Trace.from_json(json.dumps(good_trace))
    assert trace.steps and Trace.from_json(trace.to_json()) == trace


def _mutated(good_trace, fn) -> str:
    data = copy.deepcopy(good_trace)
    fn(data)
    return json.dumps(data)


def _drop(d, key):
    del d[key]


CORRUPT = {
    "not JSON": ("{not json", "not valid JSON"),
    "JSON list": ("[1, 2, 3]", "must be a JSON object"),
    "no schema_version": (lambda d: _drop(d, "schema_version"), "schema_version"),
    "newer schema": (lambda d: d.update(schema_version=SCHEMA_VERSION + 1), "newer than this ddtree-viz understands"),
    "schema 0": (lambda d: d.update(schema_version=0), "unsupported schema_version 0"),
    "missing steps": (lambda d: _drop(d, "steps"), "missing field 'steps'"),
    "missing prompt": (lambda d: _drop(d, "prompt"), "missing field 'prompt'"),
    "steps not a list": (lambda d: d.update(steps={}), "steps: expected a list"),
    "step not an object": (lambda d: d["steps"].__setitem__(0, 7), "expected an object"),
    "node missing parent": (lambda d: _drop(d["steps"][0]["nodes"][1], "parent"), "missing field 'parent'"),
    "parent out of order": (lambda d: d["steps"][0]["nodes"][1].update(parent=5), "does not precede it"),
    "root with parent": (lambda d: d["steps"][0]["nodes"][0].update(parent=0), "root"),
    "node ids out of order": (lambda d: d["steps"][0]["nodes"][1].update(id=9), "node ids"),
    "argmax length": (lambda d: d["steps"][0]["target_argmax"].append(1), "target_argmax"),
    "accepted not rooted": (lambda d: d["steps"][0].update(accepted=[3]), "accepted path"),
}

# Wrongly typed fields: trace.py lets TypeError / ValueError escape from these (reported to the lead).
MISTYPED = {
    "parent is a string": lambda d: d["steps"][0]["nodes"][1].update(parent="0"),
    "parent is null": lambda d: d["steps"][0]["nodes"][1].update(parent=None),
    "accepted is a number": lambda d: d["steps"][0].update(accepted=5),
    "target_argmax is null": lambda d: d["steps"][0].update(target_argmax=None),
    "tensor shape of strings": lambda d: d["steps"][0]["cache"][0]["tensors"][0].update(shape=["a"]),
    "tensor shape is a number": lambda d: d["steps"][0]["cache"][0]["tensors"][0].update(shape=3),
    "schema_version is a boolean": lambda d: d.update(schema_version=True),
    "output_ids is a string": lambda d: d.update(output_ids="abc"),
    "settings is a list": lambda d: d.update(settings=[1]),
    "timings are strings": lambda d: d["steps"][0].update(timings_ms={"draft": "fast"}),
}


@pytest.mark.parametrize("name", list(CORRUPT))
def test_corrupt_trace(good_trace, tmp_path, name):
    change, words = CORRUPT[name]
    if name in ("parent out of order", "node missing parent", "node ids out of order"):
        assert len(good_trace["steps"][0]["nodes"]) > 2
    text = change if isinstance(change, str) else _mutated(good_trace, change)
    with pytest.raises(TraceError) as exc:
        Trace.from_json(text)
    assert words in str(exc.value)
    path = tmp_path / "trace.json"
    path.write_text(text)
    with pytest.raises(TraceError) as exc2:
        Trace.load(path)
    assert str(exc2.value) == f"trace file {path}: {exc.value}"  # the same error, naming the file first



@pytest.mark.parametrize("name", list(MISTYPED))
def test_mistyped_trace_fields(good_trace, name):
    with pytest.raises(TraceError):
        Trace.from_json(_mutated(good_trace, MISTYPED[name]))


def test_unknown_fields_are_ignored(good_trace):
    """Readers ignore fields they do not know (newer writers may add some within a schema version)."""
    def add(d):
        d["steps"][0]["bogus"] = 1
        d["extra"] = {"x": 1}
    trace = Trace.from_json(_mutated(good_trace, add))
    assert trace == Trace.from_json(json.dumps(good_trace))


def test_trace_file_problems(tmp_path):
    with pytest.raises(TraceError, match="trace file not found"):
        Trace.load(tmp_path / "missing.json")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceError, match="cannot read trace file"):
        Trace.load(tmp_path / "bin.json")
    with pytest.raises(TraceError):
        Trace.load(tmp_path)  # a directory


def test_all_errors_share_the_base_class():
    for cls in (InputError, ModelLoadError, PairingError, TraceError):
        assert issubclass(cls, DDTreeVizError)

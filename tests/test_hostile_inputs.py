"""Issue #64's hostile inputs, table-driven: each case is refused before any work with a clear `error:` naming the
cause (exit 2 from the CLI, an InputError from the readers the CLI and the page share), or read correctly. Never a
traceback. Cases of classes 3 (another run's files), 4 (sizes and kinds checked first) and 5 (the app's flags) that
need no model; those that do live beside their code (test_analyze.py, test_speedup.py, test_app_flags.py)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from ddtree_viz.cli import main
from ddtree_viz.errors import InputError
from ddtree_viz.promptset.files import read_prompts

NESTED = "[" * 100_000 + "]" * 100_000
NESTED_OBJ = '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# (file name, content, the words the refusal must hold)
REFUSED_FILES = [
    ("nested.json", NESTED, "nested too deeply"),
    ("nested.jsonl", NESTED_OBJ, "nested too deeply"),
    ("nested-line2.jsonl", '{"prompt": "a"}\n' + NESTED_OBJ, "line 2: JSON nested too deeply"),
    ("object.json", '{"prompts": ["a"]}', "expected a non-empty 'prompt'"),
    ("numbers.json", "[1, 2]", "entry 1: expected an object"),
    ("empty-list.json", "[]", "holds no prompts"),
    ("empty-entry.json", '["a", ""]', "entry 2: expected a non-empty 'prompt'"),
    ("broken.json", '["a", ', "not JSON"),
    ("messages-not-list.json", '[{"messages": "hi"}]', "entry 1: expected a non-empty 'prompt'"),
    ("jsonl-array-line.jsonl", '{"prompt": "a"}\n[1]\n', "line 2: expected an object"),
    ("blank.txt", "\n\n   \n", "holds no prompts"),
    ("bad-utf8.txt", None, "UTF-8"),
]


@pytest.mark.parametrize("name, text, words", REFUSED_FILES, ids=[c[0] for c in REFUSED_FILES])
def test_bad_prompt_files_are_refused_by_name(tmp_path, name, text, words):
    path = tmp_path / name
    if text is None:
        path.write_bytes(b"def f():\n\xff\xfe\n")
    else:
        path.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as exc:
        read_prompts(path)
    assert words in str(exc.value) and "Traceback" not in str(exc.value), str(exc.value)


def test_a_json_list_is_read_as_a_list_of_prompts(tmp_path):
    path = _write(tmp_path, "set.json", json.dumps(["def f():", {"prompt": "x = ", "category": "code"},
                                                    {"messages": [{"role": "user", "content": "hi"}]}]))
    items = read_prompts(path)
    assert [it.get("prompt") for it in items] == ["def f():", "x = ", None]
    assert items[1]["category"] == "code" and items[2]["messages"][0]["content"] == "hi"
    assert [it["index"] for it in items] == [0, 1, 2] and items[0]["source"] == "set.json[0]"


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "rows.jsonl"
    os.mkfifo(path)
    return path


# --prompts values the CLI must refuse at once (exit 2, `error:` and the words), before any model loads
REFUSED_SETS = [
    ("humaneval:²", "whole number from 1 to 999999"),
    ("humaneval:٣", "whole number from 1 to 999999"),
    ("humaneval:" + "9" * 5000, "whole number from 1 to 999999"),
    ("humaneval:0", "whole number from 1 to 999999"),
    ("humaneval:-3", "whole number from 1 to 999999"),
    ("hf:{tmp}", "a local path must be a .jsonl or .json file"),
    ("hf:/dev/null", "a local path must be a .jsonl or .json file"),
    ("hf:{tmp}/dir.jsonl", "is a directory"),
    ("hf:{fifo}", "not a regular file"),
    ("hf:{tmp}/nested.json", "nested too deeply"),
    ("{tmp}/nested.json", "nested too deeply"),
    ("{tmp}/missing.txt", "does not exist"),
    ("{tmp}/dir.jsonl", "is a directory"),
    ("{fifo}", "not a regular file"),
]


@pytest.mark.parametrize("spec, words", REFUSED_SETS, ids=[f"{i}:{c[0][:30]}" for i, c in enumerate(REFUSED_SETS)])
def test_bad_prompt_sets_are_refused_before_any_model_work(tmp_path, capsys, spec, words):
    (tmp_path / "dir.jsonl").mkdir()
    _write(tmp_path, "nested.json", NESTED)
    fifo = _fifo(tmp_path) if "{fifo}" in spec else None
    prompts = spec.format(tmp=tmp_path, fifo=fifo)
    assert main(["analyze", "--prompts", prompts, "--out", str(tmp_path / "out"), "--no-speedup"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()  # nothing written: refused before the report folder is made


def test_a_prompt_too_long_for_the_target_is_refused_before_the_others_decode(tmp_path, capsys):
    """The page refuses a prompt that cannot fit the target at once; analyze now does too, naming it, before the
    first prompt of the set is decoded (it failed only after decoding the others)."""
    path = _write(tmp_path, "p.txt", "def add(a, b):\n\n" + "x" * 2_000_000 + "\n")
    out = tmp_path / "out"
    assert main(["analyze", "--prompts", str(path), "--out", str(out), "--max-new-tokens", "4", "--no-speedup"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"error: prompt 2 \(p\.txt block 2\) is 2,000,000 characters; it cannot fit the target's "
                     r"[\d,]+ positions", err), err
    assert not list((out / "traces").glob("*.json"))  # the first prompt was not decoded either


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory):
    from tests import tiny

    return tiny.save_pair(tiny.tiny_pair("hybrid"), tmp_path_factory.mktemp("pair"))


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("case, words", [
    ("layers", "says 1,000,000 decoder layers; its weights hold 4"),
    ("text_layers", "says 1,000,000 decoder layers; its weights hold 4"),
    ("pipe", "is not a regular file"),
    ("index_list", "must map each tensor name"),
    ("index_path", "is a path, not a file of the folder"),
    ("index_nested", "is unreadable"),
    ("header", "no readable safetensors header"),
])
def test_a_target_checkpoint_is_bounded_by_its_files_before_it_is_built(saved_pair, tmp_path, capsys, case, words):
    """issue #64 class 4: a config of 10^6 layers hung the load (transformers built the model first); a pipe among
    the weights hung it; a bad index ended in a traceback. Each is refused from the headers, by name, at once."""
    target = _copy(saved_pair[0], tmp_path / "target")
    config = json.loads((target / "config.json").read_text())
    if case == "layers":
        config["num_hidden_layers"] = 10**6
    elif case == "text_layers":
        config = {**config, "text_config": {**config, "num_hidden_layers": 10**6}}
    elif case == "pipe":
        os.mkfifo(target / "extra.safetensors")
    elif case == "header":
        (target / "extra.safetensors").write_bytes((2**40).to_bytes(8, "little") + b"{}")
    else:
        weights = {"index_list": ["model.safetensors"], "index_path": {"w": "../target/model.safetensors"},
                   "index_nested": None}[case]
        index = "[" * 100_000 if weights is None else json.dumps({"weight_map": weights})
        (target / "model.safetensors.index.json").write_text(index)
    (target / "config.json").write_text(json.dumps(config))
    code = main(["run", "--target", str(target), "--draft", str(saved_pair[1]), "--prompt", "x", "--max-new-tokens",
                 "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and words in err and "Traceback" not in err, err


def test_a_huge_fp8_block_size_is_one_block_not_gigabytes():
    """issue #64 class 4: weight_block_size [10^12, 10^12] over a small weight allocated gigabytes before any check;
    a block larger than the weight is one block: the same product as a block of the weight's own size."""
    import torch

    from ddtree_viz.engine.weights import fp8

    weight = torch.randn(5, 7).to(fp8.FP8_DTYPE)
    scale = torch.tensor([[0.5]])
    huge = fp8.dequantize(weight, scale, (10**12, 10**12))
    assert torch.equal(huge, fp8.dequantize(weight, scale, (5, 7))) and torch.equal(huge, weight.float() * 0.5)


@pytest.mark.parametrize("text", ['{"schema_version": 1}', '{"kind": "compare", "schema_version": 1, "a": {}}', "[1]",
                                  '{"schema_version": 99}'])
def test_a_bad_trace_names_its_file_first(tmp_path, text):
    """issue #64 class 7: an error deep in a trace said where in the trace, not which file; the page's upload names
    the user's own file name (never the server's temporary path)."""
    from ddtree_viz.errors import TraceError
    from ddtree_viz.trace import Trace, load_any

    path = _write(tmp_path, "mine.json", text)
    for load in (load_any, Trace.load):
        with pytest.raises(TraceError) as exc:
            load(path, name="upload.json")
        message = str(exc.value)
        assert "upload.json" in message and str(tmp_path) not in message, message
        with pytest.raises(TraceError, match=re.escape(str(path))):
            load(path)


@pytest.fixture(scope="module")
def good_trace(tmp_path_factory) -> str:
    """A real trace of the embedded pair (run --trace), for the export cases."""
    path = tmp_path_factory.mktemp("good") / "good.json"
    assert main(["run", "--prompt", "def f(x):", "--max-new-tokens", "8", "--trace", str(path)]) == 0
    return str(path)


# The CLI's numbers, paths and kinds: each refused at once with exit 2 and `error:` naming the cause (these held in
# earlier rounds; kept here so they stay held)
CLI_REFUSED = [
    (["run", "--prompt", ""], "the prompt is empty"),
    (["run", "--prompt", "x", "--budget", "0"], "budget must be between 1 and 4096, not 0"),
    (["run", "--prompt", "x", "--budget", "100000"], "budget must be between 1 and 4096, not 100000"),
    (["run", "--prompt", "x", "--max-new-tokens", "0"], "max new tokens must be between 1 and 8192"),
    (["run", "--prompt", "x", "--max-new-tokens", "99999999"], "max new tokens must be between 1 and 8192"),
    (["run", "--prompt", "x", "--temperature", "-1"], "temperature must be a number from 0"),
    (["run", "--prompt", "x", "--temperature", "nan"], "temperature must be a number from 0"),
    (["run", "--prompt", "x", "--top-p", "2"], "top-p must be a number above 0 and at most 1"),
    (["run", "--prompt", "x", "--top-k", "-3"], "top-k must be a whole number"),
    (["run", "--prompt", "x", "--seed", "-1"], "seed must be a whole number from 0 to 4294967295"),
    (["run", "--prompt", "x", "--block-size", "1"], "block size must be at least 2"),
    (["run", "--prompt-file", "{tmp}/none.txt"], "prompt file not found"),
    (["run", "--prompt-file", "/dev/zero"], "not a regular file"),
    (["run", "--prompt", "x", "--target", "{tmp}/none", "--draft", "{tmp}/none"], "target directory not found"),
    (["run", "--prompt", "x", "--max-new-tokens", "2", "--trace", "{tmp}/no/dir/t.json"], "does not exist"),
    (["replay", "{tmp}/none.json"], "trace file not found"),
    (["replay", "/dev/null"], "not a regular file"),
    (["replay", "{tmp}/nested.json"], "trace"),
    (["export", "--trace", "{tmp}/none.json", "--out", "{tmp}/x.svg"], "trace file not found"),
    (["analyze", "--prompts", "heldout-code", "--out", "{tmp}/o", "--budget", "0"], "budget must be between 1"),
    (["analyze", "--prompts", "heldout-code", "--out", "{tmp}/o", "--budgets", "0"], "--budgets must be whole"),
    (["analyze", "--prompts", "no-such-set", "--out", "{tmp}/o"], "does not exist"),
    (["analyze", "--prompts", "heldout-code", "--out", "/dev/null/x"], "cannot write the output directory"),
    (["analyze", "--prompts", "hf:", "--out", "{tmp}/o"], "needs a dataset name"),
    (["bench", "--budget", "0"], "budget must be between 1 and 4096"),
    (["run", "--prompt", "x", "--max-new-tokens", "2", "--trace", "/dev/null/t.json"], "/dev/null is not a folder"),
    # export of a real trace (the module's good.json) with bad settings
    (["export", "--trace", "{good}", "--out", "{tmp}/x.svg", "--step", "0"], "step 0 is out of range"),
    (["export", "--trace", "{good}", "--out", "{tmp}/x.svg", "--step", "9999"], "step 9999 is out of range"),
    (["export", "--trace", "{good}", "--out", "{tmp}/x.svg", "--step", "x"], "step must be a round number"),
    (["export", "--trace", "{good}", "--out", "{tmp}/x.png", "--dpi", "0"], "dpi must be a whole number from 10"),
    (["export", "--trace", "{good}", "--out", "{tmp}/x.png", "--dpi", "100000"], "dpi must be a whole number"),
    (["export", "--trace", "{good}", "--out", "{tmp}/x.svg", "--width", "0"], "width must be from 0.5 to 200"),
    (["export", "--trace", "{good}", "--out", "{tmp}/x.svg", "--width", "1e9"], "width must be from 0.5 to 200"),
    (["export", "--trace", "{good}", "--out", "{tmp}/x.svg", "--label-chars", "0"], "label chars must be"),
    (["export", "--trace", "{good}", "--out", "{tmp}/x.svg", "--max-depth", "-1"], "max depth must be"),
    (["export", "--trace", "{good}", "--out", "{tmp}/x.svg", "--min-logprob", "nan"], "min log-prob must be"),
    (["export", "--trace", "{good}", "--out", "/dev/null/x.svg"], "/dev/null is not a folder"),
    (["export", "--trace", "{good}", "--out", "{tmp}"], "cannot tell the format"),
    (["export", "--trace", "{good}", "--out", "{tmp}/x.docx"], "cannot tell the format"),
    (["export", "--trace", "{good}", "--out", "{tmp}/no/dir/x.svg"], "does not exist"),
    (["export", "--trace", "/dev/null", "--out", "{tmp}/x.svg"], "not a regular file"),
]


@pytest.mark.parametrize("argv, words", CLI_REFUSED, ids=[f"{i}:{' '.join(c[0][:3])[:40]}" for i, c in
                                                          enumerate(CLI_REFUSED)])
def test_the_cli_refuses_bad_numbers_paths_and_kinds_by_name(good_trace, tmp_path, capsys, argv, words):
    _write(tmp_path, "nested.json", NESTED)
    code = main([a.format(tmp=tmp_path, good=good_trace) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and err.splitlines()[-1].startswith("error: ") and words in err and "Traceback" not in err, err


def test_weights_of_another_size_are_named_not_pointed_at_a_hidden_report(saved_pair, tmp_path, capsys):
    """issue #64 class 7: a checkpoint whose weights do not fit its config said "look at the above report" with
    nothing above (transformers logs the report; the app keeps its logs quiet). The error names the tensors."""
    target = _copy(saved_pair[0], tmp_path / "target")
    config = json.loads((target / "config.json").read_text())
    config["intermediate_size"] = config["intermediate_size"] * 2
    (target / "config.json").write_text(json.dumps(config))
    code = main(["run", "--target", str(target), "--draft", str(saved_pair[1]), "--prompt", "x", "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "above report" not in err and "Traceback" not in err, err
    assert re.search(r"[0-9]+ weights do not have the config's shape: model\.layers\.0\.mlp\.\w+_proj\.weight \[", err), err

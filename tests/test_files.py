"""Issue #27 D7 / D8: every user-named file is read bounded (files.read_limited): devices, pipes, over-long names
and symlink loops are clear errors of the caller's kind, at once; never a hang, a MemoryError or a traceback."""

from __future__ import annotations

import os

import pytest

from ddtree_viz.engine.prompts import read_prompt_file
from ddtree_viz.errors import InputError, TraceError
from ddtree_viz.files import read_limited
from ddtree_viz.trace import Trace


def _fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("make", [lambda t: "/dev/zero", lambda t: "/dev/urandom", _fifo])
def test_devices_and_pipes_are_refused_at_once(tmp_path, make):
    path = make(tmp_path)
    with pytest.raises(InputError, match="not a regular file"):
        read_prompt_file(path)
    with pytest.raises(TraceError, match="not a regular file"):
        Trace.load(path)


def test_an_over_long_name_and_a_symlink_loop_are_clear_errors(tmp_path):
    long = tmp_path / ("x" * 300 + ".json")
    with pytest.raises(InputError, match="cannot read prompt file .*: File name too long"):
        read_prompt_file(long)
    with pytest.raises(TraceError, match="cannot read trace file .*: File name too long"):
        Trace.load(long)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(InputError, match="cannot read prompt file .*loop"):
        read_prompt_file(loop)


def test_the_limit_holds(tmp_path):
    path = tmp_path / "big.txt"
    path.write_text("a" * 101)
    assert read_limited(path, 101, "test file") == "a" * 101
    with pytest.raises(InputError, match="test file .* is 101 bytes; at most 100 are read"):
        read_limited(path, 100, "test file")
    path.write_bytes(b"\xff")
    with pytest.raises(InputError, match="it is not UTF-8 text"):
        read_limited(path, 100, "test file")


def test_prompt_sets_are_read_bounded_too(tmp_path):
    """analyze --prompts /dev/zero read until MemoryError; a name over 255 bytes ended in a traceback."""
    from ddtree_viz.promptset.files import read_prompts

    with pytest.raises(InputError, match="not a regular file"):
        read_prompts("/dev/zero")
    with pytest.raises(InputError, match="File name too long"):
        read_prompts(tmp_path / ("p" * 300 + ".txt"))
    with pytest.raises(InputError, match="does not exist"):
        read_prompts(tmp_path / "missing.txt")


def test_over_long_output_names_are_clear_errors(tmp_path, capsys):
    """D7: a name over 255 bytes for run --trace, export --out and analyze --out ended in a traceback (exit 1)."""
    from ddtree_viz import cli

    long = str(tmp_path / ("o" * 300 + ".json"))
    trace = tmp_path / "t.json"
    trace.write_text("{}")
    prompts = tmp_path / "p.txt"
    prompts.write_text("def f(x):\n")
    for argv in (["run", "--prompt", "x", "--max-new-tokens", "2", "--trace", long],
                 ["export", "--trace", str(trace), "--out", long[:-5] + ".svg"],
                 ["analyze", "--prompts", str(prompts), "--out", long[:-5]],
                 ["analyze", "--prompts", str(prompts), "--out", long[:-5] + "/sub"]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: cannot write") and ("255" in err or "too long" in err), err

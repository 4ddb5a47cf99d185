"""The web UI's start-up flags checked before it serves (issue #64 class 5): a missing or bad --replay trace, a
--report-root that is no folder and an absurd --threads end in `error: ...` and exit 2, at once and before gradio
loads, instead of a server that then fails on the page. Valid flags still pass."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_viz.errors import DDTreeVizError
from ddtree_viz.page.web.args import MAX_THREADS, checked_args

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "trace.fifo"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("flags, words", [
    (lambda t: ["--replay", str(t / "missing.json")], "trace file not found"),
    (lambda t: ["--replay", str(t)], "is a directory"),
    (lambda t: ["--replay", str(_fifo(t))], "not a regular file"),
    (lambda t: ["--replay", str(t / "bad.json")], "trace"),
    (lambda t: ["--replay", str(t / "list.json")], "trace"),
    (lambda t: ["--report-root", str(t / "nowhere")], "no such directory"),
    (lambda t: ["--report-root", str(t / "bad.json")], "no such directory"),
    (lambda t: ["--threads", "0"], "--threads must be between 1 and"),
    (lambda t: ["--threads", "100000"], f"--threads must be between 1 and {MAX_THREADS}"),
])
def test_bad_start_up_flags_are_refused_by_name(tmp_path, flags, words):
    (tmp_path / "bad.json").write_text("{not json", encoding="utf-8")
    (tmp_path / "list.json").write_text("[1, 2, 3]", encoding="utf-8")
    with pytest.raises(DDTreeVizError) as exc:
        checked_args([*flags(tmp_path), "--port", _free_port()])
    assert words in str(exc.value), str(exc.value)


def test_good_start_up_flags_pass(tmp_path):
    args = checked_args(["--report-root", str(tmp_path), "--threads", "2", "--port", _free_port()])
    assert args.report_root == str(tmp_path) and args.threads == 2


def test_the_app_exits_2_on_a_missing_replay_file_without_serving(tmp_path):
    """What a user runs: app.py, one line on stderr, exit 2, no server (it returns before gradio is imported)."""
    proc = subprocess.run([sys.executable, str(ROOT / "app.py"), "--replay", str(tmp_path / "none.json"), "--port",
                           _free_port()], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: trace file not found"), proc.stderr
    assert "Traceback" not in proc.stderr and "serving on" not in proc.stdout

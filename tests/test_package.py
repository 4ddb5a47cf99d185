"""The installable package: pyproject.toml's pins are requirements.txt's, the `ddtree-viz` console script (installed
by `pip install -e .`, as .ci/run does) runs from any directory, and `app` hands its options to the web UI's parser."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ddtree_viz import cli

ROOT = Path(__file__).resolve().parents[1]
SUBCOMMANDS = ("run", "bench", "export", "replay", "app")


def _pins(path: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("-")]


def test_pyproject_dependencies_are_the_requirements_pins():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["dependencies"] == _pins(ROOT / "requirements.txt")
    assert project["optional-dependencies"] == {"gpu": _pins(ROOT / "requirements-gpu.txt")}
    assert project["name"] == "ddtree-viz" and project["requires-python"] == ">=3.11"
    assert project["scripts"] == {"ddtree-viz": "ddtree_viz.cli:main"}


def test_app_subcommand_hands_its_options_to_the_web_parser(monkeypatch, tmp_path):
    import socket

    from ddtree_viz.page.web import app as web

    with socket.socket() as s:  # a free port: `app` refuses a port in use before it hands over
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    seen = {}
    monkeypatch.setattr(web, "main", lambda argv, prog="app.py": seen.update(argv=argv, prog=prog) or 0)
    argv = ["--port", str(port), "--report-root", str(tmp_path), "--engine", "runner"]  # flags checked first: real ones
    assert cli.main(["app", *argv]) == 0
    assert seen["argv"] == argv and seen["prog"].endswith(" app")
    args = web.build_parser().parse_args(seen["argv"])
    assert (args.port, args.report_root, args.engine, args.host, args.share) == (port, str(tmp_path), "runner",
                                                                                  "127.0.0.1", False)


def test_app_subcommand_help_is_the_web_ui_options(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["app", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--target", "--draft", "--dtype", "--device", "--engine", "--host", "--port", "--share", "--replay"):
        assert flag in out
    assert "127.0.0.1" in out


def test_unknown_options_are_still_usage_errors(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "--prompt", "x", "--no-such-option"])
    assert exit_.value.code == 2 and "unrecognized arguments: --no-such-option" in capsys.readouterr().err


def test_missing_embedded_model_is_a_clear_error(monkeypatch, tmp_path):
    """A non-editable install has no assets/ beside the package: say so, and what to pass instead."""
    import ddtree_viz.engine.models as models
    from ddtree_viz.errors import ModelLoadError

    monkeypatch.setattr(models, "EMBEDDED_TARGET", tmp_path / "assets" / "tiny-qwen35-target")
    with pytest.raises(ModelLoadError, match=r"embedded default model is not installed .*pip install -e \..*--target"):
        models.load_pair()


# ---------------------------------------------------------------------------------------------------------
# The console script of an installed checkout (`pip install -e .`: .ci/run installs it into .venv)
# ---------------------------------------------------------------------------------------------------------


def _script() -> Path:
    # the console script of the environment running the tests (a checkout's ddtree_viz.egg-info can make the
    # package look installed to importlib.metadata where it is not, so the script is what counts)
    script = Path(sys.executable).with_name("ddtree-viz")
    if not script.is_file():
        pytest.skip(f"ddtree-viz is not installed here: no console script beside {sys.executable} "
                    "(bash .ci/run installs it: pip install -e .)")
    return script


def _run_script(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the package comes from the install
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run([str(_script()), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_installed_package_is_this_checkout(tmp_path):
    _script()
    proc = subprocess.run([sys.executable, "-c", "import ddtree_viz; print(ddtree_viz.__file__)"], cwd=tmp_path,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).resolve() == ROOT / "ddtree_viz" / "__init__.py"


def test_console_script_lists_the_subcommands(tmp_path):
    proc = _run_script("--help", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "usage: ddtree-viz" in proc.stdout
    for command in SUBCOMMANDS:
        assert command in proc.stdout


def test_console_script_runs_the_embedded_model_from_any_directory(tmp_path):
    proc = _run_script("run", "--prompt", "def f(x):", "--max-new-tokens", "8", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "output identical to greedy for 8 tokens" in proc.stdout
    assert list(tmp_path.iterdir()) == []  # nothing written where it was run

"""The command line end to end: `python -m ddtree_viz run | bench` on tiny models written to disk, and app.py's options."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_viz import cli
from ddtree_viz.trace import Trace
from tests import tiny

ROOT = Path(__file__).resolve().parents[1]
BENCH_KEYS = ("greedy_tok_s", "dflash_tok_s", "ddtree_tok_s", "ddtree_speedup", "dflash_speedup",
              "ddtree_mean_acceptance", "dflash_mean_acceptance")


@pytest.fixture(scope="module")
def model_args(tmp_path_factory) -> list[str]:
    target, draft = tiny.save_pair(tiny.tiny_pair("hybrid"), tmp_path_factory.mktemp("models"))
    return ["--target", str(target), "--draft", str(draft)]


def _python(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    # one torch thread: the models are tiny, and OpenMP spin-waiting fights the test process on 2 cores
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_run_end_to_end_writes_trace(model_args, tmp_path):
    trace_path = tmp_path / "out.json"
    proc = _python("-m", "ddtree_viz", "run", *model_args, "--prompt", "def f(x):\n", "--max-new-tokens", "16",
                   "--budget", "8", "--trace", str(trace_path))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "identical to greedy for 16 tokens" in out
    assert "rounds: " in out and "tokens per round: " in out
    assert "mean acceptance: " in out
    assert "DDTree, budget 8" in out
    assert "engine runner (auto: the fastest exact engine for this target)" in out  # issue #17: the default engine
    assert "Traceback" not in proc.stderr
    trace = Trace.load(trace_path)
    assert trace.steps and len(trace.output_ids) == 16
    assert trace.first_divergence is None and trace.greedy_ids == trace.output_ids
    assert trace.settings["budget"] == 8 and trace.settings["verify"] == "exact"
    # tokens per round printed == the tokens each recorded step kept (#26.4: was s.acceptance, the walk)
    per_round = out.split("tokens per round: ")[1].splitlines()[0].split()
    assert [int(x) for x in per_round] == [s.kept for s in trace.steps]


def test_run_naive_is_labelled_known_wrong(model_args, capsys):
    rc = cli.main(["run", *model_args, "--prompt", "import os", "--max-new-tokens", "6", "--budget", "4", "--verify", "naive"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "naive" in out.lower() and "known-wrong" in out
    assert "engine transformers (auto" in out  # naive rounds: transformers' forward, the only engine with the mode
    assert "greedy" in out  # identical or DIVERGES, either way it is reported


def test_run_dflash_chain(model_args, capsys):
    rc = cli.main(["run", *model_args, "--prompt", "class A:", "--max-new-tokens", "6", "--method", "dflash",
                   "--block-size", "4"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "DFlash (chain)" in out and "block size 4" in out
    assert "identical to greedy for 6 tokens" in out


def test_run_no_greedy_skips_comparison(model_args, capsys, tmp_path):
    path = tmp_path / "t.json"
    rc = cli.main(["run", *model_args, "--prompt", "x = 1", "--max-new-tokens", "3", "--budget", "2", "--no-greedy",
                   "--trace", str(path)])
    out = capsys.readouterr().out
    assert rc == 0 and "skipped" in out and "identical" not in out
    assert Trace.load(path).greedy_ids is None


def test_bench_json_end_to_end(model_args, tmp_path, capsys):
    path = tmp_path / "bench.json"
    rc = cli.main(["bench", *model_args, "--prompt", "def f(x):", "--prompt", "import sys", "--max-new-tokens", "6",
                   "--budget", "4", "--json", str(path)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    data = json.loads(path.read_text())
    for key in BENCH_KEYS:
        assert isinstance(data[key], float) and data[key] > 0, key
    assert data["identical_to_greedy"] is True
    assert [p["prompt"] for p in data["prompts"]] == ["def f(x):", "import sys"]
    assert all(p[m]["tokens"] == 6 for p in data["prompts"] for m in ("greedy", "dflash", "ddtree"))
    for m in ("greedy", "dflash", "ddtree"):
        assert m in out.out and "tok/s" in out.out


def test_bench_times_a_dflash2_drafters_selector_methods(tmp_path, capsys):
    """With the embedded DFlash2 drafter, bench times its selector's chain and the selector tree beside the rest."""
    path = tmp_path / "bench.json"
    rc = cli.main(["bench", "--draft", "dflash2", "--prompt", "def f(x):", "--max-new-tokens", "6", "--budget", "4",
                   "--json", str(path)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    data = json.loads(path.read_text())
    for key in ("dflash2", "ddtree_selector"):
        assert data[f"{key}_tok_s"] > 0 and data[f"{key}_mean_acceptance"] >= 1, key
        assert data[f"{key}_identical_to_greedy"] is True, key
    assert data["identical_to_greedy"] is True
    assert {m for m in data["prompts"][0] if isinstance(data["prompts"][0][m], dict)} == {
        "greedy", "dflash", "ddtree", "dflash2", "ddtree-selector"}
    assert "ddtree-selector" in out.out and "dflash2 " in out.out


def test_cli_user_error_exits_2_without_traceback(tmp_path, capsys):
    """In the test process: the exit status and stderr of a real process are test_app_py_on_a_port_in_use_is_an_error's
    (`python -m ddtree_viz app`), which needs no torch import first."""
    assert cli.main(["run", "--target", "/nonexistent/dir", "--draft", str(tmp_path), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "/nonexistent/dir" in err
    assert "Traceback" not in err


def test_cli_bad_settings_are_errors(model_args, capsys, tmp_path):
    cases = [
        (["--budget", "0"], "budget"),
        (["--max-new-tokens", "0"], "max new tokens"),
        (["--block-size", "1"], "block size"),
        (["--block-size", "99"], "block size"),
        (["--trace", str(tmp_path / "no" / "such" / "dir" / "t.json"), "--max-new-tokens", "2"], "cannot write trace"),
    ]
    for extra, words in cases:
        rc = cli.main(["run", *model_args, "--prompt", "hi", *extra])
        err = capsys.readouterr().err
        assert rc == 2, extra
        assert err.startswith("error: ") and words in err and "Traceback" not in err, (extra, err)
    # settings that need no model are refused before any model is loaded
    rc = cli.main(["run", "--target", "/nonexistent/dir", "--draft", "/nonexistent/d", "--prompt", "hi", "--budget", "0"])
    assert rc == 2 and "budget must be between 1 and" in capsys.readouterr().err
    rc = cli.main(["run", *model_args, "--prompt", ""])
    assert rc == 2 and "prompt is empty" in capsys.readouterr().err
    rc = cli.main(["bench", *model_args, "--prompt", ""])
    assert rc == 2 and "empty" in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["run", "--prompt", "x", "--budget", "2.5"], "whole number"),
    (["run", "--prompt", "x", "--budget", "abc"], "whole number"),
    (["run", "--prompt", "x", "--verify", "sloppy"], "invalid choice"),
    (["run", "--prompt", "x", "--method", "beam"], "invalid choice"),
    (["run", "--prompt", "x", "--dtype", "float64"], "invalid choice"),
    (["run", "--prompt", "x", "--device", "tpu"], "invalid choice"),
    (["run"], "--prompt"),
])
def test_cli_parse_errors(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert words in capsys.readouterr().err


def test_cli_without_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "run" in capsys.readouterr().err


def test_cli_missing_embedded_default_is_a_clean_error(monkeypatch, capsys, tmp_path):
    import ddtree_viz.engine.models as models

    monkeypatch.setattr(models, "EMBEDDED_TARGET", tmp_path / "not-there")
    assert cli.main(["run", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "embedded default model" in err and "--target" in err


def test_app_help():
    proc = _python("app.py", "--help", timeout=60)
    assert proc.returncode == 0
    for flag in ("--target", "--draft", "--dtype", "--device", "--engine", "--host", "--port", "--share"):
        assert flag in proc.stdout
    assert "127.0.0.1" in proc.stdout


def test_bench_runner_end_to_end(tmp_path, capsys):
    """--runner: greedy and DDTree through the static runner on the embedded pair, checked against greedy."""
    path = tmp_path / "bench.json"
    rc = cli.main(["bench", "--prompt", "class Stack:\n    def __init__(self):\n", "--max-new-tokens", "24", "--budget",
                   "8", "--runner", "--json", str(path)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    data = json.loads(path.read_text())
    assert data["runner_identical_to_greedy"] is True
    assert data["runner_ddtree_mean_acceptance"] >= 1.0 and data["runner_greedy_tok_s"] > 0
    assert data["settings"]["runner"] is True and data["settings"]["cuda_graphs"] is False
    prompt = data["prompts"][0]
    assert prompt["runner-greedy"]["tokens"] == prompt["runner-ddtree"]["tokens"] == prompt["greedy"]["tokens"] > 1
    assert prompt["runner-ddtree"]["first_divergence"] is None
    assert "runner-ddtree vs runner-greedy" in out.out


# In the test process (cli.main, as most tests here): the subprocess path (`python -m ddtree_viz`, its exit status
# and stderr) is test_run_end_to_end_writes_trace's and test_app_py_on_a_port_in_use_is_an_error's; each subprocess
# that decodes pays the imports of torch and transformers again (10-50 s on a loaded 2-core machine).
def test_bench_runner_refuses_a_pure_attention_target(tmp_path, capsys):
    target, draft = tiny.save_pair(tiny.tiny_pair("attention"), tmp_path)
    rc = cli.main(["bench", "--target", str(target), "--draft", str(draft), "--prompt", "hi", "--max-new-tokens", "4",
                   "--runner"])
    err = capsys.readouterr().err
    assert rc == 2 and "error: " in err and "hybrid" in err and "Traceback" not in err


def test_run_on_the_runner_engine(tmp_path, capsys):
    path = tmp_path / "t.json"
    rc = cli.main(["run", "--prompt", "import os\n", "--engine", "runner", "--max-new-tokens", "20", "--trace", str(path)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "engine runner" in out.out and "output identical to greedy for 20 tokens" in out.out
    assert Trace.load(path).settings["engine"] == "runner"
    rc = cli.main(["run", "--prompt", "x", "--engine", "runner", "--verify", "naive"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and "naive" in err and "Traceback" not in err


def test_run_record_light_decodes_the_same_rounds_with_less_kept(model_args, capsys):
    """--record light (issue #31 item 3): the same rounds and output as the full record, equal to greedy, its phases
    not timed; refused with --trace or --compare, which need the trees, before any model loads. With --launch-ahead
    on a CPU (no CUDA graphs to launch) the same rounds again, and the run says the verify was not launched ahead;
    with --tree-on-device (the tree by tensor ops, eagerly here) the same rounds, and the run says so."""
    outs = {}
    for level, extra in (("full", []), ("light", []), ("light", ["--launch-ahead"]), ("light", ["--tree-on-device"])):
        rc = cli.main(["run", *model_args, "--prompt", "def f(x):\n", "--max-new-tokens", "12", "--budget", "6",
                       "--record", level, *extra])
        outs[level + " ".join(extra)] = capsys.readouterr().out
        assert rc == 0 and "identical to greedy for 12 tokens" in outs[level + " ".join(extra)]
    rounds = [next(line for line in out.splitlines() if line.startswith("rounds: ")) for out in outs.values()]
    assert rounds[0] == rounds[1] == rounds[2] == rounds[3]
    assert "trees built on the device eagerly" in outs["light--tree-on-device"]
    assert "trees built" not in outs["light"]
    ahead = outs["light--launch-ahead"]
    assert "verify not launched ahead: it needs DDTree's marginal tree on the runner engine" in ahead
    assert "launched ahead" not in outs["light"]
    assert "phases not timed: --record light" in outs["light"] and "verify " not in outs["light"].split("time: ")[1]
    assert "phases not timed" not in outs["full"] and "verify " in outs["full"].split("time: ")[1].splitlines()[0]
    for extra in (["--trace", "t.json"], ["--compare", "budget=2"]):
        rc = cli.main(["run", "--target", "/nonexistent", "--prompt", "x", "--record", "light", *extra])
        err = capsys.readouterr().err
        assert rc == 2 and "--record light keeps no trees" in err and extra[0] in err and "Traceback" not in err


def test_run_sampled_writes_a_reproducible_trace_and_replay_prints_it(model_args, capsys, tmp_path):
    path = tmp_path / "sampled.json"
    flags = ["--temperature", "0.8", "--top-k", "50", "--top-p", "0.95", "--seed", "8"]  # a sample that runs 12 tokens
    rc = cli.main(["run", *model_args, "--prompt", "def f(x):\n", "--max-new-tokens", "12", "--budget", "8", *flags,
                   "--trace", str(path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "sampling (T 0.8, top-k 50, top-p 0.95, seed 8): position-keyed noise gumbel-lowbias32-v1" in out
    assert "output identical to the target's own sampling (same seed) for 12 tokens" in out
    trace = Trace.load(path)
    assert {k: trace.settings[k] for k in ("temperature", "top_k", "top_p", "seed", "noise")} == dict(
        temperature=0.8, top_k=50, top_p=0.95, seed=8, noise="gumbel-lowbias32-v1")
    assert trace.greedy_ids == trace.output_ids and all(len(s.target_choice) == len(s.nodes) for s in trace.steps)
    assert cli.main(["replay", "--print", str(path)]) == 0
    printed = capsys.readouterr().out
    assert "target's choice: sampling (T 0.8, top-k 50, top-p 0.95, seed 8), noise gumbel-lowbias32-v1" in printed
    assert f"`run {' '.join(flags)}`" in printed
    assert "output identical to the target's own sampling (same seed) for 12 tokens" in printed
    # the same options again: the same tokens
    again = tmp_path / "again.json"
    assert cli.main(["run", *model_args, "--prompt", "def f(x):\n", "--max-new-tokens", "12", "--budget", "3", *flags,
                     "--trace", str(again)]) == 0
    assert Trace.load(again).output_ids == trace.output_ids


@pytest.mark.parametrize("extra, words", [
    (["--temperature", "-1"], "temperature"),
    (["--top-p", "0"], "top-p"),
    (["--top-p", "1.5"], "top-p"),
    (["--seed", "-2"], "seed"),
    (["--seed", str(2**32)], "seed"),
])
def test_bad_sampling_options_are_refused_before_loading(extra, words, capsys):
    rc = cli.main(["run", "--target", "/nonexistent/dir", "--draft", "/nonexistent/d", "--prompt", "hi", *extra])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and words in err and "Traceback" not in err
    rc = cli.main(["bench", "--target", "/nonexistent/dir", "--draft", "/nonexistent/d", "--temperature", "0", *extra])
    assert rc == 2 and words in capsys.readouterr().err


def test_bench_measures_several_temperatures_in_one_run(model_args, tmp_path, capsys):
    path = tmp_path / "bench.json"
    rc = cli.main(["bench", *model_args, "--prompt", "def f(x):", "--max-new-tokens", "8", "--budget", "4",
                   "--temperature", "0", "0.7", "1.0", "--seed", "3", "--json", str(path)])
    out = capsys.readouterr().out
    assert rc == 0
    data = json.loads(path.read_text())
    assert list(data)[:7] == list(BENCH_KEYS) and data["settings"]["temperature"] == 0.0
    sweep = data["by_temperature"]
    assert [r["settings"]["temperature"] for r in sweep] == [0.0, 0.7, 1.0]
    assert all(r["settings"]["seed"] == 3 and r["identical_to_greedy"] is True for r in sweep)
    assert sweep[0]["ddtree_mean_acceptance"] == data["ddtree_mean_acceptance"]
    assert "== sampling (T 0.7, seed 3) ==" in out and "identical to sampling" in out
    table = out.split("temperature  ddtree acceptance")[1].splitlines()[1:4]
    assert [line.split()[0] for line in table] == ["0", "0.7", "1"] and all(line.endswith("yes") for line in table)


# ---------------------------------------------------------------------------------------------------------------
# Hostile and clumsy command lines (issue #19): `error: ...` and exit status 2, never a traceback
# ---------------------------------------------------------------------------------------------------------------


def test_prompt_with_invalid_utf8_bytes_is_an_error_not_a_traceback(model_args, capsys):
    """Bytes that are not UTF-8 reach Python as lone surrogates (os.fsdecode: what the interpreter does to its
    argv); the tokenizer failed on them with a TypeError."""
    rc = cli.main(["run", *model_args, "--prompt", os.fsdecode(b"def f(\xff\xfe):")])
    out = capsys.readouterr()
    assert rc == 2 and "Traceback" not in out.err, out.err
    assert "error: the prompt is not valid text: character 6 is the byte 0xff, which is not UTF-8" in out.err
    assert out.out == ""  # refused before the models load


def _model_dir_with_config(model_args, tmp_path, config) -> str:
    import shutil

    target = tmp_path / "target"
    shutil.copytree(model_args[1], target)
    (target / "config.json").write_text(json.dumps(config) if not isinstance(config, str) else config)
    return str(target)


@pytest.mark.parametrize("config, words", [
    ([1, 2, 3], "must be a JSON object, not a list"),
    ("vocab", "vocab_size must be a whole number >= 1, not -5"),
    ("layers", "num_hidden_layers must be a whole number >= 1, not 'four'"),
])
def test_target_config_of_the_wrong_shape_is_an_error(model_args, tmp_path, capsys, config, words):
    if isinstance(config, str):
        good = json.loads((Path(model_args[1]) / "config.json").read_text())
        config = {**good, "vocab_size": -5} if config == "vocab" else {**good, "num_hidden_layers": "four"}
    target = _model_dir_with_config(model_args, tmp_path, config)
    rc = cli.main(["run", "--target", target, "--draft", model_args[3], "--prompt", "x", "--max-new-tokens", "2"])
    assert rc == 2 and words in capsys.readouterr().err


def _busy_port():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s, s.getsockname()[1]


def test_replay_port_in_use_or_out_of_range(tmp_path, capsys):
    path = tmp_path / "t.json"
    session = __import__("ddtree_viz.engine.session", fromlist=["DecodeSession"]).DecodeSession(
        tiny.tiny_pair("hybrid"), budget=2, max_new_tokens=3)
    session.prefill("a")
    session.run()
    session.to_trace().save(path)
    sock, port = _busy_port()
    try:
        assert cli.main(["replay", str(path), "--port", str(port)]) == 2
        assert f"error: cannot listen on 127.0.0.1:{port}: it is in use" in capsys.readouterr().err
    finally:
        sock.close()
    for bad in ("0", "70000", "-5"):
        with pytest.raises(SystemExit) as exc:
            cli.main(["replay", str(path), "--port", bad])
        assert exc.value.code == 2 and "must be a port number from 1 to 65535" in capsys.readouterr().err


@pytest.mark.parametrize("entry", [["app.py"], ["-m", "ddtree_viz", "app"]])
def test_app_py_on_a_port_in_use_is_an_error(entry):
    """The error comes before gradio and torch are imported (-X importtime lists every import on stderr): in a
    second, not after half a minute of imports."""
    sock, port = _busy_port()
    try:
        proc = _python("-X", "importtime", *entry, "--port", str(port), timeout=120)
    finally:
        sock.close()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"error: cannot listen on 127.0.0.1:{port}: it is in use" in proc.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "ddtree_viz.page.web.args" in imported and not {"gradio", "torch"} & imported


@pytest.mark.parametrize("command", ["run", "bench"])
def test_bad_output_path_is_refused_before_the_work(model_args, tmp_path, capsys, command):
    """--trace / --json are checked before any model loads (they were found bad only after the whole decode)."""
    flag = "--trace" if command == "run" else "--json"
    for bad, words in ((tmp_path / "missing" / "out.json", "does not exist"), (tmp_path, "is a directory")):
        argv = [command, *model_args, "--prompt", "x", "--max-new-tokens", "2", flag, str(bad)]
        assert cli.main(argv) == 2
        captured = capsys.readouterr()
        assert words in captured.err and captured.out == ""  # nothing printed: no model was loaded


def test_export_bad_output_path_is_refused_before_rendering(tmp_path, capsys):
    assert cli.main(["export", "--trace", str(tmp_path / "none.json"), "--out", str(tmp_path / "no" / "x.svg")]) == 2
    assert f"{tmp_path / 'no'} does not exist" in capsys.readouterr().err


def test_max_new_tokens_past_the_target_names_the_real_limit(capsys):
    """The embedded target has 2,048 positions: 8,192 new tokens blamed the prompt ('must be at most 0 tokens')."""
    assert cli.main(["run", "--prompt", "x", "--max-new-tokens", "8192", "--no-greedy"]) == 2
    err = capsys.readouterr().err
    assert "max new tokens 8192 is too many for this target: it has 2,048 positions" in err
    assert "at most 1,999 new tokens fit" in err and "prompt is" not in err


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"}, {"HF_HUB_OFFLINE": "", "HF_ENDPOINT": "http://127.0.0.1:9"}])
def test_hub_id_offline_fails_fast_and_says_how_to_use_a_directory(env, monkeypatch, capsys, tmp_path):
    """No network (or HF_HUB_OFFLINE): the hub client retried for 50 s; now a probe of a few seconds at most."""
    import time

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty hub cache
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    start = time.monotonic()
    assert cli.main(["run", "--prompt", "x", "--target", "someone/no-such-model", "--draft", "someone/no-drafter"]) == 2
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err
    assert "not in the local hub cache" in err and "--target /path/to/model" in err
    assert elapsed < 20, elapsed


def test_run_prints_the_session_analysis_and_compare_writes_both(model_args, capsys, tmp_path):
    path = tmp_path / "cmp.json"
    # the engine named: run's default is now auto (the runner on this hybrid), which the labels below would name
    rc = cli.main(["run", *model_args, "--prompt", "def f(x):\n", "--max-new-tokens", "12", "--budget", "6",
                   "--engine", "transformers", "--compare", "method=dflash,block-size=4", "--trace", str(path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "acceptance histogram (rounds with 0, 1, 2, ... accepted drafts kept; a cut round at what it kept): " in out
    assert "per-depth acceptance P(accepted >= d | accepted >= d-1, tree depth >= d): d1:" in out
    assert "session budget curve (budget:tokens gained" in out and "later rounds elsewhere" in out
    assert "B: DFlash chain, block 4, exact" in out and "session chain length curve" in out
    assert "compare: A = DDTree budget 6, block 8, exact; B = DFlash chain, block 4, exact" in out
    assert "outputs identical for 12 tokens" in out and out.count("identical to its reference") == 2
    assert "compare trace written to" in out
    from ddtree_viz.trace import CompareTrace, load_any

    both = load_any(path)
    assert isinstance(both, CompareTrace) and both.b.settings["method"] == "dflash" and both.b.settings["block_size"] == 4
    hist = out.split("at what it kept): ")[1].splitlines()[0].split()
    assert sum(map(int, hist)) == len(both.a.steps)
    with pytest.raises(Exception, match="compare trace"):
        Trace.load(path)
    # replay --print reads it (both sides and the comparison) with one round in full
    rc = cli.main(["replay", str(path), "--print", "--round", "1"])
    out = capsys.readouterr().out
    assert rc == 0 and "== A ==" in out and "== B ==" in out and "outputs identical for 12 tokens" in out
    assert "round 1 of" in out and "stopped at depth" in out and "drafter's grid (top 6 per depth" in out
    assert "drafter's grid (top 16 per depth" in out  # B, the chain: the cap
    first = both.a.steps[0]
    assert f"accepted path {list(first.accepted)}" in out
    table = out.split("== B ==")[0].split("top after\n")[1]
    node_lines = [ln for ln in table.splitlines() if ln.strip()]
    assert len(node_lines) == len(first.nodes)
    assert sum(ln.startswith(" ✓") for ln in node_lines) == first.acceptance - 1


@pytest.mark.parametrize("spec, words", [("budget", "KEY=VALUE"), ("colour=red", "KEY=VALUE"),
                                          ("budget=x", "whole number"), ("method=beam", "method must be one of")])
def test_bad_compare_specs_are_refused_before_loading(spec, words, capsys):
    try:
        rc = cli.main(["run", "--prompt", "x", "--compare", spec])
    except SystemExit as exc:  # argparse's own refusal
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2 and words in err and "Traceback" not in err


def test_replay_round_needs_print(model_args, capsys, tmp_path):
    path = tmp_path / "t.json"
    assert cli.main(["run", *model_args, "--prompt", "x = 1", "--max-new-tokens", "4", "--budget", "3",
                     "--trace", str(path)]) == 0
    capsys.readouterr()
    assert cli.main(["replay", str(path), "--round", "1"]) == 2
    assert "--round goes with --print" in capsys.readouterr().err
    assert cli.main(["replay", str(path), "--print", "--round", "99"]) == 2
    assert "out of range" in capsys.readouterr().err


def test_run_reports_the_reference_and_its_verdict(model_args, capsys, tmp_path):
    """`run` says where the reference decoded and its time apart from the rounds'; a divergence of the known-wrong
    naive mode gets 'beyond numerical noise: mismatch' with its evidence, in the output and in the trace."""
    path = tmp_path / "naive.json"
    rc = cli.main(["run", *model_args, "--prompt", "def f(x):\n", "--max-new-tokens", "40", "--budget", "16",
                   "--verify", "naive", "--trace", str(path)])
    out = capsys.readouterr().out
    assert rc == 0 and "reference: transformers' own forward" in out and "not in the rounds' time" in out
    trace = Trace.load(path)
    assert trace.first_divergence == 3  # this tiny random pair leaves greedy there in naive mode
    assert "verdict: beyond numerical noise: mismatch (margin " in out
    assert trace.divergence_verdict == "mismatch" and trace.numerical_noise < 1e-3 < trace.divergence_margin
    assert cli.main(["replay", str(path), "--print"]) == 0  # the saved trace says the same with no model
    replayed = capsys.readouterr().out
    assert "verdict: beyond numerical noise: mismatch (margin " in replayed
    assert "reference: transformers' own forward (one token at a time)" in replayed
    rc = cli.main(["run", *model_args, "--prompt", "def f(x):\n", "--max-new-tokens", "12", "--budget", "8",
                   "--engine", "runner", "--reference", "transformers"])
    out = capsys.readouterr().out
    assert rc == 0 and "identical to greedy for 12 tokens" in out and "reference: transformers' own forward" in out
    rc = cli.main(["run", *model_args, "--prompt", "def f(x):\n", "--max-new-tokens", "12", "--budget", "8",
                   "--engine", "runner"])
    out = capsys.readouterr().out
    assert rc == 0 and "reference: the runner (one-node trees on a second static runner)" in out
    assert "numerical noise " in out


# ------------------------------------------------------------------------------------------------------------
# chat prompts: --chat, --system, --thinking, --prompt-file
# ------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat_model_args(tmp_path_factory) -> list[str]:
    target, draft = tiny.save_pair(tiny.chat_pair(seed=2), tmp_path_factory.mktemp("chat-models"))
    return ["--target", str(target), "--draft", str(draft)]


def test_run_chat_from_a_messages_file(chat_model_args, capsys, tmp_path):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "List <three> colours."}]
    prompt_file, trace_path = tmp_path / "chat.json", tmp_path / "t.json"
    prompt_file.write_text(json.dumps(messages), encoding="utf-8")
    rc = cli.main(["run", *chat_model_args, "--prompt-file", str(prompt_file), "--chat", "--thinking", "off",
                   "--max-new-tokens", "10", "--budget", "6", "--trace", str(trace_path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "prompt: chat template on, 2 messages (system, user), thinking off" in out
    assert "<|im_start|>user\nList <three> colours.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n" in out
    assert "identical to greedy for 10 tokens" in out
    trace = Trace.load(trace_path)
    tok = tiny.chat_tokenizer()
    expected = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, enable_thinking=False)
    assert list(trace.prompt_ids) == list(expected["input_ids"])
    assert trace.chat_template is True and trace.thinking is False and list(trace.messages) == messages
    assert cli.main(["replay", str(trace_path), "--print"]) == 0
    assert "prompt given as: chat template on: 2 messages (system, user), thinking off" in capsys.readouterr().out


def test_run_plain_text_prompt_file_and_system_prompt(chat_model_args, capsys, tmp_path):
    prompt_file = tmp_path / "p.txt"
    prompt_file.write_text("[not json] just text", encoding="utf-8")  # a '[' that is not JSON is refused
    rc = cli.main(["run", *chat_model_args, "--prompt-file", str(prompt_file), "--max-new-tokens", "2"])
    assert rc == 2 and "not valid JSON" in capsys.readouterr().err
    prompt_file.write_text("def f(x):\n", encoding="utf-8")
    rc = cli.main(["run", *chat_model_args, "--prompt-file", str(prompt_file), "--max-new-tokens", "3", "--budget", "2"])
    out = capsys.readouterr().out
    assert rc == 0 and "prompt: raw text" in out and "<|im_start|>" not in out
    rc = cli.main(["run", *chat_model_args, "--prompt", "hi", "--chat", "--system", "Answer in French.",
                   "--max-new-tokens", "3", "--budget", "2"])
    out = capsys.readouterr().out
    assert rc == 0 and "<|im_start|>system\nAnswer in French.<|im_end|>" in out and "thinking template default" in out


def test_chat_errors(model_args, chat_model_args, capsys, tmp_path):
    rc = cli.main(["run", *model_args, "--prompt", "hi", "--chat"])  # the byte tokenizer has no chat template
    assert rc == 2 and "no chat template" in capsys.readouterr().err
    # refused before any model is loaded (the target does not exist)
    nowhere = ["--target", "/nonexistent/dir", "--draft", "/nonexistent/d"]
    for extra, words in ((["--thinking", "off"], "add --chat"), (["--system", "S"], "add --chat")):
        for command in ("run", "bench"):
            assert cli.main([command, *nowhere, "--prompt", "hi", *extra]) == 2
            assert words in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"role": "user", "content": {"text": "hi"}}]), encoding="utf-8")
    assert cli.main(["run", *nowhere, "--prompt-file", str(bad), "--chat"]) == 2
    assert "message 1 of prompt file" in capsys.readouterr().err
    good = tmp_path / "good.json"
    good.write_text(json.dumps([{"role": "user", "content": "hi"}]), encoding="utf-8")
    assert cli.main(["run", *nowhere, "--prompt-file", str(good)]) == 2
    assert "needs the chat template: add --chat" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["run", "--prompt", "a", "--prompt-file", str(good)])
    assert "not allowed with" in capsys.readouterr().err


def test_bench_chat(chat_model_args, capsys, tmp_path):
    path, prompt_file = tmp_path / "bench.json", tmp_path / "m.json"
    prompt_file.write_text(json.dumps([{"role": "user", "content": "hello"}]), encoding="utf-8")
    rc = cli.main(["bench", *chat_model_args, "--chat", "--thinking", "off", "--prompt", "hi", "--prompt-file",
                   str(prompt_file), "--max-new-tokens", "4", "--budget", "2", "--json", str(path)])
    out = capsys.readouterr().out
    assert rc == 0 and "through the chat template" in out
    data = json.loads(path.read_text())
    assert data["settings"]["chat_template"] is True and data["settings"]["thinking"] is False
    assert [p["prompt"] for p in data["prompts"]] == [
        f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n" for text in ("hi", "hello")]
    assert data["identical_to_greedy"] is True

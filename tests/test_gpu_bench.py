"""The GPU benchmark script's own code path, at toy widths on the CPU (--smoke): every figure it reports is
there, the exactness checks pass, and the split (--device-map auto) and runner (--fast) paths run."""

import json
import shutil

import pytest
import torch

from ddtree_viz.benchmarks import gpu
from ddtree_viz.benchmarks.gpu import config, exactness, memory, models, profiler
from ddtree_viz.engine.check import verdict
from ddtree_viz.engine.runner import PARTS


def _bench(tmp_path, *extra) -> dict:
    """The script's main (what `python -m ddtree_viz.benchmarks.gpu` runs) in the test process, on its one torch thread
    (conftest.py): a subprocess would import torch and transformers again and run on every core, its OpenMP threads
    spin-waiting against the other work of a loaded 2-core machine (the first test took 166 s that way in CI)."""
    out = tmp_path / "gpu.json"
    assert gpu.main(["--smoke", "--layers", "4", "--budgets", "4", "8", "--new-tokens", "8", "--json", str(out), *extra]) == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def runner_report(tmp_path_factory) -> dict:
    """One --fast --exactness run for four tests: the runner beside transformers' forward (with_the_runner), with
    FP8 and 4-bit weights beside bf16 (--fp8 --int4, measured after the bf16 target is freed, on the same default
    options) and the DFlash2 drafter beside DFlash 1 (--dflash2): separate runs measured the bf16 runner each time
    (~20 s alone each, more in CI)."""
    return _bench(tmp_path_factory.mktemp("gpu-runner"), "--fast", "--exactness", "--variants", "gdn_kernel", "fused",
                  "attention", "--fp8", "--int4", "--fp8-context", "300", "--dflash2", "--tree-forms")


def test_gpu_bench_smoke_with_the_runner(runner_report):
    report = runner_report
    speed = report["speed"]
    for key in ("weight_read_bound_ms", "copy_bandwidth_TBps", "greedy_step_ms", "draft_ms", "dflash_chain_verify_ms",
                "prefill_ms", "rounds"):
        assert speed[key], key
    assert [row["budget"] for row in speed["budgets"]] == [4, 8]
    for row in speed["budgets"]:
        assert row["verify_exact_ms"] > 0 and row["commit_exact_ms"] > 0 and "tree_exact_extra_ms" in row
    fast = speed["fast"]
    assert fast["graphs"] is False and fast["graphs_error"] is None  # no CUDA here: the same functions, eager
    assert fast["greedy_step_ms"] > 0 and fast["round_budget_64"]["host"] > 0
    assert fast["greedy_step_chained_ms"] > 0 and fast["targets"]["issue_67"]["greedy_step"]["chained_ms"] > 0
    step_timeline = fast["greedy_step_timeline"]  # the step's activities by kind (on a CPU the host's torch ops)
    assert step_timeline["steps"] == 8 and step_timeline["kinds"] and step_timeline["busy_ms_per_round"] > 0
    # the default round queues each draft before the walk is read, and every one was queued (none fell back)
    assert fast["round_budget_64"]["draft_ahead"] and fast["round_budget_64"]["queue_error"] is None
    assert not fast["round_budget_64_not_drafted_ahead"]["draft_ahead"]
    # and with the tree on the device (a GPU's default), each next tree and verify too (on a CPU only the untimed
    # rounds queue: a phase timed by the wall clock would wait for them)
    device_tree = fast["round_budget_64_device_tree"]
    assert device_tree["verify_ahead"] and device_tree["verified_ahead"] > 3 and device_tree["queue_error"] is None
    assert not fast["round_budget_64_not_verified_ahead"]["verify_ahead"]
    assert [row["budget"] for row in fast["budgets"]] == [4, 8]
    fp32 = report["exactness_fp32_8_layers"] + report["fast_exactness_fp32_8_layers"]
    assert fp32 and all(r["identical"] for r in fp32)
    # issue #18's report: what ran, the prefill at both lengths, each option switched, every target judged
    assert fast["options"] == {"gdn_kernel": "torch", "fused": False, "attention": "eager", "compile": False,
                               "blas": "default", "gate_up": "fused",
                               "gdn_step": "torch", "commit": "torch", "gdn_prep": "torch",
                               "norm": "torch", "pdl": "off"}  # CPU defaults
    assert tuple(fast["options"]) == config.VARIANT_FIELDS == tuple(PARTS)  # BenchConfig holds every runner part
    assert fast["compile_s"] == 0 and fast["compile_error"] is None
    prefill = fast["prefill"]
    assert prefill["prefill_512_ms"] > 0 and prefill["prefill_2048_ms"] > 0 and prefill["kernels"]["fla_active"] in (True, False)
    measured = [v for v in fast["variants"] if "error" not in v]
    options = [v["options"] for v in measured]
    assert {"gdn_kernel": "torch", "fused": True, "attention": "eager", "compile": False, "blas": "default",
            "gate_up": "fused", "gdn_step": "torch", "commit": "torch", "gdn_prep": "torch", "norm": "torch",
            "pdl": "off"} in options
    assert {"gdn_kernel": "torch", "fused": False, "attention": "sdpa", "compile": False, "blas": "default",
            "gate_up": "fused", "gdn_step": "torch", "commit": "torch", "gdn_prep": "torch", "norm": "torch",
            "pdl": "off"} in options
    assert all(v["greedy_step_ms"] > 0 and v["verify_64_ms"] > 0 and v["verify_128_ms"] > 0 for v in measured)
    assert all("Triton" in v["error"] for v in fast["variants"] if "error" in v)
    forms = fast["tree_forms"]  # the tree delta rule's forms per GDN layer (the Triton ones need CUDA)
    for T in ("65", "129"):
        row = forms[T]
        assert row["steps"] == 14
        for key in ("torch_form_us", "parts_repeated_heads_us", "parts_key_heads_us", "solve_cublas_us"):
            assert row[key] > 0, key
        assert row["solve_triton_tf32x3"] == row["rule_triton"] == "needs Triton and a CUDA device"
    targets = fast["targets"]
    for name in ("greedy_step", "draft_in_round", "round_64", "host_per_round", "prefill_2048", "exactness_fp32"):
        assert isinstance(targets[name]["met"], bool), name
    assert targets["greedy_step"]["ratio"] == fast["greedy_step_ms"] / speed["weight_read_bound_ms"]
    # the drafter's pass both ways (dynamic eager, static: graphs on a GPU, eager here), and the rounds' draft
    # phase through each
    passes = speed["drafter_pass"]
    assert passes["block"] == 16 and set(passes["contexts"]) == {"512", "2048"} and passes["target"] == "<= 3 ms"
    for row in passes["contexts"].values():
        assert row["dynamic"]["path"] == "dynamic" and row["static"]["path"] == "static eager"
        for name in ("static", "static_eager", "static_sdpa", "static_compiled"):
            assert row[name]["ms"] > 0 and row[name]["argmax_agreement_vs_dynamic"] >= 0.5, name
            assert row[name]["max_abs_logprob_diff_vs_dynamic"] < 0.1, name  # bf16
        if shutil.which("g++") or shutil.which("c++"):  # inductor's C++ backend can run: the compiled pieces did
            assert row["static_compiled"]["compile_error"] is None
        assert row["dynamic_per_static"] == row["dynamic"]["ms"] / row["static"]["ms"]
    assert passes["dynamic_per_static"] == passes["contexts"]["512"]["dynamic_per_static"]
    assert fast["round_budget_64"]["draft_path"] == "static eager"
    assert fast["round_budget_64_dynamic_draft"]["draft_path"] == "dynamic"
    host_walk = fast["round_budget_64_host_walk"]  # the same rounds with the walk on the host, beside the device's
    assert host_walk["draft_path"] == "static eager" and host_walk["round_ms"] > 0
    for variant in (fast["round_budget_64"], host_walk):  # what the host waits a round, phase-timed or not
        assert variant["step_wall_ms"] > 0 and (variant["loop_wall_ms"] is None or variant["loop_wall_ms"] > 0)
    assert fast["round_budget_64"]["walk_device_per_host"] == fast["round_budget_64"]["round_ms"] / host_walk["round_ms"]
    no_queue = fast["round_budget_64_no_queue"]  # each round drafting at its start (a CPU's timed rounds do anyway)
    assert no_queue["mean_kept"] == fast["round_budget_64"]["mean_kept"]
    assert fast["round_budget_64"]["queue_per_no_queue"] == fast["round_budget_64"]["step_wall_ms"] / no_queue["step_wall_ms"]
    for name, ratio, field in (("not_ahead", "launch_ahead_per_not", "loop_wall_ms"),
                               ("drafter_uncompiled", "drafter_compiled_per_not", "draft")):
        variant = fast[f"round_budget_64_{name}"]  # the defaults' alternatives beside them: the same rounds
        assert variant["mean_kept"] == fast["round_budget_64"]["mean_kept"], name
        if variant[field] is not None:
            assert fast["round_budget_64"][ratio] == fast["round_budget_64"][field] / variant[field], name
    device_tree = fast["round_budget_64_device_tree"]  # DDTree's tree built on the device, beside the host's
    assert device_tree["mean_kept"] == fast["round_budget_64"]["mean_kept"]  # the same trees: the same rounds
    host_tree = fast["round_budget_64_host_tree"]
    assert host_tree["mean_kept"] == device_tree["mean_kept"]
    device_ms, host_ms = device_tree["loop_wall_ms"], host_tree["loop_wall_ms"]
    if device_ms and host_ms:
        assert fast["round_budget_64"]["tree_device_per_host"] == device_ms / host_ms
    draft = targets["draft_in_round"]
    assert draft["ms"] == fast["round_budget_64"]["draft"] and draft["path"] == "static eager"
    assert draft["isolated_static_ms"] == passes["static_ms"] and draft["dynamic_in_round_ms"] > 0
    assert targets["exactness_fp32"]["met"] and targets["exactness_fp32"]["runs"] == len(report["fast_exactness_fp32_8_layers"])
    # issue #31's targets beside #18's; the device's timeline needs CUDA (its arithmetic: test_timeline_gaps), and
    # the runner here holds no budget-128 tree (--budgets 4 8), so no round at 128
    i31 = targets["issue_67"]
    assert i31["greedy_step"]["target"] == "<= 1.12x" and i31["round_64"]["ms"] == fast["round_budget_64"]["round_ms"]
    assert i31["round_64"]["ratio_chained"] == i31["round_64"]["ms"] / fast["greedy_step_chained_ms"]
    assert i31["host_per_round"]["met"] == (fast["round_budget_64"]["host"] <= 0.1)
    # beside the host's times, the host's own speed in the same rounds (a fixed Python loop)
    assert i31["host_per_round"]["host_loop_us"] == fast["round_budget_64"]["host_loop_us"] > 0
    # the device timeline's code path, with the host's torch ops standing in for a device's kernels here
    timeline = fast["round_budget_64"]["device_timeline"]
    assert timeline["rounds"] == 8 and timeline["busy_ms_per_round"] > 0 and timeline["kinds"], timeline.get("error")
    assert timeline["draft"]["passes"] == 8 and timeline["draft"]["kinds"], timeline["draft"]
    hosted = fast["round_budget_64"]["host_profile"]  # the host's time by function (cProfile), where rounds were left
    if "error" not in hosted:
        names = [row["fn"] for row in hosted["top"]]
        assert hosted["rounds"] >= 1 and len(names) == len(set(names)) and hosted["own_us_per_round"] > 0, hosted
        own = [row["own_us_per_round"] for row in hosted["top"]]
        assert own == sorted(own, reverse=True), own
    assert i31["device_stalls_per_round"]["us"] == timeline["stall_us_per_round"]
    assert "round_budget_128" not in fast and "round_128" not in i31
    assert fast["graph_launch"] == {"error": "the runner has no CUDA graphs here"}  # the verify graph's launch: CUDA


def test_gpu_bench_smoke_split(tmp_path):
    """--device-map auto: the target built through accelerate's dispatch (a CPU split here), still exact."""
    report = _bench(tmp_path, "--device-map", "auto", "--skip-speed", "--exactness")
    assert report["device_map"] == "auto"
    assert all(r["identical"] for r in report["exactness_fp32_8_layers"])


def test_gpu_bench_smoke_exactness_alone_on_fp8_weights(tmp_path):
    """--fast --fp8 --exactness --skip-speed: the runner's exactness checks alone, on plain and FP8 weights (what a
    device call with a time limit runs when the speed figures are already measured), every fp32 run identical."""
    report = _bench(tmp_path, "--fast", "--fast-only", "--fp8", "--exactness", "--skip-speed")
    assert "speed" not in report
    for key in ("fast_exactness_fp32_8_layers", "fast_exactness_fp8_fp32_8_layers"):
        assert report[key] and all(r["identical"] for r in report[key]), key
    assert {r["weights"] for r in report["fast_exactness_fp8_fp32_8_layers"]} == {"fp8"}
    assert report["fast_exactness_fp8_bf16_full_depth"]
    # each check's divergence judged against the runner's own noise, measured over its tokens by chain passes, and
    # every check list's outcomes counted
    summary = report.pop("fast_exactness_verdicts")
    for key, runs in report.items():
        if key.startswith("fast_exactness"):
            assert summary[key] == exactness.verdict_summary(runs) and summary[key]["runs"] == len(runs) == sum(
                summary[key][k] for k in ("identical", "noise", "mismatch", "unjudged")), key
    assert summary["fast_exactness_fp32_8_layers"]["mismatches_none"]
    for r in (r for key, runs in report.items() if key.startswith("fast_exactness") for r in runs):
        assert r["runner_greedy_repeated"] and r["runner_noise_positions"] > 0 and r["runner_noise"] >= 0, r
        assert r["verdict"] == (None if r["identical"] else verdict(r.get("runner_margin_at_divergence",
                                                                         r.get("greedy_margin_at_divergence")),
                                                                   r["runner_noise"])), r
    with pytest.raises(SystemExit):  # without --exactness, --skip-speed leaves --fp8 nothing to measure
        gpu.main(["--smoke", "--fast", "--fp8", "--skip-speed"])


def test_gpu_bench_smoke_ui(tmp_path):
    """--ui: the page's Step through page.actions.step + page.views.render_views on the runner, its check against the
    reference, the first Step after a new prompt against the prefill, and the bare round, with the issue #13 targets."""
    report = _bench(tmp_path, "--ui", "--skip-speed", "--dtype", "float32", "--ui-prompt-tokens", "200",
                    "--ui-steps", "4")
    ui = report["ui"]
    for key in ("first_step_cold_ms", "first_step_ms", "prefill_ms", "step_ms", "render_ms", "ui_step_ms", "check_ms",
                "bare_round_ms", "bare_round_recorded_ms", "reference_ms_per_token"):
        assert ui[key] > 0, key
    assert ui["ui_step_ms"] >= ui["render_ms"] and ui["ui_step_target_ms"] == 1.3 * ui["bare_round_ms"] + 10
    assert ui["ui_step_target_met"] == (ui["ui_step_ms"] <= ui["ui_step_target_ms"])
    assert ui["first_step_per_prefill"] == ui["first_step_ms"] / ui["prefill_ms"]
    assert set(ui["round_phases_ms"]) == {"draft", "tree", "verify", "commit"}
    assert ui["reference"] == "runner" and ui["prompt_tokens"] == 200 and ui["budget"] == 64
    assert ui["draft_path"] == "dynamic"  # the page's default on a CPU (static graphs on one GPU)
    assert ui["output_identical_to_reference"] and ui["independent_check"]["agrees"]
    assert ui["independent_check"]["tokens"] >= 2 and ui["independent_check"]["ms"] > 0


def test_gpu_bench_smoke_fast_only(tmp_path):
    """The lead's one command for issue #18 (--fast --fast-only --exactness): transformers' forward gives only the
    bound, prefill, greedy step and drafter pass; the runner everything, its targets and its exactness."""
    report = _bench(tmp_path, "--fast", "--fast-only", "--exactness", "--no-fused", "--attention", "sdpa", "--no-compile",
                    "--variants", "fused")
    speed = report["speed"]
    assert speed["budgets"] == [] and "rounds" not in speed and speed["greedy_step_ms"] > 0
    assert "exactness_fp32_8_layers" not in report
    fast = speed["fast"]
    assert fast["options"] == {"gdn_kernel": "torch", "fused": False, "attention": "sdpa", "compile": False,
                               "blas": "default", "gate_up": "fused",
                               "gdn_step": "torch", "commit": "torch", "gdn_prep": "torch", "norm": "torch",
                               "pdl": "off"}
    assert [v["options"]["fused"] for v in fast["variants"]] == [True]  # --variants: only the option named
    assert [row["budget"] for row in fast["budgets"]] == [4, 8]
    # the tree phase both ways (issue #31 item 1): the tree built on the device is the host's
    assert set(fast["tree_build"]) == {"4", "8", "128"} and all(t["same_tree"] for t in fast["tree_build"].values())
    assert "Triton" in fast["best_first_warps"]["error"]  # the kernel's warps are timed on CUDA only
    assert "tree_forms" not in fast  # a sweep of minutes on a GPU: only with --tree-forms
    assert report["fast_exactness_fp32_8_layers"][0]["runner_options"] == fast["options"]
    assert fast["targets"]["exactness_fp32"]["met"]


def test_gpu_bench_smoke_costs(tmp_path):
    """issue #30 at real shapes, its code path at toy widths: the runner's cost table (a round per budget, the chain,
    greedy's step) and S(b) at an oracle-controlled acceptance, whose decodes equal the target's greedy."""
    report = _bench(tmp_path, "--skip-speed", "--costs")
    costs = report["costs"]
    table = costs["costs"]
    assert set(table["rounds"]) == {"4", "8"} and table["greedy_ms"] > 0 and table["chain"]["total"] > 0
    for c in table["rounds"].values():
        assert c["total"] >= c["draft"] + c["verify"] and c["host"] >= 0
    assert costs["oracle"]["ddtree_identical_to_greedy"] and costs["oracle"]["dflash_identical_to_greedy"]
    s = costs["speedup"]
    assert set(s["budgets"]) == {"4", "8"} and s["best_budget"] in (4, 8) and s["chain"]["tau"] >= 1
    # the oracle's ranks (top-1 but for a few depths) give the tree more tokens per round at the larger budget
    assert s["budgets"]["8"]["tau"] >= s["budgets"]["4"]["tau"] > 1
    assert "best budget" in costs["cost_table"]


def test_gpu_bench_smoke_dflash2(runner_report):
    """issue #28 item 7 (--dflash2): the DFlash2 drafter of the shipped config (toy widths here) on the runner beside
    DFlash 1 in one run: its pass at its block (8) each way, static == dynamic, whole rounds at budget 64 with the
    selector tree and the DFlash2 chain, and the two targets with DFlash 1's figures beside them."""
    report = runner_report
    fast = report["speed"]["fast"]
    d2, targets = fast["dflash2"], fast["targets"]
    assert d2["config"] == "qwen3.8-27b-dflash2-config.json" and d2["block"] == 8 and d2["selector_top_k"] == 16
    passes = d2["drafter_pass"]
    assert passes["block"] == 8 and passes["target"] == "<= 3 ms"
    for row in passes["contexts"].values():
        assert row["dynamic"]["path"] == "dynamic" and row["static"]["path"] == "static eager"
        for name in ("static", "static_eager", "static_sdpa", "static_compiled"):
            assert row[name]["argmax_agreement_vs_dynamic"] >= 0.5 and row[name]["max_abs_logprob_diff_vs_dynamic"] < 0.1
    selector = d2["selector"]["round_budget_64"]
    assert selector["tree_scoring"] == "selector" and selector["draft_path"] == "static eager" and selector["round_ms"] > 0
    # a block (8) shorter than the runner's paths (16, DFlash 1's): the drafts still queued before the walk's read
    assert selector["draft_ahead"] and selector["queue_error"] is None
    assert "error" not in selector["device_timeline"]["draft"]
    assert d2["selector"]["round_budget_64_dynamic_draft"]["draft_path"] == "dynamic"
    assert d2["chain"]["round_budget_64"]["method"] == "dflash2" and d2["chain"]["round_budget_64"]["round_ms"] > 0
    draft, rnd = targets["dflash2_draft_pass"], targets["dflash2_round_64"]
    assert draft["ms"] == passes["static_ms"] and draft["target"] == "<= 3.0 ms" and isinstance(draft["met"], bool)
    assert draft["dflash_static_ms"] == report["speed"]["drafter_pass"]["static_ms"]  # DFlash 1 beside it (block 16)
    assert rnd["ratio"] == selector["round_ms"] / fast["greedy_step_ms"] and rnd["target"] == "<= 1.3x"
    assert rnd["dflash_round_ms"] == fast["round_budget_64"]["round_ms"] and isinstance(rnd["met"], bool)


def test_gpu_bench_smoke_the_long_session_alone(tmp_path):
    """--long-only (issue #67: does a 24 GB card run the 16k 4-bit session in a process that ran nothing before
    it): the build, then that session alone under the cap, its peak and its target; no step, verify, round or 4k
    figure made up."""
    report = _bench(tmp_path, "--fast", "--fast-only", "--int4", "--quantized-only", "--long-only",
                    "--fp8-context", "100", "--no-profiler")
    f = report["speed"]["fast"]["int4"]
    assert "error" not in f and "partial" not in f, f.get("error")
    assert f["peak_memory_long"]["context"] == 200 and f["peak_memory_long"]["rounds"] > 0
    assert not {"greedy_step_ms", "budgets", "peak_memory", "round_budget_64"} & set(f)
    assert set(report["speed"]["fast"]["targets"]) == {"int4_peak_memory_long"}


def test_gpu_bench_smoke_quantized_alone_with_a_4bit_drafter(tmp_path, capsys):
    """--quantized-only --int4-drafter (issue #67: a 4-bit target in a process of its own, as a 24 GB card holds it):
    no bf16 target measured, the drafter's Linears 4-bit (fewer bytes than the bf16 drafter's), the 4-bit figures
    and their targets, the peak at two contexts; the flags refused where they mean nothing."""
    report = _bench(tmp_path, "--fast", "--fast-only", "--int4", "--quantized-only", "--int4-drafter",
                    "--fp8-context", "200", "--no-profiler")
    speed = report["speed"]
    assert speed["quantized_only"] and "greedy_step_ms" not in speed  # no bf16 figure made up
    f = speed["fast"]["int4"]
    assert "error" not in f and "partial" not in f, f.get("error")
    bf16_drafter = memory.model_bytes(models.build_drafter(config.BenchConfig(smoke=True, device="cpu"),
                                                     models.build_target(config.BenchConfig(smoke=True, device="cpu"), 4,
                                                                      torch.bfloat16), torch.bfloat16))
    assert speed["drafter"]["weights"] == "int4" and 0 < speed["drafter"]["GiB"] * 2**30 < bf16_drafter
    assert f["bf16_greedy_step_ms"] is None and f["greedy_step_vs_bf16"] is None and f["greedy_step_ms"] > 0
    assert set(f["runner_trail_GiB"]) >= {"runner", "prefill", "slot_1"}
    assert (f["peak_memory"]["context"], f["peak_memory_long"]["context"]) == (200, 400)
    targets = speed["fast"]["targets"]
    assert targets["int4_step"]["target"] == "<= 1.4x" and targets["int4_round_64"]["target"] == "<= 1.4x"
    assert targets["int4_peak_memory_long"]["target"] == "<= 22 GiB"
    assert f["round_budget_64"]["device_timeline"] == {"error": "not profiled (--no-profiler)"}
    for argv, words in ((["--smoke", "--fast", "--quantized-only"], "--quantized-only measures"),
                        (["--smoke", "--fast", "--int4-drafter"], "--int4-drafter goes with"),
                        # the 4-bit checks named, the 4-bit target not built: nothing would be checked (an H100 run
                        # came back with an empty report, section 51)
                        (["--smoke", "--skip-speed", "--exactness", "--exactness-weights", "int4"], "--fast with --int4"),
                        (["--smoke", "--fast", "--int4", "--exactness-weights", "int4"], "it needs --exactness")):
        with pytest.raises(SystemExit) as exc:
            gpu.main(argv)
        assert exc.value.code == 2 and words in capsys.readouterr().err


def test_a_run_cut_in_a_quantized_phase_keeps_what_it_measured(tmp_path, monkeypatch):
    """A device call's time limit stops gpu_bench with SIGINT (`timeout -s INT`: a KeyboardInterrupt, which no
    `except Exception` catches): the report on disk keeps the quantized phase's step, verifies, rounds and peaks
    measured before the cut, marked partial (an H100 run cut in the 4-bit GEMMs' timings had them only in its log)."""
    from ddtree_viz.benchmarks.gpu import quantized

    def cut(*args):
        raise KeyboardInterrupt

    monkeypatch.setitem(quantized.GEMMS, "int4", cut)
    out = tmp_path / "cut.json"
    with pytest.raises(KeyboardInterrupt):
        gpu.main(["--smoke", "--layers", "4", "--budgets", "4", "8", "--json", str(out), "--fast", "--fast-only",
                  "--int4", "--quantized-only", "--fp8-context", "200", "--no-profiler"])
    f = json.loads(out.read_text())["speed"]["fast"]["int4"]
    assert f["partial"] is True and "gemms" not in f and "error" not in f
    assert f["greedy_step_ms"] > 0 and [row["budget"] for row in f["budgets"]] == [4, 8]
    assert f["round_budget_64"]["round_ms"] > 0
    assert (f["peak_memory"]["context"], f["peak_memory_long"]["context"]) == (200, 400)


def test_gpu_bench_dflash2_needs_the_runner(capsys):
    import pytest

    from ddtree_viz.benchmarks.gpu import main

    for argv in (["--smoke", "--dflash2"], ["--smoke", "--fast", "--dflash2", "--device-map", "auto"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2 and "--dflash2 measures on the static runner" in capsys.readouterr().err


def test_gpu_bench_smoke_fp8(runner_report):
    """issue #29 items 2 and 5 (--fp8): the same shapes with FP8 weights made at random (fp8.Fp8Linear, built layer by
    layer) on the runner beside bf16 in one run: its own weight-read bound (fp8 bytes + scales + the bf16 rest), greedy
    step, verify, rounds at budget 64, each GEMM beside bf16's, the peak-memory session, the four targets; with
    --exactness the runner's DDTree == its greedy on FP8 weights."""
    report = runner_report
    fast = report["speed"]["fast"]
    f = fast["fp8"]
    assert "error" not in f, f.get("error")
    w = f["weights"]
    assert w["quantized_bytes"] > 0 and w["scale_bytes"] > 0
    assert w["bytes"] == w["quantized_bytes"] + w["scale_bytes"] + w["other_bytes"]
    assert w["bytes"] < report["speed"]["weight_bytes"]  # the bf16 target's
    assert f["weight_read_bound_ms"] < report["speed"]["weight_read_bound_ms"]
    assert f["greedy_step_ms"] > 0 and f["bf16_greedy_step_ms"] == fast["greedy_step_ms"]
    assert [row["budget"] for row in f["budgets"]] == [4, 8] and all(row["verify_ms"] > 0 for row in f["budgets"])
    assert f["round_budget_64"]["round_ms"] > 0 and f["options"] == fast["options"]
    peak = f["peak_memory"]
    assert peak["context"] == 256 and peak["budget"] == 64 and peak["rounds"] >= 1 and peak["runner_max_len"] >= 256
    gemms = f["gemms"]
    assert set(gemms) == {"gdn_in_proj", "attention_qkv", "mlp_gate_up", "gdn_out_proj", "attention_o_proj", "mlp_down"}
    assert all(gemms[name]["65"]["fp8_us"] > 0 and gemms[name]["65"]["bf16_us"] > 0 for name in gemms)
    targets = fast["targets"]
    for name in ("fp8_step", "fp8_round_64", "fp8_peak_memory", "fp8_exactness_fp32"):
        assert name in targets, name
    assert targets["fp8_step"]["ratio"] == f["greedy_step_ms"] / f["weight_read_bound_ms"]
    assert targets["fp8_step"]["chained_ratio"] == f["greedy_step_chained_ms"] / f["weight_read_bound_ms"]
    assert f["greedy_step_chained_ms"] > 0 and "steps" in f["greedy_step_timeline"]  # the FP8 step's kernels by kind
    fp8_runs = report["fast_exactness_fp8_fp32_8_layers"]
    assert fp8_runs and all(r["identical"] and r["weights"] == "fp8" for r in fp8_runs)
    assert targets["fp8_exactness_fp32"]["met"]


def test_gpu_bench_smoke_int4(runner_report):
    """issue #29's W4A16 (--int4): the same shapes with 4-bit weights made at random (int4.Int4Linear, symmetric,
    groups of 128, built layer by layer) on the runner in the same run: its own weight-read bound (words + bf16
    scales + the bf16 rest: below FP8's), greedy step, verify, rounds at budget 64, the peak-memory session against
    a 24 GB card's 22 GB, its targets; with --exactness the runner's DDTree == its greedy on 4-bit weights."""
    report = runner_report
    fast = report["speed"]["fast"]
    f = fast["int4"]
    assert "error" not in f, f.get("error")
    assert f["weights"]["quantized_bytes"] > 0 and f["group"] == 128
    gemms = f["gemms"]  # each GEMM of a layer beside bf16's (configs only where the Triton GEMM runs: a GPU)
    assert set(gemms) == set(fast["fp8"]["gemms"]) and gemms["mlp_gate_up"]["shape"][0] == 2 * config.SMOKE_TARGET["intermediate_size"]
    assert all(gemms[name]["65"]["int4_us"] > 0 and gemms[name]["65"]["bf16_us"] > 0 for name in gemms)
    assert all(gemms[name]["1"]["int4_asym_us"] > 0 for name in gemms)  # the symmetric target's GEMMs with zero points
    w, fp8 = f["weights"], fast["fp8"]["weights"]
    assert w["bytes"] == w["quantized_bytes"] + w["scale_bytes"] + w["other_bytes"]
    assert w["quantized_bytes"] * 2 == fp8["quantized_bytes"] and w["other_bytes"] == fp8["other_bytes"]
    assert f["weight_read_bound_ms"] < fast["fp8"]["weight_read_bound_ms"]
    assert f["greedy_step_ms"] > 0 and [row["budget"] for row in f["budgets"]] == [4, 8]
    assert f["round_budget_64"]["round_ms"] > 0 and f["options"] == fast["options"]
    assert f["peak_memory"]["target"] == "<= 22 GiB" and f["peak_memory_long"]["context"] == 2 * f["peak_memory"]["context"] and f["peak_memory"]["rounds"] >= 1
    targets = fast["targets"]
    for name in ("int4_step", "int4_round_64", "int4_peak_memory", "int4_exactness_fp32"):
        assert name in targets, name
    assert targets["int4_step"]["ratio"] == f["greedy_step_ms"] / f["weight_read_bound_ms"]
    assert targets["int4_step"]["of"] == "4-bit weight-read bound"
    runs = report["fast_exactness_int4_fp32_8_layers"]
    assert runs and all(r["identical"] and r["weights"] == "int4" for r in runs)
    assert report["fast_exactness_int4_bf16_full_depth"] and targets["int4_exactness_fp32"]["met"]


def test_model_bytes_count_each_storage_once():
    """The FP8 peak is judged on the models' own bytes plus the session's peak (memory.model_bytes): every parameter
    and buffer once, a storage shared by two models (the drafter's embedding is the target's) or fused projections
    (views of one storage) once."""
    import torch

    from ddtree_viz.engine.fused import MLP_PROJECTIONS, fuse_linears
    from tests.tiny import tiny_pair

    pair = tiny_pair("hybrid", seed=0, layers=2)
    target = pair.target
    own = sum(t.numel() * t.element_size() for t in [*target.parameters(), *target.buffers()])
    assert memory.model_bytes(target) == memory.model_bytes(target, target) == own
    drafter_own = [t for t in [*pair.drafter.parameters(), *pair.drafter.buffers()]
                   if all(t.untyped_storage().data_ptr() != s.untyped_storage().data_ptr()
                          for s in [*target.parameters(), *target.buffers()])]
    assert memory.model_bytes(target, pair.drafter) == own + sum(t.numel() * t.element_size() for t in drafter_own)
    fuse_linears(target.model.layers[0].mlp, MLP_PROJECTIONS)
    assert memory.model_bytes(target) == own and torch.is_tensor(target.model.layers[0].mlp.gate_proj.weight)


def test_timeline_gaps():
    """The device timeline's arithmetic (profiler.timeline_gaps): overlapping activities are one busy stretch, a gap is
    the time between stretches, named by the activity that ended last before it and the one that starts after it;
    gaps up to 10 µs are a graph's kernel spacing, longer ones stalls, listed in timeline order."""
    spans = [(0.0, 10.0, "a"), (5.0, 30.0, "b"), (8.0, 12.0, "c"),  # one stretch 0-30, "b" ends it
             (45.0, 50.0, "d"),  # a 15 µs stall after b
             (52.0, 60.0, "e"), (200.0, 210.0, "f")]  # 2 µs of spacing after d, then a 140 µs stall after e
    out = profiler.timeline_gaps(list(reversed(spans)), rounds=2)
    assert out["span_ms_per_round"] == 210 / 2 / 1e3
    assert out["busy_ms_per_round"] == (30 + 5 + 8 + 10) / 2 / 1e3
    assert out["idle_us_per_round"] == (15 + 2 + 140) / 2
    assert out["spacing_us_per_round"] == 1.0 and out["stall_us_per_round"] == 155 / 2 and out["stalls_per_round"] == 1
    assert out["stalls"] == [{"us": 15.0, "after": "b", "before": "d"}, {"us": 140.0, "after": "e", "before": "f"}]


def test_activity_kinds():
    """The timeline's activities by kind (profiler.activity_kinds): calls and µs a round, the most time first."""
    spans = [(0.0, 5.0, "gemm"), (6.0, 7.0, "norm"), (8.0, 13.0, "gemm"), (14.0, 16.0, "norm"), (20.0, 21.0, "copy")]
    assert profiler.activity_kinds(spans, rounds=2, top=2) == [{"kind": "gemm", "calls_per_round": 1.0, "us_per_round": 5.0},
                                                         {"kind": "norm", "calls_per_round": 1.0, "us_per_round": 1.5}]


def test_profiled_spans_keep_what_follows_the_last_mark():
    """device_timeline's cut: the warm-up and whatever fn runs before its own mark (the round that refills what the
    rounds queue ahead) are left out, on a CPU's timeline of host ops as on a device's: the work's device decides
    which, also on a machine with a GPU."""
    def fn():
        torch.ones(3).add_(1)  # the refill: before the last mark
        profiler.timeline_mark("cpu")
        torch.ones(4).mul_(2)

    spans = profiler.profiled_spans(fn, "cpu", warmup=lambda: torch.zeros(2).sub_(1))
    names = {name for _, _, name in spans}
    assert "aten::mul_" in names and not names & {"aten::add_", "aten::sub_", profiler.TIMELINE_START}


def test_verdict_summary_counts_each_outcome():
    """A check list's outcomes: identical runs, and divergences by verdict; the target holds only when every
    divergence was judged noise."""
    runs = [{"identical": True, "verdict": None}, {"identical": False, "verdict": "noise"},
            {"identical": False, "verdict": "noise"}]
    assert exactness.verdict_summary(runs) == {"runs": 3, "identical": 1, "noise": 2, "mismatch": 0, "unjudged": 0,
                                         "mismatches_none": True}
    assert not exactness.verdict_summary(runs + [{"identical": False, "verdict": "mismatch"}])["mismatches_none"]
    unjudged = exactness.verdict_summary(runs + [{"identical": False, "verdict": None}])
    assert unjudged["unjudged"] == 1 and not unjudged["mismatches_none"]


def test_int4_tune_says_why_it_measures_nothing_without_triton(tmp_path):
    """--int4-tune sweeps the 4-bit GEMM's launches (benchmarks/gpu/int4.py); where torch has no Triton (the CPU
    build) the report says why instead of a traceback."""
    import importlib.util

    from ddtree_viz.benchmarks import gpu

    if importlib.util.find_spec("triton") is not None:
        pytest.skip("with Triton the sweep is a GPU's: gpu_bench --int4-tune")
    out = tmp_path / "tune.json"
    assert gpu.main(["--smoke", "--int4-tune", "--json", str(out)]) == 0
    assert "needs Triton" in json.loads(out.read_text())["int4_tune"]["error"]


def test_the_memory_plan_on_the_meta_device_is_what_a_session_holds(tmp_path, capsys):
    """--memory-plan (issue #67 item 1: will a session fit the card, known without one): computed on the meta
    device, the models' bytes are those of the same models built and quantized on the CPU (4-bit target, 4-bit
    drafter; FP8; bf16), and the session's lasting buffers those a session on the runner allocates for that prompt:
    the runner's state at its room, the static drafter's context cache. A GPU run's JSON sets its measured peaks
    beside the plan."""
    from ddtree_viz.benchmarks.gpu import plan, quantized
    from ddtree_viz.engine.proposers import make_proposer
    from ddtree_viz.engine.session import DecodeSession

    bench = config.BenchConfig(smoke=True, device="cpu")
    dtype, context, budget, models_gib = torch.bfloat16, 300, 8, {}
    for weights, int4_drafter in (("int4", True), ("fp8", False), ("bf16", False)):
        planned = plan.memory_plan(bench, weights, int4_drafter, contexts=(context,), budget=budget, rounds=1,
                                   layers=4)
        target = (models.build_target(bench, 4, dtype) if weights == "bf16"
                  else models.build_quantized_target(bench, 4, dtype, weights))
        drafter = models.build_drafter(bench, target, dtype)
        if int4_drafter:
            quantized.quantize_drafter_int4(drafter)
        assert planned["models_GiB"] * 2**30 == memory.model_bytes(target, drafter), weights
        models_gib[weights] = planned["models_GiB"]
    # the session as quantized_peak_memory runs it (the last pair: bf16), its buffers as allocated
    pair = models.pair_of(bench, target, drafter, dtype)
    session = DecodeSession.of(pair, budget=budget, max_new_tokens=3 * drafter.block_size, engine="runner",
                               record=False, proposer=make_proposer(drafter, target, static=True))
    session.prefill(prompt_ids=list(range(3, 3 + context)))
    row = planned["contexts"][0]
    assert row["prefill_features_GiB"] * 2**30 == session.features.numel() * session.features.element_size() > 0
    session.run(max_steps=1)
    state = session.cache.buffers  # (the StaticRunner)
    assert row["runner_max_len"] == session.cache.max_len
    assert row["runner_state_GiB"] * 2**30 == sum(t.numel() * t.element_size() for t in (
        state.keys_all, state.values_all, state.conv_all, state.rec_all))
    # a capture's restore point: the GDN windows and states (and the committed length), never the attention rows;
    # the first round's floor holds it beside the models, the lasting buffers and the prefill's features
    assert row["capture_copy_GiB"] * 2**30 == sum(t.numel() * t.element_size() for t in (
        state.conv_all, state.rec_all, state.committed_t))
    assert row["first_round_floor_GiB"] == pytest.approx(
        row["planned_GiB"] + row["prefill_features_GiB"] + row["capture_copy_GiB"])
    cache = session.proposer.runner
    assert row["drafter_max_len"] == cache.max_len
    assert row["drafter_cache_GiB"] * 2**30 == 2 * cache.keys.numel() * cache.keys.element_size()
    # the CLI: the weights named, a GPU run's peaks beside the plan, a missing file refused
    measured = tmp_path / "gpu.json"
    peak = {"context": 200, "session_GiB": 1.5, "model_bytes_GiB": models_gib["int4"], "peak_models_alone_GiB": 2.5}
    out = tmp_path / "plan.json"

    def plan_beside(run_peak):
        measured.write_text(json.dumps({"speed": {"fast": {"int4": {"peak_memory": run_peak}}}}))
        assert gpu.main(["--smoke", "--layers", "4", "--memory-plan", str(measured), "--int4", "--int4-drafter",
                         "--fp8-context", "200", "--json", str(out)]) == 0
        return json.loads(out.read_text())["memory_plan"]

    # a run of other models (its lm_head quantized, say) is not set beside the plan: its session is not this one's
    other = plan_beside({**peak, "model_bytes_GiB": models_gib["int4"] - 0.01})["int4"]["contexts"][0]
    assert "transient_GiB" not in other and "other weights" in other["measured_not_beside"]
    report = plan_beside(peak)
    assert list(report) == ["int4"] and report["int4"]["int4_drafter"]
    short, long = report["int4"]["contexts"]
    assert (short["context"], long["context"]) == (200, 16384) and "transient_GiB" not in long
    lasting = short["runner_state_GiB"] + short["drafter_cache_GiB"]
    assert short["transient_GiB"] == pytest.approx(1.5 - lasting) and short["measured_peak_GiB"] == 2.5
    assert short["transient_past_features_GiB"] == pytest.approx(short["transient_GiB"] - short["prefill_features_GiB"])
    with pytest.raises(SystemExit) as exc:
        gpu.main(["--smoke", "--memory-plan", str(tmp_path / "none.json")])
    assert exc.value.code == 2 and "no file" in capsys.readouterr().err


def test_the_sass_count_reads_the_longest_loop_of_a_listing():
    """benchmarks/gpu/sass.py's reader of nvdisasm's listing: the longest label-to-branch-back span, predicates and
    modifiers stripped from each opcode; a span with the kernel's EXIT in it (an out-of-line wait after the end
    that branches back into the loop) is no loop; `holding` asks for a loop with such an instruction."""
    from ddtree_viz.benchmarks.gpu.sass import loop_body, opcode

    listing = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_0:
        /*0010*/                   LDG.E R2, desc[UR4][R4.64] ;
        /*0020*/                   LOP3.LUT R3, R2, 0xf, RZ, 0xc0, !PT ;
        /*0030*/              @!P0 BRA `(.L_x_0) ;
.L_x_1:
        /*0040*/                   FADD R5, R5, R3 ;
        /*0050*/                   BRA `(.L_x_1) ;
        /*0060*/                   EXIT ;
"""
    body = loop_body(listing)
    assert [opcode(i) for i in body] == ["LDG", "LOP3", "BRA"]
    assert loop_body("        /*0000*/                   EXIT ;") == []
    stub = listing + """.L_x_2:
        /*0070*/              @!P1 BRA `(.L_x_2) ;
        /*0080*/                   BRA `(.L_x_0) ;
"""
    assert [opcode(i) for i in loop_body(stub)] == ["LDG", "LOP3", "BRA"]  # not .L_x_0 to the stub's branch
    assert [opcode(i) for i in loop_body(stub, holding="FADD")] == ["FADD", "BRA"]
    assert loop_body(stub, holding="HGMMA") == []


def test_int4_and_fp8_sass_count_each_launch_without_a_gpu(tmp_path):
    """gpu_bench --int4-sass --fp8-sass compiles the 4-bit GEMM's forms and the FP8 verify tiles for sm_90a
    (Triton's compiler and its ptxas; no GPU) and counts each k loop's instructions a weight; the FP8 loop is the
    one with the tensor-core products, and with its tiles by bulk copies it issues fewer a weight and spills no
    register (NOTEBOOK section 49). Skipped where Triton is not installed (CI's CPU torch)."""
    pytest.importorskip("triton")
    from ddtree_viz.benchmarks import gpu
    from ddtree_viz.benchmarks.gpu.sass import FP8_LAUNCHES, LAUNCHES

    out = tmp_path / "sass.json"
    assert gpu.main(["--int4-sass", "--fp8-sass", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [len(report[k]["launches"]) for k in ("int4_sass", "fp8_sass")] == [len(LAUNCHES), len(FP8_LAUNCHES)]
    for launch in report["int4_sass"]["launches"] + report["fp8_sass"]["launches"]:
        assert launch["loop_instructions"] > 0 and 1 < launch["per_weight"] < 100, launch
        assert launch["per_weight"] == round(launch["loop_instructions"] * 32 * launch["warps"]
                                             / (launch["block_n"] * launch["block_k"]), 2)
    fp8 = {(f["rows"], f["block_n"], f["tma"]): f for f in report["fp8_sass"]["launches"]}
    for rows, block_n, _ in fp8:
        bulk, loads = fp8[rows, block_n, True], fp8[rows, block_n, False]
        assert bulk["tensor_core"] > 0 and bulk["spills"] == 0, bulk
        assert bulk["per_weight"] < loads["per_weight"], (bulk, loads)


def _allocate_in_a_named_step(mib: int):
    import torch

    return torch.empty(mib * 2**20, dtype=torch.uint8, device="cuda")


def test_live_blocks_say_where_the_memory_is():
    """memory.live_blocks, what --long-capped reports at an out-of-memory: live allocations of at least 16 MiB,
    grouped by size and the innermost frames of ddtree_viz / transformers / fla, largest total first. On a GPU from
    a real snapshot (the history recorded with Python stacks, as long_context_peak records it); on a CPU from one in
    that format (freed, small and foreign blocks left out)."""
    import torch

    from ddtree_viz.benchmarks.gpu.memory import live_blocks

    def block(mib, state="active_allocated", *files):
        return {"size": mib * 2**20, "state": state,
                "frames": [{"filename": f, "line": 7, "name": f.rsplit("/", 1)[-1][:-3]} for f in files]}

    draft = "/x/ddtree_viz/engine/drafter.py"
    snapshot = {"segments": [{"blocks": [block(320, "active_allocated", "/usr/lib/torch/nn.py", draft),
                                         *[block(160, "active_allocated", draft)] * 3,
                                         block(800, "inactive", draft), block(8, "active_allocated", draft)]},
                             {"blocks": [block(2425), block(2425)]}]}
    assert live_blocks(snapshot) == [
        {"MiB": 2425.0, "count": 2, "made_by": "?"},
        {"MiB": 160.0, "count": 3, "made_by": "drafter.py:7:drafter"},
        {"MiB": 320.0, "count": 1, "made_by": "drafter.py:7:drafter"}]
    if not torch.cuda.is_available():
        return
    torch.cuda.memory._record_memory_history(max_entries=1000, stacks="python")
    try:
        kept = _allocate_in_a_named_step(48)
        rows = live_blocks(torch.cuda.memory._snapshot(), own=("test_gpu_bench",))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    assert any(r["MiB"] >= 48 and "_allocate_in_a_named_step" in r["made_by"] for r in rows), rows
    del kept

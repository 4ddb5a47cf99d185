"""Real-shape measurements on a GPU: Qwen3.6-27B text shapes (and its DFlash drafter) with random weights.

    python -m ddtree_viz.benchmarks.gpu [--layers 64] [--dtype bfloat16] [--budgets 16 32 64 128] [--json OUT]
    python -m ddtree_viz.benchmarks.gpu --exactness          # fp32 at real widths (8 layers) + bf16 at full depth
    python -m ddtree_viz.benchmarks.gpu --fast --fast-only --exactness --json gpu.json   # issue #18: the runner only,
                                                        # its figures against their targets (speed.fast.targets)
    python -m ddtree_viz.benchmarks.gpu --fast --fast-only --budgets 64 128 --variants compile   # the runner compiled
                                                        # and eager side by side, compile_s (~70 s on an H200)
    python -m ddtree_viz.benchmarks.gpu --fast --fast-only --dflash2 --budgets 64 --variants --json gpu.json
                                                        # issue #28 item 7: the DFlash2 drafter (Qwen3.8-27B's shapes)
                                                        # beside DFlash 1 on the runner (speed.fast.dflash2, targets)
    python -m ddtree_viz.benchmarks.gpu --fast --fast-only --fp8 --budgets 64 --variants --json gpu.json
                                                        # issue #29 items 2 and 5: the same shapes with FP8 weights
                                                        # made at random on the runner beside bf16, its bound, its
                                                        # peak memory at a 4,096-token context under a 40 GB cap
                                                        # (speed.fast.fp8, targets fp8_*)
    python -m ddtree_viz.benchmarks.gpu --fast --fast-only --fp8 --int4 --budgets 64 128 --json gpu.json
                                                        # and 4-bit weights (W4A16, groups of 128) after them: its own
                                                        # bound, peak under a 24 GB cap (speed.fast.int4, int4_*)

Every time is the median of repeated CUDA-synchronised runs, reported in ms and as a ratio to the
weight-read bound (weight bytes / measured copy bandwidth) and to the greedy decode step.
Weights are random (no download is possible here): speed is what random weights measure; exactness
uses the oracle drafter so that deep trees and long accepted paths occur.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ...options import HEAD_WEIGHTS
from .bf16 import speed
from .config import QUANTIZED, VARIANT_FIELDS, BenchConfig
from .costs import cost_study
from .exactness import exactness, fast_exactness, verdict_summary
from .int4 import int4_tune
from .page import ui_speed
from .profiler import PROFILER
from .quantized import quantized_alone
from .runner import forms_table
from .targets import exactness_target


def build_parser() -> argparse.ArgumentParser:
    from ...engine.kernels.device import ONE_LAUNCH_CHOICES
    from ...engine.kernels.gdn_tree.dispatch import GDN_KERNELS
    from ...engine.kernels.pdl import CHOICES as PDL_CHOICES
    from ...engine.runner import BLAS_CHOICES, GATE_UP_CHOICES

    p = argparse.ArgumentParser(prog="python -m ddtree_viz.benchmarks.gpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64, 128])
    p.add_argument("--exactness", action="store_true", help="fp32 real widths (8 layers) + bf16 full depth vs greedy")
    p.add_argument("--exactness-weights", nargs="+", choices=("plain", *QUANTIZED), metavar="W",
                   help="with --exactness: only these weights' checks (plain, fp8, int4; default: plain and each of "
                        "--fp8 / --int4), so that the checks can be split over calls of a time limit")
    p.add_argument("--quantized-only", action="store_true",
                   help="with --fp8 / --int4: only the quantized targets, no bf16 target before them (quantized_alone)")
    p.add_argument("--no-profiler", action="store_true",
                   help="no device timelines through torch.profiler (each comes back as 'not profiled')")
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--skip-speed", action="store_true")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--device-map", choices=("none", "auto"), default="none",
                   help="auto: split the target's layers over every visible GPU with accelerate (drafter on the first)")
    p.add_argument("--fast", action="store_true", help="also measure the static runner (CUDA graphs), and check its exactness")
    p.add_argument("--ui", action="store_true",
                   help="the web page's Step at these shapes on the runner (ui.step + ui.render_views, then the check "
                        "against the reference), the first Step after a new prompt, the bare round (issue #13's targets)")
    p.add_argument("--ui-prompt-tokens", type=int, default=600, help="--ui: prompt length (default: 600)")
    p.add_argument("--ui-steps", type=int, default=12, help="--ui: Steps measured (medians; default: 12)")
    p.add_argument("--fast-only", action="store_true",
                   help="the runner only: of transformers' forward just the bound, prefill, greedy step and drafter pass; "
                        "with --exactness, check the runner only")
    p.add_argument("--gdn-kernel", choices=GDN_KERNELS, default="auto",
                   help="the runner's delta rule: auto = the tree delta rule in Triton (triton-rule) on CUDA when "
                        "Triton imports, else torch")
    p.add_argument("--no-fused", action="store_true", help="the runner without fused projections")
    p.add_argument("--attention", choices=("eager", "sdpa"), default="eager", help="the runner's attention form")
    p.add_argument("--no-compile", action="store_true",
                   help="the runner without its torch.compile'd elementwise pieces (the compiled form is then a variant)")
    p.add_argument("--blas", choices=BLAS_CHOICES, default="auto",
                   help="the runner's GEMM library: auto = cuBLAS or cuBLASLt, whichever replays a tree size's graph "
                        "faster (measured when the size is first captured)")
    p.add_argument("--gate-up", choices=GATE_UP_CHOICES, default="auto",
                   help="the runner's MLP gate+up GEMM: auto = the fastest of fused, split and padded, timed per tree "
                        "size and library at its first capture")
    for flag, what, launch, otherwise in (  # the runner's one-launch parts (kernels/device.py's ONE_LAUNCH_CHOICES)
            ("--gdn-step", "one-node GDN core (the greedy step)", "a layer (kernels/gdn_step/)",
             "the tree form's own"),
            ("--commit", "commit of the GDN states", "for every layer (kernels/state_commit/)",
             "a batched matmul and a pass"),
            ("--gdn-prep", "GDN conv, l2 norms and gates over a tree", "a layer (kernels/gdn_step/)",
             "the compiled piece"),
            ("--norm", "residual add and the norm after it", "each, a program a row (kernels/add_norm/)",
             "the compiled piece")):
        p.add_argument(flag, choices=ONE_LAUNCH_CHOICES, default="auto",
                       help=f"the runner's {what}: auto = one Triton launch {launch} on CUDA when Triton imports, "
                            f"else {otherwise}")
    p.add_argument("--pdl", choices=PDL_CHOICES, default="auto",
                   help="the runner's one-row FP8 products and add + norm launches launched behind the kernel before "
                        "them (programmatic dependent launch, engine/kernels/pdl.py): auto = on for a CUDA device of compute "
                        "capability 9.0 or later with Triton")
    p.add_argument("--variants", nargs="*", choices=VARIANT_FIELDS, default=list(VARIANT_FIELDS), metavar="OPTION",
                   help="--fast: the runner options switched one at a time in speed.fast.variants (default: all of "
                        f"{', '.join(VARIANT_FIELDS)}; none: no variants)")
    p.add_argument("--tree-forms", action="store_true",
                   help="--fast: also sweep the tree delta rule's forms, precisions and tiles one GDN layer at a time "
                        "(speed.fast.tree_forms: minutes on a GPU, so asked for apart from issue #31's figures)")
    p.add_argument("--dflash2", action="store_true",
                   help="--fast: also the DFlash2 drafter (qwen3.8-27b-dflash2-config.json, random weights) beside DFlash "
                        "1 on the runner: its pass at block 8 and whole rounds at budget 64 with the selector tree "
                        "(speed.fast.dflash2; targets dflash2_draft_pass, dflash2_round_64)")
    quantized_arguments(p)
    p.add_argument("--costs", action="store_true",
                   help="issue #30: the runner's cost table at --budgets and S(b) at an oracle-controlled acceptance")
    p.add_argument("--smoke", action="store_true", help="toy widths on the CPU: checks the script, measures nothing real")
    return p


def quantized_arguments(p: argparse.ArgumentParser) -> None:
    """build_parser's options for the quantized targets (issue #29): FP8 and 4-bit weights made at random."""
    p.add_argument("--fp8", action="store_true",
                   help="--fast: also the target with FP8 weights made at random (128x128 blocks, kept as fp8 on the GPU) "
                        "on the runner beside bf16, after the bf16 target is freed: its weight-read bound, greedy step, "
                        "verify, rounds at budget 64, each GEMM, and the peak memory of a session at --fp8-context "
                        "tokens and budget 64 under --fp8-memory-cap (speed.fast.fp8; targets fp8_*); with --exactness "
                        "the runner's exactness on FP8 weights too (with --skip-speed as well: the checks alone)")
    p.add_argument("--fp8-memory-cap", type=float, default=40.0, metavar="GB",
                   help="--fp8: the process's GPU memory cap (GB) while the FP8 target runs (default: 40)")
    p.add_argument("--fp8-context", type=int, default=4096,
                   help="--fp8, --int4: the peak-memory session's prompt (default: 4096)")
    p.add_argument("--int4", action="store_true",
                   help="--fast: also the target with 4-bit weights made at random (W4A16: symmetric, groups of 128, "
                        "kept packed on the GPU, engine/kernels/int4_gemm/) on the runner beside bf16, after the bf16 (and "
                        "FP8) target is freed: its weight-read bound, greedy step, verify, rounds at budget 64, each GEMM "
                        "and the peak memory of a session under --int4-memory-cap (speed.fast.int4; targets int4_*); with "
                        "--exactness the runner's exactness on 4-bit weights too")
    p.add_argument("--int4-drafter", action="store_true", help="with --int4: the drafter's Linears 4-bit for the 4-bit target "
                        "(after the bf16 and FP8 phases)")
    p.add_argument("--head-weights", choices=HEAD_WEIGHTS, default=None,
                   help="with --fp8 / --int4 (and --memory-plan): the quantized targets' lm_head quantized too, as a "
                        "user's --head-weights makes it (the 27B's 2.37 GiB bf16 head in 0.61 int4 / 1.18 fp8)")
    p.add_argument("--int4-tune", action="store_true",
                   help="only the 4-bit GEMM's launches swept at the 27B's shapes (benchmarks/gpu/int4.py)")
    p.add_argument("--int4-tune-rows", type=int, nargs="+", metavar="ROWS",
                   help="--int4-tune: these row counts alone (default: 1 65 129 16); --int4-table fills the rest "
                        "from the shipped table")
    p.add_argument("--int4-tune-narrow", action="store_true",
                   help="--int4-tune: the narrow GEMMs alone (5,120 outputs: o_proj, out_proj, down_proj)")
    p.add_argument("--int4-memory-cap", type=float, default=24.0, metavar="GB",
                   help="--int4: the process's GPU memory cap (GB) while the 4-bit target runs (default: 24)")
    p.add_argument("--int4-sass", action="store_true",
                   help="no GPU needed: the 4-bit GEMM's forms compiled for sm_90a and the instructions a thread "
                        "issues a weight in their k loops, by opcode (benchmarks/gpu/sass.py: a proxy for what "
                        "bounds them, not a timing); nothing else is measured")
    p.add_argument("--fp8-sass", action="store_true",
                   help="no GPU needed: the FP8 GEMM's tree-verify tiles compiled for sm_90a, with their tiles by "
                        "bulk copies and by address, and the instructions a thread issues a weight in their k loops "
                        "(sass.py); with --int4-sass both; nothing else is measured")
    p.add_argument("--int4-table", metavar="JSON",
                   help="--int4: the 4-bit GEMM's launches from this table (a gpu_bench --int4-tune JSON, or a table "
                        "as engine/kernels/int4_gemm/tuned.json) instead of the shipped one, for this run")
    p.add_argument("--long-only", action="store_true",
                   help="--int4: after the build, only the 16,384-token session under the cap (--long-capped), in a "
                        "process that ran nothing before it, as a user's does: no step, verify, round or 4k figure")
    p.add_argument("--long-capped", action="store_true",
                   help="--fp8, --int4: the 16,384-token session's peak measured under the format's memory cap (does "
                        "it run on a card of that size; an out-of-memory is the answer no), not uncapped")
    p.add_argument("--memory-plan", nargs="?", const="", metavar="GPU_JSON",
                   help="no GPU needed: the memory a session of the 27B keeps, computed on the meta device (the models' "
                        "bytes, the runner's state and the drafter's context cache at --fp8-context and 16,384 tokens, "
                        "budget 64) for the weights --fp8 / --int4 name (else bf16), with --int4-drafter's drafter; "
                        "GPU_JSON: a gpu_bench run's JSON, whose measured peaks are set beside the plan (the session's "
                        "transient share); nothing else is measured")


def checked_flags(parser: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """The combinations that measure nothing, refused (argparse's error: exit 2)."""
    if a.dflash2 and (not a.fast or a.skip_speed or a.device_map == "auto"):
        parser.error("--dflash2 measures on the static runner: it needs --fast, without --skip-speed or --device-map auto")
    for flag in ("fp8", "int4"):
        measures = a.memory_plan is None  # (--memory-plan only plans: no run to need --fast)
        if getattr(a, flag) and measures and (not a.fast or (a.skip_speed and not a.exactness) or a.device_map == "auto"):
            parser.error(f"--{flag} measures on the static runner: it needs --fast, without --device-map auto, and "
                         "without --skip-speed unless --exactness (then the exactness checks alone, plain and "
                         "quantized weights)")
    if a.quantized_only and (not (a.fp8 or a.int4) or a.skip_speed):
        parser.error("--quantized-only measures the --fp8 / --int4 targets: name one, without --skip-speed")
    if a.memory_plan and not Path(a.memory_plan).is_file():
        parser.error(f"--memory-plan: no file {a.memory_plan!r} (a gpu_bench JSON, or nothing)")
    unbuilt = [w for w in a.exactness_weights or () if w != "plain" and not getattr(a, w)]
    if a.exactness_weights and (not a.exactness or unbuilt):
        parser.error("--exactness-weights checks the weights --exactness builds: it needs --exactness, and --fast "
                     f"with --{' --'.join(unbuilt) or 'fp8 / --int4'} for the quantized ones")
    if a.head_weights and not (a.fp8 or a.int4 or a.memory_plan is not None):
        parser.error("--head-weights goes with --fp8, --int4 or --memory-plan (the quantized targets' head)")
    if a.int4_drafter and not a.int4:
        parser.error("--int4-drafter goes with --int4")
    if a.int4_table and not (a.int4 and Path(a.int4_table).is_file()):
        parser.error(f"--int4-table goes with --int4 and names a file: {a.int4_table!r}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    checked_flags(parser, a)
    bench = BenchConfig.from_args(a)
    PROFILER[0] = not a.no_profiler
    try:
        return measure(a, bench)
    finally:
        PROFILER[0] = True  # the module's default again (tests call main in one process)


def count_sass(a: argparse.Namespace) -> int:
    """--int4-sass, --fp8-sass: the GEMMs' launches compiled for sm_90a and counted (sass.py), printed and saved."""
    from .sass import fp8_sass, int4_sass

    report = {}
    for flag, name, count, keys in ((a.int4_sass, "int4_sass", int4_sass, ("form", "rows", "block_n", "block_k",
                                                                               "warps", "half")),
                                    (a.fp8_sass, "fp8_sass", fp8_sass, ("rows", "block_n", "warps", "tma"))):
        if flag:
            report[name] = count()
            for launch in report[name].get("launches", []):
                print(name, {k: launch[k] for k in (*keys, "per_weight", "spills")})
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0 if all("error" not in r for r in report.values()) else 1


def measure(a: argparse.Namespace, bench: BenchConfig) -> int:
    """What the flags ask for, measured part by part, the report saved after each part (--json)."""
    if a.int4_sass or a.fp8_sass:  # on any machine with Triton: compiled, not run
        return count_sass(a)
    if a.memory_plan is not None:  # on any machine: the meta device
        from .memory import LONG_CONTEXT
        from .plan import memory_plans

        weights = [w for w in ("fp8", "int4") if getattr(a, w)] or ["bf16"]
        plan = memory_plans(bench, weights, a.int4_drafter, (a.fp8_context, LONG_CONTEXT), a.memory_plan or None,
                            layers=a.layers)
        print(json.dumps(plan, indent=1), flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps({"memory_plan": plan}, indent=1))
        return 0
    if not a.smoke and not torch.cuda.is_available():
        raise SystemExit("error: gpu_bench needs a CUDA GPU (or --smoke for a CPU check of the script)")
    if bench.quantized and bench.cuda:  # before the first allocation, so that every segment can grow (weights/load.py)
        from ...engine.weights.load import expandable_segments

        expandable_segments()
    report = report_head(a, bench)
    if a.int4 or a.int4_tune:  # the launches this run's 4-bit GEMMs take, named in its report
        from ...engine.kernels.int4_gemm import table

        try:
            table.use(table.load(a.int4_table) if a.int4_table else None)
        except (OSError, ValueError) as exc:  # (json's errors are ValueErrors)
            raise SystemExit(f"error: --int4-table: {exc}") from None
        report["int4_table"] = {"path": a.int4_table or str(table.SHIPPED), "device": table.current()["device"],
                                "launches": len(table.current()["launches"])}

    def save():  # after every part, so that a run stopped midway keeps what it measured
        if a.json:
            Path(a.json).write_text(json.dumps(report, indent=1))

    dtype = getattr(torch, a.dtype)
    if a.int4_tune:
        def tuned(part):  # the sweep so far, after each GEMM and row count
            report["int4_tune"] = part
            save()

        report["int4_tune"] = int4_tune(bench, dtype, saved=tuned, rows=a.int4_tune_rows,
                                        narrow_only=a.int4_tune_narrow)
        save()
        return 0

    def saved(part):  # the figures so far, after each of speed's phases
        report["speed"] = part
        save()

    if a.quantized_only:
        report["speed"] = quantized_alone(bench, a.layers, dtype, a.budgets, saved=saved)
        print(json.dumps({"targets": report["speed"]["fast"]["targets"]}, indent=1), flush=True)
        save()
        return 0
    if not a.skip_speed:
        report["speed"] = speed(bench, a.layers, dtype, a.budgets, saved=saved)
        print(json.dumps(report["speed"], indent=1), flush=True)
        save()
    if a.costs:
        report["costs"] = cost_study(bench, a.layers, dtype, a.budgets)
        print(report["costs"]["cost_table"], flush=True)
        save()
    if a.ui:
        report["ui"] = ui_speed(bench, a.layers, dtype, prompt_len=a.ui_prompt_tokens, steps=a.ui_steps)
        print(json.dumps(report["ui"], indent=1), flush=True)
        save()
    exactness_checks(a, bench, report, save)
    fast = report.get("speed", {}).get("fast")
    if fast is not None:
        fast["targets"].update(exactness_targets(bench, report))
        print(json.dumps({"targets": fast["targets"]}, indent=1), flush=True)
        print(forms_table(fast, report["speed"]["weight_read_bound_ms"]), flush=True)
    save()
    return 0


def report_head(a: argparse.Namespace, bench: BenchConfig) -> dict:
    """The report's first keys: where it ran (device, torch, GPUs, the device map) and transformers' version."""
    import transformers

    return {"device": torch.cuda.get_device_name() if bench.cuda else "cpu (smoke)", "torch": torch.__version__,
            "gpus": torch.cuda.device_count() if bench.cuda else 0, "device_map": a.device_map,
            "transformers": transformers.__version__}


def exactness_checks(a: argparse.Namespace, bench: BenchConfig, report: dict, save) -> None:
    """--exactness: transformers' forward (DecodeSession), then the static runner, on plain weights, then the runner
    on each quantized format's (--exactness-weights: only those named), each at float32 real widths (8 layers) and
    bf16 full depth, into the report (saved after each); every runner check's outcome counted (verdict_summary)."""
    checks = []
    chosen = set(a.exactness_weights or ("plain", *bench.quantized))
    if a.exactness and not a.fast_only and "plain" in chosen:
        checks.append(("exactness", exactness))
    if a.exactness and bench.fast and not bench.split and "plain" in chosen:
        checks.append(("fast_exactness", fast_exactness))
    for name, check in checks:
        report[f"{name}_fp32_8_layers"] = check(bench, 8 if not a.smoke else 4, torch.float32, [4, 32, 64], a.new_tokens)
        save()
        report[f"{name}_bf16_full_depth"] = check(bench, a.layers, torch.bfloat16, [32], a.new_tokens,
                                                  ranks_list=((0,), (1,)))
        save()
    for weights in [w for w in bench.quantized if w in chosen] if a.exactness else ():  # quantized weights' checks
        report[f"fast_exactness_{weights}_fp32_8_layers"] = fast_exactness(
            bench, 8 if not a.smoke else 4, torch.float32, [4, 32, 64], a.new_tokens, weights=weights)
        save()
        report[f"fast_exactness_{weights}_bf16_full_depth"] = fast_exactness(
            bench, a.layers, torch.bfloat16, [32, 64], a.new_tokens, ranks_list=((0,), (1,)), weights=weights)
        save()
    verdicts = {key: verdict_summary(runs) for key, runs in report.items() if key.startswith("fast_exactness")}
    if verdicts:  # every runner check's outcome at a glance, the reduced-precision ones' verdicts among them
        report["fast_exactness_verdicts"] = verdicts
        print(json.dumps({"fast_exactness_verdicts": verdicts}), flush=True)


def exactness_targets(bench: BenchConfig, report: dict) -> dict:
    """Issue #18's exactness target on each float32 runner check the report holds: plain weights', then each
    quantized format's."""
    out = {}
    for name, key in (("exactness_fp32", "fast_exactness_fp32_8_layers"),
                      *((f"{w}_exactness_fp32", f"fast_exactness_{w}_fp32_8_layers") for w in bench.quantized)):
        if key in report:
            out[name] = exactness_target(report[key])
    return out

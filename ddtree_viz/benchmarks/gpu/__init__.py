"""gpu_bench: real-shape measurements on a GPU, Qwen3.6-27B text shapes (and its drafters) with random weights.

`python -m ddtree_viz.benchmarks.gpu [flags]` (cli.py: the flags, what each runs, the JSON report; `--smoke` runs the
same code at toy widths on a CPU). Its modules by concern, every time taken through one harness:

- cli.py: the flags (build_parser), the combinations refused, main and measure (the report, saved after each part).
- config.py: BenchConfig (the run's options) and the shapes and formats every part shares.
- harness.py: what only a GPU times (per_call_us in a CUDA graph, the copy bandwidth), over the benchmarks' one
  timing harness (../harness.py: timed_call, samples_ms, timer's medians, host_loop_us, the progress lines).
- models.py: random real-shape targets (bf16, split over GPUs, FP8 or 4-bit) and drafters, the pair, the bound.
- bf16.py: transformers' forward and the static runner at bf16 (speed, fast_speed).
- runner.py, rounds.py, drafter.py, tree_forms.py: the runner's parts, whole rounds, the drafter's pass, the tree
  delta rule's forms.
- quantized.py, fp8.py, int4.py: the quantized targets (--fp8, --int4, --quantized-only), each format's GEMMs, and
  the 4-bit GEMM's sweep (--int4-tune).
- dflash2.py (--dflash2), costs.py (--costs), page.py (--ui), exactness.py (--exactness).
- memory.py: model bytes, the memory cap, the peak of a session; profiler.py: the device's timeline.
- targets.py: every figure against its issue's target.
"""

from .cli import main

__all__ = ["main"]

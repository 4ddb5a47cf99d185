"""The benchmark programs, outside the library's root: each measures the library and prints or writes figures, every
time taken through one harness (harness.py: timed_call, samples_ms, timer's medians, the progress lines).

- decode.py: greedy vs DFlash vs DDTree tokens/s on the same prompts (the `bench` subcommand).
- page.py: what the page costs next to the engine (`python -m ddtree_viz.benchmarks.page`).
- gpu/: Qwen3.6-27B shapes with random weights on GPUs (`python -m ddtree_viz.benchmarks.gpu`), a module per
  concern (gpu/__init__.py lists them); gpu/harness.py adds what only a GPU times (a CUDA graph's calls, the copy
  bandwidth).
"""

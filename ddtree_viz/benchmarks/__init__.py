"""The benchmark programs, outside the library's root: each measures the library and prints or writes figures.

- decode.py: greedy vs DFlash vs DDTree tokens/s on the same prompts (the `bench` subcommand).
- page.py: what the page costs next to the engine (`python -m ddtree_viz.benchmarks.page`).
- gpu/: Qwen3.6-27B shapes with random weights on GPUs (`python -m ddtree_viz.benchmarks.gpu`), a module per
  concern over one timing harness (gpu/__init__.py lists them).
"""

"""`python -m ddtree_viz.benchmarks.gpu ...`: see cli.py."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())

"""`python -m ddtree_viz ...`: see ddtree_viz/cli/."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())

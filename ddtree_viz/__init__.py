"""ddtree-viz: an interactive debugger and visualiser for DDTree speculative decoding on hybrid models."""

__version__ = "0.12.0"

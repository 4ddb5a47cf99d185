"""Optional GPU kernels (Triton) for the static runner. Nothing here is imported on the CPU path: the runner asks
`triton_available()` and imports a kernel module only when it will launch it (a CUDA device and Triton present).

- tree_gdn.py: the tree-exact gated delta rule (gdn_tree.tree_delta_rule) in one Triton kernel per GDN layer.
"""

from __future__ import annotations

import importlib.util
import os


def triton_available() -> bool:
    """Triton importable (CUDA builds of torch ship it; the CPU build and CI do not)."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """TRITON_INTERPRET=1: kernels run on CPU tensors in Triton's interpreter (tests without a GPU)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")

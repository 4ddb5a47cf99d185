"""The Triton kernel tests' one setup, imported before any kernel module: without a GPU the kernels run in Triton's
interpreter on CPU tensors (TRITON_INTERPRET=1, set before Triton is imported: it reads the switch then); a test
module importing this is skipped where Triton is not installed (CI: the CPU build of torch has none)."""

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton")
DEVICE = "cuda" if CUDA else "cpu"

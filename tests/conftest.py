import os

import torch

# The test models are tiny: one thread is fastest and keeps OpenMP from spin-waiting against other processes
# (the app under test, CLI subprocesses) on a 2-core machine. A machine with many cores (the GPU machine, whose
# test files build many CPU models) may give more: DDTREE_TEST_THREADS=8.
torch.set_num_threads(int(os.environ.get("DDTREE_TEST_THREADS", "1")))

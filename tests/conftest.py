import os

import torch

# The test models are tiny: one thread is fastest and keeps OpenMP from spin-waiting against other processes
# (the app under test, CLI subprocesses) on a 2-core machine. A machine with many cores (the GPU machine, whose
# test files build many CPU models) may give more: DDTREE_TEST_THREADS=8.
torch.set_num_threads(int(os.environ.get("DDTREE_TEST_THREADS", "1")))
# speed-up cost tables (ddtree_viz/speedup.py) go to a folder of this run, never the user's ~/.cache
if "DDTREE_VIZ_CACHE" not in os.environ:
    import tempfile

    os.environ["DDTREE_VIZ_CACHE"] = tempfile.mkdtemp(prefix="ddtree-viz-test-cache-")

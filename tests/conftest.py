import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import torch  # noqa: E402

# The test models are tiny: one thread is fastest and keeps OpenMP from spin-waiting against other processes
# (the app under test, CLI subprocesses) on a 2-core machine.
torch.set_num_threads(1)

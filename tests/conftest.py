import torch

# The test models are tiny: one thread is fastest and keeps OpenMP from spin-waiting against other processes
# (the app under test, CLI subprocesses) on a 2-core machine.
torch.set_num_threads(1)

"""Test-session settings shared by every test file."""

import os

import torch

# pytest -n 2 runs two workers on this project's 2-core machines. With torch's default of one
# intra-op thread per core each, four busy-waiting OpenMP threads share two cores and small
# models run 10× slower; one thread per worker (inherited by subprocesses) avoids that.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

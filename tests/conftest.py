"""With pytest-xdist (`-n 2`), each worker and every process it starts gets one thread: two workers
with two OpenMP threads each on 2 cores spin against each other and ran the suite several times
slower than one worker."""

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the runs the tests start
    import torch

    torch.set_num_threads(1)

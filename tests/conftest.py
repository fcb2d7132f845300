"""With pytest-xdist (`-n 2`), each worker and every process it starts gets one thread: two workers
with two OpenMP threads each on 2 cores spin against each other and ran the suite several times
slower than one worker. The tests marked slow are counted here for the README's count."""

import os

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the runs the tests start
    import torch

    torch.set_num_threads(1)


# the tests marked `slow` and the files collected, before `-m "not slow"` deselects them
# (tests/test_docs.py checks the README's count)
COLLECTED = {"slow": [], "files": set()}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    COLLECTED["slow"] = [item.nodeid for item in items if item.get_closest_marker("slow")]
    COLLECTED["files"] = {item.path.name for item in items}

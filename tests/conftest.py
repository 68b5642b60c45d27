import os
import random
import tempfile

import numpy as np
import pytest

# Tests share 2 cores with everything else: keep torch on one thread, deterministically.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# the measured step costs of `reproduce` (experiments/cost.py) go to a cache of the test
# session's own (the CLI's subprocesses inherit it), never the user's; one for the whole session:
# xdist's workers inherit the controller's environment, so between them they time each config
# once (a cold cache costs about 2 CPU-minutes of timing)
_SESSION_CACHE = os.environ.get("GROKLENS_TEST_SESSION_CACHE") or tempfile.mkdtemp(prefix="groklens-test-cache-")
os.environ["GROKLENS_TEST_SESSION_CACHE"] = os.environ["GROKLENS_CACHE_DIR"] = _SESSION_CACHE


@pytest.fixture(autouse=True)
def _seed():
    import torch

    torch.set_num_threads(1)
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield

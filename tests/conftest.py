import os
import random
import tempfile

import numpy as np
import pytest

# Tests share 2 cores with everything else: keep torch on one thread, deterministically.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# the measured step costs of `reproduce` (experiments/cost.py) go to a cache of the test
# session's own (the CLI's subprocesses inherit it), never the user's
os.environ["GROKLENS_CACHE_DIR"] = tempfile.mkdtemp(prefix="groklens-test-cache-")


@pytest.fixture(autouse=True)
def _seed():
    import torch

    torch.set_num_threads(1)
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield

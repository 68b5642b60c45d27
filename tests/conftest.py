import os
import random

import numpy as np
import pytest

# Tests share 2 cores with everything else: keep torch on one thread, deterministically.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _seed():
    import torch

    torch.set_num_threads(1)
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield

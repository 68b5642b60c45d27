"""Golden trajectories: tiny runs of each kind of training (a single run, a vmap ensemble as
`sweep --ensemble` builds it, a routed run, a regularized run) must write the same bytes into
every HDF5 dataset as the code did when these hashes were recorded. A refactor of the trainers
that changes one number anywhere in a file fails here.

The hash covers every dataset's name, shape, dtype and values; attributes are left out (they
carry the groklens version and a creation time). To re-record after a deliberate change:
`python -m tests.trainers.test_golden`, and say in the commit why the numbers moved.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import h5py
import numpy as np

from tests.helpers import tiny_config

BASE = dict(steps=60, eval_every=10, checkpoint_every=20)
SINGLE = dict(**BASE, batch_size=16, seed=3)
ENSEMBLE = [dict(**BASE, seed=1, lr=3e-3, weight_decay=1.0),
            dict(**BASE, seed=2, lr=1e-3, weight_decay=0.3, data_seed=7)]
ROUTED = dict(**BASE, routing_copies=3, routing_width=1.0, batch_size=16)
# crosses train and test accuracy 0.3 off the checkpoint schedule: guards the phase checkpoints
# (recorded after they were added; the four above predate the engine redesign)
PHASED = dict(p=11, lr=1e-2, steps=300, eval_every=10, checkpoint_every=100, grok_threshold=0.3, train_frac=0.6,
              weight_decay=3.0)
REGULARIZED = dict(**BASE, act_norm_lambda=0.05, grokfast_lambda=2.0, geomdr_lambda=0.1, geomdr_target=4.0,
                   n_layers=2)


def file_hash(path: Path) -> str:
    """sha256 over (name, shape, dtype, bytes) of every dataset, in name order."""
    h = hashlib.sha256()
    with h5py.File(path, "r", locking=False) as f:
        names: list[str] = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        for name in sorted(names):
            arr = np.ascontiguousarray(f[name][()])
            h.update(f"{name}|{arr.shape}|{arr.dtype.str}|".encode())
            h.update(arr.tobytes())
    return h.hexdigest()


def train_all(tmp: Path) -> dict[str, str]:
    """Train each golden config into `tmp`; file name -> hash."""
    from groklens.trainers.ensemble import train_ensemble
    from groklens.trainers.train import train

    train(tiny_config(**SINGLE), tmp / "single.h5", progress=False)
    ens = [tmp / f"ensemble{i}.h5" for i in range(len(ENSEMBLE))]
    results = train_ensemble([tiny_config(**c) for c in ENSEMBLE], ens, force=True)  # as sweeps does
    assert all(r.error is None for r in results)
    train(tiny_config(**ROUTED), tmp / "routed.h5", progress=False)
    train(tiny_config(**REGULARIZED), tmp / "regularized.h5", progress=False)
    train(tiny_config(**PHASED), tmp / "phased.h5", progress=False)
    return {p.name: file_hash(p) for p in sorted(tmp.glob("*.h5"))}


GOLDEN = {
    "ensemble0.h5": "00563824fa4f2e49ffe52d179be80157fb10a8d459e20f1f1db3c73b775745f3",
    "ensemble1.h5": "9813cf4ac551a64e283d54f2b8bdfa2906a2950b74341ee3e233654269990bc4",
    "phased.h5": "aae05aa9428a69b10b039746f155d24af05792dbce2a12e1ca602b49b9d44675",
    "regularized.h5": "48968c31df9d718858992c03598bf7ac5959ab66bc9df2f16afcba35f43342db",
    "routed.h5": "c140d97254e55f32f3f6b72245de3f5d5b62e714c93a6184877e2716bd2339a3",
    "single.h5": "8b5103a2a7ee5895694980e72cd2972d48fb2be45db67e74b2437160a26b2bd1",
}


def test_trajectories_are_bit_identical_to_the_golden_ones(tmp_path):
    assert train_all(tmp_path) == GOLDEN


if __name__ == "__main__":  # re-record: prints the GOLDEN dict
    import random
    import tempfile

    import torch

    torch.set_num_threads(1)
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)  # as the autouse fixture in tests/conftest.py
    with tempfile.TemporaryDirectory() as d:
        for name, digest in train_all(Path(d)).items():
            print(f'    "{name}": "{digest}",')

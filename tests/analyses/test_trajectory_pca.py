"""Parameter-trajectory PCA of a real run against numpy's SVD of the centred checkpoint matrix."""

from __future__ import annotations

import numpy as np
import pytest

from groklens.analyses.phases import run_phases
from groklens.analyses.trajectory_pca import checkpoint_phases, parameter_pca
from groklens.checkpoints.reader import Trajectory
from tests.helpers import train_tiny


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("pca") / "run.h5"
    train_tiny(path, steps=300, checkpoint_every=25, lr=1e-2, weight_decay=1.0)
    return Trajectory(path)


def test_projections_are_numpys_svd(run):
    res = parameter_pca(run, n_components=3)
    # independently: the rebuilt models' parameters (their own order: PCA does not see a column permutation)
    X = np.stack([np.concatenate([p.detach().double().reshape(-1).numpy() for p in run.model(int(s)).parameters()])
                  for s in run.steps])
    Xc = X - X.mean(axis=0)
    U, S, _ = np.linalg.svd(Xc, full_matrices=False)
    exact = U[:, :3] * S[:3]
    got = res["projections"]
    signs = np.sign(np.sum(got * exact, axis=0))  # a principal direction's sign is arbitrary
    np.testing.assert_allclose(got * signs, exact, rtol=1e-6, atol=1e-8 * S[0])
    np.testing.assert_allclose(res["explained_variance_ratio"], S[:3] ** 2 / np.sum(S ** 2), rtol=1e-8)
    assert res["steps"] == [int(s) for s in run.steps]


def test_every_checkpoint_has_its_phase(run):
    res = parameter_pca(run)
    ph = run_phases(run)
    assert len(res["phases"]) == len(res["steps"]) and res["phases"][0] == "memorization"
    for step, phase in zip(res["steps"], res["phases"]):
        if ph.memorization is not None and step >= ph.memorization:
            assert phase != "memorization"
    assert checkpoint_phases([0, 10, 20, 30], 10, 30) == ["memorization", "circuit formation", "circuit formation",
                                                          "cleanup"]
    assert checkpoint_phases([0, 10], None, None) == ["memorization"] * 2
    assert checkpoint_phases([0, 10, 20], 10, None) == ["memorization", "circuit formation", "circuit formation"]

import numpy as np
import pytest

from groklens.analyses import compute
from groklens.analyses.grokking import grokking_table
from groklens.checkpoints import Trajectory
from tests.helpers import train_tiny


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("norms") / "run.h5"
    train_tiny(path)
    return Trajectory(path)


def test_weight_norm_matches_the_trainers_log_and_distances_numpy(run):
    res = compute(run, "norms", store=False)
    logged = dict(zip(run.metrics["step"].tolist(), run.metrics["weight_norm"].tolist()))
    init = {k: v.double().numpy() for k, v in run.params(0).items()}
    for i, s in enumerate(res.steps):
        assert float(res.values["weight_norm"][i]) == pytest.approx(logged[s], rel=1e-12)
        now = {k: v.double().numpy() for k, v in run.params(s).items()}
        diff = np.sqrt(sum(((now[k] - init[k]) ** 2).sum() for k in now))
        assert float(res.values["distance_from_init"][i]) == pytest.approx(diff, rel=1e-12, abs=1e-300)
        assert float(res.values["norm@blocks.0.mlp.W_in"][i]) == pytest.approx(np.linalg.norm(now["blocks.0.mlp.W_in"]))
    assert float(res.values["distance_from_init"][0]) == 0.0


def test_grokking_times_with_censoring():
    metrics = {"step": np.array([0, 10, 20, 30]), "train_acc": np.array([0.1, 0.96, 1.0, 1.0]),
               "test_acc": np.array([0.0, 0.2, 0.97, 0.98])}
    out = grokking_table(metrics, (0.95, 0.99))
    assert out["memorization_step"].tolist() == [10, 20]
    assert out["grokking_step"].tolist() == [20, -1]
    assert out["grokking_censored"].tolist() == [0, 1]
    assert out["last_step"] == 30

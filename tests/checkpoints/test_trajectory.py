import json

import h5py
import numpy as np
import pytest

from groklens.checkpoints import Trajectory, constants as C
from groklens.errors import BadInput
from tests.helpers import train_tiny


@pytest.fixture(scope="module")
def run_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("traj") / "run.h5"
    train_tiny(path)
    return path


def test_file_layout_matches_format_doc(run_path):
    with h5py.File(run_path, "r") as f:
        assert f.attrs["format"] == "groklens-trajectory" and f.attrs["format_version"] == 1
        cfg = json.loads(f.attrs["config"])
        assert cfg["p"] == 11
        n = f["steps"].shape[0]
        assert list(f["steps"][:]) == [0, 20, 40, 60]
        for ds in f["params"].values():
            assert ds.shape[0] == n and ds.dtype == np.float32
            assert ds.chunks == (1, *ds.shape[1:])  # one chunk per checkpoint
        assert f["params/embed.W_E"].compression == "gzip"
        assert set(f["metrics"]) >= {"step", "train_loss", "test_loss", "train_acc", "test_acc"}
        assert f["metrics/train_loss"].dtype == np.float64
        assert set(f["data"]) == {"inputs", "labels", "train_idx", "test_idx", "informative_mask"}
        assert f["status"][0].rstrip(b"\0") == b"completed"
        assert list(f["state/step"][:]) in ([60, 40], [40, 60])


def test_trajectory_api(run_path):
    run = Trajectory(run_path)
    assert run.config.p == 11 and run.config.d_model == 16
    assert list(run.steps) == [0, 20, 40, 60]
    data = run.dataset()
    assert data.inputs.shape == (121, 3) and data.readout_pos == 2
    assert len(data.train_idx) + len(data.test_idx) == 121
    params = run.params(40)
    assert params["embed.W_E"].shape == (12, 16)
    assert np.array_equal(run.param_trajectory("embed.W_E")[2], params["embed.W_E"].numpy())
    model = run.model(60)
    assert not model.training and model(data.inputs).shape == (121, 3, 11)
    with pytest.raises(BadInput, match="no checkpoint at step 41"):
        run.params(41)
    with pytest.raises(BadInput, match="no parameter"):
        run.param_trajectory("nope")


@pytest.mark.parametrize("path", [None, 3, b"run.h5"])
def test_trajectory_of_a_non_path_is_refused(path):
    with pytest.raises(BadInput, match=r"Trajectory\(path\): a path"):
        Trajectory(path)


@pytest.mark.parametrize("step", [None, 40.5, 40.0, "40", True, np.float64(40)])
def test_a_checkpoint_step_is_an_int_that_exists(run_path, step):
    """40.5, 40.0 or "40" read as checkpoint 40 before (int() of them); None was a TypeError."""
    run = Trajectory(run_path)
    for call in (run.model, run.params, run.state, run.checkpoint_index):
        with pytest.raises(BadInput, match="a checkpoint step is an int"):
            call(step)
    assert run.checkpoint_index(np.int64(40)) == 2  # a numpy integer (an element of run.steps) is an int


def _copy(run_path, tmp_path, name="copy.h5"):
    dst = tmp_path / name
    dst.write_bytes(run_path.read_bytes())
    return dst


def test_future_format_version_is_refused(run_path, tmp_path):
    path = _copy(run_path, tmp_path)
    with h5py.File(path, "r+") as f:
        f.attrs["format_version"] = 99
    with pytest.raises(BadInput, match="format version 99 is newer"):
        Trajectory(path)


def test_non_groklens_hdf5_is_refused(tmp_path):
    path = tmp_path / "other.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(3)
    with pytest.raises(BadInput, match="not a groklens trajectory"):
        Trajectory(path)


@pytest.mark.parametrize("keep", [0, 7, 100, 2048])
def test_truncated_file_is_refused_with_a_clear_error(run_path, tmp_path, keep):
    path = tmp_path / "trunc.h5"
    path.write_bytes(run_path.read_bytes()[:keep])
    with pytest.raises(BadInput):
        assert Trajectory(path).steps is not None


def test_missing_and_directory_paths(tmp_path):
    with pytest.raises(BadInput, match="no such file"):
        Trajectory(tmp_path / "none.h5")
    with pytest.raises(BadInput, match="directory"):
        Trajectory(tmp_path)


def test_damaged_file_missing_group_is_refused(run_path, tmp_path):
    path = _copy(run_path, tmp_path)
    with h5py.File(path, "r+") as f:
        del f[C.STATE]
    with pytest.raises(BadInput, match="missing /state"):
        Trajectory(path)

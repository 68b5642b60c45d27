"""A file found clean is not walked again while it is unchanged (checkpoints/validate.py
`clean_once`), and any change, even one that puts the modification time back, is walked again
and refused. The walks are counted by wrapping the real ones."""

from __future__ import annotations

import os

import h5py
import pytest

from groklens.analyses import compute
from groklens.checkpoints import Trajectory, sidecar_path
from groklens.checkpoints import validate
from groklens.errors import BadInput
from tests.helpers import train_tiny


@pytest.fixture
def walks(monkeypatch):
    """Counts of the real trajectory and link walks, by name."""
    counts = {"trajectory": 0, "links": 0}
    real_file, real_links = validate._file_problems, validate._link_problems

    def file_problems(f, path):
        counts["trajectory"] += 1
        return real_file(f, path)

    def link_problems(f):
        counts["links"] += 1
        return real_links(f)

    monkeypatch.setattr(validate, "_file_problems", file_problems)
    monkeypatch.setattr(validate, "_link_problems", link_problems)
    monkeypatch.setattr(validate, "_CLEAN", set())
    return counts


def _age(path, seconds=60):
    """Move the file's modification time into the past (past the racy window)."""
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - seconds * 10**9))


def test_an_unchanged_file_is_walked_once_and_a_changed_one_again(tmp_path, walks):
    path = tmp_path / "run.h5"
    train_tiny(path, steps=40)
    _age(path)
    Trajectory(path)
    assert walks == {"trajectory": 1, "links": 1}  # the format check walks the links; the whole check reuses it
    for _ in range(3):
        Trajectory(path).metrics  # noqa: B018  (opens the file again)
    assert walks == {"trajectory": 1, "links": 1}
    # a link put in, then the modification time put back: the change time moved, so it is walked
    before = os.stat(path)
    with h5py.File(path, "a") as f:
        del f["params/embed.W_E"]
        f["params/embed.W_E"] = h5py.SoftLink("/params/unembed.W_U")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(BadInput, match="soft link"):
        Trajectory(path)
    with pytest.raises(BadInput, match="soft link"):  # a problem is never remembered as clean
        Trajectory(path)


def test_a_file_changed_just_now_is_not_remembered(tmp_path, walks):
    """Within the racy window a second change could keep the same timestamps: walk every time."""
    path = tmp_path / "run.h5"
    train_tiny(path, steps=40)
    os.utime(path)  # modified now
    Trajectory(path)
    Trajectory(path)
    assert walks["trajectory"] == 2


def test_the_analyses_file_is_checked_once_while_unchanged(tmp_path, monkeypatch):
    from groklens.analyses import store

    path = tmp_path / "run.h5"
    train_tiny(path, steps=40)
    run = Trajectory(path)
    compute(run, "norms")
    side = sidecar_path(path)
    _age(side)
    monkeypatch.setattr(validate, "_CLEAN", set())
    calls = []
    real = store.check_sidecar
    monkeypatch.setattr(store, "check_sidecar", lambda f, p: calls.append(p) or real(f, p))
    for _ in range(3):
        assert store.Sidecar(path).variants("norms")
    assert len(calls) == 1
    with h5py.File(side, "a") as f:  # a value without its row per step: refused once changed
        (variant,) = f["analyses/norms"].values()
        name = next(k for k in variant if k != "steps")
        del variant[name]
        variant[name] = [1.0] * (len(variant["steps"]) + 1)
    with pytest.raises(BadInput, match="does not hold one row per stored step"):
        store.Sidecar(path).variants("norms")

"""The CPU time a run's training took, kept in its file (/cpu_seconds, docs/FORMAT.md) and in its
ledger entry (`cpu_s`). No timing thresholds: only that it is there, positive, bounded by the
process's own CPU time, and that a resume adds to it."""

from __future__ import annotations

import math
import time

import h5py

from groklens.checkpoints import Trajectory
from groklens.checkpoints import constants as C
from groklens.trainers.train import resume, train
from tests.helpers import tiny_config, train_interrupted


def test_a_run_keeps_the_cpu_time_its_training_took(tmp_path):
    t0 = time.process_time()
    train(tiny_config(), tmp_path / "a.h5", progress=False)
    spent = time.process_time() - t0
    cpu = Trajectory(tmp_path / "a.h5").cpu_seconds
    assert cpu is not None and 0 < cpu <= spent


def test_a_resume_adds_to_the_stored_cpu_time(tmp_path):
    path = tmp_path / "r.h5"
    train_interrupted(tiny_config(), path, at_step=45)
    before = Trajectory(path).cpu_seconds
    assert before is not None and before > 0
    resume(path, progress=False)
    assert Trajectory(path).cpu_seconds > before


def test_a_file_from_before_it_was_kept_reads_as_unknown_and_stays_so(tmp_path):
    path = tmp_path / "old.h5"
    train_interrupted(tiny_config(), path, at_step=45)
    with h5py.File(path, "r+") as f:  # as written before /cpu_seconds existed
        del f[C.CPU_SECONDS]
    assert Trajectory(path).cpu_seconds is None
    resume(path, progress=False)  # the run trained before the resume is unknown: so is the total
    t = Trajectory(path)
    assert t.cpu_seconds is None and t.status == "completed"
    with h5py.File(path, "r") as f:
        assert math.isnan(f[C.CPU_SECONDS][0])


def test_the_ledger_entry_records_cpu_s_when_the_file_has_it(tmp_path):
    from groklens.experiments.ledger import summarize_run

    path = tmp_path / "l.h5"
    train(tiny_config(), path, progress=False)
    entry = summarize_run(path, "x", "base", 1, [])
    assert entry["cpu_s"] == round(Trajectory(path).cpu_seconds, 1)
    with h5py.File(path, "r+") as f:
        del f[C.CPU_SECONDS]
    assert "cpu_s" not in summarize_run(path, "x", "base", 1, [])

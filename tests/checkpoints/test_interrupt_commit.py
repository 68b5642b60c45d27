"""Ctrl-C during a commit: the interrupt waits until the row or checkpoint is whole.

Python raises KeyboardInterrupt between any two bytecodes. One that landed between a series'
resize and its value left a row of fill values, which the interrupted run's close() flushed: the
file then failed validation ("/metrics/step is not strictly increasing"). Seen once in
tests/cli/test_train_guards.py's Ctrl-C test; here the signal is sent at exactly that moment."""

import os
import signal

import h5py
import pytest

from groklens.checkpoints import Trajectory
from groklens.trainers.train import train
from tests.helpers import tiny_config


@pytest.mark.parametrize("series, nth", [("/metrics/step", 3), ("/steps", 2)])
def test_ctrl_c_between_a_resize_and_its_value_leaves_a_valid_file(tmp_path, monkeypatch, series, nth):
    path = tmp_path / "run.h5"
    real_resize = h5py.Dataset.resize
    seen = []

    def resize_then_interrupt(ds, *args, **kwargs):
        real_resize(ds, *args, **kwargs)
        if ds.name == series:
            seen.append(1)
            if len(seen) == nth:
                os.kill(os.getpid(), signal.SIGINT)  # handled at the next bytecode: before the value is set

    monkeypatch.setattr(h5py.Dataset, "resize", resize_then_interrupt)
    # Ctrl-C as a terminal delivers it: pytest-xdist's workers ignore SIGINT
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            train(tiny_config(steps=200, eval_every=5, checkpoint_every=10), path)
    finally:
        signal.signal(signal.SIGINT, previous)
    monkeypatch.undo()
    run = Trajectory(path)  # validates the file: it raised InvalidTrajectory before the fix
    steps = run.metrics["step"] if series == "/metrics/step" else run.steps
    assert len(steps) == nth and list(steps) == sorted(set(steps)) and steps[-1] > 0

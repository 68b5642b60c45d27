"""`train --resume RUN --steps N` raises a censored run's step cap: the file keeps the config it
began with (its checksum verifies) and records the extension, and the run ends bit-identical to
one trained to N in one go (issue 43)."""

from __future__ import annotations

import json

import h5py
import numpy as np

from groklens.checkpoints import Trajectory
from groklens.checkpoints.validate import file_problems
from tests.helpers import config_flags, groklens, one_line_exit, tiny_config, train_tiny

# the old cap (100) is on both schedules, so the extended run has no extra row or checkpoint
CFG = dict(steps=100, eval_every=10, checkpoint_every=20)


def test_an_extended_run_is_the_run_trained_to_the_new_cap_in_one_go(tmp_path):
    ext, one = tmp_path / "ext.h5", tmp_path / "one.h5"
    train_tiny(ext, **CFG)
    train_tiny(one, **{**CFG, "steps": 200})
    out = groklens("train", "-q", "--resume", str(ext), "--steps", "200", check=True)
    assert "completed at step 200" in out.stdout
    a, b = Trajectory(ext), Trajectory(one)
    assert list(a.steps) == list(b.steps)
    for step in a.steps:
        pa, pb = a.params(int(step)), b.params(int(step))
        assert pa.keys() == pb.keys() and all(np.array_equal(pa[k], pb[k]) for k in pa)
    ma, mb = a.metrics, b.metrics
    assert ma.keys() == mb.keys() and all(np.array_equal(ma[k], mb[k], equal_nan=True) for k in ma)
    assert a.config_dict == b.config_dict  # the cap read is the extension's
    with h5py.File(ext, "r") as f:  # the config attribute is the run's first, and still verifies
        assert json.loads(f.attrs["config"])["steps"] == 100
        extensions = json.loads(f.attrs["extensions"])
        assert file_problems(f, ext) == []
    assert [(e["from_steps"], e["steps"], e["at_step"]) for e in extensions] == [(100, 200, 100)]
    info = json.loads(groklens("info", "--json", str(ext), check=True).stdout)
    assert info["config"]["steps"] == 200 and info["extensions"][0]["from_steps"] == 100
    assert "extended cap 100 -> 200 at step 100" in groklens("info", str(ext), check=True).stdout


def test_an_extension_that_does_not_raise_the_cap_or_a_run_its_stop_rule_ended_is_refused(tmp_path):
    run = tmp_path / "r.h5"
    train_tiny(run, **CFG)
    before = run.read_bytes()
    assert "raise" in one_line_exit(groklens("train", "--resume", str(run), "--steps", "100"))
    assert "do not also give --lr" in one_line_exit(groklens("train", "--resume", str(run), "--steps", "200",
                                                             "--lr", "0.1"))
    assert run.read_bytes() == before  # nothing written
    stopped = tmp_path / "s.h5"
    groklens("train", "-q", "--out", str(stopped), *config_flags(tiny_config(
        steps=2000, eval_every=10, checkpoint_every=1000, grok_threshold=0.05, stop_after_grok=2)), check=True)
    assert "ended before its cap" in one_line_exit(groklens("train", "--resume", str(stopped), "--steps", "4000"))


def test_a_damaged_extension_record_is_one_line(tmp_path):
    run = tmp_path / "r.h5"
    train_tiny(run, **CFG)
    with h5py.File(run, "r+") as f:
        f.attrs["extensions"] = json.dumps([{"steps": 50, "from_steps": 100, "at_step": 100}])
    assert "rising step caps" in one_line_exit(groklens("info", str(run)))

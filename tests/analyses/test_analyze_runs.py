"""runner.analyze_runs: several runs at chosen checkpoints and phases, in this process or a pool."""

import json
import shutil

import numpy as np
import pytest

from groklens.analyses.runner import analyze_runs, choose_checkpoints
from groklens.analyses.store import Sidecar
from groklens.checkpoints import Trajectory, sidecar_path
from tests.helpers import train_tiny


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("analyze_runs")
    paths = [d / "a.h5", d / "b.h5"]
    for seed, p in enumerate(paths, 1):
        train_tiny(p, seed=seed, p=7, lr=1e-2, steps=120)  # checkpoints every 20 steps, evaluations every 10
    return paths


def _phases_by_hand(traj, threshold=0.95):
    """The phase checkpoints from the metrics, independently: the first evaluation whose train /
    test accuracy reaches the threshold, if a checkpoint is less than one evaluation from it, and
    the last checkpoint."""
    m, cps = traj.metrics, [int(s) for s in traj.steps]
    out = {cps[-1]}
    for key in ("train_acc", "test_acc"):
        hits = [int(s) for s, a in zip(m["step"], m[key]) if a >= threshold]
        if hits:
            near = min(cps, key=lambda c: (abs(c - hits[0]), -c))
            if abs(near - hits[0]) < traj.config.eval_every:
                out.add(near)
    return sorted(out)


def test_choose_checkpoints(runs):
    traj = Trajectory(runs[0])
    cps = [int(s) for s in traj.steps]
    assert {0, 20, 40, 60, 80, 100, 120} <= set(cps)  # periodic, plus the phase checkpoints
    assert choose_checkpoints(traj, "all") == cps
    assert choose_checkpoints(traj, "end") == [cps[-1]]
    assert choose_checkpoints(traj, "every:3") == sorted(set(cps[::3]) | {cps[-1]})
    assert choose_checkpoints(traj, "about:2") == sorted(set(cps[::len(cps) // 2]) | {cps[-1]})
    phases = _phases_by_hand(traj)
    assert len(phases) >= 2  # it memorized within 120 steps: a phase checkpoint besides the end
    assert choose_checkpoints(traj, "phases") == phases
    assert choose_checkpoints(traj, "every:4+phases") == sorted(set(cps[::4]) | {cps[-1]} | set(phases))
    with pytest.raises(ValueError):
        choose_checkpoints(traj, "every:0")


def test_a_pool_of_workers_stores_what_one_process_stores(runs, tmp_path):
    copies = []
    for p in runs:
        shutil.copy(p, tmp_path / p.name)
        copies.append(tmp_path / p.name)
    requests = [("norms", {}, "end"), ("rank", {"weights": []}, "every:3+phases")]
    assert analyze_runs(runs, requests, workers=1) == []
    assert analyze_runs(copies, requests, workers=2) == []
    for p, q in zip(runs, copies):
        traj = Trajectory(p)
        for name, want in (("norms", [int(traj.steps[-1])]), ("rank", choose_checkpoints(traj, "every:3+phases"))):
            (variant, _), = Sidecar(p).variants(name)
            a, b = Sidecar(p).read(name, variant), Sidecar(q).read(name, variant)
            assert a.steps == b.steps == want
            for key in a.values:
                assert all(np.array_equal(x, y) for x, y in zip(a.values[key], b.values[key]))


def test_an_analysis_that_does_not_apply_is_a_note_or_bad_input(runs, tmp_path):
    from groklens.errors import BadInput

    shutil.copy(runs[0], tmp_path / "a.h5")
    bad = [("rank", {"sites": ["hook_nope"]})]
    notes = analyze_runs([tmp_path / "a.h5"], bad, checkpoints="end")
    assert len(notes) == 1 and notes[0].startswith("a.h5: skipped rank")
    with pytest.raises(BadInput):
        analyze_runs([tmp_path / "a.h5"], bad, checkpoints="end", skip_inapplicable=False)


def test_one_analysis_with_two_parameter_sets_at_one_choice(runs, tmp_path):
    """The demo asks fourier twice at the same checkpoints (each checkpoint's key set, and the last
    checkpoint's for the progress-measures figure): both are stored, each equal to the analysis
    computed alone with its parameters (it was refused as 'asked twice in one call')."""
    from groklens.analyses import compute

    path = tmp_path / "a.h5"
    shutil.copy(runs[0], path)
    analyze_runs([path], [("fourier", {}, "every:3"), ("fourier", {"key_frequencies": "last"}, "every:3")])
    stored = {json.loads(a["params"])["key_frequencies"] is None: Sidecar(path).read("fourier", v)
              for v, a in Sidecar(path).variants("fourier")}
    assert set(stored) == {True, False}
    alone = tmp_path / "alone.h5"
    for own in (True, False):
        shutil.copy(runs[0], alone)
        sidecar_path(alone).unlink(missing_ok=True)
        ref = compute(Trajectory(alone), "fourier", steps=stored[own].steps,
                      **({} if own else {"key_frequencies": "last"}))
        assert stored[own].steps == ref.steps
        assert np.allclose(np.asarray(stored[own].values["restricted_loss_all"], float).ravel(),
                           np.asarray(ref["restricted_loss_all"], float).ravel())

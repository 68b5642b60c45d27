import numpy as np
import pytest
import torch
import torch.nn.functional as F

from groklens.checkpoints import Trajectory
from groklens.errors import BadInput, RunFailure
from groklens.experiments.core import EXPERIMENT_DEFAULTS
from groklens.experiments.ledger import config_hash
from groklens.models.losses import cross_entropy
from groklens.trainers.engine import checkpoint_schedule
from groklens.trainers.train import resume, train
from tests.helpers import tiny_config, train_tiny


def test_tiny_model_memorizes_and_every_checkpoint_rebuilds_identically(tmp_path):
    path = tmp_path / "run.h5"
    train_tiny(path, steps=200, checkpoint_every=40, eval_every=20, p=13)
    run = Trajectory(path)
    m = run.metrics
    assert m["train_acc"][-1] == 1.0 and m["train_acc"][0] < 0.5  # memorized
    # the periodic checkpoints, and one at each first evaluation with train or test acc >= 0.95 / 0.99
    phases = {int(m["step"][np.nonzero(m[k] >= t)[0][0]]) for k in ("train_acc", "test_acc") for t in (0.95, 0.99)
              if (m[k] >= t).any()}
    assert list(run.steps) == sorted({0, 40, 80, 120, 160, 200} | phases)
    data = run.dataset()
    for step in run.steps:
        model = run.model(int(step))
        logits = model(data.inputs)
        # the stored test accuracy at this step is what the rebuilt model computes
        row = int(np.nonzero(m["step"] == step)[0][0])
        pred = logits[data.test_idx, data.readout_pos].argmax(-1)
        assert float((pred == data.labels[data.test_idx]).double().mean()) == pytest.approx(m["test_acc"][row])
        train_loss = F.cross_entropy(logits[data.train_idx, data.readout_pos].double(), data.labels[data.train_idx])
        assert float(train_loss.detach()) == pytest.approx(m["train_loss"][row], rel=1e-6)


def test_same_seeds_give_bit_identical_trajectories(tmp_path):
    train_tiny(tmp_path / "a.h5", seed=5)
    train_tiny(tmp_path / "b.h5", seed=5)
    train_tiny(tmp_path / "c.h5", seed=6)
    a, b, c = (Trajectory(tmp_path / f"{n}.h5") for n in "abc")
    for name in a.param_names:
        assert np.array_equal(a.param_trajectory(name), b.param_trajectory(name))
    assert not np.array_equal(a.param_trajectory("embed.W_E"), c.param_trajectory("embed.W_E"))
    for key, values in a.metrics.items():
        assert np.array_equal(values, b.metrics[key], equal_nan=True), key


def test_loss_is_float64_and_does_not_underflow():
    # a very confident correct prediction: float32 cross-entropy rounds the loss to exactly 0
    logits = torch.tensor([[20.0, 0.0, 0.0]])
    labels = torch.tensor([0])
    assert F.cross_entropy(logits, labels).item() == 0.0
    loss = cross_entropy(logits, labels)
    assert loss.dtype == torch.float64 and loss.item() > 0
    assert loss.item() == pytest.approx(2 * np.exp(-20.0), rel=1e-9)


def test_checkpoint_schedule_with_log_spaced_early_checkpoints():
    cfg = tiny_config(steps=1000, checkpoint_every=100, log_checkpoints=5)
    steps = sorted(checkpoint_schedule(cfg))
    assert steps[0] == 0 and steps[-1] == 1000
    early = [s for s in steps if 0 < s < 100]
    assert early == sorted(set(early)) and len(early) >= 4 and early[0] == 1
    assert set(range(0, 1001, 100)) <= set(steps)


def test_last_step_is_always_checkpointed_and_evaluated(tmp_path):
    train_tiny(tmp_path / "r.h5", steps=55, checkpoint_every=20, eval_every=10)
    run = Trajectory(tmp_path / "r.h5")
    assert list(run.steps) == [0, 20, 40, 55]
    assert list(run.metrics["step"]) == [0, 10, 20, 30, 40, 50, 55]


def test_minibatch_training_is_deterministic(tmp_path):
    train_tiny(tmp_path / "a.h5", batch_size=16)
    train_tiny(tmp_path / "b.h5", batch_size=16)
    a, b = Trajectory(tmp_path / "a.h5"), Trajectory(tmp_path / "b.h5")
    assert np.array_equal(a.param_trajectory("unembed.W_U"), b.param_trajectory("unembed.W_U"))
    full = tmp_path / "full.h5"
    train_tiny(full)
    assert not np.array_equal(a.param_trajectory("unembed.W_U"), Trajectory(full).param_trajectory("unembed.W_U"))


def test_non_finite_loss_stops_with_last_good_checkpoint_kept(tmp_path):
    path = tmp_path / "nan.h5"
    with pytest.raises(RunFailure, match="non-finite"):
        train_tiny(path, lr=1e30, warmup_steps=0, steps=200, checkpoint_every=1, eval_every=1)
    run = Trajectory(path)
    assert run.status.startswith("stopped: non-finite")
    steps = run.steps
    assert len(steps) >= 1
    for step in steps:  # every kept checkpoint is finite
        assert all(torch.isfinite(t).all() for t in run.params(int(step)).values())


def test_stop_rule_ends_the_run_after_grokking(tmp_path):
    path = tmp_path / "g.h5"
    # threshold 0.05 is crossed almost at once (here at step 0, chance level, then it falls back):
    # the run must stop 2 evaluations after the first of 3 (grok_evals) in a row at or above it
    train_tiny(path, steps=2000, eval_every=10, checkpoint_every=1000, grok_threshold=0.05, stop_after_grok=2)
    run = Trajectory(path)
    m = run.metrics
    above = m["test_acc"] >= 0.05
    first = next(i for i in range(len(above)) if above[i:i + 3].all() and len(above[i:i + 3]) == 3)
    assert len(m["step"]) == first + 3
    assert run.steps[-1] == m["step"][-1] < 2000
    assert run.status.startswith("completed: stopped 2 evaluations after grokking")


def test_stop_on_test_loss_not_before_a_minimum_step_and_resumed_alike(tmp_path):
    """stop_test_loss counts evaluations from the first test loss <= it; stop_min_steps holds the
    stop back; a run interrupted after the event resumes to the same stop (its counter comes
    back from the rows, on the loss event, not on accuracy)."""
    from tests.helpers import train_interrupted

    # this run's test loss: 2.5 at step 0, up to 33 at step 80, 20-21 at steps 150-250 (it overfits):
    # the event holds at step 0 and again at step 200, where stop_min_steps lets the rule stop
    cfg = dict(steps=3000, eval_every=10, checkpoint_every=50, lr=1e-2, stop_after_grok=2, stop_test_loss=30.0,
               stop_min_steps=200)
    full = tmp_path / "full.h5"
    train_tiny(full, **cfg)
    m = Trajectory(full).metrics
    first = int(np.nonzero(m["test_loss"] <= 30.0)[0][0])
    assert m["test_loss"].max() > 30  # the event did not hold throughout
    want = max(first + 2, int(np.nonzero((m["step"] >= 200) & (m["test_loss"] <= 30))[0][0]))
    assert len(m["step"]) == want + 1 and m["step"][-1] < 3000
    assert Trajectory(full).status.startswith("completed: stopped 2 evaluations after test loss <= 30")
    # interrupted after the event (the accuracy threshold 0.95 is never reached here)
    assert not np.any(m["test_acc"] >= 0.95)
    part = tmp_path / "part.h5"
    train_interrupted(tiny_config(**cfg), part, at_step=int(m["step"][first]) + 5)
    resume(part, progress=False)
    r = Trajectory(part).metrics
    assert r["step"].tolist() == m["step"].tolist()
    assert np.array_equal(r["test_loss"], m["test_loss"])


def test_existing_output_is_refused_and_kept(tmp_path):
    path = tmp_path / "keep.h5"
    path.write_bytes(b"precious")
    with pytest.raises(BadInput, match="already exists"):
        train(tiny_config(), path, progress=False)
    assert path.read_bytes() == b"precious"
    with pytest.raises(BadInput, match="does not exist"):
        train(tiny_config(), tmp_path / "missing-dir" / "r.h5", progress=False)


# test accuracy planted at each evaluation (every 10 steps): grokked at step 20 (3 evaluations in a
# row >= 0.95), then a collapse at 60-70 (4 evaluations after grokking, where the rule used to stop)
DIP = {0: 0.1, 10: 0.5, 20: 0.96, 30: 0.97, 40: 0.98, 50: 0.99, 60: 0.70, 70: 0.45, 80: 0.97, 90: 0.99}
NO_DIP = {**DIP, 60: 0.99, 70: 0.99}


def _planted(accuracy: dict[int, float]):
    """SingleRun.evaluate with the real row's test accuracy replaced by accuracy[step]."""
    from groklens.trainers.single import SingleRun

    real = SingleRun.evaluate

    def evaluate(self, step):
        return [{**row, "test_acc": accuracy.get(step, 0.99)} for row in real(self, step)]

    return SingleRun, "evaluate", evaluate


@pytest.mark.parametrize("accuracy, stop", [(DIP, 80), (NO_DIP, 60)])
def test_the_stop_rule_stops_only_at_an_evaluation_at_the_threshold(tmp_path, monkeypatch, accuracy, stop):
    """A run that grokked and then collapsed was stopped in the collapse (issue 43: test accuracy
    0.768 at its last step), so its every "at end" reading was of the collapse. After the wait the
    rule stops at the first evaluation back at the threshold; a run that never dips stops as before."""
    from tests.helpers import train_interrupted

    cfg = dict(steps=300, eval_every=10, checkpoint_every=35, stop_after_grok=4)
    monkeypatch.setattr(*_planted(accuracy))
    full = tmp_path / "full.h5"
    train_tiny(full, **cfg)
    run = Trajectory(full)
    assert run.metrics["step"][-1] == run.steps[-1] == stop
    assert run.metrics["test_acc"][-1] >= 0.95
    assert run.status.startswith("completed: stopped 4 evaluations after grokking")
    assert ("(6 evaluations after it: the first then with test accuracy >= 0.95)" in run.status) == (stop == 80)
    # interrupted 5 steps before the stop (with the dip: after the checkpoint at 70, in the collapse,
    # so the counters come back from rows that end below the threshold), resumed: the same rows,
    # weights and stop
    part = tmp_path / "part.h5"
    train_interrupted(tiny_config(**cfg), part, at_step=stop - 5)
    resume(part, progress=False)
    again = Trajectory(part)
    assert again.metrics["step"].tolist() == run.metrics["step"].tolist() and again.status == run.status
    for key in ("test_acc", "train_loss", "test_loss"):
        assert np.array_equal(again.metrics[key], run.metrics[key])
    assert list(again.steps) == list(run.steps)
    for name, value in run.params(stop).items():
        assert torch.equal(value, again.params(stop)[name])


@pytest.mark.parametrize("accuracy", [DIP, NO_DIP])
@pytest.mark.parametrize("at_event", [True, False])
@pytest.mark.parametrize("evals, after", [(1, 4), (3, 4), (3, 1)])
def test_stop_rule_index_reads_a_whole_log_where_training_stops(tmp_path, monkeypatch, accuracy, at_event, evals,
                                                                 after):
    """analyses.grokking.stop_rule_index (how the peer rows read another code's whole log) against
    the engine: a run trained with the stop rule ends at the evaluation the function finds on the
    log of a run trained to its cap (after 4: in DIP's dip at 60 with stop_at_event false, after it
    with true; after 1 at grok_evals 3: where grokking is first known, 2 evaluations after its step)."""
    from groklens.analyses.grokking import stop_rule_index

    monkeypatch.setattr(*_planted(accuracy))
    stopped, whole = tmp_path / "stopped.h5", tmp_path / "whole.h5"
    train_tiny(stopped, steps=300, eval_every=10, checkpoint_every=35, grok_evals=evals, stop_after_grok=after,
               stop_at_event=at_event)
    train_tiny(whole, steps=300, eval_every=10, checkpoint_every=35, grok_evals=evals)
    log = Trajectory(whole).metrics
    assert log["step"][-1] == 300
    end = stop_rule_index(log["test_acc"], 0.95, evals, after, at_event)
    assert end is not None and log["step"][end] == Trajectory(stopped).metrics["step"][-1]
    if accuracy is DIP and after == 4:
        assert log["step"][end] == (80 if at_event else 60)


def test_stop_at_event_false_is_the_rule_the_ledgers_were_recorded_under(tmp_path, monkeypatch):
    """stop_at_event=false (the experiments' setting, EXPERIMENT_DEFAULTS): the run stops
    stop_after_grok evaluations after grokking whatever that evaluation reads, in the dip at 60,
    as before the field; the field at its legacy value leaves the config hash unchanged."""
    assert EXPERIMENT_DEFAULTS["stop_at_event"] is False
    monkeypatch.setattr(*_planted(DIP))
    path = tmp_path / "old_rule.h5"
    train_tiny(path, steps=300, eval_every=10, checkpoint_every=35, stop_after_grok=4, stop_at_event=False)
    run = Trajectory(path)
    assert run.metrics["step"][-1] == 60 and run.metrics["test_acc"][-1] == pytest.approx(0.70)
    new = tiny_config().to_dict()
    old = {k: v for k, v in new.items() if k != "stop_at_event"}  # a config from before the field
    assert config_hash({**new, "stop_at_event": False}) == config_hash(old)
    assert config_hash({**new, "stop_at_event": True}) != config_hash(old)

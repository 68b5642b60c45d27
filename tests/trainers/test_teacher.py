"""The teacher-student task and its models (groklens/tasks.py, models/teacher.py): the
perceptron's generalization error against its closed form arccos(R)/pi, the committee machine
against a re-typing of its forward and backward and against students whose error is known
exactly, and the perceptron criterion against a re-typing of the perceptron rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from groklens.checkpoints import Trajectory
from groklens.config import RunConfig
from groklens.tasks import TASKS, teacher_student
from groklens.models.losses import LOSSES
from groklens.models import build_model
from groklens.trainers.single import SingleRun
from groklens.trainers.train import train
from tests.helpers import assert_train_refused

TEACHER = dict(task="teacher", teacher_dim=40, teacher_alpha=2.0, teacher_test=20_000, lr=1e-2, weight_decay=0.0,
               steps=200, eval_every=50, checkpoint_every=100, device="cpu")


def _cfg(**overrides) -> RunConfig:
    return RunConfig.from_dict({**TEACHER, "model": "perceptron", **overrides})


def _within(measured: float, expected: float, n: int, k: float = 4.0) -> bool:
    """|measured - expected| within k binomial standard errors of a share of n examples."""
    se = math.sqrt(max(expected * (1 - expected), 1e-4) / n)
    return abs(measured - expected) <= k * se


def _errors(cfg: RunConfig, weight: torch.Tensor) -> tuple[float, float]:
    """(train, test) error of the configured model with W set to `weight`, by the trainer's evaluation."""
    run = SingleRun(cfg, TASKS.get("teacher").build(cfg))
    with torch.no_grad():
        run.model.W.copy_(weight)
    row = run.evaluate(0)[0]
    return 1 - row["train_acc"], 1 - row["test_acc"]


# ---------------------------------------------------------------------- the task
def test_teacher_task_labels_split_and_vocabulary():
    cfg = _cfg(teacher_hidden=3, data_seed=5)
    data = TASKS.get("teacher").build(cfg)
    x, b, _ = teacher_student(cfg)
    n_train, n = 80, 80 + 20_000  # round(alpha N) training examples, then the test examples
    assert x.shape == (n, 40) and b.shape == (3, 40)
    assert data.inputs.shape == (n, 2) and data.readout_pos == 1 and (data.d_vocab, data.d_vocab_out) == (n + 1, 2)
    assert np.array_equal(data.inputs[:, 0].numpy(), np.arange(n)) and bool((data.inputs[:, 1] == n).all())
    assert np.array_equal(data.train_idx.numpy(), np.arange(n_train))
    assert np.array_equal(data.test_idx.numpy(), np.arange(n_train, n))
    # labels: the teacher committee's majority of signs, computed here from the table and the teacher
    fields = x.numpy().astype(np.float64) @ b.T
    assert np.array_equal(data.labels.numpy(), (np.sign(fields).sum(1) > 0).astype(np.int64))
    assert 0.4 < data.labels.double().mean() < 0.6  # a random teacher splits the Gaussian inputs in halves
    other = TASKS.get("teacher").build(cfg.replace(data_seed=6))
    assert not np.array_equal(other.labels.numpy(), data.labels.numpy())  # each data_seed its own teacher


@pytest.mark.parametrize("flags, message", [
    (["--task", "teacher"], "needs model=perceptron or committee"),
    (["--model", "perceptron"], "needs task=teacher"),
    (["--task", "teacher", "--model", "committee", "--d-mlp", "4"], "odd number of hidden units"),
    (["--task", "teacher", "--model", "perceptron", "--teacher-hidden", "2"], "teacher_hidden must be odd"),
    (["--task", "teacher", "--model", "perceptron", "--teacher-alpha", "0.001"], "rounds to no training example"),
    (["--elastic-gamma", "0.5"], "needs routing_copies > 1"),
    (["--routing-copies", "2", "--elastic-gamma", "-1"], "elastic_gamma must be a number >= 0"),
])
def test_bad_teacher_and_elastic_options_are_one_line_errors(tmp_path, flags, message):
    assert_train_refused(tmp_path, flags, message)


# ---------------------------------------------------------------------- the perceptron: closed form
@pytest.mark.parametrize("theta", [0.3, 1.0, 2.0])
def test_perceptron_at_angle_theta_errs_theta_over_pi(theta):
    """A student at angle theta to the teacher (overlap R = cos theta) has generalization error
    arccos(R) / pi = theta / pi: the trainer's test error on 20,000 fresh examples, within 4 s.e."""
    cfg = _cfg(data_seed=3)
    _, b, _ = teacher_student(cfg)
    b = b[0] / np.linalg.norm(b[0])
    u = np.random.default_rng(0).standard_normal(b.shape)
    u -= (u @ b) * b
    u /= np.linalg.norm(u)
    w = math.cos(theta) * b + math.sin(theta) * u
    _, test = _errors(cfg, torch.tensor(7.0 * w, dtype=torch.float32)[:, None])  # the scale does not matter
    assert _within(test, theta / math.pi, cfg.teacher_test), (test, theta / math.pi)


def test_trained_perceptron_matches_arccos_overlap(tmp_path):
    """A perceptron trained through the real trainer (Rosenblatt's criterion): its logged test error
    equals arccos(R) / pi of its stored weights within sampling error, at the start and the end."""
    cfg = _cfg(loss="perceptron", data_seed=4, steps=300)
    path = tmp_path / "p.h5"
    train(cfg, path, progress=False)
    run = Trajectory(path)
    b = teacher_student(cfg)[1][0]
    overlaps = []
    for i, step in ((0, 0), (-1, int(run.steps[-1]))):
        w = run.params(step)["W"].double().numpy()[:, 0]
        r = float(w @ b / (np.linalg.norm(w) * np.linalg.norm(b)))
        test_error = 1 - float(run.metrics["test_acc"][i])
        assert _within(test_error, math.acos(r) / math.pi, cfg.teacher_test), (step, test_error, math.acos(r) / math.pi)
        overlaps.append(r)
    # it learned: the training set (realizable) is fitted, the overlap rose from a random start's ~0
    assert run.metrics["train_acc"][-1] == 1.0 and abs(overlaps[0]) < 0.4 < overlaps[1]


# ---------------------------------------------------------------------- the committee machine
def test_committee_forward_and_straight_through_backward_match_a_retyping():
    cfg = _cfg(model="committee", d_mlp=5, teacher_hidden=3, data_seed=2, teacher_test=500)
    data = TASKS.get("teacher").build(cfg)
    model = build_model(cfg, data)
    x = teacher_student(cfg)[0].double().numpy()
    w = model.W.detach().double().numpy()  # [N, K]
    rows = data.inputs[:300]
    logits = model(rows)[:, 1]
    h = x[:300] @ w / math.sqrt(40)
    phi = np.sign(h).sum(1) / math.sqrt(5)
    assert np.allclose(logits[:, 1].detach().numpy(), phi, atol=1e-6) and bool((logits[:, 0] == 0).all())
    assert np.array_equal(logits.argmax(-1).numpy(), (phi > 0).astype(np.int64))  # the majority of the signs
    logits[:, 1].sum().backward()  # d phi / d W through sign'(h) := 1 where |h| <= 1
    grad = x[:300].T @ (np.abs(h) <= 1).astype(np.float64) / math.sqrt(40) / math.sqrt(5)
    assert np.allclose(model.W.grad.double().numpy(), grad, rtol=1e-4, atol=1e-5)


def test_rows_held_between_steps_follow_the_tokens_and_the_hooks():
    """The rows kept for full-batch training (TeacherStudent._rows) never go stale: a token tensor
    edited in place, another tensor, and a hook that edits the rows in place each give the fields
    computed from the table afresh."""
    cfg = _cfg(model="committee", d_mlp=3, teacher_hidden=3, data_seed=2, teacher_test=500)
    data = TASKS.get("teacher").build(cfg)
    model = build_model(cfg, data)
    x = teacher_student(cfg)[0]

    def expected(tokens):
        return torch.sign(x[tokens[:, 0]] @ model.W.detach() / math.sqrt(40)).sum(1) / math.sqrt(3)

    tokens = data.inputs[:200].clone()
    for _ in range(2):  # the second call reads the held rows
        assert torch.allclose(model(tokens)[:, 1, 1].detach(), expected(tokens))
    tokens[:, 0] = tokens[:, 0].flip(0)  # in place: the held rows are stale
    assert torch.allclose(model(tokens)[:, 1, 1].detach(), expected(tokens))
    other = data.inputs[200:400]
    assert torch.allclose(model(other)[:, 1, 1].detach(), expected(other))

    def negate(act, hook):
        act.neg_()  # edits the rows in place: they must not be kept for the next call
        return act

    flipped = model.run_with_hooks(other, fwd_hooks=[("hook_input", negate)])[:, 1, 1].detach()
    assert torch.allclose(flipped, -expected(other))
    assert torch.allclose(model(other)[:, 1, 1].detach(), expected(other))


def test_committee_students_of_known_error():
    """Exact generalization errors: the teacher itself (0), its hidden units in another order (0:
    the committee is symmetric in them), the teacher with every weight negated (1: each sign flips,
    so the majority does)."""
    cfg = _cfg(model="committee", d_mlp=3, teacher_hidden=3, data_seed=8, teacher_test=5000)
    b = torch.tensor(teacher_student(cfg)[1].T, dtype=torch.float32)  # [N, K]
    for weight, expected in ((b, 0.0), (b[:, [2, 0, 1]] * 3.0, 0.0), (-b, 1.0)):
        train_error, test_error = _errors(cfg, weight)
        assert train_error == test_error == expected


# ---------------------------------------------------------------------- the perceptron criterion
def test_perceptron_criterion_is_the_perceptron_rule():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 4, generator=gen)
    labels = torch.randint(0, 4, (50,), generator=gen)
    own = logits[torch.arange(50), labels]
    other = torch.stack([torch.cat([row[:y], row[y + 1:]]).max() for row, y in zip(logits, labels)])
    assert torch.allclose(LOSSES.get("perceptron")(logits, labels, reduction="none"),
                          (other - own).clamp(min=0).double())
    # two classes, logits (0, h): the gradient of the mean criterion is the batch perceptron rule,
    # -mean over the examples of [misclassified] y x / sqrt(N), y = +-1
    cfg = _cfg(data_seed=1)
    data = TASKS.get("teacher").build(cfg)
    model = build_model(cfg, data)
    rows = data.train_idx
    LOSSES.get("perceptron")(model(data.inputs[rows])[:, 1], data.labels[rows]).backward()
    x = teacher_student(cfg)[0][rows].double()
    y = data.labels[rows].double() * 2 - 1
    h = x @ model.W.detach().double()[:, 0] / math.sqrt(40)
    wrong = (y * h <= 0).double()
    rule = -(wrong * y) @ x / math.sqrt(40) / len(rows)
    assert 0 < wrong.sum() < len(rows)
    assert torch.allclose(model.W.grad.double()[:, 0], rule, rtol=1e-5, atol=1e-7)

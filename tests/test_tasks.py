import numpy as np
import pytest

from groklens.config import RunConfig
from groklens.errors import BadInput
from groklens.tasks import S5, TASKS, draw_split, is_prime


@pytest.mark.parametrize(
    "task,fn",
    [
        ("add", lambda a, b, p: (a + b) % p),
        ("sub", lambda a, b, p: (a - b) % p),
        ("mul", lambda a, b, p: (a * b) % p),
        ("x2y2", lambda a, b, p: (a * a + b * b) % p),
    ],
)
def test_modular_tasks_enumerate_every_pair_with_correct_labels(task, fn):
    p = 7
    data = TASKS.get(task).build(RunConfig(task=task, p=p))
    assert data.inputs.shape == (p * p, 3) and data.d_vocab == p + 1 and data.d_vocab_out == p
    for (a, b, eq), y in zip(data.inputs.tolist(), data.labels.tolist()):
        assert eq == p and y == fn(a, b, p)
    assert data.readout_pos == 2
    assert data.informative_mask[:, :2].all() and not data.informative_mask[:, 2].any()


def test_division_excludes_zero_and_inverts():
    p = 11
    data = TASKS.get("div").build(RunConfig(task="div", p=p))
    assert len(data.labels) == p * (p - 1)
    for (a, b, _), y in zip(data.inputs.tolist(), data.labels.tolist()):
        assert b != 0 and (y * b) % p == a  # y = a / b  <=>  y * b = a


def test_division_needs_prime_and_p_at_least_3():
    with pytest.raises(BadInput, match="prime"):
        RunConfig(task="div", p=15).validate()
    with pytest.raises(BadInput, match="p must be >= 3"):
        RunConfig(task="add", p=2).validate()
    assert [n for n in range(20) if is_prime(n)] == [2, 3, 5, 7, 11, 13, 17, 19]


def test_s5_composition_is_a_group_table():
    data = TASKS.get("s5").build(RunConfig(task="s5"))
    assert data.inputs.shape == (120 * 120, 3) and data.d_vocab == 121 and data.d_vocab_out == 120
    labels = data.labels.numpy().reshape(120, 120)
    identity = S5.index((0, 1, 2, 3, 4))
    assert (labels[identity] == np.arange(120)).all() and (labels[:, identity] == np.arange(120)).all()
    # every row and column is a permutation (Latin square), and composition applies t first
    assert all(len(set(row)) == 120 for row in labels)
    s, t = 5, 77
    composed = tuple(S5[s][S5[t][i]] for i in range(5))
    assert labels[s, t] == S5.index(composed)


def test_split_depends_on_data_seed_only():
    a_train, a_test = draw_split(100, 0.3, data_seed=1)
    b_train, _ = draw_split(100, 0.3, data_seed=1)
    c_train, _ = draw_split(100, 0.3, data_seed=2)
    assert len(a_train) == 30 and len(a_test) == 70
    assert set(a_train).isdisjoint(a_test) and set(a_train) | set(a_test) == set(range(100))
    assert (a_train == b_train).all() and not (a_train == c_train).all()
    d1 = TASKS.get("add").build(RunConfig(p=7, seed=1))
    d2 = TASKS.get("add").build(RunConfig(p=7, seed=2))
    assert (d1.train_idx == d2.train_idx).all()  # model seed does not move the split


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5])
def test_train_fraction_must_be_inside_unit_interval(bad):
    with pytest.raises(BadInput, match="train_frac"):
        RunConfig(train_frac=bad).validate()


def test_unknown_task_is_bad_input():
    with pytest.raises(BadInput, match="unknown task"):
        RunConfig(task="nope").validate()


def _sphere_paper_make_dataset(p, frac_train, seed):
    """The bounded-sphere paper's make_dataset (AlperYildirim1/geometric-grokking,
    Final_Modular_No_Decay.ipynb, cell 1), re-typed: the pairs it trains and tests on."""
    import random

    rng = random.Random(seed)
    all_pairs = [(a, b) for a in range(p) for b in range(p)]
    rng.shuffle(all_pairs)
    n_train = int(len(all_pairs) * frac_train)
    return all_pairs[:n_train], all_pairs[n_train:]


@pytest.mark.parametrize("seed", [1, 2, 42])
def test_the_python_shuffle_split_is_the_sphere_papers(seed):
    from groklens.config import RunConfig

    cfg = RunConfig.from_dict({"task": "add", "p": 13, "train_frac": 0.3, "data_seed": seed,
                               "split_rule": "python_shuffle", "device": "cpu"})
    data = TASKS.get("add").build(cfg)
    train, test = _sphere_paper_make_dataset(13, 0.3, seed)
    pairs = lambda idx: {(int(a), int(b)) for a, b, _ in data.inputs[idx].tolist()}  # noqa: E731
    assert pairs(data.train_idx) == set(train) and pairs(data.test_idx) == set(test)
    assert len(data.train_idx) == int(169 * 0.3) == 50  # int(), not round(): 50.7 -> 50
    # pcg64 (the default) is another split of the same size up to rounding
    default = TASKS.get("add").build(cfg.replace(split_rule="pcg64"))
    assert len(default.train_idx) == 51 and pairs(default.train_idx) != set(train)


# small settings of every task's knobs; a task trains on those its validate accepts
SMALL = [dict(p=7), dict(p=7, op_token=True), dict(p=7, nonzero_b=True), dict(p=5, n_digits=1),
         dict(p=5, seq_len=4, n_informative=2), dict(p=5, seq_len=3, n_informative=3, distractor_vocab=2),
         dict(model="perceptron", teacher_dim=6, teacher_alpha=1.5, teacher_test=10)]


@pytest.mark.parametrize("task", TASKS.names())
def test_every_task_declares_the_shape_of_the_data_it_builds(task):
    """A task's `shape` (from the config alone: what a stored run's /data must hold, and the memory
    estimate's size) against the arrays it builds, for every small setting it accepts."""
    from groklens.checkpoints.validate import data_shape

    checked = 0
    for extra in SMALL:
        try:
            cfg = RunConfig(task=task, **extra)
            cfg.validate()
        except BadInput:
            continue
        arrays = TASKS.get(task).arrays(cfg)
        inputs, labels = arrays["inputs"], arrays["labels"]
        assert TASKS.get(task).shape(cfg) == data_shape(cfg) == (
            inputs.shape[0], inputs.shape[1], labels.shape[1] if labels.ndim == 2 else 0), (task, extra)
        checked += 1
    assert checked, f"task {task} accepts none of the small settings: give it one in SMALL"

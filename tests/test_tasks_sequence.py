"""digits_add and the informative-token sequence tasks, checked by decoding every input here."""

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from groklens.checkpoints import Trajectory
from groklens.config import PRESETS, RunConfig
from groklens.errors import BadInput
from groklens.trainers.train import train
from groklens.tasks import TASKS


def _data(**kw):
    cfg = RunConfig.from_dict(kw)
    return cfg, TASKS.get(cfg.task).build(cfg)


# ---------------------------------------------------------------------- digits_add
@pytest.mark.parametrize("n", [1, 2])
def test_digits_add_is_every_sum_written_out_character_by_character(n):
    _, data = _data(task="digits_add", n_digits=n)
    chars = "0123456789+="
    assert data.inputs.shape == (10 ** (2 * n), 3 * n + 2) and data.labels.shape == (10 ** (2 * n), n + 1)
    assert (data.d_vocab, data.d_vocab_out, data.readout_pos) == (12, 10, 2 * n + 1)
    seen = set()
    for row, label in zip(data.inputs.tolist(), data.labels.tolist()):
        text = "".join(chars[t] for t in row)
        a, b = int(text[:n]), int(text[n + 1 : 2 * n + 1])
        full = f"{a:0{n}d}+{b:0{n}d}={a + b:0{n + 1}d}"
        assert text == full[:-1]  # the input stops before the last answer digit
        assert "".join(map(str, label)) == full[2 * n + 2 :]  # the labels are the answer digits
        seen.add((a, b))
    assert len(seen) == 10 ** (2 * n)
    # teacher forcing: the label read at readout_pos + i is the input token at readout_pos + i + 1
    k = n + 1
    assert torch.equal(data.labels[:, : k - 1], data.inputs[:, data.readout_pos + 1 :])
    mask = data.informative_mask
    assert mask[:, :n].all() and mask[:, n + 1 : 2 * n + 1].all() and mask.sum(1).eq(2 * n).all()


def test_digits_add_loss_and_accuracy_are_on_the_answer_tokens_only(tmp_path):
    cfg = RunConfig.from_dict({**PRESETS["nanogpt_tiny"], "n_digits": 1, "train_frac": 0.5, "steps": 30,
                               "eval_every": 10, "checkpoint_every": 30, "device": "cpu"})
    train(cfg, tmp_path / "d.h5", progress=False)
    run = Trajectory(tmp_path / "d.h5")
    data, m = run.dataset(), run.metrics
    with torch.no_grad():
        logits = run.model(30)(data.inputs)  # [N, 5, 10]
    r = data.readout_pos
    nll, hits = [], []
    for i in range(len(data.labels)):
        answer = logits[i, r : r + 2].double()  # the two answer positions and nothing else
        nll.append(float(F.cross_entropy(answer, data.labels[i])))
        hits.append(bool((answer.argmax(-1) == data.labels[i]).all()))
    train_idx, test_idx = data.train_idx.tolist(), data.test_idx.tolist()
    assert np.mean([nll[i] for i in train_idx]) == pytest.approx(m["train_loss"][-1], rel=1e-6)
    assert np.mean([hits[i] for i in test_idx]) == pytest.approx(m["test_acc"][-1], abs=1e-12)
    token = (logits[:, r : r + 2].argmax(-1) == data.labels).double().mean(1)
    assert float(token[data.test_idx].mean()) == pytest.approx(m["test_token_acc"][-1], abs=1e-12)


def test_digits_add_refuses_bidirectional_attention_and_too_many_digits():
    with pytest.raises(BadInput, match="causal"):
        RunConfig.from_dict({"task": "digits_add", "causal": False})
    with pytest.raises(BadInput, match="n_digits"):
        RunConfig.from_dict({"task": "digits_add", "n_digits": 4})


def test_digits_pairs_is_a_sample_of_the_sums_drawn_from_data_seed(tmp_path):
    """digits_pairs: that many distinct operand pairs, each written out as every pair is, the same
    sample for the same data_seed (another for another), split by train_frac; a run on it is a
    valid trajectory file (its data shape is the sample's)."""
    cfg, data = _data(task="digits_add", n_digits=3, digits_pairs=500, train_frac=0.2)
    _, full = _data(task="digits_add", n_digits=3)
    rows = {tuple(r) for r in full.inputs.tolist()}
    assert data.inputs.shape == (500, 11) and data.labels.shape == (500, 4)
    assert all(tuple(r) in rows for r in data.inputs.tolist())  # every row a true sum (labels follow)
    pairs = [tuple(r[:3] + r[4:7]) for r in data.inputs.tolist()]
    assert len(set(pairs)) == 500 and pairs == sorted(pairs)  # distinct, in the grid's order
    index = {tuple(r): i for i, r in enumerate(full.inputs.tolist())}
    assert all(torch.equal(full.labels[index[tuple(r)]], y) for r, y in zip(data.inputs.tolist(), data.labels))
    assert torch.equal(_data(task="digits_add", digits_pairs=500, train_frac=0.2)[1].inputs, data.inputs)
    assert not torch.equal(_data(task="digits_add", digits_pairs=500, train_frac=0.2, data_seed=1)[1].inputs,
                           data.inputs)
    assert (len(data.train_idx), len(data.test_idx)) == (100, 400)
    small = {**PRESETS["nanogpt_tiny"], "n_digits": 1, "digits_pairs": 60, "train_frac": 0.5, "steps": 10,
             "eval_every": 10, "checkpoint_every": 10, "device": "cpu"}
    train(RunConfig.from_dict(small), tmp_path / "s.h5", progress=False)
    assert Trajectory(tmp_path / "s.h5").dataset().inputs.shape == (60, 5)


def test_digits_pairs_refuses_more_pairs_than_exist_and_other_tasks():
    with pytest.raises(BadInput, match="digits_pairs must be 0 .* at most the 100 pairs"):
        RunConfig.from_dict({"task": "digits_add", "n_digits": 1, "digits_pairs": 101})
    with pytest.raises(BadInput, match="digits_pairs must be 0"):
        RunConfig.from_dict({"task": "digits_add", "digits_pairs": -1})
    with pytest.raises(BadInput, match="digits_pairs is an option of task digits_add"):
        RunConfig.from_dict({"task": "add", "digits_pairs": 10})


# ---------------------------------------------------------------------- informative-token sequences
@pytest.mark.parametrize("layout,expected", [("first", [0, 1, 2]), ("last", [4, 5, 6]), ("spread", [0, 3, 6])])
def test_fixed_layouts_put_the_informative_tokens_where_they_say(layout, expected):
    p, L, k = 5, 7, 3
    _, data = _data(task="seq_add", p=p, seq_len=L, n_informative=k, informative_layout=layout)
    assert data.inputs.shape == (p**k, L + 1) and data.readout_pos == L
    assert (data.d_vocab, data.d_vocab_out) == (p + 1, p)
    assert (data.inputs[:, L] == p).all()  # the `=` token
    for row, label, mask in zip(data.inputs.tolist(), data.labels.tolist(), data.informative_mask.tolist()):
        assert [j for j, m in enumerate(mask) if m] == expected
        assert label == sum(row[j] for j in expected) % p
        assert all(0 <= t < p for t in row[:L])  # distractor_vocab = 0: distractors are residues
    # every tuple of informative values appears exactly once
    values = {tuple(row[j] for j in expected) for row in data.inputs.tolist()}
    assert values == set(itertools.product(range(p), repeat=k))


def test_random_layout_marks_informative_positions_per_input_and_uses_separate_distractors():
    p, L, k, D = 7, 6, 2, 4
    _, data = _data(task="seq_mul", p=p, seq_len=L, n_informative=k, informative_layout="random",
                    distractor_vocab=D)
    assert (data.d_vocab, data.d_vocab_out) == (p + D + 1, p)
    layouts = set()
    for row, label, mask in zip(data.inputs.tolist(), data.labels.tolist(), data.informative_mask.tolist()):
        where = [j for j, m in enumerate(mask) if m]
        assert len(where) == k and row[L] == p + D
        assert all(row[j] < p for j in where)  # the values
        assert all(p <= row[j] < p + D for j in range(L) if j not in where)  # distractors, told apart by token
        assert label == (row[where[0]] * row[where[1]]) % p
        layouts.add(tuple(where))
    assert len(layouts) > 5  # the positions move from input to input


def test_seq_add_with_no_distractors_is_the_modular_addition_task():
    _, seq = _data(task="seq_add", p=11, seq_len=2, n_informative=2)
    _, add = _data(task="add", p=11)
    assert torch.equal(seq.inputs, add.inputs) and torch.equal(seq.labels, add.labels)
    assert torch.equal(seq.informative_mask, add.informative_mask) and seq.readout_pos == add.readout_pos
    assert torch.equal(seq.train_idx, add.train_idx)


def test_sequences_depend_on_data_seed_only():
    kw = dict(task="seq_add", p=5, seq_len=6, n_informative=2, informative_layout="random", distractor_vocab=2)
    _, a = _data(**kw, data_seed=1, seed=1)
    _, b = _data(**kw, data_seed=1, seed=2)
    _, c = _data(**kw, data_seed=2)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.informative_mask, b.informative_mask)
    assert not torch.equal(a.inputs, c.inputs)


@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(n_informative=9, seq_len=8), "n_informative"),
        (dict(n_informative=0), "n_informative"),
        (dict(seq_len=0), "seq_len"),
        (dict(informative_layout="random"), "distractor_vocab > 0"),
        (dict(informative_layout="middle"), "informative_layout must be one of"),
        (dict(distractor_vocab=-1), "distractor_vocab"),
        (dict(p=200, n_informative=3), "inputs is over"),
    ],
)
def test_bad_sequence_knobs_are_bad_input(overrides, match):
    with pytest.raises(BadInput, match=match):
        RunConfig.from_dict({"task": "seq_add", **overrides})


@pytest.mark.timeout(20)
def test_a_huge_n_informative_is_refused_at_once():
    """The size check built p ** n_informative as an integer: 77 s for n_informative 1e8
    (minutes for 1e9); from logarithms it answers at once."""
    import time

    start = time.perf_counter()
    for k in (10**8, 10**9):
        with pytest.raises(BadInput, match="inputs is over"):
            RunConfig.from_dict({"task": "seq_add", "seq_len": k, "n_informative": k})
    assert time.perf_counter() - start < 2
    RunConfig.from_dict({"task": "seq_add", "p": 11, "seq_len": 6, "n_informative": 6})  # 11^6 = 1,771,561: fits

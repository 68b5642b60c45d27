"""Algorithmic tasks. A task turns a RunConfig into the full input grid, labels, the readout
position and the mask of informative positions; the train/test split comes from `data_seed`.

Modular tasks use tokens [a, b, =] with vocabulary p + 1 (`=` is token p) and p output classes
(Power et al. 2022; Nanda et al. 2023). S5 composition uses [s, t, =] over the 120
permutations of 5 elements (vocabulary 121, 120 classes).

Three further families (docs/VARIANTS.md):
- `digits_add`: character-level n-digit addition `abc+def=ghij` for a causal LM (every pair of
  operands, or a sample of `digits_pairs` of them). Its labels
  are [N, n_digits + 1] (the answer digits) read out at positions readout_pos .. readout_pos +
  n_digits: a multi-target task (loss and accuracy on the answer tokens only).
- `seq_add`, `seq_mul`: informative-token sequences of length L in which only k positions
  determine the label (their sum / product mod p), with distractor tokens elsewhere and the
  informative positions recorded per input.
- `teacher`: teacher-student data for the perceptron and committee machine: Gaussian input
  vectors labelled by a random sign teacher. An input is its example id (then `=`); its vector
  is that row of a fixed Gaussian table (`teacher_student`) which the models read.
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from groklens.errors import BadInput
from groklens.registry import Registry

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from groklens.config import RunConfig


@dataclass
class TaskData:
    """Every input of a task, with its split. Tensors are CPU LongTensors / BoolTensors."""

    inputs: "torch.Tensor"  # [N, n_ctx] token ids
    labels: "torch.Tensor"  # [N] class ids; [N, K] for multi-target tasks (K readout positions)
    train_idx: "torch.Tensor"  # [n_train] indices into inputs
    test_idx: "torch.Tensor"  # [n_test]
    readout_pos: int  # position whose logits are the prediction
    informative_mask: "torch.Tensor"  # [N, n_ctx] bool: positions that determine the label
    d_vocab: int
    d_vocab_out: int

    @property
    def n_ctx(self) -> int:
        return int(self.inputs.shape[1])

    @property
    def n_targets(self) -> int:
        """0 for single-target tasks (labels [N]); K for labels [N, K] read at K positions."""
        return 0 if self.labels.dim() == 1 else int(self.labels.shape[1])

    @property
    def readout_positions(self) -> list[int]:
        """The positions whose logits are predictions: [readout_pos], or readout_pos .. +K-1."""
        return [self.readout_pos + i for i in range(max(self.n_targets, 1))]


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    # -> (inputs [N, n_ctx], labels [N] or [N, K]) or, with a per-input informative mask,
    #    (inputs, labels, mask [N, n_ctx] bool)
    grid: Callable[["RunConfig"], tuple[np.ndarray, ...]]
    vocab: Callable[["RunConfig"], tuple[int, int]]  # -> (d_vocab, d_vocab_out)
    validate: Callable[["RunConfig"], None]
    readout_pos: int = 2
    informative: tuple[int, ...] = (0, 1)  # used when `grid` gives no mask
    readout: Callable[["RunConfig"], int] | None = None  # overrides readout_pos when it depends on cfg
    multi_target: bool = False  # labels [N, K], read out at K consecutive positions
    residue_tokens: bool = False  # token ids 0..p-1 are the residues mod p (init=fourier needs it)
    # -> (inputs, positions per input, answer positions: 0 for labels [N]) from the config alone,
    # without building the grid: what a stored run's /data must hold (checkpoints/validate.py) and
    # the memory estimate's size. None: unknown (a file's data is then not compared)
    shape: Callable[["RunConfig"], tuple[int, int, int]] | None = None
    # -> bytes of data it holds beside its token ids and labels (teacher: its Gaussian vectors), for
    # the memory estimate made before a run starts; None: nothing more
    extra_memory: Callable[["RunConfig"], int] | None = None
    # (train_idx, test_idx) of cfg's n inputs, where the task fixes its split; None: drawn by train_frac (`draw_split`)
    split: Callable[["RunConfig", int], tuple[np.ndarray, np.ndarray]] | None = None

    def readout_position(self, cfg: "RunConfig") -> int:
        return self.readout(cfg) if self.readout is not None else self.readout_pos

    def arrays(self, cfg: "RunConfig") -> dict[str, np.ndarray]:
        """The task's data as numpy arrays under /data's names (inputs, labels, train_idx,
        test_idx, informative_mask): what a run of `cfg` trains on, and what its file must hold."""
        inputs, labels, *rest = self.grid(cfg)
        train_idx, test_idx = self.draw_split(cfg, len(labels))
        if rest:
            mask = np.asarray(rest[0], dtype=bool)
        else:
            mask = np.zeros(inputs.shape, dtype=bool)
            mask[:, list(self.informative)] = True
        return {"inputs": np.asarray(inputs), "labels": np.asarray(labels), "train_idx": train_idx,
                "test_idx": test_idx, "informative_mask": mask}

    def draw_split(self, cfg: "RunConfig", n: int) -> tuple[np.ndarray, np.ndarray]:
        """The (train, test) indices of cfg's n inputs: the task's own split, or `draw_split`'s."""
        if self.split is not None:
            return self.split(cfg, n)
        return draw_split(n, cfg.train_frac, cfg.data_seed, cfg.split_rule)

    def build(self, cfg: "RunConfig", split: tuple[np.ndarray, np.ndarray] | None = None) -> TaskData:
        """The task's data; `split` (train, test indices) overrides the one drawn from data_seed."""
        import torch

        a = self.arrays(cfg)
        inputs, labels, mask = a["inputs"], a["labels"], a["informative_mask"]
        train_idx, test_idx = split if split is not None else (a["train_idx"], a["test_idx"])
        d_vocab, d_vocab_out = self.vocab(cfg)
        return TaskData(
            inputs=torch.as_tensor(inputs, dtype=torch.long),
            labels=torch.as_tensor(labels, dtype=torch.long),
            train_idx=torch.as_tensor(np.asarray(train_idx), dtype=torch.long),
            test_idx=torch.as_tensor(np.asarray(test_idx), dtype=torch.long),
            readout_pos=self.readout_position(cfg),
            informative_mask=torch.as_tensor(mask),
            d_vocab=d_vocab,
            d_vocab_out=d_vocab_out,
        )


TASKS: Registry[Task] = Registry("task")


def draw_split(n: int, train_frac: float, data_seed: int, rule: str = "pcg64") -> tuple[np.ndarray, np.ndarray]:
    """A random split of range(n), reproducible from data_seed alone: `rule` pcg64 (numpy's PCG64
    permutation, round(train_frac n) training rows) or python_shuffle (the bounded-sphere paper's
    make_dataset, AlperYildirim1/geometric-grokking: random.Random(data_seed).shuffle of the
    inputs in their row-major order, the first int(train_frac n) for training). Sorted indices."""
    if rule == "python_shuffle":
        perm = list(range(n))
        random.Random(data_seed).shuffle(perm)
        perm, n_train = np.asarray(perm), int(n * train_frac)
    else:
        perm, n_train = np.random.default_rng(data_seed).permutation(n), int(round(train_frac * n))
    if not 0 < n_train < n:
        raise BadInput(f"train_frac {train_frac} of {n} examples leaves an empty train or test set")
    return np.sort(perm[:n_train]), np.sort(perm[n_train:])


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    return all(n % k for k in range(2, int(n**0.5) + 1))


# ---------------------------------------------------------------- modular arithmetic
def _modular(op: Callable[[np.ndarray, np.ndarray, int], np.ndarray], exclude_b_zero: bool = False):
    def grid(cfg: "RunConfig") -> tuple[np.ndarray, ...]:
        p = cfg.p
        a, b = np.meshgrid(np.arange(p), np.arange(p), indexing="ij")
        a, b = a.ravel(), b.ravel()
        if exclude_b_zero or cfg.nonzero_b:
            keep = b != 0
            a, b = a[keep], b[keep]
        eq = np.full_like(a, p)
        labels = op(a, b, p) % p
        if not cfg.op_token:
            return np.stack([a, b, eq], axis=1), labels
        # [a, op, b, =] (Power et al.; Grokfast's code): the operands at 0 and 2 decide the label
        inputs = np.stack([a, np.full_like(a, p + 1), b, eq], axis=1)
        mask = np.zeros(inputs.shape, dtype=bool)
        mask[:, [0, 2]] = True
        return inputs, labels, mask

    return grid


def _modular_vocab(cfg: "RunConfig") -> tuple[int, int]:
    # with the op token the output covers the whole vocabulary, as Grokfast's head (p+2 classes)
    return (cfg.p + 2, cfg.p + 2) if cfg.op_token else (cfg.p + 1, cfg.p)


def _modular_readout(cfg: "RunConfig") -> int:
    return 3 if cfg.op_token else 2


P_MAX = 1_000_000  # p^2 inputs; far past what fits memory (check_resources says so for smaller p)


def _check_p(cfg: "RunConfig", prime: bool = False) -> None:
    if cfg.p < 3:
        raise BadInput(f"p must be >= 3; got {cfg.p}")
    if cfg.p > P_MAX:
        raise BadInput(f"p must be at most {P_MAX:,}; got {cfg.p}")
    if prime and not is_prime(cfg.p):
        raise BadInput(f"task {cfg.task!r} needs a prime p (b^-1 mod p must exist); got p={cfg.p}")


def _inverse(b: np.ndarray, p: int) -> np.ndarray:
    return np.array([pow(int(x), p - 2, p) for x in b], dtype=np.int64)  # Fermat: p prime


def _modular_shape(cfg: "RunConfig", exclude_b_zero: bool) -> tuple[int, int, int]:
    n = cfg.p * (cfg.p - 1) if exclude_b_zero or cfg.nonzero_b else cfg.p * cfg.p
    return n, 4 if cfg.op_token else 3, 0  # [a, op, b, =] or [a, b, =]


MODULAR_TASKS = ("add", "sub", "mul", "div", "x2y2")  # the tasks that take op_token and nonzero_b
for _name, _op, _desc, _div in [
    ("add", lambda a, b, p: a + b, "(a + b) mod p", False),
    ("sub", lambda a, b, p: a - b, "(a - b) mod p", False),
    ("mul", lambda a, b, p: a * b, "(a * b) mod p", False),
    ("div", lambda a, b, p: a * _inverse(b, p), "(a * b^-1) mod p, b != 0", True),
    ("x2y2", lambda a, b, p: a * a + b * b, "(a^2 + b^2) mod p", False),
]:
    TASKS.register(_name)(
        Task(
            name=_name,
            description=_desc,
            grid=_modular(_op, exclude_b_zero=_div),
            vocab=_modular_vocab,
            validate=(lambda cfg, _d=_div: _check_p(cfg, prime=_d)),
            readout=_modular_readout,
            residue_tokens=True,
            shape=(lambda cfg, _d=_div: _modular_shape(cfg, exclude_b_zero=_d)),
        )
    )


# ---------------------------------------------------------------- S5 composition
S5 = [tuple(s) for s in itertools.permutations(range(5))]  # lexicographic order = token ids


def _s5_grid(cfg: "RunConfig") -> tuple[np.ndarray, np.ndarray]:
    index = {perm: i for i, perm in enumerate(S5)}
    n = len(S5)
    s, t = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    s, t = s.ravel(), t.ravel()
    # (s . t)(i) = s[t[i]]: apply t first, then s
    labels = np.array([index[tuple(S5[i][j] for j in S5[k])] for i, k in zip(s, t)], dtype=np.int64)
    return np.stack([s, t, np.full_like(s, n)], axis=1), labels


TASKS.register("s5")(
    Task(
        name="s5",
        description="composition s.t of permutations of 5 elements (120 classes)",
        grid=_s5_grid,
        vocab=lambda cfg: (len(S5) + 1, len(S5)),
        validate=lambda cfg: None,  # p is not used by S5
        shape=lambda cfg: (len(S5) ** 2, 3, 0),
    )
)


# ---------------------------------------------------------------- n-digit addition (causal LM)
DIGIT_PLUS, DIGIT_EQ = 10, 11  # token ids of '+' and '='; digits are their own ids 0..9


def _digits(x: np.ndarray, n: int) -> np.ndarray:
    """[N] integers -> [N, n] decimal digits, most significant first, zero-padded."""
    return np.stack([(x // 10 ** (n - 1 - i)) % 10 for i in range(n)], axis=1)


def _digits_grid(cfg: "RunConfig") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every pair of n-digit operands as `a+b=` followed by the first n answer digits.

    Teacher forcing: the input holds the answer digits but the last; the label at position
    2n+1 (`=`) is the first answer digit, ..., at the last position the last one. With a causal
    mask no position sees the digit it predicts.
    """
    n = cfg.n_digits
    a, b = np.meshgrid(np.arange(10**n), np.arange(10**n), indexing="ij")
    a, b = a.ravel(), b.ravel()
    if cfg.digits_pairs:  # a sample of the pairs, in row-major order; the split divides it
        keep = np.sort(np.random.default_rng([cfg.data_seed, 3]).choice(len(a), cfg.digits_pairs, replace=False))
        a, b = a[keep], b[keep]
    answer = _digits(a + b, n + 1)  # [N, n+1]: the sum has at most n+1 digits
    col = lambda v: np.full((len(a), 1), v, dtype=np.int64)  # noqa: E731
    inputs = np.concatenate([_digits(a, n), col(DIGIT_PLUS), _digits(b, n), col(DIGIT_EQ), answer[:, :n]], axis=1)
    mask = np.zeros(inputs.shape, dtype=bool)
    mask[:, :n] = True  # the operand digits determine the answer
    mask[:, n + 1 : 2 * n + 1] = True
    return inputs, answer, mask


def _check_digits(cfg: "RunConfig") -> None:
    if not 1 <= cfg.n_digits <= 3:
        raise BadInput(f"n_digits must be 1, 2 or 3 for task digits_add; got {cfg.n_digits}")
    if not 0 <= cfg.digits_pairs <= 10 ** (2 * cfg.n_digits):
        raise BadInput(f"digits_pairs must be 0 (every pair) or at most the {10 ** (2 * cfg.n_digits):,} pairs of "
                       f"{cfg.n_digits}-digit operands; got {cfg.digits_pairs}")
    if not cfg.causal:
        raise BadInput("task digits_add needs causal=true: its inputs hold the answer digits (teacher forcing)")
    if cfg.model != "transformer":
        raise BadInput("task digits_add is a language-modelling task: it needs model=transformer")


TASKS.register("digits_add")(
    Task(
        name="digits_add",
        description="character-level n-digit addition abc+def=ghij; loss and exact match on the answer digits",
        grid=_digits_grid,
        vocab=lambda cfg: (12, 10),  # digits, '+', '='; the answer classes are the 10 digits
        validate=_check_digits,
        readout=lambda cfg: 2 * cfg.n_digits + 1,
        multi_target=True,
        shape=lambda cfg: (cfg.digits_pairs or 10 ** (2 * cfg.n_digits), 3 * cfg.n_digits + 2, cfg.n_digits + 1),
    )
)


# ---------------------------------------------------------------- informative-token sequences
SEQ_LAYOUTS = ("first", "last", "spread", "random")
SEQ_MAX_INPUTS = 2_000_000


def _seq_positions(cfg: "RunConfig", rng: np.random.Generator, n: int) -> np.ndarray:
    """[n, k] sorted informative positions in 0..L-1 for each input."""
    L, k = cfg.seq_len, cfg.n_informative
    layout = cfg.informative_layout
    if layout == "first":
        fixed = np.arange(k)
    elif layout == "last":
        fixed = np.arange(L - k, L)
    elif layout == "spread":  # evenly spaced, both ends included
        fixed = np.floor(np.arange(k) * (L - 1) / max(k - 1, 1) + 0.5).astype(np.int64)
    else:  # random: k distinct positions per input
        return np.sort(np.argsort(rng.random((n, L)), axis=1)[:, :k], axis=1)
    return np.broadcast_to(fixed, (n, k)).copy()


def _seq_grid(op: str):
    def grid(cfg: "RunConfig") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        p, L, k, D = cfg.p, cfg.seq_len, cfg.n_informative, cfg.distractor_vocab
        # one input per tuple of informative values (x_1..x_k) in [0, p)^k, lexicographic
        values = np.stack(np.meshgrid(*[np.arange(p)] * k, indexing="ij"), axis=-1).reshape(-1, k)
        n = len(values)
        rng = np.random.default_rng([cfg.data_seed, 1])  # a stream apart from the split's
        positions = _seq_positions(cfg, rng, n)
        # distractors: separate tokens p..p+D-1, or (D = 0) residues that only position tells apart
        seq = (p + rng.integers(0, D, size=(n, L))) if D else rng.integers(0, p, size=(n, L))
        np.put_along_axis(seq, positions, values, axis=1)
        inputs = np.concatenate([seq, np.full((n, 1), p + D, dtype=np.int64)], axis=1)  # then '='
        mask = np.zeros(inputs.shape, dtype=bool)
        np.put_along_axis(mask, positions, True, axis=1)
        if op == "add":
            labels = values.sum(axis=1) % p
        else:
            labels = np.ones(n, dtype=np.int64)
            for j in range(k):
                labels = labels * values[:, j] % p
        return inputs.astype(np.int64), labels.astype(np.int64), mask

    return grid


def _check_seq(cfg: "RunConfig") -> None:
    _check_p(cfg)
    if cfg.seq_len < 1:
        raise BadInput(f"seq_len must be >= 1; got {cfg.seq_len}")
    if not 1 <= cfg.n_informative <= cfg.seq_len:
        raise BadInput(f"n_informative must be in 1..seq_len ({cfg.seq_len}); got {cfg.n_informative}")
    if cfg.informative_layout not in SEQ_LAYOUTS:
        raise BadInput(f"informative_layout must be one of {', '.join(SEQ_LAYOUTS)}; got {cfg.informative_layout!r}")
    if cfg.distractor_vocab < 0:
        raise BadInput(f"distractor_vocab must be >= 0; got {cfg.distractor_vocab}")
    if cfg.informative_layout == "random" and cfg.distractor_vocab == 0 and cfg.n_informative < cfg.seq_len:
        raise BadInput("informative_layout=random needs distractor_vocab > 0: with distractors drawn from the "
                       "residues, nothing tells the informative tokens apart")
    # logarithms first: p ** n_informative as an integer takes minutes to build for n_informative 1e8
    if (cfg.n_informative * math.log(cfg.p) > math.log(SEQ_MAX_INPUTS) + 1e-9
            or cfg.p**cfg.n_informative > SEQ_MAX_INPUTS):
        raise BadInput(f"p^n_informative = {cfg.p}^{cfg.n_informative} inputs is over {SEQ_MAX_INPUTS:,}; "
                       "lower p or n_informative")


for _name, _op, _desc in [
    ("seq_add", "add", "(sum of the k informative tokens) mod p in a length-L sequence with distractors"),
    ("seq_mul", "mul", "(product of the k informative tokens) mod p in a length-L sequence with distractors"),
]:
    TASKS.register(_name)(
        Task(
            name=_name,
            description=_desc,
            grid=_seq_grid(_op),
            vocab=lambda cfg: (cfg.p + cfg.distractor_vocab + 1, cfg.p),
            validate=_check_seq,
            readout=lambda cfg: cfg.seq_len,
            residue_tokens=True,
            shape=lambda cfg: (cfg.p ** cfg.n_informative, cfg.seq_len + 1, 0),
        )
    )


# ---------------------------------------------------------------- teacher-student sign data
TEACHER_MAX_FLOATS = 50_000_000  # (train + test examples) x N of the Gaussian table (200 MB in float32)


def teacher_sizes(cfg: "RunConfig") -> tuple[int, int]:
    """(training examples P = round(teacher_alpha x teacher_dim), test examples)."""
    return int(round(cfg.teacher_alpha * cfg.teacher_dim)), cfg.teacher_test


@functools.lru_cache(maxsize=4)
def _teacher_draw(data_seed: int, n: int, dim: int, hidden: int) -> tuple["torch.Tensor", np.ndarray, np.ndarray]:
    import torch

    rng = np.random.default_rng([data_seed, 5])  # a stream apart from the split's
    teacher = rng.standard_normal((hidden, dim))  # B_k ~ N(0, I_N), k = 1..K
    x = rng.standard_normal((n, dim)).astype(np.float32)
    votes = np.sign(x.astype(np.float64) @ teacher.T).sum(axis=1)  # K odd: never 0 (a field of 0 has probability 0)
    return torch.from_numpy(x), teacher, (votes > 0).astype(np.int64)


def teacher_student(cfg: "RunConfig") -> tuple["torch.Tensor", np.ndarray, np.ndarray]:
    """The teacher task's data, from data_seed alone: (X [n, N] float32, the example vectors; the
    teacher B [K, N] float64; labels [n], 1 where the teacher's output sign(sum_k sign(B_k . x)) is
    +1, else 0). Every entry of X and B is N(0, 1); n = P + test examples. Shared (cached), never
    written: every copy of a routed run reads the one table."""
    n = sum(teacher_sizes(cfg))
    return _teacher_draw(cfg.data_seed, n, cfg.teacher_dim, cfg.teacher_hidden)


def _teacher_grid(cfg: "RunConfig") -> tuple[np.ndarray, np.ndarray]:
    _, _, labels = teacher_student(cfg)
    n = len(labels)
    ids = np.arange(n, dtype=np.int64)
    return np.stack([ids, np.full_like(ids, n)], axis=1), labels.copy()  # [example id, =]; the cached labels stay


def _teacher_split(cfg: "RunConfig", n: int) -> tuple[np.ndarray, np.ndarray]:
    # the examples are independent draws: the first P train, the rest test
    n_train, _ = teacher_sizes(cfg)
    return np.arange(n_train), np.arange(n_train, n)


def _check_teacher(cfg: "RunConfig") -> None:
    if cfg.teacher_dim < 1:
        raise BadInput(f"teacher_dim must be >= 1; got {cfg.teacher_dim}")
    if cfg.teacher_hidden < 1 or cfg.teacher_hidden % 2 == 0:
        raise BadInput("teacher_hidden must be odd and >= 1 (the teacher's output is a majority); got "
                       f"{cfg.teacher_hidden}")
    if not (math.isfinite(cfg.teacher_alpha) and cfg.teacher_alpha > 0):
        raise BadInput(f"teacher_alpha must be a number > 0; got {cfg.teacher_alpha}")
    if cfg.teacher_test < 1:
        raise BadInput(f"teacher_test must be >= 1; got {cfg.teacher_test}")
    n_train, n_test = teacher_sizes(cfg)
    if n_train < 1:
        raise BadInput(f"teacher_alpha {cfg.teacher_alpha} x teacher_dim {cfg.teacher_dim} rounds to no training "
                       "example")
    if (n_train + n_test) * cfg.teacher_dim > TEACHER_MAX_FLOATS:
        raise BadInput(f"{n_train + n_test:,} examples x teacher_dim {cfg.teacher_dim} is over {TEACHER_MAX_FLOATS:,} "
                       "numbers; lower teacher_alpha, teacher_test or teacher_dim")


TASKS.register("teacher")(
    Task(
        name="teacher",
        description="teacher-student: Gaussian vectors labelled by sign(sum_k sign(B_k . x)) of a random teacher",
        grid=_teacher_grid,
        vocab=lambda cfg: (sum(teacher_sizes(cfg)) + 1, 2),  # the example ids and '='; classes -1 (0), +1 (1)
        validate=_check_teacher,
        readout_pos=1,
        informative=(0,),
        split=_teacher_split,
        shape=lambda cfg: (sum(teacher_sizes(cfg)), 2, 0),  # [example id, =]
        extra_memory=lambda cfg: sum(teacher_sizes(cfg)) * cfg.teacher_dim * 4,  # float32, one table for every copy
    )
)

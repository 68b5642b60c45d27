"""Algorithmic tasks. A task turns a RunConfig into the full input grid, labels, the readout
position and the mask of informative positions; the train/test split comes from `data_seed`.

Modular tasks use tokens [a, b, =] with vocabulary p + 1 (`=` is token p) and p output classes
(Power et al. 2022; Nanda et al. 2023). S5 composition uses [s, t, =] over the 120
permutations of 5 elements (vocabulary 121, 120 classes).
"""

from __future__ import annotations

import itertools
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
    labels: "torch.Tensor"  # [N] class ids
    train_idx: "torch.Tensor"  # [n_train] indices into inputs
    test_idx: "torch.Tensor"  # [n_test]
    readout_pos: int  # position whose logits are the prediction
    informative_mask: "torch.Tensor"  # [N, n_ctx] bool: positions that determine the label
    d_vocab: int
    d_vocab_out: int

    @property
    def n_ctx(self) -> int:
        return int(self.inputs.shape[1])


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    grid: Callable[["RunConfig"], tuple[np.ndarray, np.ndarray]]  # -> inputs [N, n_ctx], labels [N]
    vocab: Callable[["RunConfig"], tuple[int, int]]  # -> (d_vocab, d_vocab_out)
    validate: Callable[["RunConfig"], None]
    readout_pos: int = 2
    informative: tuple[int, ...] = (0, 1)

    def build(self, cfg: "RunConfig", split: tuple[np.ndarray, np.ndarray] | None = None) -> TaskData:
        """The task's data; `split` (train, test indices) overrides the one drawn from data_seed."""
        import torch

        inputs, labels = self.grid(cfg)
        train_idx, test_idx = split if split is not None else draw_split(len(labels), cfg.train_frac, cfg.data_seed)
        mask = np.zeros(inputs.shape, dtype=bool)
        mask[:, list(self.informative)] = True
        d_vocab, d_vocab_out = self.vocab(cfg)
        return TaskData(
            inputs=torch.as_tensor(inputs, dtype=torch.long),
            labels=torch.as_tensor(labels, dtype=torch.long),
            train_idx=torch.as_tensor(np.asarray(train_idx), dtype=torch.long),
            test_idx=torch.as_tensor(np.asarray(test_idx), dtype=torch.long),
            readout_pos=self.readout_pos,
            informative_mask=torch.as_tensor(mask),
            d_vocab=d_vocab,
            d_vocab_out=d_vocab_out,
        )


TASKS: Registry[Task] = Registry("task")


def draw_split(n: int, train_frac: float, data_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A random split of range(n), reproducible from data_seed alone (numpy PCG64)."""
    perm = np.random.default_rng(data_seed).permutation(n)
    n_train = int(round(train_frac * n))
    if not 0 < n_train < n:
        raise BadInput(f"train_frac {train_frac} of {n} examples leaves an empty train or test set")
    return np.sort(perm[:n_train]), np.sort(perm[n_train:])


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    return all(n % k for k in range(2, int(n**0.5) + 1))


# ---------------------------------------------------------------- modular arithmetic
def _modular(op: Callable[[np.ndarray, np.ndarray, int], np.ndarray], exclude_b_zero: bool = False):
    def grid(cfg: "RunConfig") -> tuple[np.ndarray, np.ndarray]:
        p = cfg.p
        a, b = np.meshgrid(np.arange(p), np.arange(p), indexing="ij")
        a, b = a.ravel(), b.ravel()
        if exclude_b_zero:
            keep = b != 0
            a, b = a[keep], b[keep]
        eq = np.full_like(a, p)
        return np.stack([a, b, eq], axis=1), op(a, b, p) % p

    return grid


def _modular_vocab(cfg: "RunConfig") -> tuple[int, int]:
    return cfg.p + 1, cfg.p


def _check_p(cfg: "RunConfig", prime: bool = False) -> None:
    if cfg.p < 3:
        raise BadInput(f"p must be >= 3; got {cfg.p}")
    if prime and not is_prime(cfg.p):
        raise BadInput(f"task {cfg.task!r} needs a prime p (b^-1 mod p must exist); got p={cfg.p}")


def _inverse(b: np.ndarray, p: int) -> np.ndarray:
    return np.array([pow(int(x), p - 2, p) for x in b], dtype=np.int64)  # Fermat: p prime


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
    )
)

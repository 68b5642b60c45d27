"""Linear probes (scikit-learn) on any hook site: what a representation encodes linearly.

Targets:
  a, b       the operand tokens (input positions 0 and 1): classification, held-out accuracy
  answer     the label: classification, held-out accuracy
  fourier    [cos(w_k c), sin(w_k c) for k in frequencies], w_k = 2 pi k / p, c the answer
             ((a + b) mod p for modular addition): multi-output regression, held-out R^2
Features are the site's activation at one position (default: the readout position),
flattened, standardized on the probe's training rows. Classifier: multinomial logistic
regression (default) or ridge classification; regression: ridge. The probe's own train/test
split is either `random` (a seeded permutation of all inputs, `train_frac` for training) or
`run` (fit on the run's training inputs, score on its test inputs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from groklens.errors import BadInput
from groklens.probes.capture import DEFAULT_BATCH, capture, check_sites, resolve_position
from groklens.probes.grid import modular_grid

if TYPE_CHECKING:  # pragma: no cover
    from groklens.tasks import TaskData

CLASSIFICATION_TARGETS = ("a", "b", "answer")
REGRESSION_TARGETS = ("fourier",)
TARGETS = CLASSIFICATION_TARGETS + REGRESSION_TARGETS
SPLITS = ("random", "run")
CLASSIFIERS = ("logistic", "ridge")


def probe_targets(data: TaskData, target: str, frequencies: Sequence[int] | None = None) -> np.ndarray:
    """The target of each input: int class ids [N], or float64 [N, 2 |frequencies|] for fourier."""
    if target not in TARGETS:
        raise BadInput(f"unknown probe target {target!r} (known: {', '.join(TARGETS)})")
    if target == "a":
        return data.inputs[:, 0].numpy().astype(np.int64)
    if target == "b":
        return data.inputs[:, 1].numpy().astype(np.int64)
    if target == "answer":
        if data.labels.dim() != 1:
            raise BadInput("probe target 'answer' needs a single-target task (labels [N]); this task has "
                           f"{data.labels.shape[1]} answer positions")
        return data.labels.numpy().astype(np.int64)

    grid = modular_grid(data, "the fourier probe target")
    ks = check_frequencies(frequencies, grid.p)
    if not ks:
        raise BadInput("the fourier probe target needs at least one frequency")
    cols = []
    for k in ks:
        w = 2 * np.pi * k / grid.p
        cols += [np.cos(w * grid.c), np.sin(w * grid.c)]
    return np.stack(cols, axis=1)


def check_frequencies(frequencies: Sequence[int] | None, p: int) -> list[int]:
    """Sorted distinct frequencies in 1..p//2, or BadInput."""
    if frequencies is None:
        return []
    out = []
    for k in frequencies:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= int(k) <= p // 2:
            raise BadInput(f"frequencies must be integers in 1..{p // 2} (p={p}); got {k!r}")
        out.append(int(k))
    return sorted(set(out))


def probe_split(data: TaskData, split: str, train_frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (probe-train, probe-test) into data.inputs."""
    n = len(data.inputs)
    if split == "run":
        return data.train_idx.numpy(), data.test_idx.numpy()
    if split != "random":
        raise BadInput(f"probe split must be one of {', '.join(SPLITS)}; got {split!r}")
    if not 0.0 < train_frac < 1.0:
        raise BadInput(f"probe train_frac must be in (0, 1); got {train_frac}")
    perm = np.random.default_rng(seed).permutation(n)
    n_train = int(round(train_frac * n))
    if not 0 < n_train < n:
        raise BadInput(f"probe train_frac {train_frac} of {n} inputs leaves an empty probe train or test set")
    return np.sort(perm[:n_train]), np.sort(perm[n_train:])


def fit_probe(
    X: np.ndarray,
    y: np.ndarray,
    train_rows: np.ndarray,
    test_rows: np.ndarray,
    *,
    classifier: str = "logistic",
    C: float = 1.0,
    alpha: float = 1.0,
) -> dict:
    """Fit on `train_rows`, score on `test_rows`: accuracy for int targets, R^2 for float ones."""
    from sklearn.linear_model import LogisticRegression, Ridge, RidgeClassifier
    from sklearn.metrics import r2_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X = np.asarray(X, dtype=np.float64).reshape(len(X), -1)
    Xtr, Xte, ytr, yte = X[train_rows], X[test_rows], y[train_rows], y[test_rows]
    if np.issubdtype(y.dtype, np.integer):
        if classifier not in CLASSIFIERS:
            raise BadInput(f"probe classifier must be one of {', '.join(CLASSIFIERS)}; got {classifier!r}")
        if len(np.unique(ytr)) < 2:
            raise BadInput("the probe's training rows hold a single class; nothing to decode")
        head = LogisticRegression(C=C, max_iter=2000) if classifier == "logistic" else RidgeClassifier(alpha=alpha)
        model = make_pipeline(StandardScaler(), head).fit(Xtr, ytr)
        counts = np.bincount(yte)
        return {
            "accuracy": float((model.predict(Xte) == yte).mean()),
            "train_accuracy": float((model.predict(Xtr) == ytr).mean()),
            "chance": float(counts.max() / len(yte)),  # always predicting the commonest test class
            "n_train": len(train_rows),
            "n_test": len(test_rows),
        }
    model = make_pipeline(StandardScaler(), Ridge(alpha=alpha)).fit(Xtr, ytr)
    pred_te, pred_tr = model.predict(Xte), model.predict(Xtr)
    return {
        "r2": float(r2_score(yte, pred_te)),
        "train_r2": float(r2_score(ytr, pred_tr)),
        "r2_per_target": np.atleast_1d(r2_score(yte, pred_te, multioutput="raw_values")).astype(np.float64),
        "n_train": len(train_rows),
        "n_test": len(test_rows),
    }


def linear_probe(
    model,
    data: TaskData,
    site: str,
    target: str,
    *,
    position="readout",
    frequencies: Sequence[int] | None = None,
    split: str = "random",
    train_frac: float = 0.5,
    seed: int = 0,
    classifier: str = "logistic",
    C: float = 1.0,
    alpha: float = 1.0,
    batch_size: int = DEFAULT_BATCH,
) -> dict:
    """Decode `target` from `site` at `position` on held-out inputs (see the module docstring).

    Returns accuracy/train_accuracy/chance (classification) or r2/train_r2/r2_per_target
    (regression; per target in the order cos k1, sin k1, cos k2, ...), n_train, n_test.
    """
    check_sites(model, [site])
    y = probe_targets(data, target, frequencies)
    pos = resolve_position(position, data)
    train_rows, test_rows = probe_split(data, split, train_frac, seed)
    X = capture(model, data.inputs, [site], position=pos, batch_size=batch_size)[site]
    return fit_probe(X.double().numpy(), y, train_rows, test_rows, classifier=classifier, C=C, alpha=alpha)

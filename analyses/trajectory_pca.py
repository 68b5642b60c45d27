"""PCA of a run's parameter trajectory (docs/ANALYSES.md, "Parameter trajectory PCA").

X[i] = every parameter of checkpoint i flattened and concatenated (the file's parameter order),
[n_checkpoints, n_params]; scikit-learn's PCA (centred on the mean checkpoint, exact SVD) gives
each checkpoint's coordinates on the first principal directions and their explained-variance
ratios. Each checkpoint carries a phase, from the run's memorization and grokking steps
(analyses/phases.py: first evaluation with train / test accuracy >= GROK_THRESHOLD):
memorization before the memorization step, circuit formation from it until the grokking step,
cleanup from the grokking step on (Nanda et al.'s names; their boundaries are read from the
progress measures, ours from accuracy, which puts the cleanup's start at its end).
"""

from __future__ import annotations

import numpy as np

from groklens.analyses.phases import run_phases
from groklens.errors import BadInput

PHASE_NAMES = ("memorization", "circuit formation", "cleanup")


def parameter_matrix(traj) -> tuple[list[int], np.ndarray]:
    """The checkpoint steps and X [n_checkpoints, n_params] in float64: each checkpoint's
    parameters, flattened. A run being written gains checkpoints between reads: every parameter
    is cut to the checkpoints of the one steps read (rows past it are later checkpoints)."""
    steps = [int(s) for s in traj.steps]
    n = len(steps)
    return steps, np.concatenate([traj.param_trajectory(name)[:n].reshape(n, -1).astype(np.float64)
                                  for name in traj.param_names], axis=1)


def checkpoint_phases(steps, memorization: int | None, grokking: int | None) -> list[str]:
    """The phase of each checkpoint step (PHASE_NAMES); a phase never reached lasts to the end."""
    def phase(s: int) -> str:
        if memorization is None or s < memorization:
            return PHASE_NAMES[0]
        return PHASE_NAMES[1] if grokking is None or s < grokking else PHASE_NAMES[2]

    return [phase(int(s)) for s in steps]


def parameter_pca(run, n_components: int = 2) -> dict:
    """steps [n], projections [n, k], explained_variance_ratio [k], phases [n] of a run (a
    Trajectory or a path)."""
    from sklearn.decomposition import PCA

    from groklens.checkpoints import Trajectory  # h5py, deferred like the reader itself

    traj = run if isinstance(run, Trajectory) else Trajectory(run)
    steps, X = parameter_matrix(traj)
    if len(X) < 2:
        raise BadInput(f"{traj.path}: a trajectory PCA needs two or more checkpoints; it has {len(X)}")
    k = min(n_components, len(X) - 1, X.shape[1])  # n centred points span at most n - 1 directions
    pca = PCA(n_components=k, svd_solver="full")
    ph = run_phases(traj)
    return {"steps": steps, "projections": pca.fit_transform(X),
            "explained_variance_ratio": pca.explained_variance_ratio_,
            "phases": checkpoint_phases(steps, ph.memorization, ph.grokking)}

"""Train a run of one trajectory file from scratch (`train`), or continue one (`resume`).

A run of one file is a single run (`single.SingleRun`) or, with routing_copies > 1, a routed
set of copies (`routing.RoutedRun`); both go through the one loop in trainers/engine.py, as
batched ensembles do (trainers/ensemble.py). On CPU a run is deterministic for a given (seed,
data_seed), and a resumed run ends bit-identical to an uninterrupted one (optimizer,
regularizer and RNG state travel in the file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from groklens.checkpoints import Trajectory, TrajectoryWriter, recover
from groklens.checkpoints.locking import describe_holder, writer_alive
from groklens.checkpoints.validate import check_resources
from groklens.checkpoints.writer import config_json
from groklens.config import RunConfig
from groklens.errors import BadInput
from groklens.tasks import TASKS, TaskData
from groklens.trainers.engine import METRIC_NAMES, TrainResult, raise_failure, resolve_device, restore_counters, run
from groklens.trainers.regularizers import regularizer_metric_names
from groklens.trainers.routing import RoutedRun, routed_metric_names
from groklens.trainers.single import SingleRun


def metric_names(cfg: RunConfig) -> list[str]:
    """Every metric a run of `cfg` logs, known before the file is created (SWMR cannot add any later).

    METRIC_NAMES always; with a multi-target task the per-token accuracies (train_acc / test_acc
    are then exact match over the answer); with loss != ce the softmax cross-entropy beside the
    trained loss; then each active regularizer's metrics."""
    names = list(METRIC_NAMES)
    if TASKS.get(cfg.task).multi_target:
        names += ["train_token_acc", "test_token_acc"]
    if cfg.loss != "ce":
        names += ["train_ce", "test_ce"]
    names += regularizer_metric_names(cfg)
    if cfg.routing_copies > 1:  # per-copy and ensemble columns (trainers/routing.py)
        names = routed_metric_names(names, cfg.routing_copies)
    return names


def strategy_class(cfg: RunConfig):
    """SingleRun, or routing.RoutedRun for routing_copies > 1."""
    return SingleRun if cfg.routing_copies == 1 else RoutedRun


def train(cfg: RunConfig, out: str | Path, *, force: bool = False, progress: bool = True,
          on_commit: Callable[[int], None] | None = None) -> TrainResult:
    """Train `cfg` from scratch into the trajectory file `out` (refused if it exists, unless
    force). With force, the new run is staged beside `out` and replaces it at its first
    committed checkpoint, so a run that fails before that leaves the old one (checkpoints/writer.py).
    `on_commit(step)` is called after each committed checkpoint."""
    cfg.validate()
    out = Path(out)
    if out.exists() and out.is_dir():
        raise BadInput(f"{out} is a directory; give a file path for --out")
    exists = out.exists() or out.is_symlink()
    if exists and not force:
        raise BadInput(f"{out} already exists; use --force to overwrite it or --resume to continue it")
    if exists and writer_alive(out):
        raise BadInput(f"{out} is being written by a live process ({describe_holder(out)}); stop it first")
    if not out.parent.exists():
        raise BadInput(f"directory {out.parent} does not exist")
    check_resources(cfg)  # sizes from the config alone, before any allocation
    data = TASKS.get(cfg.task).build(cfg)
    resolve_device(cfg.device)  # fail on a missing GPU before touching any file

    def make_writer(strategy) -> TrajectoryWriter:
        params, state, copies = strategy.payloads([0])[0]
        return create_trajectory(out, cfg, data, params, state, copies=copies, replace=exists)

    strategy = strategy_class(cfg)(cfg, data, make_writer, progress=progress)
    try:
        members = run(strategy, 0, fresh=True, on_commit=on_commit)
    finally:
        for member in strategy.members:
            member.writer.close()  # idempotent; a staged run that never committed is deleted
    raise_failure(members)
    return members[0].result


def create_trajectory(out: Path, cfg: RunConfig, data: TaskData, params: dict[str, np.ndarray],
                      state: dict[str, np.ndarray], copies: list[dict[str, np.ndarray]] = (),
                      replace: bool = False) -> TrajectoryWriter:
    """A new trajectory file for a run of `cfg` on `data` (single runs and ensemble members alike;
    `copies`: copies 1..M-1 of a routed run)."""
    return TrajectoryWriter.create(
        out,
        config_json=config_json(cfg),
        data={
            "inputs": data.inputs.numpy(), "labels": data.labels.numpy(),
            "train_idx": data.train_idx.numpy(), "test_idx": data.test_idx.numpy(),
            "informative_mask": data.informative_mask.numpy(),
        },
        data_attrs={"readout_pos": data.readout_pos, "d_vocab": data.d_vocab, "d_vocab_out": data.d_vocab_out},
        params=params,
        state=state,
        metric_names=metric_names(cfg),
        copies=copies,
        replace=replace,
    )


def resume(path: str | Path, *, progress: bool = True, on_commit: Callable[[int], None] | None = None) -> TrainResult:
    """Continue an interrupted run from its last committed checkpoint (repairing the file first)."""
    path = Path(path)
    traj = Trajectory(path)
    cfg = traj.config
    steps = traj.steps
    if len(steps) and int(steps[-1]) >= cfg.steps:
        return TrainResult(path, int(steps[-1]), "already complete")
    last = recover(path)
    traj = Trajectory(path)
    params, state, metrics = traj.params(last), traj.state(last), traj.metrics
    copies = [Trajectory(path, copy=m).params(last) for m in range(1, cfg.routing_copies)]  # before the writer opens
    strategy = strategy_class(cfg)(cfg, traj.dataset(), lambda _s: TrajectoryWriter.reopen(path), progress=progress)
    strategy.load(params, state, copies, last)
    restore_counters(strategy.members[0], metrics)
    strategy.members[0].writer.set_status("running")
    members = run(strategy, last, fresh=False, on_commit=on_commit)
    raise_failure(members)
    return members[0].result


def read_state(path: Path, step: int) -> dict[str, np.ndarray]:
    """The state stored with checkpoint `step` of the file at `path`."""
    return Trajectory(path).state(step)

"""Train a run of one trajectory file from scratch (`train`), or continue one (`resume`).

A run of one file is a single run (`single.SingleRun`) or, with routing_copies > 1, a routed
set of copies (`routing.RoutedRun`); both go through the one loop in trainers/engine.py, as
batched ensembles do (trainers/ensemble.py). On CPU a run is deterministic for a given (seed,
data_seed), and a resumed run ends bit-identical to an uninterrupted one (optimizer,
regularizer and RNG state travel in the file). `resume(..., steps=N)` raises a censored run's
step cap to N: the file keeps its config as the run began and records the extension beside it
(checkpoints ATTR_EXTENSIONS), and the run ends as one trained to N in one go would, when its
old cap is on the evaluation and checkpoint schedules (otherwise the old cap's extra evaluation
and checkpoint stay in the file).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np

from groklens import __version__
from groklens.checkpoints import Trajectory, TrajectoryWriter, recover
from groklens.checkpoints.locking import describe_holder, writer_alive
from groklens.checkpoints.validate import check_resources
from groklens.checkpoints.writer import config_json
from groklens.config import RunConfig
from groklens.errors import BadInput
from groklens.tasks import TASKS, TaskData
from groklens.trainers.engine import (METRIC_NAMES, TrainResult, flushing_denormals, raise_failure, resolve_device,
                                      restore_counters, run)
from groklens.trainers.regularizers import regularizer_metric_names
from groklens.trainers.routing import RoutedRun, routed_metric_names
from groklens.trainers.single import SingleRun
from groklens.trainers.ticket import transferred_mask
from groklens.checkpoints.reader import open_trajectory_file
from groklens.fileio import check_writable_dir
from groklens.checkpoints import constants as C
from groklens.checkpoints.recovery import check_parameters


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
          on_commit: Callable[[int], None] | None = None,
          on_eval: Callable[[dict], None] | None = None) -> TrainResult:
    """Train `cfg` from scratch into the trajectory file `out` (refused if it exists, unless
    force, or unless it is a run that died before its first checkpoint: nothing to keep). With
    force, the new run is staged beside `out` and replaces it at its first committed checkpoint,
    so a run that fails before that leaves the old one (checkpoints/writer.py).
    `on_commit(step)` is called after each committed checkpoint, `on_eval(row)` after each
    evaluation row is written (trainers/loggers.py)."""
    cfg.validate()
    out = Path(out)
    if out.exists() and out.is_dir():
        raise BadInput(f"{out} is a directory; give a file path for --out")
    exists = out.exists() or out.is_symlink()
    if exists and not force and not died_before_first_checkpoint(out):
        raise BadInput(f"{out} already exists; use --force to overwrite it or --resume to continue it")
    if exists:
        check_force_target(out)
    if exists and writer_alive(out):
        raise BadInput(f"{out} is being written by a live process ({describe_holder(out)}); stop it first")
    if not out.parent.exists():
        raise BadInput(f"directory {out.parent} does not exist")
    device = resolve_device(cfg.device)  # fail on a missing GPU before touching any file
    check_resources(cfg, device=device.type, device_memory=device_free_memory(device))  # before any allocation
    if cfg.attn_mask_from and not cfg.attn_mask:  # the donor's mask, kept in this run's stored config
        cfg = cfg.replace(attn_mask=transferred_mask(cfg, out))
    with flushing_denormals(cfg.flush_denormal):  # before the model is built: engine.flushing_denormals
        data = TASKS.get(cfg.task).build(cfg)

        def make_writer(strategy) -> TrajectoryWriter:
            params, state, copies = strategy.payloads([0])[0]
            return create_trajectory(out, cfg, data, params, state, copies=copies, replace=exists)

        strategy = strategy_class(cfg)(cfg, data, make_writer, progress=progress)
        try:
            members = run(strategy, 0, fresh=True, on_commit=on_commit, on_eval=_row_only(on_eval))
        finally:
            for member in strategy.members:
                member.writer.close()  # idempotent; a staged run that never committed is deleted
        raise_failure(members)
        return members[0].result


def check_force_target(out: Path) -> None:
    """`--force` replaces only a regular groklens run file that this process may replace: never
    a link, a device, a foreign or unreadable file, or an immutable or read-only one."""
    import os


    if out.is_symlink():
        raise BadInput(f"{out} is a symbolic link; --force replaces only a groklens run file itself")
    if not out.is_file():
        raise BadInput(f"{out} is not a regular file (a device, pipe or socket?); --force replaces only a groklens run")
    try:
        if out.stat().st_size:  # an empty file (a writer killed before HDF5 wrote anything) holds nothing
            open_trajectory_file(out, validate=False).close()
    except BadInput as exc:
        raise BadInput(f"{out} is not a groklens run that --force may replace ({str(exc).removeprefix(f'{out}: ')}); "
                       "move it away") from None
    check_writable_dir(out.parent, "replace a run in")
    if not os.access(out, os.W_OK):
        raise BadInput(f"cannot replace {out} (permission denied, or the file is immutable)")


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


def resume(path: str | Path, *, progress: bool = True, on_commit: Callable[[int], None] | None = None,
           on_eval: Callable[[dict], None] | None = None, steps: int | None = None) -> TrainResult:
    """Continue an interrupted run from its last committed checkpoint (repairing the file first);
    `steps`: first raise its step cap to this (see the module docstring). The stored state is
    validated by loading it into the run before anything is written."""
    path = Path(path)
    check_resume_target(path)
    traj = Trajectory(path)
    cfg = traj.config
    extension = None if steps is None else cap_extension(traj, steps)
    if extension is not None:
        cfg = cfg.replace(steps=steps)
    steps = traj.steps
    if len(steps) and int(steps[-1]) >= cfg.steps:
        return TrainResult(path, int(steps[-1]), "already complete")
    if not len(steps) and not traj.is_live:
        raise BadInput(f"{path} holds no checkpoint: the run died before its first one (killed, e.g. out of "
                       f"memory?), so there is nothing to resume; `groklens train --out {path} ...` starts it "
                       "again (the file is replaced)")
    with flushing_denormals(cfg.flush_denormal):
        strategy = strategy_class(cfg)(cfg, traj.dataset(), None, progress=progress, path=path)
        try:
            loaded = load_stored(strategy, traj, int(steps[-1])) if len(steps) else None
        except BadInput:
            if writer_alive(path):  # another resume started since the check: it is mid-commit, not broken
                raise BadInput(f"{path} is being written by a live process ({describe_holder(path)}); "
                               "stop it before resuming") from None
            raise
        last = recover(path)
        traj = Trajectory(path)
        if last != loaded:  # the file moved on between the two reads: load what recovery kept
            load_stored(strategy, traj, last)
        member = strategy.members[0]
        # read before the writer opens the file (HDF5 refuses a second, unlocked open)
        metrics, cpu_s = traj.metrics, traj.cpu_seconds
        member.writer = TrajectoryWriter.reopen(path, extension)
        restore_counters(member, metrics, cpu_s)
        member.writer.set_status("running")
        members = run(strategy, last, fresh=False, on_commit=on_commit, on_eval=_row_only(on_eval))
        raise_failure(members)
        return members[0].result


def cap_extension(traj: Trajectory, steps: int) -> dict:
    """The extension record that raises `traj`'s step cap to `steps`; BadInput unless the run
    is censored at its cap or interrupted before it (a run its stop rule ended has grokked:
    more steps would not be the same run), and `steps` is above the cap."""
    cap = traj.config.steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps <= cap:
        raise BadInput(f"--steps {steps}: the run's cap is {cap} steps; an extension must raise it")
    status = traj.status
    if status.startswith("completed:") or status.startswith("stopped: non-finite"):  # its stop rule, or diverged
        raise BadInput(f"{traj.path} ended before its cap ({status}); only a run censored at its cap (or "
                       "interrupted) is extended")
    last = int(traj.steps[-1]) if len(traj.steps) else 0
    return {"steps": steps, "from_steps": cap, "at_step": last, "groklens_version": __version__,
            "when": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def check_resume_target(path: Path) -> None:
    """A run to continue in place: the file itself (a link is refused, never replaced by the
    repaired file) in a place this process can write (BadInput before anything is read)."""
    import os


    if path.is_symlink():
        raise BadInput(f"{path} is a symbolic link (to {os.readlink(path)}); resume the run itself, not a link to it")
    if not path.exists():
        raise BadInput(f"{path}: no such file")
    if path.is_file():
        check_writable_dir(path.parent, "resume a run in")
        if not os.access(path, os.W_OK):
            raise BadInput(f"cannot write {path} (permission denied, or the file is immutable)")

        if writer_alive(path):  # its state is being written: not read, not resumed
            raise BadInput(f"{path} is being written by a live process ({describe_holder(path)}); "
                           "stop it before resuming")


def load_stored(strategy, traj: Trajectory, step: int) -> int:
    """Load checkpoint `step` of `traj` (parameters, optimizer, regularizer and RNG state) into
    `strategy`, refusing (BadInput) state that is not what the run's own state looks like or
    does not load; nothing is written. Returns `step`."""
    check_parameters(traj.path)  # names and shapes of the model the config builds, finite
    _, fresh, _ = strategy.payloads([0])[0]  # the names, shapes and dtypes the run keeps
    with open_trajectory_file(traj.path, validate=False) as f:
        stored = {name: (ds.shape[1:], ds.dtype) for name, ds in f[C.STATE].items() if name != C.STATE_STEP}
    missing = sorted(set(fresh) - set(stored))
    extra = sorted(set(stored) - set(fresh))
    bad = [n for n in fresh if n in stored and (tuple(stored[n][0]) != tuple(np.shape(fresh[n]))
                                                 or stored[n][1] != np.asarray(fresh[n]).dtype)]
    where = f"{traj.path}: invalid trajectory: /{C.STATE}"
    if missing or extra or bad:
        what = (f"lacks {missing[0]}" if missing else f"/{extra[0]} is not part of this run's state" if extra
                else f"/{bad[0]} is {stored[bad[0]][1]} {list(stored[bad[0]][0])}, the run keeps "
                     f"{np.asarray(fresh[bad[0]]).dtype} {list(np.shape(fresh[bad[0]]))}")
        raise BadInput(f"{where} {what}")
    cfg = traj.config
    params, state = traj.params(step), traj.state(step)
    copies = [Trajectory(traj.path, copy=m).params(step) for m in range(1, cfg.routing_copies)]
    try:
        strategy.load(params, state, copies, step)
    except (RuntimeError, ValueError, TypeError, KeyError, IndexError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BadInput(f"{where} at step {step} does not load ({first})") from None
    return step


def check_stored_state(path: str | Path) -> None:
    """BadInput, before anything is written, when the last checkpoint of `path` cannot be loaded
    into the run its config builds (what `resume` checks; for callers that resume otherwise)."""
    path = Path(path)
    check_resume_target(path)
    traj = Trajectory(path)
    steps = traj.steps
    if len(steps):
        cfg = traj.config
        load_stored(strategy_class(cfg)(cfg, traj.dataset(), None, progress=False, path=path), traj, int(steps[-1]))


def _row_only(on_eval):
    """The engine's on_eval(member, row) for a run of one file, from a callback of the row."""
    return None if on_eval is None else (lambda _member, row: on_eval(row))


def died_before_first_checkpoint(path: Path) -> bool:
    """Whether `path` is a trajectory whose writer died before committing any checkpoint (killed,
    e.g. by the kernel for memory): it holds nothing to resume, and a new run may take its place."""
    try:
        traj = Trajectory(path)
        return len(traj.steps) == 0 and traj.status == "running" and not writer_alive(path)
    except (BadInput, OSError):
        return False


def device_free_memory(device) -> int | None:
    """Free memory of an accelerator in bytes (None on the CPU or when it cannot be asked)."""
    if device.type != "cuda":
        return None
    try:
        import torch

        return int(torch.cuda.mem_get_info(device)[0])
    except (RuntimeError, AssertionError):
        return None


def read_state(path: Path, step: int) -> dict[str, np.ndarray]:
    """The state stored with checkpoint `step` of the file at `path`."""
    return Trajectory(path).state(step)

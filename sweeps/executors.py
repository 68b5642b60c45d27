"""Executors: they hand each task to a process pool (`local`), Ray tasks (`ray`) or submitit job
arrays (`slurm`), and report back; they never schedule anything themselves.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from groklens.errors import BadInput
from groklens.sweeps.tasks import execute_task

EXECUTORS = ("local", "ray", "slurm")


class Executor:
    """Runs tasks somewhere; calls on_start(task) when a task is handed out and
    on_done(task, outcomes | exception) when it ends."""

    name = "base"
    workers: int

    def check(self) -> None:
        """BadInput for what can be refused before the sweep writes anything (its package
        missing, a bad option, a cluster that does not answer); nothing to check by default."""

    def execute(self, tasks: list[dict], on_start: Callable, on_done: Callable) -> None:  # pragma: no cover
        raise NotImplementedError


RAY_CONNECT_TIMEOUT_S = 10.0  # ray.init(address=...) retries a silent address for minutes


def check_gpus_per_run(gpus: float | None) -> None:
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or not math.isfinite(gpus)
                             or not 0 <= gpus <= 64):
        raise BadInput(f"--gpus-per-run must be a number from 0 to 64 (a fraction packs runs onto a GPU); got {gpus!r}")


def check_ray_address(address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """HOST:PORT (or ray://HOST:PORT) answers a TCP connect within `timeout_s`, so that a
    wrong address is one line at once, not a hang; 'auto' and 'local' are Ray's own lookups."""
    import socket

    if address in ("auto", "local"):
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    host = host.strip("[]")  # an IPv6 literal, [::1]:6379
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadInput(f"--address must be HOST:PORT, ray://HOST:PORT, auto or local; got {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__)
        raise BadInput(f"--address {address}: nothing answers at {host}:{port} within {timeout_s:g} s ({why}); "
                       "is the Ray head running there?") from None


class InlineExecutor(Executor):
    """Every task in this process, one after another (Python API only: debugging, notebooks)."""

    name = "inline"
    workers = 1

    def execute(self, tasks, on_start, on_done):
        for task in tasks:
            on_start(task)
            try:
                outcome = execute_task(task)
            except Exception as exc:  # noqa: BLE001
                outcome = exc
            on_done(task, outcome)


class LocalExecutor(Executor):
    """A concurrent.futures process pool on this machine, `workers` processes at a time."""

    name = "local"

    def __init__(self, workers: int | None = None):
        self.workers = max(1, workers or os.cpu_count() or 1)

    def execute(self, tasks, on_start, on_done):
        import multiprocessing
        from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
        from concurrent.futures.process import BrokenProcessPool

        queue = list(tasks)
        ctx = _worker_context(multiprocessing)

        def new_pool():
            return ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx, initializer=_watch_coordinator,
                                       initargs=(os.getpid(),))

        pool = new_pool()
        running: dict = {}
        try:
            while queue or running:
                while queue and len(running) < self.workers:
                    task = queue.pop(0)
                    running[pool.submit(execute_task, task)] = task
                    on_start(task)
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                broken = False
                for fut in done:
                    task = running.pop(fut)
                    try:
                        result = fut.result()
                    except BrokenProcessPool as exc:
                        broken = True
                        result = RuntimeError(f"the worker process died (killed, out of memory, or a script "
                                              f"without an `if __name__ == '__main__':` guard): {exc}")
                    except Exception as exc:  # noqa: BLE001
                        result = exc
                    on_done(task, result)
                if broken:  # every task in the pool is lost with it; start a new pool for the rest
                    for _fut, task in list(running.items()):
                        on_done(task, RuntimeError("the worker process died (killed, or out of memory)"))
                    running.clear()
                    pool.shutdown(wait=False, cancel_futures=True)
                    pool = new_pool()
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)


def _watch_coordinator(pid: int, every_s: float = 1.0) -> None:
    """Pool-worker initializer: leave when the coordinator `pid` is gone (killed, OOM), instead of
    idling forever; a run cut short this way is resumed by the next sweep like any killed run."""
    import threading

    def watch():
        while True:
            time.sleep(every_s)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(3)
            except PermissionError:  # pid reused by another user's process: ours is gone
                os._exit(3)

    threading.Thread(target=watch, name="groklens-coordinator-watch", daemon=True).start()


def _worker_context(multiprocessing):
    """A forkserver that imported torch and the trainers once (each worker forks from it in
    milliseconds instead of importing for seconds); spawn where there is no forkserver. Never
    a plain fork of this process, which may hold torch threads."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        # the model modules too (TransformerLens' hook machinery): every import done here is
        # done once per sweep, not once per worker on its first run
        ctx.set_forkserver_preload(["groklens.trainers.train", "groklens.trainers.ensemble",
                                    "groklens.models.transformer", "groklens.models.mlp"])
        return ctx
    return multiprocessing.get_context("spawn")


class RayExecutor(Executor):
    """Ray tasks: a local instance (`ray.init(num_cpus=workers)`) or the cluster at `address`.

    Each task asks for one CPU and, where the cluster has GPUs, `gpus_per_run` of a GPU
    (default 0.25 for a single tiny run, 1 for an ensemble): Ray packs fractional tasks onto a
    GPU and sets CUDA_VISIBLE_DEVICES, so a config with device=auto lands on it. If Ray is
    already initialised in this process, that instance is used and left running.
    """

    name = "ray"

    def __init__(self, workers: int | None = None, address: str | None = None,
                 gpus_per_run: float | None = None):
        self.requested_workers = workers
        self.address = address
        self.gpus_per_run = gpus_per_run

    def check(self) -> None:
        try:
            import ray  # noqa: F401
        except ImportError:
            raise BadInput("the ray executor needs Ray: pip install 'groklens[ray]'") from None
        check_gpus_per_run(self.gpus_per_run)
        if self.address:
            check_ray_address(self.address)

    def execute(self, tasks, on_start, on_done):
        self.check()
        import ray

        started_here = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if self.address:
                ray.init(address=self.address, **kwargs)
            else:
                ray.init(num_cpus=self.requested_workers or os.cpu_count(), **kwargs)
            started_here = True
        try:
            resources = ray.cluster_resources()
            n_cpu = int(resources.get("CPU", 1))
            has_gpu = resources.get("GPU", 0) > 0
            self.workers = max(1, self.requested_workers or n_cpu)
            remote = ray.remote(execute_task)
            queue = list(tasks)
            running: dict = {}
            while queue or running:
                while queue and len(running) < self.workers:
                    task = queue.pop(0)
                    gpus = self._gpus(task) if has_gpu else 0
                    ref = remote.options(num_cpus=1, num_gpus=gpus, max_retries=0).remote(task)
                    running[ref] = task
                    on_start(task)
                ready, _ = ray.wait(list(running), num_returns=1)
                for ref in ready:
                    task = running.pop(ref)
                    try:
                        result = ray.get(ref)
                    except Exception as exc:  # noqa: BLE001 - RayTaskError, WorkerCrashedError, ...
                        result = exc
                    on_done(task, result)
        finally:
            if started_here:
                ray.shutdown()

    def _gpus(self, task: dict) -> float:
        if any(r["config"].get("device") == "cpu" for r in task["runs"]):
            return 0
        if self.gpus_per_run is not None:
            return self.gpus_per_run
        return 1.0 if task.get("ensemble") else 0.25


class _SubmititTask:
    """The callable submitit pickles. `checkpoint` lets a preempted or timed-out SLURM job be
    requeued: the new job resumes every run from its trajectory file."""

    def __call__(self, task: dict) -> list[dict]:
        return execute_task(task)

    def checkpoint(self, task: dict):
        import submitit

        return submitit.helpers.DelayedSubmission(_SubmititTask(), task)


class SlurmExecutor(Executor):
    """submitit job arrays: one array element per task, at most `workers` running at once.

    `cluster` is submitit's: None picks SLURM where `sbatch` exists and runs jobs as local
    processes otherwise; "local" and "debug" force submitit's local / in-process executors
    (tests use them). Job logs go to DIR/.submitit/.
    """

    name = "slurm"

    def __init__(self, folder: Path, workers: int | None = None, cluster: str | None = None,
                 partition: str | None = None, time_min: int = 24 * 60, gpus_per_run: float | None = None,
                 cpus_per_task: int = 1, extra: dict[str, Any] | None = None, poll_s: float = 1.0):
        self.folder = Path(folder)
        self.workers = workers or 0
        self.cluster = cluster
        self.partition = partition
        self.time_min = time_min
        self.gpus_per_run = gpus_per_run
        self.cpus_per_task = cpus_per_task
        self.extra = extra or {}
        self.poll_s = poll_s

    def check(self) -> None:
        try:
            import submitit  # noqa: F401
        except ImportError:
            raise BadInput("the slurm executor needs submitit: pip install 'groklens[slurm]'") from None
        check_gpus_per_run(self.gpus_per_run)
        t = self.time_min
        if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= 366 * 24 * 60:
            raise BadInput(f"--time-min must be a whole number of minutes from 1 to {366 * 24 * 60:,}; got {t!r}")

    def execute(self, tasks, on_start, on_done):
        self.check()
        import submitit

        executor = submitit.AutoExecutor(folder=self.folder, cluster=self.cluster)
        params: dict[str, Any] = {
            "name": "groklens-sweep", "timeout_min": self.time_min, "cpus_per_task": self.cpus_per_task,
            "slurm_array_parallelism": self.workers or len(tasks),
        }
        if self.gpus_per_run:
            params["gpus_per_node"] = math.ceil(self.gpus_per_run)  # SLURM has no fractional GPUs
        if self.partition:
            params["slurm_partition"] = self.partition
        params.update({f"slurm_{k}" if not k.startswith("slurm_") else k: v for k, v in self.extra.items()})
        executor.update_parameters(**params)
        jobs = executor.map_array(_SubmititTask(), tasks)
        for task in tasks:
            on_start(task)
        waiting = dict(zip(jobs, tasks))
        try:
            while waiting:
                finished = [job for job in waiting if job.done()]
                for job in finished:
                    task = waiting.pop(job)
                    try:
                        result = job.result()
                    except Exception as exc:  # noqa: BLE001 - FailedJobError, UncompletedJobError
                        result = exc
                    on_done(task, result)
                if waiting and not finished:
                    time.sleep(self.poll_s)
        except KeyboardInterrupt:
            for job in waiting:
                job.cancel(check=False)
            raise


def make_executor(executor, out_dir, workers, address, gpus_per_run, slurm) -> Executor:
    if isinstance(executor, Executor):
        return executor
    if executor == "local":
        if address:
            raise BadInput("--address is for the ray executor")
        return LocalExecutor(workers)
    if executor == "ray":
        return RayExecutor(workers, address=address, gpus_per_run=gpus_per_run)
    if executor == "slurm":
        if address:
            raise BadInput("--address is for the ray executor")
        return SlurmExecutor(out_dir / ".submitit", workers=workers, gpus_per_run=gpus_per_run, **(slurm or {}))
    raise BadInput(f"unknown executor {executor!r} (known: {', '.join(EXECUTORS)})")

"""The paper-scale training step against the FLOP bound of the core it runs on (issue 31).

Run by hand (not by the test suite):
    OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python benchmarks/flop_bound.py [--threads 1 2] [--json OUT]

For three paper-scale models, the sphere paper's post-norm LayerNorm baseline (`reproduce
bounded-sphere` paper scale, arm `ln`: p=113, 30% of pairs, d_model 128, 4 heads, d_mlp 512,
full batch), its bounded sphere (arm `sphere_wd0`) and Nanda et al.'s no-norm model
(`reproduce progress-measures` paper scale), on each thread count, it prints:

  step_ms     the median over `--repeats` blocks of `--block` steady-state calls of
              `SingleRun.train_step` (after `--warmup` steps), per step;
  gflop       the reference count of issue 31: the FLOPs of a readout-only forward + backward on
              the batch's rows, counted from the shapes (`readout_flops`): every matrix product
              with 2 FLOPs per multiply-add, forward once and backward twice (the gradient of
              the input and of the weight);
  gemm_gflops the measured rate of a 2048 x 2048 float32 matmul on those threads, best of 5,
              in the same process;
  bound_ms    gflop / gemm_gflops: the step time if every FLOP ran at the GEMM rate;
  ratio       bound_ms / step_ms (1 = the step runs at the machine's matmul rate).
Each is given by wall time and by the process's CPU time per thread (`time.process_time()`
divided by the threads): on a loaded machine the wall time includes the time slices other
processes took, the CPU time not, so the CPU-time ratio is the one that says how close the
step comes to the core's rate (both numbers measured the same way).

It also counts the FLOPs the step itself does where the first block runs from its table of
every (position, token) pair (`table_flops`, the default where it pays: K, V, Q and the scores
on the table's rows, not the batch's; fewer than `readout_flops` counts as unavoidable), and the
ratio of that bound to the step: how close the step's own work comes to the GEMM rate.

`--variant` also times the same step, alternating blocks in one process so the ratios are
measured under the same load, with the first block on the batch's rows (`rows`:
`Transformer.embedding_table = False`, the lean step before the table) and with the lean path
switched off (`before`: `Transformer.lean_path = False`, the explicit path, the CPU step before
issue 31). `--compile` likewise times the step of the
same config with `compile=true` (torch.compile) against the eager one, and prints the compile
time: the wall time of the compiled run's first step (inductor caches its kernels in
TORCHINDUCTOR_CACHE_DIR, by default under /tmp: point it at an empty folder for a cold compile).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

MODELS = {"ln": ("bounded-sphere", "ln_lr6e-4"), "sphere_wd0": ("bounded-sphere", "sphere_wd0_lr6e-4"),
          "nanda": ("progress-measures", None)}


def paper_config(name: str):
    """The RunConfig of a paper-scale model (seed 1), on the CPU."""
    from groklens.experiments import EXPERIMENTS
    from groklens.experiments.pipeline import run_configs

    exp_name, variant = MODELS[name]
    runs = run_configs(EXPERIMENTS.get(exp_name), "paper", 1)
    return next(c for v, _, c in runs if variant is None or v == variant).replace(device="cpu")


def readout_flops(n: int, ctx: int, d: int, h: int, e: int, m: int, v: int, n_layers: int = 1) -> dict[str, float]:
    """FLOPs of a readout-only forward + backward of a one-layer model over n rows of ctx tokens:
    K and V at every position, Q, attention, O, MLP and unembedding at the readout position.
    A product [r, a] @ [a, c] costs 2 r a c forward and 4 r a c backward (input and weight
    gradients; the embedding's input gradient is needed, its parameters are trained)."""
    if n_layers != 1:
        raise ValueError("readout_flops counts one-layer models")
    he = h * e
    fwd = {
        "k_v": 2 * (2 * n * ctx * d * he),
        "q": 2 * n * d * he,
        "scores_z": 2 * (2 * n * h * ctx * e),  # q.k over ctx keys and pattern @ v, per head
        "o": 2 * n * he * d,
        "mlp": 2 * (2 * n * d * m),
        "unembed": 2 * n * d * v,
    }
    return {k: 3.0 * f for k, f in fwd.items()}


def table_flops(n: int, ctx: int, d: int, h: int, e: int, m: int, v: int,
                vocab: int, n_layers: int = 1) -> dict[str, float]:
    """FLOPs of the same step as the first block computes it from its table of every (position,
    token) pair (TransformerBlock.from_table, the default where it pays): K and V on ctx * vocab
    table rows, Q on the readout's vocab rows, the scores of every query row against every key
    row as one [h, vocab, ctx vocab] product, then per input only the mixing with the pattern,
    O, the MLP and the unembedding. Counted as `readout_flops` (forward once, backward twice)."""
    per_input = readout_flops(n, ctx, d, h, e, m, v, n_layers)  # O, MLP and unembedding as there
    he = h * e
    fwd = {"k_v_table": 2 * (2 * ctx * vocab * d * he), "q_table": 2 * vocab * d * he,
           "score_table": 2 * h * vocab * ctx * vocab * e, "mix": 2 * n * h * ctx * e}
    return {**{k: 3.0 * f for k, f in fwd.items()}, **{k: per_input[k] for k in ("o", "mlp", "unembed")}}


def model_flops(cfg, run, table: bool = False) -> float:
    """The step's FLOPs by `readout_flops` (the issue's reference count), or by `table_flops`."""
    t = run.t
    n, ctx = t.train_x.shape
    v = run.model.unembed.W_U.shape[1]
    batch = cfg.batch_size if cfg.batch_size and cfg.batch_size < n else n
    dims = (batch, ctx, cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp, v)
    if table:
        return sum(table_flops(*dims, run.model.cfg.d_vocab, cfg.n_layers).values())
    return sum(readout_flops(*dims, cfg.n_layers).values())


def gemm_rate(size: int = 2048, tries: int = 5) -> tuple[float, float]:
    """FLOP/s of a size x size float32 matmul, best of `tries`: by wall time, and by the
    process's CPU time (per thread: what the core gave while it ran, robust to time slicing)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    wall = cpu = float("inf")
    for _ in range(tries):
        t0, c0 = time.perf_counter(), time.process_time()
        a @ b
        wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, (time.process_time() - c0) / torch.get_num_threads())
    return 2.0 * size**3 / wall, 2.0 * size**3 / cpu


def build(cfg):
    from groklens.tasks import TASKS
    from groklens.trainers.single import SingleRun

    class NoWriter:
        path = "unused.h5"

    return SingleRun(cfg, TASKS.get(cfg.task).build(cfg), lambda _s: NoWriter(), progress=False)


class Stepper:
    """A run and its step counter; `block(n)` times n train_step calls, seconds per step."""

    def __init__(self, cfg, setup=None):
        self.run, self.step, self.setup = build(cfg), 0, setup or (lambda: None)
        self.first_s = None  # wall seconds of the first step (a compiled run compiles in it)

    def block(self, n: int) -> tuple[float, float]:
        """(wall seconds, CPU seconds per thread) per step."""
        self.setup()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            failed = self.run.train_step(self.step)
            self.step += 1
            if failed:
                raise RuntimeError(f"the benchmark run stopped: {failed[0][1]}")
            if self.first_s is None:
                self.first_s = time.perf_counter() - t0
        return (time.perf_counter() - t0) / n, (time.process_time() - c0) / n / torch.get_num_threads()


def measure(name: str, threads: int, args) -> dict:
    torch.set_num_threads(threads)
    cfg = paper_config(name)
    arms = {"step": Stepper(cfg, lambda: _paths(lean=True, table=True))}
    if args.variant:
        arms["step.rows"] = Stepper(cfg, lambda: _paths(lean=True, table=False))
        arms["step.before"] = Stepper(cfg, lambda: _paths(lean=False, table=False))
    if args.compile:
        arms["step.compiled"] = Stepper(cfg.replace(compile=True), lambda: _paths(lean=True, table=True))
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in arms}
    gemm = gemm_rate()
    for arm in arms.values():
        arm.block(args.warmup)
    for _ in range(args.repeats):
        for k, arm in arms.items():
            times[k].append(arm.block(args.block))
    _paths(lean=True, table=True)
    gemm = [max(a, b) for a, b in zip(gemm, gemm_rate())]  # before and after the steps: the best of 10
    flops, done = model_flops(cfg, arms["step"].run), model_flops(cfg, arms["step"].run, table=True)
    out = {"model": name, "threads": threads, "load_avg_1min": os.getloadavg()[0], "gflop": flops / 1e9,
           "gemm_gflops": gemm[0] / 1e9,
           "bound_ms": 1e3 * flops / gemm[0], "gemm_gflops_cpu": gemm[1] / 1e9, "bound_ms_cpu": 1e3 * flops / gemm[1],
           "table_gflop": done / 1e9, "table_bound_ms_cpu": 1e3 * done / gemm[1]}
    if args.compile:
        out.update(compile_s=arms["step.compiled"].first_s, eager_first_s=arms["step"].first_s)
    for k, ts in times.items():
        ms, cpu_ms = (1e3 * statistics.median(t[i] for t in ts) for i in (0, 1))
        out.update({f"{k}_ms": ms, f"{k}_ratio": out["bound_ms"] / ms,
                    f"{k}_cpu_ms": cpu_ms, f"{k}_cpu_ratio": out["bound_ms_cpu"] / cpu_ms})
    return out


def _paths(lean: bool, table: bool) -> None:
    """Which CPU forward path the next steps take: the lean one (else the explicit one, the step
    before issue 31), and on it the first block from its table (else on the batch's rows)."""
    from groklens.models.transformer import Transformer

    Transformer.lean_path, Transformer.embedding_table = lean, table


def _line(row: dict, variant: bool, compiled: bool) -> str:
    out = (f"{row['model']:11s} threads {row['threads']} (load {row['load_avg_1min']:.1f}): {row['gflop']:.2f} GFLOP "
           f"| wall: step {row['step_ms']:.1f} ms, "
           f"GEMM {row['gemm_gflops']:.1f} GFLOP/s, bound {row['bound_ms']:.1f} ms, ratio {row['step_ratio']:.2f}"
           f" | CPU time: step {row['step_cpu_ms']:.1f} ms, GEMM {row['gemm_gflops_cpu']:.1f} GFLOP/s, "
           f"ratio {row['step_cpu_ratio']:.2f}")
    out += (f" | the table step's own {row['table_gflop']:.2f} GFLOP: bound {row['table_bound_ms_cpu']:.1f} ms, "
            f"ratio {row['table_bound_ms_cpu'] / row['step_cpu_ms']:.2f}")
    if variant:
        for arm, what in (("step.rows", "rows"), ("step.before", "before")):
            out += (f" | {what}: wall {row[arm + '_ms']:.1f} ms (ratio {row[arm + '_ratio']:.2f}), "
                    f"CPU {row[arm + '_cpu_ms']:.1f} ms (ratio {row[arm + '_cpu_ratio']:.2f}), "
                    f"step/{what} {row['step_cpu_ms'] / row[arm + '_cpu_ms']:.2f}")
    if compiled:
        out += (f" | compiled: first step {row['compile_s']:.1f} s (eager {row['eager_first_s']:.2f} s), "
                f"wall {row['step.compiled_ms']:.1f} ms, CPU {row['step.compiled_cpu_ms']:.1f} ms "
                f"(ratio {row['step.compiled_cpu_ratio']:.2f}), compiled/eager "
                f"{row['step.compiled_cpu_ms'] / row['step_cpu_ms']:.2f}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--variant", action="store_true",
                    help="also time the step on the batch's rows and the step before issue 31 (alternating)")
    ap.add_argument("--compile", action="store_true", help="also time the step with compile=true (alternating)")
    ap.add_argument("--json", metavar="OUT", help="also write the rows as JSON to OUT")
    args = ap.parse_args(argv)
    rows = []
    for threads in args.threads:
        for name in args.models:
            row = measure(name, threads, args)
            rows.append(row)
            print(_line(row, args.variant, args.compile), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load_avg": list(os.getloadavg()), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

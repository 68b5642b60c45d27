"""The local learning coefficient (LLC) by SGLD (docs/ANALYSES.md, "llc").

  LLC_hat(w*) = n*beta * (E_w[L_n(w)] - L_n(w*)),   beta = 1 / log n by default

w* is the checkpoint, L_n the run's own task loss (cross-entropy, or its StableMax loss) at the
readout position(s), a per-input mean over the evaluation set of n inputs (default: the run's
training inputs), weight decay and regularizer terms excluded. The expectation is over the
localized tempered posterior exp(-n*beta L_n(w) - gamma/2 ||w - w*||^2), sampled by SGLD:
`chains` chains of `burnin` + `draws` steps of size `lr`, minibatches of `minibatch` inputs,
localization gamma = `localization`, inverse temperature `nbeta` (None: n / log n). Each chain's
estimate averages its loss over the draws (the steps after burn-in, as Lau et al. 2023).

Two samplers give the same update (devinterp 2.x's SGMCMC.sgld):
  backend="vmap"       (default) every chain at once, vectorized (analyses/sgld.py): every input
                       enters every epoch of minibatches; L_n(w*) is the exact mean over the n inputs
  backend="devinterp"  devinterp's own `devinterp.slt.sampling.sample`, chain after chain (the
                       reference): its DataLoader drops the last partial minibatch and replays its
                       first epoch, so only n - (n mod minibatch) inputs ever enter, and its
                       L_n(w*) is the mean over 32 minibatches; the default n*beta is computed from
                       the inputs that enter. Each "sequence" devinterp sees is one input's row index.
llc_devinterp is devinterp's `compute_llc` definition (every step averaged, burn-in included).

Diagnostics (devinterp 2.x computes no MALA acceptance; these show an uncalibrated sampler):
  trace         [chains, <= TRACE_BINS] n*beta (L - L_n(w*)) over every step (burn-in
                included), in equal consecutive blocks: flat after burn-in once a chain mixed
  trace_drift   [chains] n*beta x (mean loss over the second half of the draws - first half):
                ~0 when stationary; >> 0 the chain still climbs (too few steps, lr too small);
                < 0 it finds lower loss than w* (not a minimum: the LLC can come out negative)
  failed_chains chains whose loss went non-finite (lr too large): llc_mean is then NaN
  distance      [chains] ||w - w*|| at the last step (vmap; devinterp: with save_metrics)
  grad_noise    [chains] the mean over the draws of ||gradient step|| / ||noise step||
                (NaN unless save_metrics; devinterp's save_metrics makes a step ~2.5x slower)

Flags (1 / 0 per checkpoint; `analyze`, the compare / report tables and fig_llc mark them):
  negative      llc_mean < 0: the chains found lower loss than w* (not a local minimum, or the
                sampler is uncalibrated): not a learning coefficient
  pinned        the chains' mean distance from w* is within PINNED_BAND of sqrt(d / gamma), where
                the localization term alone would hold them (d parameters, gamma = localization):
                the localization dominates, the loss barely moves the chains, and the estimate
                says more about gamma than about the loss landscape
  distance_ratio  that mean distance / sqrt(d / gamma) (NaN without distances or with gamma 0)
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import io
import math
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from groklens.analyses.common import check_loss, eval_rows
from groklens.analyses.registry import analysis, batch_of
from groklens.errors import BadInput

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from groklens.tasks import TaskData

TRACE_BINS = 20
SEED_STRIDE = 1_000_003  # > any number of chains (analyses/sgld.py uses the same)
BACKENDS = ("vmap", "devinterp")
# the recommendation of `groklens llc-calibrate` (its default grid) on the README's p=23 run at steps
# 800 and 3,000 (docs/ANALYSES.md, "llc", "Calibrating"); devinterp 2.x has no default
DEFAULT_LR = 3e-7
DEFAULT_LOCALIZATION = 1e5



# limits checked before devinterp allocates a chain (issue 29): far above any calibrated setting
LIMITS = {"lr": 1.0, "localization": 1e12, "nbeta": 1e15, "chains": 1024, "draws": 1_000_000,
          "burnin": 1_000_000, "seed": 2**32 - 1}
MAX_TOTAL_STEPS = 10_000_000  # chains x (burnin + draws) SGLD steps
# a chain at sqrt(d / gamma) +- 10% sits where the localization alone would hold it (the chi
# distribution of d dimensions has a relative spread of ~1/sqrt(2d), far below this at d >= 100)
PINNED_BAND = 0.1


def _positive_int(name: str, v, lo: int) -> int:
    hi = LIMITS.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        raise BadInput(f"llc: {name} must be an integer >= {lo}" + (f" and <= {hi}" if hi is not None else "")
                       + f"; got {v!r}")
    return v


def _positive_number(name: str, v, *, zero: bool = False) -> float:
    hi = LIMITS[name]
    ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (v >= 0 if zero else v > 0)
          and v <= hi)
    if not ok:
        raise BadInput(f"llc: {name} must be a {'non-negative' if zero else 'positive'} finite number <= {hi:g}; "
                       f"got {v!r}")
    return float(v)


def check_hyperparameters(*, lr, localization, nbeta, chains, draws, burnin, minibatch, seed, n_rows: int,
                          backend: str = "vmap") -> None:
    """Every check of the llc hyperparameters, in one place (the analysis, its runner check and
    llc-calibrate call it)."""
    _positive_number("lr", lr)
    _positive_number("localization", localization, zero=True)
    if nbeta is not None:
        _positive_number("nbeta", nbeta)
    _positive_int("chains", chains, 1)
    _positive_int("draws", draws, 2)  # the drift compares two halves of the draws
    _positive_int("burnin", burnin, 0)
    _positive_int("seed", seed, 0)
    if chains * (burnin + draws) > MAX_TOTAL_STEPS:
        raise BadInput(f"llc: chains x (burnin + draws) = {chains * (burnin + draws)} SGLD steps is over "
                       f"{MAX_TOTAL_STEPS:,}")
    if _positive_int("minibatch", minibatch, 1) > n_rows:
        raise BadInput(f"llc: minibatch ({minibatch}) is larger than the evaluation set ({n_rows} inputs)")
    if n_rows < 2:
        raise BadInput("llc: the evaluation set needs at least 2 inputs")
    if backend not in BACKENDS:
        raise BadInput(f"llc: backend must be one of {', '.join(BACKENDS)}; got {backend!r}")


def default_nbeta(n: int) -> float:
    """n / log n: beta = 1 / log n (Watanabe's WBIC temperature) for n inputs; the same formula
    as devinterp.utils.default_nbeta, which applies it to the minibatch size instead."""
    from devinterp.utils import default_nbeta as _default

    return float(_default(int(n)))


def rows_entering(n_rows: int, minibatch: int, backend: str) -> int:
    """Inputs that ever enter the sampler: all of them (vmap), or devinterp's full minibatches."""
    return n_rows if backend == "vmap" else n_rows - n_rows % minibatch


class _Rows:
    """devinterp's dataset and loss: each "sequence" is [row, row], its one "token" loss the
    model's loss on input `row` (devinterp reads per-token losses of shape [batch, seq - 1])."""

    def __init__(self, row_loss: Callable, n_rows: int):
        from datasets import Dataset

        self.row_loss = row_loss
        self.dataset = Dataset.from_dict({"input_ids": [[i, i] for i in range(n_rows)]}).with_format("torch")

    def loss_fn(self, holder, input_ids: torch.Tensor) -> torch.Tensor:
        return self.row_loss(holder.model, input_ids[:, 0]).unsqueeze(1)


def _holder(model):
    """The model inside a plain module: devinterp moves TransformerLens-like models (a cfg with
    n_heads) with TL's .to(print_details=...), which our hooked models do not take."""
    from torch import nn

    class Holder(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.model = inner

    return Holder(model)


@contextlib.contextmanager
def _kept_global_rngs(device: str):
    """devinterp seeds the global random, numpy and torch generators per chain: the caller's
    (the next analysis's) draws must not depend on whether llc ran before them."""
    import random

    import torch

    py, npy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[torch.device(device)] if device.startswith("cuda") else []):
        try:
            yield
        finally:
            random.setstate(py)
            np.random.set_state(npy)


def _blocks(x: np.ndarray, k: int) -> np.ndarray:
    """Means of k near-equal consecutive blocks along the last axis (fewer when it is shorter)."""
    parts = np.array_split(x, min(k, x.shape[-1]), axis=-1)
    return np.stack([p.mean(-1) for p in parts], axis=-1)


def _devinterp_trace(model, row_loss: Callable, n_rows: int, *, lr, localization, nb, chains, draws, burnin,
                     minibatch, seed, save_metrics) -> tuple[np.ndarray, float, dict | None]:
    """devinterp's sample(): (loss trace [chains, steps], its init loss, its save_metrics norms)."""
    from devinterp.slt.llc import compute_llc
    from devinterp.slt.sampling import sample

    rows = _Rows(row_loss, n_rows)
    device = str(next(model.parameters()).device)
    tmp = Path(tempfile.mkdtemp(prefix="groklens-llc-"))
    # devinterp runs gc.collect() around every chain: ~1 s each over torch's and transformers'
    # objects; frozen, they are skipped (new garbage is still collected)
    gc.freeze()
    try:
        # devinterp warns per failed chain (we count them) and draws a progress bar per chain
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()), _kept_global_rngs(device):
            warnings.simplefilter("ignore")
            tree = sample(_holder(model), rows.dataset, {}, lr=float(lr), n_beta=nb, num_chains=chains,
                          num_draws=draws, num_burnin_steps=burnin, batch_size=minibatch,
                          localization=float(localization),
                          # chain c draws from init_seed + c: seeds far apart share no chain
                          init_seed=seed * SEED_STRIDE, device=device, save_metrics=bool(save_metrics),
                          output_path=tmp / "samples.zarr", loss_fn=rows.loss_fn)
        summary = compute_llc(tree)
        trace = np.asarray(summary["loss_trace"].values, dtype=np.float64)  # [chains, burnin + draws]
        init_loss = float(summary["init_loss"].values)
        metrics = {k: np.asarray(tree.dataset[f"metrics_{k}"].values, dtype=np.float64)
                   for k in ("distance", "scaled_grad", "noise")} if save_metrics else None
        tree.close()
    finally:
        gc.unfreeze()
        shutil.rmtree(tmp, ignore_errors=True)
    if metrics is not None:
        with np.errstate(invalid="ignore", divide="ignore"):
            metrics = {"distance": metrics["distance"][:, -1],
                       "grad_noise": (metrics["scaled_grad"][:, burnin:] / metrics["noise"][:, burnin:]).mean(axis=1)}
    return trace, init_loss, metrics


def sgld_llc(model, row_loss: Callable, n_rows: int, *, lr: float, localization: float, nbeta: float | None,
             chains: int, draws: int, burnin: int, minibatch: int, seed: int = 0, save_metrics: bool = False,
             backend: str = "vmap") -> dict:
    """The LLC at `model`'s parameters for the per-input loss row_loss(model, rows [b]) -> [b]
    over rows 0..n_rows-1; see the module docstring for the values."""
    check_hyperparameters(lr=lr, localization=localization, nbeta=nbeta, chains=chains, draws=draws, burnin=burnin,
                          minibatch=minibatch, seed=seed, n_rows=n_rows, backend=backend)
    nb = default_nbeta(rows_entering(n_rows, minibatch, backend)) if nbeta is None else float(nbeta)
    if backend == "devinterp":
        trace, init_loss, metrics = _devinterp_trace(model, row_loss, n_rows, lr=lr, localization=localization, nb=nb,
                                                     chains=chains, draws=draws, burnin=burnin, minibatch=minibatch,
                                                     seed=seed, save_metrics=save_metrics)
        if metrics is None:
            metrics = {"distance": np.full(chains, np.nan), "grad_noise": np.full(chains, np.nan)}
    else:
        from groklens.analyses.sgld import sample

        out = sample(model, row_loss, n_rows, [(float(lr), nb, float(localization))], chains=chains, burnin=burnin,
                     draws=draws, minibatch=minibatch, seed=seed, grad_noise=save_metrics)
        trace, init_loss = out["trace"][0, 0], float(out["init_loss"][0])
        metrics = {"distance": out["distance"][0, 0], "grad_noise": out["grad_noise"][0, 0]}
    return summarise(trace, init_loss, nb, burnin, metrics)


def summarise(trace: np.ndarray, init_loss: float, nb: float, burnin: int, metrics: dict) -> dict:
    """The llc values from a loss trace [chains, burnin + draws] (module docstring)."""
    failed = ~np.isfinite(trace).all(axis=1)
    drawn = trace[:, burnin:]
    per_chain = nb * (drawn.mean(axis=1) - init_loss)
    half = drawn.shape[1] // 2
    drift = nb * (drawn[:, half:].mean(axis=1) - drawn[:, :half].mean(axis=1))
    n = len(per_chain)
    ok = not failed.any()
    return {
        "llc_mean": float(per_chain.mean()) if ok else float("nan"),
        "llc_std": float(per_chain.std(ddof=1)) if ok and n > 1 else float("nan"),
        "llc_per_chain": np.where(failed, np.nan, per_chain),
        "llc_devinterp": float(nb * (trace.mean() - init_loss)) if ok else float("nan"),
        "init_loss": init_loss,
        "nbeta": nb,
        "trace": _blocks(nb * (trace - init_loss), TRACE_BINS),
        "trace_drift": np.where(failed, np.nan, drift),
        "failed_chains": int(failed.sum()),
        "distance": np.asarray(metrics["distance"], dtype=float),
        "grad_noise": np.asarray(metrics["grad_noise"], dtype=float),
    }


HYPERPARAMETERS = ("lr", "localization", "nbeta", "chains", "draws", "burnin", "minibatch", "seed", "backend")


def check(model, data: TaskData, params: dict) -> None:
    rows = eval_rows(data, params.get("eval_set", "train"))
    check_loss(params.get("loss"))
    defaults = inspect.signature(llc).parameters
    check_hyperparameters(**{k: params.get(k, defaults[k].default) for k in HYPERPARAMETERS}, n_rows=len(rows))


def task_row_loss(model, data: TaskData, rows: torch.Tensor, kind: str) -> Callable:
    """row_loss(m, idx) -> [b]: the run's task loss of each of the inputs `rows[idx]`, from the
    readout-only forward pass where the model has one (the trainer's)."""
    from groklens.models.losses import task_loss

    device = next(model.parameters()).device
    inputs, labels = data.inputs[rows].to(device), data.labels[rows].to(device)
    pos = data.readout_positions
    window = slice(pos[0], pos[-1] + 1)
    readout = getattr(model, "supports_readout", False)

    def row_loss(m, idx: torch.Tensor) -> torch.Tensor:
        idx = idx.to(device)
        logits = m(inputs[idx], readout=window) if readout else m(inputs[idx])[:, window]
        y = labels[idx]
        return task_loss(logits[:, 0] if y.dim() == 1 else logits, y, kind, reduction="none")

    return row_loss


@analysis("llc", "local learning coefficient by devinterp's SGLD, with per-chain spread and loss-trace diagnostics",
          check=check, tier="named",
          measures=[("llc", "llc_mean", "local learning coefficient (SGLD, mean over chains)")], order=100)
def llc(
    model,
    data: TaskData,
    *,
    lr: float = DEFAULT_LR,
    localization: float = DEFAULT_LOCALIZATION,
    nbeta: float | None = None,
    chains: int = 4,
    draws: int = 200,
    burnin: int = 50,
    minibatch: int = 32,
    eval_set: str = "train",
    loss: str | None = None,
    seed: int = 0,
    save_metrics: bool = False,
    backend: str = "vmap",
) -> dict:
    """LLC at one checkpoint (module docstring): llc_mean, llc_std (across chains, ddof 1),
    llc_per_chain, llc_devinterp, init_loss, nbeta (the value used), trace, trace_drift,
    failed_chains, distance, grad_noise, n_params. The same seed at every checkpoint (common
    random numbers: the curve's steps differ by the checkpoint, not the noise). `loss` None
    means cross-entropy (`compute` passes the run's training loss)."""
    params = {k: v for k, v in locals().items() if k in HYPERPARAMETERS}
    # eval_rows and check_loss refuse a bad eval_set / loss, sgld_llc bad hyperparameters: the
    # runner's check() already ran once for all checkpoints
    rows = eval_rows(data, eval_set)
    out = sgld_llc(model, task_row_loss(model, data, rows, check_loss(loss)), len(rows), **params,
                   save_metrics=save_metrics)
    out["n_params"] = sampled_params(model)
    return with_flags(out, localization)


def sampled_params(model) -> int:
    """d, the number of parameters the chains move (those that train)."""
    return int(sum(p.numel() for p in model.parameters() if p.requires_grad))


def with_flags(out: dict, localization: float) -> dict:
    """`out` with its flags (module docstring): negative, pinned, distance_ratio."""
    d, distance = out["n_params"], np.asarray(out["distance"], dtype=float)
    finite = distance[np.isfinite(distance)]
    ratio = float(finite.mean() / math.sqrt(d / localization)) if localization > 0 and len(finite) else float("nan")
    out["distance_ratio"] = ratio
    out["pinned"] = int(math.isfinite(ratio) and abs(ratio - 1) <= PINNED_BAND)
    out["negative"] = int(math.isfinite(out["llc_mean"]) and out["llc_mean"] < 0)
    return out


CENTER_LANES = 256  # lanes (checkpoints x chains) per vectorized pass of llc_many


@batch_of("llc")
def llc_many(models: list, data: TaskData, **params) -> list[dict]:
    """llc() at several checkpoints of one run at once (the same architecture): with backend=vmap
    every checkpoint's chains run in one vectorized pass (analyses/sgld.py, `centers`); chain c
    draws the same noise and minibatches at every checkpoint, so each result is llc(model) of that
    checkpoint. The runner calls it for a trajectory (Analysis.batch_func)."""
    full = {**{k: p.default for k, p in inspect.signature(llc).parameters.items()
               if p.default is not inspect.Parameter.empty}, **params}
    if full["backend"] != "vmap" or full["save_metrics"] or len(models) < 2:
        return [llc(m, data, **params) for m in models]
    from groklens.analyses.sgld import sample

    rows = eval_rows(data, full["eval_set"])
    hp = {k: full[k] for k in HYPERPARAMETERS}
    check_hyperparameters(**hp, n_rows=len(rows))
    nb = default_nbeta(len(rows)) if hp["nbeta"] is None else float(hp["nbeta"])
    row_loss = task_row_loss(models[0], data, rows, check_loss(full["loss"]))
    per = max(1, CENTER_LANES // hp["chains"])
    out: list[dict] = []
    for start in range(0, len(models), per):
        part = models[start : start + per]
        res = sample(part[0], row_loss, len(rows), [(float(hp["lr"]), nb, float(hp["localization"]))],
                     chains=hp["chains"], burnin=hp["burnin"], draws=hp["draws"], minibatch=hp["minibatch"],
                     seed=hp["seed"], centers=part)
        for k, m in enumerate(part):
            r = summarise(res["trace"][k, 0], float(res["init_loss"][k]), nb, hp["burnin"],
                          {"distance": res["distance"][k, 0], "grad_noise": res["grad_noise"][k, 0]})
            r["n_params"] = sampled_params(m)
            out.append(with_flags(r, float(hp["localization"])))
    return out


"""The grokking scaling law (REFERENCES.md, definition 8): log T against the logs of width,
training data, learning rate and weight decay, over the runs of a sweep directory.

T is the grokking step (groklens.analyses.grokking: first evaluated step with test accuracy
>= threshold). A run that never crosses is right-censored at its last evaluated step. By
default censored runs are counted and left out of the fit (ordinary least squares on the
runs that grokked, which biases exponents toward the uncensored runs); with `censored=True`
a Tobit model (normal errors on log T, right-censored at log of the last step) is fitted by
maximum likelihood with scipy.optimize, and reported beside the OLS fit.

Model: log T = c + sum_v a_v log v + e, e ~ N(0, s^2). Exponents a_v come with 95%
confidence intervals: OLS from the usual covariance s^2 (X'X)^-1 and Student's t with n - k - 1
degrees of freedom; Tobit from the inverse of the numerical Hessian of the negative
log-likelihood and the normal quantile. R^2 is reported for the main-effects model and for
the model with every pairwise interaction log u * log v added (logs centred first, so the
main effects of that model are exponents at the geometric-mean configuration). For the
Tobit fit, `r2_uncensored` is 1 - SSE/SST of the latent prediction on the grokked runs (our
definition; there is no standard R^2 for censored fits).

Variables: `width` is the model's hidden width, per model (WIDTH_FIELDS: d_mlp for both the
transformer and the MLP, whose hidden layers are d_mlp wide); `n_train` is the number of
training examples; any other numeric config field (`train_frac`, `lr`, `weight_decay`, `p`,
...) is read from the stored config. A run with a value <= 0 (weight_decay 0, say) has no
logarithm: it is excluded from the fit and listed, and still shown in the phase diagram.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

from groklens.analyses.grokking import grok_evals_of, grokking_times
from groklens.config import GROK_THRESHOLD
from groklens.errors import BadInput
from groklens.fileio import check_output_file, check_writable_dir, staged_outputs

DEFAULT_VARS = ("width", "train_frac", "lr", "weight_decay")
# the config field that is each model's hidden width (the MLP of the scaling-law study has
# n_layers hidden layers of d_mlp units each; see the `mlp` preset in groklens/config.py)
WIDTH_FIELDS = {"transformer": "d_mlp", "mlp": "d_mlp"}
RESULT_JSON = "scaling-law.json"
RESULT_FIGURE = "scaling-law.png"
MIN_LEVELS = 3  # fewer distinct values of a variable: the fit is said to be weak (a warning)


@dataclass
class GrokRecord:
    name: str
    values: dict[str, float]
    grok_step: int | None  # None: censored
    last_step: int | None
    # the weight norm from memorization to grokking (`weight_norm_transition`); None: not grokked,
    # or not read
    weight_norm: dict[str, Any] | None = None

    @property
    def censored(self) -> bool:
        return self.grok_step is None


@dataclass
class Collected:
    records: list[GrokRecord]
    skipped: dict[str, list[str]] = field(default_factory=dict)  # reason -> run names


def variable_value(var: str, cfg: dict, n_train: int | None = None) -> float:
    """The value of one scaling variable for a run's stored config."""
    if var == "width":
        model = cfg.get("model")
        if model not in WIDTH_FIELDS:
            raise BadInput(f"'width' is not defined for model {model!r}; name its width field in --vars")
        return float(cfg[WIDTH_FIELDS[model]])
    if var == "n_train":
        if n_train is None:
            raise BadInput("n_train needs the run's data")
        return float(n_train)
    if var not in cfg:
        raise BadInput(f"unknown scaling variable {var!r} (width, n_train, or a numeric config field)")
    value = cfg[var]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadInput(f"scaling variable {var!r} is not numeric (it is {value!r})")
    return float(value)


def collect_runs(directory: str | Path, variables: Sequence[str], threshold: float = GROK_THRESHOLD) -> Collected:
    """Grokking times and variable values of every finished run (*.h5) in `directory`."""
    from groklens.checkpoints import Trajectory
    from groklens.checkpoints.constants import SIDECAR_SUFFIX

    directory = Path(directory)
    if not directory.is_dir():
        raise BadInput(f"{directory}: no such directory")
    if not 0 < threshold <= 1:
        raise BadInput(f"threshold must be in (0, 1]; got {threshold}")
    out = Collected([])
    files = sorted(p for p in directory.glob("*.h5") if not p.name.endswith(SIDECAR_SUFFIX))
    if not files:
        raise BadInput(f"{directory} holds no trajectory files (*.h5)")
    key = f"{threshold:g}"
    inodes: set[tuple[int, int]] = set()
    for path in files:
        # a name in another encoding is shown with replacement characters, never written raw
        name = path.name[: -len(".h5")].encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        try:
            st = path.stat()
        except OSError:
            out.skipped.setdefault("unreadable", []).append(name)
            continue
        if (st.st_dev, st.st_ino) in inodes:  # a hard link (or a link) to a run already counted
            out.skipped.setdefault("same file as another run", []).append(name)
            continue
        inodes.add((st.st_dev, st.st_ino))
        try:
            traj = Trajectory(path)
            status = traj.status
            if not status.startswith("completed"):
                out.skipped.setdefault("unfinished", []).append(name)
                continue
            cfg = traj.config_dict
            n_train = None
            if "n_train" in variables:
                n_train = len(traj.dataset().train_idx)
            values = {v: variable_value(v, cfg, n_train) for v in variables}
            metrics = traj.metrics
            times = grokking_times(metrics, (threshold,), grok_evals_of(traj.config_dict))
        except BadInput as exc:
            if "scaling variable" in str(exc) or "'width'" in str(exc):
                raise
            out.skipped.setdefault("unreadable", []).append(name)
            continue
        grok, memo = times["grokking_step"][key], times["memorization_step"][key]
        wn = None
        if grok is not None and memo is not None and "weight_norm" in metrics:
            wn = weight_norm_transition(metrics["step"], metrics["weight_norm"], memo, grok)
        out.records.append(GrokRecord(name, values, grok, times["last_step"], wn))
    return out


# ---------------------------------------------------------------------- fits
def _design(logx: np.ndarray, names: list[str], interactions: bool) -> tuple[np.ndarray, list[str]]:
    if not interactions:
        return logx, list(names)
    centred = logx - logx.mean(axis=0)
    cols, labels = [centred], list(names)
    for i, j in combinations(range(len(names)), 2):
        cols.append((centred[:, i] * centred[:, j])[:, None])
        labels.append(f"{names[i]}*{names[j]}")
    return np.hstack(cols), labels


def ols_fit(X: np.ndarray, y: np.ndarray, names: Sequence[str]) -> dict[str, Any]:
    """OLS of y on X with an intercept (scikit-learn), with 95% intervals from its covariance."""
    from scipy import stats
    from sklearn.linear_model import LinearRegression

    n, k = X.shape
    if n <= k + 1:
        raise BadInput(f"{n} runs are too few to fit {k} exponents and an intercept")
    A = np.hstack([np.ones((n, 1)), X])
    if np.linalg.matrix_rank(A) < k + 1:
        raise BadInput("the variables are collinear over these runs (one is a function of the others)")
    reg = LinearRegression().fit(X, y)
    resid = y - reg.predict(X)
    dof = n - k - 1
    sigma2 = float(resid @ resid) / dof
    cov = sigma2 * np.linalg.inv(A.T @ A)
    se = np.sqrt(np.diag(cov))
    tq = float(stats.t.ppf(0.975, dof))
    coef = np.concatenate([[reg.intercept_], reg.coef_])
    sst = float(((y - y.mean()) ** 2).sum())
    return {
        "method": "ols",
        "n": int(n),
        "intercept": {"estimate": float(coef[0]), "se": float(se[0]),
                      "ci95": [float(coef[0] - tq * se[0]), float(coef[0] + tq * se[0])]},
        "exponents": {name: {"estimate": float(coef[i + 1]), "se": float(se[i + 1]),
                             "ci95": [float(coef[i + 1] - tq * se[i + 1]), float(coef[i + 1] + tq * se[i + 1])]}
                      for i, name in enumerate(names)},
        "r2": 1.0 - float(resid @ resid) / sst if sst > 0 else float("nan"),
        "sigma": math.sqrt(sigma2),
    }


def tobit_fit(X: np.ndarray, y: np.ndarray, censored: np.ndarray, names: Sequence[str]) -> dict[str, Any]:
    """Right-censored normal regression of y on X (y[censored] is the censoring point).

    Maximum likelihood with scipy.optimize (BFGS, analytic gradient), started from OLS on the
    uncensored rows; standard errors from the inverse of a central-difference Hessian.
    """
    from scipy import optimize, stats

    n, k = X.shape
    A = np.hstack([np.ones((n, 1)), X])
    cens = np.asarray(censored, dtype=bool)
    unc = ~cens
    if unc.sum() <= k + 1:
        raise BadInput(f"only {int(unc.sum())} runs grokked: too few for a censored fit of {k} exponents")
    if np.linalg.matrix_rank(A) < k + 1:
        raise BadInput("the variables are collinear over these runs (one is a function of the others)")

    def nll_and_grad(theta):
        b, log_s = theta[:-1], theta[-1]
        s = math.exp(log_s)
        mu = A @ b
        z = (y - mu) / s
        ll_u = stats.norm.logpdf(z[unc]) - log_s
        ll_c = stats.norm.logsf(z[cens])
        nll = -(ll_u.sum() + ll_c.sum())
        lam = np.exp(stats.norm.logpdf(z[cens]) - ll_c)  # inverse Mills ratio
        g_b = -(A[unc].T @ (z[unc] / s)) - (A[cens].T @ (lam / s))
        g_s = -((z[unc] ** 2 - 1).sum()) - (lam * z[cens]).sum()
        return nll, np.concatenate([g_b, [g_s]])

    b0, *_ = np.linalg.lstsq(A[unc], y[unc], rcond=None)
    r0 = y[unc] - A[unc] @ b0
    theta0 = np.concatenate([b0, [math.log(max(r0.std(), 1e-3))]])
    res = optimize.minimize(nll_and_grad, theta0, jac=True, method="BFGS",
                            options={"gtol": 1e-8, "maxiter": 10_000})
    theta = res.x
    # numerical Hessian of the negative log-likelihood (central differences of the gradient)
    h = 1e-5 * np.maximum(1.0, np.abs(theta))
    H = np.empty((len(theta), len(theta)))
    for i in range(len(theta)):
        e = np.zeros_like(theta)
        e[i] = h[i]
        H[:, i] = (nll_and_grad(theta + e)[1] - nll_and_grad(theta - e)[1]) / (2 * h[i])
    H = (H + H.T) / 2
    try:
        cov = np.linalg.inv(H)
        se = np.sqrt(np.clip(np.diag(cov), 0, None))
    except np.linalg.LinAlgError:
        se = np.full(len(theta), np.nan)
    zq = float(stats.norm.ppf(0.975))
    b = theta[:-1]
    pred = A @ b
    sst = float(((y[unc] - y[unc].mean()) ** 2).sum())
    sse = float(((y[unc] - pred[unc]) ** 2).sum())
    return {
        "method": "tobit",
        "n": int(n),
        "n_censored": int(cens.sum()),
        # BFGS often stops with "precision loss" at the optimum: judge by the gradient instead
        "converged": bool(res.success or np.max(np.abs(res.jac)) < 1e-5),
        "gradient_max": float(np.max(np.abs(res.jac))),
        "log_likelihood": float(-res.fun),
        "intercept": {"estimate": float(b[0]), "se": float(se[0]),
                      "ci95": [float(b[0] - zq * se[0]), float(b[0] + zq * se[0])]},
        "exponents": {name: {"estimate": float(b[i + 1]), "se": float(se[i + 1]),
                             "ci95": [float(b[i + 1] - zq * se[i + 1]), float(b[i + 1] + zq * se[i + 1])]}
                      for i, name in enumerate(names)},
        "sigma": math.exp(theta[-1]),
        "r2_uncensored": 1.0 - sse / sst if sst > 0 else float("nan"),
    }


def fit_scaling_law(records: Sequence[GrokRecord], variables: Sequence[str], *, censored: bool = False,
                    interactions: bool = False) -> dict[str, Any]:
    """Fit log T on log variables over `records`; see the module docstring."""
    variables = list(variables)
    if not variables:
        raise BadInput("give at least one scaling variable")
    if len(set(variables)) != len(variables):
        raise BadInput(f"a scaling variable is repeated: {', '.join(variables)}")
    nonpositive = [r.name for r in records if any(r.values[v] <= 0 for v in variables)]
    at_zero = [r.name for r in records if r.grok_step == 0]
    usable = [r for r in records if r.name not in set(nonpositive) | set(at_zero)]
    grokked = [r for r in usable if not r.censored]
    cens = [r for r in usable if r.censored]
    if not usable:
        raise BadInput(f"none of the {len(records)} runs can be fitted: {len(nonpositive)} have a variable <= 0 "
                       f"(no logarithm), {len(at_zero)} reached the threshold at step 0")
    warnings = []
    for v in variables:
        distinct = {r.values[v] for r in usable}
        if len(distinct) < 2:
            raise BadInput(f"scaling variable {v!r} takes one value ({next(iter(distinct), 'none')}) over the "
                           "usable runs; drop it from --vars")
        if len(distinct) < MIN_LEVELS:
            warnings.append(f"{v} has only {len(distinct)} levels ({', '.join(f'{x:g}' for x in sorted(distinct))}) "
                            f"over the fitted runs: its exponent is the slope between two group means, and a power "
                            f"law cannot be told from any other curve; sweep >= {MIN_LEVELS} levels")
    if not grokked:
        raise BadInput(f"none of the {len(usable)} usable runs grokked; nothing to fit")

    def logs(rs):
        return np.log(np.array([[r.values[v] for v in variables] for r in rs], dtype=float)).reshape(len(rs), -1)

    X, y = logs(grokked), np.log(np.array([r.grok_step for r in grokked], dtype=float))
    result: dict[str, Any] = {
        "vars": variables,
        "n_runs": len(records),
        "n_grokked": len(grokked),
        "n_censored": len(cens),
        "censored": "tobit" if censored else "excluded",
        "excluded": {"nonpositive_value": nonpositive, "grokked_at_step_0": at_zero},
        "warnings": warnings,
    }
    ols = ols_fit(X, y, variables)
    if len(variables) >= 2:
        Xi, labels = _design(X, variables, interactions=True)
        if len(grokked) > Xi.shape[1] + 1 and (
                np.linalg.matrix_rank(np.hstack([np.ones((len(X), 1)), Xi])) == Xi.shape[1] + 1):
            inter = ols_fit(Xi, y, labels)
            ols["r2_interactions"] = inter["r2"]
            if interactions:
                result["interactions"] = inter
        else:
            ols["r2_interactions"] = None
    result["ols"] = ols
    result["fit"] = "ols"
    if censored:
        allr = grokked + cens
        Xa = logs(allr)
        ya = np.log(np.array([r.grok_step if not r.censored else r.last_step for r in allr], dtype=float))
        ca = np.array([r.censored for r in allr])
        result["tobit"] = tobit_fit(Xa, ya, ca, variables)
        result["fit"] = "tobit"
    return result


# ---------------------------------------------------------------------- the phase boundary
BOUNDARY_LEVEL = 0.5  # the boundary: where the fraction of runs that grokked crosses this
BOUNDARY_BOOT = 2000  # bootstrap resamples of its interval
BOUNDARY_RULE = ("the value where the fraction of runs that grokked within the cap crosses 1/2: linear "
                 "interpolation in log value between the two adjacent grid levels whose fractions straddle 1/2 "
                 "(of several such pairs, the one with the largest step in fraction); 95% interval: percentile "
                 "bootstrap, each level's runs resampled with replacement")


def _crossing(levels: np.ndarray, frac: np.ndarray, level: float) -> tuple[float | None, int | None]:
    """(boundary, i) of BOUNDARY_RULE for fractions `frac` at sorted `levels` (i: the pair's first
    level), or (None, None) where no adjacent pair straddles `level`."""
    best, at = None, None
    for i in range(len(levels) - 1):
        a, b = frac[i] - level, frac[i + 1] - level
        if a * b <= 0 and frac[i] != frac[i + 1] and (best is None or abs(frac[i + 1] - frac[i]) > best):
            best, at = abs(frac[i + 1] - frac[i]), i
    if at is None:
        return None, None
    t = (level - frac[at]) / (frac[at + 1] - frac[at])
    lo, hi = math.log(levels[at]), math.log(levels[at + 1])
    return math.exp(lo + t * (hi - lo)), at


def phase_boundary(values: Sequence[float], grokked: Sequence[bool], level: float = BOUNDARY_LEVEL,
                   n_boot: int = BOUNDARY_BOOT, seed: int = 0) -> dict[str, Any]:
    """The grokked / not-grokked boundary along one variable (BOUNDARY_RULE) over runs with
    positive `values`: the fraction grokked at each level, the boundary (None where no pair of
    levels straddles `level`), the side that groks, and a 95% percentile-bootstrap interval (a
    resample whose fractions cross nowhere puts the boundary beyond the grid on the side its
    fractions say: 0 below the lowest level, inf above the highest)."""
    x = np.asarray(values, dtype=float)
    g = np.asarray(grokked, dtype=bool)
    if len(x) != len(g) or not len(x) or np.any(~np.isfinite(x)) or np.any(x <= 0):
        raise BadInput("the phase boundary needs one positive value per run")
    levels = np.unique(x)
    n = np.array([np.sum(x == v) for v in levels])
    k = np.array([np.sum(g[x == v]) for v in levels])
    frac = k / n
    out: dict[str, Any] = {"levels": levels.tolist(), "n": n.tolist(), "grokked": k.tolist(),
                           "fraction": frac.tolist(), "level": level, "rule": BOUNDARY_RULE,
                           "estimate": None, "ci95": None, "between": None, "grokked_side": None}
    if len(levels) < 2:
        out["why"] = f"one level ({levels[0]:g})"
        return out
    est, at = _crossing(levels, frac, level)
    if est is None:
        out["why"] = (f"more than {level:g} of the runs grokked at every level" if np.all(frac > level) else
                      f"fewer than {level:g} of the runs grokked at every level" if np.all(frac < level) else
                      f"the fractions do not cross {level:g}")
        return out
    above = bool(frac[at + 1] > frac[at])  # runs above the boundary grok
    rng = np.random.default_rng(seed)
    draws = rng.binomial(n[None, :], frac[None, :], size=(n_boot, len(levels))) / n[None, :]
    boots = []
    for f in draws:
        b, _ = _crossing(levels, f, level)
        if b is None:  # beyond the grid: where the fractions put it
            b = (0.0 if above else math.inf) if np.all(f > level) else (math.inf if above else 0.0)
        boots.append(b)
    lo, hi = np.quantile(np.array(boots), [0.025, 0.975], method="inverted_cdf")
    out.update(estimate=est, ci95=[float(lo), float(hi)], between=[float(levels[at]), float(levels[at + 1])],
               grokked_side="above" if above else "below",
               step=[float(frac[at]), float(frac[at + 1])])
    return out


def boundary_text(b: dict[str, Any], name: str = "") -> str:
    """'0.72 [0.55, 0.98] (grokked fraction 0.2 at 0.5 -> 0.9 at 1; runs grok above it)' or why none."""
    fr = ", ".join(f"{v:g}: {k}/{n}" for v, k, n in zip(b["levels"], b["grokked"], b["n"]))
    if b["estimate"] is None:
        return f"no boundary in the grid ({b.get('why', '')}; grokked per level {fr})"
    lo, hi = b["ci95"]
    hi = math.inf if hi is None else hi  # strict JSON wrote an open end as null
    ci = f"[{'< ' + format(b['levels'][0], 'g') if lo == 0 else format(lo, '.3g')}, " \
         f"{'> ' + format(b['levels'][-1], 'g') if math.isinf(hi) else format(hi, '.3g')}]"
    (a, c), (fa, fc) = b["between"], b["step"]
    return (f"{b['estimate']:.3g} {ci} (grokked fraction {fa:.2f} at {name}{a:g} -> {fc:.2f} at {name}{c:g}; runs grok "
            f"{b['grokked_side']} it; grokked per level {fr})")


# ---------------------------------------------------------------------- the weight norm through the transition
NORM_RISE_TOL = 1e-3  # "falls monotonically": no evaluation's weight norm above the previous one's by more


def weight_norm_transition(steps: Sequence[float],
                           norms: Sequence[float], start: int, end: int) -> dict[str, Any] | None:
    """The weight norm over the evaluations from `start` (memorization) to `end` (grokking),
    both included: its first and last value, the largest rise between consecutive evaluations
    relative to the earlier one (0 when it never rises), and the share of those steps where it
    fell. None with fewer than two finite evaluations in the window."""
    s, w = np.asarray(steps, dtype=float), np.asarray(norms, dtype=float)
    w = w[(s >= start) & (s <= end)]
    if len(w) < 2 or not np.all(np.isfinite(w)) or np.any(w <= 0):
        return None
    rel = np.diff(w) / w[:-1]
    return {"from_step": int(start), "to_step": int(end), "evals": int(len(w)), "first": float(w[0]),
            "last": float(w[-1]), "max_rise": float(max(rel.max(), 0.0)), "falling": float(np.mean(rel < 0))}


def falls_monotonically(t: dict[str, Any], tol: float = NORM_RISE_TOL) -> bool:
    """No rise above `tol` (relative) between consecutive evaluations, and lower at the end."""
    return t["max_rise"] <= tol and t["last"] < t["first"]


def monotone_rate(transitions: Sequence[dict[str, Any] | None], tol: float = NORM_RISE_TOL) -> dict[str, Any]:
    """How many of the runs with a transition window fall monotonically through it, with the
    exact (Clopper-Pearson) 95% interval of the rate and the median share of falling steps."""
    from scipy import stats

    have = [t for t in transitions if t is not None]
    k = sum(falls_monotonically(t, tol) for t in have)
    out = {"k": k, "n": len(have), "missing": len(transitions) - len(have), "tol": tol, "rate": None, "ci95": None,
           "median_falling": float(np.median([t["falling"] for t in have])) if have else None}
    if have:
        ci = stats.binomtest(k, len(have)).proportion_ci(0.95, method="exact")
        out.update(rate=k / len(have), ci95=[float(ci.low), float(ci.high)])
    return out


def predict_log_t(fit: dict[str, Any], values: dict[str, float]) -> float:
    return fit["intercept"]["estimate"] + sum(e["estimate"] * math.log(values[v]) for v, e in fit["exponents"].items())


# ---------------------------------------------------------------------- the whole analysis
def scaling_law(directory: str | Path, variables: Sequence[str] = DEFAULT_VARS, *, threshold: float = GROK_THRESHOLD,
                interactions: bool = False, censored: bool = False, phase: Sequence[str] | None = None,
                write: bool = True) -> dict[str, Any]:
    """Collect, fit, and (write=True) write DIR/scaling-law.json and DIR/scaling-law.png."""
    directory = Path(directory)
    if write and directory.is_dir():  # a read-only place or a directory in the way: before the fit
        check_writable_dir(directory, "write the scaling-law fit into")
        for name in (RESULT_JSON, RESULT_FIGURE):
            check_output_file(directory / name)
    collected = collect_runs(directory, variables, threshold)
    if not collected.records:
        reasons = ", ".join(f"{len(v)} {k}" for k, v in collected.skipped.items())
        raise BadInput(f"{directory}: no finished runs to fit ({reasons})")
    result = fit_scaling_law(collected.records, variables, censored=censored, interactions=interactions)
    result = _finite({"dir": str(directory), "threshold": threshold, "width_fields": WIDTH_FIELDS,
                      **result, **claims(collected.records, variables), "skipped": collected.skipped})
    if write:
        result["json"] = str(directory / RESULT_JSON)
        result["figure"] = str(directory / RESULT_FIGURE)
        fig = figure(collected.records, result, list(variables), phase)
        with staged_outputs(directory) as stage:  # whole or not at all; a link there is replaced
            fig.savefig(stage / RESULT_FIGURE, dpi=120, bbox_inches="tight")
            (stage / RESULT_JSON).write_text(json.dumps(result, indent=1, default=_json_default), encoding="utf-8")
    return result


BOUNDARY_VAR = "weight_decay"  # the variable the published phase boundary is along
PHASE_DEFAULT = ("weight_decay", "train_frac")  # the published (lambda, D) phase map, where both are fitted


def claims(records: Sequence[GrokRecord], variables: Sequence[str]) -> dict[str, Any]:
    """The published claims beyond the fit, over `records`: the phase boundary along
    BOUNDARY_VAR (when it is a variable) and the weight norm's fall through the transition."""
    out: dict[str, Any] = {"weight_norm": monotone_rate([r.weight_norm for r in records if not r.censored])}
    if BOUNDARY_VAR in variables:
        usable = [r for r in records if r.values[BOUNDARY_VAR] > 0]
        if usable:
            out["boundary"] = {"variable": BOUNDARY_VAR, **phase_boundary(
                [r.values[BOUNDARY_VAR] for r in usable], [not r.censored for r in usable])}
    return out


def figure(records: Sequence[GrokRecord], result: dict[str, Any], variables: list[str], phase=None):
    """Measured against predicted, the grokking step against each variable (the other variables'
    fitted effects taken out: each run's step times prod_u (u / geomean u)^-a_u over the other
    variables u, and the fit through the geometric mean of the others), and the phase map."""
    from groklens.analyses.scaling_figures import scaling_law_figure

    fit = result["tobit"] if result["fit"] == "tobit" else result["ols"]
    a = {v: fit["exponents"][v]["estimate"] for v in variables}
    fitted = [r for r in records if all(r.values[v] > 0 for v in variables) and r.grok_step != 0]
    measured = np.array([r.grok_step if not r.censored else r.last_step for r in fitted], dtype=float)
    predicted = np.exp([predict_log_t(fit, r.values) for r in fitted])
    cens = np.array([r.censored for r in fitted])
    logs = {v: np.log([r.values[v] for r in fitted]) for v in variables}
    centre = {v: float(logs[v].mean()) for v in variables}
    against = []
    for v in variables:
        others = sum((a[u] * (logs[u] - centre[u]) for u in variables if u != v), np.zeros(len(fitted)))
        grid = np.unique(np.exp(logs[v]))
        line = np.exp(fit["intercept"]["estimate"] + a[v] * np.log(grid)
                      + sum(a[u] * centre[u] for u in variables if u != v))
        against.append((v, np.exp(logs[v]), measured * np.exp(-others), grid, line))
    if phase is None:
        phase = PHASE_DEFAULT if set(PHASE_DEFAULT) <= set(variables) else variables[:2]
    cells = None
    if len(phase) == 2:
        px, py = phase
        by: dict[tuple, list[bool]] = {}
        for r in records:
            by.setdefault((r.values[px], r.values[py]), []).append(not r.censored)
        keys = sorted(by)
        b = result.get("boundary")
        line = None
        if b and b.get("estimate") is not None and b["variable"] in (px, py):
            lo, hi = b["ci95"]
            line = (b["variable"] == px, b["estimate"], lo, math.inf if hi is None else hi)
        cells = (px, py, np.array([k[0] for k in keys]), np.array([k[1] for k in keys]),
                 np.array([sum(by[k]) for k in keys]), np.array([len(by[k]) for k in keys]), line)
    terms = [f"{v}^{a[v]:.2f}" for v in variables]
    title = f"{result['fit'].upper()}: T ∝ " + " ".join(terms[:2]) + ("\n" + " ".join(terms[2:]) if terms[2:] else "")
    return scaling_law_figure(measured, predicted, cens, against, cells, title=title)


def _finite(x):
    """NaN and infinities -> None, so the result is strict JSON (a degenerate fit has R^2 NaN)."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _json_default(x):
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    raise TypeError(type(x).__name__)


def _num(x) -> str:
    return "n/a" if x is None else f"{x:+.3f}"


def format_result(result: dict[str, Any]) -> list[str]:
    """The lines `groklens scaling-law` prints."""
    lines = []
    ols = result["ols"]
    lines.append(f"runs     {result['n_runs']} finished: {result['n_grokked']} grokked, {result['n_censored']} "
                 f"censored (never reached test accuracy {result['threshold']:g}); censored runs "
                 f"{'fitted by Tobit' if result['censored'] == 'tobit' else 'excluded from the fit'}")
    lines += [f"warning  {w}" for w in result.get("warnings", [])]
    for reason, names in {**result["excluded"], **result.get("skipped", {})}.items():
        if names:
            lines.append(f"skipped  {len(names)} {reason.replace('_', ' ')}: {', '.join(names[:3])}"
                         + (" ..." if len(names) > 3 else ""))
    fits = [("ols", ols)] + ([("tobit", result["tobit"])] if "tobit" in result else [])
    for label, fit in fits:
        lines.append(f"{label:<8} log T = {fit['intercept']['estimate']:.3f} + sum a_v log v   (n={fit['n']})")
        for v, e in fit["exponents"].items():
            lines.append(f"  {v:<14} a = {_num(e['estimate'])}  95% CI [{_num(e['ci95'][0])}, {_num(e['ci95'][1])}]")
        if label == "ols":
            r2i = fit.get("r2_interactions")
            r2 = "n/a" if fit["r2"] is None else f"{fit['r2']:.3f}"
            lines.append(f"  R^2 {r2}" + (f"; with pairwise interactions {r2i:.3f}" if r2i is not None else ""))
        else:
            r2 = "n/a" if fit["r2_uncensored"] is None else f"{fit['r2_uncensored']:.3f}"
            lines.append(f"  R^2 on grokked runs {r2}; sigma {fit['sigma']:.3f}"
                         + ("" if fit["converged"] else "  (optimizer did not report convergence)"))
    if "interactions" in result:
        lines.append("interactions (centred logs):")
        for v, e in result["interactions"]["exponents"].items():
            lines.append(f"  {v:<26} {_num(e['estimate'])}  95% CI [{_num(e['ci95'][0])}, {_num(e['ci95'][1])}]")
    if result.get("boundary"):
        b = result["boundary"]
        lines.append(f"boundary {b['variable']}: {boundary_text(b)}")
    wn = result.get("weight_norm")
    if wn and wn["n"]:
        lines.append(f"norm     weight norm falls monotonically from memorization to grokking in {wn['k']} of "
                     f"{wn['n']} grokked runs ({wn['rate']:.2f} [{wn['ci95'][0]:.2f}, {wn['ci95'][1]:.2f}]; no rise "
                     f"above {wn['tol']:g} between evaluations; median share of falling steps "
                     f"{wn['median_falling']:.2f})")
    if "json" in result:
        lines.append(f"wrote    {result['json']}, {result['figure']}")
    return lines


__all__ = [
    "BOUNDARY_RULE",
    "DEFAULT_VARS",
    "NORM_RISE_TOL",
    "WIDTH_FIELDS",
    "GrokRecord",
    "boundary_text",
    "claims",
    "collect_runs",
    "falls_monotonically",
    "figure",
    "monotone_rate",
    "phase_boundary",
    "fit_scaling_law",
    "format_result",
    "ols_fit",
    "predict_log_t",
    "scaling_law",
    "tobit_fit",
    "variable_value",
    "weight_norm_transition",
]

"""`groklens llc-calibrate`: the LLC's SGLD hyperparameters calibrated the way devinterp calibrates
them (its examples/sgld_calibration.ipynb and examples/grokking.ipynb), as a sweep with stated
checks and a stated rule (docs/ANALYSES.md, "llc", "Calibrating").

The sweep: every setting (lr, nbeta, localization) of a grid runs `chains` chains of burnin +
draws steps at each chosen checkpoint, all settings at once (analyses/sgld.py, the same chain
noise in every setting). devinterp's ranges: lr over decades 3e-5 .. 3e-1 (the grokking notebook's
EpsilonBetaAnalyzer; continued down to 3e-7, where chains on a transformer first stay local),
nbeta over decades of the default n / log n (the analyzer's 0.01 .. 1000 x
its default; above 10 x every lr of the grid diverges on these models), localization 1, 10, 100
(the calibration notebook's gamma grid; 5 in the grokking notebook) continued by decades to 1e5.

Per setting and checkpoint (devinterp's heuristics, made numbers):
  finite     no chain's loss went non-finite
  converged  |mean over chains of the drift (second half of the draws - first half)| <= DRIFT_MAX x |LLC|
             ("optimal traces should converge")
  agree      the chains' standard deviation <= SPREAD_MAX x |LLC| (the analyzer's llc/std_over_mean)
  positive   every chain's estimate > 0 ("the graph should not have negative dips")
  local      the loss excursion E[L] - L(w*) <= LOCAL_FRACTION x (chance loss - L(w*)) ("loss traces
             should not diverge away from the initial loss"; chance: log of the output classes)
  unpinned   the chains are not pinned by the localization: their mean distance from w* is not within
             PINNED_BAND of sqrt(d / gamma): the `pinned` flag of the llc analysis (analyses/llc.py), the
             same rule, so the recommendation is not one that `analyze --metric llc` flags pinned there
Across the grid:
  lr-stable  the estimate is within LR_STABLE of the next larger lr's (same nbeta and localization),
             which is healthy too ("look for a range ... which shows little change in LLC when we
             change epsilon")
  ordered    the checkpoints' order by LLC is the one most healthy settings give ("the relative
             ordering of estimates is maintained")
Rule: among the settings that pass every check at every checkpoint, the nbeta nearest n / log n
(the WBIC temperature: nbeta defines the posterior whose LLC is estimated, lr and the localization
only how it is sampled), then the smallest lr (the low end of the plateau: the least step-size bias
among estimates that converged and agree with a 10x larger step), then the smallest localization
(the least pull toward w*). When none passes everything: among the settings pinned at no checkpoint,
the one that passes the most checks among the settings that are finite, converged and local at every
checkpoint and pinned at none, by the same order, and the report says so. A pinned setting is never
recommended: when every setting that converged and stayed local is pinned somewhere, there is no
recommendation, and the note says what to try (PINNED_ADVICE); nor when no setting converged and
stayed local.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from groklens.errors import BadInput
from groklens.analyses.llc import (LIMITS, PINNED_BAND, _blocks, check_hyperparameters, default_nbeta,
                                    sampled_params, summarise, task_row_loss, with_flags)
from groklens.analyses.common import check_loss, eval_rows
from groklens.analyses.phases import run_phases
from groklens.fileio import check_output_file, check_writable_dir, staged_outputs

# devinterp's decades 3e-5 .. 3e-1, continued two decades down: on the README's p=23 transformer no
# chain at lr >= 3e-6 stays local (the sampled loss reaches chance level within 300 steps)
DEFAULT_LRS = (3e-7, 3e-6, 3e-5, 3e-4, 3e-3, 3e-2, 3e-1)
NBETA_MULTIPLES = (0.01, 0.1, 1.0, 10.0)  # x n / log n
DEFAULT_LOCALIZATIONS = (1.0, 10.0, 100.0, 1e3, 1e4, 1e5)
DRIFT_MAX = 0.2
SPREAD_MAX = 0.2
LOCAL_FRACTION = 0.1
LR_STABLE = 0.2
CHECKS = ("finite", "converged", "agree", "positive", "local", "unpinned", "lr_stable", "ordered")
HEALTH = CHECKS[:6]  # the checks of one setting at one checkpoint; lr_stable and ordered compare them
PINNED_ADVICE = ("try a smaller localization (--localization, e.g. 10x to 1000x smaller) with a larger lr (--lr) so "
                 "the chains still settle within the burn-in, and keep the settings that stay local")
FIGURE_BINS = 50
MAX_LANES = 256  # lanes (settings x chains) per vectorized pass
# settings (lr x nbeta x localization) of one calibration: 3x the default grid (7 x 4 x 6 = 168),
# which takes minutes per checkpoint at the default chains; 40 x 40 x 40 would take hours
MAX_SETTINGS = 512


@dataclass
class Target:
    """One model to sample at: a checkpoint's model, its per-input loss over rows 0..n_rows-1 and
    the loss of a chance prediction (None: no locality check)."""

    label: str
    model: Any
    row_loss: Callable
    n_rows: int
    chance_loss: float | None = None


@dataclass
class Calibration:
    targets: list[str]
    settings: list[tuple[float, float, float]]  # (lr, nbeta, localization)
    default_nbeta: float
    results: list[list[dict[str, Any]]]  # [target][setting]
    passing: list[int] = field(default_factory=list)
    recommended: int | None = None
    rule_note: str = ""
    params: dict[str, Any] = field(default_factory=dict)

    def recommended_setting(self) -> dict[str, float] | None:
        if self.recommended is None:
            return None
        lr, nb, gamma = self.settings[self.recommended]
        return {"lr": lr, "nbeta": nb, "localization": gamma}

    def to_json(self) -> dict[str, Any]:
        rows = []
        for t, label in enumerate(self.targets):
            for s, (lr, nb, gamma) in enumerate(self.settings):
                r = self.results[t][s]
                rows.append({"checkpoint": label, "lr": lr, "nbeta": nb, "localization": gamma,
                             **{k: _plain(v) for k, v in r.items() if k != "trace_blocks"},
                             "passes": s in self.passing})
        return {"checkpoints": self.targets, "default_nbeta": self.default_nbeta, "params": self.params,
                "thresholds": {"drift_max": DRIFT_MAX, "spread_max": SPREAD_MAX, "local_fraction": LOCAL_FRACTION,
                               "lr_stable": LR_STABLE},
                "recommended": self.recommended_setting(), "rule_note": self.rule_note, "rows": rows}


def _plain(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return [_plain(x) for x in v.tolist()]
    if isinstance(v, (float, np.floating)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, (np.bool_, bool)):
        return bool(v)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def check_grid(lrs: Sequence[float], nbetas: Sequence[float], localizations: Sequence[float]) -> None:
    """Every value of every axis within the llc analysis's limits (not only the first), and at
    most MAX_SETTINGS settings in all."""
    for name, values, zero in (("lr", lrs, False), ("nbeta", nbetas, False), ("localization", localizations, True)):
        if not values:
            raise BadInput(f"llc-calibrate: the {name} grid is empty")
        hi = LIMITS[name]
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or \
                    (v == 0 and not zero) or v > hi:
                raise BadInput(f"llc-calibrate: {name} values must be {'non-negative' if zero else 'positive'} "
                               f"finite numbers <= {hi:g}; got {v!r}")
        if len(set(values)) != len(values):
            raise BadInput(f"llc-calibrate: the {name} grid repeats a value: {list(values)}")
    n = len(lrs) * len(nbetas) * len(localizations)
    if n > MAX_SETTINGS:
        raise BadInput(f"llc-calibrate: the grid has {len(lrs)} x {len(nbetas)} x {len(localizations)} = {n:,} "
                       f"settings; at most {MAX_SETTINGS:,} per run (each samples every chain at every checkpoint)")


def _health(r: dict[str, Any], chance: float | None) -> dict[str, bool]:
    llc, per = r["llc_mean"], np.asarray(r["llc_per_chain"], dtype=float)
    finite = r["failed_chains"] == 0 and math.isfinite(llc)
    scale = abs(llc) if finite else math.nan
    return {
        "finite": finite,
        "converged": finite and abs(float(np.mean(r["trace_drift"]))) <= DRIFT_MAX * scale,
        "agree": finite and (len(per) < 2 or r["llc_std"] <= SPREAD_MAX * scale),
        "positive": finite and bool((per > 0).all()),
        "local": finite and (chance is None or r["excursion"] <= LOCAL_FRACTION * (chance - r["init_loss"])),
        "unpinned": not r["pinned"],
    }


def _sample_target(target: Target, settings, *, chains, burnin, draws, minibatch, seed, max_lanes) -> list[dict]:
    from groklens.analyses.sgld import sample

    out: list[dict] = []
    per = max(1, max_lanes // chains)
    d = sampled_params(target.model)
    for start in range(0, len(settings), per):
        part = settings[start : start + per]
        res = sample(target.model, target.row_loss, target.n_rows, part, chains=chains, burnin=burnin, draws=draws,
                     minibatch=minibatch, seed=seed)
        init = float(res["init_loss"][0])
        for i, (_lr, nb, gamma) in enumerate(part):
            trace = res["trace"][0, i]
            r = summarise(trace, init, nb, burnin, {"distance": res["distance"][0, i],
                                                    "grad_noise": res["grad_noise"][0, i]})
            r["n_params"] = d
            r = with_flags(r, gamma)  # the llc analysis' own pinned flag and distance ratio
            r["excursion"] = r["llc_mean"] / nb
            r["trace_blocks"] = _blocks(nb * (trace - init), FIGURE_BINS)
            r.update(_health(r, target.chance_loss))
            del r["trace"]
            out.append(r)
    return out


def sweep(targets: Sequence[Target], *, lrs: Sequence[float] = DEFAULT_LRS, nbetas: Sequence[float] | None = None,
          localizations: Sequence[float] = DEFAULT_LOCALIZATIONS, chains: int = 4, burnin: int = 100,
          draws: int = 200, minibatch: int = 32, seed: int = 0, max_lanes: int = MAX_LANES,
          progress: Callable[[str], None] | None = None) -> Calibration:
    """The calibration sweep over the targets (module docstring). nbetas None: NBETA_MULTIPLES x
    n / log n of the first target's n."""
    if not targets:
        raise BadInput("llc-calibrate: no checkpoints to calibrate at")
    nb0 = default_nbeta(targets[0].n_rows)
    nbetas = [round(m * nb0, 6) for m in NBETA_MULTIPLES] if nbetas is None else list(nbetas)
    check_grid(lrs, nbetas, localizations)
    for t in targets:
        check_hyperparameters(lr=lrs[0], localization=localizations[0], nbeta=nbetas[0], chains=chains, draws=draws,
                              burnin=burnin, minibatch=minibatch, seed=seed, n_rows=t.n_rows)
    settings = [(float(lr), float(nb), float(g)) for lr in sorted(lrs) for nb in sorted(nbetas)
                for g in sorted(localizations)]
    results = []
    for t in targets:
        if progress:
            progress(f"{t.label}: {len(settings)} settings x {chains} chains x {burnin + draws} steps")
        results.append(_sample_target(t, settings, chains=chains, burnin=burnin, draws=draws, minibatch=minibatch,
                                      seed=seed, max_lanes=max_lanes))
    cal = Calibration([t.label for t in targets], settings, nb0, results,
                      params={"chains": chains, "burnin": burnin, "draws": draws, "minibatch": minibatch, "seed": seed})
    _cross_checks(cal)
    _recommend(cal)
    return cal


def _cross_checks(cal: Calibration) -> None:
    """lr-stable and ordered, which compare settings and checkpoints."""
    index = {s: i for i, s in enumerate(cal.settings)}
    lrs = sorted({s[0] for s in cal.settings})
    healthy = [all(all(r[c] for c in HEALTH) for r in (res[s] for res in cal.results))
               for s in range(len(cal.settings))]
    for res in cal.results:
        for s, (lr, nb, g) in enumerate(cal.settings):
            k = lrs.index(lr)
            nxt = index.get((lrs[k + 1], nb, g)) if k + 1 < len(lrs) else None
            r, ok = res[s], False
            if nxt is not None and all(r[c] for c in HEALTH) and all(res[nxt][c] for c in HEALTH):
                ok = abs(r["llc_mean"] - res[nxt]["llc_mean"]) <= LR_STABLE * abs(r["llc_mean"])
            r["lr_stable"] = ok
    orders = [tuple(np.argsort([-res[s]["llc_mean"] for res in cal.results])) for s in range(len(cal.settings))]
    votes = Counter(o for o, h in zip(orders, healthy) if h)
    consensus = votes.most_common(1)[0][0] if votes else None
    for s, order in enumerate(orders):
        for res in cal.results:
            res[s]["ordered"] = len(cal.results) < 2 or (consensus is not None and order == consensus)


def _recommend(cal: Calibration) -> None:
    def key(s: int):
        lr, nb, g = cal.settings[s]
        return (round(abs(math.log(nb / cal.default_nbeta)), 9), lr, g)

    settings = range(len(cal.settings))
    passed = [sum(r[c] for r in (res[s] for res in cal.results) for c in CHECKS) for s in settings]
    full = len(CHECKS) * len(cal.results)
    cal.passing = sorted((s for s in settings if passed[s] == full), key=key)
    # a chain that settled (converged) near w* (local): the least an estimate needs to mean anything
    settled = [s for s in settings if all(res[s][c] for res in cal.results for c in ("finite", "converged", "local"))]
    candidates = [s for s in settled if not any(res[s]["pinned"] for res in cal.results)]
    if cal.passing:
        cal.recommended = cal.passing[0]
        cal.rule_note = (f"{len(cal.passing)} of {len(cal.settings)} settings pass every check at every checkpoint; "
                         "the nbeta nearest n / log n among them, then the smallest lr, then the smallest localization")
    elif candidates:
        best = max(passed[s] for s in candidates)
        cal.recommended = min((s for s in candidates if passed[s] == best), key=key)
        cal.rule_note = (f"no setting passes every check at every checkpoint; the recommendation passes {best} of "
                         f"{full}, the most of the {len(candidates)} settings that converged and stayed local at "
                         "every checkpoint, pinned at none, chosen by the same order")
    elif settled:
        cal.recommended = None
        cal.rule_note = (f"no recommendation: every setting that converged and stayed local at every checkpoint "
                         f"({len(settled)} of {len(cal.settings)}) is pinned by the localization at some checkpoint "
                         f"(the chains' distance from w* within {PINNED_BAND:.0%} of sqrt(d / gamma): the estimate "
                         f"measures gamma, not the loss); {PINNED_ADVICE}")
    else:
        cal.recommended = None
        cal.rule_note = ("no recommendation: no setting's chains converged and stayed local at every checkpoint; "
                         "try more --burnin and --draws, a smaller lr (to stay local) or a larger localization")


def format_table(cal: Calibration, target: int, *, only_nbeta: float | None = None) -> str:
    """One checkpoint's table: a line per setting with its estimate and checks."""
    lines = [f"checkpoint {cal.targets[target]}: LLC mean +- std over {cal.params.get('chains')} chains; drift and "
             f"spread as a fraction of |LLC|; excursion E[L] - L(w*) in nats; checks "
             "f=finite c=converged a=agree p=positive l=local u=unpinned s=lr-stable o=ordered ('.' = fails); "
             "distance from w* and its ratio to sqrt(d/gamma), where the localization alone holds a chain "
             f"(PINNED: within {PINNED_BAND:.0%} of it)",
             f"{'lr':>8} {'nbeta':>9} {'gamma':>8} {'LLC':>18} {'drift':>7} {'spread':>7} {'excursion':>10} "
             f"{'distance':>9} {'/sqrt(d/g)':>10}  checks"]
    for s, (lr, nb, g) in enumerate(cal.settings):
        if only_nbeta is not None and not math.isclose(nb, only_nbeta):
            continue
        r = cal.results[target][s]
        llc = r["llc_mean"]
        flag = " <- recommended" if s == cal.recommended else (" pass" if s in cal.passing else "")
        est = f"{llc:9.3g} +- {r['llc_std']:<6.2g}" if math.isfinite(llc) else f"{'failed':>18}"
        lines.append(f"{lr:8.0e} {nb:9.4g} {g:8.0e} {est:>18} {_rel(float(np.mean(r['trace_drift'])), llc):>7} "
                     f"{_rel(r['llc_std'], llc):>7} {r['excursion']:10.3g} {_nanmean(r['distance']):9.3g} "
                     f"{r['distance_ratio']:10.3g}  {marks(r)}{' PINNED' if r['pinned'] else ''}{flag}")
    return "\n".join(lines)


def marks(r: dict[str, Any]) -> str:
    """The checks of one setting at one checkpoint as letters, '.' where one fails: fcapluso."""
    return "".join((c[0] if c != "lr_stable" else "s") if r[c] else "." for c in CHECKS)


def _rel(x: float, llc: float) -> str:
    return f"{x / abs(llc):7.2f}" if math.isfinite(llc) and llc != 0 and math.isfinite(x) else f"{'—':>7}"


def _nanmean(x) -> float:
    x = np.asarray(x, dtype=float)
    return float(x[np.isfinite(x)].mean()) if np.isfinite(x).any() else math.nan


def format_calibration(cal: Calibration) -> str:
    out = [format_table(cal, t) for t in range(len(cal.targets))]
    rec = cal.recommended_setting()
    out.append("recommended: " + (", ".join(f"{k} {v:g}" for k, v in rec.items()) if rec else "none")
               + f" ({cal.rule_note})")
    return "\n\n".join(out)


def figure(cal: Calibration, target: int, nbeta: float | None = None):
    """The loss-trace grid of one checkpoint (analyses/llc_figures.trace_grid) at `nbeta` (default:
    the recommended setting's)."""
    from groklens.analyses.llc_figures import TracePanel, trace_grid

    if nbeta is None:
        nbeta = cal.settings[cal.recommended][1] if cal.recommended is not None else cal.settings[0][1]
    lrs = sorted({s[0] for s in cal.settings})
    gammas = sorted({s[2] for s in cal.settings})
    index = {s: i for i, s in enumerate(cal.settings)}
    panels = []
    for lr in lrs:
        row = []
        for g in gammas:
            s = index.get((lr, nbeta, g))
            if s is None:
                row.append(None)
                continue
            r = cal.results[target][s]
            row.append(TracePanel(r["trace_blocks"], r["llc_mean"], s in cal.passing, marks(r), s == cal.recommended,
                                  pinned=bool(r["pinned"])))
        panels.append(row)
    p = cal.params
    return trace_grid(panels, [f"lr {lr:g}" for lr in lrs], [f"localization {g:g}" for g in gammas],
                      steps=p["burnin"] + p["draws"], burnin=p["burnin"],
                      title=f"{cal.targets[target]}: n*beta (L_t - L(w*)) per chain, nbeta {nbeta:g} "
                            f"(n/log n = {cal.default_nbeta:.3g}); dashed: LLC")


def run_targets(run, steps: Sequence[int] | None, *, eval_set: str = "train", loss: str | None = None) -> list[Target]:
    """The checkpoints of a run (a path) to calibrate at: `steps`, or by default the memorization
    checkpoint (before grokking) and the last one (after it)."""
    import math as _m

    from groklens.checkpoints import Trajectory

    traj = Trajectory(run)
    available = [int(s) for s in traj.steps]
    if not available:
        raise BadInput(f"{run}: the run has no checkpoints")
    if not steps:
        ph = run_phases(traj)
        steps = sorted({s for s in (ph.steps.get("memorization"), available[-1]) if s is not None})
    missing = [s for s in steps if s not in available]
    if missing:
        raise BadInput(f"{run}: no checkpoint at step(s) {', '.join(map(str, missing))} "
                       f"(checkpoints: {available[0]}..{available[-1]}, {len(available)} of them)")
    data = traj.dataset()
    rows = eval_rows(data, eval_set)
    kind = check_loss(loss if loss is not None else traj.config.loss)
    out = []
    for s in steps:
        model = traj.model(s)
        out.append(Target(f"step {s}", model, task_row_loss(model, data, rows, kind), len(rows),
                          _m.log(data.d_vocab_out)))
    return out


def parse_floats(items: Sequence[str] | None, flag: str) -> list[float] | None:
    """Numbers from repeatable / comma-separated option values ("3e-4,3e-3"); None when the option
    is not given; given with no number in it (--lr "") is a BadInput, not the default grid."""
    if not items:
        return None
    out = []
    for item in items:
        for part in str(item).replace(",", " ").split():
            try:
                out.append(float(part))
            except ValueError:
                raise BadInput(f"{flag} takes numbers (repeatable or comma-separated); got {part!r}") from None
    if not out:
        raise BadInput(f"{flag} is given with no number; leave it out for the default grid")
    return out


def calibrate_run(run, steps: Sequence[int] | None = None, *, lrs: Sequence[float] | None = None,
                  nbetas: Sequence[float] | None = None, localizations: Sequence[float] | None = None,
                  chains: int = 4, burnin: int = 100, draws: int = 200, minibatch: int = 32, seed: int = 0,
                  eval_set: str = "train", out_dir=None, progress: Callable[[str], None] | None = None
                  ) -> tuple[Calibration, list[str]]:
    """`groklens llc-calibrate`: the sweep at a run's checkpoints; with out_dir, calibration.json and
    one loss-trace figure per checkpoint (traces-step{S}.png), written once the sweep is done."""
    import json
    from pathlib import Path


    out = None if out_dir is None else Path(out_dir)
    if out is not None and (out.exists() and not out.is_dir() or not out.exists() and not out.parent.is_dir()):
        raise BadInput(f"-o {out}: not a directory, or its parent does not exist")
    if out is not None:  # a read-only place is refused before the sweep, not after it
        check_writable_dir(out if out.is_dir() else out.parent)
    lrs = DEFAULT_LRS if lrs is None else lrs
    localizations = DEFAULT_LOCALIZATIONS if localizations is None else localizations
    check_grid(lrs, list(NBETA_MULTIPLES) if nbetas is None else nbetas, localizations)  # the default nbetas: 4 values
    targets = run_targets(run, steps, eval_set=eval_set)
    cal = sweep(targets, lrs=lrs, nbetas=nbetas, localizations=localizations,
                chains=chains, burnin=burnin, draws=draws, minibatch=minibatch, seed=seed, progress=progress)
    cal.params.update({"run": str(run), "eval_set": eval_set})
    written: list[str] = []
    if out is not None:
        names = [f"traces-{label.replace(' ', '')}.png" for label in cal.targets] + ["calibration.json"]
        for name in names:
            check_output_file(out / name)
        with staged_outputs(out) as stage:  # a link at a name is replaced, never written through
            for t, name in enumerate(names[:-1]):
                figure(cal, t).savefig(stage / name, dpi=110)
            (stage / names[-1]).write_text(json.dumps(cal.to_json(), indent=1) + "\n", encoding="utf-8")
        written = [str(out / name) for name in names]
    return cal, written

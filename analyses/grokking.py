"""Grokking and memorization times (docs/ANALYSES.md, "grokking").

A run has grokked at the first of N consecutive evaluations with test accuracy >= threshold,
N the run's `grok_evals` (config; 3 by default, 1 in files from before the field: their
first crossing), so a crossing that a loss spike undoes is not grokking; the first crossing is
kept as its own figure (`first_crossing`). Memorization is the first evaluated step with train
accuracy >= threshold. The rule is `>=`: the bounded-sphere paper's code uses a strict
`>` (test accuracy > threshold), so a run whose accuracy sits exactly at the threshold (e.g.
0.95 on a test set of a size where 0.95 is an attainable value) groks here one evaluation
earlier than there. A run that never crosses (or not for N evaluations in a row) is
right-censored: None here, reported as `> last step` by the CLI, never dropped.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from groklens.config import GROK_THRESHOLD, PHASE_THRESHOLDS, STORED_LEGACY, first_sustained
from groklens.analyses.registry import analysis


def first_crossing(steps: Sequence[int], values: Sequence[float], threshold: float) -> int | None:
    """First step whose value is >= threshold, or None when the series never crosses."""
    values = np.asarray(values, dtype=float)
    hits = np.nonzero(values >= threshold)[0]
    return int(np.asarray(steps)[hits[0]]) if len(hits) else None


def grokked_at(steps: Sequence[int], values: Sequence[float], threshold: float, evals: int) -> int | None:
    """The grokking step: the first of `evals` consecutive evaluations with value >= threshold
    (None when there is no such run; `evals` 1 is the first crossing)."""
    start = first_sustained(np.asarray(values, dtype=float) >= threshold, evals)
    return None if start is None else int(np.asarray(steps)[start])


def grok_evals_of(config: Mapping) -> int:
    """A run's N (`grok_evals`); a config from before the field (a ledger entry's) meant 1."""
    return int(config.get("grok_evals", STORED_LEGACY["grok_evals"]))


def grokked_rule(evals: Sequence[int], threshold: str = "the threshold") -> str:
    """What 'grokked' means for runs with these grok_evals, in words (a table's header, a caption)."""
    ns = sorted(set(evals)) or [1]
    if ns == [1]:
        return f"the first evaluation with test accuracy >= {threshold}"
    mixed = " (the runs' grok_evals)" if len(ns) > 1 else ""
    return f"the first of {' or '.join(map(str, ns))} consecutive evaluations with test accuracy >= {threshold}{mixed}"


def grokking_times(metrics: Mapping[str, np.ndarray], thresholds: Sequence[float] = PHASE_THRESHOLDS,
                   evals: int = 1) -> dict:
    """memorization_step / grokking_step (`evals` consecutive evaluations) / first_crossing keyed
    by threshold as a string ("0.95"), int or None; grok_evals; last_step."""
    steps = metrics["step"]
    out: dict = {"memorization_step": {}, "grokking_step": {}, "first_crossing": {}, "grok_evals": evals,
                 "last_step": int(steps[-1]) if len(steps) else None}
    test = metrics.get("test_acc", [])
    for t in thresholds:
        key = f"{t:g}"
        out["memorization_step"][key] = first_crossing(steps, metrics.get("train_acc", []), t) if len(steps) else None
        out["grokking_step"][key] = grokked_at(steps, test, t, evals) if len(steps) else None
        out["first_crossing"][key] = first_crossing(steps, test, t) if len(steps) else None
    return out


def stop_rule_index(values: Sequence[float], threshold: float, evals: int, after: int, at_event: bool) -> int | None:
    """The evaluation at which groklens' stop rule (trainers/engine.py: `after` = stop_after_grok,
    `at_event` = stop_at_event, grokked as `evals` = grok_evals) ends a run with these test
    accuracies, None where it never does (after 0, never grokked, or a dip that lasts to the end):
    how another code's whole log reads over the evaluations a groklens run of it would have made."""
    v = np.asarray(values, dtype=float)
    g = first_sustained(v >= threshold, max(evals, 1))
    if not after or g is None:
        return None
    for i in range(g + max(after, evals - 1), len(v)):  # the rule counts from where grokking is known
        if v[i] >= threshold or not at_event:
            return i
    return None


def collapse(metrics: Mapping[str, np.ndarray], threshold: float = GROK_THRESHOLD, prefix: str = "",
             evals: int = 1) -> dict:
    """Whether a run generalized and stayed there: `crossed` (first step with test accuracy >=
    threshold, None if never), `fell_below` (the first later evaluation below it, None if none),
    `grokked` (the first of `evals` evaluations in a row at >= threshold, the run's grok_evals;
    None if never), `final_test_acc`, `ended_below` (the last evaluation below the threshold or
    not finite), and `collapsed`: it grokked and its last `evals` evaluations are all below the
    threshold (or the last is not finite). A run that dipped and recovered has `fell_below` set but
    is not collapsed; neither is one that ends inside a dip of fewer than `evals` evaluations, as a
    crossing that short is not grokking. At evals 1: it crossed and ended below."""
    steps = np.asarray(metrics["step"])
    acc = np.asarray(metrics.get(prefix + "test_acc", []), dtype=float)
    if not len(steps) or not len(acc):
        return {"crossed": None, "fell_below": None, "grokked": None, "final_test_acc": None, "ended_below": False,
                "collapsed": False}
    crossed = first_crossing(steps, acc, threshold)
    fell = None
    if crossed is not None:
        after = np.nonzero((steps > crossed) & (acc < threshold))[0]
        fell = int(steps[after[0]]) if len(after) else None
    grokked = grokked_at(steps, acc, threshold, max(evals, 1))
    final = float(acc[-1]) if np.isfinite(acc[-1]) else None
    ended_below = final is None or final < threshold
    held_below = final is None or bool(np.all(acc[-max(evals, 1):] < threshold))
    return {"crossed": crossed, "fell_below": fell, "grokked": grokked, "final_test_acc": final,
            "ended_below": ended_below, "collapsed": grokked is not None and held_below}


def collapse_text(c: Mapping) -> str:
    """'' for a run that crossed and stayed; otherwise what `collapse` found: 'crossed at N,
    collapsed at M, final test acc x', or that it fell below at M and recovered, ends inside a dip
    too short to be a collapse, or never held the threshold long enough to grok."""
    if c.get("crossed") is None or c.get("fell_below") is None and not c.get("collapsed"):
        return ""
    final = "non-finite" if c.get("final_test_acc") is None else f"{c['final_test_acc']:.3f}"
    at = f" at {c['fell_below']}" if c.get("fell_below") is not None else ""
    if c.get("collapsed"):
        return f"crossed at {c['crossed']}, collapsed{at}, final test acc {final}"
    if c.get("ended_below") and c.get("grokked") is None:
        return f"crossed at {c['crossed']}, fell below{at}, never held it long enough to grok (final test acc {final})"
    if c.get("ended_below"):
        return (f"crossed at {c['crossed']}, fell below{at}, ends inside a dip shorter than the grokking rule's "
                f"evaluations, not a collapse (final test acc {final})")
    return f"crossed at {c['crossed']}, fell below{at}, recovered (final test acc {final})"


@analysis("grokking", "memorization and grokking steps per accuracy threshold (grokked: grok_evals consecutive "
          "evaluations with test accuracy >= threshold; the first crossing apart), with censoring", kind="run",
          order=80)
def grokking_table(metrics: Mapping[str, np.ndarray], thresholds: Sequence[float] = PHASE_THRESHOLDS,
                   grok_evals: int = 0) -> dict:
    """Per threshold (in the given order): memorization and grokking steps and the first
    crossing, -1 where censored, and whether each is censored (never crossed by `last_step`, the
    last evaluated step). grok_evals 0: the run's own (the runner passes its config's)."""
    times = grokking_times(metrics, thresholds, max(grok_evals, 1))
    mem = [times["memorization_step"][f"{t:g}"] for t in thresholds]
    grok = [times["grokking_step"][f"{t:g}"] for t in thresholds]
    first = [times["first_crossing"][f"{t:g}"] for t in thresholds]
    return {
        "thresholds": np.asarray(thresholds, dtype=np.float64),
        "memorization_step": np.array([-1 if s is None else s for s in mem], dtype=np.int64),
        "memorization_censored": np.array([s is None for s in mem], dtype=np.int64),
        "grokking_step": np.array([-1 if s is None else s for s in grok], dtype=np.int64),
        "grokking_censored": np.array([s is None for s in grok], dtype=np.int64),
        "first_crossing": np.array([-1 if s is None else s for s in first], dtype=np.int64),
        "grok_evals": int(times["grok_evals"]),
        "last_step": -1 if times["last_step"] is None else int(times["last_step"]),
    }


# ---------------------------------------------------------------------- one run (`groklens info`, `train`)
def run_summary(run, thresholds: Sequence[float] = PHASE_THRESHOLDS) -> dict:
    """What `groklens info --json` prints of `run` (a checkpoints.Trajectory): path, config,
    status, checkpoints, the last evaluation, memorization and grokking steps (per copy and of
    the ensemble for a routed run), collapse, and temporaries left beside it by killed writers."""
    from groklens.checkpoints.reader import stale_temporaries  # h5py, deferred like the reader itself

    metrics = run.metrics
    steps = run.steps
    last = {k: _plain(v[-1]) for k, v in metrics.items()} if len(metrics["step"]) else None
    evals = grok_evals_of(run.config_dict)
    times = grokking_times(metrics, thresholds, evals)
    live = run.is_live
    status = run.status
    if status == "running" and not live and not len(steps):
        status = ("died before its first checkpoint (writer gone: killed, e.g. out of memory?); nothing to "
                  "resume: `groklens train --out FILE ...` starts it again over this file")
    elif status == "running" and not live:
        status = "interrupted (writer gone; `groklens train --resume` continues it)"
    routing = {}
    if run.n_copies > 1:  # per copy (0.95 and the other thresholds) and of the ensemble
        def grok_of(prefix: str) -> dict:
            series = {"step": metrics["step"], "test_acc": metrics.get(prefix + "test_acc", []),
                      "train_acc": metrics.get(prefix + "train_acc", [])}
            return grokking_times(series, thresholds, evals)["grokking_step"]

        routing = {"copies": run.n_copies, "copy": run.copy,
                   "copy_grokking_step": [grok_of(f"copy{m}.") for m in range(run.n_copies)],
                   "ensemble_grokking_step": grok_of("ensemble.")}
    return {
        "path": str(run.path),
        **({"routing": routing} if routing else {}),
        "config": run.config_dict,
        "status": status,
        "live": live,
        "verified": run.verified,  # False: a file of a format before 1.3, whose bits nothing checks
        "checkpoint_steps": [int(s) for s in steps],
        "n_checkpoints": int(len(steps)),
        "n_evaluations": int(len(metrics["step"])),
        "last": last,
        "memorization_step": times["memorization_step"],
        "grokking_step": times["grokking_step"],
        "first_crossing": times["first_crossing"],
        "grok_evals": evals,
        "extensions": run.extensions,
        "censored_at": times["last_step"],
        "collapse": {**collapse(metrics, run.config_dict.get("grok_threshold", thresholds[0]), evals=evals),
                     "threshold": run.config_dict.get("grok_threshold", thresholds[0])},
        "stale_temporaries": stale_temporaries(run.path),
    }


def _plain(x):
    x = x.item() if hasattr(x, "item") else x
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x


# ---------------------------------------------------------------------- as text (`groklens info`, `train`)
def censored_text(step: int | None, summary: Mapping) -> str:
    """'step N', or '> LAST (censored)' for a threshold not crossed by the last evaluation."""
    if step is not None:
        return f"step {step}"
    last = summary["censored_at"]
    return f"> {last} (censored)" if last is not None else "n/a"


def first_crossing_text(first: int | None, grokked: int | None) -> str:
    """' (first crossing at step N)' when the first crossing is not the grokking step ('' else)."""
    return "" if first is None or first == grokked else f" (first crossing at step {first})"


def _num(value, spec: str) -> str:
    """A stored metric; None where it was not finite (a diverged run)."""
    return "non-finite" if value is None else format(value, spec)


def format_summary(summary: Mapping) -> str:
    """The lines of `groklens info` from a `run_summary()`."""
    lines = []
    cfg = summary["config"]
    steps = summary["checkpoint_steps"]
    lines.append(f"run      {summary['path']}  ({summary['status']})")
    if cfg["task"] == "teacher":  # the teacher-student task: no p, its own split; its models have one layer
        lines.append(f"task     teacher N={cfg['teacher_dim']} K={cfg['teacher_hidden']} alpha={cfg['teacher_alpha']} "
                     f"test={cfg['teacher_test']} data_seed={cfg['data_seed']}")
        hidden = f" K={cfg['d_mlp']}" if cfg["model"] == "committee" else ""
        lines.append(f"model    {cfg['model']}{hidden} loss={cfg.get('loss', 'ce')} seed={cfg['seed']}")
    else:
        lines.append(f"task     {cfg['task']} p={cfg['p']} train_frac={cfg['train_frac']} data_seed={cfg['data_seed']}")
        lines.append(
            f"model    {cfg['model']} L={cfg['n_layers']} d_model={cfg['d_model']} heads={cfg['n_heads']} "
            f"d_mlp={cfg['d_mlp']} norm={cfg['norm']} attention={cfg['attention']} seed={cfg['seed']}"
        )
    opt = {"adamw": "AdamW", "adam": "Adam (L2 weight decay)"}.get(cfg.get("optimizer", "adamw"), cfg.get("optimizer"))
    lines.append(f"optim    {opt} lr={cfg['lr']} wd={cfg['weight_decay']} betas={cfg['betas']} steps={cfg['steps']}")
    for e in summary.get("extensions", []):
        lines.append(f"extended cap {e['from_steps']} -> {e['steps']} at step {e['at_step']} (train --resume --steps)")
    span = f"{steps[0]}..{steps[-1]}" if steps else "none"
    lines.append(f"ckpts    {len(steps)} checkpoints, steps {span}; {summary['n_evaluations']} evaluations")
    if summary.get("verified") is False:
        lines.append("checks   unverified: a file of a format before 1.3 carries no checksums of its data")
    last = summary["last"]
    if last:
        lines.append(
            f"last     step {last['step']}: train loss {_num(last['train_loss'], '.4g')} acc "
            f"{_num(last['train_acc'], '.4f')} | test loss {_num(last['test_loss'], '.4g')} acc "
            f"{_num(last['test_acc'], '.4f')}"
        )
    lines.append(f"grokked  the first of {summary['grok_evals']} consecutive evaluations with test accuracy "
                 ">= the threshold (config grok_evals)")
    for key in summary["grokking_step"]:
        lines.append(
            f"@{key:<7} memorized {censored_text(summary['memorization_step'][key], summary)}, "
            f"grokked {censored_text(summary['grokking_step'][key], summary)}"
            + first_crossing_text(summary["first_crossing"][key], summary["grokking_step"][key])
        )
    c = summary.get("collapse") or {}
    if collapse_text(c):
        lines.append(f"collapse {collapse_text(c)} (threshold {c['threshold']:g})")
    routing = summary.get("routing")
    if routing:  # a routed run: the lines above are copy 0's
        key = f"{GROK_THRESHOLD:g}"
        per_copy = ", ".join(censored_text(g[key], summary) for g in routing["copy_grokking_step"])
        elastic = f", elastic gamma {cfg['elastic_gamma']}" if cfg.get("elastic_gamma") else ""
        lines.append(f"routing  {routing['copies']} copies, width {cfg['routing_width']}, unit "
                     f"{cfg['routing_unit']}{elastic} "
                     f"(lines above: copy 0); grokked @{key} per copy: {per_copy}; ensemble: "
                     f"{censored_text(routing['ensemble_grokking_step'][key], summary)}")
    stale = summary.get("stale_temporaries")
    if stale:
        lines.append(f"stale    {len(stale)} temporary file(s) of killed writers beside the run (removed by its next "
                     f"writer): {', '.join(stale)}")
    return "\n".join(lines)

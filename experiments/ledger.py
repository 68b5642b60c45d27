"""The results ledger: one small JSON file per experiment and scale that keeps every finished run.

`groklens reproduce NAME --scale S --ledger DIR` keeps `DIR/NAME.S.json` (the repository's
committed ledger is `docs/results/`; without `--ledger` it is `OUT/ledger/`). Each entry is one
finished run: experiment, arm (variant), seed, run name, the full config and its hash,
memorization and grokking steps at each threshold of `THRESHOLDS`, censoring, the final metrics,
the measures the experiment reads (with the checkpoint each was read at; an experiment whose
scale names `ledger_curves` also keeps those measures at every stored checkpoint), the groklens version
that trained it, its wall time and the device. Rows of docs/RESULTS.md are computed from these
entries, so a later `--seeds N` trains only the seeds the ledger lacks. Trajectory files are
never part of the ledger.

Config hash (`config_hash`): sha256 of the config as sorted JSON, with these fields left out:
`NOT_HASHED` (where a run ran, not what it computed), a field `DERIVED_FROM` another run while
the field naming that run is set, and every field of `LEGACY_DEFAULTS` whose value equals its
legacy default, i.e. the value that reproduces the behaviour from before
the field existed. So adding a config field whose default keeps the old behaviour leaves old
entries valid (declare its `legacy` value with the field), while a changed default, or any
other changed value, changes the hash: such entries are not mixed into the rows (they are
listed apart) and the run is retrained.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from groklens.analyses.compare import PhaseTimes
from groklens.checkpoints.validate import ACCURACY, metric_range
from groklens.config import DERIVED_FROM, FIELD_FACTS, GROK_THRESHOLD, PHASE_THRESHOLDS, SEED_FIELDS
from groklens.experiments.cost import cpu_model
from groklens.errors import BadInput
from groklens.fileio import write_text_atomic

LEDGER_FORMAT = 1
# accuracy >= threshold (the sphere paper's rule is >; docs/RESULTS.md): the phase thresholds and two below
THRESHOLDS = (0.5, 0.9, *PHASE_THRESHOLDS)
# the rows read GROK_THRESHOLD (groklens.config); the phase "generalized": the first evaluation
# with test accuracy >= GENERALIZED
GENERALIZED = PHASE_THRESHOLDS[1]
GENERALIZED_PHASE = "generalized"
# The hash's rule, read from each field's declaration (groklens/config.py, `setting`): a field added
# after the first ledger entries is left out at its legacy value (the behaviour from before it
# existed); a field inert while another is off is left out then; a field derived from another run
# (attn_mask from attn_mask_from's run) is left out while the field naming that run is set, so the
# planned config and the one the file stores hash alike (the entry's config shows the value).
LEGACY_DEFAULTS: dict[str, Any] = {n: f.legacy for n, f in FIELD_FACTS.items() if f.has_legacy}
INERT_UNLESS: dict[str, str] = {n: f.inert_unless for n, f in FIELD_FACTS.items() if f.inert_unless}
# The config fields when the ledger began (groklens 0.1.0, ledger format 1), a record that never
# changes. A field added later must declare its legacy value (`setting(..., legacy=...)`;
# tests/cli/test_reproduce.py checks it); until then it is hashed whatever its value, so old
# entries are kept apart, never wrongly mixed in.
FIELDS_V1 = frozenset((
    "task", "p", "train_frac", "data_seed", "seed", "model", "n_layers", "d_model", "n_heads", "d_head", "d_mlp",
    "act_fn", "norm", "norm_placement", "attention", "unembed", "init", "init_scheme", "causal", "mlp_bias", "radius",
    "tau", "fourier_freqs", "mlp_embed", "n_digits", "seq_len", "n_informative", "informative_layout",
    "distractor_vocab", "loss", "act_norm_lambda", "act_norm_sites", "geomdr_lambda", "geomdr_target", "geomdr_start",
    "geomdr_end", "geomdr_site", "kl_attn_beta", "kl_attn_layer", "grokfast_alpha", "grokfast_lambda", "perp_grad",
    "routing_copies", "routing_width", "routing_unit", "lr", "weight_decay", "betas", "warmup_steps", "batch_size",
    "steps", "eval_every", "checkpoint_every", "log_checkpoints", "grok_threshold", "stop_after_grok", "device"))
# How a run ran, not what it computed (recorded as the entry's `device`): fields declared
# hashed=False, where the run ran and whether its step was compiled (torch.compile gives the eager
# step's numbers to float32 rounding, as the CPU and CUDA paths give each other's;
# tests/trainers/test_compile.py)
NOT_HASHED: tuple[str, ...] = tuple(n for n, f in FIELD_FACTS.items() if not f.hashed)


def hashed_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The part of a config the hash covers (see the module docstring)."""
    return {k: v for k, v in cfg.items()
            if k not in NOT_HASHED and not (k in LEGACY_DEFAULTS and v == LEGACY_DEFAULTS[k])
            and not (k in INERT_UNLESS and not cfg.get(INERT_UNLESS[k]))
            and not (k in DERIVED_FROM and cfg.get(DERIVED_FROM[k]))}


def config_hash(cfg: dict[str, Any]) -> str:
    text = json.dumps(hashed_config(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def arm_hash(cfg: dict[str, Any]) -> str:
    """The hash of the config without the seed fields: equal for every seed of one arm."""
    return config_hash({k: v for k, v in cfg.items() if k not in SEED_FIELDS})


def config_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Hashed fields whose values differ between two configs (for saying why an entry is apart)."""
    ha, hb = hashed_config(a), hashed_config(b)
    return sorted(k for k in set(ha) | set(hb) if k not in SEED_FIELDS and ha.get(k) != hb.get(k))


def ledger_path(directory: str | Path, name: str, scale: str) -> Path:
    return Path(directory) / f"{name}.{scale}.json"


@dataclass
class Ledger:
    path: Path
    experiment: str
    scale: str
    entries: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def load(cls, path: str | Path, experiment: str, scale: str) -> "Ledger":
        path = Path(path)
        if not path.exists() and not path.is_symlink():
            return cls(path, experiment, scale)
        data = load_ledger_file(path)
        if (data.get("experiment"), data.get("scale")) != (experiment, scale):
            raise BadInput(f"{path} is the ledger of {data.get('experiment')} at {data.get('scale')}, "
                           f"not of {experiment} at {scale}")
        return cls(path, experiment, scale, data["runs"])

    def find(self, arm: str, seed: int, chash: str) -> dict[str, Any] | None:
        return next((e for e in self.entries if (e["arm"], e["seed"], e["config_hash"]) == (arm, seed, chash)), None)

    def current(self, arm: str, ahash: str) -> list[dict[str, Any]]:
        """Entries of `arm` whose config, seed aside, hashes to `ahash` (arm_hash), by seed."""
        return sorted((e for e in self.entries if e["arm"] == arm and e["arm_hash"] == ahash),
                      key=lambda e: e["seed"])

    def apart(self, arm: str, ahash: str) -> list[dict[str, Any]]:
        """Entries of `arm` recorded with another config (a changed default or value): not mixed in."""
        return [e for e in self.entries if e["arm"] == arm and e["arm_hash"] != ahash]

    def add(self, entry: dict[str, Any]) -> None:
        old = self.find(entry["arm"], entry["seed"], entry["config_hash"])
        if old is not None:
            self.entries.remove(old)
        self.entries.append(entry)
        self.entries.sort(key=lambda e: (e["arm"], e["seed"], e["config_hash"]))

    def save(self) -> Path:
        """Write atomically (a reader never sees half a ledger)."""
        data = {"format": LEDGER_FORMAT, "experiment": self.experiment, "scale": self.scale,
                "hash": "sha256 of the sorted-JSON config without " + ", ".join(NOT_HASHED)
                        + " and without fields at their legacy default " + json.dumps(LEGACY_DEFAULTS),
                "thresholds": list(THRESHOLDS), "runs": self.entries}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return write_text_atomic(self.path, json.dumps(data, indent=1, sort_keys=False, default=_plain) + "\n")


# what every entry holds, by type (checked when a ledger is read, before any entry is used)
ENTRY_FIELDS: dict[str, tuple[type, ...]] = {
    "arm": (str,), "seed": (int,), "run": (str,), "config_hash": (str,), "arm_hash": (str,), "config": (dict,),
    "memorization_step": (dict,), "grokking_step": (dict,), "last_step": (int,),
}
OPTIONAL_FIELDS: dict[str, tuple[type, ...]] = {
    "measures": (dict,), "phase_notes": (dict,), "phase_checkpoints": (dict,), "final": (dict,),
    "wall_s": (int, float, type(None)), "device": (str,), "status": (str,), "censored": (bool,),
    "cpu_s": (int, float),
}
MAX_ENTRIES = 100_000


def load_ledger_file(path: Path) -> dict[str, Any]:
    """A results ledger, checked: format, one mapping per entry with the fields `ENTRY_FIELDS`
    name (of their types), `measures` a mapping of measure -> {phase: number or null}, and no
    (arm, seed, config_hash) twice. BadInput (one line naming the file and the entry) otherwise."""
    from groklens.fileio import load_json_file

    data = load_json_file(path, "results ledger", allow_nan=True)
    if not isinstance(data, dict) or data.get("format") != LEDGER_FORMAT or not isinstance(data.get("runs"), list):
        raise BadInput(f"{path} is not a groklens results ledger (format {LEDGER_FORMAT})")
    entries = data["runs"]
    if len(entries) > MAX_ENTRIES:
        raise BadInput(f"{path} holds {len(entries)} entries, over {MAX_ENTRIES}")
    seen: dict[tuple, int] = {}
    for i, e in enumerate(entries):
        where = f"{path}: entry {i}"
        if not isinstance(e, dict):
            raise BadInput(f"{where} is a {type(e).__name__}, not a mapping")
        for key, kinds in {**ENTRY_FIELDS, **OPTIONAL_FIELDS}.items():
            if key not in e and key in OPTIONAL_FIELDS:
                continue
            value = e.get(key)
            if key not in e or not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                raise BadInput(f"{where}: {key!r} is {'missing' if key not in e else repr(value)[:60]}, "
                               f"not {' or '.join(k.__name__ for k in kinds)}")
        for m, phases in e.get("measures", {}).items():
            if not isinstance(phases, dict) or not all(
                    v is None or (isinstance(v, (int, float, str)) and not isinstance(v, bool))
                    for v in phases.values()):
                raise BadInput(f"{where}: measure {m!r} is not a mapping of phase -> number")
        for key in ("memorization_step", "grokking_step"):
            if not all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in e[key].values()):
                raise BadInput(f"{where}: {key} holds a value that is not a step")
        problem = entry_problem(e)
        if problem:
            raise BadInput(f"{where} (arm {e['arm']}, seed {e['seed']}): {problem}")
        ident = (e["arm"], e["seed"], e["config_hash"])
        if ident in seen:
            raise BadInput(f"{where} records arm {e['arm']} seed {e['seed']} (config {e['config_hash']}) again, as "
                           f"entry {seen[ident]} does: one run counted twice; remove one")
        seen[ident] = i
    return data


def entry_problem(e: dict[str, Any]) -> str | None:
    """What is wrong with one well-typed entry's values, or None: its identity must be its
    config's (seed and hashes), its steps within [0, the run's last step <= the config's
    steps], its times finite and >= 0, and `final` and `collapse` of the shape summarize_run
    writes (a copied entry with an edited hash would count twice; a grok step of 1e30 or a
    negative wall time would be shown as measured)."""
    for check in (_identity_problem, _steps_problem, _times_problem, _final_problem, _collapse_problem):
        problem = check(e)
        if problem:
            return problem
    return None


def _identity_problem(e: dict[str, Any]) -> str | None:
    cfg = e["config"]
    if e["seed"] != cfg.get("seed"):
        return f"'seed' is {e['seed']}, its config's seed is {cfg.get('seed')!r}"
    for key, want in (("config_hash", config_hash(cfg)), ("arm_hash", arm_hash(cfg))):
        if e[key] != want:
            return f"{key!r} is {e[key][:20]!r}, not the hash of its config ({want})"
    return None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    import math

    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _steps_problem(e: dict[str, Any]) -> str | None:
    cap = e["config"].get("steps")
    if not _is_int(cap) or cap < 0:
        return f"its config's 'steps' is {cap!r}, not a step count"
    if not 0 <= e["last_step"] <= cap:
        return f"'last_step' is {e['last_step']}, outside [0, {cap}] (the config's steps)"
    for key in ("memorization_step", "grokking_step"):
        for threshold, step in e[key].items():
            if step is not None and not 0 <= step <= e["last_step"]:
                return f"{key}[{threshold!r}] is {step}, outside [0, {e['last_step']}] (the run's last step)"
    return None


def _times_problem(e: dict[str, Any]) -> str | None:
    for key in ("wall_s", "cpu_s"):
        value = e.get(key)
        if value is not None and not (_is_number(value) and value >= 0):
            return f"{key!r} is {value!r}, not a finite number of seconds >= 0"
    return None


NON_FINITE = ("nan", "inf", "-inf")  # how summarize_run keeps a non-finite final value (JSON has none)


def _final_problem(e: dict[str, Any]) -> str | None:
    for name, value in e.get("final", {}).items():
        bounds = metric_range(name)
        if value is None or (value in NON_FINITE and bounds != ACCURACY):  # a loss may overflow
            continue
        if not _is_number(value):
            return f"final[{name!r}] is {_shown(value)}, not a number"
        if bounds is not None and not bounds[0] <= value <= bounds[1]:
            return f"final[{name!r}] is {value!r}, outside [{bounds[0]:g}, {bounds[1]:g}]"
    return None


def _collapse_problem(e: dict[str, Any]) -> str | None:
    c = e.get("collapse")
    if c is None:
        return None  # recorded before collapse was kept
    if not isinstance(c, dict):
        return f"'collapse' is {_shown(c)}, not a mapping"
    for key in ("crossed", "fell_below", "grokked"):  # grokked: entries since 2026-12-06
        step = c.get(key)
        if step is not None and not (_is_int(step) and 0 <= step <= e["last_step"]):
            return f"collapse[{key!r}] is {_shown(step)}, not a step in [0, {e['last_step']}]"
    acc = c.get("final_test_acc")
    if acc is not None and not (_is_number(acc) and 0 <= acc <= 1):
        return f"collapse['final_test_acc'] is {_shown(acc)}, not an accuracy in [0, 1]"
    if not isinstance(c.get("collapsed"), bool):
        return f"collapse['collapsed'] is {_shown(c.get('collapsed'))}, not true or false"
    if not isinstance(c.get("ended_below", False), bool):  # kept since 2026-12-06, absent before
        return f"collapse['ended_below'] is {_shown(c['ended_below'])}, not true or false"
    return None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _plain(x: Any) -> Any:
    try:
        return x.item()
    except AttributeError:
        return str(x)


def _finite(x: Any) -> Any:
    import math

    x = _plain(x) if hasattr(x, "item") else x
    return x if not isinstance(x, float) or math.isfinite(x) else str(x)


def wall_seconds(path: Path) -> float | None:
    """Seconds from the file's creation (its `created` attribute) to its last write: the run's wall
    time when it was trained in one go (resumed runs also count the pause)."""
    from groklens.checkpoints.constants import ATTR_CREATED
    from groklens.checkpoints.reader import open_trajectory_file

    with open_trajectory_file(path) as f:
        created = f.attrs.get(ATTR_CREATED)
    if created is None:
        return None
    created = created.decode() if isinstance(created, bytes) else str(created)
    try:
        t0 = time.mktime(time.strptime(created[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
    return round(max(0.0, path.stat().st_mtime - t0), 1)


def device_of(cfg: dict[str, Any]) -> str:
    """Where a run with this config ran here: 'cpu (MODEL, ARCH, N cores)' or 'cuda: NAME', then
    ', subnormals flushed' for a CPU run that flushed them (flush_denormal=true), and ', compiled'
    when its step was (compile=true). The CPU's model name since 2026-12-07: step times differ
    between CPUs beyond their speed (an unflushed transformer step after memorization: 2.6x
    slower on one of this project's machines, not on another; docs/PERFORMANCE.md)."""
    how = ", compiled" if cfg.get("compile") else ""
    dev = str(cfg.get("device", "cpu"))
    if dev != "cpu":
        import torch

        if dev.startswith("cuda") or (dev == "auto" and torch.cuda.is_available()):
            return "cuda: " + torch.cuda.get_device_name(0) + how
    flushed = ", subnormals flushed" if cfg.get("flush_denormal") else ""
    return f"cpu ({cpu_model()}, {platform.machine()}, {os.cpu_count()} cores){flushed}{how}"


def summarize_run(path: Path, experiment: str, arm: str, seed: int, measures: list[str],
                  run_values: dict[str, Any] | None = None, curves: Sequence[str] = ()) -> dict[str, Any]:
    """The ledger entry of one finished run (see the module docstring); `run_values`: what the
    experiment reads from the whole run (Experiment.run_values), kept as the entry's run_values;
    `curves`: measures kept at every checkpoint where they are stored (an experiment that reads a
    whole curve)."""
    import groklens
    from groklens.analyses.compare import load_run
    from groklens.analyses.grokking import collapse, grok_evals_of, grokking_times
    from groklens.checkpoints import Trajectory

    traj = Trajectory(path)
    cfg = traj.config_dict
    metrics = traj.metrics
    evals = grok_evals_of(cfg)
    times = grokking_times(metrics, THRESHOLDS, evals)
    run = load_run(path, GROK_THRESHOLD)
    with_values = {k: {ph: _finite(v) for ph, v in run.values[k].items()} for k in measures if k in run.values}
    # "generalized": the first evaluation with test accuracy >= GENERALIZED (the sphere paper's
    # FVE checkpoint), read as load_run's grokking phase at that threshold
    run99 = load_run(path, GENERALIZED)
    for k in with_values:
        with_values[k][GENERALIZED_PHASE] = _finite(run99.values[k]["grokking"])
    phase_steps = {**run.phase_steps, GENERALIZED_PHASE: run99.phase_steps.get("grokking")}
    phase_notes = dict(run.phase_notes)
    if run99.phase_notes.get("grokking"):
        phase_notes[GENERALIZED_PHASE] = run99.phase_notes["grokking"].replace("grokking",
                                                                               f"test accuracy {GENERALIZED:g}")
    from groklens.checkpoints.constants import ATTR_GROKLENS_VERSION
    from groklens.checkpoints.reader import open_trajectory_file

    with open_trajectory_file(path) as f:
        trained_by = f.attrs.get(ATTR_GROKLENS_VERSION, "")
    trained_by = trained_by.decode() if isinstance(trained_by, bytes) else str(trained_by)
    grok = times["grokking_step"][f"{GROK_THRESHOLD:g}"]
    return {
        "experiment": experiment, "arm": arm, "seed": seed, "run": path.name.removesuffix(".h5"),
        "config_hash": config_hash(cfg), "arm_hash": arm_hash(cfg), "config": cfg,
        "memorization_step": times["memorization_step"], "grokking_step": times["grokking_step"],
        "threshold_rule": threshold_rule(evals),
        **({"first_crossing": times["first_crossing"]} if evals > 1 else {}),
        "last_step": times["last_step"], "censored": grok is None,
        "status": traj.status,
        "final": {k: _finite(v[-1]) for k, v in metrics.items() if len(v) and k != "step"},
        "collapse": collapse(metrics, GROK_THRESHOLD, evals=evals),
        "measures": with_values,
        **({"run_values": run_values} if run_values is not None else {}),
        **({"curves": _curves(run, curves)} if curves else {}),
        "phase_checkpoints": phase_steps,
        "phase_notes": phase_notes,
        "groklens_version": trained_by or groklens.__version__,
        "recorded_by": groklens.__version__,
        "wall_s": wall_seconds(path), "wall_source": "file created -> last write",
        # the process CPU time its training took (all its threads; resumes added up): files from
        # before it was kept have none
        **({"cpu_s": round(cpu, 1)} if (cpu := traj.cpu_seconds) is not None else {}),
        "device": device_of(cfg),
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def threshold_rule(evals: int) -> str:
    """How an entry's steps were read: at grok_evals 1 (every committed entry) the first crossing."""
    if evals == 1:
        return "first evaluation with accuracy >= threshold"
    return (f"memorization: first evaluation with train accuracy >= threshold; grokking: the first of {evals} "
            "consecutive evaluations with test accuracy >= threshold")


def _curves(run, keys: Sequence[str]) -> dict[str, dict[str, list]]:
    """measure key -> {steps, values} over every checkpoint the measure's analysis is stored at."""
    from groklens.analyses.measures import MEASURES, reduce_value

    out = {}
    for m in MEASURES:
        stored, key = run.stored.get(m.analysis), run.value_keys.get(m.key)
        if m.key in keys and stored is not None and key is not None:
            out[m.key] = {"steps": [int(s) for s in stored.steps],
                          "values": [reduce_value(v, m.reduce) for v in stored.values[key]]}
    return out


class LedgerRun(PhaseTimes):
    """A ledger entry with the attributes the experiments' readings use (as compare.RunSummary)."""

    def __init__(self, entry: dict[str, Any], threshold: float = GROK_THRESHOLD):
        key = f"{threshold:g}"
        self.entry = entry
        self.name = entry["run"]
        self.config = entry["config"]
        self.seed = entry["seed"]
        self.memorization = entry["memorization_step"].get(key)
        self.grokking = entry["grokking_step"].get(key)
        self.last_step = entry["last_step"]
        self.values = entry.get("measures", {})
        self.phase_notes = entry.get("phase_notes", {})
        self.wall_s = entry.get("wall_s")
        self.final_test_acc = entry.get("final", {}).get("test_acc")
        # entries recorded before collapse was stored: from the grok step and the final accuracy
        # (when it first fell back is then unknown)
        self.collapse = entry.get("collapse") or {
            "crossed": self.grokking, "fell_below": None, "final_test_acc": self.final_test_acc,
            "collapsed": self.grokking is not None and (self.final_test_acc is None or self.final_test_acc < threshold)}
        self.collapsed = bool(self.collapse.get("collapsed"))
        self.run_values = entry.get("run_values", {})

    def value(self, key: str, phase: str) -> float | None:
        v = self.values.get(key, {}).get(phase)
        return v if isinstance(v, (int, float)) else None


def ledger_entries(directories: list[Path], name: str, scale: str) -> list[dict[str, Any]]:
    """Every entry of NAME at SCALE in these ledgers; a ledger that does not load is refused
    (BadInput naming it), never skipped: its entries' times would be missing without a word."""
    out = []
    for d in directories:
        p = ledger_path(d, name, scale)
        if p.exists():
            out += Ledger.load(p, name, scale).entries
    return out


def measured_time(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The recorded time per run of these entries: `cpu` (mean_s, max_s, n) over the entries
    with a CPU time, `wall` over those with a wall time only (None where there are none), and
    the devices they ran on; None when no entry has either."""
    def stats(xs: list[float]) -> dict[str, Any] | None:
        return {"mean_s": sum(xs) / len(xs), "max_s": max(xs), "n": len(xs)} if xs else None

    num = (int, float)
    cpu = [float(e["cpu_s"]) for e in entries if isinstance(e.get("cpu_s"), num)]
    wall = [float(e["wall_s"]) for e in entries
            if not isinstance(e.get("cpu_s"), num) and isinstance(e.get("wall_s"), num)]
    if not cpu and not wall:
        return None
    devices = sorted({str(e.get("device", "?")).split(" (")[0] for e in entries
                      if isinstance(e.get("cpu_s"), num) or isinstance(e.get("wall_s"), num)})
    return {"cpu": stats(cpu), "wall": stats(wall), "n": len(cpu) + len(wall), "devices": devices}

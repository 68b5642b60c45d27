"""What training a run costs on this machine (issue 38): `reproduce --list` and the estimate
`reproduce` prints before it trains.

A run's CPU-core time = its steps to the expected stop x the step's CPU time + its evaluations x
one evaluation's CPU time. Both rates are measured here (`measure_rates`: a few steps of a real
SingleRun on one thread, by process CPU time, so other processes' time slices do not count) for
every distinct step cost (`cost_key`: the config up to fields that change no step's work), and
cached per machine, torch and trainer code (`RateCache`). Where measuring is impossible (a run
meant for a GPU here, or `--no-measure`) the FLOP model (`flop_rates`) stands in, and the listing
says which basis each figure has.

The expected stop (`expected_stop`): the mean last step of the ledger's runs of that arm where it
has some; else, for runs that stop after grokking, the experiment's expected grokking step
(`Scale.expect_grok`) x EXPECTED_MARGIN plus the evaluations the stop rule waits; else the cap.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from groklens.config import FIELD_FACTS
from groklens.experiments.layout import step_flops

# a run that stops after grokking is costed to this many times its expected grokking step
EXPECTED_MARGIN = 2.0

# Timing: one warm-up step (first-call allocation), then up to MEASURE_STEPS timed steps, stopping
# once they took MEASURE_BUDGET_S of CPU (at least one is timed); the fastest is the rate. One
# evaluation pass is timed on all inputs, or on EVAL_SAMPLE of them (scaled: the evaluation
# forward is linear in the inputs) where there are more than one evaluation chunk. On this
# project's 2-core machine a paper-scale config takes about 0.6 s, a quick one 0.2 s.
MEASURE_STEPS = 3
MEASURE_BUDGET_S = 0.5
EVAL_SAMPLE = 256

# The FLOP-model fallback: seconds per step = STEP_OVERHEAD_S + FLOPs / CPU_FLOPS (layout.step_flops
# counts the full forward, not the readout-only and table paths the trainer takes, so at paper scale
# it over-counts; calibrated 2026-11-30 on the shared 2-core machine: an upper bound there)
CPU_FLOPS = 3.0e10
STEP_OVERHEAD_S = 1.5e-2

# fields that change no step's work, declared costed=False (groklens/config.py): configs equal but
# for these share one measurement
NOT_COSTED = frozenset(n for n, f in FIELD_FACTS.items() if not f.costed)

CACHE_ENV = "GROKLENS_CACHE_DIR"
CACHE_FORMAT = 1
CACHE_NAME = "step-costs.json"
CACHE_CONTEXTS = 8  # machine/torch/code contexts kept in one cache file


@dataclass(frozen=True)
class Rates:
    step_s: float  # CPU seconds of one training step
    eval_s: float  # CPU seconds of one evaluation (every input)
    basis: str  # "measured" (here, one thread) | "flop model"


def cost_key(cfg: Any) -> str:
    """The config as the step sees it (sorted JSON without NOT_COSTED)."""
    return json.dumps({k: v for k, v in cfg.to_dict().items() if k not in NOT_COSTED}, sort_keys=True)


def measurable(cfg: Any) -> bool:
    """Whether cfg's runs train on this machine's CPU (a GPU run's step cannot be timed on it)."""
    if cfg.device == "cpu":
        return True
    if cfg.device != "auto":
        return False
    import torch

    return not torch.cuda.is_available()


# ---------------------------------------------------------------------- measuring
def measure_rates(cfg: Any, table: bool = True, steps: int = MEASURE_STEPS,
                  budget_s: float = MEASURE_BUDGET_S) -> Rates:
    """Rates of cfg timed here on one torch thread (see the module docstring); torch's thread
    count is restored after. The fastest timed step is the rate: other processes only add to a
    step's time (cache and memory traffic, even in CPU time). cfg.compile: the compiled step
    (its compiling is the warm-up step's). table=False: a transformer's first block on the
    batch's rows, not its table (`Transformer.embedding_table`: the step of runs trained before
    the table path)."""
    import torch

    from groklens.tasks import TASKS
    from groklens.trainers.train import strategy_class

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cpu = cfg.replace(device="cpu")
        run = strategy_class(cpu)(cpu, TASKS.get(cfg.task).build(cfg))  # a routed run's step is its M copies'
        if not table and hasattr(run, "lane") and hasattr(run.model, "embedding_table"):
            run.model.embedding_table = False
        run.train_step(0)
        times: list[float] = []
        while len(times) < steps and sum(times) < budget_s:
            t0 = time.process_time()
            run.train_step(len(times) + 1)
            times.append(time.process_time() - t0)
        return Rates(min(times), _eval_seconds(run), "measured")
    finally:
        torch.set_num_threads(before)


def _eval_seconds(run: Any) -> float:
    import torch

    from groklens.trainers.engine import EVAL_CHUNK

    n = len(run.t.inputs)
    if n <= EVAL_CHUNK:  # the trainer's own pass
        t0 = time.process_time()
        run.evaluate(1)
        return time.process_time() - t0
    lanes = getattr(run, "lanes", None) or [run.lane]  # a routed run evaluates each of its copies
    with torch.no_grad():
        t0 = time.process_time()
        lanes[0].forward(run.t.inputs[:EVAL_SAMPLE], capture=False)
        return (time.process_time() - t0) * n / EVAL_SAMPLE * len(lanes)


def flop_rates(cfg: Any) -> Rates:
    train_f, eval_f = step_flops(cfg)
    return Rates(STEP_OVERHEAD_S + train_f / CPU_FLOPS, STEP_OVERHEAD_S + eval_f / CPU_FLOPS, "flop model")


# ---------------------------------------------------------------------- the cache
def cache_path() -> Path:
    """$GROKLENS_CACHE_DIR, else $XDG_CACHE_HOME/groklens, else ~/.cache/groklens; the file in it."""
    d = os.environ.get(CACHE_ENV) or os.path.join(os.environ.get("XDG_CACHE_HOME") or
                                                  os.path.join(os.path.expanduser("~"), ".cache"), "groklens")
    return Path(d) / CACHE_NAME


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def code_version() -> str:
    """groklens' version and a hash of what a step runs (the trainers and models packages and the
    tasks): a changed step path re-measures, though the version number stayed."""
    import groklens
    import groklens.models
    import groklens.tasks
    import groklens.trainers

    h = hashlib.sha256(groklens.__version__.encode())
    rooms = [Path(room.__file__).parent for room in (groklens.trainers, groklens.models)]
    for p in [*sorted(p for room in rooms for p in room.rglob("*.py")), Path(groklens.tasks.__file__)]:
        h.update(p.read_bytes())
    return groklens.__version__ + "+" + h.hexdigest()[:12]


def context() -> dict[str, Any]:
    """What the cached rates hold for: this machine (CPU model, cores), torch and groklens' code."""
    import torch

    return {"cpu": cpu_model(), "cores": os.cpu_count() or 1, "torch": torch.__version__, "code": code_version(),
            "python": platform.python_version(), "threads": 1}


class RateCache:
    """Measured rates by context and cost key, in one JSON file written atomically. A missing,
    unreadable or malformed file (or entry) is no cache: measured again, never a traceback."""

    def __init__(self, path: Path, ctx: Mapping[str, Any]):
        self.path, self.ctx = path, dict(ctx)
        self.ctx_key = hashlib.sha256(json.dumps(self.ctx, sort_keys=True).encode()).hexdigest()[:16]
        self.contexts = self._load()
        self.changed = False

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError, UnicodeDecodeError):
            return {}
        if (not isinstance(data, dict) or data.get("format") != CACHE_FORMAT
                or not isinstance(data.get("contexts"), dict)):
            return {}
        return {k: v for k, v in data["contexts"].items()
                if isinstance(v, dict) and isinstance(v.get("rates"), dict)}

    def get(self, key: str) -> Rates | None:
        entry = self.contexts.get(self.ctx_key, {}).get("rates", {}).get(_digest(key))
        if not isinstance(entry, dict):
            return None
        step, ev = entry.get("step_s"), entry.get("eval_s")
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
                   for x in (step, ev)):
            return None
        return Rates(float(step), float(ev), "measured")

    def put(self, key: str, rates: Rates) -> None:
        own = self.contexts.setdefault(self.ctx_key, {"context": self.ctx, "rates": {}})
        own["rates"][_digest(key)] = {"step_s": rates.step_s, "eval_s": rates.eval_s,
                                      "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
        own["used"] = time.time()
        self.changed = True

    def save(self) -> None:
        """Write when something was measured; a cache that cannot be written is skipped (the
        rates were measured, the next listing measures them again)."""
        if not self.changed:
            return
        from groklens.fileio import write_text_atomic

        keep = sorted(self.contexts.items(), key=lambda kv: (kv[0] != self.ctx_key, -_used(kv[1])))[:CACHE_CONTEXTS]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.path, json.dumps({"format": CACHE_FORMAT, "contexts": dict(keep)}, indent=1) + "\n")
        except (OSError, ValueError):
            pass
        self.changed = False


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:20]


def _used(ctx_entry: Mapping[str, Any]) -> float:
    used = ctx_entry.get("used")
    return float(used) if isinstance(used, (int, float)) and not isinstance(used, bool) else 0.0


def rates_for(cfgs: Iterable[Any], measure: bool = True, cache: RateCache | None = None,
              timer: Callable[[Any], Rates] = measure_rates,
              echo: Callable[[str], None] | None = None) -> dict[str, Rates]:
    """cost_key -> Rates of every distinct step among `cfgs`: cached or measured here where
    `measure` and the run trains on this CPU, else the FLOP model. The cache is saved after."""
    distinct = {}
    for cfg in cfgs:
        distinct.setdefault(cost_key(cfg), cfg)
    if measure and cache is None:
        cache = RateCache(cache_path(), context())
    out: dict[str, Rates] = {}
    todo = []
    for key, cfg in distinct.items():
        hit = cache.get(key) if measure and measurable(cfg) else None
        if hit is not None:
            out[key] = hit
        elif measure and measurable(cfg):
            todo.append((key, cfg))
        else:
            out[key] = flop_rates(cfg)
    if todo and echo is not None:
        echo(f"timing the steps of {len(todo)} config(s) on one thread here (cached in {cache.path}) ...")
    for key, cfg in todo:
        out[key] = timer(cfg.replace(compile=False))  # eager: the listing's runs, and 3-30 s less per config
        cache.put(key, out[key])
    if cache is not None:
        cache.save()
    return out


# ---------------------------------------------------------------------- to the expected stop
def expected_stop(cfg: Any, expect_grok: int | None, ledger_last: list[int]) -> tuple[int, str]:
    """(steps, basis) a run of cfg is expected to train: the mean last step of the ledger's runs
    of its arm ('ledger'); for a run that stops after its stop event, EXPECTED_MARGIN x the
    expected event step, plus the evaluations the rule waits, not before stop_min_steps
    ('expected'); else its step cap ('cap'). Never past the cap."""
    cap = cfg.steps
    if ledger_last:
        return min(cap, round(sum(ledger_last) / len(ledger_last))), "ledger"
    if cfg.stop_after_grok > 0 and expect_grok is not None:
        # the stop rule waits for grokking to be confirmed (grok_evals evaluations in a row) too
        after = max(cfg.stop_after_grok, cfg.stop_event_evals() - 1)
        stop = max(EXPECTED_MARGIN * expect_grok + after * cfg.eval_every, cfg.stop_min_steps)
        return min(cap, int(math.ceil(stop / cfg.eval_every) * cfg.eval_every)), "expected"
    return cap, "cap"


def run_seconds(cfg: Any, rates: Rates, steps: int) -> float:
    """CPU seconds of training cfg for `steps` steps: the steps and the evaluations (step 0,
    every eval_every, the last)."""
    return steps * rates.step_s + (steps // cfg.eval_every + 1) * rates.eval_s


@dataclass
class RunCost:
    variant: str
    expected_s: float  # CPU-core seconds to the expected stop
    cap_s: float  # ... to the step cap
    stop: int
    stop_basis: str  # ledger | expected | cap
    rate_basis: str  # measured | flop model


def cost_runs(runs: Iterable[tuple[str, Any]], expect: Callable[[str], int | None], last_steps: Mapping[str, list[int]],
              rates: Mapping[str, Rates]) -> list[RunCost]:
    """The cost of each (variant, cfg): `expect(variant)` the expected stop-event step,
    `last_steps[variant]` the ledger's last steps of that arm, `rates` from `rates_for`."""
    out = []
    for variant, cfg in runs:
        r = rates[cost_key(cfg)]
        stop, basis = expected_stop(cfg, expect(variant), last_steps.get(variant, []))
        out.append(RunCost(variant, run_seconds(cfg, r, stop), run_seconds(cfg, r, cfg.steps), stop, basis, r.basis))
    return out


def cap_cost(cfgs: Iterable[Any], echo: Callable[[str], None] | None = None,
             measure: bool = True) -> Callable[[Any], float]:
    """cost(cfg) -> CPU seconds of cfg to its step cap, from step times measured here on one
    thread (`rates_for`, cached; measure=False: the FLOP model), for sizing a sweep's ensembles
    and ordering its tasks (the costliest first: `sweep --ensemble`, and `reproduce`)."""
    rates = rates_for(cfgs, measure=measure, echo=echo)
    return lambda cfg: run_seconds(cfg, rates[cost_key(cfg)], cfg.steps)


def echo_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)

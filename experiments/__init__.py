"""`groklens reproduce`: the published results of docs/RESULTS.md, one command each.

groklens.experiments is the room above the others (docs/DESIGN.md): it plans runs through the
sweeps, reads them through the analyses and keeps the results ledger; no other room imports it
but the CLI.

An experiment is a named plan of runs at three scales, and a reading of those runs:
    smoke  a tiny end-to-end check for the test suite (p 5-7, widths 8-32, tens of steps, one
           seed): it proves the pipeline, never the result;
    quick  fits a 2-core CPU (minutes to under an hour): smaller p and model than the paper,
           said in each experiment's note, in `--list` and in docs/RESULTS.md;
    paper  the published configuration (`--list` says whether it fits this CPU).

`reproduce(name, scale, out_dir, seeds, ledger_dir=..., results_md=...)`:
    1. looks every run of seeds 1..N up in the results ledger (`ledger.py`: LEDGER/NAME.SCALE.json,
       default OUT/ledger; the committed one is docs/results/) by arm, seed and config hash;
    2. trains, into OUT/runs through `groklens.sweeps.run_sweep`, only the runs that
       neither the ledger nor a finished file of the same config hash in OUT/runs holds
       (interrupted ones are resumed exactly);
    3. computes the analyses the experiment reads on the new runs and records each of them in the
       ledger (grokking steps at each threshold, censoring, final metrics, measures at the phases);
    4. compares the run files present in OUT/runs (`comparison.txt` / `.csv`, `report/`);
    5. reads the rows from the ledger: every recorded seed of each arm whose config hash is the
       current one (entries of another config are listed apart, never mixed in), each published
       number (value and source) beside ours and their ratio; into OUT/results.json and, with
       `results_md`, the reproduce table of that markdown file (a rerun for the same experiment
       and scale replaces its rows).

Where the source states a claim without a number, the row's published value is None, the claim
is quoted, and `verdict` says whether ours agrees, by the rules of `verdicts.py`. Results that
disagree with the paper are reported as they are. A grokking time that was not reached is
right-censored: the mean then counts the censoring step and is a lower bound (shown `> N` or
`>= N`), never dropped. Speed-ups everywhere (rows, comparison.txt) are compare.speedup's: the
ratio of geometric means with the Welch interval on log times. Every value states its n.
"""


import importlib
import pkgutil

import groklens as _top

if getattr(_top, "__file__", None) is None:  # a folder named groklens (the clone) shadows the installed package
    raise ImportError(f"the folder {list(_top.__path__)[0]} shadows the installed groklens: Python found it first "
                      "(the current directory or the script's); run from another directory, or rename the clone "
                      "(README, 'Importing groklens')")

from groklens.errors import BadInput, GroklensError  # noqa: F401  (re-exported)
from groklens.experiments.core import (  # noqa: F401
    DEFAULT_SEEDS, ENTRY_POINTS, EXPERIMENTS, LEDGER_DIR, RESULTS_MD, SCALES, SPEEDUP_DEFINITION, Context, Experiment,
    Plan, Published, Result, Row, Scale, fit_text, register)
from groklens.experiments.cost import EXPECTED_MARGIN, expected_stop, flop_rates, rates_for  # noqa: F401
from groklens.experiments.layout import step_flops  # noqa: F401
from groklens.experiments.pipeline import (  # noqa: F401
    command_text, estimate_runs, format_listing, format_result, get_experiment, listing, reproduce, result_lines,
    run_configs, update_results_md)

# every module of this package registers its experiments when imported (one file per paper: a
# new experiment is one module here), then the modules named by installed packages' entry points
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
EXPERIMENTS.load_plugins()

from groklens.experiments.scaling_law import SCALING_PUBLISHED  # noqa: E402, F401
from groklens.experiments.sphere_paper import ARCH, ARCH_LABEL, SPHERE_TABLE  # noqa: E402, F401

__all__ = ["EXPERIMENTS", "SCALES", "Experiment", "Published", "Result", "Row", "estimate_runs", "format_listing",
           "format_result", "get_experiment", "listing", "reproduce", "run_configs", "update_results_md"]

"""Train one run of an experiment (its config from `run_configs`, as `reproduce` trains it) for
STEPS steps on one thread, with one evaluation and one checkpoint at the end, in a temporary
directory; time it from outside, paired against another tree's groklens (docs/PERFORMANCE.md):

    farm-bench -n 3 --timeout 900 \\
        --vs "OLD_TREE/.venv/bin/python benchmarks/experiment_step.py structural-attention paper kl0.1_s1 300" -- \\
        .venv/bin/python benchmarks/experiment_step.py structural-attention paper kl0.1_s1 300

(run from this tree: the script's directory, not the tree, goes on sys.path, so each python
imports its own installed groklens).
"""

import pathlib
import sys
import tempfile

import torch

from groklens.experiments import get_experiment
from groklens.experiments.pipeline import run_configs
from groklens.trainers.train import train

if len(sys.argv) not in (4, 5):
    sys.exit("usage: experiment_step.py EXPERIMENT SCALE RUN [STEPS]   e.g. geomdr paper add_tf_base_s1 200")
experiment, scale, run = sys.argv[1:4]
steps = int(sys.argv[4]) if len(sys.argv) == 5 else 200
seed = int(run.rsplit("_s", 1)[1])
torch.set_num_threads(1)
cfg = next((c for _, name, c in run_configs(get_experiment(experiment), scale, seed) if name == run), None)
if cfg is None:
    sys.exit(f"no run {run!r} in {experiment} {scale}")
cfg = cfg.replace(steps=steps, eval_every=steps, checkpoint_every=steps)
with tempfile.TemporaryDirectory() as d:
    train(cfg, pathlib.Path(d) / "run.h5", progress=False)

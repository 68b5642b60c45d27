"""Train Prieto et al.'s paper MLP (experiment stablemax, paper scale, arm ce_float64, seed 1) for
STEPS steps on one thread, with the one-hot first layer read from rows (`lean`) or by the one-hot
matmul (`explicit`); time it from outside, paired (docs/PERFORMANCE.md):

    farm-bench -n 4 --timeout 400 --vs "python benchmarks/onehot_mlp_step.py explicit" -- \
        python benchmarks/onehot_mlp_step.py lean
"""

import pathlib
import sys
import tempfile

import torch

from groklens.experiments import get_experiment
from groklens.experiments.pipeline import run_configs
from groklens.models.mlp import MLP
from groklens.trainers.train import train

path, steps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 300
if path not in ("lean", "explicit"):
    sys.exit("usage: onehot_mlp_step.py lean|explicit [STEPS]")
torch.set_num_threads(1)
MLP.lean_path = path == "lean"
cfg = next(c for _, name, c in run_configs(get_experiment("stablemax"), "paper", 1) if name == "ce_float64_s1")
cfg = cfg.replace(steps=steps, eval_every=min(100, steps), checkpoint_every=steps)
with tempfile.TemporaryDirectory() as d:
    train(cfg, pathlib.Path(d) / "run.h5", progress=False)

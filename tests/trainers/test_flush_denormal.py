"""flush_denormal (float32 subnormals flushed to zero while training on the CPU): on during the
run, the process's own setting back after it, the trajectory the unflushed one's to float
rounding, and out of the ledger's hash (old entries and files keep their meaning)."""

import numpy as np
import torch

from groklens.checkpoints import Trajectory
from groklens.config import RunConfig, stored_dict
from groklens.experiments.ledger import config_hash, device_of
from groklens.trainers.engine import flushing_denormals, subnormals_flushed
from groklens.trainers.train import train
from tests.helpers import tiny_config

# Trained until the training loss is ~1e-6, so the cross-entropy's wrong-class probabilities reach
# float32's subnormal range (exp(-87) and below): checked below, not assumed.
MEMORIZING = dict(p=17, train_frac=0.5, lr=1e-2, weight_decay=0.0, steps=400, eval_every=50, checkpoint_every=200)
PARAM_RTOL, METRIC_RTOL = 1e-5, 1e-5  # a flushed operand changes a sum by less than float32's rounding of it


def _flag_during(path, **overrides) -> list[bool]:
    seen: list[bool] = []
    train(tiny_config(**MEMORIZING, **overrides), path, progress=False,
          on_eval=lambda row: seen.append(subnormals_flushed()))
    return seen


def test_the_flag_holds_while_training_and_the_former_setting_comes_back(tmp_path):
    assert not subnormals_flushed()
    assert set(_flag_during(tmp_path / "on.h5")) == {True}  # the default
    assert not subnormals_flushed()
    assert set(_flag_during(tmp_path / "off.h5", flush_denormal=False)) == {False}
    torch.set_flush_denormal(True)  # a caller that flushes already keeps flushing after a run
    try:
        assert set(_flag_during(tmp_path / "off2.h5", flush_denormal=False)) == {False}
        assert subnormals_flushed()
    finally:
        torch.set_flush_denormal(False)


def test_flushing_reaches_subnormals_and_leaves_the_trajectory_as_it_was(tmp_path):
    _flag_during(tmp_path / "flush.h5")
    _flag_during(tmp_path / "keep.h5", flush_denormal=False)
    a, b = Trajectory(tmp_path / "flush.h5"), Trajectory(tmp_path / "keep.h5")
    # the run reached the range where flushing acts: a float32 softmax of its logits has subnormal entries
    data, model = b.dataset(), b.model(int(b.steps[-1]))
    with torch.no_grad():
        logits = model(data.inputs[data.train_idx])[:, data.readout_pos].double()
    probs = logits.softmax(-1)
    subnormal = (probs > 2.0 ** -149) & (probs < torch.finfo(torch.float32).tiny)
    assert subnormal.any(), "no subnormal probability: the run is too short to test flushing"
    for step in a.steps:
        pa, pb = a.params(int(step)), b.params(int(step))
        for name in pa:
            assert float((pa[name] - pb[name]).norm()) <= PARAM_RTOL * float(pb[name].norm()), (int(step), name)
    for key in ("train_loss", "test_loss", "train_acc", "test_acc"):
        x, y = a.metrics[key], b.metrics[key]
        assert np.abs(x - y).max() <= METRIC_RTOL * max(np.abs(y).max(), 1.0), key
    assert a.config.flush_denormal and not b.config.flush_denormal


def test_the_field_is_out_of_the_hash_and_an_older_file_meant_false():
    cfg = tiny_config().to_dict()
    assert cfg["flush_denormal"] is True
    old = {k: v for k, v in cfg.items() if k != "flush_denormal"}  # a config stored before the field
    assert config_hash({**cfg, "flush_denormal": False}) == config_hash(cfg) == config_hash(old)
    assert RunConfig.from_dict(stored_dict(old)).flush_denormal is False
    assert device_of({**cfg, "device": "cpu"}).endswith(", subnormals flushed")
    assert "subnormals" not in device_of({**old, "device": "cpu"})
    assert device_of({**cfg, "device": "cpu", "compile": True}).endswith(", subnormals flushed, compiled")


def test_flushing_denormals_is_a_no_op_when_the_setting_is_already_there():
    with flushing_denormals(False):
        assert not subnormals_flushed()
    with flushing_denormals(True):
        assert subnormals_flushed()
        with flushing_denormals(True):
            assert subnormals_flushed()
        assert subnormals_flushed()
    assert not subnormals_flushed()


TWO_THREADS = r"""
import os, sys, torch
torch.set_num_threads(2)
from groklens.trainers.engine import subnormals_flushed
from groklens.trainers.train import train
from tests.helpers import tiny_config

def threads():
    return len(os.listdir("/proc/self/task"))

shares, started = [], []
def look(row):
    started.append(threads())
    y = torch.full((4_000_000,), 1e-29) * 1e-10  # subnormal products, split over both threads
    shares.append(float((y != 0).float().mean()))

before = threads()
# d_mlp 512: initializing W_in (128 x 512) is an intra-op parallel op, so torch starts its thread
# while the model is built, before the first step
train(tiny_config(d_model=128, d_head=64, d_mlp=512, steps=20, eval_every=10), sys.argv[1], progress=False,
      on_eval=look)
print(before, min(started), max(shares), subnormals_flushed())
"""


def test_a_two_thread_run_flushes_on_the_thread_torch_starts_while_building_the_model(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    out = subprocess.run([sys.executable, "-c", TWO_THREADS, str(tmp_path / "r.h5")], capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parents[2], timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    before, during, nonzero, after = out.stdout.split()
    assert int(during) > int(before)  # the intra-op thread exists by the first evaluation
    assert float(nonzero) == 0.0  # every thread flushed: none of the subnormal products survived
    assert after == "False"  # the calling thread has its setting back

"""compile=true (torch.compile of a single run's training step) against the eager step: the same
trajectory to float rounding, not to the bit (inductor fuses the elementwise ops and orders
some reductions otherwise), and refused where it would not apply."""

import functools

import numpy as np
import pytest

from groklens.checkpoints import Trajectory
from groklens.errors import BadInput
from tests.helpers import tiny_config, train_tiny

# Relative to each series' scale, over 50 steps of the post-norm LayerNorm model below: measured
# (torch 2.13 CPU, 1 thread) at most 3.7e-7 for a parameter and 2.6e-8 for a loss, over Nanda's,
# the post-norm LayerNorm, the sphere and a mini-batch tiny model; ~30x that.
PARAM_RTOL, METRIC_RTOL = 1e-5, 1e-6
POST_LN = dict(p=17, steps=50, eval_every=10, checkpoint_every=25, norm="ln", norm_placement="post",
               causal=False, mlp_bias=True)


@functools.cache
def compile_works() -> bool:
    """Whether torch.compile can build a CPU kernel here (dynamo on this Python, a C++ compiler)."""
    import torch

    try:
        return bool(torch.compile(lambda x: x.sin() + 1)(torch.ones(3)).allclose(torch.ones(3).sin() + 1))
    except Exception:  # any failure means: not available here
        return False


@pytest.mark.slow  # ~35 s of compiling on a cold inductor cache
def test_a_compiled_run_follows_the_eager_trajectory(tmp_path):
    if not compile_works():
        pytest.skip("torch.compile cannot build CPU kernels here")
    train_tiny(tmp_path / "eager.h5", **POST_LN)
    train_tiny(tmp_path / "compiled.h5", **POST_LN, compile=True)
    eager, compiled = Trajectory(tmp_path / "eager.h5"), Trajectory(tmp_path / "compiled.h5")
    assert list(compiled.steps) == list(eager.steps) == [0, 25, 50]
    for step in eager.steps:
        a, b = eager.params(int(step)), compiled.params(int(step))
        for name in a:
            scale = float(a[name].norm())
            assert float((a[name] - b[name]).norm()) <= PARAM_RTOL * scale, (int(step), name)
    for key in ("train_loss", "test_loss"):
        a, b = eager.metrics[key], compiled.metrics[key]
        assert np.abs(a - b).max() <= METRIC_RTOL * np.abs(a).max(), key
    assert compiled.config.compile and not eager.config.compile


@pytest.mark.parametrize("overrides, words", [
    (dict(routing_copies=2), "routing_copies > 1"),
    (dict(act_norm_lambda=0.1), "regularizer terms"),
])
def test_compile_is_refused_where_it_would_not_apply(tmp_path, overrides, words):
    with pytest.raises(BadInput, match=words):
        train_tiny(tmp_path / "r.h5", compile=True, **overrides)
    assert not (tmp_path / "r.h5").exists()


def test_a_compiled_config_trains_alone_with_its_step_compiled():
    from groklens.tasks import TASKS
    from groklens.trainers.ensemble import ensemble_key, unsupported_reason
    from groklens.trainers.single import SingleRun

    cfg = tiny_config(compile=True)
    assert ensemble_key(cfg) is None and "compile=True" in unsupported_reason(cfg)
    assert SingleRun(cfg, TASKS.get(cfg.task).build(cfg)).lane.compiled is not None  # compiled at its first call
    assert SingleRun(tiny_config(), TASKS.get(cfg.task).build(cfg)).lane.compiled is None


def test_no_cpp_compiler_is_a_one_line_refusal_before_any_file(tmp_path):
    from tests.helpers import config_flags, groklens

    out = tmp_path / "c.h5"
    proc = groklens("train", "-q", "--out", str(out), *config_flags(tiny_config(compile=True)),
                    env={"CXX": "/nonexistent"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "C++ compiler" in proc.stderr
    assert not out.exists()

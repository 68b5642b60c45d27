"""groklens' AdamW (trainers/optim.py) against torch.optim.AdamW, which it must equal to the bit."""

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from groklens.checkpoints import Trajectory
from groklens.trainers import single
from groklens.trainers.optim import AdamW
from tests.helpers import train_tiny


def _steps(model, opt, x, y, n, lr_schedule=None):
    for s in range(n):
        if lr_schedule is not None:
            for group in opt.param_groups:
                group["lr"] = lr_schedule(s)
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()


def _model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(7, 13), torch.nn.ReLU(), torch.nn.Linear(13, 5))


def test_same_update_and_state_as_torch_adamw():
    x, y = torch.randn(32, 7), torch.randint(0, 5, (32,))
    ours, ref = _model(), _model()
    kw = dict(lr=3e-3, betas=(0.9, 0.98), weight_decay=1.0)
    opt, ref_opt = AdamW(ours.parameters(), **kw), torch.optim.AdamW(ref.parameters(), **kw)
    schedule = lambda s: 3e-3 * min(1.0, (s + 1) / 10)  # warm-up, as the loop sets it
    _steps(ours, opt, x, y, 40, schedule)
    _steps(ref, ref_opt, x, y, 40, schedule)
    for a, b in zip(ours.parameters(), ref.parameters()):
        assert torch.equal(a, b)
    sd, ref_sd = opt.state_dict(), ref_opt.state_dict()
    assert sd["param_groups"] == ref_sd["param_groups"]
    for i, st in sd["state"].items():
        for key in st:
            assert torch.equal(st[key], ref_sd["state"][i][key]), key
    # a reloaded optimizer continues exactly like the uninterrupted reference
    resumed = AdamW(ours.parameters(), **kw)
    resumed.load_state_dict(sd)
    _steps(ours, resumed, x, y, 10)
    _steps(ref, ref_opt, x, y, 10)
    for a, b in zip(ours.parameters(), ref.parameters()):
        assert torch.equal(a, b)


def test_training_loop_is_bit_identical_with_torch_adamw(tmp_path, monkeypatch):
    train_tiny(tmp_path / "ours.h5", steps=80, weight_decay=1.0)
    # the loop as it was before trainers/optim.py
    monkeypatch.setitem(single.OPTIMIZERS, "adamw", torch.optim.AdamW)
    train_tiny(tmp_path / "torch.h5", steps=80, weight_decay=1.0)
    a, b = Trajectory(tmp_path / "ours.h5"), Trajectory(tmp_path / "torch.h5")
    assert a.param_names == b.param_names
    for name in a.param_names:
        assert np.array_equal(a.param_trajectory(name), b.param_trajectory(name)), name
    assert not np.array_equal(a.param_trajectory("embed.W_E")[0], a.param_trajectory("embed.W_E")[-1])


def test_adamw_does_not_import_the_compiler_stack():
    code = (
        "import sys, torch\n"
        "from groklens.trainers.optim import AdamW\n"
        "p = torch.nn.Parameter(torch.ones(3))\n"
        "opt = AdamW([p], lr=0.1)\n"
        "p.sum().backward(); opt.step(); opt.zero_grad(); opt.load_state_dict(opt.state_dict())\n"
        "assert float(p[0]) != 1.0\n"
        "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("method", ["add_param_group", "zero_grad", "state_dict", "load_state_dict"])
def test_methods_are_torch_own_code(method):
    # not a copy: the very function torch's wrapper holds
    assert getattr(AdamW, method) is getattr(torch.optim.Optimizer, method).__wrapped__


def test_adam_is_adam_with_an_l2_term_written_out():
    """optimizer=adam: weight decay enters the gradient (g + wd w) before Adam's moments (coupled),
    unlike AdamW's decoupled w *= 1 - lr wd; checked against the update written out here."""
    from groklens.trainers.optim import OPTIMIZERS

    x, y = torch.randn(32, 7), torch.randint(0, 5, (32,))
    ours, ref = _model(), _model()
    lr, (b1, b2), wd, eps = 5e-3, (0.9, 0.999), 0.05, 1e-8
    opt = OPTIMIZERS["adam"](ours.parameters(), lr=lr, betas=(b1, b2), weight_decay=wd)
    _steps(ours, opt, x, y, 25)
    params = list(ref.parameters())
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for t in range(1, 26):
        for p in params:
            p.grad = None
        F.cross_entropy(ref(x), y).backward()
        with torch.no_grad():
            for p, mi, vi in zip(params, m, v):
                g = p.grad + wd * p
                mi.mul_(b1).add_((1 - b1) * g)
                vi.mul_(b2).add_((1 - b2) * g * g)
                p.sub_(lr * (mi / (1 - b1**t)) / ((vi / (1 - b2**t)).sqrt() + eps))
    for a, b in zip(ours.parameters(), params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_adam_runs_train_alone():
    from groklens.config import RunConfig
    from groklens.trainers.ensemble import ensemble_key, unsupported_reason

    cfg = RunConfig(optimizer="adam")
    assert ensemble_key(cfg) is None and "optimizer='adam'" in unsupported_reason(cfg)

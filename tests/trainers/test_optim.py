"""groklens' AdamW on stacked parameters (trainers/optim.py) against torch.optim.AdamW, which it
must equal to the bit on CPU: per member of a stack, on a module viewed as a stack of one, and
inside a single run's training step."""

import subprocess
import sys

import torch
import torch.nn.functional as F

from groklens.tasks import TASKS
from groklens.trainers.engine import warmup_factor
from groklens.models.losses import task_loss
from groklens.models import build_model
from groklens.trainers.optim import AdamW, stack_of_one
from groklens.trainers.single import SingleRun
from tests.helpers import tiny_config


def _model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(7, 13), torch.nn.ReLU(), torch.nn.Linear(13, 5))


def test_a_module_as_a_stack_of_one_steps_and_resumes_as_torch_adamw():
    x, y = torch.randn(32, 7), torch.randint(0, 5, (32,))
    ours, ref = _model(), _model()
    betas, wd = (0.9, 0.98), 1.0
    params = stack_of_one(dict(ours.named_parameters()))
    opt, ref_opt = AdamW(params, betas), torch.optim.AdamW(ref.parameters(), lr=3e-3, betas=betas, weight_decay=wd)

    def steps(opt, n, start):
        for s in range(start, start + n):
            lr = 3e-3 * min(1.0, (s + 1) / 10)  # warm-up, as the loop sets it
            ours.zero_grad(set_to_none=True)
            F.cross_entropy(ours(x), y).backward()
            grads = stack_of_one({n: p.grad for n, p in ours.named_parameters()})
            opt.step(params, grads, torch.tensor([lr], dtype=torch.float64), torch.tensor([wd], dtype=torch.float64))
            for group in ref_opt.param_groups:
                group["lr"] = lr
            ref_opt.zero_grad(set_to_none=True)
            F.cross_entropy(ref(x), y).backward()
            ref_opt.step()

    steps(opt, 40, 0)
    for a, b in zip(ours.parameters(), ref.parameters()):
        assert torch.equal(a, b)
    state = opt.state(0)
    for (name, _), st in zip(ours.named_parameters(), ref_opt.state_dict()["state"].values()):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(torch.from_numpy(state[f"optim.{name}.{key}"]), st[key].float()), (name, key)
    resumed = AdamW(params, betas)  # a reloaded optimizer continues exactly like the uninterrupted reference
    resumed.load(0, state, step=40)
    steps(resumed, 10, 40)
    for a, b in zip(ours.parameters(), ref.parameters()):
        assert torch.equal(a, b)


def test_each_member_of_a_stack_steps_as_torch_adamw_alone():
    """Each member with its own lr and weight decay; a tensor without a gradient is skipped (no
    decay), as torch does."""
    gen = torch.Generator().manual_seed(0)
    lrs, wds, betas = [1e-3, 3e-2, 0.1], [1.0, 0.0, 0.3], (0.9, 0.98)
    shapes = {"a": (4, 5), "b": (7,), "frozen": (3,)}
    stacked = {n: torch.randn(3, *s, generator=gen) for n, s in shapes.items()}
    alone = [{n: torch.nn.Parameter(t[i].clone()) for n, t in stacked.items()} for i in range(3)]
    opts = [torch.optim.AdamW(list(p.values()), lr=lr, betas=betas, weight_decay=wd)
            for p, lr, wd in zip(alone, lrs, wds)]
    opt = AdamW(stacked, betas)
    for _ in range(5):
        grads = {n: torch.randn(3, *shapes[n], generator=gen) for n in ("a", "b")}
        opt.step(stacked, grads, torch.tensor(lrs, dtype=torch.float64), torch.tensor(wds, dtype=torch.float64))
        for i, (params, ref) in enumerate(zip(alone, opts)):
            for n in ("a", "b"):
                params[n].grad = grads[n][i].clone()
            ref.step()
    for i, params in enumerate(alone):
        for n, p in params.items():
            assert torch.equal(stacked[n][i], p.detach()), (i, n)


def _beside_torch(cfg, optimizer, steps: int):
    """A SingleRun of cfg and a twin model (the same seeded init) stepped by the torch optimizer
    class on the same task loss with the same warm-up, `steps` updates each."""
    data = TASKS.get(cfg.task).build(cfg)
    run = SingleRun(cfg, data)
    twin = build_model(cfg, data)
    ref = optimizer(twin.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    readout = slice(data.readout_pos, data.readout_pos + 1)
    for step in range(steps):
        assert run.train_step(step) == []
        for group in ref.param_groups:
            group["lr"] = cfg.lr * warmup_factor(cfg, step)
        ref.zero_grad(set_to_none=True)
        task_loss(twin(run.train_x, readout=readout)[:, 0], run.train_y).backward()
        ref.step()
    for (name, a), (_, b) in zip(run.model.named_parameters(), twin.named_parameters()):
        assert torch.equal(a, b), name
    return run, data


def test_a_single_run_step_is_the_task_loss_step_of_torch_adamw():
    """SingleRun.train_step against a twin model stepped by torch.optim.AdamW on the same loss,
    with warm-up, weight decay, and parameters without a gradient (uniform attention's W_Q, W_K)."""
    cfg = tiny_config(attention="uniform", norm="ln", weight_decay=1.0, warmup_steps=5)
    run, data = _beside_torch(cfg, torch.optim.AdamW, 30)
    assert not torch.equal(run.model.embed.W_E, build_model(cfg, data).embed.W_E)  # it trained


def test_adamw_does_not_import_the_compiler_stack():
    code = (
        "import sys, torch\nfrom groklens.trainers.optim import AdamW\n"
        "p = {'w': torch.ones(1, 3)}\nopt = AdamW(p, (0.9, 0.98))\n"
        "opt.step(p, {'w': torch.ones(1, 3)}, torch.tensor([0.1], dtype=torch.float64), torch.zeros(1, "
        "dtype=torch.float64))\nopt.load(0, opt.state(0), step=1)\n"
        "assert float(p['w'][0, 0]) != 1.0\n"
        "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_optimizer_adam_is_torch_adam_with_its_l2_term():
    """optimizer=adam: weight decay enters the gradient (g + wd w) before Adam's moments (coupled),
    unlike AdamW's decoupled w *= 1 - lr wd; a single run steps as torch.optim.Adam on the same loss."""
    cfg = tiny_config(optimizer="adam", weight_decay=0.05, lr=5e-3, betas=[0.9, 0.999], warmup_steps=5)
    run, data = _beside_torch(cfg, torch.optim.Adam, 25)
    adamw = SingleRun(tiny_config(weight_decay=0.05, lr=5e-3, betas=[0.9, 0.999], warmup_steps=5), data)
    for step in range(25):
        adamw.train_step(step)
    assert not torch.equal(adamw.model.embed.W_E, run.model.embed.W_E)  # the decay is not AdamW's


def test_each_member_of_a_stack_steps_as_torch_adam_alone():
    """Members with different weight decays: each steps as torch.optim.Adam alone (to rounding:
    the per-member L2 term is a product and a sum where torch fuses them)."""
    gen = torch.Generator().manual_seed(1)
    lrs, wds, betas = [1e-3, 3e-2], [0.5, 0.0], (0.9, 0.999)
    stacked = {"a": torch.randn(2, 4, 5, generator=gen)}
    alone = [torch.nn.Parameter(stacked["a"][i].clone()) for i in range(2)]
    opts = [torch.optim.Adam([p], lr=lr, betas=betas, weight_decay=wd) for p, lr, wd in zip(alone, lrs, wds)]
    opt = AdamW(stacked, betas, coupled_decay=True)
    for _ in range(5):
        g = torch.randn(2, 4, 5, generator=gen)
        opt.step(stacked, {"a": g}, torch.tensor(lrs, dtype=torch.float64), torch.tensor(wds, dtype=torch.float64))
        for i, (p, ref) in enumerate(zip(alone, opts)):
            p.grad = g[i].clone()
            ref.step()
    for i, p in enumerate(alone):
        torch.testing.assert_close(stacked["a"][i], p.detach(), rtol=1e-6, atol=1e-7)


def test_adam_members_share_an_ensemble_only_with_adam_members():
    from groklens.config import RunConfig
    from groklens.trainers.ensemble import ensemble_key

    adam, adamw = ensemble_key(RunConfig(optimizer="adam")), ensemble_key(RunConfig())
    assert adam is not None and adamw is not None and adam != adamw
    assert ensemble_key(RunConfig(optimizer="adam", seed=2)) == adam

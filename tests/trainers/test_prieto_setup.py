"""Prieto et al.'s figure-1 setup as their code runs it (experiments/stablemax.py, paper
scale): the one-hot MLP without biases, AdamW with eps 1e-25, the float32 cross-entropy and
⊥AdamW, each against an independent loop written here after their code (plain nn.Linear layers
on concatenated one-hot inputs, torch.optim.AdamW, their loss and projection formulas)."""

import math

import pytest
import torch
import torch.nn.functional as F

from groklens.errors import BadInput
from groklens.experiments.stablemax import PAPER, PAPER_ARMS
from groklens.tasks import TASKS
from groklens.models.losses import cross_entropy, cross_entropy_float32
from groklens.trainers.single import SingleRun
from tests.helpers import tiny_config

P, HIDDEN = 11, 16


def _paper_config(arm: str, **overrides):
    """The paper arm's config at p=11, 16-wide hidden layers and a few steps."""
    fields = {**PAPER, **PAPER_ARMS[arm][0], "p": P, "d_mlp": HIDDEN, "steps": 20, "eval_every": 10,
              "checkpoint_every": 10, **overrides}
    return tiny_config(**fields)


def _their_loss(logits: torch.Tensor, labels: torch.Tensor, precision: torch.dtype) -> torch.Tensor:
    """utils.py's cross_entropy_float32 / _float64: log_softmax in that precision, gather, mean."""
    return -F.log_softmax(logits.to(precision), dim=-1).gather(-1, labels[:, None]).mean()


def _their_mlp(model) -> torch.nn.Sequential:
    """models.py's MLP(2p, [h, h], p, bias=False) holding our model's weights (nn.Linear stores [out, in])."""
    layers = [torch.nn.Linear(2 * P, HIDDEN, bias=False), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN, bias=False),
              torch.nn.ReLU(), torch.nn.Linear(HIDDEN, P, bias=False)]
    ours = [model.layers[0].W_in, model.layers[1].W_in, model.unembed.W_U]
    with torch.no_grad():
        for linear, w in zip(layers[::2], ours):
            linear.weight.copy_(w.T)
    return torch.nn.Sequential(*layers)


def _onehot_inputs(tokens: torch.Tensor) -> torch.Tensor:
    """datasets.py's AlgorithmicDataset input: cat(one_hot(x, p), one_hot(y, p))."""
    return torch.cat([F.one_hot(tokens[:, 0], P), F.one_hot(tokens[:, 1], P)], dim=1).float()


def _orthogonalize(params) -> None:
    """orthograd.py's _orthogonalize_gradients, per tensor on the flattened vectors."""
    with torch.no_grad():
        for p in params:
            w, g = p.view(-1), p.grad.view(-1)
            g_orth = g - torch.dot(w, g) / (torch.dot(w, w) + 1e-30) * w
            p.grad.copy_((g_orth * (g.norm(2) / (g_orth.norm(2) + 1e-30))).view_as(p.grad))


def _their_orthograd_base(params, lr: float, beta2: float, eps: float) -> torch.optim.Optimizer:
    """grokking_experiments.py's ⊥AdamW construction in brief: a wrapper optimizer whose base AdamW
    is built on the wrapper's param groups with lr and weight_decay only, then the wrapper loads the
    state dict of AdamW(betas=(0.9, beta2), eps); the base optimizer is what steps."""
    params = list(params)

    class Wrapper(torch.optim.Optimizer):
        def __init__(self):
            super().__init__(params, {})
            self.base_optimizer = torch.optim.AdamW(self.param_groups, lr=lr, weight_decay=0)

    configured = torch.optim.AdamW(params, lr=lr, weight_decay=0, eps=eps, betas=(0.9, beta2))
    wrapper = Wrapper()
    wrapper.load_state_dict(configured.state_dict())
    assert wrapper.param_groups[0]["betas"] == (0.9, beta2)  # the wrapper's groups took the state dict's ...
    return wrapper.base_optimizer  # ... the base kept its own


def _train_beside_theirs(cfg, steps: int, loss_fn, optimizer, orthograd: bool):
    data = TASKS.get(cfg.task).build(cfg)
    run = SingleRun(cfg, data)
    twin = _their_mlp(run.model)
    x, y = _onehot_inputs(run.train_x), run.train_y
    assert torch.allclose(twin(x), run.model(run.train_x)[:, -1], atol=1e-6)  # the same function at init
    opt = optimizer(twin.parameters())
    for step in range(steps):
        run.train_step(step)
        opt.zero_grad()
        loss_fn(twin(x), y).backward()
        if orthograd:
            _orthogonalize(twin.parameters())
        opt.step()
    return run, twin, x


def _assert_same_weights(run, twin, atol: float) -> None:
    ours = [run.model.layers[0].W_in, run.model.layers[1].W_in, run.model.unembed.W_U]
    for i, (linear, w) in enumerate(zip(twin[::2], ours)):
        assert torch.allclose(linear.weight.T, w, atol=atol, rtol=0), i


def test_the_mlp_is_their_bias_free_mlp_on_2p_one_hot_inputs_with_nn_linear_init():
    cfg = _paper_config("ce_float64")
    model = SingleRun(cfg, TASKS.get(cfg.task).build(cfg)).model
    shapes = [tuple(p.shape) for _, p in model.named_parameters()]
    assert shapes == [(2 * P, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, P)]  # no `=` column, no biases
    wide = SingleRun(big := tiny_config(**{**PAPER, "steps": 10, "eval_every": 10, "checkpoint_every": 10}),
                     TASKS.get(big.task).build(big)).model.layers[0].W_in
    reference = torch.nn.Linear(226, 200).weight  # kaiming_uniform(a=sqrt(5)): U(+-1/sqrt(fan_in))
    bound = 1 / math.sqrt(226)
    for w in (wide, reference):
        assert w.abs().max() <= bound and w.abs().max() > 0.999 * bound
        assert float(w.detach().std()) == pytest.approx(bound / math.sqrt(3), rel=0.02)


def test_their_float64_ce_arm_steps_as_torch_adamw_with_eps_1e_25():
    cfg = _paper_config("ce_float64")
    assert (cfg.adam_eps, tuple(cfg.betas), cfg.loss) == (1e-25, (0.9, 0.99), "ce")
    run, twin, _ = _train_beside_theirs(
        cfg, 20, lambda o, y: _their_loss(o, y, torch.float64),
        lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.9, 0.99), eps=1e-25, weight_decay=0), orthograd=False)
    _assert_same_weights(run, twin, atol=1e-5)


def test_adam_eps_is_the_step_and_not_a_no_op():
    """The same run with torch's eps 1e-8 ends elsewhere (the eps reaches the update)."""
    a = _paper_config("ce_float64")
    runs = [SingleRun(c, TASKS.get(c.task).build(c)) for c in (a, a.replace(adam_eps=1e-8))]
    for run in runs:
        for step in range(20):
            run.train_step(step)
    assert not torch.equal(runs[0].model.unembed.W_U, runs[1].model.unembed.W_U)


def test_their_float32_ce_is_log_softmax_in_float32_and_collapses():
    gen = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(6, 9, generator=gen, dtype=torch.float64) * 5, torch.arange(6)
    assert torch.equal(cross_entropy_float32(logits, labels), _their_loss(logits, labels, torch.float32))
    assert cross_entropy_float32(logits, labels).dtype == torch.float32
    # softmax collapse: the label leads by 30 nats; float32 rounds its loss and gradient to 0, float64 does not
    lead = torch.zeros(1, 9, dtype=torch.float32)
    lead[0, 3] = 30.0
    for fn, collapses in ((cross_entropy_float32, True), (cross_entropy, False)):
        x = lead.clone().requires_grad_(True)
        loss = fn(x, torch.tensor([3]))
        loss.backward()
        assert (float(loss.detach()) == 0.0 and float(x.grad[0, 3]) == 0.0) == collapses, fn.__name__


def test_their_float32_ce_arm_steps_as_their_loop():
    cfg = _paper_config("ce_float32")
    run, twin, _ = _train_beside_theirs(
        cfg, 20, lambda o, y: _their_loss(o, y, torch.float32),
        lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.9, 0.99), eps=1e-25, weight_decay=0), orthograd=False)
    _assert_same_weights(run, twin, atol=1e-5)


def test_their_orthograd_steps_torch_default_adamw_and_so_does_our_perp_arm():
    """Their ⊥AdamW command gives --beta2 0.99 and the default eps 1e-25, but the base AdamW that
    steps keeps torch's defaults (0.9, 0.999) and 1e-8; the perp_adamw arm trains as that loop."""
    probe = torch.nn.Linear(3, 2)
    base = _their_orthograd_base(probe.parameters(), lr=0.01, beta2=0.99, eps=1e-25)
    assert (base.param_groups[0]["betas"], base.param_groups[0]["eps"]) == ((0.9, 0.999), 1e-8)
    cfg = _paper_config("perp_adamw")
    assert (cfg.perp_grad, cfg.perp_grad_scale, cfg.loss) == (True, "orthograd", "ce_float32")
    run, twin, _ = _train_beside_theirs(
        cfg, 20, lambda o, y: _their_loss(o, y, torch.float32),
        lambda ps: _their_orthograd_base(ps, lr=0.01, beta2=0.99, eps=1e-25), orthograd=True)
    _assert_same_weights(run, twin, atol=1e-5)


def test_their_stablemax_arm_steps_as_their_loop():
    def their_stablemax(logits, labels):  # utils.py: s(x) and log(s / sum s), in float64
        x = logits.to(torch.float64)
        s = torch.where(x < 0, 1 / (1 - x + 1e-30), x + 1)
        return -torch.log(s / s.sum(-1, keepdim=True)).gather(-1, labels[:, None]).mean()

    cfg = _paper_config("stablemax")
    run, twin, _ = _train_beside_theirs(
        cfg, 20, their_stablemax,
        lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.9, 0.999), eps=1e-25, weight_decay=0), orthograd=False)
    _assert_same_weights(run, twin, atol=1e-5)


def test_bad_values_of_the_new_fields_are_one_clear_line():
    with pytest.raises(BadInput, match="adam_eps must be a positive number"):
        tiny_config(adam_eps=0.0)
    with pytest.raises(BadInput, match="mlp_embed=onehot_residues needs operands that are residues"):
        tiny_config(task="seq_add", model="mlp", mlp_embed="onehot_residues", distractor_vocab=3)

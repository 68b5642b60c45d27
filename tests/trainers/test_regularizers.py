"""Regularizers, losses and gradient transforms, each against a computation written here."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from groklens.checkpoints import Trajectory
from groklens.trainers.engine import METRIC_NAMES
from groklens.trainers.single import SingleRun
from groklens.trainers.train import metric_names, resume, train
from groklens.models import build_model
from groklens.trainers.optim import stack_of_one
from groklens.models.losses import stablemax, stablemax_cross_entropy
from groklens.trainers.regularizers import REGULARIZERS, Batch, effective_rank
from groklens.tasks import TASKS
from tests.helpers import tiny_config, train_interrupted


def _setup(**kw):
    cfg = tiny_config(**kw)
    data = TASKS.get(cfg.task).build(cfg)
    return cfg, data, build_model(cfg, data)


def _grads(params):
    """The module's gradients as the update sees them: stacks of one, written through in place."""
    return stack_of_one({n: p.grad for n, p in params.items()})


def _capture(model, names, x):
    """Forward with hooks written here (not the trainer's), returning logits and the activations."""
    acts = {}

    def keep(t, hook):
        acts[hook.name] = t

    logits = model.run_with_hooks(x, fwd_hooks=[(n, keep) for n in names])
    return logits, acts


class _NoWriter:
    """Stands in for the trajectory writer when a test drives SingleRun.train_step directly."""

    class f:
        filename = "unused.h5"


def _trainer(cfg, data):
    return SingleRun(cfg, data, lambda _t: _NoWriter(), progress=False)


# ---------------------------------------------------------------------- activation-norm penalty
def test_activation_norm_penalty_matches_a_hand_computation():
    lam = 0.3
    cfg, data, model = _setup(n_layers=2, act_norm_lambda=lam)
    reg = REGULARIZERS.get("act_norm")([cfg], model, data)
    assert reg.hook_names == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    x = data.inputs[:5]
    _, acts = _capture(model, reg.hook_names, x)
    value, metrics = reg.term(acts, Batch(x, data.informative_mask[:5], [2]), step=0)
    value = value.detach()
    total, count, radius = 0.0, 0, 0.0
    for name in reg.hook_names:  # every vector: 2 sites x 5 inputs x 3 positions
        for vec in acts[name].detach().double().reshape(-1, cfg.d_model).tolist():
            norm = math.sqrt(sum(v * v for v in vec))
            total += (norm - math.sqrt(cfg.d_model)) ** 2 / cfg.d_model
            radius += norm / math.sqrt(cfg.d_model)
            count += 1
    assert count == 30
    assert float(value) == pytest.approx(lam * total / count, rel=1e-9)
    assert float(metrics["act_norm_radius"]) == pytest.approx(radius / count, rel=1e-9)


def test_act_norm_sites_are_the_sites_a_training_step_runs(tmp_path):
    """'*' passed the up-front check and failed at the first evaluation with KeyError:
    blocks.0.attn.hook_result (a TransformerLens hook that runs only with use_attn_result),
    leaving a dead run file; the causal mask's -inf attention scores gave an infinite penalty."""
    from groklens.errors import BadInput
    from tests.helpers import groklens, config_flags

    cfg, data, model = _setup(act_norm_lambda=0.1, act_norm_sites="*")
    names = REGULARIZERS.get("act_norm")([cfg], model, data).hook_names
    assert "blocks.0.hook_resid_post" in names and "blocks.0.mlp.hook_post" in names
    assert not {"blocks.0.attn.hook_result", "blocks.0.hook_q_input", "blocks.0.attn.hook_attn_scores"} & set(names)
    for sites, why in (("blocks.0.attn.hook_result", "optional hooks, which a training forward pass does not run"),
                       ("blocks.0.attn.hook_attn_scores", "not finite")):
        with pytest.raises(BadInput, match=why):
            REGULARIZERS.get("act_norm")([tiny_config(act_norm_lambda=0.1, act_norm_sites=sites)], model, data)
    run = tmp_path / "r.h5"
    out = groklens("train", "-q", "--out", str(run), *config_flags(tiny_config(
        act_norm_lambda=0.1, act_norm_sites="blocks.0.attn.hook_result", steps=20, checkpoint_every=10)))
    assert out.returncode == 2 and "matches no site the penalty can use" in out.stderr and not run.exists()
    train(tiny_config(act_norm_lambda=0.1, act_norm_sites="*", steps=20, checkpoint_every=10), run, progress=False)
    assert Trajectory(run).status == "completed"


def test_training_step_descends_loss_plus_penalty():
    """The gradient a trainer step applies == autograd of CE + the penalty, both written here."""
    lam = 0.5
    cfg, data, model = _setup(act_norm_lambda=lam, warmup_steps=0)
    trainer = _trainer(cfg, data)
    x, y = data.inputs[data.train_idx], data.labels[data.train_idx]
    logits, acts = _capture(model, ["blocks.0.hook_resid_post"], x)
    h = acts["blocks.0.hook_resid_post"].double()
    penalty = ((torch.sqrt((h * h).sum(-1)) - math.sqrt(cfg.d_model)) ** 2 / cfg.d_model).mean()
    ce = F.cross_entropy(logits[:, 2].double(), y)
    (ce + lam * penalty).backward()
    assert trainer.train_step(0) == []  # no member failed
    loss = trainer.last_loss
    # the step reports the task loss (its lean path sums in another order: float32 rounding)
    assert loss == pytest.approx(float(ce.detach()), rel=1e-6)
    for (n, a), (_, b) in zip(trainer.model.named_parameters(), model.named_parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6, rtol=1e-5), n
    # without the penalty the gradient differs: the term really enters the objective
    model.zero_grad()
    F.cross_entropy(model(x)[:, 2].double(), y).backward()
    assert not torch.allclose(trainer.model.embed.W_E.grad, model.embed.W_E.grad, atol=1e-6)
    assert not any(hp.fwd_hooks for hp in trainer.model.hook_dict.values())  # nothing left behind


def test_capture_hooks_are_removed_even_when_the_forward_raises():
    cfg, data, _ = _setup(act_norm_lambda=0.1)
    trainer = _trainer(cfg, data)
    with pytest.raises(IndexError):
        trainer.forward(torch.full((2, 3), 10_000, dtype=torch.long))
    assert not any(hp.fwd_hooks for hp in trainer.model.hook_dict.values())


# ---------------------------------------------------------------------- KL attention intervention
@pytest.mark.parametrize("layout", ["first", "random"])
def test_kl_attention_term_matches_a_hand_computation(layout):
    beta = 0.7
    cfg, data, model = _setup(task="seq_add", seq_len=5, n_informative=2, informative_layout=layout,
                              distractor_vocab=3, kl_attn_beta=beta, n_layers=2, kl_attn_layer=-1)
    reg = REGULARIZERS.get("kl_attn")([cfg], model, data)
    x, mask = data.inputs[:6], data.informative_mask[:6]
    _, cache = model.run_with_cache(x)
    _, acts = _capture(model, reg.hook_names, x)
    value, metrics = reg.term(acts, Batch(x, mask, [data.readout_pos]), step=0)
    value = value.detach()
    q = data.readout_pos
    total, count = 0.0, 0
    for layer in range(2):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"].double()  # [b, h, q, k]
        for b in range(6):
            informative = [j for j in range(mask.shape[1]) if mask[b, j]]
            for h in range(cfg.n_heads):
                pi = 1 / len(informative)
                total += sum(pi * math.log(pi / pattern[b, h, q, j].item()) for j in informative)
                count += 1
    assert float(metrics["kl_attn"]) == pytest.approx(total / count, rel=1e-5)
    assert float(value) == pytest.approx(beta * total / count, rel=1e-5)


def test_kl_attention_is_zero_when_attention_is_already_uniform_on_the_informative_tokens():
    cfg, data, model = _setup(task="seq_add", seq_len=2, n_informative=2, kl_attn_beta=1.0, attention="uniform",
                              causal=False)
    reg = REGULARIZERS.get("kl_attn")([cfg], model, data)
    _, acts = _capture(model, reg.hook_names, data.inputs)
    # uniform over 3 positions: KL(1/2, 1/2 || 1/3, 1/3) = log(3/2)
    value, _ = reg.term(acts, Batch(data.inputs, data.informative_mask, [2]), step=0)
    assert float(value) == pytest.approx(math.log(1.5), rel=1e-6)


# ---------------------------------------------------------------------- GeomDR
def test_effective_rank_against_numpy_and_a_known_case():
    k = 4
    H = torch.cat([torch.eye(k), -torch.eye(k)])  # centred, k equal singular values
    assert float(effective_rank(H)) == pytest.approx(k, rel=1e-12)
    A = torch.randn(30, 6) @ torch.randn(6, 10)
    s = np.linalg.svd(A.double().numpy() - A.double().numpy().mean(0), compute_uv=False)
    p = s / s.sum()
    assert float(effective_rank(A)) == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-9)


def test_geomdr_penalty_window_and_value():
    cfg, data, model = _setup(geomdr_lambda=2.0, geomdr_target=3.0, geomdr_start=5, geomdr_end=9)
    reg = REGULARIZERS.get("geomdr")([cfg], model, data)
    assert reg.hook_names == ["blocks.0.hook_resid_post"]
    x = data.inputs[data.train_idx]
    _, acts = _capture(model, reg.hook_names, x)
    batch = Batch(x, data.informative_mask[data.train_idx], [2])
    H = acts["blocks.0.hook_resid_post"][:, 2].detach().double().numpy()
    s = np.linalg.svd(H - H.mean(0), compute_uv=False)
    p = s / s.sum()
    erank = math.exp(-(p * np.log(p)).sum())
    for step, on in [(4, False), (5, True), (8, True), (9, False)]:
        value, metrics = reg.term(acts, batch, step, evaluating=True)
        expected = 2.0 * ((erank - 3.0) / 3.0) ** 2 if on else 0.0
        assert float(value.detach()) == pytest.approx(expected, rel=1e-9, abs=1e-300), step
        assert float(metrics["geomdr_erank"]) == pytest.approx(erank, rel=1e-9)
    value, _ = reg.term(acts, batch, 6)
    value.backward()  # differentiable inside the window
    assert model.unembed.W_U.grad is None and model.blocks[0].mlp.W_out.grad.abs().sum() > 0


# ---------------------------------------------------------------------- Grokfast
def test_grokfast_filter_matches_the_formula_over_three_steps():
    alpha, lam = 0.8, 2.5
    cfg, data, model = _setup(grokfast_alpha=alpha, grokfast_lambda=lam)
    params = dict(model.named_parameters())
    reg = REGULARIZERS.get("grokfast")([cfg], model, data, stack_of_one(params))
    gen = torch.Generator().manual_seed(3)
    raw = [{n: torch.randn(p.shape, generator=gen, dtype=torch.float64) for n, p in params.items()} for _ in range(3)]
    ema = None
    for t in range(3):
        for n, p in params.items():
            p.grad = raw[t][n].float().clone()
        reg.transform(stack_of_one(params), _grads(params))
        # ema_1 = g_1; ema_t = alpha ema_{t-1} + (1 - alpha) g_t; g_t <- g_t + lambda ema_t
        ema = {n: raw[t][n].clone() if ema is None else alpha * ema[n] + (1 - alpha) * raw[t][n] for n in params}
        for n, p in params.items():
            assert torch.allclose(p.grad.double(), raw[t][n] + lam * ema[n], atol=1e-5), (t, n)
    state = reg.state(0)
    assert all(np.allclose(state[f"reg.grokfast.{n}.ema"], ema[n].numpy(), atol=1e-6) for n in params)


def test_grokfast_training_equals_a_plain_loop_with_the_filter():
    cfg, data, model = _setup(grokfast_alpha=0.9, grokfast_lambda=2.0, warmup_steps=0)
    trainer = _trainer(cfg, data)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
    x, y = data.inputs[data.train_idx], data.labels[data.train_idx]
    ema = {}
    for step in range(3):
        trainer.train_step(step)
        opt.zero_grad()
        F.cross_entropy(model(x)[:, 2].double(), y).backward()
        for n, p in model.named_parameters():
            ema[n] = p.grad.clone() if step == 0 else 0.9 * ema[n] + 0.1 * p.grad
            p.grad = p.grad + 2.0 * ema[n]
        opt.step()
    for (n, a), (_, b) in zip(trainer.model.named_parameters(), model.named_parameters()):
        assert torch.allclose(a, b, atol=1e-6), n


def test_resume_with_grokfast_state_is_bit_identical(tmp_path):
    cfg = tiny_config(steps=60, eval_every=10, checkpoint_every=20, grokfast_lambda=2.0, perp_grad=True,
                      act_norm_lambda=0.05)
    whole = tmp_path / "whole.h5"
    train(cfg, whole, progress=False)

    cut = tmp_path / "cut.h5"
    train_interrupted(cfg, cut, 37)
    assert list(Trajectory(cut).steps) == [0, 20]
    result = resume(cut, progress=False)
    assert result.last_step == 60
    a, b = Trajectory(whole), Trajectory(cut)
    assert list(a.steps) == list(b.steps) == [0, 20, 40, 60]
    for name in a.param_names:
        assert np.array_equal(a.param_trajectory(name), b.param_trajectory(name)), name
    ma, mb = a.metrics, b.metrics
    assert set(ma) == set(mb) >= {"grokfast_ema_norm", "perp_grad_removed", "reg_act_norm"}
    for key in ma:
        assert np.array_equal(ma[key], mb[key], equal_nan=True), key


# ---------------------------------------------------------------------- perpendicular gradient
def test_unscaled_perpendicular_gradient_removes_the_component_along_each_tensor():
    cfg, data, model = _setup(perp_grad=True, perp_grad_scale="unscaled", mlp_bias=True)
    reg = REGULARIZERS.get("perp_grad")([cfg], model, data)
    params = dict(model.named_parameters())
    gen = torch.Generator().manual_seed(0)
    before = {}
    for n, p in params.items():
        p.grad = torch.randn(p.shape, generator=gen)
        before[n] = p.grad.double().clone()
    reg.transform(stack_of_one(params), _grads(params))
    for n, p in params.items():
        w, g = p.detach().double(), before[n]
        ww = (w * w).sum()
        expected = g if ww == 0 else g - (w * g).sum() / ww * w  # zero-initialised biases keep theirs
        assert torch.allclose(p.grad.double(), expected, atol=1e-5), n
        if ww > 0:
            assert abs(float((w * p.grad.double()).sum())) < 1e-4 * float(g.norm() * w.norm())
    assert 0 < reg.metrics()[0]["perp_grad_removed"] < 1


def test_perpendicular_gradient_is_orthograd_as_published():
    """Prieto et al.'s OrthoGrad, per tensor on the flattened vectors, written here in float64:
    proj = w.g / (w.w + 1e-30); g_orth = g - proj w; g <- g_orth * ||g|| / (||g_orth|| + 1e-30)."""
    cfg, data, model = _setup(perp_grad=True, mlp_bias=True)
    assert cfg.perp_grad_scale == "orthograd"  # the default
    reg = REGULARIZERS.get("perp_grad")([cfg], model, data)
    params = dict(model.named_parameters())
    gen = torch.Generator().manual_seed(1)
    raw = {n: torch.randn(p.shape, generator=gen) for n, p in params.items()}
    for n, p in params.items():
        p.grad = raw[n].clone()
    reg.transform(stack_of_one(params), _grads(params))
    for n, p in params.items():
        w, g = p.detach().double().flatten().tolist(), raw[n].double().flatten().tolist()
        proj = sum(a * b for a, b in zip(w, g)) / (sum(a * a for a in w) + 1e-30)
        orth = [b - proj * a for a, b in zip(w, g)]
        scale = math.sqrt(sum(b * b for b in g)) / (math.sqrt(sum(o * o for o in orth)) + 1e-30)
        expected = torch.tensor([o * scale for o in orth], dtype=torch.float64).reshape(p.shape)
        assert torch.allclose(p.grad.double(), expected, rtol=1e-5, atol=1e-6), n
        assert float(p.grad.double().norm()) == pytest.approx(float(raw[n].double().norm()), rel=1e-5)  # ||g|| kept


def test_old_files_with_perp_grad_describe_the_unscaled_variant_they_trained(tmp_path):
    """A file written before perp_grad_scale existed trained the unscaled projection: its stored
    config lacks the key, and reading it back must say 'unscaled', not today's default."""
    import json

    import h5py

    path = tmp_path / "old.h5"
    train(tiny_config(steps=20, perp_grad=True, perp_grad_scale="unscaled"), path, progress=False)
    with h5py.File(path, "r+") as f:  # what an old file holds: no perp_grad_scale key at all
        stored = json.loads(f.attrs["config"])
        del stored["perp_grad_scale"]
        f.attrs["config"] = json.dumps(stored)
        del f.attrs["config_sha256"]  # old files carry no checksum of their config
    old = Trajectory(path)
    assert old.config.perp_grad_scale == "unscaled" and old.config_dict["perp_grad_scale"] == "unscaled"
    train(tiny_config(steps=20, perp_grad=True), tmp_path / "new.h5", progress=False)
    assert Trajectory(tmp_path / "new.h5").config.perp_grad_scale == "orthograd"


# ---------------------------------------------------------------------- StableMax
def test_stablemax_sums_to_one_and_its_loss_is_the_formula():
    logits = torch.tensor([[0.0, 1.0, -1.0, 3.5], [-50.0, 1e6, 2.0, -1e-3], [1.0, 1.0, 1.0, 1.0]])
    probs = stablemax(logits)
    assert probs.dtype == torch.float64
    assert torch.allclose(probs.sum(-1), torch.ones(3, dtype=torch.float64), atol=1e-15)
    assert (probs > 0).all()
    assert torch.equal(probs.argmax(-1), logits.argmax(-1))

    def s(v):
        return v + 1 if v >= 0 else 1 / (1 - v)

    labels = torch.tensor([1, 3, 0])
    nll = stablemax_cross_entropy(logits, labels, reduction="none")
    for i, row in enumerate(logits.tolist()):
        assert float(nll[i]) == pytest.approx(-math.log(s(row[labels[i]]) / sum(s(v) for v in row)), rel=1e-12)
    # finite gradients everywhere, including x = 1 where the unused 1/(1-x) branch would divide by 0
    x = torch.tensor([[1.0, -1.0, 0.0]], requires_grad=True)
    stablemax_cross_entropy(x, torch.tensor([0])).backward()
    assert torch.isfinite(x.grad).all()


# ---------------------------------------------------------------------- metric names
def test_metric_names_are_known_from_the_config_and_are_what_the_file_holds(tmp_path):
    cfg = tiny_config(steps=20, loss="stablemax", geomdr_lambda=0.1, kl_attn_beta=0.1, grokfast_lambda=1.0)
    names = metric_names(cfg)
    assert names[: len(METRIC_NAMES)] == METRIC_NAMES
    assert names[len(METRIC_NAMES):] == ["train_ce", "test_ce", "reg_geomdr", "geomdr_erank",
                                              "reg_kl_attn", "kl_attn", "grokfast_ema_norm"]
    assert metric_names(tiny_config()) == METRIC_NAMES  # the default run logs what it always did
    train(cfg, tmp_path / "r.h5", progress=False)
    m = Trajectory(tmp_path / "r.h5").metrics
    assert set(m) == {"step", *names}
    assert np.isnan(m["grokfast_ema_norm"][0]) and np.isfinite(m["grokfast_ema_norm"][1:]).all()
    assert np.isfinite(m["reg_geomdr"]).all() and np.isfinite(m["kl_attn"]).all()


# ---------------------------------------------------------------------- transforms on stacks
SHARED = [dict(grokfast_lambda=2.0, grokfast_alpha=0.8, perp_grad=True)] * 3
MIXED = [dict(grokfast_lambda=2.0, grokfast_alpha=0.8, perp_grad=True), dict(grokfast_lambda=0.0, perp_grad=False),
         dict(grokfast_lambda=1.0, grokfast_alpha=0.95, perp_grad=True)]


@pytest.mark.parametrize("members", [SHARED, MIXED], ids=["shared-constants", "own-constants"])
def test_transforms_on_a_stack_equal_each_member_transformed_alone(members):
    """One implementation for every kind of run: on stacked members each row is what the
    transform does to that member alone, as a stack of one (how a single run holds it): bit for
    bit where the members share their constants (a shared constant is applied as the single
    run's Python number), to float32 rounding where each has its own (Grokfast alpha and lambda,
    0 = off; perp_grad on or off), which broadcast as a tensor."""
    cfgs = [tiny_config(**m) for m in members]
    data = TASKS.get(cfgs[0].task).build(cfgs[0])
    model = build_model(cfgs[0], data)
    gen = torch.Generator().manual_seed(5)
    shapes = {n: p.shape for n, p in model.named_parameters()}
    params = {n: torch.randn(3, *s, generator=gen) for n, s in shapes.items()}
    kinds = ("grokfast", "perp_grad")
    stack = [REGULARIZERS.get(k)(cfgs, model, data, params) for k in kinds]
    rows = [{n: p[i : i + 1] for n, p in params.items()} for i in range(3)]
    alone = [[REGULARIZERS.get(k)([c], model, data, rows[i]) for k in kinds if REGULARIZERS.get(k).active(c)]
             for i, c in enumerate(cfgs)]
    same = torch.equal if members is SHARED else (lambda a, b: torch.allclose(a, b, rtol=1e-6, atol=1e-6))
    for _ in range(3):
        grads = {n: torch.randn(3, *s, generator=gen) for n, s in shapes.items()}
        own = [{n: g[i : i + 1].clone() for n, g in grads.items()} for i in range(3)]
        for reg in stack:
            reg.transform(params, grads)
        for i, regs in enumerate(alone):
            for reg in regs:
                reg.transform(rows[i], own[i])
            for n in shapes:
                assert same(grads[n][i], own[i][n][0]), (i, n)
    for i, regs in enumerate(alone):
        state = stack[0].state(i)
        assert (state == {}) if not regs else all(same(torch.from_numpy(v), torch.from_numpy(regs[0].state(0)[k]))
                                                   for k, v in state.items()), i
        expected = {k: v for reg in regs for k, v in reg.metrics()[0].items()}
        got = {**stack[0].metrics()[i], **stack[1].metrics()[i]}
        assert {k: got[k] for k in expected} == pytest.approx(expected, rel=1e-6), i

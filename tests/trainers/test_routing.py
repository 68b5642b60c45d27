"""Permutation routing across model copies (trainers/routing.py): the kernel and its sampler, the
one-gradient-message property, equality with independent runs, exact resume, the file format."""

import math

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from groklens.checkpoints import Trajectory
from groklens.errors import BadInput
from groklens.trainers.train import resume, train
from groklens.models import build_model
from groklens.trainers.routing import RoutedRun, RouteSampler, ring_kernel, routing_units
from groklens.tasks import TASKS
from tests.helpers import assert_train_refused, tiny_config, train_interrupted

MLP = dict(model="mlp", n_layers=2, d_model=8, d_mlp=32, mlp_bias=True)


# ---------------------------------------------------------------------- kernel and sampler
def test_ring_kernel_matches_its_definition():
    m, width = 6, 1.5
    q = ring_kernel(m, width)
    for i in range(m):
        ring = [min(abs(i - j), m - abs(i - j)) for j in range(m)]  # distances around the ring
        z = sum(math.exp(-d / width) for d in ring)
        for j in range(m):
            assert q[i, j] == pytest.approx(math.exp(-ring[j] / width) / z, rel=1e-12)
    assert np.allclose(q.sum(0), 1) and np.allclose(q.sum(1), 1)  # doubly stochastic
    assert np.array_equal(ring_kernel(4, 0.0), np.eye(4))
    assert np.allclose(ring_kernel(4, math.inf), 0.25)


def test_sampled_permutations_have_marginals_q():
    m, width, n = 5, 1.5, 20_000
    q = ring_kernel(m, width)
    perms = RouteSampler(m, width, seed=7).sample(n).numpy()  # n draws of one unit's permutation
    assert all(sorted(row) == list(range(m)) for row in perms)  # each draw is a permutation
    freq = np.zeros((m, m))
    for r in range(m):
        freq[r] = np.bincount(perms[:, r], minlength=m) / n  # P(pi(r) = j)
    # each frequency is a binomial mean: 5 standard errors (a false alarm has p < 1e-6 per cell)
    tol = 5 * np.sqrt(q * (1 - q) / n) + 1e-12
    assert np.all(np.abs(freq - q) <= tol), np.abs(freq - q).max()
    assert np.all(RouteSampler(m, 0.0, seed=1).sample(100).numpy() == np.arange(m))  # identity kernel


def test_every_parameter_belongs_to_exactly_one_unit():
    data = TASKS.get("add").build(tiny_config())
    for overrides, expected in [
        (dict(n_layers=2), ["embed", "blocks.0", "blocks.1", "unembed"]),
        (dict(n_layers=2, routing_unit="sublayer"),
         ["embed", "blocks.0.attn", "blocks.0.mlp", "blocks.1.attn", "blocks.1.mlp", "unembed"]),
        (MLP, ["embed", "layers.0", "layers.1", "unembed"]),
    ]:
        cfg = tiny_config(routing_copies=2, routing_width=1.0, **overrides)
        names = [n for n, _ in build_model(cfg, data).named_parameters()]
        units = routing_units(cfg.model, cfg.routing_unit, names)
        assert [u for u, _ in units] == expected
        flat = [n for _, ns in units for n in ns]
        assert sorted(flat) == sorted(names)  # a partition: every parameter once
    units = dict(routing_units("transformer", "sublayer", [n for n, _ in build_model(
        tiny_config(norm="ln"), data).named_parameters()]))
    assert "blocks.0.ln1.w" in units["blocks.0.attn"] and "ln_final.w" in units["unembed"]


# ---------------------------------------------------------------------- one message per unit per step
def _trainer(cfg):
    return RoutedRun(cfg, TASKS.get(cfg.task).build(cfg))


def _reference_loss(cfg, data, trainer, perms, r, unit_of):
    """Routed model r rebuilt as an ordinary model from the copies' state dicts, its loss on the
    full batch: independent of the trainer's functional_call path."""
    model = build_model(cfg, data)
    state = {n: trainer.copy_params[int(perms[unit_of[n], r])][n].detach().clone() for n in unit_of}
    model.load_state_dict(state)
    logits = model(data.inputs[data.train_idx])[:, data.readout_pos]
    loss = F.cross_entropy(logits.double(), data.labels[data.train_idx])
    loss.backward()
    return loss, {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("overrides", [dict(n_layers=2), dict(n_layers=2, routing_unit="sublayer"), MLP],
                         ids=["transformer", "sublayer", "mlp"])
def test_each_copy_gets_exactly_one_gradient_message_per_unit_per_step(tmp_path, overrides):
    m = 4
    cfg = tiny_config(routing_copies=m, routing_width=2.0, **overrides)
    trainer = _trainer(cfg)
    data = trainer.data
    for step in range(3):  # move the copies a little first
        trainer.train_step(step)
    unit_of = {n: u for u, (_, names) in enumerate(trainer.units) for n in names}
    gen = torch.Generator().manual_seed(3)
    # any permutations (not only the sampler's cyclic shifts), then one draw of the sampler
    for perms in [torch.stack([torch.randperm(m, generator=gen) for _ in trainer.units]),
                  trainer.sampler.sample(len(trainer.units))]:
        losses = trainer.routed_objectives(perms, 0)[0]
        refs = [_reference_loss(cfg, data, trainer, perms, r, unit_of) for r in range(m)]
        for r in range(m):
            assert float(losses[r].detach()) == pytest.approx(float(refs[r][0].detach()), rel=1e-6)
        for c in range(m):
            for name, p in trainer.copy_params[c].items():
                # the routed paths whose loss depends on copy c's parameter: count them
                grads = [torch.autograd.grad(losses[r], p, retain_graph=True, allow_unused=True)[0] for r in range(m)]
                paths = [r for r, g in enumerate(grads) if g is not None]
                assert len(paths) == 1, (c, name, paths)
                r = paths[0]
                assert int(perms[unit_of[name], r]) == c  # r = pi_u^{-1}(c)
                assert torch.allclose(grads[r], refs[r][1][name], rtol=1e-5, atol=1e-7), (c, name)
        # the trainer's objective gives each copy exactly that message
        for lane in trainer.lanes:
            lane.zero_grad()
        torch.stack(losses).sum().backward()
        for c in range(m):
            for name, p in trainer.copy_params[c].items():
                r = int((perms[unit_of[name]] == c).nonzero()[0, 0])
                assert torch.allclose(p.grad, refs[r][1][name], rtol=1e-5, atol=1e-7), (c, name)


@pytest.mark.parametrize("overrides", [
    dict(task="teacher", model="perceptron", teacher_dim=12, teacher_alpha=3.0, teacher_test=50, loss="perceptron"),
    MLP], ids=["perceptron", "mlp"])
def test_weight_units_route_every_element_and_return_one_message_to_it(overrides):
    """routing_unit=weight: element i of routed model r's parameters is copy perms[i, r]'s element i,
    and each copy's element gets the gradient of exactly that routed model's loss (rebuilt as an
    ordinary model) at that element."""
    m = 3
    cfg = tiny_config(routing_copies=m, routing_width=math.inf, routing_unit="weight", **overrides)
    trainer = _trainer(cfg)
    data = trainer.data
    for step in range(3):
        trainer.train_step(step)
    perms = trainer.sampler.sample(trainer.n_draws)
    assert perms.shape == (sum(p.numel() for p in trainer.copy_params[0].values()), m)
    flat_copies = [torch.cat([p.detach().flatten() for p in cp.values()]) for cp in trainer.copy_params]
    losses = trainer.routed_objectives(perms, 0)[0]
    refs = []
    for r in range(m):
        routed = torch.cat([p.detach().flatten() for p in trainer.routed_params(perms, r).values()])
        assert torch.equal(routed, torch.stack(flat_copies)[perms[:, r], torch.arange(len(routed))])
        model = build_model(cfg, data)
        torch.nn.utils.vector_to_parameters(routed, model.parameters())
        logits = model(data.inputs[data.train_idx])[:, data.readout_pos]
        loss = trainer.lanes[0].objective(logits, data.labels[data.train_idx], None, 0)[0]
        assert float(loss.detach()) == pytest.approx(float(losses[r].detach()), rel=1e-6)
        loss.backward()
        refs.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    for lane in trainer.lanes:
        lane.zero_grad()
    torch.stack(losses).sum().backward()
    for c in range(m):
        got = torch.cat([p.grad.flatten() for p in trainer.copy_params[c].values()])
        path = (perms == c).int().argmax(1)  # the routed model that took each element from copy c
        want = torch.stack(refs)[path, torch.arange(len(got))]
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-7), c


def test_elastic_sgd_step_matches_a_retyping_of_its_update():
    """Elastic SGD (identity kernel, elastic_gamma): M models, each with torch.optim.AdamW on its own
    loss; every step w_m <- w_m - lr_t gamma (w_m - mean_c w_c) from the parameters before it, then
    each optimizer's step with the gradient taken before the pull (lr_t: the warm-up's rate)."""
    m, gamma, steps = 3, 0.5, 6
    cfg = tiny_config(routing_copies=m, elastic_gamma=gamma, warmup_steps=3, weight_decay=0.5, seed=4)
    trainer = _trainer(cfg)
    data = trainer.data
    models = [build_model(cfg, data, seed=cfg.seed + c) for c in range(m)]
    opts = [torch.optim.AdamW(mod.parameters(), lr=cfg.lr, betas=cfg.betas, eps=cfg.adam_eps,
                              weight_decay=cfg.weight_decay) for mod in models]
    x, y = data.inputs[data.train_idx], data.labels[data.train_idx]
    for step in range(steps):
        trainer.train_step(step)
        lr_t = cfg.lr * min(step / cfg.warmup_steps, 1.0)
        for mod, opt in zip(models, opts):
            opt.zero_grad()
            F.cross_entropy(mod(x)[:, data.readout_pos].double(), y).backward()
        with torch.no_grad():
            for params in zip(*(mod.parameters() for mod in models)):
                centre = sum(params) / m
                for p in params:
                    p -= lr_t * gamma * (p - centre)
        for opt in opts:
            opt.param_groups[0]["lr"] = lr_t
            opt.step()
    for c, mod in enumerate(models):
        for name, p in mod.named_parameters():
            assert torch.allclose(trainer.copy_params[c][name].detach(), p.detach(), rtol=1e-5, atol=1e-6), (c, name)
    # the pull moved the copies toward each other: their spread is below the uncoupled copies'
    plain = _trainer(cfg.replace(elastic_gamma=0.0))
    for step in range(steps):
        plain.train_step(step)

    def spread(t):
        flat = torch.stack([torch.cat([p.detach().flatten() for p in cp.values()]) for cp in t.copy_params])
        return float((flat - flat.mean(0)).norm())
    assert spread(trainer) < spread(plain)


# ---------------------------------------------------------------------- identity kernel = independent runs
@pytest.mark.parametrize("overrides", [dict(batch_size=16), dict(MLP)], ids=["transformer-minibatch", "mlp"])
def test_identity_kernel_trains_copies_exactly_like_independent_runs(tmp_path, overrides):
    """Bit-identical, not just close: with the identity kernel routed model r is copy r, built from
    seed+r, drawing slot r's batches from the generator an independent run with seed+r uses, and
    the same operations run in the same order on one thread (d sum / d loss_r is exactly 1)."""
    m = 3
    cfg = tiny_config(routing_copies=m, steps=40, eval_every=10, checkpoint_every=20, seed=11, **overrides)
    train(cfg, tmp_path / "routed.h5", progress=False)
    routed = Trajectory(tmp_path / "routed.h5")
    assert routed.n_copies == m
    for c in range(m):
        single = cfg.replace(routing_copies=1, seed=cfg.seed + c)
        train(single, tmp_path / f"single{c}.h5", progress=False)
        ref, copy = Trajectory(tmp_path / f"single{c}.h5"), Trajectory(tmp_path / "routed.h5", copy=c)
        assert copy.param_names == ref.param_names
        for name in ref.param_names:
            assert np.array_equal(copy.param_trajectory(name), ref.param_trajectory(name)), (c, name)
        mc, mr = copy.metrics, ref.metrics
        for key in mr:  # every single-run metric, as copy c's column
            assert np.array_equal(mc[key], mr[key], equal_nan=True), (c, key)
    # copies differ from each other (different seeds), and the ensemble is logged
    assert not np.array_equal(routed.param_trajectory("unembed.W_U"),
                              Trajectory(tmp_path / "routed.h5", copy=1).param_trajectory("unembed.W_U"))
    assert np.all(np.isfinite(routed.metrics["ensemble.test_acc"]))


def test_ensemble_metrics_are_the_mean_of_the_copies_probabilities(tmp_path):
    cfg = tiny_config(routing_copies=3, routing_width=1.0, steps=40, checkpoint_every=20)
    train(cfg, tmp_path / "r.h5", progress=False)
    run = Trajectory(tmp_path / "r.h5")
    data = run.dataset()
    m = run.metrics
    for step in (20, 40):
        with torch.no_grad():
            probs = sum(Trajectory(run.path, copy=c).model(step)(data.inputs)[:, data.readout_pos].double()
                        .softmax(-1) for c in range(3)) / 3
        row = int(np.nonzero(m["step"] == step)[0][0])
        hit = (probs.argmax(-1) == data.labels).double()
        nll = -probs[torch.arange(len(data.labels)), data.labels].log()
        assert float(hit[data.test_idx].mean()) == pytest.approx(m["ensemble.test_acc"][row])
        assert float(hit[data.train_idx].mean()) == pytest.approx(m["ensemble.train_acc"][row])
        assert float(nll[data.test_idx].mean()) == pytest.approx(m["ensemble.test_loss"][row], rel=1e-6)
        for c in range(3):  # each copy's own accuracy, from its rebuilt model
            model = Trajectory(run.path, copy=c).model(step)
            pred = model(data.inputs)[data.test_idx, data.readout_pos].argmax(-1)
            acc = float((pred == data.labels[data.test_idx]).double().mean())
            assert acc == pytest.approx(m[f"copy{c}.test_acc"][row])


def test_mixing_kernel_makes_copies_differ_from_independent_runs(tmp_path):
    cfg = tiny_config(routing_copies=2, routing_width=math.inf, steps=20, checkpoint_every=20)
    train(cfg, tmp_path / "mixed.h5", progress=False)
    train(cfg.replace(routing_width=0.0), tmp_path / "indep.h5", progress=False)
    a, b = Trajectory(tmp_path / "mixed.h5", copy=1), Trajectory(tmp_path / "indep.h5", copy=1)
    assert np.array_equal(a.param_trajectory("embed.W_E")[0], b.param_trajectory("embed.W_E")[0])  # same init
    assert not np.array_equal(a.param_trajectory("embed.W_E")[-1], b.param_trajectory("embed.W_E")[-1])


# ---------------------------------------------------------------------- resume, stop rule, format
@pytest.mark.parametrize("overrides", [dict(routing_width=1.0), dict(routing_width=2.0, routing_unit="weight",
                                                                     elastic_gamma=0.3)],
                                                                     ids=["layer", "weight-elastic"])
def test_interrupted_routed_run_resumes_bit_identically(tmp_path, overrides):
    cfg = tiny_config(routing_copies=3, batch_size=16, steps=60, eval_every=10, checkpoint_every=20, **overrides)
    whole = tmp_path / "whole.h5"
    train(cfg, whole, progress=False)
    cut = tmp_path / "cut.h5"
    train_interrupted(cfg, cut, 37, RoutedRun)
    assert list(Trajectory(cut).steps) == [0, 20]
    assert resume(cut, progress=False).last_step == 60
    for c in range(3):
        a, b = Trajectory(whole, copy=c), Trajectory(cut, copy=c)
        assert list(a.steps) == list(b.steps) == [0, 20, 40, 60]
        for name in a.param_names:
            assert np.array_equal(a.param_trajectory(name), b.param_trajectory(name)), (c, name)
    ma, mb = Trajectory(whole).metrics, Trajectory(cut).metrics
    assert set(ma) == set(mb)
    for key in ma:
        assert np.array_equal(ma[key], mb[key], equal_nan=True), key


def test_stop_rule_waits_for_every_copy(tmp_path):
    cfg = tiny_config(routing_copies=2, routing_width=1.0, steps=400, eval_every=10, checkpoint_every=200,
                      grok_threshold=0.2, stop_after_grok=1)
    train(cfg, tmp_path / "s.h5", progress=False)
    m = Trajectory(tmp_path / "s.h5").metrics
    firsts = [int(np.nonzero(m[f"copy{c}.test_acc"] >= 0.2)[0][0]) for c in range(2)]
    assert firsts[0] != firsts[1]  # (this seed) one copy crosses first: the rule must wait for the other
    lowest = np.min([m[f"copy{c}.test_acc"] for c in range(2)], axis=0) >= 0.2
    grokked = next(i for i in range(len(lowest) - 2) if lowest[i:i + 3].all())  # 3 in a row: grok_evals
    assert grokked >= max(firsts) and len(m["step"]) == grokked + 3  # stop_after_grok 1 < the 2 confirming ones


def test_file_layout_and_copy_selection(tmp_path):
    cfg = tiny_config(routing_copies=3, routing_width=1.0, steps=20, checkpoint_every=10)
    train(cfg, tmp_path / "r.h5", progress=False)
    with h5py.File(tmp_path / "r.h5", "r") as f:
        assert sorted(f["copies"]) == ["1", "2"]
        assert set(f["copies/2"]) == set(f["params"])
        assert f["copies/2/embed.W_E"].shape == (3, *f["params/embed.W_E"].shape[1:])
        w2 = f["copies/2/unembed.W_U"][1]
    assert np.array_equal(Trajectory(tmp_path / "r.h5", copy=2).params(10)["unembed.W_U"].numpy(), w2)
    with pytest.raises(BadInput, match="no copy 3"):
        Trajectory(tmp_path / "r.h5", copy=3)
    train(tiny_config(steps=20, checkpoint_every=10), tmp_path / "single.h5", progress=False)
    with h5py.File(tmp_path / "single.h5", "r") as f:
        assert "copies" not in f  # single runs are written as before
    assert Trajectory(tmp_path / "single.h5").n_copies == 1
    with pytest.raises(BadInput, match="not a routed run"):
        Trajectory(tmp_path / "single.h5", copy=1)


@pytest.mark.parametrize("flags, message", [
    (["--routing-width", "1"], "needs routing_copies > 1"),
    (["--routing-copies", "2", "--model", "mlp", "--routing-unit", "sublayer"], "option of model=transformer"),
    (["--routing-copies", "2", "--routing-width", "-1"], "routing_width must be >= 0"),
])
def test_unsupported_routing_options_are_one_line_errors(tmp_path, flags, message):
    assert_train_refused(tmp_path, flags, message)

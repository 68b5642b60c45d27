"""Batched ensembles: each member's trajectory equals the same config trained alone."""

from __future__ import annotations

from dataclasses import fields

import h5py
import numpy as np
import pytest
from groklens.checkpoints import Trajectory
from groklens.trainers import ensemble as ens
from groklens.trainers.ensemble import ensemble_key, resume_ensemble, train_ensemble
from groklens.trainers.train import train

from groklens.config import RunConfig
from groklens.errors import BadInput
from tests.helpers import tiny_config

# members differ in everything an ensemble lets them differ in
MEMBERS = [
    {"seed": 1, "lr": 3e-3, "weight_decay": 1.0},
    {"seed": 2, "lr": 1e-3, "weight_decay": 0.3, "data_seed": 7},  # another train/test split, same size
    # lr 1e-2 at wd 0 amplified float32 rounding chaotically on an AMD EPYC (Zen 4): the vmapped
    # member and the single run agreed to 3e-7 at step 20, 2.4e-4 of the weights' norm at step 80
    # (on the Intel Xeon of earlier sessions they agreed bit for bit); at 5e-3 they agree to rounding
    {"seed": 3, "lr": 5e-3, "weight_decay": 0.0, "data_seed": 8},
]


def _datasets(path) -> dict[str, tuple]:
    """name -> (shape without the growing axis, dtype) of every dataset, and root attribute names."""
    out = {}
    with h5py.File(path, "r", locking=False) as f:
        f.visititems(lambda n, o: out.__setitem__(n, (o.shape[1:], o.dtype)) if isinstance(o, h5py.Dataset) else None)
        out["@attrs"] = tuple(sorted(f.attrs))
    return out


def assert_same_trajectory(a_path, b_path, rtol=1e-5, atol=1e-6):
    """Everything a user reads from a trajectory agrees (rng.torch aside: it is the process's)."""
    a, b = Trajectory(a_path), Trajectory(b_path)
    assert a.config_dict == b.config_dict
    assert a.status == b.status
    np.testing.assert_array_equal(a.steps, b.steps)
    da, db = a.dataset(), b.dataset()
    for name in ("inputs", "labels", "train_idx", "test_idx", "informative_mask"):
        np.testing.assert_array_equal(getattr(da, name).numpy(), getattr(db, name).numpy())
    assert (da.readout_pos, da.d_vocab, da.d_vocab_out) == (db.readout_pos, db.d_vocab, db.d_vocab_out)
    assert a.param_names == b.param_names
    for name in a.param_names:
        np.testing.assert_allclose(a.param_trajectory(name), b.param_trajectory(name), rtol=rtol, atol=atol,
                                   err_msg=name)
    ma, mb = a.metrics, b.metrics
    assert sorted(ma) == sorted(mb)
    for name in ma:
        np.testing.assert_allclose(ma[name], mb[name], rtol=1e-5, atol=1e-7, equal_nan=True, err_msg=name)
    assert _datasets(a_path) == _datasets(b_path)
    # optimizer state of the last checkpoint: what an exact resume reads
    last = int(a.steps[-1])
    sa, sb = a.state(last), b.state(last)
    assert sorted(sa) == sorted(sb)
    for key in sa:
        if key != "rng.torch":
            np.testing.assert_allclose(sa[key], sb[key], rtol=rtol, atol=atol, err_msg=key)


def _configs(**shared):
    return [tiny_config(**{**shared, **m}) for m in MEMBERS]


@pytest.mark.parametrize("model", [
    {},  # the transformer
    {"model": "mlp", "n_layers": 2, "d_model": 16, "d_mlp": 32, "mlp_bias": True},  # the scaling-law MLP
    # Prieto et al.'s one-hot MLP: its first layer reads rows of W_in (MLP.lean_path), under vmap too
    {"model": "mlp", "n_layers": 2, "d_mlp": 32, "mlp_embed": "onehot_residues", "loss": "ce_float32"},
    {"attention": "uniform", "norm": "ln"},  # W_Q and W_K get no gradient: skipped like torch's AdamW
])
def test_member_equals_single_run(tmp_path, model):
    cfgs = _configs(steps=80, **model)
    results = train_ensemble(cfgs, [tmp_path / f"e{i}.h5" for i in range(3)])
    assert all(r.error is None and r.result.status == "completed" for r in results)
    for i, cfg in enumerate(cfgs):
        train(cfg, tmp_path / f"s{i}.h5", progress=False)
        assert_same_trajectory(tmp_path / f"e{i}.h5", tmp_path / f"s{i}.h5")
    # the members really differ (a stacking mistake would make them equal)
    w = [Trajectory(tmp_path / f"e{i}.h5").param_trajectory("unembed.W_U")[-1] for i in range(3)]
    assert not np.allclose(w[0], w[1])


def test_multi_target_members_equal_single_runs(tmp_path):
    """A task read out at K answer positions (digits_add): loss over the K positions, exact-match
    and per-token accuracy, a regularizer term and Grokfast, in an ensemble as alone."""
    cfgs = [tiny_config(task="digits_add", n_digits=1, train_frac=0.6, steps=40, batch_size=16, **m)
            for m in ({"seed": 1}, {"seed": 2, "act_norm_lambda": 0.05, "grokfast_lambda": 1.0, "data_seed": 4})]
    results = train_ensemble(cfgs, [tmp_path / f"e{i}.h5" for i in range(2)])
    assert all(r.error is None for r in results)
    for i, cfg in enumerate(cfgs):
        train(cfg, tmp_path / f"s{i}.h5", progress=False)
        assert_same_trajectory(tmp_path / f"e{i}.h5", tmp_path / f"s{i}.h5")
    assert {"train_token_acc", "test_token_acc"} <= set(Trajectory(tmp_path / "e1.h5").metrics)


def test_kl_attention_members_equal_single_runs(tmp_path):
    """The KL attention term on scores the template records itself inside the vmapped forward
    (Transformer.site_capture), a plain member beside it, as each trains alone."""
    seq = dict(task="seq_add", seq_len=4, n_informative=2, informative_layout="spread", steps=40)
    cfgs = [tiny_config(**seq, seed=1), tiny_config(**seq, seed=2, kl_attn_beta=0.5)]
    results = train_ensemble(cfgs, [tmp_path / f"e{i}.h5" for i in range(2)])
    assert all(r.error is None for r in results)
    for i, cfg in enumerate(cfgs):
        train(cfg, tmp_path / f"s{i}.h5", progress=False)
        assert_same_trajectory(tmp_path / f"e{i}.h5", tmp_path / f"s{i}.h5")
    assert np.isfinite(Trajectory(tmp_path / "e1.h5").metrics["kl_attn"]).all()


def test_minibatches_and_per_member_stop_rule(tmp_path):
    # every member stops 2 evaluations after its own threshold is reached, at different steps
    cfgs = _configs(batch_size=16, steps=120, stop_after_grok=2)
    cfgs = [c.replace(grok_threshold=t) for c, t in zip(cfgs, (0.02, 1.0, 0.08))]
    results = train_ensemble(cfgs, [tmp_path / f"e{i}.h5" for i in range(3)])
    for i, cfg in enumerate(cfgs):
        single = train(cfg, tmp_path / f"s{i}.h5", progress=False)
        assert results[i].result.status == single.status
        assert results[i].result.last_step == single.last_step
        assert_same_trajectory(tmp_path / f"e{i}.h5", tmp_path / f"s{i}.h5")
    assert results[1].result.last_step == 120  # threshold 1.0 is never reached on the test set
    assert results[0].result.last_step < 120  # ... while member 0 left the ensemble early


def test_failing_member_stops_alone(tmp_path):
    cfgs = _configs(steps=40)
    cfgs[1] = cfgs[1].replace(lr=1e30)  # non-finite loss within a few steps
    results = train_ensemble(cfgs, [tmp_path / f"e{i}.h5" for i in range(3)])
    assert results[1].error is not None and "non-finite" in str(results[1].error)
    assert results[0].error is None and results[2].error is None
    for i, cfg in enumerate(cfgs):
        if i == 1:
            with pytest.raises(Exception, match="non-finite"):
                train(cfg, tmp_path / f"s{i}.h5", progress=False)
        else:
            train(cfg, tmp_path / f"s{i}.h5", progress=False)
        assert_same_trajectory(tmp_path / f"e{i}.h5", tmp_path / f"s{i}.h5")


def test_interrupted_ensemble_resumes_exactly(tmp_path, monkeypatch):
    cfgs = _configs(steps=80)
    paths = [tmp_path / f"e{i}.h5" for i in range(3)]
    original = ens.EnsembleRun.train_step

    def interrupt_at_50(self, step):
        if step == 50:
            raise KeyboardInterrupt
        return original(self, step)

    monkeypatch.setattr(ens.EnsembleRun, "train_step", interrupt_at_50)
    with pytest.raises(KeyboardInterrupt):
        train_ensemble(cfgs, paths)
    assert all(Trajectory(p).status == "stopped: interrupted" for p in paths)
    assert list(Trajectory(paths[0]).steps) == [0, 20, 40]
    monkeypatch.setattr(ens.EnsembleRun, "train_step", original)
    results = resume_ensemble(paths)
    assert all(r.result.status == "completed" for r in results)
    for i, cfg in enumerate(cfgs):
        train(cfg, tmp_path / f"s{i}.h5", progress=False)
        assert_same_trajectory(paths[i], tmp_path / f"s{i}.h5")


def test_ensemble_key_groups_by_architecture():
    a = tiny_config(seed=1, lr=1e-3, weight_decay=0.1, data_seed=3)
    b = tiny_config(seed=2, lr=3e-3, weight_decay=1.0, grok_threshold=0.99)
    assert ensemble_key(a) == ensemble_key(b)
    assert ensemble_key(a) != ensemble_key(tiny_config(d_mlp=64))
    assert ensemble_key(a) != ensemble_key(tiny_config(train_frac=0.6))
    assert ensemble_key(a) != ensemble_key(tiny_config(steps=80))


def test_only_routed_compiled_and_mask_reading_configs_train_alone():
    """Every RunConfig field is per member (the loop's and the regularizers' declared ones) or
    shared by an ensemble, except routing's, compile and attn_mask_from: a routed config is its own
    strategy, a compiled one a compiled single run, one that reads its mask from another run reads
    it as it starts alone, and each trains alone, with the reason said. Any task joins,
    multi-target ones included."""
    names = {f.name for f in fields(RunConfig)}
    per_member, shared = set(ens.PER_MEMBER_FIELDS), set(ens.shared_fields())
    assert per_member <= names and not per_member & shared
    assert names - per_member - shared == set(ens.SOLO_FIELDS) == {"routing_copies", "routing_width",
                                                                   "routing_unit", "compile",
                                                                  "attn_mask_from"}
    assert {"act_norm_lambda", "grokfast_alpha", "perp_grad", "stop_test_loss"} <= per_member
    assert {"act_norm_sites", "geomdr_end", "perp_grad_scale", "task", "betas"} <= shared
    routed = tiny_config(routing_copies=2)
    assert ensemble_key(routed) is None
    assert ens.unsupported_reason(routed).startswith("ensembles do not implement routing_copies=2")
    with pytest.raises(BadInput, match="ensembles do not implement"):
        ens.EnsembleRun([routed, routed], [None, None], ["a", "b"])
    for option in ({"act_norm_lambda": 0.1}, {"loss": "stablemax"}, {"grokfast_lambda": 2.0}, {"perp_grad": True},
                   {"task": "digits_add", "n_digits": 1}):
        assert ensemble_key(tiny_config(**option)) is not None, option


def test_members_must_share_architecture(tmp_path):
    with pytest.raises(BadInput, match="share"):
        train_ensemble([tiny_config(), tiny_config(d_mlp=64)], [tmp_path / "a.h5", tmp_path / "b.h5"])
    assert not (tmp_path / "a.h5").exists()


def test_force_keeps_the_old_run_when_the_ensemble_fails_before_its_first_commit(tmp_path, monkeypatch):
    """train_ensemble(force=True) stages members over existing files (as `train --force`): a
    failure before the first committed checkpoint leaves the old run and no staging file."""
    import groklens.trainers.ensemble as ens
    from tests.helpers import train_tiny

    old = tmp_path / "a.h5"
    train_tiny(old, seed=1)
    before = old.read_bytes()

    def fail(*args, **kwargs):
        raise RuntimeError("died before the first commit")

    monkeypatch.setattr(ens, "run", fail)
    with pytest.raises(RuntimeError):
        ens.train_ensemble([tiny_config(seed=2), tiny_config(seed=3)], [old, tmp_path / "b.h5"], force=True)
    assert old.read_bytes() == before
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging file left

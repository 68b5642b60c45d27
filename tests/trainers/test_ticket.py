"""The attention-mask transfer: attn_mask confines the readout query to its keys on every path,
attn_mask_from reads them from a grokked (or finished) run beside the new one, and the run's
stored config, hash and sweep state treat the filled-in mask as planned."""

import numpy as np
import pytest
import torch

from groklens.config import RunConfig, as_planned
from groklens.errors import BadInput
from groklens.tasks import TASKS
from groklens.models import build_model
from groklens.trainers.ticket import covering_keys, readout_pattern, transferred_mask

SEQ = dict(task="seq_add", p=5, seq_len=5, n_informative=2, informative_layout="spread", train_frac=0.6,
           d_model=16, n_heads=2, d_head=8, d_mlp=32, lr=1e-2, steps=40, eval_every=10, checkpoint_every=10,
           device="cpu")


def _pattern(model, x, layer=0):
    with torch.no_grad():
        _, cache = model.run_with_cache(x, names_filter=[f"blocks.{layer}.attn.hook_pattern",
                                                         f"blocks.{layer}.attn.hook_attn_scores"])
    return cache[f"blocks.{layer}.attn.hook_pattern"], cache[f"blocks.{layer}.attn.hook_attn_scores"]


@pytest.mark.parametrize("attention", ["softmax", "uniform"])
def test_the_mask_is_a_softmax_over_the_kept_keys_of_the_readout_query(attention):
    """Independent: the unmasked model's scores (same weights), a softmax over the kept keys by
    hand; every other query keeps its causal row."""
    keys = [0, 4]
    cfg = RunConfig.from_dict({**SEQ, "n_layers": 2, "attention": attention})
    data = TASKS.get(cfg.task).build(cfg)
    free = build_model(cfg, data)
    masked = build_model(cfg.replace(attn_mask="0 4"), data)
    masked.load_state_dict(free.state_dict())
    x = data.inputs[:20]
    q = data.readout_pos
    p_free, s_free = _pattern(free, x)
    p_mask, _ = _pattern(masked, x)
    kept = s_free[:, :, q, keys].double()
    expected = torch.zeros_like(p_free[:, :, q], dtype=torch.float64)
    expected[:, :, keys] = torch.full_like(kept, 1 / len(keys)) if attention == "uniform" else kept.softmax(-1)
    assert torch.allclose(p_mask[:, :, q].double(), expected, atol=1e-6)
    assert torch.equal(p_mask[:, :, :q], p_free[:, :, :q])
    # and the fast paths give the explicit path's output
    with torch.no_grad():
        full, _ = masked.run_with_cache(x)
        for fused in (False, True):
            masked.fused_attention = fused
            assert torch.allclose(masked(x, readout=slice(q, q + 1)), full[:, q : q + 1], atol=1e-5)


def test_a_mask_outside_the_sequence_or_on_a_multi_target_task_is_bad_input():
    cfg = RunConfig.from_dict({**SEQ, "attn_mask": "0 6"})
    with pytest.raises(BadInput, match="positions are 0..5"):
        build_model(cfg, TASKS.get(cfg.task).build(cfg))
    with pytest.raises(BadInput, match="distinct integers >= 0"):
        RunConfig.from_dict({**SEQ, "attn_mask": "1 1"})
    with pytest.raises(BadInput, match="single readout query|several readout positions"):
        RunConfig.from_dict({"task": "digits_add", "n_digits": 1, "attn_mask": "0"})
    with pytest.raises(BadInput, match="run name"):
        RunConfig.from_dict({**SEQ, "attn_mask_from": "../elsewhere/run"})
    with pytest.raises(BadInput, match="model=transformer"):
        RunConfig.from_dict({**SEQ, "model": "mlp", "attn_mask": "0"})


def test_covering_keys_hold_the_share_on_planted_patterns():
    two = np.zeros((1, 2, 6))
    two[0, 0] = [0.55, 0, 0, 0, 0.4, 0.05]
    two[0, 1] = [0.05, 0, 0, 0, 0.9, 0.05]
    assert covering_keys(two) == [0, 4]  # mean (0.3, 0, 0, 0, 0.65, 0.05): 0.95 on two keys
    flat = np.full((2, 1, 5), 0.2)
    assert covering_keys(flat) == [0, 1, 2, 3, 4]  # 90% of a flat pattern needs 5 keys of 0.2 (4 hold 0.8)
    assert covering_keys(np.array([[[0.9, 0.1]]])) == [0]  # exactly 90%: one key


def test_readout_pattern_is_the_attention_analysis_pattern():
    from groklens.analyses.attention import attention_mass

    cfg = RunConfig.from_dict({**SEQ, "n_layers": 2})
    data = TASKS.get(cfg.task).build(cfg)
    model = build_model(cfg, data).eval()
    np.testing.assert_allclose(readout_pattern(model, data, batch_size=7), attention_mass(model, data)["pattern"],
                               rtol=1e-6, atol=1e-9)


def test_a_run_takes_its_donors_mask_and_keeps_its_planned_hash(tmp_path):
    from groklens.analyses.attention import attention_mass
    from groklens.checkpoints import Trajectory
    from groklens.experiments.ledger import config_hash
    from groklens.trainers.train import train

    # a donor pulled toward its informative keys (0 and 4) by the KL term, so its mask is not every key
    donor_cfg = RunConfig.from_dict({**SEQ, "seed": 3, "kl_attn_beta": 10.0, "lr": 3e-2})
    train(donor_cfg, tmp_path / "base_s3.h5", progress=False)
    planned = RunConfig.from_dict({**SEQ, "seed": 3, "attn_mask_from": "base_s{seed}"})
    train(planned, tmp_path / "ticket_s3.h5", progress=False)
    stored = Trajectory(tmp_path / "ticket_s3.h5").config_dict
    donor = Trajectory(tmp_path / "base_s3.h5")
    # the donor never grokked in 40 steps: its mask comes from its last checkpoint
    expected = covering_keys(attention_mass(donor.model(int(donor.steps[-1])), donor.dataset())["pattern"])
    assert stored["attn_mask"] == " ".join(map(str, expected))
    assert as_planned(stored) == planned.to_dict()
    assert config_hash(stored) == config_hash(planned.to_dict())
    model = Trajectory(tmp_path / "ticket_s3.h5").model(int(Trajectory(tmp_path / "ticket_s3.h5").steps[-1]))
    p, _ = _pattern(model, donor.dataset().inputs[:8])
    outside = [j for j in range(6) if j not in expected]
    assert outside and float(p[:, :, 5, outside].abs().max()) == 0.0


def test_a_missing_or_different_donor_is_bad_input(tmp_path):
    from groklens.trainers.train import train

    cfg = RunConfig.from_dict({**SEQ, "attn_mask_from": "base_s{seed}"})
    with pytest.raises(BadInput, match="does not exist"):
        transferred_mask(cfg, tmp_path / "ticket.h5")
    assert not (tmp_path / "ticket.h5").exists()
    train(RunConfig.from_dict({**SEQ, "seq_len": 6, "seed": cfg.seed}), tmp_path / f"base_s{cfg.seed}.h5",
          progress=False)
    with pytest.raises(BadInput, match="differs in seq_len"):
        train(cfg, tmp_path / "ticket.h5", progress=False)


def test_a_sweep_trains_the_ticket_once_and_then_finds_it_done(tmp_path):
    from groklens.sweeps import InlineExecutor, RunSpec, run_sweep

    runs = [RunSpec("base_s1", RunConfig.from_dict({**SEQ, "seed": 1}))]
    rep = run_sweep(runs, tmp_path, executor=InlineExecutor(), progress=False)
    ticket = [RunSpec("ticket_s1", RunConfig.from_dict({**SEQ, "seed": 1, "attn_mask_from": "base_s{seed}"}))]
    for _ in range(2):  # the second time the filled-in mask is not "a different config"
        rep = run_sweep(ticket, tmp_path, executor=InlineExecutor(), ensemble=True, progress=False)
        assert rep.counts["failed"] == 0, rep.failed
    assert rep.counts["done"] == 1

"""The sphere paper's FVE code as a peer (benchmarks/peer/sphere_fve_official.py): their
Fourier_Analysis_Last diagnostics on a groklens model (its weights in their UnifiedTransformer,
same logits) and on a model their own code trains, beside groklens' fve_ls_top5 of the same
weights, which must equal their mean of ten U/V values (they print 2 decimals of a percent).
Skipped when their repository is not here (GROKLENS_SPHERE_REPO, as tests/peer/test_sphere_official.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import peer_script

from tests.peer.test_sphere_official import REPO

pytestmark = pytest.mark.skipif(not REPO.exists(), reason="the sphere paper's repository is not here")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "peer" / "sphere_fve_official.py"
PRINTED = 0.005 / 100 + 1e-6  # they print percents with 2 decimals
# a tiny model of the notebook's kind: bidirectional, MLP biases, PyTorch's init
NOTEBOOK_MODEL = dict(p=13, train_frac=0.7, causal=False, mlp_bias=True, init_scheme="torch", steps=100, eval_every=20,
                      checkpoint_every=20, lr=1e-2)


def _script():
    return peer_script("sphere_fve_official")


def _agree(result: dict) -> None:
    for row in result["checkpoints"]:
        assert row["logit_gap"] < 1e-4
        theirs, ours = row["theirs"], row["groklens"]
        assert abs(theirs["fve_mean10_pct"] / 100 - ours["fve_ls_top5"]) <= PRINTED
        assert set(theirs["top5"]) == set(ours["top5"]) and len(theirs["fve_pct"]) == 5


@pytest.mark.parametrize("arch, theirs", [(dict(norm="sphere", unembed="bounded", weight_decay=0.0), "spherical_nowd"),
                                          (dict(norm="ln", norm_placement="post"), "layernorm"),
                                          (dict(norm="sphere"), "spherical_wd")])
def test_their_fve_code_reads_a_groklens_run_as_groklens_does(arch, theirs, tmp_path):
    from tests.helpers import train_tiny

    run = tmp_path / "r.h5"
    train_tiny(run, **NOTEBOOK_MODEL, **arch)
    out = tmp_path / "fve.json"
    assert _script().main(["--repo", str(REPO), "--run", str(run), "--at", "all", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["step"] for r in result["checkpoints"]] == [0, 20, 40, 60, 80, 100]
    assert result["model_type"] == theirs
    _agree(result)
    assert max(r["groklens"]["fve_ls_top5"] for r in result["checkpoints"]) > 0.01  # not all zeros


def test_their_fve_code_on_their_own_training(tmp_path):
    out = tmp_path / "fve.json"
    assert _script().main(["--repo", str(REPO), "--train", "spherical_nowd", "--seed", "3", "--p", "13", "--epochs",
                           "41", "--d-model", "16", "--heads", "2", "--d-mlp", "32", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["grok_epoch"] == ">41" and result["weight_decay"] == 0.0
    assert result["checkpoints"][0]["step"] == 41  # their last epoch 40, groklens' step 41
    _agree(result)


def test_a_model_the_notebook_lacks_is_refused(tmp_path):
    from tests.helpers import train_tiny

    run = tmp_path / "pre.h5"
    train_tiny(run, **{**NOTEBOOK_MODEL, "steps": 20}, norm="ln")  # pre-norm LayerNorm: not theirs
    with pytest.raises(SystemExit, match="none of the notebook's models"):
        _script().main(["--repo", str(REPO), "--run", str(run), "--out", str(tmp_path / "x.json")])

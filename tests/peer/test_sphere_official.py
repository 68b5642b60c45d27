"""The bounded-sphere paper's own code as a peer (benchmarks/peer/sphere_official.py): its split
is groklens' split_rule=python_shuffle with data_seed = the seed, and one arm trains through
their functions. Skipped when their repository is not here: set GROKLENS_SPHERE_REPO to a
checkout of AlperYildirim1/geometric-grokking (or its git directory)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

REPO = Path(os.environ.get("GROKLENS_SPHERE_REPO", "/work/.mirror/AlperYildirim1+geometric-grokking/repo"))
pytestmark = pytest.mark.skipif(not REPO.exists(), reason="the sphere paper's repository is not here")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "peer" / "sphere_official.py"


def _peer():
    spec = importlib.util.spec_from_file_location("sphere_official", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("arm", ["sphere_wd1", "ln"])
def test_their_code_trains_on_groklens_python_shuffle_split(arm):
    from groklens.config import RunConfig
    from groklens.tasks import TASKS

    peer = _peer()
    out = peer.run(REPO, arm, seed=2, epochs=3, p=13)
    assert out["epochs"] == 3 and out["history"]["epochs"] == [0, 2] and out["weight_decay"] == 1.0
    cfg = RunConfig.from_dict({"task": "add", "p": 13, "train_frac": 0.3, "data_seed": 2,
                               "split_rule": "python_shuffle", "device": "cpu"})
    data = TASKS.get("add").build(cfg)
    ours = {(int(a), int(b)) for a, b, _ in data.inputs[data.train_idx].tolist()}
    assert ours == {tuple(pr) for pr in out["train_pairs"]}


def test_a_changed_notebook_is_refused():
    peer = _peer()
    with pytest.raises(SystemExit, match="changed"):
        peer.definitions("P = 1\n", {"P": "P = 2"})
    with pytest.raises(SystemExit, match="assigned 0 times"):
        peer.definitions(f"X = 1\n{peer.MARKER}\n", {"P": "P = 2"})

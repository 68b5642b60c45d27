"""The bounded-sphere paper's own code as a peer (benchmarks/peer/sphere_official.py): its split
is groklens' split_rule=python_shuffle with data_seed = the seed, and one arm trains through
their functions. Skipped when their repository is not here: set GROKLENS_SPHERE_REPO to a
checkout of AlperYildirim1/geometric-grokking (or its git directory)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import peer_script

REPO = Path(os.environ.get("GROKLENS_SPHERE_REPO", "/work/.mirror/AlperYildirim1+geometric-grokking/repo"))
pytestmark = pytest.mark.skipif(not REPO.exists(), reason="the sphere paper's repository is not here")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "peer" / "sphere_official.py"


def _peer():
    return peer_script("sphere_official")


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


# ---------------------------------------------------------------------- the peer ledger and its rows
RECORDER = SCRIPT.with_name("record_sphere_official.py")


def _script(path: Path):
    return peer_script(path.stem)


@pytest.fixture(scope="module")
def official_jsons(tmp_path_factory):
    """Result JSONs of the peer script itself (their code, p=7, 3 epochs): two arms, two seeds."""
    out = tmp_path_factory.mktemp("official")
    peer = _peer()
    for arm in ("sphere_wd1", "sphere_wd0"):
        for seed in (1, 2):
            peer.main(["--repo", str(REPO), "--arm", arm, "--seed", str(seed), "--epochs", "3", "--p", "7",
                       "--out", str(out / f"{arm}_s{seed}.json")])
    return sorted(out.glob("*.json"))


def test_the_recorder_keeps_each_run_checked_and_its_split(official_jsons, tmp_path, capsys):
    import json

    from groklens.experiments.peer import OfficialRun
    from groklens.experiments.sphere_official import PEER, load_official, pairs_sha256
    from groklens.experiments.sphere_paper import ARCH

    ledger = tmp_path / "peer" / "sphere-official.json"
    assert _script(RECORDER).main([*map(str, official_jsons), "--ledger", str(ledger)]) == 0
    assert "split = groklens' python_shuffle split" in capsys.readouterr().out
    entries = load_official(ledger, ARCH)
    assert len(entries) == 4
    for path in official_jsons:
        result = json.loads(path.read_text())
        e = next(e for e in entries if (e["arm"], e["seed"]) == (result["arm"], result["seed"]))
        assert e["train_pairs_sha256"] == pairs_sha256(result["train_pairs"])
        assert e["log"]["test_acc"] == result["history"]["test_acc"] and e["epochs"] == 3 and e["p"] == 7
        run = OfficialRun(e, PEER)  # their last logged epoch 2 is groklens' step 3
        assert run.last_step == result["history"]["epochs"][-1] + 1 == 3
        assert (run.grokking is None) == (not isinstance(result["grok_epoch"], int))
    # recording again replaces, never duplicates
    assert _script(RECORDER).main([str(official_jsons[0]), "--ledger", str(ledger)]) == 0
    assert len(load_official(ledger, ARCH)) == 4


def test_a_bad_entry_or_file_is_refused_in_one_line(official_jsons, tmp_path, capsys):
    import json

    from groklens.errors import BadInput
    from groklens.experiments.sphere_official import load_official
    from groklens.experiments.sphere_paper import ARCH

    ledger = tmp_path / "l.json"
    assert _script(RECORDER).main([str(official_jsons[0]), "--ledger", str(ledger)]) == 0
    good = json.loads(ledger.read_text())
    for change, why in (({"grok_epoch": 2}, "their rule"), ({"weight_decay": 0.5}, "weight_decay"),
                        ({"train_pairs_sha256": "x"}, "sha256")):
        bad = {**good, "runs": [{**good["runs"][0], **change}]}
        ledger.write_text(json.dumps(bad))
        with pytest.raises(BadInput, match=why):
            load_official(ledger, ARCH)
    ledger.write_text(json.dumps({**good, "runs": good["runs"] * 2}))
    with pytest.raises(BadInput, match="counted twice"):
        load_official(ledger, ARCH)
    junk = tmp_path / "junk.json"
    junk.write_text('{"arm": "ln"}')
    fresh = tmp_path / "fresh.json"
    assert _script(RECORDER).main([str(junk), "--ledger", str(fresh)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "sphere_official.py" in err and not fresh.exists()


def test_bounded_sphere_rows_read_the_official_runs(official_jsons, tmp_path, monkeypatch):
    """The rows of the paper scale at the official runs' p: their steps (epoch + 1), the seeds'
    splits, and the weight-decay order (undetermined: every run is censored at 3 epochs)."""
    import dataclasses

    from groklens.experiments import pipeline, sphere_paper
    from groklens.experiments.core import Context

    ledger = tmp_path / "sphere-official.json"
    assert _script(RECORDER).main([*map(str, official_jsons), "--ledger", str(ledger)]) == 0
    monkeypatch.setattr(sphere_paper, "PEER_LEDGER", ledger)
    exp = pipeline.get_experiment("bounded-sphere")
    sc = exp.scales["paper"]
    sc = dataclasses.replace(sc, base={**sc.base, "p": 7})
    rows = exp.read(Context(exp.name, "paper", sc, exp.plan(sc, "paper"), {}, tmp_path))
    official = {r.measure: r for r in rows if "the official code" in r.measure}
    assert len(official) == 6
    wd1 = next(r for m, r in official.items() if "grok step" in m and "wd 1.0" in m)
    assert wd1.ours == 3 and wd1.ours_text.startswith("> 3 (n=2, all censored)") and wd1.bound == "lower"
    assert "s1 > 3 / —, s2 > 3 / —" in wd1.ours_text
    assert "python_shuffle split on 2 of 2 seeds" in wd1.ours_text
    assert wd1.published.value == sphere_paper.SPHERE_TABLE[(6e-4, "sphere_wd1")]
    ln = next(r for m, r in official.items() if "grok step" in m and "LayerNorm" in m)
    assert ln.ours is None and ln.ours_text == "no official-code run recorded"
    headline = [r for m, r in official.items() if "over LayerNorm" in m]  # no LayerNorm run: nothing to divide
    assert len(headline) == 2 and all(r.ours is None and r.verdict.startswith("undetermined") for r in headline)
    order = next(r for m, r in official.items() if "weight-decay order" in m)
    assert order.verdict.startswith("undetermined") and "censored on both sides" in order.ours_text

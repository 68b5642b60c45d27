"""The papers' own code as peers (experiments/stablemax_official.py, grokfast_official.py, on
experiments/peer.py): the ledger of their runs is checked entry by entry, the recorder takes the
peer scripts' JSONs, and the paper rows read those runs beside groklens'. Runs without their
repositories: the committed ledgers hold real runs of their code (benchmarks/peer/); tests/peer/
runs their code itself."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tests.helpers import peer_script

from groklens.errors import BadInput
from groklens.experiments import grokfast, grokfast_official, stablemax, stablemax_official
from groklens.experiments.core import Context
from groklens.experiments.pipeline import get_experiment

RECORDER = Path(__file__).resolve().parents[2] / "benchmarks" / "peer" / "record_peer.py"


def _recorder():
    return peer_script("record_peer")


def _committed() -> list[dict]:
    return stablemax_official.load_official(stablemax_official.PEER_LEDGER)


def _as_result(entry: dict) -> dict:
    """An entry written back as the peer script's JSON (the fields it writes that the entry keeps)."""
    return {"figure": entry["figure"], "command": entry["command"], "seed": entry["seed"], "argv": entry["argv"],
            "repo_commit": entry["repo_commit"], "grok_epoch": entry["grok_epoch"],
            "final_test_acc": entry["final_test_acc"], "log": entry["log"], "cpu_s": entry["cpu_s"],
            "threads": entry["threads"], "torchvision_stub": entry["torchvision_stub"],
            "args": {"lr": entry["lr"], "modulo": entry["p"], "train_fraction": entry["train_fraction"],
                     "num_epochs": entry["epochs"], "log_frequency": entry["log_frequency"], "device": entry["device"]}}


def _write_ledger(path: Path, runs: list[dict], repo: str = stablemax_official.PEER_REPO) -> Path:
    path.write_text(json.dumps({"format": 1, "peer": repo, "what": "test", "runs": runs}))
    return path


def test_the_committed_runs_are_their_perp_adamw_command_and_its_rule_holds():
    runs = [e for e in _committed() if e["arm"] == "perp_adamw"]
    assert len(runs) >= 5 and {e["seed"] for e in runs} >= {1, 2, 3, 4, 5}
    for e in runs:
        assert (e["figure"], e["command"], e["epochs"], e["log_frequency"], e["p"]) == (1, 2, 300, 10, 113)
        assert "--orthogonal_gradients" in e["argv"] and e["argv"][-2:] == ["--seed", str(e["seed"])]
        first = next(ep for ep, acc in zip(e["log"]["epochs"], e["log"]["test_acc"]) if acc >= 0.95)
        assert e["grok_epoch"] == first


def test_a_bad_entry_is_refused_naming_what(tmp_path):
    good = _committed()[0]
    for change, why in (({"grok_epoch": 0}, "their rule"), ({"figure": 6}, "'figure', 'command'"),
                        ({"final_test_acc": 1.5}, "out of range"), ({"threads": True}, "'threads'")):
        with pytest.raises(BadInput, match=why):
            stablemax_official.load_official(_write_ledger(tmp_path / "l.json", [{**good, **change}]))
    short = copy.deepcopy(good)
    for k in short["log"]:
        short["log"][k] = short["log"][k][:-1]  # a run that stopped before its last logged epoch
    with pytest.raises(BadInput, match="last logged one"):
        stablemax_official.load_official(_write_ledger(tmp_path / "l.json", [short]))
    with pytest.raises(BadInput, match="counted twice"):
        stablemax_official.load_official(_write_ledger(tmp_path / "l.json", [good, good]))
    sphere = _write_ledger(tmp_path / "s.json", [good])
    sphere.write_text(sphere.read_text().replace(stablemax_official.PEER_REPO, "AlperYildirim1/geometric-grokking"))
    with pytest.raises(BadInput, match="not a peer ledger of LucasPrietoAl"):
        stablemax_official.load_official(sphere)


def test_the_recorder_keeps_each_run_and_refuses_a_bad_file_in_one_line(tmp_path, capsys):
    entries = _committed()[:2]
    paths = []
    for i, e in enumerate(entries):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(_as_result(e)))
    ledger = tmp_path / "peer" / "stablemax-official.json"
    assert _recorder().main(["stablemax", *map(str, paths), "--ledger", str(ledger)]) == 0
    got = stablemax_official.load_official(ledger)
    strip = ("recorded",)
    assert [{k: v for k, v in g.items() if k not in strip} for g in got] == \
        [{k: v for k, v in e.items() if k not in strip} for e in entries]
    assert _recorder().main(["stablemax", str(paths[0]), "--ledger", str(ledger)]) == 0  # again: replaced, not added
    assert len(stablemax_official.load_official(ledger)) == 2
    capsys.readouterr()
    other = tmp_path / "fig2.json"
    other.write_text(json.dumps({**_as_result(entries[0]), "figure": 2}))
    junk = tmp_path / "junk.json"
    junk.write_text('{"figure": 1}')
    fresh = tmp_path / "fresh.json"
    for bad, why in ((other, "none of the recorded arms"), (junk, "stablemax_official.py")):
        assert _recorder().main(["stablemax", str(bad), "--ledger", str(fresh)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and why in err and not fresh.exists()


def test_stablemax_paper_rows_read_their_own_codes_runs(tmp_path, monkeypatch):
    """Their ⊥AdamW runs (the committed ones less seed 5, and a shortened run that must not count)
    give a row of their own code beside groklens' arm; arms without runs say so."""
    runs = [e for e in _committed() if e["arm"] == "perp_adamw" and e["seed"] != 5]
    short = {**copy.deepcopy(runs[0]), "seed": 9, "epochs": 20}
    short["log"] = {k: v[:2] for k, v in runs[0]["log"].items()}
    short["grok_epoch"] = stablemax_official.grok_epoch(short["log"])
    monkeypatch.setattr(stablemax, "PEER_LEDGER", _write_ledger(tmp_path / "l.json", [*runs, short]))
    exp = get_experiment("stablemax")
    sc = exp.scales["paper"]
    rows = exp.read(Context(exp.name, "paper", sc, exp.plan(sc, "paper"), {}, tmp_path))
    theirs = {r.measure: r for r in rows if "their own code" in r.measure}
    assert len(theirs) == len(stablemax_official.ARMS)
    perp = next(r for m, r in theirs.items() if "⊥AdamW" in m)
    steps = [e["grok_epoch"] + 1 for e in runs]  # their epoch e is our step e + 1
    assert perp.ours == pytest.approx(sum(steps) / len(steps)) and "(n=4)" in perp.ours_text
    assert perp.verdict == "agrees" and "groklens (perp_adamw): no runs" in perp.ours_text
    assert "figure 1's command 2" in perp.differs and "0cc9e8dc62" in perp.differs
    f64 = next(r for m, r in theirs.items() if "float64" in m)
    assert f64.ours_text == "no official-code run recorded" and f64.verdict.startswith("undetermined")


def test_grokfast_paper_rows_read_their_own_codes_runs_as_iterations(tmp_path, monkeypatch):
    """Their runs log the iterations taken: their count is our step (no +1), and a run that has not
    reached 95% by its budget is censored there."""
    runs = [e for e in grokfast_official.load_official(grokfast_official.PEER_LEDGER) if e["arm"] == "grokfast"]
    assert len(runs) >= 5
    for e in runs:
        assert e["log"]["iterations"][:2] == [10, 20] and e["log"]["iterations"][-1] == e["epochs"]
        assert e["grok_epoch"] == next(i for i, a in zip(e["log"]["iterations"], e["log"]["val_acc"]) if a >= 0.95)
    cut = copy.deepcopy(runs[0])  # the same run, as if its budget ended before it grokked
    keep = [i for i, t in enumerate(cut["log"]["iterations"]) if t <= cut["grok_epoch"] - 10]
    cut["log"] = {k: [v[i] for i in keep] for k, v in cut["log"].items()}
    cut.update(seed=99, epochs=cut["log"]["iterations"][-1], grok_epoch=None)
    ledger = _write_ledger(tmp_path / "g.json", [*runs, cut], grokfast_official.PEER_REPO)
    monkeypatch.setattr(grokfast, "PEER_LEDGER", ledger)
    exp = get_experiment("grokfast")
    sc = exp.scales["paper"]
    rows = exp.read(Context(exp.name, "paper", sc, exp.plan(sc, "paper"), {}, tmp_path))
    theirs = {r.measure: r for r in rows if "their own code" in r.measure}
    assert len(theirs) == 3
    ema = next(r for m, r in theirs.items() if "EMA" in m)
    assert ema.bound == "lower" and f"(n={len(runs) + 1}, 1 censored" in ema.ours_text
    assert ema.ours == pytest.approx((sum(e["grok_epoch"] for e in runs) + cut["epochs"]) / (len(runs) + 1))
    base = next(r for m, r in theirs.items() if "baseline" in m)
    assert base.ours_text == "no official-code run recorded"


def test_the_sphere_headline_from_the_official_code_is_the_ratio_of_their_geometric_means():
    """The committed runs of the sphere paper's own code: the speed-up of the bounded sphere wd 0
    over LayerNorm, as the rows read it, against the same ratio computed here from the peer
    ledger's JSON (their grok epoch e is groklens' step e + 1)."""
    import math

    from groklens.experiments import sphere_paper

    runs = json.loads(sphere_paper.PEER_LEDGER.read_text())["runs"]
    steps = {a: [e["grok_epoch"] + 1 for e in runs if e["arm"] == a and e["lr"] == 6e-4] for a in ("ln", "sphere_wd0")}
    assert len(steps["ln"]) >= 5 and len(steps["sphere_wd0"]) >= 5
    gm = {a: math.exp(sum(map(math.log, s)) / len(s)) for a, s in steps.items()}
    exp = get_experiment("bounded-sphere")
    sc = exp.scales["paper"]
    rows = exp.read(Context(exp.name, "paper", sc, exp.plan(sc, "paper"), {}, Path(".")))
    row = next(r for r in rows if r.measure.startswith("speed-up of bounded sphere, wd 0 over LayerNorm, the official "
                                                       "code") and "lr 0.0006" in r.measure)
    assert row.ours == pytest.approx(gm["ln"] / gm["sphere_wd0"], rel=1e-9)
    assert f"(n={len(steps['ln'])} / {len(steps['sphere_wd0'])})" in row.ours_text


def test_the_sphere_fve_of_models_their_code_trained(tmp_path, monkeypatch):
    """fourier-fve's official-code rows: the mean of their printed mean of ten over the committed
    readings of their fully bounded model, computed here from the JSONs; a file that is not a
    reading of their training is refused, naming it."""
    import statistics

    from groklens.experiments import sphere_official

    files = sorted(sphere_official.FVE_DIR.glob("official_nowd_s*.json"))
    fves = [json.loads(f.read_text())["checkpoints"][0]["theirs"]["fve_mean10_pct"] / 100 for f in files]
    assert len(fves) >= 10
    exp = get_experiment("fourier-fve")
    sc = exp.scales["paper"]
    rows = exp.read(Context(exp.name, "paper", sc, exp.plan(sc, "paper"), {}, Path(".")))
    row = next(r for r in rows if "official code's model" in r.measure and "spherical_nowd" in r.measure)
    assert row.ours == pytest.approx(statistics.mean(fves)) and f"(n={len(fves)})" in row.ours_text
    assert f"{statistics.stdev(fves):.3f}" in row.ours_text and row.published.value == 0.62

    good = json.loads(files[0].read_text())
    (tmp_path / "official_x.json").write_text(json.dumps({**good, "model": "groklens-trained"}))
    with pytest.raises(BadInput, match="official_x.json: model 'groklens-trained'"):
        sphere_official.load_official_fve(tmp_path)
    (tmp_path / "official_x.json").write_text(json.dumps({**good, "checkpoints": []}))
    with pytest.raises(BadInput, match="official_x.json: not a reading"):
        sphere_official.load_official_fve(tmp_path)


@pytest.mark.parametrize("tail, windowed, whole", [
    ([1.0] * 14 + [0.887], False, True),  # held 15 logs, one-log dip at the end (their wd 1 seed 2)
    ([0.9, 1.0] + [1.0] * 13, False, False),  # a dip at the window's evaluation that recovers
    ([0.5] * 15, True, True),  # fell below and never came back: a collapse either way
])
def test_an_official_log_is_read_for_collapse_where_groklens_would_have_stopped_it(tail, windowed, whole):
    """The sphere rows read a collapse over the official log up to where groklens' stop rule (2
    evaluations after grokking, through a dip until back) would end it; the whole log's reading is kept."""
    from groklens.experiments.peer import OfficialRun
    from groklens.experiments.sphere_official import PEER

    acc = [0.1, 0.5, 0.96, 0.99] + tail
    epochs = [200 * i for i in range(len(acc))]
    entry = {"arm": "sphere_wd1", "seed": 2, "epochs": epochs[-1] + 200, "grok_epoch": 400,
             "log": {"epochs": epochs, "train_acc": [1.0] * len(acc), "test_acc": acc}}
    run = OfficialRun(entry, PEER, stop=(2, True))
    assert run.collapsed is windowed and run.collapse_whole_log["collapsed"] is whole
    assert OfficialRun(entry, PEER).collapsed is whole  # no stop rule given: the whole log


def test_the_sphere_official_rows_name_the_run_that_dips_only_after_the_window():
    """On the committed official runs: wd 1 seed 2's last-log dip (0.887 at epoch 3,999, after
    holding the threshold from epoch 800) is outside the window, so the weight-decay order is read
    at the crossing, and its note names that run."""
    from groklens.experiments import sphere_paper

    exp = get_experiment("bounded-sphere")
    sc = exp.scales["paper"]
    rows = exp.read(Context(exp.name, "paper", sc, exp.plan(sc, "paper"), {}, Path(".")))
    row = next(r for r in rows if "(the weight-decay order), the official code" in r.measure and "0.0006" in r.measure)
    assert "official_sphere_wd1_s2" in row.differs and "collapsed" not in row.ours_text
    runs = json.loads(sphere_paper.PEER_LEDGER.read_text())["runs"]
    s2 = next(e for e in runs if (e["arm"], e["seed"], e["lr"]) == ("sphere_wd1", 2, 6e-4))
    assert s2["log"]["test_acc"][-1] < 0.95 and min(s2["log"]["test_acc"][4:-1]) >= 0.95

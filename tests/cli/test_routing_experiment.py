"""reproduce routing: its plan (arms, kernels, units, each seed's own teacher), the smoke scale end to
end through the CLI (ledger, rows, the per-task comparisons), what a run keeps against its file, the
rows' verdicts, and its cost in `reproduce --list` (a routed run costs its M copies)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from groklens import experiments as E
from groklens.experiments import routing as R
from groklens.experiments.core import Context
from tests.helpers import groklens


def _configs(scale: str, seeds: int = 1) -> dict[str, object]:
    return {name: cfg for _, name, cfg in E.run_configs(E.get_experiment("routing"), scale, seeds)}


def test_every_arm_trains_m_copies_and_routes_as_planned():
    for scale in E.SCALES:
        sc = E.get_experiment("routing").scales[scale]
        cfgs = _configs(scale, 2)
        for name, cfg in cfgs.items():
            variant = name.rsplit("_s", 1)[0]
            arm = variant.split("_", 2 if variant.startswith(("perceptron", "committee")) else 1)[-1]
            assert cfg.routing_copies == sc.extra["copies"], name
            assert cfg.elastic_gamma == (R.ELASTIC_GAMMA if arm == "elastic" else 0.0), name
            if arm.startswith("routed"):
                assert cfg.routing_width in sc.extra["widths"]
                assert cfg.routing_unit == ("weight" if cfg.task == "teacher" else "layer"), name
            else:
                assert cfg.routing_width == 0.0 and cfg.routing_unit == "layer", name
            if cfg.task == "teacher":  # each seed its own teacher and data
                assert cfg.data_seed == cfg.seed and cfg.teacher_alpha in sc.extra["alphas"]
                assert cfg.loss == ("perceptron" if cfg.model == "perceptron" else "ce")
    quick = _configs("quick")
    assert {c.routing_width for c in quick.values() if c.routing_width} == {0.5, 1.0, math.inf}
    assert {c.teacher_alpha for c in quick.values() if c.task == "teacher"} == {0.5, 1.0, 2.0, 4.0}
    assert quick["tf_independent_s1"].norm == "ln" and quick["mlp_independent_s1"].model == "mlp"


@pytest.mark.slow
def test_smoke_scale_through_the_cli(tmp_path):
    out, md, ledger = tmp_path / "out", tmp_path / "RESULTS.md", tmp_path / "ledger"
    proc = groklens("reproduce", "routing", "--scale", "smoke", "-o", str(out), "--results-md", str(md),
                    "--ledger", str(ledger), timeout=900)
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((out / "results.json").read_text())
    entries = json.loads((ledger / "routing.smoke.json").read_text())["runs"]
    assert len(entries) == len(saved["runs"]) == 12  # 4 models x 3 arms (smoke: one kernel, one alpha)
    # the runs of each task are compared apart
    for name in ("comparison.txt", "comparison-teacher.txt"):
        assert (out / name).exists()
    teacher, modular = (out / "comparison-teacher.txt").read_text(), (out / "comparison.txt").read_text()
    assert "model=perceptron" in teacher and "model=committee" in teacher and "model=mlp" not in teacher
    assert "model=mlp" in modular and "model=perceptron" not in modular
    # what each entry keeps is its file's copies, read here with h5py
    for e in entries:
        with h5py.File(out / "runs" / f"{e['run']}.h5", "r", locking=False) as f:
            m = e["config"]["routing_copies"]
            accs = [float(f[f"metrics/copy{c}.test_acc"][len(f['metrics/step']) - 1]) for c in range(m)]
        assert e["run_values"]["copy_test_error"] == pytest.approx([1 - a for a in accs])
        assert len(e["run_values"]["copy_grok"]) == m
    # every row: a claim of the source, in the markdown table once; verdict rows for the routed arm
    rows = saved["rows"]
    assert len(rows) == 2 * (3 + 1 + 1 + 1) + 2 * (3 + 1 + 1 + 1)
    assert md.read_text().count("| `groklens reproduce routing --scale smoke --seeds 1` |") == len(rows)
    verdicts = [r for r in rows if r["verdict"]]
    assert len(verdicts) == 8 and all(r["verdict"].startswith("undetermined") for r in verdicts)  # one seed


@pytest.mark.parametrize("grok_evals", [1, 3])
def test_run_values_read_every_copy(tmp_path, monkeypatch, grok_evals):
    from groklens.trainers.train import train
    from tests.helpers import tiny_config

    # the tiny run's copies reach 0.2-0.28, not 0.95: read at 0.2 (one copy dips below it after its first
    # crossing, where 3 in a row and the first crossing differ)
    monkeypatch.setattr(R, "GROK_THRESHOLD", 0.2)
    path = tmp_path / "r.h5"
    train(tiny_config(routing_copies=2, routing_width=1.0, steps=300, eval_every=10, checkpoint_every=100,
                      grok_threshold=0.2, grok_evals=grok_evals), path, progress=False)
    vals = R._run_values(path, None)
    with h5py.File(path, "r", locking=False) as f:
        steps = f["metrics/step"][:]
        for c in range(2):
            acc = f[f"metrics/copy{c}.test_acc"][: len(steps)]
            # the first of grok_evals evaluations in a row at >= 0.2
            held = [i for i in range(len(acc) - grok_evals + 1) if (acc[i:i + grok_evals] >= 0.2).all()]
            assert vals["copy_grok"][c] == (int(steps[held[0]]) if held else None)
            assert vals["copy_collapsed"][c] == bool(held and (acc[-grok_evals:] < 0.2).all())
            assert vals["copy_test_error"][c] == pytest.approx(1 - acc[-1])
        assert vals["ensemble_test_error"] == pytest.approx(1 - f["metrics/ensemble.test_acc"][len(steps) - 1])
    assert any(g is not None for g in vals["copy_grok"])  # the check above compared steps, not two Nones
    assert vals["last_step"] == 300


def test_modular_arms_read_grokking_at_three_evaluations_and_stop_only_while_every_copy_holds_it():
    for scale in ("quick", "paper"):
        for name, cfg in _configs(scale).items():
            if cfg.task != "teacher":
                assert (cfg.grok_evals, cfg.stop_after_grok, cfg.stop_at_event) == (3, 2, True), (scale, name)


def _ctx(values: dict[str, list[dict]]) -> Context:
    """A context whose arms hold runs with these run_values (seed i + 1 for the i-th)."""
    sc = E.get_experiment("routing").scales["smoke"]
    arms = {v: [SimpleNamespace(seed=i + 1, run_values=rv) for i, rv in enumerate(runs)] for v, runs in values.items()}
    return Context("routing", "smoke", sc, R._plan(sc, "smoke"), arms, None)


def _errs(*per_seed: float) -> list[dict]:
    return [{"copy_test_error": [e, e], "ensemble_test_error": e} for e in per_seed]


def test_paired_error_ratios_decide_by_their_interval():
    low, base = _errs(0.20, 0.22, 0.19), _errs(0.30, 0.31, 0.29)
    near = _errs(0.19, 0.23, 0.19)  # within the seeds' spread of `low`, on both sides
    ctx = _ctx({"perceptron_a2_routed_w1": low, "perceptron_a2_independent": base, "perceptron_a2_elastic": near})
    better = R._paired_row(ctx, "perceptron", "routed_w1", "independent",
                           E.Published(None, R.CLAIM, R.SOURCE), "", True)
    assert better.ours == pytest.approx(np.mean([0.20 / 0.30, 0.22 / 0.31, 0.19 / 0.29])) and better.verdict == "agrees"
    worse = R._paired_row(ctx, "perceptron", "independent", "routed_w1", E.Published(None, R.CLAIM, R.SOURCE), "", True)
    assert worse.verdict == "disagrees"
    tie = R._paired_row(ctx, "perceptron", "routed_w1", "elastic", E.Published(None, R.CLAIM, R.SOURCE), "", True)
    assert tie.ours == pytest.approx(1.0, abs=0.05) and tie.verdict.startswith("undetermined (the 95% interval")
    one = _ctx({"perceptron_a2_routed_w1": low[:1], "perceptron_a2_independent": base[:1]})
    assert R._paired_row(one, "perceptron", "routed_w1", "independent", E.Published(None, R.CLAIM, R.SOURCE), "",
                         True).verdict.startswith("undetermined (no interval")


def test_error_curves_and_their_figure(tmp_path):
    """The figure's points: per arm and alpha, the mean and sample sd over seeds of each run's
    copies' mean error; arms without runs left out; the PNG is written only when a point exists."""
    runs = {"perceptron_a2_routed_w1": [{"copy_test_error": [0.2, 0.4]}, {"copy_test_error": [0.1, 0.3]}],
            "perceptron_a2_independent": _errs(0.35)}
    ctx = _ctx(runs)
    curves = R._error_curves(ctx, "perceptron")
    assert set(curves) == {"routed_w1", "independent"} and R._error_curves(ctx, "committee") == {}
    (alpha, mean, sd), = curves["routed_w1"]
    assert alpha == 2.0 and mean == pytest.approx(0.25) and sd == pytest.approx(np.std([0.3, 0.2], ddof=1))
    assert curves["independent"] == [(2.0, pytest.approx(0.35), 0.0)]
    ctx.out_dir = tmp_path
    assert R._figures(ctx) == [tmp_path / R.FIGURE] and (tmp_path / R.FIGURE).stat().st_size > 0
    empty = _ctx({})
    empty.out_dir = tmp_path / "none"
    assert R._figures(empty) == [] and not (tmp_path / "none").exists()


def test_grokking_speedups_read_the_copies_mean_and_its_censoring():
    def runs(*copy_steps):
        return [{"copy_grok": list(s), "copy_test_error": [0.0] * len(s), "copy_collapsed": [False] * len(s),
                 "last_step": 5000} for s in copy_steps]

    ctx = _ctx({"tf_independent": runs((2000, 2200), (1800, 2400), (2100, 1900)),
                "tf_routed_w1": runs((900, 1000), (850, 950), (1000, 1100)),
                "mlp_independent": runs((3000, 3400), (2800, 3000), (2500, 2700)),
                "mlp_routed_w1": runs((None, None), (None, 5000), (None, None))})
    fast = R._speedup_row(ctx, "tf", "independent", "routed_w1", E.Published(None, R.CLAIM, R.SOURCE), "", True)
    t_base = np.exp(np.mean(np.log([2100, 2100, 2000])))
    t_var = np.exp(np.mean(np.log([950, 900, 1050])))
    assert fast.ours == pytest.approx(t_base / t_var) and fast.verdict == "agrees"
    # routed copies that never grok: their mean enters at the cap, the speed-up is an upper bound
    slow = R._speedup_row(ctx, "mlp", "independent", "routed_w1", E.Published(None, R.CLAIM, R.SOURCE), "", True)
    assert slow.bound == "upper" and slow.verdict == "disagrees"
    row = R._grok_row(ctx, "mlp", "routed_w1", "")
    assert row.bound == "lower" and "copies grokked 1/6" in row.ours_text
    # copies that crossed and fell back: the row counts copies, the verdict the runs holding them
    fell = runs((900, 1000), (850, 950), (1000, 1100))
    fell[0]["copy_collapsed"], fell[2]["copy_collapsed"] = [True, True], [False, True]
    ctx = _ctx({"tf_independent": runs((2000, 2200), (1800, 2400), (2100, 1900)), "tf_routed_w1": fell})
    assert "3 copies crossed and then ended below" in R._grok_row(ctx, "tf", "routed_w1", "").ours_text
    verdict = R._speedup_row(ctx, "tf", "independent", "routed_w1", E.Published(None, R.CLAIM, R.SOURCE), "",
                             True).verdict
    # read the other way (those copies never grokked, censored at 5000) the routed runs are censored:
    # an upper bound whose interval reaches above 1, so the two readings differ and nothing is decided
    assert verdict.startswith("undetermined (2 run(s) behind it crossed and then collapsed; read as grokked at the "
                              "crossing: agrees; as censored at the last step: undetermined (the 95% interval [0, ")
    # a collapsed copy on the slow side only: both readings say faster, so the verdict stands
    slow_fell = runs((2000, 2200), (1800, 2400), (2100, 1900))
    slow_fell[1]["copy_collapsed"] = [False, True]
    ctx = _ctx({"tf_independent": slow_fell, "tf_routed_w1": runs((900, 1000), (850, 950), (1000, 1100))})
    row = R._speedup_row(ctx, "tf", "independent", "routed_w1", E.Published(None, R.CLAIM, R.SOURCE), "", True)
    t_base = np.exp(np.mean(np.log([2100, (1800 + 5000) / 2, 2000])))  # the collapsed copy at the last step
    assert f">= {t_base / np.exp(np.mean(np.log([950, 900, 1050]))):.2f}x" in row.ours_text
    assert row.verdict == ("agrees (under both readings of the 1 collapsed run(s): grokked at the crossing, or "
                           "censored at the last step)")


def test_list_costs_a_routed_run_as_its_copies():
    items = json.loads(groklens("reproduce", "--list", "--json", "--no-measure", check=True).stdout)
    routing = next(i for i in items if i["name"] == "routing")["scales"]
    assert routing["quick"]["runs"] == (2 * 4 + 2) * 5 * 5  # (2 models x 4 alphas + 2) variants x 5 arms x 5 seeds
    assert 0 < routing["quick"]["cpu_seconds_expected"] <= routing["quick"]["cpu_seconds_cap"]
    cfg = _configs("quick")["tf_routed_w1_s1"]
    single = cfg.replace(routing_copies=1, routing_width=0.0)
    assert E.step_flops(cfg)[0] == pytest.approx(4 * E.step_flops(single)[0])
    assert E.step_flops(cfg)[1] == pytest.approx(4 * E.step_flops(single)[1])

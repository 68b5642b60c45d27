"""`groklens llc-calibrate` and the vectorized sampler against the known answer of
tests/analyses/test_llc.py: linear regression, whose LLC is rank(H) / 2 (8 for 16 regular
parameters, 4 for 16 parameters with 8 flat directions), with the SGLD step's bias and the
localization's pull written out in closed form there (`expected`), independently of the code."""

import json

import numpy as np
import pytest

from groklens.analyses.llc import sgld_llc
from groklens.analyses.llc_calibrate import CHECKS, HEALTH, Target, figure, format_calibration, sweep
from groklens.analyses.sgld import minibatch_stream, sample
from tests.analyses.test_llc import N, Redundant, Regular, _hessian, _problem, expected
from tests.helpers import groklens, train_tiny

CHAINS, BURNIN, DRAWS = 8, 200, 400


def _row_loss(x, y):
    return lambda m, rows: 0.5 * (m(x[rows]) - y[rows]) ** 2


def _targets():
    x, y, w = _problem(16)
    x2, y2, w2 = _problem(8)
    chance = [float(0.5 * ((t - t.mean()) ** 2).mean()) for t in (y, y2)]  # the best constant prediction's loss
    models = [Regular(w).double(), Redundant(w2).double()]
    targets = [Target("regular", models[0], _row_loss(x, y), N, chance[0]),
               Target("redundant", models[1], _row_loss(x2, y2), N, chance[1])]
    return targets, [(models[0], x, 16 / 2), (models[1], x2, 8 / 2)]


@pytest.fixture(scope="module")
def calibration():
    targets, known = _targets()
    # devinterp's step sizes and nbeta multiples; its calibration notebook's localizations
    return sweep(targets, localizations=(1.0, 10.0, 100.0), chains=CHAINS, burnin=BURNIN, draws=DRAWS, minibatch=N), \
        known


@pytest.mark.slow
def test_the_recommended_setting_recovers_half_the_rank(calibration):
    cal, known = calibration
    assert cal.passing and cal.recommended == cal.passing[0]
    lr, nb, gamma = cal.settings[cal.recommended]
    for t, (model, x, answer) in enumerate(known):
        r = cal.results[t][cal.recommended]
        assert all(r[c] for c in CHECKS)
        se = r["llc_std"] / np.sqrt(CHAINS)
        exp = expected(_hessian(model, x), nb=nb, gamma=gamma, lr=lr)
        assert 0 < se < 0.1 * answer  # a tolerance that can fail
        assert abs(exp - answer) < 0.06 * answer  # at this setting the sampler's expectation is rank/2 (test_llc)
        assert abs(r["llc_mean"] - answer) < 4 * se + abs(exp - answer)
    # the order of the two models (8 > 4) is the one the recommended setting gives
    assert cal.results[0][cal.recommended]["llc_mean"] > cal.results[1][cal.recommended]["llc_mean"]


@pytest.mark.slow
def test_the_checks_reject_what_they_name(calibration):
    cal, known = calibration
    by = {s: i for i, s in enumerate(cal.settings)}
    nb0 = round(cal.default_nbeta, 6)
    # the largest step diverges at the default nbeta: failed, never recommended
    assert not cal.results[0][by[(0.3, nb0, 1.0)]]["finite"]
    # the smallest step has not mixed in 600 steps: the closed-form stationary value is far off and the drift large
    r = cal.results[0][by[(3e-5, nb0, 1.0)]]
    assert not r["converged"] and abs(r["llc_mean"] - 8) > 2
    # lr-stable needs the next larger lr's estimate: the largest lr of the grid never is
    assert not any(res[s]["lr_stable"] for res in cal.results for s, st in enumerate(cal.settings) if st[0] == 0.3)
    # a passing setting can still be far from the answer when the localization dominates n*beta*lambda:
    # why the rule prefers nbeta near n/log n and the smallest localization
    low = [s for s in cal.passing if cal.settings[s][1] < nb0 and cal.settings[s][2] == 100.0]
    assert all(cal.results[0][s]["llc_mean"] < 0.5 * 8 for s in low)


def test_every_row_enters_every_epoch():
    n, b = 264, 32  # the demo's 264 training inputs: devinterp's DataLoader never shows 8 of them
    stream = minibatch_stream(n, b, steps=3 * n, seed=3).numpy().reshape(-1)
    for epoch in range(3 * b):
        assert sorted(stream[epoch * n : (epoch + 1) * n]) == list(range(n))


def test_chain_noise_does_not_depend_on_how_many_chains_or_settings_run():
    x, y, w = _problem(4, seed=5)
    kw = dict(burnin=2, draws=6, minibatch=50, seed=1)
    two = sample(Regular(w).double(), _row_loss(x, y), N, [(1e-3, 20.0, 1.0)], chains=2, **kw)
    four = sample(Regular(w).double(), _row_loss(x, y), N, [(1e-4, 5.0, 3.0), (1e-3, 20.0, 1.0)], chains=4, **kw)
    # the same noise, so equal up to the rounding of a batched matmul over more lanes (which the
    # CPU's kernels may order differently): 1e-16 here, while other noise would differ by O(1)
    np.testing.assert_allclose(two["trace"][0, 0], four["trace"][0, 1, :2], rtol=1e-12, atol=0)


@pytest.mark.slow
def test_vmap_and_devinterp_samplers_agree():
    """The same chains through devinterp's own sample() (serial) and the vectorized sampler:
    each recovers rank/2 within its standard error, and they agree with each other."""
    from tests.analyses.test_llc import BURNIN as B, DRAWS as D, GAMMA, LR, NB

    x, y, w = _problem(16)
    kw = dict(lr=LR, localization=GAMMA, nbeta=NB, chains=CHAINS, draws=D, burnin=B, minibatch=N)
    a = sgld_llc(Regular(w).double(), _row_loss(x, y), N, backend="vmap", **kw)
    b = sgld_llc(Regular(w).double(), _row_loss(x, y), N, backend="devinterp", **kw)
    se = np.hypot(a["llc_std"], b["llc_std"]) / np.sqrt(CHAINS)
    assert abs(a["llc_mean"] - b["llc_mean"]) < 4 * se
    assert a["init_loss"] == pytest.approx(b["init_loss"], rel=1e-6)  # full batch: both are L_n(w*)


# ---------------------------------------------------------------------- the command
GRID40 = ",".join(f"{1e-5 * (i + 1):g}" for i in range(40))
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("cal") / "run.h5"
    train_tiny(path)
    return path


@pytest.mark.slow
def test_command_writes_the_table_json_and_figures(run, tmp_path):
    out = tmp_path / "cal"
    proc = groklens("llc-calibrate", str(run), "--checkpoints", "20,60", "--lr", "1e-4,1e-3", "--nbeta", "5",
                    "--localization", "10,1000", "--chains", "2", "--draws", "6", "--burnin", "2", "--minibatch", "8",
                    "-o", str(out), "-q", check=True)
    assert "checkpoint step 20" in proc.stdout and "recommended:" in proc.stdout
    doc = json.loads((out / "calibration.json").read_text())
    assert doc["checkpoints"] == ["step 20", "step 60"] and len(doc["rows"]) == 2 * 4
    # 8 SGLD steps mix nothing (drift 2-4 x |LLC|): no recommendation, and the line says why
    assert doc["recommended"] is None and "no setting's chains converged" in doc["rule_note"]
    assert "recommended: none (no recommendation" in proc.stdout
    assert (out / "traces-step20.png").stat().st_size > 0 and (out / "traces-step60.png").exists()


@pytest.mark.parametrize("args, message", [
    (["--lr", "fast"], "--lr takes numbers"),
    (["--localization", "-1"], "localization values must be non-negative"),
    (["--nbeta", "0"], "nbeta values must be positive"),
    (["--checkpoints", "7"], "no checkpoint at step(s) 7"),
    (["--chains", "0"], "chains must be an integer >= 1"),
    # the limits held for the first value only, and an empty --lr ran the default grid
    (["--lr", "1e-4,5"], "lr values must be positive finite numbers <= 1; got 5.0"),
    (["--localization", "10,1e13"], "localization values must be non-negative finite numbers <= 1e+12"),
    (["--lr", ""], "--lr is given with no number"),
    (["--nbeta", ","], "--nbeta is given with no number"),
    # 64,000 settings sampled for hours
    (["--lr", GRID40, "--nbeta", GRID40, "--localization", GRID40], "40 x 40 x 40 = 64,000 settings; at most 512"),
    (["--lr", GRID40, "--localization", "1,2,3"], "40 x 4 x 3 = 480"),  # the default nbetas are 4: 480 fits
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(run, tmp_path, args, message):
    out = tmp_path / "cal"
    if message.endswith("= 480"):  # under the limit: it is not refused for its size (the checkpoint 7 is)
        args, message = [*args, "--checkpoints", "7"], "no checkpoint at step(s) 7"
    proc = groklens("llc-calibrate", str(run), *args, "-o", str(out), "-q")
    assert proc.returncode == 2
    assert proc.stderr.startswith("groklens: error:") and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()


_TINY_SWEEP = ("--checkpoints", "60", "--lr", "1e-4", "--nbeta", "5", "--localization", "10", "--chains", "1",
               "--draws", "4", "--burnin", "1", "--minibatch", "8", "-q")


def test_a_link_in_the_output_directory_is_replaced_never_written_through(run, tmp_path):
    """The trace PNG was saved through a symlink at its name, over the user's file."""
    out, mine = tmp_path / "cal", tmp_path / "mine.txt"
    out.mkdir()
    mine.write_text("precious")
    (out / "traces-step60.png").symlink_to(mine)
    (out / "calibration.json").symlink_to(mine)
    groklens("llc-calibrate", str(run), *_TINY_SWEEP, "-o", str(out), check=True)
    assert mine.read_text() == "precious"
    for name in ("traces-step60.png", "calibration.json"):
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 0
    assert sorted(p.name for p in out.iterdir()) == ["calibration.json", "traces-step60.png"]  # no stage left


def test_a_read_only_output_directory_is_refused_before_the_sweep(run, tmp_path):
    from tests.helpers import readonly_groklens, one_line_exit

    ro = tmp_path / "ro"
    ro.mkdir()
    err = one_line_exit(readonly_groklens(ro, "llc-calibrate", str(run), *_TINY_SWEEP, "--draws", "1000000",
                                          "-o", str(ro / "cal"), timeout=60))
    assert "cannot write into" in err and "read-only file system" in err
    assert not any(ro.iterdir())


def test_missing_run_is_bad_input(tmp_path):
    proc = groklens("llc-calibrate", str(tmp_path / "none.h5"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_analyze_help_lists_every_metric_and_the_default_set():
    from groklens.analyses.registry import default_names, names

    text = " ".join(groklens("analyze", "--help", check=True).stdout.split())
    listed = text.split("Analysis to compute (repeatable):", 1)[1].split(".", 1)[0]
    assert sorted(n.strip() for n in listed.split(",")) == sorted(names())
    default = text.split("Default:", 1)[1].split("(", 1)[0]
    assert sorted(n.strip() for n in default.split(",")) == sorted(default_names())


def test_checkpoints_sampled_together_equal_one_at_a_time(run):
    """The runner hands llc every checkpoint it lacks at once (llc_many: one vectorized pass over
    checkpoints x chains); chain c draws the same noise and minibatches at every checkpoint, so
    each checkpoint's result is the one llc() gives it alone."""
    from groklens.analyses import compute
    from groklens.analyses.llc import llc
    from groklens.checkpoints import Trajectory

    kw = dict(chains=2, draws=6, burnin=2, minibatch=8, lr=1e-3, localization=100.0)
    together = compute(run, "llc", steps=[20, 40, 60], store=False, **kw)
    traj = Trajectory(run)
    for i, s in enumerate([20, 40, 60]):
        alone = llc(traj.model(s), traj.dataset(), **kw)
        np.testing.assert_allclose(together.values["llc_per_chain"][i], alone["llc_per_chain"], rtol=1e-4)
        assert together.values["init_loss"][i] == pytest.approx(alone["init_loss"], rel=1e-9)


@pytest.mark.parametrize("passes", [False, True])
def test_the_trace_figure_says_green_only_with_a_green_frame_and_has_no_axis_offset(passes):
    """Traces of order 1e7 make matplotlib write a multiplier (1e7) over the axes, where it sat on
    the panel's title; the ticks carry the values instead. The title names the green frame only
    when a panel has one, and stays inside the figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from groklens.analyses.llc_figures import TracePanel, trace_grid

    blocks = 1e7 * (1 + np.random.default_rng(0).random((2, 8)))
    panels = [[TracePanel(blocks, 1.5e7, passes, "fcaplso" if passes else "f.ap..o", recommended=True), None]]
    fig = trace_grid(panels, ["lr 1e-4"], ["localization 100", "localization 1000"], steps=80, burnin=20,
                     title="step 40: n*beta (L_t - L(w*)) per chain, nbeta 5 (n/log n = 47.3); dashed: LLC")
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    assert all(a.yaxis.get_offset_text().get_text() == "" for a in fig.axes)
    title = fig.get_suptitle()
    assert ("green frame: passes every check" in title) == passes
    assert ("no setting passes every check" in title) != passes
    box = fig._suptitle.get_window_extent(canvas.get_renderer())
    assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1


# ---------------------------------------------------------------------- pinned by the localization
def _closed_form_ratio(h: np.ndarray, lr: float, nb: float, gamma: float, steps: int) -> float | None:
    """E ||w - w*||^2 of full-batch SGLD on the quadratic loss (test_llc's Gaussian autoregression:
    variance 1 / (a (1 - lr a / 4)) along each eigenvector, a = nb l + gamma), over d / gamma, rooted;
    None when the slowest direction (decay lr a / 2 a step) has not relaxed within `steps`."""
    a = nb * np.clip(np.linalg.eigvalsh(h), 0, None) + gamma
    if lr * a.min() / 2 * steps < 6:
        return None
    return float(np.sqrt(np.sum(1 / (a * (1 - lr * a / 4))) / (len(a) / gamma)))


def _wide_target():
    # 256 parameters: one chain's distance spreads by ~1/sqrt(2 d) = 4%, well inside the 10% band
    x, y, w = _problem(256)
    model = Regular(w).double()
    return Target("wide", model, _row_loss(x, y), N, float(0.5 * ((y - y.mean()) ** 2).mean())), _hessian(model, x)


def test_pinned_settings_fail_unpinned_as_the_closed_form_says_and_are_never_recommended():
    """At the defaults the calibration recommended lr 3e-7 / localization 1e5 on a p=53 transformer
    whose chains sat at sqrt(d/gamma), and `analyze --metric llc` then flagged exactly that setting
    pinned at every checkpoint (issue 43). The same rule now is a check of the calibration."""
    from groklens.analyses.llc import default_nbeta
    from groklens.analyses.llc_calibrate import format_table

    target, h = _wide_target()
    nb0 = default_nbeta(N)
    cal = sweep([target], lrs=(1e-4, 1e-3, 1e-2), nbetas=(0.1 * nb0, nb0), localizations=(1.0, 100.0), chains=4,
                burnin=200, draws=200, minibatch=N)
    seen = set()
    for s, (lr, nb, gamma) in enumerate(cal.settings):
        r = cal.results[0][s]
        want = _closed_form_ratio(h, lr, nb, gamma, 400)
        if want is None:
            continue
        assert r["finite"] and abs(r["distance_ratio"] - want) < 0.05  # measured against the closed form
        if abs(abs(want - 1) - 0.1) > 0.03:  # clear of the band's edge: the flag is the closed form's
            assert r["pinned"] == (abs(want - 1) <= 0.1) and r["unpinned"] != r["pinned"]
            seen.add(bool(r["pinned"]))
    assert seen == {True, False}  # the grid has both
    assert cal.recommended is not None and not cal.results[0][cal.recommended]["pinned"]
    table = format_table(cal, 0).splitlines()
    assert all(("PINNED" in ln) == bool(cal.results[0][s]["pinned"]) for s, ln in enumerate(table[2:]))

    # a grid whose every setting is pinned (0.1 n/log n at localization 100: closed-form ratios 0.97-1.0)
    # passes the other checks of a setting (finite, converged, agree, positive, local): one was recommended;
    # now nothing is, and the note says what to try
    only = sweep([target], lrs=(1e-4, 3e-4, 1e-3), nbetas=(0.1 * nb0,), localizations=(100.0,), chains=4,
                 burnin=200, draws=200, minibatch=N)
    assert all(r["pinned"] and all(r[c] for c in HEALTH if c != "unpinned") for r in only.results[0])
    assert only.recommended is None and only.recommended_setting() is None
    assert "pinned by the localization" in only.rule_note and "smaller localization" in only.rule_note
    assert "recommended: none (no recommendation: every setting that converged and stayed local" \
        in format_calibration(only)
    # its trace figure marks every panel pinned, and says what the mark means
    fig = figure(only, 0)
    titles = [a.get_title() for a in fig.axes if a.get_title()]
    assert titles and all(t.endswith("PINNED") for t in titles)
    assert "PINNED" in fig.get_suptitle() and "never recommended" in fig.get_suptitle()

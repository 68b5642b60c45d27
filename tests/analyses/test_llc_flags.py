"""LLC estimates flagged negative or pinned by the localization: a warning and a mark in analyze,
the compare / report tables and fig_llc; a prompt to calibrate where the defaults ran (issue 43)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from groklens.analyses.runner import LLC_CALIBRATE_PROMPT
from tests.helpers import groklens, train_tiny

QUICK = ["--param", "llc.chains=2", "--param", "llc.draws=40", "--param", "llc.burnin=20"]
# nbeta ~0: the loss does not move the chains, the localization alone holds them (measured: mean
# distance / sqrt(d / gamma) = 1.009 here); lr 1e-4 and gamma 1000 equilibrate in ~20 steps
PINNED = ["--param", "llc.nbeta=0.001", "--param", "llc.lr=0.0001", "--param", "llc.localization=1000"]
# at initialisation a strong pull of the loss (nbeta 1e4) and little noise find lower loss than w*
NEGATIVE = ["--param", "llc.nbeta=10000", "--param", "llc.lr=0.000001", "--param", "llc.localization=1"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("llc") / "r.h5"
    train_tiny(path, steps=200, eval_every=20, checkpoint_every=100)
    return path


def _analyze(run, *extra):
    out = groklens("analyze", str(run), "--metric", "llc", "--checkpoints", "0,200", "--recompute", "-q", "--json",
                   *QUICK, *extra, check=True)
    return json.loads(out.stdout)["llc"], out.stderr


def test_chains_pinned_by_the_localization_are_flagged_warned_once_and_marked(run, tmp_path):
    llc, err = _analyze(run, *PINNED)
    for dist, d in zip(llc["distance"], llc["n_params"]):
        ratio = np.mean(dist) / math.sqrt(d / 1000)  # where the localization alone holds a chain
        assert abs(ratio - 1) <= 0.1
    assert llc["pinned"] == [1, 1]  # (its sign is noise here: nbeta ~0)
    assert err.count("pinned by the localization at every checkpoint") == 1
    assert LLC_CALIBRATE_PROMPT not in err  # lr and localization were chosen
    table = groklens("analyze", str(run), "--metric", "llc", "--checkpoints", "0,200", "-q", *QUICK, *PINNED,
                     check=True).stdout
    assert "pinned=1" in table  # the mark in analyze's own output
    # compare's analyses table marks the end checkpoint's llc, and says what the mark means
    text = groklens("compare", str(run), check=True).stdout
    assert any("‡" in ln for ln in text.splitlines() if "learning coefficient" in ln.lower() or "llc" in ln.lower())
    assert "pinned by the localization" in text
    # fig_llc: an X at each flagged estimate (a triangle on the floor line where it is <= 0), on a log axis
    from groklens.analyses.compare import compare
    from groklens.analyses.report_figures import llc_flag_lines

    comp = compare([run])
    lines = llc_flag_lines(comp.groups, ["C0"])
    assert list(lines[0].x) == [200] and lines[0].marker == "X"  # step 0 is not drawn (log x)
    assert lines[-1].label == "flagged: negative or pinned" and not len(lines[-1].x)  # the legend's entry
    # drawn large enough to see beside the line's own dots, edged, named in the LLC panel's legend;
    # the estimate and its spread on log axes
    from groklens.analyses.report_figures import make_figures

    (fig,) = [f.figure for f in make_figures(comp)[0] if f.name == "llc"]
    _acc, llc_panel, spread_panel = fig.axes
    assert llc_panel.get_yscale() == "log" and spread_panel.get_yscale() in ("log", "linear")
    shape = "X" if llc["llc_mean"][1] > 0 else "v"  # (its sign is noise here)
    marks = [ln for ln in llc_panel.get_lines() if ln.get_marker() == shape and len(ln.get_xdata())]
    assert [list(m.get_xdata()) for m in marks] == [[200]] and marks[0].get_markersize() >= 7
    assert marks[0].get_markeredgecolor() == "black"
    assert "flagged: negative or pinned" in [t.get_text() for t in llc_panel.get_legend().get_texts()]
    rep = tmp_path / "rep"
    groklens("report", str(run), "-o", str(rep), "--figures", "llc", check=True)
    assert (rep / "fig_llc.png").exists() and "‡" in (rep / "index.html").read_text()


def test_a_negative_estimate_is_flagged_and_warned(run):
    llc, err = _analyze(run, *NEGATIVE)
    assert llc["llc_mean"][0] < 0 and llc["negative"][0] == 1 and llc["pinned"] == [0, 0]
    assert "llc is negative at step(s) 0" in err and "pinned" not in err


def test_the_defaults_ask_for_a_calibration_on_a_new_architecture(run):
    _, err = _analyze(run)
    assert err.count(LLC_CALIBRATE_PROMPT) == 1

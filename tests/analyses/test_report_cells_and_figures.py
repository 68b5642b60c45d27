"""The comparison and report a new user reads (issue 28): phase checkpoints analyzed with
`--every`, a reason for every empty cell, eps-dependent values marked, one clean eps line,
figures chosen and sized for a paper, panel labels at the event's own step, and the docs'
figure table and `reproduce --list` consistent with the code."""

from __future__ import annotations

import html
import os
import re
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from groklens.analyses import compute
from groklens.analyses.compare import compare
from groklens.analyses.report_figures import FIGURE_NAMES, chosen_checkpoints
from groklens.checkpoints import Trajectory, sidecar_path
from tests.helpers import groklens, train_tiny

ROOT_DIR = __import__("pathlib").Path(__file__).resolve().parents[2]
MEMORIZES = dict(steps=200, lr=1e-2, norm="ln")  # train accuracy >= 0.95 at step 60, >= 0.99 at 70


def _first(run: Trajectory, key: str, t: float = 0.95) -> int | None:
    hit = np.nonzero(run.metrics[key] >= t)[0]
    return int(run.metrics["step"][hit[0]]) if len(hit) else None


@pytest.fixture(scope="module")
def ln_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("fh") / "ln.h5"
    train_tiny(path, **MEMORIZES)
    return path


def test_analyze_every_includes_the_phase_checkpoints(ln_run, tmp_path):
    path = tmp_path / "r.h5"
    path.write_bytes(ln_run.read_bytes())
    run = Trajectory(path)
    mem = _first(run, "train_acc")
    steps = [int(s) for s in run.steps]
    assert mem is not None and mem in steps and mem not in steps[::5]  # only the phase rule brings it in
    groklens("analyze", str(path), "--metric", "norms", "--every", "5", "-q", check=True)
    with h5py.File(sidecar_path(path), "r") as f:
        (variant,) = f["analyses/norms"].values()
        stored = {int(s) for s in variant["steps"][:]}
    assert stored >= set(steps[::5]) | {steps[-1], mem}
    groklens("analyze", str(path), "--metric", "attention", "--checkpoints", "20", "-q", check=True)
    with h5py.File(sidecar_path(path), "r") as f:
        (variant,) = f["analyses/attention"].values()
        assert [int(s) for s in variant["steps"][:]] == [20]  # explicit checkpoints stay exact


def test_every_dash_has_its_reason_in_the_table_and_on_the_page(ln_run, tmp_path):
    path = tmp_path / "r.h5"
    path.write_bytes(ln_run.read_bytes())
    last = int(Trajectory(path).steps[-1])
    compute(Trajectory(path), "attention", steps=[last])  # stored at the end only
    table = compare([path]).format("table")
    lines = table.splitlines()
    dash = [line for line in lines if line.startswith("— ")]
    assert dash and all(len(line) <= 100 for line in lines if line.startswith(("— ", "    ")))
    assert any("r at memorization" in d and "'attention' not stored at that checkpoint" in d for d in dash), table
    assert "reasons below" in table and table.index("reasons below") < table.index(dash[0])
    missing = table.split("missing: ", 1)[1].splitlines()
    assert all(len(line) <= 100 for line in missing[:6]) and "computes them" in table
    groklens("report", str(path), "-o", str(tmp_path / "rep"), "-q", check=True)
    page = html.unescape((tmp_path / "rep" / "index.html").read_text())
    notes = page.split('id="analyses-notes"', 1)[1].split("</ul>", 1)[0]
    assert "r at memorization" in notes and "not stored at that checkpoint" in notes


def test_eps_dependent_values_are_marked_exactly_where_the_sidecar_flags_them(ln_run, tmp_path):
    paths = [tmp_path / "ln.h5", tmp_path / "none.h5"]
    paths[0].write_bytes(ln_run.read_bytes())
    train_tiny(paths[1], **{**MEMORIZES, "norm": "none"})
    out = groklens("report", *map(str, paths), "-o", str(tmp_path / "rep"), "--analyze", "--metric", "radial",
                   "--group-by", "run", check=True)
    warn = [line for line in out.stderr.splitlines() if "warning" in line.lower()]
    assert warn == [line for line in warn if line.startswith("groklens: ln.h5: warning: radial at ")], out.stderr
    assert len(warn) == 1 and "EpsDependenceWarning" not in out.stderr and "warnings.warn" not in out.stderr
    comp = compare(paths)
    rows = {g.runs[0].name: row for g, row in zip(comp.groups, comp.rows())}
    for run_path in paths:  # independently: the stored flags at each phase checkpoint, read with h5py
        r = next(r for g in comp.groups for r in g.runs if r.path == run_path)
        with h5py.File(sidecar_path(run_path), "r") as f:
            (variant,) = f["analyses/radial"].values()
            steps = [int(s) for s in variant["steps"][:]]
            site = r.value_keys["radius"].partition("@")[2]
            flags = variant[f"eps_dependent@{site}"][:]
        for ph, step in r.phase_steps.items():
            want = step is not None and step in steps and bool(flags[steps.index(step)])
            assert rows[r.name]["analyses"]["radius"][ph]["eps_dependent"] == want, (r.name, ph)
            assert rows[r.name]["analyses"]["rho_baseline"][ph]["eps_dependent"] is False  # 1/d: no eps
    assert any(rows["ln"]["analyses"]["radius"][ph]["eps_dependent"] for ph in ("memorization", "end"))
    assert not any(rows["none"]["analyses"]["radius"][ph]["eps_dependent"] for ph in rows["none"]["analyses"]["radius"])
    table = comp.format("table")
    assert "†" in table and "† = set by a scale-invariant norm's eps" in table
    page = html.unescape((tmp_path / "rep" / "index.html").read_text())
    assert "†" in page.split('id="analyses"', 1)[1] and "set by a scale-invariant norm's eps" in page


def test_figures_for_a_paper_and_one_figure_at_a_time(ln_run, tmp_path):
    from matplotlib.image import imread

    rep = tmp_path / "rep"
    groklens("report", str(ln_run), "-o", str(rep), "--figures", "curves,fig_grokking_times", "--style", "paper",
             "--width", "3.25", "--font-size", "7", "-q", check=True)
    assert sorted(p.name for p in rep.glob("fig_*")) == ["fig_curves.png", "fig_grokking_times.png"]
    for name in ("fig_curves.png", "fig_grokking_times.png"):
        assert imread(rep / name).shape[1] == round(3.25 * 300)  # 3.25 in at 300 dpi
    page = (rep / "index.html").read_text()
    assert "Hessian" not in page.split("Missing figures", 1)[1]  # only the chosen figures' entries
    for args, msg in ((["--figures", "curvez"], "--figures takes figure names"),
                      (["--width", "3"], "give --style paper too")):
        out = groklens("report", str(ln_run), "-o", str(tmp_path / "bad"), *args)
        assert out.returncode == 2 and msg in out.stderr and len(out.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("args, msg", [(["--width", "999"], "--width must be a number from 1 to 20; got 999.0"),
                                       (["--width", "0.1"], "--width must be a number from 1 to 20"),
                                       (["--font-size", "500"], "--font-size must be a number from 4 to 36")])
def test_paper_figure_sizes_are_limited(tmp_path, args, msg):
    """--width 999 passed (anything under 1000 did) and died of MemoryError drawing the figures
    (120 in reached 5.4 GB). Checked before the runs are read: a missing run is not the error."""
    out = groklens("report", str(tmp_path / "none.h5"), "-o", str(tmp_path / "rep"), "--style", "paper", *args,
                   timeout=60)
    assert out.returncode == 2 and msg in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "rep").exists()


def test_paper_figure_scales_width_and_text():
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    from groklens.analyses.report import paper_figure

    fig = Figure(figsize=(8, 4))
    ax = fig.add_subplot()
    ax.set_title("t", fontsize=10)
    ax.set_xlabel("x", fontsize=8)
    paper_figure(fig, width_in=4.0, font_pt=6.0)
    assert np.allclose(fig.get_size_inches(), [4.0, 2.0])
    sizes = {t.get_text(): t.get_fontsize() for t in fig.findobj(Text) if t.get_text() in ("t", "x")}
    assert sizes == {"t": 7.5, "x": 6.0}


def test_panel_labels_name_the_events_own_step():
    run = SimpleNamespace(memorization=50, grokking=1250, checkpoints=[0, 50, 1300, 3000])
    labels = [label for _, label in chosen_checkpoints(run, [0, 50, 1300, 3000], None)]
    assert labels == ["step 0 (start)", "step 50 (memorized)", "step 1300 (grokked at 1250)", "step 3000 (end)"]
    run.grokking = 1300
    assert "step 1300 (grokked)" in [lbl for _, lbl in chosen_checkpoints(run, [0, 50, 1300, 3000], None)]


def test_cli_md_lists_every_figure_the_report_makes():
    text = (ROOT_DIR / "docs" / "CLI.md").read_text()
    table = text.split("## report", 1)[1].split("## demo", 1)[0]
    listed = set(re.findall(r"^\| `fig_([a-z0-9_]+)` \|", table, flags=re.M))
    assert listed == set(FIGURE_NAMES)


def test_reproduce_list_times_agree_with_their_basis():
    from groklens.experiments.pipeline import format_listing, listing

    items = listing(measure=False)
    cores = os.cpu_count() or 1
    text = format_listing(items)
    seen = 0
    for it in items:
        for s in it["scales"].values():
            m = s["measured"]
            if s["fits_basis"].startswith("measured"):  # all runs at the measured mean, on this CPU's cores
                kind = s["fits_basis"].split()[1]
                assert s["seconds_here"] == pytest.approx(m[kind]["mean_s"] * s["runs"] / cores)
                seen += 1
            else:
                assert s["seconds_here"] == pytest.approx(s["cpu_seconds_expected"] / cores)
    demo = next(it for it in items if it["name"] == "demo")["scales"]["quick"]
    # the demo stops after grokking: costed to its expected stop, below the cap
    assert demo["stop_basis"]["expected"] == demo["runs"] and demo["cpu_seconds_expected"] < demo["cpu_seconds_cap"]
    assert seen or "(measured" not in text

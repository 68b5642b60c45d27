"""Every report figure renders from a real small trajectory, draws what it is given, and returns
its Figure without touching pyplot's global state."""

from __future__ import annotations

import numpy as np
import pytest
from groklens.analyses import figures as F
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from tests.analyses.test_compare import make_runs

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Real tiny runs, with analyses stored along their checkpoints."""
    from groklens.analyses import compute

    paths = make_runs(tmp_path_factory.mktemp("figures"))
    for key in ("ln_s1", "sphere_s1"):
        for name in ("fourier", "attention", "rank", "radial"):
            compute(paths[key], name)
        compute(paths[key], "sharpness", every=2, top_k=2, trace_samples=5)
    return paths


def render(fig: Figure, tmp_path, name: str) -> bytes:
    assert isinstance(fig, Figure)
    path = tmp_path / f"{name}.png"
    fig.savefig(path, dpi=60)
    data = path.read_bytes()
    assert data.startswith(PNG) and len(data) > 2000
    return data


def curves(path) -> F.RunCurves:
    from groklens.checkpoints import Trajectory

    m = Trajectory(path).metrics
    keep = m["step"] > 0
    return F.RunCurves(m["step"][keep], m["train_acc"][keep], m["test_acc"][keep], m["train_loss"][keep],
                       m["test_loss"][keep], grok_step=float(m["step"][keep][np.argmax(m["test_acc"][keep])]))


def test_training_curves(runs, tmp_path):
    ln = [curves(runs["ln_s1"]), curves(runs["ln_s2"])]
    mean = F.RunCurves(ln[0].steps, *(np.mean([getattr(c, k) for c in ln], axis=0)
                                      for k in ("train_acc", "test_acc", "train_loss", "test_loss")))
    variants = [F.VariantCurves("norm=ln", ln, mean), F.VariantCurves("sphere", [curves(runs["sphere_s1"])])]
    fig = F.training_curves(variants, threshold=0.95)
    render(fig, tmp_path, "curves")
    acc, loss = fig.axes[:2]
    assert acc.get_xscale() == "log" and loss.get_yscale() == "log"
    drawn = [ln for ln in acc.get_lines() if len(ln.get_xdata())]
    widths = sorted({ln.get_linewidth() for ln in drawn if ln.get_linestyle() in ("-", "--")})
    assert widths == [F.THIN["lw"], F.BOLD["lw"]]  # seeds thin, the mean (and a lone run) bold
    # train + test per seed (3 runs) and for the mean, plus one grokking dot per run
    assert sum(ln.get_linestyle() in ("-", "--") for ln in drawn) == 2 * 3 + 2
    assert sum(ln.get_marker() == "o" for ln in drawn) == 3
    assert {t.get_text() for t in acc.get_legend().get_texts()} >= {"norm=ln (n=2)", "sphere (n=1)"}
    # drawing into given axes returns their figure
    host = Figure()
    axes = host.subplots(2, 1)
    assert F.training_curves(variants, ax=axes) is host
    with pytest.raises(ValueError):
        F.training_curves(variants, ax=axes[0])


def test_a_sweep_of_many_variants_keeps_its_layout(runs, tmp_path):
    """Past LEGEND_MAX_VARIANTS (the palette's colours) the legend holds one entry for all of them,
    not one each: a scaling-law grid of 96 cells had a legend taller than the figure, which
    collapsed the constrained layout (a warning, the panels drawn at no size)."""
    import warnings

    one = curves(runs["ln_s1"])
    many = [F.VariantCurves(f"lr={i}e-3 train_frac=0.5 weight_decay=1", [one]) for i in range(40)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = F.training_curves(many, threshold=0.95)
        render(fig, tmp_path, "curves_many")
    texts = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert len(texts) <= 5 and texts[0].startswith("40 variants")
    assert min(a.get_position().height for a in fig.axes[:2]) > 0.2  # the panels keep their size
    few = F.training_curves(many[:F.LEGEND_MAX_VARIANTS])
    assert sum("n=1" in t.get_text() for t in few.axes[0].get_legend().get_texts()) == F.LEGEND_MAX_VARIANTS


def test_a_mean_that_ends_at_a_stopped_seed_is_marked(runs, tmp_path):
    """A seed that stopped early (its stop rule) ends the mean over seeds; the end is a dotted
    vertical line in the group's colour on both panels, named in the legend; a mean that runs
    as long as its seeds gets none."""
    whole, cut = curves(runs["ln_s1"]), curves(runs["ln_s2"])
    k = len(cut.steps) // 2
    cut = F.RunCurves(*(getattr(cut, f)[:k] for f in ("steps", "train_acc", "test_acc", "train_loss", "test_loss")))
    mean = F.RunCurves(cut.steps, *(np.mean([getattr(whole, f)[:k], getattr(cut, f)], axis=0)
                                    for f in ("train_acc", "test_acc", "train_loss", "test_loss")))
    fig = F.training_curves([F.VariantCurves("norm=ln", [whole, cut], mean, "#d62728")])
    render(fig, tmp_path, "curves_cut")
    end = float(cut.steps[-1])
    assert end < whole.steps[-1]
    for a in fig.axes[:2]:
        marks = [ln for ln in a.get_lines() if list(ln.get_xdata()) == [end, end]]
        assert len(marks) == 1 and marks[0].get_color() == "#d62728"
    assert "the mean ends: a seed\nstopped there" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    even = F.training_curves([F.VariantCurves("norm=ln", [whole, whole], whole)])
    assert not [ln for a in even.axes for ln in a.get_lines() if len(ln.get_xdata()) == 2
                and len(set(ln.get_xdata())) == 1]  # no vertical line
    assert "the mean ends" not in " ".join(t.get_text() for t in even.axes[0].get_legend().get_texts())


def test_grokking_times_marks_censored(tmp_path):
    fig = F.grokking_times(["a", "b"], [[1200, 900], [300, 8000]], [[False, False], [False, True]],
                           means=[1050, None])
    render(fig, tmp_path, "times")
    ax = fig.axes[0]
    censored = [ln for ln in ax.get_lines() if ln.get_marker() == ">" and len(ln.get_xdata())]
    assert len(censored) == 1 and list(censored[0].get_xdata()) == [8000]
    assert censored[0].get_markerfacecolor() == "none"
    grokked = [ln for ln in ax.get_lines() if ln.get_marker() == "o" and len(ln.get_xdata())]
    assert sorted(x for ln in grokked for x in ln.get_xdata()) == [300, 900, 1200]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"] and ax.get_xscale() == "log"


def _series(path, analysis, key, reduce=lambda a: float(np.asarray(a).reshape(-1)[0])):
    from groklens.analyses.store import Sidecar

    sc = Sidecar(path)
    (variant, _), = sc.variants(analysis)
    st = sc.read(analysis, variant)
    steps = np.asarray(st.steps)
    vals = np.array([reduce(v) for v in st.values[key]])
    keep = steps > 0
    return steps[keep], vals[keep]


def test_aligned_panels_share_the_step_axis(runs, tmp_path):
    acc = []
    panels = [F.Panel("FVE", []), F.Panel("rho", [], hlines=[(1 / 32, "black", "1/d")]),
              F.Panel("top eigenvalue", [], yscale="log")]
    for i, key in enumerate(("ln_s1", "sphere_s1")):
        c = curves(runs[key])
        acc.append(F.Line(c.steps, c.test_acc, F.colour(i), key, bold=True))
        panels[0].lines.append(F.Line(*_series(runs[key], "fourier", "neuron_fve"), F.colour(i)))
        panels[1].lines.append(F.Line(*_series(runs[key], "radial", "rho@blocks.0.hook_resid_post"), F.colour(i)))
        panels[2].lines.append(F.Line(*_series(runs[key], "sharpness", "top_eigenvalues"), F.colour(i)))
    fig = F.aligned_panels(acc, panels, title="t", threshold=0.95, marks=[(60.0, "red")])
    render(fig, tmp_path, "aligned")
    axes = fig.axes
    assert len(axes) == 4
    assert all(a.get_xscale() == "log" for a in axes)
    assert all(axes[0].get_shared_x_axes().joined(axes[0], a) for a in axes)
    assert axes[3].get_yscale() == "log" and axes[0].get_ylabel() == "test accuracy"
    # the 1/d reference line and the grokking mark in every panel
    assert any(list(ln.get_ydata()) == [1 / 32, 1 / 32] for ln in axes[2].get_lines())
    assert all(any(list(ln.get_xdata()) == [60.0, 60.0] for ln in a.get_lines()) for a in axes)


def test_spectrum_and_cluster_grids(runs, tmp_path):
    from groklens.analyses.store import Sidecar

    sc = Sidecar(runs["sphere_s1"])
    (variant, _), = sc.variants("fourier")
    st = sc.read("fourier", variant)
    power = np.asarray([st.values["embedding_power"][i] for i in (0, -1)], dtype=float)  # [2, p//2]
    freqs = np.arange(1, power.shape[1] + 1)
    grid = np.stack([power, np.full_like(power, np.nan)])[:, :, :]  # row 2: no checkpoints (NaN)
    grid[1, 0] = power[0]
    labels = [["start", "end"], ["start", "never"]]
    keys = [[[], [int(k) for k in np.asarray(st.values["key_frequencies"][-1]).reshape(-1)]], [[], []]]
    fig = F.spectrum_grid(freqs, grid, ["sphere", "other"], labels, key_frequencies=keys)
    render(fig, tmp_path, "spectrum")
    axes = np.asarray(fig.axes).reshape(2, 2)
    assert not axes[1, 1].axison  # a missing checkpoint is an empty cell
    bars = axes[0, 1].patches
    assert len(bars) == len(freqs)
    assert [b.get_height() for b in bars] == pytest.approx(power[1])
    nf = np.asarray(st.values["neuron_frequency"][-1]).astype(int)
    fr = np.asarray(st.values["neuron_fraction"][-1], dtype=float)
    clustered = (fr >= 0.85) & (nf >= 1)
    counts = np.bincount(nf[clustered], minlength=len(freqs) + 1)[1:].astype(float)
    fig = F.cluster_grid(freqs, counts[None, None, :], np.array([[float((~clustered).sum())]]), ["sphere"],
                         [["end"]], threshold=0.85)
    render(fig, tmp_path, "clusters")
    a = fig.axes[0]
    assert [b.get_height() for b in a.patches] == pytest.approx(counts)
    assert any(t.get_text() == f"unclustered: {int((~clustered).sum())}" for t in a.texts)


LONG_LABELS = ["act_norm_lambda=0 norm=none unembed=linear (run act_norm_lambda=0.0__seed=1)",
               "act_norm_lambda=1 norm=none unembed=linear (run act_norm_lambda=1.0__seed=1)",
               "act_norm_lambda=0 norm=sphere unembed=bounded (run norm=sphere__unembed=bounded__seed=1)"]


@pytest.mark.parametrize("kind", ["spectrum", "clusters"])
def test_long_row_labels_stay_inside_the_figure_and_off_each_other(tmp_path, kind):
    """Row labels as long as a real study's (three fields and the run's name) neither overlap one
    another or any panel nor run past the figure's edge, with 2 columns as with 4."""
    freqs = np.arange(1, 12)
    for n_cols in (2, 4):
        values = np.random.default_rng(0).random((3, n_cols, len(freqs)))
        cols = [[f"step {k}" for k in range(n_cols)]] * 3
        fig = (F.spectrum_grid(freqs, values / values.sum(-1, keepdims=True), LONG_LABELS, cols) if kind == "spectrum"
               else F.cluster_grid(freqs, np.round(values * 5), np.zeros((3, n_cols)), LONG_LABELS, cols))
        render(fig, tmp_path, f"{kind}{n_cols}")
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        renderer = canvas.get_renderer()
        labels = [t for t in fig.findobj(lambda a: hasattr(a, "get_text")) if t.get_text().replace("\n", " ")
                  in LONG_LABELS]
        assert len(labels) == 3
        boxes = [t.get_window_extent(renderer) for t in labels]
        page = fig.bbox
        for i, b in enumerate(boxes):
            assert page.x0 <= b.x0 and b.x1 <= page.x1 and page.y0 <= b.y0 and b.y1 <= page.y1
            assert not any(b.overlaps(o) for o in boxes[i + 1:])
            assert not any(b.overlaps(a.get_tightbbox(renderer)) for a in fig.axes if a.axison)


SWEEP_NAMES = ["act_norm_lambda=0.0__norm=none__unembed=linear__seed=0",
               "act_norm_lambda=0.0__norm=sphere__unembed=bounded__seed=0",
               "act_norm_lambda=1.0__norm=none__unembed=linear__seed=0"]


@pytest.mark.parametrize("kind", ["parameter_pca", "hessian_density"])
def test_per_run_panel_titles_stay_over_their_panels(tmp_path, kind):
    """A sweep's run names (no spaces) as the titles of panels side by side: each title whole (the
    name's text, broken only after a `__`), inside the figure and off its neighbours (the study of
    issue 43 drew them across one another)."""
    rng = np.random.default_rng(0)
    if kind == "parameter_pca":
        fig = F.parameter_paths([F.PcaPath(n, np.arange(0, 500, 100), rng.normal(size=(5, 2)),
                                           np.array([0.6, 0.3]), ["memorization"] + ["circuit formation"] * 4)
                                 for n in SWEEP_NAMES])
    else:
        grid = np.linspace(-1, 5, 50)
        fig = F.eigenvalue_densities([(n, [F.DensityCurve("step 0", grid, np.exp(-grid ** 2))]) for n in SWEEP_NAMES])
    render(fig, tmp_path, kind)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    titles = [a.title for a in fig.axes]
    assert [t.get_text().replace("\n", "") for t in titles] == SWEEP_NAMES
    assert all(line.endswith("__") for t in titles for line in t.get_text().split("\n")[:-1])
    boxes = [t.get_window_extent(renderer) for t in titles]
    page = fig.bbox
    for i, b in enumerate(boxes):
        assert page.x0 <= b.x0 and b.x1 <= page.x1 and b.y1 <= page.y1
        assert not any(b.overlaps(o) for o in boxes[i + 1:])


def test_attention_pattern_grid(runs, tmp_path):
    from groklens.analyses.store import Sidecar

    sc = Sidecar(runs["ln_s1"])
    (variant, _), = sc.variants("attention")
    st = sc.read("attention", variant)
    first, last = (np.asarray(st.values["pattern"][i], dtype=float)[-1] for i in (0, -1))  # [H, n_ctx]
    # the readout query attends over the 3 positions (a, b, =): each head's row is a distribution
    np.testing.assert_allclose(last.sum(axis=-1), 1.0, rtol=1e-5)
    grid = np.full((1, 3, *first.shape), np.nan)
    grid[0, 0], grid[0, 1] = first, last  # column 3: no checkpoint
    fig = F.pattern_grid(grid, ["ln"], [["start", "end", "never"]], ["a", "b", "="], ["head 0", "head 1"])
    render(fig, tmp_path, "patterns")
    maps = [a for a in fig.axes if a.images]
    assert len(maps) == 2
    np.testing.assert_allclose(maps[1].images[0].get_array(), last)
    assert [t.get_text() for t in maps[0].get_xticklabels()] == ["a", "b", "="]
    assert not [a for a in fig.axes if a.get_title() == "never"][0].axison


def test_figures_leave_pyplot_alone(runs, tmp_path):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    F.grokking_times(["a"], [[10]], [[False]])
    F.training_curves([F.VariantCurves("x", [curves(runs["ln_s1"])])])
    assert plt.get_fignums() == before


def test_spread_over_seeds_draws_every_seed_the_median_and_the_marked_values(tmp_path):
    steps = np.array([10, 20, 30])
    seeds = [np.array([0.1, 0.4, 0.6]), np.array([0.2, 0.3, 0.9]), np.array([0.0, 0.5, 0.7])]
    med = np.median(np.stack(seeds), axis=0)
    group = F.SeedSpread("sphere", "#1f77b4", [(steps, v) for v in seeds],
                         (steps, med, np.min(seeds, axis=0), np.max(seeds, axis=0)), [(20, 0.4), (30, 0.9), (20, 0.5)])
    empty = F.SeedSpread("ln", "#d62728", [(steps, seeds[0])], None, [])
    fig = F.spread_over_seeds([group, empty], ylabel="FVE", mark_label="test accuracy >= 0.99")
    render(fig, tmp_path, "spread")
    left, right = fig.axes
    drawn = [ln for ln in left.get_lines() if len(ln.get_xdata()) == 3 and ln.get_marker() in ("None", None, "")]
    assert len(drawn) == 4 + 1  # three seeds and the median of one group, one seed of the other
    assert any(np.allclose(ln.get_ydata(), med) and ln.get_linewidth() > 2 for ln in drawn)
    dots = [ln for ln in right.get_lines() if ln.get_marker() == "o"]
    assert len(dots) == 1 and sorted(dots[0].get_ydata()) == [0.4, 0.5, 0.9]
    bars = [ln for ln in right.get_lines() if ln.get_marker() in ("None", None, "")]
    assert len(bars) == 1 and list(bars[0].get_ydata()) == [0.5, 0.5]
    assert [t.get_text() for t in right.get_xticklabels()] == ["sphere", "ln"]

    # whole labels: rows that differ only after their first field stay apart
    twins = [F.SeedSpread(f"act_norm_lambda=0 norm={n} unembed={u}", c, [(steps, seeds[0])], None, [])
             for n, u, c in (("none", "linear", "#1f77b4"), ("sphere", "bounded", "#d62728"))]
    right = F.spread_over_seeds(twins, ylabel="FVE", mark_label="test accuracy >= 0.99").axes[1]
    assert [t.get_text() for t in right.get_xticklabels()] == ["act_norm_lambda=0\nnorm=none\nunembed=linear",
                                                               "act_norm_lambda=0\nnorm=sphere\nunembed=bounded"]


@pytest.mark.parametrize("n_groups", [2, 3, 6])
def test_the_spread_figures_group_labels_read_horizontally_apart_and_inside(tmp_path, n_groups):
    """The group labels under the right panel were turned upright at 6 pt (issue 43's study): now
    horizontal at 7 pt, wrapped at their spaces, whole, off each other and inside the figure."""
    steps = np.array([10, 20, 30])
    labels = [f"act_norm_lambda={i % 2} norm={('none', 'sphere', 'ln')[i % 3]} unembed=linear seed_group={i}"
              for i in range(n_groups)]
    groups = [F.SeedSpread(lbl, F.colour(i), [(steps, np.array([0.1, 0.4, 0.6]))], None, [(20, 0.4)])
              for i, lbl in enumerate(labels)]
    fig = F.spread_over_seeds(groups, ylabel="FVE", mark_label="test accuracy >= 0.99")
    render(fig, tmp_path, f"spread{n_groups}")
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    ticks = fig.axes[1].get_xticklabels()
    assert [t.get_text().replace("\n", " ") for t in ticks] == labels
    assert all(t.get_rotation() == 0 and t.get_fontsize() >= 7 for t in ticks)
    boxes = [t.get_window_extent(renderer) for t in ticks]
    for i, b in enumerate(boxes):
        assert fig.bbox.x0 <= b.x0 and b.x1 <= fig.bbox.x1 and fig.bbox.y0 <= b.y0
        assert not any(b.overlaps(o) for o in boxes[i + 1:])


def test_an_empty_cluster_panel_says_so_and_counts_in_whole_neurons(tmp_path):
    """Panels with no clustered neuron drew an empty box with ticks 0, 0.5, 1.0, ... (a count of
    half a neuron); every neuron-count axis now ticks at integers and an empty panel says so."""
    freqs = np.arange(1, 12)
    counts = np.zeros((2, 2, len(freqs)))
    counts[0, 1, 3] = 2  # row 0: an empty panel beside one with 2 neurons (its axis up to 2.3)
    fig = F.cluster_grid(freqs, counts, np.full((2, 2), 30.0), ["a", "b"], [["start", "end"]] * 2)
    render(fig, tmp_path, "empty_clusters")
    FigureCanvasAgg(fig).draw()
    for a in fig.axes:
        ticks = [t for t in a.get_yticks() if a.get_ylim()[0] <= t <= a.get_ylim()[1]]
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks)
    says = ["no clustered neurons" in [t.get_text() for t in a.texts] for a in fig.axes]
    assert says == [True, False, True, True]


def test_the_progress_measures_legend_covers_no_curve(tmp_path):
    """The legend sat over the test-loss curve inside the panels (issue 43's study): one legend
    for every column, outside every panel."""
    steps = np.arange(0, 1000, 50)
    loss = np.exp(-steps / 300)
    panel = F.ProgressPanel("run", steps, loss, 3 * loss + 0.1, 100 + steps / 10, steps[::4], 0.5 * loss[::4],
                            np.full(5, 3.0), [(0, 200, "memorization"), (200, 600, "circuit formation"),
                                              (600, 950, "cleanup")], "fixed key set")
    fig = F.progress_measures([panel, panel])
    render(fig, tmp_path, "progress")
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    assert all(a.get_legend() is None for a in fig.axes)
    (legend,) = fig.legends
    box = legend.get_window_extent(renderer)
    assert [t.get_text() for t in legend.get_texts()] == ["train loss", "test loss", "restricted loss",
                                                          "excluded loss", "memorization", "circuit formation",
                                                          "cleanup"]
    assert not any(box.overlaps(a.get_window_extent(renderer)) for a in fig.axes)
    assert fig.bbox.y0 <= box.y0 and box.x1 <= fig.bbox.x1


def test_the_llc_panel_keeps_small_positive_estimates_apart_and_marks_the_rest():
    """On the symmetric-log axis every estimate below 1 sat at about 0, one group's on top of
    another's (issue 43's study); on a log axis 0.01 and 0.02 lie a factor 2 apart, and an estimate
    <= 0 leaves the line for a triangle on a floor below the smallest positive one."""
    from groklens.analyses.report_figures import NOT_POSITIVE, positive_log_panel

    x = np.array([100, 200, 300, 400])
    a = F.Line(x, np.array([0.01, 0.012, 0.011, 0.01]), "#1f77b4", "a", bold=True)
    b = F.Line(x, np.array([0.02, -3.0, 0.025, 8.0]), "#d62728", "b", bold=True)
    flag = F.Line(x[1:2], np.array([-3.0]), "#d62728", bold=True, style="none", marker="X", ms=9, edge="black")
    panel = positive_log_panel("LLC", [a, b], [flag])
    assert panel.yscale == "log"
    (floor, _, _), = panel.hlines
    assert 0 < floor < 0.01
    drawn_b = next(ln for ln in panel.lines if ln.label == "b")
    assert np.isnan(drawn_b.y[1]) and list(drawn_b.y[[0, 2, 3]]) == [0.02, 0.025, 8.0]
    low = [ln for ln in panel.lines if ln.marker == "v" and len(ln.x)]
    assert len(low) == 1 and list(low[0].x) == [200] and list(low[0].y) == [floor] and low[0].edge == "black"
    assert [ln.label for ln in panel.lines if ln.own_label] == [NOT_POSITIVE]
    assert not any(ln.marker == "X" and len(ln.x) and np.isfinite(ln.y).any() for ln in panel.lines)
    fig = F.aligned_panels([F.Line(x, np.array([0.5, 0.9, 1.0, 1.0]))], [panel], log_x=False)
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[1]
    to_px = ax.transData.transform
    gap = to_px((100, 0.02))[1] - to_px((100, 0.01))[1]
    assert ax.get_yscale() == "log" and gap > 0.05 * ax.bbox.height  # apart, not both at 0
    # all positive: a plain log axis, nothing moved
    assert positive_log_panel("LLC", [a], []).yscale == "log" and len(positive_log_panel("LLC", [a], []).lines) == 1


def test_the_fve_figure_reads_each_seed_at_its_first_crossing(tmp_path):
    """value_at_accuracy: the first evaluation at the accuracy (from the file's raw metrics) and
    the fourier analysis recomputed there on the checkpoint's model (not read from the sidecar)."""
    from groklens.analyses import compute
    from groklens.analyses.compare import load_run
    from groklens.analyses.fourier import fourier
    from groklens.analyses.report_figures import _key_for, stored_series, value_at_accuracy
    from groklens.checkpoints import Trajectory
    from tests.analyses.test_compare import BASE, raw_metrics
    from tests.helpers import tiny_config
    from groklens.trainers.train import train

    path = tmp_path / "r.h5"
    train(tiny_config(**{**BASE, "checkpoint_every": 10}, norm="sphere", unembed="bounded", seed=1), path,
          progress=False)
    compute(path, "fourier", every=1)
    run = load_run(path)
    series = stored_series(run, "fourier", _key_for(run, "fourier", "ls_fve_top_k"))
    raw = raw_metrics(path)
    acc = float(np.max(raw["test_acc"]))
    first = int(raw["step"][np.nonzero(raw["test_acc"] >= acc)[0][0]])
    traj = Trajectory(path)
    step, value = value_at_accuracy(run, series, acc)
    assert step == first and value == pytest.approx(fourier(traj.model(step), traj.dataset())["ls_fve_top_k"], abs=1e-9)
    assert value_at_accuracy(run, series, 1.01) is None  # never reached

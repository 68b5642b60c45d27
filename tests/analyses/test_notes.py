"""One line per kind of note per command, however many runs it holds for (issue 43)."""

from __future__ import annotations

from groklens.analyses.fourier import trivial_key_note
from groklens.analyses.notes import one_per_kind


def test_a_note_about_many_runs_is_one_line_naming_them():
    eps = [f"run{i}.h5: warning: radial at blocks.0.hook_resid_post depends on a scale-invariant norm's eps"
           for i in range(12)]
    keys = [f"run{i}.h5: warning: Nanda's key set holds more than half of the 11 frequencies ({6 + i % 3} at step "
            f"{100 * i} of 11): read the top-5 FVE" for i in range(12)]
    out = one_per_kind(eps + eps + keys + ["time: training 3 s"])  # each eps note twice (two checkpoint choices)
    assert len(out) == 3
    assert out[0].startswith("run0.h5: warning: radial") and "[and 11 more run(s) alike: run1.h5, run2.h5" in out[0]
    assert out[1].startswith("run0.h5: warning: Nanda's key set") and "11 more run(s)" in out[1]
    assert out[2] == "time: training 3 s"
    assert one_per_kind(["a.h5: x", "b.h5: y"]) == ["a.h5: x", "b.h5: y"]  # different kinds stay apart


def test_the_key_set_at_initialization_is_no_warning():
    """Every run's step-0 key set holds most frequencies: only a trained checkpoint's counts."""
    assert trivial_key_note([0, 100, 200], [9, 2, 2], 23) is None
    assert "7 at step 200" in trivial_key_note([0, 100, 200], [9, 2, 7], 13)

"""examples/tutorial.py, the notebook a new user starts from, runs as a plain script in a fresh
directory (so it cannot rot), and reads as a jupytext percent-format notebook."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TUTORIAL = Path(__file__).resolve().parents[1] / "examples" / "tutorial.py"


def test_the_tutorial_is_a_percent_format_notebook():
    text = TUTORIAL.read_text()
    assert "format_name: percent" in text
    cells = [line for line in text.splitlines() if line.startswith("# %%")]
    assert sum(c.startswith("# %% [markdown]") for c in cells) >= 8 and len(cells) >= 16


@pytest.mark.slow
def test_the_tutorial_runs_as_a_script(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GROKLENS_TUTORIAL_DIR": str(tmp_path / "out")}
    proc = subprocess.run([sys.executable, str(TUTORIAL)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=1500)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "key frequencies of the grokked model:" in out and "phases:" in out
    assert "speed-up" in out and "wrote" in out and "0_mlp_out" in out
    report = tmp_path / "out" / "report"
    assert (report / "index.html").exists() and (report / "fig_progress_measures.png").exists()
    assert {p.name for p in (tmp_path / "out").glob("*.h5")} >= {"base.h5", "sphere.h5"}


def test_jupytext_reads_it_as_a_notebook_when_installed():
    jupytext = pytest.importorskip("jupytext")
    nb = jupytext.read(TUTORIAL)
    kinds = [c.cell_type for c in nb.cells]
    assert kinds.count("markdown") >= 8 and kinds.count("code") >= 8

"""One name per meaning on the CLI: `--checkpoints` picks checkpoint steps on analyze, probe and
report; the old spellings (`--steps` there, `--checkpoint` on report) are refused with a hint."""

import json

import pytest

from tests.helpers import groklens, train_tiny


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("names") / "run.h5"
    train_tiny(path)  # checkpoints at 0, 20, 40, 60
    return path


def _snapshot(root):
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def test_analyze_and_probe_take_checkpoints(run):
    out = groklens("analyze", str(run), "--metric", "norms", "--checkpoints", "0,40", "--checkpoints", "60",
                   "-q", "--json", check=True)
    assert json.loads(out.stdout)["norms"]["steps"] == [0, 40, 60]
    out = groklens("probe", str(run), "--site", "hook_embed", "--target", "a", "--position", "0",
                   "--checkpoints", "20", "-q", "--json", check=True)
    assert json.loads(out.stdout)["probe"]["steps"] == [20]


def test_report_takes_checkpoints(run, tmp_path):
    # the same form as analyze (comma-separated), parsed by the same function
    bad = groklens("report", str(run), "-o", str(tmp_path / "bad"), "--checkpoints", "20,x", "-q")
    assert bad.returncode == 2 and "--checkpoints takes integer checkpoint steps; got 'x'" in bad.stderr
    assert not (tmp_path / "bad").exists()
    out = groklens("report", str(run), "-o", str(tmp_path / "rep"), "--checkpoints", "20,40", "-q", "--json",
                   check=True)
    assert (tmp_path / "rep" / "index.html").is_file() and json.loads(out.stdout)["index"].endswith("index.html")


OLD = [
    (["analyze", "{run}", "--steps", "20"], "--steps was renamed --checkpoints"),
    (["analyze", "{run}", "--steps=20", "--recompute"], "--steps was renamed --checkpoints"),
    (["probe", "{run}", "--site", "hook_embed", "--target", "a", "--steps", "20"], "--steps was renamed --checkpoints"),
    (["report", "{run}", "-o", "{out}", "--checkpoint", "20"], "--checkpoint was renamed --checkpoints"),
    (["reproduce", "fourier-fve", "--no-results"], "--no-results is gone"),
]


@pytest.mark.parametrize("args,hint", OLD, ids=[" ".join(a[:1] + a[2:]) for a, _ in OLD])
def test_old_spelling_is_refused_with_a_hint(run, tmp_path, args, hint):
    before = _snapshot(run.parent), _snapshot(tmp_path)
    argv = [a.format(run=run, out=tmp_path / "report") for a in args]
    out = groklens(*argv, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    err = out.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and hint in err, err
    assert out.stdout == ""
    assert (_snapshot(run.parent), _snapshot(tmp_path)) == before  # no sidecar, no report, nothing

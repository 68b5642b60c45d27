"""Ledgers are validated entry by entry on load (issue 46, item 6): an entry whose identity is not
its config's, a step outside [0, the run's last step], a time that is not finite and >= 0, and a
malformed `final` or `collapse` are refused with one line naming the ledger file, the entry and
the field, by the loader and by `groklens reproduce`; every committed ledger still loads."""

import json
from pathlib import Path

import pytest

from groklens.errors import BadInput
from groklens.experiments.ledger import load_ledger_file
from tests.helpers import groklens

RESULTS = Path(__file__).parents[2] / "docs" / "results"
BASE = RESULTS / "grokfast.quick.json"  # entry 0: arm base, seed 1, last step 1500


def _with_entry(tmp_path: Path, edit) -> Path:
    """The committed ledger with entry 0 edited by `edit(entries)`, in a directory of its own."""
    data = json.loads(BASE.read_text())
    edit(data["runs"])
    path = tmp_path / BASE.name
    path.write_text(json.dumps(data))
    return path


def _set(key, value):
    def edit(entries):
        entries[0][key] = value
    return edit


def _set_in(key, inner, value):
    def edit(entries):
        entries[0][key] = {**(entries[0].get(key) or {}), inner: value}
    return edit


def _copy_with(key, value):
    def edit(entries):
        entries.append({**entries[0], key: value})
    return edit


CASES = [
    # the findings
    (_copy_with("config_hash", "0123456789abcdef"), "entry 6", "'config_hash'"),
    (_set_in("grokking_step", "0.99", 10**30), "entry 0", "grokking_step['0.99']"),
    (_set("wall_s", -5e8), "entry 0", "'wall_s'"),
    (_set("wall_s", float("nan")), "entry 0", "'wall_s'"),
    (_set("cpu_s", float("inf")), "entry 0", "'cpu_s'"),
    (_set_in("final", "test_acc", "high"), "entry 0", "final['test_acc']"),
    (_set_in("final", "test_acc", 1.7e308), "entry 0", "final['test_acc']"),
    (_set("collapse", "yes"), "entry 0", "'collapse'"),
    (_set("collapse", {"crossed": "x", "fell_below": None, "final_test_acc": 1.0, "collapsed": False}),
     "entry 0", "collapse['crossed']"),
    (_set("collapse", {"crossed": 100, "fell_below": None, "final_test_acc": 1.0, "collapsed": "no"}),
     "entry 0", "collapse['collapsed']"),
    (_set("collapse", {"crossed": 100, "fell_below": None, "final_test_acc": [1], "collapsed": False}),
     "entry 0", "collapse['final_test_acc']"),
    (_set("collapse", {"crossed": 100, "fell_below": None, "grokked": -5, "final_test_acc": 1.0, "collapsed": False}),
     "entry 0", "collapse['grokked']"),
    (_set("collapse", {"crossed": 100, "fell_below": None, "final_test_acc": 1.0, "ended_below": 0,
                       "collapsed": False}), "entry 0", "collapse['ended_below']"),
    # more of the same kind
    (_set("seed", 7), "entry 0", "'seed'"),
    (_set("arm_hash", "0123456789abcdef"), "entry 0", "'arm_hash'"),
    (_set("last_step", 10**9), "entry 0", "'last_step'"),
    (_set_in("memorization_step", "0.5", -3), "entry 0", "memorization_step['0.5']"),
]


@pytest.mark.parametrize("edit,entry,field", CASES)
def test_a_bad_entry_is_refused_naming_file_entry_and_field(tmp_path, edit, entry, field):
    path = _with_entry(tmp_path, edit)
    with pytest.raises(BadInput) as exc:
        load_ledger_file(path)
    text = str(exc.value)
    assert len(text.splitlines()) == 1 and str(path) in text and entry in text and field in text, text


@pytest.mark.parametrize("edit,entry,field", CASES[:3])
def test_reproduce_refuses_a_bad_ledger_with_one_line(tmp_path, edit, entry, field):
    path = _with_entry(tmp_path, edit)
    before = path.read_bytes()
    proc = groklens("reproduce", "grokfast", "--scale", "quick", "--ledger", str(tmp_path), "--no-train",
                    "--out", str(tmp_path / "out"), "--results-md", str(tmp_path / "RESULTS.md"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and entry in proc.stderr and field in proc.stderr, proc.stderr
    assert path.read_bytes() == before and not (tmp_path / "RESULTS.md").exists()


def test_every_committed_ledger_loads():
    ledgers = sorted(RESULTS.glob("*.json"))
    assert ledgers
    for path in ledgers:
        load_ledger_file(path)
    from groklens.experiments import grokfast_official, sphere_official, stablemax_official
    from groklens.experiments.sphere_paper import ARCH

    # the papers' own code's runs: each peer ledger by its loader
    loaders = {sphere_official.PEER_LEDGER.name: lambda path: sphere_official.load_official(path, ARCH),
               stablemax_official.PEER_LEDGER.name: stablemax_official.load_official,
               grokfast_official.PEER_LEDGER.name: grokfast_official.load_official}
    peers = sorted((RESULTS / "peer").glob("*.json"))
    assert peers and {p.name for p in peers} <= set(loaders)
    for path in peers:
        assert loaders[path.name](path)


def test_a_listing_refuses_a_bad_ledger_rather_than_skip_it(tmp_path):
    """`--list` showed a negative wall time as measured ("fits this CPU? yes: -500000000 s")."""
    _with_entry(tmp_path, _set("wall_s", -5e8))
    proc = groklens("reproduce", "--list", "--no-measure", "--ledger", str(tmp_path))
    assert proc.returncode == 2 and "'wall_s'" in proc.stderr and "-500000000" not in proc.stdout, proc.stderr

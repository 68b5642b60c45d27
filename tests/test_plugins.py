"""Plugins load in isolation (issue 46 items 2 and 5): an entry point that fails to import,
reuses a registered name, registers a name that is not one, or calls sys.exit is left out with
one warning naming it, and every command goes on; a plugin's sys.exit at run time is one line,
never a silent end. Each plugin is a module of a package of entry points on a temporary path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from groklens.registry import Registry
from tests.helpers import groklens, train_tiny

ANALYSIS = '''
from groklens.analyses.registry import analysis

@analysis({name!r}, "a plugin's analysis", tier="named")
def value(model, data, k: int = 1):
    {body}
    return {{"x": 1.0}}
'''
PLUGINS = {
    "evil": ANALYSIS.format(name="../../evil", body="pass"),  # committed as /analyses/../../evil before
    "broken": "import no_such_module_xyz\n",
    "dup": ANALYSIS.format(name="fourier", body="pass"),
    "exits": "import sys\nsys.exit(3)\n",
    "good": ANALYSIS.format(name="plugin_value", body="pass"),
    "exits_later": ANALYSIS.format(name="exits_later", body="import sys; sys.exit(0)"),
}


def site(tmp_path: Path, *modules: str) -> dict[str, str]:
    """A package whose entry points (group groklens.analyses) are `modules`; the env finding it."""
    root = tmp_path / ("site-" + "-".join(modules))
    root.mkdir()
    for m in modules:
        (root / f"plug_{m}.py").write_text(PLUGINS[m])
    info = root / "plugs-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugs\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text("[groklens.analyses]\n" + "".join(f"{m} = plug_{m}\n" for m in modules))
    return {"PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plugins") / "run.h5"
    train_tiny(path, steps=40)
    return path


def warnings_of(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("groklens: warning:")]


def test_a_plugin_name_that_is_a_path_is_left_out_and_the_sidecar_stays_readable(run, tmp_path):
    """`../../evil` was committed into the sidecar, after which analyze, compare and report
    refused the whole file, every stored analysis with it."""
    env = site(tmp_path, "evil", "good")
    proc = groklens("analyze", str(run), "--metric", "../../evil", "-q", env=env)
    assert proc.returncode == 2 and "unknown analysis '../../evil'" in proc.stderr
    (warning,) = warnings_of(proc.stderr)
    assert "plugin evil = plug_evil (package plugs) left out" in warning and "'../../evil'" in warning
    groklens("analyze", str(run), "--metric", "plugin_value", "--metric", "norms", "-q", check=True, env=env)
    for cmd in (["analyze", str(run), "--metric", "norms", "-q"], ["compare", str(run)]):
        assert groklens(*cmd, env=env).returncode == 0
        assert groklens(*cmd).returncode == 0  # and without the plugins


@pytest.mark.parametrize("plugin, why", [
    ("broken", "ModuleNotFoundError: No module named 'no_such_module_xyz'"),
    ("dup",
     "ValueError: duplicate analysis name 'fourier': registered by module groklens.analyses.fourier, again by plugin "
            "dup = plug_dup (package plugs)"),
    ("exits", "it called sys.exit(3)"),
])
def test_a_broken_plugin_is_named_in_one_warning_and_left_out(run, tmp_path, plugin, why):
    """It broke analyze, compare, report and reproduce --list with `failed: ImportError` naming no
    plugin (or a duplicate's ValueError); sys.exit(3) at import ended them silently."""
    env = site(tmp_path, plugin, "good")
    for cmd in (["analyze", str(run), "--metric", "plugin_value", "-q"], ["compare", str(run)],
                ["report", str(run), "-o", str(tmp_path / f"rep-{plugin}"), "-q"],
                ["reproduce", "--list", "--no-measure"]):
        proc = groklens(*cmd, env=env)
        assert proc.returncode == 0, (cmd, proc.stderr[-400:])
        assert warnings_of(proc.stderr) == [f"groklens: warning: analysis plugin {plugin} = plug_{plugin} "
                                            f"(package plugs) left out: {why}"], (cmd, proc.stderr[-400:])
    proc = groklens("analyze", str(run), "--metric", "fourier", "--checkpoints", "40", "--json", "-q", env=env)
    assert proc.returncode == 0 and '"fourier"' in proc.stdout  # the built-in, not the duplicate


def test_sys_exit_inside_a_command_is_one_line_and_a_failure(run, tmp_path):
    """A plugin's sys.exit(0) at run time ended analyze with status 0 and nothing said."""
    env = site(tmp_path, "exits_later")
    proc = groklens("analyze", str(run), "--metric", "exits_later", "--checkpoints", "40", "-q", env=env)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "groklens: failed: sys.exit(0) was called inside the command (a plugin's code?); rerun with --debug for "
        "the traceback"]


@pytest.mark.parametrize("name", ["../../evil", "a/b", "", ".hidden", "x" * 65, "has space", "1st", None])
def test_a_name_that_could_be_a_path_is_refused_where_it_is_registered(name):
    reg: Registry[int] = Registry("thing")
    with pytest.raises(ValueError, match="a name is a letter"):
        reg.register(name)
    reg.register("ok_name-2")(1)
    assert reg.get("ok_name-2") == 1


def test_a_duplicate_name_names_both_origins():
    reg: Registry = Registry("thing")
    first = reg.register("a")(lambda: 1)
    with pytest.raises(ValueError, match=f"duplicate thing name 'a': registered by module {__name__}, again by "
                                         f"module {__name__}"):
        reg.register("a")(lambda: 2)
    assert reg.get("a") is first

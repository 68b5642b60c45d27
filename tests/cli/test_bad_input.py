"""Bad input, everywhere: every case exits 2 with one line naming the problem, no traceback,
and creates or modifies no file (issue: reliability)."""

import json

import h5py
import numpy as np
import pytest

from tests.helpers import groklens, train_tiny

CASES = [
    # --- train: config values
    ("train --out {new} --p 2", "p must be >= 3"),
    ("train --out {new} --task div --p 21", "prime"),
    ("train --out {new} --train-frac 0", "train_frac"),
    ("train --out {new} --train-frac 1.5", "train_frac"),
    ("train --out {new} --lr nan", "lr must be"),
    ("train --out {new} --lr -1", "lr must be"),
    ("train --out {new} --weight-decay -1", "weight_decay"),
    ("train --out {new} --steps 0", "steps must be >= 1"),
    ("train --out {new} --steps 10 --checkpoint-every 100", "larger than the run"),
    ("train --out {new} --task nope", "unknown task"),
    ("train --out {new} --norm weird", "norm must be one of"),
    ("train --out {new} --preset nope", "unknown preset"),
    ("train --out {new} --bogus-flag", "No such option"),
    ("train --out {new} --device cuda", "cuda"),
    ("train --p 7", "missing --out"),
    # --- train: files
    ("train --out {new} --config {missing}", "does not exist"),
    ("train --out {new} --config {empty_yaml}", "empty"),
    ("train --out {new} --config {unknown_yaml}", "unknown config key"),
    ("train --out {new} --config {list_yaml}", "mapping"),
    ("train --out {dir}", "directory"),
    ("train --out {run}", "already exists"),
    ("train --resume {missing}", "no such file"),
    ("train --resume {empty}", "empty file"),
    ("train --resume {trunc}", "truncated"),
    ("train --resume {text}", "not an HDF5 file"),
    ("train --resume {run} --p 7", "do not also give"),
    # --- info: every kind of bad file
    ("info {missing}", "no such file"),
    ("info {dir}", "directory"),
    ("info {empty}", "empty file"),
    ("info {trunc}", "truncated"),
    ("info {flip}", "damaged"),
    ("info {text}", "not an HDF5 file"),
    ("info {foreign}", "not a groklens trajectory"),
    ("info {future}", "newer than this groklens reads"),
    ("info", "Missing argument"),
    # --- analyze / probe
    ("analyze {run} --metric nope", "unknown analysis"),
    ("analyze {run} --metric norms --checkpoints 7", "no checkpoint at step"),
    ("analyze {missing} --metric norms", "no such file"),
    ("analyze {future} --metric norms", "newer than this groklens reads"),
    ("analyze {run} --metric norms --every 0", "every"),
    ("probe {run} --site blocks.9.hook_nope --target a", "blocks.9.hook_nope"),
    ("probe {run} --site blocks.0.hook_resid_post --target nope", "nope"),
    ("probe {run} --site blocks.0.hook_resid_post --target a --checkpoints 3", "no checkpoint at step"),
    # --- compare / report
    ("compare {run} {run_sub}", "task"),
    ("compare {run} {missing}", "no such file"),
    ("compare {run} --group-by no_such_field", "no_such_field"),
    ("report {run} -o {file_as_dir}", "{file_as_dir}"),
    ("report {missing} -o {newdir}", "no such file"),
    # --- sweep / scaling-law / demo
    ("sweep {missing} -o {newdir}", "{missing}"),
    ("sweep {grid_unknown_key} -o {newdir}", "unknown"),
    ("sweep {grid_unknown_field} -o {newdir}", "no_such_field"),
    ("sweep {grid_bad_axis} -o {newdir}", "logspace"),
    ("scaling-law {newdir}", "{newdir}"),
    ("scaling-law {rundir} --vars width,nope", "nope"),
    ("demo --scale galaxy", "galaxy"),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    good = root / "run.h5"
    train_tiny(good)
    sub = root / "run_sub.h5"
    train_tiny(sub, task="sub")
    blob = good.read_bytes()
    paths = {
        "run": good, "run_sub": sub, "dir": root / "adir", "missing": root / "missing.h5",
        "empty": root / "empty.h5", "trunc": root / "trunc.h5", "flip": root / "flip.h5",
        "text": root / "text.h5", "foreign": root / "foreign.h5", "future": root / "future.h5",
        "empty_yaml": root / "empty.yaml", "unknown_yaml": root / "unknown.yaml", "list_yaml": root / "list.yaml",
        "file_as_dir": root / "afile", "new": root / "new.h5", "newdir": root / "newdir",
        "grid_unknown_key": root / "g1.yaml", "grid_unknown_field": root / "g2.yaml", "grid_bad_axis": root / "g3.yaml",
    }
    paths["dir"].mkdir()
    paths["rundir"] = root / "rundir"
    paths["rundir"].mkdir()
    (paths["rundir"] / "r.h5").write_bytes(good.read_bytes())
    paths["empty"].write_bytes(b"")
    paths["trunc"].write_bytes(blob[: len(blob) // 2])
    flipped = bytearray(blob)
    flipped[20] ^= 0xFF  # inside the superblock, which carries a checksum
    paths["flip"].write_bytes(bytes(flipped))
    paths["text"].write_text("not a trajectory\n")
    with h5py.File(paths["foreign"], "w") as f:
        f["x"] = [1, 2, 3]
    paths["future"].write_bytes(blob)
    with h5py.File(paths["future"], "r+") as f:
        f.attrs["format_version"] = 99
    paths["empty_yaml"].write_text("")
    paths["unknown_yaml"].write_text("p: 7\nlearning_rate: 0.1\n")
    paths["list_yaml"].write_text("- 1\n- 2\n")
    paths["file_as_dir"].write_text("a file\n")
    paths["grid_unknown_key"].write_text("base: {p: 7}\naxes: {lr: [0.001]}\nseeds: [0]\nextra: 1\n")
    paths["grid_unknown_field"].write_text("base: {p: 7}\naxes: {no_such_field: [1, 2]}\nseeds: [0]\n")
    paths["grid_bad_axis"].write_text("base: {p: 7}\naxes: {lr: {logspace: [1, 2]}}\nseeds: [0]\n")
    return root, paths


def _snapshot(root):
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("command,needle", CASES, ids=[c for c, _ in CASES])
def test_bad_input(files, command, needle):
    root, paths = files
    names = {k: str(v) for k, v in paths.items()}
    before = _snapshot(root)
    out = groklens(*command.format(**names).split(), cwd=root)
    assert out.returncode == 2, f"exit {out.returncode}: {out.stderr}{out.stdout[-300:]}"
    err = out.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert needle.format(**names) in err, err
    assert _snapshot(root) == before  # nothing created, nothing modified


def test_at_least_forty_cases():
    assert len(CASES) >= 40
    assert {c.split()[0] for c, _ in CASES} >= {"train", "info", "analyze", "probe", "compare", "report",
                                              "sweep", "scaling-law", "demo"}


# --- crafted or damaged trajectories (issue 17): every reader names the file and its first problem
def _craft(good, path, edit):
    path.write_bytes(good.read_bytes())
    with h5py.File(path, "r+") as f:
        edit(f)


def _replace(f, name, data):
    """Rewrite a dataset with its checksum, so the crafted content is what the readers meet."""
    checked = f[name].fletcher32
    del f[name]
    f.create_dataset(name, data=data, fletcher32=checked)


def _set_attr(name, value):
    return lambda f: f.attrs.__setitem__(name, value)


CRAFTED = {
    "cfg_list": (_set_attr("config", "[1, 2, 3]"), "not a mapping"),
    "cfg_deep": (_set_attr("config", "[" * 10_000 + "]" * 10_000), "config"),
    "cfg_notask": (lambda f: f.attrs.__setitem__("config", json.dumps(
        {k: v for k, v in json.loads(f.attrs["config"]).items() if k != "task"})), "task"),
    "version_str": (_set_attr("format_version", "1"), "format_version"),
    "steps_2d": (lambda f: _replace(f, "steps", f["steps"][:].reshape(-1, 1)), "/steps"),
    "steps_dup": (lambda f: _replace(f, "steps", np.repeat(f["steps"][:1], len(f["steps"]))), "/steps"),
    "steps_order": (lambda f: _replace(f, "steps", f["steps"][:][::-1]), "/steps"),
    "steps_float": (lambda f: _replace(f, "steps", f["steps"][:].astype(float)), "/steps"),
    "metric_short": (lambda f: _replace(f, "metrics/test_acc", f["metrics/test_acc"][:2]), "test_acc"),
    "labels_range": (lambda f: _replace(f, "data/labels", f["data/labels"][:] + 1000), "labels"),
    "inputs_range": (lambda f: _replace(f, "data/inputs", -f["data/inputs"][:] - 1), "inputs"),
    "idx_range": (lambda f: _replace(f, "data/train_idx", f["data/train_idx"][:] + 10_000), "train_idx"),
}
LOADERS = {  # found when the parameters are loaded (against the model the config builds)
    "param_missing": (lambda f: f.__delitem__("params/embed.W_E"), "embed.W_E"),
    "param_extra": (lambda f: f.create_dataset("params/extra.W", data=np.zeros((len(f["steps"]), 3), "f4"),
                                                          fletcher32=True),
                    "extra.W"),
    "param_shape": (lambda f: _replace(f, "params/embed.W_E", f["params/embed.W_E"][:, :3]), "embed.W_E"),
    "param_nan": (lambda f: f["params/embed.W_E"].__setitem__(1, np.nan), "not finite"),
}


@pytest.fixture(scope="module")
def crafted(files):
    root, paths = files
    out = root / "crafted"
    out.mkdir()
    made = {}
    for name, (edit, needle) in {**CRAFTED, **LOADERS}.items():
        made[name] = (out / f"{name}.h5", needle)
        _craft(paths["run"], made[name][0], edit)
        if name in LOADERS:  # an unfinished run, so that --resume loads its parameters
            _craft(made[name][0], made[name][0], lambda f: _replace(f, "steps", f["steps"][:2]))
    blob = paths["run"].read_bytes()
    (out / "trunc95.h5").write_bytes(blob[: int(len(blob) * 0.95)])
    made["trunc95"] = (out / "trunc95.h5", "truncated")
    return out, made


def _refused(root, args, needle, names_file=True):
    before = _snapshot(root)
    out = groklens(*args, cwd=root, timeout=120)
    assert out.returncode == 2, f"{args}: exit {out.returncode}: {out.stderr}{out.stdout[-300:]}"
    err = out.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert needle in err, err
    assert not names_file or any(a in err for a in args if a.endswith(".h5")), err  # names the file
    assert _snapshot(root) == before  # nothing created, nothing modified (no sidecar either)


@pytest.mark.parametrize("name", [*CRAFTED, "trunc95"])
def test_crafted_trajectory_is_refused_by_every_reader(crafted, name):
    root, made = crafted
    path, needle = made[name]
    for args in (["info", str(path)], ["analyze", str(path), "--metric", "norms", "-q"],
                 ["train", "-q", "--resume", str(path)]):
        _refused(root, args, needle)


@pytest.mark.parametrize("name", list(LOADERS))
def test_parameters_that_do_not_fit_the_model_are_refused(crafted, name):
    root, made = crafted
    path, needle = made[name]
    for args in (["analyze", str(path), "--metric", "norms", "-q"], ["train", "-q", "--resume", str(path)]):
        _refused(root, args, needle)


def test_info_json_lists_the_problems(crafted):
    root, made = crafted
    out = groklens("info", str(made["steps_order"][0]), "--json")
    assert out.returncode == 2
    info = json.loads(out.stdout)
    assert info["valid"] is False and any("/steps" in p for p in info["problems"])
    good = json.loads(groklens("info", str(root.parent / "run.h5"), "--json", check=True).stdout)
    assert good["valid"] is True and good["problems"] == []


def test_a_corrupt_sidecar_is_named(tmp_path):
    run = tmp_path / "r.h5"
    train_tiny(run)
    groklens("analyze", str(run), "--metric", "norms", "-q", check=True)
    side = tmp_path / "r.analyses.h5"
    blob = bytearray(side.read_bytes())
    for i in range(600, len(blob) - 200, 97):  # metadata past the superblock: checksums fail
        blob[i] ^= 0xFF
    side.write_bytes(bytes(blob))
    # the damaged file is the sidecar, and the message names it (needle), not the run
    _refused(tmp_path, ["analyze", str(run), "--metric", "norms", "-q"], str(side), names_file=False)


MORE_CASES = [
    ("train --out {new} --seed -1", "seed"),
    ("train --out {new} --seed 18446744073709551616", "seed"),
    ("train --out {new} --p 50000", "memory"),
    ("train --out {new} --d-model 100000000", "memory"),
    ("train --out {new} --n-heads 100000000", "memory"),
    ("train --out {new} --steps 1000000000000", "memory"),
    ("train --out {new} --log-checkpoints 1000000000", "log_checkpoints"),
    ("train --out {new} --config {bomb_yaml}", "aliases"),
    ("train --out {new} --config {deep_yaml}", "nested"),
    ("train --resume {run} --force", "--force"),
    ("report {run} -o ''", "--out is empty"),
    ("sweep {grid_huge} -o {newdir} --dry-run", "at most"),
    ("sweep {grid_bomb} -o {newdir} --dry-run", "aliases"),
    ("sweep {grid_deep} -o {newdir} --dry-run", "nested"),
    ("reproduce bounded-sphere --scale smoke -o {newdir} --results-md {binary_md}", "not a UTF-8 text file"),
    ("report {run} -o {csv_is_dir}", "is a directory"),
]

BOMB = ("a: &a [1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
        "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
        "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n")


@pytest.fixture(scope="module")
def more_files(files):
    root, paths = files
    extra = {"bomb_yaml": root / "bomb.yaml", "deep_yaml": root / "deep.yaml", "grid_huge": root / "huge.yaml",
             "grid_bomb": root / "gbomb.yaml", "grid_deep": root / "gdeep.yaml"}
    extra["bomb_yaml"].write_text(BOMB + "p: [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n")
    extra["deep_yaml"].write_text("p: " + "[" * 5000 + "]" * 5000 + "\n")
    extra["grid_huge"].write_text("base: {p: 7, steps: 10, checkpoint_every: 5, eval_every: 5}\naxes:\n"
                                  "  lr: {logspace: [0.001, 0.1, 1000]}\n  weight_decay: {logspace: [0.01, 1, 1000]}\n")
    extra["grid_bomb"].write_text(BOMB + "seeds: [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n")
    extra["grid_deep"].write_text("base: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n")
    extra["binary_md"] = root / "binary.md"
    extra["binary_md"].write_bytes(bytes(range(256)))
    extra["csv_is_dir"] = root / "rep"
    (extra["csv_is_dir"] / "comparison.csv").mkdir(parents=True)
    return root, {**paths, **extra}


@pytest.mark.parametrize("command,needle", MORE_CASES, ids=[c for c, _ in MORE_CASES])
def test_more_bad_input(more_files, command, needle):
    import shlex

    root, paths = more_files
    names = {k: str(v) for k, v in paths.items()}
    before = _snapshot(root)
    out = groklens(*shlex.split(command.format(**names)), cwd=root, timeout=120)
    assert out.returncode == 2, f"exit {out.returncode}: {out.stderr}{out.stdout[-300:]}"
    err = out.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert needle in err, err
    assert _snapshot(root) == before

"""Bad input, everywhere: every case exits 2 with one line naming the problem, no traceback,
and creates or modifies no file (issue: reliability)."""

import h5py
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
    ("analyze {run} --metric norms --steps 7", "no checkpoint at step"),
    ("analyze {missing} --metric norms", "no such file"),
    ("analyze {future} --metric norms", "newer than this groklens reads"),
    ("analyze {run} --metric norms --every 0", "every"),
    ("probe {run} --site blocks.9.hook_nope --target a", "blocks.9.hook_nope"),
    ("probe {run} --site blocks.0.hook_resid_post --target nope", "nope"),
    ("probe {run} --site blocks.0.hook_resid_post --target a --steps 3", "no checkpoint at step"),
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

"""Stored data is checked (issue 46, item 1): every dataset of a run carries HDF5's Fletcher32
checksum (format 1.3), so one flipped bit anywhere in a real run file is refused with one line
naming the dataset, by every read and by `--resume` before it writes anything; stored metrics
are range-checked, the stored task data is compared with what the config rebuilds, stored
analyses carry digests, and files of earlier formats still read, marked unverified."""

import contextlib
import io
import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from groklens.checkpoints import Trajectory
from groklens.errors import BadInput
from tests.helpers import tiny_config, train_interrupted

SETTINGS = settings(max_examples=30, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
CFG = dict(p=7, steps=60, eval_every=10, checkpoint_every=20)


def _main(args, stdout: list | None = None):
    """(exit status, stderr) of `groklens ARGS` run in this process; its output is appended to `stdout`."""
    from groklens.cli import main

    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code
    if stdout is not None:
        stdout.append(out.getvalue())
    return code, err.getvalue().strip()


def datasets(f: h5py.File) -> list[h5py.Dataset]:
    """Every dataset of the file (the test's own walk, not the product's)."""
    found: list[h5py.Dataset] = []
    f.visititems(lambda _name, obj: found.append(obj) if isinstance(obj, h5py.Dataset) else None)
    return found


def _chunks(path: Path) -> list[tuple[str, int, int]]:
    """(dataset, byte offset, size) of every stored chunk of the file (a contiguous dataset: its one extent)."""
    out = []
    with h5py.File(path, "r") as f:
        for ds in datasets(f):
            if ds.chunks is None:
                out.append((ds.name, ds.id.get_offset(), ds.id.get_storage_size()))
                continue
            for i in range(ds.id.get_num_chunks()):
                info = ds.id.get_chunk_info(i)
                out.append((ds.name, info.byte_offset, info.size))
    return out


def _flip(path: Path, offset: int, bit: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset + bit // 8)
        byte = fh.read(1)[0]
        fh.seek(offset + bit // 8)
        fh.write(bytes([byte ^ (1 << (bit % 8))]))


def _read_everything(path: Path) -> None:
    """Every read a user makes of a run: open (validation), metrics, status, CPU time, data, every
    checkpoint's parameters and every stored state slot."""
    run = Trajectory(path)
    run.metrics, run.status, run.cpu_seconds, run.dataset()
    for step in run.steps:
        run.params(int(step))
        try:
            run.state(int(step))
        except BadInput as exc:  # the two slots hold the last two checkpoints' state
            if "no optimizer state stored" not in str(exc):
                raise


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An uninterrupted run and the same run interrupted at step 45 (checkpoints 0, 20, 40)."""
    from groklens.trainers.train import train

    d = tmp_path_factory.mktemp("flips")
    whole, cut = d / "whole.h5", d / "cut.h5"
    train(tiny_config(**CFG), whole, progress=False)
    train_interrupted(tiny_config(**CFG), cut, at_step=45)
    return whole, cut, _chunks(cut)


def test_every_dataset_of_a_new_run_is_checksummed(runs):
    whole, _, _ = runs
    with h5py.File(whole, "r") as f:
        assert f.attrs["integrity"] == "fletcher32"
        assert all(ds.fletcher32 for ds in datasets(f))
    assert Trajectory(whole).verified


@SETTINGS
@given(data=st.data())
def test_a_flipped_bit_in_any_dataset_is_refused_naming_it(runs, tmp_path, data):
    """Property over the file's datasets and bit positions: every read refuses the file in one
    line naming the dataset, and `--resume` either refuses it the same way, leaving the file as
    it was, or (the flip lies in state that recovery drops) ends exactly as the uninterrupted run."""
    whole, cut, chunks = runs
    name, offset, size = data.draw(st.sampled_from(chunks), label="chunk")
    bit = data.draw(st.integers(0, 8 * size - 1), label="bit")
    path = tmp_path / "run.h5"
    shutil.copyfile(cut, path)
    _flip(path, offset, bit)

    with pytest.raises(BadInput) as exc:
        _read_everything(path)
    assert name in str(exc.value) and len(str(exc.value).splitlines()) == 1, str(exc.value)

    before = path.read_bytes()
    code, err = _main(["train", "--resume", str(path), "--quiet"])
    if code == 2:
        assert name in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert path.read_bytes() == before  # nothing a user has is lost
    else:
        assert code == 0, err
        assert name.startswith("/state/") and name != "/state/step", name  # only the older slot is dropped
        ended, want = Trajectory(path), Trajectory(whole)
        for step in want.steps:
            for key, value in want.params(int(step)).items():
                assert np.array_equal(ended.params(int(step))[key].numpy(), value.numpy()), (step, key)


def test_one_line_names_the_dataset_in_info(runs, tmp_path):
    """The issue's case: a flipped bit in test_acc read back as another accuracy by `info`."""
    _, cut, chunks = runs
    path = tmp_path / "run.h5"
    shutil.copyfile(cut, path)
    name, offset, _ = next(c for c in chunks if c[0] == "/metrics/test_acc")
    _flip(path, offset, 8 * 8 + 50)  # row 1's exponent
    code, err = _main(["info", str(path)])
    assert code == 2 and len(err.splitlines()) == 1
    assert "/metrics/test_acc fails its Fletcher32 checksum" in err, err


def _edited(src: Path, dst: Path, dataset: str, index, value) -> Path:
    """`src` with one stored value rewritten through HDF5 (the checksum rewritten with it)."""
    shutil.copyfile(src, dst)
    with h5py.File(dst, "r+") as f:
        f[dataset][index] = value
    return dst


@pytest.mark.parametrize("dataset,index,value,why", [
    ("metrics/test_acc", 2, 1.7e308, "outside [0, 1]"),
    ("metrics/train_acc", 0, -0.5, "outside [0, 1]"),
    ("metrics/train_loss", 1, -3.0, "outside [0, inf]"),
    ("metrics/grad_norm", 1, -1.0, "outside [0, inf]"),
    ("data/labels", 3, 0, "is not the data the stored config builds"),
    ("data/inputs", (5, 0), 1, "is not the data the stored config builds"),
    ("steps", 2, 61, "past the run's last step"),
])
def test_stored_values_out_of_range_or_not_the_configs_data_are_refused(runs, tmp_path, dataset, index, value, why):
    _, cut, _ = runs
    with h5py.File(cut, "r") as f:
        assert f[dataset][index] != value  # a real change
    path = _edited(cut, tmp_path / "run.h5", dataset, index, value)
    code, err = _main(["info", str(path)])
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"/{dataset}" in err and why in err, err


def test_a_swapped_split_is_refused(runs, tmp_path):
    """A train and a test index exchanged: both still distinct, disjoint and covering the inputs."""
    _, cut, _ = runs
    path = tmp_path / "run.h5"
    shutil.copyfile(cut, path)
    with h5py.File(path, "r+") as f:
        train, test = f["data/train_idx"][:], f["data/test_idx"][:]
        train[0], test[0] = test[0], train[0]
        f["data/train_idx"][:], f["data/test_idx"][:] = np.sort(train), np.sort(test)
    code, err = _main(["info", str(path)])
    assert code == 2 and "/data/train_idx is not the data the stored config builds" in err, err


def test_a_dataset_without_its_checksum_is_refused(runs, tmp_path):
    """Rewriting a dataset without the filter would let edited bytes read as valid."""
    _, cut, _ = runs
    path = tmp_path / "run.h5"
    shutil.copyfile(cut, path)
    with h5py.File(path, "r+") as f:
        labels = f["data/labels"][:]
        del f["data/labels"]
        f["data"].create_dataset("labels", data=labels)
    code, err = _main(["info", str(path)])
    assert code == 2 and "/data/labels carries no Fletcher32 checksum" in err, err


# ---------------------------------------------------------------------- earlier formats
def write_legacy(path: Path) -> None:
    """A run as format 1.2's writer left it: an interrupted run (checkpoints 0 and 20 of 40), every
    dataset rewritten with the same shape, maxshape and chunking but no Fletcher32 checksum, and no
    `integrity` attribute (what marks 1.3). Built here rather than stored: trajectory files stay out
    of git."""
    from groklens.checkpoints import constants as C

    new = path.with_suffix(".new.h5")
    train_interrupted(tiny_config(steps=40, checkpoint_every=20, eval_every=10), new, at_step=30)
    with h5py.File(new, "r") as src, h5py.File(path, "w", libver="latest") as dst:
        dst.attrs.update({k: v for k, v in src.attrs.items() if k != C.ATTR_INTEGRITY})

        def copy(name, obj):
            if isinstance(obj, h5py.Dataset):
                chunked = obj.maxshape != obj.shape  # appendable: keep its chunks; else contiguous, as 1.2 wrote
                ds = dst.create_dataset(name, data=obj[()], maxshape=obj.maxshape,
                                        chunks=obj.chunks if chunked else None)
                ds.attrs.update(dict(obj.attrs))
            else:
                dst.require_group(name).attrs.update(dict(obj.attrs))

        src.visititems(copy)
    new.unlink()


def test_a_file_of_an_earlier_format_reads_marked_unverified(tmp_path):
    path = tmp_path / "legacy.h5"
    write_legacy(path)
    run = Trajectory(path)
    assert not run.verified
    assert list(run.steps) == [0, 20] and run.params(20)
    out: list[str] = []
    assert _main(["info", str(path)], out)[0] == 0
    assert "unverified" in out[0]
    assert _main(["info", "--json", str(path)], out)[0] == 0
    assert json.loads(out[1])["verified"] is False


def test_a_file_of_an_earlier_format_resumes_and_stays_unverified(tmp_path):
    path = tmp_path / "legacy.h5"
    write_legacy(path)
    code, err = _main(["train", "--resume", str(path), "--quiet"])
    assert code == 0, err
    run = Trajectory(path)
    assert list(run.steps) == [0, 20, 40] and not run.verified
    with h5py.File(path, "r") as f:
        assert not any(ds.fletcher32 for ds in datasets(f))  # its old bytes were never checked


# ---------------------------------------------------------------------- stored analyses
def test_a_flipped_bit_in_a_stored_analysis_is_refused_naming_it(runs, tmp_path):
    """The issue's case: a stored analysis value (16.65) read back as 9e-308."""
    from groklens.analyses.store import Sidecar

    _, cut, _ = runs
    path = tmp_path / "run.h5"
    shutil.copyfile(cut, path)
    car = Sidecar(path)
    car.commit("norms", "v1", {"analysis": "norms"}, {0: {"total": 16.65}, 20: {"total": 17.5}})
    with h5py.File(car.path, "r") as f:
        ds = f["analyses/norms/v1/total"]
        offset = ds.id.get_offset()
    _flip(car.path, offset, 62)  # 16.65's exponent: a valid float64 of another size
    with pytest.raises(BadInput) as exc:
        car.read("norms", "v1")
    assert "/analyses/norms/v1/total does not match its sha256 digest" in str(exc.value)
    assert len(str(exc.value).splitlines()) == 1


def test_a_stored_analysis_of_an_earlier_sidecar_reads_unverified(runs, tmp_path):
    from groklens.analyses.store import DIGEST, Sidecar

    _, cut, _ = runs
    path = tmp_path / "run.h5"
    shutil.copyfile(cut, path)
    car = Sidecar(path)
    car.commit("norms", "v1", {"analysis": "norms"}, {0: {"total": 16.65}})
    with h5py.File(car.path, "r+") as f:
        for ds in f["analyses/norms/v1"].values():
            del ds.attrs[DIGEST]
    assert car.read("norms", "v1").rows() == {0: {"total": 16.65}}

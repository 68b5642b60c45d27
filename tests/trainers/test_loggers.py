"""`train --log`: the evaluation rows the trajectory file gets, mirrored to TensorBoard (read back
with TensorBoard's own event reader) and to an offline Weights & Biases run (its .wandb file read
back record by record with wandb's protobuf schema); the HDF5 file stays the record."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from groklens.checkpoints import Trajectory
from groklens.errors import BadInput
from groklens.trainers.loggers import check_specs, parse_specs
from tests.helpers import config_flags, groklens, tiny_config

CFG = tiny_config(steps=40, eval_every=10, checkpoint_every=20)


# the logged names, written out here: train and test of one measure share a section
TAGS = {"train_loss": "loss/train", "test_loss": "loss/test", "train_acc": "accuracy/train",
        "test_acc": "accuracy/test", "weight_norm": "stats/weight_norm", "grad_norm": "stats/grad_norm",
        "lr": "stats/lr"}


def _series(run: Trajectory) -> dict[str, list[tuple[int, float]]]:
    """logged name -> [(step, value)] of the finite values the trajectory file holds."""
    steps = run.metrics["step"]
    return {TAGS[k]: [(int(s), float(v)) for s, v in zip(steps, vals) if np.isfinite(v)]
            for k, vals in run.metrics.items() if k != "step"}


def _check_tensorboard(log_dir: Path, run: Trajectory) -> None:
    """The event files of one run: every finite metric under its name, at its steps; the config
    as hparams (one value per field, sequences as JSON) and as text; the layout that puts train
    and test of loss and accuracy on one chart each."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar import layout_pb2
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    want = _series(run)
    assert set(acc.Tags()["scalars"]) == {k for k, v in want.items() if v}
    for key, rows in want.items():
        if rows:
            got = [(e.step, e.value) for e in acc.Scalars(key)]
            assert [s for s, _ in got] == [s for s, _ in rows], key
            assert np.allclose([v for _, v in got], [v for _, v in rows], rtol=1e-6), key  # float32 in events
    start = plugin_data_pb2.HParamsPluginData.FromString(
        acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]).session_start_info
    config = run.config_dict
    assert set(start.hparams) == set(config)
    for k, v in config.items():
        field = start.hparams[k]
        got = {"bool_value": field.bool_value, "number_value": field.number_value,
               "string_value": field.string_value}[field.WhichOneof("kind")]
        assert got == (v if isinstance(v, (bool, int, float, str)) else json.dumps(v)), k
    text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert f"lr: {json.dumps(config['lr'])}" in text and f"p: {config['p']}" in text
    layout = layout_pb2.Layout.FromString(acc.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0])
    charts = {c.title: list(c.multiline.tag) for cat in layout.category for c in cat.chart}
    assert charts == {"loss": ["loss/train", "loss/test"], "accuracy": ["accuracy/train", "accuracy/test"]}


def test_tensorboard_event_files_hold_every_evaluation_row_and_the_config(tmp_path):
    pytest.importorskip("tensorboard")
    path = tmp_path / "run.h5"
    groklens("train", "-q", "--out", str(path), "--log", f"tensorboard:{tmp_path / 'tb'}", *config_flags(CFG),
             check=True)
    _check_tensorboard(tmp_path / "tb" / "run", Trajectory(path))


@pytest.mark.parametrize("ensemble", [False, True])
def test_a_sweep_logs_every_run_under_its_name(tmp_path, ensemble):
    """`sweep --log`: each run (alone, or a member of an ensemble) in its own TensorBoard run
    directory named like its file, with its own rows and config."""
    pytest.importorskip("tensorboard")
    import yaml

    grid = tmp_path / "grid.yaml"
    base = {k: v for k, v in CFG.to_dict().items() if k != "seed"}
    grid.write_text(yaml.safe_dump({"base": base, "seeds": [1, 2]}))
    flags = ["--ensemble"] if ensemble else []
    groklens("sweep", str(grid), "-o", str(tmp_path / "runs"), "--workers", "1", "-q", *flags,
             "--log", f"tensorboard:{tmp_path / 'tb'}", check=True)
    names = sorted(p.name.removesuffix(".h5") for p in (tmp_path / "runs").glob("*.h5"))
    assert names == ["seed=1", "seed=2"]
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == names
    for name in names:
        _check_tensorboard(tmp_path / "tb" / name, Trajectory(tmp_path / "runs" / f"{name}.h5"))


def _wandb_records(run_file: Path):
    """The records of a .wandb file: W&B's LevelDB-style log (a 7-byte header ':W&B', magic
    0xBEE1, version 0; 32 KiB blocks of records: crc32c (4), length (2), type (1: full, 2-4:
    first / middle / last), data), each a wandb_internal_pb2.Record."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<HB", data[4:7]) == (0xBEE1, 0)
    pos, block, parts = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            break
        parts += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(parts)
            parts = b""
            yield rec


def test_wandb_offline_run_holds_every_evaluation_row_and_stdout_stays_json(tmp_path):
    pytest.importorskip("wandb")
    path = tmp_path / "run.h5"
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    out = groklens("train", "-q", "--json", "--out", str(path), "--log", "wandb:groklens-test", *config_flags(CFG),
                   check=True, env=env)
    assert json.loads(out.stdout)["path"] == str(path)  # the logger writes nothing to stdout
    files = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    history: dict[int, dict[str, float]] = {}
    names = []
    for rec in _wandb_records(files[0]):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            history[int(items.pop("_step"))] = {k: v for k, v in items.items() if not k.startswith("_")}
        elif kind == "run":
            names.append((rec.run.project, rec.run.display_name))
    assert ("groklens-test", "run") in names
    for key, rows in _series(Trajectory(path)).items():
        assert [(s, history[s][key]) for s, _ in rows] == rows, key  # float64 in W&B: exact


def test_bad_log_specs_are_one_line_errors(tmp_path, monkeypatch):
    assert parse_specs(["tensorboard:a", "wandb:p"]) == [("tensorboard", "a"), ("wandb", "p")]
    for bad in ("tensorboard", "tb:dir", "wandb:", "mlflow:x"):
        with pytest.raises(BadInput, match="--log takes tensorboard:DIR or wandb:PROJECT"):
            parse_specs([bad])
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(BadInput, match=r"needs the wandb package: pip install 'groklens\[wandb\]'"):
        check_specs(["wandb:p"])
    out = groklens("train", "-q", "--out", str(tmp_path / "r.h5"), "--log", "tb:x", *config_flags(CFG))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r.h5").exists()
    # sweep and reproduce take --log too, checked before anything is written
    (tmp_path / "grid.yaml").write_text("base: {p: 7, steps: 10, eval_every: 5, checkpoint_every: 5}\n")
    for args in (["sweep", str(tmp_path / "grid.yaml"), "-o", str(tmp_path / "sweep")],
                 ["reproduce", "demo", "--scale", "smoke", "-o", str(tmp_path / "demo")]):
        out = groklens(*args, "-q", "--log", "tb:x")
        assert out.returncode == 2 and "--log takes tensorboard:DIR or wandb:PROJECT" in out.stderr, args
        assert len(out.stderr.strip().splitlines()) == 1 and not Path(args[args.index("-o") + 1]).exists()


@pytest.mark.parametrize("target, message", [
    ("tensorboard:{tmp}/afile", "afile is not a directory"),
    ("tensorboard:{tmp}/afile/sub", "afile is not a directory"),
    ("tensorboard:{tmp}/dangling", "is a dangling symbolic link"),
    ("tensorboard:{tmp}/r.h5", "is the run file"),
    ("wandb:bad/project", "a W&B project name has at most 128 characters and none of"),
    ("wandb:" + "p" * 129, "a W&B project name has at most 128 characters"),
])
def test_a_bad_log_target_is_refused_before_the_run_file_exists(tmp_path, target, message):
    """Each was found at the first evaluation, after the run file existed (exit 1, a 0-checkpoint
    file that blocked a retry)."""
    (tmp_path / "afile").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    out = groklens("train", "-q", "--out", str(tmp_path / "r.h5"), "--log", target.format(tmp=tmp_path),
                   *config_flags(CFG), timeout=120)
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "r.h5").exists()


def test_a_bad_wandb_mode_is_refused_before_the_run_file_exists(tmp_path):
    out = groklens("train", "-q", "--out", str(tmp_path / "r.h5"), "--log", "wandb:proj", *config_flags(CFG),
                   env={"WANDB_MODE": "bogus"}, timeout=120)
    assert out.returncode == 2 and "WANDB_MODE='bogus' is not one of online, offline" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "r.h5").exists()


def test_a_read_only_tensorboard_dir_is_refused_before_the_run_file_exists(tmp_path):
    from tests.helpers import one_line_exit, readonly_groklens

    ro = tmp_path / "ro"
    ro.mkdir()
    err = one_line_exit(readonly_groklens(ro, "train", "-q", "--out", str(tmp_path / "r.h5"), "--log",
                                          f"tensorboard:{ro / 'tb'}", *config_flags(CFG), timeout=120))
    assert "read-only file system" in err and not (tmp_path / "r.h5").exists()


def test_a_logger_failing_mid_run_is_one_line_and_the_run_completes(tmp_path):
    """It stopped training with a traceback (the HDF5 file is the record; the mirror is not)."""
    import subprocess
    import sys

    pytest.importorskip("tensorboard")
    run = tmp_path / "r.h5"
    script = f"""
import sys
from groklens.trainers import loggers
real = loggers.TensorBoardLogger.log
def log(self, row):
    if row["step"] >= 20:
        raise OSError(28, "No space left on device")
    real(self, row)
loggers.TensorBoardLogger.log = log
from groklens.cli import main
main({["train", "-q", "--out", str(run), "--log", f"tensorboard:{tmp_path / 'tb'}", *config_flags(CFG)]!r})
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-800:]
    assert proc.stderr.strip().splitlines() == [
        f"groklens: warning: --log tensorboard:{tmp_path / 'tb'} failed at step 20 (OSError: [Errno 28] No space "
        "left on device); it logs no more, the run goes on (the HDF5 file is the record)"]
    t = Trajectory(run)
    assert t.status == "completed" and list(t.steps) == [0, 20, 40]

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


def _series(run: Trajectory) -> dict[str, list[tuple[int, float]]]:
    """metric -> [(step, value)] of the finite values the trajectory file holds."""
    steps = run.metrics["step"]
    return {k: [(int(s), float(v)) for s, v in zip(steps, vals) if np.isfinite(v)]
            for k, vals in run.metrics.items() if k != "step"}


def test_tensorboard_event_files_hold_every_evaluation_row(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path = tmp_path / "run.h5"
    groklens("train", "-q", "--out", str(path), "--log", f"tensorboard:{tmp_path / 'tb'}", *config_flags(CFG),
             check=True)
    acc = EventAccumulator(str(tmp_path / "tb" / "run"), size_guidance={"scalars": 0})
    acc.Reload()
    want = _series(Trajectory(path))
    assert set(acc.Tags()["scalars"]) == {k for k, v in want.items() if v}
    for key, rows in want.items():
        if rows:
            got = [(e.step, e.value) for e in acc.Scalars(key)]
            assert [s for s, _ in got] == [s for s, _ in rows], key
            assert np.allclose([v for _, v in got], [v for _, v in rows], rtol=1e-6), key  # float32 in events


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

import json
import subprocess
import sys

import pytest

from groklens.analyses.grokking import run_summary
from groklens.checkpoints import Trajectory
from groklens.errors import BadInput
from tests.helpers import TINY, config_flags, groklens, tiny_config


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "run.h5"
    out = groklens("train", "-q", "--out", str(path), *config_flags(tiny_config()), check=True)
    return path, out


def test_train_writes_a_trajectory_and_reports_it(cli_run):
    path, out = cli_run
    assert "completed at step 60" in out.stdout
    assert Trajectory(path).config == tiny_config()


def test_info_json_contract(cli_run):
    path, _ = cli_run
    info = json.loads(groklens("info", str(path), "--json", check=True).stdout)
    assert info["config"]["p"] == 11 and info["config"]["d_model"] == 16
    assert info["checkpoint_steps"] == [0, 20, 40, 60]
    assert info["last"]["step"] == 60 and 0 <= info["last"]["test_acc"] <= 1
    for key in ("memorization_step", "grokking_step"):
        assert set(info[key]) == {"0.95", "0.99"}
        assert all(v is None or isinstance(v, int) for v in info[key].values())
    text = groklens("info", str(path), check=True).stdout
    assert "checkpoints" in text and "@0.95" in text


def test_json_output_is_strict_json_even_with_infinite_config_values(tmp_path):
    # routing_width inf is a legal config value; Python's json would print the bare token Infinity
    from groklens.trainers.train import train

    path = tmp_path / "routed.h5"
    train(tiny_config(routing_copies=2, routing_width=float("inf"), steps=20, checkpoint_every=20), path,
          progress=False)

    def refuse(token):
        raise AssertionError(f"non-standard JSON token {token}")

    info = json.loads(groklens("info", str(path), "--json", check=True).stdout, parse_constant=refuse)
    assert info["config"]["routing_width"] == "inf"


def test_yaml_config_file_and_flag_precedence(tmp_path):
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("\n".join(f"{k}: {v}" for k, v in {**TINY, "steps": 40}.items()) + "\n")
    out = tmp_path / "y.h5"
    groklens("train", "-q", "--config", str(cfg_file), "--d-model", "24", "--out", str(out), check=True)
    cfg = Trajectory(out).config
    assert cfg.steps == 40 and cfg.d_model == 24 and cfg.p == TINY["p"]


def test_stored_config_trains_the_same_run_again(cli_run, tmp_path):
    import yaml

    path, _ = cli_run
    cfg_file = tmp_path / "again.yaml"
    cfg_file.write_text(yaml.safe_dump(Trajectory(path).config_dict))
    again = tmp_path / "again.h5"
    groklens("train", "-q", "--config", str(cfg_file), "--out", str(again), check=True)
    import numpy as np

    a, b = Trajectory(path), Trajectory(again)
    assert np.array_equal(a.param_trajectory("unembed.W_U"), b.param_trajectory("unembed.W_U"))


@pytest.mark.parametrize(
    "args,needle",
    [
        (["train", "--out", "X", "--p", "2"], "p must be >= 3"),
        (["train", "--out", "X", "--task", "div", "--p", "21"], "prime"),
        (["train", "--out", "X", "--train-frac", "1.0"], "train_frac"),
        (["train", "--out", "X", "--lr", "nan"], "lr must be"),
        (["train", "--out", "X", "--lr", "-1"], "lr must be"),
        (["train", "--out", "X", "--steps", "0"], "steps must be >= 1"),
        (["train", "--out", "X", "--steps", "10", "--checkpoint-every", "100"], "larger than the run"),
        (["train", "--out", "X", "--task", "nope"], "unknown task"),
        (["train", "--out", "X", "--norm", "weird"], "norm must be one of"),
        (["train", "--out", "X", "--preset", "nope"], "unknown preset"),
        (["train", "--out", "X", "--bogus-flag"], "No such option"),
        (["train", "--p", "7"], "missing --out"),
        (["train", "--resume", "R", "--p", "7"], "do not also give --p"),
        (["info"], "Missing argument"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_creates_nothing(tmp_path, args, needle):
    args = [str(tmp_path / a) if a in ("X", "R") else a for a in args]
    out = groklens(*args, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert needle in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_unknown_yaml_key_is_refused(tmp_path):
    cfg_file = tmp_path / "bad.yaml"
    cfg_file.write_text("p: 7\nlearning_rate: 0.1\n")
    out = groklens("train", "--config", str(cfg_file), "--out", str(tmp_path / "r.h5"))
    assert out.returncode == 2 and "unknown config key(s): learning_rate (did you mean lr?)" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_an_unknown_key_names_the_closest_field():
    from groklens.config import RunConfig, did_you_mean, field_names

    assert did_you_mean("weight_decya", field_names()) == "weight_decya (did you mean weight_decay?)"
    assert did_you_mean("d_modle", field_names()) == "d_modle (did you mean d_model?)"
    assert did_you_mean("banana", field_names()) == "banana"
    with pytest.raises(BadInput, match=r"n_head \(did you mean n_heads\?\)"):
        RunConfig.from_dict({"n_head": 2})


@pytest.mark.parametrize("args, suggestion", [
    (["train", "--out", "R", "--learning-rate", "0.01"], " (did you mean --lr?)"),  # click: --attention-rate
    (["train", "--out", "R", "--weight-decya", "1"], " (did you mean --weight-decay?)"),
    (["train", "--out", "R", "--banana", "1"], ""),
    (["analyze", "R", "--metrc", "x"], " (did you mean --metric?)"),
])
def test_an_unknown_option_names_the_option_the_config_keys_rule_finds(tmp_path, args, suggestion):
    """The flag path suggests by the YAML key path's rule (a near spelling, or the initials)."""
    flag = [a for a in args if a.startswith("--")][-1]
    out = groklens(*[str(tmp_path / "r.h5") if a == "R" else a for a in args])
    assert out.returncode == 2
    assert out.stderr.strip() == f"groklens: error: No such option: {flag}{suggestion}"
    assert list(tmp_path.iterdir()) == []


def test_overwrite_needs_force(cli_run, tmp_path):
    path = tmp_path / "o.h5"
    path.write_bytes(b"mine")
    out = groklens("train", "--out", str(path), *config_flags(tiny_config()))
    assert out.returncode == 2 and "--force" in out.stderr and path.read_bytes() == b"mine"
    # --force replaces only a groklens run (issue 29): a foreign file stays
    out = groklens("train", "-q", "--force", "--out", str(path), *config_flags(tiny_config()))
    assert out.returncode == 2 and "not a groklens run" in out.stderr and path.read_bytes() == b"mine"
    path.write_bytes(cli_run[0].read_bytes())
    groklens("train", "-q", "--force", "--out", str(path), *config_flags(tiny_config(seed=3)), check=True)
    assert Trajectory(path).status == "completed" and Trajectory(path).config.seed == 3


def test_help_and_info_do_not_import_torch_or_transformer_lens(cli_run):
    path, _ = cli_run
    code = (
        "import sys; from groklens.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules and 'transformer_lens' not in sys.modules, 'heavy import'\n"
    )
    for args in (["--help"], ["info", str(path)], ["info", str(path), "--json"]):
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


def test_every_command_has_help():
    from groklens.cli import cli

    for name in cli.commands:
        out = groklens(name, "--help", check=True)
        assert "Usage:" in out.stdout


def test_train_reports_the_runs_own_grokking_threshold(tmp_path):
    out = groklens("train", "-q", "--out", str(tmp_path / "r.h5"), *config_flags(tiny_config(steps=20, eval_every=10,
                   checkpoint_every=10, grok_threshold=0.5)), check=True)
    assert "(threshold 0.5, 3 consecutive evaluations)" in out.stdout
    run = Trajectory(tmp_path / "r.h5")
    expected = run_summary(run, thresholds=(0.5,))["grokking_step"]["0.5"]
    assert f"grokked at {expected if expected is not None else '> 20'}" in out.stdout

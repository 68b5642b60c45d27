"""Config facts written once: presets applied in one place (config.config_from: preset < config
file < overrides); the loss names listed once (config.CHOICES), registered by the trainers."""

import pytest

from groklens.config import CHOICES, PRESETS, RunConfig, config_from, preset
from groklens.errors import BadInput


def test_preset_then_file_then_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("lr: 0.01\np: 7\n")
    cfg = config_from("sphere", f, {"p": 11, "seed": None})
    assert cfg.norm == "sphere" and cfg.betas == (0.9, 0.999)  # from the preset
    assert cfg.lr == 0.01  # the file over the preset's 6e-4
    assert cfg.p == 11  # the override over the file
    assert cfg.seed == RunConfig().seed  # None = not given


def test_no_preset_is_nanda_the_defaults():
    assert PRESETS["nanda"] == {}
    assert config_from().to_dict() == RunConfig().to_dict()
    assert preset("mlp").to_dict() == config_from("mlp").to_dict() == RunConfig(**PRESETS["mlp"]).to_dict()


@pytest.mark.parametrize("kwargs, needle", [
    ({"preset": "nope"}, "unknown preset 'nope' (known: mlp, nanda,"),
    ({"overrides": {"learning_rate": 0.1}}, "unknown config key(s): learning_rate"),
    ({"overrides": {"lr": "fast"}}, "config key 'lr'"),
])
def test_bad_names_and_keys_are_bad_input(kwargs, needle):
    with pytest.raises(BadInput) as err:
        config_from(**kwargs)
    assert needle in str(err.value)


def test_unknown_key_in_the_file_is_bad_input(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("p: 7\nlearning_rate: 0.1\n")
    with pytest.raises(BadInput, match="learning_rate"):
        config_from(file=f)


def test_the_loss_registry_registers_exactly_the_configs_losses():
    from groklens.analyses.common import LOSS_NAMES
    from groklens.trainers.losses import LOSSES

    assert sorted(CHOICES["loss"]) == LOSSES.names()
    assert LOSS_NAMES is CHOICES["loss"]



def test_config_validation_imports_no_room():
    # the flow of docs/DESIGN.md: config (and the tasks it validates against) come before the
    # rooms; a task-specific check (p prime for division) still runs
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from groklens.config import RunConfig\n"
        "from groklens.errors import BadInput\n"
        "RunConfig(task='div', p=7).validate()\n"
        "try:\n"
        "    RunConfig(task='div', p=8).validate()\n"
        "except BadInput as e:\n"
        "    print('refused:', e)\n"
        "print(sorted(m for m in sys.modules if m.startswith('groklens.') and m.split('.')[1] in\n"
        "      ('trainers', 'checkpoints', 'probes', 'analyses')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "refused:" in out and "prime" in out
    assert out.strip().endswith("[]")

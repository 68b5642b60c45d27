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
    from groklens.models.losses import LOSSES

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


# ---------------------------------------------------------------------- each field's declared facts
# Every table of fields is read from the fields' declarations (`setting`); these tests check what
# each fact promises against what the code does with a config, not against a list of names.
from groklens.config import FIELD_FACTS, stored_dict  # noqa: E402
from tests.helpers import tiny_config  # noqa: E402


def _other_value(name: str, default=None):
    """A valid-looking value of field `name` other than `default` (its declared default unless
    given), for a perturbation."""
    default = getattr(RunConfig, name) if default is None else default
    facts = FIELD_FACTS[name]
    if facts.choices:
        return next(c for c in facts.choices if c != default)
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default + 1 if default != 0 else 1
    if isinstance(default, tuple):
        return tuple(x / 2 for x in default)
    return default + "x"


def test_every_field_is_declared_with_words_and_consistent_facts():
    from dataclasses import fields

    assert list(FIELD_FACTS) == [f.name for f in fields(RunConfig)]
    for name, f in FIELD_FACTS.items():
        assert len(f.help.split()) >= 3, name
        assert not (f.per_member and f.solo), name  # a solo field never reaches an ensemble
        if f.choices:
            assert getattr(RunConfig, name) in f.choices, name
        for other in (f.inert_unless, f.derived_from):
            assert other is None or other in FIELD_FACTS, name
        if f.seed:
            assert f.per_member, name  # members train on their own seeds


def test_a_field_at_its_legacy_value_hashes_as_a_config_from_before_it_existed():
    """The ledger's rule: an entry recorded before the field existed still matches a config that
    sets the field to its legacy value, and a file written then reads as that value."""
    from groklens.experiments.ledger import INERT_UNLESS, NOT_HASHED, config_hash

    base = tiny_config().to_dict()
    for name, f in FIELD_FACTS.items():
        if not f.has_legacy:
            continue
        older = {k: v for k, v in base.items() if k != name}
        assert config_hash({**older, name: f.legacy}) == config_hash(older), name
        assert RunConfig.from_dict(stored_dict(older)).to_dict()[name] == f.legacy, name
        other = _other_value(name) if f.legacy == getattr(RunConfig, name) else getattr(RunConfig, name)
        on = {INERT_UNLESS[name]: True} if name in INERT_UNLESS else {}
        changed = config_hash({**older, **on, name: other}) != config_hash({**older, **on, name: f.legacy})
        assert changed == (name not in NOT_HASHED), name


def test_a_field_that_is_not_hashed_never_changes_the_hash():
    from groklens.experiments.ledger import config_hash

    base = tiny_config().to_dict()
    quiet = [n for n, f in FIELD_FACTS.items() if not f.hashed]
    assert quiet  # where a run ran, whether it compiled
    for name in quiet:
        assert config_hash({**base, name: _other_value(name)}) == config_hash(base), name


def test_a_value_outside_a_fields_choices_is_refused_in_one_line_and_help_lists_them():
    from tests.helpers import groklens

    for name, f in FIELD_FACTS.items():
        if f.choices:
            with pytest.raises(BadInput, match=f"{name} must be one of {', '.join(f.choices)}"):
                tiny_config(**{name: "no-such-value"})
    text = "".join(groklens("train", "--help", check=True).stdout.split())  # click wraps the lines
    for name, f in FIELD_FACTS.items():
        assert "".join(f.help.split()) in text, name
        if f.choices:
            assert "oneof" + ",".join(f.choices) in text, name


def test_a_transformer_only_field_is_refused_for_another_model():
    for name, f in FIELD_FACTS.items():
        if f.transformer_only and name != "attn_mask_from":  # a run name: checked with its value's run
            value = _other_value(name)
            if name == "attention_rate":
                value = 0.5
            if name == "attn_mask":
                value = "0 2"
            with pytest.raises(BadInput, match=f"{name}=.* is an option of model=transformer"):
                tiny_config(model="mlp", **{name: value})


def test_members_share_every_field_but_the_per_member_and_solo_ones():
    """An ensemble groups configs that differ only in per-member fields; a solo field trains alone."""
    from groklens.trainers.ensemble import ensemble_key

    base = tiny_config()
    for name, f in FIELD_FACTS.items():
        value = _other_value(name, getattr(base, name))
        try:
            changed = base.replace(**{name: value})
        except BadInput:
            continue  # not valid alone (needs another field): the declaration is checked elsewhere
        key = ensemble_key(changed)
        if f.solo:
            assert key is None, name
        elif f.per_member:
            assert key == ensemble_key(base), name
        else:
            assert key is not None and key != ensemble_key(base), name


def test_the_fields_that_switch_a_regularizer_on_may_differ_between_members():
    """A regularizer's strength is per member (an ensemble mixes regularized and plain members):
    every field that alone switches a regularizer on is declared per_member."""
    from groklens.trainers.regularizers import REGULARIZERS

    base = tiny_config()
    switches = set()
    for reg in map(REGULARIZERS.get, REGULARIZERS.names()):
        assert not reg.active(base), reg.name  # off by default
        for name in FIELD_FACTS:
            try:
                on = base.replace(**{name: _other_value(name)})
            except BadInput:
                continue
            if reg.active(on):
                switches.add(name)
    assert {"act_norm_lambda", "perp_grad"} <= switches
    assert all(FIELD_FACTS[n].per_member for n in switches), [n for n in switches if not FIELD_FACTS[n].per_member]


def test_a_field_that_is_not_costed_changes_no_steps_work():
    """The step-time cache shares one measurement among configs that differ only in uncosted fields:
    such a field leaves the FLOP count of a step (experiments/layout.py) as it is."""
    from groklens.experiments.cost import NOT_COSTED, cost_key
    from groklens.experiments.layout import step_flops

    base = tiny_config()
    assert {"seed", "lr", "steps", "device"} <= NOT_COSTED
    for name in NOT_COSTED:
        try:
            other = base.replace(**{name: _other_value(name, getattr(base, name))})
        except BadInput:
            continue
        assert cost_key(other) == cost_key(base), name
        assert step_flops(other) == step_flops(base), name

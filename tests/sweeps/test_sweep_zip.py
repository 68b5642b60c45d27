"""Sweep grids with `zip`: variants taken together beside the Cartesian product of the axes."""

from __future__ import annotations

import pytest

from groklens.errors import BadInput
from groklens.sweeps import parse_sweep

BASE = {"p": 7, "d_model": 16, "n_heads": 2, "d_head": 8, "d_mlp": 32, "steps": 20, "eval_every": 10,
        "checkpoint_every": 10, "norm": "ln"}
VARIANTS = [{"norm": "ln"}, {"norm": "sphere", "unembed": "bounded"}, {"attention": "uniform"}]


def test_zip_variants_times_axes_times_seeds():
    sw = parse_sweep({"base": BASE, "axes": {"lr": [0.001, 0.003]}, "zip": VARIANTS, "seeds": [0, 1]})
    runs = sw.runs()
    assert len(runs) == 2 * 3 * 2
    configs = {(r.config.lr, r.config.norm, r.config.unembed, r.config.attention, r.config.seed) for r in runs}
    want = {(lr, v.get("norm", "ln"), v.get("unembed", "linear"), v.get("attention", "softmax"), s)
            for lr in (0.001, 0.003) for v in VARIANTS for s in (0, 1)}
    assert configs == want  # never norm=ln with unembed=bounded: the variants are not crossed
    names = {r.name for r in runs}
    assert "lr=0.001__norm=sphere__unembed=bounded__seed=1" in names
    assert "attention=uniform__lr=0.003__seed=0" in names  # a field a variant leaves out stays out of the name
    assert sw.to_dict()["zip"] == VARIANTS


def test_zip_as_a_mapping_of_equal_length_lists_is_the_same_grid():
    listed = parse_sweep({"base": BASE, "zip": [{"norm": "ln", "unembed": "linear"},
                                                {"norm": "sphere", "unembed": "bounded"}]})
    mapped = parse_sweep({"base": BASE, "zip": {"norm": ["ln", "sphere"], "unembed": ["linear", "bounded"]}})
    assert [r.name for r in listed.runs()] == [r.name for r in mapped.runs()]
    assert [r.config for r in listed.runs()] == [r.config for r in mapped.runs()]
    # a product alone keeps its names (no zip key: the grids of before)
    plain = parse_sweep({"base": BASE, "axes": {"lr": [0.001]}, "seeds": [0]})
    assert [r.name for r in plain.runs()] == ["lr=0.001__seed=0"]


@pytest.mark.parametrize("zipped,message", [
    ({"norm": ["ln", "sphere"], "unembed": ["linear"]}, "lists of one length"),
    ([{"norm": "ln"}, {"norm": "ln"}], "repeats the entry"),
    ([{"no_such_field": 1}], "is not a config field"),
    ([{"lr": 0.01}], "is also an axis"),
    ([{"seed": 3}], "given by 'seeds'"),
    ([], "non-empty list"),
    ([{"norm": "cube"}], "norm must be one of"),
    # the default written out: one config, which trained twice and counted twice in compare --group-by variant
    ([{"norm": "rms"}, {"norm": "rms", "attention": "softmax"}],
     r"zip entries \{'norm': 'rms'\} and \{'attention': 'softmax', 'norm': 'rms'\} are the same config"),
    ([{"norm": "ln"}, {"attention": "softmax"}], "are the same config"),  # both are the base (norm ln)
])
def test_bad_zips_are_one_line_errors(zipped, message):
    with pytest.raises(BadInput, match=message):
        parse_sweep({"base": BASE, "axes": {"lr": [0.001, 0.003]}, "zip": zipped})

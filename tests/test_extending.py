"""docs/EXTENDING.md's three recipes, run as written: its code blocks installed as a package of
entry points in a temporary directory (the `pyproject.toml` block's entry points, each Python
block as the module the entry point of its recipe names), then the model variant trains, the
analysis runs through `groklens analyze` (checked against an independent computation) and the
experiment shows in `groklens reproduce --list` and runs at smoke scale."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.helpers import groklens

DOC = Path(__file__).resolve().parents[1] / "docs" / "EXTENDING.md"
TINY = ["--p", "7", "--train-frac", "0.5", "--d-model", "16", "--n-heads", "2", "--d-head", "8", "--d-mlp", "32",
        "--steps", "20", "--eval-every", "10", "--checkpoint-every", "10", "--device", "cpu"]


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, re.S | re.M)


def entry_points(toml: str) -> list[tuple[str, str, str]]:
    """(group, name, module) of each entry point of the pyproject block, in order."""
    out, group = [], None
    for line in toml.splitlines():
        if m := re.fullmatch(r'\[project\.entry-points\."([\w.]+)"\]', line.strip()):
            group = m.group(1)
        elif m := re.fullmatch(r'([\w.-]+) = "([\w.]+)"', line.strip()):
            out.append((group, m.group(1), m.group(2)))
    return out


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> dict[str, str]:
    """The doc's package on a path of its own; the environment that finds it."""
    text = DOC.read_text()
    code, (toml,) = blocks(text, "python"), blocks(text, "toml")
    eps = entry_points(toml)
    assert [g for g, _, _ in eps] == ["groklens.models", "groklens.analyses", "groklens.experiments"]
    assert len(code) == len(eps) == 3  # one module per recipe, in the page's order
    site = tmp_path_factory.mktemp("site")
    for (_, _, module), source in zip(eps, code):
        path = site.joinpath(*module.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(source)
    info = site / "groklens_recipes-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: groklens-recipes\nVersion: 0.0\n")
    groups: dict[str, list[str]] = {}
    for group, name, module in eps:
        groups.setdefault(group, []).append(f"{name} = {module}")
    text = "".join(f"[{g}]\n" + "\n".join(lines) + "\n\n" for g, lines in groups.items())
    (info / "entry_points.txt").write_text(text)
    return {"PYTHONPATH": str(site)}


def python(env: dict[str, str], source: str) -> str:
    proc = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1", **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def run(plugin, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("run") / "x3.h5"
    groklens("train", "--model", "transformer_x3", *TINY, "-o", str(path), check=True, env=plugin)
    return path


def test_the_model_variant_trains_with_three_times_the_standard_init(plugin, run):
    # independent of the recipe's code: the standard transformer of the same config and seed
    out = python(plugin, f"""
import torch
from groklens.checkpoints import Trajectory
from groklens.tasks import TASKS
from groklens.models import build_model
traj = Trajectory({str(run)!r})
cfg = traj.config
assert cfg.model == "transformer_x3" and traj.steps[-1] == 20, (cfg.model, traj.steps)
standard = cfg.replace(model="transformer")
ref = dict(build_model(standard, TASKS.get(cfg.task).build(standard)).named_parameters())
got = dict(traj.model(0).named_parameters())
assert set(got) == set(ref)
for k in ref:
    torch.testing.assert_close(got[k], 3.0 * ref[k])
print(len(ref))
""")
    assert int(out) > 5


def test_the_analysis_runs_through_analyze(plugin, run):
    res = json.loads(groklens("analyze", str(run), "--metric", "margin", "--json", "-q", check=True, env=plugin).stdout)
    steps, margins = res["margin"]["steps"], res["margin"]["margin"]
    assert steps == [0, 10, 20]
    # the margin recomputed with numpy from the logits at each checkpoint
    ref = json.loads(python(plugin, f"""
import json, numpy as np, torch
from groklens.checkpoints import Trajectory
traj = Trajectory({str(run)!r})
data = traj.dataset()
out = []
for s in traj.steps:
    with torch.no_grad():
        z = traj.model(s)(data.inputs[data.test_idx])[:, data.readout_pos].double().numpy()
    y = data.labels[data.test_idx].numpy()
    right = z[np.arange(len(y)), y]
    z[np.arange(len(y)), y] = -np.inf
    out.append(float(np.mean(right - z.max(axis=1))))
print(json.dumps(out))
"""))
    assert margins == pytest.approx(ref, rel=1e-9, abs=1e-12)
    # a parameter from the signature; an unknown one is a one-line error
    train = json.loads(groklens("analyze", str(run), "--metric", "margin", "--param", "margin.split=train",
                                "--checkpoints", "20", "--json", "-q", check=True, env=plugin).stdout)
    assert train["margin"]["steps"] == [20] and train["margin"]["margin"][0] != margins[-1]
    bad = groklens("analyze", str(run), "--metric", "margin", "--param", "margin.nope=1", env=plugin)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "nope" in bad.stderr


def test_the_experiment_is_listed_and_runs_at_smoke_scale(plugin, tmp_path):
    listed = groklens("reproduce", "--list", "--no-measure", check=True, env=plugin).stdout
    assert "wd-delay" in listed
    out = tmp_path / "out"
    groklens("reproduce", "wd-delay", "--scale", "smoke", "-o", str(out), check=True, env=plugin, timeout=600)
    result = json.loads((out / "results.json").read_text())
    assert result["experiment"] == "wd-delay" and result["scale"] == "smoke"
    rows = {r["measure"]: r for r in result["rows"]}
    assert set(rows) == {"grok step, weight decay 0.3", "speed-up of weight decay 1 over 0.3"}
    assert rows["speed-up of weight decay 1 over 0.3"]["published"]["value"] == pytest.approx(1 / 0.3)
    assert sorted(p.name for p in (out / "runs").glob("*.h5") if not p.name.endswith(".analyses.h5")) == [
        "wd0.3_s1.h5", "wd1_s1.h5"]


def test_without_the_package_the_names_are_unknown(run):
    proc = groklens("analyze", str(run), "--metric", "norms", "-q")
    assert proc.returncode == 2 and "transformer_x3" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------- the field and regularizer recipes
REPO = DOC.parents[1]
# folder -> where it installs, from pyproject's package-dir (groklens first: the rooms go inside it)
ROOMS = {folder: package.replace(".", "/") for package, folder in
         tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].items()}


def titled_blocks(text: str) -> dict[str, str]:
    """The code blocks with a title (```python title="WHERE"), by title."""
    return dict(re.findall(r'^```python title="([^"]+)"\n(.*?)^```$', text, re.S | re.M))


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> dict[str, str]:
    """A copy of groklens' packages with the field and regularizer blocks put where the doc says;
    the environment (and folder to run in) that imports it instead of the installed groklens."""
    import shutil

    site = tmp_path_factory.mktemp("tree")
    for folder, where in ROOMS.items():
        shutil.copytree(REPO / folder, site / where, ignore=shutil.ignore_patterns("__pycache__"))
    code = titled_blocks(DOC.read_text())
    assert set(code) == {"groklens/config.py: RunConfig", "trainers/regularizers.py"}
    config = site / "groklens" / "config.py"
    text = config.read_text()
    end_of_fields = "\n    # ------------------------------------------------------------------ (de)serialisation"
    assert text.count(end_of_fields) == 1
    config.write_text(text.replace(end_of_fields,
                                   "\n" + code["groklens/config.py: RunConfig"].rstrip() + "\n" + end_of_fields))
    regs = site / "groklens" / "trainers" / "regularizers.py"
    text = regs.read_text()
    assert text.count("\ndef composition_order(") == 1
    regs.write_text(text.replace("\ndef composition_order(",
                                 "\n" + code["trainers/regularizers.py"] + "\n\ndef composition_order("))
    return {"PYTHONPATH": str(site), "cwd": str(tmp_path_factory.mktemp("cwd"))}


def in_tree(tree: dict[str, str], *args: str, **kw):
    return groklens(*args, env={"PYTHONPATH": tree["PYTHONPATH"]}, cwd=tree["cwd"], **kw)


def python_in_tree(tree: dict[str, str], source: str) -> str:
    proc = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=300, cwd=tree["cwd"],
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": tree["PYTHONPATH"]})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_field_is_a_flag_with_its_help_and_its_facts(tree):
    assert tree["PYTHONPATH"] in python_in_tree(tree, "import groklens; print(groklens.__file__)")
    text = " ".join(in_tree(tree, "train", "--help", check=True).stdout.split())
    assert "--hidden-l2-lambda" in text and "weight of the hidden_l2 penalty" in text
    out = json.loads(python_in_tree(tree, """
import json
from groklens.config import RunConfig
from groklens.experiments.ledger import LEGACY_DEFAULTS, config_hash
from groklens.trainers.ensemble import PER_MEMBER_FIELDS
from groklens.trainers.regularizers import COMPOSITION_ORDER
cfg = RunConfig().to_dict()
old = {k: v for k, v in cfg.items() if k != "hidden_l2_lambda"}  # an entry from before the field
print(json.dumps({"legacy": LEGACY_DEFAULTS["hidden_l2_lambda"], "member": "hidden_l2_lambda" in PER_MEMBER_FIELDS,
                  "same": config_hash(cfg) == config_hash(old),
                  "apart": config_hash({**cfg, "hidden_l2_lambda": 0.1}) != config_hash(old),
                  "order": list(COMPOSITION_ORDER)}))
"""))
    assert out == {"legacy": 0.0, "member": True, "same": True, "apart": True,
                   "order": ["act_norm", "geomdr", "kl_attn", "hidden_l2", "grokfast", "grokfast_ma", "perp_grad"]}


def test_the_regularizer_trains_and_logs_its_term_as_its_formula(tree, tmp_path):
    path = tmp_path / "l2.h5"
    in_tree(tree, "train", *TINY, "--hidden-l2-lambda", "0.05", "-o", str(path), check=True)
    # recomputed here from each stored checkpoint: 0.05 * mean ||h||^2 / d over the training inputs
    # at the last block's residual stream, read through TransformerLens' cache
    out = json.loads(python_in_tree(tree, f"""
import json, torch
from groklens.checkpoints import Trajectory
traj = Trajectory({str(path)!r})
data = traj.dataset()
logged = dict(zip(traj.metrics["step"].tolist(), traj.metrics["reg_hidden_l2"].tolist()))
rows = []
for s in traj.steps:
    _, cache = traj.model(s).run_with_cache(data.inputs[data.train_idx])
    h = cache["blocks.0.hook_resid_post"].double()
    rows.append((logged[s], float(0.05 * (h * h).sum(-1).mean() / h.shape[-1])))
print(json.dumps(rows))
"""))
    assert len(out) == 3 and all(got > 0 for got, _ in out)
    for got, want in out:
        assert got == pytest.approx(want, rel=1e-5)


def test_members_with_different_strengths_train_as_one_ensemble(tree, tmp_path):
    out = python_in_tree(tree, f"""
from groklens.checkpoints import Trajectory
from groklens.config import RunConfig
from groklens.trainers.ensemble import ensemble_key, train_ensemble
base = dict(p=7, train_frac=0.5, d_model=16, n_heads=2, d_head=8, d_mlp=32, steps=20, eval_every=10,
            checkpoint_every=10, device="cpu")
cfgs = [RunConfig.from_dict({{**base, "hidden_l2_lambda": lam}}) for lam in (0.0, 0.05)]
assert ensemble_key(cfgs[0]) == ensemble_key(cfgs[1])
paths = [{str(tmp_path)!r} + f"/m{{i}}.h5" for i in range(2)]
train_ensemble(cfgs, paths)
print(" ".join(str(Trajectory(p).metrics.get("reg_hidden_l2", [None])[-1]) for p in paths))
""")
    plain, regularized = out.split()
    assert plain == "None" and float(regularized) > 0  # each member logs its own active terms

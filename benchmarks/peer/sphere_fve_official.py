"""The sphere paper's Fourier FVE by its own code (Fourier_Analysis_Last.ipynb of
AlperYildirim1/geometric-grokking) on a groklens-trained model or on a model its own code trains,
beside groklens' reading of the same weights (analyses/fourier.py, fve_ls_top5), so that "which of
code, model, seed or checkpoint gives the paper's ~62%" can be answered (issue 45).

Their cell is executed unchanged up to its `# EXECUTION` block, except for the assignments of
`SAVE_DIR` and its `os.makedirs`, `DEVICE` (the CPU), and, only where given, `P`, `D_MODEL`,
`NUM_HEADS`, `MLP_DIM`, `LR`, `MAX_EPOCHS` (their sizes for a groklens model; tests use tiny ones).
Their `run_fourier_diagnostics` prints the top 5 frequencies of W_L, the test accuracy with the
logits cut to them, and for each frequency the FVE of the cos (U) and sin (V) directions; its
printout is read back (2 decimals, as they print it). "Their reading" of the paper's number is
the mean of those ten U/V values (docs/REFERENCES.md: the notebook does not say how it aggregates).

  --run RUN.h5 [--at generalized|all|S,S,...]
        a groklens run (post-norm LayerNorm, or the sphere with a bounded or a plain unembedding,
        bidirectional, MLP biases: the notebook's three models) at the first evaluation with test
        accuracy >= 0.99 (the notebook's checkpoint: default), at every stored checkpoint, or at
        the stored checkpoints nearest the steps given. Its weights go into their UnifiedTransformer
        (the logits must agree with groklens' to 1e-4, or the run is refused); their diagnostics
        read the run's own test set.
  --train layernorm|spherical_wd|spherical_nowd --seed S [--cell 1|2]
        their main block for one model, re-typed in its order (make_dataset(P, FRAC_TRAIN, seed);
        set_seed(seed); UnifiedTransformer(...); train_model(..., MAX_EPOCHS, wd): it stops at the first
        logged epoch with test accuracy >= 0.99), then their diagnostics; cell 1 is lr 6e-4, cell 2 lr
        1e-4. The trained weights also go into a groklens model for groklens' reading.

The JSON (--out) holds, per checkpoint, their top 5, U/V values, mean of ten and cut accuracy, and
groklens' fve_ls_top5 with its top 5 and the largest logit difference between the two models.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sphere_official import definitions, read_notebook  # noqa: E402  (benchmarks/peer/sphere_official.py)

NOTEBOOK = "Fourier_Analysis_Last.ipynb"
MARKER = "# EXECUTION"
# their model types -> (groklens config fields, weight decay in their main block)
MODELS = {
    "layernorm": ({"norm": "ln", "norm_placement": "post"}, 1.0),
    "spherical_wd": ({"norm": "sphere", "unembed": "linear"}, 1.0),
    "spherical_nowd": ({"norm": "sphere", "unembed": "bounded"}, 0.0),
}
LOGIT_TOLERANCE = 1e-4


def their_code(repo: Path, cell: int = 1, **sizes) -> tuple[dict, str]:
    """Their cell's definitions (namespace) and the repository commit; `sizes`: P, D_MODEL, ... to set."""
    code, commit = read_notebook(repo, NOTEBOOK, cell - 1)
    save = tempfile.mkdtemp(prefix="sphere_fve_")
    assignments = {"SAVE_DIR": f"SAVE_DIR = {save!r}", "os.makedirs": "os.makedirs(SAVE_DIR, exist_ok=True)",
                   "DEVICE": "DEVICE = torch.device('cpu')",
                   **{k: f"{k} = {v!r}" for k, v in sizes.items() if v is not None}}
    os.environ.setdefault("TQDM_DISABLE", "1")
    ns: dict = {"__name__": "sphere_fve_official"}
    exec(compile(definitions(code, assignments, MARKER), NOTEBOOK, "exec"), ns)  # noqa: S102 - their code, by design
    return ns, commit


def model_type(cfg) -> str:
    """Their model type for a groklens config, or SystemExit naming what their notebook lacks."""
    name = next((n for n, (fields, _) in MODELS.items() if all(getattr(cfg, k) == v for k, v in fields.items())), None)
    if name is None:
        raise SystemExit(f"sphere_fve_official: norm {cfg.norm} ({cfg.norm_placement}), unembed {cfg.unembed} is none "
                         "of the notebook's models (post-norm LayerNorm, sphere with a plain or bounded unembedding)")
    need = {"task": "add", "model": "transformer", "n_layers": 1, "attention": "softmax", "causal": False,
            "mlp_bias": True, "act_fn": "relu", "radius": 1.0, "tau": 10.0, "op_token": False}
    bad = [f"{k} {getattr(cfg, k)!r}" for k, v in need.items() if getattr(cfg, k) != v]
    if cfg.n_heads * cfg.d_head != cfg.d_model:
        bad.append(f"n_heads x d_head {cfg.n_heads * cfg.d_head} != d_model {cfg.d_model}")
    if bad:
        raise SystemExit(f"sphere_fve_official: the notebook's model differs: {', '.join(bad)}")
    return name


def to_theirs(sd: dict, n_heads: int) -> dict:
    """groklens' (TransformerLens-shaped) weights -> their UnifiedTransformer's state dict."""
    h, d, e = sd["blocks.0.attn.W_Q"].shape
    out = {"tok_embed.weight": sd["embed.W_E"], "pos_embed.weight": sd["pos_embed.W_pos"],
           "mlp_in.weight": sd["blocks.0.mlp.W_in"].T, "mlp_in.bias": sd["blocks.0.mlp.b_in"],
           "mlp_out.weight": sd["blocks.0.mlp.W_out"].T, "mlp_out.bias": sd["blocks.0.mlp.b_out"],
           "unembed.weight": sd["unembed.W_U"].T,
           # their W_O: Linear over the heads' outputs concatenated head by head
           "W_O.weight": sd["blocks.0.attn.W_O"].reshape(h * e, d).T}
    for x in "QKV":  # their Linear's output row h*e + j is our W_x[h, :, j]
        out[f"W_{x}.weight"] = sd[f"blocks.0.attn.W_{x}"].permute(0, 2, 1).reshape(h * e, d)
    for theirs, ours in (("norm1", "ln_embed"), ("norm2", "blocks.0.ln1"), ("norm3", "blocks.0.ln2")):
        if f"{ours}.w" in sd:
            out[f"{theirs}.weight"], out[f"{theirs}.bias"] = sd[f"{ours}.w"], sd[f"{ours}.b"]
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def to_groklens(sd: dict, n_heads: int) -> dict:
    """Their state dict -> groklens' weights (the inverse of to_theirs)."""
    d = sd["W_Q.weight"].shape[1]
    e = d // n_heads
    out = {"embed.W_E": sd["tok_embed.weight"], "pos_embed.W_pos": sd["pos_embed.weight"],
           "blocks.0.mlp.W_in": sd["mlp_in.weight"].T, "blocks.0.mlp.b_in": sd["mlp_in.bias"],
           "blocks.0.mlp.W_out": sd["mlp_out.weight"].T, "blocks.0.mlp.b_out": sd["mlp_out.bias"],
           "unembed.W_U": sd["unembed.weight"].T, "blocks.0.attn.W_O": sd["W_O.weight"].T.reshape(n_heads, e, d)}
    for x in "QKV":
        out[f"blocks.0.attn.W_{x}"] = sd[f"W_{x}.weight"].reshape(n_heads, e, d).permute(0, 2, 1)
    for theirs, ours in (("norm1", "ln_embed"), ("norm2", "blocks.0.ln1"), ("norm3", "blocks.0.ln2")):
        if f"{theirs}.weight" in sd:
            out[f"{ours}.w"], out[f"{ours}.b"] = sd[f"{theirs}.weight"], sd[f"{theirs}.bias"]
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def logit_gap(ours, theirs, inputs) -> float:
    """Largest |logit| difference of the two models over `inputs` (groklens reads out at position 2)."""
    import torch

    with torch.no_grad():
        return float((ours(inputs)[:, 2].double() - theirs(inputs).double()).abs().max())


def their_diagnostics(ns: dict, model, name: str, p: int, test_x, test_y) -> dict:
    """Their run_fourier_diagnostics on `model`, its printout read back."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ns["run_fourier_diagnostics"](model, name, p, test_x, test_y)
    text = out.getvalue()
    top = re.search(r"Top 5 Key Frequencies detected in W_L: \[([^\]]*)\]", text)
    cut = re.search(r"Causal Ablation Acc \(Only Top 5 Freqs\):\s*([-\d.]+)%", text)
    uv = [(int(k), float(u), float(v)) for k, u, v in
          re.findall(r"^(\d+)\s*\| U:\s*([-\d.]+)%\s+V:\s*([-\d.]+)%", text, re.M)]
    if top is None or cut is None or not uv:
        raise SystemExit(f"sphere_fve_official: their diagnostics printed something unexpected:\n{text[:500]}")
    values = [x for _, u, v in uv for x in (u, v)]
    return {"top5": [int(k) for k in top.group(1).split(",")], "restricted_acc_pct": float(cut.group(1)),
            "fve_pct": [{"k": k, "U": u, "V": v} for k, u, v in uv], "fve_mean10_pct": sum(values) / len(values)}


def groklens_reading(model, data) -> dict:
    from groklens.analyses.fourier import fourier

    r = fourier(model, data)
    return {"fve_ls_top5": float(r["ls_fve_top_k"]), "top5": [int(k) for k in r["ls_key_frequencies"]]}


def checkpoints_of(traj, at: str) -> list[tuple[int, str]]:
    """(stored step, why) for --at: generalized (the first evaluation with test acc >= 0.99, read at
    the stored checkpoint within one evaluation interval of it), all, or steps."""
    import numpy as np

    from groklens.analyses.phases import phase_checkpoint

    stored = [int(s) for s in traj.steps]
    if at == "all":
        return [(s, "stored") for s in stored]
    if at == "generalized":
        m = traj.metrics
        hit = np.nonzero(np.asarray(m["test_acc"]) >= 0.99)[0]
        step = int(m["step"][hit[0]]) if len(hit) else None
        cp, why = phase_checkpoint(stored, step, traj.config.eval_every, "test accuracy 0.99")
        if cp is None:
            raise SystemExit(f"sphere_fve_official: {traj.path}: no checkpoint at test accuracy 0.99 ({why})")
        return [(cp, f"first evaluation with test accuracy >= 0.99 (step {step})")]
    try:
        wanted = [int(s) for s in at.split(",")]
    except ValueError:
        raise SystemExit(f"sphere_fve_official: --at is generalized, all or steps like 600,800; got {at!r}") from None
    return [(min(stored, key=lambda s: (abs(s - w), -s)), f"nearest to step {w}") for w in wanted]


def on_groklens_run(repo: Path, path: Path, at: str, cell: int = 1) -> dict:
    import numpy as np

    from groklens.checkpoints import Trajectory

    traj = Trajectory(path)
    cfg = traj.config
    kind = model_type(cfg)
    ns, commit = their_code(repo, cell, P=cfg.p, D_MODEL=cfg.d_model, NUM_HEADS=cfg.n_heads, MLP_DIM=cfg.d_mlp)
    data = traj.dataset()
    test_x, test_y = data.inputs[data.test_idx], data.labels[data.test_idx]
    m = traj.metrics
    rows = []
    for step, why in checkpoints_of(traj, at):
        ours = traj.model(step)
        theirs = ns["UnifiedTransformer"](cfg.p, cfg.d_model, cfg.n_heads, cfg.d_mlp, model_type=kind)
        theirs.load_state_dict(to_theirs(dict(ours.state_dict()), cfg.n_heads), strict=True)
        gap = logit_gap(ours, theirs.eval(), data.inputs)
        if gap > LOGIT_TOLERANCE:
            raise SystemExit(f"sphere_fve_official: their model's logits differ from groklens' by {gap:.3g} at step "
                             f"{step}")
        i = int(np.argmin(np.abs(np.asarray(m["step"]) - step)))
        rows.append({"step": step, "why": why, "test_acc": float(m["test_acc"][i]), "logit_gap": gap,
                     "theirs": their_diagnostics(ns, theirs, kind, cfg.p, test_x, test_y),
                     "groklens": groklens_reading(ours, data)})
    return {"model": "groklens-trained", "run": str(path), "model_type": kind, "seed": cfg.seed,
            "data_seed": cfg.data_seed, "split_rule": cfg.split_rule, "lr": cfg.lr, "weight_decay": cfg.weight_decay,
            "notebook": NOTEBOOK, "cell": cell, "repo_commit": commit, "checkpoints": rows}


def on_their_training(repo: Path, kind: str, seed: int, cell: int = 1, p: int | None = None, epochs: int | None = None,
                      lr: float | None = None, sizes: dict | None = None) -> dict:
    import torch

    from groklens.config import RunConfig
    from groklens.tasks import TASKS
    from groklens.models import build_model

    ns, commit = their_code(repo, cell, P=p, MAX_EPOCHS=epochs, LR=lr, **(sizes or {}))
    P, wd = ns["P"], MODELS[kind][1]
    tr_x, tr_y, te_x, te_y = ns["make_dataset"](P, ns["FRAC_TRAIN"], seed=seed)
    ns["set_seed"](seed)
    model = ns["UnifiedTransformer"](P, ns["D_MODEL"], ns["NUM_HEADS"], ns["MLP_DIM"], model_type=kind).to(ns["DEVICE"])
    start = time.process_time()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # their tqdm bar
        res = ns["train_model"](model, kind, tr_x, tr_y, te_x, te_y, ns["MAX_EPOCHS"], weight_decay=wd)
    cpu = time.process_time() - start
    model.eval()
    # groklens' model of the same weights: the add task with their split (python_shuffle, data_seed = seed)
    cfg = RunConfig.from_dict({"task": "add", "p": P, "train_frac": ns["FRAC_TRAIN"], "data_seed": seed,
                               "split_rule": "python_shuffle", "d_model": ns["D_MODEL"], "n_heads": ns["NUM_HEADS"],
                               "d_head": ns["D_MODEL"] // ns["NUM_HEADS"], "d_mlp": ns["MLP_DIM"], "causal": False,
                               "mlp_bias": True, "init_scheme": "torch", "device": "cpu", **MODELS[kind][0]})
    data = TASKS.get("add").build(cfg)
    ours = build_model(cfg, data)
    ours.load_state_dict(to_groklens(model.state_dict(), ns["NUM_HEADS"]), strict=True)
    ours.eval()
    gap = logit_gap(ours, model, data.inputs)
    if gap > LOGIT_TOLERANCE:
        raise SystemExit(f"sphere_fve_official: groklens' model of their weights differs by {gap:.3g} in the logits")
    hist = res["history"]
    with torch.no_grad():
        row = {"step": hist["epochs"][-1] + 1, "why": f"their stop: epoch {hist['epochs'][-1]} (test acc >= 0.99 "
               f"or their last epoch), groklens' step {hist['epochs'][-1] + 1}", "test_acc": hist["test_acc"][-1],
               "logit_gap": gap, "theirs": their_diagnostics(ns, model, kind, P, te_x, te_y),
               "groklens": groklens_reading(ours, data)}
    return {"model": "official-trained", "model_type": kind, "seed": seed, "lr": ns["LR"], "weight_decay": wd,
            "epochs": ns["MAX_EPOCHS"], "grok_epoch": res["grok_epoch"], "cpu_s": cpu, "notebook": NOTEBOOK,
            "cell": cell, "repo_commit": commit, "checkpoints": [row]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, required=True)
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--run", type=Path, help="a groklens run file")
    what.add_argument("--train", choices=sorted(MODELS), help="train this model of theirs first")
    ap.add_argument("--at", default="generalized", help="--run: generalized (default), all, or steps 600,800")
    ap.add_argument("--seed", type=int, default=42, help="--train: their seed (the notebook's: 42)")
    ap.add_argument("--cell", type=int, choices=(1, 2), default=1, help="their cell: 1 = lr 6e-4, 2 = lr 1e-4")
    ap.add_argument("--p", type=int, help="--train: their P unless given (tests)")
    ap.add_argument("--epochs", type=int, help="--train: their MAX_EPOCHS (100,000) unless given")
    ap.add_argument("--lr", type=float, help="--train: their cell's LR unless given")
    ap.add_argument("--d-model", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--d-mlp", type=int)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    if a.run is not None:
        result = on_groklens_run(a.repo, a.run, a.at, a.cell)
    else:
        result = on_their_training(a.repo, a.train, a.seed, a.cell, a.p, a.epochs, a.lr,
                                   {"D_MODEL": a.d_model, "NUM_HEADS": a.heads, "MLP_DIM": a.d_mlp})
    a.out.write_text(json.dumps(result, indent=1))
    for row in result["checkpoints"]:
        print(f"{result['model']} {result['model_type']} seed {result['seed']} step {row['step']} (test acc "
              f"{row['test_acc']:.3f}): their mean of ten {row['theirs']['fve_mean10_pct']:.1f}% (top 5 "
              f"{row['theirs']['top5']}), groklens fve_ls_top5 {100 * row['groklens']['fve_ls_top5']:.1f}% "
              f"(top 5 {row['groklens']['top5']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

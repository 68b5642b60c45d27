"""Train one arm of the bounded-sphere paper with the paper's own code (the official notebooks
of AlperYildirim1/geometric-grokking), on this machine, as a peer of groklens' bounded-sphere
arms (issue 45). Not part of the package: the code run is theirs, read from their repository.

Each notebook is one code cell. It is executed unchanged up to its `# EXECUTION & PLOTTING`
block, except for these assignments, replaced line for line (the run refuses if a line is not
found exactly once, i.e. the notebook changed): `SAVE_DIR` (a Google Drive path) and the
`os.makedirs` after it, `DEVICE` (cpu, or --device), `LR` and `WEIGHT_DECAY` (their values
unless given), `P` (113 unless --p, for tests). Their `__main__` block loops over ten seeds and
several models; for one model and one seed it is re-typed here (RECIPES), keeping the order in
which it seeds and builds models, since that order decides the initial weights:
  sphere_wd1, sphere_wd0   Final_Modular_No_Decay.ipynb: make_dataset(P, FRAC_TRAIN, seed=SEED);
                           set_seed(SEED); StandardTransformer(P, D_MODEL, NUM_HEADS, MLP_DIM, True);
                           set_seed(SEED); train_model(...). The committed notebook has
                           WEIGHT_DECAY = 1.0 (its SAVE_DIR: "..._sphere_decay_added_6e-4"); the
                           paper's errata say the wd 0 row is the same model with WEIGHT_DECAY 0,
                           which sphere_wd0 sets.
  ln, rms                  Final_Modular_Norm_Baselines.ipynb: make_dataset(...); the LayerNorm
                           model, then the RMSNorm model, built in one list (rms is built after
                           ln's init has drawn from the RNG); set_seed(SEED); train_model(...).
Their epoch e is one full-batch AdamW step (betas 0.9, 0.999); they log every 200 epochs after
the step, and `grok_epoch` is the first logged epoch with test accuracy > 0.95 (strictly), so
their epoch e is groklens' step e + 1.

  python benchmarks/peer/sphere_official.py --repo REPO --arm sphere_wd1 --seed 1 --out r.json
REPO: a checkout of the repository, or the git directory `fetch` gives (read with git show).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_repo import head_commit, read  # noqa: E402  (benchmarks/peer/peer_repo.py)

NO_DECAY = "Final_Modular_No_Decay.ipynb"
BASELINES = "Final_Modular_Norm_Baselines.ipynb"
# arm -> (notebook, the models their main block builds in order, the one trained, weight decay, epochs)
RECIPES = {
    "sphere_wd1": (NO_DECAY, ["StandardTransformer(P, D_MODEL, NUM_HEADS, MLP_DIM, True)"], 0, 1.0, 5000),
    "sphere_wd0": (NO_DECAY, ["StandardTransformer(P, D_MODEL, NUM_HEADS, MLP_DIM, True)"], 0, 0.0, 5000),
    "ln": (BASELINES, ["StandardTransformer(P, D_MODEL, NUM_HEADS, MLP_DIM, norm_type='layernorm')",
                       "StandardTransformer(P, D_MODEL, NUM_HEADS, MLP_DIM, norm_type='rmsnorm')"], 0, 1.0, 15000),
    "rms": (BASELINES, ["StandardTransformer(P, D_MODEL, NUM_HEADS, MLP_DIM, norm_type='layernorm')",
                        "StandardTransformer(P, D_MODEL, NUM_HEADS, MLP_DIM, norm_type='rmsnorm')"], 1, 1.0, 15000),
}
MARKER = "# EXECUTION & PLOTTING"


def read_notebook(repo: Path, name: str, cell: int = 0) -> tuple[str, str]:
    """(the notebook's code cell `cell` (0: the first), the repository's commit) from a checkout or
    a git directory."""
    cells = [c for c in json.loads(read(repo, name))["cells"] if c["cell_type"] == "code"]
    return "".join(cells[cell]["source"]), head_commit(repo)


def definitions(cell: str, assignments: dict[str, str], marker: str = MARKER) -> str:
    """The cell up to its main block (`marker`), with each `NAME = ...` line of `assignments` replaced."""
    if cell.count(marker) != 1:
        raise SystemExit(f"sphere_official: the notebook has changed ({marker!r} not found once)")
    code = cell.split(marker, 1)[0]
    for name, value in assignments.items():
        pattern = rf"^{re.escape(name)} = .*$" if not name.startswith("os.") else rf"^{re.escape(name)}.*$"
        code, n = re.subn(pattern, value, code, flags=re.M)
        if n != 1:
            raise SystemExit(f"sphere_official: the notebook has changed ({name} assigned {n} times)")
    return code


def run(repo: Path, arm: str, seed: int, epochs: int | None = None, p: int = 113, lr: float | None = None,
        device: str = "cpu") -> dict:
    notebook, builds, trained, wd, default_epochs = RECIPES[arm]
    cell, commit = read_notebook(repo, notebook)
    save = tempfile.mkdtemp(prefix="sphere_official_")
    assignments = {"SAVE_DIR": f"SAVE_DIR = {save!r}", "os.makedirs": "os.makedirs(SAVE_DIR, exist_ok=True)",
                   "DEVICE": f"DEVICE = torch.device({device!r})", "WEIGHT_DECAY": f"WEIGHT_DECAY = {wd!r}",
                   "P": f"P = {p}"}
    if lr is not None:
        assignments["LR"] = f"LR = {lr!r}"
    os.environ.setdefault("TQDM_DISABLE", "1")
    ns: dict = {"__name__": "sphere_official"}
    exec(compile(definitions(cell, assignments), notebook, "exec"), ns)  # noqa: S102 - their code, by design
    tr_x, tr_y, te_x, te_y = ns["make_dataset"](ns["P"], ns["FRAC_TRAIN"], seed=seed)
    if notebook == NO_DECAY:
        ns["set_seed"](seed)  # their main block seeds right before building the model
    models = [eval(expr, ns) for expr in builds]  # noqa: S307 - their constructors, as their main block writes them
    model = models[trained]
    ns["set_seed"](seed)
    model = model.to(ns["DEVICE"])
    start = time.process_time()
    out = ns["train_model"](model, arm, tr_x, tr_y, te_x, te_y, epochs or default_epochs)
    return {"arm": arm, "seed": seed, "notebook": notebook, "repo_commit": commit, "lr": ns["LR"],
            "weight_decay": ns["WEIGHT_DECAY"], "p": ns["P"], "frac_train": ns["FRAC_TRAIN"], "device": device,
            "epochs": epochs or default_epochs,
            "grok_epoch": out["grok_epoch"], "cpu_s": time.process_time() - start, "history": out["history"],
            "train_pairs": [[int(a), int(b)] for a, b, _ in tr_x.tolist()]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, required=True)
    ap.add_argument("--arm", choices=sorted(RECIPES), required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--epochs", type=int, help="their default: 5000 (sphere), 15000 (ln, rms)")
    ap.add_argument("--lr", type=float, help="their LR (6e-4) unless given (the paper's other rows: 1e-4)")
    ap.add_argument("--p", type=int, default=113)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    result = run(a.repo, a.arm, a.seed, a.epochs, a.p, a.lr, a.device)
    a.out.write_text(json.dumps(result))
    print(f"{a.arm} seed {a.seed}: grok_epoch {result['grok_epoch']} ({result['cpu_s']:.0f} s CPU)")


if __name__ == "__main__":
    sys.exit(main())

"""Zhong et al.'s own trained models (fjzzq2002/pizza, code/save/) read by groklens' Clock/Pizza
analyses, beside what their evaluation notebook printed for the same weights (issue 42).

Their Model A (`modelA = 'p99zdpze5l'`, attention rate 0) is the model code/eval-main.ipynb was
run on: its stored outputs print distance irrelevance (cell 10), gradient symmetricity (cell 12)
and, per circle of principal components (1, 2), (3, 4), (5, 6), the FVE of Q_clock and Q_pizza in
the logits with only that circle kept (cell 21, with the frequencies w = 2 pi inv(delta) / 59
written into the cell). Model B (`l8k1hzciux`, rate 1) has no printed values; its numbers are
reported beside Model A's.

Their model classes are taken from code/train-main.py unchanged (its class definitions, executed
without the script's imports of wandb and plotting) and loaded with their saved state dict. A
TransformerLens wrapper adds `hook_embed` after their `embed` (where their `forward_h` reads the
embedding) and calls their modules in their forward's order; its logits must equal their model's
exactly, or the script stops. groklens' `clock_pizza` and `logit_patterns` then read the wrapper
on their [a, b] inputs (every pair, a-major, read at b's position, as their notebook).

    python benchmarks/peer/pizza_official.py --repo PIZZA_CHECKOUT_OR_GIT_DIR [--model A|B|RUNID ...]
        [--out R.json]
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import re
import sys
from pathlib import Path

import numpy as np
import torch
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from groklens.analyses.clock_pizza import algorithm_label, clock_pizza, logit_patterns
from groklens.tasks import TaskData

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_repo import read  # noqa: E402  (benchmarks/peer/peer_repo.py)

MODELS = {"A": "p99zdpze5l", "B": "l8k1hzciux"}  # eval-main.ipynb, cell 4
CLASSES = ("HookPoint", "Embed", "Unembed", "PosEmbed", "Attention", "MLP", "TransformerBlock", "Transformer")
NOTEBOOK = "code/eval-main.ipynb"


def their_classes(repo: Path) -> dict:
    """Their model classes, the definitions of code/train-main.py executed unchanged."""
    tree = ast.parse(read(repo, "code/train-main.py"))
    defs = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name in CLASSES]
    if sorted(d.name for d in defs) != sorted(CLASSES):
        raise SystemExit("pizza_official: train-main.py has changed (its model classes are not all there)")
    import einops
    import torch.nn.functional as F  # noqa: N812 (their name)
    from torch import nn

    namespace = {"torch": torch, "nn": nn, "F": F, "np": np, "einops": einops}
    exec(compile(ast.Module(body=defs, type_ignores=[]), "train-main.py", "exec"), namespace)  # noqa: S102
    return namespace


def their_model(repo: Path, runid: str):
    """(their Transformer with their saved weights, its config), built as run_experiment builds it."""
    config = json.loads(read(repo, f"code/save/config_{runid}.json"))
    if config.get("diff_vocab") or config.get("eqn_sign") or config.get("use_linear"):
        raise SystemExit(f"pizza_official: {runid} is not a plain [a, b] transformer")
    classes = their_classes(repo)
    model = classes["Transformer"](
        num_layers=config.get("n_layers", 1), num_heads=config["n_heads"], d_model=config["d_model"],
        d_head=config.get("d_head", config["d_model"] // config["n_heads"]), attn_coeff=config["attn_coeff"],
        d_vocab=config["C"], act_type=config.get("act_fn", "relu"), n_ctx=2)
    blob = io.BytesIO(read(repo, f"code/save/model_{runid}.pt", binary=True))
    state = torch.load(blob, map_location="cpu", weights_only=True)  # tensors only: no pickled code runs
    model.load_state_dict(state)
    return model.eval(), config


class Hooked(HookedRootModule):
    """Their model with a TransformerLens hook_embed on the token embedding (their forward_h's t)."""

    def __init__(self, theirs):
        super().__init__()
        self.theirs = theirs
        self.hook_embed = HookPoint()
        self.setup()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # their Transformer.forward, in order
        x = self.theirs.pos_embed(self.hook_embed(self.theirs.embed(tokens)))
        for block in self.theirs.blocks:
            x = block(x)
        return self.theirs.unembed(x)


def their_data(p: int) -> TaskData:
    """Every (a, b) in a-major order (their MyAddDataSet), label (a + b) mod p, read at b."""
    pairs = torch.cartesian_prod(torch.arange(p), torch.arange(p))
    every = torch.arange(len(pairs))
    return TaskData(inputs=pairs, labels=(pairs.sum(1) % p), train_idx=every, test_idx=every, readout_pos=1,
                    informative_mask=torch.ones_like(pairs, dtype=torch.bool), d_vocab=p, d_vocab_out=p)


def printed(repo: Path, p: int) -> dict:
    """What eval-main.ipynb printed for Model A: distance irrelevance, gradient symmetricity, and per
    circle the frequency written into cell 21 (k = inv(delta) mod p, as min(k, p - k)) with its
    Q_clock and Q_pizza (percents, 2 decimals)."""
    cells = [c for c in json.loads(read(repo, NOTEBOOK))["cells"] if c["cell_type"] == "code"]
    text = {i: "".join("".join(o.get("text", "")) for o in c.get("outputs", [])) for i, c in enumerate(cells)}
    out = "\n".join(text.values())
    di = float(re.search(r"Distance Irrelevance ([0-9.]+)", out).group(1))
    gs = float(re.search(r"Gradient Symmetricity ([0-9.]+)", out).group(1))
    (fit_cell,) = [i for i, c in enumerate(cells) if "Qclock & Qpizza" in "".join(c["source"]) and
                   "Qpizzaacomp" not in "".join(c["source"])]
    (wk,) = re.findall(r"^wk=.*$", "".join(cells[fit_cell]["source"]), re.M)  # the frequencies they wrote in
    deltas = [int(d) for d in re.findall(r"inv\((\d+)\)", wk)]
    fits = re.findall(r"([0-9.]+)% & ([0-9.]+)% & ([0-9.]+)%", text[fit_cell])
    freq = [min(pow(d, p - 2, p), p - pow(d, p - 2, p)) for d in deltas]
    return {"distance_irrelevance": di, "gradient_symmetricity": gs, "circle_frequency": freq,
            "circle_q_clock": [float(a) / 100 for a, _, _ in fits],
            "circle_q_pizza": [float(b) / 100 for _, b, _ in fits]}


def read_model(repo: Path, runid: str) -> dict:
    theirs, config = their_model(repo, runid)
    p = config["C"]
    hooked, data = Hooked(theirs), their_data(p)
    with torch.no_grad():
        gap = float((hooked(data.inputs) - theirs(data.inputs)).abs().max())
    if gap != 0.0:
        raise SystemExit(f"pizza_official: the wrapper's logits differ from their model's by {gap:g}")
    measures = clock_pizza(hooked, data)
    patterns = logit_patterns(hooked, data)
    with torch.no_grad():
        accuracy = float((hooked(data.inputs)[:, -1].argmax(-1) == data.labels).double().mean())
    return {"runid": runid, "attn_coeff": config["attn_coeff"], "p": p, "accuracy_all_pairs": accuracy,
            "gradient_symmetricity": measures["gradient_symmetricity"],
            "distance_irrelevance": measures["distance_irrelevance"],
            "label": algorithm_label(measures["gradient_symmetricity"], measures["distance_irrelevance"]),
            "q_clock": patterns["q_clock"], "q_pizza": patterns["q_pizza"],
            "circle_frequency": patterns["circle_frequency"].tolist(),
            "circle_q_clock": patterns["circle_q_clock"].tolist(),
            "circle_q_pizza": patterns["circle_q_pizza"].tolist()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, required=True, help="a checkout of fjzzq2002/pizza or its git directory")
    ap.add_argument("--model", action="append", help="A, B or a run id of code/save (default: A and B)")
    ap.add_argument("--out", type=Path, help="write the result as JSON here")
    args = ap.parse_args(argv)
    if not args.repo.exists():
        print(f"pizza_official: {args.repo} does not exist", file=sys.stderr)
        return 2
    result = {"models": {}}
    for name in args.model or ["A", "B"]:
        result["models"][name] = read_model(args.repo, MODELS.get(name, name))
        if MODELS.get(name) == MODELS["A"]:
            result["models"][name]["printed"] = printed(args.repo, result["models"][name]["p"])
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

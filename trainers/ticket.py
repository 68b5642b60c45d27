"""The attention-mask transfer (`attn_mask_from`): a run takes the readout attention structure of a
grokked run beside it, as a mask, before it trains.

Our reading of the structural-attention account's "lottery-ticket transfer" (docs/VARIANTS.md):
the donor's structure is the smallest set of key positions that holds MASS_COVERED of its readout
query's attention, averaged over every input, head and layer, at its grokking checkpoint (the
first stored checkpoint at or after its grokking step), or at its last checkpoint when it never
grokked. The new run keeps its own initialization (its seed) and learns every weight; only its
readout query is confined to those keys (`attn_mask`, models/transformer.py). The mask is
written into the run's stored config, so its checkpoints rebuild the masked model on their own.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from groklens.config import first_sustained
from groklens.errors import BadInput

if TYPE_CHECKING:  # pragma: no cover
    from groklens.config import RunConfig

MASS_COVERED = 0.9  # ours: the share of the donor's readout attention the transferred keys hold
TRANSFER_FIELDS = ("task", "p", "seq_len", "n_informative", "informative_layout", "distractor_vocab", "model",
                   "n_layers")  # what donor and receiver must share for a mask over the same positions


def donor_path(cfg: RunConfig, out: str | Path) -> Path:
    """The run file attn_mask_from names, beside `out` ({seed} -> cfg.seed)."""
    return Path(out).parent / f"{cfg.attn_mask_from.replace('{seed}', str(cfg.seed))}.h5"


def covering_keys(pattern: np.ndarray, covered: float = MASS_COVERED) -> list[int]:
    """The smallest set of key positions holding `covered` of the readout attention `pattern`
    [L, H, n_ctx] (mean over inputs), averaged over layers and heads; ties keep the lower position."""
    w = np.asarray(pattern, dtype=np.float64).reshape(-1, pattern.shape[-1]).mean(axis=0)
    order = np.argsort(-w, kind="stable")
    need = covered * w.sum()
    k = int(np.searchsorted(np.cumsum(w[order]), need - 1e-12 * max(need, 1.0))) + 1
    return sorted(int(j) for j in order[:k])


def readout_pattern(model, data, batch_size: int = 4096) -> np.ndarray:
    """The readout query's attention pattern of every layer, mean over all inputs: [L, H, n_ctx]."""
    import torch

    sites = sorted((n for n in model.hook_dict if n.startswith("blocks.") and n.endswith(".attn.hook_pattern")),
                   key=lambda n: int(n.split(".")[1]))
    if not sites:
        raise BadInput("attn_mask_from: the donor model has no attention")
    q = int(data.readout_pos)
    sums: dict[str, torch.Tensor] = {}

    def add(act, hook):
        sums[hook.name] = sums.get(hook.name, 0) + act[:, :, q].double().sum(0)

    with torch.no_grad(), model.hooks(fwd_hooks=[(s, add) for s in sites]):
        for chunk in data.inputs.split(batch_size):
            model(chunk)
    return np.stack([(sums[s] / len(data.inputs)).numpy() for s in sites])


def transferred_mask(cfg: RunConfig, out: str | Path) -> str:
    """attn_mask of a run of `cfg` to be written at `out`, from its donor's readout attention."""
    from groklens.checkpoints import Trajectory

    path = donor_path(cfg, out)
    if not path.exists():
        raise BadInput(f"attn_mask_from={cfg.attn_mask_from!r}: the donor run {path} does not exist (it must "
                       "finish before this run starts)")
    traj = Trajectory(path)
    if traj.is_live:
        raise BadInput(f"attn_mask_from: the donor run {path} is still being written")
    donor = traj.config_dict
    differ = [f for f in TRANSFER_FIELDS if donor.get(f) != getattr(cfg, f)]
    if differ:
        raise BadInput(f"attn_mask_from: the donor run {path} differs in {', '.join(differ)}; its mask would "
                       "not be over this run's positions")
    steps = [int(s) for s in traj.steps]
    if not steps:
        raise BadInput(f"attn_mask_from: the donor run {path} holds no checkpoint")
    m = traj.metrics
    evals = int(donor.get("grok_evals", 1))
    hit = first_sustained(np.asarray(m["test_acc"]) >= float(donor.get("grok_threshold", cfg.grok_threshold)), evals)
    grok = None if hit is None else int(np.asarray(m["step"])[hit])
    at = next((s for s in steps if grok is not None and s >= grok), steps[-1])
    keys = covering_keys(readout_pattern(traj.model(at), traj.dataset()))
    return " ".join(map(str, keys))

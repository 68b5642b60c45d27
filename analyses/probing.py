"""Linear probes as an analysis over checkpoints (the probe itself is groklens.probes.linear)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from groklens.analyses.fourier import neuron_fve, resolve_sites
from groklens.analyses.registry import analysis
from groklens.errors import BadInput
from groklens.probes.capture import capture, check_sites, resolve_position
from groklens.probes.grid import modular_grid
from groklens.probes.linear import CLASSIFIERS, SPLITS, TARGETS, check_frequencies, linear_probe, probe_split

if TYPE_CHECKING:  # pragma: no cover
    from groklens.tasks import TaskData


def check(model, data: TaskData, params: dict) -> None:
    site, target = params.get("site"), params.get("target")
    if site is None or target is None:
        raise BadInput("a probe needs a hook site and a target (site=..., target=...)")
    check_sites(model, [site])
    if target not in TARGETS:
        raise BadInput(f"unknown probe target {target!r} (known: {', '.join(TARGETS)})")
    if params.get("split", "random") not in SPLITS:
        raise BadInput(f"probe split must be one of {', '.join(SPLITS)}; got {params.get('split')!r}")
    if params.get("classifier", "logistic") not in CLASSIFIERS:
        raise BadInput(f"probe classifier must be one of {', '.join(CLASSIFIERS)}; got {params.get('classifier')!r}")
    probe_split(data, params.get("split", "random"), params.get("train_frac", 0.5), params.get("seed", 0))
    resolve_position(params.get("position", "readout"), data)
    if target == "fourier":
        grid = modular_grid(data, "the fourier probe target")
        check_frequencies(params.get("frequencies"), grid.p)
        if params.get("frequencies") is None:
            resolve_sites(model, None)  # key frequencies come from the neuron clustering


@analysis("probe", "linear probe (scikit-learn) of a target from a hook site, held-out accuracy or R^2",
          check=check, tier="named", export="probe_checkpoint", order=110)
def probe(model, data: TaskData, *, site: str | None = None, target: str | None = None,
          position="readout", frequencies: Sequence[int] | None = None, split: str = "random",
          train_frac: float = 0.5, seed: int = 0, classifier: str = "logistic", C: float = 1.0,
          alpha: float = 1.0) -> dict:
    """A linear probe at one checkpoint. For target 'fourier' without frequencies, the key
    frequencies of the checkpoint's neuron clustering (definition 2b) are used and returned."""
    params = dict(site=site, target=target, position=position, frequencies=frequencies, split=split,
                  train_frac=train_frac, seed=seed, classifier=classifier)
    check(model, data, params)
    out: dict = {}
    if target == "fourier":
        if frequencies is None:
            grid = modular_grid(data)
            mlp = resolve_sites(model, None)["site"]
            post = capture(model, data.inputs, [mlp], position=int(data.readout_pos))[mlp].double().numpy()
            frequencies = [int(k) for k in neuron_fve(grid.to_grid(post))["key_frequencies_clustered"]]
        out["frequencies"] = np.array(sorted(frequencies), dtype=np.int64)
        if not frequencies:  # nothing clustered yet: no Fourier feature to decode
            tr, te = probe_split(data, split, train_frac, seed)
            out.update({"r2": float("nan"), "train_r2": float("nan"), "r2_per_target": np.zeros(0),
                        "n_train": len(tr), "n_test": len(te)})
            return out
    out.update(linear_probe(model, data, site, target, position=position, frequencies=frequencies, split=split,
                            train_frac=train_frac, seed=seed, classifier=classifier, C=C, alpha=alpha))
    return out

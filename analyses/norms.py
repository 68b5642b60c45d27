"""Weight norms and distance from initialisation, in float64.

  weight_norm                    sqrt(sum over every parameter of ||theta||_F^2)
  norm@<param>                   ||theta_param||_F
  distance_from_init             ||theta - theta_0|| over all parameters, theta_0 = the run's
                                 checkpoint at step 0 (its initialisation)
  relative_distance_from_init    distance_from_init / ||theta_0||
  distance@<param>               ||theta_param - theta_0,param||_F
Distances are present only when initial parameters are given (`compute` passes step 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from groklens.analyses.registry import analysis
from groklens.errors import BadInput

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from groklens.tasks import TaskData


@analysis("norms", "global and per-parameter weight norms, distance from initialisation", needs_init=True,
          export="weight_norms", order=70)
def norms(model, data: TaskData = None, *, init_params: Mapping[str, torch.Tensor] | None = None) -> dict:
    params = {n: p.detach().cpu().double().numpy() for n, p in model.named_parameters()}
    out: dict = {}
    total = 0.0
    for name, w in params.items():
        sq = float((w * w).sum())
        total += sq
        out[f"norm@{name}"] = float(np.sqrt(sq))
    out["weight_norm"] = float(np.sqrt(total))
    if init_params is not None:
        missing = sorted(set(params) - set(init_params))
        if missing:
            raise BadInput(f"initial parameters lack {', '.join(missing)}")
        dist, init_total = 0.0, 0.0
        for name, w in params.items():
            w0 = np.asarray(init_params[name].detach().cpu().double().numpy()
                            if hasattr(init_params[name], "detach") else init_params[name], dtype=np.float64)
            if w0.shape != w.shape:
                raise BadInput(f"initial parameter {name} has shape {w0.shape}, not {w.shape}")
            d = float(((w - w0) ** 2).sum())
            dist += d
            init_total += float((w0 * w0).sum())
            out[f"distance@{name}"] = float(np.sqrt(d))
        out["distance_from_init"] = float(np.sqrt(dist))
        out["relative_distance_from_init"] = float(np.sqrt(dist / init_total)) if init_total > 0 else float("nan")
    return out

"""Permutation routing across model copies (routing_copies M > 1; docs/VARIANTS.md).

M copies of one model train together. The parameters are split into routing units (`units`:
the embedding, each hidden layer or block, the unembedding; with routing_unit=sublayer a
block's attention and MLP apart). At every step and for every unit u a permutation pi_u of
the copies is drawn from the kernel Q; routed model r is built from unit u of copy pi_u(r),
for every u, and trained on slot r's batch:

    objective = sum_r loss(routed model r on batch r)          (each a mean over its batch)

One backward pass then gives copy m's unit u the gradient of exactly one routed path,
r = pi_u^{-1}(m), because pi_u is a permutation; each copy is updated by its own AdamW, as a
single run would be. With the identity kernel (routing_width 0) routed model r *is* copy r and
the copies train exactly like M independent runs with seeds seed, seed+1, ..., seed+M-1
(bit-identical on CPU, tests/trainers/test_routing.py).

The kernel Q (ours; `ring_kernel`): copies sit on a ring, Q_ij proportional to
exp(-d(i, j) / width), d the ring distance; Q is circulant, hence doubly stochastic. width 0 =
identity, width inf = uniform. Sampling (ours; `RouteSampler`): Q = sum_s q_s C^s is a
Birkhoff decomposition into the cyclic shifts C^s (q_s = Q_0s), so drawing a shift s ~ q and
setting pi(r) = (r + s) mod M gives P(pi(r) = j) = Q_rj exactly. Units draw independent
shifts. Only the M cyclic shifts occur, not every permutation.

Evaluation: every copy on its own (`copy<m>.*` columns, the same quantities as a single run's
row) and the ensemble (`ensemble.*`: the mean of the copies' softmax probabilities; accuracy
= its argmax, loss = -log of its probability of the label). The plain columns (`test_acc`, ...)
are copy 0's, so a routed file read as a single run describes copy 0. The stop rule waits
until every copy has grokked (`loop.stop_accuracy`).
"""

from __future__ import annotations

import math
import re
from contextlib import contextmanager

import numpy as np
import torch

from groklens.config import RunConfig
from groklens.trainers.loop import NonFiniteStep, Trainer, warmup_factor
from groklens.trainers.models import build_model
from groklens.trainers.optim import AdamW

ENSEMBLE_METRICS = ("train_loss", "test_loss", "train_acc", "test_acc")
COPY_EXCLUDED = ("lr",)  # metrics shared by every copy, logged once


# ---------------------------------------------------------------------- kernel and sampler
def ring_kernel(copies: int, width: float) -> np.ndarray:
    """Q [M, M], float64: copies on a ring, Q_ij = exp(-d(i, j) / width) / Z (doubly stochastic)."""
    i = np.arange(copies)
    d = np.abs(i[:, None] - i[None, :])
    d = np.minimum(d, copies - d)
    if width == 0:
        return np.eye(copies)
    if math.isinf(width):
        return np.full((copies, copies), 1.0 / copies)
    w = np.exp(-d / width)
    return w / w.sum(axis=1, keepdims=True)


class RouteSampler:
    """Draws one permutation of the copies per routing unit: a cyclic shift s ~ Q[0, :]."""

    def __init__(self, copies: int, width: float, seed: int):
        self.copies = copies
        self.shift_probs = torch.from_numpy(ring_kernel(copies, width)[0])
        self.gen = torch.Generator().manual_seed(seed)

    def sample(self, n_units: int) -> torch.Tensor:
        """[n_units, M] long: row u is pi_u, routed model r takes unit u from copy pi_u[r]."""
        shifts = torch.multinomial(self.shift_probs, n_units, replacement=True, generator=self.gen)
        return (torch.arange(self.copies)[None, :] + shifts[:, None]) % self.copies


def route_seed(cfg: RunConfig) -> int:
    """The route sampler's seed: a stream apart from the copies' init and batch seeds."""
    return int(np.random.SeedSequence([cfg.seed, 3]).generate_state(1)[0])


# ---------------------------------------------------------------------- routing units
_UNIT_RULES = {
    ("transformer", "layer"): [
        (r"^(embed|pos_embed|ln_embed)\.", lambda m: "embed"),
        (r"^blocks\.(\d+)\.", lambda m: f"blocks.{m.group(1)}"),
        (r"^(ln_final|unembed)\.", lambda m: "unembed"),
    ],
    ("transformer", "sublayer"): [
        (r"^(embed|pos_embed|ln_embed)\.", lambda m: "embed"),
        (r"^blocks\.(\d+)\.(ln1|attn)\.", lambda m: f"blocks.{m.group(1)}.attn"),
        (r"^blocks\.(\d+)\.(ln2|mlp)\.", lambda m: f"blocks.{m.group(1)}.mlp"),
        (r"^(ln_final|unembed)\.", lambda m: "unembed"),
    ],
    ("mlp", "layer"): [
        (r"^embed\.", lambda m: "embed"),
        (r"^layers\.(\d+)\.", lambda m: f"layers.{m.group(1)}"),
        (r"^unembed\.", lambda m: "unembed"),
    ],
}


def routing_units(model: str, unit: str, param_names: list[str]) -> list[tuple[str, list[str]]]:
    """[(unit name, its parameter names)] in model order. Every parameter belongs to one unit: a
    parameter no rule knows (a new sub-module) is an error, never silently left unrouted."""
    units: dict[str, list[str]] = {}
    for name in param_names:
        for pattern, key in _UNIT_RULES[(model, unit)]:
            match = re.match(pattern, name)
            if match:
                units.setdefault(key(match), []).append(name)
                break
        else:
            raise RuntimeError(f"routing: parameter {name!r} of model={model} belongs to no routing unit")
    return list(units.items())


def routed_metric_names(names: list[str], copies: int) -> list[str]:
    """A single run's metric names, then every copy's (`copy<m>.<name>`), then the ensemble's."""
    per_copy = [n for n in names if n not in COPY_EXCLUDED]
    return (list(names) + [f"copy{m}.{n}" for m in range(copies) for n in per_copy]
            + [f"ensemble.{n}" for n in ENSEMBLE_METRICS])


# ---------------------------------------------------------------------- the trainer
class RoutedTrainer(Trainer):
    """Trainer of M routed copies. `self.model`, `self.params`, `self.optimizer`, `self.batch_gen`
    are copy 0's, built exactly as a single run's; copies 1..M-1 are built the same way from
    seed+m. Single-run code that reads those attributes (evaluate, host_state, load_state) runs
    per copy inside `_as_copy(m)`."""

    def _setup(self) -> None:
        cfg = self.cfg
        n = cfg.routing_copies
        self.models = [self.model] + [build_model(cfg, self.data, seed=cfg.seed + m).to(self.device)
                                      for m in range(1, n)]
        self.copy_params = [dict(model.named_parameters()) for model in self.models]
        self.optimizers = [self.optimizer] + [
            AdamW(p.values(), lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
            for p in self.copy_params[1:]]
        # slot r's mini-batches: the generator an independent run with seed+r would use
        self.batch_gens = [self.batch_gen] + [torch.Generator().manual_seed(cfg.seed + m + 1) for m in range(1, n)]
        self.grad_norms = [float("nan")] * n
        self.units = routing_units(cfg.model, cfg.routing_unit, list(self.params))
        self.sampler = RouteSampler(n, cfg.routing_width, route_seed(cfg))
        self.routing: torch.Tensor | None = None  # the last step's permutations [n_units, M]

    @property
    def copies(self) -> int:
        return len(self.models)

    @contextmanager
    def _as_copy(self, m: int):
        """Point the single-run attributes at copy m for the duration."""
        saved = self.model, self.params, self.optimizer, self.batch_gen, self.grad_norm
        self.model, self.params, self.optimizer = self.models[m], self.copy_params[m], self.optimizers[m]
        self.batch_gen, self.grad_norm = self.batch_gens[m], self.grad_norms[m]
        try:
            yield
        finally:
            self.model, self.params, self.optimizer, self.batch_gen, self.grad_norm = saved

    # ------------------------------------------------------------------ state for the file
    def host_copies(self) -> list[dict[str, np.ndarray]]:
        return [{n: p.detach().cpu().numpy() for n, p in params.items()} for params in self.copy_params[1:]]

    def host_state(self) -> dict[str, np.ndarray]:
        """Copy 0's state under the single-run keys, copy m's optimizer and batch generator under
        `copy<m>.`, and the route sampler's generator as `rng.route`."""
        out = Trainer.host_state(self)
        for m in range(1, self.copies):
            with self._as_copy(m):
                st = Trainer.host_state(self)
            out.update({f"copy{m}.{k}": v for k, v in st.items() if k.startswith("optim.") or k == "rng.batch"})
        out["rng.route"] = self.sampler.gen.get_state().numpy()
        return out

    def load_copies(self, params: list[dict[str, torch.Tensor]], state: dict[str, np.ndarray], step: int) -> None:
        """Resume: params[m] is copy m's checkpoint; `state` as host_state() wrote it."""
        for m in range(self.copies):
            prefix = f"copy{m}." if m else ""
            own = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)} if m else state
            own["rng.torch"] = state["rng.torch"]
            with self._as_copy(m):
                Trainer.load_state(self, params[m], own, step)
        self.sampler.gen.set_state(torch.from_numpy(np.array(state["rng.route"])))

    # ------------------------------------------------------------------ routed forward
    def routed_params(self, perms: torch.Tensor, r: int) -> dict[str, torch.Tensor]:
        """Routed model r: unit u's parameters from copy perms[u, r]."""
        out = {}
        for u, (_, names) in enumerate(self.units):
            source = self.copy_params[int(perms[u, r])]
            out.update({n: source[n] for n in names})
        return out

    def routed_logits(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """As Trainer.readout_logits, with `params` in place of the template's own."""
        call = torch.func.functional_call
        if getattr(self.model, "supports_readout", False):
            return call(self.model, params, (x,), {"readout": self.readout_slice})
        return call(self.model, params, (x,))[:, self.readout_slice]

    def _batch(self, r: int):
        cfg = self.cfg
        if cfg.batch_size and cfg.batch_size < len(self.train_y):
            pick = torch.randperm(len(self.train_y), generator=self.batch_gens[r])[: cfg.batch_size].to(self.device)
            return self.train_x[pick], self.train_y[pick]
        return self.train_x, self.train_y

    def routed_losses(self, perms: torch.Tensor) -> list[torch.Tensor]:
        """Each routed model's task loss on its slot's batch (draws the slots' mini-batches)."""
        losses = []
        for r in range(self.copies):
            x, y = self._batch(r)
            losses.append(self.task_loss(self.readout(self.routed_logits(self.routed_params(perms, r), x)), y))
        return losses

    def train_step(self, step: int) -> float:
        """One update of every copy; returns routed model 0's task loss."""
        lr = self.cfg.lr * warmup_factor(self.cfg, step)
        for opt in self.optimizers:
            for group in opt.param_groups:
                group["lr"] = lr
        for model in self.models:
            model.train()
        perms = self.sampler.sample(len(self.units))
        self.routing = perms
        losses = torch.stack(self.routed_losses(perms))
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        losses.sum().backward()
        norms = torch.stack([torch.nn.utils.get_total_norm([p.grad for p in params.values() if p.grad is not None])
                             for params in self.copy_params])
        host = torch.cat([losses.detach(), norms.double()]).cpu().numpy()  # one sync per step
        n = self.copies
        if not np.all(np.isfinite(host)):
            bad = int(np.nonzero(~np.isfinite(host))[0][0])
            what = f"loss of routed model {bad}" if bad < n else f"gradient of copy {bad - n}"
            raise NonFiniteStep(f"non-finite {what} ({host[bad]}) at step {step}")
        self.grad_norms = [float(g) for g in host[n:]]
        self.grad_norm = self.grad_norms[0]
        for opt in self.optimizers:
            opt.step()
        return float(host[0])

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self, step: int) -> dict[str, float]:
        """Copy 0's single-run row, every copy's row under `copy<m>.`, and the ensemble's."""
        rows = []
        self._prob_sums: list[torch.Tensor] = []  # per evaluation chunk: the copies' summed probabilities
        for m in range(self.copies):
            self._chunk = 0
            with self._as_copy(m):
                rows.append(Trainer.evaluate(self, step))
        row = dict(rows[0])
        for m, r in enumerate(rows):
            row.update({f"copy{m}.{k}": v for k, v in r.items() if k != "step" and k not in COPY_EXCLUDED})
        row.update(self.ensemble_row())
        return row

    def observe_eval_logits(self, logits: torch.Tensor) -> None:
        p = logits.to(torch.float64).softmax(-1)
        if self._chunk == len(self._prob_sums):  # copy 0
            self._prob_sums.append(p)
        else:
            self._prob_sums[self._chunk] = self._prob_sums[self._chunk] + p
        self._chunk += 1

    @torch.no_grad()
    def ensemble_row(self) -> dict[str, float]:
        """The mean of the copies' softmax probabilities (float64) on every input, from the
        probabilities the per-copy evaluation just summed."""
        probs = torch.cat(self._prob_sums) / self.copies
        self._prob_sums = []
        nll = -probs.gather(-1, self.labels[..., None])[..., 0].log()
        hit = probs.argmax(-1) == self.labels
        loss = nll.mean(-1) if self.multi_target else nll
        hit = (hit.all(-1) if self.multi_target else hit).double()
        return {
            "ensemble.train_loss": float(loss[self.train_idx].mean()),
            "ensemble.test_loss": float(loss[self.test_idx].mean()),
            "ensemble.train_acc": float(hit[self.train_idx].mean()),
            "ensemble.test_acc": float(hit[self.test_idx].mean()),
        }


__all__ = ["RoutedTrainer", "RouteSampler", "ring_kernel", "routing_units", "routed_metric_names", "route_seed"]

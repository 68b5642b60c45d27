"""Permutation routing across model copies (routing_copies M > 1; docs/VARIANTS.md).

M copies of one model train together, each a `single.Lane` (its own module, AdamW,
regularizers and batch order). The parameters are split into routing units (`units`:
the embedding, each hidden layer or block, the unembedding; with routing_unit=sublayer a
block's attention and MLP apart; with routing_unit=weight every scalar weight, the M-cover of
each weight variable: the perceptron's and committee machine's only meaningful unit, since
their one layer routed whole is a whole copy). At every step and for every unit u a permutation pi_u of
the copies is drawn from the kernel Q; routed model r is built from unit u of copy pi_u(r),
for every u, and trained on slot r's batch:

    objective = sum_r [loss + terms](routed model r on batch r)   (each a mean over its batch)

One backward pass then gives copy m's unit u the gradient of exactly one routed path,
r = pi_u^{-1}(m), because pi_u is a permutation; each copy's gradient transforms (Grokfast,
the perpendicular gradient) and its own AdamW then run as in a single run. With the identity
kernel (routing_width 0) routed model r *is* copy r and the copies train exactly like M
independent runs with seeds seed, seed+1, ..., seed+M-1
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
until every copy has grokked (`engine.stop_accuracy`).

Elastic SGD (elastic_gamma > 0; with the identity kernel, the coupled baseline of the paper's
comparison): after the backward pass every copy is pulled toward the copies' mean,
w_m <- w_m - lr_t gamma (w_m - mean_c w_c), then takes its AdamW step with the gradient of its
loss. Ours: the centre is the copies' mean (replicated SGD's barycentre; Elastic Averaging SGD
keeps a centre variable of its own), and the pull is decoupled from the adaptive step, as AdamW
decouples weight decay (a pull toward 0), so it stays proportional to the distance (through
Adam's normalization it would not be).
"""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import numpy as np
import torch

from groklens.config import TEACHER_MODELS, RunConfig
from groklens.trainers.engine import Member, Strategy, nonfinite_reason, resolve_device, warmup_factor
from groklens.models import build_model
from groklens.trainers.regularizers import Batch
from groklens.trainers.evaluation import split_columns
from groklens.trainers.optim import grad_norms
from groklens.trainers.single import Lane
from groklens.trainers.step import RunTensors, check_finite
from groklens.tasks import TaskData

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
        (r"^(embed|pos_embed)\.", lambda m: "embed"),
        (r"^blocks\.(\d+)\.", lambda m: f"blocks.{m.group(1)}"),
        (r"^(ln_final|unembed)\.", lambda m: "unembed"),
    ],
    ("transformer", "sublayer"): [
        (r"^(embed|pos_embed)\.", lambda m: "embed"),
        (r"^blocks\.(\d+)\.(ln1|attn)\.", lambda m: f"blocks.{m.group(1)}.attn"),
        (r"^blocks\.(\d+)\.(ln2|mlp)\.", lambda m: f"blocks.{m.group(1)}.mlp"),
        (r"^(ln_final|unembed)\.", lambda m: "unembed"),
    ],
    ("mlp", "layer"): [
        (r"^embed\.", lambda m: "embed"),
        (r"^layers\.(\d+)\.", lambda m: f"layers.{m.group(1)}"),
        (r"^unembed\.", lambda m: "unembed"),
    ],
    **{(model, "layer"): [(r"^W$", lambda m: "W")] for model in TEACHER_MODELS},
}


def routing_units(model: str, unit: str, param_names: list[str]) -> list[tuple[str, list[str]]]:
    """[(unit name, its parameter names)] in model order. Every parameter belongs to one unit: a
    parameter no rule knows (a new sub-module) is an error, never silently left unrouted. With
    unit=weight each parameter is its own entry, routed element by element (`RoutedRun`)."""
    if unit == "weight":
        return [(name, [name]) for name in param_names]
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


# ---------------------------------------------------------------------- the strategy
class RoutedRun(Strategy):
    """M routed copies written into one file (one member). Lane m is copy m, built from seed+m;
    slot r draws its mini-batches from the generator an independent run with seed+r would use."""

    label = "routed"

    def __init__(self, cfg: RunConfig, data: TaskData, writer_factory=None, progress: bool = False,
                 path: str | Path = ""):
        self.cfg, self.data, self.progress = cfg, data, progress
        self.t = RunTensors(cfg, data, resolve_device(cfg.device))
        self.lanes = [Lane(cfg, data, self.t, build_model(cfg, data, seed=cfg.seed + m), cfg.seed + m)
                      for m in range(cfg.routing_copies)]
        self.units = routing_units(cfg.model, cfg.routing_unit, list(self.lanes[0].params))
        # routing_unit=weight: every element of every parameter is a unit (one permutation each)
        self.elementwise = cfg.routing_unit == "weight"
        self.n_draws = (sum(p.numel() for p in self.lanes[0].params.values()) if self.elementwise
                        else len(self.units))
        self.sampler = RouteSampler(cfg.routing_copies, cfg.routing_width, route_seed(cfg))
        self.routing: torch.Tensor | None = None  # the last step's permutations [n_draws, M]
        self.members = [Member(cfg, data, Path(path))]
        if writer_factory is not None:
            self.members[0].writer = writer_factory(self)
            self.members[0].path = Path(self.members[0].writer.path)

    @property
    def copies(self) -> int:
        return len(self.lanes)

    @property
    def copy_params(self) -> list[dict[str, torch.nn.Parameter]]:
        return [lane.params for lane in self.lanes]

    # ------------------------------------------------------------------ routed forward
    def routed_params(self, perms: torch.Tensor, r: int,
                      stacks: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Routed model r: unit u's parameters from copy perms[u, r]; with routing_unit=weight,
        element i of a parameter from copy perms[i, r] (i counted over the parameters in order),
        gathered from `stacks` ({name: [M, *shape]}, `copy_stacks`)."""
        if not self.elementwise:
            out = {}
            for u, (_, names) in enumerate(self.units):
                source = self.lanes[int(perms[u, r])].params
                out.update({n: source[n] for n in names})
            return out
        stacks = self.copy_stacks() if stacks is None else stacks
        out, start = {}, 0
        for name, stack in stacks.items():
            shape = stack.shape[1:]
            which = perms[start:start + shape.numel(), r].to(stack.device).reshape(1, *shape)
            out[name] = stack.gather(0, which)[0]  # gradients flow back to each copy's elements
            start += shape.numel()
        return out

    def copy_stacks(self) -> dict[str, torch.Tensor]:
        """Every parameter stacked over the copies, {name: [M, *shape]} (differentiable)."""
        return {n: torch.stack([lane.params[n] for lane in self.lanes]) for n in self.lanes[0].params}

    def routed_objectives(self, perms: torch.Tensor, step: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each routed model's task loss and objective on its slot's batch (draws the slots'
        mini-batches). Lane 0's module is the template every routed model runs through."""
        template = self.lanes[0]
        stacks = self.copy_stacks() if self.elementwise else None
        losses, objectives = [], []
        for r in range(self.copies):
            x, y, mask = self.t.batch(self.cfg, self.lanes[r].batch_gen, step)
            logits = self.t.readout(template.forward(x, self.routed_params(perms, r, stacks)))
            loss, objective = template.objective(logits, y, Batch(x, mask, self.t.positions), step)
            losses.append(loss)
            objectives.append(objective)
        return losses, objectives

    def train_step(self, step: int) -> list[tuple[Member, str]]:
        perms = self.sampler.sample(self.n_draws)
        self.routing = perms
        objectives = torch.stack(self.routed_objectives(perms, step)[1])
        for lane in self.lanes:
            lane.zero_grad()
        objectives.sum().backward()
        grads = [lane.grads() for lane in self.lanes]
        host, _ = check_finite(objectives, torch.cat([grad_norms(g) for g in grads]), step)  # one sync per step
        if not np.all(np.isfinite(host)):  # objective r is routed model r's, norm m is copy m's
            which, bad = map(int, np.argwhere(~np.isfinite(host))[0])
            what = f"loss of routed model {bad}" if which == 0 else f"gradient of copy {bad}"
            failed, self.members = self.members[0], []
            return [(failed, nonfinite_reason(what, host[which, bad], step))]
        for lane, g in zip(self.lanes, host[1]):
            lane.grad_norm = float(g)
        self.members[0].grad_norm = self.lanes[0].grad_norm
        if self.cfg.elastic_gamma:
            self.elastic_pull(step)
        for lane, g in zip(self.lanes, grads):
            lane.step(step, g)
        return []

    @torch.no_grad()
    def elastic_pull(self, step: int) -> None:
        """Elastic SGD's coupling: every copy moves toward the copies' mean by lr_t * gamma of its
        distance, w_m <- w_m - lr_t gamma (w_m - mean_c w_c) (lr_t: the step's learning rate after
        warm-up), all from the parameters before the pull."""
        rate = self.cfg.lr * warmup_factor(self.cfg, step) * self.cfg.elastic_gamma
        for name in self.lanes[0].params:
            params = [lane.params[name] for lane in self.lanes]
            centre = torch.stack(params).mean(0)
            for p in params:
                p.add_(centre - p, alpha=rate)

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self, step: int) -> list[dict[str, float]]:
        """Copy 0's single-run row, every copy's row under `copy<m>.`, and the ensemble's."""
        sums: list[torch.Tensor] = []  # per evaluation chunk: the copies' summed probabilities
        rows = []
        for lane in self.lanes:
            counter = itertools.count()  # this copy's chunk index

            def observe(logits: torch.Tensor, chunk=counter) -> None:
                i, p = next(chunk), logits.to(torch.float64).softmax(-1)
                if i == len(sums):  # copy 0
                    sums.append(p)
                else:
                    sums[i] = sums[i] + p

            rows.append(lane.evaluate(step, observe))
        row = dict(rows[0])
        for m, r in enumerate(rows):
            row.update({f"copy{m}.{k}": v for k, v in r.items() if k != "step" and k not in COPY_EXCLUDED})
        row.update(self.ensemble_row(torch.cat(sums) / self.copies))
        return [row]

    def ensemble_row(self, probs: torch.Tensor) -> dict[str, float]:
        """The mean of the copies' softmax probabilities (float64) on every input."""
        t = self.t
        nll = -probs.gather(-1, t.labels[..., None])[..., 0].log()
        hit = probs.argmax(-1) == t.labels
        scores = {"loss": nll.mean(-1) if t.multi_target else nll,
                  "acc": (hit.all(-1) if t.multi_target else hit).double()}
        columns = split_columns({k: v[None] for k, v in scores.items()}, t.train_idx[None], t.test_idx[None])
        return {f"ensemble.{k}": float(v[0]) for k, v in columns.items()}

    # ------------------------------------------------------------------ state for the file
    def host_state(self) -> dict[str, np.ndarray]:
        """Copy 0's state under the single-run keys, copy m's under `copy<m>.`, and the route
        sampler's generator as `rng.route`."""
        out = self.lanes[0].host_state()
        batch = out.pop("rng.batch")
        out["rng.torch"] = torch.get_rng_state().numpy()
        out["rng.batch"] = batch
        for m in range(1, self.copies):
            out.update({f"copy{m}.{k}": v for k, v in self.lanes[m].host_state().items()})
        out["rng.route"] = self.sampler.gen.get_state().numpy()
        return out

    def payloads(self, indices):
        copies = [lane.host_params() for lane in self.lanes[1:]]
        return [(self.lanes[0].host_params(), self.host_state(), copies)]

    def load(self, params, state, copies, step: int) -> None:
        """Resume: `params` is copy 0's checkpoint, copies[m-1] copy m's; `state` as host_state() wrote it."""
        for m, lane in enumerate(self.lanes):
            prefix = f"copy{m}." if m else ""
            own = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)} if m else state
            lane.load_state(params if m == 0 else copies[m - 1], own, step)
        torch.set_rng_state(torch.from_numpy(np.array(state["rng.torch"])))
        self.sampler.gen.set_state(torch.from_numpy(np.array(state["rng.route"])))

    def keep(self, indices):
        self.members = [self.members[i] for i in indices]


__all__ = ["RoutedRun", "RouteSampler", "ring_kernel", "routing_units", "routed_metric_names",
           "route_seed"]

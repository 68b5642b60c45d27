"""Clock or Pizza: gradient symmetricity and distance irrelevance (docs/ANALYSES.md, "clock_pizza").

Zhong, Liu, Tegmark, Andreas 2023, "The Clock and the Pizza" (NeurIPS); their code, repository
fjzzq2002/pizza, code/eval-main.ipynb. For modular addition mod p, logits read at the readout
position, E_i = the token embedding of operand i (hook_embed, before the positional embedding:
their `forward_h` returns `self.embed(x)`):

  gradient_symmetricity = mean over sampled (a, b, c) of cos(dL_c/dE_0, dL_c/dE_1),
      L_c the logit of class c at input (a, b); the samples are the first `n_samples` of all p^3
      triples (a-major order) shuffled by random.Random(seed) (eval-main.ipynb, cell 12,
      "Gradient Symmetricity": 100 triples, seed 42).
  distance_irrelevance = mean_d std_s(L[s, d]) / std(L),
      L[s, d] the correct logit at (a, b) with s = (a+b) mod p, d = (a-b) mod p; std_s over the
      rows for one column d, std over all p^2 entries, both population std (numpy's ddof=0)
      (eval-main.ipynb, cell 10, "Distance Irrelevance": np.mean(np.std(oo, axis=0)) / np.std(oo.flatten())).
      (train-main.py computes its wandb `distance_irrelevancy` from the largest *wrong* logit,
      `oo=np.array(oc)`; we follow the evaluation notebook, which uses the correct logit.)

A clock's logits are a function of E_a * E_b (a rotation product): its gradients are those of one
function times E_b and E_a, whose cosine is cos(w(a-b)), near 0 on average; a pizza's are a
function of E_a + E_b, whose gradients are equal (cosine 1). A pizza's correct logit scales with
|cos(w(a-b)/2)|, a function of the distance d alone (distance irrelevance near 0); a clock's does
not depend on d (near 1).

The labelling rule (ALGORITHM_RULE) is ours, read from their result table result/1l_fixedwidth.csv
(the data behind their phase figure): among its 1-layer runs (2,381), the uniform-attention ones
(attention rate <= 0.1) have gradient symmetricity >= 0.991 in 90 % and distance irrelevance
0.17-0.76 (10th-90th percentile); the learned-attention ones (rate >= 0.9) gradient symmetricity
0.33-0.61 and distance irrelevance 0.75-0.93. The rule labels 96 % of the latter clock and 83 % of
the former pizza, and no run of either group the other's label.
"""

from __future__ import annotations

import functools
import itertools
import random
from typing import TYPE_CHECKING

import numpy as np

from groklens.analyses.registry import analysis
from groklens.errors import BadInput
from groklens.probes.interventions import scoped_hooks

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from groklens.tasks import TaskData

SAMPLES, SEED = 100, 42  # eval-main.ipynb, cell 12
CLOCK_MAX_SYMMETRICITY, CLOCK_MIN_IRRELEVANCE = 0.8, 0.7
PIZZA_MIN_SYMMETRICITY, PIZZA_MAX_IRRELEVANCE = 0.98, 0.7
ALGORITHM_RULE = (f"clock: gradient symmetricity < {CLOCK_MAX_SYMMETRICITY} and distance irrelevance > "
                  f"{CLOCK_MIN_IRRELEVANCE}; pizza: gradient symmetricity > {PIZZA_MIN_SYMMETRICITY} and distance "
                  f"irrelevance < {PIZZA_MAX_IRRELEVANCE}; otherwise neither")


def algorithm_label(gradient_symmetricity: float, distance_irrelevance: float) -> str:
    """clock | pizza | neither by ALGORITHM_RULE."""
    if gradient_symmetricity < CLOCK_MAX_SYMMETRICITY and distance_irrelevance > CLOCK_MIN_IRRELEVANCE:
        return "clock"
    if gradient_symmetricity > PIZZA_MIN_SYMMETRICITY and distance_irrelevance < PIZZA_MAX_IRRELEVANCE:
        return "pizza"
    return "neither"


def operand_positions(data: TaskData) -> tuple[int, int]:
    """The positions of a and b: the task's informative ones ([a, b, =]: 0, 1; [a, op, b, =]: 0, 2)."""
    pos = np.nonzero(data.informative_mask[0].numpy())[0]
    if len(pos) != 2 or not bool((data.informative_mask == data.informative_mask[0]).all()):
        raise BadInput("clock/pizza measures need two operand positions, the same in every input")
    return int(pos[0]), int(pos[1])


def check(model, data: TaskData, params: dict) -> int:
    """p of the run; refuses a model without hook_embed, a multi-target task, an even p."""
    operand_positions(data)
    if "hook_embed" not in model.hook_dict:
        raise BadInput("clock/pizza measures need the token embeddings: this model has no hook_embed hook")
    if data.n_targets:
        raise BadInput("clock/pizza measures read one readout position; this task has several")
    p = int(operands(data).max()) + 1  # the residues (d_vocab_out also counts an op token's class)
    if p % 2 == 0:  # (a+b, a-b) mod p is a bijection of the grid only for odd p
        raise BadInput(f"distance irrelevance needs an odd p; got {p}")
    n = params.get("n_samples", SAMPLES)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise BadInput(f"n_samples must be an integer >= 1; got {n!r}")
    return p


@functools.lru_cache(maxsize=4)  # the same sample at every checkpoint; shuffling p^3 triples takes ~1 s at p=113
def sample_triples(p: int, n: int, seed: int) -> tuple[tuple[int, int, int], ...]:
    """Their sample: every (a, b, c) in a-major order, shuffled by random.Random(seed), the first n."""
    xs = list(itertools.product(range(p), repeat=3))
    random.Random(seed).shuffle(xs)
    return tuple(xs[:n])


def operands(data: TaskData) -> np.ndarray:
    """a, b of every input: [N, 2]."""
    return data.inputs[:, list(operand_positions(data))].numpy()


def grid_rows(data: TaskData, pairs) -> np.ndarray:
    """The input row of each operand pair (a, b)."""
    where = {(int(a), int(b)): i for i, (a, b) in enumerate(operands(data).tolist())}
    try:
        return np.array([where[(int(a), int(b))] for a, b in pairs])
    except KeyError as exc:
        raise BadInput(f"the task's inputs have no row for operands {exc.args[0]}") from None


def embedding_gradients(model, tokens: torch.Tensor, classes: torch.Tensor, readout_pos: int) -> np.ndarray:
    """d logit[i, readout_pos, classes[i]] / d hook_embed[i] for each input i: [N, n_ctx, d_model].
    Inputs do not interact, so one backward of the sum gives every input's own gradient."""
    import torch

    leaf = {}

    def as_leaf(act, hook):  # the embedding as a leaf tensor whose gradient we read
        leaf["x"] = act.detach().requires_grad_(True)
        return leaf["x"]

    device = next(model.parameters()).device
    with torch.enable_grad(), scoped_hooks(model, [("hook_embed", as_leaf)]):
        logits = model(tokens.to(device))
        chosen = logits[torch.arange(len(tokens)), readout_pos, classes.to(device)]
        (grad,) = torch.autograd.grad(chosen.sum(), leaf["x"])
    return grad.detach().double().cpu().numpy()


def cosines(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of [N, d] arrays."""
    return (u * v).sum(-1) / np.linalg.norm(u, axis=-1) / np.linalg.norm(v, axis=-1)


@analysis("gradient_symmetricity", "Clock/Pizza gradient symmetricity: cosine of the logit's gradients "
          "w.r.t. the two operand embeddings (Zhong et al. 2023)", tier="named", check=check, tasks=("add",), order=120)
def gradient_symmetricity(model, data: TaskData, *, n_samples: int = SAMPLES, seed: int = SEED) -> dict:
    """gradient_symmetricity (mean cosine over the sampled triples) and cosines [n_samples]."""
    import torch

    p = check(model, data, {"n_samples": n_samples})
    triples = np.array(sample_triples(p, n_samples, seed))
    tokens = data.inputs[grid_rows(data, triples[:, :2])]
    grad = embedding_gradients(model, tokens, torch.as_tensor(triples[:, 2]), data.readout_pos)
    i, j = operand_positions(data)
    cos = cosines(grad[:, i], grad[:, j])
    return {"gradient_symmetricity": float(cos.mean()), "cosines": cos}


def correct_logit_grid(model, data: TaskData, p: int) -> np.ndarray:
    """L[(a+b) mod p, (a-b) mod p] = the correct logit at (a, b), [p, p]."""
    import torch

    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(data.inputs.to(device))[:, data.readout_pos].double().cpu()
    correct = logits.gather(1, data.labels[:, None])[:, 0].numpy()
    a, b = operands(data).T
    grid = np.full((p, p), np.nan)
    grid[(a + b) % p, (a - b) % p] = correct
    return grid


def irrelevance(grid: np.ndarray) -> float:
    """mean over columns d of std over rows s, over the std of every entry (population std)."""
    return float(np.mean(np.std(grid, axis=0)) / np.std(grid.reshape(-1)))


@analysis("distance_irrelevance", "Clock/Pizza distance irrelevance: how little the correct logit depends on "
          "(a-b) mod p (Zhong et al. 2023)", tier="named", check=check, tasks=("add",), order=120)
def distance_irrelevance(model, data: TaskData) -> dict:
    """distance_irrelevance and correct_logits [p, p] (rows (a+b) mod p, columns (a-b) mod p)."""
    p = check(model, data, {})
    grid = correct_logit_grid(model, data, p)
    if np.isnan(grid).any():
        raise BadInput("distance irrelevance needs every (a, b) of the grid among the task's inputs")
    return {"distance_irrelevance": irrelevance(grid), "correct_logits": grid}


@analysis("clock_pizza", "Clock/Pizza at a glance: gradient symmetricity, distance irrelevance and the "
          "label of ALGORITHM_RULE (is_clock, is_pizza)", tier="named", check=check, tasks=("add",), order=120)
def clock_pizza(model, data: TaskData, *, n_samples: int = SAMPLES, seed: int = SEED) -> dict:
    """Both measures and the rule's label as is_clock / is_pizza (1 or 0; both 0: neither)."""
    gs = gradient_symmetricity(model, data, n_samples=n_samples, seed=seed)["gradient_symmetricity"]
    di = distance_irrelevance(model, data)["distance_irrelevance"]
    label = algorithm_label(gs, di)
    return {"gradient_symmetricity": gs, "distance_irrelevance": di,
            "is_clock": int(label == "clock"), "is_pizza": int(label == "pizza")}


# ------------------------------------------------------------- logit patterns (eval-main.ipynb, cell 21)
CIRCLES = 3  # cell 21 isolates the circles of principal components (1, 2), (3, 4), (5, 6)


def check_circles(model, data: TaskData, params: dict) -> int:
    """check(), and n_circles an integer >= 1."""
    p = check(model, data, {})
    n = params.get("n_circles", CIRCLES)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise BadInput(f"n_circles must be an integer >= 1; got {n!r}")
    return p


def number_embeddings(model, data: TaskData, p: int) -> np.ndarray:
    """E[t] = hook_embed at operand a's position of the input (t, 0), for t < p: [p, d_model]
    (read through the hook, so any model with hook_embed will do)."""
    import torch

    kept = {}
    pos = operand_positions(data)[0]

    def keep(act, hook):
        kept["e"] = act[:, pos].detach().double().cpu().numpy()

    device = next(model.parameters()).device
    with torch.no_grad(), scoped_hooks(model, [("hook_embed", keep)]):
        model(data.inputs[grid_rows(data, [(t, 0) for t in range(p)])].to(device))
    return kept["e"]


def circle_frequency(scores: np.ndarray) -> int:
    """The frequency k in 1..(p-1)/2 with the most power in a principal component's scores [p] taken
    as a function of the residue t. Their cell 8 finds, per component, the step i whose sequence
    vs[t i mod p] is most like one cosine of t, and cell 21 uses w = 2 pi i^-1 / p for the circle
    whose first component that is: the same k, as sum_t vs[t i] e^(2 pi i t / p) is the DFT of vs at
    k = i^-1 mod p (and k, p - k give the same patterns)."""
    power = np.abs(np.fft.fft(scores)) ** 2
    return 1 + int(np.argmax(power[1:(len(scores) - 1) // 2 + 1]))


def logit_patterns_for(p: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Their Q_clock and Q_pizza over (a, b, c), [p, p, p], at w = 2 pi k / p (cell 21's oa, ob):
    clock cos(w(a+b-c)); pizza |<s, u>| - |<s, u_perp>|, s = z_a + z_b, u = (cos wc/2, sin wc/2)."""
    w = 2 * np.pi * k / p
    a, b, c = np.meshgrid(np.arange(p), np.arange(p), np.arange(p), indexing="ij")
    clock = np.cos(w * (a + b - c))
    s0, s1 = np.cos(w * a) + np.cos(w * b), np.sin(w * a) + np.sin(w * b)
    co, si = np.cos(w * c / 2), np.sin(w * c / 2)
    return clock, np.abs(co * s0 + si * s1) - np.abs(-si * s0 + co * s1)


def pattern_fve(logits: np.ndarray, pattern: np.ndarray) -> float:
    """sklearn's explained_variance_score(z(logits), z(pattern)) of the standardized arrays, as cell 21:
    1 - var(z(logits) - z(pattern)) = 2 corr - 1 (can be negative); NaN where the logits are constant
    (nothing to explain)."""
    if logits.std() == 0:
        return float("nan")

    def z(x):
        return (x - x.mean()) / x.std()

    return float(1 - np.var(z(logits.reshape(-1)) - z(pattern.reshape(-1))))


def isolated_circle_logits(model, data: TaskData, p: int, embeddings: np.ndarray, basis: np.ndarray) -> np.ndarray:
    """Logits [a, b, c] (c < p, at the readout) with each operand's embedding replaced by the mean
    embedding plus its projection on `basis` [2, d] (cell 21's PCA inverse_transform with every other
    component zeroed); other tokens (an '=' or op token) keep theirs."""
    import torch

    mean = embeddings.mean(0)
    iso = mean + (embeddings - mean) @ basis.T @ basis
    tokens = data.inputs[grid_rows(data, itertools.product(range(p), repeat=2))]  # a-major
    i, j = operand_positions(data)
    device = next(model.parameters()).device

    def swap(act, hook):
        table = torch.as_tensor(iso, dtype=act.dtype, device=act.device)
        act = act.clone()
        act[:, i], act[:, j] = table[tokens[:, i].to(act.device)], table[tokens[:, j].to(act.device)]
        return act

    with torch.no_grad(), scoped_hooks(model, [("hook_embed", swap)]):
        logits = model(tokens.to(device))[:, data.readout_pos, :p]
    return logits.double().cpu().numpy().reshape(p, p, p)


@analysis("logit_patterns", "Clock/Pizza logit patterns: the FVE of Q_clock and Q_pizza in the logits of each "
          "embedding circle isolated by PCA (Zhong et al. 2023, eval-main.ipynb cell 21)", tier="named",
          check=check_circles, tasks=("add",), order=120)
def logit_patterns(model, data: TaskData, *, n_circles: int = CIRCLES) -> dict:
    """Per circle (principal components 2i+1, 2i+2 of the operand embeddings): its frequency and the
    FVE of their clock and pizza logit patterns in the logits with only that circle kept; q_clock and
    q_pizza are the means over circles. Their Model A (pizza) prints Q_clock 75 %, Q_pizza 98 % per circle."""
    p = check_circles(model, data, {"n_circles": n_circles})
    emb = number_embeddings(model, data, p)
    if 2 * n_circles > min(p - 1, emb.shape[1]):
        raise BadInput(f"{n_circles} circles need {2 * n_circles} principal components; the {p} operand "
                       f"embeddings in {emb.shape[1]} dimensions have at most {min(p - 1, emb.shape[1])}")
    centred = emb - emb.mean(0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    freq, q_clock, q_pizza = [], [], []
    for n in range(n_circles):
        basis = vt[2 * n:2 * n + 2]
        k = circle_frequency(centred @ basis[0])
        logits = isolated_circle_logits(model, data, p, emb, basis)
        clock, pizza = logit_patterns_for(p, k)
        freq.append(k)
        q_clock.append(pattern_fve(logits, clock))
        q_pizza.append(pattern_fve(logits, pizza))
    return {"q_clock": float(np.mean(q_clock)), "q_pizza": float(np.mean(q_pizza)),
            "circle_frequency": np.array(freq), "circle_q_clock": np.array(q_clock),
            "circle_q_pizza": np.array(q_pizza)}

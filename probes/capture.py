"""Activation capture over a task's inputs, through TransformerLens hooks only.

`capture(model, inputs, sites)` runs `model.run_with_cache` with a names filter over batches
of inputs and returns one CPU tensor per hook site, concatenated over the batches, so the
full p^2 grid at p=113 fits comfortably in memory (one batch's cache at a time).
Any `HookedRootModule` of ours works: sites are TransformerLens hook names
(`blocks.{l}.hook_resid_post`, `blocks.{l}.mlp.hook_post`, `blocks.{l}.attn.hook_pattern`, ...).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from groklens.errors import BadInput

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from groklens.tasks import TaskData

DEFAULT_BATCH = 4096  # inputs per forward pass (bounds the size of one cache)

# hooks whose tensors are [batch, head, query, key]: the position axis is the query axis
_QUERY_AXIS_SUFFIXES = ("hook_pattern", "hook_attn_scores")


def hook_names(model) -> list[str]:
    """Every hook site of `model`, sorted."""
    return sorted(model.hook_dict)


def check_sites(model, sites: Iterable[str]) -> list[str]:
    """The sites as a list, or BadInput naming the ones the model does not have."""
    sites = list(sites)
    if not sites:
        raise BadInput("no hook site given")
    for s in sites:
        if not isinstance(s, str):
            raise BadInput(f"a hook site is a hook name string, got {s!r}")
    unknown = [s for s in sites if s not in model.hook_dict]
    if unknown:
        raise BadInput(
            f"unknown hook site(s) {', '.join(unknown)} for this model "
            f"(known: {', '.join(hook_names(model))})"
        )
    return sites


def position_axis(site: str, ndim: int) -> int | None:
    """The axis that indexes sequence positions in the activation of `site`, or None."""
    if site.endswith(_QUERY_AXIS_SUFFIXES):
        return 2
    return 1 if ndim >= 3 else None  # [b, d] activations (an MLP model) have no position axis


def select_position(act: torch.Tensor, site: str, position: int | None) -> torch.Tensor:
    """The activation at one sequence position (the query position for attention patterns)."""
    if position is None:
        return act
    axis = position_axis(site, act.ndim)
    if axis is None:
        return act
    n = act.shape[axis]
    if not -n <= position < n:
        raise BadInput(f"position {position} is outside the {n} positions of {site}")
    return act.select(axis, position)


def resolve_position(position, data: TaskData) -> int | None:
    """'readout' -> the task's readout position; 'all' -> None (every position); int -> itself."""
    if position is None or position == "all":
        return None
    if position == "readout":
        return int(data.readout_pos)
    if isinstance(position, bool) or not isinstance(position, int):
        raise BadInput(f"position must be 'readout', 'all' or an integer; got {position!r}")
    if not -data.n_ctx <= position < data.n_ctx:
        raise BadInput(f"position {position} is outside the task's {data.n_ctx} positions")
    return position


def capture(
    model,
    inputs: torch.Tensor,
    sites: Sequence[str],
    *,
    position: int | None = None,
    batch_size: int = DEFAULT_BATCH,
    return_logits: bool = False,
):
    """Activations of `sites` for every input: {site: CPU tensor [N, ...]}.

    `position` keeps one sequence position (the query position of attention patterns).
    With `return_logits`, also returns the logits [N, n_ctx, d_vocab_out] as a second value.
    Runs without gradients; hooks live only inside `run_with_cache`'s scope.
    """
    import torch

    sites = check_sites(model, sites)
    if batch_size < 1:
        raise BadInput(f"batch_size must be >= 1; got {batch_size}")
    device = next(model.parameters()).device
    parts: dict[str, list[torch.Tensor]] = {s: [] for s in sites}
    logits_parts: list[torch.Tensor] = []
    with torch.no_grad():
        for start in range(0, len(inputs), batch_size):
            batch = inputs[start : start + batch_size].to(device)
            logits, cache = model.run_with_cache(batch, names_filter=list(sites))
            for s in sites:
                parts[s].append(select_position(cache[s], s, position).detach().cpu())
            if return_logits:
                logits_parts.append(logits.detach().cpu())
            del cache
    acts = {s: torch.cat(v) for s, v in parts.items()}
    if return_logits:
        return acts, torch.cat(logits_parts)
    return acts

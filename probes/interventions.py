"""Interventions through scoped hooks only: a hook lives exactly as long as its `with` block.

`scoped_hooks` wraps TransformerLens's `model.hooks(...)` (which removes the hooks of its own
context level in a `finally`) and then checks that the model holds no more hooks than before,
so an analysis that raises, anywhere, leaves the model as it found it. Hooks the caller added
in an outer scope are kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from groklens.probes.capture import DEFAULT_BATCH, check_sites, position_axis

if TYPE_CHECKING:  # pragma: no cover
    import torch

Hook = tuple[str, Callable]


def hook_count(model) -> int:
    """Forward and backward hooks registered on any submodule of `model` (PyTorch level)."""
    n = 0
    for module in model.modules():
        n += len(module._forward_hooks) + len(module._forward_pre_hooks)
        n += len(module._backward_hooks) + len(getattr(module, "_backward_pre_hooks", {}))
    return n


class HookLeak(RuntimeError):
    """A scope ended with more hooks on the model than it started with (a bug, not bad input)."""


@contextmanager
def scoped_hooks(model, fwd_hooks: Sequence[Hook] = (), bwd_hooks: Sequence[Hook] = ()) -> Iterator:
    """Add hooks for the duration of the block; they are removed even when the block raises."""
    names = [name for name, _ in (*fwd_hooks, *bwd_hooks)]
    if names:
        check_sites(model, names)
    before = hook_count(model)
    try:
        with model.hooks(fwd_hooks=list(fwd_hooks), bwd_hooks=list(bwd_hooks)):
            yield model
    finally:
        after = hook_count(model)
        if after > before:
            # never leave hooks behind, even if TransformerLens's own cleanup missed some
            model.reset_hooks(including_permanent=False)
            raise HookLeak(f"{after - before} hook(s) were left on the model after an intervention")


def replace_position(values: torch.Tensor, site: str, position: int) -> Callable:
    """A forward hook setting `act[..., position, ...] = values` (rows of the current batch)."""

    def hook(act, hook):
        axis = position_axis(site, act.ndim)
        out = act.clone()
        if axis is None:
            out[...] = values.to(act.dtype).to(act.device)
        else:
            index = [slice(None)] * act.ndim
            index[axis] = position
            out[tuple(index)] = values.to(act.dtype).to(act.device)
        return out

    return hook


def run_patched(
    model,
    inputs: torch.Tensor,
    patches: Mapping[str, tuple[int, torch.Tensor]],
    *,
    batch_size: int = DEFAULT_BATCH,
) -> torch.Tensor:
    """Logits [N, n_ctx, vocab] with `site`'s activation at `position` replaced by `values[i]`
    for input i, for each `site: (position, values [N, ...])` of `patches`. No gradients."""
    import torch

    check_sites(model, list(patches))
    device = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for start in range(0, len(inputs), batch_size):
            stop = min(start + batch_size, len(inputs))
            hooks = [
                (site, replace_position(values[start:stop], site, position))
                for site, (position, values) in patches.items()
            ]
            with scoped_hooks(model, fwd_hooks=hooks):
                out.append(model(inputs[start:stop].to(device)).detach().cpu())
    return torch.cat(out)

"""torch.optim.AdamW (and Adam) without the compiler stack: the same code, the same update to the bit.

torch.optim wraps `Optimizer.add_param_group`, `zero_grad`, `state_dict` and `load_state_dict`
in `torch._disable_dynamo`, and `Adam.step` in `_use_grad_for_differentiable`; both wrappers
import `torch._dynamo` on their first call (the constructor already calls add_param_group) so
that torch.compile can trace around them. That import costs about as much as `import torch`
itself, paid by every `groklens train` before its first step. groklens never compiles its
optimizer, so `AdamW` here calls the undecorated methods (the functions the wrappers hold as
`__wrapped__`) and sets the grad mode as `_use_grad_for_differentiable` does, minus its
`torch._dynamo.graph_break()` calls, which do nothing outside torch.compile. Where a torch
version lacks `__wrapped__` on a method, `inspect.unwrap` returns the method itself and that
method keeps torch's behaviour (correct, only slower to start).
"""

from __future__ import annotations

import inspect

import torch

_STEP = inspect.unwrap(torch.optim.AdamW.step)  # past torch's profile hook and grad-mode wrapper
_ADAM_STEP = inspect.unwrap(torch.optim.Adam.step)


class AdamW(torch.optim.AdamW):
    """torch.optim.AdamW (same arguments, state and state_dict) whose first calls do not
    import torch._dynamo; see the module docstring."""

    add_param_group = inspect.unwrap(torch.optim.Optimizer.add_param_group)
    zero_grad = inspect.unwrap(torch.optim.Optimizer.zero_grad)
    state_dict = inspect.unwrap(torch.optim.Optimizer.state_dict)
    load_state_dict = inspect.unwrap(torch.optim.Optimizer.load_state_dict)

    def step(self, closure=None):
        with torch.set_grad_enabled(self.defaults["differentiable"]):  # what _use_grad_for_differentiable does
            return _STEP(self, closure)


class Adam(torch.optim.Adam):
    """torch.optim.Adam, the same way: its weight_decay is the coupled L2 term (wd * w added to
    the gradient before the moments), not AdamW's decoupled decay (config optimizer=adam)."""

    add_param_group = AdamW.add_param_group
    zero_grad = AdamW.zero_grad
    state_dict = AdamW.state_dict
    load_state_dict = AdamW.load_state_dict

    def step(self, closure=None):
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return _ADAM_STEP(self, closure)


OPTIMIZERS = {"adamw": AdamW, "adam": Adam}  # config field `optimizer`

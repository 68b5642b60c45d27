"""GroklensCache: TransformerLens's ActivationCache for groklens models, with decompositions and
direct logit attribution that are right on every variant (docs/TRANSFORMERLENS.md).

Pre-norm and norm-free models have an additive residual stream, and TL's own methods apply.
With a post-norm LayerNorm/RMSNorm or the sphere projection a norm follows the embedding and
every residual sum (ln_embed; blocks.{l}.ln1 after the attention sum; blocks.{l}.ln2 after the
MLP sum), and no norm stands between the stream and its readers. With each norm's scale held at
its cached value (the linearization TL uses for a pre-norm model's final norm) a norm is affine,
N_j(x) = P_j(x) / s_j * w_j + b_j (P_j centres for LayerNorm; the sphere has neither w nor b), so
the stream at any point is exactly the sum of each component's output carried through the norms
between where it is added and that point, plus the norms' biases carried the same way. On these
variants every decomposition (decompose_resid, stack_head_results, stack_neuron_results,
get_full_resid_decomposition) returns those carried contributions to the stream at its target:
the input of layer l's attention (layer=l), of its MLP (mlp_input=True), or the unembedding
(layer=-1). So the rows sum to that stream (with a "bias" row where the norms have biases), and
their logit_attrs to the logit difference. apply_ln_to_stack carries a stack from the target it
was built for to a later one; at the same target, and for stream states (accumulated_resid), it
changes nothing, since the readers read the stream itself. A stack it cannot place (made by
hand, or by arithmetic on a stack) is refused there, as is a target before the stack's own.
"""

from __future__ import annotations

from typing import Any

import torch
from transformer_lens import ActivationCache

from groklens.models.stream import (
    STATE, carry_stack, decompose_resid, full_resid_decomposition, stack_head_results, stack_neuron_results,
    tag_stack, target_of,
)
from groklens.models.tl_errors import TLUnknownName, TLUnsupported

class GroklensCache(ActivationCache):
    """TL's ActivationCache: refuses (one-line TLUnsupported) on the MLP model, which has no residual
    stream; on post-norm and sphere models decomposes the stream into carried contributions (the
    module docstring); a missing name gets a one-line message (TLUnknownName, a KeyError)."""

    def __getitem__(self, key):
        try:
            return super().__getitem__(key)
        except KeyError:
            name = key if isinstance(key, str) else _act_name(key, self.model.cfg.n_layers)
            if name in self.model.hook_dict:
                raise TLUnknownName(f"{name} is not in this cache: it was filtered out by names_filter, or fires only "
                                    "with a set_use_* flag (hook_result: set_use_attn_result(True))") from None
            raise TLUnknownName(self.model.unknown_name_message(name)) from None

    # ------------------------------------------------------------------ which path
    def _stream(self, what: str) -> bool:
        """True when the decomposition must be carried through norms (post-norm, sphere)."""
        if not hasattr(self.model, "blocks"):
            raise TLUnsupported(f"{what}: the MLP model has no residual stream; read its hooks "
                                "(hook_input, layers.{i}.hook_pre/hook_post, hook_logits) directly")
        return not self.model.cfg.additive_stream

    def _no_norm(self, apply_ln: bool) -> bool:
        """TL's cached-scale norm on a model with no norm at all is the identity (TL looks for a scale)."""
        return apply_ln and self.model.cfg.norm == "none"

    def accumulated_resid(self, layer=None, incl_mid=False, apply_ln=False, pos_slice=None, mlp_input=False,
                          return_labels=False):
        if not self._stream("accumulated_resid"):
            return super().accumulated_resid(layer, incl_mid, apply_ln, pos_slice, mlp_input, return_labels)
        out = super().accumulated_resid(layer, incl_mid, False, pos_slice, mlp_input, return_labels)
        # the states are what the readers read: apply_ln changes nothing (no norm in front of them)
        return (tag_stack(out[0], STATE), out[1]) if return_labels else tag_stack(out, STATE)

    def logit_attrs(self, *args: Any, **kwargs: Any):
        self._stream("logit_attrs")
        return super().logit_attrs(*args, **kwargs)

    def logit_lens(self, **kwargs: Any):
        self._stream("logit_lens")
        return super().logit_lens(**kwargs)

    def decompose_resid(self, layer=None, mlp_input=False, mode="all", apply_ln=False, pos_slice=None,
                        incl_embeds=True, return_labels=False):
        if not self._stream("decompose_resid"):
            return super().decompose_resid(layer, mlp_input, mode, apply_ln, pos_slice, incl_embeds, return_labels)

        return decompose_resid(self, layer, mlp_input, mode, pos_slice, incl_embeds, return_labels)

    def stack_head_results(self, layer=-1, return_labels=False, incl_remainder=False, pos_slice=None, apply_ln=False):
        if not self._stream("stack_head_results"):
            return super().stack_head_results(layer, return_labels, incl_remainder, pos_slice, apply_ln)

        return stack_head_results(self, layer, return_labels, incl_remainder, pos_slice)

    def stack_neuron_results(self, layer, pos_slice=None, neuron_slice=None, return_labels=False, incl_remainder=False,
                             apply_ln=False, project_output_onto=None, mlp_input=False):
        if not self._stream("stack_neuron_results"):
            return super().stack_neuron_results(layer, pos_slice, neuron_slice, return_labels, incl_remainder,
                                                apply_ln and not self._no_norm(apply_ln),
                                                project_output_onto, mlp_input)

        return stack_neuron_results(self, layer, pos_slice, neuron_slice, return_labels, incl_remainder,
                                    project_output_onto, mlp_input)

    def get_full_resid_decomposition(self, layer=None, mlp_input=False, expand_neurons=True, apply_ln=False,
                                     pos_slice=None, return_labels=False, project_output_onto=None):
        if not self._stream("get_full_resid_decomposition"):
            return super().get_full_resid_decomposition(layer, mlp_input, expand_neurons,
                                                        apply_ln and not self._no_norm(apply_ln), pos_slice,
                                                        return_labels, project_output_onto)

        return full_resid_decomposition(self, layer, mlp_input, expand_neurons, pos_slice, return_labels,
                                        project_output_onto)

    def apply_ln_to_stack(self, residual_stack: torch.Tensor, layer: int | None = None, mlp_input: bool = False,
                          pos_slice: Any = None, batch_slice: Any = None, has_batch_dim: bool = True,
                          recompute_ln: bool = False):
        """Pre-norm: TL's (the reader norm's cached scale, centring for LayerNorm). Post-norm and
        sphere: the stack carried from the target it was built for to this one (the module docstring)."""
        if not self._stream("apply_ln_to_stack"):
            return super().apply_ln_to_stack(residual_stack, layer, mlp_input, pos_slice, batch_slice, has_batch_dim,
                                             recompute_ln)

        return carry_stack(self, residual_stack, target_of(residual_stack), layer, mlp_input, pos_slice, batch_slice,
                           has_batch_dim)


def _act_name(key: tuple, n_layers: int) -> str:
    from transformer_lens.utilities import get_act_name

    key = tuple(key)
    if len(key) > 1 and key[1] is not None and key[1] < 0:
        key = (key[0], n_layers + key[1], *key[2:])
    try:
        return get_act_name(*key)
    except Exception:  # noqa: BLE001 — a key TL cannot name: show it as given
        return str(key)


"""What every groklens model shares: TransformerLens's HookedRootModule, a `cfg` in
TransformerLens vocabulary, and the HookedTransformer-style surface that needs no architecture
(`return_type`, a tokenizer-free `to_tokens`, the cache whose helpers refuse where they would be
wrong). docs/TRANSFORMERLENS.md lists what works on which variant."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformer_lens import ActivationCache, HookedRootModule

from groklens.errors import BadInput
from groklens.trainers.losses import task_loss_at_readout as task_loss


class TLUnsupported(BadInput, ValueError):
    """A TransformerLens method that cannot be right for this model; the message says what to use."""


@dataclass
class ModelConfig:
    """Dimensions and switches of a built model (TransformerLens field names and meanings:
    d_vocab = input tokens, d_vocab_out = output classes)."""

    d_model: int
    n_heads: int
    d_head: int
    n_layers: int
    d_mlp: int
    d_vocab: int
    d_vocab_out: int
    n_ctx: int
    act_fn: str = "relu"
    norm: str = "none"
    norm_placement: str = "pre"  # ln/rms: pre (TransformerLens) | post (after every residual sum)
    attention: str = "softmax"
    unembed: str = "linear"
    init: str = "default"
    init_scheme: str = "tl"  # tl: N(0, initializer_range) | torch: PyTorch's module defaults
    causal: bool = True
    mlp_bias: bool = False
    attn_only: bool = False
    positional_embedding_type: str = "standard"
    device: str = "cpu"
    # TransformerLens's optional hooks (set_use_attn_result, ...); off: the forward pass as trained
    use_attn_result: bool = False
    use_split_qkv_input: bool = False
    use_attn_in: bool = False
    use_hook_mlp_in: bool = False

    @property
    def normalization_type(self) -> str | None:
        """The name ActivationCache reads. TL knows LN and RMS before each sub-layer with one final
        norm; post-norm and the sphere get names TL does not know, and GroklensCache keeps them away
        from the TL code paths that would silently treat them as no norm."""
        if self.norm == "none":
            return None
        if self.norm == "sphere":
            return "SPHERE"
        return {"ln": "LN", "rms": "RMS"}[self.norm] + ("Post" if self.norm_placement == "post" else "")

    @property
    def additive_stream(self) -> bool:
        """True when the residual stream is the sum of its component outputs (no norm after a sum)."""
        return self.norm != "sphere" and not (self.norm in ("ln", "rms") and self.norm_placement == "post")

    @property
    def initializer_range(self) -> float:
        # TransformerLens's default: the init of Nanda's grokking demo
        return 0.8 / self.d_model**0.5

    # fields TransformerLens's utilities read (patching, head_detector)
    dtype = torch.float32
    n_key_value_heads = None
    default_prepend_bos = False


def _token_names_default(cfg: ModelConfig) -> list[str]:
    return [str(i) for i in range(cfg.d_vocab - 1)] + ["="]


class HookedModel(HookedRootModule):
    """Base class: call `self.setup()` at the end of `__init__` so hook names are registered.
    The model builder calls `attach_task` so that `return_type='loss'` and `to_tokens` know the
    run's task."""

    cfg: ModelConfig
    task_data = None  # TaskData of the run (labels for return_type='loss')
    task_loss_name = "ce"
    token_names: list[str] | None = None
    char_tokens = False  # digits_add: every character is a token
    _label_index: dict | None = None

    def attach_task(self, data, loss: str, token_names: list[str], char_tokens: bool = False) -> None:
        self.task_data, self.task_loss_name = data, loss
        self.token_names, self.char_tokens = token_names, char_tokens
        self._label_index = None

    def run_with_cache(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        # TransformerLens 4.x returns a plain dict from HookedRootModule.run_with_cache
        out, cache = super().run_with_cache(*args, **kwargs)
        cache = cache.cache_dict if isinstance(cache, ActivationCache) else cache
        return out, GroklensCache(cache, self, has_batch_dim=not kwargs.get("remove_batch_dim", False))

    def hooks_attached(self) -> bool:
        """Whether any hook is attached to any HookPoint (then the forward pass takes the explicit
        path, so every hook sees what it always saw)."""
        return any(hp._forward_hooks or hp._backward_hooks or hp._forward_pre_hooks
                   for hp in self.hook_dict.values())

    # ------------------------------------------------------------------ tokens
    def _names(self) -> list[str]:
        return self.token_names or _token_names_default(self.cfg)

    def to_tokens(self, input: str | list[str], prepend_bos: bool | None = None, **_: Any) -> torch.Tensor:
        """Strings of the task's tokens -> ids [batch, pos]: "3 5 =" (whitespace-separated), or for
        digits_add characters ("12+34="). Integers name themselves; there is no BOS token."""
        if prepend_bos:
            raise TLUnsupported("to_tokens: groklens tasks have no BOS token; pass prepend_bos=False")
        strings = [input] if isinstance(input, str) else list(input)
        index = {name: i for i, name in enumerate(self._names())}
        rows = []
        for s in strings:
            pieces = [ch for ch in s if not ch.isspace()] if self.char_tokens else s.split()
            unknown = [p for p in pieces if p not in index]
            if unknown:
                raise TLUnsupported(f"to_tokens: {unknown[0]!r} is not a token of this task "
                                    f"(tokens: {' '.join(self._names()[:12])}{' ...' if len(index) > 12 else ''})")
            rows.append([index[p] for p in pieces])
        if len({len(r) for r in rows}) > 1:
            raise TLUnsupported("to_tokens: the strings have different numbers of tokens; groklens tasks do not pad")
        return torch.tensor(rows, dtype=torch.long, device=self.cfg.device)

    def to_str_tokens(self, input: Any, **_: Any) -> list[str]:
        ids = self.to_tokens(input)[0] if isinstance(input, str) else torch.as_tensor(input).reshape(-1)
        return [self._names()[int(i)] for i in ids]

    def to_string(self, tokens: Any) -> str | list[str]:
        t = torch.as_tensor(tokens)
        if t.ndim > 1:
            return [self.to_string(row) for row in t]
        return ("" if self.char_tokens else " ").join(self._names()[int(i)] for i in t.reshape(-1))

    def to_single_token(self, string: str) -> int:
        ids = self.to_tokens(string)[0]
        if len(ids) != 1:
            raise TLUnsupported(f"to_single_token: {string!r} is {len(ids)} tokens, not one")
        return int(ids[0])

    def _as_tokens(self, tokens: Any) -> torch.Tensor:
        return self.to_tokens(tokens) if isinstance(tokens, (str, list)) else tokens

    # ------------------------------------------------------------------ return_type
    def labels_for(self, tokens: torch.Tensor) -> torch.Tensor:
        """The task's labels of these inputs (each row must be one of the task's inputs)."""
        data = self.task_data
        if data is None:
            raise TLUnsupported("return_type='loss' needs the run's task: build the model with "
                                "groklens.trainers.models.build_model or Trajectory.model()")
        if self._label_index is None:
            self._label_index = {tuple(r): i for i, r in enumerate(data.inputs.tolist())}
        rows = [self._label_index.get(tuple(r)) for r in tokens.tolist()]
        if None in rows:
            raise TLUnsupported(f"return_type='loss': input row {rows.index(None)} is not one of the task's inputs, "
                                "so it has no label; use return_type='logits'")
        return data.labels[rows].to(tokens.device)

    def output(self, logits: torch.Tensor, tokens: torch.Tensor, return_type: str | None, loss_per_token: bool):
        """TL's return_type: logits | loss | both | None. The loss is the run's task loss (its `loss`:
        ce | stablemax, float64) at the readout position(s), the same function the trainer's
        evaluation and the analyses use (groklens.analyses.common.task_loss); loss_per_token gives
        it per input [batch]."""
        if return_type == "logits":
            return logits
        if return_type is None:
            return None
        if return_type not in ("loss", "both"):
            raise TLUnsupported(f"return_type must be logits, loss, both or None; got {return_type!r}")
        loss = task_loss(logits, self.labels_for(tokens), self.task_data, loss=self.task_loss_name,
                         reduction="none" if loss_per_token else "mean")
        return loss if return_type == "loss" else (logits, loss)

    # ------------------------------------------------------------------ TL's optional hooks
    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """Cache each head's output blocks.{l}.attn.hook_result [batch, pos, head, d_model]."""
        self._set_flag("use_attn_result", use_attn_result)

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """Per-head copies of the attention input: blocks.{l}.hook_q_input / k_input / v_input."""
        self._set_flag("use_split_qkv_input", use_split_qkv_input)

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        self._set_flag("use_attn_in", use_attn_in)

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        self._set_flag("use_hook_mlp_in", use_hook_mlp_in)

    def _set_flag(self, name: str, value: bool) -> None:
        if not hasattr(self, "blocks"):
            raise TLUnsupported(f"set_{name}: the MLP model has no attention blocks")
        setattr(self.cfg, name, bool(value))


class GroklensCache(ActivationCache):
    """TL's ActivationCache, refusing (one-line TLUnsupported) where TL's helpers would be wrong:
    on the MLP model (no residual stream), and where a norm follows every residual sum (post-norm,
    sphere), so the stream is not the sum of component outputs."""

    def _stream(self, what: str, components: bool = True) -> None:
        m = self.model
        if not hasattr(m, "blocks"):
            raise TLUnsupported(f"{what}: the MLP model has no residual stream; read its hooks "
                                "(hook_input, layers.{i}.hook_pre/hook_post, hook_logits) directly")
        if components and not m.cfg.additive_stream:
            kind = "the sphere projection" if m.cfg.norm == "sphere" else f"a {m.cfg.norm.upper()} norm"
            raise TLUnsupported(f"{what}: {kind} follows every residual sum, so the stream is not the sum of "
                                "component outputs; use accumulated_resid (the stream states) instead")

    def decompose_resid(self, *args: Any, **kwargs: Any):
        self._stream("decompose_resid")
        return super().decompose_resid(*args, **kwargs)

    def get_full_resid_decomposition(self, *args: Any, **kwargs: Any):
        self._stream("get_full_resid_decomposition")
        return super().get_full_resid_decomposition(*args, **kwargs)

    def accumulated_resid(self, *args: Any, **kwargs: Any):
        self._stream("accumulated_resid", components=False)
        return super().accumulated_resid(*args, **kwargs)

    def stack_head_results(self, *args: Any, **kwargs: Any):
        self._stream("stack_head_results", components=kwargs.get("incl_remainder") or kwargs.get("apply_ln"))
        return super().stack_head_results(*args, **kwargs)

    def stack_neuron_results(self, *args: Any, **kwargs: Any):
        self._stream("stack_neuron_results", components=kwargs.get("incl_remainder") or kwargs.get("apply_ln"))
        return super().stack_neuron_results(*args, **kwargs)

    def logit_attrs(self, *args: Any, **kwargs: Any):
        self._stream("logit_attrs", components=False)
        return super().logit_attrs(*args, **kwargs)

    def logit_lens(self, **kwargs: Any):
        self._stream("logit_lens", components=False)
        if not self.model.cfg.additive_stream:
            kwargs["apply_ln"] = False  # no final norm: the unembedding reads the last stream state as is
        return super().logit_lens(**kwargs)

    def apply_ln_to_stack(self, residual_stack: torch.Tensor, layer: int | None = None, mlp_input: bool = False,
                          pos_slice: Any = None, batch_slice: Any = None, has_batch_dim: bool = True,
                          recompute_ln: bool = False):
        """Post-norm and sphere: the unembedding reads the last stream state with no norm, so at
        layer n_layers the stack passes unchanged; at a block's input TL's cached-scale norm is
        undefined (ln1/ln2 there normalize the sums, not the sub-layer inputs): refused."""
        self._stream("apply_ln_to_stack", components=False)
        if self.model.cfg.additive_stream:
            return super().apply_ln_to_stack(residual_stack, layer, mlp_input, pos_slice, batch_slice,
                                             has_batch_dim, recompute_ln)
        if layer not in (None, -1, self.model.cfg.n_layers) or mlp_input:
            self._stream(f"apply_ln_to_stack at layer {layer}")
        if has_batch_dim:  # what TL does before normalizing: the batch slice
            from transformer_lens.utilities import Slice

            residual_stack = Slice.unwrap(batch_slice).apply(residual_stack, dim=1)
        return residual_stack

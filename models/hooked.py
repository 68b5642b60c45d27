"""What every groklens model shares: TransformerLens's HookedRootModule, a `cfg` in
TransformerLens vocabulary, and the HookedTransformer-style surface that needs no architecture
(`return_type`, a tokenizer-free `to_tokens`, hook names checked, the cache of
groklens.models.cache). docs/TRANSFORMERLENS.md lists what works on which variant."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any

import torch
from transformer_lens import ActivationCache, HookedRootModule

from groklens.models.cache import GroklensCache
from groklens.models.losses import task_loss_at_readout as task_loss
from groklens.models.tl_errors import TLUnknownName, TLUnsupported, TLUnsupportedAttribute


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
    # ln/rms: pre (TransformerLens) | post (after every residual sum) | in_stream (Grokfast)
    norm_placement: str = "pre"
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
        """TransformerLens's meaning: the norm between the stream and its readers (ln1 before the
        attention, ln2 before the MLP, ln_final before the unembedding), LN or RMS on a pre-norm
        model. After a post-norm or the sphere every reader reads the stream itself: None, as with
        no norm (TL's logit lens then reads the last stream state, which is exact). What the stream
        is there (not a sum of component outputs) is `additive_stream`; GroklensCache decides by it."""
        if self.norm in ("ln", "rms") and self.norm_placement in ("pre", "in_stream"):
            return {"ln": "LN", "rms": "RMS"}[self.norm]
        return None

    @property
    def additive_stream(self) -> bool:
        """True when the residual stream is the sum of its component outputs (no norm after a sum)."""
        after_sums = self.norm in ("ln", "rms") and self.norm_placement in ("post", "in_stream")
        return self.norm != "sphere" and not after_sums

    @property
    def model_name(self) -> str:
        """TL's cfg.model_name (TL prints it in messages): the model and its variant switches."""
        if hasattr(self, "embed"):
            return "groklens-mlp"
        placed = self.norm_placement != "pre" and self.norm in ("ln", "rms")
        parts = ["transformer", self.norm] + ([self.norm_placement] if placed else [])
        parts += [s for s, default in ((self.attention, "softmax"), (self.unembed, "linear")) if s != default]
        return "groklens-" + "-".join(parts)

    def to_dict(self) -> dict:
        """TL's cfg.to_dict(): every field, and the names TL reads (normalization_type, model_name, dtype, ...)."""
        return {**dataclasses.asdict(self), "normalization_type": self.normalization_type,
                "model_name": self.model_name,
                "initializer_range": self.initializer_range, "dtype": self.dtype,
                "n_key_value_heads": self.n_key_value_heads, "default_prepend_bos": self.default_prepend_bos}

    @property
    def initializer_range(self) -> float:
        # TransformerLens's default: the init of Nanda's grokking demo
        return 0.8 / self.d_model**0.5

    # fields TransformerLens's utilities read (patching, head_detector)
    dtype = torch.float32
    n_key_value_heads = None
    default_prepend_bos = False


_module_getattr = torch.nn.Module.__getattr__


_TOKEN_DTYPES = (torch.int64, torch.int32)  # what torch.nn.functional.embedding indexes with


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

    # ------------------------------------------------------------------ hook names
    def add_hook(self, name, hook, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        if isinstance(name, str):
            self.check_hook_name(name)
        super().add_hook(name, hook, *args, **kwargs)

    def _enable_hook_with_name(self, name: str, hook, dir) -> None:  # hooks(), run_with_hooks
        self.check_hook_name(name)
        super()._enable_hook_with_name(name, hook, dir)

    def check_hook_name(self, name: str) -> None:
        """A one-line TLUnknownName (a KeyError) for a name that is not a hook point of this model."""
        if name not in self.hook_dict:
            raise TLUnknownName(self.unknown_name_message(name))

    def unknown_name_message(self, name: str) -> str:
        """What to say about a hook name this model does not have."""
        absent = self._modules.get("ln_final")
        if name.startswith("ln_final.") and "why" in getattr(absent, "__dict__", {}):
            return f"{name}: {absent.why}"
        if getattr(self.cfg, "norm", None) == "none" and (".ln" in name or name.startswith("ln_")):
            return f"{name}: norm=none, this model has no norms"
        old = {"norm_embed.": "ln_embed.", ".norm_mid.": ".ln1.", ".norm_post.": ".ln2."}
        for was, now in old.items():
            if was in name and name.replace(was, now) in self.hook_dict:
                return f"{name}: the norms have one name on every variant now: {name.replace(was, now)}"
        close = difflib.get_close_matches(name, list(self.hook_dict), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}?" if close else f"e.g. {', '.join(list(self.hook_dict)[:3])}"
        return f"{name} is not a hook point of this model ({hint})"

    def hooks_attached(self) -> bool:
        """Whether any hook is attached to any HookPoint (then the forward pass takes the explicit
        path, so every hook sees what it always saw)."""
        return any(hp._forward_hooks or hp._backward_hooks or hp._forward_pre_hooks
                   for hp in self.hook_dict.values())

    # ------------------------------------------------------------------ tokens
    def _names(self) -> list[str]:
        return self.token_names or _token_names_default(self.cfg)

    def __getattr__(self, name: str):  # what nn.Module finds (submodules, parameters), else a refusal for TL's names
        try:
            return _module_getattr(self, name)
        except AttributeError:
            if name == "tokenizer":
                raise TLUnsupportedAttribute("tokenizer: groklens tasks have no tokenizer; use model.to_tokens / "
                                             "to_str_tokens / to_string (token names: the ids and '=')") from None
            raise

    def generate(self, *_: Any, **__: Any):
        raise TLUnsupported("generate: a groklens model reads a whole task input and gives its answer class at the "
                            "readout position; there is no next token to sample; use model(tokens)[:, -1].argmax(-1)")

    def loss_fn(self, logits: torch.Tensor, tokens: torch.Tensor, attention_mask: Any = None, per_token: bool = False):
        """HookedTransformer's loss_fn: what forward(tokens, return_type='loss') returns, here the
        run's task loss at the readout position(s) (per input with per_token), not a next-token loss."""
        if attention_mask is not None:
            raise TLUnsupported("loss_fn: groklens tasks do not pad, so there is no attention_mask")
        return self.output(logits, self._as_tokens(tokens), "loss", per_token)

    def to_tokens(self, input: str | list[str], prepend_bos: bool | None = None, **_: Any) -> torch.Tensor:
        """Strings of the task's tokens -> ids [batch, pos]: "3 5 =" (whitespace-separated), or for
        digits_add characters ("12+34="). Integers name themselves; there is no BOS token."""
        if prepend_bos:
            raise TLUnsupported("to_tokens: groklens tasks have no BOS token; pass prepend_bos=False")
        strings = [input] if isinstance(input, str) else list(input)
        if not all(isinstance(s, str) for s in strings):
            raise TLUnsupported("to_tokens: a string of the task's tokens or a list of strings; for ids, pass an "
                                "integer tensor to the model")
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

    def to_str_tokens(self, input: Any, prepend_bos: bool | None = None, **_: Any) -> list[str] | list[list[str]]:
        """TL's to_str_tokens: a string or one row of ids -> token names; a list -> one list per item."""
        if isinstance(input, (list, tuple)):
            return [self.to_str_tokens(item, prepend_bos) for item in input]
        if isinstance(input, str):
            ids = self.to_tokens(input, prepend_bos=prepend_bos)[0]
        else:
            ids = torch.as_tensor(input).squeeze()
            ids = ids.reshape(1) if ids.ndim == 0 else ids
            if ids.ndim != 1:
                raise TLUnsupported(f"to_str_tokens: tokens of shape {tuple(torch.as_tensor(input).shape)}; pass one "
                                    "row (as TL), or a list of rows or strings for one list per row")
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
        tokens = self.to_tokens(tokens) if isinstance(tokens, (str, list)) else tokens
        # the dtype, not the values: no host sync, so it holds under vmap and compile. A bool or
        # float tensor would index the embedding table (the table path adds positions to it) as ids
        if not isinstance(tokens, torch.Tensor) or tokens.dtype not in _TOKEN_DTYPES:
            what = f"a {tokens.dtype} tensor" if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise TLUnsupported(f"model(tokens): token ids are an integer torch tensor [batch, pos] (or a string of "
                                f"the task's tokens, or a list of them); got {what}")
        n, n_ctx = tokens.shape[-1], self.cfg.n_ctx
        if n > n_ctx or (n < n_ctx and "blocks" not in self._modules):
            raise TLUnsupported(f"model(tokens): {n} positions, but a task input is n_ctx={n_ctx} tokens; the model "
                                "gives one answer class at the readout position, not a next token (generate, "
                                "test_prompt and next-token losses do not apply)")
        return tokens

    # ------------------------------------------------------------------ return_type
    def labels_for(self, tokens: torch.Tensor) -> torch.Tensor:
        """The task's labels of these inputs (each row must be one of the task's inputs)."""
        data = self.task_data
        if data is None:
            raise TLUnsupported("return_type='loss' needs the run's task: build the model with "
                                "groklens.models.build_model or Trajectory.model()")
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

"""groklens.models: the model registry, a model name (RunConfig.model) -> a builder of a HookedRootModule,
and the models (transformer.py with its fast paths in fast_paths.py, mlp.py, teacher.py; hooked.py their
TransformerLens surface), with the task losses their outputs are scored by (losses.py: return_type='loss',
the trainers' objective, the analyses' losses). The trainers train them and the checkpoints rebuild them
from a stored config, so both rooms import this one. (Before issue 44: groklens.trainers.models and
groklens.trainers.losses, names that still import; groklens/trainers/__init__.py says how.)"""

from __future__ import annotations

import groklens as _top

if getattr(_top, "__file__", None) is None:  # a folder named groklens (the clone) shadows the installed package
    raise ImportError(f"the folder {list(_top.__path__)[0]} shadows the installed groklens: Python found it first "
                      "(the current directory or the script's); run from another directory, or rename the clone "
                      "(README, 'Importing groklens')")

from typing import TYPE_CHECKING, Callable

from groklens._tl import defer_package_inits
from groklens.config import MODEL_ENTRY_POINTS, parse_positions
from groklens.errors import BadInput
from groklens.registry import Registry

# The models import TransformerLens' hook machinery only, not its eager package __init__
# (transformers, datasets, pandas): groklens/_tl.py says how and why.
defer_package_inits()

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

    from groklens.config import RunConfig
    from groklens.tasks import TaskData

# installed packages add models through the entry-point group MODEL_ENTRY_POINTS (docs/EXTENDING.md)
MODELS: Registry[Callable[["RunConfig", "TaskData"], "nn.Module"]] = Registry("model", entry_points=MODEL_ENTRY_POINTS)


def memory_width(width: Callable[["RunConfig", int], int]):
    """Decorator on a builder: `width(cfg, vocab)`, the residual width per position a model of
    `cfg` keeps (vocab: an upper bound on the task's vocabulary), for the memory estimate made
    before a run starts (checkpoints/validate.py `estimate_memory`). A builder without one is
    counted d_model wide."""

    def mark(builder):
        builder.memory_width = width
        return builder

    return mark


def model_width(cfg: "RunConfig", vocab: int) -> int:
    """The residual width the memory estimate counts for cfg's model (memory_width)."""
    width = getattr(MODELS.get(cfg.model), "memory_width", None)
    return cfg.d_model if width is None else width(cfg, vocab)


def _attach_task(model, cfg: "RunConfig", data: "TaskData"):
    """What return_type='loss' and to_tokens need: the run's labels, its loss, the token names
    (digits_add: the characters 0-9 + =; every other task: the ids, and '=' for the last)."""
    if cfg.task == "digits_add":
        names, chars = [str(i) for i in range(10)] + ["+", "="], True
    elif cfg.op_token:  # [a, op, b, =]: the residues, '=' (p) and the operator (p+1)
        names, chars = [str(i) for i in range(cfg.p)] + ["=", "op"], False
    else:
        names, chars = [str(i) for i in range(data.d_vocab - 1)] + ["="], False
    model.attach_task(data, cfg.loss, names, char_tokens=chars)
    return model


def _readout_keys(cfg: "RunConfig", data: "TaskData") -> tuple[int, ...]:
    """attn_mask's positions, checked against the task: keys of the readout query, the last position."""
    keys = parse_positions(cfg.attn_mask)
    if keys and (data.n_targets or data.readout_pos != data.n_ctx - 1):
        raise BadInput(f"attn_mask masks the readout query at the last position; task {cfg.task!r} reads out elsewhere")
    if any(k >= data.n_ctx for k in keys):
        raise BadInput(f"attn_mask {cfg.attn_mask!r}: positions are 0..{data.n_ctx - 1} for this task")
    return keys


@MODELS.register("transformer")
def _build_transformer(cfg: "RunConfig", data: "TaskData"):
    from groklens.models.transformer import Transformer, TransformerConfig

    return _attach_task(Transformer(
        TransformerConfig(
            d_model=cfg.d_model, n_heads=cfg.n_heads, d_head=cfg.d_head, n_layers=cfg.n_layers,
            d_mlp=cfg.d_mlp, d_vocab=data.d_vocab, d_vocab_out=data.d_vocab_out, n_ctx=data.n_ctx,
            act_fn=cfg.act_fn, norm=cfg.norm, norm_placement=cfg.norm_placement, attention=cfg.attention,
            unembed=cfg.unembed, init=cfg.init, init_scheme=cfg.init_scheme, causal=cfg.causal, mlp_bias=cfg.mlp_bias,
            radius=cfg.radius, tau=cfg.tau, attention_rate=cfg.attention_rate,
            fourier_freqs=cfg.fourier_frequencies() if cfg.init == "fourier" else (),
            fourier_p=cfg.p if cfg.init == "fourier" else 0, readout_keys=_readout_keys(cfg, data),
        )
    ), cfg, data)


@MODELS.register("mlp")
# a one-hot embedding is as wide as what it encodes (the builder's `width` below)
@memory_width(lambda cfg, vocab: max(cfg.d_model, {"onehot": vocab, "onehot_residues": cfg.p}.get(cfg.mlp_embed, 0)))
def _build_mlp(cfg: "RunConfig", data: "TaskData"):
    from groklens.models.mlp import MLP, MLPConfig

    if data.n_targets or data.readout_pos != data.n_ctx - 1 or data.n_ctx < 2:
        raise BadInput(f"model=mlp needs a single-target task read out at its last position; "
                       f"task {cfg.task!r} is not one")
    # a one-hot embedding is as wide as its vocabulary: every token, or the p residues only
    width = {"onehot": data.d_vocab, "onehot_residues": cfg.p}.get(cfg.mlp_embed, cfg.d_model)
    return _attach_task(MLP(
        MLPConfig(
            d_model=width, n_heads=0, d_head=0, n_layers=cfg.n_layers,
            d_mlp=cfg.d_mlp, d_vocab=data.d_vocab, d_vocab_out=data.d_vocab_out, n_ctx=data.n_ctx,
            act_fn=cfg.act_fn, mlp_bias=cfg.mlp_bias, embed=cfg.mlp_embed, unembed_bias=cfg.mlp_unembed_bias,
        )
    ), cfg, data)


def _build_teacher_student(cfg: "RunConfig", data: "TaskData"):
    """model=perceptron | committee (task teacher): models/teacher.py."""
    from groklens.tasks import teacher_student
    from groklens.models.teacher import TeacherStudent, TeacherStudentConfig

    committee = cfg.model == "committee"
    return _attach_task(TeacherStudent(
        TeacherStudentConfig(
            d_model=cfg.teacher_dim, n_heads=0, d_head=0, n_layers=1, d_mlp=cfg.d_mlp if committee else 1,
            d_vocab=data.d_vocab, d_vocab_out=data.d_vocab_out, n_ctx=data.n_ctx, committee=committee,
        ), teacher_student(cfg)[0]), cfg, data)


memory_width(lambda cfg, vocab: cfg.teacher_dim)(_build_teacher_student)  # one weight vector per input dimension
MODELS.register("perceptron")(_build_teacher_student)
MODELS.register("committee")(_build_teacher_student)


def build_model(cfg: "RunConfig", data: "TaskData", seed: int | None = None) -> "nn.Module":
    """Build the configured model, initialised from `seed` (default cfg.seed)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed if seed is None else seed)
        return MODELS.get(cfg.model)(cfg, data)

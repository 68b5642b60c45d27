"""Run configuration: one flat, typed dataclass whose fields are the CLI flags and YAML keys.

Defaults reproduce Nanda et al. (2023)'s canonical modular-addition run (REFERENCES.md).
Every trajectory file stores `RunConfig.to_dict()` as JSON, so any checkpoint rebuilds its
model and data from the file alone. Fields are snake_case; their flags are --kebab-case.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from groklens.errors import BadInput

# The phase thresholds, the one place they are written: test (train) accuracy at which a run
# counts as grokked (memorized) unless a run or command names another, and the thresholds the
# grokking analysis, the trainer's phase events and the ledgers report.
GROK_THRESHOLD = 0.95
PHASE_THRESHOLDS = (GROK_THRESHOLD, 0.99)


def first_sustained(hits, n: int) -> int | None:
    """Index of the first of `n` consecutive true values, None when there is no such run: the one
    definition of grokked (the first of grok_evals evaluations in a row with test accuracy >=
    threshold), shared by the stop rule and every reading of a run."""
    streak = 0
    for i, hit in enumerate(hits):
        streak = streak + 1 if hit else 0
        if streak == n:
            return i - n + 1
    return None


ROUTING_MAX_COPIES = 64
GROKFAST_MAX_WINDOW = 1_000  # grokfast_filter=ma keeps this many gradients of every parameter in memory
MODEL_ENTRY_POINTS = "groklens.models"  # the entry-point group of models added by installed packages


def plugin_models() -> tuple[str, ...]:
    """The model names installed packages add (entry-point group groklens.models, read from
    their metadata without importing them; groklens.models registers them when built)."""
    from importlib.metadata import entry_points

    return tuple(sorted(ep.name for ep in entry_points(group=MODEL_ENTRY_POINTS)))


# ---------------------------------------------------------------------- a field and its facts
class _NoLegacy:
    def __repr__(self) -> str:
        return "NO_LEGACY"


NO_LEGACY: Any = _NoLegacy()  # a field that was there from the start has no legacy value


@dataclass(frozen=True)
class FieldFacts:
    """What the rest of groklens needs to know about a RunConfig field, declared with it (`setting`);
    every table of fields (CHOICES, the ledger's LEGACY_DEFAULTS, the ensembles' PER_MEMBER_FIELDS,
    ...) and `train --help` are read from these."""

    help: str  # what the field means, in words (`train --help` prints it)
    choices: tuple[str, ...] = ()  # the values a str field takes ('' = any; model: plugins add theirs)
    # the value that reproduces the behaviour from before the field existed, for a field added after
    # the first ledger entries and trajectory files (NO_LEGACY: it was there from the start). The
    # ledger's hash leaves the field out at this value, and a stored config without the key means it.
    legacy: Any = NO_LEGACY
    per_member: bool = False  # members of one ensemble may differ in it (trainers/ensemble.py)
    solo: bool = False  # a config that sets it trains alone, never in an ensemble
    hashed: bool = True  # in the ledger's config hash; False: how a run ran, not what it computed
    inert_unless: str | None = None  # changes nothing while this other field is off: not hashed then
    # filled in from another run when the run starts, by this field naming that run
    # (trainers/ticket.py): a planned config leaves it at its default, the stored one holds it
    derived_from: str | None = None
    transformer_only: bool = False  # an option of model=transformer: other models take the default only
    seed: bool = False  # a seed: runs that differ only in seeds are one arm, one variant
    # it changes the work of a training step (False: what a step multiplies by, the schedule, the stop
    # rule, where the run runs): configs that differ only in uncosted fields share one measured step time
    costed: bool = True

    @property
    def has_legacy(self) -> bool:
        return self.legacy is not NO_LEGACY


def setting(default: Any, help: str, **facts: Any) -> Any:
    """A RunConfig field: its default, its help and its facts (FieldFacts' names), in one place."""
    return dataclasses.field(default=default, metadata={"facts": FieldFacts(help=help, **facts)})


TEACHER_MODELS = ("perceptron", "committee")  # the models of task=teacher (models/teacher.py)


@dataclass
class RunConfig:
    """One run's configuration; every field is declared with `setting` (its help and its facts)."""

    # --- task and data split
    task: str = setting(
        "add", "add, sub, mul, div, x2y2, s5, digits_add, seq_add, seq_mul or teacher (groklens/tasks.py)")
    p: int = setting(113, "the modulus: inputs are residues 0..p-1")
    train_frac: float = setting(0.3, "share of all input pairs in the training set (the rest is the test set)")
    data_seed: int = setting(
        598, per_member=True, seed=True, costed=False,
        help="seed of the train/test split (Nanda's DATA_SEED), apart from `seed`")
    split_rule: str = setting(
        "pcg64", choices=("pcg64", "python_shuffle"), legacy="pcg64",
        help="how the split is drawn from data_seed: pcg64 (numpy's permutation, round(train_frac n) for training) or "
             "python_shuffle (the sphere paper's make_dataset: random.Random(data_seed) shuffles the pairs in "
             "row-major order, the first int(train_frac n) train)")
    op_token: bool = setting(
        False, legacy=False,
        help="modular tasks: the sequence [a, op, b, =] with an operator token p+1 and the output over the whole "
             "vocabulary (p+2 classes), as Power et al.'s and Grokfast's code; off: [a, b, =], p classes")
    nonzero_b: bool = setting(
        False, legacy=False,
        help="modular tasks: b in 1..p-1 (Grokfast's x*y data); div always has it")
    # --- model
    seed: int = setting(
        999, "seed of the model init and the mini-batch order", per_member=True, seed=True, costed=False)
    model: str = setting(
        "transformer", "transformer (TransformerLens-style), mlp, or perceptron | committee (task teacher)",
        choices=("transformer", "mlp", "perceptron", "committee"))
    n_layers: int = setting(1, "transformer blocks (mlp: hidden layers)")
    d_model: int = setting(128, "residual-stream width (mlp: embedding width)")
    n_heads: int = setting(4, "attention heads per layer")
    d_head: int = setting(32, "width of each head")
    d_mlp: int = setting(512, "MLP hidden width (model=committee: its K hidden sign units, odd)")
    act_fn: str = setting("relu", "activation function of the MLP neurons", choices=("relu", "gelu"))
    norm: str = setting(
        "none", choices=("none", "ln", "rms", "sphere"), transformer_only=True,
        help="none (Nanda), ln (LayerNorm), rms (RMSNorm), sphere (bounded sphere; VARIANTS.md)")
    norm_placement: str = setting(
        "pre", choices=("pre", "post", "in_stream"), legacy="pre", transformer_only=True,
        help="ln/rms: pre = TransformerLens' pre-norm blocks with a final norm; post = the sphere paper's baselines, a "
             "norm after the embedding and after every residual sum, no final norm; in_stream = Grokfast's code: the "
             "norm's output replaces the stream before the attention, x = ln1(x); x = x + attn(x); x = x + "
             "mlp(ln2(x)), with a final norm")
    attention: str = setting(
        "softmax", choices=("softmax", "uniform"), transformer_only=True,
        help="softmax, or uniform (fixed equal weights over the positions)")
    attention_rate: float = setting(
        1.0, legacy=1.0, transformer_only=True,
        help="attention=softmax: pattern = rate * softmax + (1 - rate) * the uniform pattern, Zhong et al.'s attention "
             "rate (their attn_coeff; their uniform part is all ones, ours 1/allowed positions): 1 = learned "
             "attention, 0 = uniform (docs/VARIANTS.md)")
    unembed: str = setting(
        "linear", choices=("linear", "bounded"), transformer_only=True,
        help="linear, or bounded (normalized unembedding with logit temperature tau)")
    init: str = setting(
        "default", choices=("default", "fourier"), transformer_only=True, costed=False,
        help="default (init_scheme), or fourier (embeddings from fourier_freqs)")
    init_scheme: str = setting(
        "tl", choices=("tl", "torch", "torch_mha"), legacy="tl", transformer_only=True, costed=False,
        help="tl = every W_ ~ N(0, 0.8/sqrt(d_model)) (TransformerLens, Nanda's demo); torch = PyTorch's module "
             "defaults as the sphere paper's code has them (nn.Linear kaiming-uniform, nn.Embedding N(0, 1)); "
             "torch_mha = torch, with W_Q, W_K, W_V as nn.MultiheadAttention initializes its in_proj (Grokfast's "
             "code): xavier-uniform over the stacked [3 d_model, d_model] matrix")
    causal: bool = setting(
        True,
        help="causal attention mask; Nanda's TransformerLens model is causal, the sphere paper's is not")
    mlp_bias: bool = setting(False, "train the MLP biases (off: frozen at zero, as in Nanda's demo)")
    # --- model variants (docs/VARIANTS.md)
    radius: float = setting(1.0, "norm=sphere: radius of the residual-stream sphere (the paper: 1)")
    tau: float = setting(10.0, "unembed=bounded: fixed logit temperature (the paper: 10)")
    fourier_freqs: str = setting("14 35 41 42 52", "init=fourier: the K frequencies (Nanda's key frequencies)")
    mlp_embed: str = setting(
        "learned", choices=("learned", "onehot", "onehot_residues"),
        help="model=mlp: learned (d_model wide) or one-hot operand embeddings, onehot over the whole vocabulary (`=` "
             "included), onehot_residues over the p residues only (Prieto et al.'s 2p inputs)")
    mlp_unembed_bias: bool = setting(
        True, legacy=True,
        help="model=mlp with mlp_bias: false drops b_U only (devinterp's grokking MLP)")
    # --- task knobs (digits_add; seq_add / seq_mul)
    n_digits: int = setting(3, "digits_add: digits per operand")
    # a 3-digit run on a CPU evaluates a sample, not 10^6 inputs every evaluation
    digits_pairs: int = setting(
        0, legacy=0,
        help="digits_add: operand pairs drawn from the 10^(2 n_digits) (data_seed, a stream apart from the "
             "split's), which train_frac then splits; 0 = every pair")
    seq_len: int = setting(8, "seq tasks: L positions before the `=` readout token")
    n_informative: int = setting(2, "seq tasks: k positions that determine the label")
    informative_layout: str = setting(
        "first", choices=("first", "last", "spread", "random"),
        help="seq tasks: where the k positions sit (first|last|spread|random)")
    distractor_vocab: int = setting(0, "seq tasks: 0 = distractors are residues; D > 0 = D separate tokens")
    # --- teacher-student task (task=teacher: Gaussian inputs labelled by a random sign teacher;
    #     its split is teacher_alpha x teacher_dim training examples and teacher_test test ones, not train_frac)
    teacher_dim: int = setting(100, "N: input dimension, the weights of one hidden unit", legacy=100)
    teacher_hidden: int = setting(1, "K of the teacher committee machine (odd); 1 = a perceptron teacher", legacy=1)
    teacher_alpha: float = setting(2.0, "examples per weight: alpha N training examples", legacy=2.0)
    teacher_test: int = setting(10_000, "test examples (the generalization error's estimate)", legacy=10_000)
    # --- loss, regularizers and gradient transforms (trainers/regularizers.py); 0 = off
    loss: str = setting(
        "ce", choices=("ce", "stablemax", "ce_float32", "perceptron"),
        help="training loss: ce (cross-entropy, float64), stablemax (Prieto et al. 2025) or ce_float32 (the "
             "cross-entropy's log-softmax in float32, as Prieto et al.'s default: it shows softmax collapse) or "
             "perceptron (Rosenblatt's criterion max(0, largest other logit - the label's): zero once an input is "
             "right)")
    act_norm_lambda: float = setting(
        0.0, per_member=True,
        help="weight of the activation-norm penalty toward the sqrt(d) sphere")
    act_norm_sites: str = setting("", 'hook-name patterns (fnmatch, comma-separated); "" = the model\'s default')
    geomdr_lambda: float = setting(0.0, "weight of the effective-rank penalty toward geomdr_target", per_member=True)
    geomdr_target: float = setting(10.0, "the effective rank the geomdr penalty pulls toward")
    geomdr_start: int = setting(0, "active for geomdr_start <= step < geomdr_end")
    geomdr_end: int = setting(0, "step the geomdr penalty ends at; 0 = the end of the run")
    geomdr_site: str = setting("", 'one hook name; "" = the model\'s default (last residual stream / hidden layer)')
    kl_attn_beta: float = setting(
        0.0, per_member=True,
        help="weight of KL(uniform on informative positions || attention at the readout query)")
    kl_attn_layer: int = setting(0, "layer whose heads are pulled; -1 = every layer")
    attn_mask: str = setting(
        "", legacy="", derived_from="attn_mask_from", transformer_only=True,
        help="attention-mask transfer (our reading of a lottery ticket; docs/VARIANTS.md): the key positions the "
             'readout query (the last position) may attend to in every layer, e.g. "0 7" ("" = all of them)')
    attn_mask_from: str = setting(
        "", legacy="", solo=True, transformer_only=True, costed=False,
        help='the run beside this run\'s file whose grokked attention gives attn_mask when that is "" (its name; '
             '"{seed}" = this run\'s seed), read when the run starts')
    grokfast_alpha: float = setting(0.98, "decay of Grokfast's gradient EMA (Lee et al. 2024)", per_member=True)
    grokfast_lambda: float = setting(
        0.0, per_member=True,
        help="Grokfast's amplification of the slow gradient; 0 = off (the paper: 2)")
    grokfast_filter: str = setting(
        "ema", choices=("ema", "ma"), legacy="ema", per_member=True,
        help="ema (gradfilter_ema, alpha) | ma (gradfilter_ma: mean of the last window gradients)")
    grokfast_window: int = setting(
        100, legacy=100,
        help="grokfast_filter=ma: the window; the filter acts once it is full (the code's warmup)")
    perp_grad: bool = setting(
        False, per_member=True,
        help="project each gradient tensor orthogonal to its weights (Prieto et al. 2025)")
    perp_grad_scale: str = setting(
        "orthograd", choices=("orthograd", "unscaled"), legacy="unscaled", inert_unless="perp_grad",
        help="orthograd: rescaled to ||g|| as published; unscaled: the projection only")
    # --- permutation routing across model copies (trainers/routing.py, docs/VARIANTS.md); 1 = off
    routing_copies: int = setting(1, "M copies trained together; each step's loss is taken on routed models", solo=True)
    routing_width: float = setting(
        0.0, solo=True, costed=False,
        help="width of the ring kernel Q over the copies: 0 = identity, inf = uniform")
    routing_unit: str = setting(
        "layer", choices=("layer", "sublayer", "weight"), solo=True,
        help="what one permutation routes: layer | sublayer (transformer: attn, mlp apart) | weight (every scalar "
             "weight)")
    elastic_gamma: float = setting(
        0.0, legacy=0.0, costed=False,
        help="Elastic SGD across the copies: each step pulls every copy toward the copies' mean by lr * elastic_gamma "
             "of its distance (decoupled, as AdamW's weight decay pulls toward 0); 0 = off; needs routing_copies > 1")
    # --- optimizer
    optimizer: str = setting(
        "adamw", choices=("adamw", "adam"), legacy="adamw",
        help="adamw (decoupled weight decay) | adam (torch.optim.Adam: weight decay as an L2 gradient term wd * w, "
             "as devinterp's grokking notebook trains)")
    lr: float = setting(1e-3, "learning rate (after warm-up)", per_member=True, costed=False)
    weight_decay: float = setting(
        1.0, per_member=True, costed=False,
        help="weight decay (decoupled with adamw, an L2 gradient term with adam)")
    betas: tuple[float, float] = setting((0.9, 0.98), "Adam(W) betas: two numbers", costed=False)
    adam_eps: float = setting(1e-8, "Adam(W)'s epsilon (torch's default; Prieto et al. train with 1e-25)", legacy=1e-8)
    warmup_steps: int = setting(10, "linear learning-rate warm-up from 0 over this many steps", costed=False)
    batch_size: int = setting(0, "training inputs per step; 0 = the full training set")
    batch_order: str = setting(
        "random", choices=("random", "epoch"), legacy="random",
        help="random: each step draws batch_size rows afresh; epoch: the training set is shuffled each epoch and cut "
             "into batches in order, the last one smaller (Grokfast's code: ceil(n / batch_size) steps an epoch)")
    # --- schedule of the run
    steps: int = setting(40_000, "optimizer updates to train for", costed=False)
    eval_every: int = setting(100, "evaluate loss and accuracy on every input each this many steps", costed=False)
    checkpoint_every: int = setting(
        100, "store the weights each this many steps (and at every phase event)", costed=False)
    log_checkpoints: int = setting(0, "extra log-spaced checkpoints before the first regular one", costed=False)
    grok_threshold: float = setting(
        GROK_THRESHOLD, per_member=True, costed=False,
        help="test accuracy that counts as grokked (and train accuracy as memorized)")
    grok_evals: int = setting(
        3, legacy=1, per_member=True, costed=False,
        help="grokked = the first of this many consecutive evaluations with test accuracy >= grok_threshold: 3 so that "
             "one evaluation lifted by a loss spike (or a first crossing that falls back) is not grokking, at the cost "
             "of 2 evaluations more before the stop rule can end a run; 1 is the first crossing (what files and "
             "ledgers from before this field recorded)")
    stop_after_grok: int = setting(
        0, per_member=True, costed=False,
        help=">0: stop at the first evaluation this many or more evaluations after grokking (grok_evals above) whose "
             "own test accuracy is >= grok_threshold (or test loss <= stop_test_loss), so a run that dips after "
             "grokking trains on until it is back (or to the cap); docs/CLI.md, 'The stop rule'")
    stop_at_event: bool = setting(
        True, legacy=False, per_member=True, costed=False,
        help="the stop rule ends a run only at an evaluation where its event holds (stop_after_grok above); false: at "
             "the stop_after_grok-th evaluation after grokking whatever it reads (the rule before this field, which "
             "the experiments' ledgers keep)")
    stop_test_loss: float = setting(
        0.0, legacy=0.0, per_member=True, costed=False,
        help=">0: the stop rule counts evaluations after test loss <= this instead")
    stop_min_steps: int = setting(
        0, "the stop rule never ends a run before this step", legacy=0, per_member=True, costed=False)
    device: str = setting(
        "auto", choices=("auto", "cpu", "cuda"), hashed=False, costed=False,
        help="auto (cuda when available), cpu or cuda")
    flush_denormal: bool = setting(
        True, legacy=False, hashed=False, costed=False,
        help="flush float32 subnormal numbers (|x| < 1.2e-38) to zero on the CPU while training "
             "(torch.set_flush_denormal): once a run has memorized, the cross-entropy's vanishing probabilities "
             "make subnormal operands, which some x86 CPUs multiply tens of times slower (Nanda's transformer "
             "step after memorization: 2.6x slower on one of this project's machines; docs/PERFORMANCE.md). Values "
             "change only below float32's smallest normal number, so the trajectory equals the unflushed one to "
             "float rounding (there: bit-identical over 4,000 steps) and the ledger's hash leaves the field out. No "
             "effect on CUDA; false: the behaviour before the field existed")
    compile: bool = setting(
        False, legacy=False, solo=True, hashed=False, costed=False,
        help="torch.compile the training step's forward and backward (single runs without regularizer terms; CPU: "
             "needs a C++ compiler), after some seconds of compiling in the first step; the trajectory equals "
             "eager's to float rounding (step times and compile cost: docs/PERFORMANCE.md)")


    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], base: "RunConfig | None" = None) -> "RunConfig":
        """Build from a plain mapping; unknown keys and wrong types are a BadInput."""
        if not isinstance(data, dict):
            raise BadInput(f"config must be a mapping of field -> value, got {type(data).__name__}")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise BadInput(f"unknown config key(s): {', '.join(did_you_mean(str(k), known) for k in unknown)}")
        values = (base or cls()).to_dict()
        for key, raw in data.items():
            values[key] = _coerce(key, known[key].type, raw)
        cfg = cls(**values)
        cfg.betas = tuple(cfg.betas)  # type: ignore[assignment]
        cfg.validate()
        return cfg

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "RunConfig":
        return cls.from_dict(json.loads(text))

    def stop_event_evals(self) -> int:
        """Consecutive evaluations with the stop event that start the stop rule's count: grok_evals
        for grokking, 1 for the stop_test_loss event (its first evaluation)."""
        return 1 if self.stop_test_loss > 0 else self.grok_evals

    def replace(self, **changes: Any) -> "RunConfig":
        return RunConfig.from_dict({**self.to_dict(), **changes})

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        for name, allowed in CHOICES.items():
            if name == "model" and self.model not in allowed:
                allowed = allowed + plugin_models()
            if getattr(self, name) not in allowed:
                raise BadInput(f"{name} must be one of {', '.join(allowed)}; got {getattr(self, name)!r}")
        _check(0.0 < self.train_frac < 1.0, f"train_frac must be in (0, 1); got {self.train_frac}")
        _check(math.isfinite(self.lr) and self.lr > 0, f"lr must be a positive number; got {self.lr}")
        _check(
            math.isfinite(self.weight_decay) and self.weight_decay >= 0,
            f"weight_decay must be >= 0; got {self.weight_decay}",
        )
        _check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
               f"betas must be two numbers in [0, 1); got {list(self.betas)}")
        _check(math.isfinite(self.adam_eps) and self.adam_eps > 0,
               f"adam_eps must be a positive number; got {self.adam_eps}")
        for name in ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "steps",
                     "eval_every", "checkpoint_every"):
            _check(getattr(self, name) >= 1, f"{name} must be >= 1; got {getattr(self, name)}")
        for name in ("warmup_steps", "batch_size", "log_checkpoints", "stop_after_grok", "stop_min_steps"):
            _check(getattr(self, name) >= 0, f"{name} must be >= 0; got {getattr(self, name)}")
        for name in ("seed", "data_seed"):  # torch and numpy take seeds in [0, 2**63)
            _check(0 <= getattr(self, name) < 2**63,
                   f"{name} must be in 0 <= {name} < 2**63; got {getattr(self, name)}")
        _check(self.checkpoint_every <= self.steps,
               f"checkpoint_every ({self.checkpoint_every}) is larger than the run (steps={self.steps})")
        _check(self.eval_every <= self.steps,
               f"eval_every ({self.eval_every}) is larger than the run (steps={self.steps})")
        _check(math.isfinite(self.stop_test_loss) and self.stop_test_loss >= 0,
               f"stop_test_loss must be >= 0; got {self.stop_test_loss}")
        _check(self.stop_test_loss == 0 or self.routing_copies == 1,
               "stop_test_loss is for single runs; a routed run stops on its copies' test accuracy")
        _check(0.0 < self.grok_threshold <= 1.0,
               f"grok_threshold must be in (0, 1]; got {self.grok_threshold}")
        _check(self.grok_evals >= 1, f"grok_evals must be >= 1; got {self.grok_evals}")
        self._validate_variants()
        # task-specific checks (p prime for division, ...) live with the task
        from groklens.tasks import MODULAR_TASKS, TASKS

        task = TASKS.get(self.task)
        task.validate(self)
        _check(self.digits_pairs == 0 or self.task == "digits_add",
               f"digits_pairs is an option of task digits_add, not task={self.task}")
        for name in ("op_token", "nonzero_b"):
            _check(not getattr(self, name) or self.task in MODULAR_TASKS,
                   f"{name} is an option of the modular tasks ({', '.join(MODULAR_TASKS)}), not task={self.task}")
        self._validate_teacher_models()
        _check(self.batch_order == "random" or self.batch_size > 0,
               "batch_order=epoch cuts the training set into mini-batches: set batch_size (0 = full batch)")
        _check(self.init != "fourier" or task.residue_tokens,
               f"init=fourier needs a task whose tokens 0..p-1 are residues mod p; {self.task!r} has none")
        _check(self.mlp_embed != "onehot_residues" or (task.residue_tokens and self.distractor_vocab == 0),
               f"mlp_embed=onehot_residues needs operands that are residues 0..p-1; task {self.task!r}"
               + (f" with distractor_vocab {self.distractor_vocab}" if self.distractor_vocab else "") + " has others")
        _check(self.kl_attn_beta == 0 or not task.multi_target,
               f"kl_attn_beta needs a single readout position; task {self.task!r} has several")
        _check(not (self.attn_mask or self.attn_mask_from) or not task.multi_target,
               f"attn_mask masks the single readout query; task {self.task!r} has several readout positions")


    def _validate_teacher_models(self) -> None:
        """The teacher task's inputs are Gaussian vectors, which only its models read (and they read nothing else)."""
        if self.task == "teacher":
            _check(self.model in TEACHER_MODELS, f"task teacher's inputs are Gaussian vectors: it needs model="
                   f"{' or '.join(TEACHER_MODELS)}; got model={self.model}")
        elif self.model in TEACHER_MODELS:
            _check(False, f"model={self.model} reads Gaussian inputs: it needs task=teacher; got task={self.task}")
        if self.model in TEACHER_MODELS:
            _check(not self.mlp_bias, f"model={self.model} has no biases; mlp_bias=true is an option of model=mlp")
        _check(self.model != "committee" or self.d_mlp % 2 == 1,
               "model=committee needs an odd number of hidden units d_mlp (its output is their majority); "
               f"got {self.d_mlp}")

    def _validate_variants(self) -> None:
        for name in ("radius", "tau"):
            value = getattr(self, name)
            _check(math.isfinite(value) and value > 0, f"{name} must be a positive number; got {value}")
        for name in ("act_norm_lambda", "geomdr_lambda", "kl_attn_beta", "grokfast_lambda"):
            value = getattr(self, name)
            _check(math.isfinite(value) and value >= 0, f"{name} must be >= 0; got {value}")
        _check(math.isfinite(self.attention_rate) and 0.0 <= self.attention_rate <= 1.0,
               f"attention_rate must be in [0, 1]; got {self.attention_rate}")
        _check(self.attention_rate == 1.0 or self.attention == "softmax",
               f"attention_rate mixes softmax attention with the uniform pattern; attention={self.attention} is "
               "already uniform (attention_rate 0 of attention=softmax)")
        _check(self.attention_rate == 1.0 or self.kl_attn_beta == 0,
               "kl_attn_beta reads the softmax of hook_attn_scores, which is not the pattern when attention_rate < 1")
        _check(0.0 <= self.grokfast_alpha < 1.0, f"grokfast_alpha must be in [0, 1); got {self.grokfast_alpha}")
        _check(1 <= self.grokfast_window <= GROKFAST_MAX_WINDOW,
               f"grokfast_window must be in 1..{GROKFAST_MAX_WINDOW}; got {self.grokfast_window}")
        _check(math.isfinite(self.geomdr_target) and self.geomdr_target >= 1,
               f"geomdr_target must be a dimension >= 1; got {self.geomdr_target}")
        _check(self.geomdr_start >= 0, f"geomdr_start must be >= 0; got {self.geomdr_start}")
        _check(self.geomdr_end == 0 or self.geomdr_end > self.geomdr_start,
               f"geomdr_end must be 0 (end of run) or > geomdr_start ({self.geomdr_start}); got {self.geomdr_end}")
        self._validate_routing()
        _check(-1 <= self.kl_attn_layer < self.n_layers,
               f"kl_attn_layer must be -1 (every layer) or in 0..{self.n_layers - 1}; got {self.kl_attn_layer}")
        parse_positions(self.attn_mask)
        _check(not self.attn_mask_from or re.fullmatch(RUN_NAME_PATTERN, self.attn_mask_from) is not None,
               f"attn_mask_from must be a run name (letters, digits, _ - ., and {{seed}}), no path; "
               f"got {self.attn_mask_from!r}")
        freqs = parse_freqs(self.fourier_freqs)
        transformer_only = [(n, getattr(self, n)) for n in TRANSFORMER_ONLY
                            if getattr(self, n) != getattr(RunConfig, n)]
        if self.model != "transformer":
            for name, value in transformer_only:
                raise BadInput(f"{name}={value} is an option of model=transformer, not model={self.model}")
            _check(self.kl_attn_beta == 0, f"kl_attn_beta needs attention: model=transformer, not model={self.model}")
        _check(self.mlp_unembed_bias or (self.model == "mlp" and self.mlp_bias),
               "mlp_unembed_bias=false drops the unembedding bias of model=mlp with mlp_bias=true; "
               f"model={self.model} with mlp_bias={str(self.mlp_bias).lower()} has none to drop")
        _check(self.norm_placement == "pre" or self.norm in ("ln", "rms"),
               f"norm_placement={self.norm_placement} places a LayerNorm or RMSNorm (norm: ln | rms); "
               f"norm={self.norm} has "
               + ("no norm to place" if self.norm == "none" else "its projection after every sum already"))
        if self.init == "fourier":
            _check(2 * len(freqs) <= self.d_model,
                   f"init=fourier needs 2 x {len(freqs)} frequencies <= d_model ({self.d_model})")
            bad = [k for k in freqs if k > self.p // 2]
            _check(not bad, f"fourier_freqs must be in 1..p//2 = {self.p // 2}; got {bad[0] if bad else ''}")

    def _validate_routing(self) -> None:
        _check(1 <= self.routing_copies <= ROUTING_MAX_COPIES,
               f"routing_copies must be in 1..{ROUTING_MAX_COPIES}; got {self.routing_copies}")
        _check(not math.isnan(self.routing_width) and self.routing_width >= 0,
               f"routing_width must be >= 0 (0 = identity kernel, inf = uniform); got {self.routing_width}")
        _check(math.isfinite(self.elastic_gamma) and self.elastic_gamma >= 0,
               f"elastic_gamma must be a number >= 0 (0 = off); got {self.elastic_gamma}")
        if self.routing_copies == 1:
            for name in ("routing_width", "routing_unit", "elastic_gamma"):  # off: at their class defaults
                _check(getattr(self, name) == getattr(RunConfig, name),
                       f"{name}={getattr(self, name)!r} needs routing_copies > 1 (routing is off with 1 copy)")
            return
        _check(not self.compile, "compile=true is for single runs; a routed run (routing_copies > 1) trains eagerly")
        _check(self.routing_unit != "sublayer" or self.model == "transformer",
               f"routing_unit={self.routing_unit} is an option of model=transformer, not model={self.model}")

    def fourier_frequencies(self) -> tuple[int, ...]:
        return parse_freqs(self.fourier_freqs)


def field_facts() -> dict[str, FieldFacts]:
    """Every RunConfig field's facts, in declaration order."""
    bare = [f.name for f in fields(RunConfig) if "facts" not in f.metadata]
    if bare:  # a programming error, said at import: every field states its facts
        raise TypeError(f"RunConfig field(s) {', '.join(bare)} declared without setting(default, help, ...) "
                        "(docs/EXTENDING.md, 'Add a config field')")
    return {f.name: f.metadata["facts"] for f in fields(RunConfig)}


# the tables of fields, read from the declarations (FieldFacts says what each fact means)
FIELD_FACTS = field_facts()
CHOICES: dict[str, tuple[str, ...]] = {n: f.choices for n, f in FIELD_FACTS.items() if f.choices}
# a key missing from a stored config (a field added after the file was written) is read as the
# value the file meant, where that is not today's default
STORED_LEGACY: dict[str, Any] = {n: f.legacy for n, f in FIELD_FACTS.items()
                                 if f.has_legacy and f.legacy != getattr(RunConfig, n)}
DERIVED_FROM: dict[str, str] = {n: f.derived_from for n, f in FIELD_FACTS.items() if f.derived_from}
TRANSFORMER_ONLY: tuple[str, ...] = tuple(n for n, f in FIELD_FACTS.items() if f.transformer_only)
SEED_FIELDS: tuple[str, ...] = tuple(n for n, f in FIELD_FACTS.items() if f.seed)


def as_planned(cfg: dict[str, Any]) -> dict[str, Any]:
    """A config mapping as it was planned: the fields a run fills in from another run (DERIVED_FROM)
    back at their defaults while the field naming that run is set."""
    return {k: getattr(RunConfig, k) if k in DERIVED_FROM and cfg.get(DERIVED_FROM[k]) else v for k, v in cfg.items()}


def stored_dict(data: Any) -> Any:
    """A stored config mapping with the keys an older file lacks filled in as that file meant."""
    if not isinstance(data, dict):
        return data
    return {**{k: v for k, v in STORED_LEGACY.items() if k not in data}, **data}


def parse_freqs(text: str) -> tuple[int, ...]:
    """'14 35 41' or '14,35,41' -> (14, 35, 41): distinct integers >= 1, at least one."""
    return _distinct_ints(text, "fourier_freqs", lowest=1, empty=False)


def _distinct_ints(text: str, name: str, lowest: int, empty: bool) -> tuple[int, ...]:
    """Field `name`'s integers separated by spaces or commas: distinct, >= lowest, some unless `empty`."""
    parts = text.replace(",", " ").split()
    try:
        values = tuple(int(x) for x in parts)
    except ValueError:
        raise BadInput(f"{name} must be integers separated by spaces or commas; got {text!r}") from None
    _check((empty or len(values) >= 1) and all(k >= lowest for k in values) and len(set(values)) == len(values),
           f"{name} must be distinct integers >= {lowest}; got {text!r}")
    return values


# attn_mask_from: a run's name beside this run's file, where {seed} stands for this run's seed
RUN_NAME_PATTERN = r"(?:[A-Za-z0-9_\-]|\{seed\})(?:[A-Za-z0-9_.\-]|\{seed\})*"


def parse_positions(text: str) -> tuple[int, ...]:
    """attn_mask '0 7' or '0,7' -> (0, 7): distinct positions >= 0 ('' -> (), no mask)."""
    return _distinct_ints(text, "attn_mask", lowest=0, empty=True)


def closest_name(key: str, known) -> str | None:
    """The known name a mistyped `key` (snake_case) most likely meant, None when none is close: a
    near spelling (difflib), or the name its words' initials spell (learning_rate -> lr). The one
    rule for unknown config keys and unknown command-line options."""
    import difflib

    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.75)
    initials = "".join(w[0] for w in key.split("_") if w)
    return close[0] if close else initials if "_" in key and initials in known else None


def did_you_mean(key: str, known) -> str:
    """`key`, with the closest known name when there is one (closest_name)."""
    guess = closest_name(key, known)
    return f"{key} (did you mean {guess}?)" if guess else key


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise BadInput(message)


def _coerce(key: str, annotation: Any, raw: Any) -> Any:
    """Convert a YAML/JSON/CLI value to the field's type, refusing what does not fit."""
    ann = str(annotation)
    try:
        if ann == "bool":
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, str) and raw.lower() in ("true", "false", "1", "0", "yes", "no"):
                return raw.lower() in ("true", "1", "yes")
            raise ValueError
        if ann == "int":
            if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
                raise ValueError
            return int(raw)
        if ann == "float":
            if isinstance(raw, bool):
                raise ValueError
            return float(raw)
        if ann == "str":
            if key == "fourier_freqs" and isinstance(raw, (list, tuple)):  # YAML: [14, 35, 41]
                if not all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
                    raise ValueError
                return " ".join(map(str, raw))
            if not isinstance(raw, str):
                raise ValueError
            return raw
        if ann.startswith("tuple"):
            if isinstance(raw, str):
                raw = [x for x in raw.replace(",", " ").split()]
            return tuple(float(x) for x in raw)
    except (TypeError, ValueError):
        pass
    else:
        return raw
    import reprlib  # a value built from YAML aliases can be huge: show its start only

    raise BadInput(f"config key {key!r}: {reprlib.repr(raw)} is not a valid {ann}")


# Named starting points; `nanda` is the default. docs/VARIANTS.md says where each comes from.
_SPHERE = {  # Yildirim 2026: bounded sphere, bidirectional, MLP biases, betas (0.9, 0.999), no warm-up,
    # PyTorch's default init as the paper's code
    "norm": "sphere", "init_scheme": "torch", "unembed": "bounded", "radius": 1.0, "tau": 10.0,
    "causal": False, "mlp_bias": True,
    "betas": [0.9, 0.999], "warmup_steps": 0, "lr": 6e-4, "weight_decay": 1.0,
    "steps": 10_000, "eval_every": 200, "checkpoint_every": 200,
}
_NANOGPT = {  # a nanoGPT-sized causal LM (our choices of the training setup: docs/VARIANTS.md)
    "task": "digits_add", "n_digits": 3, "norm": "ln", "act_fn": "gelu", "causal": True, "mlp_bias": True,
    "lr": 1e-3, "betas": [0.9, 0.99], "weight_decay": 0.1, "warmup_steps": 100,
}
PRESETS: dict[str, dict[str, Any]] = {
    "nanda": {},
    "sphere": _SPHERE,
    "sphere_fourier": {**_SPHERE, "init": "fourier", "weight_decay": 0.0},
    "mlp": {  # the two-hidden-layer MLP of the scaling-law / activation-norm studies (widths ours)
        "model": "mlp", "n_layers": 2, "d_model": 128, "d_mlp": 256, "mlp_embed": "learned", "mlp_bias": True,
    },
    "nanogpt_10m": {  # 6 layers x 384 wide (nanoGPT's "baby GPT" shape): 10.6M parameters
        **_NANOGPT, "n_layers": 6, "d_model": 384, "n_heads": 6, "d_head": 64, "d_mlp": 1536,
        "train_frac": 0.1, "batch_size": 512, "steps": 20_000, "eval_every": 500, "checkpoint_every": 1000,
    },
    "nanogpt_tiny": {  # the same architecture family, small enough for CPU tests
        **_NANOGPT, "n_digits": 2, "n_layers": 2, "d_model": 32, "n_heads": 2, "d_head": 16, "d_mlp": 128,
        "train_frac": 0.3, "lr": 3e-3, "batch_size": 128, "steps": 200, "eval_every": 50, "checkpoint_every": 100,
    },
}


def config_from(preset: str | None = None, file: str | Path | None = None,
                overrides: dict[str, Any] | None = None) -> RunConfig:
    """The one way presets are applied: preset (default nanda) < config file < overrides.

    An override of None means "not given" (an unset CLI flag). Unknown preset names, unknown
    keys and bad values are BadInput."""
    name = "nanda" if preset is None else preset
    if name not in PRESETS:
        raise BadInput(f"unknown preset {name!r} (known: {', '.join(sorted(PRESETS))})")
    values: dict[str, Any] = dict(PRESETS[name])
    if file is not None:
        values.update(load_config_file(file))
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return RunConfig.from_dict(values)


def preset(name: str) -> RunConfig:
    """The preset's config, nothing changed."""
    return config_from(name)


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML (or JSON) config file as data only (safe_load: no code from files)."""

    path = Path(path)
    if not path.is_file():
        raise BadInput(f"config file {path} does not exist or is not a file")
    data = safe_yaml(path)
    if data is None:
        raise BadInput(f"config file {path} is empty")
    if not isinstance(data, dict):
        raise BadInput(f"config file {path} must hold a mapping of field: value")
    return data


YAML_MAX_DEPTH = 20  # configs and sweeps are two or three levels deep
YAML_MAX_NODES = 100_000  # nodes after alias expansion: a few aliases must not make gigabytes
YAML_MAX_SCALAR = 1000  # characters of one value (a number of 100,000 digits is not a config)


def safe_yaml(path: Path, what: str = "config file") -> Any:
    """Data from a YAML file (safe loader: no code), refusing nesting deeper than YAML_MAX_DEPTH
    and documents whose aliases expand to more than YAML_MAX_NODES nodes, before building them."""
    import yaml

    try:
        loader = yaml.SafeLoader(path.read_text())
        try:
            node = loader.get_single_node()
            if node is not None:
                _count_nodes(node, path, what)
                return loader.construct_document(node)
            return None
        finally:
            loader.dispose()
    except RecursionError:
        raise BadInput(f"{what} {path} is nested too deeply") from None
    except OSError as exc:
        raise BadInput(f"{what} {path} is unreadable ({exc.strerror or exc})") from None
    except (yaml.YAMLError, UnicodeDecodeError, ValueError, OverflowError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BadInput(f"{what} {path} is not valid YAML: {first}") from None


def _count_nodes(root, path: Path, what: str) -> None:
    import yaml

    seen = 0
    stack = [(root, 1)]
    while stack:  # iterative: an alias is walked again at each use, as construction would expand it
        node, depth = stack.pop()
        seen += 1
        if depth > YAML_MAX_DEPTH:
            raise BadInput(f"{what} {path} is nested deeper than {YAML_MAX_DEPTH} levels")
        if seen > YAML_MAX_NODES:
            raise BadInput(f"{what} {path} expands to more than {YAML_MAX_NODES} values (nested aliases?)")
        if isinstance(node, yaml.ScalarNode) and len(node.value) > YAML_MAX_SCALAR:
            raise BadInput(f"{what} {path} holds a value of {len(node.value)} characters (over {YAML_MAX_SCALAR}) "
                           f"at line {node.start_mark.line + 1}")
        if isinstance(node, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)]
            dup = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
            if dup is not None:  # YAML says keys are unique; PyYAML would keep the last silently
                raise BadInput(f"{what} {path} gives the key {dup!r} twice (line {node.start_mark.line + 1})")
            for key, value in node.value:
                stack.extend(((key, depth + 1), (value, depth + 1)))


def field_names() -> list[str]:
    return [f.name for f in fields(RunConfig)]


def field_help() -> dict[str, str]:
    """field -> its description in words (its `setting`'s help; `train --help` shows them)."""
    return {n: f.help for n, f in FIELD_FACTS.items()}


__all__ = ["RunConfig", "PRESETS", "config_from", "preset", "load_config_file", "safe_yaml",
           "field_names", "field_help",
           "field_facts", "setting", "FieldFacts", "CHOICES", "parse_freqs"]

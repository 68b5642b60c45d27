# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # groklens in one sitting
#
# Train a small modular-addition transformer until it groks, look inside it, watch its Fourier
# circuit form, read Nanda et al.'s progress measures, compare it with a bounded-sphere variant,
# write the report, and finish with a TransformerLens analysis (direct logit attribution) on the
# grokked model. Everything is tiny (p = 23, d_model 32): measured on a loaded 2-core machine
# (2026-12, issue 43), the whole notebook took 160 s of CPU time, 437 s of wall time.
#
# This file is a Jupyter notebook in jupytext's percent format: open it in Jupyter with jupytext
# installed (`pip install jupytext`; or `jupytext --to notebook examples/tutorial.py`), or run it
# as a script: `python examples/tutorial.py` (the test suite does, so it stays true). Run it from
# anywhere but the directory that *contains* your clone (README, "Importing groklens"). Its files
# go to `tutorial-out/` (or `$GROKLENS_TUTORIAL_DIR`).

# %%
import os
from pathlib import Path


from groklens.config import RunConfig
from groklens.trainers.train import train

WORK = Path(os.environ.get("GROKLENS_TUTORIAL_DIR", "tutorial-out"))
WORK.mkdir(parents=True, exist_ok=True)

# p = 23 addition, 60% of the pairs for training, one layer without a norm (Nanda's architecture,
# smaller); it memorizes in ~100 steps and groks at ~1,100; training stops 10 evaluations after
# grokking (at most at step 4000).
BASE = dict(task="add", p=23, train_frac=0.6, d_model=32, n_heads=2, d_head=16, d_mlp=128, lr=1e-2,
            weight_decay=1.0, steps=4000, eval_every=50, checkpoint_every=200, stop_after_grok=10, device="cpu")

# %% [markdown]
# ## 1. Train
#
# One run is one HDF5 file holding every checkpoint, the evaluation rows, the config and the data
# split. The same from the shell: `groklens train --out tutorial-out/base.h5 --p 23 --train-frac 0.6
# --d-model 32 ...` (`groklens train --help` describes every field). `train` refuses an existing file,
# so rerunning this notebook reuses the runs it already has.

# %%
def trained(name: str, **changes) -> Path:
    path = WORK / f"{name}.h5"
    if not path.exists():
        result = train(RunConfig.from_dict({**BASE, **changes}), path, progress=False)
        print(f"{path}: {result.status} at step {result.last_step}")
    return path


base_path = trained("base")

# %% [markdown]
# ## 2. Inspect
#
# `Trajectory` reads a run (also one still being trained). Its metrics are a pandas DataFrame away
# (pandas is the optional extra `groklens[pandas]`).

# %%
from groklens.analyses import to_pandas
from groklens.analyses.grokking import run_summary
from groklens.checkpoints import Trajectory

run = Trajectory(base_path)
summary = run_summary(run)
print("checkpoints:", len(run.steps), "from", int(run.steps[0]), "to", int(run.steps[-1]))
print("memorized at", summary["memorization_step"]["0.95"], "grokked at", summary["grokking_step"]["0.95"])
metrics = run.to_pandas()
print(metrics[["step", "train_acc", "test_acc", "train_loss", "test_loss"]].iloc[::8].to_string(index=False))
GROK = summary["grokking_step"]["0.95"]
assert GROK is not None, "the tutorial run did not grok"

# %% [markdown]
# ## 3. The Fourier circuit
#
# Nanda et al. found that a grokked model computes `a + b mod p` with a few *key frequencies*: its
# embeddings and MLP neurons are sums of cos/sin of `2 pi k x / p` for those k. The `fourier` analysis
# finds the key set of each checkpoint and how much of each neuron's variance it explains (FVE):
# first at every checkpoint with its own key set (what `compare` reads), then every checkpoint
# measured on the grokked model's set (`key_frequencies="last"`), the way Nanda draws his curves.
# Results are kept in `base.analyses.h5` beside the run, so a second call is free.

# %%
from groklens.analyses import compute

last = int(run.steps[-1])
own = compute(run, "fourier")  # every checkpoint, its own key set
fourier = to_pandas(run, "fourier")  # the same, as a DataFrame: one row per checkpoint
print(fourier[["step", "n_key_frequencies", "neuron_fve",
               "restricted_loss_all", "excluded_loss_train"]].to_string(index=False))
keys = [int(k) for k in own.values["key_frequencies"][-1]]
print("key frequencies of the grokked model:", keys)

along = compute(run, "fourier", key_frequencies="last")
acc = metrics.set_index("step")["test_acc"]
for step, fve in zip(along.steps, along["neuron_fve"]):
    print(f"step {step:>5}: neuron FVE on {keys}: {float(fve):.2f}   test acc {acc[step]:.2f}")

# %% [markdown]
# ## 4. Progress measures
#
# Restricted loss (the logits projected onto the key frequencies) and excluded loss (those
# directions removed), beside train / test loss and the weight norm, are Nanda's progress
# measures; `groklens.analyses.progress` locates his three phases (memorization, circuit
# formation, cleanup) on them by the rule in `PHASE_RULE`. A boundary these curves do not show
# (a run stopped before it, checkpoints too sparse) is None, never a guess: this run stops 10
# evaluations after grokking, while its excluded loss is still rising (measured: 9.4 at step 1400,
# 14.2 at its last checkpoint, 1650), so circuit formation has no end here and C and K are None;
# a peak at the last checkpoint would only say where training stopped. Train longer
# (`stop_after_grok`, `steps`) to see them.

# %%
from groklens.analyses.progress import PHASE_RULE, phase_boundaries, progress_curves

curves = progress_curves(base_path)
print("key set of the curves:", curves.key_source)
print("phases:", phase_boundaries(curves))
print("rule:", PHASE_RULE)

# %% [markdown]
# ## 5. Compare with a variant
#
# The bounded sphere (Yildirim 2026: the residual stream projected onto a sphere, a bounded
# unembedding) on the same task and seed. `compare` puts memorization and grokking steps, the gap,
# the speed-up against a baseline and the stored analyses at each phase side by side; as a
# DataFrame with `to_pandas()`.

# %%
from groklens.analyses.compare import compare

sphere_path = trained("sphere", norm="sphere", unembed="bounded", causal=False)
compute(Trajectory(sphere_path), "fourier")
compute(Trajectory(sphere_path), "fourier", key_frequencies="last")
comp = compare([base_path, sphere_path], baseline=base_path)
print(comp.format_table())
table = comp.to_pandas()
print(table[["variant", "memorization_step_mean", "grokking_step_mean", "speedup"]].to_string(index=False))

# %% [markdown]
# ## 6. The report
#
# Figures and one HTML page (`report/index.html`). With the fixed-key Fourier results stored, the
# page has the progress-measures figure (`fig_progress_measures`). `--figures` / `figures=` picks
# figures, `style="paper"` sizes them for a paper. From the shell:
# `groklens report tutorial-out/*.h5 -o tutorial-out/report --baseline tutorial-out/base.h5`.

# %%
from groklens.analyses.report import build_report

report = build_report([base_path, sphere_path], WORK / "report", baseline=base_path)
print("wrote", report.index)
for fig in report.figures:
    print("  ", fig.name)
for title, why in report.missing:
    print("   missing:", title, "-", why)
assert any(f.name == "fig_progress_measures.png" for f in report.figures)

# %% [markdown]
# ## 7. TransformerLens: direct logit attribution
#
# `run.model(step)` is a TransformerLens `HookedRootModule`: `run_with_cache` gives an
# `ActivationCache` with every hook. Direct logit attribution splits the residual stream at the
# readout position into what each component wrote (embeddings, attention, MLP) and projects each
# onto the direction "correct answer minus a wrong one". The parts sum to the model's own logit
# difference (checked below). After grokking the MLP carries most of it: it is where the Fourier
# products `cos(w a) cos(w b) - sin(w a) sin(w b)` are formed.

# %%
import torch

model = run.model(last)
data = run.dataset()
x, y = data.inputs[data.test_idx], data.labels[data.test_idx]
wrong = (y + 1) % data.d_vocab_out  # one wrong answer per input
with torch.no_grad():
    logits, cache = model.run_with_cache(x)
    stack, labels = cache.decompose_resid(pos_slice=-1, return_labels=True)
    attrs = cache.logit_attrs(stack, tokens=y, incorrect_tokens=wrong, pos_slice=-1)  # [component, input]
    readout = logits[:, -1]
    diff = readout.gather(1, y[:, None])[:, 0] - readout.gather(1, wrong[:, None])[:, 0]
for label, a in zip(labels, attrs):
    print(f"{label:>12}: mean logit difference {float(a.mean()):7.2f}")
print(f"{'sum':>12}: {float(attrs.sum(0).mean()):7.2f}   the model's own: {float(diff.mean()):7.2f}")
assert torch.allclose(attrs.sum(0), diff, atol=1e-3 * float(diff.abs().max()) + 1e-4)
print("test accuracy of the grokked model:", float((readout.argmax(-1) == y).float().mean()))

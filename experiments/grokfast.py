"""The Grokfast experiment (Lee et al. 2024): Grokfast-EMA and Grokfast-MA against the baseline on
x*y mod p. The paper scale is their code's setup (ironjr/grokfast, main.py and README); the quick
scale is a toy proxy on the project's small transformer. The paper rows also read their own
code's runs on this machine (grokfast_official.py, the peer ledger)."""

from __future__ import annotations

import dataclasses

from groklens.experiments.core import (
    Context, Experiment, Plan, Published, QUICK, QUICK_NOTE, Row, SMOKE, SMOKE_NOTE, Scale, grok_row,
    no_analyses, register, speedup_row)
from groklens.experiments.grokfast_official import PEER, PEER_LEDGER, PEER_REPO, load_official
from groklens.experiments.peer import OfficialRun

GROKFAST = "Lee et al. 2024, Grokfast (REFERENCES.md; ironjr/grokfast README)"
PUBLISHED = {"base": 39_890, "grokfast": 910, "grokfast_ma": 790}  # iterations to 95% validation accuracy
LABELS = {"base": "baseline", "grokfast": "Grokfast-EMA (alpha 0.98, lambda 2)",
          "grokfast_ma": "Grokfast-MA (window 100, lambda 5)"}

# Their main.py, read from the code: Decoder(dim 128, 2 layers, 4 heads, GELU MLP of 4x width, biases);
# F.cross_entropy on the float32 logits (loss ce_float32: once the label's logit leads by ~17 nats its
# gradient is exactly 0, which float64 would keep alive; a baseline trained with the float64 loss had
# not grokked at 41,000 steps, test accuracy flat at 0.39 since ~10,000);
# Block.forward is x = ln_1(x); x = x + attn(x); x = x + mlp(ln_2(x)); ln_f; head without bias over the
# p+2 tokens; tokens [x, op, y, =] with y in 1..p-1, loss at the last position; torch.optim.Adam (its
# coupled L2 weight decay), lr 1e-3, betas (0.9, 0.98), LambdaLR warm-up update/10 over the first 10
# updates (the first has lr 0); the training half shuffled each epoch in batches of 512 (the last 48);
# validation accuracy after every epoch (10 updates).
PAPER = dict(task="mul", p=97, op_token=True, nonzero_b=True, train_frac=0.5,
             n_layers=2, d_model=128, n_heads=4, d_head=32, d_mlp=512, act_fn="gelu", mlp_bias=True,
             norm="ln", norm_placement="in_stream", init_scheme="torch_mha", causal=True,
             optimizer="adam", lr=1e-3, betas=(0.9, 0.98), warmup_steps=10, batch_size=512, batch_order="epoch",
             loss="ce_float32", weight_decay=0.0, steps=80_000, eval_every=10, checkpoint_every=2000, stop_after_grok=1)
PAPER_NOTE = ("their code's setup (ironjr/grokfast main.py): x*y mod 97, y in 1..96, [x, op, y, =], half the pairs "
              "for training, 2-layer causal decoder, width 128, 4 heads, GELU MLP 512, x = LN1(x); x = x + Attn(x); "
              "x = x + MLP(LN2(x)), final LN, cross-entropy in float32, Adam (coupled L2) lr 1e-3, betas (0.9, 0.98), "
              "10-step warm-up, epochs of batches of 512, validation every epoch (10 steps; the baseline every 5 "
              "epochs); censored at 80,000 steps (2x the "
              "published baseline). Differences: no attention biases (nn.MultiheadAttention's in_proj_bias and "
              "out_proj.bias start at 0 and are trained there); the train/validation split is drawn from data_seed "
              "598 for every seed (theirs from the run's seed), the epoch order from numpy (seed, epoch) (theirs "
              "torch's global RNG)")


# ---------------------------------------------------------------------- grokfast
def _plan_grokfast(sc: Scale, scale: str) -> Plan:
    if scale != "paper":
        return Plan({"base": {}, "grokfast": {"grokfast_alpha": 0.98, "grokfast_lambda": 2.0}}, "base", sc.base)
    # the README's commands: --filter ema --alpha 0.98 --lamb 2.0 --weight_decay 0.005 and
    # --filter ma --window_size 100 --lamb 5.0 --weight_decay 0.01; the baseline has weight decay 0
    # the baseline is evaluated every 50 steps: each evaluation of all 9,312 inputs costs about a third of
    # a training step's CPU time every 10 steps, and 50 of ~40,000 steps is below the seeds' spread
    return Plan({"base": {"eval_every": 50},
                 "grokfast": {"grokfast_filter": "ema", "grokfast_alpha": 0.98, "grokfast_lambda": 2.0,
                              "weight_decay": 0.005},
                 "grokfast_ma": {"grokfast_filter": "ma", "grokfast_window": 100, "grokfast_lambda": 5.0,
                                 "weight_decay": 0.01}}, "base", sc.base)


def _read_grokfast(ctx: Context) -> list[Row]:
    paper = ctx.scale == "paper"
    diff = ctx.sc.note if paper else (f"{ctx.sc.note}; a toy proxy: our transformer and AdamW with wd 1, not "
                                      "Grokfast's model and optimizer (those are the paper scale)")
    arms = [v for v in ("base", "grokfast", "grokfast_ma") if v in ctx.plan.variants]
    rows = [grok_row(ctx, f"iterations to 95% validation accuracy, {LABELS[v]}",
                     Published(PUBLISHED[v], f"{PUBLISHED[v]:,}", GROKFAST), v, diff) for v in arms]
    for v in arms[1:]:
        pub = PUBLISHED["base"] / PUBLISHED[v]
        rows.append(speedup_row(ctx, f"speed-up of {LABELS[v].split(' (')[0]}",
                                Published(pub, f"{pub:.1f}x (derived: 39,890 / {PUBLISHED[v]})", GROKFAST),
                                "base", v, diff, verdict=paper))
    return rows + _official_rows(ctx, arms) if paper else rows


OFFICIAL_NOTE = ("their own code ({repo} at {commit}, main.py and grokfast.py unchanged) run by "
                 "benchmarks/peer/grokfast_official.py on this machine: the README's command for the arm with --seed S "
                 "and --budget {budget} iterations (theirs: 300,000, with no stop), one thread; recorded by "
                 "benchmarks/peer/record_peer.py grokfast in docs/results/peer/grokfast-official.json. Their split "
                 "and batch order come from the seed (ours: data_seed 598 for every seed); their model has the "
                 "attention biases ours lacks; validation after every epoch of 10 iterations; grokking = the first "
                 "iteration count with validation accuracy >= 0.95, their README's measure")


def _official_rows(ctx: Context, arms: list[str]) -> list[Row]:
    """Each arm as their own code ran it here (the peer ledger, at the paper's p), beside groklens'
    runs of the arm; a run shorter than its grokking is censored at its budget."""
    entries = [e for e in load_official(PEER_LEDGER) if e["p"] == ctx.sc.base["p"]]
    rows = []
    for v in arms:
        runs = sorted((OfficialRun(e, PEER) for e in entries if e["arm"] == v), key=lambda r: r.seed)
        octx = dataclasses.replace(ctx, arms={**ctx.arms, f"official:{v}": runs})
        note = OFFICIAL_NOTE.format(
            repo=PEER_REPO, commit=", ".join(sorted({r.entry["repo_commit"][:10] for r in runs})) or "—",
            budget=", ".join(sorted({f"{r.entry['epochs']:,}" for r in runs})) or "—")
        row = grok_row(octx, f"iterations to 95% validation accuracy, their own code, {LABELS[v]}",
                       Published(PUBLISHED[v], f"{PUBLISHED[v]:,}", GROKFAST), f"official:{v}", note)
        row.ours_text = f"{row.ours_text}; groklens ({v}): {ctx.grok(v)[1]}" if runs else \
            "no official-code run recorded"
        rows.append(row)
    return rows


register(Experiment(
    "grokfast",
    "Grokfast-EMA and Grokfast-MA against the baseline on x*y mod p, 50% train (paper: their code's setup)",
    {
        "smoke": Scale.of({**SMOKE, "task": "mul"}, SMOKE_NOTE + " (x*y mod 7)"),
        "quick": Scale.of({**QUICK, "task": "mul", "steps": 6000, "stop_after_grok": 1},
                        "x*y mod 23 (the paper: mod 97), " + QUICK_NOTE.split(", ", 2)[2]
                        + "; censored at 6000 steps"),
        "paper": Scale.of(PAPER, PAPER_NOTE, expect_grok=PUBLISHED),  # the published iterations
    },
    _plan_grokfast, _read_grokfast, no_analyses, seeds={"smoke": 1, "quick": 2, "paper": 5}))

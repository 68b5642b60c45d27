"""Training throughput of groklens against a plain PyTorch loop of the same model.

Run by hand (not by the test suite), on one thread:
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/train_throughput.py [--block 20 --repeats 5] [--profile]

For each configuration (the canonical p=113 model, `RunConfig()`; the bounded sphere, preset
`sphere`) it times, in the same process and alternating blocks of `--block` steps:
  groklens.step   `groklens.trainers.single.SingleRun.train_step` (hooks, regularizer plumbing,
                  float64 loss, grad-norm check, as `groklens train` runs it);
  groklens.step.explicit  the same step with the model's explicit forward path forced (what runs
                  when a hook is attached; the forward pass of groklens before the fused fast
                  path, bit-identical): the "before" of issue 18;
  groklens.train  `groklens.trainers.train.train` end to end (evaluation every `eval_every`
                  steps on all p^2 inputs and checkpoints every `checkpoint_every` steps, as
                  configured), per step, from a separate short run;
  plain           a plain PyTorch loop written below: the same parameters (copied from the
                  groklens model), the same forward pass, full batch, AdamW, float64
                  cross-entropy at the readout position, nothing else;
  plain.readout   the same plain loop computing only what the loss needs: the last layer's
                  attention for the readout query only, and its MLP and unembedding at the
                  readout position only (what the groklens trainer does during training:
                  `Transformer.forward(..., readout=slice)`; the same loss and gradients,
                  checked below);
  plain.sdpa      the reference: the loop a competent user writes for the same model (the same
                  initial parameters): one fused QKV projection, F.scaled_dot_product_attention,
                  the full forward pass, float32 cross-entropy at the readout position, full
                  batch AdamW (same loss, checked below).
Reported: median steps/s over the blocks of each, and the step-time ratios of groklens.step to
`plain.sdpa` (the reference of issue 18: target <= 0.5 canonical, <= 0.7 sphere) and to the old
reference `plain`. Alternating
blocks cancel slow drifts of a shared machine; the ratios are meaningful even when the
absolute rates are not. `--profile` prints where groklens' training step spends its time
(torch.profiler, self CPU time by operator).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from groklens.trainers import train as training
from groklens.trainers.engine import warmup_factor
from groklens.trainers.single import SingleRun
from groklens.tasks import TASKS
from torch import nn

from groklens.config import RunConfig, preset

from common import Timed  # benchmarks/common.py


class _NoWriter:
    """Trainer needs a writer object; train_step never touches it."""

    class f:
        filename = "unused.h5"


def groklens_trainer(cfg: RunConfig) -> SingleRun:
    data = TASKS.get(cfg.task).build(cfg)
    return SingleRun(cfg, data, lambda _t: _NoWriter(), progress=False)


class PlainTransformer(nn.Module):
    """The groklens transformer written plainly (no hooks), for norm in none|ln|sphere and
    unembed linear|bounded, as a researcher would write it for one experiment."""

    def __init__(self, cfg: RunConfig, src: nn.Module, readout_only: bool, readout_pos: int):
        super().__init__()
        self.cfg, self.readout_only, self.pos = cfg, readout_only, readout_pos
        sd = {k: v.detach().clone() for k, v in src.state_dict().items()}
        self.params = nn.ParameterDict({k.replace(".", "_"): nn.Parameter(v) for k, v in sd.items()
                                        if not k.endswith("causal_mask")})
        n = sd["pos_embed.W_pos"].shape[0]
        self.register_buffer("mask", torch.tril(torch.ones(n, n, dtype=torch.bool)))

    def P(self, name: str) -> torch.Tensor:
        return self.params[name.replace(".", "_")]

    def norm(self, x, where: str):
        c = self.cfg
        if c.norm == "sphere":
            return c.radius * F.normalize(x, dim=-1)
        if c.norm == "ln":
            return F.layer_norm(x, x.shape[-1:], self.P(f"{where}.w"), self.P(f"{where}.b"), eps=1e-5)
        if c.norm == "rms":
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.P(f"{where}.w")
        return x

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # -> logits [b, v] at the readout position
        c = self.cfg
        sphere = c.norm == "sphere"
        x = self.P("embed.W_E")[tokens] + self.P("pos_embed.W_pos")[: tokens.shape[1]]
        if sphere:
            x = self.norm(x, "")
        n, e = x.shape[1], c.d_head
        for layer in range(c.n_layers):
            pre = f"blocks.{layer}."
            last = layer == c.n_layers - 1 and self.readout_only
            a_in = x if sphere else self.norm(x, pre + "ln1")
            wq, wk, wv, wo = (self.P(pre + f"attn.{w}") for w in ("W_Q", "W_K", "W_V", "W_O"))
            q_in = a_in[:, self.pos : self.pos + 1] if last else a_in
            q = torch.einsum("bpd,hde->bhpe", q_in, wq)
            k = torch.einsum("bpd,hde->bhpe", a_in, wk)
            v = torch.einsum("bpd,hde->bhpe", a_in, wv)
            s = q @ k.transpose(-1, -2) / math.sqrt(e)
            if c.attention == "uniform":
                s = torch.zeros_like(s)
            if c.causal:
                m = self.mask[self.pos : self.pos + 1, :n] if last else self.mask[:n, :n]
                s = s.masked_fill(~m, float("-inf"))
            z = s.softmax(-1) @ v  # [b, h, q, e]
            attn = torch.einsum("bhqe,hed->bqd", z, wo)
            x = (x[:, self.pos : self.pos + 1] if last else x) + attn
            if sphere:
                x = self.norm(x, "")
            m_in = x if sphere else self.norm(x, pre + "ln2")
            hid = m_in @ self.P(pre + "mlp.W_in")
            if c.mlp_bias:
                hid = hid + self.P(pre + "mlp.b_in")
            out = (F.relu(hid) if c.act_fn == "relu" else F.gelu(hid)) @ self.P(pre + "mlp.W_out")
            if c.mlp_bias:
                out = out + self.P(pre + "mlp.b_out")
            x = x + out
            if sphere:
                x = self.norm(x, "")
        if not sphere:
            x = self.norm(x, "ln_final")
        x = x[:, 0] if self.readout_only else x[:, self.pos]
        w_u = self.P("unembed.W_U")
        if c.unembed == "bounded":
            return c.tau * (x @ F.normalize(w_u, dim=0))
        return x @ w_u


class SDPATransformer(nn.Module):
    """The same model as a competent user writes it: fused QKV, F.scaled_dot_product_attention,
    norm none | ln | rms (pre-norm) | sphere, the full forward pass at every position."""

    def __init__(self, cfg: RunConfig, src: nn.Module, readout_pos: int):
        super().__init__()
        self.cfg, self.pos = cfg, readout_pos
        sd = {k: v.detach().clone() for k, v in src.state_dict().items()}
        P = lambda t: nn.Parameter(t.contiguous())  # noqa: E731
        self.W_E, self.W_pos, self.W_U = P(sd["embed.W_E"]), P(sd["pos_embed.W_pos"]), P(sd["unembed.W_U"])
        self.layers = nn.ModuleList()
        for layer in range(cfg.n_layers):
            a = f"blocks.{layer}."
            m = nn.Module()
            qkv = torch.cat([sd[a + "attn.W_Q"], sd[a + "attn.W_K"], sd[a + "attn.W_V"]])  # [3h, d, e]
            m.qkv = P(qkv.permute(1, 0, 2).reshape(cfg.d_model, -1))  # [d, 3 h e]
            m.out = P(sd[a + "attn.W_O"].reshape(-1, cfg.d_model))  # [h e, d]
            m.w_in, m.w_out = P(sd[a + "mlp.W_in"]), P(sd[a + "mlp.W_out"])
            m.b_in = P(sd[a + "mlp.b_in"]) if cfg.mlp_bias else None
            m.b_out = P(sd[a + "mlp.b_out"]) if cfg.mlp_bias else None
            for ln in ("ln1", "ln2"):
                setattr(m, ln, nn.ParameterDict({k: P(sd[f"{a}{ln}.{k}"]) for k in "wb" if f"{a}{ln}.{k}" in sd}))
            self.layers.append(m)
        self.ln_final = nn.ParameterDict({k: P(sd[f"ln_final.{k}"]) for k in "wb" if f"ln_final.{k}" in sd})

    def norm(self, x, ln):
        c = self.cfg
        if c.norm == "ln":
            return F.layer_norm(x, x.shape[-1:], ln["w"], ln["b"], eps=1e-5)
        if c.norm == "rms":
            return F.rms_norm(x, x.shape[-1:], ln["w"], eps=1e-5)
        return x

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # -> logits [b, v] at the readout position
        c = self.cfg
        sphere = lambda x: c.radius * F.normalize(x, dim=-1) if c.norm == "sphere" else x  # noqa: E731
        b, n = tokens.shape
        x = sphere(self.W_E[tokens] + self.W_pos[:n])
        for m in self.layers:
            q, k, v = (self.norm(x, m.ln1) @ m.qkv).view(b, n, 3, c.n_heads, c.d_head).permute(2, 0, 3, 1, 4)
            z = F.scaled_dot_product_attention(q, k, v, is_causal=c.causal)
            x = sphere(x + z.transpose(1, 2).reshape(b, n, -1) @ m.out)
            hid = self.norm(x, m.ln2) @ m.w_in
            hid = F.relu(hid + m.b_in if m.b_in is not None else hid)
            out = hid @ m.w_out
            x = sphere(x + (out + m.b_out if m.b_out is not None else out))
        w_u = c.tau * F.normalize(self.W_U, dim=0) if c.unembed == "bounded" else self.W_U
        return (self.norm(x, self.ln_final) @ w_u)[:, self.pos]


class PlainLoop:
    def __init__(self, cfg: RunConfig, trainer: SingleRun, readout_only: bool, sdpa: bool = False):
        self.cfg, self.sdpa = cfg, sdpa
        if sdpa:
            self.model = SDPATransformer(cfg, trainer.model, trainer.data.readout_pos)
        else:
            self.model = PlainTransformer(cfg, trainer.model, readout_only, trainer.data.readout_pos)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas),
                                     weight_decay=cfg.weight_decay)
        self.x, self.y = trainer.train_x, trainer.train_y

    def loss(self) -> torch.Tensor:
        logits = self.model(self.x)
        return F.cross_entropy(logits if self.sdpa else logits.double(), self.y)  # the user's float32 loss

    def step(self, step: int) -> float:
        for g in self.opt.param_groups:
            g["lr"] = self.cfg.lr * warmup_factor(self.cfg, step)
        loss = self.loss()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return float(loss.detach())


def check_same_loss(cfg: RunConfig) -> dict:
    """The plain loops compute groklens' loss and gradients (float tolerance)."""
    tr = groklens_trainer(cfg)
    out = {}
    ref = tr.task_loss(tr.readout(tr.forward(tr.train_x)), tr.train_y)
    ref.backward()
    ref_g = {n.replace(".", "_"): p.grad for n, p in tr.model.named_parameters()}
    for name, ro in (("plain", False), ("plain.readout", True)):
        pl = PlainLoop(cfg, tr, ro)
        loss = pl.loss()
        loss.backward()
        gdiff = max(float((p.grad - ref_g[n]).abs().max()) for n, p in pl.model.params.items() if p.grad is not None)
        out[name] = {"loss_diff": abs(loss.item() - ref.item()), "max_grad_diff": gdiff}
    out["plain.sdpa"] = {"loss_diff": abs(PlainLoop(cfg, tr, False, sdpa=True).loss().item() - ref.item())}
    return out


def time_block(fn, start: int, n: int) -> float:
    t = time.perf_counter()
    for s in range(start, start + n):
        fn(s)
    return n / (time.perf_counter() - t)


def train_end_to_end(cfg: RunConfig, steps: int) -> tuple[float, dict[str, float]]:
    """steps/s of training.train over `steps` steps (evaluation and checkpoint every min(config's,
    steps) steps: at steps 0 and `steps`), and where its wall time went (seconds)."""
    from groklens.checkpoints import TrajectoryWriter

    c = cfg.replace(steps=steps, eval_every=min(cfg.eval_every, steps),
                    checkpoint_every=min(cfg.checkpoint_every, steps))
    with tempfile.TemporaryDirectory() as d, Timed(SingleRun, "train_step") as ts, \
            Timed(SingleRun, "evaluate") as ev, Timed(TrajectoryWriter, "write_checkpoint") as ck:
        t = time.perf_counter()
        training.train(c, Path(d) / "run.h5", progress=False)
        wall = time.perf_counter() - t
    parts = {"train_step": ts.total, "evaluate": ev.total, "write_checkpoint": ck.total}
    parts["other (file creation, setup)"] = wall - sum(parts.values())
    return steps / wall, parts


def bench(name: str, cfg: RunConfig, block: int, repeats: int, e2e_steps: int) -> dict:
    tr = groklens_trainer(cfg)
    plain = PlainLoop(cfg, tr, readout_only=False)
    ro = PlainLoop(cfg, tr, readout_only=True)
    sdpa = PlainLoop(cfg, tr, readout_only=False, sdpa=True)
    explicit = groklens_trainer(cfg)
    explicit.model.hooks_attached = lambda: True  # as if a hook were attached: the explicit path
    runners = {"groklens.step": tr.train_step, "groklens.step.explicit": explicit.train_step,
               "plain.sdpa": sdpa.step, "plain": plain.step, "plain.readout": ro.step}
    for fn in runners.values():  # warm-up (allocator, first AdamW step)
        time_block(fn, 0, 3)
    rates: dict[str, list[float]] = {k: [] for k in runners}
    step = 3
    for _ in range(repeats):
        for k, fn in runners.items():
            rates[k].append(time_block(fn, step, block))
        step += block
    e2e = max((train_end_to_end(cfg, e2e_steps) for _ in range(2)), key=lambda r: r[0])
    med = {k: statistics.median(v) for k, v in rates.items()}
    med["groklens.train"] = e2e[0]  # the better of two short runs (includes file creation)
    return {
        "config": name, "n_train": len(tr.train_y), "block": block, "repeats": repeats,
        "steps_per_s": med, "all_blocks": rates,
        # step-time ratios (time = 1 / rate): the reference of issue 18 and the old one
        "time_groklens_step_over_plain_sdpa": med["plain.sdpa"] / med["groklens.step"],
        "time_groklens_step_over_plain": med["plain"] / med["groklens.step"],
        "time_explicit_step_over_plain_sdpa": med["plain.sdpa"] / med["groklens.step.explicit"],
        "time_explicit_step_over_plain": med["plain"] / med["groklens.step.explicit"],
        "ratio_groklens_step_to_plain": med["groklens.step"] / med["plain"],
        "ratio_groklens_train_to_plain": med["groklens.train"] / med["plain"],
        "ratio_plain_readout_to_plain": med["plain.readout"] / med["plain"],
        "e2e_seconds": e2e[1],
        "equivalence": check_same_loss(cfg),
    }


def profile(cfg: RunConfig, steps: int = 20, top: int = 18) -> str:
    tr = groklens_trainer(cfg)
    for s in range(3):
        tr.train_step(s)
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    with tprofile(activities=[ProfilerActivity.CPU]) as prof:
        for s in range(3, 3 + steps):
            tr.train_step(s)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block", type=int, default=20, help="steps per timed block")
    ap.add_argument("--repeats", type=int, default=5, help="alternating blocks per loop")
    ap.add_argument("--e2e-steps", type=int, default=200, help="steps of each end-to-end training.train run")
    ap.add_argument("--configs", nargs="+", default=["canonical", "sphere"], choices=["canonical", "sphere"])
    ap.add_argument("--profile", action="store_true", help="also print torch.profiler tables")
    ap.add_argument("--json", type=Path, default=None, help="write the results here too")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    configs = {"canonical": RunConfig(device="cpu"), "sphere": preset("sphere").replace(device="cpu")}
    results = []
    for name in args.configs:
        r = bench(name, configs[name], args.block, args.repeats, args.e2e_steps)
        results.append(r)
        sp = r["steps_per_s"]
        print(f"{name}: n_train={r['n_train']}  " + "  ".join(f"{k} {v:.2f} steps/s" for k, v in sp.items()))
        print(f"  step time, groklens.step / plain.sdpa = {r['time_groklens_step_over_plain_sdpa']:.3f} (reference);  "
              f"groklens.step / plain = {r['time_groklens_step_over_plain']:.3f} (old reference)")
        print(f"  explicit path (before the fast path): / plain.sdpa = {r['time_explicit_step_over_plain_sdpa']:.3f};  "
              f"/ plain = {r['time_explicit_step_over_plain']:.3f}")
        print(f"  rates: groklens.step / plain = {r['ratio_groklens_step_to_plain']:.3f};  groklens.train / plain = "
              f"{r['ratio_groklens_train_to_plain']:.3f};  plain.readout / plain = "
              f"{r['ratio_plain_readout_to_plain']:.3f}")
        print(f"  training.train over {args.e2e_steps} steps, seconds: "
              + ", ".join(f"{k} {v:.2f}" for k, v in r["e2e_seconds"].items()))
        print(f"  same loss and gradients: {json.dumps(r['equivalence'])}")
        if args.profile:
            print(profile(configs[name]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

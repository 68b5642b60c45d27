"""Golden trajectories of every kind of training, hashed dataset by dataset: the proof that a
refactor of the trainers changed no number on this machine.

Run by hand, before and after a change, on the same machine (torch's float results depend on
the CPU) and with the same thread count (one; this script sets it):
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/trajectory_hashes.py --save before.json
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/trajectory_hashes.py --compare before.json

Each case trains tiny real runs into a temporary directory (the global RNGs seeded before
every case, as tests/conftest.py does, so a case's bytes do not depend on the cases before
it) and hashes every dataset of every file it wrote: name, shape, dtype and bytes (attributes
are left out: they hold the version and a creation time; so is the CPU time the run took, which
differs between two runs of one config). The cases cover what a trainer refactor can touch:
single, ensemble and routed runs; every regularizer and transform
(act_norm, geomdr with its window, kl_attn, grokfast, perp_grad both scales); mini-batches;
losses ce and stablemax; the multi-target task; the MLP; uniform attention (parameters without
a gradient); members that stop, members with their own inputs (seq tasks); a run interrupted
and resumed, single and ensemble; and two ensembles that could not train before issue 30 (a
multi-target task, per-member stop fields), which a comparison with an older recording lists as
new. With --compare, every dataset that differs is named.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import torch

TINY = dict(p=11, train_frac=0.5, d_model=16, n_heads=2, d_head=8, d_mlp=32, lr=3e-3,
            steps=60, eval_every=10, checkpoint_every=20, device="cpu")
BASE = dict(steps=60, eval_every=10, checkpoint_every=20)
PHASED = dict(p=11, lr=1e-2, steps=300, eval_every=10, checkpoint_every=100, grok_threshold=0.3, train_frac=0.6,
              weight_decay=3.0)
SEQ = dict(task="seq_add", p=5, seq_len=4, n_informative=2, distractor_vocab=3, informative_layout="random",
           train_frac=0.6)
MIXED = dict(n_layers=2, batch_size=16, geomdr_target=4.0)
DIGITS = dict(task="digits_add", n_digits=1, train_frac=0.6)


def cfg(**overrides):
    from groklens.config import RunConfig

    return RunConfig.from_dict({**TINY, **overrides})


def single(**kw):
    return ("single", [cfg(**kw)])


def ensemble(*members):
    return ("ensemble", [cfg(**m) for m in members])


def interrupted(kind, *members):
    return (f"{kind}-resumed", [cfg(**m) for m in members])


CASES = {
    # the configurations of tests/trainers/test_golden.py
    "golden.single": single(**BASE, batch_size=16, seed=3),
    "golden.ensemble": ensemble(dict(**BASE, seed=1, lr=3e-3, weight_decay=1.0),
                                dict(**BASE, seed=2, lr=1e-3, weight_decay=0.3, data_seed=7)),
    "golden.routed": single(**BASE, routing_copies=3, routing_width=1.0, batch_size=16),
    "golden.regularized": single(**BASE, act_norm_lambda=0.05, grokfast_lambda=2.0, geomdr_lambda=0.1,
                                 geomdr_target=4.0, n_layers=2),
    "golden.phased": single(**PHASED),
    # every transform and term alone, and mini-batch variants
    "perp.orthograd": single(perp_grad=True, batch_size=16),
    "perp.unscaled+grokfast": single(perp_grad=True, perp_grad_scale="unscaled", grokfast_lambda=1.0,
                                     grokfast_alpha=0.9),
    "geomdr.window": single(geomdr_lambda=0.2, geomdr_target=3.0, geomdr_start=10, geomdr_end=40, n_layers=2),
    "act_norm.sites": single(act_norm_lambda=0.1, act_norm_sites="blocks.0.hook_resid_mid,blocks.0.hook_resid_post",
                             norm="ln"),
    "kl_attn.add": single(kl_attn_beta=0.5, batch_size=20),
    "kl_attn.seq": single(**SEQ, kl_attn_beta=0.3, kl_attn_layer=-1, n_layers=2),
    "stablemax": single(loss="stablemax", weight_decay=0.0),
    "digits.single": single(**DIGITS),
    "digits.regularized": single(**DIGITS, act_norm_lambda=0.05, grokfast_lambda=1.0, loss="stablemax"),
    "mlp.single": single(model="mlp", n_layers=2, mlp_bias=True, act_norm_lambda=0.05),
    "mlp.onehot": single(model="mlp", mlp_embed="onehot", batch_size=8, perp_grad=True),
    "uniform.sphere": single(attention="uniform", norm="sphere", unembed="bounded", causal=False),
    "rms.post": single(norm="rms", norm_placement="post", n_layers=2, log_checkpoints=3),
    # ensembles: per-member strengths, mixed plain and regularized members, own inputs, stops
    "ensemble.mixed": ensemble(
        dict(MIXED, seed=1),
        dict(MIXED, seed=2, act_norm_lambda=0.05, grokfast_lambda=2.0, lr=1e-3),
        dict(MIXED, seed=3, geomdr_lambda=0.1, perp_grad=True, weight_decay=0.1),
        dict(MIXED, seed=4, kl_attn_beta=0.2, grokfast_lambda=1.0, grokfast_alpha=0.9, perp_grad=True, data_seed=5)),
    "ensemble.stablemax": ensemble(dict(seed=1, loss="stablemax"), dict(seed=2, loss="stablemax", lr=1e-2)),
    "ensemble.mlp": ensemble(dict(model="mlp", n_layers=2, seed=1),
                             dict(model="mlp", n_layers=2, seed=2, weight_decay=0.0, perp_grad=True)),
    "ensemble.seq": ensemble(dict(**SEQ, seed=1, data_seed=1, kl_attn_beta=0.3),
                             dict(**SEQ, seed=2, data_seed=2), dict(**SEQ, seed=3, data_seed=3, act_norm_lambda=0.1)),
    "ensemble.uniform": ensemble(dict(attention="uniform", seed=1), dict(attention="uniform", seed=2, lr=1e-2)),
    "ensemble.stops": ensemble(dict(**PHASED, seed=1, stop_after_grok=2), dict(**PHASED, seed=2, stop_after_grok=2),
                               dict(PHASED, seed=3, stop_after_grok=5, grok_threshold=0.5)),
    "ensemble.grokfast-all": ensemble(dict(seed=1, grokfast_lambda=2.0), dict(seed=2, grokfast_lambda=2.0)),
    # routed runs with regularizers and transforms, and the identity kernel
    "routed.regularized": single(routing_copies=2, routing_width=2.0, routing_unit="sublayer", act_norm_lambda=0.05,
                                 grokfast_lambda=1.0, perp_grad=True, batch_size=16, n_layers=2),
    "routed.identity": single(routing_copies=2),
    # interrupted at the step-20 checkpoint, then resumed
    "resume.single": interrupted("single", dict(grokfast_lambda=1.0, batch_size=16)),
    "resume.ensemble": interrupted("ensemble", dict(seed=1, grokfast_lambda=1.0),
                                   dict(seed=2, act_norm_lambda=0.05)),
    "resume.routed": interrupted("single", dict(routing_copies=2, routing_width=1.0, grokfast_lambda=1.0)),
    # what ensembles could not train before issue 30: a multi-target task, per-member stop fields
    "ensemble.digits": ensemble(dict(DIGITS, seed=1, batch_size=16),
                                dict(DIGITS, seed=2, batch_size=16, act_norm_lambda=0.05, grokfast_lambda=1.0)),
    "ensemble.stop-loss": ensemble(dict(PHASED, seed=1, stop_after_grok=1, stop_test_loss=1.5),
                                   dict(PHASED, seed=2, stop_after_grok=2, stop_min_steps=150)),
}


# what the machine measured, not what the run computed: differs between two runs of one config
MEASURED = ("cpu_seconds",)


def dataset_hashes(path: Path) -> dict[str, str]:
    """sha256 of (name, shape, dtype, bytes) of every dataset but the MEASURED ones, by name."""
    out = {}
    with h5py.File(path, "r", locking=False) as f:
        names: list[str] = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        for name in sorted(n for n in names if n not in MEASURED):
            arr = np.ascontiguousarray(f[name][()])
            h = hashlib.sha256(f"{name}|{arr.shape}|{arr.dtype.str}|".encode())
            h.update(arr.tobytes())
            out[name] = h.hexdigest()
    return out


class _Stop(KeyboardInterrupt):
    pass


def _interrupt_at(step: int):
    def on_commit(s):
        if s == step:
            raise _Stop
    return on_commit


def run_case(kind: str, cfgs, tmp: Path) -> list[Path]:
    from groklens.trainers.ensemble import resume_ensemble, train_ensemble
    from groklens.trainers.train import resume, train

    if kind == "single":
        train(cfgs[0], tmp / "run.h5", progress=False)
        return [tmp / "run.h5"]
    paths = [tmp / f"member{i}.h5" for i in range(len(cfgs))]
    if kind == "ensemble":
        train_ensemble(cfgs, paths)  # a member's failure is in its file's status
        return paths
    if kind == "single-resumed":
        try:
            train(cfgs[0], paths[0], progress=False, on_commit=_interrupt_at(20))
        except _Stop:
            pass
        resume(paths[0], progress=False)
        return paths[:1]
    if kind == "ensemble-resumed":
        try:
            train_ensemble(cfgs, paths, on_commit=_interrupt_at(20))
        except _Stop:
            pass
        resume_ensemble(paths)
        return paths
    raise ValueError(kind)


def seed_all() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


def record(names: list[str]) -> dict[str, dict[str, dict[str, str]]]:
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for name in names:
            kind, cfgs = CASES[name]
            tmp = Path(d) / name
            tmp.mkdir()
            seed_all()
            paths = run_case(kind, cfgs, tmp)
            out[name] = {p.name: dataset_hashes(p) for p in paths}
    return out


def file_digest(datasets: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(datasets, sort_keys=True).encode()).hexdigest()[:16]


def compare(before: dict, after: dict) -> int:
    """Prints one line per case; returns the number of cases that differ."""
    bad = 0
    for case in after:
        if case not in before:
            print(f"  {case:<26} new (no before)")
            continue
        diffs = []
        if set(before[case]) != set(after[case]):
            diffs.append(f"files {sorted(before[case])} -> {sorted(after[case])}")
        for fname in sorted(set(before[case]) & set(after[case])):
            b, a = before[case][fname], after[case][fname]
            diffs += [f"{fname}:{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        if diffs:
            bad += 1
            print(f"  {case:<26} DIFFERS: {', '.join(diffs[:12])}{' ...' if len(diffs) > 12 else ''}")
        else:
            digests = " ".join(f"{f}={file_digest(h)}" for f, h in sorted(after[case].items()))
            print(f"  {case:<26} identical  {digests}")
    missing = sorted(set(before) - set(after))
    if missing:
        print(f"  not run now: {', '.join(missing)}")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save", type=Path, help="write the hashes here (JSON)")
    ap.add_argument("--compare", type=Path, help="compare with hashes saved earlier; exit 1 on a difference")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    args = ap.parse_args()
    torch.set_num_threads(1)
    t = time.perf_counter()
    hashes = record(args.cases)
    print(f"{len(hashes)} cases, {sum(len(v) for v in hashes.values())} files, "
          f"{sum(len(f) for v in hashes.values() for f in v.values())} datasets in {time.perf_counter() - t:.0f} s "
          f"(torch {torch.__version__}, {torch.get_num_threads()} thread)")
    if args.save:
        args.save.write_text(json.dumps(hashes, indent=1, sort_keys=True))
    if args.compare:
        before = json.loads(args.compare.read_text())
        bad = compare(before, hashes)
        print("all identical" if not bad else f"{bad} case(s) differ")
        return 1 if bad else 0
    for case, files in hashes.items():
        print(f"  {case:<26} " + " ".join(f"{f}={file_digest(h)}" for f, h in sorted(files.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# One prepared command for the day a GPU is lent for a short, fixed budget:
#   1. checks CUDA training and resume on the canonical model (Nanda's p=113 transformer): a run
#      interrupted with Ctrl-C (SIGINT) after a checkpoint and resumed must end like the same run
#      trained in one go;
#   2. runs as many paper-scale experiments as fit the budget, in priority order, one seed at a
#      time (`groklens reproduce NAME --scale paper --seeds k` trains only seed k: the ledger has
#      the others), so every finished run is in the ledger even when the budget ends mid-way;
#   3. with what is left, the scaling law's paper grid (benchmarks/scaling_law_gpu.yaml) as a
#      sweep of ensembles, resumed on each lease, and its fit.
# The ledger (default docs/results, the committed one) is copied to $OUT/ledger at the end when
# $OUT is set (the device machine's result folder), with the log.
#
# Usage: benchmarks/gpu_paper_scale.sh [--dry-run] [--budget-min M] [--seeds S] [--work DIR]
#                                      [--ledger DIR] [--workers W] [--python PY]
#   --dry-run  on CPU: the same check with a tiny model (train, interrupt, resume, compare), then
#              print the reproduce commands the GPU run would start, checked against
#              `groklens reproduce --list`; trains no paper-scale run.
set -euo pipefail

BUDGET_MIN=12          # wall minutes for the whole script (a 15-minute lease, less start-up)
SEEDS=10
WORK=gpu-paper-scale
LEDGER=docs/results
WORKERS=4              # training processes sharing the GPU (small models: one alone leaves it idle)
DRY=0
PY=${PYTHON:-python}
# priority order: what the CPU cannot decide first. A seed the ledger holds is not trained again,
# so bounded-sphere trains only its lr 1e-4 LayerNorm and RMSNorm arms (the lr 1e-4 headline) until
# seed 6; then the paper scales too long for the 2-core CPU (S5 97 CPU-h, activation-norm 72,
# GeomDR 373, nanoGPT's ~10M parameters, routing's modular arms 141); then those the CPU trains in
# the background (stablemax, grokfast, structural-attention, the scaling-law CPU grid); last the
# experiments already decided at paper scale (fourier-fve reads bounded-sphere's runs: no training)
EXPERIMENTS=(bounded-sphere s5-control activation-norm geomdr nanogpt-addition routing stablemax grokfast
             structural-attention scaling-law fourier-fve uniform-attention progress-measures llc-grokking clock-pizza)

while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --budget-min) BUDGET_MIN="$2"; shift ;;
    --seeds) SEEDS="$2"; shift ;;
    --work) WORK="$2"; shift ;;
    --ledger) LEDGER="$2"; shift ;;
    --workers) WORKERS="$2"; shift ;;
    --python) PY="$2"; shift ;;
    *) echo "gpu_paper_scale.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
GL=("$PY" -m groklens)
START=$(date +%s)
DEADLINE=$((START + BUDGET_MIN * 60))
mkdir -p "$WORK"
LOG="$WORK/gpu_paper_scale.log"
say() { echo "[$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }

# ---------------------------------------------------------------- 1. training and resume
if [ "$DRY" = 1 ]; then
  # long enough (seconds) that the interrupt below lands mid-run on a loaded machine
  DEV=cpu; CHECK=(--p 13 --d-model 16 --n-heads 2 --d-head 8 --d-mlp 32 --steps 2000 --eval-every 20
                  --checkpoint-every 20)
else
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
    || { say "no CUDA device: run with --dry-run on a CPU"; exit 1; }
  DEV=cuda; CHECK=(--steps 3000 --eval-every 100 --checkpoint-every 100)
fi
say "check: canonical model on $DEV, trained in one go and interrupted + resumed"
rm -f "$WORK/check_fresh.h5" "$WORK/check_resumed.h5"
"${GL[@]}" train "${CHECK[@]}" --device "$DEV" --seed 1 -o "$WORK/check_fresh.h5" -q >>"$LOG" 2>&1
# a background job of a script starts with SIGINT ignored: give Python its Ctrl-C handler back
"$PY" -c 'import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); sys.argv[0] = "groklens"
from groklens.cli import main; main()' train "${CHECK[@]}" --device "$DEV" --seed 1 -o "$WORK/check_resumed.h5" -q \
  >>"$LOG" 2>&1 &
PID=$!
# interrupt after the second checkpoint is committed (one watcher process, polling every 50 ms)
"$PY" - "$WORK/check_resumed.h5" "$PID" <<'EOF' 2>/dev/null || true
import os, signal, sys, time
from groklens.checkpoints import Trajectory
path, pid = sys.argv[1], int(sys.argv[2])
give_up = time.time() + 900


def ended(pid):  # gone, or a zombie waiting for the script's `wait`
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


while time.time() < give_up and not ended(pid):
    try:
        if len(Trajectory(path).steps) >= 2:
            os.kill(pid, signal.SIGINT)
            break
    except Exception:  # not created yet, or being created
        pass
    time.sleep(0.05)
EOF
wait "$PID" || true
STATUS=$("$PY" -c "import sys; from groklens.checkpoints import Trajectory; print(Trajectory(sys.argv[1]).status)" \
  "$WORK/check_resumed.h5")
case "$STATUS" in
  completed*) say "check: the run finished before the interrupt reached it (resume not exercised)"; exit 1 ;;
esac
say "check: interrupted ($STATUS); resuming"
"${GL[@]}" train --resume "$WORK/check_resumed.h5" -q >>"$LOG" 2>&1
"$PY" - "$WORK/check_fresh.h5" "$WORK/check_resumed.h5" <<'EOF' | tee -a "$LOG"
import sys
import numpy as np
from groklens.checkpoints import Trajectory
a, b = Trajectory(sys.argv[1]), Trajectory(sys.argv[2])
assert a.status.startswith("completed") and b.status.startswith("completed"), (a.status, b.status)
sa, sb = [int(s) for s in a.steps], [int(s) for s in b.steps]
assert sa == sb, (sa, sb)
last = sa[-1]
pa, pb = a.params(last), b.params(last)
diff = max(float(np.max(np.abs(pa[k].numpy() - pb[k].numpy()))) for k in pa)
scale = max(float(np.max(np.abs(pa[k].numpy()))) for k in pa)
ok = diff <= 1e-4 * scale
print(f"resume: {'ok' if ok else 'MISMATCH'} (checkpoints {len(sa)}, last step {last}, max |param diff| {diff:.3g}, "
      f"max |param| {scale:.3g}, test acc {float(a.metrics['test_acc'][-1]):.3f} / {float(b.metrics['test_acc'][-1]):.3f})")
sys.exit(0 if ok else 1)
EOF

# ---------------------------------------------------------------- 2. paper-scale experiments
# names only: --no-measure times nothing (a cold cache would time 267 configs, minutes on a CPU)
KNOWN=$("${GL[@]}" reproduce --list --json --no-measure | "$PY" -c "import json, sys; print(' '.join(i['name'] for i in json.load(sys.stdin)))")
for name in "${EXPERIMENTS[@]}"; do
  case " $KNOWN " in *" $name "*) ;; *) say "unknown experiment $name"; exit 2 ;; esac
done
# fourier-fve reads the bounded-sphere runs: same output directory
outdir() { case "$1" in fourier-fve) echo "$WORK/bounded-sphere" ;; *) echo "$WORK/$1" ;; esac; }
for name in "${EXPERIMENTS[@]}"; do
  for k in $(seq 1 "$SEEDS"); do
    cmd=("${GL[@]}" reproduce "$name" --scale paper --seeds "$k" -o "$(outdir "$name")" --ledger "$LEDGER"
         --workers "$WORKERS" -q)
    if [ "$DRY" = 1 ]; then
      say "would run: ${cmd[*]}"
      continue
    fi
    left=$((DEADLINE - $(date +%s)))
    if [ "$left" -lt 60 ]; then
      say "budget spent: stopping before $name seed $k"
      break 2
    fi
    say "run (${left}s left): ${cmd[*]}"
    # SIGINT at the deadline: the trainer commits and stops; finished seeds are already in the ledger
    timeout -s INT "$left" "${cmd[@]}" >>"$LOG" 2>&1 || { say "$name seed $k stopped (exit $?)"; break 2; }
  done
done

# ---------------------------------------------------------------- 3. the scaling law's paper grid
# 384 MLP configurations at p=97, up to 100k steps (a GPU config: the CPU paper scale above is a
# smaller grid of the same shape); a sweep resumes where the last lease stopped it
GRID="$(dirname "$0")/scaling_law_gpu.yaml"
SWEEP=("${GL[@]}" sweep "$GRID" -o "$WORK/scaling-law-gpu" --ensemble --workers "$WORKERS" -q)
FIT=("${GL[@]}" scaling-law "$WORK/scaling-law-gpu" --censored --interactions)
if [ "$DRY" = 1 ]; then
  "${GL[@]}" sweep "$GRID" -o "$WORK/scaling-law-gpu" --dry-run >/dev/null  # the grid builds
  say "would sweep: ${SWEEP[*]}"
  say "would fit: ${FIT[*]}"
else
  left=$((DEADLINE - $(date +%s)))
  if [ "$left" -ge 60 ]; then
    say "sweep (${left}s left): ${SWEEP[*]}"
    timeout -s INT "$left" "${SWEEP[@]}" >>"$LOG" 2>&1 || say "scaling-law grid stopped (exit $?); rerun to resume"
    "${FIT[@]}" >>"$LOG" 2>&1 || say "no scaling-law fit yet (too few finished runs)"
  else
    say "budget spent: the scaling-law grid not started"
  fi
fi
if [ -n "${OUT:-}" ] && [ -d "$LEDGER" ]; then
  mkdir -p "$OUT/ledger" && cp "$LEDGER"/*.json "$OUT/ledger/" 2>/dev/null || true
  cp "$LOG" "$OUT/"
  cp "$WORK"/scaling-law-gpu/scaling-law.* "$OUT/" 2>/dev/null || true
fi
say "done: ledger in $LEDGER; log $LOG"

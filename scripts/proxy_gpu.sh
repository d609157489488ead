#!/usr/bin/env bash
# The proxy grid of results/proxy at the paper's smallest size, on one GPU: 16M, bf16 autocast,
# torch.compile, 5 heads × 5 learning rates untied + baseline and μ-centering tied (35 runs),
# eight runs at a time on the one GPU (a 16M model leaves most of an H100/H200 idle), 600 steps
# of 16 × 512 tokens each. Sized to finish in about 10 minutes on one H200; NOT measured yet
# (no GPU was lent when it was written): the first user with one, please commit the result
# next to the CPU one. Needs data/shakespeare (scripts/proxy.sh makes it) or set DATA to
# FineWeb shards (python prepare.py fineweb --shards 1).
#   bash scripts/proxy_gpu.sh            # -> runs/proxy_16M, results/proxy_16M
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-data/shakespeare}
RUNS=${RUNS:-runs/proxy_16M}
OUT=${OUT_DIR:-results/proxy_16M}
python sweep.py run --grid proxy --sizes 16M --dtypes bfloat16 --gpus 0,0,0,0,0,0,0,0 \
    --out "$RUNS" --device cuda --compile --steps 600 --warmup 30 --batch_size 16 \
    --micro_batch 16 --seq_len 512 --loss_chunk 0 --eval_every 200 --eval_tokens 262144 \
    --stat_tokens 65536 --log_every 20 --data "$DATA"
mkdir -p "$OUT"
python sweep.py collect "$RUNS" --out "$OUT/results.csv"
python sweep.py table "$OUT/results.csv" --out "$OUT"
python sweep.py plot "$OUT/results.csv"

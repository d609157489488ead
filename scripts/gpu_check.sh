#!/usr/bin/env bash
# The one GPU check: every question this project has for a GPU, in at most 8 minutes on one
# H200 (16 cores), compile included, offline, with at most 8 small files under $OUT.
#
#   bash scripts/gpu_check.sh prepare     # once, on a CPU machine that reaches PyPI: the data
#   bash scripts/gpu_check.sh             # on the GPU machine: files under $OUT, table at the end
#   DEVICE=cpu bash scripts/gpu_check.sh  # the CPU rehearsal: tiny sizes, a few steps, < 2 min
#
# Data: data/shakespeare (3.0 MiB, ignored by git, the text of experiments/proxy and
# experiments/alignment, so the GPU runs read like the CPU ones), made by `prepare`
# (scripts/shakespeare.sh, with the GPT-2 vocabulary seeded from tests/assets/gpt2). Copy it
# with the checkout (device tools: carry data/shakespeare; a symlink must be carried as the
# folder it points to). DATA overrides it. Nothing below downloads or installs anything.
#
# Phases, in order of value; each has a cap, and a phase that would start with less than
# MIN_PHASE_S left is skipped, so the whole never exceeds BUDGET_S (480 s):
#   a. train.py's real step (bench.py), baseline, 16M and 221M, 16 × 2048, bf16, compiled:
#      tok/s, MFU, peak memory, compile time                               -> a_step.json
#   b. per-head overhead at 16M: the five heads and the float32 LM head, plain path (= the
#      default on CUDA, so no duplicate rows)                              -> b_heads.json
#   c. the LM head alone, bf16 autocast, eager, 32768 tokens, D = 224 and 832: our paths next to
#      F.ce(F.linear), F.linear_cross_entropy (fed bf16 as autocast feeds F.linear), Liger
#      Kernel and Cut Cross-Entropy where importable; errors against float64 -> c_head_alone.json
#   d. the long pairs, all six at once on the one GPU: 16M, T = 2048, bf16, compiled; baseline,
#      μ-centering and the float32 LM head at η = 0.1 and 0.3; batches of 16 × 2048 tokens (the
#      paper's: 64 × 2048; a quarter, for 4× the steps); as many steps as the time left allows
#      (from phase a's tok/s); ‖μ‖, l̄, h̄·μ̂, cos(h̄, μ) and prec_* logged ~10 times per run
#                                                                          -> d_long.jsonl
#   and phases.jsonl (what ran: the machine, each phase's seconds and exit code; 124 = cut by
#   its cap), gpu_check.log (every phase's output), table.txt (the table printed at the end).
# Every file is written as the phase goes: bench.py rewrites its JSON after every variant,
# train.py appends its log per log step (merged into d_long.jsonl at the end, also when cut).
#
# How the 8 minutes were estimated (NOT measured: no GPU had run this code when it was written).
# Compute is small: a 16M step of 16 × 2048 tokens is ~6.6 TFLOP (model.flops_per_token), ~20 ms
# at a third of the H200's 989 TFLOP/s; a 221M step ~65 TFLOP, ~130 ms at half of it. What
# costs is compiling: on this project's 2-core CPU inductor took 100 s cold for 16M; on CUDA
# with 16 workers we assumed ~40 s for 16M, ~80 s for 221M (21 layers, each traced), ~20 s per
# further 16M head (Triton kernels shared through the inductor cache), plus ~10 s per process
# start. Caps: a 150 s, b 120 s, c 45 s, then d gets what is left (≥ 150 s) less RESERVE_S for
# the table. If compiling is slower, caps cut the phases and their files say how far they got.
# BUDGET_S, CAP_A, CAP_B, CAP_C, D_STEPS, OUT, DATA, SCRATCH and PYTHON may be set from outside.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
GPT2_URL=https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/

seed_tiktoken_cache() {  # tiktoken's cache of the GPT-2 vocabulary, from tests/assets/gpt2
    export TIKTOKEN_CACHE_DIR=${TIKTOKEN_CACHE_DIR:-$PWD/.pytest_cache/tiktoken}
    mkdir -p "$TIKTOKEN_CACHE_DIR"
    for name in vocab.bpe encoder.json; do
        key=$(printf %s "$GPT2_URL$name" | sha1sum | cut -d' ' -f1)
        [ -f "$TIKTOKEN_CACHE_DIR/$key" ] || cp "tests/assets/gpt2/$name" "$TIKTOKEN_CACHE_DIR/$key"
    done
}
seed_tiktoken_cache
if [ "${1:-}" = prepare ]; then
    [ -d data/shakespeare ] || bash scripts/shakespeare.sh
    exit
fi

DEVICE=${DEVICE:-cuda}
DATA=${DATA:-data/shakespeare}
OUT=${OUT:-out/gpu_check}
SCRATCH=${SCRATCH:-$(mktemp -d)}  # phase d's run folders (checkpoints: never under $OUT)
RUNS=("baseline auto" "mu_center auto" "baseline float32")  # phase d: head, --head_dtype
if [ "$DEVICE" = cpu ]; then  # the rehearsal: the same phases and files; tiny, short, eager
    BUDGET_S=${BUDGET_S:-110} RESERVE_S=5 MIN_PHASE_S=5 CAP_A=${CAP_A:-20} CAP_B=${CAP_B:-25}
    CAP_C=${CAP_C:-20}
    SIZES=(tiny) SIZE_D=tiny SEQ=64 MICRO=2 LOSS_TOKENS=64 STEPS=2 D_STEPS=${D_STEPS:-4}
    COMPILE=--no-compile VOCAB=2048 C_HEADS=(baseline soft_cap) LR=(0.3)
else
    BUDGET_S=${BUDGET_S:-480} RESERVE_S=15 MIN_PHASE_S=30 CAP_A=${CAP_A:-150}
    CAP_B=${CAP_B:-120} CAP_C=${CAP_C:-45}
    SIZES=(16M 221M) SIZE_D=16M SEQ=2048 MICRO=16 LOSS_TOKENS=32768 STEPS=10 D_STEPS=${D_STEPS:-}
    COMPILE=--compile VOCAB=50304 C_HEADS=(baseline soft_cap z_loss mu_loss mu_center) LR=(0.1 0.3)
fi
CORES=$(nproc)
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$SCRATCH/inductor}  # shared by phases
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$OUT" "$SCRATCH"
LOG="$OUT/gpu_check.log"
: > "$LOG"
: > "$OUT/phases.jsonl"
START=$SECONDS

record() {  # record PHASE KEY=VALUE ...: one row of phases.jsonl
    "$PYTHON" -c 'import json, sys
row = {"phase": sys.argv[1]}
for pair in sys.argv[2:]:
    key, value = pair.split("=", 1)
    row[key] = int(value) if value.lstrip("-").isdigit() else value
print(json.dumps(row))' "$@" >> "$OUT/phases.jsonl"
}

cap_for() {  # cap_for CAP_S: the cap, cut to the time left (0: too little left to start)
    local left=$((BUDGET_S - RESERVE_S - (SECONDS - START)))
    local cap=$(($1 < left ? $1 : left))
    echo $((cap < MIN_PHASE_S ? 0 : cap))
}

phase() {  # phase NAME CAP_S COMMAND ...: COMMAND under its cap (PHASE_CAP), output into the log
    local name=$1
    PHASE_CAP=$(cap_for "$2")
    shift 2
    if ((PHASE_CAP == 0)); then
        echo "== $name: skipped, the time budget is spent" | tee -a "$LOG"
        record "$name" status=skipped
        return
    fi
    local cap=$PHASE_CAP begin=$SECONDS
    echo "== $name (at most ${cap}s; $((SECONDS - START))s so far)" | tee -a "$LOG"
    if declare -F "$1" > /dev/null; then  # a function of this script caps its processes itself
        "$@" >> "$LOG" 2>&1
    else
        TORCHINDUCTOR_COMPILE_THREADS=$CORES timeout -k 10 "$cap" "$@" >> "$LOG" 2>&1
    fi
    local rc=$?
    record "$name" cap_s="$cap" seconds=$((SECONDS - begin)) rc=$rc
    if ((rc == 124)); then
        echo "== $name: cut at its cap of ${cap}s; its file keeps what it measured"
    elif ((rc != 0)); then
        echo "== $name: failed (exit code $rc); see $LOG"
    fi
}

long_steps() {  # steps of each phase-d run that fit in CAP_S, at the step times of phases a, b
    "$PYTHON" - "$OUT" "$SIZE_D" "$1" "${#LR[@]}" "${RUNS[@]}" <<'PY'
import json, sys
out, size, cap_s, n_lr, runs = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:5]), sys.argv[5:]
def rows(name):
    try:
        return [r for r in json.load(open(f"{out}/{name}"))["train"] if r["size"] == size]
    except (OSError, ValueError, KeyError):
        return []
a = rows("a_step.json")
alone = a[0]["step_s"] if a else 0.1  # phase a measured nothing: a guess
step_s = {(r["head"], r["head_dtype"]): r["step_s"] for r in rows("b_heads.json")}
# The runs take turns on the GPU, so a step of all of them lasts about the sum of their steps
# alone (a float32 head's fp32 matmul is the slow one); ~60 s go to starting and compiling.
all_runs_s = n_lr * sum(step_s.get(tuple(run.split()), alone) for run in runs)
print(max(20, int(max(cap_s - 60, 30) / all_runs_s)))
PY
}

long_pairs() {  # phase d: all runs at once, each under the phase's cap; logs merged afterwards
    local steps=${D_STEPS:-$(long_steps "$PHASE_CAP")} pids=()
    local log_every=$((steps / 10 > 1 ? steps / 10 : 1))
    local threads=$((CORES / (${#LR[@]} * ${#RUNS[@]}) > 1 ? CORES / (${#LR[@]} * ${#RUNS[@]}) : 1))
    for lr in "${LR[@]}"; do
        for run in "${RUNS[@]}"; do
            set -- $run
            local name="$1_$2_lr$lr"
            TORCHINDUCTOR_COMPILE_THREADS=$threads timeout -k 10 "$PHASE_CAP" "$PYTHON" train.py \
                --device "$DEVICE" --dtype bfloat16 "$COMPILE" --size "$SIZE_D" \
                --head "$1" --head_dtype "$2" --lr "$lr" --steps "$steps" \
                --warmup $((steps / 20)) --batch_size "$MICRO" --micro_batch "$MICRO" \
                --seq_len "$SEQ" --data "$DATA" --out_dir "$SCRATCH/$name" --eval_every 0 \
                --eval_tokens $((4 * MICRO * SEQ)) --stat_tokens $((MICRO * SEQ)) \
                --log_every "$log_every" --save_every "$steps" > "$SCRATCH/$name.out" 2>&1 &
            pids+=($!)
        done
    done
    echo "$((${#LR[@]} * ${#RUNS[@]})) runs of $steps steps, $threads compile workers each"
    local rc=0
    for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
    return $rc
}

merge_long_pairs() {  # d_long.jsonl: every log row and summary of phase d's runs, by run
    "$PYTHON" - "$SCRATCH" "$OUT/d_long.jsonl" <<'PY'
import json, sys
from pathlib import Path
scratch, out = Path(sys.argv[1]), Path(sys.argv[2])
rows = []
for config_path in sorted(scratch.glob("*/config.json")):
    folder = config_path.parent
    config = json.loads(config_path.read_text())
    run = {"run": folder.name, "head": config["head"], "peak_lr": config["lr"],
           "head_dtype": config.get("head_dtype"), "compile_failed": config.get("compile_failed")}
    log = folder / "log.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    rows += [run | json.loads(line) for line in lines if line.endswith("}")]
    if (folder / "summary.json").exists():
        rows.append(run | {"summary": json.loads((folder / "summary.json").read_text())})
out.write_text("".join(json.dumps(row) + "\n" for row in rows))
PY
    for out in "$SCRATCH"/*.out; do
        [ -f "$out" ] && { echo "== $out"; tail -n 30 "$out"; } >> "$LOG"
    done
}

table() {  # the short table, from the files under $OUT
    "$PYTHON" - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])

def rows(name, part):
    try:
        return json.loads((out / name).read_text())[part]
    except (OSError, ValueError, KeyError):
        return []

def pct(x):
    return "n/a" if x is None else f"{100 * x:.1f}%"

lines = [f"{'phase':<5} {'what':<44} measured"]
for r in rows("a_step.json", "train"):
    lines.append(f"{'a':<5} {r['size'] + ' baseline step (' + r['timing'] + ')':<44} "
                 f"{1e3 * r['step_s']:.1f} ms, {r['tokens_per_s']:,.0f} tok/s, MFU "
                 f"{pct(r['mfu'])}, peak {r['peak_mem_bytes'] / 2**30:.2f} GiB, "
                 f"compile+warm-up {r['warmup_s']:.0f} s")
for r in rows("b_heads.json", "train"):
    head = r["head"] + ("+f32" if r.get("head_dtype") == "float32" else "")  # the float32 head
    lines.append(f"{'b':<5} {r['size'] + ' ' + head + ' overhead (' + r['timing'] + ')':<44} "
                 f"{100 * r['overhead']:+.2f}% ({1e3 * r['step_s']:.1f} ms, compile+warm-up "
                 f"{r['warmup_s']:.0f} s)")
alone = rows("c_head_alone.json", "loss_path")
for r in alone:
    if r["head"] == "baseline":
        lines.append(f"{'c':<5} {r['size'] + ' head alone, baseline, ' + r['loss_impl']:<44} "
                     f"{1e3 * r['time_s']:.1f} ms, peak {r['peak_mem_bytes'] / 2**20:,.0f} MiB, "
                     f"|Δ loss| {r['loss_err']:.1e}, Δ grad {r['grad_err']:.1e}")
long = [json.loads(line) for line in (out / "d_long.jsonl").read_text().splitlines()] \
    if (out / "d_long.jsonl").exists() else []
for run in dict.fromkeys(r["run"] for r in long):
    log = [r for r in long if r["run"] == run and "step" in r]
    summary = next((r["summary"] for r in long if r["run"] == run and "summary" in r), None)
    end = "diverged" if summary and summary["diverged"] else "finished" if summary else "cut"
    if not log:
        lines.append(f"{'d':<5} {run:<44} no step logged ({end})")
        continue
    first, last = log[0], log[-1]
    def grew(key):
        values = [first.get(key), last.get(key)]
        return "n/a" if None in values else f"{values[0]:.3g} → {values[1]:.3g}"
    lines.append(f"{'d':<5} {run:<44} step {last['step']} ({end}), loss {last['loss']:.3f}, "
                 f"‖μ‖ {grew('mu_norm')}, l̄ {grew('logit_mean')}, h̄·μ̂ {grew('h_mu_proj')}")
table = "\n".join(lines) + "\n"
(out / "table.txt").write_text(table)
print(table, end="")
PY
}

finish() {  # also when the whole script is stopped: phase d's logs merged, the table printed
    trap - EXIT
    kill $(jobs -p) 2> /dev/null  # phase d's runs, when the script itself is stopped
    merge_long_pairs
    if (($(stat -c %s "$LOG") > 8000000)); then  # what comes back from a GPU: < 16 MiB a file
        tail -c 8000000 "$LOG" > "$LOG.tail" && mv "$LOG.tail" "$LOG"
    fi
    echo
    table
    record total seconds=$((SECONDS - START))
    echo "total $((SECONDS - START))s; files in $OUT/"
}
trap finish EXIT
trap 'exit 143' TERM INT

record env device="$DEVICE" cores="$CORES" budget_s="$BUDGET_S" \
    commit="$(git rev-parse HEAD 2> /dev/null || echo unknown)" \
    gpu="$( (nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader \
    2>/dev/null || echo none) | head -n 1)"
if ! "$PYTHON" -c "import store; store.check_dataset('$DATA')" >> "$LOG" 2>&1; then
    echo "gpu_check.sh: $DATA is not a dataset; make it on a CPU machine with" \
        "\`bash scripts/gpu_check.sh prepare\` and copy it along" >&2
    exit 1
fi
COMMON=(--device "$DEVICE" --dtype bfloat16 "$COMPILE" --seq_len "$SEQ" --micro_batch "$MICRO"
        --vocab_size "$VOCAB" --steps "$STEPS" --warmup 2)  # bench.py: synthetic tokens
phase a "$CAP_A" "$PYTHON" bench.py "${COMMON[@]}" --sizes "${SIZES[@]}" --heads baseline \
    --loss_paths default --json "$OUT/a_step.json"
phase b "$CAP_B" "$PYTHON" bench.py "${COMMON[@]}" --sizes "${SIZES[0]}" --loss_paths plain \
    --float32_head --json "$OUT/b_heads.json"
phase c "$CAP_C" "$PYTHON" bench.py "${COMMON[@]}" --no-compile --no_train \
    --sizes "${SIZES[@]}" --heads "${C_HEADS[@]}" --loss_paths plain chunked --chunk_size 4096 \
    --loss_tokens "$LOSS_TOKENS" --json "$OUT/c_head_alone.json"
phase d "$BUDGET_S" long_pairs
exit 0  # each phase's exit code is in phases.jsonl

#!/usr/bin/env bash
# The one GPU check: every question this project has for a GPU, in at most 8 minutes on one
# H200 (16 cores), compile included, offline, with at most 8 small files under $OUT.
#
#   bash scripts/gpu_check.sh prepare     # once, on a CPU machine that reaches PyPI: the data
#   bash scripts/gpu_check.sh             # on the GPU machine: files under $OUT, table at the end
#   DEVICE=cpu bash scripts/gpu_check.sh  # the CPU rehearsal: tiny sizes, a few steps
#
# Data: data/shakespeare (3.0 MiB, ignored by git, the text of experiments/proxy and
# experiments/alignment, so the GPU runs read like the CPU ones), made by `prepare`
# (scripts/shakespeare.sh, with the GPT-2 vocabulary seeded from tests/assets/gpt2). Copy it
# with the checkout (device tools: carry data/shakespeare; a symlink must be carried as the
# folder it points to). DATA overrides it. Nothing below downloads or installs anything.
#
# Phases, in order of value; each has a cap, and a phase that would start with less than
# MIN_PHASE_S left is skipped, so the whole never exceeds BUDGET_S (480 s):
#   a. train.py's real step (bench.py) at 16M, 16 × 2048, bf16, compiled, the plain loss path
#      (CUDA's default): the baseline and the float32 LM head (phase d's slowest run, so that
#      d is priced from its measured step): tok/s, MFU, peak memory, compile  -> a_step.json
#   b. per-head overhead at 16M: the other four heads, same settings          -> b_heads.json
#   c. the LM head alone, bf16 autocast, eager, 32768 tokens, D = 224 and 832: our paths next to
#      F.ce(F.linear) and, where this torch and this machine have them, F.linear_cross_entropy
#      (torch ≥ 2.13), Liger Kernel and Cut Cross-Entropy (CUDA, when installed); the anchors it
#      compared and why the others are absent go into phases.jsonl       -> c_head_alone.json
#   d. the long pairs, all six at once on the one GPU: 16M, T = 2048, bf16, compiled; baseline,
#      μ-centering and the float32 LM head at η = 0.1 and 0.3; batches of 16 × 2048 tokens (the
#      paper's: 64 × 2048; a quarter, for 4× the steps); as many steps as the time left allows,
#      priced from phases a and b (plan_long_pairs; the plan is a row of phases.jsonl); ‖μ‖, l̄,
#      h̄·μ̂, cos(h̄, μ) and prec_* logged ~10 times per run                     -> d_long.jsonl
#   e. the 221M step, baseline, as in a (after d: its compile alone may take a minute) -> e_step.json
#   and phases.jsonl (what ran: the machine, each phase's seconds, exit code (124 = cut by its
#   cap), graph breaks and recompiles torch logged), gpu_check.log (every phase's output),
#   table.txt (the table printed at the end).
#
# What survives a time limit: bench.py rewrites its JSON after every variant; phase d's run logs
# are merged into d_long.jsonl every few seconds as they grow, each file replaced atomically.
# Every phase's process runs in the background under PR_SET_PDEATHSIG (launch), so it dies with
# the script even under SIGKILL (no `timeout` with a process group of its own); the script waits
# in one-second sleeps, so a TERM or INT is handled within a second or two: children stopped,
# logs merged, table written.
#
# Compute (model.flops_per_token: 6·N + 12·L·D·T a token, N the weights of matrix products):
#   16M:  6 × 15,568,896 + 12 × 6 × 224 × 2048  = 126.4 MFLOP a token; × 16 × 2048 tokens
#         = 4.14 TFLOP a step: ~13 ms at a third of the H200's 989 TFLOP/s (bf16, dense)
#   221M: 6 × 220,766,208 + 12 × 21 × 832 × 2048 = 1,754 MFLOP a token; × 32,768
#         = 57.5 TFLOP a step: ~116 ms at half of it
#   the float32 LM head: its 3 matmuls, 6 × V × D = 6 × 50304 × 224 FLOPs a token, 2.2 TFLOP a
#         step at float32 (no TF32: 67 TFLOP/s peak) instead of bf16: ~45 ms more a step
# What costs is compiling (NOT measured on a GPU when this was written): on this project's
# 2-core CPU inductor took 100 s cold for 16M; on CUDA with 16 workers we assumed ~40 s for 16M,
# ~20 s per further 16M head (kernels shared through the inductor cache), ~80 s for 221M.
# Caps: a 100 s, b 90 s, c 40 s, e 80 s; d gets what is left less e's cap and RESERVE_S.
# BUDGET_S, CAP_A, CAP_B, CAP_C, CAP_E, D_STEPS, PHASES, OUT, DATA, SCRATCH and PYTHON may be
# set from outside (PHASES: which of a b c d e to run; D_STEPS: phase d's steps, unpriced).
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
if ! "$PYTHON" -c "import torch" 2> /dev/null; then
    echo "gpu_check.sh: $PYTHON cannot import torch; set PYTHON to the Python that has it" >&2
    exit 1
fi
seed_tiktoken_cache
if [ "${1:-}" = prepare ]; then  # shakespeare.sh calls `python`: make that $PYTHON (by a
    bin=$(mktemp -d)               # script: a venv's python found through a symlink is not in it)
    printf '#!/bin/sh\nexec %q "$@"\n' "$(command -v "$PYTHON")" > "$bin/python"
    chmod +x "$bin/python"
    [ -d data/shakespeare ] || PATH="$bin:$PATH" bash scripts/shakespeare.sh
    rc=$?
    rm -r "$bin"
    exit $rc
fi

DEVICE=${DEVICE:-cuda}
DATA=${DATA:-data/shakespeare}
OUT=${OUT:-out/gpu_check}
SCRATCH=${SCRATCH:-$(mktemp -d)}  # phase d's run folders (checkpoints: never under $OUT)
PHASES=${PHASES:-a b c d e}
RUNS=("baseline auto" "mu_center auto" "baseline float32")  # phase d: head, --head_dtype
B_HEADS=(soft_cap z_loss mu_loss mu_center)                 # bench.py adds the baseline
if [ "$DEVICE" = cpu ]; then
    # The rehearsal: the same phases and files, tiny and short. Phase a compiles for real
    # (inductor) the graph of CUDA's default path: plain Head.forward under bf16 autocast, so a
    # graph break or a recompile shows here first; the rest runs eagerly, for time.
    BUDGET_S=${BUDGET_S:-150} RESERVE_S=5 MIN_PHASE_S=5 CAP_A=${CAP_A:-80} CAP_B=${CAP_B:-25}
    CAP_C=${CAP_C:-20} CAP_E=${CAP_E:-20}
    SIZE=tiny SIZE_E=small SEQ=64 MICRO=2 LOSS_TOKENS=64 C_SIZES=(tiny) STEPS=2
    COMPILE=--no-compile VOCAB=2048 C_HEADS=(baseline soft_cap) LR=(0.3)
    A_EXTRA=() B_EXTRA=(--float32_head)  # the float32 head eager, in b: a compiles one graph
else
    BUDGET_S=${BUDGET_S:-480} RESERVE_S=15 MIN_PHASE_S=30 CAP_A=${CAP_A:-100}
    CAP_B=${CAP_B:-90} CAP_C=${CAP_C:-40} CAP_E=${CAP_E:-80}
    SIZE=16M SIZE_E=221M SEQ=2048 MICRO=16 LOSS_TOKENS=32768 C_SIZES=(16M 221M) STEPS=10
    COMPILE=--compile VOCAB=50304 C_HEADS=(baseline soft_cap z_loss mu_loss mu_center)
    LR=(0.1 0.3) A_EXTRA=(--float32_head) B_EXTRA=()
fi
D_STEPS=${D_STEPS:-}
# Cores this process may use; nproc alone obeys OMP_NUM_THREADS, which is set to 1 below.
CORES=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$SCRATCH/inductor}  # shared by phases
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TORCH_LOGS=${TORCH_LOGS:-graph_breaks,recompiles}
mkdir -p "$OUT" "$SCRATCH"
LOG="$OUT/gpu_check.log"
: > "$LOG"
: > "$OUT/phases.jsonl"
START=$SECONDS
exec 3>&1 4>&2  # where the table goes, also when a TERM lands inside a redirected phase
CURRENT= CURRENT_BEGIN=0  # the phase running, and when it began: for a stopped phase's row

record() {  # record PHASE KEY=VALUE ...: one row of phases.jsonl
    "$PYTHON" -c 'import json, sys
row = {"phase": sys.argv[1]}
for pair in sys.argv[2:]:
    key, value = pair.split("=", 1)
    row[key] = int(value) if value.lstrip("-").isdigit() else value
print(json.dumps(row))' "$@" >> "$OUT/phases.jsonl"
}

# The child's parent-death signal is SIGKILL (prctl PR_SET_PDEATHSIG = 1), kept across exec;
# it exits at once if this script is already gone.
DIE_WITH_PARENT='import ctypes, os, signal, sys
ctypes.CDLL(None).prctl(1, signal.SIGKILL)
if os.getppid() != int(sys.argv[1]):
    os._exit(137)
os.execvp(sys.argv[2], sys.argv[2:])'

launch() {  # launch OUTPUT COMMAND ...: COMMAND in the background, dying with this script
    local output=$1
    shift
    "$PYTHON" -c "$DIE_WITH_PARENT" $$ "$@" >> "$output" 2>&1 3>&- 4>&- &
}

running() {  # running PID ...: those of them still running (this shell's jobs: a pid that
    local pid jobs=" $(jobs -pr | tr '\n' ' ') "   # ended is never signalled, even if reused)
    for pid; do [[ $jobs == *" $pid "* ]] && echo "$pid"; done
}

supervise() {  # supervise CAP_S TICK PID ...: wait for the PIDs, running TICK every 2 s; TERM
    local cap=$1 tick=$2 begin=$SECONDS last=$SECONDS rc=0 pid left
    shift 2                                         # at the cap, KILL 10 s later; 124 when cut
    while left=($(running "$@")) && ((${#left[@]})); do
        if ((SECONDS - begin >= cap + 10)); then
            kill -KILL "${left[@]}" 2> /dev/null
        elif ((SECONDS - begin >= cap)); then
            kill -TERM "${left[@]}" 2> /dev/null
        fi
        sleep 1  # a trapped TERM runs after this second, not after the phase
        ((SECONDS - last < 2)) || { $tick; last=$SECONDS; }
    done
    for pid; do wait "$pid" || rc=$?; done
    ((SECONDS - begin >= cap)) && return 124
    return $rc
}

cap_for() {  # cap_for CAP_S: the cap, cut to the time left (0: too little left to start)
    local left=$((BUDGET_S - RESERVE_S - (SECONDS - START)))
    local cap=$(($1 < left ? $1 : left))
    echo $((cap < MIN_PHASE_S ? 0 : cap))
}

torch_logged() {  # torch_logged < OUTPUT: graph_breaks=N recompiles=M, from TORCH_LOGS' lines
    local text
    text=$(cat)
    echo "graph_breaks=$(grep -ci "graph break" <<< "$text")" \
        "recompiles=$(grep -c "Recompiling function" <<< "$text")"
}

phase() {  # phase NAME CAP_S COMMAND ...: a command of this script (a function, which caps its
    local name=$1 cap                         # own processes) or one process, capped
    [[ " $PHASES " == *" $name "* ]] || return 0
    cap=$(cap_for "$2")
    shift 2
    if ((cap == 0)); then
        echo "== $name: skipped, the time budget is spent" | tee -a "$LOG"
        record "$name" status=skipped
        return
    fi
    local begin=$SECONDS lines rc
    lines=$(wc -l < "$LOG")
    echo "== $name (at most ${cap}s; $((SECONDS - START))s so far)" | tee -a "$LOG"
    CURRENT=$name CURRENT_BEGIN=$begin
    if declare -F "$1" > /dev/null; then
        "$@" "$cap" >> "$LOG" 2>&1
    else
        TORCHINDUCTOR_COMPILE_THREADS=$CORES launch "$LOG" "$@"
        supervise "$cap" : $!
    fi
    rc=$?
    CURRENT=
    record "$name" cap_s="$cap" seconds=$((SECONDS - begin)) rc=$rc \
        $(tail -n +$((lines + 1)) "$LOG" | torch_logged)
    if ((rc == 124)); then
        echo "== $name: cut at its cap of ${cap}s; its file keeps what it measured"
    elif ((rc != 0)); then
        echo "== $name: failed (exit code $rc); see $LOG"
    fi
}

plan_long_pairs() {  # plan_long_pairs DEADLINE RUN ...: "RUNS STEPS LOSS_CHUNK" for phase d,
    "$PYTHON" - "$OUT" "$DEVICE" "$SIZE" "$1" "$((MICRO * SEQ))" "$COMPILE" "${D_STEPS:-0}" \
        "${@:2}" <<'PY'                   # priced from phases a and b; the plan into phases.jsonl
import json, sys, time
from pathlib import Path
import torch
import bench
import fused_loss
from model import SIZES
out, device, size = Path(sys.argv[1]), torch.device(sys.argv[2]), sys.argv[3]
deadline, tokens, compile_asked, d_steps = (float(sys.argv[4]), int(sys.argv[5]),
                                            sys.argv[6] == "--compile", int(sys.argv[7]))
runs = [tuple(run.split()) for run in sys.argv[8:]]  # (head, head_dtype, lr), by priority
# Not measured by phases a-c, so priced here (guesses; their outcome is in d_long.jsonl):
START_S, SUMMARY_S = (15, 10) if device.type == "cuda" else (5, 3)  # a process's start (imports,
EVAL_BATCHES = 4         # data check); its end (final statistics, checkpoint); --eval_tokens
EVAL_GRAPH = 0.5         # the no-grad evaluation graph's compile, as a share of the step's
FP32_FLOPS = 50e12       # float32 matmuls without TF32 on an H200: 67 TFLOP/s peak, at 3/4
GUESS_STEP_S = 0.05      # a 16M step when nothing was measured (4.14 TFLOP at 1/12 of peak)
GUESS_COMPILE_S = 90     # compile + warm-up when nothing was measured
EAGER_RUN_BYTES = 23 * 2**30  # an eager 16M run (issue 27: the float32 log-softmax is saved)
MIN_STEPS = 20

phase_rc = {r["phase"]: r.get("rc") for r in map(json.loads, open(out / "phases.jsonl"))}
measured = {}            # (head, head_dtype) -> bench.py's row, in d's mode (compiled or eager)
for name in ("a_step.json", "b_heads.json"):
    try:
        result = json.loads((out / name).read_text())
    except (OSError, ValueError):
        continue
    if result["settings"]["compile"] == compile_asked:
        measured |= {(r["head"], r["head_dtype"]): r for r in result["train"] if r["size"] == size}
# Phase a failed outright (not cut) with nothing measured: torch.compile cannot be trusted, and
# six eager runs would not fit (the plain path saves the full float32 log-softmax): eager with
# the chunked loss, as many runs as fit.
compile_failed = compile_asked and not measured and phase_rc.get("a") not in (None, 0, 124)
compiled = compile_asked and not compile_failed
loss_chunk = fused_loss.CHUNK_SIZE if compile_failed else "default"
width, vocab = SIZES[size]["n_embd"], 50304  # train.py's default --vocab_size
base = measured.get(("baseline", "auto"))


def price(head, head_dtype):
    """(step s, evaluation s, compile s, bytes, how) of one run of phase d."""
    row = measured.get((head, head_dtype))
    if row:
        how, step_s = "measured", row["step_s"]
    else:
        how, row = "priced", base
        step_s = row["step_s"] if row else GUESS_STEP_S
        if head_dtype == "float32":  # its 3 head matmuls in float32 instead of bf16
            step_s += 6 * vocab * width * tokens / FP32_FLOPS
    eval_s = row["eval_s"] if row and "eval_s" in row else step_s / 3  # forward: 2 of 6 FLOPs
    compile_s = (1 + EVAL_GRAPH) * (row["warmup_s"] if row else GUESS_COMPILE_S) * compiled
    peak = row and (row.get("peak_reserved_bytes") or row["peak_mem_bytes"])
    if row and peak:  # weights, gradients, AdamW's m and v; activations; the CUDA context
        memory = 16 * row["params"] + peak + 2**30
    else:
        memory = EAGER_RUN_BYTES if device.type == "cuda" else 0
    return step_s, eval_s, compile_s, memory, how


have, left = bench.device_memory(device), deadline - time.time()
plan = {"phase": "d_plan", "left_s": left, "runs": 0, "steps": 0, "compiled": compiled,
        "loss_chunk": loss_chunk}
for n in range(len(runs), 0, -1):  # the most runs that fit in memory and in the time
    prices = [price(head, head_dtype) for head, head_dtype, _ in runs[:n]]
    step_s, eval_s, compile_s, memory, how = zip(*prices)
    fixed = {"start_s": START_S, "compile_s": max(compile_s), "summary_s": SUMMARY_S,
             "eval_s": 2 * EVAL_BATCHES * sum(eval_s)}  # step 0's evaluation and the final one
    round_s = sum(step_s)  # the runs take turns on the device
    steps = int((left - sum(fixed.values())) / round_s)
    if sum(memory) < 0.9 * have and steps >= MIN_STEPS:
        plan |= {"runs": n, "steps_priced": steps, "steps": d_steps or steps, **fixed,
                 "round_s": round_s, "memory_bytes": sum(memory), "device_bytes": have,
                 "how": dict(zip(("_".join(run) for run in runs), how))}
        break
with open(out / "phases.jsonl", "a") as f:
    f.write(json.dumps(plan) + "\n")
print(plan["runs"], plan["steps"], loss_chunk)
PY
}

long_pairs() {  # long_pairs CAP_S: phase d, the planned runs at once, merged as they log
    local deadline=$(($(date +%s) + $1)) runs=() plan pids=() lr run
    for lr in "${LR[@]}"; do
        for run in "${RUNS[@]}"; do runs+=("$run $lr"); done
    done
    plan=($(plan_long_pairs "$deadline" "${runs[@]}")) || return 1
    local n=${plan[0]} steps=${plan[1]} chunk=${plan[2]}
    ((n > 0)) || { echo "phase d: no run fits in the time or memory left"; return 1; }
    local threads=$((CORES / n > 1 ? CORES / n : 1)) compile=$COMPILE
    [ "$chunk" = default ] && chunk=() || { chunk=(--loss_chunk "$chunk"); compile=--no-compile; }
    local log_every=$((steps / 10 > 1 ? steps / 10 : 1))
    for run in "${runs[@]:0:n}"; do
        set -- $run
        local name="$1_$2_lr$3"
        TORCHINDUCTOR_COMPILE_THREADS=$threads launch "$SCRATCH/$name.out" "$PYTHON" train.py \
            --device "$DEVICE" --dtype bfloat16 "$compile" "${chunk[@]}" --size "$SIZE" \
            --head "$1" --head_dtype "$2" --lr "$3" --steps "$steps" \
            --warmup $((steps / 20)) --batch_size "$MICRO" --micro_batch "$MICRO" \
            --seq_len "$SEQ" --data "$DATA" --out_dir "$SCRATCH/$name" --eval_every 0 \
            --eval_tokens $((4 * MICRO * SEQ)) --stat_tokens $((MICRO * SEQ)) \
            --log_every "$log_every" --save_every "$steps"
        pids+=($!)
    done
    echo "$n runs of $steps steps, $threads compile workers each"
    supervise $(($(date +%s) < deadline ? deadline - $(date +%s) : 0)) merge_long_pairs "${pids[@]}"
}

merge_long_pairs() {  # d_long.jsonl: every log row and summary of phase d's runs, by run
    "$PYTHON" - "$SCRATCH" "$OUT/d_long.jsonl" <<'PY'
import json, os, sys
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
if rows:  # replaced at once: a reader (or a kill) never meets half a file
    out.with_suffix(".tmp").write_text("".join(json.dumps(row) + "\n" for row in rows))
    os.replace(out.with_suffix(".tmp"), out)
PY
}

head_anchors() {  # after phase c: which anchors it compared, and why the others are absent
    [ -f "$OUT/c_head_alone.json" ] || return 0
    "$PYTHON" - "$OUT/c_head_alone.json" "$DEVICE" >> "$OUT/phases.jsonl" <<'PY'
import importlib.util, json, sys
import torch
import fused_loss
result, device = json.load(open(sys.argv[1])), sys.argv[2]
compared = sorted({r["loss_impl"] for r in result["loss_path"]} - {"plain", "default", "chunked"})
reasons = {"F.linear_ce": None if fused_loss.TORCH_OP and hasattr(torch.nn, "LinearCrossEntropyOptions")
           else f"needs torch >= 2.13 (this is {torch.__version__})"}
for name, module in (("liger", "liger_kernel"), ("cce", "cut_cross_entropy")):
    reasons[name] = ("CUDA only" if device == "cpu" else
                     None if importlib.util.find_spec(module) else f"{module} is not installed")
absent = {name: why or "not run" for name, why in reasons.items() if name not in compared}
print(json.dumps({"phase": "c_anchors", "compared": compared, "absent": absent}))
PY
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

def gib(x):
    return "n/a" if x is None else f"{x / 2**30:.2f} GiB"

def label(r):
    return r["head"] + ("+f32" if r.get("head_dtype") == "float32" else "")

def steps(phase, name):
    return [f"{phase:<5} {r['size'] + ' ' + label(r) + ' step (' + r['timing'] + ')':<44} "
            f"{1e3 * r['step_s']:.1f} ms, {r['tokens_per_s']:,.0f} tok/s, MFU {pct(r['mfu'])}, "
            f"peak {gib(r['peak_mem_bytes'])} (reserved {gib(r.get('peak_reserved_bytes'))}), "
            f"compile+warm-up {r['warmup_s']:.0f} s" for r in rows(name, "train")]

lines = [f"{'phase':<5} {'what':<44} measured"] + steps("a", "a_step.json")
for r in rows("b_heads.json", "train"):
    lines.append(f"{'b':<5} {r['size'] + ' ' + label(r) + ' overhead (' + r['timing'] + ')':<44} "
                 f"{100 * r['overhead']:+.2f}% ({1e3 * r['step_s']:.1f} ms, compile+warm-up "
                 f"{r['warmup_s']:.0f} s)")
for r in rows("c_head_alone.json", "loss_path"):
    if r["head"] == "baseline":
        lines.append(f"{'c':<5} {r['size'] + ' head alone, baseline, ' + r['loss_impl']:<44} "
                     f"{1e3 * r['time_s']:.1f} ms, peak {r['peak_mem_bytes'] / 2**20:,.0f} MiB, "
                     f"|Δ loss| {r['loss_err']:.1e}, Δ grad {r['grad_err']:.1e}")
phases = [json.loads(line) for line in (out / "phases.jsonl").read_text().splitlines()]
for r in phases:
    if r["phase"] == "c_anchors":
        absent = "; ".join(f"{k}: {v}" for k, v in r["absent"].items())
        lines.append(f"{'c':<5} {'anchors compared':<44} {', '.join(r['compared'])}; absent: "
                     f"{absent or 'none'}")
    if r["phase"] == "d_plan":
        lines.append(f"{'d':<5} {'plan':<44} {r['runs']} runs × {r['steps']} steps "
                     f"({'compiled' if r['compiled'] else 'eager'}, {r['left_s']:.0f} s left)")
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
table = "\n".join(lines + steps("e", "e_step.json")) + "\n"
(out / "table.tmp").write_text(table)
(out / "table.tmp").replace(out / "table.txt")
print(table, end="")
PY
}

stop_children() {  # TERM every child still running, KILL what is left after 3 s
    local left tries
    left=($(jobs -pr))
    ((${#left[@]})) || return 0
    kill -TERM "${left[@]}" 2> /dev/null
    for tries in 1 2 3; do
        left=($(running "${left[@]}"))
        ((${#left[@]})) && sleep 1
    done
    left=($(running "${left[@]}"))
    ((${#left[@]} == 0)) || kill -KILL "${left[@]}" 2> /dev/null
}

finish() {  # also when the whole script is stopped: children ended, logs merged, table printed
    trap - EXIT
    exec >&3 2>&4
    stop_children
    [ -n "$CURRENT" ] && record "$CURRENT" status=stopped seconds=$((SECONDS - CURRENT_BEGIN))
    merge_long_pairs
    for out in "$SCRATCH"/*.out; do
        [ -f "$out" ] && { echo "== $out"; torch_logged < "$out"; tail -n 30 "$out"; } >> "$LOG"
    done
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
    torch="$("$PYTHON" -c 'import sys, torch; print(torch.__version__, sys.version.split()[0])')" \
    commit="$(git rev-parse HEAD 2> /dev/null || echo unknown)" \
    gpu="$( (nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader \
    2>/dev/null || echo none) | head -n 1)"
if ! "$PYTHON" -c "import store; store.check_dataset('$DATA')" >> "$LOG" 2>&1; then
    echo "gpu_check.sh: $DATA is not a dataset; make it on a CPU machine with" \
        "\`bash scripts/gpu_check.sh prepare\` and copy it along" >&2
    exit 1
fi
BENCH=("$PYTHON" bench.py --device "$DEVICE" --dtype bfloat16 --seq_len "$SEQ" --steps "$STEPS"
       --micro_batch "$MICRO" --vocab_size "$VOCAB" --warmup 2)  # synthetic tokens
phase a "$CAP_A" "${BENCH[@]}" --compile --sizes "$SIZE" --heads baseline --loss_paths plain \
    "${A_EXTRA[@]}" --json "$OUT/a_step.json"
phase b "$CAP_B" "${BENCH[@]}" "$COMPILE" --sizes "$SIZE" --heads "${B_HEADS[@]}" \
    --loss_paths plain "${B_EXTRA[@]}" --json "$OUT/b_heads.json"
phase c "$CAP_C" "${BENCH[@]}" --no-compile --no_train --sizes "${C_SIZES[@]}" \
    --heads "${C_HEADS[@]}" --loss_paths plain chunked --chunk_size 4096 \
    --loss_tokens "$LOSS_TOKENS" --json "$OUT/c_head_alone.json"
[[ " $PHASES " == *" c "* ]] && head_anchors
[[ " $PHASES " == *" e "* ]] && KEEP_E=$CAP_E || KEEP_E=0  # d leaves e its cap
phase d $((BUDGET_S - RESERVE_S - (SECONDS - START) - KEEP_E)) long_pairs
phase e "$CAP_E" "${BENCH[@]}" "$COMPILE" --sizes "$SIZE_E" --heads baseline --loss_paths plain \
    --json "$OUT/e_step.json"
exit 0  # each phase's exit code is in phases.jsonl

"""
sweep.py — the paper's experiments as sweeps of train.py runs, and what they are turned into.

    python sweep.py run --grid paper --out runs/paper --steps 2000 --warmup 100  # one at a time
    python sweep.py run --grid paper --out runs/paper --gpus 0,1,2,3              # four at once
    python sweep.py run --grid lambda --out runs/lam --launcher slurm --nproc_per_node 4 --submit
    python sweep.py collect runs/paper              # every summary.json -> runs/paper/results.csv
    python sweep.py table runs/paper/results.csv    # Tables 2/3/6: Markdown + CSV
    python sweep.py plot runs/paper/results.csv --reference tests/data/oec_untied_runs.csv

Grids (Sec. 3–5 of the paper): `paper` = 7 learning rates × 5 sizes × tied/untied × 5 heads
(λ = 1e-4 for z_loss and mu_loss, c = 30 for soft_cap); `lambda` = λ ∈ {1e-7, 1e-4, 1e-1, 1e2}
× {z_loss, mu_loss} × 7 learning rates × 5 sizes, untied; `custom` = what --sizes, --lrs and
--heads say. Any axis flag narrows or replaces a grid's axis, and every option sweep.py does not
know is passed on to train.py unchanged, so a short proxy sweep is one command.

Each point is one train.py run folder, OUT/{size}_{head}_lr{lr:g}_tie{0|1}[_lam{λ:g}][_cap{c:g}].
A run is finished when its summary.json exists (a diverged run too); re-running the same command
skips finished runs and retries the others, with --resume where a ckpt.pt survived.

Learning-rate sensitivity (Wortsman et al. 2023; the paper's Eq. 22), for one size, tying and
head over the learning rates η of the sweep:

    LRS = Σ_η [min(L(η), L₀) − min_η L(η)] / (n_η − 1)

L(η) is the final test loss, L₀ the loss at initialisation (≈ ln V); a diverged run counts as
L₀.
Eq. 22 writes a mean over all n_η learning rates, but the published tables divide by n_η − 1,
i.e. they average over the learning rates other than the best one; that is the default here so our
numbers compare with the paper's, and `--lrs_mean literal` gives Eq. 22 as written (n_η−1)/n_η
times as large. Additional training time = a variant's mean train time / the baseline's − 1.

sweep.py imports nothing of this project: it talks to train.py through its command line and its
run folders only.
"""
import argparse
import csv
import io
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from itertools import product
from pathlib import Path

# -----------------------------------------------------------------------------
# defaults: the paper's grids (Eq. 19–21, 23) and constants

PAPER_LRS = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
PAPER_SIZES = ("16M", "29M", "57M", "109M", "221M")
HEADS = ("baseline", "soft_cap", "z_loss", "mu_loss", "mu_center")
LAMBDA_HEADS = ("z_loss", "mu_loss")  # the heads with a regularisation weight λ
LAMBDAS = (1e-7, 1e-4, 1e-1, 1e2)
DEFAULT_LAM = 1e-4  # the paper's λ for z_loss and mu_loss outside Sec. 5
DEFAULT_CAP = 30.0  # the paper's soft-cap c
# The CPU proxy of the paper's result (README, "What you should see"): the tiny model on real
# text, the paper's learning rates extended upward (a short run needs a larger η for μ to grow
# as it does over the paper's 100,000 steps), float32 against bf16 matmuls, untied for every
# head and tied for baseline and μ-centering: 5 η × 2 dtypes × (5 + 2) = 70 runs of 300 steps,
# about 75 minutes on two idle CPU cores with --jobs 2. Its train.py settings come first;
# options given on the command line come after them and win.
PROXY_LRS = (3e-2, 1e-1, 3e-1, 1.0, 3.0)
PROXY_TRAIN_ARGS = ("--device", "cpu", "--steps", "300", "--warmup", "15", "--batch_size", "4",
                    "--micro_batch", "4", "--seq_len", "64", "--loss_chunk", "256",
                    "--eval_every", "100", "--eval_tokens", "8192", "--stat_tokens", "4096",
                    "--log_every", "20", "--data", "data/shakespeare")
GRID_DEFAULTS = dict(tied_heads=None, dtypes=(None,), seeds=(None,), train_args=())
GRIDS = {
    "paper": dict(GRID_DEFAULTS, sizes=PAPER_SIZES, lrs=PAPER_LRS, heads=HEADS,
                  ties=(False, True), lams=(DEFAULT_LAM,), caps=(DEFAULT_CAP,)),
    "lambda": dict(GRID_DEFAULTS, sizes=PAPER_SIZES, lrs=PAPER_LRS, heads=LAMBDA_HEADS,
                   ties=(False,), lams=LAMBDAS, caps=(DEFAULT_CAP,)),
    "proxy": dict(sizes=("tiny",), lrs=PROXY_LRS, heads=HEADS, ties=(False, True),
                  tied_heads=("baseline", "mu_center"), lams=(DEFAULT_LAM,), caps=(DEFAULT_CAP,),
                  dtypes=("float32", "bfloat16"), seeds=(0,), train_args=PROXY_TRAIN_ARGS),
    "custom": dict(GRID_DEFAULTS, sizes=None, lrs=None, heads=None, ties=(False,), lams=(None,),
                   caps=(None,)),
}
# The loss at initialisation where a CSV has no init_loss (the published runs): the reference
# README's values, ≈ ln 50304 = 10.83 (the 221M model starts slightly higher).
L0_BY_SIZE = {"16M": 10.83, "29M": 10.83, "57M": 10.83, "109M": 10.83, "221M": 10.85}
SIZE_ORDER = ("tiny", "small") + PAPER_SIZES  # presets first, then the paper's sizes by N
TRAIN_PY = Path(__file__).resolve().with_name("train.py")
# train.py options that the grid sets per run and the user therefore must not pass through
GRID_OPTIONS = ("--size", "--head", "--lr", "--tie", "--no-tie", "--lam", "--cap", "--dtype",
                "--seed", "--out_dir", "--resume")
RESULT_COLUMNS = ("size", "lr", "head", "lam", "cap", "tie", "dtype", "seed", "test_loss",
                  "init_loss", "diverged", "mu_norm", "logit_mean", "logit_std", "logit_absmax",
                  "mean_log2Z", "prec_ce_gap", "prec_err_cast", "prec_err_round", "steps",
                  "tokens", "train_time_s", "run")
TABLE_COLUMNS = ("size", "lr", "head", "lam", "tie", "test_loss", "train_time_s")
METRICS = (("logit_mean", "logit mean  l̄"), ("logit_std", "logit std  σ_l"),
           ("mu_norm", "‖μ‖"), ("logit_absmax", "max |l|"))  # Fig. 3, in the paper's order
# what the matmul's dtype costs the LM head (heads.precision_stat_sums); drawn where a CSV has it
PRECISION_METRICS = (("prec_err_cast", "input rounding / σ_l"),
                     ("prec_err_round", "result rounding / σ_l"), ("prec_ce_gap", "CE gap (nats)"))
HEAD_COLORS = {"baseline": "tab:gray", "soft_cap": "tab:orange", "z_loss": "tab:red",
               "mu_loss": "tab:blue", "mu_center": "tab:green"}
SOLID = dict(ls="-", marker="o", ms=4)  # our runs
DASHED = dict(ls="--", marker="x", ms=4, alpha=0.6)  # the paper's, with --reference
POLL_S = 0.2  # how often the local launcher looks for finished runs
USAGE_ERROR = 2  # argparse's exit code: train.py did not accept its options


# -----------------------------------------------------------------------------
# the grid: one Run per point

@dataclass(frozen=True)
class Run:
    size: str
    head: str
    lr: float
    tie: bool
    lam: float | None = None
    cap: float | None = None
    dtype: str | None = None  # None: train.py's default
    seed: int | None = None

    @property
    def name(self):
        """The run folder's name:
        {size}_{head}_lr{lr:g}_tie{0|1}[_lam{λ:g}][_cap{c:g}][_{dtype}][_seed{n}]."""
        name = f"{self.size}_{self.head}_lr{self.lr:g}_tie{int(self.tie)}"
        if self.lam is not None:
            name += f"_lam{self.lam:g}"
        if self.cap is not None:
            name += f"_cap{self.cap:g}"
        if self.dtype is not None:
            name += f"_{self.dtype}"
        if self.seed is not None:
            name += f"_seed{self.seed}"
        return name

    def train_args(self):
        """train.py's options for this point; numbers in full (repr), unlike the short name."""
        args = ["--size", self.size, "--head", self.head, "--lr", repr(self.lr)]
        args += ["--tie"] if self.tie else []
        args += ["--lam", repr(self.lam)] if self.lam is not None else []
        args += ["--cap", repr(self.cap)] if self.cap is not None else []
        args += ["--dtype", self.dtype] if self.dtype is not None else []
        args += ["--seed", str(self.seed)] if self.seed is not None else []
        return args


def expand_grid(grid, sizes=None, lrs=None, heads=None, ties=None, lams=None, caps=None,
                dtypes=None, seeds=None):
    """Every point of a grid, with any axis given here replacing the grid's own.

    λ only multiplies the heads that have one (z_loss, mu_loss) and c only soft_cap, so the
    paper grid is 7 × 5 × 2 × 5 = 350 runs and the λ grid 4 × 2 × 7 × 5 = 280. The proxy grid
    ties only baseline and mu_center: 5 η × 2 dtypes × (5 heads + 2 tied) = 70 runs.
    """
    if grid not in GRIDS:
        raise ValueError(f"unknown grid {grid!r}; choose one of {', '.join(GRIDS)}")
    axes = dict(GRIDS[grid])
    given = dict(sizes=sizes, lrs=lrs, heads=heads, ties=ties, lams=lams, caps=caps,
                 dtypes=dtypes, seeds=seeds)
    axes.update({axis: tuple(values) for axis, values in given.items() if values})
    missing = [f"--{axis}" for axis in ("sizes", "lrs", "heads") if not axes[axis]]
    if missing:
        raise ValueError(f"--grid {grid} needs {', '.join(missing)} (e.g. --sizes tiny "
                         f"--lrs 1e-3 3e-3 --heads baseline mu_center)")
    unknown = [head for head in axes["heads"] if head not in HEADS]
    if unknown:
        raise ValueError(f"unknown head {unknown[0]!r}; choose from {', '.join(HEADS)}")
    runs = []
    tied_heads = axes["tied_heads"] or axes["heads"]
    for size, head, tie, dtype, seed, lr in product(axes["sizes"], axes["heads"], axes["ties"],
                                                    axes["dtypes"], axes["seeds"], axes["lrs"]):
        if tie and head not in tied_heads:
            continue
        lams = axes["lams"] if head in LAMBDA_HEADS else (None,)
        caps = axes["caps"] if head == "soft_cap" else (None,)
        runs += [Run(size, head, lr, tie, lam, cap, dtype, seed) for lam in lams for cap in caps]
    return list(dict.fromkeys(runs))  # repeated axis values would only repeat runs


# -----------------------------------------------------------------------------
# launching: locally (one or several at a time) or as a SLURM job array

def is_finished(run_dir):
    return (Path(run_dir) / "summary.json").exists()


def train_command(run, out, extra_args, nproc_per_node=1):
    """The command line of one local run; --resume where an earlier attempt left a checkpoint."""
    run_dir = Path(out) / run.name
    args = [str(TRAIN_PY), *run.train_args(), "--out_dir", str(run_dir), *extra_args]
    if (run_dir / "ckpt.pt").exists():
        args.append("--resume")
    if nproc_per_node > 1:  # torchrun picks a free port itself with --standalone
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc_per_node={nproc_per_node}", *args]
    return [sys.executable, *args]


def gpu_slots(gpus, nproc_per_node, jobs=1):
    """The CUDA_VISIBLE_DEVICES value of each run that may go at once (None: no pinning; without
    --gpus, --jobs runs share the machine, e.g. one CPU core each)."""
    if not gpus:
        return [None] * jobs
    ids = [gpu.strip() for gpu in gpus.split(",") if gpu.strip()]
    if not ids or len(ids) % nproc_per_node:
        raise ValueError(f"--gpus {gpus} must list a multiple of --nproc_per_node="
                         f"{nproc_per_node} GPU ids, e.g. --gpus 0,1,2,3")
    return [",".join(ids[i:i + nproc_per_node]) for i in range(0, len(ids), nproc_per_node)]


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM takes the same way out as Ctrl-C


def launch_local(runs, out, extra_args, slots, nproc_per_node=1):
    """Run every run, len(slots) at a time; returns the names of those that failed.

    With one slot train.py prints to this terminal; with several each run's output goes to
    OUT/logs/NAME.log. An interrupt stops the runs in flight, which resume on the next call.
    """
    pending, running, failed, free = list(runs), {}, [], list(slots)
    durations, total = [], len(runs)
    log_dir = Path(out) / "logs"
    if len(slots) > 1:
        log_dir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        while pending or running:
            while pending and free:
                run, slot = pending.pop(0), free.pop(0)
                cmd = train_command(run, out, extra_args, nproc_per_node)
                env = dict(os.environ, **({"CUDA_VISIBLE_DEVICES": slot} if slot else {}))
                if len(slots) > 1 and not slot:  # CPU runs side by side: one core's threads each
                    env.setdefault("OMP_NUM_THREADS", str(max(1, os.cpu_count() // len(slots))))
                log = open(log_dir / f"{run.name}.log", "a") if len(slots) > 1 else None
                where = f" on GPU {slot}" if slot else ""
                print(f"sweep: start {run.name}{' (resume)' if '--resume' in cmd else ''}{where}",
                      flush=True)
                proc = subprocess.Popen(cmd, env=env, stdout=log,
                                        stderr=subprocess.STDOUT if log else None)
                running[proc] = (run, slot, log, time.time())
            time.sleep(POLL_S)
            for proc in [p for p in running if p.poll() is not None]:
                run, slot, log, started = running.pop(proc)
                free.append(slot)
                if log:
                    log.close()
                ok = proc.returncode == 0 and is_finished(Path(out) / run.name)
                status = "done" if ok else f"FAILED (exit {proc.returncode})"
                durations.append(time.time() - started)
                left = len(pending) + len(running)
                eta = sum(durations) / len(durations) * left / len(slots)
                print(f"sweep: {status} {run.name} in {durations[-1]:.0f} s; "
                      f"{total - left}/{total} ended, ETA {eta / 60:.0f} min", flush=True)
                if not ok:
                    failed.append(run.name)
                if proc.returncode == USAGE_ERROR and pending:
                    # the options every run shares are wrong: the other runs would fail alike
                    output = log.name if log else "see above"
                    print(f"sweep: train.py refused its command line ({output}); the other "
                          f"{len(pending)} runs were not started", flush=True)
                    failed += [run.name for run in pending]
                    pending.clear()
    except KeyboardInterrupt:
        for proc, (_, _, log, _) in running.items():
            proc.terminate()
            proc.wait()
            if log:
                log.close()
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return failed


SBATCH_TEMPLATE = """#!/bin/bash
# A SLURM job array of train.py runs, written by sweep.py: array task i runs line i (0-based)
# of the run list with one torchrun. Each line is "RUN_DIR TRAIN_ARGS...". A task whose run
# already has summary.json exits at once; one that finds a ckpt.pt resumes from it. The job
# runs in the environment sbatch was called from: activate the one with torch first.
#SBATCH --job-name=oec-sweep
#SBATCH --array={array}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={nproc}
#SBATCH --output={log_dir}/%A_%a.out
#SBATCH --chdir={cwd}
{extra_sbatch}
# Multi-node runs: write the script with `sweep.py run ... --nodes N`. srun then starts one
# torchrun per node and they meet through the c10d rendezvous on the first node of the task's
# allocation (--rdzv_endpoint); each array task gets its own port so tasks sharing a node do
# not collide. torchrun sets RANK, LOCAL_RANK and WORLD_SIZE for train.py.
set -euo pipefail
RUN_LIST={run_list}
eval "RUN=($(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" "$RUN_LIST"))"
RUN_DIR="${{RUN[0]}}"
if [ -f "$RUN_DIR/summary.json" ]; then echo "$RUN_DIR is finished"; exit 0; fi
RESUME=""
if [ -f "$RUN_DIR/ckpt.pt" ]; then RESUME="--resume"; fi
HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
PORT=$((29500 + SLURM_ARRAY_TASK_ID % 20000))
srun --ntasks-per-node=1 torchrun --nnodes="$SLURM_JOB_NUM_NODES" --nproc_per_node={nproc} \\
    --rdzv_backend=c10d --rdzv_endpoint="$HEAD_NODE:$PORT" \\
    --rdzv_id="${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}" \\
    {train_py} "${{RUN[@]:1}}" --out_dir "$RUN_DIR" $RESUME
"""


def write_slurm(runs, out, extra_args, nproc_per_node=1, nodes=1, sbatch_options=(),
                array_limit=0):
    """Write OUT/slurm/runs_STAMP.txt and OUT/slurm/sweep_STAMP.sbatch; returns the script.

    A new pair per call, so an array still queued keeps reading the list it was written for.
    """
    out = Path(out).resolve()
    slurm_dir = out / "slurm"
    (slurm_dir / "logs").mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    run_list = slurm_dir / f"runs_{stamp}.txt"
    lines = [shlex.join([str(out / run.name), *run.train_args(), *extra_args]) for run in runs]
    write_atomic(run_list, "".join(line + "\n" for line in lines))
    array = f"0-{len(runs) - 1}" + (f"%{array_limit}" if array_limit else "")
    script = SBATCH_TEMPLATE.format(
        array=array, nodes=nodes, nproc=nproc_per_node, log_dir=slurm_dir / "logs",
        cwd=Path.cwd(),  # where relative paths among the options (--data ...) were meant
        extra_sbatch="".join(f"#SBATCH --{option}\n" for option in sbatch_options),
        run_list=shlex.quote(str(run_list)), train_py=shlex.quote(str(TRAIN_PY)))
    script_path = slurm_dir / f"sweep_{stamp}.sbatch"
    write_atomic(script_path, script)
    return script_path


def submit(script_path):
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise SystemExit(f"sbatch was not found on PATH, so nothing was submitted; on a SLURM "
                         f"login node run: sbatch {script_path}")
    subprocess.run([sbatch, str(script_path)], check=True)


def check_pass_through(extra_args):
    """Refuse train.py options that the grid sets itself (a typo such as --lr for --lrs)."""
    for arg in extra_args:
        option = arg.split("=", 1)[0]
        if option in GRID_OPTIONS:
            raise ValueError(f"{option} is set per run by the sweep; give the grid's axes "
                             f"instead (--sizes, --heads, --lrs, --tie, --lams, --caps, --out)")


def cmd_run(args, extra_args):
    check_pass_through(extra_args)
    runs = expand_grid(args.grid, args.sizes, args.lrs, args.heads, args.tie, args.lams, args.caps,
                       args.dtypes, args.seeds)
    extra_args = [*GRIDS[args.grid]["train_args"], *extra_args]  # the user's options win
    todo = [run for run in runs if not is_finished(Path(args.out) / run.name)]
    print(f"sweep: {len(runs)} runs in the grid, {len(runs) - len(todo)} finished, "
          f"{len(todo)} to do", flush=True)
    if args.dry_run:
        for run in todo:
            print(shlex.join(train_command(run, args.out, extra_args, args.nproc_per_node)))
        return 0
    if not todo:
        return 0
    if args.launcher == "slurm":
        script = write_slurm(todo, args.out, extra_args, args.nproc_per_node, args.nodes,
                             args.sbatch, args.array_limit)
        print(f"sweep: wrote {script} ({len(todo)} array tasks)")
        if args.submit:
            submit(script)
        else:
            print(f"sweep: submit it with: sbatch {script}")
        return 0
    if not TRAIN_PY.exists():
        raise SystemExit(f"{TRAIN_PY} is missing; sweep.py must sit next to train.py")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    try:
        failed = launch_local(todo, args.out, extra_args,
                              gpu_slots(args.gpus, args.nproc_per_node, args.jobs),
                              args.nproc_per_node)
    except KeyboardInterrupt:
        print("sweep: interrupted; run the same command again to resume", flush=True)
        return 130
    if failed:
        print(f"sweep: {len(failed)} runs failed ({', '.join(failed)}); run the same command "
              f"again to retry them", flush=True)
        return 1
    print(f"sweep: all {len(runs)} runs finished", flush=True)
    return 0


# -----------------------------------------------------------------------------
# collect: run folders -> results.csv

def write_atomic(path, text):
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _cell(value):
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value!r}" if isinstance(value, float) else str(value)


def result_row(summary_path, root):
    """One results.csv row from a run's summary.json (train.py's names, see DESIGN.md)."""
    summary = json.loads(Path(summary_path).read_text())
    needed = ("size", "head", "lr", "tie", "val_loss", "init_loss", "diverged")
    missing = [key for key in needed if key not in summary]
    if missing:
        raise ValueError(f"{summary_path} lacks {', '.join(missing)}; it was not written by "
                         f"this project's train.py")
    config_path = Path(summary_path).with_name("config.json")
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    row = {column: summary.get(column, config.get(column)) for column in RESULT_COLUMNS}
    row["test_loss"] = summary["val_loss"]  # the paper's "test loss" is our validation split
    row["mean_log2Z"] = summary.get("log2Z")  # named as in the published table
    row["run"] = str(Path(summary_path).parent.relative_to(root))
    return {column: _cell(value) for column, value in row.items()}


def collect(run_root, out_csv=None):
    """Every summary.json under run_root -> one CSV row each; written atomically."""
    run_root = Path(run_root)
    summaries = sorted(run_root.rglob("summary.json"))
    if not summaries:
        raise FileNotFoundError(f"no summary.json under {run_root}; run `python sweep.py run "
                                f"... --out {run_root}` first")
    out_csv = Path(out_csv) if out_csv else run_root / "results.csv"
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=RESULT_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(result_row(path, run_root) for path in summaries)
    write_atomic(out_csv, buffer.getvalue())
    return out_csv


# -----------------------------------------------------------------------------
# results: read a CSV and reduce it per (tying, head, λ, c, size) over the learning rates

def _number(text, empty=math.nan):
    """A CSV cell as a float; an empty cell (or a missing column) gives `empty`."""
    return float(text) if text not in ("", None) else empty


def boolean(text):
    value = str(text).strip().lower()
    if value not in ("true", "false", "1", "0"):
        raise ValueError(f"expected true or false, got {text!r}")
    return value in ("true", "1")


def read_results(path, l0=None, columns=TABLE_COLUMNS):
    """The rows of a results CSV (ours or the published one) with types and each run's L₀.

    λ and c are filled in with the paper's defaults where a head uses them and the CSV leaves
    them empty, and dropped where a head ignores them, so equal runs compare equal.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; make it with "
                                f"`python sweep.py collect DIR`")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path} has no column {', '.join(missing)}; this needs "
                             f"{', '.join(columns)} (as `sweep.py collect` writes them)")
        rows = []
        for line, raw in enumerate(reader, start=2):
            try:
                rows.append(_typed_row(raw, l0))
            except ValueError as error:
                raise ValueError(f"{path} line {line}: {error}") from None
    if not rows:
        raise ValueError(f"{path} holds no results; run the sweep and collect it first")
    return label_settings(rows)


def _typed_row(raw, l0):
    row = dict(raw)
    head = row["head"]
    row.update(lr=float(row["lr"]), tie=boolean(row["tie"]), test_loss=_number(row["test_loss"]),
               train_time_s=_number(row["train_time_s"]),
               diverged=boolean(row.get("diverged") or "false"))
    lam, cap = _number(row.get("lam"), None), _number(row.get("cap"), None)
    row["lam"] = (DEFAULT_LAM if lam is None else lam) if head in LAMBDA_HEADS else None
    row["cap"] = (DEFAULT_CAP if cap is None else cap) if head == "soft_cap" else None
    for name, _ in METRICS + PRECISION_METRICS:
        row[name] = _number(row.get(name))
    row["l0"] = _initial_loss(row, l0)
    return row


def label_settings(rows):
    """The tables' and figures' columns are the model sizes. Where the runs differ in matmul
    dtype or seed (the proxy grid), each dtype gets a column of its own ("tiny bfloat16"), and
    so does every seed but the first ("tiny bfloat16 seed1")."""
    dtypes = {row.get("dtype") or "" for row in rows}
    seeds = sorted({int(row["seed"]) for row in rows if row.get("seed") not in (None, "")})
    for row in rows:
        if len(dtypes) > 1:
            row["size"] += f" {row.get('dtype') or 'default'}"
        if row.get("seed") not in (None, "") and int(row["seed"]) != seeds[0]:
            row["size"] += f" seed{row['seed']}"
    return rows


def _initial_loss(row, l0):
    """L₀: --l0 if given, else the run's own init_loss, else the paper's value for its size."""
    if l0 is not None:
        return l0
    own = _number(row.get("init_loss"))
    if math.isfinite(own):
        return own
    if row["size"] in L0_BY_SIZE:  # the published runs: sizes only
        return L0_BY_SIZE[row["size"]]
    raise ValueError(f"no loss at initialisation for size {row['size']!r} (no init_loss value); "
                     f"pass --l0")


def capped_loss(row):
    """min(L(η), L₀), with a diverged or non-finite run counted as L₀ (Eq. 22)."""
    loss = row["test_loss"]
    if row["diverged"] or not math.isfinite(loss):
        return row["l0"]
    return min(loss, row["l0"])


def lr_sensitivity(losses, mean="published"):
    """LRS = Σ_η [L̃(η) − min_η L̃] / (n_η − 1) ('published') or / n_η ('literal', Eq. 22),
    over the capped losses L̃(η) = min(L(η), L₀) of one size, tying and variant.
    """
    n = len(losses)
    divisor = {"published": n - 1, "literal": n}[mean]
    excess = sum(loss - min(losses) for loss in losses)
    return excess / divisor if divisor else math.nan


@dataclass
class Cell:
    """One size × variant of a table: its runs reduced over the learning rates."""
    tie: bool
    head: str
    lam: float | None
    cap: float | None
    size: str
    lrs: list
    losses: list  # min(L(η), L₀) in the order of lrs
    rows: list
    optimal_loss: float
    best_lr: float
    lrs_value: float
    train_time_s: float  # mean over the runs that did not diverge

    @property
    def variant(self):
        return (self.head, self.lam, self.cap)


def reduce_runs(rows, mean="published"):
    """Group rows by (tie, head, λ, c, size) and reduce each group to a Cell."""
    groups = {}
    for row in rows:
        key = (row["tie"], row["head"], row["lam"], row["cap"], row["size"])
        group = groups.setdefault(key, {})
        if row["lr"] in group:
            raise ValueError(f"two results for {row['size']} {row['head']} lr={row['lr']:g} "
                             f"tie={row['tie']} λ={row['lam']} c={row['cap']}; keep one run "
                             f"per point")
        group[row["lr"]] = row
    cells = []
    for (tie, head, lam, cap, size), by_lr in groups.items():
        lrs = sorted(by_lr)
        runs = [by_lr[lr] for lr in lrs]
        losses = [capped_loss(row) for row in runs]
        best = min(range(len(lrs)), key=losses.__getitem__)
        times = [row["train_time_s"] for row in runs
                 if not row["diverged"] and math.isfinite(row["train_time_s"])]
        mean_time = sum(times) / len(times) if times else math.nan
        cells.append(Cell(tie, head, lam, cap, size, lrs, losses, runs, losses[best], lrs[best],
                          lr_sensitivity(losses, mean), mean_time))
    return sorted(cells, key=lambda c: (c.tie, variant_order(c.variant), size_order(c.size)))


def size_order(label):
    """Sizes by N, then a size's dtype/seed columns (setting_label) in name order."""
    size, _, rest = label.partition(" ")
    return (SIZE_ORDER.index(size), rest) if size in SIZE_ORDER else (len(SIZE_ORDER), label)


def variant_order(variant):
    head, lam, cap = variant
    return (HEADS.index(head) if head in HEADS else len(HEADS), head, lam or 0.0, cap or 0.0)


def extra_time(cell, cells):
    """Additional training time relative to the baseline of the same size and tying."""
    base = [c for c in cells if c.head == "baseline" and c.size == cell.size and c.tie == cell.tie]
    if not base or not base[0].train_time_s > 0:
        return math.nan
    return cell.train_time_s / base[0].train_time_s - 1.0


def swept_lambda_heads(cells, tie):
    """Heads run with more than one λ: they get their own Table 3 and Fig. 4."""
    lams = {}
    for cell in cells:
        if cell.tie == tie and cell.lam is not None:
            lams.setdefault(cell.head, set()).add(cell.lam)
    return [head for head in LAMBDA_HEADS if len(lams.get(head, ())) > 1]


def main_cells(cells, tie):
    """The cells of Table 2 (untied) / 6 (tied): heads swept over λ show only λ = 1e-4 there."""
    swept = swept_lambda_heads(cells, tie)
    return [c for c in cells if c.tie == tie and (c.head not in swept or c.lam == DEFAULT_LAM)]


def variant_label(variant, show_lam=False):
    head, lam, cap = variant
    if lam is not None and (show_lam or lam != DEFAULT_LAM):
        return f"{head} λ={lam:g}"
    if cap is not None and cap != DEFAULT_CAP:
        return f"{head} c={cap:g}"
    return head


# -----------------------------------------------------------------------------
# table: Markdown (the paper's layout) + CSV (one row per cell)

def _markdown_table(cells, value, fmt, best=min, show_lam=False):
    """Rows = sizes, columns = variants; the best value of each row in bold (best=None: none)."""
    variants = sorted({c.variant for c in cells}, key=variant_order)
    sizes = sorted({c.size for c in cells}, key=size_order)
    at = {(c.size, c.variant): value(c) for c in cells}
    labels = [variant_label(v, show_lam) for v in variants]
    lines = ["| N | " + " | ".join(labels) + " |", "|---" * (len(variants) + 1) + "|"]
    for size in sizes:
        values = [at.get((size, v), math.nan) for v in variants]
        finite = [x for x in values if math.isfinite(x)]
        top = fmt(best(finite)) if best and finite else None
        texts = [fmt(x) if math.isfinite(x) else "–" for x in values]
        texts = [f"**{t}**" if t == top else t for t in texts]  # ties at the shown precision too
        lines.append(f"| {size} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


LOSS, LRS = "(i) Optimal loss min_η L (↓)", "(ii) Learning rate sensitivity LRS (↓)"
TIME = "(iii) Additional training time (↓)"


def _caption(mean, l0):
    divisor = {"published": "(n_η − 1), the published tables' rule",
               "literal": "n_η, Eq. 22 as written"}[mean]
    l0_text = (f"L₀ = {l0:g} for every run" if l0 is not None else
               "L₀ = each run's loss at initialisation (init_loss; 10.83, or 10.85 for 221M, "
               "where a CSV has none)")
    return (f"LRS = Σ_η [min(L(η), L₀) − min_η L] / {divisor}; {l0_text}; a diverged run "
            f"counts as L₀. Additional training time = mean train time over the runs that did "
            f"not diverge / the baseline's − 1. Best loss and LRS per size in bold.")


def markdown_report(cells, mean="published", l0=None):
    """Table 2 (untied) / Table 6 (tied) and, for heads run with several λ, Table 3."""
    optimal, sensitivity = (lambda c: c.optimal_loss), (lambda c: c.lrs_value)
    loss_fmt, lrs_fmt = "{:.2f}".format, "{:.3f}".format
    parts = [f"# Results\n\n{_caption(mean, l0)}"]
    for tie in sorted({c.tie for c in cells}):
        tying = "with weight tying" if tie else "without weight tying"
        main = main_cells(cells, tie)
        n_lrs = "/".join(str(n) for n in sorted({len(c.lrs) for c in main}))
        parts += [f"## All variants, {tying} ({n_lrs} learning rates)",
                  LOSS, _markdown_table(main, optimal, loss_fmt),
                  LRS, _markdown_table(main, sensitivity, lrs_fmt),
                  TIME, _markdown_table(main, lambda c: 100 * extra_time(c, cells),
                                        "{:.1f}%".format, best=None)]
        for head in swept_lambda_heads(cells, tie):
            swept = [c for c in cells if c.tie == tie and c.head == head]
            parts += [f"## {head} for several λ, {tying}",
                      LOSS, _markdown_table(swept, optimal, loss_fmt, show_lam=True),
                      LRS, _markdown_table(swept, sensitivity, lrs_fmt, show_lam=True)]
    return "\n\n".join(parts) + "\n"


TABLE_CSV_COLUMNS = ("tie", "size", "head", "lam", "cap", "n_lrs", "best_lr", "optimal_loss",
                     "lrs", "lrs_mean", "train_time_s", "extra_time")


def table_csv(cells, mean="published"):
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(TABLE_CSV_COLUMNS)
    for c in cells:
        writer.writerow([_cell(v) for v in (c.tie, c.size, c.head, c.lam, c.cap, len(c.lrs),
                                            c.best_lr, c.optimal_loss, c.lrs_value, mean,
                                            c.train_time_s, extra_time(c, cells))])
    return buffer.getvalue()


def cmd_table(args):
    cells = reduce_runs(read_results(args.results, args.l0), args.lrs_mean)
    out = Path(args.out) if args.out else Path(args.results).parent
    out.mkdir(parents=True, exist_ok=True)
    markdown = markdown_report(cells, args.lrs_mean, args.l0)
    write_atomic(out / "table.md", markdown)
    write_atomic(out / "table.csv", table_csv(cells, args.lrs_mean))
    print(markdown)
    print(f"sweep: wrote {out / 'table.md'} and {out / 'table.csv'}")
    return 0


# -----------------------------------------------------------------------------
# plot: Fig. 2/8 (loss vs η per size, LRS vs size), Fig. 3 (logit statistics vs η), Fig. 4 (λ)

def _plot_loss_and_lrs(plt, cells, ref_cells, color_of, label_of, title):
    """Top row: min(L(η), L₀) vs η, one panel per size; below: LRS vs size. Dashed = paper."""
    sizes = sorted({c.size for c in cells + ref_cells}, key=size_order)
    fig = plt.figure(figsize=(3.2 * max(len(sizes), 2) + 1, 6.4))
    grid = fig.add_gridspec(2, max(len(sizes), 2))
    loss_axes = [fig.add_subplot(grid[0, i]) for i in range(len(sizes))]
    lrs_ax = fig.add_subplot(grid[1, :2])
    for source, style in ((cells, SOLID), (ref_cells, DASHED)):
        suffix = " (paper)" if source is ref_cells else ""
        for c in source:
            loss_axes[sizes.index(c.size)].plot(c.lrs, c.losses, color=color_of(c),
                                                label=label_of(c) + suffix, **style)
        for variant in sorted({c.variant for c in source}, key=variant_order):
            line = sorted((c for c in source if c.variant == variant),
                          key=lambda c: size_order(c.size))
            lrs_ax.plot([sizes.index(c.size) for c in line], [c.lrs_value for c in line],
                        color=color_of(line[0]), label=label_of(line[0]) + suffix, **style)
    for ax, size in zip(loss_axes, sizes):
        losses = [loss for c in cells + ref_cells if c.size == size for loss in c.losses]
        # zoom on the optimum: up to 30% above it, the region the paper's Fig. 2 shows
        low, high = min(losses), min(max(losses), 1.3 * min(losses))
        pad = 0.05 * (high - low) or 0.05
        ax.set(xscale="log", title=size, xlabel="learning rate η", ylim=(low - pad, high + pad))
        ax.grid(alpha=0.3)
    loss_axes[0].set_ylabel("loss min(L, L₀)")
    loss_axes[0].legend(fontsize=7)
    positive = all(c.lrs_value > 0 for c in cells + ref_cells)  # a log axis must show them all
    lrs_ax.set(xticks=range(len(sizes)), xticklabels=sizes, xlabel="model size N", ylabel="LRS",
               yscale="log" if positive else "linear")
    lrs_ax.grid(alpha=0.3)
    lrs_ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _plot_metrics(plt, cells, ref_cells, title):
    """Fig. 3: logit mean, logit std, ‖μ‖ and max |l| vs η, and the precision metrics where the
    runs logged them; rows = metrics, columns = sizes."""
    sizes = sorted({c.size for c in cells + ref_cells}, key=size_order)
    metrics = METRICS + tuple(m for m in PRECISION_METRICS
                              if any(math.isfinite(r[m[0]]) for c in cells for r in c.rows))
    fig, axes = plt.subplots(len(metrics), len(sizes), figsize=(3.2 * len(sizes) + 1,
                                                                2.5 * len(metrics)), squeeze=False)
    for source, style in ((cells, SOLID), (ref_cells, DASHED)):
        suffix = " (paper)" if source is ref_cells else ""
        for c in source:
            for i, (metric, _) in enumerate(metrics):
                axes[i][sizes.index(c.size)].plot(c.lrs, [row[metric] for row in c.rows],
                                                  color=HEAD_COLORS.get(c.head, "k"),
                                                  label=variant_label(c.variant) + suffix, **style)
    for i, (metric, label) in enumerate(metrics):
        for j, size in enumerate(sizes):
            ax = axes[i][j]
            values = [abs(r[metric]) for c in cells + ref_cells if c.size == size for r in c.rows]
            # the baseline's values grow by orders of magnitude while μ-centering's stay at 0:
            # symlog (linear within ±1) shows both, where the range calls for it
            if max(filter(math.isfinite, values), default=0.0) > 50:
                ax.set_yscale("symlog", linthresh=1.0)
            ax.set_xscale("log")
            ax.grid(alpha=0.3)
            if i == 0:
                ax.set_title(size)
            if i == len(metrics) - 1:
                ax.set_xlabel("learning rate η")
        axes[i][0].set_ylabel(label)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _save(fig, out, stem):
    """PNG and PDF, each written to a temp file and renamed, so no half-written figure stays."""
    paths = []
    for ext in ("png", "pdf"):
        path = out / f"{stem}.{ext}"
        tmp = out / f".{stem}.tmp{os.getpid()}.{ext}"
        fig.savefig(tmp, dpi=120)
        os.replace(tmp, path)
        paths.append(path)
    return paths


def make_figures(cells, ref_cells, out):
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for tie in sorted({c.tie for c in cells}):
        tying = "tied" if tie else "untied"
        ours, ref = main_cells(cells, tie), main_cells(ref_cells, tie) if ref_cells else []
        head_color = lambda c: HEAD_COLORS.get(c.head, "k")
        fig = _plot_loss_and_lrs(plt, ours, ref, head_color, lambda c: variant_label(c.variant),
                                 f"Loss vs learning rate and LRS vs size ({tying})")
        written += _save(fig, out, f"fig2_loss_lrs_{tying}")
        fig = _plot_metrics(plt, ours, ref, f"Logit statistics, ‖μ‖ vs learning rate ({tying})")
        written += _save(fig, out, f"fig3_logits_{tying}")
        for head in swept_lambda_heads(cells, tie):
            ours_lam = [c for c in cells if c.tie == tie and c.head == head]
            ref_lam = [c for c in ref_cells if c.tie == tie and c.head == head]
            lams = sorted({c.lam for c in ours_lam + ref_lam})
            lam_color = lambda c: plt.get_cmap("viridis")(
                0.9 * lams.index(c.lam) / max(len(lams) - 1, 1))
            fig = _plot_loss_and_lrs(plt, ours_lam, ref_lam, lam_color, lambda c: f"λ={c.lam:g}",
                                     f"{head}: λ sensitivity ({tying})")
            written += _save(fig, out, f"fig4_lambda_{head}_{tying}")
        plt.close("all")
    return written


def cmd_plot(args):
    columns = TABLE_COLUMNS + tuple(name for name, _ in METRICS)  # Fig. 3 needs the metrics
    cells = reduce_runs(read_results(args.results, args.l0, columns), args.lrs_mean)
    ref_cells = (reduce_runs(read_results(args.reference, columns=columns), args.lrs_mean)
                 if args.reference else [])
    out = Path(args.out) if args.out else Path(args.results).parent
    for path in make_figures(cells, ref_cells, out):
        print(f"sweep: wrote {path}")
    return 0


CURVES = (("loss", "training loss"), ("val_loss", "validation loss"), ("mu_norm", "‖μ‖"),
          ("logit_mean", "logit mean  l̄"), ("logit_absmax", "max |l|"),
          ("prec_err_cast", "input rounding / σ_l"), ("prec_err_round", "result rounding / σ_l"),
          ("prec_ce_gap", "CE gap (nats)"))


def read_log(run_dir):
    """The records of a run's log.jsonl, in step order."""
    path = Path(run_dir) / "log.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; give run folders written by train.py")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def cmd_curves(args):
    """Curves over training of a few runs (log.jsonl): the quantities of CURVES vs step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    logs = {Path(run).name: read_log(run) for run in args.runs}
    fig, axes = plt.subplots(2, (len(CURVES) + 1) // 2, figsize=(16, 7), squeeze=False)
    for ax, (key, label) in zip(axes.flat, CURVES):
        for name, records in logs.items():
            points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
            if points:
                ax.plot(*zip(*points), label=name, lw=1)
        if key in ("mu_norm", "logit_absmax"):
            ax.set_yscale("symlog", linthresh=1.0)
        ax.set(title=label, xlabel="step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for path in _save(fig, out.parent, out.stem):
        print(f"sweep: wrote {path}")
    return 0


# -----------------------------------------------------------------------------
# command line

def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip(),
                                     allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", allow_abbrev=False,
                              help="launch a grid of train.py runs "
                                   "(unknown options go to train.py)")
    run.add_argument("--grid", required=True, choices=tuple(GRIDS))
    run.add_argument("--sizes", nargs="+", help="model sizes (paper: 16M 29M 57M 109M 221M)")
    run.add_argument("--lrs", nargs="+", type=float, help="learning rates (paper: 3e-4 ... 3e-1)")
    run.add_argument("--heads", nargs="+", help=f"heads among {', '.join(HEADS)}")
    run.add_argument("--tie", nargs="+", type=boolean, help="weight tying: false, true or both")
    run.add_argument("--lams", nargs="+", type=float, help="λ for z_loss and mu_loss")
    run.add_argument("--caps", nargs="+", type=float, help="c for soft_cap")
    run.add_argument("--dtypes", nargs="+", choices=("float32", "bfloat16"),
                     help="train.py --dtype of each run (proxy: both)")
    run.add_argument("--seeds", nargs="+", type=int, help="train.py --seed of each run")
    run.add_argument("--out", required=True, help="folder that holds one run folder per point")
    run.add_argument("--launcher", choices=("local", "slurm"), default="local")
    run.add_argument("--gpus", help="local: GPU ids to run on at once, e.g. 0,1,2,3 "
                                    "(each run gets --nproc_per_node of them)")
    run.add_argument("--jobs", type=int, default=1,
                     help="local, without --gpus: runs at once (CPU: one per core)")
    run.add_argument("--nproc_per_node", type=int, default=1,
                     help="processes (GPUs) per run; >1 uses torchrun")
    run.add_argument("--nodes", type=int, default=1, help="slurm: nodes per run")
    run.add_argument("--sbatch", nargs="+", default=[], metavar="KEY=VALUE",
                     help="slurm: extra #SBATCH options without the dashes, "
                          "e.g. partition=gpu time=2-00:00:00")
    run.add_argument("--array_limit", type=int, default=0,
                     help="slurm: at most this many tasks at once (0: no limit)")
    run.add_argument("--submit", action="store_true", help="slurm: submit the script with sbatch")
    run.add_argument("--dry_run", action="store_true",
                     help="print the commands of the runs to do, run nothing")
    gather = commands.add_parser("collect", help="every summary.json under DIR -> DIR/results.csv")
    gather.add_argument("dir")
    gather.add_argument("--out", help="CSV path (default DIR/results.csv)")
    for name, text in (("table", "optimal loss, LRS and extra training time as Markdown + CSV"),
                       ("plot", "the paper's Fig. 2/3/4/8 as PNG + PDF")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("results", help="a results CSV (from collect, or the published runs)")
        sub.add_argument("--out", help="output folder (default: the CSV's folder)")
        sub.add_argument("--lrs_mean", choices=("published", "literal"), default="published",
                         help="divide the LRS sum by n_η − 1 (published tables) "
                              "or n_η (Eq. 22)")
        sub.add_argument("--l0", type=float, help="loss at initialisation for every run "
                                                  "(default: init_loss, else 10.83/10.85 by size)")
        if name == "plot":
            sub.add_argument("--reference",
                             help="a CSV of the paper's runs to draw beside ours (dashed)")
    curves = commands.add_parser("curves", help="loss, ‖μ‖, logits and precision vs step of "
                                                "some runs, as PNG + PDF")
    curves.add_argument("runs", nargs="+", help="run folders (with log.jsonl)")
    curves.add_argument("--out", required=True, help="figure path without extension")
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "run":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "run" and min(args.nproc_per_node, args.jobs) < 1:
        parser.error("--nproc_per_node and --jobs must be at least 1")
    return args, extra


def main(argv=None):
    args, extra = parse_args(argv)
    try:
        if args.command == "run":
            return cmd_run(args, extra)
        if args.command == "collect":
            print(f"sweep: wrote {collect(args.dir, args.out)}")
            return 0
        commands = {"table": cmd_table, "plot": cmd_plot, "curves": cmd_curves}
        return commands[args.command](args)
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"sweep {args.command}: {error}") from None


if __name__ == "__main__":
    sys.exit(main())

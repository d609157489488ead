"""sweep.py — the paper's experiments as grids of train.py runs, and the commands that turn their
results into the paper's tables and figures (drawn by report.py); README's More commands and
scripts/README.md's Sweeps on SLURM have examples.

Options sweep.py does not know go to train.py after the grid's own, so they win. A point is a run
folder OUT/Run.name, finished once it has summary.json: the same command again skips it, resumes
the others and, before anything starts, refuses folders of other settings.
"""
import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from itertools import product, takewhile
from pathlib import Path

import report
import store
from model import SIZES
from report import DEFAULT_CAP, DEFAULT_LAM, HEADS, LAMBDA_HEADS, PAPER_SIZES

# ---- The grids: the paper's (Eq. 19–21, 23) and the CPU proxy ------------------------------
PAPER_LRS = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
LAMBDAS = (1e-7, 1e-4, 1e-1, 1e2)
# The paper's code draws each batch from a random shard at random windows, seeded: its grids too.
PAPER_TRAIN_ARGS = ("--data_order", "random")
# The CPU proxy (experiments/proxy): a short run needs η up to 1 for ‖μ‖ to come near the paper's
# baselines at η = 3e-2 (56.652–79.721): its untied baselines reach 45.15–56.50 at η = 1, 33.07–
# 36.93 at 0.3 (experiments/proxy/results/results.csv). Its committed runs read the text in
# order: it keeps that order.
PROXY_LRS = (1e-2, 3e-2, 1e-1, 3e-1, 1.0)
PROXY_TRAIN_ARGS = tuple("--device cpu --steps 300 --warmup 15 --batch_size 4 --micro_batch 4 "
                        "--seq_len 64 --loss_chunk 256 --eval_every 100 --eval_tokens 8192 "
                        "--stat_tokens 4096 --log_every 20 --data data/shakespeare "
                        "--data_order sequential".split())
AXES = ("sizes", "lrs", "heads", "ties", "lams", "caps", "dtypes", "seeds")  # --tie gives ties
GRID_DEFAULTS = dict(tied_heads=None, dtypes=(None,), seeds=(None,), train_args=())
PAPER_GRID = dict(GRID_DEFAULTS, sizes=PAPER_SIZES, lrs=PAPER_LRS, caps=(DEFAULT_CAP,),
                  train_args=PAPER_TRAIN_ARGS)
GRIDS = {  # custom: the command line gives sizes, lrs and heads
    "paper": dict(PAPER_GRID, heads=HEADS, ties=(False, True), lams=(DEFAULT_LAM,)),
    "lambda": dict(PAPER_GRID, heads=LAMBDA_HEADS, ties=(False,), lams=LAMBDAS),
    "proxy": dict(sizes=("tiny",), lrs=PROXY_LRS, heads=HEADS, ties=(False, True),
                  tied_heads=("baseline", "mu_center"), lams=(DEFAULT_LAM,), caps=(DEFAULT_CAP,),
                  dtypes=("float32", "bfloat16"), seeds=(0,), train_args=PROXY_TRAIN_ARGS),
    "custom": dict(GRID_DEFAULTS, ties=(False,), lams=(None,), caps=(None,)),
}
TRAIN_PY = Path(__file__).resolve().with_name("train.py")
# train.py's options sweep.py sets per run (config.json names): passing one is an error
GRID_OPTIONS = ("size", "head", "lr", "tie", "lam", "cap", "dtype", "seed", "out_dir", "resume")
SCHEDULING = ("log_every", "save_every", "keep_every", "stop_at")  # not what a run computes
POLL_S = 0.2  # how often the local launcher looks for finished runs
USAGE_ERROR = 2  # argparse's exit code: train.py did not accept its options
RESULT_COLUMNS = tuple("size lr head lam cap tie dtype seed test_loss init_loss diverged mu_norm "
                       "logit_mean logit_std logit_absmax mean_log2Z prec_ce_gap prec_err_cast "
                       "prec_err_round h_mu_proj h_mu_cos steps tokens train_time_s run".split())


def short(x):
    """x with the fewest significant digits (6 or more, as :g) that give x back exactly."""
    for digits in range(6, 18):
        if float(text := f"{x:.{digits}g}") == x:
            return text
    return repr(x)  # NaN


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

    def _given(self):  # (field, value) of lam, cap, dtype and seed where not train.py's default
        return [(field, value) for field, value in asdict(self).items()
                if field not in ("size", "head", "lr", "tie") and value is not None]

    @property
    def name(self):
        """{size}_{head}_lr{η}_tie{0|1}[_lam{λ}][_cap{c}][_{dtype}][_seed{n}]."""
        return f"{self.size}_{self.head}_lr{short(self.lr)}_tie{int(self.tie)}" + "".join(
            f"_{'' if field == 'dtype' else field}{short(v) if isinstance(v, float) else v}"
            for field, v in self._given())

    def train_args(self):
        """train.py's options for this point; numbers in full (str(float) is repr)."""
        args = ["--size", self.size, "--head", self.head, "--lr", str(self.lr)]
        args += ["--tie"] * self.tie
        return args + [arg for field, value in self._given() for arg in (f"--{field}", str(value))]


def expand_grid(grid, **given):
    """Every point of a grid, an axis given (AXES) replacing the grid's own: paper 7 η × 5 sizes ×
    2 ties × 5 heads = 350 runs, λ 4 × 2 × 7 × 5 = 280, proxy 5 η × 2 dtypes × (5 + 2 tied) = 70."""
    if grid not in GRIDS:
        raise ValueError(f"unknown grid {grid!r}; choose one of {', '.join(GRIDS)}")
    axes = {**GRIDS[grid], **{axis: tuple(values) for axis, values in given.items() if values}}
    check_axes(grid, axes)
    points = product(*(axes[axis] for axis in ("sizes", "heads", "ties", "dtypes", "seeds", "lrs")))
    runs = [Run(size, head, lr, tie, lam, cap, dtype, seed)
            for size, head, tie, dtype, seed, lr in points
            if not tie or head in (axes["tied_heads"] or axes["heads"])
            for lam in (axes["lams"] if head in LAMBDA_HEADS else (None,))
            for cap in (axes["caps"] if head == "soft_cap" else (None,))]
    return list(dict.fromkeys(runs))  # repeated axis values would only repeat runs


def check_axes(grid, axes):
    """Refuse a grid with a missing axis, an unknown head or bad values (all named at once)."""
    if missing := [f"--{axis}" for axis in ("sizes", "lrs", "heads") if not axes.get(axis)]:
        raise ValueError(f"--grid {grid} needs {', '.join(missing)} (e.g. --sizes tiny "
                         f"--lrs 1e-3 3e-3 --heads baseline mu_center)")
    if unknown := [head for head in axes["heads"] if head not in HEADS]:
        raise ValueError(f"unknown head {unknown[0]!r}; choose from {', '.join(HEADS)}")
    problems = []
    if unknown := [size for size in axes["sizes"] if size not in SIZES]:
        problems.append(f"--sizes {' '.join(unknown)} (each must be one of {', '.join(SIZES)})")
    for axis, setting in (("lrs", "lr"), ("lams", "lam"), ("caps", "cap")):
        rule, valid = report.RULES[setting]
        if bad := [v for v in axes[axis] if v is not None and not valid(v)]:
            problems.append(f"--{axis} {' '.join(map(short, bad))} (each must be {rule})")
    if bad := [str(seed) for seed in axes["seeds"] if seed is not None and not 0 <= seed < 2**64]:
        problems.append(f"--seeds {' '.join(bad)} (each must be an integer from 0 to 2^64 − 1)")
    if problems:
        raise ValueError(f"nothing was started, as the grid has bad values: {'; '.join(problems)}")


# ---- Run folders: a run's log, which are finished, do they hold what was asked -------------
def json_object(path, missing=None):
    """The dict a JSON file holds (missing, if given, where none); anything else (a pipe) fails."""
    if missing is not None and not Path(path).exists():
        return missing
    with contextlib.suppress(ValueError):  # not UTF-8, not JSON
        if Path(path).is_file() and isinstance(value := json.loads(Path(path).read_text()), dict):
            return value
    raise ValueError(f"{path} is not a JSON object; it was not written by this project's train.py")


def read_log(run_dir):
    path = report.regular_file(Path(run_dir) / "log.jsonl", "give run folders of train.py")
    try:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except ValueError:
        raise ValueError(f"{path} is not a log of train.py (a line is not JSON)") from None
    if not records:
        raise ValueError(f"{path} is empty: the run has not logged a step yet; wait, or omit it")
    if not all(isinstance(r, dict) and "step" in r and "loss" in r for r in records):
        raise ValueError(f"{path} is not a log of train.py (a line is not a JSON object with "
                         f"'step' and 'loss')")
    return records


def is_finished(run_dir):  # a diverged run too
    return (Path(run_dir) / "summary.json").exists()


def passed_settings(train_args):
    """train.py's options as {config.json name: value}: --flag True, --no-flag False, several
    values (--data a.txt b.txt) a list; the last of a repeated option wins."""
    settings = {}
    for i, arg in enumerate(train_args):
        if not arg.startswith("--"):
            continue  # a value of the option before it
        option, has_value, value = arg[2:].partition("=")
        if not has_value:
            values = list(takewhile(lambda a: not a.startswith("--"), train_args[i + 1:]))
            value = True if not values else values[0] if len(values) == 1 else values
        if value is True and option.startswith("no-"):
            option, value = option[3:], False
        settings[option.replace("-", "_")] = value
    return settings


def _paths(value):  # --data's value (one path or several) as a list
    return [value] if isinstance(value, str) else value if isinstance(value, list) else []


def same_setting(name, asked, recorded):
    """Whether config.json's value is the one asked (asked may be the command line's text)."""
    if isinstance(asked, bool) or isinstance(recorded, bool) or recorded is None:
        return asked == recorded
    if isinstance(recorded, (int, float)):
        with contextlib.suppress(ValueError):  # else asked is not a number
            return (asked if isinstance(asked, (int, float)) else float(asked)) == recorded
        return False
    if name == "data":  # the same folder or text files however their paths are written
        return ([os.path.realpath(p) for p in _paths(asked)]
                == [os.path.realpath(p) for p in _paths(recorded)])
    return str(asked) == str(recorded)


def differences(run_dir, run, passed):
    """In words, the settings of run (None: train.py's default) and passed that differ in run_dir's
    config.json ([] if none); Run's fields are config.json's names."""
    config_path = Path(run_dir) / "config.json"
    if not config_path.exists():
        return ["no config.json beside its summary.json"] if is_finished(run_dir) else []
    try:
        config = json_object(config_path)
    except ValueError:
        return ["a config.json that is not a JSON object"]
    if config.get("text"):  # text files given as --data: "data" is their tokenized folder
        config["data"] = config["text"]
    asked = {**{name: value for name, value in asdict(run).items() if value is not None}, **passed}
    return [f"{name} {config[name]} there, {value} asked" for name, value in asked.items()
            if name in config and not same_setting(name, value, config[name])]


def check_run_folders(runs, out, train_args):
    """Refuse folders holding runs of other settings (but scheduling, and train.py's "auto")."""
    passed = {name: value for name, value in passed_settings(train_args).items()
              if name not in SCHEDULING and value != "auto"}
    stale = {run.name: found for run in runs
             if (found := differences(Path(out) / run.name, run, passed))}
    if stale:
        name, found = next(iter(stale.items()))
        raise ValueError(f"{len(stale)} run folder(s) in {out} hold runs of other settings than "
                         f"asked (e.g. {name}: {'; '.join(found)}), so they cannot count as "
                         f"finished; give another --out for these settings, or move those "
                         f"folders away to redo them")


def check_out(out):
    """Refuse an --out that is a file, lies under one or cannot be written; creates nothing."""
    out = Path(out)
    existing = next(path for path in (out, *out.parents) if path.exists())
    if not existing.is_dir():
        where = "is a file" if existing == out else f"lies under the file {existing}"
        raise ValueError(f"--out {out} {where}; give a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out} cannot be written ({existing} is read-only); give "
                         f"another --out")


# ---- Launching: locally (one or several at a time) or as a SLURM job array -----------------
def train_command(run, out, extra_args, nproc_per_node=1):
    """The command line of one local run; --resume where an earlier attempt left files (killed
    before its first checkpoint, it left config.json: train.py then starts at step 0)."""
    run_dir = Path(out) / run.name
    args = [str(TRAIN_PY), *run.train_args(), "--out_dir", str(run_dir), *extra_args]
    args += ["--resume"] if run_dir.is_dir() and any(run_dir.iterdir()) else []
    if nproc_per_node > 1:  # torchrun picks a free port itself with --standalone
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc_per_node={nproc_per_node}", *args]
    return [sys.executable, *args]


def gpu_slots(gpus, nproc_per_node, jobs=1):
    """CUDA_VISIBLE_DEVICES of each run that may go at once (None: --jobs runs share the CPU)."""
    if not gpus:
        return [None] * jobs
    ids = [gpu.strip() for gpu in gpus.split(",") if gpu.strip()]
    if not ids or len(ids) % nproc_per_node:
        raise ValueError(f"--gpus {gpus} must list a multiple of --nproc_per_node="
                         f"{nproc_per_node} GPU ids, e.g. --gpus 0,1,2,3")
    return [",".join(ids[i:i + nproc_per_node]) for i in range(0, len(ids), nproc_per_node)]


def _start(run, cmd, slot, out, n_slots):
    """Start one run: with one slot it prints to this terminal, else to OUT/logs/NAME.log."""
    env = dict(os.environ, **({"CUDA_VISIBLE_DEVICES": slot} if slot else {}))
    if n_slots > 1 and not slot:  # CPU runs side by side: an equal share of the cores each
        env.setdefault("OMP_NUM_THREADS", str(max(1, os.cpu_count() // n_slots)))
    print(f"sweep: start {run.name}{' (resume)' if '--resume' in cmd else ''}"
          f"{f' on GPU {slot}' if slot else ''}", flush=True)
    if n_slots == 1:
        return subprocess.Popen(cmd, env=env)
    (Path(out) / "logs").mkdir(exist_ok=True)
    with open(Path(out) / "logs" / f"{run.name}.log", "a") as log:  # the run holds its own copy
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)


def launch_local(commands, out, slots):
    """Run {run: command}, len(slots) at once; the failed ones' names. An interrupt stops all."""
    pending, running, failed, free, durations = list(commands), {}, [], list(slots), []
    on_sigint = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # the way out of Ctrl-C
    try:
        while pending or running:
            while pending and free:
                run, slot = pending.pop(0), free.pop(0)
                proc = _start(run, commands[run], slot, out, len(slots))
                running[proc] = (run, slot, time.time())
            time.sleep(POLL_S)
            for proc in [p for p in running if p.poll() is not None]:
                run, slot, started = running.pop(proc)
                free.append(slot)
                ok = proc.returncode == 0 and is_finished(Path(out) / run.name)
                durations.append(time.time() - started)
                left = len(pending) + len(running)
                eta = sum(durations) / len(durations) * left / len(slots)
                print(f"sweep: {'done' if ok else f'FAILED (exit {proc.returncode})'} {run.name} "
                      f"in {durations[-1]:.0f} s; {len(commands) - left}/{len(commands)} ended, "
                      f"ETA {eta / 60:.0f} min", flush=True)
                failed += [] if ok else [run.name]
                if proc.returncode == USAGE_ERROR and pending:  # the others would fail alike
                    where = Path(out) / "logs" / f"{run.name}.log" if len(slots) > 1 else None
                    print(f"sweep: train.py refused its command line ({where or 'see above'}); "
                          f"the other {len(pending)} runs were not started", flush=True)
                    failed += [run.name for run in pending]
                    pending.clear()
    except BaseException:  # Ctrl-C, SIGTERM, a closed stdout: stop the runs in flight
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut this short
        for proc in running:
            proc.terminate()
            proc.wait()
        raise
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, on_sigint)
    return failed


SBATCH_TEMPLATE = """#!/bin/bash
# train.py runs as a SLURM job array (written by sweep.py): task i runs line i (0-based) of
# RUN_LIST, "RUN_DIR TRAIN_ARGS...", one torch.distributed.run per node with the Python that ran
# sweep.py, meeting --standalone on one node (a rendezvous of its own), else via c10d on the
# first node (this script's) on a port free there as the task starts, under the task's job id.
#SBATCH --job-name=oec-sweep
#SBATCH --array={array}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
{sbatch_lines}set -euo pipefail
RUN_LIST={run_list}
eval "RUN=($(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" "$RUN_LIST"))"
RUN_DIR="${{RUN[0]}}"
if [ -f "$RUN_DIR/summary.json" ]; then echo "$RUN_DIR is finished"; exit 0; fi
RESUME=""; if [ -n "$(ls -A "$RUN_DIR" 2>/dev/null)" ]; then RESUME="--resume"; fi
RDZV=(--standalone)
if [ "$SLURM_JOB_NUM_NODES" != 1 ]; then
    # no pipe into head: under pipefail the SIGPIPE scontrol would get (exit 141) ends the task
    NODES=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
    PORT=$({python} -c 'import socket; print(socket.create_server(("", 0)).getsockname()[1])')
    RDZV=(--nnodes="$SLURM_JOB_NUM_NODES" --rdzv_backend=c10d --rdzv_id="$SLURM_JOB_ID"
          --rdzv_endpoint="${{NODES%%$'\\n'*}}:$PORT")
fi
srun --ntasks-per-node=1 {python} -m torch.distributed.run "${{RDZV[@]}}" \\
    --nproc_per_node={nproc} {train_py} "${{RUN[@]:1}}" --out_dir "$RUN_DIR" $RESUME
"""


def partition_has_gpus(partition):
    """Whether sinfo lists GPU GRES on a node of partition (None: the default; no sinfo: no)."""
    listed = subprocess.run(["sinfo", "-h", "-o", "%P %G"], capture_output=True,
                            text=True).stdout if shutil.which("sinfo") else ""
    return any("gpu" in gres for name, _, gres in (row.partition(" ") for row in listed.split("\n"))
               if (name.rstrip("*") in partition.split(",") if partition else name.endswith("*")))


def sbatch_lines(args, log_dir):
    """#SBATCH lines of the task's output, the working folder (where relative paths among the
    options were meant) and --sbatch, quoted as sbatch unquotes them; GPUs, --nproc_per_node per
    node, where the partition has them and --sbatch names none."""
    asked = dict(option.partition("=")[::2] for option in args.sbatch)  # a bare KEY: ""
    options = {"output": str(log_dir / "%A_%a.out"), "chdir": str(Path.cwd())}
    if not any(key == "gres" or key.startswith("gpu") for key in asked) and partition_has_gpus(
            asked.get("partition")):
        options["gpus-per-node"] = str(args.nproc_per_node)
    return "".join(f"#SBATCH --{key}{value and '=' + shlex.quote(value)}\n"
                   for key, value in {**options, **asked}.items())


def write_slurm(runs, args, extra_args):
    """OUT/slurm/runs_STAMP.txt and sweep_STAMP.sbatch, new per call: a queued job's list stays."""
    slurm_dir = Path(args.out).resolve() / "slurm"
    (slurm_dir / "logs").mkdir(parents=True, exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    run_list, script = slurm_dir / f"runs_{stamp}.txt", slurm_dir / f"sweep_{stamp}.sbatch"
    store.write_atomic(run_list, "".join(shlex.join([str(slurm_dir.parent / run.name),
                       *run.train_args(), *extra_args]) + "\n" for run in runs))
    store.write_atomic(script, SBATCH_TEMPLATE.format(
        array=f"0-{len(runs) - 1}" + (f"%{args.array_limit}" if args.array_limit else ""),
        nodes=args.nodes, nproc=args.nproc_per_node, run_list=shlex.quote(str(run_list)),
        sbatch_lines=sbatch_lines(args, slurm_dir / "logs"), python=shlex.quote(sys.executable),
        train_py=shlex.quote(str(TRAIN_PY))))
    return script


def submit(script):
    """sbatch's job id for script, which it first checks (--test-only) against the cluster: a job
    it refuses or can never run (more nodes than a partition has) ends in one sentence."""
    for check in ("--test-only", "--parsable"):
        done = subprocess.run(["sbatch", check, str(script)], capture_output=True, text=True)
        # sbatch's own words, less the "Try sbatch --help" after an option it does not know
        reason = "; ".join(line.removeprefix("sbatch: ").removeprefix("error: ") for line in
                           done.stderr.splitlines() if line.strip() and not line.startswith("Try "))
        if done.returncode:
            raise ValueError(f"sbatch refused the job ({reason or f'exit {done.returncode}'}), so "
                             f"nothing was submitted; change --sbatch, --nodes or --nproc_per_node"
                             f" to what the cluster offers (sinfo lists its partitions)")
    return done.stdout.split(";")[0].strip()  # --parsable prints JOBID[;CLUSTER]


def cmd_run(args, extra_args):
    if clash := [name for name in passed_settings(extra_args) if name in GRID_OPTIONS]:
        raise ValueError(f"--{clash[0]} is set per run by the sweep; give the grid's axes instead "
                         f"(--sizes, --heads, --lrs, --tie, --lams, --caps, --out)")
    runs = expand_grid(args.grid, **{axis: getattr(args, axis) for axis in AXES})
    extra_args = [*GRIDS[args.grid]["train_args"], *extra_args]  # the user's options win
    check_out(args.out)
    check_run_folders(runs, args.out, extra_args)
    todo = [run for run in runs if not is_finished(Path(args.out) / run.name)]
    print(f"sweep: {len(runs)} runs in the grid, {len(runs) - len(todo)} finished, "
          f"{len(todo)} to do", flush=True)
    commands = {run: train_command(run, args.out, extra_args, args.nproc_per_node) for run in todo}
    if args.dry_run:
        for command in commands.values():
            print(shlex.join(command))
        data = _paths(passed_settings(extra_args).get("data"))
        if todo and (missing := [path for path in data if not Path(path).exists()]):
            print(f"sweep: note: --data {' '.join(missing)} does not exist yet; the runs fail "
                  f"until it does (make it with prepare.py)")
    elif todo and args.launcher == "slurm":
        script = write_slurm(todo, args, extra_args)
        print(f"sweep: wrote {script} ({len(todo)} array tasks)")
        if not args.submit:
            print(f"sweep: submit it with: sbatch {script}")
        elif not shutil.which("sbatch"):
            raise SystemExit(f"sbatch was not found on PATH, so nothing was submitted; on a "
                             f"SLURM login node run: sbatch {script}")
        else:
            print(f"sweep: submitted job {submit(script)}; its tasks write to "
                  f"{script.parent / 'logs'}; run the same command again to resume runs cut short")
    elif todo:
        if not TRAIN_PY.exists():
            raise SystemExit(f"{TRAIN_PY} is missing; sweep.py must sit next to train.py")
        slots = gpu_slots(args.gpus, args.nproc_per_node, args.jobs)
        try:
            failed = launch_local(commands, store.make_folder(args.out), slots)
        except KeyboardInterrupt:
            print("sweep: interrupted; run the same command again to resume", flush=True)
            return 130
        if failed:
            print(f"sweep: {len(failed)} runs failed ({', '.join(failed)}); run the same command "
                  f"again to retry them", flush=True)
            return 1
        print(f"sweep: all {len(runs)} runs finished", flush=True)
    return 0


# ---- collect, table, plot, curves: report.py's text and figures, written atomically ---------
def save_figure(fig, folder, stem):  # FOLDER/STEM.png and .pdf, each whole or not there
    for path in (Path(folder) / f"{stem}.png", Path(folder) / f"{stem}.pdf"):
        with store.open_atomic(path) as f:
            fig.savefig(f, format=path.suffix[1:], dpi=120)
        print(f"sweep: wrote {path}")


def cmd_collect(args):
    """Every summary.json under DIR -> a results CSV (settings it lacks: its config.json)."""
    summaries = sorted(Path(args.dir).rglob("summary.json"))
    if not summaries:
        raise FileNotFoundError(f"no summary.json under {args.dir}; run `python sweep.py run "
                                f"... --out {args.dir}` first")
    rows = []
    for path in summaries:
        summary = json_object(path)
        needed = ("size", "head", "lr", "tie", "val_loss", "init_loss", "diverged")
        if missing := [key for key in needed if key not in summary]:
            raise ValueError(f"{path} lacks {', '.join(missing)}; it was not written by this "
                             f"project's train.py")
        config = json_object(path.with_name("config.json"), missing={})
        row = {column: summary.get(column, config.get(column)) for column in RESULT_COLUMNS}
        row.update(test_loss=summary["val_loss"], mean_log2Z=summary.get("log2Z"),  # the paper's
                   run=str(path.parent.relative_to(args.dir)))                     # names
        rows.append(row.values())
    out_csv = Path(args.out or Path(args.dir) / "results.csv")
    store.write_atomic(out_csv, report.csv_text(RESULT_COLUMNS, rows))
    print(f"sweep: wrote {out_csv}")


def cmd_table(args):  # prints the tables; writes them only into --out (not beside tests/data)
    cells = report.reduce_runs(report.read_results(args.results, args.l0), args.lrs_mean)
    markdown = report.markdown_report(cells, args.lrs_mean, args.l0)
    print(markdown)
    if not args.out:
        print("sweep: pass --out DIR to write table.md and table.csv")
        return
    out = store.make_folder(args.out)
    store.write_atomic(out / "table.md", markdown)
    store.write_atomic(out / "table.csv", report.table_csv(cells, args.lrs_mean))
    print(f"sweep: wrote {out / 'table.md'} and {out / 'table.csv'}")


def cmd_plot(args):
    columns = report.TABLE_COLUMNS + tuple(name for name, _ in report.METRICS)  # Fig. 3's too
    cells = report.reduce_runs(report.read_results(args.results, args.l0, columns), args.lrs_mean)
    ref_cells = report.reduce_runs(report.read_results(args.reference, columns=columns),
                                   args.lrs_mean) if args.reference else []
    out = store.make_folder(args.out or Path(args.results).parent)
    for stem, fig in report.figures(cells, ref_cells):
        save_figure(fig, out, stem)


def cmd_curves(args):  # report.CURVES vs step of a few runs; config.json names their heads
    logs = {run: read_log(run) for run in args.runs}
    configs = {run: json_object(Path(run) / "config.json", missing={}) for run in args.runs}
    save_figure(report.curves_figure(logs, configs), store.make_folder(args.out), args.name)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", allow_abbrev=False,
                              help="launch a grid of train.py runs (other options go to train.py)")
    run.add_argument("--grid", required=True, choices=tuple(GRIDS))
    for option, kind, text in (("--sizes", str, "model sizes (paper: 16M 29M 57M 109M 221M)"),
                               ("--lrs", float, "learning rates (paper: 3e-4 ... 3e-1)"),
                               ("--heads", str, f"heads among {', '.join(HEADS)}"),
                               ("--tie", report.boolean, "weight tying: false, true or both"),
                               ("--lams", float, "λ for z_loss and mu_loss"),
                               ("--caps", float, "c for soft_cap"),
                               ("--seeds", int, "train.py --seed of each run")):
        run.add_argument(option, nargs="+", type=kind, help=text,
                         dest="ties" if option == "--tie" else option[2:])
    run.add_argument("--dtypes", nargs="+", choices=("float32", "bfloat16"), help="proxy: both")
    run.add_argument("--out", required=True, help="folder that holds one run folder per point")
    run.add_argument("--launcher", choices=("local", "slurm"), default="local")
    run.add_argument("--gpus", help="local: GPU ids to share out (--nproc_per_node a run)")
    run.add_argument("--jobs", type=store.positive_int, default=1, help="local, CPU: runs at once")
    run.add_argument("--nproc_per_node", type=store.positive_int, default=1, help="GPUs per run")
    run.add_argument("--nodes", type=store.positive_int, default=1, help="slurm: nodes per run")
    run.add_argument("--sbatch", nargs="+", default=[], metavar="KEY=VALUE",
                     help="slurm: #SBATCH options without dashes, e.g. partition=gpu time=1:00:00")
    run.add_argument("--array_limit", type=store.non_negative_int, default=0,
                     help="slurm: at most this many tasks at once (0: no limit)")
    run.add_argument("--submit", action="store_true", help="slurm: submit the script with sbatch")
    run.add_argument("--dry_run", action="store_true", help="print the runs' commands, run none")
    gather = commands.add_parser("collect", help="every summary.json under DIR -> DIR/results.csv")
    gather.add_argument("dir")
    gather.add_argument("--out", help="CSV path (default DIR/results.csv)")
    for name, text in (("table", "optimal loss, LRS and extra training time as Markdown + CSV"),
                       ("plot", "the paper's Fig. 2/3/4/8 as PNG + PDF")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("results", help="a results CSV (from collect, or the published runs)")
        sub.add_argument("--out", help="output folder (table: none; plot: the CSV's folder)")
        sub.add_argument("--lrs_mean", choices=("published", "literal"), default="published",
                         help="divide the LRS sum by n_η − 1 (published tables) or n_η (Eq. 22)")
        sub.add_argument("--l0", type=store.positive_float, help="loss at initialisation for "
                         "every run (default: init_loss, else 10.83/10.85 by size)")
        if name == "plot":
            sub.add_argument("--reference", help="a CSV of the paper's runs to draw (dashed)")
    curves = commands.add_parser("curves", help="report.CURVES vs step of runs, as PNG + PDF")
    curves.add_argument("runs", nargs="+", help="run folders (with log.jsonl)")
    curves.add_argument("--out", required=True, help="output folder, as for plot")
    curves.add_argument("--name", default="curves", help="the figure's file name, no extension")
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "run":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args, extra


def main(argv=None):
    args, extra = parse_args(argv)
    commands = {"run": lambda args: cmd_run(args, extra), "collect": cmd_collect,
                "table": cmd_table, "plot": cmd_plot, "curves": cmd_curves}
    try:
        return commands[args.command](args) or 0
    except BrokenPipeError:  # the reader of our output left (`sweep.py ... | head`): end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 128 + signal.SIGPIPE  # as a process that SIGPIPE ended
    except (ValueError, OSError) as error:  # store.WriteError is an OSError with one sentence
        raise SystemExit(f"sweep {args.command}: {error}") from None
    except KeyboardInterrupt:
        print(f"sweep {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

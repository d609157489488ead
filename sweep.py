"""sweep.py — the paper's grids as train.py runs, locally or as a SLURM job array (`run`), and
their results (`collect`) as its Tables 2, 3 and 6 (`table`) and Figs. 2, 3, 4 and 8 (`plot`);
`curves` draws the statistics runs logged over training.

A run is the folder OUT/NAME, finished once train.py has written its summary.json: the same
command again skips it and resumes the others. Options sweep.py does not know go to train.py.

Learning-rate sensitivity (Eq. 22) over n_η learning rates η, L(η) the final validation loss, L₀
the loss at initialisation (≈ ln V), a diverged run counting as L₀:

    LRS = Σ_η [min(L(η), L₀) − min_η L(η)] / (n_η − 1)

Eq. 22 as printed divides by n_η (--lrs_mean literal). The published tables divide by n_η − 1:
from the authors' runs (tests/data/oec_untied_runs.csv) it gives back every printed digit of
Table 3 and of Table 2 (ii) but its soft-cap column (that CSV holds no soft-capped runs).
"""
import argparse
import csv
import json
import math
import os
import shlex
import subprocess
import sys
import time
from itertools import product
from pathlib import Path

from matplotlib import ticker
from matplotlib.figure import Figure  # no pyplot: files only, nothing to show or close

from model import SIZES

HEADS = ("baseline", "soft_cap", "z_loss", "mu_loss", "mu_center")  # the paper's order
LAMBDA_HEADS = ("z_loss", "mu_loss")  # the heads with a weight λ
DEFAULT_LAM, DEFAULT_CAP = 1e-4, 30.0  # the paper's λ (outside Sec. 5) and soft-cap c
PAPER_SIZES = ("16M", "29M", "57M", "109M", "221M")
PAPER_LRS = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
# The paper's code draws each batch at random windows, by seed: its grids do too. The CPU proxy
# (experiments/proxy) needs η up to 1 for ‖μ‖ to grow large in 300 steps; its runs read in order.
PAPER_ARGS = ("--data_order", "random")
PROXY_ARGS = tuple("--device cpu --steps 300 --warmup 15 --batch_size 4 --micro_batch 4 "
                   "--seq_len 64 --loss_chunk 256 --eval_every 100 --eval_tokens 8192 "
                   "--stat_tokens 4096 --log_every 20 --data data/shakespeare "
                   "--data_order sequential".split())
DEFAULT_AXES = dict(ties=(False,), tied_heads=None, lams=(None,), caps=(None,), dtypes=(None,),
                    seeds=(None,), train_args=())
PAPER = dict(sizes=PAPER_SIZES, lrs=PAPER_LRS, caps=(DEFAULT_CAP,), train_args=PAPER_ARGS)
GRIDS = {  # custom: the command line gives the sizes, learning rates and heads
    "paper": dict(PAPER, heads=HEADS, ties=(False, True), lams=(DEFAULT_LAM,)),
    "lambda": dict(PAPER, heads=LAMBDA_HEADS, lams=(1e-7, 1e-4, 1e-1, 1e2)),
    "proxy": dict(sizes=("tiny",), lrs=(1e-2, 3e-2, 1e-1, 3e-1, 1.0), heads=HEADS,
                  ties=(False, True), tied_heads=("baseline", "mu_center"), lams=(DEFAULT_LAM,),
                  caps=(DEFAULT_CAP,), dtypes=("float32", "bfloat16"), seeds=(0,),
                  train_args=PROXY_ARGS),
    "custom": {},
}
OPTIONAL = ("lam", "cap", "dtype", "seed")  # in a run's name and options where given
TRAIN_PY = Path(__file__).resolve().with_name("train.py")
GRID_OPTIONS = ("size", "head", "lr", "tie", "lam", "cap", "dtype", "seed", "out_dir", "resume")


def short(x):  # a float as :g where that is exact, else in full: distinct values, distinct names
    return f"{x:g}" if isinstance(x, float) and float(f"{x:g}") == x else str(x)


def run_name(run):  # {size}_{head}_lr{η}_tie{0|1}[_lam{λ}][_cap{c}][_{dtype}][_seed{n}]
    name = f"{run['size']}_{run['head']}_lr{short(run['lr'])}_tie{int(run['tie'])}"
    return name + "".join(f"_{'' if k == 'dtype' else k}{short(run[k])}" for k in OPTIONAL
                          if run[k] is not None)


def run_args(run):  # train.py's options for the run
    args = ["--size", run["size"], "--head", run["head"], "--lr", str(run["lr"])]
    return args + ["--tie"] * run["tie"] + [
        arg for k in OPTIONAL if run[k] is not None for arg in (f"--{k}", str(run[k]))]


def expand_grid(grid, **given):
    """Every run of a grid as {name: settings}, an axis given replacing the grid's: paper 7 η × 5
    sizes × 2 ties × 5 heads = 350, lambda 7 × 5 × 4 λ × 2 = 280, proxy 5 η × 2 dtypes × 7 = 70."""
    axes = {**DEFAULT_AXES, **GRIDS[grid], **{k: tuple(v) for k, v in given.items() if v}}
    if missing := [f"--{axis}" for axis in ("sizes", "lrs", "heads") if axis not in axes]:
        raise ValueError(f"--grid {grid} needs {', '.join(missing)}: the runs' sizes, η and heads")
    runs = {}
    order = ("sizes", "heads", "ties", "dtypes", "seeds", "lrs", "lams", "caps")
    for size, head, tie, dtype, seed, lr, lam, cap in product(*(axes[axis] for axis in order)):
        run = dict(size=size, head=head, lr=lr, tie=tie, lam=lam if head in LAMBDA_HEADS else None,
                   cap=cap if head == "soft_cap" else None, dtype=dtype, seed=seed)
        if not tie or head in (axes["tied_heads"] or axes["heads"]):
            runs[run_name(run)] = run  # a head without λ or c: once, whatever the λ and c
    return runs


# ---- Launching: locally, some at a time, or as a SLURM job array ----------------------------
def train_command(name, run, out, extra_args, nproc_per_node):
    """One run's command line, with --resume where an earlier try left files."""
    args = [str(TRAIN_PY), *run_args(run), "--out_dir", str(out / name), *extra_args]
    if (out / name).is_dir() and any((out / name).iterdir()):
        args.append("--resume")
    if nproc_per_node > 1:  # --standalone: torchrun picks a free port itself
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc_per_node={nproc_per_node}", *args]
    return [sys.executable, *args]


def launch_local(commands, out, slots):
    """Run {name: command}, len(slots) at once, logs in OUT/logs; returns the names that failed."""
    pending, running, failed, free = list(commands), {}, [], list(slots)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    while pending or running:
        while pending and free:
            name, slot = pending.pop(0), free.pop(0)
            env = dict(os.environ)
            if slot:
                env["CUDA_VISIBLE_DEVICES"] = slot
            elif len(slots) > 1:  # CPU runs side by side: an equal share of the cores each
                env.setdefault("OMP_NUM_THREADS", str(max(1, os.cpu_count() // len(slots))))
            resume = " (resume)" if "--resume" in commands[name] else ""
            print(f"sweep: start {name}{resume}{f' on GPU {slot}' if slot else ''}", flush=True)
            with open(out / "logs" / f"{name}.log", "a") as log:  # the run has its own copy
                proc = subprocess.Popen(commands[name], env=env, stdout=log, stderr=log)
            running[proc] = (name, slot)
        time.sleep(0.2)
        for proc in [p for p in running if p.poll() is not None]:
            name, slot = running.pop(proc)
            free.append(slot)
            ok = proc.returncode == 0 and (out / name / "summary.json").exists()
            failed += [] if ok else [name]
            print(f"sweep: {'done' if ok else f'FAILED (exit {proc.returncode})'} {name} ("
                  f"{len(commands) - len(pending) - len(running)}/{len(commands)})", flush=True)
    return failed


SBATCH = """#!/bin/bash
# Written by sweep.py: task i runs line i (from 0) of the run list, "RUN_DIR TRAIN_ARGS...".
#SBATCH --job-name=oec-sweep
#SBATCH --array=0-{last}
#SBATCH --nodes=1
{options}set -euo pipefail
eval "RUN=($(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" {run_list}))"
RUN_DIR="${{RUN[0]}}"
RESUME=()
if [ -n "$(ls -A "$RUN_DIR" 2>/dev/null)" ]; then RESUME=(--resume); fi
{python} -m torch.distributed.run --standalone --nproc_per_node={nproc} {train_py} \\
    "${{RUN[@]:1}}" --out_dir "$RUN_DIR" "${{RESUME[@]}}"
"""


def write_slurm(runs, args, extra_args):  # new files each time: a queued job's list stays
    folder = Path(args.out).resolve() / "slurm"
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    run_list = folder / f"runs_{time.time_ns()}.txt"
    run_list.write_text("".join(shlex.join([str(folder.parent / name), *run_args(run),
                                            *extra_args]) + "\n" for name, run in runs.items()))
    options = {"output": str(folder / "logs" / "%A_%a.out"), "chdir": str(Path.cwd())}
    options.update(option.partition("=")[::2] for option in args.sbatch)  # a bare KEY: ""
    script = run_list.with_name(run_list.stem.replace("runs", "sweep") + ".sbatch")
    script.write_text(SBATCH.format(
        last=len(runs) - 1, run_list=shlex.quote(str(run_list)), nproc=args.nproc_per_node,
        options="".join(f"#SBATCH --{key}{value and '=' + shlex.quote(value)}\n"
                        for key, value in options.items()),
        python=shlex.quote(sys.executable), train_py=shlex.quote(str(TRAIN_PY))))
    return script


def submit(script):  # sbatch's job id; a job it refuses ends in one sentence with its reason
    done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True)
    if done.returncode:
        reason = "; ".join(done.stderr.replace("sbatch: error: ", "").strip().splitlines())
        raise ValueError(f"sbatch refused the job ({reason}), so nothing was submitted; change "
                         f"--sbatch to what the cluster offers (sinfo lists its partitions)")
    return done.stdout.split(";")[0].strip()  # --parsable prints JOBID[;CLUSTER]


def check_finished(runs, out, train_args):
    """Refuse a finished run whose config.json holds another value of an option passed to it."""
    for name in [name for name in runs if (out / name / "summary.json").exists()]:
        config = json.loads((out / name / "config.json").read_text())
        config["data"] = config.get("text") or config.get("data")  # text files: as --data got them
        args = [*run_args(runs[name]), *train_args, "--"]
        starts = [i for i, arg in enumerate(args) if arg.startswith("--")]
        for key, asked in {args[i][2:]: args[i + 1:j] for i, j in zip(starts, starts[1:])}.items():
            had = config.get(key, asked)  # a list: --data's text files; True: a flag
            had = [] if had is True else had if isinstance(had, list) else [had]
            if len(had) != len(asked) or any(h is None or type(h)(a) != h
                                             for a, h in zip(asked, had)):
                raise ValueError(f"{out / name} holds a run of --{key} {config[key]}, not "
                                 f"{' '.join(asked) or True}; give another --out or move it away")


def cmd_run(args, extra_args):
    extra_args = [part for arg in extra_args  # --key=value as --key value
                  for part in (arg.split("=", 1) if arg.startswith("--") else [arg])]
    if clash := [arg for arg in extra_args if arg[:2] == "--" and arg[2:] in GRID_OPTIONS]:
        raise ValueError(f"{clash[0]} is set per run by the sweep; give the grid's axes instead "
                         f"(--sizes, --heads, --lrs, --tie, --lams, --caps, --dtypes, --seeds)")
    given = {axis: getattr(args, axis) for axis in ("sizes", "lrs", "heads", "lams", "caps")}
    runs = expand_grid(args.grid, ties=[tie == "true" for tie in args.ties or ()],
                       dtypes=args.dtypes, seeds=args.seeds, **given)
    extra_args = [*GRIDS[args.grid].get("train_args", ()), *extra_args]  # the user's come last
    out, n = Path(args.out), args.nproc_per_node
    check_finished(runs, out, extra_args)
    gpus = args.gpus.split(",") if args.gpus else []  # a slot: CUDA_VISIBLE_DEVICES, or the CPU
    slots = [",".join(gpus[i:i + n]) for i in range(0, len(gpus), n)] or [None] * args.jobs
    todo = {name: run for name, run in runs.items() if not (out / name / "summary.json").exists()}
    print(f"sweep: {len(runs)} runs in the grid, {len(runs) - len(todo)} finished, "
          f"{len(todo)} to do", flush=True)
    commands = {name: train_command(name, run, out, extra_args, args.nproc_per_node)
                for name, run in todo.items()}
    if args.dry_run or not todo:
        print("".join(shlex.join(command) + "\n" for command in commands.values()), end="")
    elif args.launcher == "slurm":
        script = write_slurm(todo, args, extra_args)
        print(f"sweep: wrote {script} ({len(todo)} array tasks)")
        if args.submit:
            print(f"sweep: submitted job {submit(script)}; its tasks write to "
                  f"{script.parent / 'logs'}; run the same command again to resume runs cut short")
    else:
        failed = launch_local(commands, out, slots)
        if failed:
            print(f"sweep: {len(failed)} runs failed ({', '.join(failed)}; logs in {out / 'logs'})"
                  f"; run the same command again to retry them", flush=True)
            return 1
        print(f"sweep: all {len(runs)} runs finished", flush=True)
    return 0


# ---- Results: a CSV's rows, reduced over the learning rates ---------------------------------
RESULT_COLUMNS = tuple("size lr head lam cap tie dtype seed test_loss init_loss diverged mu_norm "
                       "logit_mean logit_std logit_absmax mean_log2Z prec_ce_gap prec_err_cast "
                       "prec_err_round h_mu_proj h_mu_cos steps tokens train_time_s run".split())
# L₀ where a CSV has no init_loss (the published runs), as the authors' analysis notebook sets it
L0_BY_SIZE = {**dict.fromkeys(PAPER_SIZES, 10.83), "221M": 10.85}
# (column, in words, unit): Fig. 3's in the paper's order, then the head's rounding, if logged
METRICS = (("logit_mean", "mean logit l̄", "l̄"), ("logit_std", "logit spread σ_l", "σ_l"),
           ("mu_norm", "‖μ‖, the output rows' mean", "‖μ‖"),
           ("logit_absmax", "largest |logit|", "max |l|"),
           ("prec_err_cast", "logit error from\nrounding the inputs", "÷ σ_l"),
           ("prec_err_round", "logit error from\nrounding the result", "÷ σ_l"),
           ("prec_ce_gap", "cross-entropy lost to\nthe matmul's rounding", "nats"))
HEAD_COLORS = dict(zip(HEADS, ("tab:gray", "tab:orange", "tab:red", "tab:blue", "tab:green")))


def read_results(path):
    """A results CSV's rows, typed, with L₀; a size names the dtype and seed where runs differ."""
    rows = list(csv.DictReader(Path(path).read_text().splitlines()))
    dtypes = {row.get("dtype") or "" for row in rows}
    first_seed = min((int(row["seed"]) for row in rows if row.get("seed")), default=None)
    for row in rows:
        numbers = ("lr", "test_loss", "init_loss", "train_time_s", *(m[0] for m in METRICS))
        row.update({key: float(row.get(key) or math.nan) for key in numbers})
        row["tie"], row["diverged"] = row["tie"] == "true", row.get("diverged") == "true"
        row["lam"] = float(row.get("lam") or DEFAULT_LAM) if row["head"] in LAMBDA_HEADS else None
        row["cap"] = float(row.get("cap") or DEFAULT_CAP) if row["head"] == "soft_cap" else None
        row["l0"] = row["init_loss"] if row["init_loss"] > 0 else L0_BY_SIZE[row["size"]]
        if len(dtypes) > 1:
            row["size"] += f" {row.get('dtype') or 'default'}"
        if row.get("seed") and int(row["seed"]) != first_seed:
            row["size"] += f" seed{row['seed']}"
    return rows


def lr_sensitivity(losses, mean="published"):  # of the capped losses; one η: NaN (literal: 0)
    divisor = len(losses) - 1 if mean == "published" else len(losses)
    return sum(loss - min(losses) for loss in losses) / divisor if divisor else math.nan


def reduce_runs(rows, mean="published"):
    """Cells: the runs of one tying, head, λ, c and size, reduced over the learning rates."""
    groups = {}
    for row in rows:
        key = tuple(row[k] for k in ("tie", "head", "lam", "cap", "size"))
        groups.setdefault(key, []).append(row)
    cells = []
    for (tie, head, lam, cap, size), runs in groups.items():
        runs.sort(key=lambda row: row["lr"])
        if len({r["lr"] for r in runs}) < len(runs):  # two sweeps collected together
            raise ValueError(f"two {size} {head} runs at one η (λ={lam}, c={cap}); keep one")
        losses = [r["l0"] if r["diverged"] or not r["test_loss"] < r["l0"] else r["test_loss"]
                  for r in runs]
        times = [r["train_time_s"] for r in runs if not r["diverged"]]
        label = head + (f" λ={lam:g}" if lam not in (None, DEFAULT_LAM) else "") + (
            f" c={cap:g}" if cap not in (None, DEFAULT_CAP) else "")
        cells.append(dict(tie=tie, head=head, lam=lam, cap=cap, size=size, label=label,
                          variant=(HEADS.index(head), lam or 0.0, cap or 0.0), rows=runs,
                          etas=[r["lr"] for r in runs], losses=losses, optimal_loss=min(losses),
                          best_lr=runs[losses.index(min(losses))]["lr"],
                          lrs=lr_sensitivity(losses, mean),
                          train_time_s=sum(times) / len(times) if times else math.nan,
                          n_lrs=len(runs), lrs_mean=mean))
    for c in cells:  # mean train time over the baseline's (the same size and tying) − 1
        base = [b["train_time_s"] for b in cells if b["head"] == "baseline"
                and (b["size"], b["tie"]) == (c["size"], c["tie"])]
        c["extra_time"] = c["train_time_s"] / base[0] - 1 if base and base[0] > 0 else math.nan
    return sorted(cells, key=lambda c: (c["tie"], c["variant"], size_order(c["size"])))


def size_order(label):  # sizes by N, then their dtype and seed columns by name
    size, _, rest = label.partition(" ")
    return list(SIZES).index(size), rest


def split(cells, tie):  # Table 2 or 6's cells (a head with several λ at 1e-4), {such head: cells}
    swept = {head: [c for c in cells if c["tie"] == tie and c["head"] == head]
             for head in LAMBDA_HEADS}
    swept = {head: mine for head, mine in swept.items() if len({c["lam"] for c in mine}) > 1}
    return [c for c in cells if c["tie"] == tie
            and (c["head"] not in swept or c["lam"] == DEFAULT_LAM)], swept


# ---- Tables 2, 3 and 6 in Markdown, and a CSV row per cell ----------------------------------
def markdown_table(cells, value, fmt, label_of=lambda c: c["label"], bold=True):
    """A row per size, a column per variant; the best (least) value of a row in bold."""
    labels = {c["variant"]: label_of(c) for c in cells}
    at = {(c["size"], c["variant"]): value(c) for c in cells}
    first = "model size N" + " (matmul dtype, seed)" * any(" " in c["size"] for c in cells)
    lines = [f"| {first} | {' | '.join(labels.values())} |", "|---" * (len(labels) + 1) + "|"]
    for size in sorted({c["size"] for c in cells}, key=size_order):
        values = [at.get((size, variant), math.nan) for variant in labels]
        finite = [x for x in values if math.isfinite(x)]
        top = fmt(min(finite)) if bold and finite else None
        texts = [fmt(x) if math.isfinite(x) else "–" for x in values]
        lines.append(f"| {size} | " + " | ".join(f"**{t}**" if t == top else t for t in texts)
                     + " |")
    return "\n".join(lines)


def markdown_report(cells, mean="published"):
    """Table 2 (untied) and 6 (tied), and Table 3 for each head run with several λ."""
    divisor = {"published": "(n_η − 1), the published tables' rule",
               "literal": "n_η, Eq. 22 as written"}[mean]
    parts = [f"# Results\n\nLRS = Σ_η [min(L(η), L₀) − min_η L] / {divisor}; L₀ = the loss at "
             f"initialisation ({L0_BY_SIZE['16M']}, or {L0_BY_SIZE['221M']} for 221M, where a "
             f"CSV has none), a diverged run's "
             f"too. Additional training time = mean train time of the runs that did not diverge "
             f"/ the baseline's − 1. The best loss and LRS of each size in bold."]

    def loss_and_lrs(cells, label_of=lambda c: c["label"]):
        return ["(i) Optimal loss min_η L (↓)",
                markdown_table(cells, lambda c: c["optimal_loss"], "{:.2f}".format, label_of),
                "(ii) Learning rate sensitivity LRS (↓)",
                markdown_table(cells, lambda c: c["lrs"], "{:.3f}".format, label_of)]
    for tie in sorted({c["tie"] for c in cells}):
        tying = "with weight tying" if tie else "without weight tying"
        main, swept = split(cells, tie)
        n_lrs = "/".join(str(n) for n in sorted({len(c["etas"]) for c in main}))
        parts += [f"## All variants, {tying} ({n_lrs} learning rates)", *loss_and_lrs(main),
                  "(iii) Additional training time (↓)", markdown_table(
                      main, lambda c: 100 * c["extra_time"], "{:.1f}%".format, bold=False)]
        for head, mine in swept.items():
            parts += [f"## {head} for several λ, {tying}",
                      *loss_and_lrs(mine, lambda c: f"{c['head']} λ={c['lam']:g}")]
    return "\n\n".join(parts) + "\n"


def write_text(path, text):  # whole or not there: a temporary file, then renamed
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    print(f"sweep: wrote {path}")


def csv_text(header, rows):  # our values hold no commas: None empty, true/false, floats in full
    return "".join(",".join("" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
                            for v in row) + "\n" for row in [header, *rows])


# ---- Figures 2 and 8 (loss and LRS vs η), 3 (logit statistics vs η), 4 (λ), curves ----------
def style(cell, variants):
    """A variant's line: thinner than the one before, hollow markers; the paper's runs dashed."""
    k, paper = variants.index(cell["variant"]), cell.get("paper", False)
    wide = (len(variants) - 1 - k) / max(len(variants) - 1, 1)
    return dict(lw=1 + 2 * wide, ms=4 + 4 * wide, marker="osD^vPX"[k % 7], mfc="none",
                ls="--" if paper else "-", alpha=0.6 if paper else 0.9)


def draw_lines(ax, cells, column, y, color_of, label_of):
    """y(cell) vs η for the cells of the column, a tick at each η swept."""
    variants = sorted({c["variant"] for c in cells})
    here = [c for c in cells if c["size"] == column]
    for c in here:
        ax.plot(c["etas"], y(c), color=color_of(c), **style(c, variants),
                label=label_of(c) + " (paper)" * c.get("paper", False))
    etas = sorted({lr for c in here for lr in c["etas"]})
    ax.set(xscale="log", xlabel="learning rate η")
    ax.set_xticks(etas, [f"{lr:g}" for lr in etas], rotation=45, fontsize=8)
    ax.xaxis.set_minor_locator(ticker.NullLocator())  # no crowded minor labels


def finish(fig, title):  # one legend, below the panels; grids; empty panels hidden
    handles = {}
    for ax in fig.axes[::-1]:  # a label's handle from the first panel that has it
        ax.grid(alpha=0.3)
        ax.set_visible(ax.has_data())
        handles.update(zip(*reversed(ax.get_legend_handles_labels())))
    fig.legend(handles.values(), handles.keys(), loc="outside lower center", fontsize=8,
               ncols=min(len(handles), 5))
    fig.suptitle(title)
    return fig


def figures(cells):
    """(file stem, figure) of every figure the cells give, the paper's among them dashed."""
    for tie in sorted({c["tie"] for c in cells if not c.get("paper")}):
        tying = "tied" if tie else "untied"
        main, swept = split(cells, tie)
        yield f"fig2_loss_lrs_{tying}", loss_and_lrs_figure(
            main, lambda c: HEAD_COLORS[c["head"]], lambda c: c["label"],
            f"Loss and learning-rate sensitivity (LRS) vs learning rate, {tying}")
        yield f"fig3_logits_{tying}", metrics_figure(
            main, f"Logit statistics, ‖μ‖ and the head's rounding vs learning rate, {tying}")
        for head, mine in swept.items():
            lams = sorted({c["lam"] for c in mine})
            yield f"fig4_lambda_{head}_{tying}", loss_and_lrs_figure(
                mine, lambda c: f"C{lams.index(c['lam'])}", lambda c: f"λ={c['lam']:g}",
                f"{head}: loss and LRS for each λ, {tying}")


def loss_and_lrs_figure(cells, color_of, label_of, title):
    """min(L(η), L₀) vs η per size, zoomed to 30% above the best loss; LRS per size below them
    (beside it, for one size)."""
    columns = sorted({c["size"] for c in cells}, key=size_order)
    by_size = len(columns) > 1 and not any(" " in column for column in columns)
    fig = Figure(figsize=(3.2 * max(len(columns), 2) + 1, 4.2 if len(columns) == 1 else 7.4),
                 layout="constrained")
    grid = fig.add_gridspec(1 if len(columns) == 1 else 2, max(len(columns), 2))
    for i, column in enumerate(columns):
        ax = fig.add_subplot(grid[0, i])
        losses = [x for c in cells if c["size"] == column or not by_size for x in c["losses"]]
        low, high = min(losses), min(max(losses), 1.3 * min(losses))  # settings share a scale
        pad = 0.05 * (high - low) or 0.05
        draw_lines(ax, cells, column, lambda c: c["losses"], color_of, label_of)
        ax.set(title=column, ylim=(low - pad, high + pad), ylabel="loss min(L, L₀)")
    ax = fig.add_subplot(grid[0, 1] if len(columns) == 1 else grid[1, :min(len(columns), 3)])
    variants = sorted({c["variant"] for c in cells})
    dodge = [0.6 * (k + 0.5) / len(variants) - 0.3 for k in range(len(variants))]
    for k, variant in enumerate(variants):  # a line across the columns: ours, the paper's
        for line in ([c for c in cells if c["variant"] == variant and c.get("paper") == paper]
                     for paper in (None, True)):
            if line:
                ax.plot([columns.index(c["size"]) + (0 if by_size else dodge[k]) for c in line],
                        [c["lrs"] for c in line], color=color_of(line[0]),
                        label=label_of(line[0]) + " (paper)" * bool(line[0].get("paper")),
                        **style(line[0], variants) | ({} if by_size else {"ls": ""}))
    if len(columns) == 1:  # a tick per variant, named
        labels = {c["variant"]: label_of(c) for c in cells}
        ax.set_xticks(dodge, [labels[v] for v in variants], rotation=30, fontsize=8)
        ax.set(title=f"LRS of each variant, {columns[0]}", xlim=(-0.5, 0.5))
    else:
        ax.set_xticks(range(len(columns)), columns)
        ax.set(xlim=(-0.5, len(columns) - 0.5), xlabel="model size N" if by_size else None,
               title="LRS of each variant")
    top = max((c["lrs"] for c in cells if c["lrs"] > 0), default=1.0)  # NaN: a single η
    ax.set(ylabel="LRS (↓)", ylim=(0, 1.1 * top))
    return finish(fig, title)


def metrics_figure(cells, title):
    """Fig. 3: a row per metric vs η, a column per size (one: a grid), symlog past 50."""
    columns = sorted({c["size"] for c in cells}, key=size_order)
    metrics = [m for m in METRICS if any(math.isfinite(r[m[0]]) for c in cells for r in c["rows"])]
    one = len(columns) == 1  # then a grid, not a column of panels
    shape = (2, math.ceil(len(metrics) / 2)) if one else (len(metrics), len(columns))
    axes = Figure(figsize=(3.3 * shape[1] + 1, 3.0 * shape[0]), layout="constrained").subplots(
        *shape, squeeze=False)
    for i, (metric, words, unit) in enumerate(metrics):
        values = [r[metric] for c in cells for r in c["rows"] if math.isfinite(r[metric])]
        for j, column in enumerate(columns):
            ax = axes.flat[i] if one else axes[i][j]
            draw_lines(ax, cells, column, lambda c: [r[metric] for r in c["rows"]],
                       lambda c: HEAD_COLORS[c["head"]], lambda c: c["label"])
            ax.set(ylabel=unit, title=words if one or i else f"{column}\n{words}")
            if max(map(abs, values)) > 50:  # linear within ±1, logarithmic beyond
                ax.set_yscale("symlog", linthresh=1.0)
    return finish(axes.flat[0].figure, title + (f", {columns[0]}" if one else ""))


CURVES = (("loss", "training loss", "nats"), ("val_loss", "validation loss", "nats"), METRICS[2],
          METRICS[0], ("h_mu_proj", "mean hidden state along μ", "h̄·μ̂ = l̄/‖μ‖"), *METRICS[3:])


def curves_figure(logs, heads):
    """CURVES vs step of {run folder: log records}: a colour per head, a line style per run."""
    curves = [curve for curve in CURVES
              if any(r.get(curve[0]) is not None for records in logs.values() for r in records)]
    fig = Figure(figsize=(4 * math.ceil(len(curves) / 2), 8), layout="constrained")
    for ax, (key, words, unit) in zip(fig.subplots(2, math.ceil(len(curves) / 2)).flat, curves):
        seen = []
        for run, records in logs.items():
            points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
            seen.append(heads[run])
            if points:
                ax.plot(*zip(*points), label=Path(run).name, lw=1.2, color=HEAD_COLORS[heads[run]],
                        ls=("-", "--", ":", "-.")[(seen.count(heads[run]) - 1) % 4],
                        marker="o" if len(points) <= 12 else None, ms=4)  # few points: marked
        if max(map(abs, ax.get_ylim())) > 50:  # ‖μ‖ growing while μ-centering's stays 0
            ax.set_yscale("symlog", linthresh=1.0)
        ax.set(title=words, xlabel="step", ylabel=unit)
    return finish(fig, " vs ".join(dict.fromkeys(heads.values())) + ", over training")


def save_figure(fig, folder, stem):  # FOLDER/STEM.png and .pdf
    folder.mkdir(parents=True, exist_ok=True)
    for path in (folder / f"{stem}.png", folder / f"{stem}.pdf"):
        fig.savefig(path, dpi=120)
        print(f"sweep: wrote {path}")


# ---- The commands that read results ---------------------------------------------------------
def cmd_collect(args):  # every summary.json under DIR, with config.json's settings it lacks
    rows = []
    for path in sorted(Path(args.dir).rglob("summary.json")):
        config = path.with_name("config.json")
        row = {**(json.loads(config.read_text()) if config.exists() else {}),
               **json.loads(path.read_text()), "run": str(path.parent.relative_to(args.dir))}
        row.update(test_loss=row["val_loss"], mean_log2Z=row.get("log2Z"))  # the paper's names
        rows.append([row.get(column) for column in RESULT_COLUMNS])
    if not rows:
        raise ValueError(f"no summary.json under {args.dir}; run `python sweep.py run ... --out "
                         f"{args.dir}` first")
    write_text(Path(args.out or Path(args.dir) / "results.csv"), csv_text(RESULT_COLUMNS, rows))


def cmd_table(args):  # prints the tables; writes table.md and table.csv only into --out
    cells = reduce_runs(read_results(args.results), args.lrs_mean)
    text = markdown_report(cells, args.lrs_mean)
    print(text)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        write_text(Path(args.out) / "table.md", text)
        columns = ("tie", "size", "head", "lam", "cap", "n_lrs", "best_lr", "optimal_loss", "lrs",
                   "lrs_mean", "train_time_s", "extra_time")
        write_text(Path(args.out) / "table.csv",
                   csv_text(columns, [[c[k] for k in columns] for c in cells]))


def cmd_plot(args):
    cells = reduce_runs(read_results(args.results), args.lrs_mean)
    if args.reference:  # the paper's runs, drawn dashed
        cells += [dict(c, paper=True) for c in reduce_runs(read_results(args.reference))]
    for stem, fig in figures(cells):
        save_figure(fig, Path(args.out or Path(args.results).parent), stem)


def cmd_curves(args):  # the logged statistics of a few runs; config.json names their heads
    logs = {run: [json.loads(line) for line in (Path(run) / "log.jsonl").read_text().splitlines()]
            for run in args.runs}
    heads = {run: json.loads((Path(run) / "config.json").read_text())["head"] for run in args.runs}
    save_figure(curves_figure(logs, heads), Path(args.out), args.name)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", allow_abbrev=False, help="launch a grid of train.py runs")
    run.add_argument("--grid", required=True, choices=tuple(GRIDS))
    run.add_argument("--tie", nargs="+", dest="ties", choices=("false", "true"))
    for option, kind in (("--sizes", tuple(SIZES)), ("--lrs", float), ("--heads", HEADS),
                         ("--lams", float), ("--caps", float), ("--seeds", int),
                         ("--dtypes", ("float32", "bfloat16"))):  # each a grid's axis
        run.add_argument(option, nargs="+", **{"type" if kind in (int, float) else "choices": kind})
    run.add_argument("--out", required=True, help="the folder that holds a folder per run")
    run.add_argument("--launcher", choices=("local", "slurm"), default="local")
    run.add_argument("--gpus", help="local: GPU ids to share out, --nproc_per_node to a run")
    run.add_argument("--jobs", type=int, default=1, help="local, CPU: runs at once")
    run.add_argument("--nproc_per_node", type=int, default=1, help="GPUs per run")
    run.add_argument("--sbatch", nargs="+", default=[], help="slurm: e.g. partition=gpu mem=8G")
    run.add_argument("--submit", action="store_true", help="slurm: submit the script with sbatch")
    run.add_argument("--dry_run", action="store_true", help="print the runs' commands, run none")
    collect = commands.add_parser("collect", allow_abbrev=False, help="summary.json files -> CSV")
    collect.add_argument("dir")
    collect.add_argument("--out", help="the CSV's path (default: DIR/results.csv)")
    for name, text in (("table", "Tables 2, 3 and 6 as Markdown, and a CSV"),
                       ("plot", "Figs. 2, 8, 3 and 4 as PNG and PDF")):
        sub = commands.add_parser(name, allow_abbrev=False, help=text)
        sub.add_argument("results", help="a results CSV (from collect, or the published runs)")
        sub.add_argument("--out", help="the output folder (table: none; plot: the CSV's)")
        sub.add_argument("--lrs_mean", choices=("published", "literal"), default="published",
                         help="divide the LRS sum by n_η − 1 (published tables) or n_η (Eq. 22)")
        if name == "plot":
            sub.add_argument("--reference", help="a CSV of the paper's runs to draw dashed")
    curves = commands.add_parser("curves", allow_abbrev=False, help="runs' logs vs step")
    curves.add_argument("runs", nargs="+", help="run folders")
    curves.add_argument("--out", required=True, help="the output folder")
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
    except (ValueError, OSError) as error:
        raise SystemExit(f"sweep {args.command}: {error}") from None


if __name__ == "__main__":
    sys.exit(main())

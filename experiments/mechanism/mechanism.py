"""The divergence mechanism, shown in training: one common shift of all output rows, then
training continued under five numerics, from an untied bf16 baseline this command trains itself.

    bash experiments/mechanism/run.sh       # ~45 min on 2 cores, the data too

Why the conditions are one run in exact arithmetic. Let W be the V × D output matrix, c ∈ ℝᴰ any
vector and W' = W + 1cᵀ (every row eᵢ moved by c). For any hidden state h:
    l'ᵢ = (eᵢ + c)·h = lᵢ + c·h          every logit of the token moves by the same c·h, so
    softmax(l') = softmax(l) = p,         the loss and ∂L/∂eᵢ = (pᵢ − yᵢ)·h are unchanged, and
    ∂L/∂h = Σᵢ (pᵢ − yᵢ)(eᵢ + c) = Σᵢ (pᵢ − yᵢ)eᵢ + c·Σᵢ (pᵢ − yᵢ) = ∂L/∂h|_W  (Σᵢ pᵢ = Σᵢ yᵢ = 1).
Every gradient is the unshifted run's, hence the clipping norm and AdamW's step (a function of
the gradients alone; decoupled weight decay would shrink the shift, still a common one): the
shift rides along and every prediction is the unshifted run's at every step. μ-centering
subtracts μ + c after each step and makes the same predictions again (heads.MuCenter). float32,
bf16 and bf16 with a float32 LM head compute that same function with other rounding. So for these
four, any gap between a shifted run and its unshifted twin is finite precision, nothing else.
μ-loss is the exception: λ‖μ + c‖² sees the shift and adds 2λ(μ + c)/V to every row's gradient;
AdamW divides it by each element's own second moment, a different step per row, which pulls the
rows back towards μ = 0 (fastest for rows that CE barely moves). Its gap mixes both effects.
tests/test_mechanism.py checks all of this in float64.

The shifts c, measured on the base model's validation hidden states h (h̄ their mean):
    none      c = 0, the reference: each condition's gap is to its own unshifted run;
    along L   c = a·h̄/‖h̄‖ with a = (L − l̄₀)/‖h̄‖, so the mean logit becomes l̄ = L (Lemma 1):
              logits near L round coarsely (result rounding), rows of coordinates ~a (input);
    ortho     c of the same length as along 1000, along the direction in which the hidden
              states vary least (the eigenvector of the mean of hhᵀ with the smallest eigenvalue):
              c·h ≈ 0 for every token, so l̄ stays near l̄₀ and only the stored rows grow, the
              input rounding alone (as far as the span of the hidden states allows).
Each (condition, shift, seed) continues --steps steps from the base checkpoint (weights and
AdamW moments) at the constant --lr, on the batches of the seed's data order (the same for every
condition and shift), and is scored on the same validation tokens in its own numerics.
"""
import argparse
import contextlib
import csv
import json
import multiprocessing
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]  # the repository root, whose modules these import
sys.path.insert(0, str(ROOT))
import analyze
import data
import fused_loss
import heads
import store
import train
from model import from_config, load_checkpoint


@dataclass(frozen=True)
class Condition:
    dtype: str            # the autocast dtype of the body (train.py --dtype)
    head: str             # heads.HEADS
    head_dtype: str = "auto"  # train.py --head_dtype


CONDITIONS = {
    "bf16": Condition("bfloat16", "baseline"),
    "float32": Condition("float32", "baseline"),
    "bf16_f32_head": Condition("bfloat16", "baseline", "float32"),
    "bf16_mu_center": Condition("bfloat16", "mu_center"),
    "bf16_mu_loss": Condition("bfloat16", "mu_loss"),
}
LEVELS = (0, 100, 300, 1000, 3000)  # the mean logits L of the `along` shifts
ORTHO_LEVEL = 1000                  # the `ortho` shift has the length of along L = 1000
# The base run: experiments/proxy/run.sh's setting at η = 0.3, the long run cut short.
BASE = dict(size="tiny", head="baseline", lr=0.3, dtype="bfloat16", batch_size=4, seq_len=64)


# ---------------------------------------------------------------------------------------------
# the shifts

def hidden_states(model, tokens: torch.Tensor, amp) -> torch.Tensor:
    """The final hidden states of the (B, T) token windows, flattened to (B·T, D), float64."""
    with torch.no_grad(), amp:
        return model.hidden(tokens).flatten(0, 1).double()


def shift_vectors(H: torch.Tensor, W: torch.Tensor, levels=LEVELS, ortho_level=ORTHO_LEVEL):
    """{name: c (D,) float64}: none, along{L} for each L, ortho (module docstring)."""
    shifts = {"none": torch.zeros(H.shape[1], dtype=torch.float64)}
    for level in levels:
        shifts[f"along{level:g}"] = analyze.mean_logit_shift(H, W, level)
    H = H.double()
    _, vectors = torch.linalg.eigh(H.T @ H / len(H))  # eigenvalues ascending
    least = vectors[:, 0] * torch.sign(vectors[:, 0] @ H.mean(0) + 1e-300)
    shifts["ortho"] = analyze.mean_logit_shift(H, W, ortho_level).norm() * least
    return shifts


def shift_rows(model, c: torch.Tensor):
    """Every output row eᵢ ← eᵢ + c (in place)."""
    with torch.no_grad():
        model.output_weight.add_(c.to(model.output_weight.dtype))


# ---------------------------------------------------------------------------------------------
# one continued run

def amp_for(dtype: str):
    return train.autocast(torch.device("cpu"), dtype if dtype != "float64" else "float32")


def build_condition_model(config: dict, state: dict, condition: Condition, model_dtype):
    """The base model under `condition`'s head and head dtype, its weights from `state`."""
    model = from_config({**config, "head": condition.head, "head_dtype": condition.head_dtype,
                         "lam": None, "cap": None})
    model.load_state_dict(state)
    model.head.loss_path = fused_loss.loss_path(None, "cpu")
    return model.to(model_dtype)


@torch.no_grad()
def mean_logit(model, H_tokens, amp) -> tuple[float, float]:
    """(l̄, ‖μ‖) on fixed validation windows: l̄ = μ·h̄ (Lemma 1), in float64."""
    mu = heads.mean_embedding(model.output_weight.detach()).double()
    return (hidden_states(model, H_tokens, amp).mean(0) @ mu).item(), mu.norm().item()


@torch.no_grad()
def val_loss(model, val, amp) -> float:
    """Mean cross-entropy over the validation windows, in the run's own numerics."""
    model.eval()
    with amp:
        total = sum(model(x, y)[1]["ce"].double() for x, y in val) / len(val)
    model.train()
    return total.item()


def continue_run(model, optimizer_state, batches, val, lr: float, dtype: str,
                 measure_every: int) -> dict:
    """Train `model` on `batches` (a list of (x, y)) at the constant lr from optimizer_state
    (AdamW's moments, or None for fresh ones), in `dtype` ("bfloat16", "float32", or "float64"
    for a model already in float64). Returns the train losses per step, and every measure_every
    steps the mean logit, ‖μ‖ and the validation loss (val: a list of (x, y))."""
    amp = amp_for(dtype)
    optimizer = train.make_optimizer(model, argparse.Namespace(lr=lr))
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
    probe = val[0][0]
    curve, losses = [], []
    batch_iter = iter(batches)
    for step in range(len(batches) + 1):
        if step % measure_every == 0 or step == len(batches):
            lbar, mu_norm = mean_logit(model, probe, amp)
            curve.append(dict(step=step, logit_mean=lbar, mu_norm=mu_norm,
                              val_loss=val_loss(model, val, amp)))
        if step == len(batches):
            break
        result = train.train_step(model, optimizer, lambda: next(batch_iter), lr, 1, amp)
        losses.append(result.loss.item())
    return dict(losses=losses, curve=curve)


# ---------------------------------------------------------------------------------------------
# the data

def train_batches(tokens: np.ndarray, seed: int, steps: int, batch: int, seq_len: int):
    """`steps` batches of `batch` random (seq_len + 1)-token windows: the data order of `seed`."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(tokens) - seq_len - 1, size=(steps, batch))
    out = []
    for row in starts:
        windows = torch.from_numpy(np.stack([tokens[s:s + seq_len + 1] for s in row])
                                   .astype(np.int64))
        out.append((windows[:, :-1], windows[:, 1:]))
    return out


def val_windows(data_dir, n_tokens: int, batch: int, seq_len: int):
    return list(data.val_batches(data_dir, n_tokens, batch, seq_len))


# ---------------------------------------------------------------------------------------------
# the experiment

def train_base(args) -> Path:
    """The untied bf16 baseline, trained by train.py (resumed if cut off): its ckpt.pt."""
    out = Path(args.work) / "base"
    if not (out / "summary.json").exists():
        command = [sys.executable, str(ROOT / "train.py"), "--data",
                   args.data, "--out_dir", str(out), "--steps", str(args.base_steps),
                   "--eval_every", "0", "--eval_tokens", "65536", "--stat_tokens", "4096",
                   "--log_every", "100", "--save_every", "250", "--resume"]
        command += [arg for key, value in BASE.items() for arg in (f"--{key}", str(value))]
        print("mechanism: training the base run:", " ".join(command[1:]), flush=True)
        subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return out / "ckpt.pt"


def cell_name(condition: str, shift: str, seed: int) -> str:
    return f"{condition}_{shift}_seed{seed}"


def run_cell(job) -> str:
    """One (condition, shift, seed): continue, then write its JSON into the work folder."""
    args, condition, shift, seed = job
    torch.set_num_threads(1)
    path = Path(args.work) / "cells" / f"{cell_name(condition, shift, seed)}.json"
    if path.exists():
        return path.name
    ckpt = load_checkpoint(Path(args.work) / "base" / "ckpt.pt")
    setting = CONDITIONS[condition]
    model = build_condition_model(ckpt["config"], ckpt["model"], setting, torch.float32)
    c = torch.tensor(json.loads((Path(args.work) / "shifts.json").read_text())[shift]["c"],
                     dtype=torch.float64)
    shift_rows(model, c)
    tokens = data.read_shard(data.shard_paths(args.data, "train")[0])
    batches = train_batches(tokens, seed, args.steps, BASE["batch_size"], BASE["seq_len"])
    val = val_windows(args.data, args.val_tokens, BASE["batch_size"], BASE["seq_len"])
    start = time.perf_counter()
    result = continue_run(model, ckpt["optimizer"], batches, val, args.lr, setting.dtype,
                          args.measure_every)
    result |= dict(condition=condition, shift=shift, seed=seed, wall_s=time.perf_counter() - start)
    train.write_json(path, result)
    return path.name


def prepare_shifts(args):
    """shifts.json: each shift's c and the mean logit it gives on the validation windows."""
    path = Path(args.work) / "shifts.json"
    if path.exists():
        return json.loads(path.read_text())
    ckpt = load_checkpoint(Path(args.work) / "base" / "ckpt.pt")
    model = build_condition_model(ckpt["config"], ckpt["model"], CONDITIONS["bf16"],
                                  torch.float32)
    val = val_windows(args.data, args.val_tokens, BASE["batch_size"], BASE["seq_len"])
    H = torch.cat([hidden_states(model, x, amp_for("bfloat16")) for x, _ in val])
    W = model.output_weight.detach().double()
    shifts = {}
    for name, c in shift_vectors(H, W).items():
        shifts[name] = dict(c=c.tolist(), c_norm=c.norm().item(),
                            logit_mean=(H.mean(0) @ (W.mean(0) + c)).item())
    train.write_json(path, shifts)
    return shifts


def run_all(args):
    (Path(args.work) / "cells").mkdir(parents=True, exist_ok=True)
    cells = [(args, condition, shift, seed) for seed in range(args.seeds)
             for shift in prepare_shifts(args) for condition in args.conditions]
    done = sum((Path(args.work) / "cells" / f"{cell_name(*job[1:])}.json").exists()
               for job in cells)
    print(f"mechanism: {len(cells)} runs of {args.steps} steps, {done} done; {args.jobs} at once",
          flush=True)
    start, finished = time.perf_counter(), 0
    context = multiprocessing.get_context("spawn")  # fresh interpreters: one thread each
    with context.Pool(args.jobs) if args.jobs > 1 else contextlib.nullcontext() as pool:
        mapper = pool.imap_unordered if pool else map
        for name in mapper(run_cell, [job for job in cells if not (
                Path(args.work) / "cells" / f"{cell_name(*job[1:])}.json").exists()]):
            finished += 1
            left = len(cells) - done - finished
            eta = (time.perf_counter() - start) / finished * left
            print(f"mechanism: {name} ({done + finished}/{len(cells)}, ETA {eta / 60:.0f} min)",
                  flush=True)


# ---------------------------------------------------------------------------------------------
# the results

RUN_COLUMNS = ("condition", "shift", "seed", "logit_mean_start", "logit_mean_end", "mu_norm_end",
               "val_loss_start", "val_loss_end", "train_loss_last50", "wall_s")


def read_cells(work: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((work / "cells").glob("*.json"))]


def run_rows(cells: list[dict]) -> list[dict]:
    """One row per continued run, for runs.csv. logit_mean_drift: how far l̄ wandered from its
    start, the largest |l̄(t) − l̄(0)| over the logged steps."""
    return [dict(condition=c["condition"], shift=c["shift"], seed=c["seed"],
                 logit_mean_start=c["curve"][0]["logit_mean"],
                 logit_mean_end=c["curve"][-1]["logit_mean"],
                 logit_mean_drift=max(abs(p["logit_mean"] - c["curve"][0]["logit_mean"])
                                      for p in c["curve"]),
                 mu_norm_end=c["curve"][-1]["mu_norm"],
                 val_loss_start=c["curve"][0]["val_loss"], val_loss_end=c["curve"][-1]["val_loss"],
                 train_loss_last50=float(np.mean(c["losses"][-50:])), wall_s=c["wall_s"])
            for c in cells]


def gap_rows(rows: list[dict], shifts: dict) -> list[dict]:
    """Per condition and shift: the validation loss minus that of the same condition's unshifted
    run on the same data order, right after the shift (start: the forward pass alone) and after
    the continued training (end), as mean, sample std and range over the seeds; and how far
    l̄ wandered (drift_mean: logit_mean_drift, mean over the seeds)."""
    table = []
    for condition in dict.fromkeys(r["condition"] for r in rows):
        reference = {r["seed"]: r for r in rows
                     if r["condition"] == condition and r["shift"] == "none"}
        for shift in shifts:
            runs = [r for r in rows if r["condition"] == condition and r["shift"] == shift
                    and r["seed"] in reference]
            if not runs:
                continue
            row = dict(condition=condition, shift=shift, logit_mean=shifts[shift]["logit_mean"],
                       c_norm=shifts[shift]["c_norm"], seeds=len(runs))
            for when in ("start", "end"):
                gaps = [r[f"val_loss_{when}"] - reference[r["seed"]][f"val_loss_{when}"]
                        for r in runs]
                row |= {f"gap_{when}_mean": float(np.mean(gaps)),
                        f"gap_{when}_std": float(np.std(gaps, ddof=1)) if len(gaps) > 1 else 0.0}
            row |= dict(gap_min=min(gaps), gap_max=max(gaps))  # of the end gaps, the last above
            row["drift_mean"] = float(np.mean([r["logit_mean_drift"] for r in runs]))
            table.append(row)
    return table


def write_csv(path: Path, rows: list[dict]):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in r.items()}
                         for r in rows)


def write_results(args):
    """runs.csv, gaps.csv, curves.csv, table.md, gap_vs_L.png, logit_mean_steps.png in --out."""
    work, out = Path(args.work), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shifts = json.loads((work / "shifts.json").read_text())
    cells = read_cells(work)
    rows, curves = run_rows(cells), [dict(condition=c["condition"], shift=c["shift"],
                                          seed=c["seed"], **point)
                                     for c in cells for point in c["curve"]]
    gaps = gap_rows(rows, shifts)
    write_csv(out / "runs.csv", rows)
    write_csv(out / "curves.csv", curves)
    write_csv(out / "gaps.csv", gaps)
    base = json.loads((work / "base" / "summary.json").read_text())
    (out / "base.json").write_text(json.dumps(
        {k: base[k] for k in ("steps", "val_loss", "logit_mean", "logit_std", "mu_norm",
                              "h_mu_proj", "h_mu_cos") if k in base}, indent=2) + "\n")
    (out / "table.md").write_text(gap_table(gaps, args))
    plot_gaps(gaps, out / "gap_vs_L.png")
    plot_logit_mean(curves, out / "logit_mean_steps.png")
    print(f"mechanism: wrote {out}/runs.csv, gaps.csv, curves.csv, table.md and two figures")


def gap_table(gaps: list[dict], args) -> str:
    conditions = list(dict.fromkeys(g["condition"] for g in gaps))
    shifts = list(dict.fromkeys(g["shift"] for g in gaps))
    cell = {(g["condition"], g["shift"]): g for g in gaps}
    header = ["| condition | " + " | ".join(
        f"{s} (l̄ = {cell[conditions[0], s]['logit_mean']:.0f})" for s in shifts) + " |",
        "|---" * (len(shifts) + 1) + "|"]
    lines = [f"Final validation loss minus the same condition's unshifted run (same data order), "
             f"after {args.steps} steps at η = {args.lr:g}: mean ± std over the seeds (nats); "
             f"gaps.csv also holds the gap right after the shift (gap_start).", "", *header]
    for condition in conditions:
        lines.append(f"| {condition} | " + " | ".join(
            f"{cell[condition, s]['gap_end_mean']:+.3f} ± {cell[condition, s]['gap_end_std']:.3f}"
            for s in shifts) + " |")
    lines += ["", "How far the mean logit wandered in those steps: the largest |l̄(t) − l̄(0)| "
              "over the logged steps, mean over the seeds. In exact arithmetic a shifted run's l̄(t) "
              "is the unshifted run's plus c·h̄(t): every row shares c, so c·h̄ moves no "
              "prediction, the loss does not hold it, and it follows h̄ along c. Unshifted, "
              "l̄ = μ·h̄ is held: the rows' reach along μ falls with their token's frequency "
              "(experiments/alignment/rarity.py).", "", *header]
    for condition in conditions:
        lines.append(f"| {condition} | " + " | ".join(
            f"{cell[condition, s]['drift_mean']:.0f}" for s in shifts) + " |")
    return "\n".join(lines) + "\n"


COLORS = {"bf16": "tab:red", "float32": "tab:blue", "bf16_f32_head": "tab:purple",
          "bf16_mu_center": "tab:green", "bf16_mu_loss": "tab:orange"}


def plot_gaps(gaps: list[dict], path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for condition in dict.fromkeys(g["condition"] for g in gaps):
        points = sorted((g for g in gaps if g["condition"] == condition
                         and g["shift"].startswith("along")), key=lambda g: g["logit_mean"])
        x = [max(g["logit_mean"], 10) for g in points]  # L = 0 drawn at 10 on the log axis
        ax.errorbar(x, [g["gap_end_mean"] for g in points],
                    yerr=[g["gap_end_std"] for g in points],
                    marker="o", capsize=3, color=COLORS[condition], label=condition)
        ortho = [g for g in gaps if g["condition"] == condition and g["shift"] == "ortho"]
        if ortho:
            ax.errorbar([1000 * 1.15], [ortho[0]["gap_end_mean"]],
                        yerr=[ortho[0]["gap_end_std"]],
                        marker="s", mfc="white", capsize=3, color=COLORS[condition])
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=0.1)  # noise of ±0.1 and divergences of 10² together
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("mean logit l̄ after the shift (L; 0 drawn at 10)")
    ax.set_ylabel("val loss − unshifted run's (nats; symlog)")
    ax.set_title("loss gap after the shift; squares: ‖c‖ of L = 1000, orthogonal", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_logit_mean(curves: list[dict], path: Path):
    """l̄ over the continued steps, mean over the seeds, one panel per shift that moves it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [s for s in ("along300", "along1000", "along3000", "ortho")
              if any(c["shift"] == s for c in curves)]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels), 3.4), squeeze=False)
    for ax, shift in zip(axes[0], panels):
        for condition in dict.fromkeys(c["condition"] for c in curves):
            by_step = {}
            for c in curves:
                if c["condition"] == condition and c["shift"] == shift:
                    by_step.setdefault(c["step"], []).append(c["logit_mean"])
            steps = sorted(by_step)
            ax.plot(steps, [np.mean(by_step[s]) for s in steps], marker=".",
                    color=COLORS[condition], label=condition)
        ax.set_title(f"shift {shift}", fontsize=9)
        ax.set_yscale("symlog", linthresh=100)  # a diverging run leaves for −10⁵
        ax.set_xlabel("step after the shift")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("mean logit l̄ = μ·h̄ (mean over seeds)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--data", default="data/shakespeare", help="a folder of shards (scripts/shakespeare.sh)")
    a("--work", default="runs/mechanism", help="the base run and one JSON per continued run")
    a("--out", default="experiments/mechanism/results", help="the CSVs, table and figures")
    a("--base_steps", type=store.positive_int, default=2000, help="steps of the base run")
    a("--steps", type=store.positive_int, default=300, help="steps of each continued run")
    a("--lr", type=store.positive_float, default=0.03, help="constant η of the continued runs")
    a("--seeds", type=store.positive_int, default=3, help="data orders 0 … seeds − 1")
    a("--conditions", nargs="+", default=list(CONDITIONS), choices=list(CONDITIONS))
    a("--val_tokens", type=store.positive_int, default=4096, help="validation tokens scored")
    a("--measure_every", type=store.positive_int, default=25, help="steps between l̄, val loss")
    a("--jobs", type=store.positive_int, default=2, help="runs at once (one core each)")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        store.check_dataset(args.data)         # one whole dataset, before any run starts
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"mechanism.py: error: {err}") from None
    train_base(args)
    run_all(args)
    write_results(args)


if __name__ == "__main__":
    main()

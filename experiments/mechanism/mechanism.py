"""The divergence mechanism in training (experiments/mechanism/README.md): every output row of an
untied bf16 baseline, trained here, moved by one common vector c, then training continued under
five numerics.

Exactly, a common shift of the rows changes no prediction and no AdamW step (heads.MuCenter
derives it), so a gap to the unshifted twin is finite precision alone, but for μ-loss, whose
λ‖μ + c‖² sees it.
"""
import argparse
import csv
import json
import multiprocessing
import os
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]  # the repository root, whose modules these import
sys.path.insert(0, str(ROOT))
import analyze
import data
from experiments import pages
import fused_loss
import heads
import store
import train
from model import from_config, load_checkpoint
from runs import write_json


# train.py's --dtype (the body's autocast), --head and --head_dtype; the figures' colour and label
Condition = namedtuple("Condition", "dtype head head_dtype colour label",
                       defaults=("auto", None, None))
CONDITIONS = {
    "bf16": Condition("bfloat16", "baseline", "auto", "tab:red", "bf16"),
    "float32": Condition("float32", "baseline", "auto", "tab:blue", "float32"),
    "bf16_f32_head": Condition("bfloat16", "baseline", "float32", "tab:purple",
                               "bf16, float32 LM head"),
    "bf16_mu_center": Condition("bfloat16", "mu_center", "auto", "tab:green", "bf16, μ-centering"),
    "bf16_mu_loss": Condition("bfloat16", "mu_loss", "auto", "tab:orange", "bf16, μ-loss")}
LEVELS = (0, 100, 300, 1000, 3000)  # the mean logits L of the `along` shifts
ORTHO_LEVEL = 1000                  # the `ortho` shift has the length of along L = 1000
# The base run (train.py's options): experiments/proxy/run.sh's setting at η = 0.3
BASE = dict(size="tiny", head="baseline", lr=0.3, dtype="bfloat16", batch_size=4, seq_len=64,
            eval_every=0, eval_tokens=65536, stat_tokens=4096, log_every=100, save_every=250)


@torch.no_grad()
def hidden_states(model, tokens: torch.Tensor, amp) -> torch.Tensor:  # (B·T, D), float64
    with amp:
        return model.hidden(tokens).flatten(0, 1).double()


def shift_vectors(H: torch.Tensor, W: torch.Tensor, levels=LEVELS, ortho_level=ORTHO_LEVEL):
    """{name: c (D,) float64}: none; along{L} (c ∥ h̄, l̄ → L); ortho (‖c‖ as along ortho_level,
    along the least eigenvector of the mean hhᵀ of the states H: l̄ stays, only the rows grow)."""
    shifts = {"none": torch.zeros(H.shape[1], dtype=torch.float64)}
    for level in levels:
        shifts[f"along{level:g}"] = analyze.mean_logit_shift(H, W, level)
    _, vectors = torch.linalg.eigh(H.T @ H / len(H))  # eigenvalues ascending
    least = vectors[:, 0] * torch.sign(vectors[:, 0] @ H.mean(0) + 1e-300)
    shifts["ortho"] = analyze.mean_logit_shift(H, W, ortho_level).norm() * least
    return shifts


@torch.no_grad()
def shift_rows(model, c: torch.Tensor):  # every output row eᵢ ← eᵢ + c, in place
    model.output_weight.add_(c.to(model.output_weight.dtype))


def amp_for(dtype: str):  # float64: a model already in float64, no autocast
    return train.autocast(torch.device("cpu"), dtype if dtype != "float64" else "float32")


def build_condition_model(config: dict, state: dict, condition: Condition, model_dtype):
    model = from_config({**config, "head": condition.head, "head_dtype": condition.head_dtype,
                         "lam": None, "cap": None})
    model.load_state_dict(state)
    model.head.loss_path = fused_loss.loss_path(None, "cpu")
    return model.to(model_dtype)


@torch.no_grad()
def measure_point(model, val, amp) -> dict:
    """l̄ = μ·h̄ (float64) and ‖μ‖ on the first validation batch, and the loss over all of val."""
    mu = heads.mean_embedding(model.output_weight.detach()).double()
    logit_mean = (hidden_states(model, val[0][0], amp).mean(0) @ mu).item()
    with amp:
        loss = sum(model(x, y)[1]["ce"].double() for x, y in val) / len(val)
    return dict(logit_mean=logit_mean, mu_norm=mu.norm().item(), val_loss=loss.item())


def continue_run(model, optimizer_state, batches, val, lr: float, dtype: str,
                 measure_every: int) -> dict:
    """Train on `batches` at the constant lr from AdamW's moments (or None) in `dtype` ("float64":
    a model in float64): the loss per step, measure_point's figures every measure_every steps."""
    amp = amp_for(dtype)
    optimizer = train.make_optimizer(model, argparse.Namespace(lr=lr))
    if optimizer_state is not None:
        optimizer.load_state_dict(optimizer_state)
    curve, losses = [dict(step=0, **measure_point(model, val, amp))], []
    for step, batch in enumerate(batches, 1):  # train_step draws its one batch at once
        losses.append(train.train_step(model, optimizer, lambda: batch, lr, 1, amp).loss.item())
        if step % measure_every == 0 or step == len(batches):
            curve.append(dict(step=step, **measure_point(model, val, amp)))
    return dict(losses=losses, curve=curve)


def train_batches(tokens: np.ndarray, seed: int, steps: int, batch: int, seq_len: int):
    """`steps` batches of `batch` random (seq_len + 1)-token windows: the data order of `seed`."""
    starts = np.random.default_rng(seed).integers(0, len(tokens) - seq_len - 1, (steps, batch))
    windows = [torch.from_numpy(np.stack([tokens[s:s + seq_len + 1] for s in row]).astype(np.int64))
               for row in starts]
    return [(w[:, :-1], w[:, 1:]) for w in windows]


def val_windows(args):
    return list(data.val_batches(args.data, args.val_tokens, BASE["batch_size"], BASE["seq_len"]))


def train_base(args):
    out = Path(args.work) / "base"
    if not (out / "summary.json").exists():
        command = [sys.executable, str(ROOT / "train.py"), "--data", args.data, "--out_dir",
                   str(out), "--steps", str(args.base_steps), "--resume", *(
                       arg for key, value in BASE.items() for arg in (f"--{key}", str(value)))]
        print("mechanism: training the base run:", " ".join(command[1:]), flush=True)
        subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def cell_path(args, condition: str, shift: str, seed: int) -> Path:
    return Path(args.work) / "cells" / f"{condition}_{shift}_seed{seed}.json"


def base_model(args, condition: Condition):
    ckpt = load_checkpoint(Path(args.work) / "base" / "ckpt.pt")
    return ckpt, build_condition_model(ckpt["config"], ckpt["model"], condition, torch.float32)


def run_cell(job) -> str:
    torch.set_num_threads(1)
    args, condition, shift, seed = job
    ckpt, model = base_model(args, CONDITIONS[condition])
    shift_rows(model, torch.tensor(prepare_shifts(args)[shift]["c"], dtype=torch.float64))
    tokens = data.read_shard(data.shard_paths(args.data, "train")[0])
    batches = train_batches(tokens, seed, args.steps, BASE["batch_size"], BASE["seq_len"])
    start = time.perf_counter()
    result = continue_run(model, ckpt["optimizer"], batches, val_windows(args), args.lr,
                          CONDITIONS[condition].dtype, args.measure_every)
    result |= dict(condition=condition, shift=shift, seed=seed, wall_s=time.perf_counter() - start)
    write_json(cell_path(*job), result)
    return cell_path(*job).name


def prepare_shifts(args):
    path = Path(args.work) / "shifts.json"
    if path.exists():
        return json.loads(path.read_text())
    _, model = base_model(args, CONDITIONS["bf16"])
    H = torch.cat([hidden_states(model, x, amp_for("bfloat16")) for x, _ in val_windows(args)])
    W = model.output_weight.detach().double()
    shifts = {name: dict(c=c.tolist(), c_norm=c.norm().item(),
                         logit_mean=(H.mean(0) @ (W.mean(0) + c)).item())
              for name, c in shift_vectors(H, W).items()}
    write_json(path, shifts)
    return shifts


def run_all(args):
    (Path(args.work) / "cells").mkdir(parents=True, exist_ok=True)
    cells = [(args, condition, shift, seed) for seed in range(args.seeds)
             for shift in prepare_shifts(args) for condition in args.conditions]
    pending = [job for job in cells if not cell_path(*job).exists()]
    print(f"mechanism: {len(cells)} runs of {args.steps} steps, {len(cells) - len(pending)} done; "
          f"{args.jobs} at once", flush=True)
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:  # one thread each
        for finished, name in enumerate(pool.imap_unordered(run_cell, pending), 1):
            eta = (time.perf_counter() - start) / finished * (len(pending) - finished)
            print(f"mechanism: {name} ({len(cells) - len(pending) + finished}/{len(cells)}, "
                  f"ETA {eta / 60:.0f} min)", flush=True)


def run_rows(cells: list[dict]) -> list[dict]:
    """runs.csv's rows; logit_mean_drift: the largest |l̄(t) − l̄(0)| over the logged steps."""
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
    """Per condition and shift: the validation loss minus the same condition's unshifted run's on
    the same data order, at the start and the end, over the seeds (mean, sample std, range)."""
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
            row |= dict(gap_min=min(gaps), gap_max=max(gaps),  # of the end gaps, the last above
                        drift_mean=float(np.mean([r["logit_mean_drift"] for r in runs])))
            table.append(row)
    return table


def write_csv(path: Path, rows: list[dict]):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in r.items()}
                         for r in rows)


def write_results(args):
    work, out = Path(args.work), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cells = [json.loads(p.read_text()) for p in sorted((work / "cells").glob("*.json"))]
    rows = run_rows(cells)
    write_csv(out / "runs.csv", rows)
    write_csv(out / "curves.csv", [dict(condition=c["condition"], shift=c["shift"],
                                        seed=c["seed"], **point)
                                   for c in cells for point in c["curve"]])
    write_csv(out / "gaps.csv", gap_rows(rows, prepare_shifts(args)))  # written by run_all
    base = json.loads((work / "base" / "summary.json").read_text())
    write_json(out / "base.json", {k: base[k] for k in ("steps", "val_loss", "logit_mean",
               "logit_std", "mu_norm", "h_mu_proj", "h_mu_cos") if k in base})


def gap_table(gaps: list[dict], args) -> str:
    conditions = [c for c in CONDITIONS if any(g["condition"] == c for g in gaps)]
    shifts = list(dict.fromkeys(g["shift"] for g in gaps))
    cell = {(g["condition"], g["shift"]): g for g in gaps}

    def table(caption: str, number) -> list[str]:
        return [caption, "", pages.markdown_table([["numerics", *map(shift_label, shifts)], *(
            [CONDITIONS[c].label, *(number(cell[c, s]) for s in shifts)] for c in conditions)]), ""]
    return "\n".join(
        table("Validation loss right after the shift minus the same numerics' unshifted run "
              "(nats; the forward pass alone, the same for every data order):",
              lambda g: f"{g['gap_start_mean']:+.2g}")
        + table(f"The same after {args.steps} steps at η = {args.lr:g}: mean ± std over "
                f"{max(g['seeds'] for g in gaps):.0f} data orders (nats):",
                lambda g: f"{g['gap_end_mean']:+.3f} ± {g['gap_end_std']:.3f}")
        + table("How far the mean logit wandered in those steps: the largest |l̄(t) − l̄(0)| "
                "over the logged steps, mean over the data orders:",
                lambda g: f"{g['drift_mean']:.0f}"))


def shift_label(shift: str) -> str:
    if shift == "ortho":
        return f"ortho: c ⊥ h, ‖c‖ as l̄ → {ORTHO_LEVEL}"
    return f"c ∥ h̄, l̄ → {shift[len('along'):]}" if shift.startswith("along") else shift


def report(out: Path, args):
    if missing := ", ".join(n for n in ("gaps.csv", "curves.csv", "base.json")
                            if not (out / n).exists()):
        raise ValueError(f"{out} lacks {missing}; run mechanism.py without --from_results first.")
    gaps, curves = pages.read_csv(out / "gaps.csv"), pages.read_csv(out / "curves.csv")
    (out / "table.md").write_text(gap_table(gaps, args))
    print(f"wrote {out / 'table.md'}")
    base = json.loads((out / "base.json").read_text())
    title = (f"untied {BASE['size']} baseline after {base['steps']:,} bf16 steps at "
             f"η = {BASE['lr']:g}, its rows shifted by c, then {max(c['step'] for c in curves):.0f}"
             f" steps at η = {args.lr:g}; {max(g['seeds'] for g in gaps):.0f} data orders")
    plot_gaps(gaps, title, out / "gap_vs_L.png")
    plot_logit_mean(curves, title, out / "logit_mean_steps.png")


def plot_gaps(gaps: list[dict], title: str, path: Path):
    shifts = [s for s in dict.fromkeys(g["shift"] for g in gaps) if s != "none"]
    conditions = [c for c in CONDITIONS if any(g["condition"] == c for g in gaps)]
    fig, ax = analyze.new_axes(figsize=(9, 4.6))
    for i, condition in enumerate(conditions):
        cell = [next(g for g in gaps if (g["condition"], g["shift"]) == (condition, s))
                for s in shifts]
        ax.errorbar([k + (i - (len(conditions) - 1) / 2) * 0.14 for k in range(len(shifts))],
                    [g["gap_end_mean"] for g in cell], yerr=[g["gap_end_std"] for g in cell],
                    fmt="o", capsize=2, color=CONDITIONS[condition].colour,
                    label=CONDITIONS[condition].label)
    ax.set_xticks(range(len(shifts)), [shift_label(s).replace(", ", "\n") for s in shifts])
    ax.set_yscale("symlog", linthresh=0.1)  # noise of ±0.1 and divergences of 10² together
    ax.set_yticks(ticks := (-0.1, 0, 0.1, 1, 10, 100, 1000), [f"{t:g}" for t in ticks])
    ax.set_ylim(bottom=1.2 * min(g["gap_end_mean"] - g["gap_end_std"] for g in gaps))
    ax.axhline(0, color="grey", lw=0.8)
    ax.set(xlabel="the common shift c of every output row",
           ylabel="val loss − the unshifted run's (nats, symlog)")
    ax.set_title(f"{title}\nloss gap after training on, mean ± std over them", fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    analyze.save_figure(fig, path)


def plot_logit_mean(curves: list[dict], title: str, path: Path):
    panels = [s for s in ("along300", "along1000", "along3000", "ortho")
              if any(c["shift"] == s for c in curves)]
    fig, axes = analyze.new_axes(1, len(panels), squeeze=False, figsize=(3.3 * len(panels), 3.9))
    for ax, shift in zip(axes[0], panels):
        for condition, (*_, colour, label) in CONDITIONS.items():
            points = [(c["step"], c["logit_mean"]) for c in curves
                      if (c["condition"], c["shift"]) == (condition, shift)]
            steps = sorted({step for step, _ in points})
            ax.plot(steps, [np.mean([l for t, l in points if t == step]) for step in steps],
                    marker=".", color=colour, label=label)
        ax.set_title(shift_label(shift), fontsize=9)
        if max(abs(c["logit_mean"]) for c in curves if c["shift"] == shift) > 1e4:
            ax.set_yscale("symlog", linthresh=100)  # a diverging run leaves for −10⁵
        ax.set(xlabel="step after the shift", ylabel="mean logit l̄ = μ·h̄")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title}\nmean logit, mean over the data orders", fontsize=9)
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="outside lower center",
               ncol=len(CONDITIONS), fontsize=8)
    analyze.save_figure(fig, path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--data", default="data/shakespeare", help="a folder of shards (scripts/shakespeare.sh)")
    a("--work", default="runs/mechanism", help="the base run and one JSON per continued run")
    a("--out", default="experiments/mechanism/results", help="the CSVs, table and figures")
    a("--from_results", action="store_true",
      help="train nothing: write table.md and the figures from the CSVs in --out")
    a("--base_steps", type=store.positive_int, default=2000, help="steps of the base run")
    a("--steps", type=store.positive_int, default=300, help="steps of each continued run")
    a("--lr", type=store.positive_float, default=0.03, help="constant η of the continued runs")
    a("--seeds", type=store.positive_int, default=3, help="data orders 0 … seeds − 1")
    a("--conditions", nargs="+", default=list(CONDITIONS), choices=list(CONDITIONS))
    a("--val_tokens", type=store.positive_int, default=4096, help="validation tokens scored")
    a("--measure_every", type=store.positive_int, default=25, help="steps between l̄, val loss")
    a("--jobs", type=store.positive_int, default=2, help="runs at once (one core each)")
    args = p.parse_args(argv)
    try:
        if not args.from_results:
            store.check_dataset(args.data)  # one whole dataset, before any run starts
            train_base(args)
            run_all(args)
            write_results(args)
        report(Path(args.out), args)
    except (FileNotFoundError, ValueError) as err:  # a dataset or a results folder at fault
        raise SystemExit(f"mechanism.py: error: {err}") from None


if __name__ == "__main__":
    main()

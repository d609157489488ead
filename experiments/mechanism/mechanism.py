"""The divergence mechanism in training (experiments/mechanism/README.md): every output row of
untied bf16 baselines (one per initial seed), trained here, moved by one common vector c, then
training continued under several numerics, from each base in several data orders.

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
import heads
import train
from experiments import pages
from model import from_config, load_checkpoint


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
ALL_SHIFTS = ("none", *(f"along{level:g}" for level in LEVELS), "ortho")  # in the tables' order
SHIFTS = ("none", "along300", "along1000", "along3000", "ortho")  # those run by default
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
                         "lam": None, "cap": None, "loss_chunk": train.CPU_LOSS_CHUNK})
    model.load_state_dict(state)
    return model.to(model_dtype)


@torch.no_grad()
def measure_point(model, val, amp) -> dict:
    """l̄ = μ·h̄ (float64) on the first validation batch, ‖μ‖ of the stored rows, and val's loss."""
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
    windows = torch.from_numpy(tokens[starts[..., None] + np.arange(seq_len + 1)].astype(np.int64))
    return [(w[:, :-1], w[:, 1:]) for w in windows]


def val_windows(args):
    return list(data.val_batches(args.data, args.val_tokens, BASE["batch_size"], BASE["seq_len"]))


def base_dir(args, base: int) -> Path:
    return Path(args.work) / f"base{base}"


def train_base(job):
    """The base run of initial seed `base` (train.py --seed; the data order is train.py's
    sequential one, the same for every base)."""
    args, base = job
    out = base_dir(args, base)
    if not (out / "summary.json").exists():
        command = [sys.executable, str(ROOT / "train.py"), "--data", args.data, "--out_dir",
                   str(out), "--steps", str(args.base_steps), "--seed", str(base), "--resume", *(
                       arg for key, value in BASE.items() for arg in (f"--{key}", str(value)))]
        print("mechanism: training a base run:", " ".join(command[1:]), flush=True)
        subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                       stdout=subprocess.DEVNULL)


def cell_path(args, base: int, condition: str, shift: str, seed: int) -> Path:
    return Path(args.work) / "cells" / f"base{base}_{condition}_{shift}_seed{seed}.json"


def base_model(args, base: int, condition: Condition):
    ckpt = load_checkpoint(base_dir(args, base) / "ckpt.pt")
    return ckpt, build_condition_model(ckpt["config"], ckpt["model"], condition, torch.float32)


def run_cell(job) -> str:
    torch.set_num_threads(1)
    args, base, condition, shift, seed = job
    ckpt, model = base_model(args, base, CONDITIONS[condition])
    shift_rows(model, torch.tensor(prepare_shifts(args, base)[shift]["c"], dtype=torch.float64))
    tokens = data.read_shard(data.shard_paths(args.data, "train")[0])
    batches = train_batches(tokens, seed, args.steps, BASE["batch_size"], BASE["seq_len"])
    start = time.perf_counter()
    result = continue_run(model, ckpt["optimizer"], batches, val_windows(args), args.lr,
                          CONDITIONS[condition].dtype, args.measure_every)
    result |= dict(base=base, condition=condition, shift=shift, seed=seed,
                   wall_s=time.perf_counter() - start)
    pages.write_json(cell_path(*job), result)
    return cell_path(*job).name


def prepare_shifts(args, base: int):
    path = base_dir(args, base) / "shifts.json"
    if path.exists():
        return json.loads(path.read_text())
    _, model = base_model(args, base, CONDITIONS["bf16"])
    H = torch.cat([hidden_states(model, x, amp_for("bfloat16")) for x, _ in val_windows(args)])
    W = model.output_weight.detach().double()
    shifts = {name: dict(c=c.tolist(), c_norm=c.norm().item())
              for name, c in shift_vectors(H, W).items()}
    pages.write_json(path, shifts)
    return shifts


def run_all(args):
    (Path(args.work) / "cells").mkdir(parents=True, exist_ok=True)
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:  # one thread each
        pool.map(train_base, [(args, base) for base in range(args.base_seeds)])
        cells = [(args, base, condition, shift, seed) for base in range(args.base_seeds)
                 for seed in range(args.seeds) for shift in args.shifts
                 for condition in args.conditions]  # base by base: each one whole in turn
        pending = [job for job in cells if not cell_path(*job).exists()]
        print(f"mechanism: {len(cells)} runs of {args.steps} steps, {len(cells) - len(pending)} "
              f"done; {args.jobs} at once", flush=True)
        for base in range(args.base_seeds):
            prepare_shifts(args, base)
        start = time.perf_counter()
        for finished, name in enumerate(pool.imap_unordered(run_cell, pending), 1):
            eta = (time.perf_counter() - start) / finished * (len(pending) - finished)
            print(f"mechanism: {name} ({len(cells) - len(pending) + finished}/{len(cells)}, "
                  f"ETA {eta / 60:.0f} min)", flush=True)


def run_rows(cells: list[dict]) -> list[dict]:
    """runs.csv's rows; logit_mean_drift: the largest |l̄(t) − l̄(0)| over the logged steps."""
    return [dict(base=c["base"], condition=c["condition"], shift=c["shift"], seed=c["seed"],
                 logit_mean_start=c["curve"][0]["logit_mean"],
                 logit_mean_end=c["curve"][-1]["logit_mean"],
                 logit_mean_drift=max(abs(p["logit_mean"] - c["curve"][0]["logit_mean"])
                                      for p in c["curve"]),
                 mu_norm_end=c["curve"][-1]["mu_norm"],
                 val_loss_start=c["curve"][0]["val_loss"], val_loss_end=c["curve"][-1]["val_loss"],
                 train_loss_last50=float(np.mean(c["losses"][-50:])), wall_s=c["wall_s"])
            for c in cells]


def gap_rows(rows: list[dict]) -> list[dict]:
    """Per numerics and shift, the gaps of pages.with_gaps over every base and data order: mean,
    range, the spread across bases (sample std of the bases' means) and within them (the root
    mean of each base's sample variance over its data orders); gap_start, the forward pass
    alone, does not depend on the order."""
    table, gapped = [], pages.with_gaps(rows)
    order = lambda key: (list(CONDITIONS).index(key[0]), ALL_SHIFTS.index(key[1]))
    for key in sorted({(r["condition"], r["shift"]) for r in gapped}, key=order):
        runs = [r for r in gapped if (r["condition"], r["shift"]) == key]
        by_base = [[r["gap_end"] for r in runs if r["base"] == b]
                   for b in dict.fromkeys(r["base"] for r in runs)]
        means = [np.mean(g) for g in by_base]
        ends = [r["gap_end"] for r in runs]
        table.append(dict(condition=key[0], shift=key[1], bases=len(by_base), runs=len(runs),
                          gap_start_mean=float(np.mean([r["gap_start"] for r in runs])),
                          gap_end_mean=float(np.mean(ends)), gap_min=min(ends), gap_max=max(ends),
                          base_mean_min=float(min(means)), base_mean_max=float(max(means)),
                          across_bases=float(np.std(means, ddof=1)) if len(means) > 1 else 0.0,
                          within_bases=float(np.sqrt(np.mean(
                              [np.var(g, ddof=1) if len(g) > 1 else 0.0 for g in by_base]))),
                          drift_mean=float(np.mean([r["logit_mean_drift"] for r in runs]))))
    return table


def base_rows(rows: list[dict], summaries: dict) -> list[dict]:
    """bases.csv: each base run's final statistics and what bf16 then does from it: the mean gap
    and the mean change l̄(end) − l̄(start) over the data orders, at L = 1000 and 3000."""
    bf16 = [r for r in pages.with_gaps(rows) if r["condition"] == "bf16"]
    table = []
    for base, summary in summaries.items():
        row = dict(base=base, **{k: summary[k] for k in BASE_STATS})
        for shift in ("along1000", "along3000"):
            if runs := [r for r in bf16 if (r["base"], r["shift"]) == (base, shift)]:
                row |= {f"bf16_gap_{shift}": float(np.mean([r["gap_end"] for r in runs])),
                        f"bf16_dl_{shift}": float(np.mean([r["logit_mean_end"] -
                                                           r["logit_mean_start"] for r in runs]))}
        table.append(row)
    return table


BASE_STATS = ("steps", "val_loss", "logit_mean", "logit_std", "mu_norm", "h_mu_proj", "h_mu_cos",
              "c_norm_along1000")  # train.py's final statistics; ‖c‖ that takes l̄ to 1000


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
    write_csv(out / "curves.csv", [dict(base=c["base"], condition=c["condition"],
                                        shift=c["shift"], seed=c["seed"], **point)
                                   for c in cells for point in c["curve"]])
    write_csv(out / "gaps.csv", gap_rows(rows))
    summaries = {b: json.loads((base_dir(args, b) / "summary.json").read_text()) | dict(
        c_norm_along1000=prepare_shifts(args, b)["along1000"]["c_norm"])
                 for b in sorted({r["base"] for r in rows})}
    write_csv(out / "bases.csv", base_rows(rows, summaries))
    pages.write_json(out / "cpu.json", pages.cpu_record())


def gap_table(gaps: list[dict], bases: list[dict], args) -> str:
    conditions = [c for c in CONDITIONS if any(g["condition"] == c for g in gaps)]
    shifts = list(dict.fromkeys(g["shift"] for g in gaps))
    cell = {(g["condition"], g["shift"]): g for g in gaps}
    n_bases, n_runs = max(g["bases"] for g in gaps), max(g["runs"] for g in gaps)

    def table(caption: str, number) -> list[str]:
        return [caption, "", pages.markdown_table([["numerics", *map(shift_label, shifts)], *(
            [CONDITIONS[c].label, *(number(cell[c, s]) if (c, s) in cell else "–"
                                    for s in shifts)] for c in conditions)]), ""]
    stats = [(name, key, form) for name, key, form in (
        ("base", "base", "seed {:.0f}"), ("validation loss", "val_loss", "{:.3f}"),
        ("l̄", "logit_mean", "{:.2f}"), ("‖μ‖", "mu_norm", "{:.0f}"),
        ("h̄·μ̂", "h_mu_proj", "{:.3f}"), ("bf16 gap, L = 1000", "bf16_gap_along1000", "{:+.2f}"),
        ("bf16 l̄ change, L = 1000", "bf16_dl_along1000", "{:+.0f}"),
        ("bf16 gap, L = 3000", "bf16_gap_along3000", "{:+.3g}")) if key in bases[0]]
    over = f"the {n_bases:.0f} bases"
    spread = "mean [range of the bases' means] ± std over the data orders within a base (pooled)"
    return "\n".join(
        table("Validation loss right after the shift minus the same numerics' unshifted run "
              f"(nats; the forward pass alone), mean over {over}:",
              lambda g: f"{g['gap_start_mean']:+.2g}")
        + table(f"The same after {args.steps} steps at η = {args.lr:g}, {n_runs:.0f} runs "
                f"({over} × {n_runs / n_bases:.0f} data orders): {spread} (nats):",
                lambda g: f"{g['gap_end_mean']:+.2f} [{g['base_mean_min']:+.2f}, "
                          f"{g['base_mean_max']:+.2f}] ± {g['within_bases']:.2f}")
        + table("How far the mean logit wandered in those steps: the largest |l̄(t) − l̄(0)| "
                "over the logged steps, mean over the runs:",
                lambda g: f"{g['drift_mean']:.0f}")
        + [f"Each base run (train.py's final statistics: the validation loss over the first "
           f"{BASE['eval_tokens']:,} validation tokens, the rest over the first "
           f"{BASE['stat_tokens']:,}) and bf16 from it, mean over the data orders:", "",
           pages.markdown_table([[name for name, *_ in stats], *(
               [form.format(b[key]) for _, key, form in stats] for b in bases)]), ""])


def shift_label(shift: str) -> str:
    if shift == "ortho":
        return f"ortho: c ⊥ h, ‖c‖ as l̄ → {ORTHO_LEVEL}"
    return f"c ∥ h̄, l̄ → {shift[len('along'):]}" if shift.startswith("along") else shift


def report(out: Path, args):
    names = ("runs.csv", "curves.csv", "bases.csv")
    if missing := ", ".join(n for n in names if not (out / n).exists()):
        raise ValueError(f"{out} lacks {missing}; run mechanism.py without --from_results first.")
    runs, curves, bases = (pages.read_csv(out / n) for n in names)
    (out / "table.md").write_text(gap_table(gap_rows(runs), bases, args))
    print(f"wrote {out / 'table.md'}")
    title = (f"untied {BASE['size']} baselines ({len(bases)} initial seeds) after "
             f"{bases[0]['steps']:,.0f} bf16 steps at η = {BASE['lr']:g}, their rows shifted by c,"
             f" then {max(c['step'] for c in curves):.0f} steps at η = {args.lr:g} in "
             f"{len({r['seed'] for r in runs})} data orders")
    plot_gaps(pages.with_gaps(runs), title, out / "gap_vs_L.png")
    plot_logit_mean(curves, title, out / "logit_mean_steps.png")


BASE_MARKERS = "os^Dv"  # one marker per base run in the figures


def plot_gaps(gapped: list[dict], title: str, path: Path):
    """Every run's gap: a column per numerics inside each shift, a marker per base, a bar at the
    mean of all."""
    shifts = [s for s in ALL_SHIFTS[1:] if any(r["shift"] == s for r in gapped)]
    conditions = [c for c in CONDITIONS if any(r["condition"] == c for r in gapped)]
    fig, ax = analyze.new_axes(figsize=(10, 4.8))
    for i, condition in enumerate(conditions):
        colour, label = CONDITIONS[condition].colour, CONDITIONS[condition].label
        for k, shift in enumerate(shifts):
            x = k + (i - (len(conditions) - 1) / 2) * 0.2
            runs = [r for r in gapped if (r["condition"], r["shift"]) == (condition, shift)]
            for r in runs:
                ax.scatter(x + 0.04 * (r["seed"] - 1), r["gap_end"], s=14, color=colour,
                           marker=BASE_MARKERS[int(r["base"]) % len(BASE_MARKERS)], alpha=0.7,
                           linewidths=0)
            ax.hlines(np.mean([r["gap_end"] for r in runs]), x - 0.08, x + 0.08, color=colour,
                      label=label if k == 0 else None)
    for base in sorted({r["base"] for r in gapped}):
        ax.scatter([], [], color="grey", marker=BASE_MARKERS[int(base) % len(BASE_MARKERS)],
                   label=f"base seed {base:.0f}")
    ax.set_xticks(range(len(shifts)), [shift_label(s).replace(", ", "\n") for s in shifts])
    ax.set_yscale("symlog", linthresh=0.1)  # noise of ±0.1 and divergences of 10² together
    ax.set_yticks(ticks := (-1, -0.1, 0, 0.1, 1, 10, 100, 1000), [f"{t:g}" for t in ticks])
    ax.set_ylim(bottom=-1.2)  # gains of more than a nat would be no noise; none is that large
    ax.axhline(0, color="grey", lw=0.8)
    ax.set(xlabel="the common shift c of every output row",
           ylabel="val loss − the unshifted run's (nats, symlog)")
    ax.set_title(f"{title}\nloss gap after training on: each run, a bar at the mean", fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    analyze.save_figure(fig, path)


def plot_logit_mean(curves: list[dict], title: str, path: Path):
    """l̄ over the steps after the shift, a line per run: colour the numerics, style the base."""
    panels = [s for s in ("along300", "along1000", "along3000", "ortho")
              if any(c["shift"] == s for c in curves)]
    fig, axes = analyze.new_axes(1, len(panels), squeeze=False, figsize=(3.4 * len(panels), 4.1))
    styles = ("-", "--", ":", "-.")
    runs = sorted({(c["condition"], c["base"], c["seed"]) for c in curves},
                  key=lambda run: (list(CONDITIONS).index(run[0]), *run[1:]))
    for ax, shift in zip(axes[0], panels):
        for condition, base, seed in runs:
            steps, l_mean = zip(*[(c["step"], c["logit_mean"]) for c in curves
                                  if (c["condition"], c["base"], c["seed"], c["shift"])
                                  == (condition, base, seed, shift)])
            label = f"{CONDITIONS[condition].label}, base seed {base:.0f}" if seed == 0 else None
            ax.plot(steps, l_mean, color=CONDITIONS[condition].colour, lw=0.8, alpha=0.8,
                    linestyle=styles[int(base) % len(styles)], label=label,
                    zorder=2 + (condition == "bf16"))  # bf16's lines on top
        ax.set_title(shift_label(shift), fontsize=9)
        if max(abs(c["logit_mean"]) for c in curves if c["shift"] == shift) > 1e4:
            ax.set_yscale("symlog", linthresh=100)  # a diverging run leaves for −10⁵
        ax.set(xlabel="step after the shift", ylabel="mean logit l̄ = μ·h̄")
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title}\nmean logit of every run, a line per data order", fontsize=9)
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="outside lower center", ncol=4,
               fontsize=7)
    analyze.save_figure(fig, path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--data", default="data/shakespeare", help="a folder of shards (scripts/shakespeare.sh)")
    a("--work", default="runs/mechanism", help="the base run and one JSON per continued run")
    a("--out", default="experiments/mechanism/results", help="the CSVs, table and figures")
    a("--from_results", action="store_true",
      help="train nothing: write table.md and the figures from the CSVs in --out")
    a("--base_steps", type=int, default=2000, help="steps of the base run")
    a("--steps", type=int, default=300, help="steps of each continued run")
    a("--lr", type=float, default=0.03, help="constant η of the continued runs")
    a("--base_seeds", type=int, default=3, help="base runs, initial seeds 0 … base_seeds − 1")
    a("--seeds", type=int, default=3, help="data orders 0 … seeds − 1")
    a("--conditions", nargs="+", default=[c for c in CONDITIONS if c != "bf16_mu_loss"],
      choices=list(CONDITIONS))
    a("--shifts", nargs="+", default=list(SHIFTS), choices=ALL_SHIFTS,
      help="`none` is every gap's reference")
    a("--val_tokens", type=int, default=4096, help="validation tokens scored")
    a("--measure_every", type=int, default=25, help="steps between l̄, val loss")
    a("--jobs", type=int, default=2, help="runs at once (one core each)")
    args = p.parse_args(argv)
    try:
        if not args.from_results:
            data.shard_paths(args.data, "train")  # no data: one sentence, before any run starts
            run_all(args)
            write_results(args)
        report(Path(args.out), args)
    except (FileNotFoundError, ValueError) as err:  # a dataset or a results folder at fault
        raise SystemExit(f"mechanism.py: error: {err}") from None


if __name__ == "__main__":
    main()

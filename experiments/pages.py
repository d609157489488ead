"""Each experiment's README.md: its README.in.md filled by str.format with the numbers read here
from its committed results, so that the page cannot drift from them (tests/test_experiments.py);
and what the experiments write beside them: write_json, cpu_record (the CPU that made a result).
    python experiments/pages.py [NAME ...]     # default: every page; the last step of run.sh
"""
import csv
import itertools
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent


def read_csv(path) -> list[dict]:
    """The rows of a CSV file, every cell that reads as a number a float."""
    def cell(text: str):
        try:
            return float(text)
        except ValueError:
            return text
    with open(path, newline="") as f:
        return [{key: cell(value) for key, value in row.items()} for row in csv.DictReader(f)]


def write_json(path, obj: dict):  # whole or not at all: a temporary name, then a rename
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def cpu_record() -> dict:
    """What decides a bf16 run on a CPU: the model name, its bf16-related flags, torch's kernels."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    field = lambda name: next((line.split(":", 1)[1].strip() for line in info.splitlines()
                               if line.startswith(name)), "unknown")
    flags = field("flags").split()
    return dict(model=field("model name"), torch=torch.__version__,
                capability=torch.backends.cpu.get_cpu_capability(),
                flags=[f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
                       if f in flags])


def markdown_table(rows) -> str:
    lines = ["|" + "|".join(f" {cell} " if cell else " " for cell in row) + "|" for row in rows]
    return "\n".join([lines[0], "|---" * len(rows[0]) + "|", *lines[1:]])


def span(key: str, rows) -> tuple:
    return min(row[key] for row in rows), max(row[key] for row in rows)


class Upper(float):
    """An upper bound on a page: printed rounded up at the precision its format asks ("{x:.2f}",
    "{x:.1%}"), so that the printed number still bounds the value; Lower rounds down."""
    towards = staticmethod(math.ceil)

    def __format__(self, spec: str) -> str:
        digits = int(spec.rsplit(".", 1)[1].rstrip("f%")) + 2 * spec.endswith("%")
        scaled = round(self * 10 ** digits, 6)  # a value printed exactly stays as it is
        return format(self.towards(scaled) / 10 ** digits, spec)


class Lower(Upper):
    towards = staticmethod(math.floor)


def mechanism(results: Path) -> dict:
    """gaps.csv by condition and shift (g), bases.csv, runs.csv's bf16 runs and times, cpu.json,
    the cures' paired tests against float32 (test) and each shift's bf16 gap against its final
    |l̄| (rho); other: the same of the runs of another CPU in other_cpu/."""
    runs, bases, g = read_csv(results / "runs.csv"), read_csv(results / "bases.csv"), {}
    for row in read_csv(results / "gaps.csv"):
        g.setdefault(row["condition"], {})[row["shift"]] = row
    gapped = [r for r in with_gaps(runs) if r["shift"] != "none"]
    of = lambda condition, shift=None: sorted(  # in one order, so that runs pair up
        (r for r in gapped if r["condition"] == condition and shift in (None, r["shift"])),
        key=lambda r: (r["shift"], r["base"], r["seed"]))
    blown = [r for r in of("bf16", "along3000") if r["val_loss_end"] > 10 * r["val_loss_start"]]
    ortho_f32 = of("float32", "ortho") + of("bf16_f32_head", "ortho")
    moved = [abs(r["logit_mean_end"] - r["logit_mean_start"])
             for s in ("along1000", "along3000", "ortho") for r in of("bf16", s)]
    wall = [r["wall_s"] for r in runs]
    paper = [r for r in paper_baselines() if r["size"] == "16M"]
    return dict(
        g=g, bases=bases, n_bases=len(bases), last_base=len(bases) - 1, runs=len(runs),
        orders=len({r["seed"] for r in runs}), paper=next(r for r in paper if r["lr"] == 0.3),
        paper_best=min(r["test_loss"] for r in paper),
        h_mean_norm=span("h", [dict(h=b["h_mu_proj"] / b["h_mu_cos"]) for b in bases]),
        c_norm=span("c_norm_along1000", bases), val=span("val_loss", bases),
        l_base=span("logit_mean", bases), mu=span("mu_norm", bases),
        proj=span("h_mu_proj", bases), blown=len(blown), n_3000=len(of("bf16", "along3000")),
        blown_min=min((r["val_loss_end"] for r in blown), default=float("nan")),
        noise=span("gap_end", of("float32")),
        cures=span("gap_end", of("bf16_f32_head") + of("bf16_mu_center")),
        test={c: paired_test([r["gap_end"] for r in of(c)], [r["gap_end"] for r in of("float32")])
              for c in ("bf16_f32_head", "bf16_mu_center")},
        rho={s: rank_correlation([abs(r["logit_mean_end"]) for r in of("bf16", s)],
                                 [r["gap_end"] for r in of("bf16", s)])
             for s in ("along1000", "along3000", "ortho")},
        ortho_l=span("logit_mean_end", of("bf16", "ortho")), moved=(min(moved), max(moved)),
        ortho_l_f32=Upper(max(abs(r["logit_mean_end"]) for r in ortho_f32)),
        core_min=sum(wall) / 60, wall_min=min(wall), wall_max=max(wall),
        cpu=cpu_text(json.loads((results / "cpu.json").read_text())),
        table=(results / "table.md").read_text().rstrip("\n"),
        drift_1000=bf16_drift_table(runs), drift_3000=bf16_drift_table(runs, "along3000"),
        other=mechanism(results / "other_cpu") if (results / "other_cpu").is_dir() else {})


def paper_baselines() -> list[dict]:
    """The untied baselines of the authors' run table, each with h_mu_proj = l̄/‖μ‖ = h̄·μ̂."""
    return [r | dict(h_mu_proj=r["logit_mean"] / r["mu_norm"]) for r in read_csv(
        HERE.parent / "tests/data/oec_untied_runs.csv") if r["head"] == "baseline"]


def paired_test(gaps: list, reference: list) -> dict:
    """Gaps against the reference runs' of the same base, data order and shift (paired in order):
    the mean and root mean square of each, and the signed-rank p of the paired differences (cost:
    is the mean shifted?) and of the paired |gap| differences (size: do they stray further?)."""
    x, f = np.array(gaps), np.array(reference)
    return dict(n=len(x), mean=x.mean(), rms=np.sqrt(np.mean(x ** 2)), ref_mean=f.mean(),
                ref_rms=np.sqrt(np.mean(f ** 2)), p_cost=signed_rank_p(x - f),
                p_size=signed_rank_p(np.abs(x) - np.abs(f)))


def signed_rank_p(d: np.ndarray) -> float:
    """Wilcoxon's signed-rank test of differences d centred on 0, two-sided and exact: the share
    of the 2ⁿ sign patterns whose rank sum lies as far from its mean n(n + 1)/4 as d's does."""
    n, ranks = len(d), np.abs(d).argsort().argsort() + 1
    ways = np.zeros(n * (n + 1) // 2 + 1)  # ways[w]: the sign patterns of rank sum w
    ways[0] = 1
    for k in range(1, n + 1):
        ways[k:] = ways[k:] + ways[:-k]
    far = np.abs(np.arange(len(ways)) - n * (n + 1) / 4)
    return ways[far >= abs(ranks[d > 0].sum() - n * (n + 1) / 4) - 1e-9].sum() / 2 ** n


def rank_correlation(x: list, y: list) -> tuple:
    """Spearman's ρ of x and y and its two-sided exact p: the share of the n! orders of y whose ρ
    is at least as far from 0 (n ≤ 10)."""
    rx, ry = (np.argsort(np.argsort(v)) for v in (x, y))
    rho = lambda r: 1 - 6 * ((rx - r) ** 2).sum(-1) / (len(rx) ** 3 - len(rx))
    every = rho(np.array(list(itertools.permutations(ry)), dtype=np.int8))
    return rho(ry), np.mean(np.abs(every) >= abs(rho(ry)) - 1e-9)


def with_gaps(rows: list[dict]) -> list[dict]:
    """Each shifted run with gap_start, gap_end: its validation loss minus that of the run of the
    same base, numerics and data order without the shift."""
    reference = {(r["base"], r["condition"], r["seed"]): r for r in rows if r["shift"] == "none"}
    return [r | {f"gap_{when}": r[f"val_loss_{when}"] - ref[f"val_loss_{when}"]
                 for when in ("start", "end")}
            for r in rows if (ref := reference.get((r["base"], r["condition"], r["seed"])))]


def bf16_drift_table(runs: list[dict], shift: str = "along1000") -> str:
    """The bf16 runs of one shift: where l̄ went, and the gap of with_gaps."""
    rows = [[f"{r['base']:.0f}", f"{r['seed']:.0f}", f"{r['logit_mean_start']:,.0f}",
             f"{r['logit_mean_end']:,.0f}", f"{r['gap_end']:+.2f}"]
            for r in with_gaps(runs) if (r["condition"], r["shift"]) == ("bf16", shift)]
    return markdown_table([["base seed", "data order", "l̄ after the shift", "l̄ 300 steps later",
                            "gap (nats)"], *rows])


def cpu_text(cpu: dict) -> str:
    flags = ", ".join(cpu["flags"]) or "none of avx2, avx512f, avx512_bf16, amx_bf16"
    return f"{cpu['model']} ({flags}; torch {cpu['torch']}, kernels {cpu['capability']})"


ALIGNMENT_PAIRS = ("base", "lr1", "small", "batch16", "seq512", "long", "dense")  # run.sh's order
ALIGNMENT_ROWS = (  # b, c: the baseline's and μ-centering's row of results.csv; a: rarity.py's
    ("validation loss, baseline / μ-centering", "{b[test_loss]:.2f} / {c[test_loss]:.2f}"),
    ("‖μ‖", "{b[mu_norm]:.0f}"),
    ("l̄", "{b[logit_mean]:.1f}"),
    ("h̄·μ̂ (cos(h̄, μ)), train.py", "{b[h_mu_proj]:.3f} ({b[h_mu_cos]:.2f})"),
    ("h̄·μ̂ (cos(h̄, μ)), rarity.py", "{a[h_mu_proj]:.3f} ({a[h_mu_cos]:.2f})"),
    ("‖h̄‖ / RMS ‖h‖ / ‖g‖",
     "{a[h_mean_norm]:.2f} / {a[h_norm_rms]:.2f} / {a[ln_f_gain_norm]:.1f}"),
    ("share of the residual's mean square in its 2 largest coordinates (\\|g\\| there)",
     "{a[top2]:.3f} ({a[top2_gains]})"),
    ("reach aᵢ by training count: 0 / 1–9 / ≥ 10⁴", "{a[reach]}"),
    ("reach over the training targets (mean ± std)",
     "{a[target_reach]:.2f} ± {a[target_reach_std]:.2f}"),
    ("B_ratio", "{a[B_ratio]:.2f}"),
    ("rounding the loss can see (σ_l), baseline / centering",
     "{b[prec_err_round]:.4f} / {c[prec_err_round]:.4f}"),
    ("cross-entropy lost to bf16 (nats), baseline / centering",
     "{b[prec_ce_gap]:+.4f} / {c[prec_ce_gap]:+.4f}"),
    ("minutes of training, baseline / centering", "{b[minutes]:.0f} / {c[minutes]:.0f}"),
    ("the CPU that trained them (torch's kernels, bf16 flags)", "{b[cpu]}"))


def rarity(path: Path) -> dict:
    """A rarity.py JSON and its table cells: reach (the mean reach by training count), top2 (the
    share of the residual's mean square in its 2 largest coordinates) and their gains."""
    a = json.loads(path.read_text())
    bucket = {b["counts"]: b["reach_mean"] for b in a["buckets"]}
    top = a["residual_top"][:2]
    return a | dict(bucket=bucket, top2=sum(c["share"] for c in top),
                    top2_gain=max(abs(c["gain"]) for c in top),
                    top2_gains=", ".join(f"{abs(c['gain']):.3f}" for c in top),
                    reach=" / ".join(f"{bucket[k]:.2f}" if k in bucket else "–"
                                     for k in ("[0, 1)", "[1, 10)", "≥ 10000")))


def alignment(results: Path) -> dict:
    """Each pair's results_<pair>.csv by head (r) and its baseline's rarity JSON (a), the table;
    frozen: frozen_gain.csv by gain (trained, frozen) and seed."""
    pairs = [p for p in ALIGNMENT_PAIRS if (results / f"results_{p}.csv").exists()]
    r = {p: {row["head"]: row | dict(minutes=row["train_time_s"] / 60, cpu=cpu_kernels(
        results / f"cpu_{p}.json")) for row in read_csv(results / f"results_{p}.csv")}
         for p in pairs}
    a = {p: rarity(results / f"rarity_{p}.json") for p in pairs}
    table = markdown_table([["", *pairs], *([name, *(cell.format(
        b=r[p]["baseline"], c=r[p]["mu_center"], a=a[p]) for p in pairs)]
        for name, cell in ALIGNMENT_ROWS)])
    baselines, rarities = [r[p]["baseline"] for p in pairs], list(a.values())
    paper = paper_baselines()
    at_03, at_3e4 = ([row for row in paper if row["lr"] == lr] for lr in (0.3, 3e-4))
    bests = [min(row["test_loss"] for row in paper if row["size"] == size)  # each size's best η
             for size in {row["size"] for row in paper}]
    frozen = {}
    for row in read_csv(results / "frozen_gain.csv"):
        frozen.setdefault(row["gain"], []).append(row)
    return dict(r=r, a=a, table=table, n_pairs=len(pairs), proj=span("h_mu_proj", baselines),
                paper=len(paper), paper_aligned=sum(abs(row["h_mu_proj"]) >= 0.5 for row in paper),
                paper_proj=span("h_mu_proj", at_03),
                paper_proj_low=span("h_mu_proj", at_3e4), paper_l=span("logit_mean", at_03),
                paper_loss=span("test_loss", at_03), paper_best=(min(bests), max(bests)),
                mu=span("mu_norm", baselines), cost_max=Upper(span("prec_ce_gap", baselines)[1]),
                rms=span("h_norm_rms", rarities), gain=span("ln_f_gain_norm", rarities),
                top2_min=Lower(span("top2", rarities)[0]),
                top2_gain=Upper(span("top2_gain", rarities)[1]), frozen=frozen)


def cpu_kernels(path: Path) -> str:  # a cpu.json in a table cell: the bf16 kernels it had
    cpu = json.loads(path.read_text())
    return ", ".join([cpu["capability"]] + [f for f in cpu["flags"] if "bf16" in f])


def proxy(results: Path) -> dict:
    """results.csv by run name (run), table.csv by tie, size and head (t), offsets_bf16.json;
    above: by untied bf16 head|seed and η, min(L, L₀) − that run group's best loss."""
    rows = read_csv(results / "results.csv")
    t = {f"{r['tie']}|{r['size']}|{r['head']}": r for r in read_csv(results / "table.csv")}
    shifts = json.loads((results / "offsets_bf16.json").read_text())["offsets"]
    untied = lambda head: [r for r in rows if r["head"] == head and r["tie"] == "false"]
    above, high = {}, {}
    for head in ("baseline", "mu_center"):
        for seed in (0, 1):
            runs = [r for r in untied(head) if (r["dtype"], r["seed"]) == ("bfloat16", seed)]
            best = min(r["test_loss"] for r in runs)
            above[f"{head}|{seed}"] = {f"{r['lr']:g}": min(r["test_loss"], r["init_loss"]) - best
                                       for r in runs}
        large = [above[f"{head}|{seed}"][lr] for seed in (0, 1) for lr in ("0.3", "1")]
        high[head] = (min(large), max(large))  # at η = 0.3 and 1, both seeds
    return dict(run={r["run"]: r for r in rows}, t=t, runs=len(rows), above=above, high=high,
                l=span("logit_mean", untied("baseline")),
                cost_max=Upper(max(abs(r["prec_ce_gap"]) for r in untied("baseline"))),
                core_min=sum(r["train_time_s"] for r in rows) / 60,
                centred_mu_max=span("mu_norm", untied("mu_center"))[1],
                offsets=markdown_table([
                    ["mean logit after the shift, L", *(f"{o['offset']:g}" for o in shifts)],
                    ["cross-entropy lost to bf16 (nats)",
                     *(f"{o['prec_ce_gap']:+.4f}" for o in shifts)]]))


WRITTEN = dict(mechanism=mechanism, alignment=alignment, proxy=proxy)


def render(name: str) -> str:
    values = WRITTEN[name](HERE / name / "results")
    return (HERE / name / "README.in.md").read_text().format(**values)


if __name__ == "__main__":
    for name in sys.argv[1:] or WRITTEN:
        if name not in WRITTEN:
            raise SystemExit(f"pages.py: error: there is no page {name!r}; name one of "
                             f"{', '.join(WRITTEN)}.")
        (HERE / name / "README.md").write_text(render(name))
        print(f"wrote {HERE / name / 'README.md'}")

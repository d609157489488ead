"""Writes experiments/alignment/README.md from the committed results (experiments/pages.py)."""
import json
import sys
from pathlib import Path

FOLDER = Path(__file__).resolve().parent
sys.path.insert(0, str(FOLDER.parents[1]))  # the repository root
from experiments import pages

PAIRS = ("base", "lr1", "small", "batch16", "seq512", "long", "dense")  # run.sh's order


def values(results: Path) -> dict:
    """results.csv by pair and head (r), the baselines' rarity JSONs by pair (a), the table."""
    r = {}
    for row in pages.read_csv(results / "results.csv"):
        r.setdefault(row["run"].split("/")[0], {})[row["head"]] = row
    pairs = [p for p in PAIRS if p in r]
    a = {p: json.loads((results / f"rarity_{p}.json").read_text()) for p in pairs}
    for p in pairs:  # buckets by their training counts, top-2 residual coordinates
        a[p]["bucket"] = {b["counts"]: b for b in a[p]["buckets"]}
        a[p]["top2"] = sum(c["share"] for c in a[p]["residual_top"][:2])
    both = lambda key, f: lambda p: f"{r[p]['baseline'][key]:{f}} / {r[p]['mu_center'][key]:{f}}"
    reach = lambda p: " / ".join(f"{a[p]['bucket'][k]['reach_mean']:.2f}" if k in a[p]["bucket"]
                                 else "–" for k in ("[0, 1)", "[1, 10)", "≥ 10000"))
    rows = {  # results.csv: train.py's final statistics; rarity JSONs: rarity.py's
        "validation loss, baseline / μ-centering": both("test_loss", ".2f"),
        "‖μ‖": lambda p: f"{r[p]['baseline']['mu_norm']:.0f}",
        "l̄": lambda p: f"{r[p]['baseline']['logit_mean']:.1f}",
        "h̄·μ̂ (cos(h̄, μ)), train.py": lambda p: f"{r[p]['baseline']['h_mu_proj']:.3f} "
                                               f"({r[p]['baseline']['h_mu_cos']:.2f})",
        "h̄·μ̂ (cos(h̄, μ)), rarity.py": lambda p: f"{a[p]['h_mu_proj']:.3f} ({a[p]['h_mu_cos']:.2f})",
        "‖h̄‖ / RMS ‖h‖ / ‖g‖": lambda p: f"{a[p]['h_mean_norm']:.2f} / {a[p]['h_norm_rms']:.2f}"
                                        f" / {a[p]['ln_f_gain_norm']:.1f}",
        "share of the residual's mean square in its 2 largest coordinates (\\|g\\| there)":
            lambda p: f"{a[p]['top2']:.3f} (" + ", ".join(
                f"{abs(c['gain']):.3f}" for c in a[p]["residual_top"][:2]) + ")",
        "reach aᵢ by training count: 0 / 1–9 / ≥ 10⁴": reach,
        "reach over the training targets (mean ± std)":
            lambda p: f"{a[p]['target_reach']:.2f} ± {a[p]['target_reach_std']:.2f}",
        "B_ratio": lambda p: f"{a[p]['B_ratio']:.2f}",
        "rounding the loss can see (σ_l), baseline / centering": both("prec_err_round", ".4f"),
        "cross-entropy lost to bf16 (nats), baseline / centering": both("prec_ce_gap", "+.4f"),
        "minutes of training, baseline / centering":
            lambda p: f"{r[p]['baseline']['train_time_s'] / 60:.0f} / "
                      f"{r[p]['mu_center']['train_time_s'] / 60:.0f}"}
    table = "\n".join([f"| | {' | '.join(pairs)} |", "|---" * (len(pairs) + 1) + "|"] + [
        f"| {name} | " + " | ".join(cell(p) for p in pairs) + " |" for name, cell in rows.items()])
    base = [r[p]["baseline"] for p in pairs]
    return dict(r=r, a=a, table=table, n_pairs=len(pairs),
                proj_min=min(b["h_mu_proj"] for b in base), proj_max=max(b["h_mu_proj"] for b in base),
                cost_max=max(b["prec_ce_gap"] for b in base),
                mu_min=min(b["mu_norm"] for b in base), mu_max=max(b["mu_norm"] for b in base),
                rms_min=min(a[p]["h_norm_rms"] for p in pairs),
                rms_max=max(a[p]["h_norm_rms"] for p in pairs),
                gain_min=min(a[p]["ln_f_gain_norm"] for p in pairs),
                gain_max=max(a[p]["ln_f_gain_norm"] for p in pairs),
                top2_min=min(a[p]["top2"] for p in pairs),
                top2_gain=max(abs(c["gain"]) for p in pairs for c in a[p]["residual_top"][:2]))


if __name__ == "__main__":
    pages.write(FOLDER, values(FOLDER / "results"))

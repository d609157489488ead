"""The numbers experiments/alignment/README.md quotes, from its committed results."""
import json
from pathlib import Path

from experiments import pages

PAIRS = ("base", "lr1", "small", "batch16", "seq512", "long", "dense")  # run.sh's order
ROWS = (  # b, c: the baseline's and μ-centering's row of results.csv (train.py); a: rarity.py's
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
    ("minutes of training, baseline / centering", "{b[minutes]:.0f} / {c[minutes]:.0f}"))


def values(results: Path) -> dict:
    """results.csv by pair and head (r), the baselines' rarity JSONs by pair (a), the table."""
    r = {}
    for row in pages.read_csv(results / "results.csv"):
        r.setdefault(row["run"].split("/")[0], {})[row["head"]] = row | dict(
            minutes=row["train_time_s"] / 60)
    pairs = [p for p in PAIRS if p in r]
    a = {p: json.loads((results / f"rarity_{p}.json").read_text()) for p in pairs}
    for p in pairs:
        bucket = {b["counts"]: b["reach_mean"] for b in a[p]["buckets"]}
        top = a[p]["residual_top"][:2]
        a[p] |= dict(bucket=bucket, top2=sum(c["share"] for c in top),
                     top2_gains=", ".join(f"{abs(c['gain']):.3f}" for c in top),
                     reach=" / ".join(f"{bucket[k]:.2f}" if k in bucket else "–"
                                      for k in ("[0, 1)", "[1, 10)", "≥ 10000")))
    table = "\n".join([f"| | {' | '.join(pairs)} |", "|---" * (len(pairs) + 1) + "|"] + [
        f"| {name} | " + " | ".join(cell.format(b=r[p]["baseline"], c=r[p]["mu_center"], a=a[p])
                                    for p in pairs) + " |" for name, cell in ROWS])
    span = lambda key, runs: (min(run[key] for run in runs), max(run[key] for run in runs))
    baselines, rarities = [r[p]["baseline"] for p in pairs], [a[p] for p in pairs]
    return dict(r=r, a=a, table=table, n_pairs=len(pairs), proj=span("h_mu_proj", baselines),
                mu=span("mu_norm", baselines), cost=span("prec_ce_gap", baselines),
                rms=span("h_norm_rms", rarities), gain=span("ln_f_gain_norm", rarities),
                top2=span("top2", rarities),
                top2_gain=max(abs(c["gain"]) for p in pairs for c in a[p]["residual_top"][:2]))

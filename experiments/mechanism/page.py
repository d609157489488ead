"""The numbers experiments/mechanism/README.md quotes, from its committed results."""
import json
from pathlib import Path

from experiments import pages


def values(results: Path) -> dict:
    """The numbers the page quotes: the CSVs by condition and shift, and what they add up to."""
    gaps, runs = pages.read_csv(results / "gaps.csv"), pages.read_csv(results / "runs.csv")
    g = {}
    for row in gaps:
        g.setdefault(row["condition"], {})[row["shift"]] = row
    ends = lambda condition, shift: sorted(r["val_loss_end"] for r in runs
                                           if r["condition"] == condition and r["shift"] == shift)
    base = json.loads((results / "base.json").read_text())
    noise = [row for row in g["float32"].values() if row["shift"] != "none"]
    wall = [r["wall_s"] for r in runs]
    paper, = [r for r in pages.read_csv(pages.HERE.parent / "tests/data/oec_untied_runs.csv")
              if (r["size"], r["lr"], r["head"]) == ("16M", 0.3, "baseline")]
    return dict(g=g, base=base, paper=paper, h_mean_norm=base["h_mu_proj"] / base["h_mu_cos"],
                bf16_none=ends("bf16", "none"), bf16_1000=ends("bf16", "along1000"),
                bf16_3000=ends("bf16", "along3000"),
                l_3000=min(r["logit_mean_end"] for r in runs
                           if (r["condition"], r["shift"]) == ("bf16", "along3000")),
                noise_min=min(r["gap_min"] for r in noise),
                noise_max=max(r["gap_max"] for r in noise),
                runs=len(runs), core_min=sum(wall) / 60, wall_min=min(wall), wall_max=max(wall),
                table=(results / "table.md").read_text().rstrip("\n"))

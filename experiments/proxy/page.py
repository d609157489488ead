"""The numbers experiments/proxy/README.md quotes, from its committed results."""
import json
from pathlib import Path

from experiments import pages


def values(results: Path) -> dict:
    """results.csv by run name (run), table.csv by tie, size and head (t), offsets_bf16.json."""
    rows = pages.read_csv(results / "results.csv")
    run = {r["run"]: r for r in rows}
    t = {f"{r['tie']}|{r['size']}|{r['head']}": r for r in pages.read_csv(results / "table.csv")}
    shifts = json.loads((results / "offsets_bf16.json").read_text())["offsets"]
    row = lambda name, cells: f"| {name} | " + " | ".join(cells) + " |"
    baselines = [r["logit_mean"] for r in rows if r["head"] == "baseline" and r["tie"] == "false"]
    return dict(run=run, t=t, l_min=min(baselines), l_max=max(baselines), runs=len(rows),
                core_min=sum(r["train_time_s"] for r in rows) / 60,
                centred_mu_max=max(r["mu_norm"] for r in rows if r["head"] == "mu_center"
                                   and r["tie"] == "false"),
                offsets="\n".join([
                    row("mean logit after the shift, L", (f"{o['offset']:g}" for o in shifts)),
                    "|---" * (len(shifts) + 1) + "|",
                    row("cross-entropy lost to bf16 (nats)",
                        (f"{o['prec_ce_gap']:+.4f}" for o in shifts))]))

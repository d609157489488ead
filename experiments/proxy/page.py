"""Writes experiments/proxy/README.md from the committed results (experiments/pages.py)."""
import json
import sys
from pathlib import Path

FOLDER = Path(__file__).resolve().parent
sys.path.insert(0, str(FOLDER.parents[1]))  # the repository root
from experiments import pages


def values(results: Path) -> dict:
    """results.csv by run name (run), table.csv by tie, size and head (t), offsets_bf16.json."""
    rows = pages.read_csv(results / "results.csv")
    run = {r["run"]: r for r in rows}
    t = {(r["tie"], r["size"], r["head"]): r for r in pages.read_csv(results / "table.csv")}
    offsets = json.loads((results / "offsets_bf16.json").read_text())
    baselines = [r["logit_mean"] for r in rows if r["head"] == "baseline" and r["tie"] == "false"]
    return dict(run=run, t={f"{tie}|{size}|{head}": r for (tie, size, head), r in t.items()},
                l_min=min(baselines), l_max=max(baselines), runs=len(rows),
                core_min=sum(r["train_time_s"] for r in rows) / 60,
                centred_mu_max=max(r["mu_norm"] for r in rows if r["head"] == "mu_center"
                                   and r["tie"] == "false"),
                offsets="\n".join(["| mean logit after the shift, L | " + " | ".join(f"{o['offset']:g}" for o in
                                                               offsets["offsets"]) + " |",
                                   "|---" * (len(offsets["offsets"]) + 1) + "|",
                                   "| cross-entropy lost to bf16 (nats) | " + " | ".join(
                                       f"{o['prec_ce_gap']:+.4f}" for o in offsets["offsets"])
                                   + " |"]))


if __name__ == "__main__":
    pages.write(FOLDER, values(FOLDER / "results"))

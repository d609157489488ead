"""Every run's logged statistics by step, as one CSV that the page reads (train.py logs them
every --log_every steps in RUN/log.jsonl; run folders are not committed).
    python experiments/frequency/trajectories.py runs/frequency --out results/trajectories.csv
"""
import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root, whose modules these import
import sweep

KEYS = ("step", "loss", "logit_mean", "mu_norm", "h_mu_proj", "h_mu_cos", "prec_ce_gap")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", help="a folder of sweeps, each a folder of run folders")
    p.add_argument("--out", required=True, help="the CSV to write")
    args = p.parse_args(argv)
    with open(args.out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(("run", *KEYS))
        for run in sorted(log.parent for log in Path(args.runs).glob("*/*/log.jsonl")):
            writer.writerows((f"{run.parent.name}/{run.name}", *(f"{r[k]:.6g}" for k in KEYS))
                             for r in sweep.read_log(run) if "h_mu_cos" in r)


if __name__ == "__main__":
    main()

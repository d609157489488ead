"""Every run's logged statistics by step, as one CSV that the page reads (train.py logs them
every --log_every steps in RUN/log.jsonl; run folders are not committed). `loss` is the step's
training loss as train.py logs it: the cross-entropy, for the heads run here.
    python experiments/frequency/trajectories.py runs/frequency --out results/trajectories.csv
"""
import argparse
import csv
import json
from pathlib import Path

KEYS = ("step", "loss", "logit_mean", "mu_norm", "h_mu_proj", "h_mu_cos", "prec_ce_gap")


def log_records(log: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    except ValueError:
        raise SystemExit(f"trajectories.py: error: {log} is not a log of train.py (a line is not "
                         "JSON); name a folder of sweep.py's sweeps.") from None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", help="a folder of sweeps, each a folder of run folders")
    p.add_argument("--out", required=True, help="the CSV to write")
    args = p.parse_args(argv)
    with open(args.out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(("run", *KEYS))
        for log in sorted(Path(args.runs).glob("*/*/log.jsonl")):
            writer.writerows((f"{log.parent.parent.name}/{log.parent.name}",
                              *(f"{r[k]:.6g}" for k in KEYS))
                             for r in log_records(log) if "h_mu_cos" in r)


if __name__ == "__main__":
    main()

"""train.py with the final LayerNorm's gain g frozen at 1 (experiments/frequency/README.md): the
ablation that lifts the cap ‖h̄‖ ≤ RMS ‖h‖, which small gains on the massive coordinates hold
far below ‖g‖.
    python experiments/frequency/frozen_gain.py TRAIN.PY-OPTIONS...
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root, whose modules these import
import model
import train


def frozen_gain(config: dict):
    gpt = model.from_config(config)  # model.py's: below, train.from_config becomes this function
    gpt.ln_f.weight.requires_grad_(False)  # no gradient: AdamW never moves it
    return gpt


if __name__ == "__main__":
    train.from_config = frozen_gain
    train.main(sys.argv[1:])

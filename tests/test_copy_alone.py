"""heads.py and data.py each work copied alone into another project (DESIGN.md's promise)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
USE = """
import numpy as np, torch
import heads, data
h, w, t = torch.randn(5, 8), torch.randn(11, 8, requires_grad=True), torch.randint(0, 11, (5,))
head = heads.build("mu_center")
loss, stats = head(h, w, t)
loss.backward()
head.after_step(w.data)
assert w.data.mean(0).abs().max() < 1e-6
data.write_shard("s_train_000.bin", np.arange(200) % 11)
data.write_shard("s_val_000.bin", np.arange(100) % 11)
x, y = data.ShardLoader(".", 2, 8, 0, 1, "train").next_batch()
assert torch.equal(y[:, :-1], x[:, 1:])
import sys
assert not any(m in sys.modules for m in ("model", "store", "prepare", "runs", "measure"))
print("ok")
"""


def test_heads_and_data_work_copied_alone(tmp_path):
    for name in ("heads.py", "data.py"):
        shutil.copy(ROOT / name, tmp_path / name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", USE], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr

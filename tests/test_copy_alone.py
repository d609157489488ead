"""heads.py and data.py each work copied alone into another project (DESIGN.md's promise): they
import nothing of it; data.py reads the files its users have, and its messages name no file of
this project but data.py itself."""
import json
import os
import re
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
assert not any(m in sys.modules for m in ("model", "prepare", "train"))
print("ok")
"""
NANOGPT = """
import numpy as np, torch
import heads, data
tokens = np.random.default_rng(0).integers(0, 50257, size=3000).astype(np.uint16)
for split, part in (("train", tokens[:2700]), ("val", tokens[2700:])):  # as nanoGPT writes them
    memmap = np.memmap(f"{split}.bin", dtype=np.uint16, mode="w+", shape=part.shape)
    memmap[:] = part
    memmap.flush()
emb = torch.nn.Embedding(50257, 8)
head, opt = heads.build("mu_center"), torch.optim.SGD(emb.parameters(), lr=0.1)
for order in data.ORDERS:
    x, y = data.ShardLoader(".", 4, 16, order=order, seed=1).next_batch()
    assert torch.equal(x[:, 1:], y[:, :-1]) and y.max() < 50257
    loss, _ = head(emb(x).flatten(0, 1), emb.weight, y.flatten())   # a tied toy model
    loss.backward()
    opt.step()
    head.after_step(emb.weight.data)
first = next(iter(data.val_batches(".", 64, 4, 16)))[0]
assert torch.equal(first.flatten(), torch.from_numpy(tokens[2700:2764].astype(np.int64)))
print("ok")
"""
COPIER = """
import torch, torch.nn.functional as F
import heads
h = torch.randn(2, 6, 8).bfloat16()
w, t = torch.randn(11, 8), torch.randint(0, 11, (2, 6))
try:
    heads.build("baseline")(h, w, t)
except RuntimeError:
    print("mixed dtypes refused")
loss, stats = heads.build("baseline", matmul_dtype=torch.bfloat16)(h, w, t)
head = heads.build("soft_cap", cap=15)
per_token = F.cross_entropy(head.logits(h.float(), w).flatten(0, -2), t.flatten(),
                            ignore_index=heads.IGNORE, reduction="none")
assert torch.allclose(per_token.mean(), head(h.float(), w, t)[0]) and per_token.shape == (12,)
print("ok")
"""
ERRORS = """
import json, os, numpy as np, data

def where_raised(err):
    tb = err.__traceback__
    while tb.tb_next:
        tb = tb.tb_next
    return tb.tb_lineno

def shard(name, n=100, edit=None):
    data.write_shard(name, np.arange(n))
    raw = bytearray(open(name, "rb").read())
    if edit:
        edit(raw)
    open(name, "wb").write(bytes(raw))
    return name

def header_int(i, value):
    return lambda raw: raw.__setitem__(slice(4 * i, 4 * i + 4), np.int32(value).tobytes())

def cut(raw):
    del raw[500:]

def odd(raw):
    raw[0:4] = b"odd!!"                                     # no magic, and an odd size

for folder in ("empty", "ok", "short", "zero_val"):
    os.makedirs(folder)
shard("ok/a_train.bin", 500), shard("ok/a_val.bin", 200), shard("short/a_train.bin", 10)
shard("zero_val/a_train.bin", 500), shard("zero_val/a_val.bin", 0)
loader = data.ShardLoader("ok", 2, 8, order="random")
CASES = [
    lambda: data.write_shard("w.bin", [70000]),
    lambda: data.shard_length(shard("cut.bin", edit=cut)),
    lambda: data.shard_length(shard("version.bin", edit=header_int(1, 7))),
    lambda: data.shard_length(shard("negative.bin", edit=header_int(2, -5))),
    lambda: data.shard_length(shard("more.bin", edit=header_int(2, 101))),
    lambda: data.shard_length(shard("fewer.bin", edit=header_int(2, 99))),
    lambda: data.read_shard(shard("odd.bin", edit=odd)),
    lambda: data.shard_length(shard("bare.bin", edit=header_int(0, 7))),   # a header required
    lambda: data.ShardLoader("missing", 2, 8),
    lambda: data.ShardLoader("empty", 2, 8),
    lambda: data.ShardLoader("ok", 2, 8, world_size=2, step_rows=6),
    lambda: data.ShardLoader("short", 2, 8),
    lambda: data.ShardLoader("ok", 2, 8).load_state_dict(loader.state_dict()),
    lambda: data.ShardLoader("ok", 2, 8).load_state_dict({"shard": 3, "position": 0}),
    lambda: data.val_batches("ok", 10**6, 2, 8),
    lambda: data.val_steps_held("zero_val", 2, 8),
]
found = []
for case in CASES:
    try:
        case()
    except (ValueError, FileNotFoundError) as err:
        found.append([where_raised(err), str(err)])
    else:
        found.append([None, "no error"])
print(json.dumps(found))
"""


def copy_alone(folder):
    for name in ("heads.py", "data.py"):
        shutil.copy(ROOT / name, folder / name)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return lambda *argv: subprocess.run([sys.executable, *argv], cwd=folder, env=env,
                                        capture_output=True, text=True)


def test_heads_and_data_work_copied_alone(tmp_path):
    done = copy_alone(tmp_path)("-c", USE)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_what_the_docstring_tells_a_copier_holds_in_the_copy(tmp_path):
    """A bf16 h with a float32 weight needs matmul_dtype; the per-token loss recipe."""
    done = copy_alone(tmp_path)("-c", COPIER)
    assert done.returncode == 0 and done.stdout.split() == ["mixed", "dtypes", "refused", "ok"], \
        done.stderr


def test_a_nanogpt_folder_of_headerless_bins_trains_in_the_copy(tmp_path):
    done = copy_alone(tmp_path)("-c", NANOGPT)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_every_error_of_the_copied_data_py_names_only_what_the_copy_has(tmp_path):
    run = copy_alone(tmp_path)
    done = run("-c", ERRORS)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    lines = (tmp_path / "data.py").read_text(encoding="utf-8").splitlines()
    raises = {n for n, line in enumerate(lines, 1) if line.lstrip().startswith("raise ")
              and "SystemExit" not in line}
    assert {line for line, _ in found} == raises            # every raise of data.py, triggered
    messages = [message for _, message in found]
    assert len(set(messages)) == len(messages)
    for message in messages:                                # one sentence, destroying nothing
        assert "\n" not in message and "delete" not in message, message
        assert set(re.findall(r"\w+\.py\b", message)) <= {"data.py"}, message

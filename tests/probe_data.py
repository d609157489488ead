"""Probe the data commands as a new user would, and classify each outcome (issue 19):

    SENTENCE   refused with one line, nothing written where it should not be
    TRACEBACK  a Python traceback
    SILENT     it succeeded although the input was bad (or wrote what it should not)

    python tests/probe_data.py [CHECKOUT]      (default: this checkout; `check` is
                                               `store.py check` here, `data.py check` before)
Not collected by pytest (no test_ prefix): it runs real commands, some of them for seconds.
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent)
CHECK = "store.py" if (ROOT / "store.py").exists() else "data.py"


def shard(path, n=100, magic=20240520, version=1, count=None, extra=b"", cut=0):
    header = np.zeros(256, dtype="<i4")
    header[:3] = magic, version, n if count is None else count
    raw = header.tobytes() + np.arange(n, dtype="<u2").tobytes() + extra
    path.write_bytes(raw[:len(raw) - cut] if cut else raw)


def folder_with(tmp, **bad):
    folder = Path(tempfile.mkdtemp(dir=tmp))
    shard(folder / "x_train_000000.bin", **bad)
    shard(folder / "x_val_000000.bin")
    return folder


def run(tmp, args, cwd=None):
    done = subprocess.run([sys.executable, *args], cwd=cwd or tmp, capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return done.returncode, done.stdout + done.stderr


def classify(code, output, wrote_anyway):
    if "Traceback" in output:
        return "TRACEBACK"
    if code == 0 or wrote_anyway:
        return "SILENT"
    lines = output.strip().splitlines()
    argparse_error = code == 2 and ": error: " in lines[-1]     # its usage line, then one line
    return "SENTENCE" if len(lines) == 1 or argparse_error else "TRACEBACK"


def main():
    tmp = Path(tempfile.mkdtemp())
    cases = []
    check = [str(ROOT / CHECK), "check"]
    for name, bad in [("wrong magic", dict(magic=7)), ("wrong version", dict(version=2)),
                      ("count larger than the file", dict(count=150)),
                      ("count smaller than the file", dict(count=50)),
                      ("negative count", dict(count=-5)), ("one byte appended", dict(extra=b"x")),
                      ("shorter than the header", dict(n=0, cut=600)),
                      ("truncated mid-tokens", dict(cut=3))]:
        folder = folder_with(tmp, **bad)
        code, out = run(tmp, [*check, str(folder)])
        cases.append((f"check: {name}", code, out, (folder / "manifest.json").exists()))
    empty = Path(tempfile.mkdtemp(dir=tmp))
    code, out = run(tmp, [*check, str(empty)])
    cases.append(("check: empty folder", code, out, (empty / "manifest.json").exists()))
    here = Path(tempfile.mkdtemp(dir=tmp))
    (here / "notes.txt").write_text("a folder in use")      # a user's current folder
    code, out = run(tmp, [str(ROOT / "prepare.py"), "synthetic", "--task", "repeat", "--vocab",
                          "5", "--tokens", "1000", "--out", ""], cwd=here)
    cases.append(("prepare synthetic --out ''", code, out, any(here.glob("*.bin"))))
    one = tmp / "one.txt"
    one.write_text("a")
    code, out = run(tmp, [str(ROOT / "prepare.py"), "text", str(one), "--out", str(tmp / "one")])
    cases.append(("prepare text, a one-character file", code, out,
                  any((tmp / "one").glob("*.bin"))))
    code, out = run(tmp, [str(ROOT / "prepare.py"), "synthetic", "--task", "markov", "--vocab",
                          "5", "--tokens", str(10 ** 13), "--out", str(tmp / "big")])
    cases.append(("prepare synthetic --tokens 10**13", code, out, False))
    width = max(len(c[0]) for c in cases)
    print(f"{'case':{width}}  outcome    first line")
    for name, code, out, wrote in cases:
        first = (out.strip().splitlines() or [""])[-1 if "Traceback" in out or code == 2 else 0]
        print(f"{name:{width}}  {classify(code, out, wrote):9}  {first[:110]}")


if __name__ == "__main__":
    main()

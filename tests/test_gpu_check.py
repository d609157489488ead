"""The GPU path, checked where a CPU can: scripts/gpu_check.py's CPU rehearsal at its own
defaults brings back a row of every phase, and its parts work on made-up rows; float32 is
float32 unless TF32 is asked for; the first speed window leaves out the step that compiles; the
chunked loss stays eager under torch.compile."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import heads
import prepare
import train

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_check  # noqa: E402


def tiny(data_dir, out_dir, *extra, steps=3):
    return ["--size", "tiny", "--device", "cpu", "--vocab_size", "64", "--data", str(data_dir),
            "--out_dir", str(out_dir), "--steps", str(steps), "--warmup", "1", "--seq_len", "32",
            "--batch_size", "2", "--eval_tokens", "64", "--stat_tokens", "64", *extra]


def jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_float32_is_float32_unless_tf32_is_asked_for(markov_dir, tmp_path, monkeypatch):
    precisions = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", precisions.append)
    train.main(tiny(markov_dir, tmp_path / "run", steps=1))
    train.main(tiny(markov_dir, tmp_path / "tf32", "--tf32", steps=1))
    assert precisions == ["highest", "high"]  # "high" lets float32 matmuls use TF32


def test_the_first_speed_window_leaves_out_the_step_that_compiles(markov_dir, tmp_path,
                                                                  monkeypatch):
    """On a clock that the first step moves by 100 s (compiling) and every other by 1 s, the
    windows read exactly 1 s per step; the first step itself reports no speed."""
    clock, real_step = [0.0], train.train_step

    def step_on_the_clock(*args):
        clock[0] += 100.0 if clock[0] == 0 else 1.0
        return real_step(*args)

    monkeypatch.setattr(train.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(train, "train_step", step_on_the_clock)
    train.main(tiny(markov_dir, tmp_path, "--log_every", "1"))
    assert [r["tok_per_s"] for r in jsonl(tmp_path / "log.jsonl")] == [None, 2 * 32, 2 * 32]


def test_the_chunked_loss_stays_eager_under_compile():
    """Compiled, the chunk loop would be unrolled into the graph with every chunk's buffers
    alive at once; it runs outside the graph instead."""
    graphs = []

    def record(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    head = heads.build("z_loss", chunk_size=4)
    h, weight = torch.randn(32, 8, requires_grad=True), torch.randn(16, 8, requires_grad=True)
    targets = torch.randint(0, 16, (32,))
    try:
        loss, _ = torch.compile(lambda *a: head(*a), backend=record)(h, weight, targets)
    finally:
        torch._dynamo.reset()
    assert loss.item() == pytest.approx(heads.build("z_loss")(h, weight, targets)[0].item())
    ops = {str(node.target) for graph in graphs for module in graph.modules()
           if isinstance(module, torch.fx.GraphModule) for node in module.graph.nodes}
    assert not [op for op in ops if any(part in op for part in ("mm", "cross_entropy", "exp"))]


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


def wait_for(condition, seconds):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.1)


def rows_now(out):
    """{file: its row count} of the result files under out, each parsed whole (a half-written
    file raises)."""
    rows = {}
    for path in out.glob("*.json*"):
        if path.suffix == ".json":
            result = json.loads(path.read_text())
            rows[path.name] = len(result["train"]) + len(result["head_alone"])
        elif path.suffix == ".jsonl":
            rows[path.name] = len(jsonl(path))
    return rows


def test_the_cpu_rehearsal_at_its_defaults_brings_back_a_row_of_every_phase(tmp_path):
    """Every phase publishes its rows whole: read at any moment, every file parses and no row
    measured before is gone; at the end a row of every kind, in 8 files, and no child left."""
    data = tmp_path / "text"
    prepare.prepare_text([ROOT / "tests" / "assets" / "paradise_regained.txt"], data)
    env = {**os.environ, "DEVICE": "cpu", "OUT": str(tmp_path / "out"), "DATA": str(data),
           "SCRATCH": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    proc = subprocess.Popen([sys.executable, "scripts/gpu_check.py"], cwd=ROOT, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, seen = tmp_path / "out", {}
    while proc.poll() is None:
        for name, count in rows_now(out).items():
            assert count >= seen.get(name, 0), name
            seen[name] = count
        time.sleep(0.1)
    printed = proc.stdout.read()
    assert proc.returncode == 0, printed
    assert sorted(path.name for path in out.iterdir()) == [
        "a_step.json", "b_heads.json", "c_head_alone.json", "d_long.jsonl", "e_step.json",
        "gpu_check.log", "phases.jsonl", "table.txt"]
    phases = {row["phase"]: row for row in jsonl(out / "phases.jsonl")}
    assert phases["env"]["py_sha256"] and "compute_mode" in phases["env"]
    assert all(phases[name]["rc"] == 0 for name in "abce"), phases
    assert phases["a"]["graph_breaks"] == 0, (out / "gpu_check.log").read_text()
    a = json.loads((out / "a_step.json").read_text())
    assert a["settings"]["compile"] and a["settings"]["backend"] == "aot_eager"
    assert [r["head"] for r in a["train"]] == ["baseline", "mu_center"]
    assert all(r["tokens_per_s"] > 0 and r["loss_chunk"] == 0 for r in a["train"])
    b = json.loads((out / "b_heads.json").read_text())["train"]
    assert [(r["head"], r["head_dtype"]) for r in b] == \
        [(h, "auto") for h in ("baseline", "soft_cap", "z_loss", "mu_loss")] + \
        [("baseline", "float32")]
    c = json.loads((out / "c_head_alone.json").read_text())["head_alone"]
    paths = {"plain", "chunked"} | ({"torch op"} if hasattr(torch.nn.functional,
                                                           "linear_cross_entropy") else set())
    assert {r["loss_path"] for r in c} == paths
    steps = phases["d_plan"]["steps"]
    assert phases["d_plan"]["runs"] == 3 and gpu_check.MIN_STEPS <= steps <= 20
    long = [r for r in jsonl(out / "d_long.jsonl") if "step" in r]
    assert max(r["step"] for r in long) == steps  # the plan records the steps its runs take
    assert {r["run"] for r in long} == {"baseline_auto_lr0.3", "mu_center_auto_lr0.3",
                                        "baseline_float32_lr0.3"}
    assert all({"mu_norm", "logit_mean", "h_mu_proj"} <= set(r) for r in long)
    e = json.loads((out / "e_step.json").read_text())["train"]
    assert [(r["size"], r["head"]) for r in e] == [("small", "baseline")]
    table = (out / "table.txt").read_text()
    assert table in printed and table.count("\nd ") == 3 and table.count("\nc ") == len(c)
    assert not processes_mentioning(str(tmp_path))


SLEEPER = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
           "signal.SIG_IGN); time.sleep(60)"]  # deaf to TERM


def test_a_capped_run_is_cut_at_its_cap_and_killed_after_its_grace(tmp_path):
    ticks, log = [], tmp_path / "log"
    begin = time.monotonic()
    rc = gpu_check.capped_run([SLEEPER, ["echo", "hi"]], log, cap_s=1, env=os.environ,
                              tick=lambda: ticks.append(1), grace_s=1)
    assert rc == 124 and 2 <= time.monotonic() - begin < 10 and ticks
    assert log.read_text() == "hi\n"
    assert gpu_check.capped_run([["false"]], log, 60, os.environ) == 1


def test_the_children_of_a_killed_driver_die_with_it(tmp_path):
    """PR_SET_PDEATHSIG: a driver killed by SIGKILL takes its children along."""
    script = (f"import os, sys; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import gpu_check; "
              f"gpu_check.capped_run([{SLEEPER!r}], {str(tmp_path / 'log')!r}, 60, os.environ)")
    proc = subprocess.Popen([sys.executable, "-c", script],
                            env={**os.environ, "MARK": str(tmp_path)})
    wait_for(lambda: len(processes_mentioning(str(tmp_path))) == 2, seconds=30)
    proc.kill()
    proc.wait()
    wait_for(lambda: not processes_mentioning(str(tmp_path)), seconds=10)


def test_flags_spell_out_switches_lists_and_values():
    assert gpu_check.flags(compile=False, no_train=True, heads=["a", "b"], steps=1, skip=None,
                           none=[]) == ["--no-compile", "--no_train", "--heads", "a", "b",
                                        "--steps", "1"]


def test_the_plan_fits_the_memory_and_fills_its_share_of_the_time():
    row = {"step_s": 0.1, "warmup_s": 10.0, "params": 10**6, "peak_mem_bytes": 2**30}
    runs = [("baseline", "auto", "0.1")] * 3
    per_run = 16 * 10**6 + 2**30 + gpu_check.PROCESS_BYTES
    plan = gpu_check.plan_long(runs, row, 200, 100 * 2**30, 20)
    assert plan["runs"] == 3 and plan["per_run_bytes"] == per_run
    assert plan["fixed_s"] == pytest.approx(20 + 10 * (1 + gpu_check.EVAL_GRAPH) + 4 * 0.3)
    assert plan["steps"] == int(gpu_check.SLACK * (200 - plan["fixed_s"]) / 0.3)
    two = gpu_check.plan_long(runs, row, 200, 5 * per_run // 2, 20)  # memory for two
    assert two["runs"] == 2 and two["steps"] > plan["steps"]
    assert gpu_check.plan_long(runs, row, 30, 100 * 2**30, 20)["runs"] == 0  # no time


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
    row = {"size": "16M", "head": "baseline", "head_dtype": "auto", "loss_path": "plain",
           "step_s": 0.01, "tokens_per_s": 2e6, "mfu": 0.3, "overhead": 0.0, "warmup_s": 40.0,
           "peak_mem_bytes": 2**30}
    (tmp_path / "a_step.json").write_text(json.dumps({"train": [row], "head_alone": []}))
    (tmp_path / "d_long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [
        {"run": "x", "step": 1, "loss": 9.0, "mu_norm": 1.0, "logit_mean": 0.5, "h_mu_proj": None},
        {"run": "x", "step": 9, "loss": 4.0, "mu_norm": 3.0, "logit_mean": -1.0, "h_mu_proj": 0.1},
        {"run": "x", "summary": {"diverged": False}}, {"run": "y", "head": "mu_center"}]))
    lines = gpu_check.table(tmp_path).splitlines()
    assert lines[0] == ("a  16M baseline auto plain step" + " " * 13 + "10.0 ms, 2,000,000 tok/s, "
                        "MFU 30.0%, +0.0% vs baseline, peak 1.00 GiB, warm-up 40 s")
    assert lines[1:] == ["d  x" + " " * 40 + "step 9 (finished), loss 4.000, ‖μ‖ 1 → 3, "
                         "l̄ 0.5 → -1, h̄·μ̂ n/a → 0.1", "d  y" + " " * 40 + "no step logged (cut)"]


def test_the_code_is_named_by_its_files_without_git(tmp_path, monkeypatch):
    """In a copy without .git the env row still names the files' contents; one byte changes it."""
    (tmp_path / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(gpu_check, "ROOT", tmp_path)
    first = gpu_check.machine("cpu")
    (tmp_path / "a.py").write_text("x = 2\n")
    assert first["py_files"] == 1 and first["py_sha256"] != gpu_check.machine("cpu")["py_sha256"]

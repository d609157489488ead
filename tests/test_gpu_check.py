"""The GPU path, checked where a CPU can: scripts/gpu_check.sh's CPU rehearsal writes every file
of a GPU check, and a TERM or a KILL leaves what it measured and no process behind; float32 is
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


def rehearsal(tmp_path, text_data, **settings):
    """DEVICE=cpu bash scripts/gpu_check.sh, started; its caps raised (on a busy shared machine
    the rehearsal's own could cut), inductor's cache kept between test runs (a graph that
    changed compiles again)."""
    env = {**os.environ, "DEVICE": "cpu", "OUT": str(tmp_path / "out"), "PYTHON": sys.executable,
           "SCRATCH": str(tmp_path / "scratch"), "DATA": str(text_data), "BUDGET_S": "1500",
           "CAP_A": "300", "CAP_B": "300", "CAP_C": "300", "CAP_E": "300",
           "TORCHINDUCTOR_CACHE_DIR": str(ROOT / ".pytest_cache" / "inductor"), **settings}
    return subprocess.Popen(["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def wait_for(condition, seconds=300):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.2)


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


def test_the_cpu_rehearsal_of_gpu_check_writes_every_file_of_a_gpu_check(tmp_path, text_data):
    """Every phase runs (tiny, a few steps; phase a compiled by inductor, the graph of CUDA's
    default path) and leaves the files a GPU check brings back: at most 8, each under 16 MiB,
    directly under $OUT, with phase d's plan inside the time it was given."""
    proc = rehearsal(tmp_path, text_data, D_STEPS="2")
    printed, _ = proc.communicate(timeout=1500)
    assert proc.returncode == 0, printed
    out = tmp_path / "out"
    files = sorted(path.name for path in out.rglob("*"))
    assert files == ["a_step.json", "b_heads.json", "c_head_alone.json", "d_long.jsonl",
                     "e_step.json", "gpu_check.log", "phases.jsonl", "table.txt"]
    assert all((out / name).stat().st_size < 16 * 2**20 for name in files)
    phases = {row["phase"]: row for row in jsonl(out / "phases.jsonl")}
    assert [phases[p]["rc"] for p in "abcde"] == [0, 0, 0, 0, 0], phases
    a = json.loads((out / "a_step.json").read_text())
    assert a["settings"]["compile"] and a["settings"]["loss_paths"] == ["plain"]
    assert [(r["head"], r["timing"]) for r in a["train"]] == [("baseline", "in turns")]
    assert phases["a"]["graph_breaks"] == 0
    log = (out / "gpu_check.log").read_text()
    a_log = log[:log.index("== b")]  # one graph for the step, one for the no-grad evaluation
    assert a_log.count("Recompiling function") == a_log.count("GLOBAL_STATE changed: grad_mode") \
        <= 1
    b = json.loads((out / "b_heads.json").read_text())["train"]
    assert [(r["head"], r["head_dtype"]) for r in b] == \
        [(h, "auto") for h in heads.HEADS] + [("baseline", "float32")]
    c = json.loads((out / "c_head_alone.json").read_text())["loss_path"]
    assert {r["loss_impl"] for r in c} >= {"plain", "chunked", "F.ce(F.linear)"}
    anchors = phases["c_anchors"]
    assert sorted(anchors["compared"] + list(anchors["absent"])) == \
        ["F.ce(F.linear)", "F.linear_ce", "cce", "liger"]
    assert anchors["absent"]["liger"] == anchors["absent"]["cce"] == "CUDA only"
    if not fused_loss.TORCH_OP:
        assert anchors["absent"]["F.linear_ce"].startswith("needs torch >= 2.13")
    plan = phases["d_plan"]
    assert (plan["runs"], plan["steps"]) == (3, 2) and set(plan["how"].values()) == {"measured"}
    assert plan["start_s"] + plan["compile_s"] + plan["eval_s"] + plan["summary_s"] + \
        plan["steps_priced"] * plan["round_s"] <= plan["left_s"]
    long = jsonl(out / "d_long.jsonl")
    runs_logged = {r["run"] for r in long if "step" in r}
    assert runs_logged == {"baseline_auto_lr0.3", "mu_center_auto_lr0.3",
                           "baseline_float32_lr0.3"}
    assert all({"mu_norm", "logit_mean", "h_mu_proj", "prec_ce_gap"} <= set(r)
               for r in long if "step" in r)
    assert {r["run"] for r in long if "summary" in r} == runs_logged
    e = json.loads((out / "e_step.json").read_text())["train"]
    assert [(r["size"], r["head"]) for r in e] == [("small", "baseline")]
    table = (out / "table.txt").read_text()
    assert table in printed and table.count("\nd ") == 4 and table.count("\nb ") == 6


def test_a_term_during_a_phase_stops_it_and_keeps_what_it_measured(tmp_path, text_data):
    """SIGTERM while phase b's bench.py measures: the script stops it at once (not when the
    phase ends), records b as stopped, writes the table and exits 143; nothing is left running."""
    proc = rehearsal(tmp_path, text_data, PHASES="b")
    log = tmp_path / "out" / "gpu_check.log"
    wait_for(lambda: log.exists() and "training step: building" in log.read_text())
    proc.send_signal(signal.SIGTERM)
    printed, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, printed
    b = [r for r in jsonl(tmp_path / "out" / "phases.jsonl") if r["phase"] == "b"]
    assert len(b) == 1 and b[0]["status"] == "stopped"  # no row of b ending by itself
    assert json.loads((tmp_path / "out" / "b_heads.json").read_text())["settings"]["heads"]
    assert (tmp_path / "out" / "table.txt").exists()
    wait_for(lambda: not processes_mentioning(str(tmp_path)), seconds=15)


def test_a_kill_during_phase_d_leaves_its_merged_logs_and_no_process(tmp_path, text_data):
    """SIGKILL, which no trap sees, while phase d's runs train: d_long.jsonl already holds
    their log rows (merged as they grow, whole lines only), and the runs die with the script."""
    proc = rehearsal(tmp_path, text_data, PHASES="d", D_STEPS="20")
    long = tmp_path / "out" / "d_long.jsonl"
    wait_for(lambda: long.exists() and '"step"' in long.read_text())
    proc.kill()
    proc.communicate(timeout=60)
    rows = jsonl(long)
    assert rows and all(r["run"] in {"baseline_auto_lr0.3", "mu_center_auto_lr0.3",
                                     "baseline_float32_lr0.3"} for r in rows)
    assert not all(any("summary" in r for r in rows if r["run"] == run)
                   for run in {r["run"] for r in rows})  # killed while they ran
    assert [r["phase"] for r in jsonl(tmp_path / "out" / "phases.jsonl")] == ["env", "d_plan"]
    wait_for(lambda: not processes_mentioning(str(tmp_path)), seconds=15)


def test_peak_memory_with_reserved_gives_none_for_a_cpu_beside_the_peak():
    """On a CPU the RSS growth is all the process held, so there is no reserved figure apart
    from it: (peak, None), the peak seeing a 64 MiB transient buffer."""
    def work():
        torch.ones(16 * 2**20).sum()   # 64 MiB of float32, freed at once

    peak, reserved = bench.peak_memory(torch.device("cpu"), work, reserved=True)
    assert reserved is None and (peak is None or peak >= 60 * 2**20)

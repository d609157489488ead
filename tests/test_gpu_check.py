"""The GPU path, checked where a CPU can: scripts/gpu_check.sh's CPU rehearsal writes every file
of a GPU check; float32 is float32 (TF32 only when asked); a failed compile is said in one line
and recorded; the first throughput window leaves out the step that compiles; the chunked loss
stays eager under torch.compile; the peaks of the NVL boards."""
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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


def test_the_cpu_rehearsal_of_gpu_check_writes_every_file_of_a_gpu_check(tmp_path):
    """DEVICE=cpu bash scripts/gpu_check.sh: every phase runs (tiny, a few steps) and leaves
    the files a GPU check brings back: at most 8, each under 16 MiB, directly under $OUT. The
    caps are raised: on a busy shared machine the rehearsal's own (~1 minute idle) could cut."""
    prepare.prepare_text([ROOT / "tests" / "assets" / "paradise_regained.txt"], tmp_path / "data",
                         workers=1)
    out = tmp_path / "out"
    env = {**os.environ, "DEVICE": "cpu", "OUT": str(out), "SCRATCH": str(tmp_path / "scratch"),
           "DATA": str(tmp_path / "data"), "D_STEPS": "2", "PYTHON": sys.executable,
           "BUDGET_S": "1500", "CAP_A": "300", "CAP_B": "300", "CAP_C": "300"}
    proc = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = sorted(path.name for path in out.rglob("*"))
    assert files == ["a_step.json", "b_heads.json", "c_head_alone.json", "d_long.jsonl",
                     "gpu_check.log", "phases.jsonl", "table.txt"]
    assert all((out / name).stat().st_size < 16 * 2**20 for name in files)
    phases = {row["phase"]: row for row in map(json.loads, (out / "phases.jsonl").open())}
    assert [phases[p]["rc"] for p in "abcd"] == [0, 0, 0, 0], phases
    a = json.loads((out / "a_step.json").read_text())["train"]
    assert [(r["head"], r["timing"]) for r in a] == [("baseline", "in turns")]
    b = json.loads((out / "b_heads.json").read_text())["train"]
    assert [(r["head"], r["head_dtype"]) for r in b] == \
        [(h, "auto") for h in heads.HEADS] + [("baseline", "float32")]
    c = json.loads((out / "c_head_alone.json").read_text())["loss_path"]
    assert {r["loss_impl"] for r in c} >= {"plain", "chunked", "F.ce(F.linear)"}
    long = [json.loads(line) for line in (out / "d_long.jsonl").read_text().splitlines()]
    runs_logged = {r["run"] for r in long if "step" in r}
    assert runs_logged == {"baseline_auto_lr0.3", "mu_center_auto_lr0.3",
                           "baseline_float32_lr0.3"}
    assert all({"mu_norm", "logit_mean", "h_mu_proj", "prec_ce_gap"} <= set(r)
               for r in long if "step" in r)
    assert {r["run"] for r in long if "summary" in r} == runs_logged
    table = (out / "table.txt").read_text()
    assert table in proc.stdout and table.count("\nd ") == 3 and table.count("\nb ") == 6

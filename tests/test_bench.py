"""bench.py: a tiny CPU run end to end (JSON fields and sane values), and its measuring parts."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import bench
import fused_loss
import heads

ROOT = Path(__file__).resolve().parent.parent
PATHS = ["plain", "default", "chunked"]
TINY = ["--device", "cpu", "--sizes", "tiny", "--steps", "2", "--warmup", "1", "--seq_len", "32",
        "--micro_batch", "2", "--vocab_size", "256", "--chunk_size", "16"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    # One thread: on a shared, busy CPU OpenMP's waiting threads make steps 100× slower.
    proc = subprocess.run([sys.executable, "bench.py", *TINY, "--loss_paths", *PATHS,
                           "--loss_tokens", "64", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text()), proc.stdout


def test_tiny_cpu_run_writes_every_variant_with_sane_values(tiny_run):
    result, _ = tiny_run
    rows = result["train"]
    assert {(r["head"], r["loss_impl"]) for r in rows} == \
        {(h, i) for h in heads.HEADS for i in PATHS}
    tokens = 2 * 32
    for r in rows:
        assert r["step_s"] > 0 and r["tokens_per_s"] == pytest.approx(tokens / r["step_s"])
        assert r["mfu"] is None  # no peak FLOP/s is known for a CPU
        assert r["flops_per_token"] > 6 * r["params"]  # 6N plus attention
        assert r["peak_mem_bytes"] is None or r["peak_mem_bytes"] >= 0
        assert (r["vs_plain"] is None) == (r["loss_impl"] == "plain")
    baseline = [r for r in rows if r["head"] == "baseline"]
    assert all(r["overhead"] == 0.0 for r in baseline)
    soft_cap = next(r for r in rows if r["head"] == "soft_cap" and r["loss_impl"] == "plain")
    assert soft_cap["overhead"] == pytest.approx(soft_cap["step_s"] / baseline[0]["step_s"] - 1)
    assert result["peak_flops"] is None and result["settings"]["compile"] is False


def test_tiny_cpu_run_measures_the_loss_path_alone_next_to_the_anchors(tiny_run):
    """Our three paths and F.cross_entropy(F.linear) for every head, torch's fused op where it
    computes the head's loss; every one within float32 error of heads.py in float64."""
    result, stdout = tiny_run
    rows = result["loss_path"]
    torch_op = ({(h, "F.linear_ce") for h in fused_loss.PLAIN_CE_HEADS} if fused_loss.TORCH_OP
                else set())
    assert {(r["head"], r["loss_impl"]) for r in rows} == \
        {(h, p) for h in heads.HEADS for p in PATHS + ["F.ce(F.linear)"]} | torch_op
    for r in rows:
        assert (r["tokens"], r["vocab"], r["dim"]) == (64, 256, 64) and r["time_s"] > 0
        assert r["loss_err"] < 1e-5 and r["grad_err"] < 1e-5, r
        if fused_loss.TORCH_OP:
            baseline_op = next(x for x in rows if x["head"] == "baseline"
                               and x["loss_impl"] == "F.linear_ce")
            assert r["vs_torch_op"] == pytest.approx(r["time_s"] / baseline_op["time_s"])
    assert "Additional training time relative to baseline" in stdout
    assert "LM head alone" in stdout


def test_baseline_is_always_measured_first():
    args = bench.parse_args(["--device", "cpu", "--heads", "mu_center", "soft_cap", "mu_center"])
    assert args.heads == ["baseline", "mu_center", "soft_cap"]
    assert (args.micro_batch, args.seq_len, args.compile, args.dtype) == (4, 256, False, "float32")


def test_round_robin_rotates_the_order_every_round():
    calls = []
    results = bench.round_robin(["a", "b", "c"], lambda v: (calls.append(v), 1.0)[1], 3)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert all(len(samples) == 3 for samples in results.values())


def test_overhead_and_vs_plain_are_relative_to_the_same_process_rows():
    rows = [{"size": "s", "head": h, "loss_impl": i, "t": t, "peak_mem_bytes": m}
            for h, i, t, m in [("baseline", "plain", 2.0, 600), ("z_loss", "plain", 2.5, 900),
                               ("baseline", "chunked", 1.0, 200), ("z_loss", "chunked", 1.5, 300)]]
    bench.add_relative(rows, "t")
    assert [r["overhead"] for r in rows] == [0.0, 0.25, 0.0, 0.5]
    assert [r["vs_plain"] for r in rows] == [None, None, -0.5, -0.4]
    assert [r["mem_reduction"] for r in rows] == [None, None, 3.0, 3.0]


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_cpu_peak_memory_sees_a_transient_allocation():
    size = 64 * 2**20

    def work():
        x = torch.ones(size // 4)  # written, so every page is resident
        del x

    peak = bench.peak_memory(torch.device("cpu"), work)
    assert 0.9 * size <= peak <= 2 * size


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_cpu_peak_memory_sees_a_buffer_that_reuses_freed_heap():
    """A 4 MiB buffer freed and allocated again comes from malloc's heap, already resident:
    without releasing the free heap first the second run read as ~0 bytes."""
    size = 4 * 2**20

    def work():
        x = torch.ones(size // 4)
        del x

    work()
    peak = bench.peak_memory(torch.device("cpu"), work)
    assert 0.9 * size <= peak <= 2 * size


def test_cuda_without_a_gpu_is_one_clear_error():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    proc = subprocess.run([sys.executable, "bench.py", "--device", "cuda"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "no GPU is visible; use --device cpu" in proc.stderr.strip().splitlines()[-1]

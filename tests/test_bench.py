"""bench.py: a tiny CPU run end to end (JSON fields and sane values), and its measuring parts."""
import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

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
                           "--loss_tokens", "64", "--measure", "--stat_tokens", "200",
                           "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text()), proc.stdout


def test_tiny_cpu_run_writes_every_variant_with_sane_values(tiny_run):
    result, _ = tiny_run
    rows = result["train"]
    assert {(r["head"], r["loss_impl"]) for r in rows} == \
        {(h, i) for h in heads.HEADS for i in PATHS}
    for r in rows:
        assert r["step_s"] > 0 and r["tokens_per_s"] == pytest.approx(2 * 32 / r["step_s"])
        assert r["mfu"] is None  # no peak FLOP/s is known for a CPU
        assert r["flops_per_token"] > 6 * r["params"]  # 6N plus attention
        assert r["peak_mem_bytes"] is None or r["peak_mem_bytes"] >= 0
        assert r["peak_reserved_bytes"] is None  # CUDA's allocator slack: gpu_check.py reads it
        assert (r["vs_plain"] is None) == (r["loss_impl"] == "plain")
        assert r["timing"] == "in turns" and r["warmup_s"] > 0 and r["eval_s"] > 0
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
    torch_op = ({(h, "F.linear_ce") for h in heads.HEADS if heads.build(h).plain_softmax}
                if fused_loss.TORCH_OP else set())
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


def test_tiny_cpu_run_times_the_measurements_against_a_training_step(tiny_run):
    result, stdout = tiny_run
    (row,) = result["measure"]
    assert (row["size"], row["tokens"], row["stat_tokens"]) == ("tiny", 64, 256)  # 4 batches
    assert all(row[k] > 0 for k in ("step_s", "log_step_s", "eval_s", "final_stats_s"))
    assert "Measurements against a training step" in stdout


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
@pytest.mark.parametrize("mib, ran_before", [(64, False), (4, True)])
def test_cpu_peak_memory_sees_a_transient_allocation_even_from_freed_heap(mib, ran_before):
    """ran_before: a 4 MiB buffer freed and allocated again comes from malloc's heap, resident:
    without releasing the free heap first the second run read as ~0 bytes."""
    size = mib * 2**20

    def work():
        x = torch.ones(size // 4)  # written, so every page is resident
        del x

    if ran_before:
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


def test_rows_are_published_after_every_variant_then_once_more_timed_in_turns():
    """So that a run stopped by a time limit (scripts/gpu_check.py caps every phase) keeps the
    variants it has measured."""
    args = bench.parse_args([*TINY, "--heads", "baseline", "z_loss", "--loss_paths", "plain",
                             "chunked", "--steps", "1", "--warmup", "0"])
    published = []
    bench.bench_size(args, "tiny", published.append)
    assert [len(rows) for rows in published] == [1, 2, 3, 4, 4]
    assert {r["timing"] for rows in published[:4] for r in rows} == {"alone"}
    assert [(r["head"], r["loss_impl"], r["timing"]) for r in published[-1]] == \
        [(h, i, "in turns") for h in ("baseline", "z_loss") for i in ("plain", "chunked")]


def test_a_default_path_that_is_another_requested_path_is_timed_once(capsys):
    chunk = str(fused_loss.DEFAULT_CHUNK["cpu"])
    args = bench.parse_args(["--device", "cpu", "--chunk_size", chunk, "--loss_paths", "plain",
                             "default", "chunked"])
    assert args.impls == ["plain", "chunked"]
    assert "the default loss path on cpu is the chunked one; timed once" in capsys.readouterr().out
    other = bench.parse_args(["--device", "cpu", "--chunk_size", "16", "--loss_paths", "plain",
                              "default", "chunked"])
    assert other.impls == ["plain", "default", "chunked"]


@pytest.mark.skipif(not fused_loss.TORCH_OP, reason="torch < 2.13 has no F.linear_cross_entropy")
def test_the_fused_anchors_run_in_the_autocast_dtype_like_f_linear(monkeypatch):
    seen = []
    real = F.linear_cross_entropy

    def spy(h, weight, *args, **kwargs):
        seen.append((h.dtype, weight.dtype))
        return real(h, weight, *args, **kwargs)
    monkeypatch.setattr(F, "linear_cross_entropy", spy)
    args = bench.parse_args(TINY)
    anchor = bench.loss_functions("baseline", args, "cpu")["F.linear_ce"]
    h, weight, targets = torch.randn(8, 16), torch.randn(32, 16), torch.randint(0, 32, (8,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        anchor(h, weight, targets)
    anchor(h, weight, targets)
    assert seen == [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)]


def test_the_recompile_limit_is_raised_under_the_name_every_torch_has():
    old_torch = SimpleNamespace(cache_size_limit=8)  # torch 2.4–2.6: no recompile_limit
    bench.allow_recompiles(old_torch)
    assert old_torch.cache_size_limit == 64
    bench.allow_recompiles(torch._dynamo.config)
    assert torch._dynamo.config.recompile_limit >= 64  # the same setting from torch 2.7 on


def bench_error(argv, capsys):
    """The last stderr line and exit code of bench.main(argv), run in this process."""
    with pytest.raises(SystemExit) as err:
        bench.main(argv)
    message = str(err.value.code) if isinstance(err.value.code, str) else \
        capsys.readouterr().err.strip().splitlines()[-1]
    return message, err.value.code


@pytest.mark.parametrize("option, message", [
    ("--micro_batch", "--micro_batch 1000000000000 × --seq_len 32 = 32,000,000,000,000 tokens "
                      "per step at tiny would need at least "),
    ("--loss_tokens", "--loss_tokens 1,000,000,000,000 (V = 256, D = 64) at tiny would need at "
                      "least ")])
def test_a_size_that_cannot_fit_in_memory_says_how_much_it_would_need(capsys, option, message):
    said, code = bench_error([*TINY, option, str(10 ** 12)], capsys)
    assert code == 2 and said.startswith(f"bench.py: error: {message}")
    assert "of memory, but the cpu has " in said and f"GiB; lower {option}" in said


def test_a_json_that_cannot_be_written_is_one_sentence_before_any_work(tmp_path, capsys,
                                                                      monkeypatch):
    (tmp_path / "file").write_text("notes\n")
    said, code = bench_error([*TINY, "--json", str(tmp_path)], capsys)
    assert code == 2 and said == (f"bench.py: error: --json {tmp_path} is a folder; give a file "
                                  f"in it, e.g. {tmp_path / 'bench.json'}")
    said, _ = bench_error([*TINY, "--json", str(tmp_path / "file" / "b.json")], capsys)
    assert said == f"bench.py: error: --json: {tmp_path / 'file'} is a file; give a folder"
    monkeypatch.setattr(bench, "bench_size", lambda *a: pytest.fail("measured before the check"))
    real_write = os.write

    def full_disk(fd, raw):
        if "b.json" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, raw)
    monkeypatch.setattr(os, "write", full_disk)
    said, _ = bench_error([*TINY, "--json", str(tmp_path / "b.json")], capsys)
    assert said.startswith(f"bench.py: error: --json: the disk is full: could not write "
                           f"{tmp_path / 'b.json'} (") and said.endswith("; free space or write "
                                                                          "elsewhere")
    assert not list(tmp_path.glob("*.tmp")) and not (tmp_path / "b.json").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only folder")
def test_a_read_only_json_folder_is_one_sentence(tmp_path, capsys):
    tmp_path.chmod(0o500)
    try:
        said, _ = bench_error([*TINY, "--json", str(tmp_path / "b.json")], capsys)
    finally:
        tmp_path.chmod(0o700)
    assert said.endswith("(Permission denied); give --json a file you can write")


def test_running_out_of_memory_midway_is_one_sentence_and_keeps_the_json(tmp_path, capsys,
                                                                        monkeypatch):
    def out_of_memory(args, size, publish):
        publish([{"size": size, "head": "baseline"}])
        raise RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory: 1 TB")
    monkeypatch.setattr(bench, "bench_size", out_of_memory)
    said, _ = bench_error([*TINY, "--json", str(tmp_path / "b.json")], capsys)
    assert said == (f"bench.py: error: tiny ran out of cpu memory; lower --micro_batch, --seq_len "
                    f"or --loss_tokens; {tmp_path / 'b.json'} holds what was measured before")
    assert json.loads((tmp_path / "b.json").read_text())["train"] == [{"size": "tiny",
                                                                       "head": "baseline"}]

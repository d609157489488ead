"""bench.py: a tiny CPU run of every head and loss path (rows, JSON, tables), and its parts."""
import contextlib
import io
import json

import pytest
import torch
import torch.nn.functional as F

import bench
import heads
import train

TINY = ["--device", "cpu", "--sizes", "tiny", "--steps", "2", "--warmup", "1", "--seq_len", "32",
        "--micro_batch", "2", "--vocab_size", "256", "--chunk_size", "16"]
PATHS = ["default", "plain", "chunked"]
TORCH_OP = hasattr(F, "linear_cross_entropy")  # torch ≥ 2.13


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "out" / "bench.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result = bench.main([*TINY, "--loss_paths", *PATHS, "--loss_tokens", "64",
                             "--json", str(path)])
    return result, json.loads(path.read_text()), printed.getvalue()


def test_every_head_and_loss_path_gets_a_training_step_row(tiny_run):
    result, written, printed = tiny_run
    rows = result["train"]
    assert [(r["head"], r["loss_path"]) for r in rows] == \
        [(h, p) for h in heads.HEADS for p in PATHS]
    chunks = {"default": train.CPU_LOSS_CHUNK, "plain": 0, "chunked": 16}
    baseline = {r["loss_path"]: r["step_s"] for r in rows if r["head"] == "baseline"}
    for r in rows:
        assert r["loss_chunk"] == chunks[r["loss_path"]]
        assert r["step_s"] > 0 and r["tokens_per_s"] == pytest.approx(2 * 32 / r["step_s"])
        assert r["overhead"] == pytest.approx(r["step_s"] / baseline[r["loss_path"]] - 1)
        assert r["mfu"] is None and r["peak_mem_bytes"] is None  # no peak FLOP/s, no CUDA
        assert r["flops_per_token"] > 6 * r["params"] and r["warmup_s"] > 0
    assert written == json.loads(json.dumps(result))
    assert "Training steps of 2 × 32 tokens" in printed and "n/a" in printed


def test_the_head_alone_is_within_float32_error_of_float64_beside_torchs_op(tiny_run):
    """heads.py's paths for every head; torch's op where the head's loss is CE of the raw
    logits plus a term of W (baseline, mu_loss, mu_center), never where a hook changes it."""
    result, _, printed = tiny_run
    rows = result["head_alone"]
    with_op = {"baseline", "mu_loss", "mu_center"} if TORCH_OP else set()
    assert {(r["head"], r["loss_path"]) for r in rows} == \
        {(h, p) for h in heads.HEADS for p in ("plain", "chunked")} | \
        {(h, "torch op") for h in with_op}
    for r in rows:
        assert (r["tokens"], r["dim"]) == (64, 64) and r["time_s"] > 0
        assert r["loss_err"] < 1e-5 and r["grad_err"] < 1e-5, r
    assert "LM head alone (V = 256)" in printed


def test_the_defaults_time_every_head_on_train_pys_path_and_abbreviations_are_refused():
    args = bench.parse_args(["--device", "cpu"])
    assert args.heads == list(heads.HEADS) and args.sizes == ["tiny"]
    assert args.loss_paths == ["default"] and args.loss_tokens == 0 and not args.no_train
    assert (args.micro_batch, args.seq_len, args.chunk_size) == (4, 256, train.CPU_LOSS_CHUNK)
    assert (args.compile, args.dtype) == (False, "float32")
    chosen = bench.parse_args(["--device", "cpu", "--heads", "mu_center", "soft_cap", "mu_center"])
    assert chosen.heads == ["baseline", "mu_center", "soft_cap"]  # overheads need the baseline
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cpu", "--step", "3"])


def test_in_turns_rotates_the_order_every_round_and_takes_the_median(monkeypatch):
    calls, durations = [], {"a": iter([1, 5, 2]), "b": iter([0, 0, 0]), "c": iter([3, 3, 9])}
    clock = [0.0]

    def work(key):
        calls.append(key)
        clock[0] += next(durations[key])

    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    times = bench.in_turns({key: lambda key=key: work(key) for key in "abc"},
                           torch.device("cpu"), 3)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert times == {"a": (2, None), "b": (0, None), "c": (3, None)}


@pytest.mark.skipif(not TORCH_OP, reason="torch < 2.13 has no F.linear_cross_entropy")
def test_torchs_op_runs_in_the_matmul_dtype_and_adds_mu_loss_term(monkeypatch):
    seen, real = [], F.linear_cross_entropy

    def spy(h, weight, *args, **kwargs):
        seen.append((h.dtype, weight.dtype))
        return real(h, weight, *args, **kwargs)
    monkeypatch.setattr(F, "linear_cross_entropy", spy)
    h, weight, targets = torch.randn(8, 16), torch.randn(32, 16), torch.randint(0, 32, (8,))
    bench.loss_functions("baseline", 4, torch.bfloat16)["torch op"](h, weight, targets)
    assert seen == [(torch.bfloat16, torch.bfloat16)]
    fns = bench.loss_functions("mu_loss", 4, torch.float32)
    assert fns["torch op"](h, weight, targets).item() == \
        pytest.approx(fns["plain"](h, weight, targets).item(), rel=1e-5)

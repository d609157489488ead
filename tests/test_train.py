"""train.py: a run learns, DDP equals gradient accumulation, resume is exact, divergence ends
cleanly, bad input ends in one sentence. CPU, offline; tiny models on real text (GPT-2 tokens of
tests/assets/paradise_regained.txt) or on a 64-token Markov language where speed matters."""
import errno
import fcntl
import functools
import http.server
import io
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import data
import prepare
import runs
import store
import train

ROOT = Path(__file__).resolve().parent.parent
TEXT = ROOT / "tests" / "assets" / "paradise_regained.txt"
SUMMARY_KEYS = {"head", "size", "lr", "tie", "lam", "cap", "steps", "tokens", "val_loss",
                "init_loss", "diverged", "logit_mean", "logit_std", "logit_absmax", "log2Z",
                "prec_ce_gap", "prec_err_cast", "prec_err_round", "mu_norm", "train_time_s",
                "h_mu_proj", "h_mu_cos", "measure_time_s",
                *(f"{s}_se" for s in train.HEAD_STATS)}
LOG_KEYS = {"step", "tokens", "lr", "loss", "objective", "grad_norm", "mu_norm", "logit_mean",
            "logit_std", "logit_absmax", "log2Z", "tok_per_s", "mfu"}


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and far faster than on two when other processes
    share the two cores (OpenMP threads then wait for each other)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def text_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("text")
    prepare.prepare_text([TEXT], out, workers=1)
    return out


@pytest.fixture(scope="module")
def markov_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("markov")
    prepare.prepare_synthetic("markov", vocab=64, n_tokens=40_000, out_dir=out, seq_len=32)
    return out


@pytest.fixture(scope="module")
def fineweb_mirror(markov_data, tmp_path_factory):
    """A local HTTP server standing in for Hugging Face: the Markov shards under FineWeb's
    names. Yields the URL for $FINEWEB_BASE_URL."""
    mirror = tmp_path_factory.mktemp("mirror")
    for split, name in (("train", "fineweb_train_000001.bin"), ("val", "fineweb_val_000000.bin")):
        (mirror / name).write_bytes(data.shard_paths(markov_data, split)[0].read_bytes())
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(mirror))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def tiny(data_dir, out_dir, *extra, steps=6):
    """Command line of a tiny CPU run on the 64-token Markov language (or other data)."""
    return ["--size", "tiny", "--device", "cpu", "--vocab_size", "64", "--data", str(data_dir),
            "--out_dir", str(out_dir), "--steps", str(steps), "--warmup", "2", "--seq_len", "32",
            "--batch_size", "8", "--micro_batch", "2", "--eval_tokens", "512",
            "--stat_tokens", "256", "--log_every", "1", *extra]


def read_log(out_dir):
    return [json.loads(line) for line in (Path(out_dir) / "log.jsonl").read_text().splitlines()]


def read_summary(out_dir):
    return json.loads((Path(out_dir) / "summary.json").read_text())


def run_script(args, cwd=None, **env):
    """python ARGS in a subprocess that finds the project's modules."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
                               **env})


# ---------------------------------------------------------------------------------------------
# learning, and the run folder

def test_tiny_run_on_text_learns_and_fills_the_run_folder(text_data, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--size", "tiny", "--device", "cpu", "--data", str(text_data), "--out_dir", str(out),
            "--steps", "30", "--warmup", "5", "--lr", "1e-2", "--batch_size", "4",
            "--micro_batch", "4", "--seq_len", "32", "--eval_every", "15", "--eval_tokens", "1024",
            "--stat_tokens", "256", "--log_every", "5", "--save_every", "10", "--keep_every", "15"]
    train.main(argv)
    ln_v = math.log(50304)
    summary = read_summary(out)
    assert set(summary) == SUMMARY_KEYS
    assert abs(summary["init_loss"] - ln_v) < 0.1           # untrained: about uniform
    assert summary["val_loss"] < ln_v - 3                    # well below ln V after 30 steps
    assert summary["diverged"] is False and summary["tokens"] == 30 * 4 * 32
    assert summary["logit_std"] > 0 and summary["logit_absmax"] >= abs(summary["logit_mean"])
    assert summary["mu_norm"] > 0.1                          # baseline: the common shift grows

    log = read_log(out)
    assert [r["step"] for r in log] == [5, 10, 15, 20, 25, 30]
    assert all(LOG_KEYS <= set(r) for r in log)
    assert [r["step"] for r in log if "val_loss" in r] == [15, 30]
    assert log[-1]["val_loss"] == summary["val_loss"] and log[-1]["mfu"] is None   # CPU: no peak
    assert log[-1]["loss"] < log[0]["loss"]

    config = json.loads((out / "config.json").read_text())
    assert config["size"] == "tiny" and config["steps"] == 30 and config["dtype"] == "float32"
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)    # tensors and plain types only
    assert ckpt["step"] == 30 and ckpt["config"] == config
    assert not any(key.startswith("_orig_mod.") for key in ckpt["model"])

    for step in (0, 15, 30):                                 # weights-only snapshots
        snapshot = torch.load(out / f"ckpt_step{step:07d}.pt", weights_only=True)
        assert set(snapshot) == {"model", "step", "config"} and snapshot["step"] == step

    printed = capsys.readouterr().out
    assert "step 30/30 | loss" in printed and "tok/s" in printed and "ETA" in printed
    assert f"the run is finished; {runs.TRAIN_LONGER}" in printed
    assert train.main(argv + ["--resume"]) is None           # finished: nothing to do
    assert read_summary(out) == summary


def test_mu_center_run_logs_zero_mean_embedding_at_every_step(markov_data, tmp_path):
    train.main(tiny(markov_data, tmp_path, "--head", "mu_center", "--lr", "3e-2"))
    log = read_log(tmp_path)
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6]
    assert all(r["mu_norm"] < 1e-6 for r in log)
    assert all(abs(r["logit_mean"]) < 1e-5 for r in log)    # l̄ = μ·h = 0 (Lemma 1)
    assert read_summary(tmp_path)["mu_norm"] < 1e-6


# ---------------------------------------------------------------------------------------------
# DDP

PROBE = """
import os, sys, torch, train
model = train.main(sys.argv[1:])
rank = os.environ["RANK"]
torch.save(model.state_dict(), os.path.join(os.environ["PROBE_OUT"], f"rank{rank}.pt"))
"""


def test_two_processes_equal_one_with_twice_the_accumulation(markov_data, fineweb_mirror,
                                                              tmp_path):
    """8 sequences per step: 1 process × 4 micro-batches of 2 against 2 processes × 2 of 2.
    The two processes start without data: rank 0 fetches the default shards (the same Markov
    tokens, from the local mirror) while rank 1 waits."""
    single = train.main(tiny(markov_data, tmp_path / "one", "--head", "mu_center"))
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    done = run_script(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                       str(probe), *tiny(prepare.DEFAULT_DATA, tmp_path / "two", "--head",
                                         "mu_center")],
                      cwd=tmp_path, PROBE_OUT=str(tmp_path),
                      **{prepare.BASE_URL_ENV: fineweb_mirror})
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / prepare.DEFAULT_DATA / "fineweb_train_000001.bin").exists()

    one, two = read_log(tmp_path / "one"), read_log(tmp_path / "two")
    assert [r["step"] for r in two] == [r["step"] for r in one]
    for a, b in zip(one, two):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    s1, s2 = read_summary(tmp_path / "one"), read_summary(tmp_path / "two")
    assert s2["init_loss"] == pytest.approx(s1["init_loss"], rel=1e-6)  # shared evaluation
    assert s2["val_loss"] == pytest.approx(s1["val_loss"], rel=1e-5)

    rank0 = torch.load(tmp_path / "rank0.pt", weights_only=True)
    rank1 = torch.load(tmp_path / "rank1.pt", weights_only=True)
    for name, tensor in rank0.items():  # identical, bit for bit, with μ-centering on each rank
        assert torch.equal(tensor, rank1[name]), name
        assert torch.allclose(tensor, single.state_dict()[name], atol=1e-5), name


# ---------------------------------------------------------------------------------------------
# interruption, resume, divergence

DETERMINISTIC = ("step", "tokens", "lr", "loss", "grad_norm", "mu_norm", "logit_mean",
                 "logit_std", "logit_absmax", "log2Z", "val_loss")


def test_interrupt_and_resume_reproduce_the_uninterrupted_run(markov_data, tmp_path, monkeypatch,
                                                              capsys):
    """Killed after step 5 with the last checkpoint at step 3: steps 4‥5 are lost and redone.
    The second half runs under torch.compile (dynamo, eager backend, for speed): a compiled
    run resumes an eager checkpoint."""
    common = ("--head", "mu_loss", "--eval_every", "4", "--save_every", "3")
    whole = train.main(tiny(markov_data, tmp_path / "whole", *common, steps=8))
    train.main(tiny(markov_data, tmp_path / "cut", *common, "--stop_at", "5", steps=8))
    assert not (tmp_path / "cut" / "summary.json").exists()
    assert torch.load(tmp_path / "cut" / "ckpt.pt", weights_only=True)["step"] == 3

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    resumed = train.main(tiny(markov_data, tmp_path / "cut", *common, "--resume", "--compile",
                              steps=8))
    assert "--resume with compile True, not the run's False: the same run, rounded otherwise" \
        in capsys.readouterr().out
    expected, got = read_log(tmp_path / "whole"), read_log(tmp_path / "cut")
    assert [r["step"] for r in got] == list(range(1, 9))
    for a, b in zip(expected, got):
        assert {k: a.get(k) for k in DETERMINISTIC} == {k: b.get(k) for k in DETERMINISTIC}
    for name, tensor in whole.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name
    s1, s2 = read_summary(tmp_path / "whole"), read_summary(tmp_path / "cut")
    assert {k: v for k, v in s1.items() if not k.endswith("_time_s")} == \
        {k: v for k, v in s2.items() if not k.endswith("_time_s")}
    ckpt = torch.load(tmp_path / "cut" / "ckpt.pt", weights_only=True)
    assert not any(key.startswith("_orig_mod.") for key in ckpt["model"])


def test_a_resumed_run_keeps_its_cpu_thread_count_under_another_load(markov_data, tmp_path,
                                                                     monkeypatch, capsys):
    """1 and 2 threads round a step's gradients apart, and the count follows the load average."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))     # idle: 2 threads
    train.main(tiny(markov_data, tmp_path, "--stop_at", "2", "--save_every", "2", steps=4))
    assert json.loads((tmp_path / "config.json").read_text())["cpu_threads"] == 2
    monkeypatch.setattr(os, "getloadavg", lambda: (5.0, 0.0, 0.0))     # busy: a new run takes 1
    train.main(tiny(markov_data, tmp_path, "--resume", steps=4))
    assert ", 2 CPU thread(s)" in capsys.readouterr().out and torch.get_num_threads() == 2
    assert json.loads((tmp_path / "config.json").read_text())["cpu_threads"] == 2


def test_resume_without_a_checkpoint_says_it_starts_at_step_0(markov_data, tmp_path, capsys):
    train.main(tiny(markov_data, tmp_path, "--stop_at", "1", steps=3))  # before any checkpoint
    train.main(tiny(markov_data, tmp_path, "--resume", steps=3))
    assert f"{tmp_path} holds no ckpt.pt: the run starts at step 0" in capsys.readouterr().out
    assert [record["step"] for record in read_log(tmp_path)] == [1, 2, 3]


def resumed_with(markov_data, tmp_path, order, resume):
    """An 8-step run, and the same run cut after step 4 and resumed by `resume(argv)`: their
    logs (the same steps read the same rows, so they differ only by rounding)."""
    common = ("--data_order", order, "--save_every", "4", "--seed", "1")
    train.main(tiny(markov_data, tmp_path / "whole", *common, steps=8))
    train.main(tiny(markov_data, tmp_path / "cut", *common, "--stop_at", "4", steps=8))
    printed = resume(tiny(markov_data, tmp_path / "cut", *common, "--resume", steps=8))
    whole, cut = read_log(tmp_path / "whole"), read_log(tmp_path / "cut")
    assert [r["step"] for r in cut] == list(range(1, 9))
    for a, b in zip(whole[4:], cut[4:]):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4), (a["step"], order)
    return printed


@pytest.mark.parametrize("order", data.ORDERS)
def test_a_resume_with_another_micro_batch_is_the_same_run(markov_data, tmp_path, order, capsys):
    def resume(argv):
        train.main([*argv, "--micro_batch", "4"])            # 8 rows: 4 × 2, then 2 × 4
        return capsys.readouterr().out
    assert "--resume with micro_batch 4, not the run's 2: the same run" in \
        resumed_with(markov_data, tmp_path, order, resume)


@pytest.mark.parametrize("order", data.ORDERS)
def test_a_resume_on_two_processes_is_the_same_run(markov_data, tmp_path, order):
    def resume(argv):
        done = run_script(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(ROOT / "train.py"), *argv])
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout
    assert "--resume with world_size 2, not the run's 1: the same run" in \
        resumed_with(markov_data, tmp_path, order, resume)


def test_chunked_loss_path_trains_like_the_plain_one(markov_data, tmp_path):
    """--loss_chunk swaps in fused_loss.chunked_loss: same losses, same weights, to float tolerance
    (chunks of 24 tokens do not divide the 64-token micro-batches, so a ragged chunk is used)."""
    common = ("--head", "z_loss", "--lam", "0.01")
    plain = train.main(tiny(markov_data, tmp_path / "plain", *common, "--loss_chunk", "0"))
    chunked = train.main(tiny(markov_data, tmp_path / "chunked", *common, "--loss_chunk", "24"))
    assert chunked.head.loss_path.keywords == {"chunk_size": 24} and plain.head.loss_path is None
    for a, b in zip(read_log(tmp_path / "plain"), read_log(tmp_path / "chunked"), strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    for name, tensor in plain.state_dict().items():
        torch.testing.assert_close(chunked.state_dict()[name], tensor, rtol=1e-4, atol=1e-5)


def test_absurd_learning_rate_diverges_cleanly_with_exit_code_0(markov_data, tmp_path):
    done = run_script([str(ROOT / "train.py"), *tiny(markov_data, tmp_path, "--lr", "1e6",
                                                     "--log_every", "10", "--save_every", "2",
                                                     steps=40)])
    assert done.returncode == 0, done.stderr[-3000:]
    summary = read_summary(tmp_path)
    assert summary["diverged"] is True and summary["val_loss"] is None
    assert summary["tokens"] < 40 * 8 * 32                   # stopped at once, not at the end
    assert "diverged" in done.stdout
    if (tmp_path / "ckpt.pt").exists():                      # no checkpoint of a broken model
        state = torch.load(tmp_path / "ckpt.pt", weights_only=True)["model"]
        assert all(torch.isfinite(t).all() for t in state.values())


# ---------------------------------------------------------------------------------------------
# bad input: one sentence, no traceback

def error_of(argv, capsys):
    """The message train.main ends with (argparse's from stderr, ours from SystemExit)."""
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv)
    code = exit_info.value.code
    message = code if isinstance(code, str) else capsys.readouterr().err
    assert code not in (0, None)
    return message


def test_a_bad_command_line_under_torchrun_is_said_once_and_fails(markov_data, tmp_path):
    """Both processes used to print the sentence; the exit code stays a failure."""
    done = run_script(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                       str(ROOT / "train.py"), *tiny(markov_data, tmp_path, "--batch_size", "3",
                                                     "--micro_batch", "1")])
    assert done.stderr.count("train.py: error: --batch_size 3 must be a multiple of "
                             "--micro_batch × processes = 1 × 2 = 2") == 1
    assert done.returncode != 0 and not list(tmp_path.iterdir())


def test_an_error_of_every_rank_under_torchrun_is_said_once(tmp_path):
    done = run_script(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                       str(ROOT / "train.py"), *tiny(tmp_path / "missing", tmp_path / "run")])
    assert done.stderr.count("train.py: error: ") == 1 and done.returncode != 0
    assert not (tmp_path / "run").exists()               # no folder holding only .lock


def test_an_error_of_rank_0_alone_under_torchrun_is_the_last_thing_train_py_says(markov_data,
                                                                                  tmp_path):
    """Rank 0 alone locks the run folder; torchrun's own report follows, no traceback of ours."""
    out = tmp_path / "run"
    out.mkdir()
    with open(out / ".lock", "a+") as held:              # another process holds the folder
        fcntl.flock(held, fcntl.LOCK_EX)
        done = run_script(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(ROOT / "train.py"), *tiny(markov_data, out)])
    ours = [line for line in done.stderr.splitlines() if line.startswith("train.py: ")]
    assert ours == [f"train.py: error: {out} is in use by another process; wait for it to end, "
                    f"or choose another --out_dir"] and done.returncode != 0
    assert f'File "{ROOT}' not in done.stderr and "ChildFailedError" in done.stderr


@pytest.mark.parametrize("val_tokens", [0, 64])
def test_a_val_shard_too_short_for_one_evaluation_step_is_one_sentence_at_setup(
        markov_data, tmp_path, capsys, val_tokens):
    """An empty val shard used to end in a traceback at the first evaluation."""
    folder, out = tmp_path / "shards", tmp_path / "run"
    folder.mkdir()
    shutil.copy(data.shard_paths(markov_data, "train")[0], folder / "x_train_000000.bin")
    data.write_shard(folder / "x_val_000000.bin", [1] * val_tokens)  # one step reads 2 × 32 + 1
    message = error_of(tiny(folder, out), capsys)
    assert f"x_val_000000.bin holds {val_tokens} tokens, fewer than the 65" in message
    assert "\n" not in message and not (out / "log.jsonl").exists()


def test_a_failed_run_leaves_no_folder_holding_only_its_lock(tmp_path, capsys):
    out = tmp_path / "run"
    assert "no train shards" in error_of(tiny(tmp_path / "missing", out), capsys)
    assert not out.exists()
    out.mkdir()                                          # a folder the user made stays
    error_of(tiny(tmp_path / "missing", out), capsys)
    assert out.is_dir() and not list(out.iterdir())


def test_help_groups_the_options_gives_an_example_and_the_download_size(capsys):
    with pytest.raises(SystemExit):
        train.parse_args(["--help"])
    text = capsys.readouterr().out
    for group in ("model", "optimisation", "data and run folder", "measurement", "device"):
        assert f"\n{group}:\n" in text
    assert "python train.py --size tiny --data tests/assets/paradise_regained.txt" in text
    assert "(default: None)" not in text and "(default: False)" not in text and "2⁶⁴" not in text
    shards = prepare.shards_needed(100_000 * 64 * 2048)  # the default --steps, batch, seq_len
    gigabytes = (shards + 1) * (data.SHARD_TOKENS * 2 + data.HEADER_BYTES) / 1e9
    assert f"downloads the {prepare.DEFAULT_DATASET} shards the run reads: {gigabytes:.1f} GB" \
        in text


@pytest.mark.parametrize("extra, expected", [
    (["--head", "nope"], "invalid choice: 'nope'"),
    (["--size", "1B"], "invalid choice: '1B'"),
    (["--lr", "-1"], "--lr: -1 is invalid; give a finite number > 0"),
    (["--lr", "fast"], "--lr: 'fast' is not a number"),
    (["--min_lr", "1"], "--min_lr 1 exceeds --lr 0.003"),
    (["--batch_size", "7"], "--batch_size 7 must be a multiple of --micro_batch"),
    (["--lam", "0.1"], "head 'baseline' does not use lam=0.1"),
    (["--head", "soft_cap", "--cap", "0"], "cap=0.0 is invalid"),
    (["--warmup", "7"], "--warmup 7 exceeds --steps 6"),
    (["--seed", str(2 ** 64)], "--seed 18446744073709551616 is too large; give an integer from 0"),
    (["--device", "mps"], "--device mps is not supported: train.py runs on cpu or cuda"),
    (["--vocab_size", "32"], "outside the model's vocabulary of 32"),
    (["--data", "/nonexistent/shards"], "no train shards"),
    (["--device", "toaster"], "--device 'toaster' is not a torch device"),
    # used to end in the allocator's traceback ("you tried to allocate 256000000000000 bytes")
    (["--vocab_size", str(10 ** 12)], "--vocab_size 1,000,000,000,000 needs 1.8 PiB for the "
                                      "embeddings alone"),
])
def test_bad_input_ends_in_one_clear_sentence(markov_data, tmp_path, capsys, extra, expected):
    message = error_of(tiny(markov_data, tmp_path, *extra), capsys)
    assert expected in message
    assert not (tmp_path / "ckpt.pt").exists() and not (tmp_path / "log.jsonl").exists()


def test_a_token_id_beyond_the_vocabulary_in_the_val_split_is_caught(markov_data, tmp_path,
                                                                      capsys):
    """Training data within the vocabulary does not vouch for the validation split."""
    bad = tmp_path / "shards"
    bad.mkdir()
    for split in ("train", "val"):
        tokens = data.read_shard(data.shard_paths(markov_data, split)[0]).copy()
        if split == "val":
            tokens[-1] = 64  # one id just outside --vocab_size 64
        data.write_shard(bad / f"markov_{split}_000000.bin", tokens)
    message = error_of(tiny(bad, tmp_path / "run"), capsys)
    assert "outside the model's vocabulary of 64" in message


class Payload:
    """Unpickling this runs code: it creates the file `marker`."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def test_a_checkpoint_cannot_run_code(markov_data, tmp_path, capsys):
    marker = tmp_path / "code_ran"
    train.main(tiny(markov_data, tmp_path / "run", "--stop_at", "1", "--save_every", "1"))
    torch.save({"model": Payload(marker)}, tmp_path / "run" / "ckpt.pt")
    message = error_of(tiny(markov_data, tmp_path / "run", "--resume"), capsys)
    assert "cannot be read as a checkpoint" in message and "weights_only" not in message
    assert not marker.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_asking_for_a_missing_gpu_is_a_clear_error(markov_data, tmp_path, capsys):
    assert "no GPU is visible; use --device cpu" in \
        error_of(tiny(markov_data, tmp_path, "--device", "cuda"), capsys)


def test_existing_runs_are_not_overwritten_and_resume_checks_the_settings(markov_data, tmp_path,
                                                                           capsys):
    train.main(tiny(markov_data, tmp_path, "--stop_at", "2", "--save_every", "2"))
    assert "already holds a run (ckpt.pt, config.json, log.jsonl); pass --resume" in \
        error_of(tiny(markov_data, tmp_path), capsys)
    message = error_of(tiny(markov_data, tmp_path, "--resume", "--lr", "0.01"), capsys)
    assert "was trained with --lr 0.003, not --lr 0.01; resume with its own settings" in message


# ---------------------------------------------------------------------------------------------
# the run folder: one process at a time, no other run's files replaced, a full disk

HOLD_LOCK = """
import fcntl, sys, time
lock = open(sys.argv[1], "a")
lock.write("train.py, process 123\\n")
lock.flush()
fcntl.flock(lock, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(600)
"""


def test_a_folder_in_use_is_refused_and_the_lock_of_a_killed_process_taken_over(
        markov_data, tmp_path, capsys):
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path / ".lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        message = error_of(tiny(markov_data, tmp_path), capsys)
        assert "is in use by train.py, process 123; wait for it to end" in message
        assert [p.name for p in tmp_path.iterdir()] == [".lock"]
    finally:
        holder.kill()                                    # kill -9: the OS drops its lock
        holder.wait()
    (tmp_path / ".ckpt.pt.123.0a1b2c3d.tmp").write_bytes(b"half a save")
    train.main(tiny(markov_data, tmp_path, steps=2))
    assert read_summary(tmp_path)["diverged"] is False
    assert not list(tmp_path.glob("*.tmp"))             # the dead process's temporary file


def test_a_fresh_run_leaves_the_files_of_another_run_alone(markov_data, tmp_path, capsys):
    (tmp_path / "config.json").write_text('{"size": "57M"}\n')
    (tmp_path / "log.jsonl").write_text('{"step": 1, "loss": 3.0}\n')
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert "already holds a run (config.json, log.jsonl); pass --resume" in \
        error_of(tiny(markov_data, tmp_path), capsys)
    assert "was trained with --size 57M" in error_of(tiny(markov_data, tmp_path, "--resume"),
                                                     capsys)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name != ".lock"} == before


def test_resume_refuses_other_settings_data_or_dtype_even_when_finished(markov_data, tmp_path,
                                                                        capsys):
    run = tmp_path / "run"
    train.main(tiny(markov_data, run, steps=2))
    finished = read_summary(run)
    message = error_of(tiny(markov_data, run, "--resume", "--lr", "0.01", steps=3), capsys)
    assert "was trained with --lr 0.003 --steps 2, not --lr 0.01 --steps 3" in message
    assert "was trained with --dtype float32, not --dtype bfloat16" in \
        error_of(tiny(markov_data, run, "--resume", "--dtype", "bfloat16", steps=2), capsys)
    assert "was trained with --data_order sequential, not --data_order random" in \
        error_of(tiny(markov_data, run, "--resume", "--data_order", "random", steps=2), capsys)
    config = json.loads((run / "config.json").read_text())
    del config["data_order"]                             # a run recorded before the option
    (run / "config.json").write_text(json.dumps(config))
    other = tmp_path / "other"                           # another Markov language
    prepare.prepare_synthetic("markov", vocab=64, n_tokens=40_000, out_dir=other, seq_len=32,
                              seed=1)
    message = error_of(tiny(other, run, "--resume", steps=2), capsys)
    assert f"trained with --data {markov_data} (dataset " in message
    assert f", not --data {other} (dataset " in message
    copy = tmp_path / "copy"                             # the same dataset in another folder
    shutil.copytree(markov_data, copy)
    assert train.main(tiny(copy, run, "--resume", steps=2)) is None
    assert "the run is finished, nothing to do" in capsys.readouterr().out
    assert read_summary(run) == finished


def fill_disk_for(name, monkeypatch):
    """Make every os.write (store.open_atomic's way to write) to a file whose path holds `name`
    fail as on a full disk."""
    real_write = os.write

    def write(fd, raw):
        if name in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, raw)
    monkeypatch.setattr(os, "write", write)


def test_a_full_disk_during_a_save_is_one_sentence_and_keeps_the_last_checkpoint(
        markov_data, tmp_path, capsys, monkeypatch):
    train.main(tiny(markov_data, tmp_path, "--stop_at", "2", "--save_every", "2"))
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    fill_disk_for("/.ckpt.pt.", monkeypatch)
    message = error_of(tiny(markov_data, tmp_path, "--resume", "--save_every", "2"), capsys)
    assert message.startswith(f"train.py: error: the disk is full: could not write "
                              f"{tmp_path / 'ckpt.pt'} (")
    assert not list(tmp_path.glob("*.tmp"))
    kept = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert kept["step"] == 2
    assert all(torch.equal(tensor, saved["model"][name]) for name, tensor in kept["model"].items())


def fill_disk_midway(name, monkeypatch):
    """Make os.write to a file whose path holds `name` go in halfway on its second call, and
    fail with ENOSPC from then on: a disk that fills up while a line is appended."""
    real_write, calls = os.write, []

    def write(fd, raw):
        if name not in os.readlink(f"/proc/self/fd/{fd}"):
            return real_write(fd, raw)
        calls.append(len(raw))
        if len(calls) == 1:
            return real_write(fd, raw)
        if len(calls) == 2:
            return real_write(fd, bytes(raw[:len(raw) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "write", write)


def test_a_full_disk_while_logging_is_one_sentence_and_leaves_no_half_line(
        markov_data, tmp_path, capsys, monkeypatch):
    """It used to leave half a JSON line in log.jsonl and end in OSError 28's traceback."""
    fill_disk_midway("log.jsonl", monkeypatch)
    message = error_of(tiny(markov_data, tmp_path), capsys)
    assert message.startswith(f"train.py: error: the disk is full: could not write "
                              f"{tmp_path / 'log.jsonl'} (") and "\n" not in message
    text = (tmp_path / "log.jsonl").read_text()
    assert text.endswith("\n") and [record["step"] for record in read_log(tmp_path)] == [1]


def test_a_log_that_cannot_be_opened_mid_run_is_one_sentence(markov_data, tmp_path, capsys,
                                                              monkeypatch):
    """Opening log.jsonl to append a step's line used to fail outside store's WriteError, in a
    traceback."""
    def broken_open(self, path, mode="r", *args, **kwargs):
        if str(path).endswith("log.jsonl") and "a" in mode:
            raise OSError(errno.EIO, "Input/output error")
        io.FileIO.__init__(self, path, mode, *args, **kwargs)
    monkeypatch.setattr(store.WatchedFile, "__init__", broken_open)
    assert error_of(tiny(markov_data, tmp_path), capsys) == (
        f"train.py: error: could not write {tmp_path / 'log.jsonl'} (Input/output error)")


def test_a_fresh_run_into_a_full_disk_is_one_sentence(markov_data, tmp_path, capsys,
                                                      monkeypatch):
    """The lock file's line used to be retried when the file closed, raising ENOSPC again."""
    fill_disk_for("/.lock", monkeypatch)
    assert error_of(tiny(markov_data, tmp_path), capsys) == (
        f"train.py: error: cannot write {tmp_path / '.lock'} (No space left on device); free "
        f"space or choose another --out_dir")


@pytest.mark.parametrize("name", ["ckpt.pt", "log.jsonl"])
def test_resume_where_a_run_file_is_a_folder_is_one_sentence(markov_data, tmp_path, capsys,
                                                              name):
    """Both used to end in a traceback (FileNotFoundError, IsADirectoryError)."""
    train.main(tiny(markov_data, tmp_path, "--stop_at", "1", "--save_every", "1"))
    (tmp_path / name).unlink()
    (tmp_path / name).mkdir()
    message = error_of(tiny(markov_data, tmp_path, "--resume"), capsys)
    assert message.startswith(f"train.py: error: {tmp_path / name} is not a file") \
        and "\n" not in message


def test_resume_where_config_json_is_a_pipe_is_refused_not_read(markov_data, tmp_path):
    """Reading it used to block --resume forever."""
    os.mkfifo(tmp_path / "config.json")
    done = subprocess.run([sys.executable, str(ROOT / "train.py"),
                           *tiny(markov_data, tmp_path, "--resume")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr == (
        f"train.py: error: {tmp_path} holds config.json but no config.json of train.py, so it is "
        f"not a run to resume; choose another --out_dir\n")


@pytest.mark.parametrize("out_dir, expected", [("file", "is a file; give a folder"),
                                               ("file/run", "(Not a directory)")])
def test_an_out_dir_that_cannot_be_a_folder_is_one_sentence(markov_data, tmp_path, capsys,
                                                            out_dir, expected):
    (tmp_path / "file").write_text("notes\n")
    message = error_of(tiny(markov_data, tmp_path / out_dir), capsys)
    assert f"{tmp_path / out_dir}" in message and expected in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only folder")
def test_a_read_only_out_dir_is_one_sentence(markov_data, tmp_path, capsys):
    tmp_path.chmod(0o500)
    try:
        assert "(Permission denied); choose a folder you can write to" in \
            error_of(tiny(markov_data, tmp_path), capsys)
    finally:
        tmp_path.chmod(0o700)


@pytest.mark.parametrize("change, expected", [
    (lambda ckpt: ckpt.update(config=None), "has no run settings (its 'config' is NoneType"),
    (lambda ckpt: ckpt["model"].update({"wte.weight": torch.zeros(64, 32)}),
     "holds weights that do not fit the model of its settings (size mismatch for wte.weight"),
    (lambda ckpt: ckpt.update(loader={"shard": 3, "position": 0, "epoch": 0}),
     "does not fit the 1 shard(s)"),
    (lambda ckpt: ckpt.pop("optimizer"), "holds weights but not what --resume needs (optimizer)"),
    # used to train on and write the string into summary.json
    (lambda ckpt: ckpt.update(init_loss="oops"), "records init_loss 'oops', not a number"),
    # used to end in a traceback deep inside AdamW's first step
    (lambda ckpt: ckpt["optimizer"]["state"][0].update(exp_avg=torch.zeros(3)),
     "holds optimizer state exp_avg of shape (3,) for parameter 0 of shape (64, 64)"),
])
def test_a_checkpoint_that_cannot_continue_the_run_is_one_sentence(markov_data, tmp_path, capsys,
                                                                   change, expected):
    train.main(tiny(markov_data, tmp_path, "--stop_at", "1", "--save_every", "1"))
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    change(ckpt)
    torch.save(ckpt, tmp_path / "ckpt.pt")
    message = error_of(tiny(markov_data, tmp_path, "--resume"), capsys)
    assert expected in message and "\n" not in message and message.endswith("start afresh")


def test_ctrl_c_ends_in_one_line_and_exit_code_130(markov_data, tmp_path):
    run = subprocess.Popen([sys.executable, str(ROOT / "train.py"),
                            *tiny(markov_data, tmp_path, steps=100_000)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
                                "PYTHONUNBUFFERED": "1"})
    for line in run.stdout:                              # wait for the first step
        if line.split()[:2] == ["step", "1/100000"]:
            break
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 130
    assert err == ("train.py: interrupted; no checkpoint yet (every --save_every 1000 steps), so "
                   "--resume starts at step 0\n")


def test_ctrl_c_while_torch_imports_ends_in_one_line_and_writes_nothing(markov_data, tmp_path):
    """At 0.3 s an import used to swallow the exit and the run went on."""
    for delay in (0.1, 0.3, 0.6):                        # importing torch takes seconds
        run = subprocess.Popen([sys.executable, str(ROOT / "train.py"),
                                *tiny(markov_data, tmp_path / "run")], stderr=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        time.sleep(delay)
        run.send_signal(signal.SIGINT)
        _, err = run.communicate(timeout=60)
        assert run.returncode == 130 and len(err.splitlines()) == 1, (delay, err)
        assert err.startswith("train.py: interrupted") and not (tmp_path / "run").exists()


def test_a_run_outlives_its_console(markov_data, tmp_path):
    """`python train.py … | head -n 3`: once the reader is gone, the run goes on unprinted."""
    run = subprocess.Popen([sys.executable, str(ROOT / "train.py"),
                            *tiny(markov_data, tmp_path, steps=12)], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    for _ in range(3):
        run.stdout.readline()
    run.stdout.close()                                   # what head does after 3 lines
    err = run.stderr.read()
    assert run.wait(timeout=120) == 0 and err == ""
    assert read_summary(tmp_path)["steps"] == 12 and read_log(tmp_path)[-1]["step"] == 12


def test_command_line_errors_come_without_a_traceback(tmp_path):
    done = run_script([str(ROOT / "train.py"), "--size", "tiny", "--device", "cpu",
                       "--data", str(tmp_path / "missing"), "--out_dir", str(tmp_path)])
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().startswith("train.py: error: no train shards")


# ---------------------------------------------------------------------------------------------
# the default data: fetched when missing

def test_default_data_is_fetched_when_missing(fineweb_mirror, tmp_path, monkeypatch):
    monkeypatch.setenv(prepare.BASE_URL_ENV, fineweb_mirror)
    monkeypatch.chdir(tmp_path)                   # the default --data is a relative path
    train.main(tiny(prepare.DEFAULT_DATA, "run", steps=2))
    assert sorted(p.name for p in Path(prepare.DEFAULT_DATA).glob("*.bin")) == \
        ["fineweb_train_000001.bin", "fineweb_val_000000.bin"]
    assert read_summary("run")["diverged"] is False


def test_default_data_offline_says_how_to_train_on_local_text(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(prepare.BASE_URL_ENV, "http://127.0.0.1:9")   # nothing listens there
    monkeypatch.chdir(tmp_path)
    message = error_of(tiny(prepare.DEFAULT_DATA, "run"), capsys)
    assert f"the FineWeb download into {prepare.DEFAULT_DATA} failed" in message
    assert "to train on local text instead, pass the text files as --data" in message


# ---------------------------------------------------------------------------------------------
# one command on a laptop

def test_the_readme_laptop_command_trains_on_the_bundled_text(tmp_path, monkeypatch, capsys):
    """The README's command, cut to 3 steps, from another folder; then again in-process: the
    text is tokenized once and its cached shards are reused."""
    readme = (ROOT / "README.md").read_text()
    command = next(line for line in readme.splitlines()
                   if line.startswith("python train.py") and "paradise_regained.txt" in line)
    argv = [str(ROOT / arg) if arg.startswith(("train.py", "tests/")) else arg
            for arg in shlex.split(command.split("#")[0])[1:]]
    first = run_script([*argv, "--steps", "3", "--out_dir", "first"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "tokenized 1 file(s)" in first.stdout and "is more than the val split holds" in \
        first.stdout
    assert read_summary(tmp_path / "first")["diverged"] is False
    monkeypatch.chdir(tmp_path)
    train.main([*argv[1:], "--steps", "1", "--out_dir", "again"])
    assert "tokenized" not in capsys.readouterr().out
    configs = [json.loads((tmp_path / run / "config.json").read_text())
               for run in ("first", "again")]
    assert configs[0]["data"] == configs[1]["data"] and "data/text/" in configs[0]["data"]
    assert configs[0]["text"] == [str(TEXT)]


def test_eval_and_stat_tokens_are_cut_to_what_the_val_split_holds(markov_data, tmp_path, capsys):
    train.main(tiny(markov_data, tmp_path, "--eval_tokens", "10000000", "--stat_tokens",
                    "10000000", steps=2))
    n = data.shard_length(data.shard_paths(markov_data, "val")[0])
    held = (n - 1) // 64 * 64                            # whole evaluation steps of 2 × 32 tokens
    printed = capsys.readouterr().out
    for name in ("eval_tokens", "stat_tokens"):
        assert f"--{name} 10,000,000 is more than the val split holds: using its {held:,} " \
               f"tokens" in printed
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["eval_tokens"] == config["stat_tokens"] == held


def test_warmup_defaults_to_5_percent_of_the_steps():
    assert train.parse_args(["--device", "cpu"]).warmup == 5000          # the paper's, of 100,000
    assert train.parse_args(["--device", "cpu", "--steps", "300"]).warmup == 15
    assert train.parse_args(["--device", "cpu", "--steps", "8", "--warmup", "8"]).warmup == 8


# ---------------------------------------------------------------------------------------------
# the pieces

def test_lr_schedule_warms_up_linearly_then_decays_by_cosine_to_min_lr():
    args = train.parse_args(["--lr", "1e-2", "--min_lr", "1e-4", "--steps", "110",
                             "--warmup", "10", "--device", "cpu"])
    lrs = [train.lr_at(s, args) for s in range(110)]
    assert lrs[:10] == pytest.approx([1e-2 * (s + 1) / 10 for s in range(10)])
    assert lrs[10] == pytest.approx(1e-2)
    assert lrs[60] == pytest.approx(1e-4 + 0.5 * (1e-2 - 1e-4))      # half way down the cosine
    assert train.lr_at(110, args) == pytest.approx(1e-4)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))


def test_log_step_statistics_cover_an_even_spread_of_few_tokens(monkeypatch):
    args = train.parse_args(["--size", "tiny", "--vocab_size", "96", "--seq_len", "16",
                             "--device", "cpu"])
    model = train.build_model(args)
    x, y = torch.randint(0, 96, (3, 16)), torch.randint(0, 96, (3, 16))
    monkeypatch.setattr(train, "LOG_STAT_TOKENS", 8)     # 48 tokens: every 6th counts
    result = train.StepResult(torch.tensor(1.0), torch.tensor(1.0), torch.tensor(1.0), x, y)
    stats = train.step_metrics(model, result, args, train.autocast(torch.device("cpu"),
                                                                   "float32"))
    with torch.no_grad():
        l = model(x).double().flatten(0, 1)[::6]          # positions 0, 6, 12 of each row
    assert stats["logit_mean"] == pytest.approx(l.mean(1).mean().item(), abs=1e-6)
    assert stats["logit_absmax"] == pytest.approx(l.abs().amax(1).mean().item(), rel=1e-6)


def test_eta_counts_the_log_steps_evaluations_and_final_statistics_still_to_come():
    args = train.parse_args(["--steps", "100", "--log_every", "10", "--eval_every", "50",
                             "--stat_tokens", str(2 * train.LOG_STAT_TOKENS), "--device", "cpu"])
    def eta(step):
        return train.eta_seconds(step, args, per_step=1.0, log_s=0.5, eval_s=3.0,
                                 log_tokens=train.LOG_STAT_TOKENS)
    # 90 steps of 1 s, 9 log steps of 0.5 s, evaluations at 50 and 100 of 3 s, final stats 1 s
    assert eta(10) == 90 + 4.5 + 6 + 1
    assert eta(100) == 1
    args.eval_every, args.steps = 0, 95                  # evaluated at the end only; 95 logged
    assert eta(10) == 85 + 4.5 + 3 + 1


def test_cpu_threads_are_the_idle_cores_shared_by_the_processes_of_a_node(monkeypatch):
    cpu = runs.Dist(0, 0, 1, torch.device("cpu"))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (2.6, 0.0, 0.0))
    assert runs.choose_cpu_threads(cpu) == 5            # 8 cores, 2.6 busy
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert runs.choose_cpu_threads(cpu) == 2
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 0.0, 0.0))
    assert runs.choose_cpu_threads(cpu) == 1            # overloaded: still one
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    torch.set_num_threads(3)
    assert runs.choose_cpu_threads(cpu) == 3            # the user's choice stands


def test_a_folder_holding_a_run_is_refused_before_the_data_is_looked_at(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "log.jsonl").write_text("")
    done = subprocess.run([sys.executable, "train.py", *tiny(tmp_path / "no_such_data", out)],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip().endswith("already holds a run (log.jsonl); pass --resume to "
                                        "continue it, or choose another --out_dir")


def test_alignment_of_the_mean_hidden_state_with_mu_is_the_mean_logit_over_mu_norm():
    args = train.parse_args(["--size", "tiny", "--vocab_size", "96", "--seq_len", "16",
                             "--device", "cpu"])
    model = train.build_model(args)
    with torch.no_grad():  # a drifted μ, as training grows it
        model.output_weight.add_(torch.randn(64, generator=torch.Generator().manual_seed(1)))
    x, y = torch.randint(0, 96, (3, 16)), torch.randint(0, 96, (3, 16))
    amp = train.autocast(torch.device("cpu"), "float32")
    stats = train.head_stats(train.head_stat_sums(model, x, y, args, amp), model)
    with torch.no_grad():
        h_mean = model.hidden(x).double().flatten(0, 1).mean(0)
    mu = model.output_weight.detach().double().mean(0)
    mu_norm = train.mu_norm(model).item()
    assert stats["h_mu_proj"] * mu_norm == pytest.approx(stats["logit_mean"], rel=1e-5)  # Lemma 1
    assert stats["h_mu_cos"] == pytest.approx(
        (h_mean @ mu / (h_mean.norm() * mu.norm())).item(), rel=1e-6)
    assert abs(stats["h_mu_cos"]) <= 1


def test_too_few_validation_tokens_still_give_one_micro_batch_per_rank(markov_data):
    args = train.parse_args(tiny(markov_data, "unused", "--stat_tokens", "1"))
    one = runs.Dist(0, 0, 1, torch.device("cpu"))
    runs.ready_data(args, one)                           # what a run's setup does
    assert args.stat_tokens == args.micro_batch * args.seq_len
    batches = list(train.val_batches(args.stat_tokens, args, one))
    assert len(batches) == 1 and batches[0][0].shape == (2, 32)


@pytest.mark.parametrize("name, peak", [("NVIDIA A100-SXM4-80GB", 312e12),
                                        ("NVIDIA H100 80GB HBM3", 989e12),
                                        ("NVIDIA H100 PCIe", 756e12),
                                        ("NVIDIA H200", 989e12), ("Tesla T4", None)])
def test_mfu_uses_the_peak_of_the_device_in_use(monkeypatch, name, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert train.peak_flops(torch.device("cuda", 0), "bfloat16") == peak
    assert train.peak_flops(torch.device("cuda", 0), "float32") is None
    assert train.peak_flops(torch.device("cpu"), "bfloat16") is None


def test_finite_watch_names_the_first_nonfinite_step():
    watch = train.FiniteWatch(torch.device("cpu"))
    for step, loss in enumerate([1.0, 2.0, float("nan"), float("inf")], 1):
        watch.push(step, torch.tensor(loss))
    assert watch.first_nonfinite() == 3


def test_the_log_line_shows_the_eta_in_hours_and_minutes_or_minutes_and_seconds():
    record = {"step": 5, "loss": 2.0, "lr": 1e-3, "val_loss": None}
    assert runs.log_line(record, 100, eta=3725).endswith("| ETA 1h02m")
    assert runs.log_line(record, 100, eta=249.9).endswith("| ETA 4m09s")
    assert "ETA" not in runs.log_line(record, 100, eta=None)

"""train.py: a run learns and fills its folder, DDP equals gradient accumulation, a killed run
resumes exactly, divergence ends cleanly, the mistakes people make end in one sentence. CPU,
offline; tiny models on real text or on a 64-token Markov language where speed matters."""
import functools
import http.server
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import data
import prepare
import train

ROOT = Path(__file__).resolve().parent.parent
TEXT = ROOT / "tests" / "assets" / "paradise_regained.txt"
SUMMARY_KEYS = {"head", "size", "lr", "tie", "lam", "cap", "steps", "tokens", "val_loss",
                "init_loss", "diverged", *train.HEAD_STATS, "mu_norm", "train_time_s",
                "h_mu_proj", "h_mu_cos", "measure_time_s", *(f"{s}_se" for s in train.HEAD_STATS)}
LOG_KEYS = {"step", "tokens", "lr", "loss", "objective", "grad_norm", "mu_norm", "logit_mean",
            "logit_std", "logit_absmax", "log2Z", "tok_per_s", "mfu"}


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, above all when other processes share the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def text_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("text") / "paradise"
    prepare.prepare_text([TEXT], out)
    return out


@pytest.fixture(scope="module")
def markov_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("markov") / "markov"
    prepare.prepare_synthetic(vocab=64, n_tokens=40_000, out_dir=out)
    return out


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


def run_script(args, cwd=None):
    """python ARGS in a subprocess that finds the project's modules."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT),
                                        "OMP_NUM_THREADS": "1"})


def torchrun(*args, cwd=None):
    return run_script(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                       *map(str, args)], cwd=cwd)


def error_of(argv, capsys):
    """The one sentence train.main ends with (argparse's on stderr, ours as SystemExit's)."""
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv)
    code = exit_info.value.code
    assert code not in (0, None)
    return code if isinstance(code, str) else capsys.readouterr().err


# ---- learning and the run folder -------------------------------------------------------------

def test_tiny_run_on_text_learns_and_fills_the_run_folder(text_data, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--size", "tiny", "--device", "cpu", "--data", str(text_data), "--out_dir", str(out),
            "--steps", "30", "--warmup", "5", "--lr", "1e-2", "--batch_size", "4",
            "--micro_batch", "4", "--seq_len", "32", "--eval_every", "15", "--eval_tokens", "1024",
            "--stat_tokens", "256", "--log_every", "5", "--keep_every", "15"]
    train.main(argv)
    summary = read_summary(out)
    assert set(summary) == SUMMARY_KEYS
    assert abs(summary["init_loss"] - math.log(50304)) < 0.1   # untrained: about uniform
    assert summary["val_loss"] < math.log(50304) - 3
    assert summary["diverged"] is False and summary["tokens"] == 30 * 4 * 32
    assert summary["logit_absmax"] >= abs(summary["logit_mean"]) and summary["mu_norm"] > 0.1

    log = read_log(out)
    assert [r["step"] for r in log] == [5, 10, 15, 20, 25, 30]
    assert all(LOG_KEYS <= set(r) for r in log) and log[-1]["loss"] < log[0]["loss"]
    assert [r["step"] for r in log if "val_loss" in r] == [15, 30]
    assert log[-1]["val_loss"] == summary["val_loss"] and log[-1]["mfu"] is None  # CPU: no peak

    config = json.loads((out / "config.json").read_text())
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["step"] == 30 and ckpt["config"] == config and config["save_every"] == 3
    for step in (0, 15, 30):                                   # weights-only snapshots
        snapshot = torch.load(out / f"ckpt_step{step:07d}.pt", weights_only=True)
        assert set(snapshot) == {"model", "step", "config"} and snapshot["step"] == step

    printed = capsys.readouterr().out
    assert "step 30/30 | loss" in printed and "tok/s" in printed and "ETA" in printed
    assert f"done: val loss {summary['val_loss']:.4f}" in printed
    assert train.main(argv + ["--resume"]) is None             # finished: nothing to do
    assert "is finished (summary.json); to train longer" in capsys.readouterr().out
    message = error_of(argv, capsys)
    assert "already holds a finished run" in message and "--resume" not in message
    assert read_summary(out) == summary


def test_mu_center_run_logs_zero_mean_embedding_at_every_step(markov_data, tmp_path):
    train.main(tiny(markov_data, tmp_path, "--head", "mu_center", "--lr", "3e-2"))
    log = read_log(tmp_path)
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6]
    assert all(r["mu_norm"] < 1e-6 and abs(r["logit_mean"]) < 1e-5 for r in log)  # Lemma 1


def test_chunked_loss_trains_like_the_plain_one(markov_data, tmp_path):
    """Chunks of 24 tokens do not divide the 64-token micro-batches: a ragged chunk is used."""
    common = ("--head", "z_loss", "--lam", "0.01")
    plain = train.main(tiny(markov_data, tmp_path / "plain", *common, "--loss_chunk", "0"))
    chunked = train.main(tiny(markov_data, tmp_path / "chunked", *common, "--loss_chunk", "24"))
    assert chunked.head.chunk_size == 24 and plain.head.chunk_size == 0
    for a, b in zip(read_log(tmp_path / "plain"), read_log(tmp_path / "chunked"), strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
    for name, tensor in plain.state_dict().items():
        torch.testing.assert_close(chunked.state_dict()[name], tensor, rtol=1e-4, atol=1e-5)


def test_an_absurd_learning_rate_diverges_cleanly_with_exit_code_0(markov_data, tmp_path):
    done = run_script([ROOT / "train.py", *tiny(markov_data, tmp_path, "--lr", "1e6",
                                                "--log_every", "10", "--save_every", "2",
                                                steps=40)])
    assert done.returncode == 0, done.stderr[-3000:]
    summary = read_summary(tmp_path)
    assert summary["diverged"] is True and summary["val_loss"] is None
    assert summary["tokens"] < 40 * 8 * 32 and "diverged" in done.stdout
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)["model"]  # no broken weights
    assert all(torch.isfinite(t).all() for t in state.values())


def test_the_default_data_is_fetched_as_far_as_the_run_reads(markov_data, tmp_path, monkeypatch,
                                                             capsys):
    """A local HTTP server stands in for Hugging Face, serving the Markov shards."""
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for split, name in (("train", "fineweb_train_000001.bin"), ("val", "fineweb_val_000000.bin")):
        shutil.copy(data.shard_paths(markov_data, split)[0], mirror / name)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(mirror))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("FINEWEB_BASE_URL", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setattr(prepare, "DEFAULT_DATA", str(tmp_path / "fineweb"))
    argv = tiny(markov_data, tmp_path / "run", steps=2)
    del argv[argv.index("--data"):argv.index("--data") + 2]
    train.main(argv)
    server.shutdown()
    assert sorted(p.name for p in (tmp_path / "fineweb").glob("*.bin")) == \
        ["fineweb_train_000001.bin", "fineweb_val_000000.bin"]
    assert "downloading fineweb100B" in capsys.readouterr().out
    assert read_summary(tmp_path / "run")["diverged"] is False
    monkeypatch.setenv("FINEWEB_BASE_URL", "http://127.0.0.1:9")  # nothing listens there
    shutil.rmtree(tmp_path / "fineweb")
    message = error_of(tiny(prepare.DEFAULT_DATA, tmp_path / "offline"), capsys)
    assert "could not download" in message and "pass text files as --data" in message


# ---- DDP, interruption and resume ----------------------------------------------------------

PROBE = """
import os, sys, torch, train
model = train.main(sys.argv[1:])
torch.save(model.state_dict(), os.path.join(os.path.dirname(__file__), os.environ["RANK"] + ".pt"))
"""


def test_two_processes_equal_one_with_twice_the_accumulation(markov_data, tmp_path):
    """8 sequences per step: 1 process × 4 micro-batches of 2 against 2 processes × 2 of 2."""
    single = train.main(tiny(markov_data, tmp_path / "one", "--head", "mu_center"))
    (tmp_path / "probe.py").write_text(PROBE)
    done = torchrun(tmp_path / "probe.py", *tiny(markov_data, tmp_path / "two", "--head",
                                                 "mu_center"))
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = read_log(tmp_path / "one"), read_log(tmp_path / "two")
    assert [r["step"] for r in two] == [r["step"] for r in one]
    for a, b in zip(one, two):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    s1, s2 = read_summary(tmp_path / "one"), read_summary(tmp_path / "two")
    assert s2["init_loss"] == pytest.approx(s1["init_loss"], rel=1e-6)
    assert s2["val_loss"] == pytest.approx(s1["val_loss"], rel=1e-5)
    rank0 = torch.load(tmp_path / "0.pt", weights_only=True)
    rank1 = torch.load(tmp_path / "1.pt", weights_only=True)
    for name, tensor in rank0.items():  # identical, bit for bit, with μ-centering on each rank
        assert torch.equal(tensor, rank1[name]), name
        assert torch.allclose(tensor, single.state_dict()[name], atol=1e-5), name


DETERMINISTIC = ("step", "tokens", "lr", "loss", "grad_norm", "mu_norm", "logit_mean",
                 "logit_std", "logit_absmax", "log2Z", "val_loss")


def test_a_killed_run_resumes_exactly(markov_data, tmp_path, monkeypatch, capsys):
    """Killed after step 5 with the last checkpoint at step 3: steps 4‥5 are redone, their log
    lines replaced. The second half runs compiled (dynamo's eager backend, for speed)."""
    common = ("--head", "mu_loss", "--eval_every", "4", "--save_every", "3")
    whole = train.main(tiny(markov_data, tmp_path / "whole", *common, steps=8))
    train.main(tiny(markov_data, tmp_path / "cut", *common, "--stop_at", "5", steps=8))
    assert not (tmp_path / "cut" / "summary.json").exists()
    with open(tmp_path / "cut" / "log.jsonl", "a") as log:
        log.write('{"step": 6, "lo')                               # a line the kill cut off
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


def test_a_resume_without_a_checkpoint_starts_at_step_0(markov_data, tmp_path, capsys):
    train.main(tiny(markov_data, tmp_path, "--stop_at", "1", "--save_every", "2", steps=3))
    train.main(tiny(markov_data, tmp_path, "--resume", steps=3))
    assert f"{tmp_path} holds no ckpt.pt: the run starts at step 0" in capsys.readouterr().out
    assert [record["step"] for record in read_log(tmp_path)] == [1, 2, 3]


def resumed_with(markov_data, tmp_path, order, resume):
    """An 8-step run, and the same run cut after step 4 and resumed by `resume(argv)`: their
    losses (the same steps read the same rows, so they differ only by rounding)."""
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
        train.main([*argv, "--micro_batch", "4"])                  # 8 rows: 4 × 2, then 2 × 4
        return capsys.readouterr().out
    assert "--resume with micro_batch 4, not the run's 2: the same run" in \
        resumed_with(markov_data, tmp_path, order, resume)


@pytest.mark.parametrize("order", data.ORDERS)
def test_a_resume_on_two_processes_is_the_same_run(markov_data, tmp_path, order):
    def resume(argv):
        done = torchrun(ROOT / "train.py", *argv)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout
    assert "--resume with world_size 2, not the run's 1: the same run" in \
        resumed_with(markov_data, tmp_path, order, resume)


def test_existing_runs_are_not_overwritten_and_resume_checks_the_settings(markov_data, tmp_path,
                                                                           capsys):
    train.main(tiny(markov_data, tmp_path, "--stop_at", "2", "--save_every", "2"))
    assert "already holds a run (ckpt.pt, config.json, log.jsonl); pass --resume" in \
        error_of(tiny(markov_data, tmp_path), capsys)
    message = error_of(tiny(markov_data, tmp_path, "--resume", "--lr", "0.01"), capsys)
    assert "was trained with --lr 0.003, not --lr 0.01; resume with its settings" in message


# ---- the mistakes people make: one sentence ---------------------------------------------------

def test_under_torchrun_an_error_is_said_once_without_a_traceback_of_ours(markov_data, tmp_path):
    """A command-line error (every rank), then a run-folder error (rank 0 alone)."""
    done = torchrun(ROOT / "train.py", *tiny(markov_data, tmp_path, "--batch_size", "3",
                                             "--micro_batch", "1"))
    assert done.stderr.count("train.py: error: --batch_size 3 must be a multiple of "
                             "--micro_batch × processes = 1 × 2 = 2") == 1
    assert done.returncode != 0 and not list(tmp_path.iterdir())
    (tmp_path / "log.jsonl").write_text("")
    done = torchrun(ROOT / "train.py", *tiny(markov_data, tmp_path))
    ours = [line for line in done.stderr.splitlines() if line.startswith("train.py: ")]
    assert ours == [f"train.py: error: {tmp_path} already holds a run (log.jsonl); pass "
                    f"--resume to continue it, or choose another --out_dir"]
    assert done.returncode != 0 and not re.search(rf'File "{ROOT}/[a-z_]+\.py"', done.stderr)


def shards(folder, val_tokens=None, bad_id=None, markov=None):
    """A copy of the Markov shards, its val split cut to val_tokens or one id made bad_id."""
    folder.mkdir()
    for split in ("train", "val"):
        tokens = data.read_shard(data.shard_paths(markov, split)[0]).copy()
        if split == "val" and val_tokens is not None:
            tokens = tokens[:val_tokens]
        if split == "val" and bad_id is not None:
            tokens[-1] = bad_id
        data.write_shard(folder / f"x_{split}_000000.bin", tokens)
    return folder


@pytest.mark.parametrize("extra, expected", [
    (["--head", "nope"], "invalid choice: 'nope'"),
    (["--size", "1B"], "invalid choice: '1B'"),
    (["--step", "10"], "unrecognized arguments: --step 10"),
    (["--batch_size", "7"], "--batch_size 7 must be a multiple of --micro_batch × processes"),
    (["--lam", "0.1"], "head 'baseline' does not use lam=0.1"),
    (["--vocab_size", "32"], "holds token id"),
    (["--data", "/nonexistent/shards"], "python prepare.py text FILES --out DIR"),
])
def test_bad_input_ends_in_one_clear_sentence(markov_data, tmp_path, capsys, extra, expected):
    message = error_of(tiny(markov_data, tmp_path, *extra), capsys)
    assert expected in message.strip().splitlines()[-1]  # argparse's usage lines come first
    assert not (tmp_path / "log.jsonl").exists()


@pytest.mark.parametrize("kind, expected", [
    ("short", "x_val_000000.bin holds 10 tokens, fewer than the 65"),
    ("bad_id", "holds token id 64, outside the model's vocabulary of 64"),
])
def test_bad_val_data_is_one_sentence_before_training(markov_data, tmp_path, capsys, kind,
                                                      expected):
    folder = shards(tmp_path / "shards", markov=markov_data,
                    **({"val_tokens": 10} if kind == "short" else {"bad_id": 64}))
    message = error_of(tiny(folder, tmp_path / "run"), capsys)
    assert expected in message and not (tmp_path / "run" / "log.jsonl").exists()


def test_eval_and_stat_tokens_fit_the_val_split(markov_data, tmp_path, capsys):
    """Asked for more than the val split holds: said once. By default: fitted, silently."""
    train.main(tiny(markov_data, tmp_path / "asked", "--eval_tokens", "10000000",
                    "--stat_tokens", "10000000", steps=2))
    n = data.shard_length(data.shard_paths(markov_data, "val")[0])
    held = (n - 1) // 64 * 64                        # whole evaluation steps of 2 × 32 tokens
    printed = capsys.readouterr().out
    for name in ("eval_tokens", "stat_tokens"):
        assert f"--{name} 10,000,000 is more than the val split holds: using its {held:,}" \
            in printed
    argv = tiny(markov_data, tmp_path / "default", steps=100)
    del argv[argv.index("--eval_tokens"):argv.index("--stat_tokens") + 2]
    args = train.parse_args(argv)
    train.ready_data(args)
    assert "more than" not in capsys.readouterr().out
    assert args.eval_tokens == args.stat_tokens == 100 * 8 * 32 // 20 < held  # a twentieth


# ---- the pieces -----------------------------------------------------------------------------

def test_defaults_warmup_5_percent_and_a_checkpoint_every_tenth_of_a_short_run():
    paper = train.parse_args(["--device", "cpu"])
    assert paper.warmup == 5000 and paper.save_every == 1000
    short = train.parse_args(["--device", "cpu", "--steps", "200"])
    assert short.warmup == 10 and short.save_every == 20 and short.loss_chunk == 64


def test_lr_schedule_warms_up_linearly_then_decays_by_cosine_to_min_lr():
    args = train.parse_args(["--device", "cpu", "--steps", "100", "--warmup", "10"])
    lrs = [train.lr_at(s, args) for s in range(100)]
    assert lrs[0] == pytest.approx(args.lr / 10) and lrs[9] == pytest.approx(args.lr)
    assert lrs[55] == pytest.approx(args.min_lr + 0.5 * (args.lr - args.min_lr))
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:])) and lrs[-1] > args.min_lr


def test_the_mean_hidden_state_along_mu_is_the_mean_logit_over_mu_norm():
    args = train.parse_args(["--size", "tiny", "--vocab_size", "96", "--seq_len", "16",
                             "--device", "cpu"])
    model = train.build_model(args)
    with torch.no_grad():  # a drifted μ, as training grows it
        model.output_weight.add_(torch.randn(64, generator=torch.Generator().manual_seed(1)))
    x, y = torch.randint(0, 96, (3, 16)), torch.randint(0, 96, (3, 16))
    amp = train.autocast(torch.device("cpu"), "float32")
    stats = train.head_stats(train.stat_sums(model, x, y, args, amp), model)
    with torch.no_grad():
        h_mean = model.hidden(x).double().flatten(0, 1).mean(0)
    mu = model.output_weight.detach().double().mean(0)
    assert stats["h_mu_proj"] * train.mu_norm(model) == pytest.approx(stats["logit_mean"],
                                                                      rel=1e-5)  # Lemma 1
    assert stats["h_mu_cos"] == pytest.approx(
        (h_mean @ mu / (h_mean.norm() * mu.norm())).item(), rel=1e-6)


@pytest.mark.parametrize("name, peak", [("NVIDIA A100-SXM4-80GB", 312e12),
                                        ("NVIDIA H100 80GB HBM3", 989e12),
                                        ("NVIDIA H100 PCIe", 756e12),
                                        ("NVIDIA H200", 989e12), ("Tesla T4", None)])
def test_mfu_uses_the_peak_of_the_device_in_use(monkeypatch, name, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert train.peak_flops(torch.device("cuda", 0), "bfloat16") == peak
    assert train.peak_flops(torch.device("cuda", 0), "float32") is None


def test_the_log_line_shows_the_eta_in_hours_and_minutes_or_minutes_and_seconds():
    record = {"step": 5, "loss": 2.0, "lr": 1e-3, "tok_per_s": 1234.0, "mfu": None}
    assert train.log_line(record, 100, 3725) == \
        "step   5/100 | loss 2.0000 | lr 1.00e-03 | 1,234 tok/s | ETA 1h02m"
    assert train.log_line(record, 100, 125).endswith("ETA 2m05s")
    assert "ETA" not in train.log_line(record, 100, None)

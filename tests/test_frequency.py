"""experiments/frequency: the two Markov languages have K successors a token and differ only in
frequency; the frozen-gain ablation keeps ln_f's gain at 1; the trajectories CSV is the logs."""
import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import data
from experiments.frequency import chain, trajectories

ROOT = Path(__file__).resolve().parents[1]


def test_uniform_successors_make_a_doubly_stochastic_chain_of_uniform_frequency():
    S = chain.successors("uniform", vocab=50, k=3, zipf=1.0, seed=0)
    assert S.shape == (50, 3) and all(len(set(row)) == 3 for row in S)
    assert (np.bincount(S.ravel(), minlength=50) == 3).all()  # K predecessors each
    assert chain.stationary(S) == pytest.approx(np.full(50, 1 / 50), abs=1e-12)


def test_zipf_successors_follow_the_prior_and_unreached_tokens_never_occur():
    S = chain.successors("zipf", vocab=400, k=4, zipf=1.0, seed=1)
    pi = chain.stationary(S)
    assert all(len(set(row)) == 4 for row in S) and pi.sum() == pytest.approx(1)
    P = np.zeros((400, 400))
    P[np.arange(400)[:, None], S] = 1 / 4
    assert pi @ P == pytest.approx(pi, abs=1e-12)  # stationary
    unreached = np.setdiff1d(np.arange(400), S)
    assert len(unreached) > 0 and (pi[unreached] == 0).all()
    assert np.sort(pi)[-4:].sum() > 10 * 4 / 400  # a few tokens take a large share


def test_samples_follow_the_successor_sets_and_a_periodic_chain_is_refused():
    S = chain.successors("uniform", vocab=30, k=2, zipf=1.0, seed=2)
    tokens = chain.sample(S, chain.stationary(S), 5000, seed=0)
    assert len(tokens) == 5000 and all(b in S[a] for a, b in zip(tokens[:-1], tokens[1:]))
    two_cycles = np.array([[1, 1], [0, 0], [0, 0]])  # 2 → 0 ⇄ 1: periodic, π(t) oscillates
    with pytest.raises(ValueError, match="no single stationary distribution"):
        chain.stationary(two_cycles)


def test_the_cli_writes_a_dataset_with_its_entropy_rate_and_refuses_a_bad_k(tmp_path, capsys):
    chain.main(["zipf", "--out", str(tmp_path / "z"), "--vocab", "64", "--successors", "4",
                "--tokens", "6400"])
    assert "entropy rate ln 4 = 1.386 nats" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "z" / "manifest.json").read_text())
    assert manifest["source"]["entropy_rate"] == pytest.approx(math.log(4))
    assert data.read_shard(data.shard_paths(tmp_path / "z", "train")[0]).max() < 64
    with pytest.raises(SystemExit, match="need 2 ≤ --successors < --vocab ≤ 65536, got 64 and 64"):
        chain.main(["uniform", "--out", str(tmp_path / "u"), "--vocab", "64",
                    "--successors", "64"])


def test_frozen_gain_trains_with_the_final_layernorms_gain_left_at_one(tmp_path):
    chain.main(["uniform", "--out", str(tmp_path / "u"), "--vocab", "64", "--tokens", "20000"])
    run = tmp_path / "run"
    subprocess.run([sys.executable, str(ROOT / "experiments/frequency/frozen_gain.py"), "--size",
                    "tiny", "--vocab_size", "64", "--data", str(tmp_path / "u"), "--steps", "5",
                    "--batch_size", "2", "--seq_len", "16", "--lr", "0.1", "--log_every", "1",
                    "--eval_every", "0", "--eval_tokens", "64", "--stat_tokens", "64",
                    "--device", "cpu", "--out_dir", str(run)], check=True, capture_output=True)
    model = torch.load(run / "ckpt.pt", weights_only=False)["model"]
    assert (model["ln_f.weight"] == 1).all() and not (model["blocks.0.ln_1.weight"] == 1).all()
    logged = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    stats = [r for r in logged if "h_mu_cos" in r]
    rows = list(csv.DictReader(open(trajectories_of(tmp_path, run))))
    assert [float(r["h_mu_proj"]) for r in rows] == pytest.approx(
        [r["h_mu_proj"] for r in stats], rel=1e-5) and rows[0]["run"] == "sweep/run"


def trajectories_of(tmp_path, run) -> Path:
    (tmp_path / "sweeps" / "sweep").mkdir(parents=True)
    run.rename(tmp_path / "sweeps" / "sweep" / "run")
    trajectories.main([str(tmp_path / "sweeps"), "--out", str(tmp_path / "t.csv")])
    return tmp_path / "t.csv"

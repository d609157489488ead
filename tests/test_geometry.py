"""geometry.py: known answers for the embedding-geometry measurements, the `repeat` task's
floor against a brute-force optimum, and the CLI on the small run folders of test_analyze."""
import json
import math

import numpy as np
import pytest
import torch

import data
import prepare
from experiments.geometry import geometry
from test_analyze import VOCAB, gaussian, markov_dir, runs, tiny_model  # noqa: F401 (fixtures)


def random_rotation(d, seed=0):
    Q, R = torch.linalg.qr(gaussian(d, d, seed=seed))
    return Q * torch.sign(torch.diagonal(R))  # a proper random orthogonal matrix


# ───────────────────────────── pure functions: known answers ─────────────────────────────

def test_rotated_copy_has_procrustes_alignment_one_and_full_knn_overlap():
    A = gaussian(200, 16, seed=11)
    B = A @ random_rotation(16, seed=12) + 3.0  # rotated and shifted: centring removes the shift
    out = geometry.alignment(A, B)
    assert out["procrustes"] == pytest.approx(1.0, abs=1e-12)
    assert out["lstsq"] == pytest.approx(1.0, abs=1e-12)
    assert out["identity"] < 0.5  # a non-trivial rotation moves the coordinates
    assert geometry.knn_overlap(A, B, k=10) == 1.0
    assert geometry.similarity_alignment(geometry.centred(A), geometry.centred(B)) == pytest.approx(1.0, abs=1e-12)


def test_unrelated_matrices_are_not_aligned():
    A, B = gaussian(300, 16, seed=13), gaussian(300, 16, seed=14)
    assert geometry.alignment(A, B)["procrustes"] < 0.3
    assert geometry.knn_overlap(A, B, k=10) < 0.1  # chance is k/(n−1) ≈ 0.03


def test_markov_signatures_equal_the_generating_probabilities(markov_dir):
    """Label signature = P; context signature at −k = π_b (Pᵏ)_ba / π_a (the reversed chain)."""
    P = prepare.markov_transition(VOCAB, 0)
    pi = prepare.markov_stationary(P)
    tokens = geometry.training_tokens(markov_dir, 10**9)
    ids = np.arange(VOCAB)
    rows = np.bincount(tokens, minlength=VOCAB)
    for offset, expected in ((1, P), (-1, (pi[:, None] * P).T / pi[:, None]),
                             (-2, (pi[:, None] * (P @ P)).T / pi[:, None])):
        S = geometry.signature(tokens, ids, offset)
        np.testing.assert_allclose(S.sum(1), 1, atol=1e-12)
        # binomial sampling error of each entry, 5σ (plus the few joins between chains)
        sigma = np.sqrt(expected * (1 - expected) / rows[:, None])
        assert np.all(np.abs(S - expected) <= 5 * sigma + 2e-3), offset


def test_signature_over_a_subset_counts_partners_outside_it():
    tokens = np.array([0, 1, 2, 0, 1, 0, 2])
    S = geometry.signature(tokens, np.array([0, 1]), offset=1)
    # after 0: 1, 1, 2 → P(1 | 0) = 2/3, and P(2 | 0) = 1/3 falls outside the subset
    np.testing.assert_allclose(S, [[0, 2 / 3], [1 / 2, 0]])
    np.testing.assert_array_equal(geometry.frequent_tokens(tokens, 2), [0, 1])


def test_tied_gradient_split_equals_the_untied_twin():
    """A tied model's two gradient parts equal the input and output gradients of an untied
    model whose two matrices hold the same values."""
    tied, untied = tiny_model(tie=True), tiny_model(tie=False)
    state = tied.state_dict()
    state["out_embedding"] = state["wte.weight"].clone()
    untied.load_state_dict(state)
    x = torch.randint(VOCAB, (2, 32), generator=torch.Generator().manual_seed(1))
    y = torch.roll(x, -1, 1)
    out_t, in_t = geometry.tied_gradient_split(tied, x, y)
    out_u, in_u = geometry.tied_gradient_split(untied, x, y)
    # float32 model: the output part is a difference of two float32 sums, so compare at that scale
    for a, b in ((in_t, in_u), (out_t, out_u)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6 * b.abs().max().item())
    untied(x, y)[0].backward()
    torch.testing.assert_close(in_u, untied.wte.weight.grad.double())
    share = geometry.output_share(out_t, in_t)
    assert share["share_norm"] == pytest.approx(out_t.norm() / (out_t.norm() + in_t.norm()))
    assert 0 < share["share_energy"] < 1


# ───────────────────────────── the repeat task's floor ─────────────────────────────

def brute_force_floor(V, T):
    """The lowest mean loss of one prediction per window, found by minimising it numerically
    over every window's logits, averaged over all V² equally likely (a, b) pairs: x = a…a and
    y = a…a b."""
    losses = []
    for a in range(V):
        targets = torch.tensor([[a] * (T - 1) + [b] for b in range(V)]).flatten()
        logits = torch.zeros(V, dtype=torch.float64, requires_grad=True)
        optimizer = torch.optim.LBFGS([logits], max_iter=200, tolerance_grad=1e-14,
                                      tolerance_change=1e-16, line_search_fn="strong_wolfe")

        def loss():
            optimizer.zero_grad()
            value = torch.nn.functional.cross_entropy(logits.expand(len(targets), V), targets)
            value.backward()
            return value
        optimizer.step(loss)
        losses.append(loss().item())
    return sum(losses) / V


@pytest.mark.parametrize("V, T", [(3, 4), (5, 2), (4, 1)])
def test_repeat_floor_is_the_best_constant_prediction_per_window(V, T):
    floor = geometry.repeat_floor(V, T)
    assert floor == pytest.approx(brute_force_floor(V, T), abs=1e-9)
    assert floor > math.log(V) / T or T == 1
    assert geometry.repeat_floor(V, 1) == pytest.approx(math.log(V))  # T = 1: chance


def test_repeat_floor_leaves_out_eot():
    assert geometry.repeat_floor(data.EOT + 1, 8) == geometry.repeat_floor(data.EOT, 8)


def test_the_loader_cuts_repeat_windows_as_the_floor_assumes(tmp_path):
    V, T = 5, 4
    prepare.prepare_synthetic("repeat", V, 2000, tmp_path, seq_len=T)
    for split in ("train", "val"):
        loader = data.ShardLoader(tmp_path, 3, T, split=split)
        for _ in range(5):
            x, y = loader.next_batch()
            assert (x == x[:, :1]).all() and (y[:, :-1] == x[:, 1:]).all(), split


def test_a_window_of_one_token_gives_one_hidden_state_at_every_position():
    """The model has no absolute position: the premise of repeat_floor."""
    gpt = tiny_model(tie=False).eval()
    with torch.no_grad():
        h = gpt.hidden(torch.full((2, 32), 7))
    torch.testing.assert_close(h, h[:, :1].expand_as(h), rtol=0, atol=1e-5)
    assert not torch.allclose(h[0, 0], gpt.hidden(torch.full((1, 32), 8))[0, 0])


# ───────────────────────────── CLI ─────────────────────────────

def cli(*argv):
    return geometry.main([str(a) for a in argv])


def test_cli_signatures_follow_the_checkpoints(runs, tmp_path):
    sig = cli("signatures", "--run", runs["untied"], "--top_k", 32, "--sig_tokens", 50_000,
              "--plot", tmp_path / "s.png", "--json", tmp_path / "s.json")
    assert [r["step"] for r in sig["steps"]] == [0, 10] and sig["top_k"] == 32
    assert all(-1 <= r["out+1"] <= 1 and -1 <= r["in-3"] <= 1 for r in sig["steps"])
    assert (tmp_path / "s.png").is_file()
    assert json.loads((tmp_path / "s.json").read_text()) == sig


def test_cli_tying(runs, capsys):
    out = cli("tying", "--tied", runs["tied"], "--untied", runs["untied"], "--top_k", 48,
              "--sig_tokens", 50_000, "--batch_size", 2)
    assert out["tokens"] == 48
    geometry_ = out["geometry"]
    for pair in geometry_.values():
        assert -1 <= pair["identity"] <= 1 and -1 <= pair["lstsq"] <= 1 and 0 <= pair["knn_overlap"] <= 1
    # model.py's init: the tied matrix starts as the untied output matrix's Xavier draw
    assert geometry_["tied vs untied output at init"]["identity"] == pytest.approx(1, abs=1e-12)
    assert abs(geometry_["tied vs untied input at init"]["identity"]) < 0.1  # independent draws
    assert "Δtied vs Δuntied output since init" in geometry_
    shares = out["gradient_share"]
    assert [(s["run"], s["step"]) for s in shares] == [("tied", 0), ("tied", 10), ("untied", 0), ("untied", 10)]
    assert all(0 < s["share_norm"] < 1 for s in shares)
    assert "share of the embedding gradient" in capsys.readouterr().out


def test_cli_errors_are_one_sentence(runs, tmp_path):
    with pytest.raises(SystemExit, match="--tied must name a run trained with --tie"):
        cli("tying", "--tied", runs["untied"], "--untied", runs["tied"])
    with pytest.raises(SystemExit, match="no config.json"):
        cli("signatures", "--run", tmp_path)
    with pytest.raises(SystemExit):
        cli("signatures", "--run", runs["untied"], "--offsets", 0)


@pytest.mark.parametrize("value", ["-1", "inf", "nan"])
def test_trivial_refuses_a_bad_exposure_before_anything_runs(tmp_path, capsys, value):
    """-1 ran prepare.py and train.py; inf ended in OverflowError's traceback."""
    with pytest.raises(SystemExit):
        cli("trivial", "--out", tmp_path / "t", "--seqs_per_token", value)
    assert f"argument --seqs_per_token: {value} is invalid; give a finite number >= 0" in \
        capsys.readouterr().err
    assert not (tmp_path / "t").exists()


def test_signatures_refuse_an_offset_beyond_the_tokens(runs):
    """--offsets 1000000000 printed a table of NaN."""
    with pytest.raises(SystemExit, match="--offsets 1000000000 reach beyond the 5000 training "
                                         "tokens counted"):
        cli("signatures", "--run", runs["untied"], "--offsets", 1, 10 ** 9, "--sig_tokens", 5000)


def test_cli_trivial_trains_one_vocabulary_end_to_end(tmp_path):
    # data already there (as after an interrupted sweep) is reused: only train.py runs
    prepare.prepare_synthetic("repeat", 8, 2000, tmp_path / "repeat_V8_T16_N2000", seq_len=16)
    out = cli("trivial", "--out", tmp_path, "--vocabs", 8, "--steps", 1, "--seqs_per_token", 1,
              "--batch_size", 2, "--seq_len", 16, "--trivial_tokens", 2000,
              "--plot", tmp_path / "t.png", "--train_args", "--lr", "1e-3")
    row, = out["runs"]
    assert row["vocab"] == 8 and row["steps"] == 4  # max(--steps, ⌈1·8/2⌉)
    assert row["seqs_per_token"] == 1 and row["chance"] == pytest.approx(math.log(8))
    assert row["floor"] == pytest.approx(geometry.repeat_floor(8, 16))
    assert math.isfinite(row["val_loss"]) and not row["diverged"]
    config = json.loads((tmp_path / "tiny_baseline_tie0_V8_steps4" / "config.json").read_text())
    assert config["vocab_size"] == 8 and config["lr"] == 1e-3  # --train_args reach train.py
    assert (tmp_path / "t.png").stat().st_size > 1000

"""analyze.py: known answers for every measurement, and the CLI on small run folders.

The run folders here are written in train.py's checkpoint format (config.json, ckpt.pt and
ckpt_step*.pt snapshots) from tiny models on a synthetic Markov language of 64 tokens, so each
subcommand runs end to end in about a second.
"""
import json
import math

import numpy as np
import pytest
import torch

import analyze
import data
import heads
import model

VOCAB = 64  # the synthetic runs' vocabulary


def gaussian(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def random_rotation(d, seed=0):
    Q, R = torch.linalg.qr(gaussian(d, d, seed=seed))
    return Q * torch.sign(torch.diagonal(R))  # a proper random orthogonal matrix


# ───────────────────────────── pure functions: known answers ─────────────────────────────

def test_isotropic_weight_retains_d_over_v_of_a_random_gradient():
    """For a fixed D-dim subspace and isotropic g, ‖Pg‖²/‖g‖² ~ Beta(D/2, (V−D)/2): mean D/V."""
    V, D, N = 2000, 40, 400
    out = analyze.bottleneck(gaussian(N, V, seed=1), gaussian(V, D, seed=2))
    p = D / V
    beta_std = math.sqrt(2 * p * (1 - p) / (V + 2))  # std of one Beta(D/2, (V−D)/2) draw
    assert out["rank"] == D and out["isotropic_energy"] == p
    assert abs(out["retained_energy"] - p) < 5 * beta_std / math.sqrt(N)
    assert abs(out["suppressed_energy"] - (1 - p)) < 5 * beta_std / math.sqrt(N)
    assert abs(out["retained_norm"] - math.sqrt(p)) < 0.01


def test_retained_norm_is_the_best_cosine_reachable_through_h():
    """‖Pg‖/‖g‖ equals cos(g, W a*) with a* the least-squares fit of g by W's columns."""
    V, D, N = 300, 12, 20
    G, W = gaussian(N, V, seed=3), gaussian(V, D, seed=4) + 2.0  # anisotropic: a common shift
    fits = W @ torch.linalg.lstsq(W, G.T).solution  # V×N, column t = best W·a for gₜ
    cosines = torch.nn.functional.cosine_similarity(fits.T, G, dim=1)
    assert analyze.bottleneck(G, W)["retained_norm"] == pytest.approx(cosines.mean().item(), rel=1e-10)


def test_batch_bounds_match_an_explicit_svd_and_an_explicit_sgd_step():
    N, V, D = 120, 300, 10
    G, W, H = gaussian(N, V, seed=5), gaussian(V, D, seed=6), gaussian(N, D, seed=7)
    out = analyze.bottleneck(G, W, H)
    sigma_sq = torch.linalg.svdvals(G) ** 2
    assert out["rank2D_energy"] == pytest.approx((sigma_sq[:2 * D].sum() / sigma_sq.sum()).item(), rel=1e-10)
    assert out["rankD_energy"] == pytest.approx((sigma_sq[:D].sum() / sigma_sq.sum()).item(), rel=1e-10)
    M = G @ W @ W.T + H @ H.T @ G  # −ΔZ of a gradient step on free H and W (up to the step size)
    cosine = (M * G).sum() / (M.norm() * G.norm())
    assert out["sgd_cosine"] == pytest.approx(cosine.item(), rel=1e-10)
    assert out["rankD_energy"] < out["rank2D_energy"] < 1
    assert out["pooled_energy"] <= out["rankD_energy"] + 1e-12  # Eckart–Young: best rank-D


def test_batch_bound_is_trivial_when_there_are_fewer_tokens_than_2d():
    out = analyze.bottleneck(gaussian(30, 200, seed=8), gaussian(200, 20, seed=9))
    assert out["rank2D_energy"] == pytest.approx(1.0, abs=1e-12)


def test_loss_gradients_are_softmax_minus_onehot():
    logits = gaussian(5, 7, seed=10).requires_grad_()
    targets = torch.tensor([0, 6, 3, 3, 1])
    torch.nn.functional.cross_entropy(logits, targets, reduction="sum").backward()
    G = analyze.loss_gradients(logits.detach(), targets)
    torch.testing.assert_close(G, logits.grad, rtol=0, atol=1e-15)


def test_rotated_copy_has_procrustes_alignment_one_and_full_knn_overlap():
    A = gaussian(200, 16, seed=11)
    B = A @ random_rotation(16, seed=12) + 3.0  # rotated and shifted: centring removes the shift
    out = analyze.alignment(A, B)
    assert out["procrustes"] == pytest.approx(1.0, abs=1e-12)
    assert out["lstsq"] == pytest.approx(1.0, abs=1e-12)
    assert out["identity"] < 0.5  # a non-trivial rotation moves the coordinates
    assert analyze.knn_overlap(A, B, k=10) == 1.0
    assert analyze.similarity_alignment(analyze.centred(A), analyze.centred(B)) == pytest.approx(1.0, abs=1e-12)


def test_unrelated_matrices_are_not_aligned():
    A, B = gaussian(300, 16, seed=13), gaussian(300, 16, seed=14)
    assert analyze.alignment(A, B)["procrustes"] < 0.3
    assert analyze.knn_overlap(A, B, k=10) < 0.1  # chance is k/(n−1) ≈ 0.03


@pytest.fixture(scope="module")
def markov_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("markov")
    data.prepare_synthetic("markov", VOCAB, 120_000, out, seed=0, seq_len=64)
    return out


def test_markov_signatures_equal_the_generating_probabilities(markov_dir):
    """Label signature = P; context signature at −k = π_b (Pᵏ)_ba / π_a (the reversed chain)."""
    P = data.markov_transition(VOCAB, 0)
    pi = data.markov_stationary(P)
    tokens = analyze.training_tokens(markov_dir, 10**9)
    ids = np.arange(VOCAB)
    rows = np.bincount(tokens, minlength=VOCAB)
    for offset, expected in ((1, P), (-1, (pi[:, None] * P).T / pi[:, None]),
                             (-2, (pi[:, None] * (P @ P)).T / pi[:, None])):
        S = analyze.signature(tokens, ids, offset)
        np.testing.assert_allclose(S.sum(1), 1, atol=1e-12)
        # binomial sampling error of each entry, 5σ (plus the few joins between chains)
        sigma = np.sqrt(expected * (1 - expected) / rows[:, None])
        assert np.all(np.abs(S - expected) <= 5 * sigma + 2e-3), offset


def test_signature_over_a_subset_counts_partners_outside_it():
    tokens = np.array([0, 1, 2, 0, 1, 0, 2])
    S = analyze.signature(tokens, np.array([0, 1]), offset=1)
    # after 0: 1, 1, 2 → P(1 | 0) = 2/3, and P(2 | 0) = 1/3 falls outside the subset
    np.testing.assert_allclose(S, [[0, 2 / 3], [1 / 2, 0]])
    np.testing.assert_array_equal(analyze.frequent_tokens(tokens, 2), [0, 1])


# ───────────────────────────── the paper's identities ─────────────────────────────

def shifted_weight(V=VOCAB, D=16, shift=1.5, seed=15):
    """An anisotropic output embedding: isotropic rows plus a common shift (a large μ)."""
    return gaussian(V, D, seed=seed) + shift * gaussian(D, seed=seed + 1)


def test_verify_identities_hold_to_float64_precision_with_the_projects_centering():
    W, H = shifted_weight(), gaussian(300, 16, seed=17) * 3
    targets = torch.randint(VOCAB, (300,), generator=torch.Generator().manual_seed(0))
    W_star = W.clone()
    heads.build("mu_center").after_step(W_star)
    out = analyze.verify_identities(H, W, W_star, targets, chunk=64)
    assert out["mu_norm"] > 1  # the check is not vacuous: the mean logit before is far from 0
    for name in ("centering_dev", "lemma1_dev", "prop3_mean", "prop3_std_dev", "prop3_prob_dev",
                 "prop3_loss_dev", "eq26_dev"):
        assert out[name] < 1e-12 * out["max_abs_logit"], name
    assert 0 < out["lemma2_ratio"] <= 1
    assert out["B_ratio"] == pytest.approx(heads.b_ratio(W), abs=0)


def test_verify_reports_the_failing_step_of_theorem_4():
    """heads.b_ratio's E₁ = [[−1,0],[0,−1],[0,1]]: B_ratio = 2/3 ≤ 1, yet Eq. 32 and Eq. 34 fail,
    and h = (1, −3) gets a larger max |l*| than max |l| (10/3 > 3)."""
    W = torch.tensor([[-1.0, 0], [0, -1], [0, 1]], dtype=torch.float64)
    W_star = W - W.mean(0)
    out = analyze.verify_identities(torch.tensor([[1.0, -3.0]], dtype=torch.float64), W, W_star,
                                    torch.tensor([0]))
    assert out["B_ratio"] == pytest.approx(2 / 3) and out["B_ratio_le_1"]
    assert not out["eq34_holds"] and out["max_norm_star"] == pytest.approx(math.sqrt(10) / 3)
    assert out["eq32_dev"] == pytest.approx(4 / 9 + 1 - 10 / 9)
    assert out["eq35_token_share"] == 0 and not out["eq35_global_holds"]
    assert out["max_abs_logit_star"] == pytest.approx(10 / 3) and out["max_abs_logit"] == pytest.approx(3)


def test_logit_statistics_per_token():
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, -6.0]], dtype=torch.float64)
    out = analyze.logit_statistics(logits)
    assert out["logit_mean"] == pytest.approx(2.0 + -2.0)
    assert out["logit_std"] == pytest.approx(math.sqrt(2 / 3) + math.sqrt(8))
    assert out["logit_absmax"] == pytest.approx(3 + 6)
    lse = [math.log(math.e + math.e ** 2 + math.e ** 3), math.log(2 + math.exp(-6))]
    assert out["log2Z"] == pytest.approx(lse[0] ** 2 + lse[1] ** 2)


# ───────────────────────────── gradient split of a tied matrix ─────────────────────────────

def tiny_model(tie, head="baseline", seed=0):
    torch.manual_seed(seed)
    return analyze.build_model(dict(size="tiny", head=head, tie=tie, vocab_size=VOCAB, seq_len=32))


def test_tied_gradient_split_equals_the_untied_twin():
    """A tied model's two gradient parts equal the input and output gradients of an untied
    model whose two matrices hold the same values."""
    tied, untied = tiny_model(tie=True), tiny_model(tie=False)
    state = tied.state_dict()
    state["out_embedding"] = state["wte.weight"].clone()
    untied.load_state_dict(state)
    x = torch.randint(VOCAB, (2, 32), generator=torch.Generator().manual_seed(1))
    y = torch.roll(x, -1, 1)
    out_t, in_t = analyze.tied_gradient_split(tied, x, y)
    out_u, in_u = analyze.tied_gradient_split(untied, x, y)
    # float32 model: the output part is a difference of two float32 sums, so compare at that scale
    for a, b in ((in_t, in_u), (out_t, out_u)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6 * b.abs().max().item())
    untied(x, y)[0].backward()
    torch.testing.assert_close(in_u, untied.wte.weight.grad.double())
    share = analyze.output_share(out_t, in_t)
    assert share["share_norm"] == pytest.approx(out_t.norm() / (out_t.norm() + in_t.norm()))
    assert 0 < share["share_energy"] < 1


# ───────────────────────────── CLI on run folders and fresh models ─────────────────────────────

def write_run(run_dir, data_dir, tie, shift_per_step, steps=(0, 10)):
    """A run folder in train.py's format whose output embedding drifts by a common shift
    (and a little per token, so that the moves since init have a geometry of their own)."""
    cfg = dict(size="tiny", head="baseline", tie=tie, lam=None, cap=None, vocab_size=VOCAB,
               seq_len=64, data=str(data_dir), lr=1e-3, steps=steps[-1])
    gpt = tiny_model(tie)
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(cfg))
    generator = torch.Generator().manual_seed(2)
    direction = torch.randn(gpt.config.n_embd, generator=generator)
    for i, step in enumerate(steps):
        with torch.no_grad():
            move = direction + 0.1 * torch.randn(gpt.output_weight.shape, generator=generator)
            gpt.output_weight.add_(shift_per_step * (i > 0) * move)
        name = "ckpt.pt" if step == steps[-1] else f"ckpt_step{step:07d}.pt"
        torch.save(dict(model=gpt.state_dict(), step=step, config=cfg), run_dir / name)
    return run_dir


@pytest.fixture(scope="module")
def runs(markov_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return dict(untied=write_run(root / "untied", markov_dir, False, 0.5),
                tied=write_run(root / "tied", markov_dir, True, 0.5))


def cli(*argv):
    return analyze.main([str(a) for a in argv])


def test_cli_verify_on_a_run_and_its_json(runs, tmp_path, capsys):
    out = cli("verify", "--run", runs["untied"], "--tokens", 256, "--json", tmp_path / "v.json")
    assert json.loads((tmp_path / "v.json").read_text()) == out
    assert out["step"] == 10 and out["tokens"] == 256 and out["mu_norm"] > 0.4
    assert out["prop3_mean"] < 1e-12 * out["max_abs_logit"]
    assert out["prop3_loss_dev"] < 1e-12 * out["max_abs_logit"]
    printed = capsys.readouterr().out
    assert "Prop. 3 (ii): std(l*) = std(l)" in printed and "B_ratio" in printed


def test_cli_logits_after_mu_center_has_zero_mean_logit(runs, tmp_path):
    before = cli("logits", "--run", runs["untied"], "--tokens", 256)
    gpt, cfg, step = analyze.load_checkpoint(runs["untied"] / "ckpt.pt", "cpu")
    heads.build("mu_center").after_step(gpt.output_weight)
    centred_run = tmp_path / "centred"
    centred_run.mkdir()
    (centred_run / "config.json").write_text(json.dumps(cfg))
    torch.save(dict(model=gpt.state_dict(), step=step, config=cfg), centred_run / "ckpt.pt")
    after = cli("logits", "--run", centred_run, "--tokens", 256, "--plot", tmp_path / "hist.png")
    assert abs(before["logit_mean"]) > 0.1 and before["mu_norm"] > 0.4
    assert abs(after["logit_mean"]) < 1e-6 and after["mu_norm"] < 1e-6  # float32 weights
    assert after["logit_std"] == pytest.approx(before["logit_std"], rel=1e-5)
    assert (tmp_path / "hist.png").stat().st_size > 1000


def test_cli_on_a_fresh_model_gives_sane_numbers(tmp_path):
    V = 512
    logits = cli("logits", "--init", "tiny", "--vocab_size", V, "--tokens", 256, "--seq_len", 64)
    # near-Gaussian logits at init: log Z ≈ ln V + σ²/2 (E exp(l) = exp(σ²/2) for l ~ N(0, σ²))
    assert math.sqrt(logits["log2Z"]) == pytest.approx(math.log(V) + logits["logit_std"] ** 2 / 2, abs=0.05)
    assert abs(logits["logit_mean"]) < 0.05 and 0 < logits["B_ratio"]
    out = cli("bottleneck", "--init", "tiny", "--vocab_size", V, "--tokens", 256, "--seq_len", 64,
              "--json", tmp_path / "b.json")
    row, = out["steps"]
    D = model.SIZES["tiny"]["n_embd"]
    assert row["isotropic_energy"] == D / V
    assert 0.5 * D / V < row["retained_energy"] < 2 * D / V  # an untrained head is near-isotropic
    assert row["suppressed_norm"] == pytest.approx(1 - row["retained_norm"])
    assert json.loads((tmp_path / "b.json").read_text()) == out


def test_cli_bottleneck_and_signatures_follow_the_checkpoints(runs, tmp_path):
    out = cli("bottleneck", "--run", runs["untied"], "--tokens", 256, "--plot", tmp_path / "b.png")
    assert [r["step"] for r in out["steps"]] == [0, 10]
    sig = cli("signatures", "--run", runs["untied"], "--top_k", 32, "--sig_tokens", 50_000,
              "--plot", tmp_path / "s.png")
    assert [r["step"] for r in sig["steps"]] == [0, 10] and sig["top_k"] == 32
    assert all(-1 <= r["out+1"] <= 1 and -1 <= r["in-3"] <= 1 for r in sig["steps"])
    assert (tmp_path / "b.png").is_file() and (tmp_path / "s.png").is_file()


def test_cli_tying(runs, capsys):
    out = cli("tying", "--tied", runs["tied"], "--untied", runs["untied"], "--top_k", 48,
              "--sig_tokens", 50_000, "--batch_size", 2)
    assert out["tokens"] == 48
    geometry = out["geometry"]
    for pair in geometry.values():
        assert -1 <= pair["identity"] <= 1 and -1 <= pair["lstsq"] <= 1 and 0 <= pair["knn_overlap"] <= 1
    # model.py's init: the tied matrix starts as the untied output matrix's Xavier draw
    assert geometry["tied vs untied output at init"]["identity"] == pytest.approx(1, abs=1e-12)
    assert abs(geometry["tied vs untied input at init"]["identity"]) < 0.1  # independent draws
    assert "Δtied vs Δuntied output since init" in geometry
    shares = out["gradient_share"]
    assert [(s["run"], s["step"]) for s in shares] == [("tied", 0), ("tied", 10), ("untied", 0), ("untied", 10)]
    assert all(0 < s["share_norm"] < 1 for s in shares)
    assert "share of the embedding gradient" in capsys.readouterr().out


def test_cli_errors_are_one_sentence(runs, tmp_path):
    with pytest.raises(SystemExit, match="no config.json"):
        cli("verify", "--run", tmp_path)
    with pytest.raises(SystemExit, match="--tied must name a run trained with --tie"):
        cli("tying", "--tied", runs["untied"], "--untied", runs["tied"])
    with pytest.raises(SystemExit, match="lower --tokens"):
        cli("verify", "--run", runs["untied"], "--tokens", 10**6)
    with pytest.raises(SystemExit):
        cli("signatures", "--run", runs["untied"], "--offsets", 0)


def test_cli_on_snapshots_written_by_train_py(markov_dir, tmp_path):
    import train
    run = tmp_path / "run"
    train.main(["--size", "tiny", "--vocab_size", "256", "--data", str(markov_dir), "--steps", "2",
                "--warmup", "1", "--batch_size", "2", "--micro_batch", "2", "--seq_len", "64",
                "--eval_tokens", "128", "--stat_tokens", "128", "--keep_every", "1",
                "--out_dir", str(run), "--device", "cpu", "--log_every", "1"])
    out = cli("bottleneck", "--run", run, "--tokens", 256)
    assert [r["step"] for r in out["steps"]] == [0, 1, 2]
    assert all(0 < r["pooled_energy"] <= r["rank2D_energy"] <= 1 for r in out["steps"])
    assert all(r["retained_energy"] < 1 and r["rank"] == 64 for r in out["steps"])
    verify = cli("verify", "--run", run, "--tokens", 128)
    assert verify["step"] == 2 and verify["lemma1_dev"] < 1e-12 * verify["max_abs_logit"]


def test_cli_trivial_trains_one_vocabulary_end_to_end(tmp_path):
    # data already there (as after an interrupted sweep) is reused: only train.py runs
    data.prepare_synthetic("repeat", 8, 2000, tmp_path / "repeat_V8_T16_N2000", seq_len=16)
    out = cli("trivial", "--out", tmp_path, "--vocabs", 8, "--steps", 1, "--seqs_per_token", 1,
              "--batch_size", 2, "--seq_len", 16, "--trivial_tokens", 2000,
              "--plot", tmp_path / "t.png", "--train_args", "--lr", "1e-3")
    row, = out["runs"]
    assert row["vocab"] == 8 and row["steps"] == 4  # max(--steps, ⌈1·8/2⌉)
    assert row["seqs_per_token"] == 1 and row["chance"] == pytest.approx(math.log(8))
    assert row["floor"] == pytest.approx(math.log(8) / 16)
    assert math.isfinite(row["val_loss"]) and not row["diverged"]
    config = json.loads((tmp_path / "tiny_baseline_tie0_V8_steps4" / "config.json").read_text())
    assert config["vocab_size"] == 8 and config["lr"] == 1e-3  # --train_args reach train.py
    assert (tmp_path / "t.png").stat().st_size > 1000

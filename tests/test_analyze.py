"""analyze.py: known answers of the bottleneck, the paper's identities and Theorem 4's bounds in
float64, and each command on a run folder in train.py's format (conftest.py's `runs`: a tiny
model on a synthetic Markov language of 64 tokens)."""
import json
import math

import pytest
import torch

import analyze
import heads
import model

VOCAB = 64  # the vocabulary of conftest.py's markov_dir and runs


def gaussian(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def cli(*argv):
    return analyze.main([str(a) for a in argv])


def one_sentence(excinfo):
    message = str(excinfo.value)
    assert "\n" not in message and "Traceback" not in message
    return message


# ───────────────────────────── gradient bottleneck: known answers ─────────────────────────────

def test_isotropic_weight_retains_d_over_v_of_a_random_gradient():
    """For a fixed D-dim subspace and isotropic g, ‖Pg‖²/‖g‖² ~ Beta(D/2, (V−D)/2): mean D/V."""
    V, D, N = 2000, 40, 400
    out = analyze.bottleneck(gaussian(N, V, seed=1), gaussian(V, D, seed=2))
    p = D / V
    beta_std = math.sqrt(2 * p * (1 - p) / (V + 2))  # std of one Beta(D/2, (V−D)/2) draw
    assert out["rank"] == D and out["isotropic_energy"] == p
    assert abs(out["retained_energy"] - p) < 5 * beta_std / math.sqrt(N)
    assert abs(out["retained_norm"] - math.sqrt(p)) < 0.01


def test_retained_norm_is_the_best_cosine_reachable_through_h():
    """‖Pg‖/‖g‖ equals cos(g, W a*) with a* the least-squares fit of g by W's columns."""
    V, D, N = 300, 12, 20
    G, W = gaussian(N, V, seed=3), gaussian(V, D, seed=4) + 2.0  # anisotropic: a common shift
    fits = W @ torch.linalg.lstsq(W, G.T).solution  # V×N, column t = best W·a for gₜ
    cosines = torch.nn.functional.cosine_similarity(fits.T, G, dim=1)
    retained = analyze.bottleneck(G, W)["retained_norm"]
    assert retained == pytest.approx(cosines.mean().item(), rel=1e-10)


def test_batch_bounds_match_an_explicit_svd_and_an_explicit_sgd_step():
    N, V, D = 120, 300, 10
    G, W, H = gaussian(N, V, seed=5), gaussian(V, D, seed=6), gaussian(N, D, seed=7)
    out = analyze.bottleneck(G, W, H)
    sigma_sq = torch.linalg.svdvals(G) ** 2
    rank2D = (sigma_sq[:2 * D].sum() / sigma_sq.sum()).item()
    assert out["rank2D_energy"] == pytest.approx(rank2D, rel=1e-10)
    assert out["rankD_energy"] == pytest.approx((sigma_sq[:D].sum() / sigma_sq.sum()).item(),
                                                rel=1e-10)
    M = G @ W @ W.T + H @ H.T @ G  # −ΔZ of a gradient step on free H and W (up to the step size)
    cosine = (M * G).sum() / (M.norm() * G.norm())
    assert out["sgd_cosine"] == pytest.approx(cosine.item(), rel=1e-10)
    assert out["rankD_energy"] < out["rank2D_energy"] < 1
    assert out["pooled_energy"] <= out["rankD_energy"] + 1e-12  # Eckart–Young: best rank-D


@pytest.mark.parametrize("N, trivial", [(15, ["rankD_energy", "rank2D_energy", "rank2D_cosine"]),
                                        (30, ["rank2D_energy", "rank2D_cosine"]),
                                        (41, [])])
def test_which_batch_figures_are_trivially_one(N, trivial):
    """rank G ≤ N: the rank-2D energy is 1 when N ≤ 2D, the rank-D energy only when N ≤ D, and
    the pooled energy never (here D = 20, V = 200)."""
    D = 20
    out = analyze.bottleneck(gaussian(N, 200, seed=8), gaussian(200, D, seed=9))
    assert analyze.trivially_one(N, 200, D) == trivial
    for name in ("rankD_energy", "rank2D_energy", "rank2D_cosine"):
        assert (out[name] == pytest.approx(1.0, abs=1e-12)) == (name in trivial), name
    assert out["pooled_energy"] < 0.5


def test_loss_gradients_are_softmax_minus_onehot_and_pass_through_the_cap():
    """d/dl c·tanh(l/c) = 1 − tanh²(l/c): G = (softmax(capped) − onehot)·(1 − (capped/c)²)."""
    logits, targets = gaussian(5, 7, seed=10) * 4, torch.tensor([0, 6, 3, 3, 1])
    onehot = torch.nn.functional.one_hot(targets, 7)
    G = analyze.loss_gradients(logits, targets)
    torch.testing.assert_close(G, logits.softmax(1) - onehot, rtol=0, atol=1e-15)
    head = heads.build("soft_cap", cap=2.0)
    capped = head.cap_logits(logits)
    expected = (capped.softmax(1) - onehot) * (1 - (capped / 2) ** 2)
    torch.testing.assert_close(analyze.loss_gradients(logits, targets, head.cap_logits),
                               expected, rtol=0, atol=1e-15)


# ───────────────────────────── the paper's identities and Theorem 4's bounds ──────────────────

E1 = torch.tensor([[-1.0, 0.0], [0.0, -1.0], [0.0, 1.0]], dtype=torch.float64)  # μ = (−1/3, 0)


def anisotropic(V, D, seed):
    """Rows with per-axis scales and a common shift, like trained output embeddings."""
    scales = 2 * torch.rand(D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return gaussian(V, D, seed=seed) * scales + 3 * gaussian(D, seed=seed + 1)


@pytest.mark.parametrize("V, D, seed", [(3, 2, 0), (100, 16, 2), (500, 32, 3)])
def test_b_ratio_is_eq_26_and_theorem_4_holds_along_mu(V, D, seed):
    """Eq. 13 with the tight bounds = Eq. 26 = max|e*·μ| / max|e·μ|: so at h = μ, B_ratio ≤ 1
    exactly when max|l*| ≤ max|l|."""
    e = anisotropic(V, D, seed)
    mu = e.mean(0)
    along_mu, along_mu_star = (e @ mu).abs().max(), ((e - mu) @ mu).abs().max()
    assert analyze.b_ratio(e) == pytest.approx((along_mu_star / along_mu).item(), rel=1e-12)
    assert (analyze.b_ratio(e) <= 1) == (along_mu_star <= along_mu)


def test_b_bounds_are_the_tight_bounds_of_eq_12():
    out = analyze.b_bounds(E1)  # e·μ = (1/3, 0, 0), ‖μ‖² = 1/9
    assert [out[k] for k in ("B_minus", "B_plus", "mu_sq", "B_ratio")] == pytest.approx(
        [1 / 9, 2 / 9, 1 / 9, 2 / 3], rel=1e-14)
    assert out["mu_norm"] == pytest.approx(1 / 3)
    e = anisotropic(100, 16, 2)
    out, dots = analyze.b_bounds(e), e @ e.mean(0)
    assert dots.min().item() == pytest.approx(out["mu_sq"] - out["B_minus"])
    assert dots.max().item() == pytest.approx(out["mu_sq"] + out["B_plus"])
    assert analyze.b_ratio(E1 - E1.mean(0)) == 1.0  # μ = 0: 0/0, taken as 1
    assert analyze.b_ratio(torch.nn.Parameter(E1.float())) == pytest.approx(2 / 3, rel=1e-7)


def test_verify_identities_hold_to_float64_precision_with_the_projects_centering():
    W, H = anisotropic(VOCAB, 16, 15), gaussian(300, 16, seed=17) * 3
    targets = torch.randint(VOCAB, (300,), generator=torch.Generator().manual_seed(0))
    W_star = W.clone()
    heads.build("mu_center").after_step(W_star)
    out = analyze.verify_identities(H, W, W_star, targets, chunk=64)
    assert out["mu_norm"] > 1  # not vacuous: the mean logit before is far from 0
    for name in ("centering_dev", "lemma1_dev", "prop3_mean", "prop3_std_dev", "prop3_prob_dev",
                 "prop3_loss_dev", "eq26_dev"):
        assert out[name] < 1e-12 * out["max_abs_logit"], name
    assert 0 < out["lemma2_ratio"] <= 1
    assert out["B_ratio"] == analyze.b_ratio(W)


def test_verify_identities_show_where_theorem_4_fails():
    """E₁: B_ratio = 2/3 ≤ 1, yet max‖e*‖ = √10/3 > 1 = max‖e‖, and h = (1, −3) gets
    max|l*| = 10/3 > 3 = max|l|."""
    h = torch.tensor([[1.0, -3.0]], dtype=torch.float64)
    out = analyze.verify_identities(h, E1, E1 - E1.mean(0), torch.tensor([0]))
    assert out["B_ratio"] == pytest.approx(2 / 3)
    assert out["eq34_ratio"] == pytest.approx(math.sqrt(10) / 3)
    assert out["eq35_ratio"] == pytest.approx(10 / 9) and out["eq35_token_fails"] == 1


# ───────────────────────────── the commands on a run folder ─────────────────────────────

def test_verify_prints_each_statement_in_words_and_writes_its_json(runs, tmp_path, capsys):
    out = cli("verify", "--run", runs["untied"], "--tokens", 256, "--json", tmp_path / "v.json")
    assert json.loads((tmp_path / "v.json").read_text()) == out
    assert out["step"] == 10 and out["tokens"] == 256 and out["mu_norm"] > 0.4
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("Eq. 12–13: ‖μ‖² = ") and lines[2].split() == [
        "statement", "measured", "holds"]
    for key, statement, kind in analyze.CLAIMS:
        row, = [line for line in lines if line.startswith(statement + " ")]
        measured, holds = row[len(statement):].split()
        assert float(measured) == pytest.approx(out[key], rel=1e-3)
        if key.endswith("_dev") or key in ("prop3_mean", "lemma2_ratio"):  # the identities hold
            assert holds == "yes", row
    assert lines[-2].startswith("measured: an identity's largest error")


def test_logits_after_mu_center_have_mean_0_and_the_plot_goes_to_the_run(runs, tmp_path):
    before = cli("logits", "--run", runs["untied"], "--tokens", 256)
    gpt, cfg, step = model.load_model(runs["untied"] / "ckpt.pt", "cpu")
    heads.build("mu_center").after_step(gpt.output_weight)
    centred = tmp_path / "centred"
    centred.mkdir()
    (centred / "config.json").write_text(json.dumps(cfg))
    torch.save(dict(model=gpt.state_dict(), step=step, config=cfg), centred / "ckpt.pt")
    after = cli("logits", "--run", centred, "--tokens", 256, "--plot")
    assert (centred / "logits.png").stat().st_size > 1000
    assert abs(before["logit_mean"]) > 0.1 and before["mu_norm"] > 0.4
    # Lemma 1 over the tokens: l̄ = μ·h̄ = ‖μ‖·(h̄·μ̂); the cosine is that over ‖h̄‖
    assert before["h_mu_proj"] * before["mu_norm"] == pytest.approx(before["logit_mean"], rel=1e-6)
    assert 0 < abs(before["h_mu_cos"]) <= 1
    assert abs(after["logit_mean"]) < 1e-6 and after["mu_norm"] < 1e-6  # float32 weights
    assert after["logit_std"] == pytest.approx(before["logit_std"], rel=1e-5)
    cli("logits", "--run", centred, "--tokens", 64, "--plot", tmp_path / "figs" / "hist.svg")
    assert (tmp_path / "figs" / "hist.svg").stat().st_size > 1000


def test_every_printed_figure_says_in_words_what_it_is(runs, capsys):
    """logits: a meaning column beside each key; offsets and bottleneck: a legend under the
    table; the JSON keeps the bare keys."""
    logits = cli("logits", "--run", runs["untied"], "--tokens", 64, "--offsets", 0, 100)
    bottleneck = cli("bottleneck", "--run", runs["untied"], "--tokens", 64)
    lines = capsys.readouterr().out.splitlines()
    shown = [*heads.LOGIT_STATS, "mu_norm", "h_mu_proj", "B_ratio", *heads.PRECISION_STATS]
    for key in shown:
        row, = [line for line in lines if line.startswith(key + " ")]
        assert row.endswith(analyze.MEANING[key]) and key in logits
    for key in ("offset", "spacing_over_sigma", "retained_norm", "rank2D_energy", "sgd_cosine"):
        assert f"  {key}: {analyze.MEANING[key]}" in lines
    assert "sgd_cosine" in bottleneck["steps"][0] and "offset" in logits["offsets"][0]


def test_logits_report_what_the_matmul_dtype_loses_at_each_offset(runs):
    """float32 loses nothing measurable at any offset; bf16 (8 significant bits) loses more the
    further the mean logit sits from 0, though shifting every row by one vector changes no
    prediction."""
    offsets = ("--offsets", 0, 30, 300, 3000)
    f32 = cli("logits", "--run", runs["untied"], "--tokens", 128, *offsets)
    bf16 = cli("logits", "--run", runs["untied"], "--tokens", 128, "--dtype", "bfloat16",
               *offsets)
    assert f32["prec_err_cast"] == 0 and f32["prec_err_round"] < 1e-6
    assert abs(f32["prec_ce_gap"]) < 1e-6
    assert all(abs(row["prec_ce_gap"]) < 1e-4 for row in f32["offsets"])
    assert bf16["prec_err_cast"] > 1e-3 and bf16["prec_err_round"] > 1e-3
    assert [row["offset"] for row in bf16["offsets"]] == [0, 30, 300, 3000]
    rounding = [row["prec_err_round"] for row in bf16["offsets"]]
    assert rounding == sorted(rounding) and rounding[-1] > 30 * rounding[0]
    assert bf16["offsets"][-1]["prec_ce_gap"] > 0.1  # at 3000 the spacing (16) dwarfs σ_l


def test_bf16_spacing_is_a_unit_in_the_last_of_eight_significant_bits():
    assert [analyze.bf16_spacing(x) for x in (10, 128, 1152, -1152, 0)] == [0.0625, 1, 8, 8, 0]
    for x in (10.0, 300.0, 1152.0):  # the next bf16 number above x is x + spacing
        above = torch.nextafter(torch.tensor(x).bfloat16(), torch.tensor(1e9).bfloat16())
        assert above.item() - x == analyze.bf16_spacing(x)


def test_a_fresh_model_gives_sane_numbers(tmp_path):
    V = 512
    logits = cli("logits", "--init", "tiny", "--vocab_size", V, "--tokens", 256, "--seq_len", 64)
    # near-Gaussian logits at init: log Z ≈ ln V + σ²/2 (E exp(l) = exp(σ²/2) for l ~ N(0, σ²))
    log_z = math.log(V) + logits["logit_std"] ** 2 / 2
    assert math.sqrt(logits["log2Z"]) == pytest.approx(log_z, abs=0.05)
    assert abs(logits["logit_mean"]) < 0.05 and 0 < logits["B_ratio"]
    out = cli("bottleneck", "--init", "tiny", "--vocab_size", V, "--seq_len", 64,
              "--json", tmp_path / "b.json")
    row, = out["steps"]
    D = model.SIZES["tiny"]["n_embd"]
    assert out["tokens"] == row["tokens"] == 4 * D and out["trivially_one"] == []  # the default
    assert row["isotropic_energy"] == D / V
    assert 0.5 * D / V < row["retained_energy"] < 2 * D / V  # an untrained head is near-isotropic
    assert row["retained_energy"] <= row["retained_norm"] < 1  # ‖Pg‖/‖g‖ ≤ 1: its square less
    assert row["rank2D_energy"] < 0.99
    assert json.loads((tmp_path / "b.json").read_text()) == out


def test_bottleneck_follows_the_checkpoints_and_says_what_is_trivial(runs, capsys):
    out = cli("bottleneck", "--run", runs["untied"], "--tokens", 64, "--plot")
    assert [r["step"] for r in out["steps"]] == [0, 10]
    assert out["trivially_one"] == ["rankD_energy", "rank2D_energy", "rank2D_cosine"]
    assert "trivially 1 as min(N, V) ≤ D" in capsys.readouterr().out
    assert (runs["untied"] / "bottleneck.png").stat().st_size > 1000


def test_curves_of_one_checkpoint_are_bars_not_a_dot_on_a_step_axis(monkeypatch):
    drawn = []
    monkeypatch.setattr(analyze, "save_figure", lambda fig, path: drawn.append(fig))
    for steps in ([200], [0, 100, 200]):
        rows = [{"step": step, "share_a": 0.2, "share_b": 0.7} for step in steps]
        analyze.plot_curves(rows, ("share_a", "share_b"), "share", "unused.png")
    (bars,), (curves,) = drawn[0].axes, drawn[1].axes
    assert [bar.get_width() for bar in bars.patches] == [0.2, 0.7] and not bars.get_lines()
    assert bars.get_title().startswith("one checkpoint, step 200")
    assert len(curves.get_lines()) == 2 and curves.get_xlabel() == "training step"


def test_the_commands_on_snapshots_written_by_train_py(markov_dir, tmp_path):
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


# ───────────────────────────── mistakes: one sentence each ─────────────────────────────

def test_a_folder_that_is_no_run_or_holds_too_few_tokens_is_named(runs, tmp_path):
    with pytest.raises(SystemExit, match="holds no checkpoint .*; pass the --out_dir") as excinfo:
        cli("verify", "--run", tmp_path)
    one_sentence(excinfo)
    with pytest.raises(SystemExit, match="lower --tokens") as excinfo:
        cli("verify", "--run", runs["untied"], "--tokens", 10**6)
    one_sentence(excinfo)


@pytest.mark.parametrize("argv, message", [
    (["verify", "--init", "tiny", "--plot", "v.png"], "verify draws no figure; drop --plot"),
    (["logits", "--init", "tiny", "--tok", "64"], "unrecognized arguments: --tok 64"),
])
def test_options_that_would_do_nothing_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        cli(*argv)
    assert message in capsys.readouterr().err


def test_a_plot_without_a_file_needs_a_run_folder(tmp_path):
    with pytest.raises(SystemExit, match="--plot needs a FILE with --init"):
        cli("logits", "--init", "tiny", "--vocab_size", 128, "--tokens", 64, "--plot")

"""analyze.py and theorem4.py: known answers for every measurement, Theorem 4's audit in exact
arithmetic, and the CLI on run folders in train.py's checkpoint format (config.json, ckpt.pt,
ckpt_step*.pt) of tiny models on a synthetic Markov language of 64 tokens."""
import errno
import itertools
import json
import math
import os
import pickle
from fractions import Fraction

import pytest
import torch

import analyze
import prepare
import heads
import measure
import model
import theorem4

VOCAB = 64  # the synthetic runs' vocabulary


def gaussian(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ───────────────────────────── gradient bottleneck: known answers ─────────────────────────────

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


@pytest.mark.parametrize("N, trivial", [(15, ["rankD_energy", "rank2D_energy", "rank2D_cosine"]),
                                        (20, ["rankD_energy", "rank2D_energy", "rank2D_cosine"]),
                                        (30, ["rank2D_energy", "rank2D_cosine"]),
                                        (40, ["rank2D_energy", "rank2D_cosine"]),
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


def test_loss_gradients_are_softmax_minus_onehot():
    logits = gaussian(5, 7, seed=10).requires_grad_()
    targets = torch.tensor([0, 6, 3, 3, 1])
    torch.nn.functional.cross_entropy(logits, targets, reduction="sum").backward()
    G = analyze.loss_gradients(logits.detach(), targets)
    torch.testing.assert_close(G, logits.grad, rtol=0, atol=1e-15)


def test_loss_gradients_pass_through_the_soft_cap_by_its_derivative():
    """d/dl c·tanh(l/c) = 1 − tanh²(l/c): G = (softmax(capped) − onehot)·(1 − (capped/c)²)."""
    logits, targets = gaussian(5, 7, seed=11) * 4, torch.tensor([0, 6, 3, 3, 1])
    head = heads.build("soft_cap", cap=2.0)
    capped = head.cap_logits(logits)
    expected = (capped.softmax(1) - torch.nn.functional.one_hot(targets, 7)) * (1 - (capped / 2) ** 2)
    torch.testing.assert_close(analyze.loss_gradients(logits, targets, head.cap_logits), expected,
                               rtol=0, atol=1e-15)


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
    assert out["B_ratio"] == pytest.approx(measure.b_ratio(W), abs=0)


def test_verify_reports_the_failing_step_of_theorem_4():
    """E₁ = [[−1,0],[0,−1],[0,1]]: B_ratio = 2/3 ≤ 1, yet Eq. 32 and Eq. 34 fail, and
    h = (1, −3) gets a larger max |l*| than max |l| (10/3 > 3)."""
    W = torch.tensor(theorem4.E1, dtype=torch.float64)
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
    out = dict(zip(heads.LOGIT_STATS, heads.logit_stats(logits).sum(1).tolist()))
    assert out["logit_mean"] == pytest.approx(2.0 + -2.0)
    assert out["logit_std"] == pytest.approx(math.sqrt(2 / 3) + math.sqrt(8))
    assert out["logit_absmax"] == pytest.approx(3 + 6)
    lse = [math.log(math.e + math.e ** 2 + math.e ** 3), math.log(2 + math.exp(-6))]
    assert out["log2Z"] == pytest.approx(lse[0] ** 2 + lse[1] ** 2)


# ───────────────────────────── Theorem 4's audit (theorem4.py) ─────────────────────────────

def audit_row(step, example):
    row, = [r for r in theorem4.theorem4_audit()
            if r["step"] == step and r["example"].startswith(example)]
    return Fraction(row["lhs"]), Fraction(row["rhs"]), row["holds"]


@pytest.mark.parametrize("step, example, lhs, rhs, holds", [
    ("Eq. 26", "E₁", "2/3", "2/3", True),
    ("Eq. 13, loose B₋", "E₁", "9/8", "2/3", False),
    ("Eq. 32", "E₀", "5/9", "13/18", False),
    ("Eq. 32", "E₁", "10/9", "13/9", False),
    ("Eq. 33, parallel parts", "E₁", "-5/9", "0", True),
    ("Eq. 33 as printed", "E₁", "1/3", "0", False),
    ("Eq. 34", "E₁", "10/9", "1", False),
    ("Eq. 34 → 35", "E₂", "4/3", "1", False),
    ("Eq. 14 ⇒", "E₂", "4/3", "1", False),
    ("Eq. 14 ⇐", "E₃", "4/3", "1", False),
    ("⇐ by reversing", "E₃", "4/3", "1", False),
    ("(i) at h = μ", "E₃", "4/9", "1/3", True),
])
def test_audit_checks_each_step_as_its_text_states(step, example, lhs, rhs, holds):
    assert audit_row(step, example) == (Fraction(lhs), Fraction(rhs), holds)


def test_audit_premises_and_the_strict_backward_counterexample():
    """The premises the audit's examples rely on, recomputed in float64 without theorem4.py."""
    def terms(E, h):
        e = torch.tensor(E, dtype=torch.float64)
        e_star, h = e - e.mean(0), torch.tensor(h, dtype=torch.float64)
        return (measure.b_ratio(e), (e_star ** 2).sum(1).max().item(), (e ** 2).sum(1).max().item(),
                (e_star @ h).abs().max().item(), (e @ h).abs().max().item())
    b2, norm2_star, norm2, l2_star, l2 = terms(theorem4.E2, theorem4.H2)
    assert b2 == pytest.approx(1 / 3) and norm2_star == pytest.approx(8 / 9) and norm2 == 1
    assert l2_star == pytest.approx(4 / 3) and l2 == 1
    b3, norm3_star, norm3, l3_star, l3 = terms(theorem4.E3, theorem4.H3)
    assert b3 == pytest.approx(4 / 3) and norm3_star == pytest.approx(16 / 9) and norm3 == 2
    assert l3_star == pytest.approx(5 / 3) and l3 == 2  # strictly smaller: not only h ⊥ μ


def size(E):
    return sum(abs(x) for row in E for x in row)


def test_exhaustive_search_finds_no_counterexample_smaller_than_the_audits():
    """On entries in {−1, 0, 1} (the full default range is ±2; same answers, see the CLI)."""
    found = {r["step"]: r for r in theorem4.exhaustive_search(entries=1, h_entries=1)}
    assert found["Eq. 32"]["W"] == [list(r) for r in theorem4.E0] and found["Eq. 32"]["size"] == 2
    assert found["Eq. 34"]["W"] == [list(r) for r in theorem4.E1]
    for step in ("Eq. 34 → 35", "Eq. 14 ⇒"):
        assert found[step]["W"] == [list(r) for r in theorem4.E2]
        assert found[step]["h"] == list(theorem4.H2)
    assert found["⇐ by reversing"]["W"] == [list(r) for r in theorem4.E3]
    assert found["Eq. 14 ⇐"]["size"] == size(theorem4.E3)  # a tie with E₃: none is smaller
    assert all(r["matrices"] > 0 for r in found.values())


def test_b_ratio_scan_breaks_theorem_4_more_often_near_b_ratio_1():
    scan = theorem4.b_ratio_scan(n_matrices=30, n_hidden=200, shape=(200, 16), seed=1)
    bins = theorem4.binned(scan)
    assert sum(b["matrices"] for b in bins) == 30
    low = [r["larger_share"] for r in scan if r["B_ratio"] < 0.3]
    high = [r["larger_share"] for r in scan if 0.6 < r["B_ratio"] <= 1]
    assert low and high and max(high) > 0  # B_ratio ≤ 1, and yet a larger max |l*|
    assert sum(high) / len(high) > sum(low) / len(low)


# ───────────────────────────── CLI on run folders and fresh models ─────────────────────────────

def tiny_model(tie, head="baseline", seed=0):
    torch.manual_seed(seed)
    return model.from_config(dict(size="tiny", head=head, tie=tie, vocab_size=VOCAB, seq_len=32))


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
def markov_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("markov")
    prepare.prepare_synthetic("markov", VOCAB, 120_000, out, seed=0, seq_len=64)
    return out


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
    assert [r["step"] for r in out["theorem4_audit"]][:3] == ["Eq. 26", "Eq. 13, loose B₋", "Eq. 32"]
    printed = capsys.readouterr().out
    assert "Prop. 3 (ii): std(l*) = std(l)" in printed and "B_ratio" in printed
    assert "Eq. 33 as printed" in printed


def test_cli_verify_without_a_model_audits_searches_and_scans(capsys):
    out = cli("verify", "--exhaustive", "--entries", 1, "--h_entries", 1, "--b_ratio_scan", 4)
    assert "step" not in out and len(out["theorem4_audit"]) == 12
    assert [r["size"] for r in out["exhaustive"]] == [2, 3, 3, 3, 5, 5]
    assert sum(b["matrices"] for b in out["b_ratio_scan"]) == 4
    seeded = cli("verify", "--b_ratio_scan", 4, "--seed", 1)["b_ratio_scan"]
    assert seeded == theorem4.binned(theorem4.b_ratio_scan(4, seed=1)) != out["b_ratio_scan"]
    printed = capsys.readouterr().out
    assert "exhaustive search: 5,440 (W, h) pairs …\nexhaustive search: V = 3, D = 2" in printed
    assert "larger_share" in printed


def test_search_pairs_counts_what_the_search_enumerates():
    for entries, h_entries in ((1, 1), (1, 2), (2, 1)):
        values = range(-entries, entries + 1)
        W = torch.tensor(list(itertools.product(values, repeat=6))).reshape(-1, 3, 2)
        states = (2 * h_entries + 1) ** 2 - 1
        assert theorem4.search_pairs(entries, h_entries) == W.sum(1).any(1).sum() * states


@pytest.mark.parametrize("entries, h_entries, advice", [(50, 3, "give --entries 4 or less."),
                                                      (2, 1000, "give a smaller --h_entries.")])
def test_an_exhaustive_search_too_large_is_refused_before_anything_runs(entries, h_entries,
                                                                         advice, capsys):
    """--entries 50 printed the audit, then ran past 60 s in silence (5.1·10¹³ pairs)."""
    with pytest.raises(SystemExit) as excinfo:
        cli("verify", "--exhaustive", "--entries", entries, "--h_entries", h_entries)
    assert one_sentence(excinfo) == (
        f"analyze.py verify: error: --exhaustive with --entries {entries} and --h_entries "
        f"{h_entries} would compare {theorem4.search_pairs(entries, h_entries):,} (W, h) pairs, "
        f"more than the 30,000,000 it may; {advice}")
    assert theorem4.search_pairs(4, 3) <= theorem4.SEARCH_MAX_PAIRS < theorem4.search_pairs(5, 3)
    assert capsys.readouterr().out == ""


def test_cli_logits_after_mu_center_has_zero_mean_logit(runs, tmp_path):
    before = cli("logits", "--run", runs["untied"], "--tokens", 256)
    gpt, cfg, step = model.load_model(runs["untied"] / "ckpt.pt", "cpu")
    heads.build("mu_center").after_step(gpt.output_weight)
    centred_run = tmp_path / "centred"
    centred_run.mkdir()
    (centred_run / "config.json").write_text(json.dumps(cfg))
    torch.save(dict(model=gpt.state_dict(), step=step, config=cfg), centred_run / "ckpt.pt")
    after = cli("logits", "--run", centred_run, "--tokens", 256, "--plot", tmp_path / "hist.png")
    assert abs(before["logit_mean"]) > 0.1 and before["mu_norm"] > 0.4
    # Lemma 1 over the tokens: l̄ = μ·h̄ = ‖μ‖·(h̄·μ̂); the cosine is that over ‖h̄‖
    assert before["h_mu_proj"] * before["mu_norm"] == pytest.approx(before["logit_mean"], rel=1e-6)
    assert 0 < abs(before["h_mu_cos"]) <= 1
    assert abs(after["logit_mean"]) < 1e-6 and after["mu_norm"] < 1e-6  # float32 weights
    assert after["logit_std"] == pytest.approx(before["logit_std"], rel=1e-5)
    assert (tmp_path / "hist.png").stat().st_size > 1000


def test_every_printed_figure_says_in_words_what_it_is(runs, capsys):
    """logits: a meaning column beside each key; offsets and bottleneck: a legend under the
    table; the JSON keeps the bare keys."""
    logits = cli("logits", "--run", runs["untied"], "--tokens", 64, "--offsets", 0, 100)
    bottleneck = cli("bottleneck", "--run", runs["untied"], "--tokens", 64)
    lines = capsys.readouterr().out.splitlines()
    assert "mean logit l̄ = (1/V)·Σᵢ lᵢ (Eq. 8)" in analyze.MEANING["logit_mean"]
    shown = [*heads.LOGIT_STATS, "mu_norm", "h_mu_proj", "B_ratio", *heads.PRECISION_STATS]
    for key in shown:
        row, = [line for line in lines if line.startswith(key + " ")]
        assert row.endswith(analyze.MEANING[key]) and key in logits
    for key in ("offset", "spacing_over_sigma", "retained_norm", "rank2D_energy", "sgd_cosine"):
        assert f"  {key}: {analyze.MEANING[key]}" in lines
    assert "sgd_cosine" in bottleneck["steps"][0] and "offset" in logits["offsets"][0]


def test_cli_logits_reports_what_the_matmul_dtype_loses(runs):
    """float32: rounding at float32's 2⁻²⁴ only; bfloat16 (8 significant bits): far more."""
    f32 = cli("logits", "--run", runs["untied"], "--tokens", 128)
    bf16 = cli("logits", "--run", runs["untied"], "--tokens", 128, "--dtype", "bfloat16")
    assert f32["dtype"] == "float32" and bf16["dtype"] == "bfloat16"
    assert f32["prec_err_cast"] == 0 and f32["prec_err_round"] < 1e-6
    assert abs(f32["prec_ce_gap"]) < 1e-6
    assert bf16["prec_err_cast"] > 1e-3 and bf16["prec_err_round"] > 1e-3
    assert bf16["prec_ce_gap"] != 0


def test_bf16_spacing_is_a_unit_in_the_last_of_eight_significant_bits():
    assert [analyze.bf16_spacing(x) for x in (10, 128, 1152, -1152, 0)] == [0.0625, 1, 8, 8, 0]
    for x in (10.0, 300.0, 1152.0):  # the next bf16 number above x is x + spacing
        above = torch.nextafter(torch.tensor(x).bfloat16(), torch.tensor(1e9).bfloat16())
        assert above.item() - x == analyze.bf16_spacing(x)


def test_a_common_shift_of_the_rows_costs_only_through_rounding(runs):
    """Shifting every row by one vector changes no prediction (float32 loses nothing at any
    offset), but bf16 loses more the further the mean logit sits from 0."""
    offsets = ("--offsets", 0, 30, 300, 3000)
    f32 = cli("logits", "--run", runs["untied"], "--tokens", 128, *offsets)["offsets"]
    bf16 = cli("logits", "--run", runs["untied"], "--tokens", 128, "--dtype", "bfloat16",
               *offsets)["offsets"]
    assert [row["offset"] for row in bf16] == [0, 30, 300, 3000]
    assert all(abs(row["prec_ce_gap"]) < 1e-4 for row in f32)
    rounding = [row["prec_err_round"] for row in bf16]
    assert rounding == sorted(rounding) and rounding[-1] > 30 * rounding[0]
    assert bf16[-1]["prec_ce_gap"] > 0.1  # at 3000 the spacing (16) dwarfs the logits' spread


def test_cli_on_a_fresh_model_gives_sane_numbers(tmp_path):
    V = 512
    logits = cli("logits", "--init", "tiny", "--vocab_size", V, "--tokens", 256, "--seq_len", 64)
    # near-Gaussian logits at init: log Z ≈ ln V + σ²/2 (E exp(l) = exp(σ²/2) for l ~ N(0, σ²))
    assert math.sqrt(logits["log2Z"]) == pytest.approx(math.log(V) + logits["logit_std"] ** 2 / 2, abs=0.05)
    assert abs(logits["logit_mean"]) < 0.05 and 0 < logits["B_ratio"]
    out = cli("bottleneck", "--init", "tiny", "--vocab_size", V, "--seq_len", 64,
              "--json", tmp_path / "b.json")
    row, = out["steps"]
    D = model.SIZES["tiny"]["n_embd"]
    assert out["tokens"] == row["tokens"] == 4 * D and out["trivially_one"] == []  # the default
    assert row["isotropic_energy"] == D / V
    assert 0.5 * D / V < row["retained_energy"] < 2 * D / V  # an untrained head is near-isotropic
    assert row["suppressed_norm"] == pytest.approx(1 - row["retained_norm"])
    assert row["rank2D_energy"] < 0.99
    assert json.loads((tmp_path / "b.json").read_text()) == out


def test_cli_bottleneck_follows_the_checkpoints_and_says_what_is_trivial(runs, tmp_path, capsys):
    out = cli("bottleneck", "--run", runs["untied"], "--tokens", 64, "--plot", tmp_path / "b.png")
    assert [r["step"] for r in out["steps"]] == [0, 10]
    assert out["trivially_one"] == ["rankD_energy", "rank2D_energy", "rank2D_cosine"]
    assert "trivially 1 as N ≤ D" in capsys.readouterr().out
    assert (tmp_path / "b.png").is_file()


@pytest.mark.parametrize("steps", [[200], [0, 100, 200]])
def test_curves_of_one_checkpoint_are_bars_not_a_dot_on_a_step_axis(monkeypatch, steps):
    drawn = []
    monkeypatch.setattr(analyze, "save_figure", lambda fig, path: drawn.append(fig))
    rows = [{"step": step, "share_a": 0.2, "share_b": 0.7} for step in steps]
    analyze.plot_curves(rows, ("share_a", "share_b"), "share", "unused.png")
    ax, = drawn[0].axes
    if len(steps) == 1:
        assert [bar.get_width() for bar in ax.patches] == [0.2, 0.7] and not ax.get_lines()
        assert ax.get_title().startswith("one checkpoint, step 200")
    else:
        assert len(ax.get_lines()) == 2 and ax.get_xlabel() == "training step"


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


# ───────────────────────────── bad input: one sentence each ─────────────────────────────

def one_sentence(excinfo):
    message = str(excinfo.value)
    assert "\n" not in message and "Traceback" not in message and "weights_only" not in message
    return message


def test_cli_errors_are_one_sentence(runs, tmp_path):
    with pytest.raises(SystemExit, match="no config.json"):
        cli("verify", "--run", tmp_path)
    with pytest.raises(SystemExit, match="lower --tokens"):
        cli("verify", "--run", runs["untied"], "--tokens", 10**6)


def test_json_into_a_directory_or_onto_a_full_disk(runs, tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match="is a directory; give a file name") as excinfo:
        cli("verify", "--json", tmp_path)
    one_sentence(excinfo)

    def full_disk(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(SystemExit, match="the disk is full") as excinfo:
        cli("verify", "--json", tmp_path / "out" / "v.json")
    one_sentence(excinfo)
    assert list((tmp_path / "out").iterdir()) == []  # no temporary file left behind


class RunsCode:
    """Unpickling this runs a shell command that creates `marker`."""
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("crafted", [False, True], ids=["corrupt", "crafted"])
def test_corrupt_or_crafted_checkpoint(tmp_path, crafted):
    run, marker = tmp_path / "run", tmp_path / "code_ran"
    run.mkdir()
    (run / "config.json").write_text("{}")
    payload = pickle.dumps({"model": RunsCode(marker), "step": 1, "config": {}}, protocol=2)
    (run / "ckpt.pt").write_bytes(payload if crafted else b"not a checkpoint at all")
    with pytest.raises(SystemExit, match="cannot be read as a checkpoint") as excinfo:
        cli("logits", "--run", run)
    one_sentence(excinfo)
    assert not marker.exists()
    if crafted:
        pickle.loads(payload)  # what loading it without weights_only would have done
        assert marker.exists()


def test_checkpoint_without_config_or_with_weights_of_another_shape(runs, tmp_path):
    ckpt = torch.load(runs["untied"] / "ckpt.pt", weights_only=True)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    torch.save(dict(ckpt, config=None), run / "ckpt.pt")
    with pytest.raises(SystemExit, match="has no run settings") as excinfo:
        cli("verify", "--run", run)
    one_sentence(excinfo)
    torch.save(dict(ckpt, config=dict(ckpt["config"], vocab_size=2 * VOCAB)), run / "ckpt.pt")
    with pytest.raises(SystemExit, match="weights that do not fit .*size mismatch") as excinfo:
        cli("verify", "--run", run)
    one_sentence(excinfo)


@pytest.mark.parametrize("argv, message", [
    (["--offsets", "0", "1e300"], "--offsets: 1e300 is invalid; give a finite L with |L| ≤ 4096"),
    (["--offsets", "8192"], "--offsets: 8192 is invalid; give a finite L with |L| ≤ 4096"),
    (["--offsets", "inf"], "argument --offsets: inf is invalid"),
    (["--offsets", "nan"], "argument --offsets: nan is invalid"),
    (["--seed", "-1"], "argument --seed: -1 is invalid; give an integer from 0 to 2^64 − 1"),
    (["--seed", str(2 ** 64)], f"{2 ** 64} is invalid; give an integer from 0 to 2^64 − 1"),
    (["--device", "bogus"], "argument --device: bogus is invalid; give cpu, or cuda or cuda:N where"),
    (["--tokens", "1.5"], "argument --tokens: '1.5' is not a number; give an integer > 0"),
])
def test_bad_arguments_are_refused_before_any_table(argv, message, capsys):
    """1e300 printed a table of NaN, nan its whole table before the error, inf and a bogus
    device a traceback; --seed -1 ran; 2⁶⁴ said "Overflow when unpacking long long"."""
    with pytest.raises(SystemExit):
        cli("logits", "--init", "tiny", "--tokens", 64, *argv)
    printed = capsys.readouterr()
    assert message in printed.err and printed.out == ""


def test_verify_refuses_a_figure_it_would_not_draw(capsys):
    with pytest.raises(SystemExit):
        cli("verify", "--plot", "v.png")  # it was accepted, and no file was written
    assert "verify draws no figure; drop --plot" in capsys.readouterr().err


def test_a_dataset_or_checkpoint_at_fault_is_named_for_what_it_is(runs, markov_dir, tmp_path):
    """A folder that mixes datasets (or /dev/null) used to be reported as too few tokens for
    --tokens; a ckpt.pt that is a folder as a run without checkpoints."""
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for shard in markov_dir.iterdir():
        (mixed / shard.name).write_bytes(shard.read_bytes())
    (mixed / "markov_val_000001.bin").write_bytes((mixed / "markov_val_000000.bin").read_bytes())
    for data_dir, expected in ((mixed, "is not named in"),
                               ("/dev/null", "/dev/null is a file, not a folder of shards")):
        with pytest.raises(SystemExit) as excinfo:
            cli("logits", "--run", runs["untied"], "--data", data_dir, "--tokens", 64)
        message = one_sentence(excinfo)
        assert expected in message and "--tokens" not in message
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text((runs["untied"] / "config.json").read_text())
    (run / "ckpt.pt").mkdir()
    with pytest.raises(SystemExit, match="run/ckpt.pt is not a file; move it away"):
        cli("logits", "--run", run)

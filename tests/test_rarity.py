"""experiments/alignment/rarity.py: each row's reach along μ, its buckets by training count, the
massive coordinates that cap ‖h̄‖, and the command on conftest's run folder."""
import json
import math

import pytest
import torch

import analyze
import data
import model
from experiments.alignment import rarity


def gaussian(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def shifted_log_probs(W, h, targets, s):
    """log p of the targets after every hidden state moves by s·μ̂ (float64)."""
    mu = W.mean(0)
    logits = (h + s * mu / mu.norm()) @ W.T
    return torch.log_softmax(logits, -1).gather(1, targets[:, None]).squeeze(1)


def test_moving_h_along_mu_is_seen_only_through_the_spread_of_the_rows_reach():
    """reach_along_mu's docstring: h → h + s·μ̂ changes log pᵧ by s‖μ‖·aᵧ − (logsumexp(l +
    s‖μ‖a) − logsumexp(l)); with every aᵢ = 1 (rows = μ + parts ⊥ μ) nothing changes."""
    W, h = gaussian(6, 3, seed=1) + torch.tensor([2.0, 0.0, 1.0]), gaussian(5, 3, seed=2)
    targets, s = torch.tensor([0, 1, 2, 3, 5]), 0.7
    a, mu_norm = rarity.reach_along_mu(W), W.mean(0).norm()
    assert a.mean().item() == pytest.approx(1, abs=1e-14) and a.std() > 0.1
    logits = h @ W.T
    expected = s * mu_norm * a[targets] - (torch.logsumexp(logits + s * mu_norm * a, -1)
                                           - torch.logsumexp(logits, -1))
    change = shifted_log_probs(W, h, targets, s) - shifted_log_probs(W, h, targets, 0)
    assert torch.allclose(change, expected, atol=1e-12) and change.abs().max() > 0.1
    mu_hat = W.mean(0) / mu_norm
    shared = W - torch.outer(W @ mu_hat, mu_hat) + W.mean(0)  # every row reaches ‖μ‖ along μ̂
    assert torch.allclose(rarity.reach_along_mu(shared), torch.ones(6, dtype=torch.float64))
    assert torch.allclose(shifted_log_probs(shared, h, targets, s),
                          shifted_log_probs(shared, h, targets, 0), atol=1e-12)


def test_reach_by_frequency_buckets_the_rows_and_weights_the_targets_by_count():
    reach = torch.tensor([1.0, 1.2, 0.8, 0.5, 0.1], dtype=torch.float64)
    counts = torch.tensor([0, 0, 5, 50, 20_000])
    buckets, targets = rarity.reach_by_frequency(reach, counts)
    assert [(b["counts"], b["rows"]) for b in buckets] == [
        ("[0, 1)", 2), ("[1, 10)", 1), ("[10, 100)", 1), ("≥ 10000", 1)]  # empty ones left out
    assert (buckets[0]["reach_mean"], buckets[0]["reach_std"]) == pytest.approx((1.1, 0.1))
    mean = (5 * 0.8 + 50 * 0.5 + 20_000 * 0.1) / 20_055
    assert targets["target_reach"] == pytest.approx(mean)
    spread = sum(c * (a - mean) ** 2 for c, a in ((5, 0.8), (50, 0.5), (20_000, 0.1))) / 20_055
    assert targets["target_reach_std"] == pytest.approx(math.sqrt(spread))


def test_two_massive_coordinates_take_layernorms_variance_and_h_is_as_small_as_their_gains():
    """top_coordinates' docstring: x = A·(e₀ − e₁) + small noise normalises to z₀ = −z₁ ≈ √(D/2)
    and z ≈ 0 elsewhere, so ‖h‖ = ‖g ⊙ z‖ ≈ √(D/2)·‖(g₀, g₁)‖, not ‖g‖."""
    D, A = 8, 1e4
    X = 0.01 * gaussian(200, D, seed=3)
    X[:, 0] += A
    X[:, 1] -= A
    gain = torch.ones(D, dtype=torch.float64)
    gain[:2] = torch.tensor([0.01, 0.02], dtype=torch.float64)
    top = rarity.top_coordinates(X, gain, k=3)
    assert sum(c["share"] for c in top[:2]) == pytest.approx(1, abs=1e-8)
    assert {c["coordinate"]: c["gain"] for c in top[:2]} == {0: 0.01, 1: 0.02}
    h = torch.nn.functional.layer_norm(X, (D,), weight=gain)
    expected = math.sqrt(D / 2) * math.hypot(0.01, 0.02)
    assert h.norm(dim=1).mean().item() == pytest.approx(expected, rel=1e-3)
    assert expected < 0.05 * gain.norm().item()


def test_rarity_counts_the_training_tokens_and_measures_as_analyze_logits_does(
        runs, markov_dir, tmp_path):
    out = rarity.main(["--run", str(runs["untied"]), "--tokens", "256", "--json",
                       str(tmp_path / "r.json"), "--plot", str(tmp_path / "reach.png")])
    assert json.loads((tmp_path / "r.json").read_text()) == out
    assert (tmp_path / "reach.png").stat().st_size > 1000
    gpt, _, _ = model.load_model(runs["untied"] / "ckpt.pt", "cpu")
    counts = rarity.token_counts(markov_dir, gpt.config.vocab_size)
    assert sum(b["rows"] for b in out["buckets"]) == gpt.config.vocab_size
    assert counts.sum() == sum(len(data.read_shard(path))
                               for path in data.shard_paths(markov_dir, "train"))
    logits = analyze.main(["logits", "--run", str(runs["untied"]), "--tokens", "256"])
    for key in ("mu_norm", "h_mu_proj", "h_mu_cos", "B_ratio"):
        assert out[key] == pytest.approx(logits[key], rel=1e-6)
    assert out["h_mu_proj"] == pytest.approx(out["h_mean_norm"] * out["h_mu_cos"], rel=1e-9)
    assert 0 < out["h_mean_norm"] <= out["h_norm_rms"]  # ‖mean‖ ≤ RMS of the norms
    assert out["ln_f_gain_norm"] == pytest.approx(gpt.ln_f.weight.norm().item())
    assert out["h_norm_rms"] == pytest.approx(out["ln_f_gain_norm"], rel=0.1)  # near init
    shares = [c["share"] for c in out["residual_top"]]
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1
    assert [c["gain"] for c in out["residual_top"]] == pytest.approx(
        [gpt.ln_f.weight[c["coordinate"]].item() for c in out["residual_top"]])


def test_rarity_refuses_a_model_without_mu_in_one_sentence(runs, tmp_path):
    gpt, cfg, step = model.load_model(runs["untied"] / "ckpt.pt", "cpu")
    with torch.no_grad():
        gpt.output_weight.sub_(gpt.output_weight.mean(0))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    torch.save(dict(model=gpt.state_dict(), step=step, config=cfg), tmp_path / "ckpt.pt")
    with pytest.raises(SystemExit, match="no direction to measure along") as excinfo:
        rarity.main(["--run", str(tmp_path)])
    assert "\n" not in str(excinfo.value) and "Traceback" not in str(excinfo.value)


def test_the_figure_names_its_run_and_shows_the_never_seen_rows_in_a_strip(monkeypatch):
    drawn = {}
    monkeypatch.setattr(analyze, "save_figure", lambda fig, path: drawn.update(fig=fig))
    reach = torch.tensor([1.0, 1.0, 1.0, 0.4, 0.1], dtype=torch.float64).numpy()
    rarity.plot_reach(reach, torch.tensor([0, 0, 0, 5, 500]).numpy(), "run X, step 7", "r.png")
    fig = drawn["fig"]
    strip, ax = fig.axes
    assert fig._suptitle.get_text() == "run X, step 7"
    assert strip.get_xticklabels()[0].get_text() == "never seen\n(3 rows,\njittered)"
    assert len(strip.collections[0].get_offsets()) == 3
    assert len(ax.collections[0].get_offsets()) == 2
    assert len(set(strip.collections[0].get_offsets()[:, 0])) == 3  # jittered, not one dot
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["aᵢ = 1: the row shares μ"]
    assert ax.get_xlabel() and strip.get_ylabel() and ax.get_xscale() == "log"

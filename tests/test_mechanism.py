"""mechanism.py: in exact arithmetic (float64 here) a common shift of the output rows changes no
prediction of a continued run, for the baseline and μ-centering alike, while μ-loss sees it;
the shifts reach the mean logit they are built for; the results table reads the cells."""
import argparse

import numpy as np
import pytest
import torch

from experiments.mechanism import mechanism
from model import from_config

CONFIG = {"size": "tiny", "vocab_size": 128, "seq_len": 16}


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def setting():
    torch.manual_seed(0)
    state = from_config(CONFIG).state_dict()
    tokens = np.random.default_rng(0).integers(0, 128, 4000).astype(np.uint16)
    batches = mechanism.train_batches(tokens, seed=1, steps=12, batch=2, seq_len=16)
    val = mechanism.train_batches(tokens, seed=2, steps=2, batch=2, seq_len=16)
    c = 40 * torch.randn(64, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    return state, batches, val, c


def log_probs_after(setting, head, shift):
    state, batches, val, c = setting
    model = mechanism.build_condition_model(CONFIG, state, mechanism.Condition("float64", head),
                                            torch.float64)
    if shift:
        mechanism.shift_rows(model, c)
    result = mechanism.continue_run(model, None, batches, val, lr=3e-2, dtype="float64",
                                    measure_every=6)
    with torch.no_grad():
        return torch.log_softmax(model(val[0][0]), dim=-1), result


def test_a_common_shift_changes_no_prediction_in_exact_arithmetic(setting):
    base, base_run = log_probs_after(setting, "baseline", shift=False)
    shifted, shifted_run = log_probs_after(setting, "baseline", shift=True)
    centred, _ = log_probs_after(setting, "mu_center", shift=True)
    # float64 rounds logits shifted by c·h of order 10²–10³ and 12 AdamW steps compound it:
    # torch 2.11's AVX2 kernels leave 1.06e-9; μ-loss's real difference (below) is > 100× TOL
    TOL = 1e-8
    assert (shifted - base).abs().max() < TOL
    assert (centred - base).abs().max() < TOL
    assert np.allclose(shifted_run["losses"], base_run["losses"], rtol=0, atol=TOL)
    # the shift rides along: the mean logit differs, the validation loss does not
    assert abs(shifted_run["curve"][-1]["logit_mean"] - base_run["curve"][-1]["logit_mean"]) > 1
    assert shifted_run["curve"][-1]["val_loss"] == pytest.approx(
        base_run["curve"][-1]["val_loss"], abs=TOL)


def test_mu_loss_sees_the_shift(setting):
    plain, _ = log_probs_after(setting, "mu_loss", shift=False)
    shifted, _ = log_probs_after(setting, "mu_loss", shift=True)
    assert (shifted - plain).abs().max() > 1e-6


def test_the_shifts_reach_their_mean_logit_and_the_orthogonal_one_stays_off_the_hidden_states():
    gen = torch.Generator().manual_seed(0)
    scales = torch.linspace(0.05, 2, 16, dtype=torch.float64)
    H = torch.randn(500, 16, generator=gen, dtype=torch.float64) * scales + 0.3
    W = torch.randn(300, 16, generator=gen, dtype=torch.float64) + 0.2
    shifts = mechanism.shift_vectors(H, W, levels=(0, 1000), ortho_level=1000)
    mean_logit = lambda c: (H.mean(0) @ (W.mean(0) + c)).item()
    assert mean_logit(shifts["none"]) == pytest.approx((H.mean(0) @ W.mean(0)).item())
    assert mean_logit(shifts["along0"]) == pytest.approx(0, abs=1e-9)
    assert mean_logit(shifts["along1000"]) == pytest.approx(1000, rel=1e-12)
    ortho = shifts["ortho"]
    assert ortho.norm() == pytest.approx(shifts["along1000"].norm().item(), rel=1e-12)
    # the least-varying direction: its rms over the tokens is the smallest of all directions
    rms = lambda c: (H @ c).square().mean().sqrt().item()
    assert rms(ortho) < 0.2 * rms(shifts["along1000"])


def test_gaps_are_against_the_unshifted_run_of_the_same_base_and_order_and_spread_by_base():
    rows = [dict(base=base, condition=cond, shift=shift, seed=seed, val_loss_start=loss + 1,
                 val_loss_end=loss, logit_mean_start=1000.0, logit_mean_end=1000.0 + 10 * base,
                 logit_mean_drift=10 * loss)
            for base, cond, shift, seed, loss in [
                (0, "bf16", "none", 0, 5.0), (0, "bf16", "none", 1, 5.2),
                (0, "bf16", "along1000", 0, 5.5), (0, "bf16", "along1000", 1, 5.9),
                (1, "bf16", "none", 0, 6.0), (1, "bf16", "none", 1, 6.0),
                (1, "bf16", "along1000", 0, 8.0), (1, "bf16", "along1000", 1, 9.0),
                (0, "float32", "none", 0, 4.0), (0, "float32", "along1000", 0, 4.0)]]
    gaps = {(g["condition"], g["shift"]): g for g in mechanism.gap_rows(rows)}
    bf16 = gaps["bf16", "along1000"]  # gaps 0.5, 0.7 from base 0; 2.0, 3.0 from base 1
    assert bf16["gap_end_mean"] == pytest.approx(1.55) and bf16["gap_start_mean"] == bf16[
        "gap_end_mean"]
    assert (bf16["base_mean_min"], bf16["base_mean_max"]) == pytest.approx((0.6, 2.5))
    assert bf16["across_bases"] == pytest.approx(np.std([0.6, 2.5], ddof=1))
    assert bf16["within_bases"] == pytest.approx(np.sqrt((0.02 + 0.5) / 2))
    assert (bf16["gap_min"], bf16["gap_max"], bf16["runs"]) == pytest.approx((0.5, 3.0, 4))
    assert gaps["float32", "along1000"]["gap_end_mean"] == 0 and gaps["bf16", "none"][
        "gap_max"] == 0
    assert list(gaps) == [("bf16", "none"), ("bf16", "along1000"), ("float32", "none"),
                          ("float32", "along1000")]  # CONDITIONS' order, then the shifts'
    bases = mechanism.base_rows(rows, {b: dict.fromkeys(mechanism.BASE_STATS, 0.0)
                                       for b in (0, 1)})
    assert [b["bf16_gap_along1000"] for b in bases] == pytest.approx([0.6, 2.5])
    assert [b["bf16_dl_along1000"] for b in bases] == [0, 10]
    assert "bf16_gap_along3000" not in bases[0]  # no such runs: no column
    table = mechanism.gap_table(list(gaps.values()), bases,
                                argparse.Namespace(steps=300, lr=0.03))
    assert "| bf16 | +0.00 [+0.00, +0.00] ± 0.00 | +1.55 [+0.60, +2.50] ± 0.51 |" in table
    assert "| bf16 | 56 | 71 |\n" in table  # the drift, mean over every base and order
    assert table.endswith("| seed 1 | 0.000 | 0.00 | 0 | 0.000 | +2.50 | +10 |\n")


def test_run_rows_drift_is_the_largest_move_of_the_mean_logit_from_its_start():
    curve = [dict(logit_mean=l, mu_norm=1.0, val_loss=5.0) for l in (-7.0, 250.0, -330.0, 150.0)]
    cell = dict(base=0, condition="float32", shift="ortho", seed=0, curve=curve, losses=[5.0],
                wall_s=1)
    row, = mechanism.run_rows([cell])
    assert row["logit_mean_drift"] == 323 and row["logit_mean_end"] == 150


def test_the_mean_logit_figure_draws_every_run_so_one_that_blows_up_stands_alone(monkeypatch):
    drawn = {}
    monkeypatch.setattr(mechanism.analyze, "save_figure", lambda fig, path: drawn.update(fig=fig))
    ends = {0: -2e5, 1: 2000.0, 2: 500.0}  # one base, three data orders; order 0 blows up
    curves = [dict(base=0.0, condition="bf16", shift="along3000", seed=float(seed), step=step,
                   logit_mean=l)
              for seed, end in ends.items() for step, l in ((0.0, 3e3), (300.0, end))]
    mechanism.plot_logit_mean(curves, "title", "unused.png")
    ax, = drawn["fig"].axes
    assert sorted(line.get_ydata()[-1] for line in ax.get_lines()) == sorted(ends.values())
    assert ax.get_yscale() == "symlog"
    assert [t.get_text() for t in drawn["fig"].legends[0].get_texts()] == ["bf16, base seed 0"]

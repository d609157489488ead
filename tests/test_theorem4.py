"""experiments/theorem4: the audit of Theorem 4's proof in exact fractions, the search on small
integer matrices, what holds for every h instead, and the committed results and page."""
from fractions import Fraction
from pathlib import Path

import pytest
import torch

import analyze
from experiments.theorem4 import theorem4

HERE = Path(__file__).resolve().parents[1] / "experiments" / "theorem4"


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def audit_row(step, example):
    row, = [r for r in theorem4.theorem4_audit()
            if r["step"] == step and r["example"].startswith(example)]
    return Fraction(row["left"]), Fraction(row["right"]), row["holds"]


@pytest.mark.parametrize("step, example, left, right, holds", [
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
def test_the_audit_checks_each_step_as_its_text_states(step, example, left, right, holds):
    assert audit_row(step, example) == (Fraction(left), Fraction(right), holds)


def test_the_audits_examples_recomputed_in_float64():
    """Without theorem4.py's fractions: B_ratio by analyze.b_ratio, norms and logits by torch."""
    def terms(E, h):
        e, h = torch.tensor(E, dtype=torch.float64), torch.tensor(h, dtype=torch.float64)
        e_star = e - e.mean(0)
        return [analyze.b_ratio(e), (e_star ** 2).sum(1).max().item(),
                (e ** 2).sum(1).max().item(), (e_star @ h).abs().max().item(),
                (e @ h).abs().max().item()]
    assert terms(theorem4.E2, theorem4.H2) == pytest.approx([1 / 3, 8 / 9, 1, 4 / 3, 1])
    assert terms(theorem4.E3, theorem4.H3) == pytest.approx([4 / 3, 16 / 9, 2, 5 / 3, 2])


def test_the_search_finds_no_counterexample_smaller_than_the_audits():
    """On entries in {−1, 0, 1}; the committed results search ±2 with the same answers."""
    n_matrices, rows = theorem4.exhaustive_search(entries=1, h_entries=1)
    found = {r["step"]: r for r in rows}
    assert n_matrices == 3**6 - 7**2  # μ = 0: each column one of 7 (a, b, −a − b) in ±1
    assert found["Eq. 32"]["W"] == [list(r) for r in theorem4.E0] and found["Eq. 32"]["size"] == 2
    assert found["Eq. 34"]["W"] == [list(r) for r in theorem4.E1]
    for step in ("Eq. 34 → 35", "Eq. 14 ⇒"):
        assert found[step]["W"] == [list(r) for r in theorem4.E2]
        assert found[step]["h"] == list(theorem4.H2)
    assert found["⇐ by reversing"]["W"] == [list(r) for r in theorem4.E3]
    assert found["Eq. 14 ⇐"]["size"] == 5  # a tie with E₃: none is smaller
    assert all(r["matrices"] > 0 for r in rows)


def test_random_h_break_theorem_4_more_often_near_b_ratio_1():
    scan = theorem4.b_ratio_scan(30, seed=1, n_hidden=200, shape=(200, 16))
    assert sum(b["matrices"] for b in theorem4.binned(scan)) == 30
    low = [r["larger_share"] for r in scan if r["B_ratio"] < 0.3]
    high = [r["larger_share"] for r in scan if 0.6 < r["B_ratio"] <= 1]
    assert low and high and max(high) > 0  # B_ratio ≤ 1, and yet a larger max |l*|
    assert sum(high) / len(high) > sum(low) / len(low)


@pytest.mark.parametrize("V, D, seed", [(3, 2, 0), (100, 16, 2)])
def test_what_holds_for_every_h(V, D, seed):
    """l* = l − l̄, so max|l*| ≤ max l − min l; centering lowers the mean square of the logits
    by l̄² and of the row norms by ‖μ‖²; row i's norm shrinks exactly when eᵢ·μ ≥ ‖μ‖²/2."""
    scales = 2 * torch.rand(D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    e = rand(V, D, seed=seed) * scales + 3 * rand(D, seed=seed + 1)  # anisotropic, as trained
    e_star, mu, H = e - e.mean(0), e.mean(0), rand(D, 64, seed=seed + 7)
    l, l_star = e @ H, e_star @ H
    torch.testing.assert_close(l_star, l - l.mean(0), rtol=0, atol=1e-11)
    assert (l_star.abs().amax(0) <= l.amax(0) - l.amin(0) + 1e-12).all()
    torch.testing.assert_close((l_star ** 2).mean(0), (l ** 2).mean(0) - l.mean(0) ** 2)
    norm_sq, norm_sq_star = (e ** 2).sum(1), (e_star ** 2).sum(1)
    assert norm_sq_star.mean().item() == pytest.approx((norm_sq.mean() - mu @ mu).item())
    assert torch.equal(norm_sq_star <= norm_sq, e @ mu >= (mu @ mu) / 2)


def test_no_counterexample_exists_for_v_2_or_d_1():
    """V = 2: e*₁ = −e*₂, so max|l*| = |l₁ − l₂|/2 ≤ max|l|. D = 1: every h is along μ."""
    for seed in range(10):
        e2, H = rand(2, 5, seed=seed) + 3, rand(5, 64, seed=seed + 50)
        assert (((e2 - e2.mean(0)) @ H).abs().amax(0) <= (e2 @ H).abs().amax(0) + 1e-12).all()
        e1, h = rand(7, 1, seed=seed) + 1, rand(1, seed=seed + 60)
        larger = ((e1 - e1.mean(0)) @ h).abs().max() > (e1 @ h).abs().max()
        assert (analyze.b_ratio(e1) <= 1) != larger


def test_the_command_writes_the_committed_results_and_the_page_quotes_them(tmp_path):
    theorem4.main(["--out", str(tmp_path)])
    page = (HERE / "README.md").read_text()
    for name in ("audit.md", "search.md", "scan.md"):
        written = (tmp_path / name).read_text()
        assert written == (HERE / "results" / name).read_text(), name
        table = "".join(line + "\n" for line in written.splitlines() if line.startswith("|"))
        assert table in page, name


def test_for_h_orthogonal_to_mu_centering_changes_no_logit():
    """l*ᵢ = lᵢ − μ·h (Lemma 1), so h ⊥ μ leaves every logit as it was, in exact fractions."""
    E = [[Fraction(2), Fraction(-1)], [Fraction(0), Fraction(3)], [Fraction(1), Fraction(1)]]
    mu = [sum(row[j] for row in E) / len(E) for j in range(2)]
    h = [-mu[1], mu[0]]  # ⊥ μ
    for row in E:
        centred = [row[j] - mu[j] for j in range(2)]
        assert sum(c * x for c, x in zip(centred, h)) == sum(e * x for e, x in zip(row, h))

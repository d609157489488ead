"""Theorem 4 of the paper (Eq. 14: B_ratio ≤ 1 ⇔ maxᵢ|l*ᵢ| ≤ maxᵢ|lᵢ|) and its proof (App. B),
audited in exact arithmetic (`python analyze.py verify`). Notation as in heads.py (W's rows eᵢ,
μ, lᵢ = eᵢ·h), e*ᵢ = eᵢ − μ, l*ᵢ = e*ᵢ·h = lᵢ − l̄; B₋, B₊: Eq. 12's tight bounds, B_ratio Eq. 13.

The verdict (this docstring is its one home; theorem4_audit has each step):
  • For h ∥ μ the equivalence is exact: it restates Eq. 26, B_ratio = max|e*ᵢ·μ| / max|eᵢ·μ|.
  • For h ⊥ μ, l* = l: the right side holds whatever B_ratio is (⇒ holds, ⇐ fails: E₃).
  • For a given h otherwise both directions fail, ⇒ on E₂ and ⇐ on E₃ (theorem4_audit's rows);
    none exists for V = 2 (e*₁ = −e*₂) or D = 1 (l* = h·(eᵢ − μ): exactly the h ∥ μ case).
  • Read "for every h", ⇒ still fails (E₂) and ⇐ holds, trivially: every h includes h = μ.
  What holds for every h: max|l*| ≤ max|l| ⇔ max|lᵢ − l̄| ≤ max|lᵢ| (Eq. 26 with eᵢ·h for eᵢ·μ),
  and max|l*| ≤ 2·max|l|; centering lowers the mean square of the logits and of the row norms (by
  l̄² and ‖μ‖²), not their maximum (row i's norm shrinks exactly when eᵢ·μ ≥ ‖μ‖²/2). So
  B_ratio ≤ 1 says that centering shrinks the logit range along μ, not for every token; how often
  a random h gets a larger max|l*| grows with B_ratio (`--b_ratio_scan` prints it per bin).
"""
import itertools
import math
from fractions import Fraction

import numpy as np
import torch

import measure

SEARCH_ENTRIES, SEARCH_H_ENTRIES = 2, 3  # exhaustive search: W's entries in ±2, h's in ±3
SEARCH_MAX_PAIRS = 30_000_000  # (W, h) pairs. `analyze.py verify --exhaustive`, once each on this
# project's 2-core AMD EPYC (shared, OMP_NUM_THREADS=1): 25,330,560 pairs (±4, ±3) 14.5 s and
# 1.83 GB peak RSS, 25,643,520 (±2, ±20) 11.9 s and 1.68 GB
SCAN_MATRICES = 200                      # B_ratio scan: random anisotropic matrices

E0 = ((-1, 0), (0, -1), (0, 0))    # μ = (−1/3, −1/3); E₀–E₃: the audit's counterexamples
E1 = ((-1, 0), (0, -1), (0, 1))    # μ = (−1/3, 0)
E2 = ((-1, 0), (-1, 0), (0, -1))   # μ = (−2/3, −1/3)
E3 = ((-1, -1), (-1, 1), (1, 0))   # μ = (−1/3, 0)
H2, H3 = (-1, 1), (1, 1)           # the hidden states that E₂ and E₃ need


def dot(a, b):
    return sum(x * y for x, y in zip(a, b))


def exact_terms(E, h=None) -> dict:
    """The proof's quantities for a small integer E (rows eᵢ) and h, in fractions: no rounding."""
    e = [tuple(map(Fraction, row)) for row in E]
    mu = tuple(sum(column) / len(e) for column in zip(*e))
    star = [tuple(x - m for x, m in zip(row, mu)) for row in e]
    mu_sq = dot(mu, mu)
    dots, dots_star = [dot(row, mu) for row in e], [dot(row, mu) for row in star]
    parallel_sq = [d * d / mu_sq for d in dots_star]            # ‖e*ᵢ∥‖²
    norm_sq_star = [dot(row, row) for row in star]
    b_minus, b_plus = mu_sq - min(dots), max(dots) - mu_sq      # tight bounds (Eq. 12)
    out = dict(mu_sq=mu_sq, b_minus=b_minus, b_plus=b_plus,
               eq13=max(b_minus, b_plus) / max(b_minus - mu_sq, b_plus + mu_sq),
               eq26=max(map(abs, dots_star)) / max(map(abs, dots)),
               norm_sq=max(dot(row, row) for row in e), norm_sq_star=max(norm_sq_star),
               eq32_split=max(parallel_sq) + max(n - p for n, p in zip(norm_sq_star, parallel_sq)),
               eq33=max(parallel_sq) - max(d * d / mu_sq for d in dots),
               logit_mu=max(map(abs, dots)), logit_mu_star=max(map(abs, dots_star)))  # h = μ
    if h is not None:
        out.update(logit=max(abs(dot(row, h)) for row in e),
                   logit_star=max(abs(dot(row, h)) for row in star))
    return out


def theorem4_audit() -> list[dict]:
    """Theorem 4's proof (App. B), one row per step (lhs, rhs exact, as strings such as "10/9"),
    on the smallest counterexamples E₀–E₃ (V = 3, D = 2; exhaustive_search finds none smaller).
    With aᵢ = eᵢ·μ̂ and pᵢ = eᵢ − aᵢμ̂, centering maps aᵢ → aᵢ − ‖μ‖ and keeps pᵢ.
      Eq. 24–28 hold with the tight B₋, B₊: e*ᵢ·μ = eᵢ·μ − ‖μ‖² fills [−B₋, B₊], so Eq. 13 is
        Eq. 26. With loose bounds (which Eq. 12 allows) it is not: E₁ with B₋ = 1 gives 9/8.
      Eq. 32 is false: maxᵢ(xᵢ + yᵢ) ≤ maxᵢ xᵢ + maxᵢ yᵢ, equal only if one row maximises the
        parallel and the perpendicular part (E₀: 5/9 < 13/18; E₁ also breaks Eq. 34).
      Eq. 33 mixes μ̂ with μ and squared with unsquared terms; its correct form (parallel parts,
        from Eq. 28: E₁ −5/9 ≤ 0) says nothing about norms without Eq. 32; as printed, E₁ 1/3.
      Eq. 34 is false: E₁ has B_ratio = 2/3 yet maxᵢ‖e*ᵢ‖² = 10/9 > 1 (e₂·μ = 0 < ‖μ‖²/2).
      Eq. 34 → 35 (Lemma 2) is false: a smaller upper bound does not shrink a given h's largest
        logit (E₂: 8/9 ≤ 1, yet h = (−1, 1) gives l = (1, 1, −1), l* = (2/3, 2/3, −4/3)).
      Eq. 14 ⇒ fails on E₂ (same h); ⇐ on E₃ (h = (1, 1): l = (−2, 0, 1), l* = (−5/3, 1/3, 4/3)),
        and "reversing the logic" too (E₃: max‖e*‖² = 16/9 ≤ 2, yet B_ratio = 4/3).
      (i) at h = μ the logits are eᵢ·μ and e*ᵢ·μ: Eq. 26 itself (E₃: 4/9 > 1/3)."""
    e0, e1, e2, e3 = exact_terms(E0), exact_terms(E1), exact_terms(E2, H2), exact_terms(E3, H3)
    loose = max(1, e1["b_plus"]) / max(1 - e1["mu_sq"], e1["b_plus"] + e1["mu_sq"])
    mu_norm = Fraction(*map(math.isqrt, e1["mu_sq"].as_integer_ratio()))  # ‖μ‖² = 1/9: exact
    eq33_printed = e1["logit_mu_star"] / mu_norm - e1["logit_mu"]
    split = "max‖e*‖² = max‖e*∥‖² + max‖e*⊥‖²"
    e2_logits = ("max|l*| ≤ max|l|", e2["logit_star"], "≤", e2["logit"])  # at h = H2
    e3_b_ratio = ("B_ratio ≤ 1", e3["eq26"], "≤", 1)
    rows = [  # (step, example, claim, lhs, relation, rhs)
        ("Eq. 26", "E₁", "Eq. 13 = max|e*·μ| / max|e·μ|", e1["eq13"], "=", e1["eq26"]),
        ("Eq. 13, loose B₋", "E₁, B₋ = 1", "Eq. 13 = max|e*·μ| / max|e·μ|", loose, "=", e1["eq26"]),
        ("Eq. 32", "E₀", split, e0["norm_sq_star"], "=", e0["eq32_split"]),
        ("Eq. 32", "E₁", split, e1["norm_sq_star"], "=", e1["eq32_split"]),
        ("Eq. 33, parallel parts", "E₁", "max(e*·μ̂)² − max(e·μ̂)² ≤ 0", e1["eq33"], "≤", 0),
        ("Eq. 33 as printed", "E₁", "max|e*·μ̂| − max|e·μ| ≤ 0", eq33_printed, "≤", 0),
        ("Eq. 34", f"E₁, B_ratio = {e1['eq26']}", "max‖e*‖² ≤ max‖e‖²", e1["norm_sq_star"], "≤",
         e1["norm_sq"]),
        ("Eq. 34 → 35", f"E₂, h = {H2}, max‖e*‖² = {e2['norm_sq_star']} ≤ {e2['norm_sq']}",
         *e2_logits),
        ("Eq. 14 ⇒", f"E₂, h = {H2}, B_ratio = {e2['eq26']}", *e2_logits),
        ("Eq. 14 ⇐", f"E₃, h = {H3}, max|l*| = {e3['logit_star']} < {e3['logit']}", *e3_b_ratio),
        ("⇐ by reversing", f"E₃, max‖e*‖² = {e3['norm_sq_star']} ≤ {e3['norm_sq']}", *e3_b_ratio),
        ("(i) at h = μ", f"E₃, B_ratio = {e3['eq26']} > 1", "max|l*| > max|l|",
         e3["logit_mu_star"], ">", e3["logit_mu"]),
    ]
    holds = {"=": lambda a, b: a == b, "≤": lambda a, b: a <= b, ">": lambda a, b: a > b}
    return [dict(step=step, example=example, claim=claim, lhs=str(lhs), rhs=str(rhs),
                 holds=holds[rel](lhs, rhs)) for step, example, claim, lhs, rel, rhs in rows]


def search_pairs(entries: int, h_entries: int) -> int:
    """The (W, h) pairs exhaustive_search compares, which its time and memory grow with: the
    (2K+1)⁶ matrices less those with μ = 0 (per column, e₃ = −e₁ − e₂ must lie in ±K too), times
    the (2K_h+1)² − 1 states h ≠ 0."""
    zero_mu = ((2 * entries + 1) ** 2 - entries * (entries + 1)) ** 2
    return ((2 * entries + 1) ** 6 - zero_mu) * ((2 * h_entries + 1) ** 2 - 1)


def exhaustive_search(entries: int = SEARCH_ENTRIES,
                      h_entries: int = SEARCH_H_ENTRIES) -> list[dict]:
    """Every V = 3, D = 2 integer W with entries in ±entries and μ ≠ 0, against every integer
    h ≠ 0 with entries in ±h_entries: per failing step of the proof, how many matrices break it
    and the smallest that does (size Σ|Wᵢⱼ|, then Σ|hⱼ|; ties: the first enumerated). In
    integers: with s = 3μ, the rows 3eᵢ and 3e*ᵢ = 3eᵢ − s are integer vectors and every
    comparison is one of their dot products (Eq. 32's split times ‖s‖²): no rounding."""
    values = range(-entries, entries + 1)
    W = np.array(list(itertools.product(values, repeat=6)), dtype=np.int64).reshape(-1, 3, 2)
    W = W[W.sum(1).any(1)]                                          # μ ≠ 0
    s = W.sum(1)[:, None, :]                                        # 3μ, shaped like a row
    rows, rows_star = 3 * W, 3 * W - s                              # 3eᵢ, 3e*ᵢ
    dots_star = (rows_star * s).sum(2)                              # 3e*ᵢ·3μ
    b_ratio_le_1 = np.abs(dots_star).max(1) <= np.abs((rows * s).sum(2)).max(1)  # Eq. 26 ≤ 1
    norm_sq, norm_sq_star = (rows ** 2).sum(2), (rows_star ** 2).sum(2)
    norm_shrinks = norm_sq_star.max(1) <= norm_sq.max(1)            # Eq. 34's conclusion
    s_sq = (s ** 2).sum(2)
    parallel = dots_star ** 2                          # ‖s‖²·‖3e*ᵢ∥‖²
    eq32_fails = s_sq[:, 0] * norm_sq_star.max(1) < parallel.max(1) + (
        s_sq * norm_sq_star - parallel).max(1)
    H = np.array([h for h in itertools.product(range(-h_entries, h_entries + 1), repeat=2)
                  if any(h)], dtype=np.int64)
    logit = np.abs(np.einsum("mvd,hd->mhv", rows, H)).max(2)        # 3·max|l|, matrix × h
    logit_star = np.abs(np.einsum("mvd,hd->mhv", rows_star, H)).max(2)
    no_h = np.ones((len(W), 1), dtype=bool)
    claims = (  # (step, claim, counterexample: premise of W and outcome for (W, h))
        ("Eq. 32", "max‖e*‖² = max‖e*∥‖² + max‖e*⊥‖²", eq32_fails, no_h),
        ("Eq. 34", "B_ratio ≤ 1 ⇒ max‖e*‖ ≤ max‖e‖", b_ratio_le_1 & ~norm_shrinks, no_h),
        ("Eq. 34 → 35", "max‖e*‖ ≤ max‖e‖ ⇒ max|l*| ≤ max|l|", norm_shrinks, logit_star > logit),
        ("Eq. 14 ⇒", "B_ratio ≤ 1 ⇒ max|l*| ≤ max|l|", b_ratio_le_1, logit_star > logit),
        ("Eq. 14 ⇐", "max|l*| < max|l| ⇒ B_ratio ≤ 1", ~b_ratio_le_1, logit_star < logit),
        ("⇐ by reversing", "max‖e*‖ ≤ max‖e‖ ⇒ B_ratio ≤ 1", norm_shrinks & ~b_ratio_le_1, no_h))
    w_size, h_size = np.abs(W).sum((1, 2)), np.abs(H).sum(1)
    out = []
    for step, claim, premise, outcome in claims:
        i, j = np.nonzero(premise[:, None] & outcome)  # the failing (W, h) pairs
        found = dict(step=step, claim=claim, matrices=len(np.unique(i)), W=None, h=None, size=None)
        if len(i):
            needs_h = outcome is not no_h
            k = np.lexsort((h_size[j] * needs_h, w_size[i]))[0]       # smallest W, then h
            found.update(W=W[i[k]].tolist(), h=H[j[k]].tolist() if needs_h else None,
                         size=int(w_size[i[k]]))
        out.append(found)
    return out


def b_ratio_scan(n_matrices: int = SCAN_MATRICES, n_hidden: int = 500, shape=(1000, 64),
                 seed: int = 0) -> list[dict]:
    """Per random anisotropic matrix, its B_ratio and the share of n_hidden random h with
    maxᵢ|l*ᵢ| > maxᵢ|lᵢ| (Theorem 4 would make it 0 for B_ratio ≤ 1, 1 above). Rows isotropic
    up to axis scales aₖ ~ U(0, 2), plus a common shift of size c = 10^U(−1, 1) (float64, seeded):
        W = X·diag(a) + c·m,   X ~ N(0, 1)^{V×D},  m ~ N(0, I_D),   h ~ N(0, I_D)"""
    seeded = dict(generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    V, D = shape
    out = []
    for _ in range(n_matrices):
        scales, shift = 2 * torch.rand(D, **seeded), 10 ** (2 * torch.rand(1, **seeded) - 1)
        W = torch.randn(V, D, **seeded) * scales + shift * torch.randn(D, **seeded)
        H = torch.randn(D, n_hidden, **seeded)
        larger = ((W - W.mean(0)) @ H).abs().amax(0) > (W @ H).abs().amax(0)
        out.append(dict(B_ratio=measure.b_ratio(W), larger_share=larger.double().mean().item()))
    return out


def binned(scan: list[dict], edges=(*(k / 10 for k in range(11)), math.inf)):
    """The scan's mean share per B_ratio bin [lo, hi), empty bins left out."""
    bins = [(lo, hi, [r["larger_share"] for r in scan if lo <= r["B_ratio"] < hi])
            for lo, hi in zip(edges, edges[1:])]
    return [dict(B_ratio_from=lo, B_ratio_to=hi, matrices=len(shares),
                 larger_share=sum(shares) / len(shares)) for lo, hi, shares in bins if shares]

"""Theorem 4 (Eq. 14: B_ratio ≤ 1 ⇔ maxᵢ|l*ᵢ| ≤ maxᵢ|lᵢ|) and its proof (App. B), audited in
exact arithmetic: the proof step by step (audit.md), every small integer W (search.md), random W
(scan.md); README.md beside this file says what they show. Notation as in heads.py (rows eᵢ of W,
their mean μ, lᵢ = eᵢ·h), e*ᵢ = eᵢ − μ, l*ᵢ = e*ᵢ·h = lᵢ − l̄; B₋, B₊, B_ratio: analyze.b_bounds.

    python experiments/theorem4/theorem4.py --out experiments/theorem4/results   # run.sh
"""
import argparse
import itertools
import math
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root, for analyze.py
import analyze  # noqa: E402

E0 = ((-1, 0), (0, -1), (0, 0))    # μ = (−1/3, −1/3)
E1 = ((-1, 0), (0, -1), (0, 1))    # μ = (−1/3, 0)
E2 = ((-1, 0), (-1, 0), (0, -1))   # μ = (−2/3, −1/3)
E3 = ((-1, -1), (-1, 1), (1, 0))   # μ = (−1/3, 0)
H2, H3 = (-1, 1), (1, 1)           # the hidden states that E₂ and E₃ need
ENTRIES, H_ENTRIES = 2, 3          # the search: W's entries in ±2, h's in ±3
MATRICES, SEED = 200, 0            # the scan: random matrices


def dot(a, b):
    return sum(x * y for x, y in zip(a, b))


def exact_terms(E, h=None) -> dict:
    """The proof's quantities for a small integer E (rows eᵢ) and h, in fractions: no rounding."""
    e = [tuple(map(Fraction, row)) for row in E]
    mu = tuple(sum(column) / len(e) for column in zip(*e))
    star = [tuple(x - m for x, m in zip(row, mu)) for row in e]
    mu_sq = dot(mu, mu)
    dots = [dot(row, mu) for row in e]
    dots_star = [dot(row, mu) for row in star]
    parallel_sq = [d * d / mu_sq for d in dots_star]            # ‖e*ᵢ∥‖²
    norm_sq_star = [dot(row, row) for row in star]
    b_minus, b_plus = mu_sq - min(dots), max(dots) - mu_sq      # tight bounds (Eq. 12)
    out = dict(mu_sq=mu_sq, b_plus=b_plus,
               eq13=max(b_minus, b_plus) / max(b_minus - mu_sq, b_plus + mu_sq),
               eq26=max(map(abs, dots_star)) / max(map(abs, dots)),
               norm_sq=max(dot(row, row) for row in e), norm_sq_star=max(norm_sq_star),
               eq32_split=max(parallel_sq) + max(n - p for n, p in zip(norm_sq_star, parallel_sq)),
               eq33=max(parallel_sq) - max(d * d / mu_sq for d in dots),
               logit_mu=max(map(abs, dots)), logit_mu_star=max(map(abs, dots_star)))  # at h = μ
    if h is not None:
        out["logit"] = max(abs(dot(row, h)) for row in e)
        out["logit_star"] = max(abs(dot(row, h)) for row in star)
    return out


def theorem4_audit() -> list[dict]:
    """The proof (App. B), one row per step, its two sides exact (strings such as "10/9").
    Eq. 13 = Eq. 26 needs the tight B₋, B₊ (e*ᵢ·μ = eᵢ·μ − ‖μ‖² fills [−B₋, B₊]). Eq. 32 fails
    as maxᵢ(xᵢ + yᵢ) < maxᵢ xᵢ + maxᵢ yᵢ unless one row maximises both. Eq. 33 mixes μ̂ with μ
    and squares with absolute values. Eq. 34 fails as row i's norm grows when eᵢ·μ < ‖μ‖²/2.
    Eq. 34 → 35: a smaller bound on every logit does not shrink a given h's largest one."""
    e0, e1, e2, e3 = exact_terms(E0), exact_terms(E1), exact_terms(E2, H2), exact_terms(E3, H3)
    loose = max(1, e1["b_plus"]) / max(1 - e1["mu_sq"], e1["b_plus"] + e1["mu_sq"])  # B₋ = 1
    mu_norm = Fraction(*map(math.isqrt, e1["mu_sq"].as_integer_ratio()))  # ‖μ‖² = 1/9: exact
    eq33_printed = e1["logit_mu_star"] / mu_norm - e1["logit_mu"]
    split = "max‖e*‖² = max‖e*∥‖² + max‖e*⊥‖²"
    e2_logits = ("max|l*| ≤ max|l|", e2["logit_star"], "≤", e2["logit"])  # at h = H2
    e3_b_ratio = ("B_ratio ≤ 1", e3["eq26"], "≤", 1)
    rows = [  # (step, example, claim, left, relation, right)
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
    return [dict(step=step, example=example, claim=claim, left=str(left), right=str(right),
                 holds=holds[relation](left, right))
            for step, example, claim, left, relation, right in rows]


def exhaustive_search(entries: int, h_entries: int) -> tuple[int, list[dict]]:
    """Every V = 3, D = 2 integer W with entries in ±entries and μ ≠ 0, against every integer
    h ≠ 0 with entries in ±h_entries: (how many W, and per step of the proof: how many W break it
    and the smallest that does, by Σ|Wᵢⱼ|, then Σ|hⱼ|). In integers, with s = 3μ: the rows 3eᵢ
    and 3e*ᵢ = 3eᵢ − s are integer vectors and every comparison is one of their dot products."""
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
    parallel = dots_star ** 2                                       # ‖s‖²·‖3e*ᵢ∥‖²
    split = parallel.max(1) + (s_sq * norm_sq_star - parallel).max(1)
    eq32_fails = s_sq[:, 0] * norm_sq_star.max(1) < split
    H = np.array([h for h in itertools.product(range(-h_entries, h_entries + 1), repeat=2)
                  if any(h)], dtype=np.int64)
    logit = np.abs(np.einsum("mvd,hd->mhv", rows, H)).max(2)        # 3·max|l|, W × h
    logit_star = np.abs(np.einsum("mvd,hd->mhv", rows_star, H)).max(2)
    any_h = np.ones((len(W), 1), dtype=bool)
    claims = (  # (step, claim, counterexample: premise of W, outcome for (W, h))
        ("Eq. 32", "max‖e*‖² = max‖e*∥‖² + max‖e*⊥‖²", eq32_fails, any_h),
        ("Eq. 34", "B_ratio ≤ 1 ⇒ max‖e*‖ ≤ max‖e‖", b_ratio_le_1 & ~norm_shrinks, any_h),
        ("Eq. 34 → 35", "max‖e*‖ ≤ max‖e‖ ⇒ max|l*| ≤ max|l|", norm_shrinks, logit_star > logit),
        ("Eq. 14 ⇒", "B_ratio ≤ 1 ⇒ max|l*| ≤ max|l|", b_ratio_le_1, logit_star > logit),
        ("Eq. 14 ⇐", "max|l*| < max|l| ⇒ B_ratio ≤ 1", ~b_ratio_le_1, logit_star < logit),
        ("⇐ by reversing", "max‖e*‖ ≤ max‖e‖ ⇒ B_ratio ≤ 1", norm_shrinks & ~b_ratio_le_1, any_h))
    w_size, h_size = np.abs(W).sum((1, 2)), np.abs(H).sum(1)
    out = []
    for step, claim, premise, outcome in claims:
        i, j = np.nonzero(premise[:, None] & outcome)              # the failing (W, h) pairs
        found = dict(step=step, claim=claim, matrices=len(np.unique(i)), W=None, h=None, size=None)
        if len(i):
            needs_h = outcome is not any_h
            k = np.lexsort((h_size[j] * needs_h, w_size[i]))[0]    # smallest W, then h
            found.update(W=W[i[k]].tolist(), h=H[j[k]].tolist() if needs_h else None,
                         size=int(w_size[i[k]]))
        out.append(found)
    return len(W), out


def b_ratio_scan(n_matrices: int, seed: int, n_hidden=500, shape=(1000, 64)) -> list[dict]:
    """Per random anisotropic W, its B_ratio and the share of n_hidden random h with
    max|l*| > max|l| (Theorem 4 would make it 0 for B_ratio ≤ 1). Rows isotropic up to axis
    scales aₖ ~ U(0, 2), plus a common shift of size c = 10^U(−1, 1), float64:
        W = X·diag(a) + c·m,   X ~ N(0, 1)^{V×D},  m ~ N(0, I_D),   h ~ N(0, I_D)"""
    seeded = dict(generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    V, D = shape
    out = []
    for _ in range(n_matrices):
        scales = 2 * torch.rand(D, **seeded)
        shift = 10 ** (2 * torch.rand(1, **seeded) - 1)
        W = torch.randn(V, D, **seeded) * scales + shift * torch.randn(D, **seeded)
        H = torch.randn(D, n_hidden, **seeded)
        larger = ((W - W.mean(0)) @ H).abs().amax(0) > (W @ H).abs().amax(0)
        out.append(dict(B_ratio=analyze.b_ratio(W), larger_share=larger.double().mean().item()))
    return out


def binned(scan: list[dict], edges=(*(k / 10 for k in range(11)), math.inf)) -> list[dict]:
    """The scan's mean share per B_ratio bin [lo, hi), empty bins left out."""
    out = []
    for lo, hi in zip(edges, edges[1:]):
        shares = [r["larger_share"] for r in scan if lo <= r["B_ratio"] < hi]
        if shares:
            label = f"[{lo:.1f}, {hi:.1f})" if hi < math.inf else f"≥ {lo:.1f}"
            out.append({"B_ratio": label, "matrices": len(shares),
                        "share of h with max|l*| > max|l|": f"{sum(shares) / len(shares):.3f}"})
    return out


def markdown(title: str, rows: list[dict]) -> str:
    """A titled markdown table of rows with the same keys; a | in a cell is escaped."""
    cell = lambda v: ("yes" if v else "no") if isinstance(v, bool) else "—" if v is None else str(v)
    lines = [list(rows[0]), ["---"] * len(rows[0])] + [[cell(v) for v in r.values()] for r in rows]
    escaped = [" | ".join(text.replace("|", "\\|") for text in line) for line in lines]
    return f"{title}\n\n" + "".join(f"| {line} |\n" for line in escaped)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for audit.md, search.md and scan.md")
    out = Path(p.parse_args(argv).out)
    n_matrices, search = exhaustive_search(ENTRIES, H_ENTRIES)
    tables = dict(
        audit=("The proof (App. B) step by step in exact fractions; holds: the step's claim holds "
               "on that example", theorem4_audit()),
        search=(f"All {n_matrices:,} integer W (V = 3, D = 2, entries in ±{ENTRIES}, μ ≠ 0), each "
                f"with every integer h ≠ 0 in ±{H_ENTRIES}; matrices: how many break the claim; "
                "W, h: the smallest that does (size Σ|Wᵢⱼ|)", search),
        scan=(f"{MATRICES} random anisotropic W (V = 1000, D = 64, seed {SEED}), 500 random h each",
              binned(b_ratio_scan(MATRICES, SEED))))
    out.mkdir(parents=True, exist_ok=True)
    for name, (title, rows) in tables.items():
        text = markdown(title, rows)
        (out / f"{name}.md").write_text(text)
        print(text)
    return {name: rows for name, (_, rows) in tables.items()}


if __name__ == "__main__":
    main()

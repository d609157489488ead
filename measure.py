"""What train.py, analyze.py and the experiments measure of an LM head (notation as in heads.py):
the paper's logit statistics and their bf16 cost, h̄ along μ, and Theorem 4's B₋, B₊, B_ratio."""
import torch

import heads
from heads import precision_stats


def precision_stat_sums(head, h, weight, targets, dtype):
    """precision_stats summed over the tokens whose target is not -1, then their count: (4,)."""
    keep = targets != heads.IGNORE
    kept = precision_stats(head, h[keep], weight, targets[keep], dtype)
    return torch.cat((kept.sum(dim=1), kept.new_tensor([kept.shape[1]])))


# ---- Theorem 4 and B_ratio ------------------------------------------------------------------

def b_bounds(weight):
    """(B₋, B₊, ‖μ‖²) of Eq. 12 for `weight` (V, D), as float64 Python floats: the tight bounds
        ‖μ‖² − B₋ ≤ eᵢ·μ ≤ ‖μ‖² + B₊,   B₋ = ‖μ‖² − minᵢ eᵢ·μ,   B₊ = maxᵢ eᵢ·μ − ‖μ‖²,
    both ≥ 0 as the mean over i of eᵢ·μ is ‖μ‖²."""
    e = weight.detach().to(torch.float64)
    mu = e.mean(dim=0)
    mu_sq, dots = mu @ mu, e @ mu
    return float(mu_sq - dots.min()), float(dots.max() - mu_sq), float(mu_sq)


def b_ratio(weight):
    """B_ratio = max(B₋, B₊) / max(B₋ − ‖μ‖², B₊ + ‖μ‖²) (Eq. 13); 1.0 when μ = 0 (0/0). What
    it says of the logits (Eq. 26, Theorem 4): theorem4.py, the verdict's one home."""
    b_minus, b_plus, mu_sq = b_bounds(weight)
    return max(b_minus, b_plus) / max(b_minus - mu_sq, b_plus + mu_sq) if mu_sq else 1.0

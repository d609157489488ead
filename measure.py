"""What train.py, analyze.py and the experiments measure of an LM head (notation as in heads.py):
the paper's logit statistics and their bf16 cost, h̄ along μ, and Theorem 4's B₋, B₊, B_ratio."""
import torch
import torch.nn.functional as F

import heads

LOGIT_STATS = ("logit_mean", "logit_std", "logit_absmax", "log2Z")
PRECISION_STATS = ("prec_ce_gap", "prec_err_cast", "prec_err_round")


def spread(x):
    """std over the last dimension in two passes, √((1/V) Σᵢ (xᵢ − x̄)²): float32 keeps its digits
    where a common offset x̄ ≫ σ would cancel them in (1/V) Σᵢ xᵢ² − x̄²."""
    return (x - x.mean(dim=-1, keepdim=True)).square_().mean(dim=-1).sqrt_()


def logit_stats(logits):
    """The paper's logit statistics of each row of `logits` (N, V), as float64 (4, N) in the order
    of LOGIT_STATS; for one token's logits l ∈ ℝⱽ:
        l̄ = (1/V) Σᵢ lᵢ,   σ = √((1/V) Σᵢ (lᵢ − l̄)²),   maxᵢ |lᵢ|,   log²Z = (logsumexp l)².
    In float32, each within 1e-5 (relative; l̄: of max|l|) of float64's (tested); no device sync."""
    logits = logits.float()
    absmax = torch.maximum(logits.amax(dim=-1), -logits.amin(dim=-1))
    return torch.stack((logits.mean(dim=-1), spread(logits), absmax,
                        torch.logsumexp(logits, dim=-1).square())).double()


@torch.no_grad()
def precision_stats(head, h, weight, targets, dtype, chunk=64):
    """What a matmul in `dtype` (bf16 under autocast) costs the head, per token of h (N, D) with
    targets (N,) (none -1), as float64 (3, N) in the order of PRECISION_STATS, `chunk` tokens at a
    time. With l⁰ = W·h exact, lᶜ = ⌊W⌋·⌊h⌋ (inputs rounded to `dtype`, exact products),
    lʳ = ⌊⌊W⌋·⌊h⌋⌋ (the head's matmul, its result rounded too) and σ = std over i of l⁰ᵢ:
        prec_err_cast  = std_i(lᶜᵢ − l⁰ᵢ)/σ   input rounding: bf16 keeps 8 bits of each coordinate,
                         so a row eᵢ = μ + (eᵢ − μ) with a large μ keeps few bits of eᵢ − μ
        prec_err_round = std_i(lʳᵢ − lᶜᵢ)/σ   result rounding: coarse at a large l̄ = μ·h (Lemma 1)
        prec_ce_gap    = CE(lʳ) − CE(l⁰) = log Σᵢ pᵢ·e^δᵢ − δ_target,  p = softmax(l⁰), δ = lʳ − l⁰
                         (after the cap): what the loss pays for both
    std over i, not rms: softmax cannot see an error common to all V logits (Prop. 3 (iii)).
    Differences are formed in float32 for a bf16 matmul, float64 for a float32 one (≥ 2¹⁶× finer
    than what is measured): each statistic is within 1e-3 (relative) of float64's (tested)."""
    wide = torch.float64 if dtype == torch.float32 else torch.float32
    rows = []
    with torch.autocast(h.device.type, enabled=False):
        w_low, w_exact = weight.float().to(dtype), weight.float().to(wide)
        w_cast = w_exact if dtype == torch.float32 else w_low.to(wide)
        for h_c, t_c in zip(h.float().split(chunk), targets.split(chunk)):  # a chunk of tokens
            exact, h_low = F.linear(h_c.to(wide), w_exact), h_c.to(dtype)
            cast = exact if w_cast is w_exact else F.linear(h_low.to(wide), w_cast)
            rounded = F.linear(h_low, w_low).to(wide)
            capped = head.cap_logits(exact)
            delta = (head.cap_logits(rounded) - capped).float()
            delta -= delta.mean(dim=-1, keepdim=True)  # softmax cannot see a common part: drop it
            p = torch.softmax(capped.float(), dim=-1)  # Σ p = 1 up to rounding, divided out below
            ce_gap = (torch.log1p((p * torch.expm1(delta)).sum(dim=-1) / p.sum(dim=-1))
                      - delta.gather(-1, t_c.unsqueeze(-1)).squeeze(-1))
            sigma = spread(exact.float()).clamp(min=torch.finfo(torch.float32).tiny)
            rows.append(torch.stack((ce_gap, spread((cast - exact).float()) / sigma,
                                     spread((rounded - cast).float()) / sigma)))
    return torch.cat(rows, dim=1).double()


def precision_stat_sums(head, h, weight, targets, dtype):
    """precision_stats summed over the tokens whose target is not -1, then their count: (4,)."""
    keep = targets != heads.IGNORE
    kept = precision_stats(head, h[keep], weight, targets[keep], dtype)
    return torch.cat((kept.sum(dim=1), kept.new_tensor([kept.shape[1]])))


def mean_state_alignment(h_mean, weight):
    """How the mean hidden state h̄ lines up with μ̂ = μ/‖μ‖, as float64 0-d tensors
        (h̄·μ̂, cos(h̄, μ)) = (h̄·μ̂, h̄·μ̂/‖h̄‖),   both 0 where μ = 0 or h̄ = 0.
    Lemma 1 averaged over tokens gives l̄ = μ·h̄ = ‖μ‖·(h̄·μ̂): h̄·μ̂ is what turns a long μ into
    a large mean logit (in the authors' run table, the degraded 16M baseline at η = 0.3:
    l̄/‖μ‖ = 1152/331.471 ≈ 3.5)."""
    tiny = torch.finfo(torch.float64).tiny
    h_mean, mu = h_mean.double(), heads.mean_embedding(weight).double()
    proj = h_mean @ (mu / mu.norm().clamp(min=tiny))
    return proj, proj / h_mean.norm().clamp(min=tiny)


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

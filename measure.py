"""What train.py, analyze.py and the experiments measure of an LM head: the paper's per-token
logit statistics, what a bf16 matmul costs them, how the mean hidden state lines up with μ, and
the bounds B₋, B₊ and B_ratio of Theorem 4. Notation as in heads.py."""
import torch
import torch.nn.functional as F

import heads

LOGIT_STATS = ("logit_mean", "logit_std", "logit_absmax", "log2Z")  # the order of logit_stat_sums


def logit_stat_sums(logits):
    """The paper's per-token logit statistics, summed over the N rows of `logits` (N, V), as a
    float64 tensor in the order of LOGIT_STATS. For one token's logits l ∈ ℝⱽ:
        l̄ = (1/V) Σᵢ lᵢ,   σ = √((1/V) Σᵢ (lᵢ − l̄)²),   maxᵢ |lᵢ|,   log²Z = (logsumexp l)².
    Sums, so that chunks and processes add up; divided by the token count they are the means
    over tokens that the paper reports (Sec. 3). No .item(): no device sync."""
    std, mean = torch.std_mean(logits, dim=-1, correction=0)
    log_z = torch.logsumexp(logits, dim=-1)
    per_token = torch.stack((mean, std, logits.abs().amax(dim=-1), log_z.square()))
    return per_token.double().sum(dim=1)


def mean_state_alignment(h_mean, weight):
    """How the mean hidden state h̄ lines up with μ̂ = μ/‖μ‖, as float64 0-d tensors
        (h̄·μ̂, cos(h̄, μ)) = (h̄·μ̂, h̄·μ̂/‖h̄‖),   both 0 where μ = 0 or h̄ = 0.
    Lemma 1 averaged over tokens gives l̄ = μ·h̄ = ‖μ‖·(h̄·μ̂): h̄·μ̂ is what turns a long μ into
    a large mean logit (the published 16M baseline at η = 0.3: 1152/331 ≈ 3.5)."""
    tiny = torch.finfo(torch.float64).tiny
    h_mean, mu = h_mean.double(), heads.mean_embedding(weight).double()
    proj = h_mean @ (mu / mu.norm().clamp(min=tiny))
    return proj, proj / h_mean.norm().clamp(min=tiny)


PRECISION_STATS = ("prec_ce_gap", "prec_err_cast", "prec_err_round")  # order of the sums below


@torch.no_grad()
def precision_stat_sums(head, h, weight, targets, dtype):
    """What the LM head loses to a matmul in `dtype` (bf16 under autocast), summed over the N
    tokens of h (N, D) with targets (N,) ≠ -1, as float64 in the order of PRECISION_STATS,
    followed by the token count. With l⁰ = W·h exact (float64 products of the float32 inputs),
    lᶜ = ⌊W⌋·⌊h⌋ (inputs rounded to `dtype`, exact products), lʳ = ⌊⌊W⌋·⌊h⌋⌋ (the matmul the
    head runs, its result rounded too) and σ = std over i of l⁰ᵢ:
        prec_err_cast  = std_i(lᶜᵢ − l⁰ᵢ)/σ   input rounding: bf16 keeps 8 significant bits of
                         each coordinate, so a row eᵢ = μ + (eᵢ − μ) with a large μ keeps few
                         bits of its own part eᵢ − μ, and h rounds likewise
        prec_err_round = std_i(lʳᵢ − lᶜᵢ)/σ   result rounding: each logit keeps 8 bits at its own
                         magnitude, so a large common offset l̄ = μ·h (Lemma 1) rounds coarsely
        prec_ce_gap    = CE(lʳ) − CE(l⁰)      what the loss pays for both (through the cap)
    std over i, not rms: the part of an error common to all V logits of a token shifts them
    together, which softmax and the loss cannot see (heads' Prop. 3 (iii)); what is left is
    what they can. Measured: ~5e-7 in float32, ~2e-3 to 1e-2 in bf16 for a trained head with
    l̄ of a few units; μ = 0 removes the common offset's part of the rounding."""
    f64 = torch.float64
    exact = h.float().to(f64) @ weight.float().to(f64).t()
    h_low, w_low = h.float().to(dtype), weight.float().to(dtype)
    cast = h_low.to(f64) @ w_low.to(f64).t()
    rounded = F.linear(h_low, w_low).to(f64)
    sigma = exact.std(dim=-1, correction=0).clamp(min=torch.finfo(f64).tiny)
    keep, target_col = targets != heads.IGNORE, targets.clamp(min=0).unsqueeze(-1)

    def token_ce(logits):
        logits = head.cap_logits(logits)
        return torch.logsumexp(logits, dim=-1) - logits.gather(-1, target_col).squeeze(-1)

    def visible(error):  # the error's spread over the V logits of each token, over σ
        return error.std(dim=-1, correction=0) / sigma

    per_token = torch.stack((token_ce(rounded) - token_ce(exact), visible(cast - exact),
                             visible(rounded - cast)))
    sums = torch.where(keep, per_token, 0.0).sum(dim=1)
    return torch.cat((sums, keep.sum().to(f64).unsqueeze(0)))


# ---------------------------------------------------------------------------------------------
# Theorem 4 and B_ratio

def b_bounds(weight):
    """(B₋, B₊, ‖μ‖²) of Eq. 12 for `weight` (V, D), as float64 Python floats: the tight bounds
        ‖μ‖² − B₋ ≤ eᵢ·μ ≤ ‖μ‖² + B₊,   B₋ = ‖μ‖² − minᵢ eᵢ·μ,   B₊ = maxᵢ eᵢ·μ − ‖μ‖²,
    both ≥ 0 because the mean over i of eᵢ·μ is μ·μ = ‖μ‖²."""
    e = weight.detach().to(torch.float64)
    mu = e.mean(dim=0)
    mu_sq, dots = mu @ mu, e @ mu
    return float(mu_sq - dots.min()), float(dots.max() - mu_sq), float(mu_sq)


def b_ratio(weight):
    """B_ratio = max(B₋, B₊) / max(B₋ − ‖μ‖², B₊ + ‖μ‖²) (Eq. 13); 1.0 when μ = 0 (0/0).

    Since e*ᵢ·μ = eᵢ·μ − ‖μ‖² ∈ [−B₋, B₊] (Eq. 24), B_ratio = maxᵢ|e*ᵢ·μ| / maxᵢ|eᵢ·μ| (Eq. 26):
    for h = μ, B_ratio ≤ 1 ⇔ max|l*ᵢ| ≤ max|lᵢ|. Theorem 4 (Eq. 14) states it for any h: exact
    for h ∥ μ only; for other h either direction can fail (theorem4.py: the verdict, the proof).
    """
    b_minus, b_plus, mu_sq = b_bounds(weight)
    if mu_sq == 0:
        return 1.0
    return max(b_minus, b_plus) / max(b_minus - mu_sq, b_plus + mu_sq)

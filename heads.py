"""The language-modeling head in five variants, after the paper *Output Embedding Centering
for Stable LLM Pretraining*. Torch only; copy this file alone into any project.

    head = build("mu_center")                  # or baseline, soft_cap, z_loss, mu_loss
    loss, stats = head(h, weight, targets)     # h (..., D), weight (V, D), targets (...)
    loss.backward(); optimizer.step()
    head.after_step(weight)                    # μ-centering acts here; the others do nothing

Notation. eᵢ ∈ ℝᴰ is row i of the V × D output embedding `weight`, h ∈ ℝᴰ a final hidden state,
lᵢ = eᵢ·h the logits (Eq. 3), Z = Σⱼ exp(lⱼ) (Eq. 4), log Z = logsumexp(l), the cross-entropy
of target t is log Z − l_t, μ = (1/V) Σᵢ eᵢ the mean output embedding (Eq. 7, over all V rows,
padded rows included) and l̄ = (1/V) Σᵢ lᵢ the mean logit (Eq. 8).

Lemma 1 (mean logit = μ·h).
    l̄ = (1/V) Σᵢ eᵢ·h = ((1/V) Σᵢ eᵢ)·h = μ·h            (linearity of the dot product)

Lemma 2 (logit range).  |lⱼ| = |eⱼ·h| ≤ ‖eⱼ‖·‖h‖ ≤ maxᵢ‖eᵢ‖·‖h‖   (Cauchy–Schwarz)
    The bound is attained for the worst unit h: sup over ‖h‖ = 1 of maxⱼ|lⱼ| = maxᵢ‖eᵢ‖.
    For one given h it is only an upper bound (see Theorem 4 at `b_ratio`).

So a common shift μ of all rows (anisotropy) moves every logit by μ·h, and the row norms set
how far logits can go: the motivation for centering the output embeddings.

Variants (`HEADS`; defaults in `DEFAULTS`):
    baseline   loss = CE
    soft_cap   lᵢ ← c·tanh(lᵢ/c) inside the model (logits() is capped too), loss = CE
    z_loss     loss = CE + λ·mean over tokens of log²Z
    mu_loss    loss = CE + λ·μ·μ
    mu_center  loss = CE; after each optimizer step eᵢ ← eᵢ − μ

Numerics: the matmul may run in bf16 (autocast, or bf16 h / weight), but the logits are upcast
and softmax, log Z, CE and the regularisers are computed in float32 (float64 stays float64).
CE is the mean over tokens whose target is not -1; if every target is -1 the mean over no
tokens is defined as 0 (loss 0 for all but mu_loss, whose weight term does not depend on tokens),
so a fully masked micro-batch contributes nothing and produces no NaN. Target ids must lie in
[0, V) or be -1; they are not checked here, because checking needs a device sync.
`cross_entropy_and_log_z` is the plain reference path that every variant shares;
`chunked_loss` (end of file) computes the same loss and gradients chunk by chunk, never holding
the N × V logits; `head.chunk_size = 2048` switches a head over to it.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

HEADS = ("baseline", "soft_cap", "z_loss", "mu_loss", "mu_center")
DEFAULTS = {"cap": 30.0, "lam": 1e-4}  # c of Gemma 2 (Eq. 6); λ of Eq. 5 and Eq. 16
HPARAMS = {"baseline": (), "soft_cap": ("cap",), "z_loss": ("lam",), "mu_loss": ("lam",),
           "mu_center": ()}
IGNORE = -1  # target id that contributes nothing to the loss


# ---------------------------------------------------------------------------------------------
# shared math

def _compute_dtype(dtype):
    """float32 for bf16/fp16/float32, float64 for float64: softmax never runs below float32."""
    return torch.promote_types(dtype, torch.float32)


def mean_embedding(weight):
    """μ = (1/V) Σᵢ eᵢ over all V rows of `weight` (Eq. 7), in at least float32."""
    return weight.mean(dim=0, dtype=_compute_dtype(weight.dtype))


def token_mean(values, keep):
    """Mean of `values` over the tokens where `keep` is True; 0 when no token is kept."""
    return torch.where(keep, values, 0.0).sum() / keep.sum().clamp(min=1)


def cross_entropy_and_log_z(logits, targets):
    """The reference loss path shared by all variants.

    logits (N, V) in float32 or float64, targets (N,) with -1 = ignore. Returns
    (ce, log_z, keep): ce = mean over kept tokens of log Z − l_t (Eq. 1–2, −log p_t),
    log_z (N,) = log Σⱼ exp(lⱼ) per token, keep (N,) bool = targets ≠ -1.
    """
    keep = targets != IGNORE
    log_z = torch.logsumexp(logits, dim=-1)
    target_logit = logits.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return token_mean(log_z - target_logit, keep), log_z, keep


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


PRECISION_STATS = ("prec_ce_gap", "prec_err_cast", "prec_err_round")  # order of the sums below


@torch.no_grad()
def precision_stat_sums(head, h, weight, targets, dtype):
    """What the LM head loses to a matmul in `dtype` (bf16 under autocast), summed over the N
    tokens of h (N, D) with targets (N,) ≠ -1, as float64 in the order of PRECISION_STATS,
    followed by the token count. Three versions of one token's logits:
        l⁰ = W·h           exact: float64 products of the float32 weights and hidden state
        lᶜ = ⌊W⌋·⌊h⌋       W and h rounded to `dtype` (⌊·⌋), then exact float64 products
        lʳ = ⌊⌊W⌋·⌊h⌋⌋     what the head runs: the matmul in `dtype`, its result rounded too
    and, with σ = std over i of l⁰ᵢ (the informative spread of the logits),
        prec_err_cast  = rms_i(lᶜᵢ − l⁰ᵢ) / σ    rounding of the *inputs*: a row eᵢ = μ + (eᵢ − μ)
                         is stored with a spacing set by its largest coordinates, so a large
                         common shift μ drowns the rows' informative part (eᵢ − μ)
        prec_err_round = rms_i(lʳᵢ − lᶜᵢ) / σ    rounding of the *result*: bf16 keeps 8
                         significant bits, so a logit lᵢ = l̄ + (lᵢ − l̄) far from 0 (a large
                         common offset l̄ = μ·h, Lemma 1) is stored coarsely
        prec_ce_gap    = CE(lʳ) − CE(l⁰)         what the loss pays for both (signed)
    CE goes through the head's own capping, so soft_cap is measured as it trains. In float32
    all three are ~1e-7, in bf16 ~1e-3 for a well-centred head; μ-centering sets μ = 0 and
    l̄ = 0, which removes the part of both errors that the common shift causes."""
    exact, dtype64 = h.float().double() @ weight.float().double().t(), torch.float64
    h_low, w_low = h.float().to(dtype), weight.float().to(dtype)
    cast = h_low.to(dtype64) @ w_low.to(dtype64).t()
    rounded = F.linear(h_low, w_low).to(dtype64)
    sigma = exact.std(dim=-1, correction=0).clamp(min=torch.finfo(dtype64).tiny)
    keep = targets != IGNORE
    t = targets.clamp(min=0).unsqueeze(-1)

    def token_ce(logits):
        logits = head.cap_logits(logits)
        return torch.logsumexp(logits, dim=-1) - logits.gather(-1, t).squeeze(-1)

    def rms(diff):
        return diff.square().mean(dim=-1).sqrt() / sigma

    per_token = torch.stack((token_ce(rounded) - token_ce(exact), rms(cast - exact),
                             rms(rounded - cast)))
    sums = torch.where(keep, per_token, 0.0).sum(dim=1)
    return torch.cat((sums, keep.sum().to(dtype64).unsqueeze(0)))


# ---------------------------------------------------------------------------------------------
# the heads

class Head(nn.Module):
    """Baseline LM head: lᵢ = eᵢ·h, loss = mean CE over targets ≠ -1 (Eq. 1–3).

    A variant overrides at most three hooks: `cap_logits` (model intervention),
    `regulariser` (the added loss term) and `after_step` (a parameter update after the
    optimizer step). A head has no parameters of its own: the output embedding `weight` is
    passed in, so the same head serves tied and untied models.
    """
    name = "baseline"
    chunk_size = None  # None: the plain path below; a number of tokens: chunked_loss (end of file)

    def __init__(self, cap=None, lam=None):
        super().__init__()
        self.cap, self.lam = cap, lam

    def extra_repr(self):
        return ", ".join(f"{k}={getattr(self, k)}" for k in HPARAMS[self.name])

    def cap_logits(self, logits):
        return logits

    def regulariser(self, weight, log_z, keep):
        """The term added to CE (0-dim tensor), or None where the variant adds nothing."""
        return None

    def logits(self, h, weight):
        """Logits over the whole vocabulary, (..., V), upcast to at least float32."""
        logits = F.linear(h, weight)
        return self.cap_logits(logits.to(_compute_dtype(logits.dtype)))

    def forward(self, h, weight, targets):
        """(loss, stats): loss = CE + regulariser (scalar, with grad); stats holds detached
        0-dim tensors `ce` and `reg` (no .item(): no device sync on the hot path)."""
        if self.chunk_size is not None:  # same result without the N × V logits
            return chunked_loss(self, h, weight, targets, self.chunk_size)
        logits = self.logits(h, weight)
        ce, log_z, keep = cross_entropy_and_log_z(logits.reshape(-1, logits.shape[-1]),
                                                  targets.reshape(-1))
        reg = self.regulariser(weight, log_z, keep)
        if reg is None:  # the loss is ce itself, not ce + 0: torch.compile (2.13) folds ce + 0
            # into an alias of ce, which then loses its grad next to the ce.detach() of the stats
            return ce, {"ce": ce.detach(), "reg": torch.zeros_like(ce)}
        return ce + reg, {"ce": ce.detach(), "reg": reg.detach()}

    @torch.no_grad()
    def after_step(self, weight):
        """Called after every optimizer step; only mu_center changes `weight`."""


class SoftCap(Head):
    """Logit soft-capping (Gemma 2, Eq. 6): lᵢ ← c·tanh(lᵢ/c), applied between Eq. 3 and Eq. 2.

    A model intervention: `logits()` returns capped logits, so evaluation and sampling see
    them too. |lᵢ| < c for every input, and for |l| ≪ c, c·tanh(l/c) = l − l³/(3c²) + …, so
    small logits pass almost unchanged. tanh is odd, c·tanh(−l/c) = −c·tanh(l/c): positive
    and negative divergences are treated alike (Table 1, symmetric).
    """
    name = "soft_cap"

    def cap_logits(self, logits):
        return self.cap * torch.tanh(logits / self.cap)


class ZLoss(Head):
    """z-loss (PaLM, Eq. 4–5): loss = CE + λ·mean over kept tokens of log²Z, Z = Σⱼ exp(lⱼ).

    It pulls log Z towards 0 (Z towards 1). It is not symmetric in the logits (Eq. 17–18).
    View it as a function of one logit lᵢ with the others fixed, S = Σ_{j≠i} exp(lⱼ) > 0:
        L_z(lᵢ) ∝ log²(exp(lᵢ) + S)
        lᵢ → +∞:  log(exp(lᵢ) + S) ≈ lᵢ           so L_z grows like lᵢ²
        lᵢ → −∞:  log(exp(lᵢ) + S) → log S         so L_z stays at log²S
    hence L_z(lᵢ) ≠ L_z(−lᵢ) in general; e.g. S = 1: L_z(2) = log²(e²+1) ≈ 4.52 but
    L_z(−2) = log²(e⁻²+1) ≈ 0.016. Only in the limit S → 0 (all other logits → −∞) does
    log(exp(lᵢ)) = lᵢ make it even. For the whole logit vector, l → −l changes log Z unless
    the logits are already symmetric: a positive divergence is penalised, a negative one
    (all logits → −∞, Z → 0) only once every logit diverges (App. D).
    """
    name = "z_loss"

    def regulariser(self, weight, log_z, keep):
        return self.lam * token_mean(log_z.square(), keep)


class MuLoss(Head):
    """μ-loss (Eq. 15–16): loss = CE + λ·μ·μ, μ = (1/V) Σᵢ eᵢ over all V rows.

    Gradient on each row: μ·μ = ‖(1/V) Σₖ eₖ‖², and ∂μ/∂eᵢ = (1/V)·I, so
        ∂(λ μ·μ)/∂eᵢ = 2λ μ · ∂μ/∂eᵢ = 2λμ/V      for every i.
    The same vector for every row: a gradient step moves all rows by −η·2λμ/V, i.e. it
    shrinks μ itself (μ ← μ(1 − 2ηλ/V) under SGD) and leaves the centred rows eᵢ − μ
    untouched: a uniform pull of all rows towards centering, an approximate μ-centering.
    (Adam rescales each coordinate, so there the pull is uniform across rows but not
    exactly proportional to μ.) Quadratic in μ, so invariant under μ → −μ, and by Lemma 1
    under l̄ → −l̄ (Table 1, symmetric).
    """
    name = "mu_loss"

    def regulariser(self, weight, log_z, keep):
        mu = mean_embedding(weight)
        return self.lam * (mu @ mu)


class MuCenter(Head):
    """μ-centering (Eq. 11): after every optimizer step eᵢ ← e*ᵢ = eᵢ − μ; loss = plain CE.

    Proposition 3. Let l*ᵢ = e*ᵢ·h be the logits after centering, for any h.
    (i)  mean logit 0:  by Lemma 1, l̄* = μ*·h, and μ* = (1/V) Σᵢ (eᵢ − μ) = μ − μ = 0,
         so l̄* = 0.
    (ii) std unchanged:  l*ᵢ = eᵢ·h − μ·h = lᵢ − l̄ (Lemma 1): every logit of a token moves
         by the same constant l̄, and σ² = (1/V) Σᵢ (lᵢ − l̄)² is shift-invariant:
         (1/V) Σᵢ (l*ᵢ − l̄*)² = (1/V) Σᵢ (lᵢ − l̄ − 0)² = σ².
    (iii) softmax and loss unchanged:  exp(lᵢ − l̄) / Σⱼ exp(lⱼ − l̄)
         = exp(−l̄)·exp(lᵢ) / (exp(−l̄)·Σⱼ exp(lⱼ)) = pᵢ, so −log p_t is unchanged.  ∎
    So centering changes nothing the model computes; it removes the common shift that
    Adam's second moment builds up in the output embeddings. What it does to the largest
    logit is the subject of Theorem 4, see `b_ratio` (the paper's claim needs care).
    """
    name = "mu_center"

    @torch.no_grad()
    def after_step(self, weight):
        weight.sub_(mean_embedding(weight).to(weight.dtype))


_CLASSES = {cls.name: cls for cls in (Head, SoftCap, ZLoss, MuLoss, MuCenter)}


def _checked(name, key, value):
    """The hyperparameter as a float, or ValueError saying what is wrong and what is valid."""
    rule = "a finite number > 0" if key == "cap" else "a finite number >= 0"
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: {key}={value!r} is not a number; give {rule}.") from None
    if not math.isfinite(value) or value < 0 or (key == "cap" and value == 0):
        raise ValueError(f"{name}: {key}={value!r} is invalid; give {rule}.")
    return value


def build(name, **hparams):
    """The head called `name` (one of HEADS) with hyperparameters `cap` (soft_cap) or `lam`
    (z_loss, mu_loss); a value of None means the default of DEFAULTS. A hyperparameter the
    head does not use is accepted only as None (so a CLI can pass lam=None, cap=None)."""
    if name not in _CLASSES:
        raise ValueError(f"unknown head {name!r}; choose one of {', '.join(HEADS)}.")
    kwargs = {}
    for key, value in hparams.items():
        if key not in DEFAULTS:
            raise ValueError(f"unknown hyperparameter {key!r}; valid ones are {', '.join(DEFAULTS)}"
                             " (cap for soft_cap, lam for z_loss and mu_loss).")
        if value is not None and key not in HPARAMS[name]:
            users = " and ".join(n for n in HEADS if key in HPARAMS[n])
            raise ValueError(f"head {name!r} does not use {key}={value!r}; {key} applies to "
                             f"{users} only (leave it unset or None for {name}).")
    for key in HPARAMS[name]:
        value = hparams.get(key)
        kwargs[key] = DEFAULTS[key] if value is None else _checked(name, key, value)
    return _CLASSES[name](**kwargs)


# ---------------------------------------------------------------------------------------------
# Theorem 4 and B_ratio

def b_ratio(weight):
    """B_ratio of the paper (Eq. 12–13) for an output embedding `weight` (V, D), in float64.

        B₋ = ‖μ‖² − minᵢ eᵢ·μ ≥ 0,   B₊ = maxᵢ eᵢ·μ − ‖μ‖² ≥ 0   (tight bounds of Eq. 12;
                                     both ≥ 0 because the mean of eᵢ·μ is μ·μ = ‖μ‖²)
        B_ratio = max(B₋, B₊) / max(B₋ − ‖μ‖², B₊ + ‖μ‖²)
    Returns 1.0 when μ = 0 (then 0/0: centering changes nothing).

    What B_ratio is.  e*ᵢ·μ = eᵢ·μ − ‖μ‖² lies in [−B₋, B₊] (Eq. 24), and for an interval
    [a, b] with b ≥ 0, max|x| = max(−a, b); so with the tight bounds (Eq. 25)
        maxᵢ|eᵢ·μ|  = max(B₋ − ‖μ‖², B₊ + ‖μ‖²),   maxᵢ|e*ᵢ·μ| = max(B₋, B₊),
        B_ratio = maxᵢ|e*ᵢ·μ| / maxᵢ|eᵢ·μ|                                         (Eq. 26)
    (with loose bounds Eq. 25 is only "≤" and Eq. 13 is not Eq. 26: E₁ below with the valid
    but loose B₋ = 1 instead of the tight 1/9 gives 9/8 > 1 instead of 2/3).
    With h = μ the logits are lᵢ = eᵢ·μ and l*ᵢ = e*ᵢ·μ, so
        B_ratio ≤ 1  ⇔  max|l*ᵢ| ≤ max|lᵢ|   for h ∥ μ                             (i)
    — true, but a restatement of the definition in the single direction of μ.

    Theorem 4 claims (Eq. 14): B_ratio ≤ 1 ⇔ max|l*ᵢ| ≤ max|lᵢ|. Checked step by step (App. B)
    on random anisotropic matrices and by exhaustive search over V = 3, D = 2 with entries in
    {−2, …, 2}; the counterexamples below are the smallest found (tests/test_heads.py keeps
    each one). Writing aᵢ = eᵢ·μ̂ (μ̂ = μ/‖μ‖) and pᵢ = eᵢ − aᵢμ̂, centering maps aᵢ → aᵢ − ‖μ‖
    and leaves pᵢ alone, so ‖e*ᵢ‖² = ‖eᵢ‖² − 2eᵢ·μ + ‖μ‖².
      Eq. 24–28: correct (tight bounds; μ ≠ 0).
      Eq. 32 is false: maxᵢ(xᵢ + yᵢ) ≤ maxᵢ xᵢ + maxᵢ yᵢ with equality only if one row maximises
        both the parallel and the perpendicular part. E₁ = [[−1,0],[0,−1],[0,1]], μ = (−1/3, 0):
        e* = (−2/3,0), (1/3,−1), (1/3,1); maxᵢ‖e*ᵢ‖² = 10/9 but max‖e*∥‖² + max‖e*⊥‖² = 4/9 + 1.
      Eq. 33 mixes μ̂ with μ and squared with unsquared terms; its correct form
        maxᵢ(e*ᵢ·μ̂)² − maxᵢ(eᵢ·μ̂)² ≤ 0 follows from Eq. 28, but it bounds the parallel parts
        only, and without Eq. 32 it says nothing about the norms. As printed it is not even
        ≤ 0: for E₁, maxᵢ|e*ᵢ·μ̂| − maxᵢ|eᵢ·μ| = 2/3 − 1/3 = 1/3 > 0 although B_ratio = 2/3.
      Eq. 34 is false: E₁ has B_ratio = 2/3 ≤ 1 yet maxᵢ‖e*ᵢ‖ = √10/3 > 1 = maxᵢ‖eᵢ‖
        (row 2 has e₂·μ = 0 < ‖μ‖²/2, so its norm grows).
      Eq. 34 → 35 (Lemma 2) is false: Lemma 2 is an upper bound, and a smaller bound does not
        make a given h's largest logit smaller. E₂ = [[−1,0],[−1,0],[0,−1]], h = (−3, 2):
        max‖e*‖² = 8/9 ≤ 1 = max‖e‖² and B_ratio = 1/3, yet l = (3, 3, −2), l* = (5/3, 5/3,
        −10/3): max|l*| = 10/3 > 3 = max|l|.
      Eq. 14 ⇒, for a given h: false (E₂ with h = (−3, 2); E₁ with h = (1, −3): 10/3 > 3).
        Hence ⇒ also fails when read as "for every h".
      Eq. 14 ⇐, for a given h: false. E₃ = [[−1,−1],[−1,1],[1,0]], μ = (−1/3, 0), B_ratio = 4/3,
        and h = (0, 1) ⊥ μ gives l* = l = (−1, 1, 0) (any h ⊥ μ has l* = l). "Reversing the
        logic" also fails because E₃ has max‖e*‖² = 16/9 ≤ 2 = max‖e‖²: a shrinking Lemma-2
        bound does not imply B_ratio ≤ 1 either.
      Eq. 14 ⇐, read as "for every h": true, trivially, by taking h = μ in (i).
    None of this can happen for V = 2 (e*₁ = −e*₂ = (e₁ − e₂)/2, so |l*| ≤ max|l| always) or
    D = 1 (l* = h·(eᵢ − μ), so Eq. 14 is exactly (i) for h ≠ 0): V = 3, D = 2 is the smallest
    size for every counterexample.

    What does hold, for every h and every matrix:
      (ii)  l*ᵢ = lᵢ − l̄ (Lemma 1), so max|l*ᵢ| ≤ max|lᵢ| ⇔ max|lᵢ − l̄| ≤ max|lᵢ|: the
            criterion is the ratio of Eq. 26 with eᵢ·μ replaced by this h's logits eᵢ·h;
            and always max|l*ᵢ| ≤ maxᵢ lᵢ − minᵢ lᵢ ≤ 2·max|lᵢ|.
      (iii) (1/V) Σᵢ l*ᵢ² = (1/V) Σᵢ lᵢ² − l̄²  and  (1/V) Σᵢ ‖e*ᵢ‖² = (1/V) Σᵢ ‖eᵢ‖² − ‖μ‖²:
            centering always lowers the root-mean-square logit and row norm (by the removed
            mean), but not necessarily the maximum.
      (iv)  maxᵢ‖e*ᵢ‖ ≤ maxᵢ‖eᵢ‖ ⇔ the Lemma-2 bound shrinks ⇔ the worst case over unit h
            shrinks (sup over ‖h‖ = 1 of max|lᵢ| = maxᵢ‖eᵢ‖); row i's norm shrinks exactly
            when eᵢ·μ ≥ ‖μ‖²/2, so minᵢ eᵢ·μ ≥ ‖μ‖²/2 is a sufficient condition for it.
    So B_ratio ≤ 1 (the paper's App. C finds it for trained untied models) is evidence that
    centering shrinks the logit range along μ, the direction of the common shift; it is not
    a guarantee for the largest logit of every token. The failures are not corner cases: on
    random anisotropic matrices with B_ratio ≤ 1 (V = 1000, D = 64, random shifts) a random h
    gets a larger max|l*| about a fifth to two fifths of the time.
    """
    e = weight.detach().to(torch.float64)
    mu = e.mean(dim=0)
    mu2 = mu @ mu
    if mu2 == 0:
        return 1.0
    dots = e @ mu
    b_minus, b_plus = mu2 - dots.min(), dots.max() - mu2
    return float(torch.maximum(b_minus, b_plus) / torch.maximum(b_minus - mu2, b_plus + mu2))


# ---------------------------------------------------------------------------------------------
# the chunked loss path: the same loss and gradients without the N × V logits
#
# The plain path above is the readable reference. It builds all N × V logits, and autograd keeps
# them (plus their float32 copy and softmax) alive until the backward pass: at V = 50304 the
# largest tensors of a small model's step. Because the loss is a scalar, the gradient of a
# chunk's logits is known as soon as its softmax is, so the chunked path computes it right away,
# folds it into ∂L/∂h and ∂L/∂W, and drops the chunk. Backward then only scales the two stored
# gradients by the incoming one (1.0 in training). Switch it on per head:
#     head.chunk_size = 2048      # tokens per chunk; None (default) = the plain path

CHUNK_SIZE = 2048  # tokens per chunk: 2048 × 50304 float32 logits ≈ 0.4 GB per live buffer


class _ChunkedSoftmaxLoss(torch.autograd.Function):
    """L = (1/n) Σ_r [CE_r + λ·log²Z_r] over the n tokens r whose target t_r ≠ -1, and ∂L/∂h, ∂L/∂W.

    Per token r, in chunks of rows of h (N, D) against weight W (V, D):
        a_r = W·h_r                      raw logits: matmul in bf16 under autocast, then float32
        l_r = c·tanh(a_r/c)              with a soft-cap c; l_r = a_r without one
        log Z_r = log Σⱼ exp(l_rj),      p_r = softmax(l_r) = exp(l_r − log Z_r)
        CE_r = log Z_r − l_r,t           z_r = λ·log²Z_r  (λ = 0 unless z-loss)

    Gradient w.r.t. the logits, one term at a time:
        ∂CE_r/∂l_rj = p_rj − [j = t_r]                    (softmax minus one-hot)
        ∂z_r/∂l_rj  = 2λ·log Z_r · ∂log Z_r/∂l_rj = 2λ·log Z_r · p_rj
        ∂l_rj/∂a_rj = c · (1/c)·(1 − tanh²(a_rj/c)) = 1 − tanh²(a_rj/c)   (1 without a cap)
    so  g_r := ∂L/∂a_r = (1/n)·[(1 + 2λ·log Z_r)·p_r − onehot(t_r)] ⊙ (1 − tanh²(a_r/c)),
    and g_r = 0 for ignored tokens. With G the chunk's rows g_r stacked (C × V), H its rows h_r:
        ∂L/∂H = G·W          (a_r = W·h_r is linear in h_r)
        ∂L/∂W = Σ_chunks Gᵀ·H (accumulated in float32 across chunks)
    """

    @staticmethod
    def forward(ctx, h, weight, targets, cap, lam, chunk_size, matmul_dtype):
        n = (targets != IGNORE).sum().clamp(min=1)  # 0 kept tokens: loss 0, as token_mean
        want_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        w = weight.to(matmul_dtype)
        sums = torch.zeros(2, dtype=_compute_dtype(matmul_dtype), device=h.device)  # Σ CE, Σ log²Z
        grad_h_chunks = []
        grad_w = torch.zeros_like(weight, dtype=sums.dtype) if want_grad else None
        for start in range(0, h.shape[0], chunk_size):
            h_c = h[start:start + chunk_size].to(matmul_dtype)
            chunk_sums, g = _chunk_sums_and_grad(h_c, w, targets[start:start + chunk_size], n,
                                                 cap, lam, want_grad)
            sums += chunk_sums
            if want_grad:
                grad_h_chunks.append(g @ w)
                grad_w += (g.t() @ h_c).to(grad_w.dtype)
        ce, reg = sums[0] / n, lam * sums[1] / n
        if want_grad:
            ctx.save_for_backward(torch.cat(grad_h_chunks).to(h.dtype), grad_w.to(weight.dtype))
        ctx.mark_non_differentiable(ce, reg)
        return ce + reg, ce, reg

    @staticmethod
    def backward(ctx, grad_loss, _grad_ce, _grad_reg):
        grad_h, grad_w = ctx.saved_tensors
        return grad_loss * grad_h, grad_loss * grad_w, None, None, None, None, None


def _chunk_sums_and_grad(h_c, w, targets, n, cap, lam, want_grad):
    """One chunk of _ChunkedSoftmaxLoss: (Σ CE_r, Σ log²Z_r) over its kept tokens, and its
    g = ∂L/∂a (C × V, in the matmul dtype; None when no gradient is wanted). Working in place
    keeps one C × V float32 buffer alive, two with a soft-cap: every extra one costs a pass
    over memory, which is what an LM head at large V is bound by."""
    keep = targets != IGNORE
    t_c = targets.clamp(min=0).unsqueeze(1)
    logits = (h_c @ w.t()).to(_compute_dtype(w.dtype))  # a fresh tensor: safe to change in place
    if cap is not None:
        logits.div_(cap).tanh_().mul_(cap)  # l = c·tanh(a/c)
    log_z = torch.logsumexp(logits, dim=1)
    ce = torch.where(keep, log_z - logits.gather(1, t_c).squeeze(1), 0.0)
    sums = torch.stack([ce.sum(), torch.where(keep, log_z.square(), 0.0).sum()])
    if not want_grad:
        return sums, None
    # ∂l/∂a = 1 − tanh²(a/c) = 1 − (l/c)², taken before the logits become g below
    cap_slope = (logits / cap).square_().neg_().add_(1) if cap is not None else None
    row_scale = keep.to(logits.dtype) / n  # 1/n for kept tokens, 0 for ignored ones
    g = logits.sub_(log_z.unsqueeze(1)).exp_()  # p = exp(l − log Z), in the logits' buffer
    g.mul_((row_scale * (1 + 2 * lam * log_z)).unsqueeze(1))
    g.scatter_add_(1, t_c, -row_scale.unsqueeze(1))
    if cap_slope is not None:
        g.mul_(cap_slope)
    return sums, g.to(w.dtype)


def _matmul_dtype(h, weight):
    """The dtype the plain path's F.linear runs in: autocast's where it is on, else promotion."""
    if torch.is_autocast_enabled(h.device.type):
        return torch.get_autocast_dtype(h.device.type)
    return torch.promote_types(h.dtype, weight.dtype)


def chunked_loss(head, h, weight, targets, chunk_size=CHUNK_SIZE):
    """head(h, weight, targets) computed chunk by chunk: same (loss, stats), same gradients.

    Soft-capping and z-loss live inside the chunk loop (_ChunkedSoftmaxLoss); μ-loss adds
    λ·μ·μ afterwards, touching the V × D matrix once; μ-centering changes nothing in the loss.
    """
    if not (isinstance(chunk_size, int) and chunk_size > 0):
        raise ValueError(f"chunk_size must be a positive number of tokens, got {chunk_size!r}.")
    z_lam = head.lam if head.name == "z_loss" else 0.0
    matmul_dtype = _matmul_dtype(h, weight)
    with torch.autocast(h.device.type, enabled=False):  # the Function casts for itself
        loss, ce, reg = _ChunkedSoftmaxLoss.apply(h.reshape(-1, h.shape[-1]), weight,
                                                  targets.reshape(-1), head.cap, z_lam,
                                                  chunk_size, matmul_dtype)
    if head.name == "mu_loss":
        reg = head.regulariser(weight, None, None)
        loss = loss + reg
    return loss, {"ce": ce.detach(), "reg": reg.detach()}

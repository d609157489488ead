"""The language-modeling head in five variants, after the paper *Output Embedding Centering
for Stable LLM Pretraining*. Torch only; copy this file alone into any project.

    head = build("mu_center")                  # or baseline, soft_cap, z_loss, mu_loss
    loss, stats = head(h, weight, targets)     # loss first; stats: detached "ce" and "reg"
    loss.backward(); optimizer.step()          # h (..., D), weight (V, D), targets (...)
    head.after_step(weight)                    # on every rank; only μ-centering acts

`weight` is the output embedding: the head's own matrix untied; tied (nanoGPT's default) it is
also the input embedding, which centering then moves too (MuCenter). Under DDP the weights are
identical on all ranks, so each rank's `after_step` subtracts the same μ; a sharded weight (FSDP,
ZeRO) needs μ over all V rows (the weight all-gathered, or Σᵢ eᵢ all-reduced), not a shard's.
With `head.loss_path = f`, forward returns f(head, h, weight, targets) instead of its plain path
(the reference); f must compute the same loss from the head's hooks (fused_loss.py), and an f
that computes only CE of the raw logits (torch's fused op) may serve only `plain_softmax` heads.

Notation. eᵢ ∈ ℝᴰ is row i of the V × D output embedding `weight`, h ∈ ℝᴰ a final hidden state,
lᵢ = eᵢ·h the logits (Eq. 3), Z = Σⱼ exp(lⱼ) (Eq. 4), the cross-entropy of target t is
CE = log Z − l_t = −log softmax(l)_t, μ = (1/V) Σᵢ eᵢ the mean output embedding (Eq. 7, over all
V rows, padded rows included) and l̄ = (1/V) Σᵢ lᵢ the mean logit (Eq. 8).

Lemma 1 (mean logit = μ·h).  l̄ = (1/V) Σᵢ eᵢ·h = ((1/V) Σᵢ eᵢ)·h = μ·h   (linearity)
Lemma 2 (logit range).  |lⱼ| = |eⱼ·h| ≤ ‖eⱼ‖·‖h‖ ≤ maxᵢ‖eᵢ‖·‖h‖   (Cauchy–Schwarz); attained
    for the worst unit h, only an upper bound for a given h (Theorem 4: theorem4.py).
So a common shift μ of all rows moves every logit of a token by μ·h: the motivation for centering.

Variants (`HEADS`; each class carries its hyperparameters and their defaults):
    baseline   loss = CE
    soft_cap   lᵢ ← c·tanh(lᵢ/c) inside the model (logits() is capped too), loss = CE
    z_loss     loss = CE + λ·mean over tokens of log²Z
    mu_loss    loss = CE + λ·μ·μ
    mu_center  loss = CE; after each optimizer step eᵢ ← eᵢ − μ

Numerics: the matmul may run in bf16 (autocast, or bf16 inputs); softmax, log Z, CE and the
regularisers run in float32 (float64 stays float64). `build(name, matmul_dtype=torch.float32)`
runs the head's matmul, and so its backward, in float32 even under bf16 autocast: a float32 LM
head under a bf16 body. CE is the mean over tokens whose target is not -1 (IGNORE), 0 over no
tokens (no NaN); ids are not checked here (that needs a device sync).
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

IGNORE = -1  # target id that contributes nothing to the loss


def compute_dtype(dtype):
    """float32 for bf16/fp16/float32, float64 for float64: softmax never runs below float32."""
    return torch.promote_types(dtype, torch.float32)


def mean_embedding(weight):
    """μ = (1/V) Σᵢ eᵢ over all V rows of `weight` (Eq. 7), in at least float32."""
    return weight.mean(dim=0, dtype=compute_dtype(weight.dtype))


def token_mean(values, keep):
    """Mean of `values` over the tokens where `keep` is True; 0 when no token is kept."""
    return torch.where(keep, values, 0.0).sum() / keep.sum().clamp(min=1)


class Head(nn.Module):
    """Baseline LM head: lᵢ = eᵢ·h, loss = mean CE over targets ≠ -1 (Eq. 1–3); no parameters
    of its own (`weight` is passed in). A variant overrides hooks, never `logits` or `forward`
    (a loss path rebuilds them from the hooks): `cap_logits` (a model intervention, out of place,
    on each logit alone), `log_z_penalty` and `regulariser` (terms added to CE) and
    `after_step` (a parameter update after the optimizer step).
    """
    name, hparams = "baseline", {}  # hparams: the variant's hyperparameters and their defaults
    loss_path = None  # None: forward's plain path; else f(head, h, weight, targets)

    def __init__(self, cap=None, lam=None, matmul_dtype=None):
        super().__init__()
        self.cap, self.lam = cap, lam
        self.matmul_dtype = matmul_dtype  # None: autocast's (or the inputs') dtype

    def extra_repr(self):
        return ", ".join(f"{k}={getattr(self, k)}" for k in self.hparams)

    def cap_logits(self, logits):
        return logits

    def log_z_penalty(self, log_z):
        """Per token, a term of its own log Z (same shape), or None; the loss adds the kept mean."""
        return None

    def regulariser(self, weight):
        """The term of the weight added to the loss (0-dim tensor), or None."""
        return None

    @property
    def plain_softmax(self):  # the loss is CE of the raw logits + regulariser(weight)
        return (type(self).cap_logits is Head.cap_logits
                and type(self).log_z_penalty is Head.log_z_penalty)

    def logits(self, h, weight):
        """Logits over the whole vocabulary, (..., V), upcast to at least float32."""
        if self.matmul_dtype is None:
            logits = F.linear(h, weight)
        else:  # autocast off: the product and its backward run in matmul_dtype
            with torch.autocast(h.device.type, enabled=False):
                logits = F.linear(h.to(self.matmul_dtype), weight.to(self.matmul_dtype))
        return self.cap_logits(logits.to(compute_dtype(logits.dtype)))

    def forward(self, h, weight, targets):
        """(loss, stats) of 0-dim tensors, loss with grad; no .item(): no device sync here."""
        if self.loss_path is not None:
            return self.loss_path(self, h, weight, targets)
        logits, targets = self.logits(h, weight).reshape(-1, len(weight)), targets.reshape(-1)
        keep = targets != IGNORE
        # log Z_r = CE_r + l_r,t: no pass over N × V; keep drops the ignored rows (CE 0, id 0)
        ce_per_token = F.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="none")
        ce = ce_per_token.sum() / keep.sum().clamp(min=1)
        log_z = ce_per_token + logits.gather(1, targets.clamp(min=0)[:, None]).squeeze(1)
        reg = None
        if (penalty := self.log_z_penalty(log_z)) is not None:
            reg = token_mean(penalty, keep)
        if (weight_term := self.regulariser(weight)) is not None:
            reg = weight_term if reg is None else reg + weight_term
        loss, reg = (ce, torch.zeros_like(ce)) if reg is None else (ce + reg, reg)  # CE: as is
        return loss, {"ce": ce.detach(), "reg": reg.detach()}

    @torch.no_grad()
    def after_step(self, weight):
        """Called after every optimizer step; only mu_center changes `weight`."""


class SoftCap(Head):
    """Logit soft-capping (Gemma 2, Eq. 6): lᵢ ← c·tanh(lᵢ/c), applied between Eq. 3 and Eq. 2.

    A model intervention: `logits()` returns capped logits, so evaluation and sampling see
    them too. |lᵢ| < c in exact arithmetic, |lᵢ| ≤ c in floating point (tanh rounds to ±1 once
    |lᵢ/c| ≳ 9 in float32). For |l| ≪ c, c·tanh(l/c) = l − l³/(3c²) + …: small logits pass
    almost unchanged. tanh is odd, so l → −l gives capped l → −capped l (Table 1, symmetric).
    """
    name, hparams = "soft_cap", {"cap": 30.0}  # c of Gemma 2

    def cap_logits(self, logits):
        return self.cap * torch.tanh(logits / self.cap)


class ZLoss(Head):
    """z-loss (PaLM, Eq. 4–5): loss = CE + λ·mean over kept tokens of log²Z, Z = Σⱼ exp(lⱼ).

    It pulls log Z towards 0 (Z towards 1). Symmetric, L_z(l) = L_z(−l), means log Z(l) =
    ±log Z(−l). The − sign needs Z(l)·Z(−l) = Σⱼ Σₖ exp(lⱼ − lₖ) = 1, impossible for V ≥ 2 (its
    V diagonal terms are 1 each); the + sign is Σⱼ exp(lⱼ) = Σⱼ exp(−lⱼ), i.e. Σⱼ sinh(lⱼ) = 0:
    true for symmetric logits and others (l = (asinh 2, −asinh 1, −asinh 1)), false in general
    (Eq. 17–18): with S = Σ_{j≠i} exp(lⱼ) fixed, log²(exp(lᵢ) + S) grows like lᵢ² as lᵢ → +∞ but
    tends to log²S as lᵢ → −∞ (S = 1: log²(e² + 1) ≈ 4.52, log²(e⁻² + 1) ≈ 0.016). A positive
    divergence is penalised, a negative one only once every logit diverges (App. D).
    """
    name, hparams = "z_loss", {"lam": 1e-4}  # λ of Eq. 5

    def log_z_penalty(self, log_z):
        return self.lam * log_z.square()


class MuLoss(Head):
    """μ-loss (Eq. 15–16): loss = CE + λ·μ·μ, μ = (1/V) Σᵢ eᵢ over all V rows.

    ∂μ/∂eᵢ = (1/V)·I, so ∂(λ μ·μ)/∂eᵢ = 2λμ/V: the same vector for every row. Under SGD a step
    moves all rows by −η·2λμ/V: μ ← μ(1 − 2ηλ/V), the centred rows eᵢ − μ stay (an approximate
    μ-centering). Under Adam the pull is not uniform: each element's step is divided by the root
    of its own second moment, set mostly by CE's gradient, which differs per row; rows with
    little gradient history (rare tokens) move most. Quadratic in μ: symmetric (Table 1).
    """
    name, hparams = "mu_loss", {"lam": 1e-4}  # λ of Eq. 16

    def regulariser(self, weight):
        return self.lam * mean_embedding(weight).square().sum()  # not μ @ μ: bf16 under autocast


class MuCenter(Head):
    """μ-centering (Eq. 11): after every optimizer step eᵢ ← e*ᵢ = eᵢ − μ; loss = plain CE.

    Proposition 3. Let l*ᵢ = e*ᵢ·h be the logits after centering, for any h.
    (i)  mean logit 0:  μ* = (1/V) Σᵢ (eᵢ − μ) = 0, so l̄* = μ*·h = 0 (Lemma 1).
    (ii) std unchanged:  l*ᵢ = eᵢ·h − μ·h = lᵢ − l̄ (Lemma 1): every logit of a token moves by
         the same l̄, and σ² = (1/V) Σᵢ (lᵢ − l̄)² is shift-invariant.
    (iii) softmax and loss unchanged:  exp(lᵢ − l̄) / Σⱼ exp(lⱼ − l̄) = pᵢ.  ∎
    Untied, (iii) makes centering a no-op for the predictions in exact arithmetic: loss and
    gradients are invariant to a common shift of the rows, and so are AdamW's update, clipping
    and decoupled weight decay (a decayed shift is a shift), so the run follows the baseline's
    trajectory exactly, every row moved by one vector. What changes is μ and each token's
    common offset l̄ = μ·h (both now 0), which cost precision in bf16 (measure.py).
    Tied, subtracting μ also shifts every input embedding: it changes the model's function.
    """
    name = "mu_center"

    @torch.no_grad()
    def after_step(self, weight):
        weight.sub_(mean_embedding(weight).to(weight.dtype))


# ---- The paper's statistics of a head's logits ----
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


def mean_state_alignment(h_mean, weight):
    """How the mean hidden state h̄ lines up with μ̂ = μ/‖μ‖, as float64 0-d tensors
        (h̄·μ̂, cos(h̄, μ)) = (h̄·μ̂, h̄·μ̂/‖h̄‖),   both 0 where μ = 0 or h̄ = 0.
    Lemma 1 averaged over tokens gives l̄ = μ·h̄ = ‖μ‖·(h̄·μ̂): h̄·μ̂ is what turns a long μ into
    a large mean logit (in the authors' run table, the degraded 16M baseline at η = 0.3:
    l̄/‖μ‖ = 1152/331.471 ≈ 3.5)."""
    tiny = torch.finfo(torch.float64).tiny
    h_mean, mu = h_mean.double(), mean_embedding(weight).double()
    proj = h_mean @ (mu / mu.norm().clamp(min=tiny))
    return proj, proj / h_mean.norm().clamp(min=tiny)


_REGISTRY = {cls.name: cls for cls in (Head, SoftCap, ZLoss, MuLoss, MuCenter)}
HEADS = tuple(_REGISTRY)
DEFAULTS = {k: v for cls in _REGISTRY.values() for k, v in cls.hparams.items()}  # cap, lam


def build(name, matmul_dtype=None, **hparams):
    """The head called `name` (one of HEADS) with `cap` (soft_cap: finite, > 0) or `lam` (z_loss,
    mu_loss: finite, ≥ 0); None means the default and is the only value allowed for a hyperparameter
    the head does not use (so a CLI can pass lam=None, cap=None). matmul_dtype: see Numerics."""
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ValueError(f"unknown head {name!r}; choose one of {', '.join(HEADS)}.")
    for key, value in hparams.items():
        users = " and ".join(n for n, c in _REGISTRY.items() if key in c.hparams)
        if not users:
            raise ValueError(f"unknown hyperparameter {key!r}; valid ones are cap, lam.")
        if value is not None and key not in cls.hparams:
            raise ValueError(f"head {name!r} does not use {key}={value!r}; {key} applies to "
                             f"{users} only.")
    return cls(**{key: default if hparams.get(key) is None else _checked(key, hparams[key])
                  for key, default in cls.hparams.items()}, matmul_dtype=matmul_dtype)


def _checked(key, value):
    """value as a float that is finite and ≥ 0 (> 0 for cap), else one sentence with the rule."""
    rule = "a finite number > 0" if key == "cap" else "a finite number >= 0"
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key}={value!r} is not a number; give {rule}.") from None
    if not (0 <= number < math.inf) or (key == "cap" and number == 0):
        raise ValueError(f"{key}={number!r} is invalid; give {rule}.")
    return number

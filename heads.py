"""The language-modeling head in five variants, after the paper *Output Embedding Centering
for Stable LLM Pretraining*, and the paper's statistics of its logits. Torch only: copy this
file alone into any project.

    head = build("mu_center")                  # or baseline, soft_cap, z_loss, mu_loss
    loss, stats = head(h, weight, targets)     # stats: detached "ce" and "reg"
    loss.backward(); optimizer.step()          # h (..., D), weight (V, D), targets (...)
    head.after_step(weight)                    # on every rank; only μ-centering acts

`weight` is the output embedding; tied (nanoGPT's default), also the input one. Four things a
copier meets:
- Pass the rows the softmax should cover. This project, like the paper's code, passes all
  50,304 (GPT-2's 50,257 padded). A model that keeps its padding out of the softmax passes
  weight[:vocab_size]; else the loss and μ-centering count the padded rows too.
- A bf16 h with a float32 weight and no autocast fails in F.linear; build(name,
  matmul_dtype=torch.bfloat16) (or torch.float32) runs the matmul in that dtype.
- A per-token loss (for evaluation): F.cross_entropy(head.logits(h, weight).flatten(0, -2),
  targets.flatten(), ignore_index=IGNORE, reduction="none").
- soft_cap defaults to the paper's c = 30 (Gemma 2's); nanochat caps at 15:
  build("soft_cap", cap=15).
A sharded weight (FSDP, ZeRO) needs μ over all V rows, not a shard's.

Notation. eᵢ ∈ ℝᴰ is row i of the V × D output embedding `weight`, h ∈ ℝᴰ a final hidden state,
lᵢ = eᵢ·h the logits (Eq. 3), Z = Σⱼ exp(lⱼ) (Eq. 4), the cross-entropy of target t is
CE = log Z − l_t, μ = (1/V) Σᵢ eᵢ the mean output embedding (Eq. 7, over all V rows) and
l̄ = (1/V) Σᵢ lᵢ the mean logit (Eq. 8).

Lemma 1 (mean logit = μ·h).  l̄ = (1/V) Σᵢ eᵢ·h = ((1/V) Σᵢ eᵢ)·h = μ·h   (linearity)
Lemma 2 (logit range).  |lⱼ| = |eⱼ·h| ≤ ‖eⱼ‖·‖h‖ ≤ maxᵢ‖eᵢ‖·‖h‖   (Cauchy–Schwarz)
So a common shift μ of all rows moves every logit of a token by μ·h: the motivation for centering.
Variants (`HEADS`), a class each below with its hyperparameters and their defaults:
    baseline   loss = CE
    soft_cap   lᵢ ← c·tanh(lᵢ/c) inside the model (logits() is capped too), loss = CE
    z_loss     loss = CE + λ·mean over tokens of log²Z
    mu_loss    loss = CE + λ·μ·μ
    mu_center  loss = CE; after each optimizer step eᵢ ← eᵢ − μ

Numerics: the matmul runs in autocast's dtype (or the inputs'), or in `matmul_dtype` where set;
softmax, log Z, CE and the regularisers in float32 (float64 stays float64). CE is the mean over
tokens whose target is not -1 (IGNORE), 0 when there are none. The plain loss path keeps all
N × V logits; with `chunk_size` C > 0 the loss runs C tokens at a time and holds a few C × V
buffers instead (ChunkedLoss), with the same loss and gradients (bench.py times both).
"""
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


class Head(nn.Module):
    """Baseline LM head: lᵢ = eᵢ·h, loss = CE (Eq. 1–3). A variant overrides hooks: both loss
    paths call `cap_logits` (each logit alone) and `log_z_penalty` (a term of log Z), forward
    adds `regulariser` (a term of the weight), and the trainer calls `after_step`."""
    name, hparams = "baseline", {}  # hparams: the variant's hyperparameters and their defaults

    def __init__(self, cap=None, lam=None, matmul_dtype=None, chunk_size=0):
        super().__init__()
        self.cap, self.lam = cap, lam
        self.matmul_dtype = matmul_dtype  # None: autocast's (or the inputs') dtype
        self.chunk_size = chunk_size      # 0: the plain path; C: the chunked one, C tokens a chunk

    def cap_logits(self, logits):
        return logits

    def log_z_penalty(self, log_z):  # per token, a term of its log Z, or None: CE + its mean
        return None

    def regulariser(self, weight):  # a 0-dim term of the weight added to the loss, or None
        return None

    def logits(self, h, weight):
        """Logits over the whole vocabulary, (..., V), in at least float32."""
        if self.matmul_dtype is None:
            logits = F.linear(h, weight)
        else:  # autocast off: the product and its backward run in matmul_dtype
            with torch.autocast(h.device.type, enabled=False):
                logits = F.linear(h.to(self.matmul_dtype), weight.to(self.matmul_dtype))
        return self.cap_logits(logits.to(compute_dtype(logits.dtype)))

    def forward(self, h, weight, targets):
        """(loss, stats) of 0-dim tensors, loss with grad; no .item(), so no device sync."""
        h, targets = h.reshape(-1, h.shape[-1]), targets.reshape(-1)
        if self.chunk_size:
            loss, ce, reg = chunked_loss(self, h, weight, targets)
        else:
            loss, ce, reg = self.plain_loss(h, weight, targets)
        if (weight_term := self.regulariser(weight)) is not None:
            loss, reg = loss + weight_term, reg + weight_term
        return loss, {"ce": ce.detach(), "reg": reg.detach()}

    def plain_loss(self, h, weight, targets):
        """(CE + mean penalty, CE, mean penalty) from all N × V logits at once."""
        logits = self.logits(h, weight)
        ce_per_token = F.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="none")
        kept = (targets != IGNORE).sum().clamp(min=1)
        ce = ce_per_token.sum() / kept
        # log Z = CE + l_t, without another pass over the logits (wrong for ignored rows, masked)
        log_z = ce_per_token + logits.gather(1, targets.clamp(min=0)[:, None]).squeeze(1)
        penalty = self.log_z_penalty(log_z)
        if penalty is None:
            return ce, ce, torch.zeros_like(ce)
        penalty = torch.where(targets != IGNORE, penalty, 0.0).sum() / kept
        return ce + penalty, ce, penalty

    @torch.no_grad()
    def after_step(self, weight):
        """Called after every optimizer step; only mu_center changes `weight`."""


@torch.compiler.disable  # compiled, Dynamo would unroll the chunk loop into one graph
def chunked_loss(head, h, weight, targets):
    """head.plain_loss, head.chunk_size tokens at a time: the same loss and gradients."""
    device = h.device.type
    autocast = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    matmul_dtype = head.matmul_dtype or autocast or torch.promote_types(h.dtype, weight.dtype)
    # Asked here: inside Function.forward grad mode is off.
    want_grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    with torch.autocast(device, enabled=False):
        return ChunkedLoss.apply(h, weight, targets, head, matmul_dtype, want_grad)


class ChunkedLoss(torch.autograd.Function):
    """L = (1/n) Σ_r [CE_r + φ(log Z_r)] over the n tokens r whose target t_r ≠ -1, with the head's
    cap f = head.cap_logits and penalty φ = head.log_z_penalty (f = identity, φ = 0 where absent).

    Per token r, in chunks of rows of h (N, D) against W (V, D):
        a_r = W·h_r        l_r = f(a_r)        log Z_r = log Σⱼ exp(l_rj)
        p_r = softmax(l_r) = exp(l_r − log Z_r)        CE_r = log Z_r − l_r,t
    L is a scalar, so each chunk's gradient is known once its softmax is:
        ∂CE_r/∂l_rj = p_rj − [j = t_r]          ∂φ(log Z_r)/∂l_rj = φ'(log Z_r)·p_rj
        g_r := ∂L/∂a_r = (1/n)·[(1 + φ'(log Z_r))·p_r − onehot(t_r)] ⊙ f'(a_r)
    (0 for ignored tokens; f' and φ' by autograd on the chunk). With G a chunk's rows g_r and H
    its rows h_r: ∂L/∂H = G·W and ∂L/∂W = Σ over chunks of Gᵀ·H (summed in at least float32).
    The forward pass computes both (every chunk's logits in one C × V buffer); backward scales."""

    @staticmethod
    def forward(ctx, h, weight, targets, head, matmul_dtype, want_grad):
        acc = compute_dtype(matmul_dtype)
        w, h_low = weight.to(matmul_dtype), h.to(matmul_dtype)
        keep = targets != IGNORE
        n = keep.sum().clamp(min=1).to(acc)
        row_scale = (keep.to(acc) / n)[:, None]  # 1/n for kept tokens, 0 for ignored ones
        size = head.chunk_size
        logits = torch.empty(min(size, len(h)), len(w), dtype=acc, device=h.device)
        sums = torch.zeros(2, dtype=acc, device=h.device)  # Σ CE_r, Σ φ(log Z_r)
        grad_h = torch.empty_like(h_low) if want_grad else None
        grad_w = torch.zeros_like(w, dtype=acc) if want_grad else None
        for start in range(0, len(h), size):
            rows = slice(start, start + size)
            h_c = h_low[rows]
            buf = logits[:len(h_c)]
            _matmul(h_c, w.t(), out=buf)
            g = _chunk_grad(head, buf, targets[rows], keep[rows], row_scale[rows], sums,
                            want_grad)
            if want_grad:
                g = g.to(matmul_dtype)
                torch.mm(g, w, out=grad_h[rows])
                _matmul(g.t(), h_c, out=grad_w, accumulate=True)
        if want_grad:
            ctx.save_for_backward(grad_h.to(h.dtype), grad_w.to(weight.dtype))
        ce, penalty = sums[0] / n, sums[1] / n
        ctx.mark_non_differentiable(ce, penalty)
        return ce + penalty, ce, penalty

    @staticmethod
    def backward(ctx, grad_loss, _grad_ce, _grad_penalty):
        return (*(grad_loss * g for g in ctx.saved_tensors), None, None, None, None)


def _matmul(a, b, out, accumulate=False):
    """out = a·b (or out += a·b) in place, also where a and b are bf16 and out float32."""
    if a.dtype == out.dtype:
        torch.addmm(out, a, b, beta=1 if accumulate else 0, out=out)
    elif accumulate:
        out += a @ b
    else:  # the product rounded once to bf16, as the plain path's F.linear
        out.copy_(a @ b)


def _chunk_grad(head, raw, targets, keep, row_scale, sums, want_grad):
    """One chunk: `raw` (C × V, float32) holds a = W·h (the softmax overwrites it unless the
    head caps); adds Σ CE_r, Σ φ(log Z_r) of its kept tokens to `sums`; returns ∂L/∂a or None."""
    target_col = targets.clamp(min=0).unsqueeze(1)
    with torch.enable_grad():
        a = raw.detach().requires_grad_(want_grad)
        capped = head.cap_logits(a)
    slope = None  # f'(a), elementwise
    if want_grad and capped is not a:
        slope = torch.autograd.grad(capped, a, torch.ones_like(raw))[0]
    logits = capped.detach()
    target_logit = logits.gather(1, target_col).squeeze(1)
    shift = logits.amax(dim=1, keepdim=True)  # so that exp never overflows
    exps = logits.sub_(shift).exp_()
    sum_exp = exps.sum(dim=1, keepdim=True)
    log_z = (sum_exp.log() + shift).squeeze(1)
    sums[0] += torch.where(keep, log_z - target_logit, 0.0).sum()
    with torch.enable_grad():
        log_z.requires_grad_(want_grad)
        penalty = head.log_z_penalty(log_z)
    if penalty is not None:
        sums[1] += torch.where(keep, penalty.detach(), 0.0).sum()
    if not want_grad:
        return None
    scale = row_scale  # (1/n)·(1 + φ'), the φ' part by autograd
    if penalty is not None:
        scale = scale + torch.autograd.grad(penalty, log_z, row_scale.squeeze(1))[0][:, None]
    g = exps.mul_(scale / sum_exp)
    g.scatter_add_(1, target_col, -row_scale)
    return g if slope is None else g.mul_(slope)


class SoftCap(Head):
    """Logit soft-capping (Gemma 2, Eq. 6): lᵢ ← c·tanh(lᵢ/c), applied between Eq. 3 and Eq. 2.

    A model intervention: `logits()` returns capped logits, so evaluation and sampling see
    them too. |lᵢ| < c (≤ c in floating point); for |l| ≪ c, c·tanh(l/c) = l − l³/(3c²) + …,
    so small logits pass almost unchanged. tanh is odd: symmetric (Table 1).
    """
    name, hparams = "soft_cap", {"cap": 30.0}  # c of Gemma 2

    def cap_logits(self, logits):
        return self.cap * torch.tanh(logits / self.cap)


class ZLoss(Head):
    """z-loss (PaLM, Eq. 4–5): loss = CE + λ·mean over kept tokens of log²Z, Z = Σⱼ exp(lⱼ).

    It pulls log Z towards 0 (Z towards 1). Symmetry, L_z(l) = L_z(−l), needs log Z(l) =
    ±log Z(−l). − needs Z(l)·Z(−l) = Σⱼ Σₖ exp(lⱼ − lₖ) = 1, impossible for V ≥ 2 (its V
    diagonal terms are 1 each); + means Σⱼ sinh(lⱼ) = 0, false in general. With
    S = Σ_{j≠i} exp(lⱼ) fixed, log²(exp(lᵢ) + S) grows like lᵢ² as lᵢ → +∞ but tends to log²S
    as lᵢ → −∞: a positive divergence is penalised, a negative one only once every logit
    diverges (Eq. 17–18, App. D).
    """
    name, hparams = "z_loss", {"lam": 1e-4}  # λ of Eq. 5

    def log_z_penalty(self, log_z):
        return self.lam * log_z.square()


class MuLoss(Head):
    """μ-loss (Eq. 15–16): loss = CE + λ·μ·μ, μ = (1/V) Σᵢ eᵢ over all V rows.

    ∂μ/∂eᵢ = (1/V)·I, so ∂(λ μ·μ)/∂eᵢ = 2λμ/V: the same vector for every row. Under SGD a step
    moves all rows by −η·2λμ/V: μ ← μ(1 − 2ηλ/V), the centred rows eᵢ − μ stay (an approximate
    μ-centering). Under Adam the pull is not uniform: each element's step is divided by the root
    of its own second moment, set mostly by CE's gradient, so rows with little gradient history
    (rare tokens) move most. Quadratic in μ: symmetric (Table 1).
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
    Untied, (iii) makes centering a no-op for the predictions in exact arithmetic: the gradients
    ignore a common shift of the rows, and so do clipping and AdamW's update (decoupled weight
    decay turns a shift into a shift), so the run follows the baseline's, every row moved by one
    vector. What changes is μ and each token's offset l̄ = μ·h (both now 0),
    which cost precision in bf16 (precision_stats). Tied, subtracting μ also shifts every input
    embedding: it changes the model's function.
    """
    name = "mu_center"

    @torch.no_grad()
    def after_step(self, weight):
        weight.sub_(mean_embedding(weight).to(weight.dtype))


# ---- The paper's statistics of a head's logits (train.py logs them, analyze.py reports them)
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
    In float32: max|l| and, where |l̄|/σ ≤ 10⁴, σ within 1e-5 of float64's (relative), l̄ within
    1e-5 of max|l|, log²Z within 1e-5 (relative) where |log Z| ≥ 0.2; no device sync."""
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
    Differences in float32 (float64 for a float32 matmul) keep err_cast and err_round per token,
    and ce_gap's mean over tokens, within 1e-3 of float64's."""
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
    Lemma 1 averaged over tokens gives l̄ = μ·h̄ = ‖μ‖·(h̄·μ̂): h̄·μ̂ turns a long μ into a large
    mean logit."""
    tiny = torch.finfo(torch.float64).tiny
    h_mean, mu = h_mean.double(), mean_embedding(weight).double()
    proj = h_mean @ (mu / mu.norm().clamp(min=tiny))
    return proj, proj / h_mean.norm().clamp(min=tiny)


_REGISTRY = {cls.name: cls for cls in (Head, SoftCap, ZLoss, MuLoss, MuCenter)}
HEADS = tuple(_REGISTRY)


def build(name, matmul_dtype=None, chunk_size=0, **hparams):
    """The head called `name` (one of HEADS) with its hyperparameters `cap` (soft_cap) or `lam`
    (z_loss, mu_loss); None stands for the default, so a command line can pass both."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown head {name!r}; choose one of {', '.join(HEADS)}.")
    cls = _REGISTRY[name]
    for key, value in hparams.items():
        if value is not None and key not in cls.hparams:
            raise ValueError(f"head {name!r} does not use {key}={value!r}; it takes "
                             f"{', '.join(cls.hparams) or 'no hyperparameters'}.")
    chosen = {key: default if hparams.get(key) is None else float(hparams[key])
              for key, default in cls.hparams.items()}
    return cls(**chosen, matmul_dtype=matmul_dtype, chunk_size=chunk_size)

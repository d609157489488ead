"""The LM head's loss without the N × V logits: the same loss and gradients as heads.py's plain
path, computed chunk by chunk of tokens. Imports only heads.py.

    head.loss_path = loss_path(chunk, device_type)     # train.py --loss_chunk (None: fastest)
    loss, stats = head(h, weight, targets)             # now chunked; same (loss, stats)

Why it is faster, not only smaller. The plain path builds all N × V logits and autograd keeps
them (and their softmax) until the backward pass: at V = 50304 the largest tensors of a small
model's step, each written and re-read from main memory, and each fresh allocation of that size
costs page faults on CPU. Because the loss is a scalar, a chunk's gradient w.r.t. its logits is
known as soon as its softmax is; so the forward computes it right away, folds it into ∂L/∂h and
∂L/∂W with two matmuls, and reuses one small C × V buffer for the next chunk (torch's own
F.linear_cross_entropy, torch ≥ 2.13, works the same way; this file learned from it: matmuls
written into preallocated buffers, every elementwise step in place, ∂L/∂W accumulated by addmm_).
Backward then only scales the two stored gradients by the incoming one (1.0 in training).

Which path runs (`chunked_loss`): baseline, μ-loss and μ-centering add nothing inside the
softmax, so where torch has F.linear_cross_entropy (2.13 and later) and the matmul runs in
float32/float64 they use it; soft-cap and z-loss (and every head on an older torch, or with a
bf16 matmul, where torch's op would round the loss itself to bf16) use `_ChunkedSoftmaxLoss`.
"""
import functools

import torch
import torch.nn.functional as F

import heads

# Tokens per chunk of the default path, per device type; 0 = the plain path. CPU: measured with
# `bench.py --no_train --loss_tokens 1024` (1 thread, V = 50304): 32 to 256 tokens are within
# noise of each other and ~1.8× faster than the plain path. CUDA: not measured yet; the plain
# path, whose softmax torch.compile fuses, stays the default there until scripts/gpu_bench.sh
# shows a chunked path is faster.
DEFAULT_CHUNK = {"cpu": 64, "cuda": 0}
CHUNK_SIZE = 1024  # chunked_loss's chunk when not given one (and bench.py's --chunk_size)
TORCH_OP = hasattr(F, "linear_cross_entropy")  # torch ≥ 2.13
PLAIN_CE_HEADS = ("baseline", "mu_loss", "mu_center")  # nothing but CE inside the softmax


def loss_path(chunk_size, device_type):
    """What train.py puts in head.loss_path for --loss_chunk: None (not given) → the fastest
    exact path known for this device type (DEFAULT_CHUNK); 0 → None, heads.py's plain
    reference; N → chunked_loss with N tokens per chunk."""
    if chunk_size is None:
        chunk_size = DEFAULT_CHUNK.get(device_type, 0)
    return functools.partial(chunked_loss, chunk_size=chunk_size) if chunk_size else None


def chunked_loss(head, h, weight, targets, chunk_size=CHUNK_SIZE, torch_op=None):
    """head(h, weight, targets) computed chunk by chunk: same (loss, stats), same gradients.

    Soft-capping and z-loss live inside the chunk loop; μ-loss adds λ·μ·μ afterwards, touching
    the V × D matrix once; μ-centering changes nothing in the loss. The matmul runs in
    head.matmul_dtype where the head has one (a float32 head under bf16), else as autocast
    says, as on the plain path. torch_op: None uses torch's
    op where it can (TORCH_OP); False forces this file's own loop (bench.py compares the two)."""
    if not (isinstance(chunk_size, int) and chunk_size > 0):
        raise ValueError(f"chunk_size must be a positive number of tokens, got {chunk_size!r}.")
    h, targets = h.reshape(-1, h.shape[-1]), targets.reshape(-1)
    matmul_dtype = head.matmul_dtype or _matmul_dtype(h, weight)
    # Decided here: inside Function.forward grad mode is off and ctx.needs_input_grad is True
    # even under torch.no_grad(), so the Function would do a backward's work during evaluation.
    want_grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    use_torch_op = ((TORCH_OP if torch_op is None else torch_op) and head.name in PLAIN_CE_HEADS
                    and matmul_dtype in (torch.float32, torch.float64))
    with torch.autocast(h.device.type, enabled=False):  # the matmul dtype is chosen above
        if use_torch_op:
            loss = ce = _torch_chunked_ce(h.to(matmul_dtype), weight.to(matmul_dtype), targets,
                                          chunk_size)
            reg = torch.zeros_like(ce)
        else:
            z_lam = head.lam if head.name == "z_loss" else 0.0
            loss, ce, reg = _ChunkedSoftmaxLoss.apply(h, weight, targets, head.cap, z_lam,
                                                      chunk_size, matmul_dtype, want_grad)
    if head.name == "mu_loss":
        reg = head.regulariser(weight, None, None)
        loss = loss + reg
    return loss, {"ce": ce.detach(), "reg": reg.detach()}


def _matmul_dtype(h, weight):
    """The dtype the plain path's F.linear runs in: autocast's where it is on, else promotion."""
    if torch.is_autocast_enabled(h.device.type):
        return torch.get_autocast_dtype(h.device.type)
    return torch.promote_types(h.dtype, weight.dtype)


def _torch_chunked_ce(h, weight, targets, chunk_size):
    """Mean CE over targets ≠ -1 by torch's F.linear_cross_entropy; 0 when none is kept (as
    heads.token_mean; torch's own mean would be NaN there)."""
    # allow_retain_graph: a second backward works, as on the plain path (cost not measurable)
    options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=chunk_size,
                                                 allow_retain_graph=True)
    total = F.linear_cross_entropy(h, weight, targets, reduction="sum", ignore_index=heads.IGNORE,
                                   options=options)
    return total / (targets != heads.IGNORE).sum().clamp(min=1)


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
        ∂l_rj/∂a_rj = 1 − tanh²(a_rj/c)                   (1 without a cap)
    so  g_r := ∂L/∂a_r = (1/n)·[(1 + 2λ·log Z_r)·p_r − onehot(t_r)] ⊙ (1 − tanh²(a_r/c)),
    and g_r = 0 for ignored tokens. With G the chunk's rows g_r stacked (C × V), H its rows h_r:
        ∂L/∂H = G·W          (a_r = W·h_r is linear in h_r)
        ∂L/∂W = Σ_chunks Gᵀ·H (accumulated in float32 across chunks)

    The cap goes through the sigmoid, tanh(x) = 2σ(2x) − 1 and 1 − tanh²(x) = 4σ(2x)(1 − σ(2x)),
    because torch's CPU tanh_ can be far slower: ~16× sigmoid_'s time on this project's machine
    (1 thread, AVX512 kernels; results/sigmoid_vs_tanh.txt, by scripts/sigmoid_vs_tanh.py),
    though a review on another CPU measured 0.4–0.9×: the speed is the CPU's, the loss is not.
    In float32 this tanh is off by up to ~2·10⁻⁷ (torch.tanh: ~5·10⁻⁸), so a capped logit by
    ~c·2·10⁻⁷; the loss stays as close to float64 as the plain path's (bench.py --loss_tokens
    prints both).
    """

    @staticmethod
    def forward(ctx, h, weight, targets, cap, lam, chunk_size, matmul_dtype, want_grad):
        acc = heads.compute_dtype(matmul_dtype)  # softmax never below float32
        w, h_low = weight.to(matmul_dtype), h.to(matmul_dtype)
        keep = targets != heads.IGNORE
        n = keep.sum().clamp(min=1).to(acc)  # 0 kept tokens: loss 0, as heads.token_mean
        # g's row scale: 1/n for kept tokens, 0 for ignored ones; ×4 of the cap's 4σ(1 − σ)
        row_scale = keep.to(acc) * ((4.0 if cap is not None else 1.0) / n)
        chunk = min(chunk_size, h.shape[0])
        logits = torch.empty(chunk, w.shape[0], dtype=acc, device=h.device)  # reused per chunk
        slope = torch.empty_like(logits) if cap is not None and want_grad else None
        sums = torch.zeros(2, dtype=acc, device=h.device)  # Σ CE, Σ log²Z over kept tokens
        grad_h = torch.empty_like(h_low) if want_grad else None
        grad_w = torch.zeros_like(w, dtype=acc) if want_grad else None
        for start in range(0, h.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            h_c = h_low[rows]
            buf = logits[:h_c.shape[0]]
            _matmul(h_c, w.t(), out=buf, alpha=1.0 if cap is None else 2 / cap)  # a or 2a/c
            g = _chunk_loss_and_grad(buf, targets[rows], keep[rows], row_scale[rows], cap, lam,
                                     sums, want_grad, None if slope is None else slope[:len(h_c)])
            if want_grad:
                g = g.to(matmul_dtype)
                torch.mm(g, w, out=grad_h[rows])
                _matmul(g.t(), h_c, out=grad_w, accumulate=True)
        if want_grad:
            ctx.save_for_backward(grad_h.to(h.dtype), grad_w.to(weight.dtype))
        ce, reg = sums[0] / n, lam * sums[1] / n
        ctx.mark_non_differentiable(ce, reg)
        return ce + reg, ce, reg

    @staticmethod
    def backward(ctx, grad_loss, _grad_ce, _grad_reg):
        grad_h, grad_w = ctx.saved_tensors
        return grad_loss * grad_h, grad_loss * grad_w, None, None, None, None, None, None


def _matmul(a, b, out, accumulate=False, alpha=1.0):
    """out = α·a·b (or out += a·b) in place, also where a and b are bf16 and out float32."""
    if a.dtype == out.dtype:  # the scale α rides along in the matmul, without its own pass
        torch.addmm(out, a, b, beta=1 if accumulate else 0, alpha=alpha, out=out)
    elif accumulate:
        out += a @ b
    else:  # the product rounded once to bf16, as the plain path's F.linear, then scaled in float32
        out.copy_(a @ b)
        if alpha != 1:
            out.mul_(alpha)


def _chunk_loss_and_grad(logits, targets, keep, row_scale, cap, lam, sums, want_grad, slope):
    """One chunk of _ChunkedSoftmaxLoss, in place in `logits` (C × V, float32: the raw logits a,
    or 2a/c with a cap): adds (Σ CE_r, Σ log²Z_r) over its kept tokens to `sums` and, if
    want_grad, returns g = ∂L/∂a in the same buffer (with a cap, `slope` is a second C × V
    buffer). Every step works in place: each extra C × V tensor costs a pass over memory, which
    is what an LM head at large V is bound by."""
    target_col = targets.clamp(min=0).unsqueeze(1)
    if cap is None:
        target_logit = logits.gather(1, target_col)
        shift = logits.amax(dim=1, keepdim=True)  # max l, so that exp never overflows
        logits.sub_(shift)
    else:  # l = c·tanh(a/c) = 2c·σ(2a/c) − c, and l − max l = 2c·(σ − max σ)
        sig = logits.sigmoid_()
        if want_grad:
            torch.addcmul(sig, sig, sig, value=-1, out=slope)  # σ(1 − σ); the 4 is in row_scale
        target_logit = 2 * cap * sig.gather(1, target_col) - cap
        sig_max = sig.amax(dim=1, keepdim=True)
        shift = 2 * cap * sig_max - cap
        torch.add(-2 * cap * sig_max, sig, alpha=2 * cap, out=sig)
    sum_exp = logits.exp_().sum(dim=1, keepdim=True)  # logits now hold exp(l − max l)
    log_z = sum_exp.log() + shift
    sums[0] += torch.where(keep, (log_z - target_logit).squeeze(1), 0.0).sum()
    sums[1] += torch.where(keep, log_z.squeeze(1).square(), 0.0).sum()
    if not want_grad:
        return None
    scale = row_scale.unsqueeze(1)
    g = logits.mul_(scale * (1 + 2 * lam * log_z) / sum_exp)  # (1 + 2λ·log Z)·p/n
    g.scatter_add_(1, target_col, -scale)  # − onehot/n
    return g.mul_(slope) if cap is not None else g

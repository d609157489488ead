"""The LM head's loss without the N × V logits: the same loss and gradients as heads.py's plain
path, chunk by chunk of tokens, once `head.loss_path = loss_path(chunk, device_type)`.

The plain path keeps all N × V logits (and their softmax) for the backward pass. The loss is a
scalar, so a chunk's gradient w.r.t. its logits is known once its softmax is: the forward folds
it into ∂L/∂h and ∂L/∂W at once and reuses one C × V buffer for the next chunk. How they compare:
    python bench.py --device cpu --no_train --loss_tokens 1024 --loss_paths plain default chunked
"""
import functools

import torch
import torch.nn.functional as F

import heads

# Default tokens per chunk by device type (0: the plain path): CPU 64, timed by the bench command
# above; CUDA plain (torch.compile fuses its softmax) until scripts/gpu_check.sh times one faster.
DEFAULT_CHUNK = {"cpu": 64, "cuda": 0}
CHUNK_SIZE = 1024  # chunked_loss's chunk when not given one (and bench.py's --chunk_size)
# torch's fused op and its options class both arrived in torch 2.13; either missing: our loop
TORCH_OP = hasattr(F, "linear_cross_entropy") and hasattr(torch.nn, "LinearCrossEntropyOptions")
PLAIN_CE_HEADS = ("baseline", "mu_loss", "mu_center")  # nothing but CE inside the softmax


def loss_path(chunk_size, device_type):
    """head.loss_path for --loss_chunk: None → DEFAULT_CHUNK, 0 → None (the plain path), N → N."""
    chunk_size = DEFAULT_CHUNK.get(device_type, 0) if chunk_size is None else chunk_size
    return functools.partial(chunked_loss, chunk_size=chunk_size) if chunk_size else None


@torch.compiler.disable  # compiled, the loop is unrolled and every chunk's buffers stay alive
def chunked_loss(head, h, weight, targets, chunk_size=CHUNK_SIZE, torch_op=None):
    """head(h, weight, targets) chunk by chunk: same (loss, stats), same gradients.

    Soft-cap and z-loss live inside the chunk loop; μ-loss adds λ·μ·μ afterwards; μ-centering
    changes nothing in the loss. The matmul runs in head.matmul_dtype, else as autocast says.
    Torch's op (TORCH_OP) serves the PLAIN_CE_HEADS where the matmul is float32 or float64 (in
    bf16 it would round the loss itself); torch_op=False forces our loop, True torch's op."""
    if not (isinstance(chunk_size, int) and chunk_size > 0):
        raise ValueError(f"chunk_size must be a positive number of tokens, got {chunk_size!r}.")
    if torch_op and not TORCH_OP:
        raise ValueError("torch_op=True needs torch ≥ 2.13's F.linear_cross_entropy; pass None.")
    h, targets = h.reshape(-1, h.shape[-1]), targets.reshape(-1)
    device = h.device.type  # the plain path's F.linear dtype: autocast's, else promotion
    matmul_dtype = head.matmul_dtype or (torch.get_autocast_dtype(device)
                                         if torch.is_autocast_enabled(device)
                                         else torch.promote_types(h.dtype, weight.dtype))
    # Not in Function.forward: there grad mode is off and needs_input_grad True under no_grad.
    want_grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    use_torch_op = ((TORCH_OP if torch_op is None else torch_op) and head.name in PLAIN_CE_HEADS
                    and matmul_dtype in (torch.float32, torch.float64))
    with torch.autocast(device, enabled=False):  # the matmul dtype is chosen above
        if use_torch_op:  # allow_retain_graph: a second backward works, as on the plain path
            options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=chunk_size,
                                                         allow_retain_graph=True)
            total = F.linear_cross_entropy(h.to(matmul_dtype), weight.to(matmul_dtype), targets,
                                           reduction="sum", ignore_index=heads.IGNORE,
                                           options=options)  # its "mean" is NaN with none kept
            loss = ce = total / (targets != heads.IGNORE).sum().clamp(min=1)
            reg = torch.zeros_like(ce)
        else:
            z_lam = head.lam if head.name == "z_loss" else 0.0
            loss, ce, reg = _ChunkedSoftmaxLoss.apply(h, weight, targets, head.cap, z_lam,
                                                      chunk_size, matmul_dtype, want_grad)
    if head.name == "mu_loss":
        reg = head.regulariser(weight, None, None)
        loss = loss + reg
    return loss, {"ce": ce.detach(), "reg": reg.detach()}


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
    """

    @staticmethod
    def forward(ctx, h, weight, targets, cap, lam, chunk_size, matmul_dtype, want_grad):
        acc = heads.compute_dtype(matmul_dtype)  # softmax never below float32
        w, h_low = weight.to(matmul_dtype), h.to(matmul_dtype)
        keep = targets != heads.IGNORE
        n = keep.sum().clamp(min=1).to(acc)  # 0 kept tokens: loss 0, as heads.token_mean
        row_scale = (keep.to(acc) / n)[:, None]  # g's row scale: 1/n for kept tokens, 0 else
        logits = torch.empty(min(chunk_size, len(h)), len(w), dtype=acc, device=h.device)  # reused
        slope = torch.empty_like(logits) if cap is not None and want_grad else None
        sums = torch.zeros(2, dtype=acc, device=h.device)  # Σ CE, Σ log²Z over kept tokens
        grad_h = torch.empty_like(h_low) if want_grad else None
        grad_w = torch.zeros_like(w, dtype=acc) if want_grad else None
        for start in range(0, h.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            h_c = h_low[rows]
            buf = logits[:len(h_c)]
            _matmul(h_c, w.t(), out=buf, alpha=1.0 if cap is None else 1 / cap)  # a or a/c
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
        return (*(grad_loss * g for g in ctx.saved_tensors), None, None, None, None, None, None)


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
    """One chunk of _ChunkedSoftmaxLoss in place in `logits` (C × V, float32: a, or a/c with a cap;
    each extra C × V tensor costs a pass over memory): adds (Σ CE_r, Σ log²Z_r) over its kept
    tokens to `sums`; if want_grad, returns g = ∂L/∂a in that buffer (`slope`: a second one)."""
    target_col = targets.clamp(min=0).unsqueeze(1)
    if cap is not None:  # l = c·tanh(a/c), ∂l/∂a = 1 − tanh²(a/c)
        capped = logits.tanh_()
        if want_grad:
            torch.mul(capped, capped, out=slope).neg_().add_(1)
        capped.mul_(cap)
    target_logit = logits.gather(1, target_col)
    shift = logits.amax(dim=1, keepdim=True)  # max l, so that exp never overflows
    sum_exp = logits.sub_(shift).exp_().sum(dim=1, keepdim=True)  # logits: exp(l − max l)
    log_z = sum_exp.log() + shift
    sums[0] += torch.where(keep, (log_z - target_logit).squeeze(1), 0.0).sum()
    sums[1] += torch.where(keep, log_z.squeeze(1).square(), 0.0).sum()
    if not want_grad:
        return None
    g = logits.mul_(row_scale * (1 + 2 * lam * log_z) / sum_exp)  # (1 + 2λ·log Z)·p/n
    g.scatter_add_(1, target_col, -row_scale)  # − onehot/n
    return g.mul_(slope) if cap is not None else g

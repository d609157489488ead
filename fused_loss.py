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


def loss_path(chunk_size, device_type):
    """head.loss_path for --loss_chunk: None → DEFAULT_CHUNK, 0 → None (the plain path), N → N."""
    chunk_size = DEFAULT_CHUNK.get(device_type, 0) if chunk_size is None else chunk_size
    return functools.partial(chunked_loss, chunk_size=chunk_size) if chunk_size else None


def uses_torch_op(head, matmul_dtype, torch_op=None) -> bool:
    """Whether torch's op (TORCH_OP) serves head: it adds nothing inside the softmax (plain_softmax)
    and the matmul is float32 or float64 (in bf16 the op would round the loss itself)."""
    return bool((TORCH_OP if torch_op is None else torch_op) and head.plain_softmax
                and matmul_dtype in (torch.float32, torch.float64))


def path_name(head, run_dtype) -> str:
    """In words, what head.loss_path (set by loss_path) runs in a run of run_dtype (autocast's, or
    float32): the matmul is in head.matmul_dtype where set, as chunked_loss chooses."""
    if head.loss_path is None:
        return "heads.py's plain forward"
    matmul_dtype = head.matmul_dtype or run_dtype
    way = "torch's F.linear_cross_entropy" if uses_torch_op(head, matmul_dtype) else \
        "fused_loss.py's loop through the head's hooks"
    return f"{way}, {head.loss_path.keywords['chunk_size']} tokens a chunk"


@torch.compiler.disable  # compiled, Dynamo would unroll the chunk loop into one graph
def chunked_loss(head, h, weight, targets, chunk_size=CHUNK_SIZE, torch_op=None):
    """head(h, weight, targets) chunk by chunk: same (loss, stats), same gradients.

    cap_logits and log_z_penalty run inside the chunk loop, each chunk's derivatives of them by
    autograd; regulariser(weight) is added afterwards. The matmul runs in head.matmul_dtype, else
    as autocast says. Torch's op serves where uses_torch_op says, our loop everywhere else;
    torch_op=False forces our loop, True asks for torch's op where it serves the head."""
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
    with torch.autocast(device, enabled=False):  # the matmul dtype is chosen above
        if uses_torch_op(head, matmul_dtype, torch_op):
            # allow_retain_graph: a second backward works, as on the plain path
            options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=chunk_size,
                                                         allow_retain_graph=True)
            total = F.linear_cross_entropy(h.to(matmul_dtype), weight.to(matmul_dtype), targets,
                                           reduction="sum", ignore_index=heads.IGNORE,
                                           options=options)  # its "mean" is NaN with none kept
            loss = ce = total / (targets != heads.IGNORE).sum().clamp(min=1)
            reg = None
        else:
            loss, ce, reg = _ChunkedSoftmaxLoss.apply(h, weight, targets, head, chunk_size,
                                                      matmul_dtype, want_grad)
    weight_term = head.regulariser(weight)
    if weight_term is not None:
        loss = loss + weight_term
        reg = weight_term if reg is None else reg + weight_term
    reg = torch.zeros_like(ce) if reg is None else reg
    return loss, {"ce": ce.detach(), "reg": reg.detach()}


class _ChunkedSoftmaxLoss(torch.autograd.Function):
    """L = (1/n) Σ_r [CE_r + φ(log Z_r)] over the n tokens r whose target t_r ≠ -1, with the head's
    cap f = head.cap_logits and penalty φ = head.log_z_penalty (f = identity, φ = 0 where absent),
    and ∂L/∂h, ∂L/∂W.

    Per token r, in chunks of rows of h (N, D) against weight W (V, D):
        a_r = W·h_r                      raw logits: matmul in bf16 under autocast, then float32
        l_r = f(a_r)                     soft-cap: c·tanh(a_r/c)
        log Z_r = log Σⱼ exp(l_rj),      p_r = softmax(l_r) = exp(l_r − log Z_r)
        CE_r = log Z_r − l_r,t           z-loss: φ(log Z_r) = λ·log²Z_r

    Gradient w.r.t. the logits, one term at a time:
        ∂CE_r/∂l_rj = p_rj − [j = t_r]                    (softmax minus one-hot)
        ∂φ(log Z_r)/∂l_rj = φ'(log Z_r) · p_rj            (z-loss: φ' = 2λ·log Z_r)
    so  ∂L/∂l_r = (1/n)·[(1 + φ'(log Z_r))·p_r − onehot(t_r)], 0 for ignored tokens, and
        g_r := ∂L/∂a_r = ∂L/∂l_r ⊙ f'(a_r)                (soft-cap: f' = 1 − tanh²(a_r/c))
    with f' and φ' from autograd on the chunk (f acts on each logit alone, φ on each log Z_r
    alone). With G the chunk's rows g_r stacked (C × V), H its rows h_r:
        ∂L/∂H = G·W          (a_r = W·h_r is linear in h_r)
        ∂L/∂W = Σ_chunks Gᵀ·H (accumulated in float32 across chunks)
    """

    @staticmethod
    def forward(ctx, h, weight, targets, head, chunk_size, matmul_dtype, want_grad):
        acc = heads.compute_dtype(matmul_dtype)  # softmax never below float32
        w, h_low = weight.to(matmul_dtype), h.to(matmul_dtype)
        keep = targets != heads.IGNORE
        n = keep.sum().clamp(min=1).to(acc)  # 0 kept tokens: loss 0, as heads.token_mean
        row_scale = (keep.to(acc) / n)[:, None]  # g's row scale: 1/n for kept tokens, 0 else
        logits = torch.empty(min(chunk_size, len(h)), len(w), dtype=acc, device=h.device)  # reused
        sums = torch.zeros(2, dtype=acc, device=h.device)  # Σ CE_r, Σ φ(log Z_r) over kept tokens
        grad_h = torch.empty_like(h_low) if want_grad else None
        grad_w = torch.zeros_like(w, dtype=acc) if want_grad else None
        for start in range(0, h.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            h_c = h_low[rows]
            buf = logits[:len(h_c)]
            _matmul(h_c, w.t(), out=buf)
            g = _chunk_loss_and_grad(head, buf, targets[rows], keep[rows], row_scale[rows], sums,
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
        return (*(grad_loss * g for g in ctx.saved_tensors), None, None, None, None, None)


def _matmul(a, b, out, accumulate=False):
    """out = a·b (or out += a·b) in place, also where a and b are bf16 and out float32."""
    if a.dtype == out.dtype:
        torch.addmm(out, a, b, beta=1 if accumulate else 0, out=out)
    elif accumulate:
        out += a @ b
    else:  # the product rounded once to bf16, as the plain path's F.linear
        out.copy_(a @ b)


def _chunk_loss_and_grad(head, raw, targets, keep, row_scale, sums, want_grad):
    """One chunk of _ChunkedSoftmaxLoss: `raw` (C × V, float32) holds a = W·h; the softmax runs in
    place in it, or in the capped logits (each extra C × V tensor costs a pass over memory); adds
    (Σ CE_r, Σ φ(log Z_r)) over its kept tokens to `sums`; if want_grad, returns g = ∂L/∂a."""
    target_col = targets.clamp(min=0).unsqueeze(1)
    with torch.enable_grad():  # Function.forward runs without grad; the hooks' derivatives need it
        a = raw.detach().requires_grad_(want_grad)
        capped = head.cap_logits(a)
    slope = None  # ∂l/∂a, elementwise: the ones vector pulled back through the cap
    if want_grad and capped is not a:
        slope = torch.autograd.grad(capped, a, torch.ones(()).to(raw).expand_as(raw))[0]
    logits = capped.detach()  # its graph is freed: the softmax may overwrite it
    target_logit = logits.gather(1, target_col)
    shift = logits.amax(dim=1, keepdim=True)  # max l, so that exp never overflows
    exps = logits.sub_(shift).exp_()  # exp(l − max l)
    sum_exp = exps.sum(dim=1, keepdim=True)
    log_z = (sum_exp.log() + shift).squeeze(1)
    sums[0] += torch.where(keep, log_z - target_logit.squeeze(1), 0.0).sum()
    with torch.enable_grad():
        log_z.requires_grad_(want_grad)
        penalty = head.log_z_penalty(log_z)
    if penalty is not None:
        sums[1] += torch.where(keep, penalty.detach(), 0.0).sum()
    if not want_grad:
        return None
    scale = row_scale  # ∂L/∂l = p·(1/n)(1 + φ') − onehot/n; autograd gives (1/n)·φ'
    if penalty is not None:
        scale = scale + torch.autograd.grad(penalty, log_z, row_scale.squeeze(1))[0][:, None]
    g = exps.mul_(scale / sum_exp)
    g.scatter_add_(1, target_col, -row_scale)
    return g if slope is None else g.mul_(slope)

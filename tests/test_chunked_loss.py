"""heads.py's chunked loss (head.chunk_size > 0) equals its plain path: values and gradients, of
every head and SETTINGS dtype; gradcheck of its hand-derived backward. Heads defined here, each
overriding a hook, check that both paths compute the head they are given through its hooks."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import heads
import model

V, D = 50, 16
HPARAMS = {"soft_cap": {"cap": 2.0}, "z_loss": {"lam": 0.1}, "mu_loss": {"lam": 0.1}}
# (dtype of h and W, autocast on?, tolerance relative to the largest entry)
SETTINGS = {"float64": (torch.float64, False, 1e-12), "float32": (torch.float32, False, 2e-6),
            "bf16": (torch.bfloat16, False, 2e-2), "autocast_bf16": (torch.float32, True, 2e-2)}




class AtanCap(heads.Head):
    """A cap whose derivative is not tanh's: l = 2·atan(a/2)."""
    def cap_logits(self, logits):
        return 2 * torch.atan(logits / 2)


class CubedLogZ(heads.Head):
    """A per-token term of log Z that is neither z-loss's nor symmetric: softplus(log Z)³/10."""
    def log_z_penalty(self, log_z):
        return 0.1 * F.softplus(log_z) ** 3


class RowNorms(heads.Head):
    """A term of the weight alone: the mean squared row norm, /20."""
    def regulariser(self, weight):
        return 0.05 * weight.square().sum(dim=1).mean()


class AllThree(AtanCap, CubedLogZ, RowNorms):
    """Every hook above at once."""


CUSTOM_HEADS = {cls.__name__: cls for cls in (AtanCap, CubedLogZ, RowNorms, AllThree)}


def make_head(name, chunk_size=0, **options):
    if name in CUSTOM_HEADS:
        return CUSTOM_HEADS[name](chunk_size=chunk_size, **options)
    return heads.build(name, chunk_size=chunk_size, **options, **HPARAMS.get(name, {}))


def make_inputs(dtype, seed=0, n_tokens=37):
    """h (2, N, D) large enough to saturate the soft-cap, W (V, D) shifted (μ ≠ 0), 5 ignored."""
    gen = torch.Generator().manual_seed(seed)
    h = (2 * torch.randn(2, n_tokens, D, generator=gen)).to(dtype).requires_grad_()
    w = (torch.randn(V, D, generator=gen) + 0.5).to(dtype).requires_grad_()
    targets = torch.randint(0, V, (2, n_tokens), generator=gen)
    targets[0, :5] = -1
    return h, w, targets


def loss_and_grads(fn, h, w, targets, autocast):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss, stats = fn(h, w, targets)
    return loss, stats, torch.autograd.grad(loss, (h, w))


def assert_close(actual, expected, tol):
    scale = expected.abs().max().clamp(min=1e-30)
    assert (actual.double() - expected.double()).abs().max() <= tol * scale


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("name", heads.HEADS)
def test_chunked_equals_plain(name, setting):
    dtype, autocast, tol = SETTINGS[setting]
    h, w, targets = make_inputs(dtype)
    plain = loss_and_grads(make_head(name), h, w, targets, autocast)
    chunked = loss_and_grads(make_head(name, chunk_size=8), h, w, targets, autocast)
    (loss_p, stats_p, grads_p), (loss_c, stats_c, grads_c) = plain, chunked
    assert loss_c.dtype == loss_p.dtype and loss_c.shape == ()
    assert_close(loss_c, loss_p, tol)
    for key in ("ce", "reg"):
        assert not stats_c[key].requires_grad
        assert_close(stats_c[key], stats_p[key], tol)
    for grad_c, grad_p in zip(grads_c, grads_p):
        assert grad_c.dtype == grad_p.dtype
        assert_close(grad_c, grad_p, tol)
    assert grads_c[0][0, :5].abs().max() == 0  # ignored tokens get no gradient


@pytest.mark.parametrize("name", [*heads.HEADS, *CUSTOM_HEADS])
def test_backward_matches_finite_differences(name):
    """The hand-derived gradient (heads.ChunkedLoss's docstring) against float64 numerics."""
    head = make_head(name, chunk_size=5)
    h, w, targets = make_inputs(torch.float64, seed=1, n_tokens=6)
    assert torch.autograd.gradcheck(lambda h, w: head(h, w, targets)[0], (h, w),
        fast_mode=True)  # checks random directions: the full Jacobian takes minutes


def hooks_written_out(head, h, w, targets):
    """CE of cap_logits(W·h) + the kept tokens' mean log_z_penalty + regulariser(W), by torch's
    logsumexp and a boolean mask: heads.py's forward without its plumbing."""
    logits = head.cap_logits(h.reshape(-1, D) @ w.t())
    keep, targets = targets.reshape(-1) != heads.IGNORE, targets.reshape(-1)
    log_z = torch.logsumexp(logits, dim=1)
    ce = log_z - logits.gather(1, targets.clamp(min=0)[:, None]).squeeze(1)
    penalty, reg = head.log_z_penalty(log_z), head.regulariser(w)
    return (ce[keep].mean() + (0 if penalty is None else penalty[keep].mean())
            + (0 if reg is None else reg))


@pytest.mark.parametrize("name", CUSTOM_HEADS)
def test_the_plain_path_of_a_new_head_is_its_hooks(name):
    """heads.py's forward composes the hooks as written out, and each hook matters: the new
    head's loss differs from the baseline's by more than 0.05."""
    h, w, targets = make_inputs(torch.float64)
    head = make_head(name)
    loss, _, grads = loss_and_grads(head, h, w, targets, False)
    expected = hooks_written_out(head, h, w, targets)
    assert_close(loss, expected, 1e-12)
    for grad, want in zip(grads, torch.autograd.grad(expected, (h, w))):
        assert_close(grad, want, 1e-12)
    assert abs(loss.item() - make_head("baseline")(h, w, targets)[0].item()) > 0.05


@pytest.mark.parametrize("chunk_size", [1, 8, 74, 100])  # 74 tokens: 8 leaves a ragged chunk of 2
@pytest.mark.parametrize("all_ignored", [False, True])
@pytest.mark.parametrize("name", [*heads.HEADS, *CUSTOM_HEADS])
def test_every_head_chunked_is_its_plain_path_within_1e_12_in_float64(name, all_ignored,
                                                                      chunk_size):
    """Built-in or new: the same loss, stats and gradients, in chunks that divide the 74 tokens
    or not, one token a chunk, or all in one."""
    h, w, targets = make_inputs(torch.float64)
    if all_ignored:
        targets = torch.full_like(targets, heads.IGNORE)
    loss_p, stats_p, grads_p = loss_and_grads(make_head(name), h, w, targets, False)
    loss_c, stats_c, grads_c = loss_and_grads(make_head(name, chunk_size=chunk_size), h, w,
                                              targets, False)
    for got, want in zip((loss_c, stats_c["ce"], stats_c["reg"], *grads_c),
                         (loss_p, stats_p["ce"], stats_p["reg"], *grads_p)):
        assert_close(got, want, 1e-12)
    assert grads_c[0][0, :5].abs().max() == 0  # ignored tokens get no gradient


def test_all_targets_ignored_gives_zero_loss_like_plain():
    h, w, targets = make_inputs(torch.float32)
    targets = torch.full_like(targets, -1)
    loss, _, (grad_h, grad_w) = loss_and_grads(make_head("z_loss", chunk_size=8), h, w, targets,
                                               False)
    assert loss.item() == 0.0 == make_head("z_loss")(h, w, targets)[0].item()
    assert grad_h.abs().max() == 0 and grad_w.abs().max() == 0


@pytest.mark.parametrize("name", heads.HEADS)
def test_without_grad_gives_the_same_loss_and_does_no_backward_work(name):
    """Under no_grad only the forward matmul runs (2·N·D·V FLOPs), not the two of ∂L/∂h and
    ∂L/∂W: ctx.needs_input_grad says True there, so the decision is taken at the call site."""
    h, w, targets = make_inputs(torch.float32)
    n_tokens = targets.numel()
    with torch.no_grad(), FlopCounterMode(display=False) as flops:
        loss, stats = make_head(name, chunk_size=8)(h, w, targets)
    assert flops.get_total_flops() == 2 * n_tokens * D * V
    assert_close(loss, make_head(name)(h, w, targets)[0].detach(), 2e-6)
    assert not loss.requires_grad and stats["ce"] > 0


@pytest.mark.parametrize("name", ["soft_cap", "mu_loss"])
def test_head_loss_path_switches_a_whole_model(name):
    """Setting head.chunk_size routes model(idx, targets) through the chunked path: same loss,
    same gradient for every parameter of the model."""
    config = model.config_for("tiny", vocab_size=V, block_size=32)
    torch.manual_seed(0)
    gpt = model.GPT(config, make_head(name))
    idx = torch.randint(0, V, (2, 32))
    targets = torch.roll(idx, -1, dims=1)
    results = []
    for chunk_size in (0, 24):
        gpt.head.chunk_size = chunk_size
        gpt.zero_grad(set_to_none=True)
        loss, _ = gpt(idx, targets)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in gpt.parameters()]))
    (loss_plain, grads_plain), (loss_chunked, grads_chunked) = results
    assert_close(loss_chunked, loss_plain, 2e-6)
    for grad_c, grad_p in zip(grads_chunked, grads_plain):
        assert_close(grad_c, grad_p, 1e-5)


@pytest.mark.parametrize("name", heads.HEADS)
def test_compiled_loss_keeps_its_gradient(name):
    """torch.compile of a head, with W a captured parameter as in a compiled model: the loss
    still has a grad_fn, and its gradient equals eager's. (Guards a torch 2.13 bug: CE + 0 next
    to CE.detach() came back without a grad.)"""
    head = make_head(name)
    h, w, targets = make_inputs(torch.float32, n_tokens=7)
    h = h.detach()
    compiled = torch.compile(lambda h, targets: head(h, w, targets)[0])
    loss = compiled(h, targets)
    assert loss.requires_grad
    (grad_compiled,) = torch.autograd.grad(loss, w)
    (grad_eager,) = torch.autograd.grad(head(h, w, targets)[0], w)
    assert_close(grad_compiled, grad_eager, 1e-5)


@pytest.mark.parametrize("path", ["plain", "chunked"])
@pytest.mark.parametrize("name", heads.HEADS)
def test_a_float32_head_under_bf16_autocast_is_the_float32_head(name, path):
    """train.py --head_dtype float32: under bf16 autocast the head's matmul and its backward
    stay float32, so loss and gradients are the all-float32 head's to float32 rounding, where
    the autocast head is off by bf16's (the control shows the test can tell them apart)."""
    h, w, targets = make_inputs(torch.float32)
    chunk_size = 8 if path == "chunked" else 0
    float32_head = make_head(name, chunk_size, matmul_dtype=torch.float32)
    autocast_head = make_head(name, chunk_size)
    reference = loss_and_grads(make_head(name), h, w, targets, autocast=False)
    ours = loss_and_grads(float32_head, h, w, targets, autocast=True)
    bf16 = loss_and_grads(autocast_head, h, w, targets, autocast=True)
    for got, want, low in zip((ours[0], *ours[2]), (reference[0], *reference[2]),
                              (bf16[0], *bf16[2])):
        assert_close(got, want, 2e-6)
        assert (low.double() - want.double()).abs().max() > 1e-4 * want.abs().max()

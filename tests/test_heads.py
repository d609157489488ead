"""heads.py: the five LM heads against independent float64 formulas, Lemma 1, Proposition 3,
Table 1's symmetries and validation (Theorem 4: tests/test_analyze.py, tests/test_theorem4.py)."""
import math

import pytest
import torch

import heads

F64 = torch.float64
LAM, CAP = 0.3, 2.0  # far from the defaults so every regulariser and the cap actually matter


def rand(*shape, seed=0, dtype=F64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def toy_batch(V=7, D=4, shape=(2, 3), seed=0):
    """h (*shape, D), weight (V, D) with a common shift (anisotropic), targets with one -1."""
    h = rand(*shape, D, seed=seed)
    weight = rand(V, D, seed=seed + 1) + 1.5 * rand(D, seed=seed + 2)
    targets = torch.randint(0, V, shape, generator=torch.Generator().manual_seed(seed + 3))
    targets.view(-1)[1] = -1
    return h, weight, targets


def reference_loss(name, h, weight, targets, lam=LAM, cap=CAP):
    """(ce, reg) written out from the paper's equations, in float64, without heads.py."""
    h, weight = h.to(F64).reshape(-1, h.shape[-1]), weight.to(F64)
    targets = targets.reshape(-1)
    logits = h @ weight.T                                                    # Eq. 3
    if name == "soft_cap":
        logits = cap * torch.tanh(logits / cap)                             # Eq. 6
    log_z = torch.log(torch.exp(logits).sum(dim=1))                         # Eq. 4
    kept = [n for n in range(len(targets)) if targets[n] != -1]
    ce = sum(log_z[n] - logits[n, targets[n]] for n in kept) / len(kept)   # Eq. 1-2
    reg = torch.zeros((), dtype=F64)
    if name == "z_loss":
        reg = lam * sum(log_z[n] ** 2 for n in kept) / len(kept)           # Eq. 5
    if name == "mu_loss":
        mu = weight.sum(dim=0) / weight.shape[0]                            # Eq. 7
        reg = lam * (mu * mu).sum()                                         # Eq. 15
    return ce, reg


def make(name):
    return heads.build(name, lam=LAM if name in ("z_loss", "mu_loss") else None,
                       cap=CAP if name == "soft_cap" else None)


# --- Lemma 1, Proposition 3 ---------------------------------------------------------------

def test_lemma1_mean_logit_is_mu_dot_h():
    h, weight, _ = toy_batch(V=50, D=8)
    logits = heads.build("baseline").logits(h, weight)
    torch.testing.assert_close(logits.mean(-1), h @ heads.mean_embedding(weight),
                               rtol=0, atol=1e-13)


def test_proposition3_mu_centering_keeps_softmax_std_and_loss():
    h, weight, targets = toy_batch(V=50, D=8)
    head = heads.build("mu_center")
    before_logits = head.logits(h, weight)
    before_loss, _ = head(h, weight, targets)
    head.after_step(weight)
    after_logits = head.logits(h, weight)
    after_loss, _ = head(h, weight, targets)
    assert before_logits.mean(-1).abs().max() > 1.0            # it was not centred before
    assert after_logits.mean(-1).abs().max() < 1e-13           # (i)
    torch.testing.assert_close(after_logits.std(-1), before_logits.std(-1), rtol=1e-13, atol=0)
    torch.testing.assert_close(after_logits.softmax(-1), before_logits.softmax(-1),
                               rtol=1e-12, atol=1e-15)         # (iii)
    torch.testing.assert_close(after_loss, before_loss, rtol=1e-13, atol=0)
    assert heads.mean_embedding(weight).abs().max() < 1e-14


# --- every head against the formulas ---------------------------------------------------------

@pytest.mark.parametrize("name", heads.HEADS)
def test_loss_and_stats_match_independent_float64_formula(name):
    h, weight, targets = toy_batch()
    loss, stats = make(name)(h, weight, targets)
    ce, reg = reference_loss(name, h, weight, targets)
    torch.testing.assert_close(loss, ce + reg, rtol=1e-12, atol=0)
    torch.testing.assert_close(stats["ce"], ce, rtol=1e-12, atol=0)
    torch.testing.assert_close(stats["reg"], reg, rtol=1e-12, atol=1e-300)
    for value in stats.values():
        assert isinstance(value, torch.Tensor) and value.dim() == 0 and not value.requires_grad
    assert (reg > 0) == (name in ("z_loss", "mu_loss"))


@pytest.mark.parametrize("name", heads.HEADS)
def test_float32_inputs_give_float32_loss_and_stats(name):
    h, weight, targets = toy_batch()
    loss, stats = make(name)(h.float(), weight.float().requires_grad_(), targets)
    assert loss.dtype == stats["ce"].dtype == stats["reg"].dtype == torch.float32
    assert loss.dim() == 0 and loss.requires_grad


@pytest.mark.parametrize("name", heads.HEADS)
def test_gradcheck(name):
    h, weight, targets = toy_batch(V=5, D=3, shape=(4,))
    head = make(name)
    h.requires_grad_(), weight.requires_grad_()
    assert torch.autograd.gradcheck(lambda h, w: head(h, w, targets)[0], (h, weight))


@pytest.mark.parametrize("name", heads.HEADS)
def test_ignored_targets_count_for_nothing(name):
    h, weight, targets = toy_batch(shape=(6,))
    targets[[0, 3]] = -1
    kept = targets != -1
    head = make(name)
    torch.testing.assert_close(head(h, weight, targets)[0],
                               head(h[kept], weight, targets[kept])[0], rtol=1e-13, atol=0)


@pytest.mark.parametrize("name", heads.HEADS)
def test_all_targets_ignored_gives_zero_token_loss_without_nan(name):
    """Documented choice: the mean over no tokens is 0, so only μ-loss's weight term remains."""
    h, weight, _ = toy_batch()
    weight.requires_grad_()
    loss, stats = make(name)(h, weight, torch.full((2, 3), -1))
    loss.backward()
    assert stats["ce"] == 0 and torch.isfinite(weight.grad).all()
    _, reg = reference_loss("mu_loss", h, weight.detach(), torch.zeros(1, dtype=torch.long))
    assert loss.item() == pytest.approx(reg.item() if name == "mu_loss" else 0.0, rel=1e-12)


def test_mu_loss_pulls_every_row_by_the_same_2_lambda_mu_over_V():
    h, weight, _ = toy_batch(V=9, D=4)
    weight.requires_grad_()
    loss, _ = make("mu_loss")(h, weight, torch.full((2, 3), -1))  # only the μ-loss term is left
    loss.backward()
    expected = 2 * LAM * weight.detach().mean(0) / 9
    torch.testing.assert_close(weight.grad, expected.expand(9, 4), rtol=1e-13, atol=0)


# --- Table 1: symmetry under l -> -l -----------------------------------------------------------

def test_z_loss_is_not_symmetric_eq_17_18():
    # V = 2, h = 1, e = (2, 0): l = (2, 0), S = exp(0) = 1 for the first logit.
    head = heads.build("z_loss", lam=1.0)
    h, targets = torch.ones(1, 1, dtype=F64), torch.tensor([-1, 0])[1:]
    weight = torch.tensor([[2.0], [0.0]], dtype=F64)
    reg_plus = head(h, weight, targets)[1]["reg"]
    reg_minus = head(h, -weight, targets)[1]["reg"]        # l -> -l
    assert reg_plus.item() == pytest.approx(math.log(math.exp(2) + 1) ** 2, rel=1e-14)
    assert reg_minus.item() == pytest.approx(math.log(math.exp(-2) + 1) ** 2, rel=1e-14)
    assert reg_plus > 100 * reg_minus
    # and on random logits too
    h, weight, targets = toy_batch()
    assert not torch.isclose(head(h, weight, targets)[1]["reg"],
                             head(h, -weight, targets)[1]["reg"], rtol=1e-3)


def test_z_loss_is_symmetric_exactly_when_the_sinh_of_the_logits_sum_to_zero():
    """ZLoss's derivation: L_z(l) = L_z(−l) ⇔ Σⱼ sinh(lⱼ) = 0, also for logits that are not
    symmetric, l = (asinh 2, −asinh 1, −asinh 1)."""
    head = heads.build("z_loss", lam=1.0)
    h, targets = torch.ones(1, 1, dtype=F64), torch.tensor([0])
    weight = torch.tensor([[math.asinh(2)], [-math.asinh(1)], [-math.asinh(1)]], dtype=F64)
    assert torch.sinh(weight).sum().abs() < 1e-15
    reg_plus, reg_minus = head(h, weight, targets)[1]["reg"], head(h, -weight, targets)[1]["reg"]
    assert reg_plus.item() == pytest.approx(reg_minus.item(), rel=1e-14)
    weight[0, 0] += 0.1  # Σ sinh ≠ 0: no longer symmetric
    assert head(h, weight, targets)[1]["reg"] != pytest.approx(
        head(h, -weight, targets)[1]["reg"].item(), rel=1e-3)


def test_soft_cap_and_mu_loss_are_symmetric():
    h, weight, targets = toy_batch()
    cap = make("soft_cap")
    torch.testing.assert_close(cap.logits(h, -weight), -cap.logits(h, weight), rtol=0, atol=0)
    mu_loss = make("mu_loss")
    torch.testing.assert_close(mu_loss(h, -weight, targets)[1]["reg"],
                               mu_loss(h, weight, targets)[1]["reg"], rtol=0, atol=0)


def test_soft_cap_is_a_model_intervention_seen_by_logits():
    h, weight, _ = toy_batch()
    raw = heads.build("baseline").logits(h, 100 * weight)
    logits = heads.build("soft_cap").logits(h, 100 * weight)
    assert raw.abs().max() > 300 and logits.abs().max() <= 30.0
    torch.testing.assert_close(logits, 30 * torch.tanh(raw / 30), rtol=1e-15, atol=0)


# --- precision -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", heads.HEADS)
def test_bf16_inputs_get_float32_softmax(name):
    """Small integers are exact in bf16, and so are the integer logits of their matmul; what
    is left to lose is the softmax / log Z / regulariser precision, which must be float32."""
    g = torch.Generator().manual_seed(0)
    h = torch.randint(-3, 4, (4, 8, 16), generator=g).to(F64)
    weight = torch.randint(-2, 3, (300, 16), generator=g).to(F64)
    targets = torch.randint(0, 300, (4, 8), generator=g)
    head = make(name)
    logits = head.logits(h.bfloat16(), weight.bfloat16())
    loss, stats = head(h.bfloat16(), weight.bfloat16(), targets)
    assert logits.dtype == loss.dtype == stats["ce"].dtype == torch.float32
    raw = heads.build("baseline").logits(h.bfloat16(), weight.bfloat16())
    torch.testing.assert_close(raw, (h @ weight.T).float(), rtol=0, atol=0)
    ce, reg = reference_loss(name, h, weight, targets)
    assert loss.item() == pytest.approx((ce + reg).item(), rel=1e-5)   # bf16 would be ~1e-3 off
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto_loss, _ = head(h.float(), weight.float(), targets)
    assert auto_loss.dtype == torch.float32
    assert auto_loss.item() == pytest.approx((ce + reg).item(), rel=1e-5)


def test_mu_loss_term_is_float32_under_bf16_autocast():
    """λ·μ·μ must not go through autocast's bf16 matmul (≈ 2⁻⁹ relative error)."""
    _, weight, _ = toy_batch(V=64, D=32)
    weight = weight.float()
    head, targets = heads.build("mu_loss", lam=1.0), torch.full((1,), -1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, stats = head(torch.zeros(1, 32), weight, targets)
    exact = weight.double().mean(0).square().sum()
    assert stats["reg"].dtype == torch.float32
    assert abs(stats["reg"].item() - exact.item()) <= 1e-6 * exact.item()


# --- after_step -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", heads.HEADS)
def test_after_step_only_mu_center_changes_weight_in_place(name):
    _, weight, _ = toy_batch()
    param = torch.nn.Parameter(weight.clone())
    storage, before = param.data_ptr(), param.detach().clone()
    heads.build(name).after_step(param)
    assert param.data_ptr() == storage and param.requires_grad
    if name == "mu_center":
        torch.testing.assert_close(param.detach(), before - before.mean(0), rtol=0, atol=1e-15)
    else:
        assert torch.equal(param.detach(), before)


def test_mu_center_on_bf16_weight_centres_it():
    _, weight, _ = toy_batch(V=64, D=8)
    param = torch.nn.Parameter(weight.bfloat16())
    heads.build("mu_center").after_step(param)
    assert param.dtype == torch.bfloat16
    assert heads.mean_embedding(param).abs().max() < 2e-2 < weight.mean(0).abs().max()


# --- validation -----------------------------------------------------------------------------

def test_build_defaults_and_none_means_default():
    assert heads.build("soft_cap").cap == 30.0 and heads.build("soft_cap", cap=None).cap == 30.0
    assert heads.build("z_loss", lam=None, cap=None).lam == 1e-4
    assert heads.build("mu_loss", lam=0).lam == 0.0
    assert heads.build("baseline", lam=None, cap=None).name == "baseline"
    assert [heads.build(n).name for n in heads.HEADS] == list(heads.HEADS)


def test_unknown_name_lists_the_heads():
    with pytest.raises(ValueError, match="baseline, soft_cap, z_loss, mu_loss, mu_center"):
        heads.build("mu_centre")


@pytest.mark.parametrize("name, hparams, message", [
    ("soft_cap", {"temperature": 2.0}, "does not use temperature=2.0; it takes cap"),
    ("baseline", {"lam": 1e-4}, "does not use lam=0.0001; it takes no hyperparameters"),
    ("mu_loss", {"cap": 30.0}, "does not use cap=30.0; it takes lam"),
])
def test_a_hyperparameter_the_head_does_not_take_is_named(name, hparams, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        heads.build(name, **hparams)

"""heads.py: the five LM heads against independent float64 formulas, Lemma 1, Proposition 3,
Table 1's symmetries, validation, and Theorem 4 step by step (counterexamples included)."""
import math

import pytest
import torch

import heads
import measure

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


def test_plain_softmax_holds_exactly_where_cap_logits_and_log_z_penalty_are_heads_own():
    """The loss-path rule reads the hooks, not the name: a subclass that overrides either hook,
    even with the identity, leaves the plain-softmax paths."""
    assert [n for n in heads.HEADS if heads.build(n).plain_softmax] == \
        ["baseline", "mu_loss", "mu_center"]

    class Capped(heads.MuLoss):
        def cap_logits(self, logits):
            return logits

    class Penalised(heads.Head):
        def log_z_penalty(self, log_z):
            return None
    assert not Capped(lam=LAM).plain_softmax and not Penalised().plain_softmax


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


def test_unknown_hparam_lists_the_valid_ones():
    with pytest.raises(ValueError, match="'temperature'.*cap, lam"):
        heads.build("soft_cap", temperature=2.0)


@pytest.mark.parametrize("name, hparams, message", [
    ("soft_cap", {"cap": 0}, "cap=0.0 is invalid; give a finite number > 0"),
    ("soft_cap", {"cap": -1.0}, "cap=-1.0 is invalid"),
    ("soft_cap", {"cap": float("inf")}, "cap=inf is invalid"),
    ("z_loss", {"lam": -1e-4}, "lam=-0.0001 is invalid; give a finite number >= 0"),
    ("mu_loss", {"lam": float("nan")}, "lam=nan is invalid"),
    ("mu_loss", {"lam": "big"}, "lam='big' is not a number"),
    ("baseline", {"lam": 1e-4}, "does not use lam=0.0001; lam applies to z_loss and mu_loss"),
    ("mu_loss", {"cap": 30.0}, "cap applies to soft_cap only"),
])
def test_bad_hparam_values_are_rejected_with_the_rule(name, hparams, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        heads.build(name, **hparams)


# --- Theorem 4 ------------------------------------------------------------------------------
# The smallest counterexamples found by exhaustive search (V = 3, D = 2, entries in {-2..2});
# V = 2 or D = 1 cannot give any (see theorem4.py's docstring and the two "holds" tests below).

E1 = torch.tensor([[-1.0, 0.0], [0.0, -1.0], [0.0, 1.0]], dtype=F64)   # mu = (-1/3, 0)
E2 = torch.tensor([[-1.0, 0.0], [-1.0, 0.0], [0.0, -1.0]], dtype=F64)  # mu = (-2/3, -1/3)
E3 = torch.tensor([[-1.0, -1.0], [-1.0, 1.0], [1.0, 0.0]], dtype=F64)  # mu = (-1/3, 0)


def centred(e):
    return e - e.mean(0)


def max_abs_logit(e, h):
    return (e @ h).abs().max().item()


def max_sq_norm(e):
    return (e ** 2).sum(1).max().item()


def anisotropic(V, D, seed):
    """Rows with per-axis scales and a common shift, like trained output embeddings."""
    scales = 2 * torch.rand(D, generator=torch.Generator().manual_seed(seed), dtype=F64)
    return rand(V, D, seed=seed) * scales + 3 * rand(D, seed=seed + 1)


CASES = [(3, 2, 0), (10, 4, 1), (100, 16, 2), (500, 32, 3)]


@pytest.mark.parametrize("V, D, seed", CASES)
def test_b_ratio_is_the_ratio_of_max_abs_dot_products_eq_25_26(V, D, seed):
    e = anisotropic(V, D, seed)
    mu = e.sum(0) / V
    expected = (centred(e) @ mu).abs().max() / (e @ mu).abs().max()
    assert measure.b_ratio(e) == pytest.approx(expected.item(), rel=1e-12)
    # (i): so B_ratio <= 1 <=> max|l*| <= max|l| holds exactly in the direction h = mu
    assert (measure.b_ratio(e) <= 1) == (max_abs_logit(centred(e), mu) <= max_abs_logit(e, mu))


def test_b_ratio_edge_cases_and_input_types():
    assert measure.b_ratio(centred(E1)) == 1.0                          # mu = 0: 0/0 defined as 1
    assert measure.b_ratio(torch.nn.Parameter(E1.float())) == pytest.approx(2 / 3, rel=1e-7)
    assert isinstance(measure.b_ratio(E1), float)


def test_eq_13_needs_tight_bounds():
    """With the valid but loose B- = 1 (tight: 1/9) Eq. 13 gives 9/8 instead of 2/3."""
    mu2 = 1 / 9
    b_minus, b_plus = 1.0, 1 / 3 - mu2
    assert max(b_minus, b_plus) / max(b_minus - mu2, b_plus + mu2) == pytest.approx(9 / 8)
    assert measure.b_ratio(E1) == pytest.approx(2 / 3, rel=1e-14)


def test_eq_32_max_of_sum_is_not_sum_of_maxes():
    e_star = centred(E1)
    mu_hat = E1.mean(0) / E1.mean(0).norm()
    parallel = (e_star @ mu_hat) ** 2
    perpendicular = (e_star ** 2).sum(1) - parallel
    assert max_sq_norm(e_star) == pytest.approx(10 / 9)
    assert (parallel.max() + perpendicular.max()).item() == pytest.approx(4 / 9 + 1)


def test_eq_33_as_printed_is_not_the_line_above_and_not_negative():
    mu = E1.mean(0)
    mu_hat = mu / mu.norm()
    e_star = centred(E1)
    line2 = ((e_star @ mu_hat) ** 2).max() - ((E1 @ mu_hat) ** 2).max()     # parallel parts
    printed = (e_star @ mu_hat).abs().max() - (E1 @ mu).abs().max()       # as in the paper
    assert line2.item() == pytest.approx(-5 / 9) and printed.item() == pytest.approx(1 / 3)
    assert measure.b_ratio(E1) <= 1 and printed > 0


def test_eq_34_norms_can_grow_although_b_ratio_is_at_most_1():
    assert measure.b_ratio(E1) == pytest.approx(2 / 3)
    assert max_sq_norm(centred(E1)) == pytest.approx(10 / 9) and max_sq_norm(E1) == 1.0


def test_lemma_2_step_smaller_bound_does_not_mean_smaller_logit():
    h = torch.tensor([-3.0, 2.0], dtype=F64)
    assert max_sq_norm(centred(E2)) == pytest.approx(8 / 9) and max_sq_norm(E2) == 1.0
    assert measure.b_ratio(E2) == pytest.approx(1 / 3)
    assert max_abs_logit(E2, h) == 3.0
    assert max_abs_logit(centred(E2), h) == pytest.approx(10 / 3)   # Eq. 14 "=>" fails too


def test_eq_14_fails_strictly_both_ways_smallest_examples_of_b_ratio_docstring():
    """⇒: E₂, B_ratio = 1/3, h = (−1, 1): max|l*| = 4/3 > 1 = max|l|.
    ⇐: E₃, B_ratio = 4/3, h = (1, 1): max|l*| = 5/3 < 2 = max|l| (strict, unlike h ⊥ μ)."""
    h2, h3 = torch.tensor([-1.0, 1.0], dtype=F64), torch.tensor([1.0, 1.0], dtype=F64)
    assert measure.b_ratio(E2) == pytest.approx(1 / 3, rel=1e-14)
    assert max_abs_logit(E2, h2) == 1.0 and max_abs_logit(centred(E2), h2) == pytest.approx(4 / 3)
    assert measure.b_ratio(E3) == pytest.approx(4 / 3, rel=1e-14)
    assert max_abs_logit(E3, h3) == 2.0 and max_abs_logit(centred(E3), h3) == pytest.approx(5 / 3)


def test_b_bounds_are_the_tight_bounds_of_eq_12():
    b_minus, b_plus, mu_sq = measure.b_bounds(E1)                  # e·μ = (1/3, 0, 0), ‖μ‖² = 1/9
    assert (b_minus, b_plus, mu_sq) == pytest.approx((1 / 9, 2 / 9, 1 / 9), rel=1e-14)
    e = anisotropic(100, 16, 2)
    b_minus, b_plus, mu_sq = measure.b_bounds(e)
    dots = e @ e.mean(0)
    assert dots.min().item() == pytest.approx(mu_sq - b_minus) and b_minus >= 0 and b_plus >= 0
    assert dots.max().item() == pytest.approx(mu_sq + b_plus)


def test_eq_14_forward_fails_for_a_given_h():
    h = torch.tensor([1.0, -3.0], dtype=F64)
    assert measure.b_ratio(E1) <= 1
    assert max_abs_logit(E1, h) == 3.0 and max_abs_logit(centred(E1), h) == pytest.approx(10 / 3)


def test_eq_14_backward_fails_for_a_given_h_and_for_the_norm_bound():
    h = torch.tensor([0.0, 1.0], dtype=F64)                       # h ⊥ mu: l* = l
    assert measure.b_ratio(E3) == pytest.approx(4 / 3)
    assert max_abs_logit(centred(E3), h) == max_abs_logit(E3, h) == 1.0
    assert max_sq_norm(centred(E3)) == pytest.approx(16 / 9) and max_sq_norm(E3) == 2.0


@pytest.mark.parametrize("V, D, seed", CASES)
def test_what_holds_for_every_h(V, D, seed):
    e = anisotropic(V, D, seed)
    e_star, mu = centred(e), e.mean(0)
    H = rand(D, 64, seed=seed + 7)
    l, l_star = e @ H, e_star @ H                                   # (V, 64): 64 hidden states
    # (ii) l* = l - mean(l), hence max|l*| <= max l - min l
    torch.testing.assert_close(l_star, l - l.mean(0), rtol=0, atol=1e-11)
    assert (l_star.abs().amax(0) <= l.amax(0) - l.amin(0) + 1e-12).all()
    # (iii) the mean square drops by exactly the removed mean, for logits and for row norms
    torch.testing.assert_close((l_star ** 2).mean(0), (l ** 2).mean(0) - l.mean(0) ** 2,
                               rtol=1e-10, atol=1e-10)
    assert ((e_star ** 2).sum(1).mean() - ((e ** 2).sum(1).mean() - mu @ mu)).abs() < 1e-10
    # (iv) row i's norm shrinks exactly when e_i·mu >= |mu|^2 / 2
    shrinks = (e_star ** 2).sum(1) <= (e ** 2).sum(1)
    assert torch.equal(shrinks, e @ mu >= (mu @ mu) / 2)


def test_no_counterexample_exists_for_v2_or_d1():
    for seed in range(20):
        e2, H = anisotropic(2, 5, seed), rand(5, 64, seed=seed + 50)
        assert ((centred(e2) @ H).abs().amax(0) <= (e2 @ H).abs().amax(0) + 1e-12).all()
        e1, h = anisotropic(7, 1, seed), rand(1, seed=seed + 60)
        assert (measure.b_ratio(e1) <= 1) == (max_abs_logit(centred(e1), h) <= max_abs_logit(e1, h))

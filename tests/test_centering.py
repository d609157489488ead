"""What μ-centering changes, and what it cannot.

Untied, every row eᵢ of the output embedding enters the loss only through the logits
lᵢ = eᵢ·h, and softmax is shift-invariant per token: rows eᵢ − c give logits lᵢ − c·h and the
same probabilities, hence the same loss and the same gradients for every parameter (∂L/∂eᵢ
= (pᵢ − [i = t])·h does not see c). Clipping sees the same gradient norm, and AdamW's update
is a function of the gradients alone plus decoupled weight decay, which is linear
((W − 1cᵀ)(1 − ηλ) = W(1 − ηλ) − 1((1 − ηλ)c)ᵀ is again W's decay shifted by a common row).
So by induction the centred run is the baseline run with every output row shifted by the same
vector: same predictions at every step, in exact arithmetic. What is left to differ is
rounding. Tied, the matrix is also the input embedding, and the shift moves every input
vector, so the function changes.
"""
import math

import pytest
import torch

import heads
import measure
import model

V, T, STEPS = 512, 32, 40


def trained_log_probs(head_name, tie, weight_decay, dtype=torch.float64):
    """log p of a fixed batch after STEPS AdamW steps (the recipe of train.py: clip 1.0,
    β = (0.9, 0.95), ε = 1e-8, then head.after_step), from the same initial weights."""
    torch.manual_seed(0)
    gpt = model.GPT(model.config_for("tiny", vocab_size=V, block_size=T, tie=tie),
                    heads.build(head_name)).to(dtype)
    optimizer = torch.optim.AdamW(gpt.parameters(), lr=3e-2, betas=(0.9, 0.95), eps=1e-8,
                                  weight_decay=weight_decay)
    data = torch.Generator().manual_seed(1)
    seen = torch.randperm(V, generator=data)[:64]  # most tokens are never seen, as in a corpus
    for _ in range(STEPS):
        x, y = seen[torch.randint(0, 64, (2, T + 1), generator=data)].split([T, 1], dim=1)
        y = torch.cat((x[:, 1:], y), dim=1)
        loss, _ = gpt(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(gpt.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        gpt.head.after_step(gpt.output_weight)
    probe = seen[torch.randint(0, 64, (4, T), generator=data)]
    with torch.no_grad():
        return torch.log_softmax(gpt(probe).to(torch.float64), dim=-1), gpt


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_untied_centering_follows_the_baseline_exactly_in_float64(weight_decay):
    base, base_gpt = trained_log_probs("baseline", tie=False, weight_decay=weight_decay)
    centred, centred_gpt = trained_log_probs("mu_center", tie=False, weight_decay=weight_decay)
    assert (centred - base).abs().max() < 1e-9  # float64 rounding, grown over 40 steps
    # ... while the weights differ by one common row: the baseline's μ (which has grown)
    shift = base_gpt.output_weight - centred_gpt.output_weight
    mu = heads.mean_embedding(base_gpt.output_weight.detach())
    assert mu.norm() > 0.1
    assert torch.allclose(shift, mu.expand_as(shift), atol=1e-9)


def test_tied_centering_changes_the_function():
    base, _ = trained_log_probs("baseline", tie=True, weight_decay=0.0)
    centred, _ = trained_log_probs("mu_center", tie=True, weight_decay=0.0)
    assert (centred - base).abs().max() > 1e-2


# ---- what the matmul's dtype costs (measure.precision_stat_sums) --------------------------------

def precision(weight, h, targets, dtype=torch.bfloat16, head="baseline"):
    sums = measure.precision_stat_sums(heads.build(head), h, weight, targets, dtype)
    return dict(zip(measure.PRECISION_STATS, (sums[:3] / sums[3]).tolist()))


@pytest.fixture
def head_inputs():
    g = torch.Generator().manual_seed(0)
    weight = 0.3 * torch.randn(1000, 64, generator=g)
    h = 3 * torch.randn(48, 64, generator=g)
    targets = torch.randint(0, 1000, (48,), generator=g)
    targets[:5] = heads.IGNORE
    return weight, h, targets


def test_precision_stats_match_a_float64_computation_by_hand(head_inputs):
    weight, h, targets = head_inputs
    stats = precision(weight, h, targets)
    keep = targets != heads.IGNORE
    x, t = h[keep], targets[keep]
    exact = x.double() @ weight.double().T
    cast = x.bfloat16().double() @ weight.bfloat16().double().T
    rounded = (x.bfloat16() @ weight.bfloat16().T).double()
    sigma = exact.std(dim=1, correction=0)
    ce = lambda l: (torch.logsumexp(l, 1) - l.gather(1, t[:, None]).squeeze(1)).mean()
    spread = lambda d: (d.std(1, correction=0) / sigma).mean()
    assert stats["prec_ce_gap"] == pytest.approx((ce(rounded) - ce(exact)).item(), abs=1e-12)
    assert stats["prec_err_cast"] == pytest.approx(spread(cast - exact).item(), rel=1e-9)
    assert stats["prec_err_round"] == pytest.approx(spread(rounded - cast).item(), rel=1e-9)
    assert 1e-4 < stats["prec_err_cast"] < 1e-2  # bf16 keeps 8 significant bits


def test_an_error_common_to_all_logits_of_a_token_is_not_counted():
    # Every row has 1 in column 0 and small integers elsewhere (bf16-exact); h₀ = 1 + 2⁻¹⁰ is not
    # a bf16 number, so the cast moves every logit of the token by the same −2⁻¹⁰: softmax and
    # the loss cannot see that, and neither may prec_err_cast (an rms over rows would be 2⁻¹⁰/σ).
    gen = torch.Generator().manual_seed(0)
    weight = torch.cat((torch.ones(256, 1), torch.randint(-4, 5, (256, 7), generator=gen)), 1)
    h = torch.cat((torch.full((3, 1), 1 + 2 ** -10), torch.randint(-2, 3, (3, 7),
                                                                   generator=gen)), 1).float()
    stats = precision(weight.float(), h, torch.zeros(3, dtype=torch.long))
    assert stats["prec_err_cast"] == 0.0 and stats["prec_ce_gap"] == pytest.approx(0, abs=1e-12)


def test_float32_matmul_costs_nothing_measurable(head_inputs):
    stats = precision(*head_inputs, dtype=torch.float32)
    assert stats["prec_err_cast"] == 0.0
    assert stats["prec_err_round"] < 1e-6 and abs(stats["prec_ce_gap"]) < 1e-5


def test_a_common_shift_costs_bf16_precision_and_centering_gives_it_back(head_inputs):
    weight, h, targets = head_inputs
    shifted = weight + 60 * torch.randn(64, generator=torch.Generator().manual_seed(3)) / 8
    plain, drowned = precision(weight, h, targets), precision(shifted, h, targets)
    # same exact logits up to the common offset, so only the rounding can differ
    assert drowned["prec_err_cast"] > 10 * plain["prec_err_cast"]
    assert drowned["prec_err_round"] > 10 * plain["prec_err_round"]
    assert abs(drowned["prec_ce_gap"]) > 3 * abs(plain["prec_ce_gap"])  # signed, so noisier
    centred = shifted.clone()
    heads.build("mu_center").after_step(centred)
    restored = precision(centred, h, targets)
    for key in ("prec_err_cast", "prec_err_round"):
        assert restored[key] < 2 * precision(weight - weight.mean(0), h, targets)[key]


def test_soft_cap_precision_goes_through_the_cap(head_inputs):
    weight, h, targets = head_inputs
    capped = precision(weight * 50, h, targets, head="soft_cap")
    raw = precision(weight * 50, h, targets)
    assert capped["prec_err_cast"] == raw["prec_err_cast"]  # the errors are of the raw matmul
    assert capped["prec_ce_gap"] != raw["prec_ce_gap"]      # the loss is of the capped logits
    assert math.isfinite(capped["prec_ce_gap"])

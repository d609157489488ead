"""The paper's statistics (heads.py) and train.py's measurements: each statistic against a
float64 reference written out here, the tokens they count (ignored targets are not counted),
their standard errors, the evaluation's weighting, and the summary's errors and times."""
import json
import math

import pytest
import torch
import torch.nn.functional as F

import heads
import prepare
import train

LOGIT_REL = 1e-5      # heads.logit_stats against float64 (logit_mean: of max |l|)
PRECISION_REL = 1e-3  # heads.precision_stats against float64
CPU = torch.device("cpu")
FLOAT32 = train.autocast(CPU, "float32")


def reference_logit_stats(logits):
    """The paper's per-token logit statistics in float64, (4, N)."""
    l = logits.double()
    std, mean = torch.std_mean(l, dim=-1, correction=0)
    return torch.stack((mean, std, l.abs().amax(dim=-1), torch.logsumexp(l, dim=-1).square()))


def reference_precision_stats(head, h, weight, targets, dtype):
    """heads.precision_stats's quantities by their definitions, everything in float64."""
    exact = h.double() @ weight.double().T
    cast = h.to(dtype).double() @ weight.to(dtype).double().T
    rounded = F.linear(h.to(dtype), weight.to(dtype)).double()
    sigma = exact.std(dim=-1, correction=0)

    def ce(logits):
        logits = head.cap_logits(logits)
        return torch.logsumexp(logits, -1) - logits.gather(-1, targets[:, None]).squeeze(-1)
    return torch.stack((ce(rounded) - ce(exact), (cast - exact).std(-1, correction=0) / sigma,
                        (rounded - cast).std(-1, correction=0) / sigma))


def trained_like(V=2000, D=64, shift=3.0, seed=0):
    """Rows with a common shift μ (as a trained baseline grows it), hidden states, targets."""
    g = torch.Generator().manual_seed(seed)
    weight = 0.3 * torch.randn(V, D, generator=g) + shift * torch.randn(D, generator=g) / D ** 0.5
    return weight, 3 * torch.randn(40, D, generator=g), torch.randint(0, V, (40,), generator=g)


@pytest.mark.parametrize("shift", [0.0, 30.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logit_stats_are_within_the_stated_tolerance_of_float64(shift, dtype):
    weight, h, _ = trained_like(shift=shift)
    logits = F.linear(h.to(dtype), weight.to(dtype)).float()
    got, want = heads.logit_stats(logits), reference_logit_stats(logits)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=LOGIT_REL * want[2].max().item())
    torch.testing.assert_close(got[1:], want[1:], rtol=LOGIT_REL, atol=0)


@pytest.mark.parametrize("head", ["baseline", "soft_cap"])
@pytest.mark.parametrize("shift", [0.0, 30.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_precision_stats_are_within_the_stated_tolerance_of_float64(head, shift, dtype):
    weight, h, targets = trained_like(shift=shift)
    head = heads.build(head)
    got = heads.precision_stats(head, h, weight, targets, dtype)
    want = reference_precision_stats(head, h, weight, targets, dtype)
    if dtype == torch.float32:
        assert (got[1] == 0).all() and (want[1] == 0).all()  # no input rounding at all
    # per token for the errors; the CE gap is signed and its mean is what is reported
    torch.testing.assert_close(got[1:], want[1:], rtol=PRECISION_REL, atol=0)
    assert got[0].mean().item() == pytest.approx(want[0].mean().item(), rel=PRECISION_REL)


# ---- what the matmul's dtype costs (measure.precision_stat_sums) -----------------------------

def precision(weight, h, targets, dtype=torch.bfloat16, head="baseline"):
    keep = targets != heads.IGNORE
    means = heads.precision_stats(heads.build(head), h[keep], weight, targets[keep], dtype)
    means = means.mean(dim=1)
    return dict(zip(heads.PRECISION_STATS, means.tolist()))


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
    # within the stated tolerance: precision_stats forms these differences in float32
    assert stats["prec_ce_gap"] == pytest.approx((ce(rounded) - ce(exact)).item(),
                                                 rel=PRECISION_REL)
    assert stats["prec_err_cast"] == pytest.approx(spread(cast - exact).item(), rel=PRECISION_REL)
    assert stats["prec_err_round"] == pytest.approx(spread(rounded - cast).item(),
                                                    rel=PRECISION_REL)
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


# ---- train.py: the tokens a statistic counts, its standard error, the evaluation --------------

def tiny_model(*extra):
    args = train.parse_args(["--size", "tiny", "--vocab_size", "96", "--seq_len", "16",
                             "--device", "cpu", *extra])
    return train.build_model(args), args


def test_logit_statistics_match_a_float64_reference():
    model, args = tiny_model("--head", "soft_cap", "--cap", "2")
    x, y = torch.randint(0, 96, (3, 16)), torch.randint(0, 96, (3, 16))
    sums = train.stat_sums(model, x, y, args, FLOAT32)
    stats = train.head_stats(sums, model)
    with torch.no_grad():
        l = model(x).double().flatten(0, 1)                 # soft-capped logits, (48, 96)
    assert (sums[8].item(), sums[15].item()) == (48, 12)  # the counts; precision: every 4th
    assert stats["logit_mean"] == pytest.approx(l.mean(1).mean().item(), abs=1e-6)
    assert stats["logit_std"] == pytest.approx(l.std(1, correction=0).mean().item(), rel=1e-5)
    assert stats["logit_absmax"] == pytest.approx(l.abs().amax(1).mean().item(), rel=1e-6)
    assert stats["log2Z"] == pytest.approx(torch.logsumexp(l, 1).square().mean().item(), rel=1e-5)
    assert stats["logit_absmax"] <= 2                        # the cap holds
    assert abs(stats["prec_ce_gap"]) < 1e-5 and stats["prec_err_cast"] == 0  # float32: exact
    assert 0 < stats["prec_err_round"] < 1e-5


def test_statistics_count_only_the_tokens_whose_target_is_not_ignored():
    """Issue 26: the sums ran over all tokens but were divided by the kept ones' count."""
    model, args = tiny_model()
    with torch.no_grad():  # a drifted μ, so that the mean logit is far from 0
        model.output_weight.add_(torch.randn(64, generator=torch.Generator().manual_seed(1)))
    x, y = torch.randint(0, 96, (3, 16)), torch.randint(0, 96, (3, 16))
    y[:, ::2] = heads.IGNORE
    stats = train.head_stats(train.stat_sums(model, x, y, args, FLOAT32), model)
    keep = y.flatten() != heads.IGNORE
    with torch.no_grad():
        l = model(x).double().flatten(0, 1)[keep]
        h_mean = model.hidden(x).double().flatten(0, 1)[keep].mean(0)
    assert stats["logit_mean"] == pytest.approx(l.mean(1).mean().item(), rel=1e-5)
    assert stats["log2Z"] == pytest.approx(torch.logsumexp(l, 1).square().mean().item(), rel=1e-5)
    assert stats["h_mu_proj"] == pytest.approx(heads.mean_state_alignment(
        h_mean, model.output_weight.detach())[0].item(), rel=1e-5)


def test_standard_errors_are_the_spread_over_tokens_over_root_n():
    model, args = tiny_model()
    x, y = torch.randint(0, 96, (4, 16)), torch.randint(0, 96, (4, 16))
    stats = train.head_stats(train.stat_sums(model, x, y, args, FLOAT32), model,
                             with_se=True)
    with torch.no_grad():
        per_token = heads.logit_stats(model(x).flatten(0, 1))     # 64 tokens
    want = per_token.std(dim=1, correction=1) / 64 ** 0.5
    got = [stats[f"{name}_se"] for name in heads.LOGIT_STATS]
    assert got == pytest.approx(want.tolist(), rel=1e-6)
    assert stats["prec_err_round_se"] > 0 and stats["prec_err_cast_se"] == 0  # float32: exact


def test_the_validation_loss_weights_each_batch_by_its_kept_tokens():
    """Issue 26: each batch's mean CE was weighted by y.numel(), ignored targets included."""
    model, args = tiny_model()
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, 96, (2, 16), generator=g),
                torch.randint(0, 96, (2, 16), generator=g)) for _ in range(2)]
    batches[0][1][:, 2:] = heads.IGNORE                     # 4 kept targets against 32
    with torch.no_grad():
        batches[1][1][:] = model(batches[1][0]).argmax(-1)  # an easy batch: a low loss
        logits = torch.cat([model(x) for x, _ in batches]).flatten(0, 1)
    want = F.cross_entropy(logits.double(), torch.cat([y for _, y in batches]).flatten(),
                           ignore_index=heads.IGNORE).item()
    assert train.evaluate(model, batches, FLOAT32) == pytest.approx(want, rel=1e-5)


def test_the_summary_says_how_long_measuring_took_and_each_statistics_error(tmp_path):
    data = tmp_path / "markov"
    prepare.prepare_synthetic(vocab=64, n_tokens=20_000, out_dir=data)
    out = tmp_path / "run"
    train.main(["--size", "tiny", "--device", "cpu", "--vocab_size", "64", "--data", str(data),
                "--out_dir", str(out), "--steps", "4", "--warmup", "1", "--seq_len", "32",
                "--batch_size", "4", "--eval_tokens", "256", "--stat_tokens", "512"])
    summary = json.loads((out / "summary.json").read_text())
    assert 0 < summary["measure_time_s"] and 0 < summary["train_time_s"]
    for name in train.HEAD_STATS:
        assert math.isfinite(summary[f"{name}_se"]) and summary[f"{name}_se"] >= 0
    assert summary["logit_std_se"] < 0.1 * summary["logit_std"]   # 512 tokens: a tight mean

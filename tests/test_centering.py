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

import pytest
import torch

import heads
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

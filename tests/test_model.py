"""model.py: the paper's decoder — sizes, init, causality, RoPE, tying, bad input, bf16, FLOPs."""
import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import heads
import model

V = 50304  # the paper's (padded GPT-2) vocabulary
PAPER_SIZES = {"16M": 15.6e6, "29M": 28.6e6, "57M": 57.3e6, "109M": 108.4e6, "221M": 220.8e6}


def build(size="tiny", head="baseline", seed=0, **overrides):
    torch.manual_seed(seed)
    return model.GPT(model.config_for(size, **overrides), heads.build(head))


def random_tokens(vocab, B=2, T=32, seed=1):
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------- sizes

@pytest.mark.parametrize("size", PAPER_SIZES)
def test_parameter_counts_match_the_paper_labels(size):
    with torch.device("meta"):  # shapes only: no memory, no init cost
        untied = build(size)
        tied = build(size, tie=True)
    c = untied.config
    L, D, F, hd = c.n_layer, c.n_embd, c.ffn_hidden, c.head_dim
    # per block: qkv + out-proj 4D², SwiGLU 3DF, two LayerNorms 2D, q/k LayerNorms 2·hd;
    # then the final LayerNorm D and the output embedding V·D.
    expected = L * (4 * D * D + 3 * D * F + 2 * D + 2 * hd) + D + V * D
    assert untied.num_params() == expected
    assert abs(expected / PAPER_SIZES[size] - 1) < 0.01
    assert untied.num_params(non_embedding=False) == expected + V * D
    assert tied.num_params() == tied.num_params(non_embedding=False) == expected


def test_flops_per_token_counts_every_matmul_and_the_attention_term():
    m = build(vocab_size=500)
    idx = random_tokens(500, B=2, T=16)
    with FlopCounterMode(display=False) as counter:
        loss, _ = m(idx, idx)
        loss.backward()
    matmul_ops = {torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm}
    counts = counter.get_flop_counts()["Global"]
    matmul_flops = sum(n for op, n in counts.items() if op in matmul_ops)
    c = m.config
    attention = 12 * c.n_layer * c.n_embd * 16
    assert matmul_flops + attention * idx.numel() == m.flops_per_token(16) * idx.numel()
    assert m.flops_per_token(48) - m.flops_per_token(16) == 12 * c.n_layer * c.n_embd * 32


# ------------------------------------------------------------------------------- initialisation

def assert_normal_std(w, std, what):
    """Sample std within 5 standard errors (SE of a normal's std ≈ σ/√(2n)); mean within 5·σ/√n."""
    w = w.detach().double().flatten()
    n = w.numel()
    assert abs(w.std().item() / std - 1) < 5 / math.sqrt(2 * n), what
    assert abs(w.mean().item()) < 5 * std / math.sqrt(n), what


def test_init_follows_xavier_and_the_paper_codes_exceptions():
    m = build("small", vocab_size=V)
    c = m.config
    out_projs = {block.attn.proj for block in m.blocks}
    for name, module in m.named_modules():
        if isinstance(module, torch.nn.Linear) and module not in out_projs:
            xavier = math.sqrt(2 / (module.in_features + module.out_features))
            assert_normal_std(module.weight, xavier, name)
        if isinstance(module, torch.nn.LayerNorm):
            assert torch.equal(module.weight, torch.ones_like(module.weight)), name
            assert module.bias is None, name
    for proj in out_projs:
        assert_normal_std(proj.weight, 0.02 / math.sqrt(2 * c.n_layer), "attention out-proj")
    assert_normal_std(m.wte.weight, 1 / math.sqrt(c.n_embd), "input embedding")
    assert_normal_std(m.output_weight, math.sqrt(2 / (V + c.n_embd)), "output embedding")
    # not truncated: among 6.4M normal draws the largest |z| is about 5.3σ
    z_max = (m.wte.weight.abs().max() * math.sqrt(c.n_embd)).item()
    assert z_max > 4.5


def test_tied_matrix_takes_the_output_embeddings_init():
    m = build("small", vocab_size=V, tie=True)
    assert_normal_std(m.wte.weight, math.sqrt(2 / (V + m.config.n_embd)), "tied embedding")


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("head", heads.HEADS)
def test_initial_loss_is_log_vocabulary(head, tie):
    m = build(head=head, tie=tie)
    idx = random_tokens(V)
    with torch.no_grad():
        loss, stats = m(idx[:, :-1], idx[:, 1:])
    assert abs(loss.item() - math.log(V)) < 0.1
    assert set(stats) >= {"ce", "reg"}


# --------------------------------------------------------------- what the forward pass computes

def test_model_is_causal():
    m = build(vocab_size=97)
    idx = random_tokens(97, T=24)
    with torch.no_grad():
        before = m(idx)
        for changed in (1, 9, 23):
            edited = idx.clone()
            edited[:, changed] = (edited[:, changed] + 1) % 97
            after = m(edited)
            torch.testing.assert_close(after[:, :changed], before[:, :changed], rtol=0, atol=1e-6)
            assert (after[:, changed] - before[:, changed]).abs().max() > 1e-3


def test_targets_of_minus_one_are_ignored():
    m = build(vocab_size=97)
    idx = random_tokens(97, T=12)
    targets = random_tokens(97, T=12, seed=2)
    targets[0, :5] = -1
    targets[1, 7:] = -1
    with torch.no_grad():
        loss, _ = m(idx, targets)
        logits = m(idx).double()
    kept = targets != -1
    reference = torch.nn.functional.cross_entropy(logits[kept], targets[kept])
    assert abs(loss.item() - reference.item()) < 1e-5


def test_forward_under_bf16_autocast_returns_float32():
    m = build(vocab_size=97)
    idx = random_tokens(97, T=16)
    with torch.no_grad():
        loss32, _ = m(idx[:, :-1], idx[:, 1:])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = m(idx)
        loss, stats = m(idx[:, :-1], idx[:, 1:])
    assert logits.dtype == torch.float32 and logits.shape == (2, 16, 97)
    assert torch.isfinite(logits).all()
    assert loss.dtype == torch.float32 and abs(loss.item() - loss32.item()) < 0.05
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


def test_hidden_is_the_final_layernormed_state_the_head_sees():
    m = build(vocab_size=97)
    idx = random_tokens(97, T=8)
    with torch.no_grad():
        h = m.hidden(idx)
        torch.testing.assert_close(m(idx), h @ m.output_weight.T)
    # final LayerNorm with unit weight: every token has mean 0 and variance 1 over D
    torch.testing.assert_close(h.mean(-1), torch.zeros(2, 8), atol=1e-5, rtol=0)
    torch.testing.assert_close(h.var(-1, unbiased=False), torch.ones(2, 8), atol=1e-3, rtol=0)


def test_compiles_to_one_graph():
    m = build(vocab_size=97)
    idx = random_tokens(97, T=8)
    compiled = torch.compile(m, backend="eager", fullgraph=True)  # a graph break would raise
    with torch.no_grad():
        torch.testing.assert_close(compiled(idx), m(idx))


# ----------------------------------------------------------------------------------------- RoPE

def test_rope_turns_pairs_of_the_first_half_and_leaves_the_rest():
    T, hd = 9, 16
    x = torch.randn(2, 3, T, hd, generator=torch.Generator().manual_seed(0))
    cos, sin = model.rope_tables(hd // 2, T)
    out = model.apply_rope(x, cos, sin)
    assert torch.equal(out[..., hd // 2:], x[..., hd // 2:])
    # float64 reference: pair j of position t is the complex number x₂ⱼ + i·x₂ⱼ₊₁ times e^{i·t·θⱼ}
    xd = x[..., : hd // 2].double()
    z = torch.complex(xd[..., 0::2], xd[..., 1::2])
    theta = model.ROPE_BASE ** (-torch.arange(0, hd // 2, 2, dtype=torch.float64) / (hd // 2))
    turned = z * torch.polar(torch.ones(T, hd // 4, dtype=torch.float64),
                             torch.arange(T, dtype=torch.float64)[:, None] * theta)
    reference = torch.stack((turned.real, turned.imag), dim=-1).flatten(-2)
    torch.testing.assert_close(out[..., : hd // 2].double(), reference, atol=1e-5, rtol=0)


def test_rope_scores_depend_only_on_the_offset():
    T, hd = 40, 16
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(hd, generator=gen), torch.randn(hd, generator=gen)
    cos, sin = model.rope_tables(hd // 2, T)
    q_at = model.apply_rope(q.expand(T, hd), cos, sin)  # the same query placed at every position
    k_at = model.apply_rope(k.expand(T, hd), cos, sin)
    scores = (q_at @ k_at.T).double()  # scores[m, n] = q at position m · k at position n
    for offset in (-7, 0, 1, 5, 30):
        diagonal = torch.diagonal(scores, offset)
        assert (diagonal - diagonal[0]).abs().max() < 1e-4 * q.norm() * k.norm()
    assert (scores.diagonal(1)[0] - scores.diagonal(5)[0]).abs() > 1e-3


def test_model_rotates_half_of_each_head_and_keeps_tables_out_of_the_state_dict():
    m = build(vocab_size=97, block_size=64)
    assert m.rope_cos.shape == (64, m.config.head_dim // 4)  # head_dim/2 rotated = head_dim/4 pairs
    state = m.state_dict()
    assert not any("rope" in key for key in state)
    clone = build(vocab_size=97, block_size=64, seed=5)
    clone.load_state_dict(state)
    idx = random_tokens(97, T=8)
    with torch.no_grad():
        torch.testing.assert_close(clone(idx), m(idx), rtol=0, atol=0)


# ----------------------------------------------------------------- weight tying and μ-centering

def test_tied_weights_are_one_tensor_and_untied_are_two():
    tied, untied = build(vocab_size=97, tie=True), build(vocab_size=97)
    assert tied.output_weight is tied.wte.weight
    assert sum(p.shape == (97, 64) for p in tied.parameters()) == 1
    assert untied.output_weight is not untied.wte.weight
    assert sum(p.shape == (97, 64) for p in untied.parameters()) == 2


def test_mu_center_centres_the_tied_matrix_and_the_input_embedding_sees_it():
    m = build(vocab_size=97, tie=True, head="mu_center")
    with torch.no_grad():
        m.output_weight.add_(0.3 * torch.randn(m.config.n_embd))  # a clearly non-zero mean row
    mu = m.output_weight.detach().double().mean(0)
    idx = random_tokens(97, T=8)
    embedded_before = m.wte(idx).detach().double()
    m.head.after_step(m.output_weight)
    assert m.output_weight.double().mean(0).abs().max() < 1e-6
    torch.testing.assert_close(m.wte(idx).detach().double(), embedded_before - mu, atol=1e-6, rtol=0)


def test_mu_center_leaves_an_untied_input_embedding_alone():
    m = build(vocab_size=97, head="mu_center")
    wte_before = m.wte.weight.detach().clone()
    m.head.after_step(m.output_weight)
    assert m.output_weight.double().mean(0).abs().max() < 1e-6
    assert torch.equal(m.wte.weight, wte_before)


# ---------------------------------------------------------------- bad input: one clear sentence

def test_unknown_size_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown model size '17M'; choose one of tiny, small, 16M"):
        model.config_for("17M")


RUN_CONFIG = {"size": "tiny", "vocab_size": 97, "tie": True, "seq_len": 4096, "head": "soft_cap",
              "cap": 5.0, "lam": None, "lr": 3e-3}      # train.py's names; lr is ignored here


def test_from_config_builds_the_run_model_with_room_for_its_sequences():
    torch.manual_seed(0)
    gpt = model.from_config(RUN_CONFIG)
    reference = build(vocab_size=97, tie=True, block_size=4096, head="soft_cap", seed=0)
    assert gpt.config == reference.config and gpt.head.cap == 5.0
    for name, tensor in reference.state_dict().items():
        assert torch.equal(gpt.state_dict()[name], tensor), name
    assert model.from_config({"size": "tiny", "seq_len": 64}).config.block_size == 2048


def test_load_checkpoint_returns_what_train_saved(tmp_path):
    torch.manual_seed(0)
    gpt = model.from_config(RUN_CONFIG)
    torch.save({"model": gpt.state_dict(), "step": 7, "config": RUN_CONFIG}, tmp_path / "c.pt")
    ckpt = model.load_checkpoint(tmp_path / "c.pt")
    assert ckpt["step"] == 7 and ckpt["config"] == RUN_CONFIG
    again = model.from_config(ckpt["config"])
    again.load_state_dict(ckpt["model"])
    assert all(torch.equal(t, gpt.state_dict()[k]) for k, t in again.state_dict().items())


class Payload:
    """Unpickling this runs code: it creates the file `marker`."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")



def test_a_crafted_checkpoint_runs_no_code(tmp_path):
    marker = tmp_path / "code_ran"
    torch.save({"model": Payload(marker), "step": 1, "config": RUN_CONFIG}, tmp_path / "c.pt")
    with pytest.raises(Exception):  # torch's refusal of a weights_only load
        model.load_checkpoint(tmp_path / "c.pt")
    assert not marker.exists()

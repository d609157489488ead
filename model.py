"""The decoder of the paper's App. A, built as the paper's code builds it, and its size presets.

    token ids ─► wte (V×D) ─► L × Block ─► final LayerNorm ─► h ─► head(h, W) ─► logits / loss
    Block:  x ← x + Attention(LN(x)),   x ← x + SwiGLU(LN(x))            (pre-LayerNorm)
    Attention: causal, per-head qk-LayerNorm, RoPE on half of each head's dimensions.

No linear layer or LayerNorm has a bias; logits and loss are the head's (heads.py), given h and W.

Init: the paper's Table 4, or its code where they differ. Linear weights Xavier normal, std =
√(2 / (fan_in + fan_out)), untruncated; input embedding N(0, 1/√D); the attention output
projection N(0, 0.02/√(2L)) (nanoGPT's c_proj rule; SwiGLU's down-projection keeps Xavier);
with tying, the output embedding's Xavier init runs last: the shared matrix starts with std
√(2 / (V + D)).
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

import heads

# The paper's five sizes (Porian et al. 2024) and labels, ffn = 256·⌈(2/3·4D)/256⌉ as its code;
# all parameters but the input embedding at V = 50304 count 15.6M, 28.6M, 57.3M, 108.4M and
# 220.8M. tiny, small: CPU presets (ffn = 3·D).
SIZES = {
    "tiny":  dict(n_layer=2, n_embd=64, n_head=4, ffn_hidden=192),
    "small": dict(n_layer=4, n_embd=128, n_head=4, ffn_hidden=384),
    "16M":   dict(n_layer=6, n_embd=224, n_head=4, ffn_hidden=768),
    "29M":   dict(n_layer=9, n_embd=320, n_head=4, ffn_hidden=1024),
    "57M":   dict(n_layer=12, n_embd=480, n_head=4, ffn_hidden=1280),
    "109M":  dict(n_layer=15, n_embd=640, n_head=4, ffn_hidden=1792),
    "221M":  dict(n_layer=21, n_embd=832, n_head=4, ffn_hidden=2304),
}
ROPE_BASE = 10000.0  # θ of RoPE: pair i turns by angle t·θ^(−2i/r) at position t


@dataclass(kw_only=True)
class GPTConfig:
    vocab_size: int = 50304  # GPT-2's 50257 tokens padded to a multiple of 64
    n_layer: int
    n_embd: int
    n_head: int
    ffn_hidden: int
    block_size: int = 2048   # longest sequence; RoPE tables are computed up to here
    tie: bool = False        # share the input and output embedding (one tensor)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def config_for(size: str, **overrides) -> GPTConfig:
    """The GPTConfig of a named size, with any field replaced by a keyword (e.g. tie=True)."""
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; choose one of {', '.join(SIZES)}.")
    return GPTConfig(**{**SIZES[size], **overrides})


def rope_tables(rot_dim: int, n_pos: int, base: float = ROPE_BASE):
    """cos and sin of the RoPE angles φ(t, i) = t·base^(−2i/rot_dim), shapes (n_pos, rot_dim/2),
    computed in float64 (a float32 angle is off by ~1e-4 rad at t ≈ 2000), stored as float32."""
    inv_freq = base ** (-torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    angles = torch.outer(torch.arange(n_pos, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first r = 2·cos.size(-1) features of x (…, T, hd) in adjacent pairs by φ(t, i)
    (the paper's code: rotary-embedding-torch with dim = hd/2); the rest pass unchanged:
        x₂ᵢ' = x₂ᵢ·cos φ − x₂ᵢ₊₁·sin φ,    x₂ᵢ₊₁' = x₂ᵢ·sin φ + x₂ᵢ₊₁·cos φ.
    R(φ_m)ᵀR(φ_n) = R(φ_n − φ_m), so q'·k' depends on the positions only through n − m."""
    rot_dim = 2 * cos.size(-1)
    rotated, passed = x[..., :rot_dim], x[..., rot_dim:]
    even, odd = rotated.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    turned = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)
    return torch.cat((turned, passed), dim=-1)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)
        # qk-LayerNorm over each head's dimensions, one weight shared by the heads (Wortsman et al.)
        self.q_norm = nn.LayerNorm(config.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(config.head_dim, bias=False)
        self.proj = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(self, x, cos, sin):
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, D // self.n_head).permute(2, 0, 3, 1, 4)
        q = apply_rope(self.q_norm(q), cos, sin)  # (B, heads, T, hd)
        k = apply_rope(self.k_norm(k), cos, sin)
        # Under CUDA autocast LayerNorm returns float32 and v is bf16: attend in v's dtype.
        y = F.scaled_dot_product_attention(q.to(v.dtype), k.to(v.dtype), v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, D))


class SwiGLU(nn.Module):
    """down(SiLU(gate·x) ⊙ (up·x)), hidden size ffn_hidden (Shazeer 2020)."""
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.gate = nn.Linear(config.n_embd, config.ffn_hidden, bias=False)
        self.up = nn.Linear(config.n_embd, config.ffn_hidden, bias=False)
        self.down = nn.Linear(config.ffn_hidden, config.n_embd, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=False)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=False)
        self.mlp = SwiGLU(config)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.ln_1(x), cos, sin)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig, head: heads.Head):
        super().__init__()
        self.config = config
        self.head = head  # no parameters: logits, loss and after_step live in heads.py
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, bias=False)
        if not config.tie:
            self.out_embedding = nn.Parameter(torch.empty(config.vocab_size, config.n_embd))
        cos, sin = rope_tables(config.head_dim // 2, config.block_size)  # not in the state_dict
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    @property
    def output_weight(self) -> nn.Parameter:
        """The V×D output embedding W (row i is token i's eᵢ); the input embedding when tied."""
        return self.wte.weight if self.config.tie else self.out_embedding

    def reset_parameters(self):  # the module docstring's init; with tying, the order matters
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_normal_(module.weight)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        nn.init.normal_(self.wte.weight, std=1 / math.sqrt(self.config.n_embd))
        nn.init.xavier_normal_(self.output_weight)  # after wte's: with tying it wins
        for block in self.blocks:  # paper's code: GPT-2's scaled init for the attention c_proj
            nn.init.normal_(block.attn.proj.weight, std=0.02 / math.sqrt(2 * self.config.n_layer))

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """The final hidden state h (B, T, D), after the final LayerNorm."""
        cos, sin = self.rope_cos[:idx.size(1)], self.rope_sin[:idx.size(1)]
        x = self.wte(idx)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.ln_f(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """logits (B, T, V) float32 without targets; (loss, stats) from the head with them."""
        h, W = self.hidden(idx), self.output_weight
        return self.head.logits(h, W) if targets is None else self.head(h, W, targets)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameters, each once; non_embedding: less the input embedding where untied (tied, the
        one matrix counts, as the output embedding)."""
        n = sum(p.numel() for p in self.parameters())  # parameters() yields a shared tensor once
        return n - (self.wte.weight.numel() if non_embedding and not self.config.tie else 0)

    def flops_per_token(self, seq_len: int) -> int:
        """Forward + backward FLOPs per token, for MFU: 6·N + 12·L·D·T (PaLM App. B). N: the
        weights of matrix products (linear layers, V×D head), 2 FLOPs forward and 4 backward;
        attention's q·kᵀ and weighted sum: 2·T·D each forward, ×3 with backward, per layer."""
        n_matmul = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        n_matmul += self.output_weight.numel()
        return 6 * n_matmul + 12 * self.config.n_layer * self.config.n_embd * seq_len


# Runs of train.py: a model from a run's settings, and its checkpoints

def from_config(config: dict) -> GPT:
    """The untrained GPT of a run's settings (train.py's options as a dict; seed torch first),
    its head's loss path the run's (--loss_chunk).
    block_size is max(2048, seq_len): the RoPE tables are not in the state_dict."""
    gpt_config = config_for(config["size"], vocab_size=config.get("vocab_size", 50304),
                            tie=config.get("tie", False),
                            block_size=max(2048, config.get("seq_len") or 0))
    float32_head = torch.float32 if config.get("head_dtype") == "float32" else None
    head = heads.build(config.get("head", "baseline"), lam=config.get("lam"),
                       cap=config.get("cap"), matmul_dtype=float32_head,
                       chunk_size=config.get("loss_chunk") or 0)
    return GPT(gpt_config, head)


def load_checkpoint(path) -> dict:
    """train.py's ckpt.pt or ckpt_step*.pt as a dict (model, config, step, …), on the CPU.
    weights_only: a crafted file runs no code."""
    return torch.load(path, map_location="cpu", weights_only=True)


def load_model(path, device="cpu") -> tuple[GPT, dict, int]:
    """A checkpoint's model in eval mode on `device`, its run's config and its step."""
    ckpt = load_checkpoint(path)
    gpt = from_config(ckpt["config"])
    gpt.load_state_dict(ckpt["model"])
    return gpt.to(device).eval(), ckpt["config"], ckpt["step"]

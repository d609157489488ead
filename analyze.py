"""Numerical checks and measurements on a model or a run's checkpoints.

    verify      --run DIR | --init SIZE   Lemma 1, Lemma 2, Prop. 3, Theorem 4 and its proof's steps
    logits      --run DIR | --init SIZE   logit statistics, ‖μ‖, B_ratio, Fig. 1 (right)
    bottleneck  --run DIR | --init SIZE   how much of the loss gradient the LM head lets through
    tying       --tied DIR --untied DIR   tied vs untied embeddings, output side's gradient share
    signatures  --run DIR                 embeddings vs probability signatures (context staircase)
    trivial     --out DIR                 the `repeat` task over growing vocabularies (train.py)

e.g. python analyze.py verify --run out --tokens 2048 --json verify.json

Every subcommand prints a short table; `--json PATH` writes its numbers and `--plot PATH` a
figure (both atomically). A run folder is train.py's: config.json + ckpt.pt, and, with
`train.py --keep_every N`, weights-only snapshots ckpt_step*.pt for curves over training.
`--init SIZE` measures a freshly initialised model instead (random tokens unless --data).
All measurements run in float64 on --device (cpu or cuda); the model itself runs in float32.

Notation (as in the paper): W is the V×D output embedding with rows eᵢ, μ = (1/V)·Σᵢ eᵢ its
mean row, h ∈ ℝᴰ a final hidden state, lᵢ = eᵢ·h the logits, Z = Σⱼ exp(lⱼ), p = softmax(l).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import data
import heads
import model

DEFAULTS = dict(
    tokens=512,          # hidden states per measurement (N); bottleneck's batch bound needs N > 2D
    batch_size=4,        # sequences per forward pass
    seq_len=None,        # None: the run's seq_len (256 for --init)
    init_seq_len=256,
    seed=0,
    device="cpu",
    head="baseline",
    vocab_size=50304,
    bins=100,            # histogram of eᵢ·μ
    chunk=128,           # token rows per float64 block of logits (memory: chunk·V·8 bytes)
    knn=10,              # neighbours in the k-NN overlap of `tying`
    top_k=512,           # most frequent tokens kept by `tying` and `signatures`
    sig_tokens=2_000_000,  # training tokens counted for the signatures
    offsets=(1, -1, -2, -3),  # +1: label signature P(next | token); −k: context P(x₋ₖ | token)
    trivial_vocabs=(16, 256, 4096),  # at tiny's D = 64: below, 4× and 64× above D
    trivial_size="tiny",
    trivial_steps=200,
    trivial_seq_len=32,
    trivial_tokens=200_000,
    trivial_batch=16,
    trivial_train=("--lr", "3e-3", "--eval_every", "0", "--log_every", "50",
                   "--save_every", "1000"),
)


# ── the paper's identities (pure, float64) ────────────────────────────────────────────────────

def token_chunks(n: int, size: int):
    """Slices that cover range(n) in blocks of at most `size` rows (bounds the N×V memory)."""
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def cross_entropy_rows(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """−log pᵧ = log Z − l_y per row, in the logits' own precision."""
    return torch.logsumexp(logits, dim=1) - logits.gather(1, targets[:, None])[:, 0]


def theorem4_bounds(W: torch.Tensor) -> dict:
    """The tight bounds of Eq. 12 for a V×D matrix W, and the dot products they bound.

        ‖μ‖² − B₋ ≤ eᵢ·μ ≤ ‖μ‖² + B₊   with  B₋ = ‖μ‖² − minᵢ eᵢ·μ,  B₊ = maxᵢ eᵢ·μ − ‖μ‖²

    Both B's are ≥ 0 because ‖μ‖² = μ·μ is the mean of the eᵢ·μ. B_ratio (Eq. 13) comes from
    heads.b_ratio, whose docstring checks the proof of Theorem 4 step by step.
    """
    mu = W.mean(0)
    dots = W @ mu
    mu_sq = mu @ mu
    return dict(mu_norm=mu_sq.sqrt().item(), mu_sq=mu_sq.item(),
                B_minus=(mu_sq - dots.min()).item(), B_plus=(dots.max() - mu_sq).item(),
                B_ratio=heads.b_ratio(W), dots=dots)


def verify_identities(H: torch.Tensor, W: torch.Tensor, W_star: torch.Tensor, targets: torch.Tensor,
                      chunk: int = DEFAULTS["chunk"]) -> dict:
    """The paper's statements checked on hidden states H (N×D) and output embedding W (V×D).

    W_star is W after μ-centering as the project's head computes it (heads' mu_center
    after_step); l = H Wᵀ and l* = H W*ᵀ are the logits before and after. Deviations (all ≥ 0,
    float64 round-off ≈ 1e-15·scale where an identity holds):
      centering_dev      maxᵢⱼ |W*ᵢⱼ − (Wᵢⱼ − μⱼ)|                         (Eq. 11)
      lemma1_dev         maxₜ |mean(lₜ) − μ·hₜ|                              (Lemma 1)
      lemma2_ratio       maxₜ maxⱼ|lₜⱼ| / (maxᵢ‖eᵢ‖·‖hₜ‖), ≤ 1 where it holds (Lemma 2)
      prop3_mean         maxₜ |mean(l*ₜ)|                                    (Prop. 3 i)
      prop3_std_dev      maxₜ |std(l*ₜ) − std(lₜ)|                          (Prop. 3 ii)
      prop3_prob_dev     maxₜⱼ |softmax(l*ₜ)ⱼ − softmax(lₜ)ⱼ|               (Prop. 3 iii)
      prop3_loss_dev     maxₜ |CE(l*ₜ) − CE(lₜ)|                             (Prop. 3 iii)
    Theorem 4 (B_ratio ≤ 1 ⇔ max|l*| ≤ max|l|) and the steps of its proof in App. B:
      B_ratio, eq26_dev  |B_ratio − maxᵢ|e*ᵢ·μ| / maxᵢ|eᵢ·μ||                (Eq. 26)
      max_norm, max_norm_star  maxᵢ‖eᵢ‖, maxᵢ‖e*ᵢ‖; eq34_holds: the latter ≤ the former (Eq. 34)
      eq32_dev           |maxᵢ‖e*ᵢ‖² − (maxᵢ‖e*ᵢ∥‖² + maxᵢ‖e*ᵢ⊥‖²)|: the proof's split of a
                         max of a sum into a sum of maxes (Eq. 32), which needs the same i to
                         maximise both parts
      eq35_token_share   share of tokens t with maxⱼ|l*ₜⱼ| ≤ maxⱼ|lₜⱼ| (Eq. 35, per hidden state)
      eq35_global_holds  maxₜⱼ|l*ₜⱼ| ≤ maxₜⱼ|lₜⱼ| over all N tokens together
    """
    mu = W.mean(0)
    bounds = theorem4_bounds(W)
    max_norm = W.norm(dim=1).max()
    out = dict(centering_dev=(W_star - (W - mu)).abs().max().item(),
               lemma1_dev=0.0, lemma2_ratio=0.0, prop3_mean=0.0, prop3_std_dev=0.0,
               prop3_prob_dev=0.0, prop3_loss_dev=0.0)
    absmax, absmax_star, star_not_larger = [], [], 0
    for rows in token_chunks(len(H), chunk):
        h, y = H[rows], targets[rows]
        l, l_star = h @ W.T, h @ W_star.T
        updates = dict(
            lemma1_dev=(l.mean(1) - h @ mu).abs().max(),
            lemma2_ratio=(l.abs().amax(1) / (max_norm * h.norm(dim=1))).max(),
            prop3_mean=l_star.mean(1).abs().max(),
            prop3_std_dev=(l_star.std(1) - l.std(1)).abs().max(),
            prop3_prob_dev=(l_star.softmax(1) - l.softmax(1)).abs().max(),
            prop3_loss_dev=(cross_entropy_rows(l_star, y) - cross_entropy_rows(l, y)).abs().max())
        for name, value in updates.items():
            out[name] = max(out[name], value.item())
        absmax.append(l.abs().amax(1))
        absmax_star.append(l_star.abs().amax(1))
    absmax, absmax_star = torch.cat(absmax), torch.cat(absmax_star)

    mu_hat = mu / mu.norm()
    parallel_sq = (W_star @ mu_hat) ** 2                      # ‖e*ᵢ∥‖²
    perpendicular_sq = (W_star ** 2).sum(1) - parallel_sq      # ‖e*ᵢ⊥‖² (= ‖eᵢ⊥‖²)
    max_norm_star = W_star.norm(dim=1).max()
    eq26 = (W_star @ mu).abs().max() / (W @ mu).abs().max()
    out.update(
        mu_norm=bounds["mu_norm"], B_minus=bounds["B_minus"], B_plus=bounds["B_plus"],
        B_ratio=bounds["B_ratio"], B_ratio_le_1=bounds["B_ratio"] <= 1,
        eq26_dev=abs(bounds["B_ratio"] - eq26.item()),
        max_norm=max_norm.item(), max_norm_star=max_norm_star.item(),
        eq34_holds=bool(max_norm_star <= max_norm),
        eq32_dev=abs(max_norm_star.item() ** 2
                     - (parallel_sq.max() + perpendicular_sq.max()).item()),
        eq35_token_share=(absmax_star <= absmax).double().mean().item(),
        eq35_global_holds=bool(absmax_star.max() <= absmax.max()),
        max_abs_logit=absmax.max().item(), max_abs_logit_star=absmax_star.max().item())
    return out


def logit_statistics(logits: torch.Tensor) -> dict:
    """Per-token statistics of a block of logits (N×V), as sums over its N rows (see
    heads.logit_stat_sums): mean l̄ = (1/V)·Σⱼ lⱼ, population std σ over the vocabulary,
    max |l| = maxⱼ |lⱼ|, log²Z = (log Σⱼ exp lⱼ)². Divide by N for the per-token averages."""
    return dict(zip(heads.LOGIT_STATS, heads.logit_stat_sums(logits).tolist()))


# ── gradient bottleneck (pure, float64) ───────────────────────────────────────────────────────

def orthonormal_basis(W: torch.Tensor, rtol: float = 1e-10) -> torch.Tensor:
    """Q (V×r) with orthonormal columns spanning col(W), r = numerical rank of W (SVD)."""
    U, S, _ = torch.linalg.svd(W, full_matrices=False)
    return U[:, S > rtol * S.max()]


def loss_gradients(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """G (N×V): row t is gₜ = ∂CEₜ/∂lₜ = softmax(lₜ) − onehot(yₜ)."""
    G = logits.softmax(1)
    G[torch.arange(len(targets)), targets] -= 1
    return G


def bottleneck(G: torch.Tensor, W: torch.Tensor, H: torch.Tensor | None = None) -> dict:
    """How much of the loss gradient in logit space an LM head l = W h lets through.

    The logits of one token move only through h or through W. Through h the change is
    Δl = W Δh ∈ col(W), and the back-propagated signal Wᵀg sees g only via its projection
    P g onto col(W) (Wᵀ g = Wᵀ P g): the rest, (I − P) g, never reaches the network below the
    head. With Q an orthonormal basis of col(W) (V×r, r = rank W ≤ D), ‖Pg‖ = ‖Qᵀg‖. Per token
    t, averaged over the N rows of G:
      retained_norm    ‖Pgₜ‖ / ‖gₜ‖ — also the largest cosine between −gₜ and any Δlₜ ∈ col(W)
      retained_energy  ‖Pgₜ‖² / ‖gₜ‖²
      suppressed_norm  1 − retained_norm (the gradient-bottleneck paper's "share of the gradient
                       norm suppressed"; its exact definition is not available to us),
      suppressed_energy 1 − retained_energy,
      isotropic_energy r / V: E‖Pg‖²/‖g‖² when col(W) is a uniformly random r-dim subspace
                       (isotropic_norm = √(r/V) is the matching typical norm fraction).
    Batch level, for the N×V matrix G of a batch (the loss is (1/N)·Σₜ CEₜ, ∂L/∂Z = G/N):
    one first-order step changes the logits Z = H Wᵀ by ΔZ = ΔH Wᵀ + H ΔWᵀ, a sum of two
    matrices of rank ≤ D each, so rank ΔZ ≤ 2D whatever the optimizer. With singular values
    σ₁ ≥ σ₂ ≥ … of G, the best rank-k approximation G_k (Eckart–Young) gives the largest cosine
    any rank-k matrix can have with −G, cos = ‖G_k‖_F/‖G‖_F = √(Σ_{i≤k} σᵢ² / Σᵢ σᵢ²):
      rank2D_energy    Σ_{i≤2D} σᵢ² / Σᵢ σᵢ²,  rank2D_cosine = √rank2D_energy,
      rankD_energy     the same with k = D (one of the two terms alone),
      pooled_energy    ‖G Q‖²_F / ‖G‖²_F: the best update of the form ΔH Wᵀ (W frozen).
    These are trivially 1 when N ≤ 2D (rank G ≤ N); measure with N ≫ 2D.
    With H (N×D) given, also the plain gradient step on free H and W: ΔH ∝ −G W, ΔW ∝ −Gᵀ H, so
    ΔZ ∝ −(G W Wᵀ + H Hᵀ G) =: −M, and sgd_cosine = ⟨M, G⟩ / (‖M‖‖G‖), evaluated without
    forming M through ⟨M, G⟩ = ‖GW‖² + ‖HᵀG‖² and
    ‖M‖² = tr((GW)ᵀ(GW)·WᵀW) + tr((HᵀG)(HᵀG)ᵀ·HᵀH) + 2‖HᵀGW‖².
    """
    N, V = G.shape
    Q = orthonormal_basis(W)
    r = Q.shape[1]
    D = W.shape[1]
    g_sq = (G ** 2).sum(1)
    kept_sq = ((G @ Q) ** 2).sum(1)
    energy = kept_sq / g_sq
    sigma_sq = torch.linalg.eigvalsh(G @ G.T).flip(0).clamp_min(0)  # σᵢ² of G, descending
    total = sigma_sq.sum()
    out = dict(tokens=N, vocab=V, rank=r,
               retained_norm=energy.sqrt().mean().item(),
               retained_energy=energy.mean().item(),
               suppressed_norm=1 - energy.sqrt().mean().item(),
               suppressed_energy=1 - energy.mean().item(),
               isotropic_energy=r / V, isotropic_norm=math.sqrt(r / V),
               pooled_energy=(kept_sq.sum() / g_sq.sum()).item(),
               rankD_energy=(sigma_sq[:D].sum() / total).item(),
               rank2D_energy=(sigma_sq[:2 * D].sum() / total).item())
    out["rank2D_cosine"] = math.sqrt(out["rank2D_energy"])
    if H is not None:
        GW, HtG = G @ W, H.T @ G
        inner = (GW ** 2).sum() + (HtG ** 2).sum()
        m_sq = (torch.trace(GW.T @ GW @ (W.T @ W)) + torch.trace(HtG @ HtG.T @ (H.T @ H))
                + 2 * ((HtG @ W) ** 2).sum())
        out["sgd_cosine"] = (inner / (m_sq.sqrt() * total.sqrt())).item()
    return out


# ── embedding geometry (pure, float64) ────────────────────────────────────────────────────────

def centred(A: torch.Tensor) -> torch.Tensor:
    """A minus its mean row: removes the common shift (μ) that dominates raw cosines."""
    return A - A.mean(0)


def row_cosines(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """cos(aᵢ, bᵢ) for every row i."""
    return torch.nn.functional.cosine_similarity(A, B, dim=1, eps=1e-300)


def alignment(A: torch.Tensor, B: torch.Tensor) -> dict:
    """How well the rows of A (n×d) map onto the rows of B (n×d'), both centred first.

    Mean over rows i of cos(aᵢ M, bᵢ) for three maps M:
      identity     M = I (needs d = d'): the same coordinates,
      procrustes   M = argmin_{MᵀM = I} ‖A M − B‖_F = U Vᵀ with U Σ Vᵀ = Aᵀ B (needs d = d'):
                   equal to 1 when B is a rotated copy of A,
      lstsq        M = argmin ‖A M − B‖_F (any linear map; ≥ procrustes in fit, not in cosine).
    """
    A, B = centred(A), centred(B)
    out = {}
    if A.shape[1] == B.shape[1]:
        out["identity"] = row_cosines(A, B).mean().item()
        U, _, Vh = torch.linalg.svd(A.T @ B)
        out["procrustes"] = row_cosines(A @ (U @ Vh), B).mean().item()
    out["lstsq"] = row_cosines(A @ torch.linalg.lstsq(A, B).solution, B).mean().item()
    return out


def nearest_neighbours(A: torch.Tensor, k: int) -> torch.Tensor:
    """Indices (n×k) of each row's k most cosine-similar other rows, rows centred first."""
    X = torch.nn.functional.normalize(centred(A), dim=1)
    sim = X @ X.T
    sim.fill_diagonal_(-math.inf)
    return sim.topk(k, dim=1).indices


def knn_overlap(A: torch.Tensor, B: torch.Tensor, k: int = DEFAULTS["knn"]) -> float:
    """Mean over rows of |N_A(i) ∩ N_B(i)| / k, N(i) the k nearest neighbours by cosine.

    Invariant under any rotation (and scaling) of either matrix: 1 for a rotated copy.
    """
    n_a, n_b = nearest_neighbours(A, k), nearest_neighbours(B, k)
    shared = (n_a[:, :, None] == n_b[:, None, :]).any(2).sum(1)
    return (shared.double() / k).mean().item()


def signature(tokens: np.ndarray, vocab_ids: np.ndarray, offset: int) -> np.ndarray:
    """Probability signature S (K×K) of the K tokens `vocab_ids` at a position offset.

        S[a, b] = P(x_{t+offset} = b | x_t = a)

    offset = +1 is the label signature P(next | token); offset = −k the context signature
    P(token k places back | token). Estimated by counting over the token stream; the
    conditioning counts every position t whose partner t + offset exists, so a row sums to the
    share of partners that fall inside the K tokens (exactly 1 when K covers the vocabulary).
    """
    k = abs(offset)
    current, partner = (tokens[:-k], tokens[k:]) if offset > 0 else (tokens[k:], tokens[:-k])
    index = np.full(int(max(tokens.max(), vocab_ids.max())) + 1, -1, dtype=np.int64)
    index[vocab_ids] = np.arange(len(vocab_ids))
    a, b = index[current], index[partner]
    K = len(vocab_ids)
    rows = np.bincount(a[a >= 0], minlength=K).astype(np.float64)
    both = (a >= 0) & (b >= 0)
    pairs = np.bincount(a[both] * K + b[both], minlength=K * K).reshape(K, K)
    return pairs / np.maximum(rows, 1)[:, None]


def cosine_similarity_matrix(X: torch.Tensor) -> torch.Tensor:
    """Sᵢⱼ = cos(xᵢ, xⱼ) over the rows of X."""
    X = torch.nn.functional.normalize(X, dim=1, eps=1e-300)
    return X @ X.T


def similarity_alignment(X: torch.Tensor, Y: torch.Tensor) -> float:
    """Pearson correlation of the off-diagonal entries of the two cosine-similarity matrices.

    A representational-similarity score in [−1, 1]: 1 when the K×K similarity structures of X
    and Y agree up to an affine map, ≈ 0 when unrelated. Callers pass centred embeddings (so the
    common shift μ does not make every pair similar) and raw signature rows (probabilities).
    """
    i, j = torch.triu_indices(len(X), len(X), offset=1)
    sx, sy = cosine_similarity_matrix(X)[i, j], cosine_similarity_matrix(Y)[i, j]
    return torch.corrcoef(torch.stack((sx, sy)))[0, 1].item()


# ── models, checkpoints, tokens ───────────────────────────────────────────────────────────────

def build_model(cfg: dict) -> model.GPT:
    """An untrained GPT as a run's config dict (train.py's CLI names) describes it."""
    gpt_config = model.config_for(cfg["size"], vocab_size=int(cfg.get("vocab_size", 50304)),
                                  tie=bool(cfg.get("tie", False)),
                                  block_size=max(2048, int(cfg.get("seq_len") or 0)))
    return model.GPT(gpt_config, heads.build(cfg.get("head", "baseline"),
                                             lam=cfg.get("lam"), cap=cfg.get("cap")))


def checkpoint_paths(run_dir: str) -> list[Path]:
    """A run's weight snapshots in training order: ckpt_step*.pt, then ckpt.pt (the latest)."""
    run = Path(run_dir)
    if not (run / "config.json").is_file():
        raise FileNotFoundError(f"{run} is not a run folder (no config.json); "
                                "pass a folder written by train.py --out_dir.")
    paths = sorted(run.glob("ckpt_step*.pt")) + [p for p in [run / "ckpt.pt"] if p.is_file()]
    if not paths:
        raise FileNotFoundError(f"{run} holds no checkpoint (ckpt.pt or ckpt_step*.pt); "
                                "train it first, or pass --init SIZE for a fresh model.")
    return paths


def load_checkpoint(path: Path, device: str) -> tuple[model.GPT, dict, int]:
    """(model in eval mode on device, its config dict, its training step) from a checkpoint."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)  # never runs foreign code
    gpt = build_model(ckpt["config"])
    gpt.load_state_dict(ckpt["model"])
    return gpt.to(device).eval(), ckpt["config"], int(ckpt["step"])


def fresh_model(args) -> tuple[model.GPT, dict, int]:
    """A freshly initialised model (--init SIZE, --head, --tie, --vocab_size, --seed), step 0."""
    torch.manual_seed(args.seed)
    cfg = dict(size=args.init, head=args.head, tie=args.tie, vocab_size=args.vocab_size,
               seq_len=args.seq_len or DEFAULTS["init_seq_len"], data=args.data)
    return build_model(cfg).to(args.device).eval(), cfg, 0


def run_models(run_dir: str, device: str, all_steps: bool):
    """Yield (model, config, step) for the latest checkpoint of a run or, with all_steps, for
    every snapshot in training order, loading one at a time. ckpt.pt is the latest unless the
    run is still going and a newer snapshot exists; it is skipped when a snapshot has its step."""
    paths = checkpoint_paths(run_dir)
    snapshots, latest = paths[:-1], paths[-1]
    last_step = -1
    for path in snapshots if all_steps else []:
        gpt, cfg, last_step = load_checkpoint(path, device)
        yield gpt, cfg, last_step
    gpt, cfg, step = load_checkpoint(latest, device)
    if step > last_step:
        yield gpt, cfg, step


def models(args, all_steps: bool = False):
    """The model(s) a subcommand measures: --init SIZE or the checkpoints of --run."""
    if args.init:
        return [fresh_model(args)]
    return run_models(args.run, args.device, all_steps)


def token_batches(cfg: dict, args, n_tokens: int, vocab_size: int):
    """(x, y) batches of validation tokens of the run's data (or --data); uniformly random
    tokens (y = x shifted by one) for a fresh model without data."""
    seq_len = args.seq_len or int(cfg["seq_len"])
    data_dir = args.data or cfg.get("data")
    per_batch = args.batch_size * seq_len
    if data_dir:
        try:
            return data.val_batches(data_dir, math.ceil(n_tokens / per_batch) * per_batch,
                                    args.batch_size, seq_len)
        except ValueError as err:
            raise ValueError(f"--tokens {n_tokens} asks for more than the validation split holds; "
                             f"lower --tokens ({err}).") from None
    generator = torch.Generator().manual_seed(args.seed)
    windows = [torch.randint(vocab_size, (args.batch_size, seq_len + 1), generator=generator)
               for _ in range(math.ceil(n_tokens / per_batch))]
    return [(w[:, :-1], w[:, 1:]) for w in windows]


@torch.no_grad()
def hidden_states(gpt: model.GPT, cfg: dict, args) -> tuple[torch.Tensor, torch.Tensor]:
    """H (N×D, float64) final hidden states and their next-token targets (N,), N = --tokens."""
    H, Y, n = [], [], 0
    for x, y in token_batches(cfg, args, args.tokens, gpt.config.vocab_size):
        H.append(gpt.hidden(x.to(args.device)).flatten(0, 1).double())
        Y.append(y.flatten().to(args.device))
        n += y.numel()
        if n >= args.tokens:
            break
    return torch.cat(H)[:args.tokens], torch.cat(Y)[:args.tokens]


def output_weight64(gpt: model.GPT) -> torch.Tensor:
    return gpt.output_weight.detach().double()


def head_loss_gradients(gpt: model.GPT, H: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """G (N×V): ∂CEₜ/∂lₜ with respect to the raw logits l = W h of the model's head.

    For soft_cap the loss sees c·tanh(l/c), so the chain rule multiplies softmax − onehot by
    d/dl c·tanh(l/c) = 1 − tanh²(l/c) = 1 − (capped/c)². The regularisers are left out: the
    gradient bottleneck concerns the cross-entropy signal.
    """
    W = output_weight64(gpt)
    capped = gpt.head.logits(H, W)
    G = loss_gradients(capped, targets)
    if gpt.head.name == "soft_cap":
        G *= 1 - (capped / gpt.head.cap) ** 2
    return G


def training_tokens(data_dir: str, n_tokens: int) -> np.ndarray:
    """The first n_tokens of the training shards (fewer if the shards hold fewer), as int64."""
    parts, n = [], 0
    for path in data.shard_paths(data_dir, "train"):
        parts.append(np.asarray(data.read_shard(path)[: n_tokens - n], dtype=np.int64))
        n += len(parts[-1])
        if n >= n_tokens:
            break
    return np.concatenate(parts)


def frequent_tokens(tokens: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k most frequent tokens (ties broken by the smaller id), most frequent first."""
    counts = np.bincount(tokens)
    order = np.lexsort((np.arange(len(counts)), -counts))
    return order[: min(k, int((counts > 0).sum()))]


# ── subcommands ───────────────────────────────────────────────────────────────────────────────

def verify_table(r: dict) -> list[tuple]:
    """(statement, value, holds) rows; an identity holds at float64 round-off of the logits."""
    tol = 1e-12 * max(1.0, r["max_abs_logit"])

    def exact(key):
        return r[key], r[key] <= tol

    return [
        ("Eq. 11 centering: W* = W − μ", *exact("centering_dev")),
        ("Lemma 1: mean(l) = μ·h", *exact("lemma1_dev")),
        ("Lemma 2: max|l| / (max‖e‖·‖h‖) ≤ 1", r["lemma2_ratio"], r["lemma2_ratio"] <= 1 + 1e-12),
        ("Prop. 3 (i): mean(l*) = 0", *exact("prop3_mean")),
        ("Prop. 3 (ii): std(l*) = std(l)", *exact("prop3_std_dev")),
        ("Prop. 3 (iii): softmax(l*) = softmax(l)", *exact("prop3_prob_dev")),
        ("Prop. 3 (iii): CE(l*) = CE(l)", *exact("prop3_loss_dev")),
        ("Eq. 26: B_ratio = max|e*·μ| / max|e·μ|", *exact("eq26_dev")),
        ("Thm. 4 condition: B_ratio ≤ 1", r["B_ratio"], r["B_ratio_le_1"]),
        ("Eq. 32: max of sum = sum of maxes", *exact("eq32_dev")),
        ("Eq. 34: max‖e*‖ / max‖e‖ ≤ 1", r["max_norm_star"] / r["max_norm"], r["eq34_holds"]),
        ("Eq. 35 per token: share max|l*| ≤ max|l|", r["eq35_token_share"],
         r["eq35_token_share"] == 1),
        ("Eq. 35 over all tokens: max|l*| / max|l|", r["max_abs_logit_star"] / r["max_abs_logit"],
         r["eq35_global_holds"]),
    ]


def run_verify(args) -> dict:
    """Lemma 1, Lemma 2, Proposition 3 and Theorem 4 on the model's own hidden states."""
    (gpt, cfg, step), = models(args)
    H, targets = hidden_states(gpt, cfg, args)
    W = output_weight64(gpt)
    W_star = W.clone()
    heads.build("mu_center").after_step(W_star)  # the project's μ-centering, in float64
    result = dict(step=step, head=cfg["head"], tie=bool(cfg.get("tie")), tokens=len(H),
                  **verify_identities(H, W, W_star, targets, args.chunk))
    print_table(verify_table(result), ("statement", "value", "holds"),
                f"verify: {describe(args, cfg, step)}, {len(H)} tokens, float64; "
                f"‖μ‖ = {result['mu_norm']:.4g}, B₋ = {result['B_minus']:.4g}, "
                f"B₊ = {result['B_plus']:.4g}")
    return result


def run_logits(args) -> dict:
    """The paper's logit statistics (Sec. 3) over N tokens, ‖μ‖, B_ratio and Fig. 1 (right)."""
    (gpt, cfg, step), = models(args)
    H, _ = hidden_states(gpt, cfg, args)
    W = output_weight64(gpt)
    sums = {}
    for rows in token_chunks(len(H), args.chunk):
        for name, value in logit_statistics(gpt.head.logits(H[rows], W)).items():
            sums[name] = sums.get(name, 0.0) + value
    bounds = theorem4_bounds(W)
    dots = bounds.pop("dots")
    result = dict(step=step, head=cfg["head"], tie=bool(cfg.get("tie")), tokens=len(H),
                  **{name: total / len(H) for name, total in sums.items()}, **bounds)
    names = ("logit_mean", "logit_std", "logit_absmax", "log2Z", "mu_norm", "mu_sq", "B_minus",
             "B_plus", "B_ratio")
    print_table([(name, result[name]) for name in names], ("quantity", "value"),
                f"logits: {describe(args, cfg, step)}, per-token statistics averaged over "
                f"{len(H)} tokens")
    if args.plot:
        plot_dot_histogram(dots.cpu().numpy(), bounds, args.bins, args.plot)
    return result


def run_bottleneck(args) -> dict:
    """The share of the loss gradient that the LM head passes on, per checkpoint."""
    rows = []
    for gpt, cfg, step in models(args, all_steps=True):
        H, targets = hidden_states(gpt, cfg, args)
        G = head_loss_gradients(gpt, H, targets)
        rows.append(dict(step=step, **bottleneck(G, output_weight64(gpt), H)))
    D = gpt.config.n_embd
    columns = ("step", "retained_norm", "suppressed_norm", "retained_energy", "isotropic_energy",
               "pooled_energy", "rank2D_energy", "rank2D_cosine", "sgd_cosine")
    note = f"; N ≤ 2D = {2 * D}: the batch bound is trivially 1" if args.tokens <= 2 * D else ""
    print_table([[r[c] for c in columns] for r in rows], columns,
                f"bottleneck: {describe(args, cfg, step)}, N = {args.tokens} tokens, D = {D}, "
                f"V = {gpt.config.vocab_size}{note}")
    if args.plot:
        plot_curves(rows, ("retained_norm", "retained_energy", "rank2D_energy",
                           "isotropic_energy"), "share of the loss gradient", args.plot)
    return dict(run=args.run, init=args.init, steps=rows)


def tied_gradient_split(gpt: model.GPT, x: torch.Tensor, y: torch.Tensor):
    """(∇ from the LM head, ∇ from the input embedding) of the loss on one batch, each V×D.

    The input side is the embedding lookup's gradient: ∂L/∂x at every position, added to the
    row of its token. With tying, the output side is the rest of the shared matrix's gradient;
    untied, it is the output matrix's own gradient.
    """
    embedded = {}

    def keep_output(module, inputs, output):
        output.retain_grad()
        embedded["x"] = output

    handle = gpt.wte.register_forward_hook(keep_output)
    try:
        gpt.zero_grad(set_to_none=True)
        with torch.enable_grad():
            loss, _ = gpt(x, y)
            loss.backward()
    finally:
        handle.remove()
    dx = embedded["x"].grad
    from_input = torch.zeros_like(gpt.wte.weight).index_add_(0, x.flatten(), dx.flatten(0, 1))
    from_output = gpt.output_weight.grad - (from_input if gpt.config.tie else 0)
    gpt.zero_grad(set_to_none=True)
    return from_output.double(), from_input.double()


def output_share(from_output: torch.Tensor, from_input: torch.Tensor) -> dict:
    """How much of the embedding gradient comes from the LM head (tied: both parts act on one
    matrix; untied: on the output and the input matrix), Frobenius norms over V×D:
        share_norm   = ‖∇_out‖ / (‖∇_out‖ + ‖∇_in‖)
        share_energy = ‖∇_out‖² / (‖∇_out‖² + ‖∇_in‖²)
        cos_out_in   = ⟨∇_out, ∇_in⟩ / (‖∇_out‖·‖∇_in‖)
    These are raw gradients: Adam rescales each coordinate before it updates."""
    out_norm, in_norm = from_output.norm(), from_input.norm()
    return dict(share_norm=(out_norm / (out_norm + in_norm)).item(),
                share_energy=(out_norm ** 2 / (out_norm ** 2 + in_norm ** 2)).item(),
                cos_out_in=((from_output * from_input).sum() / (out_norm * in_norm)).item())


def embedding_geometry(A: torch.Tensor, B: torch.Tensor, k: int) -> dict:
    return dict(**alignment(A, B), knn_overlap=knn_overlap(A, B, k))


def run_tying(args) -> dict:
    """Tied vs untied embeddings: alignment, k-NN overlap, and the output side's gradient share.

    Geometry compares three V×D matrices over the K most frequent training tokens: the tied
    matrix T and the untied run's input matrix E_in and output matrix E_out. Their starting
    points are not independent: with the paper's init (model.py) and equal seeds, T starts as
    the very Xavier draw that E_out starts from. So where both runs kept a step-0 snapshot the
    table also compares the moves since init, ΔT = T − T₀ etc., which carry no shared start.
    """
    (tied, tied_cfg, tied_step), = run_models(args.tied, args.device, all_steps=False)
    (untied, _, untied_step), = run_models(args.untied, args.device, all_steps=False)
    if not tied.config.tie or untied.config.tie:
        raise ValueError("--tied must name a run trained with --tie and --untied one without it.")
    data_dir = args.data or tied_cfg["data"]
    ids = torch.from_numpy(frequent_tokens(training_tokens(data_dir, args.sig_tokens), args.top_k))

    def matrices(tied_model, untied_model):
        return {name: weight.detach().double().cpu()[ids] for name, weight in
                (("tied", tied_model.wte.weight), ("untied input", untied_model.wte.weight),
                 ("untied output", untied_model.output_weight))}

    pairs = (("tied", "untied input"), ("tied", "untied output"), ("untied input", "untied output"))
    final = matrices(tied, untied)
    geometry = {f"{a} vs {b}": embedding_geometry(final[a], final[b], args.knn) for a, b in pairs}
    starts = [Path(run) / "ckpt_step0000000.pt" for run in (args.tied, args.untied)]
    if all(path.is_file() for path in starts):
        start = matrices(*(load_checkpoint(path, args.device)[0] for path in starts))
        for a, b in pairs:
            geometry[f"{a} vs {b} at init"] = embedding_geometry(start[a], start[b], args.knn)
            geometry[f"Δ{a} vs Δ{b} since init"] = embedding_geometry(
                final[a] - start[a], final[b] - start[b], args.knn)
    columns = ("identity", "procrustes", "lstsq", "knn_overlap")
    D = tied.config.n_embd
    note = (f"; note: K ≤ D = {D}, so a linear map fits any K points: raise --top_k"
            if len(ids) <= D else "")
    print_table([[name, *(g[c] for c in columns)] for name, g in geometry.items()],
                ("matrices", *columns),
                f"tying: mean per-token cosine after each map (rows centred), k = {args.knn}, "
                f"K = {len(ids)} most frequent tokens; tied step {tied_step}, "
                f"untied step {untied_step}{note}")
    shares = []
    for name, run in (("tied", args.tied), ("untied", args.untied)):
        for gpt, cfg, step in run_models(run, args.device, all_steps=True):
            seq_len = args.seq_len or int(cfg["seq_len"])
            x, y = data.ShardLoader(data_dir, args.batch_size, seq_len).next_batch()
            split = tied_gradient_split(gpt, x.to(args.device), y.to(args.device))
            shares.append(dict(run=name, step=step, **output_share(*split)))
    print_table([list(s.values()) for s in shares], list(shares[0]),
                "share of the embedding gradient from the LM head (first training batch)")
    if args.plot:
        plot_curves([s for s in shares if s["run"] == "tied"], ("share_norm", "share_energy"),
                    "output side's share of the tied gradient", args.plot)
    return dict(tokens=len(ids), geometry=geometry, gradient_share=shares)


def run_signatures(args) -> dict:
    """Alignment of the embeddings' similarity structure with each probability signature.

    Per checkpoint and per signature S (K×K, see `signature`), the similarity_alignment of the
    centred input (or output) embeddings of the K most frequent training tokens with the rows of
    S. What to expect: an input embedding x is trained through what follows it, so its
    first-order signature is the label one (+1); an output embedding eᵧ is pulled towards the
    hidden states of the contexts that precede y, so its first-order signature is P(x₋₁ | y)
    (−1). The context staircase is the higher orders (−2, −3, …) catching up later."""
    snapshots = run_models(args.run, args.device, all_steps=True)
    first = next(snapshots)
    tokens = training_tokens(args.data or first[1]["data"], args.sig_tokens)
    ids = frequent_tokens(tokens, args.top_k)
    signatures = {o: torch.from_numpy(signature(tokens, ids, o)) for o in args.offsets}
    rows = []
    for gpt, cfg, step in [first, *snapshots]:
        row = dict(step=step)
        for side, weight in (("in", gpt.wte.weight), ("out", gpt.output_weight)):
            E = centred(weight.detach().double().cpu()[torch.from_numpy(ids)])
            for offset, S in signatures.items():
                row[f"{side}{offset:+d}"] = similarity_alignment(E, S)
        rows.append(row)
    print_table([list(r.values()) for r in rows], list(rows[0]),
                f"signatures: Pearson r of pairwise cosines, embeddings (in/out) vs signature at "
                f"offset (+1 next token, −k k back); {len(ids)} most frequent of {len(tokens)} "
                "training tokens")
    if args.plot:
        plot_curves(rows, [k for k in rows[0] if k != "step"], "similarity alignment (Pearson r)",
                    args.plot)
    return dict(run=args.run, tokens=len(tokens), top_k=len(ids), offsets=list(args.offsets),
                steps=rows)


def run_trivial(args) -> dict:
    """The gradient-bottleneck paper's trivial pattern: `repeat` sequences (one token repeated
    seq_len times) learned at a fixed width over growing vocabularies V.

    Inside a sequence the next token is certain; only the last target of each row starts a new
    sequence, uniform over ~V tokens. So the best possible loss is ln(V)/seq_len and chance is
    ln V. A token occurs in about steps·batch/V training sequences, so at a fixed number of
    steps a large vocabulary is also a rarely seen one; --seqs_per_token S removes that
    confound by training each V for max(--steps, ⌈S·V/batch⌉) steps. Each V gets fresh data
    (data.py synthetic, enough that no sequence repeats) and its own run (train.py); both are
    skipped when already there, so an interrupted sweep resumes."""
    here, out = Path(__file__).resolve().parent, Path(args.out)
    batch, T = args.batch_size, args.seq_len
    eval_steps = min(16, int(args.trivial_tokens * data.VAL_FRACTION - 1) // (batch * T))
    if eval_steps < 1:
        raise ValueError(f"--trivial_tokens {args.trivial_tokens} leaves less than one batch of "
                         f"{batch * T} validation tokens; raise it to at least {11 * batch * T}.")
    eval_tokens = eval_steps * batch * T
    rows = []
    for V in args.vocabs:
        steps = max(args.steps, math.ceil(args.seqs_per_token * V / batch))
        n_tokens = max(args.trivial_tokens, math.ceil(steps * batch * T / (1 - data.VAL_FRACTION)))
        data_dir = out / f"repeat_V{V}_T{T}_N{n_tokens}"
        run_dir = out / f"{args.size}_{args.head}_tie{int(args.tie)}_V{V}_steps{steps}"
        if not list(data_dir.glob("*val*.bin")):
            run_script(here / "data.py", "synthetic", "--task", "repeat", "--vocab", V,
                       "--tokens", n_tokens, "--seq_len", T, "--out", data_dir, "--seed", args.seed)
        if not (run_dir / "summary.json").is_file():
            run_script(here / "train.py", "--size", args.size, "--head", args.head,
                       "--vocab_size", V, "--data", data_dir, "--out_dir", run_dir,
                       "--steps", steps, "--warmup", max(1, steps // 10), "--seq_len", T,
                       "--batch_size", batch, "--micro_batch", batch, "--eval_tokens", eval_tokens,
                       "--stat_tokens", eval_tokens, "--device", args.device, "--seed", args.seed,
                       *(["--tie"] if args.tie else []), *DEFAULTS["trivial_train"],
                       *args.train_args)  # train.py's argparse: a repeated option's last value wins
        summary = json.loads((run_dir / "summary.json").read_text())
        rows.append(dict(vocab=V, steps=steps, seqs_per_token=steps * batch / V,
                         val_loss=summary["val_loss"], floor=math.log(V) / T, chance=math.log(V),
                         diverged=summary["diverged"]))
    print_table([list(r.values()) for r in rows], list(rows[0]),
                f"trivial: repeat task, size {args.size} (D = {model.SIZES[args.size]['n_embd']}), "
                f"head {args.head}, tie {args.tie}, batches of {batch} sequences of {T}; "
                "floor = ln(V)/seq_len is the best possible loss, chance = ln V")
    if args.plot:
        plot_trivial(rows, f"{args.size}, tie {args.tie}", args.plot)
    return dict(size=args.size, head=args.head, tie=args.tie, seq_len=T, batch_size=batch,
                runs=rows)


def run_script(script: Path, *argv) -> None:
    """Run a project script in its own Python process; a failure ends this command."""
    done = subprocess.run([sys.executable, str(script), *map(str, argv)])
    if done.returncode:
        raise ValueError(f"{script.name} failed with exit code {done.returncode}; "
                         "its message is printed above.")


COMMANDS = dict(verify=run_verify, logits=run_logits, bottleneck=run_bottleneck, tying=run_tying,
                signatures=run_signatures, trivial=run_trivial)


# ── output: tables, JSON, figures ─────────────────────────────────────────────────────────────

def describe(args, cfg: dict, step: int) -> str:
    source = args.run if args.run else f"fresh {args.init}"
    return (f"{source} (size {cfg['size']}, head {cfg['head']}, tie {bool(cfg.get('tie'))}, "
            f"step {step})")


def format_cell(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def print_table(rows, columns, title: str) -> None:
    """A plain aligned text table under its title."""
    cells = [[format_cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    print(title)
    for line in [list(columns)] + cells:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())


def write_atomic(path: str, write) -> None:
    """Call write(tmp) on a temporary file next to path, then rename it into place."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise


def write_json(path: str, result: dict) -> None:
    def dump(tmp):
        Path(tmp).write_text(json.dumps(result, indent=2) + "\n")
    write_atomic(path, dump)


def save_figure(fig, path: str) -> None:
    import matplotlib.pyplot as plt
    image_format = Path(path).suffix.lstrip(".") or "png"
    write_atomic(path, lambda tmp: fig.savefig(tmp, format=image_format, dpi=120))
    plt.close(fig)
    print(f"wrote {path}")


def new_axes():
    import matplotlib
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    return plt.subplots(figsize=(6.4, 4.0), layout="constrained")


def plot_dot_histogram(dots: np.ndarray, bounds: dict, bins: int, path: str) -> None:
    """Fig. 1 (right): histogram of eᵢ·μ with 0, ‖μ‖² and the extrema ‖μ‖² − B₋, ‖μ‖² + B₊."""
    fig, ax = new_axes()
    ax.hist(dots, bins=bins, color="0.6")
    mu_sq = bounds["mu_sq"]
    ax.axvline(0, color="black", linestyle=":", label="0")
    ax.axvline(mu_sq, color="purple", linestyle="--", label=f"‖μ‖² = {mu_sq:.3g}")
    ax.axvline(mu_sq - bounds["B_minus"], color="green", linestyle="--",
               label="‖μ‖² − B₋, ‖μ‖² + B₊")
    ax.axvline(mu_sq + bounds["B_plus"], color="green", linestyle="--")
    ax.set(xlabel="eᵢ·μ", ylabel="tokens",
           title=f"B₋ = {bounds['B_minus']:.3g}, B₊ = {bounds['B_plus']:.3g}, "
                 f"B_ratio = {bounds['B_ratio']:.3g}")
    ax.legend()
    save_figure(fig, path)


def plot_curves(rows: list[dict], keys, ylabel: str, path: str) -> None:
    """One line per key against the training step."""
    fig, ax = new_axes()
    steps = [r["step"] for r in rows]
    for key in keys:
        ax.plot(steps, [r[key] for r in rows], marker="o", label=key)
    ax.set(xlabel="training step", ylabel=ylabel)
    ax.legend(fontsize="small")
    save_figure(fig, path)


def plot_trivial(rows: list[dict], size: str, path: str) -> None:
    fig, ax = new_axes()
    V = [r["vocab"] for r in rows]
    ax.plot(V, [r["val_loss"] for r in rows], marker="o", label=f"{size}: final validation loss")
    ax.plot(V, [r["chance"] for r in rows], linestyle="--", color="0.5", label="chance, ln V")
    ax.plot(V, [r["floor"] for r in rows], linestyle=":", color="black",
            label="best possible, ln(V)/seq_len")
    ax.set(xscale="log", xlabel="vocabulary size V", ylabel="loss (nats)",
           title="repeat task at a fixed width")
    ax.legend(fontsize="small")
    save_figure(fig, path)


# ── CLI ───────────────────────────────────────────────────────────────────────────────────────

def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--device", default=DEFAULTS["device"], help="cpu, cuda, cuda:1, ...")
    output.add_argument("--json", help="write the numbers to this JSON file")
    output.add_argument("--plot", help="write a figure to this file (.png, .pdf, .svg)")
    output.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    common = argparse.ArgumentParser(add_help=False, parents=[output])
    common.add_argument("--data", help="token shards folder (default: the run's own --data)")
    common.add_argument("--tokens", type=positive_int, default=DEFAULTS["tokens"],
                        help="hidden states (validation tokens) per measurement, N")
    common.add_argument("--batch_size", type=positive_int, default=DEFAULTS["batch_size"])
    common.add_argument("--seq_len", type=positive_int, default=DEFAULTS["seq_len"],
                        help="tokens per sequence (default: the run's seq_len, 256 for --init)")
    common.add_argument("--chunk", type=positive_int, default=DEFAULTS["chunk"],
                        help="token rows per float64 block of logits (memory: chunk·V·8 bytes)")
    source = argparse.ArgumentParser(add_help=False)
    which = source.add_mutually_exclusive_group(required=True)
    which.add_argument("--run", help="a train.py run folder (config.json, ckpt.pt, ckpt_step*.pt)")
    which.add_argument("--init", choices=list(model.SIZES), help="a fresh model of this size")
    source.add_argument("--head", choices=heads.HEADS, default=DEFAULTS["head"], help="with --init")
    source.add_argument("--tie", action="store_true", help="with --init: tied embeddings")
    source.add_argument("--vocab_size", type=positive_int, default=DEFAULTS["vocab_size"],
                        help="with --init")
    token_set = argparse.ArgumentParser(add_help=False)
    token_set.add_argument("--top_k", type=positive_int, default=DEFAULTS["top_k"],
                           help="keep the K most frequent training tokens")
    token_set.add_argument("--sig_tokens", type=positive_int, default=DEFAULTS["sig_tokens"],
                           help="training tokens counted")

    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("verify", parents=[common, source], help=run_verify.__doc__)
    logits = sub.add_parser("logits", parents=[common, source], help=run_logits.__doc__)
    logits.add_argument("--bins", type=positive_int, default=DEFAULTS["bins"])
    sub.add_parser("bottleneck", parents=[common, source], help=run_bottleneck.__doc__)
    tying = sub.add_parser("tying", parents=[common, token_set], help=run_tying.__doc__)
    tying.add_argument("--tied", required=True, help="run folder trained with --tie")
    tying.add_argument("--untied", required=True, help="run folder trained without --tie")
    tying.add_argument("--knn", type=positive_int, default=DEFAULTS["knn"])
    signatures = sub.add_parser("signatures", parents=[common, token_set],
                                help=run_signatures.__doc__)
    signatures.add_argument("--run", required=True, help="a train.py run folder")
    signatures.add_argument("--offsets", type=int, nargs="+", default=list(DEFAULTS["offsets"]),
                            help="+1 = label signature, -k = context k tokens back")
    trivial = sub.add_parser("trivial", parents=[output], help=run_trivial.__doc__.split("\n\n")[0])
    trivial.add_argument("--out", required=True, help="folder for the data and runs")
    trivial.add_argument("--vocabs", type=positive_int, nargs="+",
                         default=list(DEFAULTS["trivial_vocabs"]))
    trivial.add_argument("--size", choices=list(model.SIZES), default=DEFAULTS["trivial_size"])
    trivial.add_argument("--head", choices=heads.HEADS, default=DEFAULTS["head"])
    trivial.add_argument("--tie", action="store_true", help="tied embeddings")
    trivial.add_argument("--steps", type=positive_int, default=DEFAULTS["trivial_steps"])
    trivial.add_argument("--seq_len", type=positive_int, default=DEFAULTS["trivial_seq_len"])
    trivial.add_argument("--batch_size", type=positive_int, default=DEFAULTS["trivial_batch"])
    trivial.add_argument("--seqs_per_token", type=float, default=0.0,
                         help="train each V for at least S·V/batch steps (equal exposure per token)")
    trivial.add_argument("--trivial_tokens", type=positive_int, default=DEFAULTS["trivial_tokens"])
    trivial.add_argument("--train_args", nargs=argparse.REMAINDER, default=[],
                         help="everything after this goes to train.py as is (e.g. --lr 3e-3)")
    args = p.parse_args(argv)
    if any(o == 0 for o in getattr(args, "offsets", [1])):
        p.error("--offsets must be non-zero (+1 next token, -k context k tokens back)")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    try:
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"--device {args.device} was asked for but no CUDA device is "
                             "available; use --device cpu.")
        result = COMMANDS[args.command](args)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"analyze.py {args.command}: error: {err}") from None
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main()

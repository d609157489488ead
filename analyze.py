"""This paper's checks on a model or a run's checkpoints, and the gradient bottleneck.

    verify      [--run DIR | --init SIZE]  Theorem 4's proof audited step by step (exact
                                           arithmetic); with a model also Lemma 1–2, Prop. 3
                                           and the proof's steps on its own matrix
    logits      --run DIR | --init SIZE    logit statistics, ‖μ‖, B_ratio, Fig. 1 (right), and
                                           what the head's matmul in --dtype loses
    bottleneck  --run DIR | --init SIZE    how much of the loss gradient the LM head lets through

e.g. python analyze.py verify --run out --tokens 2048 --json verify.json
     python analyze.py verify --b_ratio_scan --exhaustive

The related work's embedding geometry (tied vs untied, probability signatures, the `repeat`
task over growing vocabularies) is in experiments/geometry/geometry.py. Every subcommand prints a short table;
`--json PATH` writes its numbers and `--plot PATH` a figure (both atomically). A run folder is
train.py's: config.json + ckpt.pt, and, with `train.py --keep_every N`, weights-only snapshots
ckpt_step*.pt for curves over training. `--init SIZE` measures a freshly initialised model
instead (random tokens unless --data). All measurements run in float64 on --device (cpu or
cuda); the model itself runs in float32 (logits: in --dtype, as train.py runs it).

Notation (as in the paper): W is the V×D output embedding with rows eᵢ, μ = (1/V)·Σᵢ eᵢ its
mean row, h ∈ ℝᴰ a final hidden state, lᵢ = eᵢ·h the logits, Z = Σⱼ exp(lⱼ), p = softmax(l);
after μ-centering e*ᵢ = eᵢ − μ and l*ᵢ = e*ᵢ·h.
"""
import argparse
import io
import json
import math
from pathlib import Path

import numpy as np
import torch

import data
import heads
import measure
import model
import store
import theorem4
from store import positive_int

DEFAULTS = dict(
    tokens=512,          # hidden states per measurement (N) of verify and logits
    bottleneck_tokens_per_dim=4,  # bottleneck's default N = 4·D > 2D: no figure is trivially 1
    batch_size=4,        # sequences per forward pass
    seq_len=None,        # None: the run's seq_len (256 for --init)
    init_seq_len=256,
    seed=0,
    device="cpu",
    head="baseline",
    vocab_size=50304,
    dtype="float32",     # logits: the dtype of the model's matmuls, as train.py --dtype
    bins=100,            # histogram of eᵢ·μ
    chunk=128,           # token rows per float64 block of logits (memory: chunk·V·8 bytes)
)


# ── the paper's identities (pure, float64) ────────────────────────────────────────────────────

def token_chunks(n: int, size: int):
    """Slices that cover range(n) in blocks of at most `size` rows (bounds the N×V memory)."""
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def cross_entropy_rows(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """−log pᵧ = log Z − l_y per row, in the logits' own precision."""
    return torch.logsumexp(logits, dim=1) - logits.gather(1, targets[:, None])[:, 0]


def theorem4_bounds(W: torch.Tensor) -> dict:
    """‖μ‖, ‖μ‖², the tight bounds B₋, B₊ of Eq. 12 (measure.b_bounds) and B_ratio (Eq. 13)."""
    b_minus, b_plus, mu_sq = measure.b_bounds(W)
    return dict(mu_norm=math.sqrt(mu_sq), mu_sq=mu_sq, B_minus=b_minus, B_plus=b_plus,
                B_ratio=measure.b_ratio(W))


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
    Theorem 4 (B_ratio ≤ 1 ⇔ max|l*| ≤ max|l|) and the steps of its proof in App. B (see
    theorem4.theorem4_audit for why each step holds or fails):
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
    absmax, absmax_star = [], []
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


def trivially_one(n_tokens: int, vocab: int, dim: int) -> list[str]:
    """The batch figures of `bottleneck` that equal 1 whatever the model and the data: G has
    rank ≤ min(N, V), and the best rank-k approximation of a matrix of rank ≤ k is itself."""
    rank_bound = min(n_tokens, vocab)
    return [name for name, k in (("rankD_energy", dim), ("rank2D_energy", 2 * dim),
                                 ("rank2D_cosine", 2 * dim)) if rank_bound <= k]


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
    rank G ≤ min(N, V), so rank2D_energy (and its cosine) is trivially 1 when N ≤ 2D and
    rankD_energy when N ≤ D (`trivially_one`); pooled_energy never is — it is 1 only if every
    gₜ lies in col(W). `analyze.py bottleneck` therefore measures N = 4·D tokens by default.
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


# ── models, checkpoints, tokens ───────────────────────────────────────────────────────────────

def checkpoint_paths(run_dir: str) -> list[Path]:
    """A run's weight snapshots in training order: ckpt_step*.pt, then ckpt.pt (the latest)."""
    run = Path(run_dir)
    if not (run / "config.json").is_file():
        raise FileNotFoundError(f"{run} is not a run folder (no config.json); "
                                "pass a folder written by train.py --out_dir.")
    latest = run / "ckpt.pt"
    if latest.exists() and not latest.is_file():
        raise FileNotFoundError(f"{latest} is not a file; move it away, or pass a folder "
                                "written by train.py --out_dir.")
    paths = sorted(run.glob("ckpt_step*.pt")) + [p for p in [latest] if p.is_file()]
    if not paths:
        raise FileNotFoundError(f"{run} holds no checkpoint (ckpt.pt or ckpt_step*.pt); "
                                "train it first, or pass --init SIZE for a fresh model.")
    return paths


def load_checkpoint(path: Path, device: str) -> tuple[model.GPT, dict, int]:
    """(model in eval mode on device, its config dict, its training step) from a checkpoint.
    A missing, corrupt, crafted or config-less file (model.load_checkpoint), settings that
    describe no model, or weights that do not fit it: ValueError in one sentence."""
    ckpt = model.load_checkpoint(path, map_location="cpu")
    try:
        gpt = model.from_config(ckpt["config"])
        gpt.load_state_dict(ckpt["model"])
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    except RuntimeError as err:  # load_state_dict: a missing or extra tensor, or a wrong shape
        detail = next((line.strip() for line in str(err).splitlines()[1:] if line.strip()), err)
        raise ValueError(f"{path} holds weights that do not fit the model its config describes "
                         f"({detail}); it was not written by this train.py, or its config was "
                         "changed.") from None
    return gpt.to(device).eval(), ckpt["config"], ckpt["step"]


def fresh_model(args) -> tuple[model.GPT, dict, int]:
    """A freshly initialised model (--init SIZE, --head, --tie, --vocab_size, --seed), step 0."""
    torch.manual_seed(args.seed)
    cfg = dict(size=args.init, head=args.head, tie=args.tie, vocab_size=args.vocab_size,
               seq_len=args.seq_len or DEFAULTS["init_seq_len"], data=args.data)
    return model.from_config(cfg).to(args.device).eval(), cfg, 0


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
        store.check_dataset(data_dir)          # a half-written or mixed folder: one sentence
        loader = data.ShardLoader(data_dir, args.batch_size, seq_len, split="val")
        held = sum((n - 1) // per_batch for n in loader.lengths) * per_batch  # as val_batches
        if n_tokens > held:
            raise ValueError(f"--tokens {n_tokens} asks for more than the {held} validation "
                             f"tokens that {data_dir} holds in batches of --batch_size × "
                             f"--seq_len = {args.batch_size} × {seq_len}; lower --tokens.")
        return data.val_batches(data_dir, math.ceil(n_tokens / per_batch) * per_batch,
                                args.batch_size, seq_len)
    generator = torch.Generator().manual_seed(args.seed)
    windows = [torch.randint(vocab_size, (args.batch_size, seq_len + 1), generator=generator)
               for _ in range(math.ceil(n_tokens / per_batch))]
    return [(w[:, :-1], w[:, 1:]) for w in windows]


@torch.no_grad()
def hidden_states(gpt: model.GPT, cfg: dict, args, n_tokens: int,
                  dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """H (N×D) final hidden states, N = n_tokens, and their next-token targets (N,). The model
    runs in float32, or under autocast to `dtype` as train.py --dtype runs it; H is float32."""
    H, Y, n = [], [], 0
    low_precision = torch.autocast(torch.device(args.device).type, dtype=dtype,
                                   enabled=dtype != torch.float32)
    for x, y in token_batches(cfg, args, n_tokens, gpt.config.vocab_size):
        with low_precision:
            H.append(gpt.hidden(x.to(args.device)).flatten(0, 1).float())
        Y.append(y.flatten().to(args.device))
        n += y.numel()
        if n >= n_tokens:
            break
    return torch.cat(H)[:n_tokens], torch.cat(Y)[:n_tokens]


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


def verify_theorem4(args) -> dict:
    """theorem4.py's audit, and with --exhaustive / --b_ratio_scan its search and scan."""
    audit = theorem4.theorem4_audit()
    print_table([list(r.values()) for r in audit], list(audit[0]),
                "Theorem 4's proof (App. B) step by step, exact fractions on the smallest "
                "counterexamples (theorem4.py); holds = the step's claim holds on the example")
    out = dict(theorem4_audit=audit)
    if args.exhaustive:
        found = theorem4.exhaustive_search(args.entries, args.h_entries)
        print_table([["—" if v is None else v for v in r.values()] for r in found],
                    list(found[0]),
                    f"exhaustive search: V = 3, D = 2, W's entries in ±{args.entries}, h's in "
                    f"±{args.h_entries}; matrices = how many break the claim, W/h = the "
                    "smallest (size Σ|Wᵢⱼ|)")
        out["exhaustive"] = found
    if args.b_ratio_scan:
        V, D = theorem4.SCAN_SHAPE
        scan = theorem4.binned(theorem4.b_ratio_scan(args.b_ratio_scan, seed=args.seed))
        print_table([list(r.values()) for r in scan], list(scan[0]),
                    f"B_ratio scan: {args.b_ratio_scan} random {V}×{D} matrices W = X·diag(a) "
                    "+ c·m (X ~ N(0, 1), a ~ U(0, 2)ᴰ, c = 10^U(−1, 1), m ~ N(0, I)), "
                    f"{theorem4.SCAN_HIDDEN} random h ~ N(0, I) each, seed {args.seed}; "
                    "larger_share = share of h with max|l*| > max|l| (Theorem 4 says 0 for "
                    "B_ratio ≤ 1, 1 above)")
        out["b_ratio_scan"] = scan
    return out


def run_verify(args) -> dict:
    """Theorem 4's proof audited step by step (theorem4.py); with --run or --init also Lemma 1,
    Lemma 2, Proposition 3 and the proof's steps on the model's own hidden states."""
    result = verify_theorem4(args)
    if not (args.run or args.init):
        return result
    (gpt, cfg, step), = models(args)
    H, targets = hidden_states(gpt, cfg, args, args.tokens)
    H = H.double()
    W = output_weight64(gpt)
    W_star = W.clone()
    heads.build("mu_center").after_step(W_star)  # the project's μ-centering, in float64
    result.update(step=step, head=cfg["head"], tie=bool(cfg.get("tie")), tokens=len(H),
                  **verify_identities(H, W, W_star, targets, args.chunk))
    print_table(verify_table(result), ("statement", "value", "holds"),
                f"verify: {describe(args, cfg, step)}, {len(H)} tokens, float64; "
                f"‖μ‖ = {result['mu_norm']:.4g}, B₋ = {result['B_minus']:.4g}, "
                f"B₊ = {result['B_plus']:.4g}")
    return result


def bf16_spacing(x: float) -> float:
    """The gap between neighbouring bf16 numbers at |x|: 8 significant bits, so 2^(⌊log₂|x|⌋−7)
    (0.0625 at 10, 1 at 128, 8 at 1152: a logit stored there is known to ±half of it)."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 0.0


def mean_logit_shift(H: torch.Tensor, W: torch.Tensor, mean_logit: float) -> torch.Tensor:
    """The common row shift c along the mean hidden state h̄ of H (N, D) that moves the mean
    logit over those tokens to L = mean_logit, float64 (D,). By Lemma 1 the mean logit is
    l̄ = μ·h̄, and after eᵢ ← eᵢ + c it is (μ + c)·h̄; with c = a·h̄ that is l̄ + a‖h̄‖², so
    a = (L − μ·h̄)/‖h̄‖²."""
    h_mean, mu = H.double().mean(0), W.double().mean(0)
    return (mean_logit - h_mean @ mu) / h_mean.square().sum() * h_mean


def offset_precision(head, H: torch.Tensor, W: torch.Tensor, targets: torch.Tensor,
                     dtype: torch.dtype, offsets, chunk: int) -> list[dict]:
    """The finite-precision channel on its own: every output row shifted by one common vector
    c (along the mean hidden state), sized so that the mean logit over the tokens becomes L.

    In exact arithmetic the shift changes nothing: lᵢ = (eᵢ + c)·h = eᵢ·h + c·h moves every
    logit of a token by the same c·h, and softmax is shift-invariant per token (the baseline's
    drifting μ does exactly this; μ-centering undoes it). In `dtype` it changes the rounding:
    the stored rows eᵢ + c and the logits near L. One row per L: the mean logit reached,
    the spacing of bf16 there over the logits' spread σ, and measure.PRECISION_STATS."""
    H64 = H.double()
    sigma = torch.cat([(H64[rows] @ W.double().T).std(dim=1, correction=0)
                       for rows in token_chunks(len(H), chunk)]).mean().item()
    table = []
    for target in offsets:
        shifted = W + mean_logit_shift(H, W, target).to(W.dtype)
        sums = sum(measure.precision_stat_sums(head, H[rows], shifted, targets[rows], dtype).cpu()
                   for rows in token_chunks(len(H), chunk))
        table.append(dict(offset=target, spacing_over_sigma=bf16_spacing(target) / sigma,
                          **dict(zip(measure.PRECISION_STATS, (sums[:-1] / sums[-1]).tolist()))))
    return table


def run_logits(args) -> dict:
    """The paper's logit statistics (Sec. 3) over N tokens, ‖μ‖, the mean hidden state's
    alignment with μ (h_mu_proj = h̄·μ̂ = l̄/‖μ‖, h_mu_cos = cos(h̄, μ), as train.py logs them),
    B_ratio, Fig. 1 (right), and what the head's matmul in --dtype loses
    (measure.precision_stat_sums, as train.py logs it).

    The model runs in --dtype as train.py runs it; the paper's statistics are computed in
    float64 from its hidden states, the precision metrics compare the head's matmul in --dtype
    with float64 (float32: all ~1e-7; bfloat16: what training in bf16 pays)."""
    (gpt, cfg, step), = models(args)
    dtype = getattr(torch, args.dtype)
    H, targets = hidden_states(gpt, cfg, args, args.tokens, dtype)
    W = output_weight64(gpt)
    stats = torch.zeros(len(measure.LOGIT_STATS), dtype=torch.float64)
    precision = torch.zeros(len(measure.PRECISION_STATS) + 1, dtype=torch.float64)  # + count
    for rows in token_chunks(len(H), args.chunk):
        stats += measure.logit_stat_sums(gpt.head.logits(H[rows].double(), W)).cpu()
        precision += measure.precision_stat_sums(gpt.head, H[rows], gpt.output_weight.detach(),
                                               targets[rows], dtype).cpu()
    bounds = theorem4_bounds(W)
    h_mu_proj, h_mu_cos = (x.item() for x in measure.mean_state_alignment(H.mean(0), W))
    result = dict(step=step, head=cfg["head"], tie=bool(cfg.get("tie")), tokens=len(H),
                  dtype=args.dtype, h_mu_proj=h_mu_proj, h_mu_cos=h_mu_cos,
                  **dict(zip(measure.LOGIT_STATS, (stats / len(H)).tolist())),
                  **dict(zip(measure.PRECISION_STATS, (precision[:-1] / precision[-1]).tolist())),
                  **bounds)
    names = (*measure.LOGIT_STATS, "mu_norm", "h_mu_proj", "h_mu_cos", "mu_sq", "B_minus",
             "B_plus", "B_ratio", *measure.PRECISION_STATS)
    print_table([(name, result[name]) for name in names], ("quantity", "value"),
                f"logits: {describe(args, cfg, step)}, per-token statistics averaged over "
                f"{len(H)} tokens; prec_*: the head's matmul in {args.dtype} against float64")
    if args.offsets:
        result["offsets"] = offset_precision(gpt.head, H, gpt.output_weight.detach(), targets,
                                             dtype, args.offsets, args.chunk)
        columns = ("offset", "spacing_over_sigma", *measure.PRECISION_STATS)
        print_table([tuple(row[c] for c in columns) for row in result["offsets"]], columns,
                    f"every output row shifted by one common vector so that the mean logit is "
                    f"L (exact arithmetic: no change); the head's matmul in {args.dtype}")
    if args.plot:
        plot_dot_histogram((W @ W.mean(0)).cpu().numpy(), bounds, args.bins, args.plot)
    return result


def run_bottleneck(args) -> dict:
    """The share of the loss gradient that the LM head passes on, per checkpoint (N = --tokens,
    default 4·D: memory N·V·8 bytes for the float64 gradients)."""
    rows = []
    for gpt, cfg, step in models(args, all_steps=True):
        D, V = gpt.config.n_embd, gpt.config.vocab_size
        n_tokens = args.tokens or DEFAULTS["bottleneck_tokens_per_dim"] * D
        H, targets = hidden_states(gpt, cfg, args, n_tokens)
        G = head_loss_gradients(gpt, H.double(), targets)
        rows.append(dict(step=step, **bottleneck(G, output_weight64(gpt), H.double())))
    columns = ("step", "retained_norm", "suppressed_norm", "retained_energy", "isotropic_energy",
               "pooled_energy", "rankD_energy", "rank2D_energy", "rank2D_cosine", "sgd_cosine")
    trivial = trivially_one(n_tokens, V, D)
    note = f"; trivially 1 as N ≤ {'D' if len(trivial) == 3 else '2D'}: {', '.join(trivial)}" \
        if trivial else ""
    print_table([[r[c] for c in columns] for r in rows], columns,
                f"bottleneck: {describe(args, cfg, step)}, N = {n_tokens} tokens, D = {D}, "
                f"V = {V}{note}")
    if args.plot:
        plot_curves(rows, ("retained_norm", "retained_energy", "rank2D_energy",
                           "isotropic_energy"), "share of the loss gradient", args.plot)
    return dict(run=args.run, init=args.init, tokens=n_tokens, trivially_one=trivial, steps=rows)


COMMANDS = dict(verify=run_verify, logits=run_logits, bottleneck=run_bottleneck)


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


def write_file(path: str, content: bytes) -> None:
    """Write content to path as a unit (store.write_atomic: unique temporary file, fsync,
    rename). A directory, a full disk or any other failure: one sentence (store.WriteError)."""
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"{target} is a directory; give a file name, e.g. {target / 'out.json'}.")
    store.write_atomic(store.make_folder(target.parent) / target.name, content)


def write_json(path: str, result: dict) -> None:
    write_file(path, (json.dumps(result, indent=2) + "\n").encode())


def save_figure(fig, path: str) -> None:
    import matplotlib.pyplot as plt
    image = io.BytesIO()
    fig.savefig(image, format=Path(path).suffix.lstrip(".") or "png", dpi=120)
    plt.close(fig)
    write_file(path, image.getvalue())
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
    """One line per key against the training step; of a single checkpoint (no curve to draw),
    one bar per key."""
    fig, ax = new_axes()
    if len(rows) == 1:
        keys = list(keys)
        ax.barh(keys, [rows[0][key] for key in keys], color="tab:blue")
        ax.invert_yaxis()  # the first key on top, as in the printed table
        ax.set(xlabel=ylabel, title=f"one checkpoint, step {rows[0]['step']} (keep_every "
                                    f"snapshots give curves)")
        save_figure(fig, path)
        return
    steps = [r["step"] for r in rows]
    for key in keys:
        ax.plot(steps, [r[key] for r in rows], marker="o", label=key)
    ax.set(xlabel="training step", ylabel=ylabel)
    ax.legend(fontsize="small")
    save_figure(fig, path)


# ── CLI ───────────────────────────────────────────────────────────────────────────────────────

OFFSET_LIMIT = 1e8  # |L| of --offsets: by 10⁹ the float32 rounding error measured overflows


def offset(text: str) -> float:
    """A mean logit L of --offsets: a finite number with |L| ≤ OFFSET_LIMIT."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give a mean logit L") \
            from None
    if not abs(value) <= OFFSET_LIMIT:  # also NaN
        raise argparse.ArgumentTypeError(f"{text} is out of range; give a finite L with |L| ≤ "
                                         f"{OFFSET_LIMIT:g} (by 1e9 the float32 rounding "
                                         f"error measured overflows)")
    return value


def seed(text: str) -> int:
    """A seed of torch.manual_seed: an integer from 0 to 2⁶⁴ − 1."""
    value = store.non_negative_int(text)
    if value >= 2 ** 64:
        raise argparse.ArgumentTypeError(f"{text} is too large; give an integer from 0 to "
                                         f"2^64 − 1")
    return value


def device(text: str) -> str:
    """A torch device this code runs on: cpu, cuda or cuda:N."""
    try:
        kind = torch.device(text).type
    except RuntimeError:
        kind = None
    if kind not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device this runs on; give cpu, "
                                         f"cuda or cuda:N")
    return text


def shared_options() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """Parent parsers (output: --device --json --plot --seed; measurement: those and --data
    --tokens --batch_size --seq_len --chunk), shared with geometry.py."""
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--device", type=device, default=DEFAULTS["device"],
                        help="cpu, cuda, cuda:1, ...")
    output.add_argument("--json", help="write the numbers to this JSON file")
    output.add_argument("--plot", help="write a figure to this file (.png, .pdf, .svg)")
    output.add_argument("--seed", type=seed, default=DEFAULTS["seed"])
    measurement = argparse.ArgumentParser(add_help=False, parents=[output])
    measurement.add_argument("--data", help="token shards folder (default: the run's own --data)")
    measurement.add_argument("--tokens", type=positive_int,
                             help=f"hidden states (validation tokens) per measurement, N "
                                  f"(default {DEFAULTS['tokens']}; bottleneck: 4·D)")
    measurement.add_argument("--batch_size", type=positive_int, default=DEFAULTS["batch_size"])
    measurement.add_argument("--seq_len", type=positive_int, default=DEFAULTS["seq_len"],
                             help="tokens per sequence (default: the run's, 256 for --init)")
    measurement.add_argument("--chunk", type=positive_int, default=DEFAULTS["chunk"],
                             help="token rows per float64 block of logits (chunk·V·8 bytes)")
    return output, measurement


def model_source(required: bool) -> argparse.ArgumentParser:
    source = argparse.ArgumentParser(add_help=False)
    which = source.add_mutually_exclusive_group(required=required)
    which.add_argument("--run", help="a train.py run folder (config.json, ckpt.pt, ckpt_step*.pt)")
    which.add_argument("--init", choices=list(model.SIZES), help="a fresh model of this size")
    source.add_argument("--head", choices=heads.HEADS, default=DEFAULTS["head"], help="with --init")
    source.add_argument("--tie", action="store_true", help="with --init: tied embeddings")
    source.add_argument("--vocab_size", type=positive_int, default=DEFAULTS["vocab_size"],
                        help="with --init")
    return source


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _, measurement = shared_options()
    sub = p.add_subparsers(dest="command", required=True)
    verify = sub.add_parser("verify", parents=[measurement, model_source(required=False)],
                            help=run_verify.__doc__)
    verify.add_argument("--exhaustive", action="store_true",
                        help="search every V = 3, D = 2 integer matrix for counterexamples")
    verify.add_argument("--entries", type=positive_int, default=theorem4.SEARCH_ENTRIES,
                        help="with --exhaustive: W's entries in {-K, ..., K}")
    verify.add_argument("--h_entries", type=positive_int, default=theorem4.SEARCH_H_ENTRIES,
                        help="with --exhaustive: h's entries in {-K, ..., K}")
    verify.add_argument("--b_ratio_scan", type=positive_int, nargs="?", metavar="MATRICES",
                        const=theorem4.SCAN_MATRICES,
                        help="how often a random h breaks Theorem 4, per B_ratio bin "
                             f"(default {theorem4.SCAN_MATRICES} random matrices)")
    logits = sub.add_parser("logits", parents=[measurement, model_source(required=True)],
                            help=run_logits.__doc__.split("\n\n")[0])
    logits.add_argument("--bins", type=positive_int, default=DEFAULTS["bins"])
    logits.add_argument("--dtype", choices=("float32", "bfloat16"), default=DEFAULTS["dtype"],
                        help="the model's matmul dtype, as train.py --dtype")
    logits.add_argument("--offsets", type=offset, nargs="+", metavar="L",
                        help="also shift every output row by one common vector so that the mean "
                             "logit is L, and report what --dtype then loses (e.g. 0 100 1000)")
    sub.add_parser("bottleneck", parents=[measurement, model_source(required=True)],
                   help=run_bottleneck.__doc__)
    args = p.parse_args(argv)
    if args.command == "verify" and args.plot:
        p.error("verify draws no figure; drop --plot (logits and bottleneck draw one)")
    if args.command != "bottleneck" and args.tokens is None:
        args.tokens = DEFAULTS["tokens"]
    return args


def execute(args, commands: dict, program: str) -> dict:
    """Run args.command and write --json; a bad input ends in one sentence, not a traceback."""
    try:
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"--device {args.device} was asked for but no CUDA device is "
                             "available; use --device cpu.")
        result = commands[args.command](args)
        if args.json:
            write_json(args.json, result)
            print(f"wrote {args.json}")
    except (FileNotFoundError, ValueError, store.WriteError) as err:
        raise SystemExit(f"{program} {args.command}: error: {err}") from None
    return result


def main(argv=None) -> dict:
    return execute(parse_args(argv), COMMANDS, "analyze.py")


if __name__ == "__main__":
    main()

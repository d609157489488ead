"""This paper's checks on a model or a run's checkpoints, and the gradient bottleneck.

    python analyze.py verify [--run DIR | --init SIZE]  # Theorem 4's proof; Lemma 1–2, Prop. 3
    python analyze.py verify --exhaustive --b_ratio_scan
    python analyze.py logits --run out --dtype bfloat16 # logit statistics, ‖μ‖, B_ratio, Fig. 1
    python analyze.py bottleneck --run out              # the loss gradient the head lets through

Measurements are float64 (the rounding statistics of a bf16 matmul: float32 differences,
measure.py), the model runs in float32 (logits: in --dtype); --init without --data scores random
tokens. Notation as in heads.py: W (V×D), rows eᵢ, mean μ, hidden state h, lᵢ = eᵢ·h.
"""
import argparse
import io
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

import data
import heads
import measure
import model
import store
import theorem4
from store import positive_int

DEFAULTS = dict(tokens=512,  # hidden states N per measurement of verify, logits and rarity
                init_seq_len=256, chunk=128)  # chunk: token rows per float64 block of logits

# verify's statements, keyed as in verify_identities; *_dev ≥ 0: the deviation from an identity
STATEMENTS = dict(
    centering_dev="Eq. 11 centering: W* = W − μ", lemma1_dev="Lemma 1: mean(l) = μ·h",
    lemma2_ratio="Lemma 2: max|l| / (max‖e‖·‖h‖) ≤ 1", prop3_mean="Prop. 3 (i): mean(l*) = 0",
    prop3_std_dev="Prop. 3 (ii): std(l*) = std(l)", prop3_loss_dev="Prop. 3 (iii): CE(l*) = CE(l)",
    prop3_prob_dev="Prop. 3 (iii): softmax(l*) = softmax(l)",
    eq26_dev="Eq. 26: B_ratio = max|e*·μ| / max|e·μ|", B_ratio_le_1="Thm. 4 condition: B_ratio ≤ 1",
    eq32_dev="Eq. 32: max‖e*‖² = max‖e*∥‖² + max‖e*⊥‖²", eq34_holds="Eq. 34: max‖e*‖ / max‖e‖ ≤ 1",
    eq35_token_share="Eq. 35 per token: share max|l*| ≤ max|l|",
    eq35_global_holds="Eq. 35 over all tokens: max|l*| / max|l|")
# Every other printed key in words (the JSON keeps the keys)
MEANING = dict(
    logit_mean="mean logit l̄ = (1/V)·Σᵢ lᵢ (Eq. 8)", logit_std="spread σ_l of the logits",
    logit_absmax="largest |lᵢ|", log2Z="log²Z, z-loss's term (Eq. 5)", mu_norm="‖μ‖ (Eq. 7)",
    h_mu_proj="h̄·μ̂: the mean hidden state along μ (l̄ = ‖μ‖·h̄·μ̂, Lemma 1)",
    h_mu_cos="cos(h̄, μ)", mu_sq="‖μ‖², the centre of Eq. 12's bounds on eᵢ·μ",
    B_minus="B₋ = ‖μ‖² − minᵢ eᵢ·μ (Eq. 12)", B_plus="B₊ = maxᵢ eᵢ·μ − ‖μ‖² (Eq. 12)",
    B_ratio="Eq. 13 (Theorem 4: theorem4.py's verdict)",
    prec_ce_gap="loss with the head's matmul in --dtype minus the float64 loss",
    prec_err_cast="logit error from rounding W and h to --dtype, over σ_l",
    prec_err_round="logit error from rounding the matmul's result to --dtype, over σ_l",
    offset="mean logit L the rows are shifted to", spacing_over_sigma="bf16's spacing at L / σ_l",
    retained_norm="‖Pg‖/‖g‖: share of a token's gradient norm that reaches h",
    suppressed_norm="1 − retained_norm", retained_energy="‖Pg‖²/‖g‖²",
    isotropic_energy="r/V: retained_energy for a random col(W)",
    pooled_energy="share of ‖G‖² the best update ΔH·Wᵀ (W frozen) can follow",
    rankD_energy="share of ‖G‖² the best rank-D update can follow",
    rank2D_energy="share of ‖G‖² the best rank-2D update (any one step) can follow",
    rank2D_cosine="√rank2D_energy: the best cosine of a step's ΔZ with −G",
    sgd_cosine="cosine of a plain gradient step's ΔZ with −G")


def theorem4_bounds(W: torch.Tensor) -> dict:
    """‖μ‖, ‖μ‖², Eq. 12's tight bounds B₋, B₊ and B_ratio (Eq. 13), from measure.py."""
    b_minus, b_plus, mu_sq = measure.b_bounds(W)
    return dict(mu_norm=math.sqrt(mu_sq), mu_sq=mu_sq, B_minus=b_minus, B_plus=b_plus,
                B_ratio=measure.b_ratio(W))


def verify_identities(H, W, W_star, targets, chunk: int = DEFAULTS["chunk"]) -> dict:
    """STATEMENTS on states H (N×D), W (V×D), W_star (W μ-centred): l = H Wᵀ, l* = H W*ᵀ."""
    mu = W.mean(0)
    max_norm, max_norm_star = W.norm(dim=1).max(), W_star.norm(dim=1).max()
    out = dict(centering_dev=(W_star - (W - mu)).abs().max().item())
    absmax = []  # per chunk: max|l|, max|l*| of each token
    for h, y in zip(H.split(chunk), targets.split(chunk)):
        l, l_star = h @ W.T, h @ W_star.T
        ce, ce_star = (F.cross_entropy(logits, y, reduction="none") for logits in (l, l_star))
        for name, value in dict(lemma1_dev=(l.mean(1) - h @ mu).abs().max(),
                                lemma2_ratio=(l.abs().amax(1) / (max_norm * h.norm(dim=1))).max(),
                                prop3_mean=l_star.mean(1).abs().max(),
                                prop3_std_dev=(l_star.std(1) - l.std(1)).abs().max(),
                                prop3_prob_dev=(l_star.softmax(1) - l.softmax(1)).abs().max(),
                                prop3_loss_dev=(ce_star - ce).abs().max()).items():
            out[name] = max(out.get(name, 0.0), value.item())
        absmax.append((l.abs().amax(1), l_star.abs().amax(1)))
    absmax, absmax_star = map(torch.cat, zip(*absmax))
    parallel_sq = (W_star @ (mu / mu.norm())) ** 2             # ‖e*ᵢ∥‖²
    perpendicular_sq = (W_star ** 2).sum(1) - parallel_sq      # ‖e*ᵢ⊥‖² (= ‖eᵢ⊥‖²)
    bounds = theorem4_bounds(W)
    eq26 = (W_star @ mu).abs().max() / (W @ mu).abs().max()
    return dict(out, **bounds, B_ratio_le_1=bounds["B_ratio"] <= 1,
                eq26_dev=abs(bounds["B_ratio"] - eq26.item()), max_norm=max_norm.item(),
                max_norm_star=max_norm_star.item(), eq34_holds=bool(max_norm_star <= max_norm),
                eq32_dev=abs(max_norm_star.item() ** 2
                             - (parallel_sq.max() + perpendicular_sq.max()).item()),
                eq35_token_share=(absmax_star <= absmax).double().mean().item(),
                eq35_global_holds=bool(absmax_star.max() <= absmax.max()),
                max_abs_logit=absmax.max().item(), max_abs_logit_star=absmax_star.max().item())


def loss_gradients(logits: torch.Tensor, targets: torch.Tensor, cap_logits=lambda l: l):
    """G (N×V): row t is gₜ = ∂CEₜ/∂lₜ through a head's cap_logits (regularisers left out), by
    autograd; uncapped, gₜ = softmax(lₜ) − onehot(yₜ)."""
    with torch.enable_grad():
        logits = logits.detach().requires_grad_()
        ce = F.cross_entropy(cap_logits(logits), targets, reduction="sum")
        return torch.autograd.grad(ce, logits)[0]


def trivially_one(n_tokens: int, vocab: int, dim: int) -> list[str]:
    """The batch figures that are 1 whatever the model: rank G ≤ min(N, V) ≤ k."""
    return [name for name, k in (("rankD_energy", dim), ("rank2D_energy", 2 * dim),
                                 ("rank2D_cosine", 2 * dim)) if min(n_tokens, vocab) <= k]


def bottleneck(G: torch.Tensor, W: torch.Tensor, H: torch.Tensor | None = None) -> dict:
    """How much of the loss gradient G (N×V) an LM head l = W h lets through (MEANING: each).
    Through h the logits move by W Δh ∈ col(W); the signal Wᵀg sent below sees g only through
    P g, its projection onto col(W) = span Q (V×r), ‖Pg‖ = ‖Qᵀg‖. One step moves Z = H Wᵀ by
    ΔH Wᵀ + H ΔWᵀ, of rank ≤ 2D; by Eckart–Young the best rank-k matrix follows
    Σ_{i≤k} σᵢ²/Σᵢ σᵢ² of ‖G‖² (σᵢ: G's singular values). With H, the plain step on free H and W
    is ΔZ ∝ −(G W Wᵀ + H Hᵀ G) =: −M; ⟨M, G⟩ = ‖GW‖² + ‖HᵀG‖² and ‖M‖² = tr((GW)ᵀ(GW)·WᵀW) +
    tr((HᵀG)(HᵀG)ᵀ·HᵀH) + 2‖HᵀGW‖² give sgd_cosine without forming M."""
    (N, V), D = G.shape, W.shape[1]
    U, S, _ = torch.linalg.svd(W, full_matrices=False)
    Q = U[:, S > 1e-10 * S.max()]  # col(W) at W's numerical rank r
    r, g_sq, kept_sq = Q.shape[1], (G ** 2).sum(1), ((G @ Q) ** 2).sum(1)
    sigma_sq = torch.linalg.eigvalsh(G @ G.T).flip(0).clamp_min(0)  # σᵢ² of G, descending
    total = sigma_sq.sum()
    rank2D, energy = (sigma_sq[:2 * D].sum() / total).item(), kept_sq / g_sq
    retained_norm, retained_energy = energy.sqrt().mean().item(), energy.mean().item()
    out = dict(tokens=N, vocab=V, rank=r, retained_norm=retained_norm,
               retained_energy=retained_energy, suppressed_norm=1 - retained_norm,
               suppressed_energy=1 - retained_energy, isotropic_energy=r / V,
               pooled_energy=(kept_sq.sum() / g_sq.sum()).item(), rank2D_cosine=math.sqrt(rank2D),
               rankD_energy=(sigma_sq[:D].sum() / total).item(), rank2D_energy=rank2D)
    if H is not None:
        GW, HtG = G @ W, H.T @ G
        m_sq = (torch.trace(GW.T @ GW @ (W.T @ W)) + torch.trace(HtG @ HtG.T @ (H.T @ H))
                + 2 * ((HtG @ W) ** 2).sum())
        out["sgd_cosine"] = (((GW ** 2).sum() + (HtG ** 2).sum()) / (m_sq * total).sqrt()).item()
    return out


def run_models(run_dir: str, device: str, all_steps: bool):
    """Yield (model, config, step) of ckpt.pt or, with all_steps, of each snapshot, then ckpt.pt."""
    run, latest = Path(run_dir), Path(run_dir) / "ckpt.pt"
    if not (run / "config.json").is_file():
        raise FileNotFoundError(f"{run} is not a run folder (no config.json); pass train.py's "
                                "--out_dir.")
    if latest.exists() and not latest.is_file():
        raise FileNotFoundError(f"{latest} is not a file; move it away, or pass another run.")
    if not (paths := sorted(run.glob("ckpt_step*.pt")) + [latest] * latest.is_file()):
        raise FileNotFoundError(f"{run} holds no checkpoint; train it first, or pass --init.")
    last_step = -1
    for path in paths if all_steps else paths[-1:]:
        gpt, cfg, step = model.load_model(path, device)
        if step > last_step:  # ckpt.pt is skipped where the last snapshot has its step
            yield gpt, cfg, step
        last_step = step


def models(args, all_steps: bool = False):
    """The model(s) a subcommand measures: --run's checkpoints, or a fresh --init SIZE at step 0."""
    if not args.init:
        return run_models(args.run, args.device, all_steps)
    torch.manual_seed(args.seed)
    cfg = dict(size=args.init, head=args.head, tie=args.tie, vocab_size=args.vocab_size,
               seq_len=args.seq_len or DEFAULTS["init_seq_len"], data=args.data)
    return [(model.from_config(cfg).to(args.device).eval(), cfg, 0)]


@torch.no_grad()
def hidden_states(gpt: model.GPT, cfg: dict, args, n_tokens: int, dtype=torch.float32):
    """(H, targets): the final hidden states (N×D, float32) of N = n_tokens validation tokens of
    the run's data or --data (random tokens without), the model under autocast to `dtype`."""
    seq_len, data_dir = args.seq_len or int(cfg["seq_len"]), args.data or cfg.get("data")
    n_batches = math.ceil(n_tokens / (per_batch := args.batch_size * seq_len))
    if data_dir:
        store.check_dataset(data_dir)          # a half-written or mixed folder: one sentence
        if n_tokens > (held := data.val_steps_held(data_dir, args.batch_size, seq_len) * per_batch):
            raise ValueError(f"--tokens {n_tokens} is more than the {held} validation tokens "
                             f"{data_dir} holds in batches of {per_batch}; lower --tokens.")
        batches = data.val_batches(data_dir, n_batches * per_batch, args.batch_size, seq_len)
    else:
        windows = torch.randint(gpt.config.vocab_size, (n_batches, args.batch_size, seq_len + 1),
                                generator=torch.Generator().manual_seed(args.seed))
        batches = [(w[:, :-1], w[:, 1:]) for w in windows]
    H, Y = [], []
    for x, y in batches:
        with torch.autocast(torch.device(args.device).type, dtype, enabled=dtype != torch.float32):
            H.append(gpt.hidden(x.to(args.device)).flatten(0, 1).float())
        Y.append(y.flatten().to(args.device))
    return torch.cat(H)[:n_tokens], torch.cat(Y)[:n_tokens]


def run_verify(args) -> dict:
    """Theorem 4's proof audited step by step (theorem4.py); with --run or --init also Lemma 1,
    Lemma 2, Prop. 3 and the proof's steps on the model's own hidden states."""
    pairs = theorem4.search_pairs(args.entries, args.h_entries)
    if args.exhaustive and pairs > (most := theorem4.SEARCH_MAX_PAIRS):  # it grows as (2K+1)⁶
        fits = next(k for k in reversed(range(args.entries))  # the largest K that fits, or 0
                    if theorem4.search_pairs(k, args.h_entries) <= most)
        raise ValueError(f"--exhaustive with --entries {args.entries} and --h_entries "
                         f"{args.h_entries} would compare {pairs:,} (W, h) pairs, more than the "
                         f"{most:,} it may; give " + (f"--entries {fits} or less." if fits else
                                                      "a smaller --h_entries."))
    result = dict(theorem4_audit=theorem4.theorem4_audit())
    print_table(result["theorem4_audit"], "Theorem 4's proof (App. B) step by step in exact "
                "fractions on the smallest counterexamples; holds: the step's claim holds there")
    if args.exhaustive:
        print(f"exhaustive search: {pairs:,} (W, h) pairs …", flush=True)
        result["exhaustive"] = theorem4.exhaustive_search(args.entries, args.h_entries)
        print_table(result["exhaustive"], f"exhaustive search: V = 3, D = 2, W's entries in "
                    f"±{args.entries}, h's in ±{args.h_entries}; matrices: how many break it")
    if args.b_ratio_scan:
        scan = theorem4.b_ratio_scan(args.b_ratio_scan, seed=args.seed)
        result["b_ratio_scan"] = theorem4.binned(scan)
        print_table(result["b_ratio_scan"], f"B_ratio scan: {args.b_ratio_scan} random matrices, "
                    f"seed {args.seed}; larger_share: share of random h with max|l*| > max|l|")
    if not (args.run or args.init):
        return result
    (gpt, cfg, step), = models(args)
    H, targets = hidden_states(gpt, cfg, args, args.tokens)
    W = gpt.output_weight.detach().double()
    heads.build("mu_center").after_step(W_star := W.clone())  # the project's μ-centering
    r = dict(step=step, head=cfg["head"], tie=bool(cfg.get("tie")), tokens=len(H),
             **verify_identities(H.double(), W, W_star, targets, args.chunk))
    value = dict(r, B_ratio_le_1=r["B_ratio"], eq34_holds=r["max_norm_star"] / r["max_norm"],
                 eq35_global_holds=r["max_abs_logit_star"] / r["max_abs_logit"])
    holds = dict(r, lemma2_ratio=r["lemma2_ratio"] <= 1 + 1e-12,
                 eq35_token_share=r["eq35_token_share"] == 1)
    tol = 1e-12 * max(1.0, r["max_abs_logit"])  # an identity holds at float64 round-off
    rows = [dict(statement=statement, value=value[key],
                 holds=holds[key] if isinstance(holds[key], bool) else value[key] <= tol)
            for key, statement in STATEMENTS.items()]
    print_table(rows, f"verify: {describe(args, cfg, step)}, {len(H)} tokens")
    return result | r


def bf16_spacing(x: float) -> float:
    """The gap between neighbouring bf16 numbers at |x| (8 significant bits): 2^(⌊log₂|x|⌋−7)."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 0.0


def mean_logit_shift(H: torch.Tensor, W: torch.Tensor, mean_logit: float) -> torch.Tensor:
    """The common row shift c = a·h̄ (float64, D) that moves the mean logit μ·h̄ over H's tokens
    to L = mean_logit: (μ + c)·h̄ = μ·h̄ + a‖h̄‖² (Lemma 1), so a = (L − μ·h̄)/‖h̄‖²."""
    h_mean, mu = H.double().mean(0), W.double().mean(0)
    return (mean_logit - h_mean @ mu) / h_mean.square().sum() * h_mean


def run_logits(args) -> dict:
    """Logit statistics (Sec. 3), ‖μ‖, h̄·μ̂, B_ratio, Fig. 1 (right), what --dtype's head loses."""
    (gpt, cfg, step), = models(args)
    H, targets = hidden_states(gpt, cfg, args, args.tokens, dtype := getattr(torch, args.dtype))
    W = (weight := gpt.output_weight.detach()).double()
    chunks = list(zip(H.split(args.chunk), targets.split(args.chunk)))

    def precision(E):  # measure.precision_stat_sums over the tokens, as means
        sums = sum(measure.precision_stat_sums(gpt.head, h, E, y, dtype).cpu() for h, y in chunks)
        return dict(zip(heads.PRECISION_STATS, (sums[:-1] / sums[-1]).tolist()))
    stats = sum(heads.logit_stats(gpt.head.logits(h.double(), W)).sum(1) for h, _ in chunks)
    h_mu_proj, h_mu_cos = (x.item() for x in heads.mean_state_alignment(H.mean(0), W))
    result = dict(step=step, head=cfg["head"], tie=bool(cfg.get("tie")), tokens=len(H),
                  dtype=args.dtype, h_mu_proj=h_mu_proj, h_mu_cos=h_mu_cos,
                  **dict(zip(heads.LOGIT_STATS, (stats / len(H)).tolist())),
                  **precision(weight), **theorem4_bounds(W))
    print_table([dict(quantity=key, value=result[key], meaning=MEANING[key]) for key in MEANING
                 if key in result], f"logits: {describe(args, cfg, step)}; per-token figures "
                f"averaged over {len(H)} tokens; --dtype {args.dtype}")
    if args.offsets:  # all rows + c (mean_logit_shift): exactly no change, as softmax drops c·h
        sigma = torch.cat([(h.double() @ W.T).std(1, correction=0) for h, _ in chunks]).mean()
        result["offsets"] = [dict(offset=L, spacing_over_sigma=bf16_spacing(L) / sigma.item(),
                                  **precision(weight + mean_logit_shift(H, W, L).to(weight.dtype)))
                             for L in args.offsets]
        print_table(result["offsets"], "every output row shifted by one vector to a mean logit L "
                    f"(exactly: no change); the head's matmul in {args.dtype}", legend=True)
    if args.plot:
        plot_dot_histogram((W @ W.mean(0)).cpu().numpy(), result, args.bins, args.plot)
    return result


def run_bottleneck(args) -> dict:
    """The share of the loss gradient that the LM head passes on, per checkpoint (N·V·8 bytes)."""
    rows = []
    for gpt, cfg, step in models(args, all_steps=True):
        D, V = gpt.config.n_embd, gpt.config.vocab_size
        n_tokens = args.tokens or 4 * D  # N > 2D: no figure trivially 1 where V > 2D too
        H, targets = hidden_states(gpt, cfg, args, n_tokens)
        W, H = gpt.output_weight.detach().double(), H.double()
        G = loss_gradients(H @ W.T, targets, gpt.head.cap_logits)
        rows.append(dict(step=step, **bottleneck(G, W, H)))
    trivial = trivially_one(n_tokens, V, D)
    note = f"; trivially 1 as N ≤ {'2D' if len(trivial) < 3 else 'D'}: {', '.join(trivial)}"
    print_table(rows, f"bottleneck: {describe(args, cfg, step)}, N = {n_tokens}, D = {D}, "
                f"V = {V}{note * bool(trivial)}",
                ["step", *(key for key in MEANING if key in rows[0])], legend=True)
    if args.plot:
        plot_curves(rows, ("retained_norm", "retained_energy", "rank2D_energy",
                           "isotropic_energy"), "share of the loss gradient", args.plot)
    return dict(run=args.run, init=args.init, tokens=n_tokens, trivially_one=trivial, steps=rows)


def describe(args, cfg: dict, step: int) -> str:
    return (f"{args.run or f'fresh {args.init}'} (size {cfg['size']}, head {cfg['head']}, "
            f"tie {bool(cfg.get('tie'))}, step {step})")


def print_table(rows: list[dict], title: str, columns=None, legend: bool = False) -> None:
    """An aligned table of `columns` (default: the first row's keys); legend: their MEANING."""
    cell = lambda v: ("yes" if v else "no") if isinstance(v, bool) else (
        f"{v:.4g}" if isinstance(v, float) else "—" if v is None else str(v))
    columns = columns or list(rows[0])
    cells = [[cell(row[c]) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    print(title)
    for line in [list(columns)] + cells:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip())
    for column in [c for c in columns if c in MEANING] if legend else ():
        print(f"  {column}: {MEANING[column]}")


def write_file(path: str, content: bytes) -> None:
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"{target} is a directory; give a file name, e.g. {target / 'out.json'}.")
    store.write_atomic(store.make_folder(target.parent) / target.name, content)
    print(f"wrote {path}")


def new_axes(*grid, figsize=(6.4, 4.0), **options):  # no pyplot: files only, nothing to close
    from matplotlib.figure import Figure
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.subplots(*grid, **options)


def save_figure(fig, path: str) -> None:
    image = io.BytesIO()
    fig.savefig(image, format=Path(path).suffix.lstrip(".") or "png", dpi=120)
    write_file(path, image.getvalue())


def plot_dot_histogram(dots, bounds: dict, bins: int, path: str) -> None:
    """Fig. 1 (right): histogram of eᵢ·μ with 0, ‖μ‖² and the extrema ‖μ‖² − B₋, ‖μ‖² + B₊."""
    fig, ax = new_axes()
    ax.hist(dots, bins=bins, color="0.6")
    mu_sq, b_minus, b_plus = bounds["mu_sq"], bounds["B_minus"], bounds["B_plus"]
    ax.axvline(0, color="black", linestyle=":", label="0")
    ax.axvline(mu_sq, color="purple", linestyle="--", label=f"‖μ‖² = {mu_sq:.3g}")
    ax.axvline(mu_sq - b_minus, color="green", linestyle="--", label="‖μ‖² − B₋, ‖μ‖² + B₊")
    ax.axvline(mu_sq + b_plus, color="green", linestyle="--")
    ax.set(xlabel="eᵢ·μ", ylabel="tokens", title=f"B₋ = {b_minus:.3g}, B₊ = {b_plus:.3g}, "
                                                  f"B_ratio = {bounds['B_ratio']:.3g}")
    ax.legend()
    save_figure(fig, path)


def plot_curves(rows: list[dict], keys, ylabel: str, path: str) -> None:
    """One line per key against the training step; of one checkpoint, one bar per key."""
    fig, ax = new_axes()
    if len(rows) == 1:
        ax.barh(keys, [rows[0][key] for key in keys], color="tab:blue")
        ax.invert_yaxis()  # the first key on top, as in the printed table
        ax.set(xlabel=ylabel, title=f"one checkpoint, step {rows[0]['step']} (keep_every: curves)")
    else:
        for key in keys:
            ax.plot([r["step"] for r in rows], [r[key] for r in rows], marker="o", label=key)
        ax.set(xlabel="training step", ylabel=ylabel)
        ax.legend(fontsize="small")
    save_figure(fig, path)


# an argparse type: a mean logit L. At 8192 `logits --init tiny --vocab_size 512 --dtype bfloat16`
# gave prec_ce_gap = inf (a rounding error past ln(FLT_MAX) ≈ 88.72 overflows float32's exp); at 4096 it, its
# --seed 1 and --vocab_size 50304 gave finite statistics
offset = store.number(float, "a finite L with |L| ≤ 4096", lambda v: abs(v) <= 4096)


def shared_options() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """Parent parsers shared with the experiments: output, and measurement (output's and more)."""
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--device", type=store.device, default="cpu", help="cpu, cuda, cuda:1, ...")
    output.add_argument("--json", help="write the numbers to this JSON file")
    output.add_argument("--plot", help="write a figure to this file (.png, .pdf, .svg); "
                        "analyze.py verify draws none")
    output.add_argument("--seed", type=store.seed, default=0)
    measurement = argparse.ArgumentParser(add_help=False, parents=[output])
    add = measurement.add_argument
    add("--data", help="token shards folder (default: the run's own --data)")
    add("--tokens", type=positive_int, help=f"validation tokens N per measurement (default "
                                            f"{DEFAULTS['tokens']}; bottleneck: 4·D)")
    add("--batch_size", type=positive_int, default=4)
    add("--seq_len", type=positive_int, help=f"the run's; --init: {DEFAULTS['init_seq_len']}")
    add("--chunk", type=positive_int, default=DEFAULTS["chunk"], help="rows at once: chunk·V·8 B")
    return output, measurement


def model_source(required: bool) -> argparse.ArgumentParser:
    source = argparse.ArgumentParser(add_help=False)
    which = source.add_mutually_exclusive_group(required=required)
    which.add_argument("--run", help="a train.py run folder (config.json, ckpt.pt, ckpt_step*.pt)")
    which.add_argument("--init", choices=list(model.SIZES), help="a fresh model of this size")
    source.add_argument("--head", choices=heads.HEADS, default="baseline", help="with --init")
    source.add_argument("--tie", action="store_true", help="with --init: tied embeddings")
    source.add_argument("--vocab_size", type=positive_int, default=50304, help="with --init")
    return source


def main(argv=None) -> dict:
    commands = dict(verify=run_verify, logits=run_logits, bottleneck=run_bottleneck)
    p, sub = store.command_parser(__doc__)
    command = {name: sub.add_parser(name, help=run.__doc__.split("\n\n")[0], parents=[
        shared_options()[1], model_source(name != "verify")]) for name, run in commands.items()}
    add = command["verify"].add_argument
    add("--exhaustive", action="store_true", help="search small integer W for counterexamples")
    add("--entries", type=positive_int, default=theorem4.SEARCH_ENTRIES, help="W's entries in ±K")
    add("--h_entries", type=positive_int, default=theorem4.SEARCH_H_ENTRIES, help="h's in ±K")
    add("--b_ratio_scan", type=positive_int, nargs="?", metavar="MATRICES",
        const=theorem4.SCAN_MATRICES, help="how often a random h breaks Theorem 4, per B_ratio "
                                           f"bin (default {theorem4.SCAN_MATRICES} matrices)")
    add = command["logits"].add_argument
    add("--bins", type=positive_int, default=100, help="histogram bins of eᵢ·μ")
    add("--dtype", choices=("float32", "bfloat16"), default="float32", help="as train.py's")
    add("--offsets", type=offset, nargs="+", metavar="L", help="also what --dtype loses with all "
        "rows shifted by one vector to a mean logit L (e.g. 0 100 1000)")
    args = p.parse_args(argv)
    if args.command == "verify" and args.plot:
        p.error("verify draws no figure; drop --plot (logits and bottleneck draw one)")
    args.tokens = args.tokens or (None if args.command == "bottleneck" else DEFAULTS["tokens"])
    return execute(args, commands, "analyze.py")


def execute(args, commands: dict, program: str) -> dict:
    """Run args.command and write --json; a bad input ends in one sentence, not a traceback."""
    try:
        result = commands[args.command](args)
        if args.json:
            write_file(args.json, (json.dumps(result, indent=2) + "\n").encode())
    except (FileNotFoundError, ValueError, store.WriteError) as err:
        raise SystemExit(f"{program} {args.command}: error: {err}") from None
    return result


if __name__ == "__main__":
    main()

"""The paper's checks on a trained model, its logit statistics, and the LM-head gradient bottleneck.

    python analyze.py verify --run DIR                   # Lemma 1–2, Prop. 3, Theorem 4's bounds
    python analyze.py logits --run DIR --dtype bfloat16  # logit statistics; --plot: Fig. 1 (right)
    python analyze.py bottleneck --run DIR               # the loss gradient the head passes on

--init SIZE measures a fresh model instead (on random tokens unless --data is given). The model
runs in float32 (logits: under autocast to --dtype); what is measured of it is float64. Notation
as in heads.py: W (V×D) with rows eᵢ and mean μ, a hidden state h, the logits lᵢ = eᵢ·h; the
μ-centred W* = W − μ has rows e*ᵢ and logits l*ᵢ = e*ᵢ·h. Theorem 4's exact audit:
experiments/theorem4/.
"""
import argparse
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

import data
import heads
import model

DEFAULTS = dict(tokens=512,  # hidden states N per measurement (bottleneck: 4·D)
                init_seq_len=256, chunk=128)  # chunk: token rows per float64 block of logits

# verify's rows: (key, the paper's statement, how it holds: "0" an error, "≤ 1" a ratio)
CLAIMS = (
    ("centering_dev", "Eq. 11: centering gives W − μ", "0"),
    ("lemma1_dev", "Lemma 1: mean logit = μ·h", "0"),
    ("lemma2_ratio", "Lemma 2: max|l| ≤ max‖e‖·‖h‖", "≤ 1"),
    ("prop3_mean", "Prop. 3 (i): the centred logits have mean 0", "0"),
    ("prop3_std_dev", "Prop. 3 (ii): centering keeps the logits' spread", "0"),
    ("prop3_prob_dev", "Prop. 3 (iii): centering keeps the probabilities", "0"),
    ("prop3_loss_dev", "Prop. 3 (iii): centering keeps the loss", "0"),
    ("eq26_dev", "Eq. 26: B_ratio = max|e*·μ| / max|e·μ|", "0"),
    ("B_ratio", "Theorem 4's condition: B_ratio ≤ 1", "≤ 1"),
    ("eq34_ratio", "Eq. 34: max‖e*‖ ≤ max‖e‖", "≤ 1"),
    ("eq35_ratio", "Eq. 35: max|l*| ≤ max|l| over all tokens", "≤ 1"),
    ("eq35_token_fails", "Eq. 35 per token: share with max|l*| > max|l|", "0"))

# logits' and bottleneck's figures in words (the JSON keeps the keys)
MEANING = dict(
    logit_mean="mean logit l̄ = (1/V)·Σᵢ lᵢ (Eq. 8)", logit_std="spread σ_l of the logits",
    logit_absmax="largest |lᵢ|", log2Z="log²Z, z-loss's term (Eq. 5)", mu_norm="‖μ‖ (Eq. 7)",
    h_mu_proj="h̄·μ̂: the mean hidden state along μ (l̄ = ‖μ‖·h̄·μ̂, Lemma 1)",
    h_mu_cos="cos(h̄, μ)", mu_sq="‖μ‖², the centre of Eq. 12's bounds on eᵢ·μ",
    B_minus="B₋ = ‖μ‖² − minᵢ eᵢ·μ (Eq. 12)", B_plus="B₊ = maxᵢ eᵢ·μ − ‖μ‖² (Eq. 12)",
    B_ratio="Eq. 13 (Theorem 4: experiments/theorem4/)",
    prec_ce_gap="loss with the head's matmul in --dtype minus the float64 loss",
    prec_err_cast="logit error from rounding W and h to --dtype, over σ_l",
    prec_err_round="logit error from rounding the matmul's result to --dtype, over σ_l",
    offset="mean logit L the rows are shifted to", spacing_over_sigma="bf16's spacing at L / σ_l",
    retained_norm="‖Pg‖/‖g‖: share of a token's gradient norm that reaches h",
    retained_energy="‖Pg‖²/‖g‖²",
    isotropic_energy="r/V: retained_energy for a random col(W)",
    pooled_energy="share of ‖G‖² the best update ΔH·Wᵀ (W frozen) can follow",
    rankD_energy="share of ‖G‖² the best rank-D update can follow",
    rank2D_energy="share of ‖G‖² the best rank-2D update (any one step) can follow",
    rank2D_cosine="√rank2D_energy: the best cosine of a step's ΔZ with −G",
    sgd_cosine="cosine of a plain gradient step's ΔZ with −G")


def b_bounds(weight) -> dict:
    """Eq. 12's tight bounds on eᵢ·μ and Eq. 13's B_ratio for `weight` (V×D), in float64:
        ‖μ‖² − B₋ ≤ eᵢ·μ ≤ ‖μ‖² + B₊,   B₋ = ‖μ‖² − minᵢ eᵢ·μ,   B₊ = maxᵢ eᵢ·μ − ‖μ‖²,
        B_ratio = max(B₋, B₊) / max(B₋ − ‖μ‖², B₊ + ‖μ‖²)   (1 where μ = 0).
    Both bounds are ≥ 0, as eᵢ·μ has mean ‖μ‖² over i. Tight, they make Eq. 13 equal Eq. 26,
    B_ratio = maxᵢ|e*ᵢ·μ| / maxᵢ|eᵢ·μ|, since e*ᵢ·μ = eᵢ·μ − ‖μ‖² fills [−B₋, B₊]."""
    e = weight.detach().double()
    mu = e.mean(0)
    dots = e @ mu
    mu_sq = (mu @ mu).item()
    b_minus, b_plus = mu_sq - dots.min().item(), dots.max().item() - mu_sq
    ratio = max(b_minus, b_plus) / max(b_minus - mu_sq, b_plus + mu_sq) if mu_sq else 1.0
    return dict(mu_norm=math.sqrt(mu_sq), mu_sq=mu_sq, B_minus=b_minus, B_plus=b_plus,
                B_ratio=ratio)


def b_ratio(weight) -> float:
    return b_bounds(weight)["B_ratio"]


def verify_identities(H, W, W_star, targets, chunk: int = DEFAULTS["chunk"]) -> dict:
    """CLAIMS on hidden states H (N×D) and W (V×D) with its μ-centred W_star, l = H Wᵀ and
    l* = H W*ᵀ: a *_dev is the largest error of an identity over the tokens, a *_ratio the left
    side of an inequality over its right side (the largest over the tokens: Lemma 2)."""
    mu = W.mean(0)
    max_norm = W.norm(dim=1).max()
    out = dict(centering_dev=(W_star - (W - mu)).abs().max().item())
    absmax, absmax_star = [], []  # per token: max|l|, max|l*|
    for h, y in zip(H.split(chunk), targets.split(chunk)):
        l, l_star = h @ W.T, h @ W_star.T
        ce = F.cross_entropy(l, y, reduction="none")
        ce_star = F.cross_entropy(l_star, y, reduction="none")
        absmax.append(l.abs().amax(1))
        absmax_star.append(l_star.abs().amax(1))
        errors = dict(lemma1_dev=(l.mean(1) - h @ mu).abs().max(),
                      lemma2_ratio=(absmax[-1] / (max_norm * h.norm(dim=1))).max(),
                      prop3_mean=l_star.mean(1).abs().max(),
                      prop3_std_dev=(l_star.std(1) - l.std(1)).abs().max(),
                      prop3_prob_dev=(l_star.softmax(1) - l.softmax(1)).abs().max(),
                      prop3_loss_dev=(ce_star - ce).abs().max())
        for name, value in errors.items():
            out[name] = max(out.get(name, 0.0), value.item())
    absmax, absmax_star = torch.cat(absmax), torch.cat(absmax_star)
    bounds = b_bounds(W)
    eq26 = ((W_star @ mu).abs().max() / (W @ mu).abs().max()).item()
    return dict(out, **bounds, eq26_dev=abs(bounds["B_ratio"] - eq26),
                eq34_ratio=(W_star.norm(dim=1).max() / max_norm).item(),
                eq35_ratio=(absmax_star.max() / absmax.max()).item(),
                eq35_token_fails=(absmax_star > absmax).double().mean().item(),
                max_abs_logit=absmax.max().item())


def loss_gradients(logits: torch.Tensor, targets: torch.Tensor, cap_logits=lambda l: l):
    """G (N×V): row t is gₜ = ∂CEₜ/∂lₜ through a head's cap_logits (regularisers left out), by
    autograd; uncapped, gₜ = softmax(lₜ) − onehot(yₜ)."""
    with torch.enable_grad():
        logits = logits.detach().requires_grad_()
        ce = F.cross_entropy(cap_logits(logits), targets, reduction="sum")
        return torch.autograd.grad(ce, logits)[0]


def trivially_one(n_tokens: int, vocab: int, dim: int) -> list[str]:
    """The batch figures that are 1 whatever the model: rank G ≤ min(N, V) ≤ k."""
    ranks = (("rankD_energy", dim), ("rank2D_energy", 2 * dim), ("rank2D_cosine", 2 * dim))
    return [name for name, k in ranks if min(n_tokens, vocab) <= k]


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
    r = Q.shape[1]
    g_sq, kept_sq = (G ** 2).sum(1), ((G @ Q) ** 2).sum(1)
    sigma_sq = torch.linalg.eigvalsh(G @ G.T).flip(0).clamp_min(0)  # σᵢ² of G, descending
    total = sigma_sq.sum()
    rank2D = (sigma_sq[:2 * D].sum() / total).item()
    energy = kept_sq / g_sq
    out = dict(tokens=N, vocab=V, rank=r, retained_norm=energy.sqrt().mean().item(),
               retained_energy=energy.mean().item(), isotropic_energy=r / V,
               pooled_energy=(kept_sq.sum() / g_sq.sum()).item(), rank2D_cosine=math.sqrt(rank2D),
               rankD_energy=(sigma_sq[:D].sum() / total).item(), rank2D_energy=rank2D)
    if H is not None:
        GW, HtG = G @ W, H.T @ G
        m_sq = (torch.trace(GW.T @ GW @ (W.T @ W)) + torch.trace(HtG @ HtG.T @ (H.T @ H))
                + 2 * ((HtG @ W) ** 2).sum())
        out["sgd_cosine"] = (((GW ** 2).sum() + (HtG ** 2).sum()) / (m_sq * total).sqrt()).item()
    return out


def models(args, all_steps: bool = False):
    """(model, config, step) of --run's ckpt.pt or, with all_steps, of each ckpt_step*.pt and
    then ckpt.pt (skipped where the last snapshot has its step); or a fresh --init SIZE."""
    if args.init:
        torch.manual_seed(args.seed)
        cfg = dict(size=args.init, head=args.head, tie=args.tie, vocab_size=args.vocab_size,
                   seq_len=args.seq_len or DEFAULTS["init_seq_len"], data=args.data)
        yield model.from_config(cfg).to(args.device).eval(), cfg, 0
        return
    run = Path(args.run)
    paths = sorted(run.glob("ckpt_step*.pt"))
    if (run / "ckpt.pt").is_file():
        paths.append(run / "ckpt.pt")
    if not paths:
        raise FileNotFoundError(f"{run} holds no checkpoint (ckpt.pt, ckpt_step*.pt); pass the "
                                "--out_dir of a train.py run, or --init SIZE.")
    last_step = -1
    for path in paths if all_steps else paths[-1:]:
        gpt, cfg, step = model.load_model(path, args.device)
        if step > last_step:  # ckpt.pt is skipped where the last snapshot has its step
            yield gpt, cfg, step
        last_step = step


@torch.no_grad()
def hidden_states(gpt: model.GPT, cfg: dict, args, n_tokens: int, dtype=torch.float32):
    """(H, targets): the final hidden states (N×D, float32) of N = n_tokens validation tokens of
    the run's data or --data (random tokens without), the model under autocast to `dtype`."""
    seq_len, data_dir = args.seq_len or int(cfg["seq_len"]), args.data or cfg.get("data")
    per_batch = args.batch_size * seq_len
    n_batches = math.ceil(n_tokens / per_batch)
    if data_dir:
        held = data.val_steps_held(data_dir, args.batch_size, seq_len) * per_batch
        if n_tokens > held:
            raise ValueError(f"--tokens {n_tokens} is more than the {held} validation tokens "
                             f"{data_dir} holds in batches of {per_batch}; lower --tokens.")
        batches = data.val_batches(data_dir, n_batches * per_batch, args.batch_size, seq_len)
    else:
        windows = torch.randint(gpt.config.vocab_size, (n_batches, args.batch_size, seq_len + 1),
                                generator=torch.Generator().manual_seed(args.seed))
        batches = [(w[:, :-1], w[:, 1:]) for w in windows]
    H, Y = [], []
    device = torch.device(args.device).type
    for x, y in batches:
        with torch.autocast(device, dtype, enabled=dtype != torch.float32):
            H.append(gpt.hidden(x.to(args.device)).flatten(0, 1).float())
        Y.append(y.flatten().to(args.device))
    return torch.cat(H)[:n_tokens], torch.cat(Y)[:n_tokens]


def run_verify(args) -> dict:
    """Lemma 1, Lemma 2, Prop. 3 and Theorem 4's bounds on the model's own hidden states."""
    (gpt, cfg, step), = models(args)
    H, targets = hidden_states(gpt, cfg, args, args.tokens)
    W = gpt.output_weight.detach().double()
    W_star = W.clone()
    heads.build("mu_center").after_step(W_star)  # the project's own μ-centering
    result = dict(step=step, head=cfg["head"], tie=bool(cfg.get("tie")), tokens=len(H),
                  **verify_identities(H.double(), W, W_star, targets))
    tol = 1e-12 * max(1.0, result["max_abs_logit"])  # float64 round-off
    rows = [dict(statement=statement, measured=result[key],
                 holds=result[key] <= (tol if kind == "0" else 1 + 1e-12))
            for key, statement, kind in CLAIMS]
    bounds = ", ".join(f"{name} = {result[key]:.4g}" for name, key in (
        ("‖μ‖²", "mu_sq"), ("B₋", "B_minus"), ("B₊", "B_plus"), ("B_ratio", "B_ratio")))
    print_table(rows, f"verify: {describe(args, cfg, step)}, {len(H)} tokens, in float64\n"
                f"Eq. 12–13: {bounds}")
    print("measured: an identity's largest error, or a share of tokens (holds: 0, up to "
          "round-off); an inequality's left side over its right (holds: ≤ 1)")
    return result


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
    dtype = getattr(torch, args.dtype)
    H, targets = hidden_states(gpt, cfg, args, args.tokens, dtype)
    weight = gpt.output_weight.detach()
    W = weight.double()

    def precision(E):  # heads.precision_stats, averaged over the tokens
        stats = heads.precision_stats(gpt.head, H, E, targets, dtype).mean(1)
        return dict(zip(heads.PRECISION_STATS, stats.tolist()))
    chunks = H.double().split(DEFAULTS["chunk"])
    stats = sum(heads.logit_stats(gpt.head.logits(h, W)).sum(1) for h in chunks)
    h_mu_proj, h_mu_cos = (x.item() for x in heads.mean_state_alignment(H.mean(0), W))
    result = dict(step=step, head=cfg["head"], tie=bool(cfg.get("tie")), tokens=len(H),
                  dtype=args.dtype, h_mu_proj=h_mu_proj, h_mu_cos=h_mu_cos,
                  **dict(zip(heads.LOGIT_STATS, (stats / len(H)).tolist())),
                  **precision(weight), **b_bounds(W))
    rows = [dict(quantity=key, value=result[key], meaning=MEANING[key])
            for key in MEANING if key in result]
    print_table(rows, f"logits: {describe(args, cfg, step)}; per-token figures averaged over "
                f"{len(H)} tokens; --dtype {args.dtype}")
    if args.offsets:  # all rows + c (mean_logit_shift): exactly no change, as softmax drops c·h
        sigma = torch.cat([heads.spread(h @ W.T) for h in chunks]).mean().item()
        result["offsets"] = [dict(offset=L, spacing_over_sigma=bf16_spacing(L) / sigma,
                                  **precision(weight + mean_logit_shift(H, W, L).to(weight.dtype)))
                             for L in args.offsets]
        print_table(result["offsets"], "every output row shifted by one vector to a mean logit L "
                    f"(exactly: no change); the head's matmul in {args.dtype}", legend=True)
    if args.plot:
        plot_dot_histogram((W @ W.mean(0)).cpu().numpy(), result, args.plot)
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
    bound = '2D' if len(trivial) < 3 else 'D'
    note = f"; trivially 1 as min(N, V) ≤ {bound}: {', '.join(trivial)}"
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


def new_axes(*grid, figsize=(6.4, 4.0), **options):  # no pyplot: files only, nothing to close
    from matplotlib.figure import Figure
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.subplots(*grid, **options)


def save_figure(fig, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def plot_dot_histogram(dots, bounds: dict, path: str) -> None:
    """Fig. 1 (right): histogram of eᵢ·μ with 0, ‖μ‖² and the extrema ‖μ‖² − B₋, ‖μ‖² + B₊."""
    fig, ax = new_axes()
    ax.hist(dots, bins=100, color="0.6")
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


def options() -> argparse.ArgumentParser:
    """The options of every measurement, the experiments' too: which model, which tokens."""
    p = argparse.ArgumentParser(add_help=False)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--run", help="a train.py run folder (config.json, ckpt.pt, ckpt_step*.pt)")
    which.add_argument("--init", choices=list(model.SIZES), help="a fresh model of this size")
    p.add_argument("--head", choices=heads.HEADS, default="baseline", help="with --init")
    p.add_argument("--tie", action="store_true", help="with --init: tied embeddings")
    p.add_argument("--vocab_size", type=int, default=50304, help="with --init")
    p.add_argument("--data", help="token shards folder (default: the run's own --data)")
    p.add_argument("--tokens", type=int, help=f"validation tokens N per measurement (default "
                                              f"{DEFAULTS['tokens']}; bottleneck: 4·D)")
    p.add_argument("--batch_size", type=int, default=4)
    p.add_argument("--seq_len", type=int, help=f"the run's; --init: {DEFAULTS['init_seq_len']}")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the numbers to this JSON file")
    p.add_argument("--plot", nargs="?", const="", metavar="FILE", help="draw the figure into "
                   "FILE (.png, .pdf, .svg); without FILE into the run folder, as COMMAND.png")
    return p


def main(argv=None) -> dict:
    commands = dict(verify=run_verify, logits=run_logits, bottleneck=run_bottleneck)
    p = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    parsers = {name: sub.add_parser(name, help=run.__doc__.splitlines()[0], allow_abbrev=False,
                                    parents=[options()]) for name, run in commands.items()}
    add = parsers["logits"].add_argument
    add("--dtype", choices=("float32", "bfloat16"), default="float32", help="as train.py's")
    add("--offsets", type=float, nargs="+", metavar="L", help="also what --dtype loses with all "
        "rows shifted by one vector to a mean logit L (e.g. 0 100 1000)")
    args = p.parse_args(argv)
    if args.command == "verify" and args.plot is not None:
        p.error("verify draws no figure; drop --plot (logits and bottleneck draw one)")
    if args.command != "bottleneck":
        args.tokens = args.tokens or DEFAULTS["tokens"]
    return execute(args, commands, "analyze.py")


def execute(args, commands: dict, program: str) -> dict:
    """Run args.command and write --json; a mistake in the input ends in one sentence."""
    try:
        if args.plot == "":  # --plot without FILE: into the run folder, not the working directory
            if not args.run:
                raise ValueError("--plot needs a FILE with --init, which has no run folder.")
            args.plot = str(Path(args.run) / f"{args.command}.png")
        result = commands[args.command](args)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"{program} {args.command}: error: {err}") from None
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main()

"""The related work's embedding geometry on train.py's runs of this model, in float64: tied vs
untied embeddings (tying), embeddings vs probability signatures (signatures), the `repeat` task
over growing vocabularies (trivial). What each measures: experiments/geometry/README.md.
"""
import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]  # the repository root, whose modules these import
sys.path.insert(0, str(ROOT))
import analyze
import data
import heads
import model
import prepare
import store
from analyze import new_axes, plot_curves, print_table, run_models, save_figure


def centred(A: torch.Tensor) -> torch.Tensor:
    """A minus its mean row: removes the common shift (μ) that dominates raw cosines."""
    return A - A.mean(0)


def alignment(A: torch.Tensor, B: torch.Tensor) -> dict:
    """How well the rows of A (n×d) map onto those of B (n×d'), both centred: the mean over rows
    of cos(aᵢ M, bᵢ) for M = I (identity, d = d'), the best rotation (procrustes, d = d':
    argmin_{MᵀM = I} ‖A M − B‖_F = U Vᵀ with U Σ Vᵀ = Aᵀ B, 1 for a rotated copy) and the best
    linear map (lstsq: argmin ‖A M − B‖_F, ≥ procrustes in fit, not in cosine)."""
    A, B = centred(A), centred(B)
    cosine = lambda X: F.cosine_similarity(X, B, dim=1, eps=1e-300).mean().item()  # of xᵢ, bᵢ
    out = {}
    if A.shape[1] == B.shape[1]:
        out["identity"] = cosine(A)
        U, _, Vh = torch.linalg.svd(A.T @ B)
        out["procrustes"] = cosine(A @ (U @ Vh))
    out["lstsq"] = cosine(A @ torch.linalg.lstsq(A, B).solution)
    return out


def knn_overlap(A: torch.Tensor, B: torch.Tensor, k: int = 10) -> float:
    """Mean over rows of |N_A(i) ∩ N_B(i)| / k, N(i) the k nearest other rows by cosine, rows
    centred; invariant under any rotation (and scaling) of either matrix: 1 for a rotated copy."""
    def neighbours(M):  # (n×k) indices
        X = F.normalize(centred(M), dim=1)
        return (X @ X.T).fill_diagonal_(-math.inf).topk(k, dim=1).indices
    shared = (neighbours(A)[:, :, None] == neighbours(B)[:, None, :]).any(2).sum(1)
    return (shared.double() / k).mean().item()


def signature(tokens: np.ndarray, vocab_ids: np.ndarray, offset: int) -> np.ndarray:
    """Probability signature S[a, b] = P(x_{t+offset} = b | x_t = a) (K×K) of the K tokens
    `vocab_ids` (+1: the label signature, −k: the context k back), counted at every t whose
    partner exists: a row sums to the share of partners inside the K tokens."""
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


def similarity_alignment(X: torch.Tensor, Y: torch.Tensor) -> float:
    """Pearson r of the off-diagonal entries of cos(xᵢ, xⱼ) and cos(yᵢ, yⱼ): 1 when the K×K
    similarity structures agree up to an affine map; centred inputs, lest μ make all similar."""
    i, j = torch.triu_indices(len(X), len(X), offset=1)
    cosines = [(Z @ Z.T)[i, j] for Z in (F.normalize(M, dim=1, eps=1e-300) for M in (X, Y))]
    return torch.corrcoef(torch.stack(cosines))[0, 1].item()


def training_tokens(data_dir: str, n_tokens: int) -> np.ndarray:
    store.check_dataset(data_dir)             # a half-written or mixed folder: one sentence
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


def tied_gradient_split(gpt: model.GPT, x: torch.Tensor, y: torch.Tensor):
    """(∇ from the LM head, ∇ from the input embedding) of one batch's loss, each V×D: ∂L/∂x at
    each position added to its token's row; the output side is the rest (tied) or its own."""
    embedded = []  # the lookup's output, kept with its gradient (append, retain_grad: None)
    hook = gpt.wte.register_forward_hook(lambda _, __, x: embedded.append(x) or x.retain_grad())
    gpt.zero_grad(set_to_none=True)
    try:
        with torch.enable_grad():
            gpt(x, y)[0].backward()
    finally:
        hook.remove()
    dx = embedded[0].grad.flatten(0, 1)
    from_input = torch.zeros_like(gpt.wte.weight).index_add_(0, x.flatten(), dx)
    from_output = gpt.output_weight.grad - (from_input if gpt.config.tie else 0)
    gpt.zero_grad(set_to_none=True)
    return from_output.double(), from_input.double()


def output_share(from_output: torch.Tensor, from_input: torch.Tensor) -> dict:
    """How much of the embedding gradient comes from the LM head, Frobenius norms over V×D (raw
    gradients: Adam rescales each coordinate): share_norm = ‖∇_out‖ / (‖∇_out‖ + ‖∇_in‖),
    share_energy = ‖∇_out‖² / (‖∇_out‖² + ‖∇_in‖²), cos_out_in = ⟨∇_out, ∇_in⟩/(‖∇_out‖‖∇_in‖)."""
    out_norm, in_norm = from_output.norm(), from_input.norm()
    return dict(share_norm=(out_norm / (out_norm + in_norm)).item(),
                share_energy=(out_norm ** 2 / (out_norm ** 2 + in_norm ** 2)).item(),
                cos_out_in=((from_output * from_input).sum() / (out_norm * in_norm)).item())


def run_tying(args) -> dict:
    """Tied vs untied embeddings of the K most frequent training tokens: alignment, k-NN overlap,
    the output side's gradient share; with step-0 snapshots also the moves since init."""
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
    measure = lambda A, B: dict(**alignment(A, B), knn_overlap=knn_overlap(A, B, args.knn))
    pairs = (("tied", "untied input"), ("tied", "untied output"), ("untied input", "untied output"))
    final = matrices(tied, untied)
    geometry = {f"{a} vs {b}": measure(final[a], final[b]) for a, b in pairs}
    starts = [Path(run) / "ckpt_step0000000.pt" for run in (args.tied, args.untied)]
    if all(path.is_file() for path in starts):
        start = matrices(*(model.load_model(path, args.device)[0] for path in starts))
        for a, b in pairs:
            geometry[f"{a} vs {b} at init"] = measure(start[a], start[b])
            geometry[f"Δ{a} vs Δ{b} since init"] = measure(final[a] - start[a], final[b] - start[b])
    note = (f"; K ≤ D = {tied.config.n_embd}: a linear map fits any K points, raise --top_k"
            if len(ids) <= tied.config.n_embd else "")
    print_table([dict(matrices=name, **g) for name, g in geometry.items()], "tying: mean "
                f"per-token cosine after each map (rows centred), k = {args.knn}, K = {len(ids)} "
                f"most frequent tokens; tied step {tied_step}, untied {untied_step}{note}")
    shares = []
    for name, run in (("tied", args.tied), ("untied", args.untied)):
        for gpt, cfg, step in run_models(run, args.device, all_steps=True):
            x, y = data.ShardLoader(data_dir, args.batch_size,
                                    args.seq_len or int(cfg["seq_len"])).next_batch()
            split = tied_gradient_split(gpt, x.to(args.device), y.to(args.device))
            shares.append(dict(run=name, step=step, **output_share(*split)))
    print_table(shares, "share of the embedding gradient from the LM head (first training batch)")
    if args.plot:
        plot_curves([s for s in shares if s["run"] == "tied"], ("share_norm", "share_energy"),
                    "output side's share of the tied gradient", args.plot)
    return dict(tokens=len(ids), geometry=geometry, gradient_share=shares)


def run_signatures(args) -> dict:
    """Per checkpoint, the similarity_alignment of the centred input and output embeddings of the
    K most frequent training tokens with each probability signature."""
    snapshots = run_models(args.run, args.device, all_steps=True)
    first = next(snapshots)
    tokens = training_tokens(args.data or first[1]["data"], args.sig_tokens)
    too_far = " ".join(str(o) for o in args.offsets if abs(o) >= len(tokens))
    if too_far:
        raise ValueError(f"--offsets {too_far} reach beyond the {len(tokens)} training tokens "
                         "counted; give shorter offsets or raise --sig_tokens.")
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
    print_table(rows, "signatures: Pearson r of pairwise cosines, embeddings (in/out) vs "
                f"signature at offset (+1 next token, −k k back); {len(ids)} most frequent of "
                f"{len(tokens)} training tokens")
    if args.plot:
        plot_curves(rows, [k for k in rows[0] if k != "step"], "similarity alignment (Pearson r)",
                    args.plot)
    return dict(run=args.run, tokens=len(tokens), top_k=len(ids), offsets=list(args.offsets),
                steps=rows)


def repeat_floor(vocab: int, seq_len: int) -> float:
    """The lowest mean loss (nats/token) this model can reach on prepare.py's `repeat` task when
    --seq_len is the task's T. Data: T copies of one token drawn from V' ids (V − 1 once the
    vocabulary holds EOT, left out), cut into windows at multiples of T: x = a…a, y = a…a b with
    b the next sequence's token. Model: equal tokens give one hidden state at every position (by
    induction over the layers: attention mixes equal rows, RoPE is relative, the rest acts row by
    row), so one q per window. A window's expected loss −(1/T)·[(T − 1)·ln q_a + (1/V')·Σ_b ln
    q_b] is a cross-entropy against π_a = (T − 1 + 1/V')/T, π_c = 1/(V'·T) for the V' − 1 others,
    minimised at q = π (Gibbs): H(π) = −π_a·ln π_a − (V' − 1)·π_c·ln π_c; ln V' at T = 1, above
    ln(V')/T (a model that knew the position) for T ≥ 2."""
    choices = vocab - (vocab > data.EOT)
    p_same = (seq_len - 1 + 1 / choices) / seq_len
    p_other = 1 / (choices * seq_len)
    return -p_same * math.log(p_same) - (choices - 1) * p_other * math.log(p_other)


def run_trivial(args) -> dict:
    """The gradient-bottleneck paper's trivial pattern: `repeat` sequences (one token repeated
    seq_len times) learned at a fixed width over growing vocabularies V.

    Each V trains max(--steps, ⌈S·V/batch⌉) steps (S: --seqs_per_token); it resumes."""
    out, batch, T = Path(args.out), args.batch_size, args.seq_len
    eval_steps = min(16, int(args.trivial_tokens * prepare.VAL_FRACTION - 1) // (batch * T))
    if eval_steps < 1:
        raise ValueError(f"--trivial_tokens {args.trivial_tokens} leaves less than one batch of "
                         f"{batch * T} validation tokens; raise it to at least {11 * batch * T}.")
    eval_tokens = eval_steps * batch * T
    all_steps = [max(args.steps, math.ceil(args.seqs_per_token * V / batch)) for V in args.vocabs]
    print(f"trivial: runs of {' + '.join(map(str, all_steps))} steps of {batch} × {T} tokens "
          f"(V = {', '.join(map(str, args.vocabs))}); train.py prints each run's ETA", flush=True)
    rows = []
    for V, steps in zip(args.vocabs, all_steps):
        n_tokens = max(args.trivial_tokens,  # enough that no training sequence repeats
                       math.ceil(steps * batch * T / (1 - prepare.VAL_FRACTION)))
        data_dir = out / f"repeat_V{V}_T{T}_N{n_tokens}"
        run_dir = out / f"{args.size}_{args.head}_tie{int(args.tie)}_V{V}_steps{steps}"
        if not list(data_dir.glob("*val*.bin")):
            run_script(ROOT / "prepare.py", "synthetic", "--task", "repeat", "--vocab", V,
                       "--tokens", n_tokens, "--seq_len", T, "--out", data_dir, "--seed", args.seed)
        if not (run_dir / "summary.json").is_file():
            run_script(ROOT / "train.py", "--size", args.size, "--head", args.head,
                       "--vocab_size", V, "--data", data_dir, "--out_dir", run_dir,
                       "--steps", steps, "--warmup", max(1, steps // 10), "--seq_len", T,
                       "--batch_size", batch, "--micro_batch", batch, "--eval_tokens", eval_tokens,
                       "--stat_tokens", eval_tokens, "--device", args.device, "--seed", args.seed,
                       *(["--tie"] if args.tie else []), "--lr", "3e-3", "--eval_every", 0,
                       "--log_every", 50, "--save_every", 1000,
                       *args.train_args)  # train.py's argparse: a repeated option's last value wins
        summary = json.loads((run_dir / "summary.json").read_text())
        rows.append(dict(vocab=V, steps=steps, seqs_per_token=steps * batch / V,
                         val_loss=summary["val_loss"], floor=repeat_floor(V, T), chance=math.log(V),
                         diverged=summary["diverged"]))
    print_table(rows, f"trivial: repeat task, size {args.size} (D = "
                f"{model.SIZES[args.size]['n_embd']}), head {args.head}, tie {args.tie}, batches "
                f"of {batch} sequences of {T}; floor = the best this model can reach "
                "(repeat_floor), chance = ln V")
    if args.plot:
        plot_trivial(rows, f"repeat task, {args.size}, head {args.head}, tie {args.tie}, "
                           f"{batch} × {T} tokens a step", args.plot)
    return dict(size=args.size, head=args.head, tie=args.tie, seq_len=T, batch_size=batch,
                runs=rows)


def run_script(script: Path, *argv) -> None:
    code = subprocess.run([sys.executable, str(script), *map(str, argv)]).returncode
    if code:
        raise ValueError(f"{script.name} failed with exit code {code}; its message is above.")


def plot_trivial(rows: list[dict], title: str, path: str) -> None:
    fig, ax = new_axes()
    V = [r["vocab"] for r in rows]
    ax.plot(V, [r["val_loss"] for r in rows], marker="o", label="final validation loss")
    ax.plot(V, [r["chance"] for r in rows], linestyle="--", color="0.5", label="chance, ln V")
    ax.plot(V, [r["floor"] for r in rows], linestyle=":", color="black",
            label="best this model can reach (one prediction per window)")
    ax.set(xscale="log", xlabel="vocabulary size V", ylabel="loss (nats)", title=title)
    ax.legend(fontsize="small")
    save_figure(fig, path)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    output, measurement = analyze.shared_options()
    count = store.positive_int
    token_set = argparse.ArgumentParser(add_help=False)
    token_set.add_argument("--top_k", type=count, default=512, help="the K most frequent tokens")
    token_set.add_argument("--sig_tokens", type=count, default=2_000_000, help="tokens counted")
    sub = p.add_subparsers(dest="command", required=True)
    tying = sub.add_parser("tying", parents=[measurement, token_set], help=run_tying.__doc__)
    tying.add_argument("--tied", required=True, help="run folder trained with --tie")
    tying.add_argument("--untied", required=True, help="run folder trained without --tie")
    tying.add_argument("--knn", type=count, default=10, help="neighbours in the k-NN overlap")
    a = sub.add_parser("signatures", parents=[measurement, token_set],
                       help=run_signatures.__doc__).add_argument
    a("--run", required=True, help="a train.py run folder")
    a("--offsets", type=int, nargs="+", default=[1, -1, -2, -3],
      help="+1 = label signature, -k = context k tokens back")
    a = sub.add_parser("trivial", parents=[output],
                       help=run_trivial.__doc__.split("\n\n")[0]).add_argument
    a("--out", required=True, help="folder for the data and runs")
    a("--vocabs", type=count, nargs="+", default=[16, 256, 4096],
      help="vocabularies V (at tiny's D = 64: below, 4× and 64× above D)")
    a("--size", choices=list(model.SIZES), default="tiny")
    a("--head", choices=heads.HEADS, default="baseline")
    a("--tie", action="store_true", help="tied embeddings")
    for name, default in (("steps", 200), ("seq_len", 32), ("batch_size", 16),
                          ("trivial_tokens", 200_000)):
        a(f"--{name}", type=count, default=default)
    a("--seqs_per_token", type=store.non_negative_float, default=0.0,
      help="train each V for at least S·V/batch steps (equal exposure)")
    a("--train_args", nargs=argparse.REMAINDER, default=[],
      help="everything after this goes to train.py as is (e.g. --lr 3e-3)")
    args = p.parse_args(argv)
    if 0 in getattr(args, "offsets", ()):
        p.error("--offsets must be non-zero (+1 next token, -k context k tokens back)")
    return analyze.execute(args, dict(tying=run_tying, signatures=run_signatures,
                                      trivial=run_trivial), "geometry.py")


if __name__ == "__main__":
    main()

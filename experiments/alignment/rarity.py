"""What holds h̄·μ̂ small (experiments/alignment/README.md): each output row's reach along μ by
its token's training count, the mean hidden state, and the residual coordinates that bound it.
    python experiments/alignment/rarity.py --run RUN_DIR --tokens 4096 --json r.json --plot r.png
"""
import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root, whose modules these import
import analyze
import data
import heads

COUNT_EDGES = (0, 1, 10, 100, 1000, 10000)  # buckets of training counts: [0, 1), [1, 10), … ≥ 10⁴


def reach_along_mu(W: torch.Tensor) -> torch.Tensor:
    """aᵢ = eᵢ·μ̂ / ‖μ‖ for every row, float64 (V,), of mean 1. Moving h by s·μ̂ moves logit i by
    s·‖μ‖·aᵢ, of which the loss sees only s·‖μ‖·(aᵢ − Σⱼ pⱼaⱼ): were every aᵢ = 1, h·μ̂ would be
    free to drift; where aᵢ follows token i's frequency, the loss sees it."""
    mu = W.double().mean(0)
    return W.double() @ mu / mu.square().sum()


def reach_by_frequency(reach: torch.Tensor, counts: torch.Tensor) -> tuple[list[dict], dict]:
    """(per bucket of training counts: rows, mean and std of aᵢ; the mean and std of aᵢ over
    the training targets, each row weighted by its count)."""
    counts = counts.double()
    buckets = []
    for low, high in zip(COUNT_EDGES, (*COUNT_EDGES[1:], math.inf)):
        rows = (counts >= low) & (counts < high)
        if rows.any():
            buckets.append(dict(counts=f"[{low}, {high})" if high < math.inf else f"≥ {low}",
                                rows=int(rows.sum()), reach_mean=reach[rows].mean().item(),
                                reach_std=reach[rows].std(correction=0).item()))
    weight = counts / counts.sum()
    mean = weight @ reach
    return buckets, dict(target_reach=mean.item(),
                         target_reach_std=(weight @ (reach - mean).square()).sqrt().item())


def token_counts(data_dir, vocab_size: int) -> torch.Tensor:
    return torch.from_numpy(sum(np.bincount(data.read_shard(path), minlength=vocab_size)
                                [:vocab_size] for path in data.shard_paths(data_dir, "train")))


def top_coordinates(X: torch.Tensor, gain: torch.Tensor, k: int = 3) -> list[dict]:
    """The k coordinates of X (N×D) of largest mean square: their share of it, the gain g on them
    (a few that carry it all take LayerNorm's unit variance: h is as small as g there)."""
    energy = X.square().mean(0)
    share, index = (energy / energy.sum()).topk(min(k, len(energy)))
    return [dict(coordinate=i, share=s, gain=gain[i].item())
            for s, i in zip(share.tolist(), index.tolist())]


def run_rarity(args) -> dict:
    """Each row's reach aᵢ by its token's training count, B_ratio, and over N validation tokens
    ‖h̄‖, RMS ‖h‖, h̄·μ̂ (|h̄·μ̂| ≤ ‖h̄‖ ≤ RMS ‖h‖) and cos(h̄, μ); ‖h‖ = ‖g ⊙ z‖ (g: ln_f's gain,
    z of unit RMS) is ≈ ‖g‖ when the residual's variance spreads evenly, less where g is small."""
    (gpt, cfg, step), = analyze.models(args)
    data_dir = args.data or cfg.get("data")
    if not data_dir:
        raise ValueError("rarity needs the training tokens to count; pass --data DIR.")
    W = gpt.output_weight.detach().double()
    mu_norm = W.mean(0).norm().item()
    if mu_norm <= 1e-5 * W.norm(dim=1).mean().item():  # μ-centred: μ is float32 rounding
        raise ValueError(f"μ ≈ 0 (‖μ‖ = {mu_norm:.2g}: a μ-centred model): no direction to "
                         "measure along; pass a baseline run.")
    reach, counts = reach_along_mu(W), token_counts(data_dir, gpt.config.vocab_size)
    buckets, targets = reach_by_frequency(reach, counts)
    residual = []  # ln_f's input x, the residual stream: where its variance sits
    hook = gpt.ln_f.register_forward_pre_hook(lambda _, x: residual.append(x[0].flatten(0, 1)))
    H = analyze.hidden_states(gpt, cfg, args, args.tokens)[0].double()
    hook.remove()
    h_mu_proj, h_mu_cos = (x.item() for x in heads.mean_state_alignment(H.mean(0), W))
    gain = gpt.ln_f.weight.detach().double()
    result = dict(step=step, head=cfg["head"], tokens=len(H), mu_norm=mu_norm,
                  h_mean_norm=H.mean(0).norm().item(),
                  h_norm_rms=H.square().sum(1).mean().sqrt().item(),
                  ln_f_gain_norm=gain.norm().item(), h_mu_proj=h_mu_proj, h_mu_cos=h_mu_cos,
                  **targets, B_ratio=analyze.b_ratio(W), buckets=buckets,
                  residual_top=top_coordinates(torch.cat(residual)[:len(H)].double(), gain))
    title = analyze.describe(args, cfg, step)
    analyze.print_table(buckets, f"rarity: {title}; aᵢ = eᵢ·μ̂/‖μ‖ by training count")
    analyze.print_table([dict(quantity=k, value=v) for k, v in result.items() if type(v) is float],
                        f"over the training tokens (target_reach) and {len(H)} validation tokens")
    analyze.print_table(result["residual_top"], "the residual stream's largest coordinates: their "
                        "share of its mean square, and the final LayerNorm's gain on them")
    if args.plot:
        plot_reach(reach.numpy(), counts.numpy(), f"{title}\neach output row's reach along μ "
                   f"(‖μ‖ = {mu_norm:.0f})", args.plot)
    return result


def plot_reach(reach: np.ndarray, counts: np.ndarray, title: str, path: str) -> None:
    fig, (strip, ax) = analyze.new_axes(1, 2, sharey=True, figsize=(7.6, 4.4), width_ratios=(1, 5))
    never = counts == 0
    strip.scatter(np.random.default_rng(0).uniform(-1, 1, never.sum()), reach[never], s=2,
                  alpha=0.3, color="tab:gray", linewidths=0)
    strip.set(xlim=(-1.5, 1.5), xticks=[0], ylabel="reach along μ, aᵢ = eᵢ·μ̂ / ‖μ‖",
              xticklabels=[f"never seen\n({never.sum():,} rows,\njittered)"])
    ax.scatter(counts[~never], reach[~never], s=2, alpha=0.3, color="tab:blue", linewidths=0)
    ax.set(xscale="log", xlabel="training count of token i")
    for axes in (strip, ax):
        axes.axhline(1, color="purple", linestyle="--", label="aᵢ = 1: the row shares μ")
    fig.suptitle(title, fontsize=9)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", fontsize="small")
    analyze.save_figure(fig, path)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, parents=[analyze.options()],
                                allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    args = p.parse_args(argv)
    args.command, args.tokens = "rarity", args.tokens or analyze.DEFAULTS["tokens"]
    return analyze.execute(args, dict(rarity=run_rarity), "rarity.py")


if __name__ == "__main__":
    main()

"""Two Markov languages with one entropy rate, built to differ in how often each token occurs
(experiments/frequency/README.md; they also differ in how many tokens occur).

Every token i has K distinct successors S(i), each next with probability 1/K: the entropy rate is
ln K in both, and a model learns either chain by memorising its V·K pairs.
  uniform: S(i) = {τ((ρ(i) + k) mod V) : k < K}, τ and ρ random permutations. Every token is the
           successor of exactly K tokens, so P is doubly stochastic: each occurs 1/V of the time.
  zipf:    S(i) drawn without replacement from the Zipf prior zⱼ ∝ 1/rⱼ^s (rⱼ a random ranking
           of the tokens). A token's predecessors, and so its frequency, grow with zⱼ; a token in
           no S(i) never occurs, as most of GPT-2's vocabulary never occurs in Shakespeare.
The tokens are chains run side by side from the stationary π (power iteration), end to end.
    python experiments/frequency/chain.py uniform --out data/freq_uniform
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root, whose modules these import
import prepare
import store


def successors(kind: str, vocab: int, k: int, zipf: float, seed: int) -> np.ndarray:
    """S (V×K int): row i holds token i's K distinct successors."""
    rng = np.random.default_rng([seed, 4])
    if kind == "uniform":
        tau, rho = rng.permutation(vocab), rng.permutation(vocab)
        return tau[(rho[:, None] + np.arange(k)) % vocab]
    prior = (rng.permutation(vocab) + 1.0) ** -zipf
    prior /= prior.sum()
    return np.stack([rng.choice(vocab, k, replace=False, p=prior) for _ in range(vocab)])


def stationary(S: np.ndarray, iterations: int = 2000) -> np.ndarray:
    """π = πP by power iteration, P(j | i) = 1/K for j ∈ S(i); refused where it does not settle."""
    V, k = S.shape
    pi = np.full(V, 1 / V)
    for _ in range(iterations):
        pi, last = np.bincount(S.ravel(), np.repeat(pi / k, k), minlength=V), pi
    if np.abs(pi - last).sum() > 1e-9:
        raise ValueError("the chain has no single stationary distribution (it is periodic or "
                         "splits); choose another --seed")
    return pi


def sample(S: np.ndarray, pi: np.ndarray, n_tokens: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 5])
    n_chains = -(-n_tokens // prepare.MARKOV_CHAIN_TOKENS)
    out = np.empty((n_chains, -(-n_tokens // n_chains)), dtype=np.uint16)
    out[:, 0] = rng.choice(len(S), n_chains, p=pi)
    for t in range(1, out.shape[1]):
        out[:, t] = S[out[:, t - 1], rng.integers(S.shape[1], size=n_chains)]
    return out.ravel()[:n_tokens]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("kind", choices=["uniform", "zipf"])
    p.add_argument("--out", required=True, help="the dataset folder to write")
    p.add_argument("--vocab", type=store.positive_int, default=4096, help="V (≤ 65,536)")
    p.add_argument("--successors", type=store.positive_int, default=4, help="K")
    p.add_argument("--zipf", type=store.positive_float, default=1.0, help="s of zipf's prior")
    p.add_argument("--tokens", type=store.positive_int, default=2_000_000)
    p.add_argument("--seed", type=store.non_negative_int, default=0, help="the draws of S")
    args = p.parse_args(argv)
    try:
        if not 2 <= args.successors < args.vocab <= 65536:
            raise ValueError(f"need 2 ≤ --successors < --vocab ≤ 65536, got {args.successors} "
                             f"and {args.vocab}")
        S = successors(args.kind, args.vocab, args.successors, args.zipf, args.seed)
        pi = stationary(S)
        unigram = -(pi[pi > 0] @ np.log(pi[pi > 0]))
        source = dict(kind=f"frequency_{args.kind}", **{k: v for k, v in vars(args).items()
                                                        if k not in ("kind", "out")},
                      entropy_rate=float(np.log(args.successors)), unigram_entropy=unigram)
        splits = prepare._split_train_val(sample(S, pi, args.tokens, args.seed),
                                          prepare.VAL_FRACTION, align=64)
        written = store.write_dataset(args.out, args.kind, splits, source,
                                      {"successors.npy": prepare._npy_bytes(S)})
    except ValueError as err:
        raise SystemExit(f"chain.py: error: {err}") from None
    print(f"{args.kind}: {args.tokens:,} tokens, entropy rate ln {args.successors} = "
          f"{np.log(args.successors):.3f} nats, unigram entropy {unigram:.3f} (ln V = "
          f"{np.log(args.vocab):.3f}), {int((pi == 0).sum())} tokens never occur; wrote "
          f"{', '.join(map(str, written))}")


if __name__ == "__main__":
    main()

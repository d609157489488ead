"""Token shards of GPT-2 FineWeb, of any UTF-8 text, or of a random Markov language.

    python prepare.py fineweb --shards 8                 GPT-2 FineWeb100B, 100M tokens a shard
    python prepare.py text FILES... --out data/mytext    any UTF-8 text, GPT-2 tokenizer
    python prepare.py synthetic --vocab 64 --tokens 10000000 --out data/markov
    python prepare.py renumber data/shakespeare --out data/shakespeare_dense
"""
import argparse
import hashlib
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

import data

ROOT = Path(__file__).resolve().parent
FINEWEB_DATASETS = {"fineweb10B": ("kjj0/fineweb10B-gpt2", 103),  # (Hugging Face dataset,
                    "fineweb100B": ("kjj0/fineweb100B-gpt2", 1028)}  # train shards it holds)
DEFAULT_DATASET = "fineweb100B"       # the paper's recipe reads 13.1B tokens; 10B holds 10.3B
DEFAULT_DATA = str(ROOT / "data" / DEFAULT_DATASET)
TEXT_CACHE = ROOT / "data" / "text"   # where text_dataset tokenizes text files once
BASE_URL_ENV = "FINEWEB_BASE_URL"     # overrides the download location (mirrors, tests)
VAL_FRACTION = 0.1                    # share of the tokens that text, synthetic hold out
MARKOV_ALPHA = 0.2                    # Dirichlet concentration of each transition row
MARKOV_CHAIN_TOKENS = 100_000         # tokens per independent chain (see synthesize_markov)
GPT2_VOCAB_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
GPT2_FILES = ("vocab.bpe", "encoder.json")
GPT2_SHIPPED = ROOT / "tests" / "assets" / "gpt2"  # the same bytes as GPT2_VOCAB_URL's
GPT2_CACHE = ROOT / "data" / "tiktoken"            # seeded from them offline


def write_dataset(out_dir, prefix, train, val=None):
    """Write train and val tokens (default: the last ⌈VAL_FRACTION·n⌉ of train) as shards
    `{prefix}_{split}_{i:06d}.bin` into the new folder out_dir. They go into a temporary folder
    beside it, renamed to out_dir once whole, so that a killed write leaves no out_dir."""
    if val is None:
        n_val = int(np.ceil(VAL_FRACTION * len(train)))
        train, val = train[:-n_val], train[-n_val:]
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; delete it, or choose another --out")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")  # the pid keeps two writers apart
    tmp.mkdir(parents=True)
    try:
        for split, tokens in (("train", train), ("val", val)):
            for i, start in enumerate(range(0, len(tokens), data.SHARD_TOKENS)):
                data.write_shard(tmp / f"{prefix}_{split}_{i:06d}.bin",
                                 tokens[start:start + data.SHARD_TOKENS])
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------- text
def gpt2_encoding():
    """tiktoken's GPT-2 encoding. Where tiktoken cannot download the vocabulary, the copy
    shipped in tests/assets/gpt2 seeds a cache in data/tiktoken, used from then on."""
    import tiktoken  # here, not above: reading shards needs no tokenizer
    cached = [GPT2_CACHE / hashlib.sha1((GPT2_VOCAB_URL + name).encode()).hexdigest()
              for name in GPT2_FILES]  # tiktoken names a cached file by the sha1 of its URL
    if "TIKTOKEN_CACHE_DIR" not in os.environ and all(path.is_file() for path in cached):
        os.environ["TIKTOKEN_CACHE_DIR"] = str(GPT2_CACHE)
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception:  # requests' errors or tiktoken's own: the download failed
        GPT2_CACHE.mkdir(parents=True, exist_ok=True)
        for name, path in zip(GPT2_FILES, cached):
            shutil.copyfile(GPT2_SHIPPED / name, path)
    os.environ["TIKTOKEN_CACHE_DIR"] = str(GPT2_CACHE)
    print(f"using the GPT-2 vocabulary shipped in tests/assets/gpt2 (cached in {GPT2_CACHE})")
    return tiktoken.get_encoding("gpt2")


def read_text(path):
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start}); "
                         f"convert it to UTF-8 first") from None


def prepare_text(files, out_dir):
    """Tokenize text files into `text_{train,val}_*.bin`, each file a document [EOT] + its
    tokens (tiktoken's batch encoding runs them on threads)."""
    docs = gpt2_encoding().encode_ordinary_batch([read_text(f) for f in files])
    tokens = np.concatenate([np.array([data.EOT, *doc], dtype=np.uint16) for doc in docs])
    write_dataset(out_dir, "text", tokens)
    print(f"wrote the {len(tokens):,} tokens of {len(files)} text file(s) into {out_dir}")


def text_dataset(files):
    """The shard folder of these text files, TEXT_CACHE/{first stem}-{key}, made on first use;
    the key hashes the texts, so an edited file is tokenized again."""
    digests = [hashlib.sha256(read_text(f).encode("utf-8")).hexdigest() for f in files]
    key = json.dumps({"texts": digests, "tokenizer": "gpt2", "val_fraction": VAL_FRACTION})
    folder = TEXT_CACHE / f"{Path(files[0]).stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    if not folder.is_dir():
        try:
            prepare_text(files, folder)
        except OSError:
            if not folder.is_dir():  # else another run wrote it first
                raise
    return folder


# ----------------------------------------------------------------------------- synthetic
def markov_transition(vocab, seed):
    """A random Markov language P[i, j] = P(next = j | token = i), V×V float64, each row drawn
    from a symmetric Dirichlet(MARKOV_ALPHA): all positive, so irreducible, aperiodic, one π."""
    P = np.random.default_rng([seed, 0]).dirichlet(np.full(vocab, MARKOV_ALPHA), size=vocab)
    return P / P.sum(axis=1, keepdims=True)


def markov_stationary(P):
    """π with π P = π and Σπ = 1: solves (Pᵀ − I) π = 0 with its last equation made Σπ = 1."""
    A = P.T - np.eye(len(P))
    A[-1] = 1.0
    return np.linalg.solve(A, np.eye(len(P))[-1])


def synthesize_markov(P, n_tokens, seed):
    """n_tokens of the chain P, as ⌈n / MARKOV_CHAIN_TOKENS⌉ independent chains end to end, each
    started from π. They advance together: with the rows' CDFs on one axis as i + cdf[i, j], a
    chain at i with uniform u moves to searchsorted(that axis, i + u) − i·V."""
    V, rng = len(P), np.random.default_rng([seed, 1])
    n_chains = -(-n_tokens // MARKOV_CHAIN_TOKENS)
    length = -(-n_tokens // n_chains)
    cdf = np.cumsum(P, axis=1)
    cdf[:, -1] = 1.0                                      # guard against rounding below 1
    axis = (cdf + np.arange(V)[:, None]).ravel()
    out = np.empty((n_chains, length), dtype=np.uint16)
    out[:, 0] = cur = rng.choice(V, size=n_chains, p=markov_stationary(P))
    for t in range(1, length):
        cur = np.searchsorted(axis, cur + rng.random(n_chains), side="right") - cur * V
        out[:, t] = cur = np.minimum(cur, V - 1)          # u ≈ 1 rounding guard
    return out.ravel()[:n_tokens]


def prepare_synthetic(vocab, n_tokens, out_dir, seed=0):
    """Write n_tokens of a random Markov language (markov_transition) as train/val shards."""
    P = markov_transition(vocab, seed)
    pi = markov_stationary(P)
    tokens = synthesize_markov(P, n_tokens, seed)
    write_dataset(out_dir, "markov", tokens)
    rate = -(pi[:, None] * P * np.log(P)).sum()          # H = −Σᵢ πᵢ Σⱼ Pᵢⱼ ln Pᵢⱼ nats
    print(f"wrote {len(tokens):,} tokens into {out_dir}; their entropy rate (the best possible "
          f"loss) is {rate:.4f} nats")


def prepare_renumbered(source_dir, out_dir):
    """Copy source_dir with the ids its train split uses re-numbered 0 … V′−1 in order, and the
    val tokens it never uses dropped."""
    train, val = (np.concatenate([data.read_shard(p) for p in data.shard_paths(source_dir, split)])
                  for split in ("train", "val"))
    used, train = np.unique(train, return_inverse=True)     # train[i] = the new id of its token
    kept = np.searchsorted(used, val[np.isin(val, used)])  # new ids of the val tokens kept
    write_dataset(out_dir, "renumbered", train.astype(np.uint16), kept.astype(np.uint16))
    print(f"wrote {out_dir}: {len(used):,} token ids in use (train with --vocab_size "
          f"{len(used)}), {len(val) - len(kept):,} val tokens dropped")


# ----------------------------------------------------------------------------- FineWeb
def shards_needed(tokens, dataset=DEFAULT_DATASET):
    """Train shards a run of `tokens` training tokens reads, at most all (a longer run wraps)."""
    return min(-(-tokens // data.SHARD_TOKENS), FINEWEB_DATASETS[dataset][1])


def fetch_fineweb(folder=DEFAULT_DATA, dataset=DEFAULT_DATASET, train_shards=8):
    """Download train shards 1‥N, then the val shard, skipping those already there. Each goes to
    a .tmp name, renamed once whole. Val comes last: the loader refuses a folder without it."""
    repo, available = FINEWEB_DATASETS[dataset]
    if not 1 <= train_shards <= available:
        raise ValueError(f"{dataset} has {available} train shards; ask for 1 to {available}, "
                         f"not {train_shards}")
    url = os.environ.get(BASE_URL_ENV) or f"https://huggingface.co/datasets/{repo}/resolve/main"
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"fineweb_train_{i:06d}.bin" for i in range(1, train_shards + 1)]
    missing = [name for name in names + ["fineweb_val_000000.bin"] if not (folder / name).exists()]
    t0 = time.perf_counter()
    for k, name in enumerate(missing, 1):
        tmp, source = folder / (name + ".tmp"), f"{url.rstrip('/')}/{name}"
        request = urllib.request.Request(source, headers={"User-Agent": "prepare.py"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response, open(tmp, "wb") as f:
                shutil.copyfileobj(response, f, 1 << 20)
            n = data.shard_length(tmp)  # a transfer cut short fails here
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError) as err:
            raise RuntimeError(f"could not download {source} ({getattr(err, 'reason', err)}); run "
                               f"the command again, or offline, train on local text instead: "
                               f"`python prepare.py text FILES --out DIR`") from None
        os.replace(tmp, folder / name)
        eta = (time.perf_counter() - t0) / k * (len(missing) - k)
        print(f"[{k}/{len(missing)}] {name}: {n:,} tokens, ETA {eta:.0f} s", flush=True)


# ----------------------------------------------------------------------------- command line
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fineweb", help="download GPT-2 FineWeb shards", allow_abbrev=False)
    f.add_argument("--shards", type=int, default=8, help="train shards of 100M tokens")
    f.add_argument("--dataset", choices=list(FINEWEB_DATASETS), default=DEFAULT_DATASET)
    f.add_argument("--out", help="the folder (default: the project's data/DATASET)")
    t = sub.add_parser("text", help="tokenize UTF-8 text files", allow_abbrev=False)
    t.add_argument("files", nargs="+")
    s = sub.add_parser("synthetic", help="a random Markov language", allow_abbrev=False)
    s.add_argument("--vocab", type=int, required=True)
    s.add_argument("--tokens", type=int, required=True)
    s.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("renumber", help="re-number to the ids training uses", allow_abbrev=False)
    r.add_argument("source", help="a dataset folder")
    for command in (t, s, r):
        command.add_argument("--out", required=True, help="the new dataset's folder")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    run = {"fineweb": lambda: fetch_fineweb(args.out or ROOT / "data" / args.dataset,
                                            args.dataset, args.shards),
           "text": lambda: prepare_text(args.files, args.out),
           "synthetic": lambda: prepare_synthetic(args.vocab, args.tokens, args.out, args.seed),
           "renumber": lambda: prepare_renumbered(args.source, args.out)}
    try:
        run[args.command]()
    except (ValueError, RuntimeError, OSError) as err:  # the user's to fix: one sentence
        raise SystemExit(f"prepare.py {args.command}: error: {err}") from None


if __name__ == "__main__":
    main()

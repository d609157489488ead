"""Token shards on disk: download, tokenize, synthesize, and load them (DDP-aware).

Every source ends in the same format, the llm.c / modded-nanogpt shard, so pre-tokenized
shards from elsewhere work as they are:

    bytes 0‥1023   header, 256 little-endian int32: [20240520 (magic), 1 (version), n, 0, …]
    bytes 1024‥    n tokens, little-endian uint16

A data folder holds `*train*.bin` and `*val*.bin` shards. Sources (`python data.py --help`):

    python data.py fineweb --shards 8                 GPT-2 FineWeb, 100M tokens per train shard
    python data.py text FILES... --out data/mytext    any UTF-8 text, GPT-2 tokenizer
    python data.py synthetic --task markov --vocab 64 --tokens 10000000 --out data/markov
    python data.py bench --data DIR                   how fast the loader reads

`ShardLoader` cuts the token stream of a split into (B, T+1) windows, x = window[:-1] and
y = window[1:]; with world_size W, step s of rank r reads the block that starts at
position s·W·B·T + r·B·T, so the ranks of one step read disjoint, adjacent blocks and
together read exactly what one process with batch W·B reads. Its position is a plain dict
of ints (`state_dict`), so a resumed run continues with exactly the next batch.

This file imports nothing of its project (torch, numpy, tiktoken, standard library), so it
can be copied alone.
"""
import argparse
import hashlib
import multiprocessing
import os
import re
import time
import urllib.error
import urllib.request
from bisect import bisect_right
from pathlib import Path

import numpy as np
import tiktoken
import torch

# ----------------------------------------------------------------------------- defaults
MAGIC, VERSION = 20240520, 1          # llm.c shard header
HEADER_INTS = 256                     # header length in int32 (1024 bytes)
HEADER_BYTES = HEADER_INTS * 4
EOT = 50256                           # GPT-2 <|endoftext|>, placed before every document
DEFAULT_DATA = "data/fineweb10B"
FINEWEB_DATASETS = {                  # name -> Hugging Face dataset of pre-tokenized shards
    "fineweb10B": "kjj0/fineweb10B-gpt2",
    "fineweb100B": "kjj0/fineweb100B-gpt2",
}
BASE_URL_ENV = "FINEWEB_BASE_URL"     # overrides the download location (mirrors, tests)
DOWNLOAD_TIMEOUT_S = 60
DOWNLOAD_RETRIES = 5                  # resumed attempts after a transfer breaks off
SHARD_TOKENS = 100_000_000            # tokens per train shard written by `text`/`synthetic`
VAL_FRACTION = 0.1                    # share of tokens put in the val shard by `text`/`synthetic`
PIECE_CHARS = 1_000_000               # text piece handed to one tokenizer process
MARKOV_ALPHA = 0.2                    # Dirichlet concentration of each transition row
MARKOV_MAX_VOCAB = 4096               # the V×V float64 matrix stays ≤ 128 MiB
MARKOV_CHAIN_TOKENS = 100_000         # tokens per independent chain (see synthesize_markov)
GPT2_VOCAB_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
PREPARE_HINT = ("`python data.py fineweb --shards 8 --out {dir}` (GPT-2 FineWeb) or "
                "`python data.py text FILES --out {dir}` (your own text)")


# ----------------------------------------------------------------------------- shard format
def write_shard(path, tokens):
    """Write tokens (ints in [0, 65535]) as one shard, atomically: a crash leaves no half file."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() > 65535):
        raise ValueError(f"token ids must lie in [0, 65535] to fit a uint16 shard, "
                         f"got the range [{tokens.min()}, {tokens.max()}]")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = MAGIC, VERSION, tokens.size
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())
    os.replace(tmp, path)


def shard_length(path):
    """Validate a shard's header against its file size and return its token count n."""
    path = Path(path)
    size = path.stat().st_size
    if size < HEADER_BYTES:
        raise ValueError(f"{path} is truncated: {size} bytes is shorter than the "
                         f"{HEADER_BYTES}-byte header; delete it and prepare the data again")
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if header[0] != MAGIC:
        raise ValueError(f"{path} is not a token shard: its magic number is {header[0]}, "
                         f"not {MAGIC} (llm.c format); delete it and prepare the data again")
    if header[1] != VERSION:
        raise ValueError(f"{path} has shard version {header[1]}, but only version {VERSION} "
                         f"(uint16 tokens) is supported; prepare the data again with data.py")
    n = int(header[2])
    expected = HEADER_BYTES + 2 * n
    if size != expected:
        state = "truncated" if size < expected else "longer than its header says"
        raise ValueError(f"{path} is {state}: its header announces {n} tokens "
                         f"({expected} bytes) but the file has {size} bytes; "
                         f"delete it and prepare the data again")
    return n


def read_shard(path):
    """The tokens of a validated shard as a read-only uint16 memory map (no copy in RAM)."""
    n = shard_length(path)
    if n == 0:
        return np.zeros(0, dtype=np.uint16)
    return np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(n,))


def shard_paths(data_dir, split):
    """Sorted shards `DIR/*{split}*.bin`; FileNotFoundError naming the command that makes them."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    paths = sorted(Path(data_dir).glob(f"*{split}*.bin"))
    if not paths:
        raise FileNotFoundError(f"no {split} shards (*{split}*.bin) in {data_dir}; prepare them "
                                f"with {PREPARE_HINT.format(dir=data_dir)}")
    return paths


def _write_dataset(out_dir, prefix, splits):
    """Write {split: tokens} as `{prefix}_{split}_{i:06d}.bin` shards of ≤ SHARD_TOKENS each.

    Shards left from an earlier run with the same prefix are replaced (stale extra ones
    removed); shards of another source in the same folder are refused, since the loader
    would silently mix them in."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    foreign = [p.name for p in out_dir.glob("*.bin") if not p.name.startswith(prefix + "_")]
    if foreign:
        raise ValueError(f"{out_dir} already holds other shards ({foreign[0]}, …) that the "
                         f"loader would mix in; choose another --out folder or delete them")
    written = []
    for split, tokens in splits.items():
        for i, start in enumerate(range(0, max(len(tokens), 1), SHARD_TOKENS)):
            path = out_dir / f"{prefix}_{split}_{i:06d}.bin"
            write_shard(path, tokens[start:start + SHARD_TOKENS])
            written.append(path)
    for stale in set(out_dir.glob(f"{prefix}_*.bin")) - set(written):
        stale.unlink()
    return written


def _split_train_val(tokens, val_fraction, align=1):
    """Train = the first part, val = the last ⌈val_fraction·n⌉ tokens (rounded to `align`)."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"--val_fraction must lie strictly between 0 and 1, got {val_fraction}")
    n_val = -(-int(np.ceil(val_fraction * len(tokens))) // align) * align
    if n_val >= len(tokens):
        raise ValueError(f"{len(tokens)} tokens are too few to split into train and val "
                         f"with --val_fraction {val_fraction}; provide more data")
    return {"train": tokens[:-n_val], "val": tokens[-n_val:]}


# ----------------------------------------------------------------------------- GPT-2 tokenizer
def gpt2_encoding():
    """tiktoken's GPT-2 encoding (50257 tokens, <|endoftext|> = EOT = 50256).

    tiktoken downloads vocab.bpe and encoder.json on first use and caches them in
    TIKTOKEN_CACHE_DIR under the sha1 of their URL; offline, that cache must be seeded."""
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as err:  # tiktoken raises requests' or its own errors; all mean the same
        names = ", ".join(f"{name} as {hashlib.sha1((GPT2_VOCAB_URL + name).encode()).hexdigest()}"
                          for name in ("vocab.bpe", "encoder.json"))
        raise RuntimeError(f"tiktoken could not load the GPT-2 vocabulary ({type(err).__name__}); "
                           f"offline, copy {GPT2_VOCAB_URL}{{vocab.bpe,encoder.json}} into a "
                           f"folder ({names}) and set TIKTOKEN_CACHE_DIR to it") from err


def text_pieces(text, max_chars=PIECE_CHARS):
    """Cut text into pieces of about ≤ max_chars at line ends, for parallel tokenizing.

    A cut sits just before a newline that follows a non-space character. GPT-2's
    pre-tokenizer regex has no look-behind, and none of its patterns carries a run of
    letters, digits or punctuation on into whitespace, so a pre-token ends there in the
    whole text too: the tokens of the pieces, concatenated, equal the tokens of the whole."""
    cuts = [m.start() for m in re.finditer(r"(?<=\S)\n", text)]
    pieces, start = [], 0
    while len(text) - start > max_chars:
        i = bisect_right(cuts, start + max_chars) - 1
        if i < 0 or cuts[i] <= start:          # no line end in reach: take the next one after
            i = bisect_right(cuts, start)
            if i == len(cuts):
                break
        pieces.append(text[start:cuts[i]])
        start = cuts[i]
    pieces.append(text[start:])
    return pieces


def _encode_piece(text):
    """Worker: GPT-2 tokens of one text piece (loaded once per process by tiktoken)."""
    return np.array(gpt2_encoding().encode_ordinary(text), dtype=np.uint16)


def tokenize_files(files, workers=None):
    """All files as one token stream: each file is one document, [EOT] + its tokens.

    Large files are cut at line ends (text_pieces) and the pieces tokenized by
    a pool of processes; the result is identical to tokenizing each file whole."""
    pieces, starts = [], []                # starts[k]: is pieces[k] the first of a document?
    for f in files:
        path = Path(f)
        if not path.is_file():
            raise FileNotFoundError(f"text file {path} does not exist; check the path")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start}); "
                             f"convert it to UTF-8 first") from err
        if not text.strip():
            raise ValueError(f"{path} is empty (no text to tokenize); remove it from the list")
        doc = text_pieces(text)
        pieces += doc
        starts += [True] + [False] * (len(doc) - 1)
    gpt2_encoding()  # fail here, once, with the clear message if the vocabulary is missing
    workers = min(workers or os.cpu_count() or 1, len(pieces))
    if workers > 1:
        with multiprocessing.get_context().Pool(workers) as pool:
            encoded = pool.map(_encode_piece, pieces, chunksize=1)
    else:
        encoded = [_encode_piece(p) for p in pieces]
    eot = np.array([EOT], dtype=np.uint16)
    return np.concatenate([part for first, toks in zip(starts, encoded)
                           for part in ((eot, toks) if first else (toks,))])


def prepare_text(files, out_dir, val_fraction=VAL_FRACTION, workers=None):
    """Tokenize text files into `text_train_*.bin` / `text_val_*.bin` (val = the last part)."""
    t0 = time.perf_counter()
    tokens = tokenize_files(files, workers)
    seconds = time.perf_counter() - t0
    written = _write_dataset(out_dir, "text", _split_train_val(tokens, val_fraction))
    print(f"tokenized {len(files)} file(s): {len(tokens):,} tokens in {seconds:.2f} s "
          f"({len(tokens) / seconds:,.0f} tokens/s); wrote {', '.join(map(str, written))}")
    return written


# ----------------------------------------------------------------------------- synthetic tasks
def _synthetic_rng(seed, stream):
    """Independent random streams per (seed, purpose), so the matrix ignores --tokens."""
    return np.random.default_rng([seed, stream])


def synthesize_repeat(vocab, n_tokens, seq_len, seed):
    """Sequences of seq_len copies of one token, drawn uniformly from [0, V) without EOT.

    The trivial pattern of the gradient-bottleneck study: within a sequence the next token
    is certain, P(y = x) = 1. With train.py's --seq_len equal to this seq_len, every input
    row x is one sequence; only a row's last target y[-1] starts the next sequence (as at
    a document boundary)."""
    choices = np.arange(vocab)
    choices = choices[choices != EOT]
    firsts = _synthetic_rng(seed, 1).choice(choices, size=n_tokens // seq_len)
    return np.repeat(firsts, seq_len).astype(np.uint16)


def markov_transition(vocab, seed):
    """A random first-order Markov language: P[i, j] = P(next = j | token = i), V×V float64.

    Each row is drawn from a symmetric Dirichlet(MARKOV_ALPHA); all entries are positive,
    so the chain is irreducible and aperiodic and has one stationary distribution π."""
    if not 2 <= vocab <= MARKOV_MAX_VOCAB:
        raise ValueError(f"the markov task needs 2 ≤ --vocab ≤ {MARKOV_MAX_VOCAB} "
                         f"(its V×V matrix is stored), got {vocab}")
    P = _synthetic_rng(seed, 0).dirichlet(np.full(vocab, MARKOV_ALPHA), size=vocab)
    return P / P.sum(axis=1, keepdims=True)


def markov_stationary(P, tol=1e-13):
    """π with π P = π and Σπ = 1, by power iteration (fast: random dense rows mix at once)."""
    pi = np.full(len(P), 1.0 / len(P))
    for _ in range(100_000):
        nxt = pi @ P
        if np.abs(nxt - pi).sum() < tol:
            break
        pi = nxt
    return nxt / nxt.sum()


def markov_entropy_rate(P, pi):
    """H = −Σᵢ πᵢ Σⱼ Pᵢⱼ ln Pᵢⱼ nats: the lowest cross-entropy any model can reach."""
    return float(-(pi[:, None] * P * np.log(P)).sum())


def synthesize_markov(P, n_tokens, seed):
    """n_tokens of the chain P, as ⌈n/MARKOV_CHAIN_TOKENS⌉ independent chains laid end to end.

    Each chain starts from π and so is stationary throughout; every transition inside a
    chain is an exact draw from P, and only the few joins between chains (one per
    MARKOV_CHAIN_TOKENS tokens) are not. The chains advance together, one vectorized step
    each: with the rows' CDFs laid out on one axis as i + cdf[i, j], the next token of a
    chain at i with uniform u is searchsorted(that axis, i + u) − i·V."""
    V = len(P)
    rng = _synthetic_rng(seed, 1)
    n_chains = -(-n_tokens // MARKOV_CHAIN_TOKENS)
    length = -(-n_tokens // n_chains)
    cdf = np.cumsum(P, axis=1)
    cdf[:, -1] = 1.0                                      # guard against rounding below 1
    axis = (cdf + np.arange(V)[:, None]).ravel()
    out = np.empty((n_chains, length), dtype=np.uint16)
    cur = rng.choice(V, size=n_chains, p=markov_stationary(P))
    out[:, 0] = cur
    for t in range(1, length):
        u = rng.random(n_chains)
        cur = np.searchsorted(axis, cur + u, side="right") - cur * V
        cur = np.minimum(cur, V - 1)                      # u ≈ 1 rounding guard
        out[:, t] = cur
    return out.ravel()[:n_tokens]


def prepare_synthetic(task, vocab, n_tokens, out_dir, seed=0, seq_len=64,
                      val_fraction=VAL_FRACTION):
    """Write a synthetic task's train/val shards (and, for markov, its P and π as .npy)."""
    if not 2 <= vocab <= 65536:
        raise ValueError(f"--vocab must lie in [2, 65536] (uint16 tokens), got {vocab}")
    if seq_len < 1 or n_tokens < 2 * seq_len:
        raise ValueError(f"--tokens ({n_tokens}) must hold at least two sequences of "
                         f"--seq_len ({seq_len}) tokens")
    n_tokens -= n_tokens % seq_len                        # whole sequences only
    if task == "repeat":
        tokens = synthesize_repeat(vocab, n_tokens, seq_len, seed)
        summary = "best possible loss → 0 inside sequences"
    elif task == "markov":
        P = markov_transition(vocab, seed)
        pi = markov_stationary(P)
        tokens = synthesize_markov(P, n_tokens, seed)
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        for name, array in (("markov_transition", P), ("markov_stationary", pi)):
            tmp = Path(out_dir) / f".{name}.tmp.npy"
            np.save(tmp, array)
            os.replace(tmp, Path(out_dir) / f"{name}.npy")
        summary = f"entropy rate (best possible loss) {markov_entropy_rate(P, pi):.4f} nats"
    else:
        raise ValueError(f"unknown synthetic task {task!r}; choose 'repeat' or 'markov'")
    written = _write_dataset(out_dir, task,
                             _split_train_val(tokens, val_fraction, align=seq_len))
    print(f"{task}: {len(tokens):,} tokens, vocab {vocab}, {summary}; "
          f"wrote {', '.join(map(str, written))}")
    return written


# ----------------------------------------------------------------------------- FineWeb download
def fineweb_base_url(dataset="fineweb10B", base_url=None):
    """Where the shards live: base_url, else $FINEWEB_BASE_URL, else Hugging Face."""
    if dataset not in FINEWEB_DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; "
                         f"choose one of {', '.join(FINEWEB_DATASETS)}")
    return (base_url or os.environ.get(BASE_URL_ENV)
            or f"https://huggingface.co/datasets/{FINEWEB_DATASETS[dataset]}/resolve/main")


def fetch_fineweb(out_dir=DEFAULT_DATA, n_train_shards=8, dataset="fineweb10B", base_url=None):
    """Download fineweb_val_000000.bin and fineweb_train_000001‥N.bin (100M tokens each).

    Shards already in place and valid are kept; an interrupted download continues from its
    `.part` file; every download is validated before it is renamed into place."""
    if n_train_shards < 1:
        raise ValueError(f"--shards must be at least 1, got {n_train_shards}")
    url = fineweb_base_url(dataset, base_url).rstrip("/")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = ["fineweb_val_000000.bin"] + [f"fineweb_train_{i:06d}.bin"
                                          for i in range(1, n_train_shards + 1)]
    for k, name in enumerate(names, 1):
        path = out_dir / name
        if path.exists():
            try:
                shard_length(path)
                print(f"[{k}/{len(names)}] {name}: already here")
                continue
            except ValueError:
                path.unlink()                  # a bad complete file: fetch it again
        download_shard(f"{url}/{name}", path, label=f"[{k}/{len(names)}] {name}")
    return [out_dir / name for name in names]


def download_shard(url, path, label=""):
    """Fetch one shard through `path.part`, resuming with HTTP Range, then validate and rename.

    A transfer that breaks off after making progress is resumed up to DOWNLOAD_RETRIES
    times; a shard that fails validation is deleted, so no half or corrupt file remains."""
    part = path.with_name(path.name + ".part")
    for attempt in range(DOWNLOAD_RETRIES + 1):
        have = _size(part)
        try:
            total = _transfer(url, part, have, label)
        except (urllib.error.URLError, OSError) as err:
            if _size(part) == have or attempt == DOWNLOAD_RETRIES:
                raise _download_error(url, err) from err
            continue                           # progress was made: resume from there
        if total is None or _size(part) >= total:
            break
    else:
        raise RuntimeError(f"the download of {url} kept breaking off; run the command again "
                           f"to resume it from {part}")
    try:
        n = shard_length(part)
        if total is not None and _size(part) != total:
            raise ValueError(f"{part} has {_size(part)} bytes but the server announced {total}")
    except ValueError as err:
        part.unlink()
        raise ValueError(f"the download of {url} is corrupt and was deleted ({err}); "
                         f"run the command again, or check --base_url") from None
    os.replace(part, path)
    print(f"{label}: {n:,} tokens ok")


def _size(path):
    return path.stat().st_size if path.exists() else 0


def _transfer(url, part, have, label):
    """Append url's bytes from offset `have` to `part`; return the full size if known."""
    request = urllib.request.Request(url, headers={"User-Agent": "data.py"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT_S)
    except urllib.error.HTTPError as err:
        if err.code == 416:                    # the part already holds the whole file
            return have
        raise
    with response:
        resumed = response.status == 206
        length = response.headers.get("Content-Length")
        total = (have if resumed else 0) + int(length) if length is not None else None
        done = have if resumed else 0
        t0, last, start = time.perf_counter(), 0.0, done
        with open(part, "ab" if resumed else "wb") as f:
            while chunk := response.read(1 << 20):
                f.write(chunk)
                done += len(chunk)
                now = time.perf_counter() - t0
                if now - last > 0.5 or done == total:
                    last = now
                    _print_progress(label, done, total, (done - start) / max(now, 1e-9))
    print()
    return total


def _print_progress(label, done, total, rate):
    mb = 1e6
    eta = f", ETA {(total - done) / max(rate, 1):.0f} s" if total else ""
    of = f"/{total / mb:.0f}" if total else ""
    print(f"\r{label}: {done / mb:.0f}{of} MB, {rate / mb:.1f} MB/s{eta}   ", end="", flush=True)


def _download_error(url, err):
    if isinstance(err, urllib.error.HTTPError):
        return RuntimeError(f"{url} answered HTTP {err.code} ({err.reason}); check --shards "
                            f"(the dataset may have fewer), --dataset and --base_url")
    return RuntimeError(f"could not download {url} ({getattr(err, 'reason', err)}); offline, "
                        f"train on local text instead: `python data.py text FILES --out DIR`, "
                        f"then `python train.py --data DIR`")


# ----------------------------------------------------------------------------- loading
class ShardLoader:
    """Batches (x, y) of int64 CPU tensors (B, T) from a split's shards, memory-mapped.

    Step s reads, for rank r, the window block tokens[p + r·B·T : p + r·B·T + B·T + 1] of
    the current shard, with p the step's global position; row b is the (T+1)-token window
    starting at b·T of that block, x = window[:-1], y = window[1:]. After the step
    p ← p + W·B·T. When the next step's W·B·T + 1 tokens do not fit in the shard, the
    loader moves to the next shard at p = 0 (the tail is skipped), and after the last shard
    wraps around to the first (epoch + 1)."""

    def __init__(self, data_dir, batch_size, seq_len, rank=0, world_size=1, split="train"):
        if batch_size < 1 or seq_len < 1:
            raise ValueError(f"batch_size and seq_len must be ≥ 1, "
                             f"got {batch_size} and {seq_len}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must lie in [0, world_size={world_size}), got {rank}")
        self.B, self.T, self.rank, self.world_size = batch_size, seq_len, rank, world_size
        self.paths = shard_paths(data_dir, split)
        self.lengths = [shard_length(p) for p in self.paths]
        step_tokens = world_size * batch_size * seq_len + 1
        for path, n in zip(self.paths, self.lengths):
            if n < step_tokens:
                raise ValueError(f"{path} holds {n} tokens, fewer than the {step_tokens} one step "
                                 f"needs (world_size·batch_size·seq_len + 1); lower batch_size "
                                 f"or seq_len, or prepare more data")
        self.load_state_dict({"shard": 0, "position": 0, "epoch": 0})

    def next_batch(self):
        B, T, W = self.B, self.T, self.world_size
        if self.position + W * B * T + 1 > self.lengths[self.shard]:
            self.shard += 1
            if self.shard == len(self.paths):
                self.shard, self.epoch = 0, self.epoch + 1
            self.position = 0
            self.tokens = read_shard(self.paths[self.shard])
        start = self.position + self.rank * B * T
        window = torch.from_numpy(self.tokens[start:start + B * T + 1].astype(np.int64))
        self.position += W * B * T
        return window[:-1].view(B, T), window[1:].view(B, T)

    def state_dict(self):
        """Where the next batch starts: plain ints, shared by all ranks (not rank-specific)."""
        return {"shard": self.shard, "position": self.position, "epoch": self.epoch}

    def load_state_dict(self, state):
        shard, position = int(state["shard"]), int(state["position"])
        if not (0 <= shard < len(self.paths) and 0 <= position <= self.lengths[shard]):
            raise ValueError(f"loader state {state} does not fit the {len(self.paths)} shard(s) "
                             f"of {self.paths[0].parent}; were shards added or removed?")
        self.shard, self.position, self.epoch = shard, position, int(state.get("epoch", 0))
        self.tokens = read_shard(self.paths[shard])

    def check_vocab(self, vocab_size):
        """ValueError if any token id ≥ vocab_size: reads every shard once (~GB/s)."""
        for path in self.paths:
            tokens = read_shard(path)
            top = int(tokens.max()) if tokens.size else -1
            if top >= vocab_size:
                raise ValueError(f"{path} holds token id {top}, outside the model's vocabulary "
                                 f"of {vocab_size}; raise --vocab_size or use data made for it")


def val_batches(data_dir, eval_tokens, batch_size, seq_len, rank=0, world_size=1):
    """The first ⌊eval_tokens / (W·B·T)⌋ steps of the val split, as ShardLoader reads them.

    Every rank gets the same number of batches and together they cover each evaluated
    token exactly once, so a mean over ranks gives the same loss for any world size."""
    loader = ShardLoader(data_dir, batch_size, seq_len, rank, world_size, split="val")
    step = world_size * batch_size * seq_len
    steps = eval_tokens // step
    available = sum((n - 1) // step for n in loader.lengths)
    if not 1 <= steps <= available:
        raise ValueError(f"eval_tokens={eval_tokens} must cover between 1 and {available} steps "
                         f"of {step} tokens (world_size·batch_size·seq_len) of {data_dir}'s val "
                         f"split; change eval_tokens")
    return (loader.next_batch() for _ in range(steps))


def bench_loader(data_dir, batch_size=64, seq_len=1024, steps=200, split="train"):
    """Tokens per second the loader delivers (memory map → int64 tensors)."""
    loader = ShardLoader(data_dir, batch_size, seq_len, split=split)
    loader.next_batch()                        # touch the first shard
    t0 = time.perf_counter()
    for _ in range(steps):
        loader.next_batch()
    rate = steps * batch_size * seq_len / (time.perf_counter() - t0)
    print(f"loader: {rate:,.0f} tokens/s ({steps} batches of {batch_size}×{seq_len} "
          f"from {data_dir} {split})")
    return rate


# ----------------------------------------------------------------------------- command line
def parse_args(argv=None):
    examples = [line for line in __doc__.splitlines() if line.lstrip().startswith("python ")]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="examples:\n" + "\n".join(examples),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fineweb", help="download pre-tokenized GPT-2 FineWeb shards")
    f.add_argument("--shards", type=int, default=8, help="train shards of 100M tokens")
    f.add_argument("--dataset", choices=list(FINEWEB_DATASETS), default="fineweb10B")
    f.add_argument("--out", help="output folder (default data/DATASET)")
    f.add_argument("--base_url",
                   help=f"download location (default ${BASE_URL_ENV}, else Hugging Face)")
    t = sub.add_parser("text", help="tokenize UTF-8 text files (one document per file)")
    t.add_argument("files", nargs="+")
    t.add_argument("--out", required=True)
    t.add_argument("--val_fraction", type=float, default=VAL_FRACTION)
    t.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    s = sub.add_parser("synthetic", help="generate a synthetic language")
    s.add_argument("--task", choices=["repeat", "markov"], required=True)
    s.add_argument("--vocab", type=int, required=True)
    s.add_argument("--tokens", type=int, required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--seq_len", type=int, default=64, help="sequence length (use train.py's)")
    s.add_argument("--val_fraction", type=float, default=VAL_FRACTION)
    b = sub.add_parser("bench", help="measure the loader's read rate")
    b.add_argument("--data", default=DEFAULT_DATA)
    b.add_argument("--batch_size", type=int, default=64)
    b.add_argument("--seq_len", type=int, default=1024)
    b.add_argument("--steps", type=int, default=200)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        if args.command == "fineweb":
            fetch_fineweb(args.out or f"data/{args.dataset}", args.shards, args.dataset,
                          args.base_url)
        elif args.command == "text":
            prepare_text(args.files, args.out, args.val_fraction, args.workers)
        elif args.command == "synthetic":
            prepare_synthetic(args.task, args.vocab, args.tokens, args.out, args.seed,
                              args.seq_len, args.val_fraction)
        else:
            bench_loader(args.data, args.batch_size, args.seq_len, args.steps)
    except (ValueError, RuntimeError, OSError) as err:  # user-caused: one sentence, no traceback
        raise SystemExit(f"data.py {args.command}: error: {err}") from None


if __name__ == "__main__":
    main()

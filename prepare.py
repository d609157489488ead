"""Token shards, written whole by store.py, of GPT-2 FineWeb, UTF-8 text or a synthetic language.

    python prepare.py fineweb --shards 8                 GPT-2 FineWeb100B, 100M tokens per shard
    python prepare.py text FILES... --out data/mytext    any UTF-8 text, GPT-2 tokenizer
    python prepare.py synthetic --task markov --vocab 64 --tokens 10000000 --out data/markov
    python prepare.py renumber data/shakespeare --out data/shakespeare_dense
"""
import argparse
import contextlib
import hashlib
import http.client
import io
import json
import multiprocessing
import os
import re
import shutil
import time
import urllib.error
import urllib.request
from bisect import bisect_right
from pathlib import Path

import numpy as np

import data
import store
from store import fraction, non_negative_int, positive_int

# (Hugging Face dataset, train shards it holds; fineweb100B's 1028 has no committed source, nor
# has the 1,027 the paper's code draws from: number_of_training_chunks in its nanoGPT/train.py)
FINEWEB_DATASETS = {"fineweb10B": ("kjj0/fineweb10B-gpt2", 103),
                    "fineweb100B": ("kjj0/fineweb100B-gpt2", 1028)}
DEFAULT_DATASET = "fineweb100B"       # the paper's recipe reads 13.1B tokens; 10B holds 10.3B
DEFAULT_DATA = f"data/{DEFAULT_DATASET}"
BASE_URL_ENV = "FINEWEB_BASE_URL"     # overrides the download location (mirrors, tests)
DOWNLOAD_RETRIES = 5                  # resumed attempts after a transfer breaks off
VAL_FRACTION = 0.1                    # share of tokens put in the val shard by `text`/`synthetic`
MARKOV_ALPHA = 0.2                    # Dirichlet concentration of each transition row
MARKOV_MAX_VOCAB = 4096               # the V×V float64 matrix stays ≤ 128 MiB
MARKOV_CHAIN_TOKENS = 100_000         # tokens per independent chain (see synthesize_markov)
GPT2_VOCAB_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
GPT2_FILES = ("vocab.bpe", "encoder.json")
GPT2_SHIPPED = Path(__file__).resolve().parent / "tests" / "assets" / "gpt2"  # the same bytes
GPT2_CACHE = Path(__file__).resolve().parent / "data" / "tiktoken"  # seeded from them offline


def _split_train_val(tokens, val_fraction, align=1):
    """Train = the first part, val = the last ⌈val_fraction·n⌉ tokens (rounded up to `align`)."""
    n_val = -(-int(np.ceil(val_fraction * len(tokens))) // align) * align
    if min(n_val, len(tokens) - n_val) < 2:           # the loader's least: one input, one target
        raise ValueError(f"{len(tokens)} tokens are too few to split into train and val of at "
                         f"least 2 tokens each with --val_fraction {val_fraction}; add text")
    return {"train": tokens[:-n_val], "val": tokens[-n_val:]}


def gpt2_encoding():
    """tiktoken's GPT-2 encoding; if its download fails, GPT2_SHIPPED seeds GPT2_CACHE for good."""
    try:
        import tiktoken  # here, not above: reading shards needs no tokenizer
    except ImportError:
        raise RuntimeError("tokenizing text needs tiktoken, which is not installed; "
                           "run `pip install tiktoken`") from None
    seeded = [GPT2_CACHE / _gpt2_cache_name(name) for name in GPT2_FILES]
    if "TIKTOKEN_CACHE_DIR" not in os.environ and all(path.is_file() for path in seeded):
        os.environ["TIKTOKEN_CACHE_DIR"] = str(GPT2_CACHE)  # inherited by tokenizer workers
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as err:  # tiktoken raises requests' errors or its own; all mean the same
        failure = err
    with contextlib.suppress(Exception):  # no shipped copy, an unwritable folder, still failing
        if os.environ.get("TIKTOKEN_CACHE_DIR") != str(GPT2_CACHE):  # not tried yet
            GPT2_CACHE.mkdir(parents=True, exist_ok=True)
            for name, path in zip(GPT2_FILES, seeded):
                shutil.copyfile(GPT2_SHIPPED / name, path)
            os.environ["TIKTOKEN_CACHE_DIR"] = str(GPT2_CACHE)
            print(f"the GPT-2 vocabulary could not be downloaded ({type(failure).__name__}); using "
                  f"the copy shipped in tests/assets/gpt2 (cached in {GPT2_CACHE})", flush=True)
            return tiktoken.get_encoding("gpt2")
    raise RuntimeError(f"tiktoken could not load the GPT-2 vocabulary ({type(failure).__name__}); "
                       f"offline, copy {GPT2_VOCAB_URL}{{vocab.bpe,encoder.json}} into a folder "
                       f"as {' and '.join(p.name for p in seeded)}; set TIKTOKEN_CACHE_DIR to it")


def _gpt2_cache_name(name):
    """The file name tiktoken caches a download under: the sha1 of its URL."""
    return hashlib.sha1((GPT2_VOCAB_URL + name).encode()).hexdigest()


def text_pieces(text, max_chars=1_000_000):
    """Cut text into pieces of about ≤ max_chars, for parallel tokenizing, before newlines that
    follow a non-space. GPT-2's pre-tokenizer regex has no look-behind and carries no letter,
    digit or punctuation on into whitespace, so the pieces' tokens are the whole text's."""
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


def read_texts(files):
    texts = []
    for path in map(Path, files):
        if not path.is_file():
            if not path.exists():
                raise FileNotFoundError(f"text file {path} does not exist; check the path")
            kind = "a folder" if path.is_dir() else "not a regular file (a device or a pipe)"
            raise ValueError(f"{path} is {kind}; give text files")
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as err:
            raise ValueError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start}); "
                             f"convert it to UTF-8 first") from None
        if not texts[-1].strip():
            raise ValueError(f"{path} is empty (no text to tokenize); remove it from the list")
    return texts


def tokenize_texts(texts, workers=None):
    """All texts as one stream of documents [EOT] + tokens, pieces tokenized by a process pool."""
    docs = [text_pieces(text) for text in texts]
    pieces = [piece for doc in docs for piece in doc]
    gpt2_encoding()  # fail here, once, with the clear message if the vocabulary is missing
    workers = min(workers or os.cpu_count() or 1, len(pieces))
    if workers > 1:
        with multiprocessing.get_context().Pool(workers) as pool:
            encoded = iter(pool.map(_encode_piece, pieces, chunksize=1))
    else:
        encoded = map(_encode_piece, pieces)
    eot = np.array([data.EOT], dtype=np.uint16)
    return np.concatenate([part for doc in docs for part in [eot] + [next(encoded) for _ in doc]])


def prepare_text(files, out_dir, val_fraction=VAL_FRACTION, workers=None, replace=True, texts=None):
    """Tokenize text files (`texts`: their text, if read) into `text_{train,val}_*.bin`."""
    texts = texts or read_texts(files)
    t0 = time.perf_counter()
    tokens = tokenize_texts(texts, workers)
    seconds = time.perf_counter() - t0
    source = {"kind": "text", "files": [str(f) for f in files], "tokenizer": "gpt2",
              "val_fraction": val_fraction, "key": _text_key(texts, val_fraction)}
    written = store.write_dataset(out_dir, "text", _split_train_val(tokens, val_fraction), source,
                                  replace=replace)
    print(f"tokenized {len(files)} file(s): {len(tokens):,} tokens in {seconds:.2f} s "
          f"({len(tokens) / seconds:,.0f} tokens/s); wrote {', '.join(map(str, written))}")


def text_dataset(files, cache_root="data/text", val_fraction=VAL_FRACTION, workers=None):
    """The shard folder of these text files, `cache_root/{first stem}-{key}`, made on first use."""
    texts = read_texts(files)
    key = _text_key(texts, val_fraction)
    folder = Path(cache_root) / f"{Path(files[0]).stem}-{key[:16]}"
    if not (folder / store.MANIFEST).exists():  # new, or another run is writing it now
        with contextlib.suppress(FileExistsError):  # a concurrent run wrote the same folder
            prepare_text(files, folder, val_fraction, workers, replace=False, texts=texts)
    if (store.read_manifest(folder) or {}).get("source", {}).get("key") != key:
        raise ValueError(f"the cached dataset {folder} does not hold the tokens of "
                         f"{', '.join(map(str, files))}; delete {folder} and run again")
    return folder                  # checked whole by the caller (runs.make_ready: check_dataset)


def _text_key(texts, val_fraction):
    digests = [hashlib.sha256(text.encode("utf-8")).hexdigest() for text in texts]
    description = json.dumps({"texts": digests, "tokenizer": "gpt2", "val_fraction": val_fraction})
    return hashlib.sha256(description.encode()).hexdigest()


# np.random.default_rng([seed, 0]) draws the matrix, [seed, 1] the tokens: P is alike at any size
def synthesize_repeat(vocab, n_tokens, seq_len, seed):
    """Sequences of seq_len copies of one token, drawn uniformly from [0, V) without EOT:
    P(y = x) = 1 inside a sequence (its loss floor: experiments/geometry's repeat_floor)."""
    choices = np.setdiff1d(np.arange(vocab), [data.EOT])
    firsts = np.random.default_rng([seed, 1]).choice(choices, size=n_tokens // seq_len)
    return np.repeat(firsts.astype(np.uint16), seq_len)      # 2 bytes per token, no more


def markov_transition(vocab, seed):
    """A random Markov language P[i, j] = P(next = j | token = i), V×V float64, each row drawn from
    a symmetric Dirichlet(MARKOV_ALPHA): all positive, so irreducible, aperiodic, one π."""
    if not 2 <= vocab <= MARKOV_MAX_VOCAB:
        raise ValueError(f"the markov task needs 2 ≤ --vocab ≤ {MARKOV_MAX_VOCAB} "
                         f"(its V×V matrix is stored), got {vocab}")
    P = np.random.default_rng([seed, 0]).dirichlet(np.full(vocab, MARKOV_ALPHA), size=vocab)
    return P / P.sum(axis=1, keepdims=True)


def markov_stationary(P):
    """π with π P = π and Σπ = 1: solves (Pᵀ − I) π = 0 with its last equation made Σπ = 1."""
    A = P.T - np.eye(len(P))
    A[-1] = 1.0
    return np.linalg.solve(A, np.eye(len(P))[-1])


def synthesize_markov(P, n_tokens, seed):
    """n_tokens of the chain P, as ⌈n/MARKOV_CHAIN_TOKENS⌉ independent chains end to end, each
    started from π (stationary; every transition but the joins is a draw from P). They advance
    together: with the rows' CDFs on one axis as i + cdf[i, j], a chain at i with uniform u
    moves to searchsorted(that axis, i + u) − i·V."""
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


def prepare_synthetic(task, vocab, n_tokens, out_dir, seed=0, seq_len=64,
                      val_fraction=VAL_FRACTION):
    """Write a synthetic task's train/val shards (and, for markov, its P and π as .npy)."""
    if not 2 <= vocab <= 65536:
        raise ValueError(f"--vocab must lie in [2, 65536] (uint16 tokens), got {vocab}")
    if seq_len < 1 or n_tokens < 2 * seq_len:
        raise ValueError(f"--tokens ({n_tokens}) must hold at least two sequences of "
                         f"--seq_len ({seq_len}) tokens")
    n_tokens -= n_tokens % seq_len                        # whole sequences only
    need, out = 2 * n_tokens, Path(out_dir).resolve()     # 2 bytes a token, in memory and on disk
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    disk = next(folder for folder in (out, *out.parents) if folder.exists())
    if need > min(memory, free := shutil.disk_usage(disk).free):  # a sentence, not a MemoryError
        raise ValueError(f"--tokens {n_tokens:,} needs about {need / 2**30:,.1f} GiB of memory "
                         f"and as much disk, but this machine has {memory / 2**30:,.1f} GiB of "
                         f"memory and {free / 2**30:,.1f} GiB free on {disk}; ask for fewer")
    if task == "repeat":
        tokens, extras = synthesize_repeat(vocab, n_tokens, seq_len, seed), {}
        summary = "the next token is the current one except at each sequence's end"
    else:                                                 # markov: parse_args offers the two
        P = markov_transition(vocab, seed)
        pi = markov_stationary(P)
        tokens = synthesize_markov(P, n_tokens, seed)
        extras = {"markov_transition.npy": _npy_bytes(P), "markov_stationary.npy": _npy_bytes(pi)}
        rate = -(pi[:, None] * P * np.log(P)).sum()      # H = −Σᵢ πᵢ Σⱼ Pᵢⱼ ln Pᵢⱼ nats
        summary = f"entropy rate (best possible loss) {rate:.4f} nats"
    source = {"kind": task, "vocab": vocab, "tokens": n_tokens, "seed": seed, "seq_len": seq_len,
              "val_fraction": val_fraction}
    splits = _split_train_val(tokens, val_fraction, align=seq_len)
    written = store.write_dataset(out_dir, task, splits, source, extras)
    print(f"{task}: {len(tokens):,} tokens, vocab {vocab}, {summary}; "
          f"wrote {', '.join(map(str, written))}")


def _npy_bytes(array):
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def prepare_renumbered(source_dir, out_dir):
    """Copy source_dir with the ids its train split uses re-numbered 0 … V′−1 in order (their
    old ids in renumber_ids.npy) and val tokens it never uses dropped."""
    if Path(source_dir).resolve() == Path(out_dir).resolve():
        raise ValueError(f"--out {out_dir} is the source itself; give another folder")
    store.check_dataset(source_dir)
    train, val = (np.concatenate([np.asarray(data.read_shard(path))
                                  for path in data.shard_paths(source_dir, split)])
                  for split in ("train", "val"))
    used, train = np.unique(train, return_inverse=True)     # train[i] = the new id of its token
    kept = np.searchsorted(used, val[np.isin(val, used)])  # new ids of the val tokens kept
    dropped = len(val) - len(kept)
    splits = {"train": train.astype(np.uint16), "val": kept.astype(np.uint16)}
    source = {"kind": "renumbered", "from": str(source_dir), "vocab": len(used),
              "val_dropped": dropped}
    written = store.write_dataset(out_dir, "renumbered", splits, source,
                                  {"renumber_ids.npy": _npy_bytes(used.astype(np.int64))})
    print(f"renumber: {len(used):,} token ids in use, now 0 … {len(used) - 1} (train with "
          f"--vocab_size {len(used)}); dropped {dropped:,} of {len(val):,} validation tokens "
          f"that training never uses; wrote {', '.join(map(str, written))}")


def shards_needed(tokens, dataset=DEFAULT_DATASET):
    """Train shards a run of `tokens` training tokens reads, at most all (a longer run wraps)."""
    return min(-(-tokens // data.SHARD_TOKENS), FINEWEB_DATASETS[dataset][1])


def fetch_fineweb(folder=DEFAULT_DATA, dataset=DEFAULT_DATASET, train_shards=8, base_url=None):
    """Download the val shard and train shards 1‥N, each recorded in the manifest as it comes."""
    repo, available = FINEWEB_DATASETS[dataset]
    if not 1 <= train_shards <= available:
        raise ValueError(f"{dataset} has {available} train shards; ask for 1 to {available}, "
                         f"not {train_shards}")
    url = (base_url or os.environ.get(BASE_URL_ENV)
           or f"https://huggingface.co/datasets/{repo}/resolve/main").rstrip("/")
    folder = store.make_folder(folder)
    store.refuse_foreign_shards(folder, "fineweb")
    names = [f"fineweb_{'train' if i else 'val'}_{i:06d}.bin" for i in range(train_shards + 1)]
    recorded = (store.read_manifest(folder) or {}).get("files", {})
    source = {"kind": "fineweb", "dataset": dataset}
    for k, name in enumerate(names, 1):
        path, label, entry = folder / name, f"[{k}/{len(names)}] {name}", recorded.get(name)
        if entry and path.is_file() and path.stat().st_size == entry["bytes"]:
            continue
        if entry is None and path.is_file():
            with contextlib.suppress(ValueError):  # not a shard: fetched again, renamed over it
                data.shard_length(path)
                print(f"{label}: already here, recorded in the manifest")
                store.write_manifest(folder, source)
                continue
        entry = download_shard(f"{url}/{name}", path, label=label)
        store.write_manifest(folder, source, known={name: entry})
    tokens = sum(data.shard_length(folder / name) for name in names[1:])
    print(f"{folder}: {dataset} val shard and {train_shards} train shards ({tokens:,} tokens)")


def download_shard(url, path, label=""):
    """Fetch one shard through `path.part` (resumed), checked; returns its manifest entry."""
    part, expected = path.with_name(path.name + ".part"), None
    for attempt in range(DOWNLOAD_RETRIES + 1):
        have = _size(part)
        try:
            total, announced = _transfer(url, part, have, label)
        except store.WriteError:
            raise
        except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
            if _size(part) == have or attempt == DOWNLOAD_RETRIES:
                raise _download_error(url, err) from err   # __cause__: the network's reason
            continue                           # progress was made: resume from there
        expected = announced or expected
        if total is None or _size(part) >= total:
            break
    else:
        raise RuntimeError(f"the download of {url} kept breaking off; run the command again "
                           f"to resume it from {part}")
    try:
        n, entry = data.shard_length(part), store.file_entry(part, shard=True)
        if expected and entry["sha256"] != expected:
            raise ValueError(f"its sha256 differs from the {expected} the server announced")
    except ValueError as err:
        part.unlink()
        raise ValueError(f"the download of {url} is corrupt and was deleted ({err}); "
                         f"run the command again, or check --base_url") from None
    store.rename(part, path)
    print(f"{label}: {n:,} tokens ok")
    return entry


def _size(path):
    return path.stat().st_size if path.exists() else 0


class _RecordRedirects(urllib.request.HTTPRedirectHandler):
    """Keeps the headers of each redirect: the hub states an LFS file's sha256 on its 302."""
    def __init__(self):
        self.headers = []

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        self.headers.append(headers)
        return super().redirect_request(req, fp, code, msg, headers, newurl)

    def announced_sha256(self, final):
        values = [(headers.get(field) or "").removeprefix("W/").strip('"').lower()
                  for field in ("X-Linked-Etag", "ETag") for headers in self.headers + [final]]
        return next((value for value in values if re.fullmatch(r"[0-9a-f]{64}", value)), None)


def _transfer(url, part, have, label):
    """Append url's bytes from `have` on to `part`; returns (full size, sha256 stated), or None."""
    request = urllib.request.Request(url, headers={"User-Agent": "prepare.py"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    redirects = _RecordRedirects()
    try:
        response = urllib.request.build_opener(redirects).open(request, timeout=60)
    except urllib.error.HTTPError as err:
        if err.code == 416:                    # the part already holds the whole file
            return have, None
        raise
    with response:
        announced = redirects.announced_sha256(response.headers)
        resumed = response.status == 206
        length = response.headers.get("Content-Length")
        total = _resumed_total(url, response.headers, have) if resumed else \
            None if length is None else int(length)
        done = start = have if resumed else 0
        t0, last = time.perf_counter(), 0.0
        with store.WatchedFile.opened(part, "ab" if resumed else "wb") as f:
            try:
                while chunk := response.read(1 << 20):
                    f.write(chunk)             # a full disk: store.WriteError, not retried
                    done += len(chunk)
                    now = time.perf_counter() - t0
                    if now - last > 0.5 or done == total:
                        last = now
                        _print_progress(label, done, total, (done - start) / max(now, 1e-9))
            finally:
                print()
    return total, announced


def _resumed_total(url, headers, have):
    """TOTAL of a 206 reply's `Content-Range: bytes START-END/TOTAL` whose START is `have`."""
    match = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", headers.get("Content-Range", "").strip())
    if match is None or int(match[1]) != have:
        raise ValueError(f"{url} answered a request for its bytes from {have} with Content-Range "
                         f"{headers.get('Content-Range')!r}; run again, or use another --base_url")
    return int(match[3]) if match[3] != "*" else None


def _print_progress(label, done, total, rate):
    eta = f", ETA {(total - done) / max(rate, 1):.0f} s" if total else ""
    of = f"/{total / 1e6:.0f}" if total else ""
    print(f"\r{label}: {done / 1e6:.0f}{of} MB, {rate / 1e6:.1f} MB/s{eta}   ", end="", flush=True)


def _download_error(url, err):
    if isinstance(err, urllib.error.HTTPError):
        return RuntimeError(f"{url} answered HTTP {err.code} ({err.reason}); check --shards "
                            f"(the dataset may have fewer), --dataset and --base_url")
    return RuntimeError(f"could not download {url} ({getattr(err, 'reason', err)}); offline, "
                        f"train on local text instead: `python prepare.py text FILES --out DIR`, "
                        f"then `python train.py --data DIR`")


def folder_name(text):
    """An argparse type: a non-empty folder name (an empty one would mean the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is empty; give a folder such as data/mytext")
    return text


def parse_args(argv=None):
    p, sub = store.command_parser(__doc__)
    f = sub.add_parser("fineweb", help="download pre-tokenized GPT-2 FineWeb shards")
    f.add_argument("--shards", type=positive_int, default=8, help="train shards of 100M tokens")
    f.add_argument("--dataset", choices=list(FINEWEB_DATASETS), default=DEFAULT_DATASET)
    f.add_argument("--out", type=folder_name, help="output folder (default data/DATASET)")
    f.add_argument("--base_url", help=f"download location (default ${BASE_URL_ENV}, else HF)")
    out = argparse.ArgumentParser(add_help=False)
    out.add_argument("--out", type=folder_name, required=True, help="the dataset's folder: a "
                     "dataset there is replaced whole, any other files in it stay")
    t = sub.add_parser("text", parents=[out], help="tokenize UTF-8 text files, a document each")
    t.add_argument("files", nargs="+")
    t.add_argument("--val_fraction", type=fraction, default=VAL_FRACTION)
    t.add_argument("--workers", type=positive_int, help="processes (default: all cores)")
    s = sub.add_parser("synthetic", parents=[out], help="generate a synthetic language")
    s.add_argument("--task", choices=["repeat", "markov"], required=True)
    s.add_argument("--vocab", type=positive_int, required=True)
    s.add_argument("--tokens", type=positive_int, required=True)
    s.add_argument("--seed", type=non_negative_int, default=0)
    s.add_argument("--seq_len", type=positive_int, default=64, help="use train.py's")
    s.add_argument("--val_fraction", type=fraction, default=VAL_FRACTION)
    r = sub.add_parser("renumber", parents=[out], help="re-number to the ids training uses")
    r.add_argument("source", type=folder_name, help="a dataset folder")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    run = {"fineweb": lambda: fetch_fineweb(args.out or f"data/{args.dataset}", args.dataset,
                                            args.shards, args.base_url),
           "text": lambda: prepare_text(args.files, args.out, args.val_fraction, args.workers),
           "renumber": lambda: prepare_renumbered(args.source, args.out),
           "synthetic": lambda: prepare_synthetic(args.task, args.vocab, args.tokens, args.out,
                                                  args.seed, args.seq_len, args.val_fraction)}
    try:
        run[args.command]()
    except (ValueError, RuntimeError, OSError) as err:  # user-caused: one sentence, no traceback
        raise SystemExit(f"prepare.py {args.command}: error: {err}") from None


if __name__ == "__main__":
    main()

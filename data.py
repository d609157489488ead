"""Token shards on disk: the format, the dataset folder, the loader; then how to prepare them.

Every source ends in the same format, the llm.c / modded-nanogpt shard, so pre-tokenized
shards from elsewhere work as they are:

    bytes 0‥1023   header, 256 little-endian int32: [20240520 (magic), 1 (version), n, 0, …]
    bytes 1024‥    n tokens, little-endian uint16

A dataset is a folder of `*train*.bin` and `*val*.bin` shards plus `manifest.json`, which
names every file of the dataset with its size and sha256 and is written last, so a reader
can tell a complete dataset from a mixed or half-written one (`check_dataset`). Sources
(`python data.py --help`):

    python data.py fineweb --shards 8                 GPT-2 FineWeb100B, 100M tokens per shard
    python data.py text FILES... --out data/mytext    any UTF-8 text, GPT-2 tokenizer
    python data.py synthetic --task markov --vocab 64 --tokens 10000000 --out data/markov
    python data.py check data/mytext                  verify every hash, print the fingerprint
    python data.py bench --data DIR                   how fast the loader reads

`ShardLoader` cuts the token stream of a split into (B, T+1) windows, x = window[:-1] and
y = window[1:]; with world_size W, step s of rank r reads the block that starts at
position s·W·B·T + r·B·T, so the ranks of one step read disjoint, adjacent blocks and
together read exactly what one process with batch W·B reads. Its position is a plain dict
of ints (`state_dict`), so a resumed run continues with exactly the next batch.

This file imports nothing of its project (torch, numpy and the standard library; tiktoken
only when text is tokenized), so it can be copied alone.
"""
import argparse
import contextlib
import errno
import hashlib
import http.client
import io
import json
import math
import multiprocessing
import os
import re
import secrets
import shutil
import time
import urllib.error
import urllib.request
from bisect import bisect_right
from pathlib import Path

import numpy as np
import torch

# ----------------------------------------------------------------------------- defaults
MAGIC, VERSION = 20240520, 1          # llm.c shard header
HEADER_INTS = 256                     # header length in int32 (1024 bytes)
HEADER_BYTES = HEADER_INTS * 4
SHARD_TOKENS = 100_000_000            # tokens per train shard: FineWeb's, and ours
EOT = 50256                           # GPT-2 <|endoftext|>, placed before every document
MANIFEST = "manifest.json"            # the dataset's file list; written last
INCOMPLETE = "INCOMPLETE"             # present while data.py replaces a dataset in place
HASH_ALWAYS_BYTES = 256 << 20         # datasets up to this size are hashed on every check
FINEWEB_DATASETS = {                  # name -> (Hugging Face dataset, train shards it holds)
    "fineweb10B": ("kjj0/fineweb10B-gpt2", 103),
    "fineweb100B": ("kjj0/fineweb100B-gpt2", 1028),
}
DEFAULT_DATASET = "fineweb100B"       # the paper's recipe reads 13.1B tokens; 10B holds 10.3B
DEFAULT_DATA = f"data/{DEFAULT_DATASET}"
BASE_URL_ENV = "FINEWEB_BASE_URL"     # overrides the download location (mirrors, tests)
DOWNLOAD_TIMEOUT_S = 60
DOWNLOAD_RETRIES = 5                  # resumed attempts after a transfer breaks off
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
    with open_atomic(path) as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())


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
    """Sorted shards `DIR/*{split}*.bin` of a folder that passes `verify_folder`.

    FileNotFoundError naming the command that makes them when there are none."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    verify_folder(data_dir)                    # sizes only: this runs at every loader start
    paths = sorted(Path(data_dir).glob(f"*{split}*.bin"))
    if not paths:
        raise FileNotFoundError(f"no {split} shards (*{split}*.bin) in {data_dir}; prepare them "
                                f"with {PREPARE_HINT.format(dir=data_dir)}")
    return paths


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


# ----------------------------------------------------------------------------- dataset folder
def verify_folder(folder, hash_bytes=0):
    """The folder's files {name: (bytes, sha256 or None)}, after checking it is one dataset.

    With a manifest: every shard in the folder is named in it, and every file it names is
    there with its size and, when the whole dataset is at most hash_bytes, its sha256.
    Without a manifest (shards written by another tool), the shards are accepted as they
    are and only their sizes are known. ValueError with one sentence when the folder is
    half-written or mixed."""
    folder = Path(folder)
    if (folder / INCOMPLETE).exists():
        raise ValueError(f"{folder} was left half-written by an interrupted data.py (it still "
                         f"holds {INCOMPLETE}); run the data.py command that made it again")
    shards = _shard_files(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        return {p.name: (p.stat().st_size, None) for p in shards}
    files = manifest["files"]
    for path in shards:
        if path.name not in files:
            raise ValueError(f"{path} is not named in {folder / MANIFEST}, so the folder mixes "
                             f"datasets; remove it or prepare the data again")
    hash_all = sum(entry["bytes"] for entry in files.values()) <= hash_bytes
    for name, entry in files.items():
        path = folder / name
        size = path.stat().st_size if path.is_file() else None
        if size != entry["bytes"]:
            found = "is missing" if size is None else f"has {size} bytes"
            raise ValueError(f"{path} {found}, but the manifest records {entry['bytes']} bytes, "
                             f"so the folder mixes datasets; prepare the data again")
        if hash_all and sha256_file(path) != entry["sha256"]:
            raise ValueError(f"{path} differs from the file the manifest records (sha256 "
                             f"mismatch), so the folder mixes datasets; prepare the data again")
    return {name: (entry["bytes"], entry["sha256"]) for name, entry in files.items()}


def check_dataset(folder, full_hash=False):
    """Verify the folder as one dataset with train and val shards and return its fingerprint.

    Sizes are always checked; hashes when full_hash is set or the dataset is at most
    HASH_ALWAYS_BYTES: hashing FineWeb's 200 MB shards at every start would take minutes,
    so large datasets are hashed on request (`python data.py check DIR`). The fingerprint
    is the sha256 of the files' names, sizes and hashes (sizes only for a folder without a
    manifest): the same for the same content wherever it lives, different when any file
    differs or a shard is added, so --resume can compare datasets, not paths."""
    shard_paths(folder, "train"), shard_paths(folder, "val")
    files = verify_folder(folder, math.inf if full_hash else HASH_ALWAYS_BYTES)
    listing = json.dumps(sorted((name, size, digest) for name, (size, digest) in files.items()))
    return hashlib.sha256(listing.encode()).hexdigest()


def read_manifest(folder):
    """The folder's manifest {"files": {name: {"bytes", "sha256"}}, "source": …}, or None."""
    path = Path(folder) / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if not all(isinstance(e["bytes"], int) and isinstance(e["sha256"], str)
                   for e in manifest["files"].values()):
            raise ValueError("an entry lacks bytes or sha256")
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{path} is not a data.py manifest ({err}); delete the folder and "
                         f"prepare the data again") from None
    return manifest


def write_manifest(folder, source, names=None, known=None):
    """Record the files `names` of the dataset in folder (default: its shards, and the files
    the old manifest names that are still there) with their sizes and hashes.

    Files of the old manifest whose size still matches, and `known` ones ({name: entry}),
    are not hashed again, so recording one more FineWeb shard costs one hash."""
    folder = Path(folder)
    old = (read_manifest(folder) or {}).get("files", {})
    if names is None:
        names = {p.name for p in _shard_files(folder)} | {n for n in old if (folder / n).is_file()}
    entries = {n: e for n, e in old.items()
               if (folder / n).is_file() and (folder / n).stat().st_size == e["bytes"]}
    entries.update(known or {})
    files = {name: entries.get(name) or file_entry(folder / name) for name in sorted(names)}
    write_atomic(folder / MANIFEST, json.dumps({"files": files, "source": source}, indent=1))


def file_entry(path):
    """A manifest entry: the file's size and sha256."""
    return {"bytes": Path(path).stat().st_size, "sha256": sha256_file(path)}


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _shard_files(folder):
    """What the loader reads: `*train*.bin` and `*val*.bin`; each must be a file."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file, not a folder of shards; pass the folder that "
                         f"holds the *train*.bin and *val*.bin shards")
    paths = sorted(set(folder.glob("*train*.bin")) | set(folder.glob("*val*.bin")))
    for path in paths:
        if not path.is_file():
            raise ValueError(f"{path} is named like a shard but is not a file; "
                             f"rename or remove it")
    return paths


# ----------------------------------------------------------------------------- safe writes
class WriteError(OSError):
    """A file could not be written; the message is one sentence that names it."""


class DiskFullError(WriteError):
    """The disk (or quota) was full while writing a file."""


def write_atomic(path, data):
    """Write bytes or text (UTF-8) to path atomically: see open_atomic."""
    with open_atomic(path) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


@contextlib.contextmanager
def open_atomic(path):
    """A binary file that becomes `path` only when the block ends without an error.

    It is written under a unique temporary name in the same folder (so concurrent writers
    never share one), fsynced, renamed over `path`, and the folder fsynced: after a crash
    `path` holds either the old or the new content. On any error the temporary file is
    removed; an OSError while writing becomes a WriteError (DiskFullError when the disk is
    full) with one sentence, also when a library such as torch.save wraps it in its own."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        f = _WatchedFile(tmp, "xb")
    except OSError as err:
        raise _write_error(err, path) from None
    try:
        with f:
            yield f
            f.sync()
        _rename(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        if f.error is not None:
            raise _write_error(f.error, path) from None
        raise


class _WatchedFile(io.FileIO):
    """A file that writes all of every buffer and remembers the OSError of a failed write
    (so it can be told apart from other errors, and from a library's wrapping of it)."""
    error = None

    def write(self, data):
        view, done = memoryview(data).cast("B"), 0
        try:
            while done < len(view):                # os.write may write only a part
                done += os.write(self.fileno(), view[done:])
        except OSError as err:
            self.error = err
            raise
        return done

    def sync(self):
        try:
            os.fsync(self.fileno())
        except OSError as err:
            self.error = err
            raise


def _rename(source, target):
    """os.replace, then fsync the folder so the rename itself survives a crash."""
    try:
        os.replace(source, target)
        _fsync_folder(Path(target).parent)
    except OSError as err:
        raise _write_error(err, target) from None


def _fsync_folder(folder):
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_error(err, path):
    """The one-sentence WriteError (or DiskFullError) for an OSError while writing path."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        mount = Path(path).resolve().parent
        while not mount.exists() or not os.path.ismount(mount):
            mount = mount.parent
        error = DiskFullError(f"the disk is full: could not write {path} "
                              f"({shutil.disk_usage(mount).free:,} bytes free on {mount})")
    else:
        error = WriteError(f"could not write {path} ({err.strerror or err})")
    error.errno = err.errno
    return error


def make_folder(path):
    """mkdir -p, with one sentence when the path is (under) a file or not writable."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise WriteError(f"{path} is a file; give a folder") from None
    except OSError as err:
        raise _write_error(err, path) from None
    return path


# ----------------------------------------------------------------------------- writing a dataset
def write_dataset(out_dir, prefix, splits, source, extras=None, replace=True):
    """Write {split: tokens} as `{prefix}_{split}_{i:06d}.bin` shards of ≤ SHARD_TOKENS each,
    plus `extras` {name: bytes}, as one unit with its manifest. Returns the shard paths.

    Everything is first written complete into a staging folder. An empty out_dir is then
    replaced by it in one rename. An existing dataset is replaced under an INCOMPLETE marker:
    the marker is written, the new files are renamed over the old ones (stale ones removed),
    the manifest is written, the marker removed. A failure before that leaves the old
    dataset untouched; a kill during it leaves the marker, which every reader refuses.
    Shards of another source in out_dir are refused: the loader would mix them in. With
    replace=False an existing dataset is never touched: FileExistsError instead."""
    out_dir = make_folder(out_dir)
    fresh = not any(out_dir.iterdir())
    if not fresh:
        if not replace:
            raise FileExistsError(f"{out_dir} exists already; delete it to write it again")
        _refuse_foreign_shards(out_dir, prefix)
    staging = _staging_folder(out_dir.parent if fresh else out_dir, out_dir.name)
    try:
        names = _write_files(staging, prefix, splits, extras or {})
        write_manifest(staging, source, names)
        if fresh:
            _rename_folder(staging, out_dir)
        else:
            _swap_in(staging, out_dir, names, prefix)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return sorted(out_dir / name for name in names if name.endswith(".bin"))


def _write_files(folder, prefix, splits, extras):
    names = []
    for split, tokens in splits.items():
        for i, start in enumerate(range(0, max(len(tokens), 1), SHARD_TOKENS)):
            names.append(f"{prefix}_{split}_{i:06d}.bin")
            write_shard(folder / names[-1], tokens[start:start + SHARD_TOKENS])
    for name, content in extras.items():
        write_atomic(folder / name, content)
        names.append(name)
    return names


def _refuse_foreign_shards(out_dir, prefix):
    foreign = [p.name for p in _shard_files(out_dir) if not p.name.startswith(prefix + "_")]
    if foreign:
        raise ValueError(f"{out_dir} already holds other shards ({foreign[0]}, …) that the "
                         f"loader would mix in; choose another --out folder or delete them")


def _staging_folder(parent, name):
    """A new, uniquely named folder `.{name}.{pid}.{random}.staging` in parent; staging
    folders there of processes that no longer run (killed writers) are removed first."""
    make_folder(parent)
    for old in parent.glob(f".{name}.*.staging"):
        pid = old.name.rsplit(".", 3)[-3]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return make_folder(parent / f".{name}.{os.getpid()}.{secrets.token_hex(4)}.staging")


def _running(pid):
    try:
        os.kill(pid, 0)                        # signal 0 only asks whether it exists
    except ProcessLookupError:
        return False
    except PermissionError:                    # it exists, run by another user
        pass
    return True


def _rename_folder(staging, out_dir):
    """Rename the complete staging folder to out_dir; FileExistsError if out_dir was
    filled meanwhile (another writer of the same dataset finished first)."""
    try:
        os.rename(staging, out_dir)
    except OSError as err:
        if err.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise FileExistsError(f"{out_dir} was written by another process meanwhile; "
                                  f"run the command again") from None
        raise _write_error(err, out_dir) from None
    _fsync_folder(out_dir.parent)


def _swap_in(staging, out_dir, names, prefix):
    write_atomic(out_dir / INCOMPLETE, "data.py is replacing this dataset; if this file stays, "
                                       "the replacement was interrupted: run it again\n")
    (out_dir / MANIFEST).unlink(missing_ok=True)
    for name in names:
        _rename(staging / name, out_dir / name)
    for stale in set(out_dir.glob(f"{prefix}_*.bin")) - {out_dir / name for name in names}:
        stale.unlink()
    _rename(staging / MANIFEST, out_dir / MANIFEST)
    (out_dir / INCOMPLETE).unlink()
    _fsync_folder(out_dir)
    staging.rmdir()


def _split_train_val(tokens, val_fraction, align=1):
    """Train = the first part, val = the last ⌈val_fraction·n⌉ tokens (rounded to `align`)."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"--val_fraction must lie strictly between 0 and 1, got {val_fraction}")
    n_val = -(-int(np.ceil(val_fraction * len(tokens))) // align) * align
    if n_val >= len(tokens):
        raise ValueError(f"{len(tokens)} tokens are too few to split into train and val "
                         f"with --val_fraction {val_fraction}; provide more data")
    return {"train": tokens[:-n_val], "val": tokens[-n_val:]}


# ----------------------------------------------------------------------------- GPT-2 text
def gpt2_encoding():
    """tiktoken's GPT-2 encoding (50257 tokens, <|endoftext|> = EOT = 50256).

    tiktoken is imported here, not at the top: reading shards needs no tokenizer. It
    downloads vocab.bpe and encoder.json on first use and caches them in
    TIKTOKEN_CACHE_DIR under the sha1 of their URL; offline, that cache must be seeded."""
    try:
        import tiktoken
    except ImportError:
        raise RuntimeError("tokenizing text needs tiktoken, which is not installed; "
                           "run `pip install tiktoken`") from None
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


def read_texts(files):
    """The files' text (UTF-8), each checked to exist and to hold more than whitespace."""
    texts = []
    for f in files:
        path = Path(f)
        if not path.is_file():
            raise FileNotFoundError(f"text file {path} does not exist; check the path")
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as err:
            raise ValueError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start}); "
                             f"convert it to UTF-8 first") from None
        if not texts[-1].strip():
            raise ValueError(f"{path} is empty (no text to tokenize); remove it from the list")
    return texts


def tokenize_texts(texts, workers=None):
    """All texts as one token stream: each is one document, [EOT] + its tokens.

    Large texts are cut at line ends (text_pieces) and the pieces tokenized by
    a pool of processes; the result is identical to tokenizing each text whole."""
    pieces, starts = [], []                # starts[k]: is pieces[k] the first of a document?
    for text in texts:
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
    texts = read_texts(files)
    return _write_text_dataset(files, texts, out_dir, val_fraction, workers)


def text_dataset(files, cache_root="data/text", val_fraction=VAL_FRACTION, workers=None):
    """The shard folder of these text files: tokenized on first use, reused after that.

    The folder, `cache_root/{first file's stem}-{key}`, is named by a key: the sha256 of
    the texts (in order), the tokenizer and val_fraction. The same text finds the same
    folder, checked before use; edited text gets a new folder, hence another dataset
    fingerprint, which a resumed run compares. A folder whose manifest records another key
    than its name (changed under the cache) is refused."""
    texts = read_texts(files)
    key = _text_key(texts, val_fraction)
    folder = Path(cache_root) / f"{Path(files[0]).stem}-{key[:16]}"
    if not (folder / MANIFEST).exists():       # new, or another run is writing it now
        try:
            _write_text_dataset(files, texts, folder, val_fraction, workers, replace=False)
        except FileExistsError:
            pass                               # a concurrent run wrote the same folder
    recorded = (read_manifest(folder) or {}).get("source", {}).get("key")
    if recorded != key:
        raise ValueError(f"the cached dataset {folder} does not hold the tokens of "
                         f"{', '.join(map(str, files))} (its manifest records other text); "
                         f"delete {folder} and run again")
    check_dataset(folder)
    return folder


def _text_key(texts, val_fraction):
    digests = [hashlib.sha256(text.encode("utf-8")).hexdigest() for text in texts]
    description = json.dumps({"texts": digests, "tokenizer": "gpt2", "val_fraction": val_fraction})
    return hashlib.sha256(description.encode()).hexdigest()


def _write_text_dataset(files, texts, out_dir, val_fraction, workers, replace=True):
    t0 = time.perf_counter()
    tokens = tokenize_texts(texts, workers)
    seconds = time.perf_counter() - t0
    source = {"kind": "text", "files": [str(f) for f in files], "tokenizer": "gpt2",
              "val_fraction": val_fraction, "key": _text_key(texts, val_fraction)}
    written = write_dataset(out_dir, "text", _split_train_val(tokens, val_fraction), source,
                            replace=replace)
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
    a document boundary), and is uniform. A causal model without absolute positions (RoPE
    is relative) has the same hidden state at every position of such a row, so it cannot
    single out that last position: its floor is the loss of the best constant prediction,
    above 0 (analyze.py derives it)."""
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
    extras = {}
    if task == "repeat":
        tokens = synthesize_repeat(vocab, n_tokens, seq_len, seed)
        summary = "the next token is the current one except at each sequence's end"
    elif task == "markov":
        P = markov_transition(vocab, seed)
        pi = markov_stationary(P)
        tokens = synthesize_markov(P, n_tokens, seed)
        extras = {"markov_transition.npy": _npy_bytes(P), "markov_stationary.npy": _npy_bytes(pi)}
        summary = f"entropy rate (best possible loss) {markov_entropy_rate(P, pi):.4f} nats"
    else:
        raise ValueError(f"unknown synthetic task {task!r}; choose 'repeat' or 'markov'")
    source = {"kind": task, "vocab": vocab, "tokens": n_tokens, "seed": seed, "seq_len": seq_len,
              "val_fraction": val_fraction}
    written = write_dataset(out_dir, task, _split_train_val(tokens, val_fraction, align=seq_len),
                            source, extras)
    print(f"{task}: {len(tokens):,} tokens, vocab {vocab}, {summary}; "
          f"wrote {', '.join(map(str, written))}")
    return written


def _npy_bytes(array):
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


# ----------------------------------------------------------------------------- FineWeb download
def shards_needed(tokens, dataset=DEFAULT_DATASET):
    """Train shards of SHARD_TOKENS a run of `tokens` training tokens reads, at most all the
    dataset holds (a longer run wraps around): the paper's 13.1B tokens need 132 of
    FineWeb100B; FineWeb10B has only 103, so it would repeat about a quarter of its data."""
    return min(math.ceil(tokens / SHARD_TOKENS), FINEWEB_DATASETS[dataset][1])


def fineweb_shard_names(train_shards):
    """fineweb_val_000000.bin, then fineweb_train_000001‥N.bin (the datasets count from 1)."""
    return ["fineweb_val_000000.bin"] + [f"fineweb_train_{i:06d}.bin"
                                         for i in range(1, train_shards + 1)]


def fineweb_base_url(dataset=DEFAULT_DATASET, base_url=None):
    """Where the shards live: base_url, else $FINEWEB_BASE_URL, else Hugging Face."""
    if dataset not in FINEWEB_DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; "
                         f"choose one of {', '.join(FINEWEB_DATASETS)}")
    return (base_url or os.environ.get(BASE_URL_ENV)
            or f"https://huggingface.co/datasets/{FINEWEB_DATASETS[dataset][0]}/resolve/main")


def fetch_fineweb(folder=DEFAULT_DATA, dataset=DEFAULT_DATASET, train_shards=8, base_url=None):
    """Download the val shard and train shards 1‥N of a FineWeb dataset into folder.

    Shards the manifest records with their size are kept; shards there but not recorded
    (fetched by an older data.py or another tool) are validated, hashed and recorded. An
    interrupted download continues from its `.part` file; each shard is validated (and its
    sha256 compared when the server states it) before it is renamed into place and
    recorded in the manifest, so the folder is one consistent dataset at every moment."""
    url = fineweb_base_url(dataset, base_url).rstrip("/")
    available = FINEWEB_DATASETS[dataset][1]
    if not 1 <= train_shards <= available:
        raise ValueError(f"{dataset} has {available} train shards; ask for 1 to {available}, "
                         f"not {train_shards}")
    folder = make_folder(folder)
    _refuse_foreign_shards(folder, "fineweb")
    names = fineweb_shard_names(train_shards)
    recorded = (read_manifest(folder) or {}).get("files", {})
    source = {"kind": "fineweb", "dataset": dataset}
    for k, name in enumerate(names, 1):
        path, label = folder / name, f"[{k}/{len(names)}] {name}"
        entry = recorded.get(name)
        if entry and path.is_file() and path.stat().st_size == entry["bytes"]:
            continue
        if path.is_file() and entry is None and _valid_shard(path):
            print(f"{label}: already here, recorded in the manifest")
            write_manifest(folder, source)
        else:
            digest = download_shard(f"{url}/{name}", path, label=label)
            entry = {"bytes": path.stat().st_size, "sha256": digest}
            write_manifest(folder, source, known={name: entry})
    tokens = sum(shard_length(folder / name) for name in names[1:])
    print(f"{folder}: {dataset} val shard and {train_shards} train shards ({tokens:,} tokens)")
    return [folder / name for name in names]


def _valid_shard(path):
    try:
        shard_length(path)
        return True
    except ValueError:
        path.unlink()                          # a bad complete file: fetch it again
        return False


def download_shard(url, path, label=""):
    """Fetch one shard through `path.part`, resuming with HTTP Range, then validate and rename.

    A transfer that breaks off after making progress is resumed up to DOWNLOAD_RETRIES
    times. A 206 reply must continue exactly where the part file ends (its Content-Range
    says so). Where the server states the file's sha256 (the Hugging Face hub's
    X-Linked-Etag, or an ETag of 64 hex digits), the download must match it. A shard that
    fails validation is deleted, so no half or corrupt file remains under its name.
    Returns the shard's sha256."""
    part = path.with_name(path.name + ".part")
    expected = None
    for attempt in range(DOWNLOAD_RETRIES + 1):
        have = _size(part)
        try:
            total, announced = _transfer(url, part, have, label)
        except WriteError:
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
        n, digest = shard_length(part), sha256_file(part)
        if total is not None and _size(part) != total:
            raise ValueError(f"{part} has {_size(part)} bytes but the server announced {total}")
        if expected and digest != expected:
            raise ValueError(f"its sha256 differs from the {expected} the server announced")
    except ValueError as err:
        part.unlink()
        raise ValueError(f"the download of {url} is corrupt and was deleted ({err}); "
                         f"run the command again, or check --base_url") from None
    _rename(part, path)
    print(f"{label}: {n:,} tokens ok")
    return digest


def _size(path):
    return path.stat().st_size if path.exists() else 0


class _RecordRedirects(urllib.request.HTTPRedirectHandler):
    """Keeps the headers of each redirect: the hub states an LFS file's sha256 on its 302."""

    def __init__(self):
        self.headers = []

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        self.headers.append(headers)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _transfer(url, part, have, label):
    """Append url's bytes from offset `have` to `part`.

    Returns (the full size if known, the sha256 the server states or None)."""
    request = urllib.request.Request(url, headers={"User-Agent": "data.py"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    redirects = _RecordRedirects()
    try:
        response = urllib.request.build_opener(redirects).open(request, timeout=DOWNLOAD_TIMEOUT_S)
    except urllib.error.HTTPError as err:
        if err.code == 416:                    # the part already holds the whole file
            return have, None
        raise
    with response:
        announced = _announced_sha256(redirects.headers + [response.headers])
        resumed = response.status == 206
        total = _resumed_total(url, response.headers, have) if resumed else \
            _int_or_none(response.headers.get("Content-Length"))
        done = have if resumed else 0
        t0, last, start = time.perf_counter(), 0.0, done
        try:
            f = _WatchedFile(part, "ab" if resumed else "wb")
        except OSError as err:
            raise _write_error(err, part) from None
        with f:
            try:
                while chunk := response.read(1 << 20):
                    f.write(chunk)
                    done += len(chunk)
                    now = time.perf_counter() - t0
                    if now - last > 0.5 or done == total:
                        last = now
                        _print_progress(label, done, total, (done - start) / max(now, 1e-9))
            except OSError:                    # the disk's, or the network's (retried)
                if f.error is not None:
                    raise _write_error(f.error, part) from None
                raise
            finally:
                print()
    return total, announced


def _resumed_total(url, headers, have):
    """The full size from a 206 reply's `Content-Range: bytes START-END/TOTAL`, after
    checking that START is where the part file ends; ValueError if it is not."""
    match = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", headers.get("Content-Range", "").strip())
    if match is None or int(match[1]) != have:
        raise ValueError(f"{url} answered a request for its bytes from {have} with "
                         f"Content-Range {headers.get('Content-Range')!r}; the reply was refused "
                         f"(the part file is kept): run again, or use another --base_url")
    return int(match[3]) if match[3] != "*" else None


def _announced_sha256(header_sets):
    """The sha256 a server states: X-Linked-Etag first, else ETag, when 64 hex digits."""
    for field in ("X-Linked-Etag", "ETag"):
        for headers in header_sets:
            value = (headers.get(field) or "").removeprefix("W/").strip('"').lower()
            if re.fullmatch(r"[0-9a-f]{64}", value):
                return value
    return None


def _int_or_none(text):
    return int(text) if text is not None else None


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


# ----------------------------------------------------------------------------- command line
def _number(kind, rule, test):
    """An argparse type: kind(text) that passes test, else one sentence giving the rule."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; give {rule}") from None
        if not test(value):
            raise argparse.ArgumentTypeError(f"{text} is invalid; give {rule}")
        return value
    return parse


positive_int = _number(int, "an integer > 0", lambda v: v > 0)
non_negative_int = _number(int, "an integer >= 0", lambda v: v >= 0)
positive_float = _number(float, "a finite number > 0", lambda v: math.isfinite(v) and v > 0)
non_negative_float = _number(float, "a finite number >= 0", lambda v: math.isfinite(v) and v >= 0)
fraction = _number(float, "a number strictly between 0 and 1", lambda v: 0 < v < 1)


def parse_args(argv=None):
    examples = [line for line in __doc__.splitlines() if line.lstrip().startswith("python ")]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="examples:\n" + "\n".join(examples),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fineweb", help="download pre-tokenized GPT-2 FineWeb shards")
    f.add_argument("--shards", type=positive_int, default=8, help="train shards of 100M tokens")
    f.add_argument("--dataset", choices=list(FINEWEB_DATASETS), default=DEFAULT_DATASET)
    f.add_argument("--out", help="output folder (default data/DATASET)")
    f.add_argument("--base_url",
                   help=f"download location (default ${BASE_URL_ENV}, else Hugging Face)")
    t = sub.add_parser("text", help="tokenize UTF-8 text files (one document per file)")
    t.add_argument("files", nargs="+")
    t.add_argument("--out", required=True)
    t.add_argument("--val_fraction", type=fraction, default=VAL_FRACTION)
    t.add_argument("--workers", type=positive_int, default=None,
                   help="processes (default: all cores)")
    s = sub.add_parser("synthetic", help="generate a synthetic language")
    s.add_argument("--task", choices=["repeat", "markov"], required=True)
    s.add_argument("--vocab", type=positive_int, required=True)
    s.add_argument("--tokens", type=positive_int, required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--seed", type=non_negative_int, default=0)
    s.add_argument("--seq_len", type=positive_int, default=64,
                   help="sequence length (use train.py's)")
    s.add_argument("--val_fraction", type=fraction, default=VAL_FRACTION)
    c = sub.add_parser("check", help="verify a dataset folder, every hash, and print its "
                                     "fingerprint (writes a manifest if it has none)")
    c.add_argument("folder")
    b = sub.add_parser("bench", help="measure the loader's read rate")
    b.add_argument("--data", default=DEFAULT_DATA)
    b.add_argument("--batch_size", type=positive_int, default=64)
    b.add_argument("--seq_len", type=positive_int, default=1024)
    b.add_argument("--steps", type=positive_int, default=200)
    return p.parse_args(argv)


def check_command(folder):
    """`data.py check`: record a folder without a manifest, then verify every hash."""
    if not Path(folder).is_dir():
        raise FileNotFoundError(f"{folder} is not a folder; give a dataset folder")
    if read_manifest(folder) is None:
        verify_folder(folder)
        write_manifest(folder, {"kind": "recorded by data.py check"})
        print(f"{folder}: had no manifest; wrote {Path(folder) / MANIFEST}")
    print(f"{folder}: ok, fingerprint {check_dataset(folder, full_hash=True)}")


def main(argv=None):
    args = parse_args(argv)
    try:
        if args.command == "fineweb":
            fetch_fineweb(args.out or f"data/{args.dataset}", args.dataset, args.shards,
                          args.base_url)
        elif args.command == "text":
            prepare_text(args.files, args.out, args.val_fraction, args.workers)
        elif args.command == "synthetic":
            prepare_synthetic(args.task, args.vocab, args.tokens, args.out, args.seed,
                              args.seq_len, args.val_fraction)
        elif args.command == "check":
            check_command(args.folder)
        else:
            bench_loader(args.data, args.batch_size, args.seq_len, args.steps)
    except (ValueError, RuntimeError, OSError) as err:  # user-caused: one sentence, no traceback
        raise SystemExit(f"data.py {args.command}: error: {err}") from None


if __name__ == "__main__":
    main()

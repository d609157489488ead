"""Token shards on disk: the format, the dataset folder, the loader, safe writes.

Every source ends in the same format, the llm.c / modded-nanogpt shard, so pre-tokenized
shards from elsewhere work as they are:

    bytes 0‥1023   header, 256 little-endian int32: [20240520 (magic), 1 (version), n, 0, …]
    bytes 1024‥    n tokens, little-endian uint16

A dataset is a folder of `*train*.bin` and `*val*.bin` shards plus `manifest.json`, which
names every file of the dataset with its size and sha256 and is written last, so a reader
can tell a complete dataset from a mixed or half-written one (`check_dataset`). A new
dataset is written beside the old one and swapped in (`write_dataset`), so a reader never
sees half of one. prepare.py makes datasets from a source (FineWeb, text, synthetic tasks);
this file reads, checks and writes them (`python data.py --help`):

    python data.py check data/mytext                  verify every hash, print the fingerprint
    python data.py bench --data DIR                   how fast the loader reads

`ShardLoader` cuts the token stream of a split into (B, T+1) windows, x = window[:-1] and
y = window[1:]; with world_size W, step s of rank r reads the block that starts at
position s·W·B·T + r·B·T, so the ranks of one step read disjoint, adjacent blocks and
together read exactly what one process with batch W·B reads. Its position is a plain dict
of ints (`state_dict`), so a resumed run continues with exactly the next batch.

This file imports nothing of its project (torch, numpy and the standard library), so it
can be copied alone.
"""
import argparse
import contextlib
import errno
import hashlib
import io
import json
import math
import os
import secrets
import shutil
import time
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
PREPARE_HINT = ("`python prepare.py fineweb --shards 8 --out {dir}` (GPT-2 FineWeb) or "
                "`python prepare.py text FILES --out {dir}` (your own text)")


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
                         f"(uint16 tokens) is supported; prepare the data again with prepare.py")
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
                         f"holds {INCOMPLETE}); run the prepare.py command that made it again")
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
        f = WatchedFile(tmp, "xb")
    except OSError as err:
        raise write_error(err, path) from None
    try:
        with f:
            yield f
            f.sync()
        rename(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        if f.error is not None:
            raise write_error(f.error, path) from None
        raise


class WatchedFile(io.FileIO):
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


def rename(source, target):
    """os.replace, then fsync the folder so the rename itself survives a crash."""
    try:
        os.replace(source, target)
        _fsync_folder(Path(target).parent)
    except OSError as err:
        raise write_error(err, target) from None


def _fsync_folder(folder):
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_error(err, path):
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
        raise write_error(err, path) from None
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
        refuse_foreign_shards(out_dir, prefix)
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


def refuse_foreign_shards(out_dir, prefix):
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
        raise write_error(err, out_dir) from None
    _fsync_folder(out_dir.parent)


def _swap_in(staging, out_dir, names, prefix):
    write_atomic(out_dir / INCOMPLETE, "data.py is replacing this dataset; if this file stays, "
                                       "the replacement was interrupted: run it again\n")
    (out_dir / MANIFEST).unlink(missing_ok=True)
    for name in names:
        rename(staging / name, out_dir / name)
    for stale in set(out_dir.glob(f"{prefix}_*.bin")) - {out_dir / name for name in names}:
        stale.unlink()
    rename(staging / MANIFEST, out_dir / MANIFEST)
    (out_dir / INCOMPLETE).unlink()
    _fsync_folder(out_dir)
    staging.rmdir()

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


def command_parser(doc):
    """A parser of subcommands, described by doc's first paragraph; its `python …` lines are
    the examples. Returns (parser, subparsers)."""
    examples = [line for line in doc.splitlines() if line.lstrip().startswith("python ")]
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                epilog="examples:\n" + "\n".join(examples),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    return p, p.add_subparsers(dest="command", required=True)


def parse_args(argv=None):
    p, sub = command_parser(__doc__)
    c = sub.add_parser("check", help="verify a dataset folder, every hash, and print its "
                                     "fingerprint (writes a manifest if it has none)")
    c.add_argument("folder")
    b = sub.add_parser("bench", help="measure the loader's read rate")
    b.add_argument("--data", required=True, help="a dataset folder")
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
        if args.command == "check":
            check_command(args.folder)
        else:
            bench_loader(args.data, args.batch_size, args.seq_len, args.steps)
    except (ValueError, RuntimeError, OSError) as err:  # user-caused: one sentence, no traceback
        raise SystemExit(f"data.py {args.command}: error: {err}") from None


if __name__ == "__main__":
    main()

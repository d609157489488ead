"""Datasets (shards and a manifest) checked and written whole; atomic writes.

    python store.py check data/mytext               verify every hash, print the fingerprint
    python store.py bench --data DIR                how fast data.py's loader reads
"""
import argparse
import contextlib
import errno
import fcntl
import hashlib
import io
import json
import math
import os
import re
import shutil
import time
from pathlib import Path

import torch

import data

MANIFEST = "manifest.json"            # each file's bytes, sha256 (and max_token); written last
NEW_DATASET = ".new_dataset"          # a complete replacement being moved in (_move_in)
HASH_ALWAYS_BYTES = 256 << 20         # datasets up to this size are hashed on every check


def check_dataset(folder, hash_bytes=HASH_ALWAYS_BYTES):
    """Verify the folder as one dataset (hashing it if ≤ hash_bytes); returns a fingerprint of its
    files' names, sizes and sha256s (sizes alone with no manifest): content, not paths."""
    folder = Path(folder)
    if (folder / NEW_DATASET).is_dir():        # its writer was killed: finish what it began
        try:
            with _writer_lock(folder, wait=True):
                _move_in(folder)
        except OSError as err:
            raise ValueError(f"{folder} is half-way through a replacement that a stopped "
                             f"prepare.py began and could not be finished here ({err}); run "
                             f"`python store.py check {folder}` as one who may write it") from None
    shards = data.shard_paths(folder, "train") + data.shard_paths(folder, "val")
    for path in shards:
        data.shard_length(path, headerless=True)  # nanoGPT's bare uint16 files are a dataset too
    manifest = read_manifest(folder)
    files = {p.name: {"bytes": p.stat().st_size, "sha256": None} for p in shards}
    if manifest is not None:
        files = manifest["files"]
        hash_all = sum(e["bytes"] for e in files.values()) <= hash_bytes
        for path in sorted(set(shards) | {folder / name for name in files}):
            entry = files.get(path.name)
            size = path.stat().st_size if path.is_file() else None
            if entry is None:
                problem = f"is not named in {folder / MANIFEST}"
            elif size != entry["bytes"]:
                found = "is missing" if size is None else f"has {size} bytes"
                problem = f"{found}, but the manifest records {entry['bytes']} bytes"
            elif hash_all and file_entry(path)["sha256"] != entry["sha256"]:
                problem = "differs from the file the manifest records (sha256 mismatch)"
            else:
                continue
            raise ValueError(f"{path} {problem}, so the folder mixes datasets; prepare it again")
    listing = sorted((name, e["bytes"], e["sha256"]) for name, e in files.items())
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()


def check_vocab(folder, vocab_size):
    """ValueError if a shard holds a token id ≥ vocab_size: the manifest's record, else read."""
    files = (read_manifest(folder) or {"files": {}})["files"]
    for path in shard_files(folder):
        top = files.get(path.name, {}).get("max_token")
        top = data.max_token(path) if top is None else top
        if top >= vocab_size:
            raise ValueError(f"{path} holds token id {top}, outside the model's vocabulary "
                             f"of {vocab_size}; raise --vocab_size or use data made for it")


def read_manifest(folder):
    """The folder's manifest {"files": {name: {"bytes", "sha256", …}}, "source": …}, or None."""
    path = Path(folder) / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        if not all(isinstance(e["bytes"], int) and isinstance(e["sha256"], str)
                   for e in manifest["files"].values()):
            raise ValueError("an entry lacks bytes or sha256")
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{path} is not a dataset manifest ({err}); delete the folder and "
                         f"prepare the data again") from None
    return manifest


def write_manifest(folder, source, names=None, known=None):
    """Record the files `names` (default: the shards and the old manifest's files still there);
    old complete entries of the same size, and `known` ones {name: entry}, are not read again."""
    folder = Path(folder)
    old = (read_manifest(folder) or {}).get("files", {})
    if names is None:
        names = {p.name for p in shard_files(folder)} | {n for n in old if (folder / n).is_file()}
    entries = {n: e for n, e in old.items() if (folder / n).is_file() and
               (folder / n).stat().st_size == e["bytes"] and _complete(n, e)} | (known or {})
    files = {name: entries.get(name) or file_entry(folder / name) for name in sorted(names)}
    write_atomic(folder / MANIFEST, json.dumps({"files": files, "source": source}, indent=1))


def _complete(name, entry):
    return "max_token" in entry or not name.endswith(".bin")


def file_entry(path, shard=None):
    """{bytes, sha256} of the file, and for a shard (a .bin unless told) its max_token."""
    with open(path, "rb") as f:
        entry = {"bytes": os.fstat(f.fileno()).st_size,
                 "sha256": hashlib.file_digest(f, "sha256").hexdigest()}
    if shard or str(path).endswith(".bin"):
        entry["max_token"] = data.max_token(path)
    return entry


def shard_files(folder):
    paths = set()
    for split in ("train", "val"):
        with contextlib.suppress(FileNotFoundError):  # a split with no shards is no error here
            paths.update(data.shard_paths(folder, split))
    return sorted(paths)


class WriteError(OSError):
    """A file could not be written; the message is one sentence that names it."""


class DiskFullError(WriteError):
    """The disk (or quota) was full while writing a file."""


def write_atomic(path, content):  # bytes, or text as UTF-8: see open_atomic
    with open_atomic(path) as f:
        f.write(content.encode("utf-8") if isinstance(content, str) else content)


@contextlib.contextmanager
def open_atomic(path):
    """A binary file that becomes `path` (temp name, fsync, rename) if the block succeeds."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    f = WatchedFile.opened(tmp, "xb", path)
    try:
        with f:
            yield f
            f.watched(os.fsync, f.fileno())
        rename(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        if f.error is not None:
            raise write_error(f.error, path) from None
        raise


class WatchedFile(io.FileIO):
    """A file that writes all of every buffer (os.write may write a part); failures: WriteError."""
    error = None                    # the failed write's OSError: a library may wrap the WriteError

    @classmethod
    def opened(cls, path, mode, named=None):  # a failed open too is a WriteError, about `named`
        try:
            return cls(path, mode)
        except OSError as err:
            raise write_error(err, named or path) from None

    def write(self, content):
        view, done = memoryview(content).cast("B"), 0
        while done < len(view):
            done += self.watched(os.write, self.fileno(), view[done:])
        return done

    def watched(self, call, *args):
        try:
            return call(*args)
        except OSError as err:
            self.error = err
            raise write_error(err, self.name) from None


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
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        mount = next(p for p in Path(path).resolve().parents if os.path.ismount(p))
        return DiskFullError(f"the disk is full: could not write {path} "
                             f"({shutil.disk_usage(mount).free:,} bytes free on {mount})")
    return WriteError(f"could not write {path} ({err.strerror or err})")


def make_folder(path):
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise WriteError(f"{path} is a file; give a folder") from None
    except OSError as err:
        raise write_error(err, path) from None
    return path


def write_dataset(out_dir, prefix, splits, source, extras=None, replace=True):
    """Write {split: tokens} as `{prefix}_{split}_{i:06d}.bin` shards and `extras` {name: bytes}
    as one dataset; returns the shards. replace=False keeps one there, after a concurrent writer.
    The new dataset is written in a staging folder inside out_dir, which one rename makes
    NEW_DATASET: a kill before that rename leaves out_dir as it was, a kill after it the new
    dataset, which _move_in moves in (here, or in the next check_dataset); files there that are
    neither shards nor named like the new dataset's stay."""
    out_dir = make_folder(out_dir)
    with _writer_lock(out_dir, wait=not replace):
        _move_in(out_dir)                      # what a killed writer left, before anything else
        staging = _staging_folder(out_dir)
        try:
            if not replace and any(path != staging for path in out_dir.iterdir()):
                raise FileExistsError(f"{out_dir} exists already; delete it to write it again")
            refuse_foreign_shards(out_dir, prefix)
            names = _write_files(staging, prefix, splits, extras or {})
            write_manifest(staging, source, names)
            rename(staging, out_dir / NEW_DATASET)  # the commit; the lock keeps writers out
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        _move_in(out_dir)
    return sorted(out_dir / name for name in names if name.endswith(".bin"))


@contextlib.contextmanager
def _writer_lock(folder, wait):
    """An exclusive flock on the folder itself (no lock file), held while the block runs."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise FileExistsError(f"another process is writing a dataset into {folder} right "
                                  f"now, so this one was not written; run the command again "
                                  f"when it has finished") from None
        yield
    finally:
        os.close(fd)                            # releases the lock


def _write_files(folder, prefix, splits, extras):
    names = []
    for split, tokens in splits.items():
        for i, start in enumerate(range(0, max(len(tokens), 1), data.SHARD_TOKENS)):
            names.append(f"{prefix}_{split}_{i:06d}.bin")
            try:
                data.write_shard(folder / names[-1], tokens[start:start + data.SHARD_TOKENS])
            except OSError as err:             # staging is removed: one sentence suffices
                raise write_error(err, folder / names[-1]) from None
    for name, content in extras.items():
        write_atomic(folder / name, content)
    return names + list(extras)


def refuse_foreign_shards(out_dir, prefix):
    if foreign := [p.name for p in shard_files(out_dir) if not p.name.startswith(prefix + "_")]:
        raise ValueError(f"{out_dir} already holds other shards ({foreign[0]}, …) that the "
                         f"loader would mix in; choose another --out folder or delete them")


def _staging_folder(folder):
    """A new folder `.{name}.{pid}.{random}.staging` in the folder; those of killed writers go."""
    for old in folder.glob(f".{folder.name}.*.staging"):
        with contextlib.suppress(PermissionError, ValueError):  # another user's; not a pid
            try:
                os.kill(int(old.name.rsplit(".", 3)[-3]), 0)  # signal 0: does the writer run?
            except ProcessLookupError:
                shutil.rmtree(old, ignore_errors=True)
    return make_folder(folder / f".{folder.name}.{os.getpid()}.{os.urandom(4).hex()}.staging")


def _move_in(folder):
    """Finish a replacement: NEW_DATASET's files renamed over the old ones, old shards it lacks
    removed, its manifest renamed last, NEW_DATASET removed. A step done is skipped when this
    runs again, so a kill at any moment (of this too) leaves what the next call finishes."""
    new = folder / NEW_DATASET
    if not new.is_dir():
        return
    if (new / MANIFEST).exists():              # gone: every file before it is moved already
        names = set(read_manifest(new)["files"])
        for name in names:
            if (new / name).exists():          # not moved in yet
                rename(new / name, folder / name)
        for stale in set(shard_files(folder)) - {folder / name for name in names}:
            stale.unlink()
        rename(new / MANIFEST, folder / MANIFEST)
    new.rmdir()
    _fsync_folder(folder)


def number(kind, rule, test):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; give {rule}") from None
        if not test(value):
            raise argparse.ArgumentTypeError(f"{text} is invalid; give {rule}")
        return value
    return parse


positive_int = number(int, "an integer > 0", lambda v: v > 0)
non_negative_int = number(int, "an integer >= 0", lambda v: v >= 0)
positive_float = number(float, "a finite number > 0", lambda v: math.isfinite(v) and v > 0)
non_negative_float = number(float, "a finite number >= 0", lambda v: math.isfinite(v) and v >= 0)
fraction = number(float, "a number strictly between 0 and 1", lambda v: 0 < v < 1)
seed = number(int, "an integer from 0 to 2^64 − 1", lambda v: 0 <= v < 2 ** 64)  # torch's range
device = number(str, "cpu, or cuda or cuda:N where torch sees a GPU", lambda v: v == "cpu" or (
    re.fullmatch(r"cuda(:\d+)?", v) is not None and torch.cuda.is_available()))


def command_parser(doc):
    """(parser, subparsers): described by doc's first paragraph, its `python …` lines examples."""
    examples = [line for line in doc.splitlines() if line.lstrip().startswith("python ")]
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                epilog="examples:\n" + "\n".join(examples),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    return p, p.add_subparsers(dest="command", required=True)


def parse_args(argv=None):
    p, sub = command_parser(__doc__)
    sub.add_parser("check", help="verify a dataset folder, every hash, and print its fingerprint "
                   "(writes a manifest if it has none)").add_argument("folder")
    b = sub.add_parser("bench", help="measure the loader's read rate")
    b.add_argument("--data", required=True, help="a dataset folder")
    b.add_argument("--batch_size", type=positive_int, default=64)
    b.add_argument("--seq_len", type=positive_int, default=1024)
    b.add_argument("--steps", type=positive_int, default=200)
    b.add_argument("--data_order", choices=data.ORDERS, default="sequential")
    return p.parse_args(argv)


def check_command(args):
    folder = args.folder
    check_dataset(folder, hash_bytes=math.inf)  # nothing is recorded that a reader refuses
    manifest = read_manifest(folder)
    if manifest is None or not all(_complete(*item) for item in manifest["files"].items()):
        write_manifest(folder, manifest["source"] if manifest else {"kind": "store.py check"})
        done = "had no manifest" if manifest is None else "recorded its shards' largest token ids"
        print(f"{folder}: {done}; wrote {Path(folder) / MANIFEST}")
    print(f"{folder}: ok, fingerprint {check_dataset(folder, hash_bytes=0)}")


def bench_loader(args):
    B, T, steps = args.batch_size, args.seq_len, args.steps
    loader = data.ShardLoader(args.data, B, T, order=args.data_order)
    loader.next_batch()                        # touch the first shard
    t0 = time.perf_counter()
    for _ in range(steps):
        loader.next_batch()
    rate = steps * B * T / (time.perf_counter() - t0)
    print(f"loader: {rate:,.0f} tokens/s ({steps} batches of {B}×{T} from {args.data} train, "
          f"{args.data_order} order)")


def main(argv=None):
    args = parse_args(argv)
    try:
        {"check": check_command, "bench": bench_loader}[args.command](args)
    except (ValueError, RuntimeError, OSError) as err:  # user-caused: one sentence, no traceback
        raise SystemExit(f"store.py {args.command}: error: {err}") from None


if __name__ == "__main__":
    main()

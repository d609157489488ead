"""Token shards: the format, the DDP-aware loader, validation batches. Copy this file alone.

Every source ends in the llm.c / modded-nanogpt shard, so pre-tokenized shards from
elsewhere work as they are:

    bytes 0‥1023   header, 256 little-endian int32: [20240520 (magic), 1 (version), n, 0, …]
    bytes 1024‥    n tokens, little-endian uint16

A split is the sorted `*train*.bin` (or `*val*.bin`) shards of a folder. `ShardLoader` cuts
its token stream into (B, T+1) windows, x = window[:-1] and y = window[1:]; with world size
W, step s of rank r reads the block that starts at position s·W·B·T + r·B·T, so the ranks of
one step read disjoint, adjacent blocks and together read exactly what one process with
batch W·B reads. Its position is a plain dict of ints (`state_dict`), so a resumed run
continues with exactly the next batch.

Imports nothing of its project (torch and numpy only). What makes a folder one dataset (a
manifest, writing it whole, fingerprints) is store.py's; prepare.py makes the shards.
"""
from pathlib import Path

import numpy as np
import torch

MAGIC, VERSION = 20240520, 1          # llm.c shard header
HEADER_INTS = 256                     # header length in int32 (1024 bytes)
HEADER_BYTES = HEADER_INTS * 4
SHARD_TOKENS = 100_000_000            # tokens per train shard: FineWeb's, and ours
EOT = 50256                           # GPT-2 <|endoftext|>, placed before every document
PREPARE_HINT = ("`python prepare.py fineweb --shards 8 --out {dir}` (GPT-2 FineWeb) or "
                "`python prepare.py text FILES --out {dir}` (your own text)")


# ----------------------------------------------------------------------------- shard format
def write_shard(path, tokens):
    """Write tokens (ints in [0, 65535]) as one shard. Not atomic by itself: a write cut short
    leaves a file shorter than its header says, which shard_length refuses (prepare.py
    writes whole datasets in a staging folder, store.write_dataset)."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() > 65535):
        raise ValueError(f"token ids must lie in [0, 65535] to fit a uint16 shard, "
                         f"got the range [{tokens.min()}, {tokens.max()}]")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = MAGIC, VERSION, tokens.size
    with open(path, "wb") as f:
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
    if n < 0:
        raise ValueError(f"{path} has a corrupt header: it announces {n} tokens; delete it "
                         f"and prepare the data again")
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
    """The sorted shards `DIR/*{split}*.bin`; FileNotFoundError naming the command that makes
    them when there are none, ValueError when one of those names is not a file."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    data_dir = Path(data_dir)
    if data_dir.exists() and not data_dir.is_dir():
        raise ValueError(f"{data_dir} is a file, not a folder of shards; pass the folder that "
                         f"holds the *train*.bin and *val*.bin shards")
    paths = sorted(data_dir.glob(f"*{split}*.bin"))
    for path in paths:
        if not path.is_file():
            raise ValueError(f"{path} is named like a shard but is not a file; "
                             f"rename or remove it")
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


if __name__ == "__main__":  # the commands that were here live in store.py now
    raise SystemExit("data.py is the shard format and loader and has no commands; check a "
                     "dataset with `python store.py check DIR`")

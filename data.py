"""Token shards: the format, the DDP-aware loader, validation batches. Copy this file alone.

A split is the sorted `*train*.bin` (or `*val*.bin`) files of a folder, each read as one of:

    an llm.c / modded-nanogpt shard (write_shard's): bytes 0‥1023 are 256 little-endian int32
        [20240520 (magic), 1 (version), n, 0, …], then n little-endian uint16 tokens;
    headerless tokens (nanoGPT's train.bin / val.bin): a file of even size whose first int32
        is not the magic, read as it is: size / 2 little-endian uint16 tokens (to pass for a
        header its first two tokens would have to be 55432 and 308, the first beyond GPT-2's
        50257 ids), unless the rest is an llm.c header (version 1, n fitting the size): that is
        a shard whose magic was damaged, and is refused.

`ShardLoader` cuts a split into (B, T) batches x and y = x shifted by one token, in order or at
random (every window start of the split equally likely), from a position of ints
(`state_dict`): a resumed run reads exactly the windows the uninterrupted one would have,
however the rows of a step (`step_rows`) are split into ranks and micro-batches. Imports
nothing of its project (torch and numpy only).
"""
from pathlib import Path

import numpy as np
import torch

MAGIC, VERSION = 20240520, 1           # llm.c shard header
HEADER_INTS, HEADER_BYTES = 256, 1024  # header length in int32, in bytes
SHARD_TOKENS = 100_000_000             # tokens per train shard: FineWeb's, and ours
EOT = 50256                            # GPT-2 <|endoftext|>, placed before every document
ORDERS = ("sequential", "random")


# ----------------------------------------------------------------------------- shard format
def write_shard(path, tokens):
    """One llm.c shard of tokens (ids in [0, 65535]); not atomic: a cut write fails shard_length."""
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() > 65535):
        raise ValueError(f"token ids must lie in [0, 65535] to fit a uint16 shard, "
                         f"got the range [{tokens.min()}, {tokens.max()}]")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = MAGIC, VERSION, tokens.size
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())


def shard_length(path, headerless=False):
    """Validate a shard and return its token count n: an llm.c shard, or with headerless=True
    also bare uint16 tokens without the magic (n = size / 2; a download must have the header)."""
    path, fix = Path(path), "make it again with the tool that wrote it"  # unless said below
    size, header = path.stat().st_size, np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    n = int(header[2]) if header.size > 2 else -1
    if not (header.size and header[0] == MAGIC):
        if header.size > 2 and header[1] == VERSION and size == HEADER_BYTES + 2 * n:  # the rest fits
            problem = f"is an llm.c shard whose magic number is {header[0]}, not {MAGIC}"
        elif headerless and size % 2 == 0:
            return size // 2
        elif headerless:
            problem = (f"is neither an llm.c shard (its first int32 is not {MAGIC}) nor "
                       f"headerless uint16 tokens (its size, {size} bytes, is odd)")
        else:
            problem = f"has no llm.c shard header (its first int32 is not {MAGIC})"
    elif size < HEADER_BYTES:
        problem = f"is truncated: {size} bytes is shorter than the {HEADER_BYTES}-byte header"
    elif header[1] != VERSION:
        problem, fix = (f"has shard version {header[1]}, but only version {VERSION} (uint16 "
                        f"tokens) is read"), f"write its tokens as a version-{VERSION} shard"
    elif n < 0:
        problem = f"has a corrupt header: it announces {n} tokens"
    elif size != (expected := HEADER_BYTES + 2 * n):
        problem = (f"is {'truncated' if size < expected else 'longer than its header says'}: "
                   f"its header announces {n} tokens ({expected} bytes) but the file has {size}")
    else:
        return n
    raise ValueError(f"{path} {problem}; {fix}")


def token_offset(path):
    """The byte where a shard's tokens begin: 1024 in an llm.c shard, 0 in headerless tokens."""
    return Path(path).stat().st_size - 2 * shard_length(path, headerless=True)


def read_shard(path):
    """The tokens of a validated shard of either layout as a read-only uint16 memory map."""
    if not (n := shard_length(path, headerless=True)):
        return np.zeros(0, dtype=np.uint16)  # memmap cannot map zero bytes
    return np.memmap(path, dtype="<u2", mode="r", offset=token_offset(path), shape=(n,))


def shard_paths(data_dir, split):
    """The sorted `DIR/*{split}*.bin`: FileNotFoundError if none, ValueError if one is no file."""
    data_dir = Path(data_dir)
    if not data_dir.exists():
        raise FileNotFoundError(f"no {split} shards: {data_dir} does not exist (a relative "
                                f"path starts in {Path.cwd()}); check the path")
    if not data_dir.is_dir():
        raise ValueError(f"{data_dir} is a file, not a folder of shards; pass the folder that "
                         f"holds the *train*.bin and *val*.bin shards")
    paths = sorted(data_dir.glob(f"*{split}*.bin"))
    for path in paths:
        if not path.is_file():
            raise ValueError(f"{path} is named like a shard but is not a file; rename or remove it")
    if not paths:
        raise FileNotFoundError(f"no {split} shards (*{split}*.bin) in {data_dir}; put the "
                                f"split's token files there, llm.c shards or headerless uint16")
    return paths


# ----------------------------------------------------------------------------- loading
class ShardLoader:
    """Batches (x, y) of int64 CPU tensors (B, T): B = batch_size rows of T = seq_len tokens a
    call on this rank (a trainer's micro-batch), from a split's shards, never read whole.

    Rows are numbered globally: a step of S = step_rows rows (a trainer passes its global batch,
    over all W ranks; default W·B) is S / (W·B) micro-batches, rank r's k-th holding rows
    g = k·W·B + r·B + b, b < B. Row g's window w (T + 1 tokens; x = w[:-1], y = w[1:]) depends
    on g alone, so every split of a step's rows into micro-batches, ranks and B reads the same
    windows, and between steps has one state_dict.

    sequential: row g of a step starting at position p reads the window at p + (g mod S)·T; the
    next step starts at p + S·T. A step whose S·T + 1 tokens do not fit starts the next shard at
    p = 0 (the tail is skipped), after the last the first (epoch + 1).

    random: row g draws, from numpy's generator seeded with (seed, g), one of the split's
    Σ (n − T) window starts uniformly: its shard with probability ∝ n − T, its start uniform in
    [0, n − T − 1]; windows may overlap and repeat. The paper's code draws a shard per micro-
    batch, uniformly (the same odds for shards of one size), and all its starts in it."""

    def __init__(self, data_dir, batch_size, seq_len, rank=0, world_size=1, split="train",
                 order="sequential", seed=0, step_rows=None):
        B, T, W, S = batch_size, seq_len, world_size, step_rows or world_size * batch_size
        if B < 1 or T < 1:
            raise ValueError(f"batch_size and seq_len must be ≥ 1, got {B} and {T}")
        if not 0 <= rank < W:
            raise ValueError(f"rank must lie in [0, world_size={W}), got {rank}")
        if S < 1 or S % (W * B):
            raise ValueError(f"step_rows={S} must be a positive multiple of world_size × "
                             f"batch_size = {W * B}, the rows of one micro-batch on all ranks")
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
        self.B, self.T, self.rank, self.world_size, self.step_rows = B, T, rank, W, S
        self.order, self.seed, self.paths = order, seed, shard_paths(data_dir, split)
        self.lengths = [shard_length(p, headerless=True) for p in self.paths]
        need, what = (S * T + 1, f"one step reads ({S} sequences × {T} tokens + 1)") if \
            order == "sequential" else (T + 1, f"one sequence reads ({T} tokens + 1)")
        for path, n in zip(self.paths, self.lengths):
            if n < need:
                raise ValueError(f"{path} holds {n} tokens, fewer than the {need} {what}; use "
                                 f"fewer or shorter sequences, or more data")
        counts = np.array(self.lengths) - T  # window starts per shard, numbered shard by shard:
        self.first_window, self.windows = np.cumsum(counts) - counts, int(counts.sum())
        self.offsets = np.array([token_offset(p) for p in self.paths])
        self.load_state_dict({"rows": 0} if order == "random" else {"shard": 0, "position": 0})

    def next_batch(self):
        return self._next_in_order() if self.order == "sequential" else self._next_at_random()

    def _next_in_order(self):
        B, T, W, S = self.B, self.T, self.world_size, self.step_rows
        # at a step's start, a step that does not fit moves on to the next shard's start
        if self.position % (S * T) == 0 and self.position + S * T + 1 > self.lengths[self.shard]:
            self.shard, self.position = (self.shard + 1) % len(self.paths), 0
            self.epoch += self.shard == 0                       # back at the first shard
            self.tokens = read_shard(self.paths[self.shard])
        start = self.position + self.rank * B * T
        window = torch.from_numpy(self.tokens[start:start + B * T + 1].astype(np.int64))
        self.position += W * B * T
        return window[:-1].view(B, T), window[1:].view(B, T)

    def _next_at_random(self):
        first = self.rows + self.rank * self.B
        draws = np.array([np.random.default_rng([self.seed, g]).integers(self.windows)
                          for g in range(first, first + self.B)])
        shards = np.searchsorted(self.first_window, draws, side="right") - 1
        starts = self.offsets[shards] + 2 * (draws - self.first_window[shards])  # in bytes
        batch = torch.from_numpy(np.stack([np.fromfile(self.paths[s], "<u2", self.T + 1, offset=b)
                                           for s, b in zip(shards, starts)]).astype(np.int64))
        self.rows += self.world_size * self.B
        return batch[:, :-1], batch[:, 1:]

    def state_dict(self):
        """Where the next row comes from, equal on every rank and, between steps, for every
        split: sequential {shard, position, epoch}; random {rows} (the global rows drawn)."""
        return {"rows": self.rows} if self.order == "random" else \
            {"shard": self.shard, "position": self.position, "epoch": self.epoch}

    def load_state_dict(self, state):
        if ("rows" in state or "batches" in state) != (self.order == "random"):
            raise ValueError(f"loader state {state} was written for the other data order, not "
                             f"{self.order}; resume with the order the run was started with")
        if "batches" in state:  # (seed, rank, batch) seeded the draw, so it hung on the split
            raise ValueError("this run's random windows were drawn by an older data.py and "
                             "cannot be continued exactly; start a new run")
        if self.order == "random":
            self.rows = int(state["rows"])
            return
        shard, position = int(state["shard"]), int(state["position"])
        step = self.step_rows * self.T  # mid-step: another S or T (or an older data.py)
        if not (0 <= shard < len(self.paths) and 0 <= position <= self.lengths[shard]
                and position % step == 0):
            raise ValueError(f"loader state {state} does not fit the {len(self.paths)} shard(s) "
                             f"of {self.paths[0].parent} in steps of {self.step_rows} × {self.T} "
                             f"tokens; resume with the data, batch size and sequence length "
                             f"the run was saved with")
        self.shard, self.position, self.epoch = shard, position, int(state.get("epoch", 0))
        self.tokens = read_shard(self.paths[shard])


def max_token(path):
    """The largest token id of a shard (−1 if it is empty): reads all of it (~GB/s)."""
    tokens = read_shard(path)
    return int(tokens.max()) if tokens.size else -1


def val_steps_held(data_dir, batch_size, seq_len, world_size=1):
    """The evaluation steps of W·B·T tokens the val split holds, Σ ⌊(n − 1) / (W·B·T)⌋ over its
    shards; ValueError if a shard holds fewer than the W·B·T + 1 tokens of one (0 included)."""
    loader = ShardLoader(data_dir, batch_size, seq_len, world_size=world_size, split="val")
    return sum((n - 1) // (world_size * batch_size * seq_len) for n in loader.lengths)


def val_batches(data_dir, eval_tokens, batch_size, seq_len, rank=0, world_size=1):
    """The first ⌊eval_tokens / (W·B·T)⌋ steps of the val split, read in order.

    Every rank gets the same number of batches, together covering each evaluated token once, so
    the mean of the ranks' mean losses is the mean over those tokens. Runs on W and W′ ranks
    evaluate the same tokens (the same loss up to rounding) when eval_tokens is a multiple of
    W·B·T and W′·B·T and they lie in the first val shard (its skipped tail depends on W)."""
    step = world_size * batch_size * seq_len
    available = val_steps_held(data_dir, batch_size, seq_len, world_size)
    if not 1 <= (steps := eval_tokens // step) <= available:
        raise ValueError(f"eval_tokens={eval_tokens} must cover between 1 and {available} steps "
                         f"of {step} tokens ({world_size} ranks × {batch_size} sequences × "
                         f"{seq_len} tokens) of {data_dir}'s val split; change eval_tokens")
    loader = ShardLoader(data_dir, batch_size, seq_len, rank, world_size, split="val")
    return (loader.next_batch() for _ in range(steps))


if __name__ == "__main__":
    raise SystemExit("data.py is a library module with no commands; import it")

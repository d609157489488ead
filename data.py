"""Token shards: the format, the DDP-aware loader, validation batches. Copy this file alone.

A split is the sorted `*train*.bin` (or `*val*.bin`) files of a folder. Each is an llm.c /
modded-nanogpt shard (write_shard's: 256 little-endian int32 [20240520 (magic), 1 (version), n,
0, …], then n little-endian uint16 tokens) or, without the magic, bare uint16 tokens as in
nanoGPT's train.bin and val.bin.

The loader numbers rows globally, so a resumed run reads exactly the windows of the
uninterrupted one, however a step's rows are split over ranks and micro-batches.
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
    """One llm.c shard of tokens (ids in [0, 65535])."""
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
    """The token count n of an llm.c shard, or with headerless=True also of bare uint16 tokens
    (n = size / 2). ValueError if the file is neither, or is cut short."""
    size = Path(path).stat().st_size
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if header.size < 3 or header[0] != MAGIC:
        if headerless and size % 2 == 0:
            return size // 2
        odd = f", nor uint16 tokens (its size, {size} bytes, is odd)" if headerless else ""
        raise ValueError(f"{path} is no llm.c shard (its first int32 is not {MAGIC}){odd}")
    if header[1] != VERSION:
        raise ValueError(f"{path} has shard version {header[1]}, but only version {VERSION} "
                         f"(uint16 tokens) is read")
    n = int(header[2])
    if size != HEADER_BYTES + 2 * n:
        raise ValueError(f"{path} is cut short or damaged: its header announces {n} tokens "
                         f"({HEADER_BYTES + 2 * n} bytes) but the file has {size} bytes")
    return n


def read_shard(path):
    """The tokens of a shard of either layout, as a read-only uint16 memory map."""
    if not (n := shard_length(path, headerless=True)):
        return np.zeros(0, dtype=np.uint16)  # memmap cannot map zero bytes
    offset = Path(path).stat().st_size - 2 * n  # 1024 bytes of header, or none
    return np.memmap(path, dtype="<u2", mode="r", offset=offset, shape=(n,))


def shard_paths(data_dir, split):
    """The sorted `DIR/*{split}*.bin`; FileNotFoundError if there are none."""
    if not (paths := sorted(Path(data_dir).glob(f"*{split}*.bin"))):
        where = Path(data_dir).resolve()
        missing = "" if where.is_dir() else ", a folder that does not exist"
        raise FileNotFoundError(f"no {split} shards (*{split}*.bin) in {where}{missing}")
    return paths


# ----------------------------------------------------------------------------- loading
class ShardLoader:
    """Batches (x, y) of int64 tensors (B, T), y = x shifted by one token: B = batch_size rows of
    T = seq_len tokens a call on this rank (a trainer's micro-batch).

    Rows are numbered globally: a step of S = step_rows rows (a trainer's global batch; default
    W·B on W ranks) is S / (W·B) micro-batches, rank r's k-th holding rows g = k·W·B + r·B + b.
    Row g's window of T + 1 tokens depends on g alone, so every split of a step into ranks and
    micro-batches reads the same windows and leaves the same state_dict.

    sequential: row g of a step starting at position p reads the window at p + (g mod S)·T; the
    next step starts at p + S·T, or at the next shard's start if its S·T + 1 tokens do not fit
    (the tail is skipped; after the last shard comes the first, epoch + 1).
    random: row g draws one of the split's Σ (n − T) window starts uniformly, with numpy's
    generator seeded with (seed, g); windows may overlap and repeat."""

    def __init__(self, data_dir, batch_size, seq_len, rank=0, world_size=1, split="train",
                 order="sequential", seed=0, step_rows=None):
        B, T, W, S = batch_size, seq_len, world_size, step_rows or world_size * batch_size
        if S % (W * B):
            raise ValueError(f"step_rows={S} must be a multiple of world_size × batch_size = "
                             f"{W * B}, the rows of one micro-batch on all ranks")
        self.B, self.T, self.rank, self.world_size, self.step_rows = B, T, rank, W, S
        self.order, self.seed, self.paths = order, seed, shard_paths(data_dir, split)
        self.lengths = [shard_length(p, headerless=True) for p in self.paths]
        need, what = (S * T + 1, f"one step reads ({S} rows × {T} tokens + 1)") \
            if order == "sequential" else (T + 1, f"one row reads ({T} tokens + 1)")
        for path, n in zip(self.paths, self.lengths):
            if n < need:
                raise ValueError(f"{path} holds {n} tokens, fewer than the {need} {what}; use "
                                 f"fewer or shorter sequences, or more data")
        counts = np.array(self.lengths) - T  # window starts per shard, numbered shard by shard
        self.first_window, self.windows = np.cumsum(counts) - counts, int(counts.sum())
        sizes = np.array([p.stat().st_size for p in self.paths])
        self.offsets = sizes - 2 * np.array(self.lengths)  # where each shard's tokens begin
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
        rows = [np.fromfile(self.paths[s], "<u2", self.T + 1, offset=b)
                for s, b in zip(shards, starts)]
        batch = torch.from_numpy(np.stack(rows).astype(np.int64))
        self.rows += self.world_size * self.B
        return batch[:, :-1], batch[:, 1:]

    def state_dict(self):
        """Where the next row comes from, equal on every rank and, between steps, for every
        split: sequential {shard, position, epoch}; random {rows} (the global rows drawn)."""
        return {"rows": self.rows} if self.order == "random" else \
            {"shard": self.shard, "position": self.position, "epoch": self.epoch}

    def load_state_dict(self, state):
        if ("rows" in state) != (self.order == "random"):
            raise ValueError(f"loader state {state} was written for the other data order, not "
                             f"{self.order}; resume with the order the run was started with")
        if self.order == "random":
            self.rows = int(state["rows"])
            return
        shard, position = int(state["shard"]), int(state["position"])
        if not (0 <= shard < len(self.paths) and 0 <= position <= self.lengths[shard]
                and position % (self.step_rows * self.T) == 0):
            raise ValueError(f"loader state {state} does not fit {self.paths[0].parent} in steps "
                             f"of {self.step_rows} × {self.T} tokens; resume with the data, batch "
                             f"size and sequence length the run was saved with")
        self.shard, self.position, self.epoch = shard, position, int(state.get("epoch", 0))
        self.tokens = read_shard(self.paths[shard])


def max_token(path):
    """The largest token id of a shard (−1 if it is empty): reads all of it."""
    tokens = read_shard(path)
    return int(tokens.max()) if tokens.size else -1


def val_steps_held(data_dir, batch_size, seq_len, world_size=1):
    """The evaluation steps of W·B·T tokens the val split holds, Σ ⌊(n − 1) / (W·B·T)⌋ over its
    shards; ValueError if a shard holds fewer than the W·B·T + 1 tokens of one."""
    loader = ShardLoader(data_dir, batch_size, seq_len, world_size=world_size, split="val")
    return sum((n - 1) // (world_size * batch_size * seq_len) for n in loader.lengths)


def val_batches(data_dir, eval_tokens, batch_size, seq_len, rank=0, world_size=1):
    """The first ⌊eval_tokens / (W·B·T)⌋ steps of the val split, in order. The ranks get as many
    batches each, covering each token once: the mean of their mean losses is the tokens' mean."""
    step = world_size * batch_size * seq_len
    available = val_steps_held(data_dir, batch_size, seq_len, world_size)
    if not 1 <= (steps := eval_tokens // step) <= available:
        raise ValueError(f"eval_tokens={eval_tokens} must cover 1 to {available} steps of "
                         f"{step} tokens of the val split in {data_dir}")
    loader = ShardLoader(data_dir, batch_size, seq_len, rank, world_size, split="val")
    return (loader.next_batch() for _ in range(steps))

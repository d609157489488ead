"""The plumbing of a training run, kept out of train.py's way: the command line with its defaults
and checks, the device, the processes of torchrun, the data made ready, the run folder (one
process at a time, files replaced whole, no other run's files replaced, its checkpoints), the
divergence watch that never makes the GPU wait, the console line with its speed, and the setup
before the first step. train.py is the reader's file; this one is what makes it safe to run."""
import argparse
import contextlib
import fcntl
import json
import logging
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import data
import heads
import prepare
import store
from model import GPT, SIZES, load_checkpoint
from store import non_negative_float, non_negative_int, positive_float, positive_int

WARMUP_SHARE = 20          # default --warmup = --steps / 20: the paper's 5,000 of 100,000
STAT_TOKENS = 524_288      # 2¹⁹ tokens ≈ the 5·10⁵ logit vectors of the paper's Sec. 3
TEXT_CACHE = "data/text"   # where --data text files are tokenized (prepare.text_dataset)
LOCK = ".lock"             # in the run folder: held (fcntl.flock) by the process using it
STALE_TEMP = re.compile(r"\..+\.\d+\.[0-9a-f]{8}\.tmp")  # store.open_atomic's temporary names
# Settings that define what a run computes; --resume refuses a run folder that differs in any.
RUN_DEFINING = ("size", "head", "lr", "tie", "lam", "cap", "vocab_size", "steps", "warmup",
                "min_lr", "batch_size", "seq_len", "seed", "dtype", "data_fingerprint")
# Dense bf16 tensor-core peak FLOP/s of one GPU, first match in torch.cuda.get_device_name()
# (the NVL boards run at a lower clock than the SXM ones).
PEAK_BF16_FLOPS = (("A100", 312e12), ("H100 PCIe", 756e12), ("H100 NVL", 835e12),
                   ("H200 NVL", 835e12), ("H100", 989e12), ("H200", 989e12))


def fail(message: str):
    """End the run with one sentence and no traceback (exit code 1)."""
    raise SystemExit(f"train.py: error: {message}")


# ---------------------------------------------------------------------------------------------
# The command line: its defaults (the paper's recipe) and its checks

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="One training run with the recipe of the paper's "
                                "App. A, on one process or many (torchrun DDP).",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--size", default="16M", choices=tuple(SIZES), help="model size preset (model.SIZES)")
    a("--head", default="baseline", choices=heads.HEADS, help="LM-head variant (heads.py)")
    a("--lr", type=positive_float, default=3e-3, help="peak learning rate η (paper: 3e-4 … 3e-1)")
    a("--tie", action="store_true", help="tie the input and output embeddings")
    a("--lam", type=float, default=None, help="λ of z_loss / mu_loss; None = heads.py's 1e-4")
    a("--cap", type=float, default=None, help="c of soft_cap; None = heads.py's 30")
    a("--vocab_size", type=positive_int, default=50304, help="V (GPT-2's 50257, padded)")
    a("--steps", type=positive_int, default=100_000, help="optimizer steps")
    a("--warmup", type=non_negative_int, default=None, help="warmup steps; None: 5%% of --steps")
    a("--min_lr", type=non_negative_float, default=1e-5, help="end of the cosine decay")
    a("--batch_size", type=positive_int, default=64, help="sequences per step, all processes")
    a("--micro_batch", type=positive_int, default=None,
      help="sequences per forward and process; None = the most ≤ 16 dividing its batch")
    a("--seq_len", type=positive_int, default=2048, help="tokens per sequence")
    a("--seed", type=non_negative_int, default=0, help="seed of the initial weights, < 2⁶⁴")
    a("--loss_chunk", type=non_negative_int, default=None,
      help="tokens per chunk of the LM head's loss (fused_loss.py: same loss and gradients "
           "without the N×V logits); 0 = heads.py's plain path; default: the fastest exact "
           "path measured for the device (fused_loss.DEFAULT_CHUNK)")
    a("--data", nargs="+", default=[prepare.DEFAULT_DATA], help="a folder of *train*.bin and "
      f"*val*.bin shards (the default is downloaded), or text files (tokenized into {TEXT_CACHE})")
    a("--data_order", default="sequential", choices=data.ORDERS, help="sequential: each token "
      "once per epoch; random: the paper's, random windows of a random shard per batch, by --seed")
    a("--out_dir", default="out", help="run folder")
    a("--resume", action="store_true", help="continue from OUT_DIR/ckpt.pt (fresh if none)")
    a("--save_every", type=positive_int, default=1000, help="steps between checkpoints")
    a("--keep_every", type=non_negative_int, default=0,
      help="also keep ckpt_step{step:07d}.pt (weights only) every N steps; 0 = never")
    a("--stop_at", type=non_negative_int, default=0,
      help="end the process after this step as if killed (no summary); 0 = never")
    a("--eval_every", type=non_negative_int, default=5000,
      help="steps between validation losses (and at the end); 0 = only at the end")
    a("--eval_tokens", type=positive_int, default=65_536_000,
      help="val tokens per evaluation, ≤ the val split (paper's code: 2000 iters × 16 × 2048)")
    a("--stat_tokens", type=positive_int, default=STAT_TOKENS,
      help="validation tokens for the final logit statistics (likewise)")
    a("--log_every", type=positive_int, default=10, help="steps between log lines")
    a("--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:1, …")
    a("--dtype", default="auto", choices=("auto", "bfloat16", "float32"),
      help="autocast dtype of the matmuls (auto: bfloat16 on CUDA, float32 elsewhere)")
    a("--head_dtype", default="auto", choices=("auto", "float32"),
      help="dtype of the LM head's matmul and its backward (auto: --dtype's; float32: a "
           "float32 head under a bf16 body)")
    a("--compile", action=argparse.BooleanOptionalAction, default=None, help="None: on CUDA")
    a("--tf32", action="store_true", help="TensorFloat-32 (10-bit mantissa) for the matmuls "
      "left in float32, on CUDA; without it float32 is float32")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, checked and resolved (warmup, device, dtype, compile); bad input ends
    in parser.error: one sentence and exit code 2."""
    parser = build_parser()
    one_usage_error_under_torchrun(parser)
    args = parser.parse_args(argv)
    if args.warmup is None:
        args.warmup = args.steps // WARMUP_SHARE
    if args.warmup > args.steps:
        parser.error(f"--warmup {args.warmup} exceeds --steps {args.steps}; lower --warmup")
    if args.seed >= 2 ** 64:
        parser.error(f"--seed {args.seed} is too large; give an integer from 0 to 2⁶⁴ − 1")
    if args.min_lr > args.lr:
        parser.error(f"--min_lr {args.min_lr:g} exceeds --lr {args.lr:g}; the cosine decays "
                     f"from --lr down to --min_lr")
    try:
        heads.build(args.head, lam=args.lam, cap=args.cap)
    except ValueError as err:
        parser.error(str(err))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if args.micro_batch is None:
        per_process = max(1, args.batch_size // world_size)
        args.micro_batch = max(n for n in range(1, 17) if per_process % n == 0)
    per_pass = args.micro_batch * world_size
    if args.batch_size % per_pass:
        parser.error(f"--batch_size {args.batch_size} must be a multiple of --micro_batch × "
                     f"processes = {args.micro_batch} × {world_size} = {per_pass}; change "
                     f"--batch_size or --micro_batch")
    files = [Path(path).is_file() for path in args.data]
    if len(args.data) > 1 and not all(files):
        parser.error("--data takes one folder of shards or one or more text files, not both; "
                     f"{args.data[files.index(False)]} is not a file")
    args.text = args.data if all(files) else None  # tokenized into a folder by prepare_data
    args.data = None if args.text else args.data[0]
    if resolve_device(args, parser.error) != "cuda" and args.tf32:
        parser.error("--tf32 asks for TensorFloat-32 matmuls, which only CUDA GPUs have; drop it")
    refuse_oversized_embeddings(args, parser.error)
    return args


def resolve_device(args, error) -> str:
    """Turn --device/--dtype/--compile "auto" (or None) into what this machine has: CUDA with
    bf16 autocast and torch.compile, else CPU in float32, uncompiled. Calls error(message) for
    a device that is not usable. Returns the device type."""
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(args.device)
    except RuntimeError:
        error(f"--device {args.device!r} is not a torch device; use cpu, cuda or cuda:N")
    if device.type not in ("cpu", "cuda"):
        error(f"--device {args.device} is not supported: train.py runs on cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        error(f"--device {args.device} asks for CUDA but no GPU is visible; use --device cpu")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        error(f"--device {args.device} names a GPU that is not there; this machine has "
              f"{torch.cuda.device_count()}")
    if args.dtype == "auto":
        args.dtype = "bfloat16" if device.type == "cuda" else "float32"
    if args.compile is None:
        args.compile = device.type == "cuda"
    return device.type


def one_usage_error_under_torchrun(parser):
    """Under torchrun every process parses the same command line, so each printed the same
    error. Now rank 0 alone prints it; every process still exits 2, so torchrun and any script
    around it see a failure (torchrun then adds its own banner below the sentence: exiting 0
    to silence it would report a refused command as a success)."""
    if int(os.environ.get("WORLD_SIZE", 1)) == 1:
        return

    def error(message):
        if int(os.environ.get("RANK", 0)) == 0:
            parser.print_usage(sys.stderr)
            print(f"{parser.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)
    parser.error = error


def refuse_oversized_embeddings(args, error):
    """Call error(sentence) when the embeddings alone cannot fit in the device's memory, saying
    how much they need, instead of the allocator's traceback: V·D numbers (twice untied) in
    float32, with their gradients and AdamW's two moments, 16 bytes per number."""
    numbers = args.vocab_size * SIZES[args.size]["n_embd"] * (1 if args.tie else 2)
    needed = 16 * numbers
    device = torch.device(args.device)
    if device.type == "cuda":
        total, where = torch.cuda.get_device_properties(device).total_memory, "the GPU's"
    else:
        total, where = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine's"
    if needed > total:
        error(f"--vocab_size {args.vocab_size:,} needs {format_bytes(needed)} for the embeddings "
              f"alone (weights, gradients and AdamW state, 16 bytes per number), more than "
              f"{where} {format_bytes(total)} of memory; lower --vocab_size")


def format_bytes(n: int) -> str:
    """1.8 PiB, 12.0 GiB, 512 B."""
    for power, unit in ((5, "PiB"), (4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB")):
        if n >= 1024 ** power:
            return f"{n / 1024 ** power:,.1f} {unit}"
    return f"{n} B"


# ---------------------------------------------------------------------------------------------
# Processes: torchrun sets RANK (global, over all nodes), LOCAL_RANK (on this node), WORLD_SIZE.

@dataclass
class Dist:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def master(self) -> bool:
        """Global rank 0 alone prints and writes files."""
        return self.rank == 0


def init_distributed(args) -> Dist:
    """Join the process group when launched by torchrun (NCCL on CUDA, gloo on CPU)."""
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if world_size == 1:
        device = torch.device(args.device)
        if device.type == "cuda":
            device = torch.device("cuda", device.index or 0)  # "cuda" means the first GPU
            torch.cuda.set_device(device)
        return Dist(0, 0, 1, device)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    if torch.device(args.device).type == "cuda":
        device = torch.device("cuda", local_rank)  # one GPU per process on each node
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device(args.device)
        dist.init_process_group("gloo")
    return Dist(rank, local_rank, world_size, device)


def choose_cpu_threads(ctx: Dist) -> int:
    """On CPU, unless OMP_NUM_THREADS says otherwise: as many threads as there are idle cores
    (the cores this process may use less the 1-minute load average, at least 1), shared by the
    processes of this node. torch's default, one per core, oversubscribes a busy machine: on a
    loaded 2-core CPU the quickstart took 8 min with 2 threads and 2 min 49 s with 1."""
    if ctx.device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            os.cpu_count() or 1
        idle = cores - (os.getloadavg()[0] if hasattr(os, "getloadavg") else 0)
        torch.set_num_threads(max(1, int(idle) // int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
    return torch.get_num_threads()


def cpu_threads(ctx: Dist) -> str:
    """', N CPU thread(s)' for the run's first line (choose_cpu_threads), '' on a GPU."""
    return f", {torch.get_num_threads()} CPU thread(s)" if ctx.device.type == "cpu" else ""


def unwrap(model) -> GPT:
    """The GPT inside DDP and torch.compile wrappers."""
    model = model.module if isinstance(model, DDP) else model
    return getattr(model, "_orig_mod", model)


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Σ over processes, in place (a no-op on one process)."""
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


# ---------------------------------------------------------------------------------------------
# The data: made ready once per node, checked before any step

def prepare_data(args, ctx: Dist):
    """Make --data a folder of shards and check it, once per node: local rank 0 does it
    (make_ready) while the other ranks wait at a gloo barrier with a long timeout (NCCL's 10
    minutes are too short for a download), so no rank sees a half-made folder and no two ranks
    of a node read the whole dataset; a failure ends every rank, rank 0 with its sentence."""
    waiting = dist.new_group(backend="gloo", timeout=timedelta(hours=24)) \
        if ctx.world_size > 1 else None
    problem = make_ready(args) if ctx.local_rank == 0 else ""
    failed = torch.tensor([float(bool(problem))])
    if waiting is not None:  # the barrier: local rank 0 is done
        dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=waiting)
    if failed.item():
        fail(problem or "preparing or checking the data failed on another process")
    if args.text and ctx.local_rank != 0:
        args.data = str(prepare.text_dataset(args.text, TEXT_CACHE))  # finds rank 0's folder


def make_ready(args) -> str:
    """Tokenize --data's text files (prepare.text_dataset), or download the default FineWeb
    shards the run reads when missing (prepare.fetch_fineweb); then check the dataset whole
    (store.check_dataset, hashes when small) and its token ids < --vocab_size (store.check_vocab:
    the manifest's largest ids, else every shard read once). Returns '' or one sentence."""
    try:
        if args.text:
            args.data = str(prepare.text_dataset(args.text, TEXT_CACHE))
        elif args.data == prepare.DEFAULT_DATA and not has_shards(args.data):
            shards = prepare.shards_needed(args.steps * args.batch_size * args.seq_len)
            print(f"no shards in {args.data}: downloading {prepare.DEFAULT_DATASET} (1 val + "
                  f"{shards} train shards of {data.SHARD_TOKENS:,} tokens) …", flush=True)
            try:
                prepare.fetch_fineweb(args.data, train_shards=shards)
            except store.WriteError as err:  # a full disk is not a network error
                return str(err)
            except (RuntimeError, OSError, ValueError) as err:
                return (f"the FineWeb download into {args.data} failed ({err.__cause__ or err}); "
                        f"to train on local text instead, pass the text files as --data")
        store.check_dataset(args.data)
        store.check_vocab(args.data, args.vocab_size)
        return ""
    except (RuntimeError, OSError, ValueError) as err:
        return str(err)


def has_shards(folder) -> bool:
    try:
        return bool(data.shard_paths(folder, "train") and data.shard_paths(folder, "val"))
    except (FileNotFoundError, ValueError):
        return False


def open_data(args, ctx: Dist, say):
    """The rank's training loader (--data_order, seeded by --seed and the rank) on the data
    prepare_data checked; every rank reads only headers and the manifest here, for the
    dataset's fingerprint (recorded hashes, not new ones: --resume compares it) and the val
    split's length: --eval_tokens and --stat_tokens are cut down to what it holds, saying so."""
    try:
        args.data_fingerprint = store.check_dataset(args.data, hash_bytes=0)
        loader = data.ShardLoader(args.data, args.micro_batch, args.seq_len, ctx.rank,
                                  ctx.world_size, "train", args.data_order, args.seed)
        val = [data.shard_length(path) for path in data.shard_paths(args.data, "val")]
    except (FileNotFoundError, ValueError) as err:
        fail(str(err))
    step = ctx.world_size * args.micro_batch * args.seq_len  # val tokens per evaluation step
    held = sum((n - 1) // step for n in val) * step  # as data.val_batches counts them
    if held == 0:
        fail(f"the val split of {args.data} holds fewer than the {step + 1:,} tokens of one "
             f"evaluation step ({ctx.world_size} processes × --micro_batch {args.micro_batch} × "
             f"--seq_len {args.seq_len} + 1)")
    for name in ("eval_tokens", "stat_tokens"):
        if getattr(args, name) > held:
            say(f"--{name} {getattr(args, name):,} is more than the val split holds: using "
                f"its {held:,} tokens")
            setattr(args, name, held)
    return loader


def val_batches(tokens: int, args, ctx: Dist):
    """This rank's share of the first `tokens` validation tokens (at least one micro-batch per
    rank, so that few statistics tokens also work on 8 GPUs)."""
    tokens = max(tokens, ctx.world_size * args.micro_batch * args.seq_len)
    return data.val_batches(args.data, tokens, args.micro_batch, args.seq_len, ctx.rank,
                            ctx.world_size)


# ---------------------------------------------------------------------------------------------
# The device: batches moved to it, and its losses read without waiting for it

def device_batches(loader, device):
    """next_batch() of the loader, moved to the device (asynchronously from pinned memory)."""
    def next_batch():
        x, y = loader.next_batch()
        if device.type == "cuda":
            x, y = x.pin_memory(), y.pin_memory()
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    return next_batch


class FiniteWatch:
    """Tells whether each step's loss was finite without making the GPU wait.

    Reading a CUDA value (.item()) blocks the CPU until all queued work is done, so the next
    step could not be queued meanwhile. Instead the flag is copied to pinned memory without
    blocking and read one step later, once the next step is queued: a divergence is noticed
    one step late at most (at once on the CPU, and at every log or save step)."""

    def __init__(self, device: torch.device):
        self.lag = 1 if device.type == "cuda" else 0
        self.pending = []  # (step, flag, event), oldest first

    def push(self, step: int, loss: torch.Tensor):
        flag, event = torch.isfinite(loss), None
        if loss.is_cuda:
            host = torch.empty((), dtype=torch.bool, pin_memory=True)
            flag, event = host.copy_(flag, non_blocking=True), torch.cuda.Event()
            event.record()
        self.pending.append((step, flag, event))

    def first_nonfinite(self, wait_all: bool = False):
        """The first step whose loss was not finite, among all the steps that can be read
        without waiting (or all steps when wait_all); None if every one was finite."""
        while len(self.pending) > (0 if wait_all else self.lag):
            step, flag, event = self.pending.pop(0)
            if event is not None:
                event.synchronize()
            if not bool(flag):
                return step
        return None


# ---------------------------------------------------------------------------------------------
# The run folder: one process at a time, files replaced whole, no other run's files replaced

@contextlib.contextmanager
def run_folder_lock(out: Path):
    """Hold OUT/.lock (fcntl.flock) while the block runs, so two processes never train in one
    folder. The OS drops the lock when its process ends, however it ends, so the lock of a
    killed run is taken over, never stale; so are the temporary files of its last save."""
    try:
        store.make_folder(out)
        lock = open(out / LOCK, "a+")
    except OSError as err:  # store.WriteError says it in one sentence
        fail(err if isinstance(err, store.WriteError) else f"cannot write to --out_dir {out} "
             f"({err.strerror}); choose a folder you can write to")
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            fail(f"{out} is in use by {lock.read().strip() or 'another process'}; wait for it to "
                 f"end, or choose another --out_dir")
        try:  # unbuffered: a write that failed must not be retried when the file closes
            os.ftruncate(lock.fileno(), 0)
            os.write(lock.fileno(), f"train.py, process {os.getpid()}\n".encode())
        except OSError as err:
            fail(f"cannot write {out / LOCK} ({err.strerror}); free space or choose another "
                 f"--out_dir")
        for path in out.iterdir():
            if STALE_TEMP.fullmatch(path.name) and path.is_file():
                path.unlink()
        yield


def check_run_folder(args, out: Path, config: dict) -> bool:
    """Whether to train: False when --resume finds this very run finished. Refuses, in one
    sentence, a folder holding files without --resume, and with --resume the folder of another
    run: files without a config.json of train.py, or one with other run-defining settings."""
    files = sorted(path.name for path in out.iterdir() if path.name != LOCK)
    if files and not args.resume:
        fail(f"{out} already holds a run ({', '.join(files[:4])}); pass --resume to continue "
             f"it, or choose another --out_dir")
    if not files:
        return True
    try:  # not a pipe, whose read would block forever
        recorded = json.loads((out / "config.json").read_text()) \
            if (out / "config.json").is_file() else None
    except (OSError, ValueError):
        recorded = None
    if not isinstance(recorded, dict):
        fail(f"{out} holds {', '.join(files[:4])} but no config.json of train.py, so it is not "
             f"a run to resume; choose another --out_dir")
    refuse_other_settings(out, recorded, config)
    if (out / "summary.json").exists():
        print(f"{out / 'summary.json'} exists: the run is finished, nothing to do")
        return False
    return True


def refuse_other_settings(source, recorded: dict, config: dict):
    """Fail, naming them, if the run-defining settings recorded in source differ from config."""
    keys = [key for key in RUN_DEFINING if recorded.get(key) != config[key]]
    if keys:
        fail(f"--resume: the run of {source} was trained with {settings(recorded, keys)}, not "
             f"{settings(config, keys)}; resume with its own settings or choose another "
             f"--out_dir")


def settings(config: dict, keys) -> str:
    """The settings as options, '--lr 0.003 --steps 6'; the dataset by folder and fingerprint."""
    return " ".join(f"--data {config.get('data')} (dataset {str(config.get(key))[:12]})"
                    if key == "data_fingerprint" else f"--{key} {config.get(key)}"
                    for key in keys)


def finite_or_none(value):
    """JSON has no NaN or ∞: a non-finite number is written as null."""
    return value if not isinstance(value, float) or math.isfinite(value) else None


def write_json(path, obj: dict):
    store.write_atomic(path, json.dumps({k: finite_or_none(v) for k, v in obj.items()},
                                        indent=2) + "\n")


def append_log(path: Path, record: dict):
    """One JSON line at the end of the log, whole or not at all: when the disk fills up midway,
    the part that went in is cut off again and store.WriteError says so in one sentence."""
    line = (json.dumps({k: finite_or_none(v) for k, v in record.items()}) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size, done = os.fstat(fd).st_size, 0
        try:
            while done < len(line):  # os.write may write only a part
                done += os.write(fd, line[done:])
        except OSError as err:
            os.ftruncate(fd, size)
            raise store.write_error(err, path) from None
    finally:
        os.close(fd)


def trim_log(path: Path, last_step: int):
    """Keep the log lines up to the checkpoint's step: the steps after it are trained again,
    and a line cut off by a kill is dropped."""
    kept = []
    if path.exists() and not path.is_file():
        fail(f"{path} is not a file, so the run's log cannot be continued; move it out of the "
             f"way and resume again")
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                if json.loads(line)["step"] <= last_step:
                    kept.append(line + "\n")
            except (ValueError, KeyError, TypeError):
                pass
    store.write_atomic(path, "".join(kept))


def save(obj: dict, path: Path):
    """torch.save through store.open_atomic: a unique temporary file, fsynced, renamed."""
    with store.open_atomic(path) as f:
        torch.save(obj, f)


def save_checkpoint(out: Path, model: GPT, optimizer, loader, step: int, config: dict,
                    init_loss: float, train_time: float):
    """ckpt.pt: everything --resume needs, tensors and plain types only (weights_only-loadable).
    The unwrapped model's state_dict has no `_orig_mod.` prefix, so compiled and eager runs
    resume each other. The loader position is global, the same on every rank."""
    device = model.output_weight.device
    rng = {"torch": torch.get_rng_state(),
           **({"cuda": torch.cuda.get_rng_state(device)} if device.type == "cuda" else {})}
    save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
          "loader": loader.state_dict(), "rng": rng, "config": config, "init_loss": init_loss,
          "train_time_s": train_time}, out / "ckpt.pt")


def save_snapshot(out: Path, model: GPT, step: int, config: dict):
    """ckpt_step{step:07d}.pt: the weights alone, for curves over training (analyze.py)."""
    save({"model": model.state_dict(), "step": step, "config": config},
         out / f"ckpt_step{step:07d}.pt")


def restore(path: Path, config: dict, model: GPT, optimizer, loader, device) -> dict:
    """Model, optimizer, loader position and RNG from ckpt.pt; returns step, init_loss and
    train_time_s. A checkpoint that cannot continue this run ends in one sentence."""
    try:
        ckpt = load_checkpoint(path)
    except (ValueError, FileNotFoundError) as err:  # FileNotFoundError: not a file
        fail(f"{str(err).rstrip('.')}; delete it to start afresh")
    missing = [key for key in ("optimizer", "loader", "rng", "init_loss", "train_time_s")
               if key not in ckpt]
    if missing:
        fail(f"{path} holds weights but not what --resume needs ({', '.join(missing)}); "
             f"delete it to start afresh")
    for key in ("init_loss", "train_time_s"):  # they go into summary.json as they are
        if not isinstance(ckpt[key], (int, float)) or isinstance(ckpt[key], bool):
            fail(f"{path} records {key} {ckpt[key]!r}, not a number, so it was not written by "
                 f"train.py; delete it to start afresh")
    refuse_other_settings(path, ckpt["config"], config)
    try:
        model.load_state_dict(ckpt["model"])
    except RuntimeError as err:  # torch lists every mismatch, one per line: name the first
        detail = next(line.strip() for line in str(err).splitlines()[1:] + [str(err)] if line)
        fail(f"{path} holds weights that do not fit the model of its settings ({detail[:160]}); "
             f"delete it to start afresh")
    try:
        optimizer.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        if device.type == "cuda" and "cuda" in ckpt["rng"]:
            torch.cuda.set_rng_state(ckpt["rng"]["cuda"], device)
    except (ValueError, KeyError, TypeError, RuntimeError) as err:
        fail(f"{path} cannot continue this run ({err}); delete it to start afresh")
    refuse_misshapen_optimizer_state(path, optimizer)
    return {key: ckpt[key] for key in ("step", "init_loss", "train_time_s")}


def refuse_misshapen_optimizer_state(path: Path, optimizer):
    """AdamW's load_state_dict takes moments of any shape; the first step would then fail deep
    inside it. Each moment must have its parameter's shape (the step count is a scalar)."""
    for number, param in enumerate(p for group in optimizer.param_groups for p in group["params"]):
        for name, value in optimizer.state.get(param, {}).items():
            if torch.is_tensor(value) and value.dim() and value.shape != param.shape:
                fail(f"{path} holds optimizer state {name} of shape {tuple(value.shape)} for "
                     f"parameter {number} of shape {tuple(param.shape)}; it does not fit this "
                     f"model: delete it to start afresh")


# ---------------------------------------------------------------------------------------------
# Speed and the console line

def sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_flops(device: torch.device, dtype: str):
    """Dense bf16 peak FLOP/s of one device, or None when unknown (CPU, other GPUs, float32)."""
    if device.type != "cuda" or dtype != "bfloat16":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_FLOPS if key in name), None)


class CompileWatch(logging.Filter):
    """What torch.compile gave up on. With torch._dynamo.config.suppress_errors a function that
    fails to compile runs eagerly, and torch logs that as a warning with a long traceback; this
    filter keeps the root cause of each instead (one line), for train.py to say once."""
    LOGGER = logging.getLogger("torch._dynamo.convert_frame")

    def __init__(self):
        super().__init__()
        self.failures = []
        self.LOGGER.addFilter(self)

    def filter(self, record) -> bool:
        if record.levelno < logging.WARNING:
            return True
        cause = record.exc_info[1] if record.exc_info else None
        while inner := getattr(cause, "inner_exception", None) or getattr(cause, "__cause__", None):
            cause = inner  # the compiler's own error, inside torch's wrapping of it
        text = f"{type(cause).__name__}: {cause}" if cause else record.getMessage()
        self.failures.append(text.strip().splitlines()[0][:200])
        return False  # kept from the console

    def stop(self) -> str | None:
        """Stop watching; the first failure, or None when everything compiled."""
        self.LOGGER.removeFilter(self)
        return self.failures[0] if self.failures else None


class Throughput:
    """Tokens per second over the steps since the last restart, timed between device syncs
    (CUDA runs asynchronously: without a sync the clock would time the queueing)."""

    def __init__(self, device: torch.device, tokens_per_step: int):
        self.device, self.tokens_per_step = device, tokens_per_step
        self.restart()

    def restart(self):
        sync(self.device)
        self.start, self.steps = time.perf_counter(), 0

    def read(self) -> tuple[float, float]:
        """(tokens/s, seconds per step)."""
        sync(self.device)
        per_step = (time.perf_counter() - self.start) / self.steps
        return self.tokens_per_step / per_step, per_step


def timed(fn, *args):
    """fn(*args) and the seconds it took (fn reads a device value, so the device is done)."""
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


def eta_seconds(step: int, args, per_step: float, log_s: float, eval_s: float,
                log_tokens: int) -> float:
    """Seconds until the run ends after `step`: the steps left, the log steps and evaluations
    among them (each as long as the last one), and the final statistics over --stat_tokens
    (as long per token as a log step's statistics over log_tokens)."""
    final_stats = log_s * args.stat_tokens / log_tokens
    if step == args.steps:
        return final_stats

    def count(every):  # multiples of `every` in (step, steps], and --steps itself
        return (args.steps // every - step // every + bool(args.steps % every)) if every else 1
    return ((args.steps - step) * per_step + count(args.log_every) * log_s
            + count(args.eval_every) * eval_s + final_stats)


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def log_line(record: dict, steps: int, eta: float | None) -> str:
    """step, loss, lr, tokens/s, MFU, ETA: one line a person can read (no speed and no ETA
    where none was measured: the first step, which compiles)."""
    parts = [f"step {record['step']:>{len(str(steps))}}/{steps}", f"loss {record['loss']:.4f}",
             f"lr {record['lr']:.2e}"]
    if record["tok_per_s"] is not None:
        parts.append(f"{record['tok_per_s']:,.0f} tok/s")
    if record["mfu"] is not None:
        parts.append(f"MFU {record['mfu']:.1%}")
    if eta is not None:
        parts.append(f"ETA {format_duration(eta)}")
    if "val_loss" in record:
        parts.append(f"val {record['val_loss']:.4f}")
    return " | ".join(parts)


# ---------------------------------------------------------------------------------------------
# Setup: everything before the first step

@dataclass
class Run:
    """What setup() hands the training loop."""
    model: GPT                 # what is saved, measured and centred
    compiled: torch.nn.Module  # model, compiled (setup says when): runs the evaluations
    wrapped: torch.nn.Module   # compiled, in DDP on several processes: runs the steps
    optimizer: torch.optim.AdamW
    loader: data.ShardLoader
    config: dict
    out: Path
    step: int                 # optimizer steps done
    init_loss: float | None   # val loss before training; None until measured
    train_time_s: float       # training seconds so far
    compile_watch: CompileWatch | None  # what torch.compile gave up on; None: not compiled


def setup(args, ctx: Dist, out: Path, say, build_model, make_optimizer) -> Run | None:
    """Everything before the first step: the data, the run folder's checks, the model and its
    optimizer (train.py's build_model(args) and make_optimizer(model, args), restored from
    ckpt.pt with --resume), config.json. None when --resume finds the run finished."""
    if ctx.master and not args.resume:  # a folder holding a run is refused before any download
        check_run_folder(args, out, config={})
    prepare_data(args, ctx)
    loader = open_data(args, ctx, say)
    config = dict(vars(args))
    finished = ctx.master and not check_run_folder(args, out, config)  # rank 0 decides for all
    if all_reduce_sum(torch.tensor(float(finished), device=ctx.device)).item():
        return None
    torch.set_float32_matmul_precision("high" if args.tf32 else "highest")  # TF32 if asked
    model = build_model(args).to(ctx.device)
    optimizer = make_optimizer(model, args)
    state = {"step": 0, "init_loss": None, "train_time_s": 0.0}
    if args.resume and (out / "ckpt.pt").exists():
        state = restore(out / "ckpt.pt", config, model, optimizer, loader, ctx.device)
    # The wrappers share the model's parameters: compiled on CUDA (a model that fails to compile
    # runs eagerly: the loop says so after the first step), and in DDP on several processes.
    if args.compile:
        torch._dynamo.config.suppress_errors = True
    compile_watch = CompileWatch() if args.compile else None
    compiled = torch.compile(model) if args.compile else model
    wrapped = compiled if ctx.world_size == 1 else \
        DDP(compiled, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    if ctx.master:
        write_json(out / "config.json", config)
        trim_log(out / "log.jsonl", state["step"])  # a fresh run starts an empty log
    return Run(model, compiled, wrapped, optimizer, loader, config, out,
               compile_watch=compile_watch, **state)


def say_compile_failure(run: Run, ctx: Dist, say):
    """After the first step (everything has compiled by then): if torch.compile gave up on
    anything, say it in one line and record it in config.json as compile_failed."""
    failure = run.compile_watch.stop()
    if failure:
        run.config["compile_failed"] = failure
        say(f"torch.compile failed ({failure}); the run goes on uncompiled (eager) where it "
            f"failed, recorded as compile_failed in config.json")
        if ctx.master:
            write_json(run.out / "config.json", run.config)

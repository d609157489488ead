"""The plumbing of a training run, kept out of train.py's way: the processes of torchrun, the
run folder (one process at a time, files replaced whole, no other run's files replaced, its
checkpoints), the divergence watch that never makes the GPU wait, and the console line with
its speed. train.py is the reader's file; this one is what makes it safe to run."""
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
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import store
from model import GPT, SIZES, load_checkpoint

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

"""train.py's plumbing: the device, the processes, the data made ready, the run folder (its lock,
files, checkpoints and resume), the console line. Its command line: options.py."""
import contextlib
import fcntl
import json
import logging
import math
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import data
import prepare
import store
from model import GPT, load_checkpoint, load_weights

STAT_TOKENS = 524_288      # 2¹⁹ tokens ≈ the 5·10⁵ logit vectors of the paper's Sec. 3
TEXT_CACHE = "data/text"   # where --data text files are tokenized (prepare.text_dataset)
LOCK = ".lock"             # in the run folder: held (fcntl.flock) by the process using it
STALE_TEMP = re.compile(r"\..+\.\d+\.[0-9a-f]{8}\.tmp")  # store.open_atomic's temporary names
# What a run computes: --resume refuses a run folder that recorded others.
RUN_DEFINING = ("size", "head", "lr", "tie", "lam", "cap", "vocab_size", "steps", "warmup",
                "min_lr", "batch_size", "seq_len", "seed", "dtype", "data_fingerprint",
                "data_order")
OLD_DEFAULTS = {"data_order": "sequential"}  # what runs recorded before an option existed used
# Only a step's rounding: --resume takes new ones and says so (CPU threads: choose_cpu_threads).
# Every step reads the same rows however micro_batch and world_size split them; besides rounding
# they change which tokens a log step measures (each process's last micro-batch) and, where
# --eval_tokens or --stat_tokens is no multiple of processes × micro_batch × seq_len, or the
# tokens pass the first val shard, which an evaluation or the final statistics read; head_dtype
# changes what prec_* measure.
ROUNDING = ("micro_batch", "world_size", "loss_chunk", "head_dtype", "compile", "tf32")
# The cosine schedule ends at --steps, so a finished run cannot go on.
TRAIN_LONGER = "to train longer, start a new run (another --out_dir) with a larger --steps"
# Dense bf16 peak FLOP/s of one GPU, first match in its name (NVL boards clock below SXM ones)
PEAK_BF16_FLOPS = (("A100", 312e12), ("H100 PCIe", 756e12), ("H100 NVL", 835e12),
                   ("H200 NVL", 835e12), ("H100", 989e12), ("H200", 989e12))


def fail(message: str):
    """Exit 1 with one sentence; every check runs on all ranks alike or on rank 0, which says it."""
    raise SystemExit(1 if int(os.environ.get("RANK", 0)) else f"train.py: error: {message}")


def resolve_device(args, error) -> str:
    """Sets "auto" --device, --dtype, --compile (CUDA: bf16, compiled; CPU: float32, eager)."""
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(args.device)
    except RuntimeError:
        error(f"--device {args.device!r} is not a torch device; use cpu, cuda or cuda:N")
    if device.type not in ("cpu", "cuda"):
        error(f"--device {args.device} is not supported: train.py runs on cpu or cuda")
    if device.type == "cuda" and (device.index or 0) >= (gpus := torch.cuda.device_count()):
        error(f"--device {args.device} " + (f"names a GPU that is not there; this machine "
              f"has {gpus}" if gpus else "asks for CUDA but no GPU is visible; use --device cpu"))
    if args.tf32 and device.type != "cuda":
        error("--tf32 asks for TensorFloat-32 matmuls, which only CUDA GPUs have; drop it")
    if args.dtype == "auto":
        args.dtype = "bfloat16" if device.type == "cuda" else "float32"
    if args.compile is None:
        args.compile = device.type == "cuda"
    return device.type


# Processes: torchrun sets RANK (over all nodes), LOCAL_RANK (on this node) and WORLD_SIZE.
@dataclass
class Dist:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def master(self) -> bool:  # global rank 0 alone prints and writes files
        return self.rank == 0

    def say(self, *lines):
        """Print on rank 0; once stdout's reader is gone (`| head`), the run goes on silently."""
        if not self.master:
            return
        try:
            print(*lines, flush=True)
        except BrokenPipeError:  # stdout now leads nowhere, so that no later print fails
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


@contextlib.contextmanager
def run_process(args):
    """This process's Dist, in torchrun's group (NCCL or gloo); a full disk or Ctrl-C: one line."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C: KeyboardInterrupt from now
    world_size, device = int(os.environ.get("WORLD_SIZE", 1)), torch.device(args.device)
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    cuda = device.type == "cuda"
    try:
        if cuda:  # "cuda" means the first GPU; under torchrun, the process's own
            device = torch.device("cuda", local_rank if world_size > 1 else device.index or 0)
            torch.cuda.set_device(device)
        torch.set_float32_matmul_precision("high" if args.tf32 else "highest")  # TF32 if asked
        if world_size > 1:
            dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
        yield Dist(rank, local_rank, world_size, device)
    except store.WriteError as err:  # a full disk, a folder that cannot be written
        fail(str(err))
    except KeyboardInterrupt:
        if rank == 0:
            ckpt = Path(args.out_dir) / "ckpt.pt"
            print("train.py: interrupted; " + (f"--resume continues from {ckpt}" if ckpt.is_file()
                  else f"no checkpoint yet (every --save_every {args.save_every} steps), so "
                  f"--resume starts at step 0"), file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def choose_cpu_threads(ctx: Dist, recorded: int | None = None) -> int | None:
    """CPU threads (None on a GPU): a resumed run's (1 and 2 threads round gradients apart),
    else OMP_NUM_THREADS's, else the node's share of the idle cores; the fewest of any rank."""
    if ctx.device.type != "cpu":
        return None
    if recorded:
        torch.set_num_threads(recorded)
    elif "OMP_NUM_THREADS" not in os.environ:  # torch's one per core oversubscribes a busy host
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            os.cpu_count() or 1
        idle = int(cores - os.getloadavg()[0])
        torch.set_num_threads(max(1, idle // int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
    if dist.is_initialized():  # every rank computes alike, and the record is rank 0's
        fewest = torch.tensor(torch.get_num_threads())
        dist.all_reduce(fewest, op=dist.ReduceOp.MIN)
        torch.set_num_threads(int(fewest))
    return torch.get_num_threads()


# The data: made ready once per node, checked before any step
def ready_data(args, ctx: Dist) -> data.ShardLoader:
    """Local rank 0 readies --data (make_ready) while its node's other ranks wait at a barrier;
    then the data's fingerprint (for --resume), --eval_tokens and --stat_tokens cut to what the
    val split holds, and this rank's train loader (its shards checked against what a step reads)."""
    waiting = dist.new_group(backend="gloo", timeout=timedelta(hours=24)) \
        if ctx.world_size > 1 else None  # gloo: NCCL's 10 minutes are too short for a download
    problem = make_ready(args) if ctx.local_rank == 0 else ""
    failed = torch.tensor([float(bool(problem))])
    if waiting is not None:  # the barrier: local rank 0 is done
        dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=waiting)
    if failed.item():
        fail(problem or "preparing or checking the data failed on another process")
    if args.text and ctx.local_rank != 0:
        args.data = str(prepare.text_dataset(args.text, TEXT_CACHE))  # finds rank 0's folder
    step = ctx.world_size * args.micro_batch * args.seq_len  # val tokens per evaluation step
    try:
        args.data_fingerprint = store.check_dataset(args.data, hash_bytes=0)
        loader = data.ShardLoader(args.data, args.micro_batch, args.seq_len, ctx.rank,
                                  ctx.world_size, "train", args.data_order, args.seed,
                                  step_rows=args.batch_size)  # a step's rows, all ranks
        held = step * data.val_steps_held(args.data, args.micro_batch, args.seq_len,
                                          ctx.world_size)
    except (FileNotFoundError, ValueError) as err:
        fail(str(err))
    for name in ("eval_tokens", "stat_tokens"):
        if getattr(args, name) > held:
            ctx.say(f"--{name} {getattr(args, name):,} is more than the val split holds: using "
                    f"its {held:,} tokens")
        setattr(args, name, min(held, max(step, getattr(args, name))))  # ≥ 1 micro-batch a rank
    return loader


def make_ready(args) -> str:
    """The text tokenized or missing default shards downloaded, then checked: '' or a sentence."""
    try:
        if args.text:
            args.data = str(prepare.text_dataset(args.text, TEXT_CACHE))
        elif args.data == prepare.DEFAULT_DATA and not all(  # both splits' shards are there
                any(Path(args.data).glob(f"*{split}*.bin")) for split in ("train", "val")):
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
    except FileNotFoundError as err:  # data.py's sentence, then this project's way to make shards
        return (f"{err}; or make a dataset with `python prepare.py fineweb --shards 8 --out DIR` "
                f"(GPT-2 FineWeb) or `python prepare.py text FILES --out DIR` (your own text)")
    except (RuntimeError, OSError, ValueError) as err:
        return str(err)


class FiniteWatch:
    """Whether each step's loss was finite, without making the GPU wait: the flag goes to pinned
    memory and is read one step later, once the next step is queued (at once on the CPU)."""
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
        """The first non-finite step among those readable without waiting (all with wait_all)."""
        while len(self.pending) > (0 if wait_all else self.lag):
            step, flag, event = self.pending.pop(0)
            if event is not None:
                event.synchronize()
            if not bool(flag):
                return step
        return None


# The run folder: one process at a time, files written whole, no other run's files replaced
@contextlib.contextmanager
def run_folder_lock(out: Path):
    """Hold OUT/.lock (fcntl.flock, which the OS drops however its process ends) while the block
    runs; a run that fails before writing a file takes the lock (and the folder it made) away."""
    made = not out.exists()
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
        try:
            try:  # unbuffered: a write that failed must not be retried when the file closes
                os.ftruncate(lock.fileno(), 0)
                os.write(lock.fileno(), f"train.py, process {os.getpid()}\n".encode())
            except OSError as err:
                fail(f"cannot write {out / LOCK} ({err.strerror}); free space or choose another "
                     f"--out_dir")
            for path in out.iterdir():  # a killed run's last temporary files
                if STALE_TEMP.fullmatch(path.name) and path.is_file():
                    path.unlink()
            yield
        except BaseException:
            if [path.name for path in out.iterdir()] == [LOCK]:  # ours, still held
                (out / LOCK).unlink()
                if made:
                    out.rmdir()
            raise


def check_run_folder(args, out: Path, config: dict, say) -> bool:
    """False: --resume finds the run finished; refuses a run without --resume, another's with it."""
    files = sorted(path.name for path in out.iterdir() if path.name != LOCK)
    if files and not args.resume:
        fail(f"{out} already holds a run ({', '.join(files[:4])}); pass --resume to continue "
             f"it, or choose another --out_dir")
    if not files:
        return True
    recorded, path = None, out / "config.json"
    with contextlib.suppress(OSError, ValueError):  # is_file: not a pipe, whose read blocks
        recorded = json.loads(path.read_text()) if path.is_file() else None
    if not isinstance(recorded, dict):
        fail(f"{out} holds {', '.join(files[:4])} but no config.json of train.py, so it is not "
             f"a run to resume; choose another --out_dir")
    refuse_other_settings(out, recorded, config)
    if (out / "summary.json").exists():
        say(f"{out / 'summary.json'} exists: the run is finished, nothing to do; {TRAIN_LONGER}")
        return False
    return True


def refuse_other_settings(source, recorded: dict, config: dict):
    """Fail, naming them, where the run-defining settings recorded in source differ."""
    def settings(run):  # as options; the dataset by folder and fingerprint
        return " ".join(f"--data {run.get('data')} (dataset {str(run.get(key))[:12]})"
                        if key == "data_fingerprint" else f"--{key} {run.get(key)}"
                        for key in keys)
    if keys := [key for key in RUN_DEFINING
                if recorded.get(key, OLD_DEFAULTS.get(key)) != config[key]]:
        fail(f"--resume: the run of {source} was trained with {settings(recorded)}, not "
             f"{settings(config)}; resume with its own settings or choose another --out_dir")


def json_text(record: dict, indent=None) -> str:
    """record as JSON, which has no NaN or ∞: a non-finite number is written as null."""
    return json.dumps({key: None if isinstance(value, float) and not math.isfinite(value)
                       else value for key, value in record.items()}, indent=indent)


def write_json(path, obj: dict):
    store.write_atomic(path, json_text(obj, indent=2) + "\n")


def trim_log(path: Path, last_step: int):
    """Keep the log lines up to the checkpoint's step; a line cut off by a kill is dropped."""
    if path.exists() and not path.is_file():
        fail(f"{path} is not a file, so the run's log cannot be continued; move it away")
    kept = []
    for line in path.read_text().splitlines() if path.exists() else ():
        with contextlib.suppress(ValueError, KeyError, TypeError):  # not a whole line of ours
            if json.loads(line)["step"] <= last_step:
                kept.append(line + "\n")
    store.write_atomic(path, "".join(kept))


def restore(path: Path, config: dict, model: GPT, optimizer, loader, device):
    """Model, optimizer, loader and RNG from ckpt.pt; its Progress and the config it recorded."""
    def refuse(reason):
        fail(f"{path} {reason}; delete it to start afresh")
    try:
        ckpt = load_checkpoint(path)
    except (ValueError, FileNotFoundError) as err:  # FileNotFoundError: not a file
        fail(f"{str(err).rstrip('.')}; delete it to start afresh")
    if missing := [key for key in ("optimizer", "loader", "rng", "init_loss", "train_time_s")
                   if key not in ckpt]:
        refuse(f"holds weights but not what --resume needs ({', '.join(missing)})")
    for key in ("init_loss", "train_time_s"):  # they go into summary.json as they are
        if not isinstance(ckpt[key], (int, float)) or isinstance(ckpt[key], bool):
            refuse(f"records {key} {ckpt[key]!r}, not a number")
    refuse_other_settings(path, ckpt["config"], config)
    try:
        load_weights(model, ckpt["model"], path, "delete it to start afresh")
    except ValueError as err:
        fail(str(err))
    try:
        optimizer.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        if device.type == "cuda" and "cuda" in ckpt["rng"]:
            torch.cuda.set_rng_state(ckpt["rng"]["cuda"], device)
    except (ValueError, KeyError, TypeError, RuntimeError) as err:
        refuse(f"cannot continue this run ({err})")
    # AdamW takes moments of any shape, and its first step would then fail deep inside.
    for number, param in enumerate(p for group in optimizer.param_groups for p in group["params"]):
        for name, value in optimizer.state.get(param, {}).items():
            if torch.is_tensor(value) and value.dim() and value.shape != param.shape:
                refuse(f"holds optimizer state {name} of shape {tuple(value.shape)} for "
                       f"parameter {number} of shape {tuple(param.shape)}")
    return Progress(ckpt["step"], ckpt["init_loss"], ckpt["train_time_s"]), ckpt["config"]


@dataclass
class Progress:  # what a checkpoint carries besides the weights, the optimizer and the loader
    step: int = 0                    # optimizer steps done
    init_loss: float | None = None   # val loss before training; None until measured
    train_time_s: float = 0.0        # training seconds so far


class RunFolder:
    """The run folder as train.py writes it: rank 0 writes, on other ranks each call does nothing.
    Files: config.json, log.jsonl (a line per log step), ckpt.pt (every --save_every steps, for
    --resume), ckpt_step*.pt (--keep_every) and summary.json (the run is finished), each whole."""

    def __init__(self, out: Path, config: dict, loader: data.ShardLoader, ctx: Dist):
        self.out, self.config, self.loader, self.ctx = out, config, loader, ctx

    def resume(self, args, model: GPT, optimizer) -> Progress:
        """ckpt.pt's Progress with --resume (restore), else a fresh one; then the CPU threads,
        config.json, and the log cut to the step."""
        progress, recorded, ckpt = Progress(), {}, self.out / "ckpt.pt"
        if args.resume and ckpt.exists():
            progress, recorded = restore(ckpt, self.config, model, optimizer, self.loader,
                                         self.ctx.device)
        elif args.resume:
            self.ctx.say(f"{self.out} holds no ckpt.pt: the run starts at step 0")
        if changed := [key for key in ROUNDING
                       if key in recorded and recorded[key] != self.config[key]]:
            self.ctx.say(f"--resume with {', '.join(f'{k} {self.config[k]}' for k in changed)}, "
                         f"not the run's {', '.join(str(recorded[k]) for k in changed)}: the "
                         f"same run, rounded otherwise")
        self.config["cpu_threads"] = choose_cpu_threads(self.ctx, recorded.get("cpu_threads"))
        if self.ctx.master:
            write_json(self.out / "config.json", self.config)
            trim_log(self.out / "log.jsonl", progress.step)  # a fresh run starts an empty log
        return progress

    def log(self, record: dict):
        """A JSON line at the end of log.jsonl, whole or not at all (a full disk's part is cut)."""
        if not self.ctx.master:
            return
        with store.WatchedFile.opened(self.out / "log.jsonl", "ab") as f:  # all, or WriteError
            size = os.fstat(f.fileno()).st_size
            try:
                f.write((json_text(record) + "\n").encode())
            except store.WriteError:
                os.ftruncate(f.fileno(), size)
                raise

    def save_checkpoint(self, model: GPT, optimizer, progress: Progress):
        """ckpt.pt: what --resume needs, weights_only-loadable; the unwrapped model's weights, so
        compiled and eager runs resume each other; the loader position is the same on every rank."""
        if not self.ctx.master:
            return
        rng = {"torch": torch.get_rng_state(), **({"cuda": torch.cuda.get_rng_state(
            self.ctx.device)} if self.ctx.device.type == "cuda" else {})}
        with store.open_atomic(self.out / "ckpt.pt") as f:  # a unique temporary file, renamed
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "loader": self.loader.state_dict(), "rng": rng, "config": self.config,
                        **vars(progress)}, f)

    def snapshot(self, model: GPT, step: int):  # ckpt_step*.pt, for analyze.py's curves
        if self.ctx.master:
            with store.open_atomic(self.out / f"ckpt_step{step:07d}.pt") as f:
                torch.save({"model": model.state_dict(), "step": step, "config": self.config}, f)

    def compile_failed(self, failure: str):  # what CompileWatch caught
        self.config["compile_failed"] = failure
        self.ctx.say(f"torch.compile failed ({failure}); the run goes on uncompiled (eager) where "
                     f"it failed, recorded as compile_failed in config.json")
        if self.ctx.master:
            write_json(self.out / "config.json", self.config)

    def finish(self, summary: dict):
        if self.ctx.master:
            write_json(self.out / "summary.json", summary)
        self.ctx.say("done: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                          for k, v in summary.items()))
        self.ctx.say(f"the run is finished; {TRAIN_LONGER}")


@contextlib.contextmanager
def run_folder(args, ctx: Dist):
    """The run folder, which rank 0 locks for the block, with --data made ready and checked: a
    RunFolder, or None when --resume finds the run finished (check_run_folder)."""
    out = Path(args.out_dir)
    with run_folder_lock(out) if ctx.master else contextlib.nullcontext():
        if ctx.master and not args.resume:  # a run in the folder is refused before any download
            check_run_folder(args, out, {}, ctx.say)
        loader = ready_data(args, ctx)
        config = dict(vars(args), world_size=ctx.world_size)
        done = ctx.master and not check_run_folder(args, out, config, ctx.say)
        finished = torch.tensor(float(done), device=ctx.device)
        if dist.is_initialized():  # rank 0 decides
            dist.all_reduce(finished)
        yield None if finished.item() else RunFolder(out, config, loader, ctx)


# Speed and the console line
def sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_memory(device: torch.device) -> int:
    """Bytes of memory of the GPU, or of the machine for a CPU (Linux / Unix)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cpu_record() -> dict:
    """What decides a bf16 run on a CPU: the model name, its bf16-related flags, torch's kernels."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    field = lambda name: next((line.split(":", 1)[1].strip() for line in info.splitlines()
                               if line.startswith(name)), "unknown")
    flags = field("flags").split()
    return dict(model=field("model name"), torch=torch.__version__,
                capability=torch.backends.cpu.get_cpu_capability(),
                flags=[f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
                       if f in flags])


def peak_flops(device: torch.device, dtype: str):  # dense bf16 FLOP/s of one GPU; None: unknown
    if device.type != "cuda" or dtype != "bfloat16":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_FLOPS if key in name), None)


class CompileWatch:
    """What torch.compile gave up on (suppress_errors logs a traceback and runs eagerly): each
    root cause in one line, kept from the console, for train.py to say once."""
    LOGGER = logging.getLogger("torch._dynamo.convert_frame")

    def __init__(self):
        torch._dynamo.config.suppress_errors = True  # what fails to compile runs eagerly
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
        return False

    def stop(self) -> str | None:  # the first failure; None when everything compiled
        self.LOGGER.removeFilter(self)
        return self.failures[0] if self.failures else None


class Throughput:
    """Tokens per second since the last restart, timed between device syncs (not CUDA's queue)."""
    def __init__(self, device: torch.device, tokens_per_step: int):
        self.device, self.tokens_per_step = device, tokens_per_step
        self.restart()

    def restart(self):
        sync(self.device)
        self.start, self.steps = time.perf_counter(), 0

    def read(self) -> tuple[float, float]:  # tokens/s, seconds per step
        sync(self.device)
        per_step = (time.perf_counter() - self.start) / self.steps
        return self.tokens_per_step / per_step, per_step


def eta_seconds(step: int, args, per_step: float, log_s: float, eval_s: float,
                log_tokens: int) -> float:
    """Seconds left after `step`: steps, log steps and evaluations (each as long as the last), and
    the final statistics over --stat_tokens (per token as long as a log step's over log_tokens)."""
    final_stats = log_s * args.stat_tokens / log_tokens
    if step == args.steps:
        return final_stats

    def count(every):  # multiples of `every` in (step, steps], and --steps itself
        return (args.steps // every - step // every + bool(args.steps % every)) if every else 1
    return ((args.steps - step) * per_step + count(args.log_every) * log_s
            + count(args.eval_every) * eval_s + final_stats)


def log_line(record: dict, steps: int, eta: float | None) -> str:
    """step, loss, lr and what was measured of tok/s, MFU, ETA (not over a process's first step,
    which compiles or warms up) and val loss."""
    s = int(eta or 0)  # the ETA as 1h05m or 4m09s
    duration = f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
    shown = {**record, "eta": None if eta is None else duration}
    parts = [f"step {record['step']:>{len(str(steps))}}/{steps}", f"loss {record['loss']:.4f}",
             f"lr {record['lr']:.2e}"]
    parts += [form.format(shown[key]) for key, form in (("tok_per_s", "{:,.0f} tok/s"),
              ("mfu", "MFU {:.1%}"), ("eta", "ETA {}"), ("val_loss", "val {:.4f}"))
              if shown.get(key) is not None]
    return " | ".join(parts)

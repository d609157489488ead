"""One training run with the recipe of the paper's App. A, on one process or many (torchrun DDP).

    python train.py --size tiny --device cpu --data data/mytext --steps 300 --warmup 30 \\
        --batch_size 8 --micro_batch 8 --seq_len 128 --out_dir runs/tiny       # a laptop
    torchrun --nproc_per_node=4 train.py --head mu_center                     # the paper's 4 GPUs

One optimizer step: the global batch of --batch_size sequences is split into micro-batches of
--micro_batch sequences per process, A = batch_size / (micro_batch · world_size) of them on
every process (gradient accumulation). Each micro-batch's loss is backpropagated as loss / A;
DDP averages gradients over the processes on the last micro-batch only. Then the global
gradient norm is clipped to 1.0, AdamW steps, and head.after_step(W) runs: μ-centering sets
eᵢ ← eᵢ − μ. Every rank computes μ from identical weights, so no communication is needed.

The run folder (--out_dir) holds config.json, log.jsonl (one line per log step), ckpt.pt
(everything --resume needs; written atomically every --save_every steps) and summary.json
(written once at the end; its presence means the run is finished). A run whose loss becomes
non-finite stops, records diverged: true and exits 0, so a sweep carries on.
"""
import argparse
import contextlib
import json
import math
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import data
import fused_loss
import heads
from model import GPT, SIZES, config_for

# ---------------------------------------------------------------------------------------------
# The recipe of the paper's App. A (Table 4) and the measurement settings, in one place.
# The command-line defaults follow in build_parser().
ADAM_BETAS = (0.9, 0.95)
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.0
GRAD_CLIP = 1.0            # the global gradient norm ‖g‖₂ is clipped to this
STAT_TOKENS = 131_072      # validation tokens behind the final logit statistics
STAT_CHUNK = 1024          # tokens per logits chunk: bounds memory to STAT_CHUNK × V floats
FINEWEB_SHARD_TOKENS = 100_000_000
FINEWEB10B_TRAIN_SHARDS = 103  # the default dataset has no more; longer runs wrap around
# Dense bf16 tensor-core peak FLOP/s of one GPU, first match in torch.cuda.get_device_name().
PEAK_BF16_FLOPS = (("A100", 312e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12))
# Settings that define what a run computes; --resume refuses a checkpoint that differs in any.
RUN_DEFINING = ("size", "head", "lr", "tie", "lam", "cap", "vocab_size", "steps", "warmup",
                "min_lr", "batch_size", "seq_len", "seed")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
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
    a("--warmup", type=non_negative_int, default=5000, help="steps of linear warmup")
    a("--min_lr", type=non_negative_float, default=1e-5, help="end of the cosine decay")
    a("--batch_size", type=positive_int, default=64,
      help="sequences per optimizer step, all processes together")
    a("--micro_batch", type=positive_int, default=16, help="sequences per forward, per process")
    a("--seq_len", type=positive_int, default=2048, help="tokens per sequence")
    a("--seed", type=int, default=0, help="seed of the initial weights")
    a("--loss_chunk", type=non_negative_int, default=None,
      help="tokens per chunk of the LM head's loss (fused_loss.py: same loss and gradients "
           "without the N×V logits); 0 = heads.py's plain path; default: the fastest exact "
           "path measured for the device (fused_loss.DEFAULT_CHUNK)")
    a("--data", default=data.DEFAULT_DATA,
      help="folder of *train*.bin / *val*.bin shards (the default is downloaded if missing)")
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
      help="validation tokens per evaluation (paper: 65.5M)")
    a("--stat_tokens", type=positive_int, default=STAT_TOKENS,
      help="validation tokens for the final logit statistics")
    a("--log_every", type=positive_int, default=10, help="steps between log lines")
    a("--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:1, …")
    a("--dtype", default="auto", choices=("auto", "bfloat16", "float32"),
      help="autocast dtype of the matmuls (auto: bfloat16 on CUDA, float32 elsewhere)")
    a("--compile", action=argparse.BooleanOptionalAction, default=None,
      help="torch.compile the model; None = on CUDA only")
    return p


def _number(kind, rule, test):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; give {rule}") from None
        if not test(value):
            raise argparse.ArgumentTypeError(f"{text} is invalid; give {rule}")
        return value
    return parse


positive_float = _number(float, "a finite number > 0", lambda v: math.isfinite(v) and v > 0)
non_negative_float = _number(float, "a finite number >= 0", lambda v: math.isfinite(v) and v >= 0)
positive_int = _number(int, "an integer > 0", lambda v: v > 0)
non_negative_int = _number(int, "an integer >= 0", lambda v: v >= 0)


def resolve_device(args, error) -> str:
    """Turn --device/--dtype/--compile "auto" (or None) into what this machine has: CUDA with
    bf16 autocast and torch.compile when a GPU is visible, else CPU in float32, uncompiled.
    Calls error(message) for a device that is not usable. Returns the device type."""
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device_type = torch.device(args.device).type
    except RuntimeError:
        error(f"--device {args.device!r} is not a torch device; use cpu, cuda or cuda:N")
    if device_type == "cuda" and not torch.cuda.is_available():
        error(f"--device {args.device} asks for CUDA but no GPU is visible; use --device cpu")
    if args.dtype == "auto":
        args.dtype = "bfloat16" if device_type == "cuda" else "float32"
    if args.compile is None:
        args.compile = device_type == "cuda"
    return device_type


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, checked and resolved (device, dtype, compile); bad input ends in
    parser.error: one sentence and exit code 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.min_lr > args.lr:
        parser.error(f"--min_lr {args.min_lr:g} exceeds --lr {args.lr:g}; the cosine decays "
                     f"from --lr down to --min_lr")
    try:
        heads.build(args.head, lam=args.lam, cap=args.cap)
    except ValueError as err:
        parser.error(str(err))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    per_pass = args.micro_batch * world_size
    if args.batch_size % per_pass:
        parser.error(f"--batch_size {args.batch_size} must be a multiple of --micro_batch × "
                     f"processes = {args.micro_batch} × {world_size} = {per_pass}; change "
                     f"--batch_size or --micro_batch")
    resolve_device(args, parser.error)
    return args


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


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Σ over processes, in place (a no-op on one process)."""
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def fail(message: str):
    """End the run with one sentence and no traceback (exit code 1)."""
    raise SystemExit(f"train.py: error: {message}")


# ---------------------------------------------------------------------------------------------
# Data

def has_shards(data_dir) -> bool:
    try:
        data.shard_paths(data_dir, "train"), data.shard_paths(data_dir, "val")
        return True
    except FileNotFoundError:
        return False


def fetch_default_data(args, ctx: Dist):
    """Download the default FineWeb shards when --data is left at its default and none are
    there. Local rank 0 of every node downloads; the others wait at a gloo barrier with a long
    timeout (NCCL's default of 10 minutes is too short for 10 GB). All ranks agree on whether
    a download is needed before anyone starts, so no rank can see a half-fetched folder."""
    needed = torch.tensor([0.0 if has_shards(args.data) else 1.0])
    waiting = None
    if ctx.world_size > 1:
        waiting = dist.new_group(backend="gloo", timeout=timedelta(hours=24))
        dist.all_reduce(needed, op=dist.ReduceOp.MAX, group=waiting)
    if not needed.item():
        return
    tokens = args.steps * args.batch_size * args.seq_len
    shards = min(math.ceil(tokens / FINEWEB_SHARD_TOKENS), FINEWEB10B_TRAIN_SHARDS)
    problem = ""
    if ctx.local_rank == 0:
        print(f"no shards in {args.data}: downloading FineWeb (1 val + {shards} train shards "
              f"of 100M tokens) …", flush=True)
        try:
            data.fetch_fineweb(args.data, n_train_shards=shards)
        except (RuntimeError, OSError, ValueError) as err:
            problem = str(err.__cause__ or err)  # the network's reason, without data.py's advice
    failed = torch.tensor([1.0 if problem else 0.0])
    if waiting is not None:
        dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=waiting)
    if failed.item():
        fail(f"the FineWeb download into {args.data} failed ({problem or 'on another process'}); "
             f"to train on local text instead, run `python data.py text FILES --out DIR` and "
             f"pass --data DIR")


def open_data(args, ctx: Dist):
    """The rank's training loader, with the data checked before any step: shards present and
    valid, token ids < vocab_size, enough validation tokens for the evaluations."""
    try:
        loader = data.ShardLoader(args.data, args.micro_batch, args.seq_len, ctx.rank,
                                  ctx.world_size, split="train")
        loader.check_vocab(args.vocab_size)
        data.ShardLoader(args.data, 1, 1, split="val").check_vocab(args.vocab_size)
        for name in ("eval_tokens", "stat_tokens"):
            try:
                val_batches(getattr(args, name), args, ctx)
            except ValueError as err:
                raise ValueError(str(err).replace("eval_tokens", f"--{name}")) from None
    except (FileNotFoundError, ValueError) as err:
        fail(str(err))
    return loader


def val_batches(tokens: int, args, ctx: Dist):
    """This rank's share of the first `tokens` validation tokens (at least one micro-batch per
    rank, so that the paper's 131,072 statistics tokens also work on 8 GPUs)."""
    tokens = max(tokens, ctx.world_size * args.micro_batch * args.seq_len)
    return data.val_batches(args.data, tokens, args.micro_batch, args.seq_len, ctx.rank,
                            ctx.world_size)


def device_batches(loader, device):
    """next_batch() of the loader, moved to the device (asynchronously from pinned memory)."""
    def next_batch():
        x, y = loader.next_batch()
        if device.type == "cuda":
            x, y = x.pin_memory(), y.pin_memory()
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    return next_batch


# ---------------------------------------------------------------------------------------------
# The training step (bench.py reuses these)

def build_model(args) -> GPT:
    """The GPT of --size with the head of --head; --seed fixes the initial weights."""
    head = heads.build(args.head, lam=args.lam, cap=args.cap)
    config = config_for(args.size, vocab_size=args.vocab_size, block_size=args.seq_len,
                        tie=args.tie)
    head.loss_path = fused_loss.loss_path(args.loss_chunk, torch.device(args.device).type)
    torch.manual_seed(args.seed)
    model = GPT(config, head)
    # The callers feed checked ids (train.py checks every shard in open_data, bench.py draws
    # them in range), so the model's per-forward check and its host sync are not needed.
    model.check_token_ids = False
    return model


def make_optimizer(model: GPT, args) -> torch.optim.AdamW:
    """AdamW with β = (0.9, 0.95), ε = 1e-8, no weight decay (App. A); fused on CUDA."""
    return torch.optim.AdamW(model.parameters(), lr=args.lr, betas=ADAM_BETAS, eps=ADAM_EPS,
                             weight_decay=WEIGHT_DECAY,
                             fused=next(model.parameters()).is_cuda)


def lr_at(step: int, args) -> float:
    """η(s) for optimizer step s = 0 … S−1 (S = --steps, W = --warmup):
        s < W:  η·(s+1)/W                                     linear warmup, never 0
        s ≥ W:  η_min + ½(η − η_min)(1 + cos(π·(s−W)/(S−W)))  cosine from η down to η_min."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * progress))


def autocast(device: torch.device, dtype: str):
    """The mixed-precision context: bf16 matmuls with float32 weights, or plain float32."""
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, dtype))


def unwrap(model) -> GPT:
    """The GPT inside DDP and torch.compile wrappers."""
    model = model.module if isinstance(model, DDP) else model
    return getattr(model, "_orig_mod", model)


@dataclass
class StepResult:
    loss: torch.Tensor       # mean training loss over the global batch (0-dim, on the device)
    grad_norm: torch.Tensor  # ‖g‖₂ before clipping
    last_x: torch.Tensor     # this process's last micro-batch, for logit statistics
    last_y: torch.Tensor     # and its targets


def train_step(model, optimizer, next_batch, lr: float, grad_accum: int, amp) -> StepResult:
    """One optimizer step: grad_accum micro-batches, clip, AdamW, head.after_step(W).

    The gradient is g = (1/A) Σₐ ∇loss_a averaged over processes, the gradient of the mean
    loss over the global batch (every micro-batch has the same number of tokens). Nothing
    here waits for the device: the loss stays a tensor (its all-reduce is queued, not read)."""
    raw = unwrap(model)
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss_sum = torch.zeros((), device=raw.output_weight.device)
    for micro in range(grad_accum):
        x, y = next_batch()
        last = micro == grad_accum - 1
        # DDP all-reduces gradients during backward; on the last micro-batch only.
        sync = model.no_sync() if isinstance(model, DDP) and not last else contextlib.nullcontext()
        with sync:
            with amp:
                loss, _ = model(x, y)
            (loss / grad_accum).backward()
        loss_sum += loss.detach()
    grad_norm = torch.nn.utils.clip_grad_norm_(raw.parameters(), GRAD_CLIP)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    raw.head.after_step(raw.output_weight)
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    return StepResult(all_reduce_sum(loss_sum) / (grad_accum * world_size), grad_norm, x, y)


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
# Measurements

def sync(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_flops(device: torch.device, dtype: str):
    """Dense bf16 peak FLOP/s of one device, or None when unknown (CPU, other GPUs, float32)."""
    if device.type != "cuda" or dtype != "bfloat16":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_FLOPS if key in name), None)


def mu_norm(model: GPT) -> torch.Tensor:
    """‖μ‖, μ = (1/V) Σᵢ eᵢ the mean output embedding (Eq. 7)."""
    return heads.mean_embedding(model.output_weight.detach()).norm()


HEAD_STATS = heads.LOGIT_STATS + heads.PRECISION_STATS  # logged and summarised per token


@torch.no_grad()
def head_stat_sums(model: GPT, x: torch.Tensor, y: torch.Tensor, args, amp) -> torch.Tensor:
    """Σ over the tokens of x of the per-token statistics of HEAD_STATS (heads.logit_stat_sums:
    mean, std, max |l|, log²Z of the logits as the run computes them; heads.precision_stat_sums:
    what the matmul's dtype costs them), and the token count: float64 (8,). Divided by the
    count they give the means over tokens. STAT_CHUNK tokens at a time."""
    with amp:
        h = model.hidden(x).flatten(0, -2)
    matmul_dtype = torch.float32 if args.dtype == "float32" else getattr(torch, args.dtype)
    sums = torch.zeros(len(HEAD_STATS) + 1, dtype=torch.float64, device=h.device)
    for chunk, targets in zip(h.split(STAT_CHUNK), y.flatten().split(STAT_CHUNK)):
        with amp:
            logits = model.head.logits(chunk, model.output_weight)
        sums[:4] += heads.logit_stat_sums(logits)
        sums[4:] += heads.precision_stat_sums(model.head, chunk, model.output_weight, targets,
                                              matmul_dtype)
    return sums


def head_stats(sums: torch.Tensor) -> dict:
    """The means over all tokens of all processes, from head_stat_sums (all-reduced here)."""
    sums = all_reduce_sum(sums)
    return dict(zip(HEAD_STATS, (sums[:-1] / sums[-1]).tolist()))


@torch.no_grad()
def evaluate(model, args, ctx: Dist, amp) -> float:
    """Mean cross-entropy over the first --eval_tokens validation tokens; every rank scores
    its share and the sums are added over ranks."""
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=ctx.device)  # Σ CE, tokens
    for x, y in val_batches(args.eval_tokens, args, ctx):
        x, y = x.to(ctx.device), y.to(ctx.device)
        with amp:
            _, stats = model(x, y)
        total += torch.stack((stats["ce"].double() * y.numel(), total.new_tensor(y.numel())))
    model.train()
    all_reduce_sum(total)
    return (total[0] / total[1]).item()


@torch.no_grad()
def final_head_stats(model: GPT, args, ctx: Dist, amp) -> dict:
    """HEAD_STATS over the first --stat_tokens validation tokens (paper: 5·10⁵ logit vectors)."""
    sums = torch.zeros(len(HEAD_STATS) + 1, dtype=torch.float64, device=ctx.device)
    for x, y in val_batches(args.stat_tokens, args, ctx):
        sums += head_stat_sums(model, x.to(ctx.device), y.to(ctx.device), args, amp)
    return head_stats(sums)


# ---------------------------------------------------------------------------------------------
# The run folder

def finite_or_none(value):
    """JSON has no NaN or ∞: a non-finite number is written as null."""
    return value if not isinstance(value, float) or math.isfinite(value) else None


def write_json(path: Path, obj: dict):
    """Atomically: a temporary file renamed into place, so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({k: finite_or_none(v) for k, v in obj.items()}, indent=2) + "\n")
    os.replace(tmp, path)


def append_log(path: Path, record: dict):
    with open(path, "a") as f:
        f.write(json.dumps({k: finite_or_none(v) for k, v in record.items()}) + "\n")


def trim_log(path: Path, last_step: int):
    """Keep the log lines up to the checkpoint's step: the steps after it are trained again,
    and a line cut off by a kill is dropped."""
    kept = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                if json.loads(line)["step"] <= last_step:
                    kept.append(line + "\n")
            except (ValueError, KeyError, TypeError):
                pass
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(kept))
    os.replace(tmp, path)


def save_atomic(obj: dict, path: Path):
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def rng_state(device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device):
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def load_checkpoint(path: Path, config: dict) -> dict:
    """ckpt.pt, loaded without running code (weights_only) and checked against the settings."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # unpickling errors come in many types; all mean "unusable file"
        fail(f"{path} cannot be read as a checkpoint ({type(err).__name__}); delete it to "
             f"start afresh")
    needed = ("model", "optimizer", "step", "loader", "rng", "config", "init_loss", "train_time_s")
    if not isinstance(ckpt, dict) or any(key not in ckpt for key in needed):
        fail(f"{path} is not a checkpoint of train.py (it lacks some of {', '.join(needed)}); "
             f"delete it to start afresh")
    for key in RUN_DEFINING:
        if ckpt["config"].get(key) != config[key]:
            fail(f"--resume: {path} was trained with --{key} {ckpt['config'].get(key)}, not "
                 f"{config[key]}; resume with the run's own settings or use another --out_dir")
    return ckpt


# ---------------------------------------------------------------------------------------------
# The run

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


def log_line(record: dict, steps: int, eta: float) -> str:
    """step, loss, lr, tokens/s, MFU, ETA: one line a person can read."""
    parts = [f"step {record['step']:>{len(str(steps))}}/{steps}", f"loss {record['loss']:.4f}",
             f"lr {record['lr']:.2e}", f"{record['tok_per_s']:,.0f} tok/s"]
    if record["mfu"] is not None:
        parts.append(f"MFU {record['mfu']:.1%}")
    parts.append(f"ETA {format_duration(eta)}")
    if "val_loss" in record:
        parts.append(f"val {record['val_loss']:.4f}")
    return " | ".join(parts)


def step_metrics(raw: GPT, result: StepResult, args, amp) -> dict:
    """loss, grad_norm, ‖μ‖ and the head statistics of this process's last micro-batch
    (summed over processes). Reads device values, so log steps only."""
    sums = head_stat_sums(raw, result.last_x, result.last_y, args, amp)
    return {"loss": result.loss.item(), "grad_norm": result.grad_norm.item(),
            "mu_norm": mu_norm(raw).item(), **head_stats(sums)}


def save_checkpoint(out: Path, raw: GPT, optimizer, loader, step: int, config: dict,
                    init_loss: float, train_time: float):
    """ckpt.pt: everything --resume needs, tensors and plain types only (weights_only-loadable).
    The unwrapped model's state_dict has no `_orig_mod.` prefix, so compiled and eager runs
    resume each other. The loader position is global, the same on every rank."""
    save_atomic({"model": raw.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                 "loader": loader.state_dict(), "rng": rng_state(raw.output_weight.device),
                 "config": config, "init_loss": init_loss, "train_time_s": train_time},
                out / "ckpt.pt")


def save_snapshot(out: Path, raw: GPT, step: int, config: dict):
    """ckpt_step{step:07d}.pt: the weights alone, for curves over training (analyze.py)."""
    save_atomic({"model": raw.state_dict(), "step": step, "config": config},
                out / f"ckpt_step{step:07d}.pt")


def claim_run_folder(args, out: Path, say) -> bool:
    """False when --resume finds the run finished; refuses to overwrite a run without it."""
    if args.resume and (out / "summary.json").exists():
        say(f"{out / 'summary.json'} exists: the run is finished, nothing to do")
        return False
    if not args.resume and ((out / "ckpt.pt").exists() or (out / "summary.json").exists()):
        fail(f"{out} already holds a run; pass --resume to continue it, or choose another "
             f"--out_dir")
    return True


def restore(path: Path, config: dict, raw: GPT, optimizer, loader, device) -> dict:
    """Model, optimizer, loader position and RNG from ckpt.pt; returns step, init_loss and
    train_time_s."""
    ckpt = load_checkpoint(path, config)
    raw.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    loader.load_state_dict(ckpt["loader"])
    set_rng_state(ckpt["rng"], device)
    return {key: ckpt[key] for key in ("step", "init_loss", "train_time_s")}


def main(argv=None) -> GPT:
    """Train one run as the command line says. Returns the trained (unwrapped) model, or None
    when --resume finds the run already finished."""
    args = parse_args(argv)
    ctx = init_distributed(args)
    try:
        return train(args, ctx)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def train(args, ctx: Dist) -> GPT:
    """Data, model, the training loop, the final evaluation; global rank 0 writes the folder."""
    say = print if ctx.master else (lambda *a, **k: None)
    out, config = Path(args.out_dir), dict(vars(args))
    if not claim_run_folder(args, out, say):
        return None
    if args.data == data.DEFAULT_DATA:
        fetch_default_data(args, ctx)
    loader = open_data(args, ctx)
    if ctx.device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 for what autocast leaves in float32
    raw = build_model(args).to(ctx.device)
    optimizer = make_optimizer(raw, args)
    state = {"step": 0, "init_loss": None, "train_time_s": 0.0}
    if args.resume and (out / "ckpt.pt").exists():
        state = restore(out / "ckpt.pt", config, raw, optimizer, loader, ctx.device)
    step, init_loss = state["step"], state["init_loss"]
    if args.compile:  # a model that fails to compile runs eagerly, with a warning, not a crash
        torch._dynamo.config.suppress_errors = True
    fast = torch.compile(raw) if args.compile else raw
    model = fast if ctx.world_size == 1 else \
        DDP(fast, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    if ctx.master:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "config.json", config)
        trim_log(out / "log.jsonl", step)  # a fresh run starts an empty log

    amp = autocast(ctx.device, args.dtype)
    grad_accum = args.batch_size // (args.micro_batch * ctx.world_size)
    tokens_per_step = args.batch_size * args.seq_len
    say(f"{args.size} ({raw.num_params() / 1e6:.2f}M parameters without the input embedding), "
        f"head {args.head}, lr {args.lr:g}, tie {args.tie}; {ctx.world_size} process(es) × "
        f"{grad_accum} micro-batch(es) of {args.micro_batch}×{args.seq_len} = "
        f"{tokens_per_step:,} tokens per step; {ctx.device} {args.dtype}"
        f"{' compiled' if args.compile else ''}; "
        f"{f'resuming after step {step}' if step else f'{args.steps} steps'}")
    if init_loss is None:
        init_loss = evaluate(fast, args, ctx, amp)
        say(f"step 0: val loss {init_loss:.4f} (ln V = {math.log(args.vocab_size):.4f})")
        if args.keep_every and ctx.master:
            save_snapshot(out, raw, 0, config)

    peak = peak_flops(ctx.device, args.dtype)
    flops_per_token = raw.flops_per_token(args.seq_len)
    watch = FiniteWatch(ctx.device)
    next_batch = device_batches(loader, ctx.device)
    diverged_at, last_val = None, None
    run_start = time.perf_counter()
    speed = Throughput(ctx.device, tokens_per_step)
    while step < args.steps:
        result = train_step(model, optimizer, next_batch, lr_at(step, args), grad_accum, amp)
        step += 1
        speed.steps += 1
        is_eval = step == args.steps or (args.eval_every and step % args.eval_every == 0)
        is_log = is_eval or step % args.log_every == 0
        is_save = step == args.steps or step % args.save_every == 0
        watch.push(step, result.loss)
        diverged_at = watch.first_nonfinite(wait_all=is_log or is_save)
        if diverged_at is not None:
            say(f"step {diverged_at}: the loss is not finite; the run diverged and stops")
            break
        if is_log:
            tok_per_s, per_step = speed.read()
            record = {"step": step, "tokens": step * tokens_per_step,
                      "lr": lr_at(step - 1, args), **step_metrics(raw, result, args, amp),
                      "tok_per_s": tok_per_s,
                      "mfu": flops_per_token * tok_per_s / (peak * ctx.world_size) if peak
                      else None}
            if is_eval:
                record["val_loss"] = last_val = evaluate(fast, args, ctx, amp)
            say(log_line(record, args.steps, eta=(args.steps - step) * per_step))
            if ctx.master:
                append_log(out / "log.jsonl", record)
        if is_save and ctx.master:
            save_checkpoint(out, raw, optimizer, loader, step, config, init_loss,
                            state["train_time_s"] + time.perf_counter() - run_start)
        if args.keep_every and step % args.keep_every == 0 and ctx.master:
            save_snapshot(out, raw, step, config)
        if step == args.stop_at:
            say(f"stopping after step {step} as --stop_at asks; continue with --resume")
            return raw
        if is_log or is_save:  # the next throughput window starts after this bookkeeping
            speed.restart()
    train_time = state["train_time_s"] + time.perf_counter() - run_start

    summary = {"head": args.head, "size": args.size, "lr": args.lr, "tie": args.tie,
               "lam": raw.head.lam, "cap": raw.head.cap, "steps": args.steps}
    if diverged_at is None:
        val_loss = last_val if last_val is not None else evaluate(fast, args, ctx, amp)
        stats = final_head_stats(raw, args, ctx, amp)
        summary |= {"tokens": step * tokens_per_step, "val_loss": val_loss,
                    "diverged": not math.isfinite(val_loss)}
    else:
        stats = dict.fromkeys(HEAD_STATS)
        summary |= {"tokens": diverged_at * tokens_per_step, "val_loss": None, "diverged": True}
    summary |= {"init_loss": init_loss, **stats, "mu_norm": mu_norm(raw).item(),
                "train_time_s": train_time}
    if ctx.master:
        write_json(out / "summary.json", summary)
    say("done: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                             for k, v in summary.items()))
    return raw


if __name__ == "__main__":
    main()

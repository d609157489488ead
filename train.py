"""One training run with the recipe of the paper's App. A, on one process or many (torchrun DDP).

    python train.py --size tiny --data tests/assets/paradise_regained.txt --steps 200 \\
        --batch_size 8 --seq_len 128                                          # on a laptop
    torchrun --nproc_per_node=4 train.py --head mu_center                     # the paper's 4 GPUs

One optimizer step: the global batch of --batch_size sequences is split into micro-batches of
--micro_batch sequences per process, A = batch_size / (micro_batch · world_size) of them on
every process (gradient accumulation). Each micro-batch's loss is backpropagated as loss / A;
DDP averages gradients over the processes on the last micro-batch only. Then the global
gradient norm is clipped to 1.0, AdamW steps, and head.after_step(W) runs: μ-centering sets
eᵢ ← eᵢ − μ. Every rank computes μ from identical weights, so no communication is needed.

--data is a folder of shards, or text files (tokenized once into a cached shard folder); left
at its default, the FineWeb100B shards the run reads are downloaded. The run folder (--out_dir)
holds config.json, log.jsonl (one line per log step), ckpt.pt (everything --resume needs,
every --save_every steps) and summary.json (written at the end: the run is finished). Every
file is replaced atomically; one process at a time may use the folder (OUT_DIR/.lock). A run
whose loss becomes non-finite stops, records diverged: true and exits 0, so a sweep carries on.
"""
import argparse
import contextlib
import math
import os
import sys
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
import prepare
import store
from model import GPT, SIZES, from_config
from runs import (CompileWatch, Dist, FiniteWatch, Throughput, all_reduce_sum, append_log,
                  check_run_folder, device_batches, fail, init_distributed, log_line,
                  one_usage_error_under_torchrun, peak_flops, refuse_oversized_embeddings, restore,
                  run_folder_lock, save_checkpoint, save_snapshot, trim_log, unwrap, write_json)
from store import non_negative_float, non_negative_int, positive_float, positive_int

# ---------------------------------------------------------------------------------------------
# The recipe of the paper's App. A (Table 4) and the measurement settings; more in build_parser().
ADAM_BETAS = (0.9, 0.95)
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.0
GRAD_CLIP = 1.0            # the global gradient norm ‖g‖₂ is clipped to this
WARMUP_SHARE = 20          # default --warmup = --steps / 20: the paper's 5,000 of 100,000
STAT_TOKENS = 524_288      # 2¹⁹ tokens ≈ the 5·10⁵ logit vectors of the paper's Sec. 3
STAT_CHUNK = 1024          # tokens per logits chunk: bounds memory to STAT_CHUNK × V floats
LOG_STAT_TOKENS = 128      # tokens of a log step's statistics (float64: ~3 ms a token on CPU)
TEXT_CACHE = "data/text"   # where --data text files are tokenized (prepare.text_dataset)
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


# ---------------------------------------------------------------------------------------------
# Data

def prepare_data(args, ctx: Dist):
    """Make --data a folder of shards: text files are tokenized once (prepare.text_dataset); the
    default FineWeb shards the run reads are downloaded when missing (prepare.fetch_fineweb).
    Local rank 0 of each node does it while the others wait at a gloo barrier with a long
    timeout (NCCL's 10 minutes are too short for a download). All ranks agree on whether
    there is work before anyone starts, so no rank can see a half-made folder."""
    needed = torch.tensor([float(bool(args.text) or args.data == prepare.DEFAULT_DATA
                                 and not has_shards(args.data))])
    waiting = dist.new_group(backend="gloo", timeout=timedelta(hours=24)) \
        if ctx.world_size > 1 else None
    if waiting is not None:
        dist.all_reduce(needed, op=dist.ReduceOp.MAX, group=waiting)
    if not needed.item():
        return
    problem = make_shards(args) if ctx.local_rank == 0 else ""
    failed = torch.tensor([float(bool(problem))])
    if waiting is not None:  # the barrier: local rank 0 is done
        dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=waiting)
    if failed.item():
        fail(problem or "preparing the data failed on another process")
    if args.text and ctx.local_rank != 0:
        args.data = str(prepare.text_dataset(args.text, TEXT_CACHE))  # finds rank 0's folder


def make_shards(args) -> str:
    """Tokenize --data's text files, or download the default FineWeb shards; returns '' or one
    sentence saying what went wrong."""
    try:
        if args.text:
            args.data = str(prepare.text_dataset(args.text, TEXT_CACHE))
        else:
            shards = prepare.shards_needed(args.steps * args.batch_size * args.seq_len)
            print(f"no shards in {args.data}: downloading {prepare.DEFAULT_DATASET} (1 val + "
                  f"{shards} train shards of {data.SHARD_TOKENS:,} tokens) …", flush=True)
            prepare.fetch_fineweb(args.data, train_shards=shards)
        return ""
    except (RuntimeError, OSError, ValueError) as err:
        if args.text or isinstance(err, store.WriteError):  # a full disk is not a network error
            return str(err)
        return (f"the FineWeb download into {args.data} failed ({err.__cause__ or err}); to "
                f"train on local text instead, pass the text files as --data")


def has_shards(folder) -> bool:
    try:
        return bool(data.shard_paths(folder, "train") and data.shard_paths(folder, "val"))
    except (FileNotFoundError, ValueError):
        return False


def open_data(args, ctx: Dist, say):
    """The rank's training loader, with the data checked before any step: one dataset (its
    fingerprint goes into the run's settings), token ids < vocab_size; --eval_tokens and
    --stat_tokens cut down to what the val split holds, saying so."""
    try:
        args.data_fingerprint = store.check_dataset(args.data)  # --resume compares it
        loader = data.ShardLoader(args.data, args.micro_batch, args.seq_len, ctx.rank,
                                  ctx.world_size, split="train")
        loader.check_vocab(args.vocab_size)
        val = data.ShardLoader(args.data, 1, 1, split="val")
        val.check_vocab(args.vocab_size)
    except (FileNotFoundError, ValueError) as err:
        fail(str(err))
    step = ctx.world_size * args.micro_batch * args.seq_len  # val tokens per evaluation step
    held = sum((n - 1) // step for n in val.lengths) * step  # as data.val_batches counts them
    if held == 0:
        fail(f"the val split of {args.data} holds fewer than the {step + 1} tokens of one "
             f"evaluation step (processes · --micro_batch · --seq_len + 1)")
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
# The training step (bench.py reuses these)

def build_model(args) -> GPT:
    """The GPT of --size with the head of --head; --seed fixes the initial weights."""
    torch.manual_seed(args.seed)
    model = from_config(vars(args))
    model.head.loss_path = fused_loss.loss_path(args.loss_chunk, torch.device(args.device).type)
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


@dataclass
class StepResult:
    loss: torch.Tensor       # mean training loss over the global batch (0-dim, on the device)
    grad_norm: torch.Tensor  # ‖g‖₂ before clipping
    last_x: torch.Tensor     # this process's last micro-batch, for logit statistics
    last_y: torch.Tensor     # and its targets


def train_step(wrapped, optimizer, next_batch, lr: float, grad_accum: int, amp) -> StepResult:
    """One optimizer step: grad_accum micro-batches, clip, AdamW, head.after_step(W).

    The gradient is g = (1/A) Σₐ ∇loss_a averaged over processes, the gradient of the mean
    loss over the global batch (every micro-batch has the same number of tokens). Nothing
    here waits for the device: the loss stays a tensor (its all-reduce is queued, not read)."""
    model = unwrap(wrapped)
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss_sum = torch.zeros((), device=model.output_weight.device)
    for micro in range(grad_accum):
        x, y = next_batch()
        last = micro == grad_accum - 1
        # DDP all-reduces gradients during backward; on the last micro-batch only.
        sync = wrapped.no_sync() if isinstance(wrapped, DDP) and not last else \
            contextlib.nullcontext()
        with sync:
            with amp:
                loss, _ = wrapped(x, y)
            (loss / grad_accum).backward()
        loss_sum += loss.detach()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.head.after_step(model.output_weight)
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    return StepResult(all_reduce_sum(loss_sum) / (grad_accum * world_size), grad_norm, x, y)


# ---------------------------------------------------------------------------------------------
# Measurements

def mu_norm(model: GPT) -> torch.Tensor:
    """‖μ‖, μ = (1/V) Σᵢ eᵢ the mean output embedding (Eq. 7)."""
    return heads.mean_embedding(model.output_weight.detach()).norm()


HEAD_STATS = heads.LOGIT_STATS + heads.PRECISION_STATS  # logged and summarised per token
ALIGN_STATS = ("h_mu_proj", "h_mu_cos")  # how the mean hidden state lines up with μ


@torch.no_grad()
def head_stat_sums(model: GPT, x: torch.Tensor, y: torch.Tensor, args, amp,
                   max_tokens: int | None = None) -> torch.Tensor:
    """Σ over the tokens of x of the per-token statistics of HEAD_STATS (heads.logit_stat_sums:
    mean, std, max |l|, log²Z of the logits as the run computes them; heads.precision_stat_sums:
    what the matmul's dtype costs them), the token count, then Σ h (D values): float64
    (8 + D,). Divided by the count they give the means over tokens. STAT_CHUNK tokens at a time.
    With max_tokens, only every k-th token counts, k = ⌈N / max_tokens⌉, so that they spread
    over rows and positions (the others still give them their context)."""
    with amp:
        h = model.hidden(x).flatten(0, -2)
    y = y.flatten()
    if max_tokens and len(h) > max_tokens:
        stride = -(-len(h) // max_tokens)
        h, y = h[::stride], y[::stride]
    matmul_dtype = model.head.matmul_dtype or (torch.float32 if args.dtype == "float32"
                                               else getattr(torch, args.dtype))
    n = len(HEAD_STATS)
    sums = torch.zeros(n + 1 + h.shape[-1], dtype=torch.float64, device=h.device)
    for chunk, targets in zip(h.split(STAT_CHUNK), y.split(STAT_CHUNK)):
        with amp:
            logits = model.head.logits(chunk, model.output_weight)
        sums[:4] += heads.logit_stat_sums(logits)
        sums[4:n + 1] += heads.precision_stat_sums(model.head, chunk, model.output_weight,
                                                   targets, matmul_dtype)
    sums[n + 1:] = h.double().sum(dim=0)
    return sums


def head_stats(sums: torch.Tensor, model: GPT) -> dict:
    """The means over all tokens of all processes, from head_stat_sums (all-reduced here), and
    the alignment of the mean hidden state h̄ with μ̂ = μ/‖μ‖ (what turns a large ‖μ‖ into a
    large mean logit: l̄ = μ·h̄ = ‖μ‖·(h̄·μ̂), Lemma 1 averaged over tokens):
        h_mu_proj = h̄·μ̂ = l̄/‖μ‖,   h_mu_cos = h̄·μ̂/‖h̄‖ ∈ [−1, 1]   (0 where μ = 0).
    The published 16M baseline at η = 0.3 ends with l̄/‖μ‖ = 1152/331 ≈ 3.5."""
    sums, n = all_reduce_sum(sums), len(HEAD_STATS)
    count, h_mean = sums[n], sums[n + 1:] / sums[n]
    mu = heads.mean_embedding(model.output_weight.detach()).double()
    mu_hat = mu / mu.norm().clamp(min=torch.finfo(torch.float64).tiny)
    proj = h_mean @ mu_hat
    cos = proj / h_mean.norm().clamp(min=torch.finfo(torch.float64).tiny)
    return dict(zip(HEAD_STATS + ALIGN_STATS, (*(sums[:n] / count).tolist(), proj.item(),
                                               cos.item())))


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
    """HEAD_STATS and ALIGN_STATS over the first --stat_tokens validation tokens (paper: 5·10⁵
    logit vectors)."""
    sums = torch.zeros(len(HEAD_STATS) + 1 + model.config.n_embd, dtype=torch.float64,
                       device=ctx.device)
    for x, y in val_batches(args.stat_tokens, args, ctx):
        sums += head_stat_sums(model, x.to(ctx.device), y.to(ctx.device), args, amp)
    return head_stats(sums, model)


def step_metrics(model: GPT, result: StepResult, args, amp) -> dict:
    """loss, grad_norm, ‖μ‖ and the head statistics of LOG_STAT_TOKENS tokens of this process's
    last micro-batch (summed over processes): the float64 precision metrics over all its tokens
    would cost more than the steps between two log lines. Reads device values, so log steps
    only; the final statistics (final_head_stats) cover --stat_tokens."""
    sums = head_stat_sums(model, result.last_x, result.last_y, args, amp, LOG_STAT_TOKENS)
    return {"loss": result.loss.item(), "grad_norm": result.grad_norm.item(),
            "mu_norm": mu_norm(model).item(), **head_stats(sums, model)}


def eta_seconds(step: int, args, per_step: float, log_s: float, eval_s: float) -> float:
    """Seconds until the run ends after `step`: the steps left, the log steps and evaluations
    among them (each as long as the last one), and the final statistics over --stat_tokens
    (as long per token as a log step's)."""
    final_stats = log_s * args.stat_tokens / LOG_STAT_TOKENS
    if step == args.steps:
        return final_stats

    def count(every):  # multiples of `every` in (step, steps], and --steps itself
        return (args.steps // every - step // every + bool(args.steps % every)) if every else 1
    return ((args.steps - step) * per_step + count(args.log_every) * log_s
            + count(args.eval_every) * eval_s + final_stats)


def timed(fn, *args):
    """fn(*args) and the seconds it took (fn reads a device value, so the device is done)."""
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


def cpu_threads(ctx: Dist) -> str:
    """', N CPU thread(s)' for the run's first line (choose_cpu_threads), '' on a GPU."""
    return f", {torch.get_num_threads()} CPU thread(s)" if ctx.device.type == "cpu" else ""


# ---------------------------------------------------------------------------------------------
# The run

@dataclass
class Run:
    """What setup() hands the training loop."""
    model: GPT                 # what is saved, measured and centred
    compiled: torch.nn.Module  # model, compiled (setup says when): runs the evaluations
    wrapped: torch.nn.Module   # compiled, in DDP on several processes: runs the steps
    optimizer: torch.optim.AdamW
    loader: data.ShardLoader
    amp: contextlib.AbstractContextManager
    config: dict
    out: Path
    step: int                 # optimizer steps done
    init_loss: float | None   # val loss before training; None until measured
    train_time_s: float       # training seconds so far
    compile_watch: CompileWatch | None  # what torch.compile gave up on; None: not compiled


def setup(args, ctx: Dist, out: Path, say) -> Run | None:
    """Everything before the first step: the data, the run folder's checks, the model and its
    optimizer (restored from ckpt.pt with --resume), config.json. None when --resume finds the
    run finished."""
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
    return Run(model, compiled, wrapped, optimizer, loader, autocast(ctx.device, args.dtype),
               config, out, compile_watch=compile_watch, **state)


def training_loop(run: Run, args, ctx: Dist, say) -> GPT:
    """Steps until --steps (or --stop_at), logging, evaluating and saving on the way, then the
    summary; a loss that turns non-finite ends the run early, as diverged."""
    grad_accum = args.batch_size // (args.micro_batch * ctx.world_size)
    tokens_per_step = args.batch_size * args.seq_len
    say(f"{args.size} ({run.model.num_params() / 1e6:.2f}M parameters without the input "
        f"embedding), head {args.head}, lr {args.lr:g}, tie {args.tie}; {ctx.world_size} "
        f"process(es) × {grad_accum} micro-batch(es) of {args.micro_batch}×{args.seq_len} = "
        f"{tokens_per_step:,} tokens per step; {ctx.device} {args.dtype}"
        f"{' compiled' * args.compile}{cpu_threads(ctx)}; "
        f"{f'resuming after step {run.step} of ' if run.step else ''}{args.steps} steps")
    eval_s = log_s = 0.0  # seconds of the last evaluation and log step, for the ETA
    if run.init_loss is None:
        run.init_loss, eval_s = timed(evaluate, run.compiled, args, ctx, run.amp)
        say(f"step 0: val loss {run.init_loss:.4f} (ln V = {math.log(args.vocab_size):.4f})")
        if args.keep_every and ctx.master:
            save_snapshot(run.out, run.model, 0, run.config)
    peak = peak_flops(ctx.device, args.dtype)
    flops_per_token = run.model.flops_per_token(args.seq_len)
    watch = FiniteWatch(ctx.device)
    next_batch = device_batches(run.loader, ctx.device)
    diverged_at, last_val, start = None, None, time.perf_counter()
    speed, first_step = Throughput(ctx.device, tokens_per_step), run.step + 1
    while run.step < args.steps:
        step = run.step = run.step + 1
        result = train_step(run.wrapped, run.optimizer, next_batch, lr_at(step - 1, args),
                            grad_accum, run.amp)
        speed.steps += 1
        is_eval = step == args.steps or (args.eval_every and step % args.eval_every == 0)
        is_log = is_eval or step % args.log_every == 0
        is_save = step == args.steps or step % args.save_every == 0
        watch.push(step, result.loss)
        diverged_at = watch.first_nonfinite(wait_all=is_log or is_save)
        if diverged_at is not None:
            say(f"step {diverged_at}: the loss is not finite; the run diverged and stops")
            break
        if step == first_step and run.compile_watch:
            say_compile_failure(run, ctx, say)
        if is_log:  # the first step compiles: no throughput is read over it
            tok_per_s, per_step = speed.read() if step > first_step else (None, None)
            metrics, log_s = timed(step_metrics, run.model, result, args, run.amp)
            record = {"step": step, "tokens": step * tokens_per_step, "lr": lr_at(step - 1, args),
                      **metrics, "tok_per_s": tok_per_s,
                      "mfu": flops_per_token * tok_per_s / (peak * ctx.world_size)
                      if peak and tok_per_s else None}
            if is_eval:
                last_val, eval_s = timed(evaluate, run.compiled, args, ctx, run.amp)
                record["val_loss"] = last_val
            eta = None if per_step is None else eta_seconds(step, args, per_step, log_s, eval_s)
            say(log_line(record, args.steps, eta=eta))
            if ctx.master:
                append_log(run.out / "log.jsonl", record)
        if is_save and ctx.master:
            save_checkpoint(run.out, run.model, run.optimizer, run.loader, step, run.config,
                            run.init_loss, run.train_time_s + time.perf_counter() - start)
        if args.keep_every and step % args.keep_every == 0 and ctx.master:
            save_snapshot(run.out, run.model, step, run.config)
        if step == args.stop_at:
            say(f"stopping after step {step} as --stop_at asks; continue with --resume")
            return run.model
        if is_log or is_save or step == first_step:  # the next window starts after this step
            speed.restart()
    run.train_time_s += time.perf_counter() - start

    # The final evaluation and logit statistics, into summary.json: the run is finished.
    model = run.model
    summary = {"head": args.head, "size": args.size, "lr": args.lr, "tie": args.tie,
               "lam": model.head.lam, "cap": model.head.cap, "steps": args.steps}
    if diverged_at is None:
        val_loss = last_val if last_val is not None else evaluate(run.compiled, args, ctx, run.amp)
        stats = final_head_stats(model, args, ctx, run.amp)
        summary |= {"tokens": run.step * tokens_per_step, "val_loss": val_loss,
                    "diverged": not math.isfinite(val_loss)}
    else:
        stats = dict.fromkeys(HEAD_STATS + ALIGN_STATS)
        summary |= {"tokens": diverged_at * tokens_per_step, "val_loss": None, "diverged": True}
    summary |= {"init_loss": run.init_loss, **stats, "mu_norm": mu_norm(model).item(),
                "train_time_s": run.train_time_s}
    if ctx.master:
        write_json(run.out / "summary.json", summary)
    say("done: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                             for k, v in summary.items()))
    return model


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


def train(args, ctx: Dist) -> GPT | None:
    """Setup, then the training loop; global rank 0 holds the run folder's lock throughout and
    writes its files. Returns the trained model (None when --resume finds the run finished)."""
    say = print if ctx.master else (lambda *a, **k: None)
    out = Path(args.out_dir)
    choose_cpu_threads(ctx)
    with run_folder_lock(out) if ctx.master else contextlib.nullcontext():
        run = setup(args, ctx, out, say)
        if run is None:
            return None
        return training_loop(run, args, ctx, say)


def main(argv=None) -> GPT | None:
    """Train one run as the command line says; see train()."""
    args = parse_args(argv)
    try:
        return train(args, init_distributed(args))
    except store.WriteError as err:  # a full disk, a folder that cannot be written: one sentence
        fail(str(err))
    except KeyboardInterrupt:
        print("train.py: interrupted; --resume continues from the last checkpoint",
              file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""One training run with the recipe of the paper's App. A, on one process or many (torchrun DDP):
`python train.py --help` lists the options, grouped, with an example.

Read it top to bottom: the recipe, `build_model`, `train_step` (one optimizer step), the
measurements, `training_loop`, `main`. `ctx` is this process (runs.Dist: rank, local_rank,
world_size, device; ctx.say prints on rank 0 only). runs.py holds the plumbing: the device and
the processes, the run folder (its lock, config.json, log.jsonl, ckpt.pt for --resume,
summary.json, each written whole), the data made ready, the CPU threads, the console line and
the speed (Throughput, MFU's peak, the ETA), what torch.compile gave up on (CompileWatch), and
FiniteWatch, which reads whether a loss was finite without making the GPU wait. A run whose
loss turns non-finite stops, records diverged: true and exits 0.
"""
import os
import signal
import sys

if __name__ == "__main__":  # Ctrl-C while torch imports (seconds): one line, not a traceback
    def interrupted_at_start(*_):  # os._exit: an import's bare `except:` would swallow SystemExit
        if not int(os.environ.get("RANK", 0)):
            print("train.py: interrupted while starting; nothing was written", file=sys.stderr,
                  flush=True)
        os._exit(130)
    signal.signal(signal.SIGINT, interrupted_at_start)

import contextlib
import functools
import math
import operator
import time
from dataclasses import dataclass, fields

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import data
import fused_loss
import heads
from model import GPT, from_config
from options import parse_args
from runs import (CompileWatch, FiniteWatch, Throughput, eta_seconds, log_line,
                  peak_flops, run_folder, run_process)

# ---- The recipe of the paper's App. A (Table 4); the options: options.py (--help) ----------
ADAM_BETAS, ADAM_EPS = (0.9, 0.95), 1e-8
WEIGHT_DECAY = 0.0
GRAD_CLIP = 1.0            # the global gradient norm ‖g‖₂ is clipped to this


def build_model(args) -> GPT:
    """The GPT of --size with the head of --head; --seed fixes the initial weights (and, with
    --data_order random, the data's windows: data.py)."""
    torch.manual_seed(args.seed)
    model = from_config(vars(args))
    # The loss path, each returning Head.forward's (loss, {ce, reg}), up to rounding:
    #   --loss_chunk 0 (CUDA's default)  None: heads.py's plain forward, all N × V logits kept
    #   --loss_chunk N (CPU's default 64)  chunks of N tokens, without the N × V logits: torch's
    #       F.linear_cross_entropy where fused_loss.uses_torch_op holds (a head that adds nothing
    #       inside the softmax, a float32 matmul, torch ≥ 2.13), else fused_loss.py's own loop
    # The line after the run's settings line names the one taken.
    model.head.loss_path = fused_loss.loss_path(args.loss_chunk, torch.device(args.device).type)
    return model


def make_optimizer(model: GPT, args) -> torch.optim.AdamW:
    """AdamW with β = (0.9, 0.95), ε = 1e-8, no weight decay (App. A); fused on CUDA."""
    return torch.optim.AdamW(model.parameters(), lr=args.lr, betas=ADAM_BETAS, eps=ADAM_EPS,
                             weight_decay=WEIGHT_DECAY, fused=next(model.parameters()).is_cuda)


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


def unwrap(model) -> GPT:  # the GPT inside DDP and torch.compile
    model = model.module if isinstance(model, DDP) else model
    return getattr(model, "_orig_mod", model)


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:  # Σ over processes, in place
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def device_batches(loader: data.ShardLoader, device: torch.device):
    """next_batch(): the loader's next (x, y), moved to the device (from pinned memory)."""
    def next_batch():
        x, y = loader.next_batch()
        if device.type == "cuda":
            x, y = x.pin_memory(), y.pin_memory()
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    return next_batch


# ---- The training step (bench.py reuses it) -------------------------------------------------
@dataclass
class StepResult:
    loss: torch.Tensor       # mean cross-entropy over the global batch (0-dim, on the device)
    objective: torch.Tensor  # what was minimised: loss + the head's regulariser (z_loss, mu_loss)
    grad_norm: torch.Tensor  # ‖g‖₂ before clipping
    last_x: torch.Tensor     # this process's last micro-batch, for logit statistics
    last_y: torch.Tensor     # and its targets


def train_step(wrapped, optimizer, next_batch, lr: float, grad_accum: int, amp) -> StepResult:
    """One optimizer step: A = grad_accum = batch_size / (micro_batch · world_size) micro-batches
    per process, each objective backpropagated as objective / A, clip, AdamW, head.after_step(W).
    The gradient g = (1/A) Σₐ ∇objective_a averaged over processes is that of the mean objective
    over the global batch (every micro-batch has as many tokens, none of them ignored: the
    loader yields no -1 target); DDP all-reduces on the last micro-batch only. Nothing here waits
    for the device: the losses stay tensors."""
    model = unwrap(wrapped)
    for group in optimizer.param_groups:
        group["lr"] = lr
    sums = torch.zeros(2, device=model.output_weight.device)  # Σ CE, Σ objective
    for micro in range(grad_accum):
        x, y = next_batch()
        if isinstance(wrapped, DDP):  # all-reduce the gradients in the last backward only
            wrapped.require_backward_grad_sync = micro == grad_accum - 1
        with amp:
            objective, stats = wrapped(x, y)  # GPT.forward, then its head (its loss_path):
            # CE + regulariser, {ce, reg}
        (objective / grad_accum).backward()
        sums += torch.stack((stats["ce"], objective.detach()))
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.head.after_step(model.output_weight)  # μ-centering: eᵢ ← eᵢ − μ, alike on every rank
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    loss, objective = all_reduce_sum(sums) / (grad_accum * world_size)
    return StepResult(loss, objective, grad_norm, x, y)


# ---- The measurements -----------------------------------------------------------------------
STAT_CHUNK = 64         # tokens per logits chunk: temporaries of a few × 64 × V floats
LOG_STAT_TOKENS = 128   # tokens per process of a log step's logit statistics
PRECISION_STRIDE = 4    # the precision statistics take every 4th of those tokens (the costly ones)
# Logged and summarised per token: the paper's logit statistics (l̄, σ_l, max |l|, log²Z) and
# prec_*, what rounding the head's matmul to the run's dtype costs (heads.precision_stats)
HEAD_STATS = heads.LOGIT_STATS + heads.PRECISION_STATS
ALIGN_STATS = ("h_mu_proj", "h_mu_cos")  # how the mean hidden state lines up with μ


@dataclass
class TokenSums:
    """Sums over the measured tokens, float64, added over batches and processes: Σx and Σx² of
    each per-token statistic x, the token count, and Σ h (for the mean hidden state h̄)."""
    logit_sum: torch.Tensor      # (len(heads.LOGIT_STATS),)
    logit_sq: torch.Tensor
    logit_n: torch.Tensor        # 0-dim
    precision_sum: torch.Tensor  # (len(heads.PRECISION_STATS),), every PRECISION_STRIDE-th token
    precision_sq: torch.Tensor
    precision_n: torch.Tensor
    hidden_sum: torch.Tensor     # (D,), over the logit tokens

    def parts(self) -> list:
        return [getattr(self, field.name) for field in fields(self)]

    def __add__(self, other: "TokenSums") -> "TokenSums":
        return TokenSums(*(a + b for a, b in zip(self.parts(), other.parts())))

    def all_reduced(self) -> "TokenSums":  # Σ over processes: the parts stacked for one all-reduce
        flat = all_reduce_sum(torch.cat([part.reshape(-1) for part in self.parts()]))
        pieces = flat.split([part.numel() for part in self.parts()])
        return TokenSums(*(piece.view_as(part) for piece, part in zip(pieces, self.parts())))


def mu_norm(model: GPT) -> torch.Tensor:
    """‖μ‖, μ = (1/V) Σᵢ eᵢ the mean output embedding (Eq. 7)."""
    return heads.mean_embedding(model.output_weight.detach()).norm()


@torch.no_grad()
def head_stat_sums(model: GPT, x: torch.Tensor, y: torch.Tensor, args, amp,
                   max_tokens: int | None = None) -> TokenSums:
    """TokenSums over the tokens of x whose target is not -1 (with max_tokens, every k-th,
    k = ⌈N / max_tokens⌉): heads.logit_stats of the logits as the run computes them on each,
    heads.precision_stats on every PRECISION_STRIDE-th."""
    with amp:
        h = model.hidden(x).flatten(0, -2)
    keep = y.flatten() != heads.IGNORE
    h, y = h[keep], y.flatten()[keep]
    if max_tokens and len(h) > max_tokens:
        stride = -(-len(h) // max_tokens)
        h, y = h[::stride], y[::stride]
    weight, dtype = model.output_weight, model.head.matmul_dtype or getattr(torch, args.dtype)
    with amp:
        # heads.logit_stats and precision_stats: a row per statistic, a column per token
        logit = torch.cat([heads.logit_stats(model.head.logits(c, weight))
                           for c in h.split(STAT_CHUNK)], dim=1)
    h_p, y_p = h[::PRECISION_STRIDE], y[::PRECISION_STRIDE]
    precision = heads.precision_stats(model.head, h_p, weight, y_p, dtype, STAT_CHUNK)
    count = logit.new_tensor
    return TokenSums(logit.sum(dim=1), logit.square().sum(dim=1), count(len(h)),
                     precision.sum(dim=1), precision.square().sum(dim=1), count(len(h_p)),
                     h.double().sum(dim=0))


def head_stats(sums: TokenSums, model: GPT, with_se: bool = False) -> dict:
    """The means over all tokens of all processes (all-reduced here) of HEAD_STATS, the mean
    hidden state's alignment with μ (ALIGN_STATS, heads.mean_state_alignment) and, with_se,
    each mean's standard error √(var/(n−1)) as <stat>_se (tokens as independent)."""
    s, stats, errors = sums.all_reduced(), {}, {}
    for names, total, squares, n in ((heads.LOGIT_STATS, s.logit_sum, s.logit_sq, s.logit_n),
                                     (heads.PRECISION_STATS, s.precision_sum, s.precision_sq,
                                      s.precision_n)):
        mean = total / n
        stats |= dict(zip(names, mean.tolist()))
        se = ((squares / n - mean.square()).clamp(min=0) / (n - 1)).sqrt()
        errors |= {f"{name}_se": value for name, value in zip(names, se.tolist())}
    proj, cos = heads.mean_state_alignment(s.hidden_sum / s.logit_n,
                                             model.output_weight.detach())
    return stats | {"h_mu_proj": proj.item(), "h_mu_cos": cos.item()} | (errors if with_se else {})


def val_batches(tokens: int, args, ctx):  # this rank's share of the first `tokens` val tokens
    return data.val_batches(args.data, tokens, args.micro_batch, args.seq_len, ctx.rank,
                            ctx.world_size)


@torch.no_grad()
def evaluate(model, args, ctx, amp, batches=None) -> float:
    """Mean cross-entropy over the tokens of `batches` whose target is not -1 (default: the
    first --eval_tokens validation tokens, in whole steps of processes × micro_batch × seq_len);
    every rank scores its share, the sums are added."""
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=ctx.device)  # Σ CE, kept tokens
    for x, y in val_batches(args.eval_tokens, args, ctx) if batches is None else batches:
        x, y = x.to(ctx.device), y.to(ctx.device)
        with amp:
            _, stats = model(x, y)
        kept = (y != heads.IGNORE).sum().double()
        total += torch.stack((stats["ce"].double() * kept, kept))
    model.train()
    all_reduce_sum(total)
    return (total[0] / total[1]).item()


@torch.no_grad()
def final_head_stats(model: GPT, args, ctx, amp, batches=None) -> dict:
    """HEAD_STATS, their standard errors and ALIGN_STATS over `batches` (default: --stat_tokens)."""
    batches = val_batches(args.stat_tokens, args, ctx) if batches is None else batches
    sums = functools.reduce(operator.add, (
        head_stat_sums(model, x.to(ctx.device), y.to(ctx.device), args, amp) for x, y in batches))
    return head_stats(sums, model, with_se=True)


def step_metrics(model: GPT, result: StepResult, args, amp) -> dict:
    """loss (CE), objective, grad_norm, ‖μ‖ and head_stats of LOG_STAT_TOKENS tokens of each
    process's last micro-batch, pooled (its cost: bench.py --measure); reads the device: log
    steps only."""
    sums = head_stat_sums(model, result.last_x, result.last_y, args, amp, LOG_STAT_TOKENS)
    return {"loss": result.loss.item(), "objective": result.objective.item(),
            "grad_norm": result.grad_norm.item(), "mu_norm": mu_norm(model).item(),
            **head_stats(sums, model)}


def timed(fn, *args):  # fn(*args) and its seconds (fn reads a device value: the device is done)
    start = time.perf_counter()
    return fn(*args), time.perf_counter() - start  # left to right: fn runs first


# ---- The loop -------------------------------------------------------------------------------
def training_loop(model: GPT, optimizer, folder, progress, args, ctx) -> dict:
    """Steps until --steps (or --stop_at), logging, evaluating and saving on the way, then the
    summary (None after --stop_at); a loss that turns non-finite ends the run early, diverged.
    progress (runs.Progress): the steps done, the val loss before training, the seconds so far;
    folder (runs.RunFolder): its calls write on rank 0 only, ckpt.pt with folder.loader's place."""
    # grad_accum is whole: options.py refuses a --batch_size not a multiple of the other two
    say, grad_accum = ctx.say, args.batch_size // (args.micro_batch * ctx.world_size)
    amp = autocast(ctx.device, args.dtype)
    # The wrappers share the model's parameters. What fails to compile runs eagerly (CompileWatch
    # keeps torch's traceback from the console): the loop says so after the first step.
    watch_compile = CompileWatch() if args.compile else None
    compiled = torch.compile(model) if args.compile else model  # runs the evaluations
    wrapped = compiled if ctx.world_size == 1 else \
        DDP(compiled, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    # folder.config: what config.json records; cpu_threads is None on a GPU (choose_cpu_threads)
    tokens_per_step, threads = args.batch_size * args.seq_len, folder.config["cpu_threads"]
    compiled_text = " compiled" if args.compile else ""
    threads_text = f", {threads} CPU thread(s)" if threads else ""
    resuming = f"resuming after step {progress.step} of " if progress.step else ""
    say(f"{args.size} ({model.num_params() / 1e6:.2f}M parameters without the input "
        f"embedding), head {args.head}, lr {args.lr:g}, tie {args.tie}; {ctx.world_size} "
        f"process(es) × {grad_accum} micro-batch(es) of {args.micro_batch}×{args.seq_len} = "
        f"{tokens_per_step:,} tokens per step; {ctx.device} {args.dtype}{compiled_text}"
        f"{threads_text}; {resuming}{args.steps} steps")
    say(f"loss path: {fused_loss.path_name(model.head, getattr(torch, args.dtype))}")
    eval_s = log_s = 0.0  # seconds of the last evaluation and log step, for the ETA
    if progress.init_loss is None:
        progress.init_loss, eval_s = timed(evaluate, compiled, args, ctx, amp)
        say(f"step 0: val loss {progress.init_loss:.4f} (ln V = {math.log(args.vocab_size):.4f})")
        if args.keep_every:
            folder.snapshot(model, 0)
    peak = peak_flops(ctx.device, args.dtype)  # MFU: tokens/s × FLOPs a token / all peaks
    mfu_per_tok = model.flops_per_token(args.seq_len) / (peak * ctx.world_size) if peak else 0
    # folder.loader: this rank's data.ShardLoader of --micro_batch rows, --batch_size a step
    watch, next_batch = FiniteWatch(ctx.device), device_batches(folder.loader, ctx.device)
    diverged_at, last_val, start = None, None, time.perf_counter()
    # speed: tokens/s over the steps counted since restart(), read() and restart() sync the device
    speed, first_step = Throughput(ctx.device, tokens_per_step), progress.step + 1
    time_before = progress.train_time_s
    while progress.step < args.steps:
        step = progress.step = progress.step + 1
        result = train_step(wrapped, optimizer, next_batch, lr_at(step - 1, args),  # s = 0, 1, …
                            grad_accum, amp)
        speed.steps += 1
        is_eval = step == args.steps or (args.eval_every and step % args.eval_every == 0)
        is_log = is_eval or step % args.log_every == 0
        is_save = step == args.steps or step % args.save_every == 0
        # The objective is all-reduced, alike on every rank. On CUDA FiniteWatch reads it one
        # step late, once the next is queued, so there only a log or a save step (which waits for
        # the device anyway) reads its own flag; on CPU every step reads its own at once. Every
        # rank stops at the same step.
        watch.push(step, result.objective)
        diverged_at = watch.first_nonfinite(wait_all=is_log or is_save)
        if diverged_at is not None:
            say(f"step {diverged_at}: the loss is not finite; the run diverged and stops")
            break
        if step == first_step and watch_compile and (failure := watch_compile.stop()):
            folder.compile_failed(failure)
        if is_log:  # the first step compiles: no throughput is read over it
            tok_per_s, per_step = speed.read() if step > first_step else (None, None)
            metrics, log_s = timed(step_metrics, model, result, args, amp)
            record = {"step": step, "tokens": step * tokens_per_step, "lr": lr_at(step - 1, args),
                      **metrics, "tok_per_s": tok_per_s,
                      "mfu": mfu_per_tok * tok_per_s if mfu_per_tok and tok_per_s else None}
            if is_eval:
                last_val, eval_s = timed(evaluate, compiled, args, ctx, amp)
                record["val_loss"] = last_val
            # a log step measured about these tokens (every k-th) in log_s: the ETA prices the
            # final statistics from them
            log_tokens = min(LOG_STAT_TOKENS, result.last_y.numel()) * ctx.world_size
            eta = None if per_step is None else eta_seconds(step, args, per_step, log_s, eval_s,
                                                            log_tokens)
            say(log_line(record, args.steps, eta=eta))
            folder.log(record)
        progress.train_time_s = time_before + time.perf_counter() - start
        if is_save:
            folder.save_checkpoint(model, optimizer, progress)
        if args.keep_every and step % args.keep_every == 0:
            folder.snapshot(model, step)
        if step == args.stop_at:
            say(f"stopping after step {step} as --stop_at asks; continue with --resume")
            return None
        if is_log or is_save or step == first_step:  # the next window starts after this step
            speed.restart()
    progress.train_time_s = time_before + time.perf_counter() - start
    return final_summary(model, compiled, progress, diverged_at, last_val, args, ctx, amp)


def final_summary(model, compiled, progress, diverged_at, last_val, args, ctx, amp) -> dict:
    """summary.json's record: the run's settings, its final val loss and head statistics (over
    --stat_tokens), ‖μ‖ and times; the statistics are None for a diverged run."""
    summary = {"head": args.head, "size": args.size, "lr": args.lr, "tie": args.tie,
               "lam": model.head.lam, "cap": model.head.cap, "steps": args.steps}
    measure_start = time.perf_counter()  # the end-of-run measurements: measure_time_s
    tokens_per_step = args.batch_size * args.seq_len
    if diverged_at is None:
        val_loss = last_val if last_val is not None else evaluate(compiled, args, ctx, amp)
        stats = final_head_stats(model, args, ctx, amp)
        summary |= {"tokens": progress.step * tokens_per_step, "val_loss": val_loss,
                    "diverged": not math.isfinite(val_loss)}
    else:
        stats = dict.fromkeys(HEAD_STATS + ALIGN_STATS + tuple(f"{s}_se" for s in HEAD_STATS))
        summary |= {"tokens": diverged_at * tokens_per_step, "val_loss": None, "diverged": True}
    return summary | {"init_loss": progress.init_loss, **stats, "mu_norm": mu_norm(model).item(),
                      "train_time_s": progress.train_time_s,
                      "measure_time_s": time.perf_counter() - measure_start}


def main(argv=None) -> GPT | None:
    """One run: the model (None when --resume finds the run finished)."""
    args = parse_args(argv)  # checked; "auto" device, dtype, compile and micro_batch resolved
    with run_process(args) as ctx, run_folder(args, ctx) as folder:  # locked; data made ready
        if folder is None:
            return None
        model = build_model(args).to(ctx.device)
        optimizer = make_optimizer(model, args)
        progress = folder.resume(args, model, optimizer)  # with --resume: weights, optimizer,
        # loader and RNG from ckpt.pt; then the CPU threads set and config.json written
        summary = training_loop(model, optimizer, folder, progress, args, ctx)
        if summary is not None:
            folder.finish(summary)
        return model


if __name__ == "__main__":
    main()

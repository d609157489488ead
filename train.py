"""One training run with the recipe of the paper's App. A, on one process or many (torchrun DDP):
`python train.py --help` lists the options, grouped, with an example.

The run folder (--out_dir, one process at a time) holds config.json, log.jsonl (a line per log
step), ckpt.pt (every --save_every steps, for --resume) and summary.json (the run is finished),
each written whole. A run whose loss turns non-finite stops, records diverged: true and exits 0.
"""
import contextlib
import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import fused_loss
import heads
import measure
from model import GPT, from_config
from options import parse_args
from runs import (TRAIN_LONGER, Dist, FiniteWatch, Run, Throughput, all_reduce_sum, append_log,
                  device_batches, eta_seconds, log_line, peak_flops, run_process, save_checkpoint,
                  save_snapshot, say_compile_failure, setup, timed, unwrap, val_batches, write_json)

# ---- The recipe of the paper's App. A (Table 4); the options: options.py (--help) ----------
ADAM_BETAS, ADAM_EPS = (0.9, 0.95), 1e-8
WEIGHT_DECAY = 0.0
GRAD_CLIP = 1.0            # the global gradient norm ‖g‖₂ is clipped to this

# ---- The training step (bench.py reuses these) ---------------------------------------------
def build_model(args) -> GPT:
    """The GPT of --size with the head of --head; --seed fixes the initial weights."""
    torch.manual_seed(args.seed)
    model = from_config(vars(args))
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


@dataclass
class StepResult:
    loss: torch.Tensor       # mean training loss over the global batch (0-dim, on the device)
    grad_norm: torch.Tensor  # ‖g‖₂ before clipping
    last_x: torch.Tensor     # this process's last micro-batch, for logit statistics
    last_y: torch.Tensor     # and its targets


def train_step(wrapped, optimizer, next_batch, lr: float, grad_accum: int, amp) -> StepResult:
    """One optimizer step: A = grad_accum = batch_size / (micro_batch · world_size) micro-batches
    per process, each loss backpropagated as loss / A, clip, AdamW, head.after_step(W). The
    gradient g = (1/A) Σₐ ∇loss_a averaged over processes is that of the mean loss over the global
    batch (every micro-batch has as many tokens); DDP all-reduces on the last micro-batch only.
    Nothing here waits for the device: the loss stays a tensor (its all-reduce is queued)."""
    model = unwrap(wrapped)
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss_sum = torch.zeros((), device=model.output_weight.device)
    for micro in range(grad_accum):
        x, y = next_batch()
        wait = isinstance(wrapped, DDP) and micro < grad_accum - 1  # no all-reduce yet
        with wrapped.no_sync() if wait else contextlib.nullcontext():
            with amp:
                loss, _ = wrapped(x, y)
            (loss / grad_accum).backward()
        loss_sum += loss.detach()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.head.after_step(model.output_weight)  # μ-centering: eᵢ ← eᵢ − μ, alike on every rank
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    return StepResult(all_reduce_sum(loss_sum) / (grad_accum * world_size), grad_norm, x, y)


# ---- The measurements -----------------------------------------------------------------------
STAT_CHUNK = 64         # tokens per logits chunk: temporaries of a few × 64 × V floats
LOG_STAT_TOKENS = 128   # tokens of a log step's logit statistics
PRECISION_STRIDE = 4    # the precision statistics take every 4th of those tokens (the costly ones)
HEAD_STATS = measure.LOGIT_STATS + measure.PRECISION_STATS  # logged and summarised per token
ALIGN_STATS = ("h_mu_proj", "h_mu_cos")  # how the mean hidden state lines up with μ


def mu_norm(model: GPT) -> torch.Tensor:
    """‖μ‖, μ = (1/V) Σᵢ eᵢ the mean output embedding (Eq. 7)."""
    return heads.mean_embedding(model.output_weight.detach()).norm()


@torch.no_grad()
def head_stat_sums(model: GPT, x: torch.Tensor, y: torch.Tensor, args, amp,
                   max_tokens: int | None = None) -> torch.Tensor:
    """Σ x and Σ x² of each per-token statistic x of HEAD_STATS, the two token counts, then Σ h,
    float64 (2·7 + 2 + D,), over the tokens of x whose target is not -1 (with max_tokens, every
    k-th, k = ⌈N / max_tokens⌉): measure.logit_stats of the logits as the run computes them on
    each, measure.precision_stats on every PRECISION_STRIDE-th."""
    with amp:
        h = model.hidden(x).flatten(0, -2)
    keep = y.flatten() != heads.IGNORE
    h, y = h[keep], y.flatten()[keep]
    if max_tokens and len(h) > max_tokens:
        stride = -(-len(h) // max_tokens)
        h, y = h[::stride], y[::stride]
    weight, dtype = model.output_weight, model.head.matmul_dtype or getattr(torch, args.dtype)
    with amp:
        logit = torch.cat([measure.logit_stats(model.head.logits(c, weight))
                           for c in h.split(STAT_CHUNK)], dim=1)
    h_p, y_p = h[::PRECISION_STRIDE], y[::PRECISION_STRIDE]
    precision = measure.precision_stats(model.head, h_p, weight, y_p, dtype, STAT_CHUNK)
    return torch.cat((logit.sum(dim=1), precision.sum(dim=1), logit.square().sum(dim=1),
                      precision.square().sum(dim=1), logit.new_tensor([len(h), len(h_p)]),
                      h.double().sum(dim=0)))


def head_stats(sums: torch.Tensor, model: GPT, with_se: bool = False) -> dict:
    """The means over all tokens of all processes, from head_stat_sums (all-reduced here), the
    mean hidden state's alignment with μ (ALIGN_STATS, measure.mean_state_alignment) and, with_se,
    each mean's standard error √(var/(n−1)) as <stat>_se (tokens as independent)."""
    sums, n = all_reduce_sum(sums), len(HEAD_STATS)
    counts = sums[2 * n:2 * n + 2]
    count = counts[[0] * len(measure.LOGIT_STATS) + [1] * len(measure.PRECISION_STATS)]
    mean, mean_sq = sums[:n] / count, sums[n:2 * n] / count
    proj, cos = measure.mean_state_alignment(sums[2 * n + 2:] / counts[0],
                                             model.output_weight.detach())
    stats = dict(zip(HEAD_STATS + ALIGN_STATS, (*mean.tolist(), proj.item(), cos.item())))
    if with_se:
        se = ((mean_sq - mean.square()).clamp(min=0) / (count - 1)).sqrt()
        stats |= {f"{name}_se": value for name, value in zip(HEAD_STATS, se.tolist())}
    return stats


@torch.no_grad()
def evaluate(model, args, ctx: Dist, amp, batches=None) -> float:
    """Mean cross-entropy over the tokens of `batches` whose target is not -1 (default: the
    first --eval_tokens validation tokens); every rank scores its share, the sums are added."""
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
def final_head_stats(model: GPT, args, ctx: Dist, amp, batches=None) -> dict:
    """HEAD_STATS, their standard errors and ALIGN_STATS over `batches` (default: --stat_tokens)."""
    batches = val_batches(args.stat_tokens, args, ctx) if batches is None else batches
    sums = sum(head_stat_sums(model, x.to(ctx.device), y.to(ctx.device), args, amp)
               for x, y in batches)
    return head_stats(sums, model, with_se=True)


def step_metrics(model: GPT, result: StepResult, args, amp) -> dict:
    """loss, grad_norm, ‖μ‖ and head_stats of LOG_STAT_TOKENS tokens of this process's last
    micro-batch (its cost against a step: bench.py --measure); reads the device: log steps only."""
    sums = head_stat_sums(model, result.last_x, result.last_y, args, amp, LOG_STAT_TOKENS)
    return {"loss": result.loss.item(), "grad_norm": result.grad_norm.item(),
            "mu_norm": mu_norm(model).item(), **head_stats(sums, model)}


# ---- The loop -------------------------------------------------------------------------------
def training_loop(run: Run, args, ctx: Dist, say) -> GPT:
    """Steps until --steps (or --stop_at), logging, evaluating and saving on the way, then the
    summary; a loss that turns non-finite ends the run early, as diverged."""
    grad_accum = args.batch_size // (args.micro_batch * ctx.world_size)
    amp = autocast(ctx.device, args.dtype)
    tokens_per_step, threads = args.batch_size * args.seq_len, run.config["cpu_threads"]
    say(f"{args.size} ({run.model.num_params() / 1e6:.2f}M parameters without the input "
        f"embedding), head {args.head}, lr {args.lr:g}, tie {args.tie}; {ctx.world_size} "
        f"process(es) × {grad_accum} micro-batch(es) of {args.micro_batch}×{args.seq_len} = "
        f"{tokens_per_step:,} tokens per step; {ctx.device} {args.dtype}"
        f"{' compiled' * args.compile}{f', {threads} CPU thread(s)' * bool(threads)}; "
        f"{f'resuming after step {run.step} of ' if run.step else ''}{args.steps} steps")
    eval_s = log_s = 0.0  # seconds of the last evaluation and log step, for the ETA
    if run.init_loss is None:
        run.init_loss, eval_s = timed(evaluate, run.compiled, args, ctx, amp)
        say(f"step 0: val loss {run.init_loss:.4f} (ln V = {math.log(args.vocab_size):.4f})")
        if args.keep_every and ctx.master:
            save_snapshot(run.out, run.model, 0, run.config)
    peak = peak_flops(ctx.device, args.dtype)  # MFU: tokens/s × FLOPs a token / all peaks
    mfu_per_tok = run.model.flops_per_token(args.seq_len) / (peak * ctx.world_size) if peak else 0
    watch, next_batch = FiniteWatch(ctx.device), device_batches(run.loader, ctx.device)
    diverged_at, last_val, start = None, None, time.perf_counter()
    speed, first_step = Throughput(ctx.device, tokens_per_step), run.step + 1
    while run.step < args.steps:
        step = run.step = run.step + 1
        result = train_step(run.wrapped, run.optimizer, next_batch, lr_at(step - 1, args),
                            grad_accum, amp)
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
            metrics, log_s = timed(step_metrics, run.model, result, args, amp)
            record = {"step": step, "tokens": step * tokens_per_step, "lr": lr_at(step - 1, args),
                      **metrics, "tok_per_s": tok_per_s,
                      "mfu": mfu_per_tok * tok_per_s if mfu_per_tok and tok_per_s else None}
            if is_eval:
                last_val, eval_s = timed(evaluate, run.compiled, args, ctx, amp)
                record["val_loss"] = last_val
            eta = None if per_step is None else eta_seconds(
                step, args, per_step, log_s, eval_s, min(LOG_STAT_TOKENS, result.last_y.numel()))
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
    measure_start = time.perf_counter()  # the end-of-run measurements: measure_time_s
    if diverged_at is None:
        val_loss = last_val if last_val is not None else evaluate(run.compiled, args, ctx, amp)
        stats = final_head_stats(model, args, ctx, amp)
        summary |= {"tokens": run.step * tokens_per_step, "val_loss": val_loss,
                    "diverged": not math.isfinite(val_loss)}
    else:
        stats = dict.fromkeys(HEAD_STATS + ALIGN_STATS + tuple(f"{s}_se" for s in HEAD_STATS))
        summary |= {"tokens": diverged_at * tokens_per_step, "val_loss": None, "diverged": True}
    summary |= {"init_loss": run.init_loss, **stats, "mu_norm": mu_norm(model).item(),
                "train_time_s": run.train_time_s,
                "measure_time_s": time.perf_counter() - measure_start}
    if ctx.master:
        write_json(run.out / "summary.json", summary)
    say("done: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                             for k, v in summary.items()))
    return model


def main(argv=None) -> GPT | None:
    """Setup, then the loop, in the run folder rank 0 locks: the model (None: already finished)."""
    args = parse_args(argv)
    with run_process(args) as ctx:
        say = print if ctx.master else (lambda *a, **k: None)
        with setup(args, ctx, say, build_model, make_optimizer) as run:
            model = run and training_loop(run, args, ctx, say)
        if run and run.step == args.steps and (run.out / "summary.json").exists():
            say(f"the run is finished; {TRAIN_LONGER}")
        return model


if __name__ == "__main__":
    main()

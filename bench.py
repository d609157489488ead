"""Speed and memory of train.py's training step, of the LM head's loss path and of the run's
measurements (README, "Speed and memory": what each row means).

    python bench.py --device cpu --sizes tiny --steps 10                  # seconds, on a laptop
    python bench.py --sizes 16M 221M --loss_paths plain default chunked --json out/bench.json
    python bench.py --device cpu --no_train --loss_tokens 1024 --loss_paths plain default chunked
    python bench.py --device cpu --no_train --measure     # a log step, an evaluation, the final
                                                          # statistics against a training step

Every variant (size × head × loss path) is built exactly as train.py builds it and timed on
synthetic tokens between device syncs: warm-up steps (the first compiles), then --steps steps
alone, then all variants of a size in turns, in an order that rotates every round, so drift
falls on all alike. Each real-step row also times one no-grad evaluation forward (eval_s).
Peak memory is measured in one extra untimed run (peak_memory). On a shared, busy CPU run with
OMP_NUM_THREADS=1. --json is rewritten atomically after every variant; a path that cannot be
written, or a size that cannot fit in memory, ends in one sentence before anything is measured.
"""
import argparse
import contextlib
import ctypes
import functools
import math
import os
import re
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import fused_loss
import heads
import runs
import store
import train
from model import SIZES

# CUDA: the paper's micro-batch; CPU: small, where 16 × 2048 tokens would take many seconds
SHAPES = {"cuda": dict(micro_batch=16, seq_len=2048), "cpu": dict(micro_batch=4, seq_len=256)}
STEPS, WARMUP, SEED, VOCAB_SIZE = 10, 3, 0, 50304
MEASURE_STAT_TOKENS = 8192  # --measure's final statistics: experiments/alignment's --stat_tokens
LOSS_PATHS = {"plain": "heads.py's reference (--loss_chunk 0)",
              "default": "train.py's default (fused_loss.DEFAULT_CHUNK for the device)",
              "chunked": "fused_loss.chunked_loss with --chunk_size tokens per chunk"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="bench.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:1, …")
    a("--sizes", nargs="+", default=["tiny"], choices=tuple(SIZES), metavar="SIZE",
      help=f"model sizes, of {', '.join(SIZES)}")
    a("--heads", nargs="+", default=list(heads.HEADS), choices=heads.HEADS, metavar="HEAD",
      help="heads to time (the baseline is always added: overheads are relative to it)")
    a("--loss_paths", nargs="+", default=["plain", "default"], choices=LOSS_PATHS, metavar="PATH",
      help="loss paths to time: " + "; ".join(f"{k}: {v}" for k, v in LOSS_PATHS.items()))
    a("--chunk_size", type=store.positive_int, default=fused_loss.CHUNK_SIZE,
      help="tokens per chunk of the chunked loss path")
    a("--steps", type=store.positive_int, default=STEPS, help="timed steps per variant")
    a("--warmup", type=store.non_negative_int, default=WARMUP, help="untimed steps first")
    a("--micro_batch", type=store.positive_int, default=None,
      help="sequences per step (default: 16 on CUDA, 4 on CPU)")
    a("--seq_len", type=store.positive_int, default=None,
      help="tokens per sequence (default: 2048 on CUDA, 256 on CPU)")
    a("--vocab_size", type=store.positive_int, default=VOCAB_SIZE, help="V")
    a("--dtype", default="auto", choices=("auto", "bfloat16", "float32"),
      help="autocast dtype, as train.py (auto: bfloat16 on CUDA, float32 elsewhere)")
    a("--compile", action=argparse.BooleanOptionalAction, default=None,
      help="torch.compile, as train.py (default: on CUDA only)")
    a("--tf32", action="store_true", help="TensorFloat-32 for float32 matmuls, as train.py")
    a("--float32_head", action="store_true",
      help="also time the baseline with a float32 LM head (train.py --head_dtype float32)")
    a("--loss_tokens", type=store.non_negative_int, default=0,
      help="also time the LM head alone on this many tokens (0: skip)")
    a("--measure", action="store_true", help="also time the baseline's log step, evaluation "
      "and final statistics over --stat_tokens tokens against its training step")
    a("--stat_tokens", type=store.positive_int, default=MEASURE_STAT_TOKENS, help="see --measure")
    a("--no_train", action="store_true", help="skip the training step (--loss_tokens, --measure)")
    a("--json", type=Path, default=None, help="write the results here (atomically)")
    args = p.parse_args(argv)
    device_type = runs.resolve_device(args, p.error)
    if device_type not in SHAPES:
        p.error(f"--device {args.device} is not supported; use cpu or cuda")
    for key, value in SHAPES[device_type].items():
        setattr(args, key, getattr(args, key) or value)
    if args.no_train and not (args.loss_tokens or args.measure):
        p.error("--no_train leaves nothing to measure; add --loss_tokens N")
    if args.tf32 and device_type != "cuda":
        p.error("--tf32 asks for TensorFloat-32 matmuls, which only CUDA GPUs have; drop it")
    if args.json is not None and args.json.is_dir():
        p.error(f"--json {args.json} is a folder; give a file in it, e.g. "
                f"{args.json / 'bench.json'}")
    args.heads = ["baseline"] + [h for h in dict.fromkeys(args.heads) if h != "baseline"]
    args.impls = distinct_paths(list(dict.fromkeys(args.loss_paths)), args.chunk_size, device_type)
    for size in args.sizes:
        refuse_what_cannot_fit(args, size, device_type, p.error)
    return args


def distinct_paths(impls, chunk_size, device_type):
    """The loss paths without a default that is another requested path on this device (CUDA:
    the plain one; CPU with --chunk_size DEFAULT_CHUNK: the chunked one): timed once, not twice."""
    same = {0: "plain", chunk_size: "chunked"}.get(fused_loss.DEFAULT_CHUNK.get(device_type, 0))
    if "default" in impls and same in impls:
        print(f"bench.py: the default loss path on {device_type} is the {same} one; timed once, "
              f"as {same}")
        impls.remove("default")
    return impls


def device_memory(device):
    """Bytes of memory of the GPU, or of the machine for a CPU (Linux / Unix)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def refuse_what_cannot_fit(args, size, device_type, error):
    """error(one sentence) when a size's step or loss alone needs more than the device's memory,
    by a lower bound: a step keeps its token ids (16 bytes a token) and one float32 activation
    of width D per layer; the head alone h and its gradient (8D), targets and float64 logits."""
    have, cfg = device_memory(torch.device(args.device)), SIZES[size]
    train_tokens = args.micro_batch * args.seq_len
    needs = [] if args.no_train and not args.measure else [(
        train_tokens * (16 + 4 * cfg["n_embd"] * cfg["n_layer"]),
        f"--micro_batch {args.micro_batch} × --seq_len {args.seq_len} = {train_tokens:,} tokens "
        f"per step", "--micro_batch or --seq_len")]
    if args.loss_tokens:
        needs.append((args.loss_tokens * (8 * cfg["n_embd"] + 8 + 8 * args.vocab_size),
                      f"--loss_tokens {args.loss_tokens:,} (V = {args.vocab_size}, D = "
                      f"{cfg['n_embd']})", "--loss_tokens"))
    for need, what, lower in needs:
        if need > have:
            error(f"{what} at {size} would need at least {fmt_memory(need)} of memory, but the "
                  f"{device_type} has {fmt_memory(have)}; lower {lower}")


# ---------------------------------------------------------------------------------------------
# Peak memory of a piece of work, above what was held when it started

def _rss_kib(field):
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1))


def _release_free_heap():
    """Give memory that glibc's malloc keeps after a free back to the OS, so that reusing it
    shows in the resident set again (without this a chunk buffer reused from the heap reads as
    0 bytes). No-op without glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_memory(device, work, reserved=False):
    """Peak memory of one run of work() above what was held when it started, in bytes, or
    None where it cannot be measured (a CPU without Linux's /proc). Measured apart from the
    timed runs: on CPU it first releases the free heap, which makes the next run cold.
    With reserved, (that peak, the caching allocator's): on CUDA, torch.cuda.max_memory_reserved
    above the start after empty_cache, what the process held from the driver at the peak
    (allocated + the allocator's slack: what decides whether runs side by side fit); on a CPU
    None, the RSS growth being already all it held."""
    runs.sync(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
        work()
        runs.sync(device)
        peak = torch.cuda.max_memory_allocated(device) - start[0]
        return (peak, torch.cuda.max_memory_reserved(device) - start[1]) if reserved else peak
    if not Path("/proc/self/clear_refs").exists():
        return (None, None) if reserved else None
    _release_free_heap()
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    start = _rss_kib("VmRSS")
    work()
    peak = 1024 * (_rss_kib("VmHWM") - start)
    return (peak, None) if reserved else peak


def timed(device, work):
    """Seconds of work(), between device syncs."""
    runs.sync(device)
    start = time.perf_counter()
    work()
    runs.sync(device)
    return time.perf_counter() - start


def median_time(device, work, n):
    return statistics.median(timed(device, work) for _ in range(n))  # n ≥ 1


def round_robin(variants, run_once, steps):
    """Each variant's list of run_once(variant) over `steps` rounds of one run each; the order
    rotates every round, so no variant always runs first or after the same neighbour. Prints
    each round's number as it ends: a slow device still shows progress."""
    results = {v: [] for v in variants}
    print(f"  {len(variants)} variants, timed rounds:", end="", flush=True)
    for r in range(steps):
        shift = r % len(variants)
        for v in variants[shift:] + variants[:shift]:
            results[v].append(run_once(v))
        print(f" {r + 1}", end="" if r + 1 < steps else "\n", flush=True)
    return results


# ---------------------------------------------------------------------------------------------
# The training step of train.py, per size, head and loss path

class Variant:
    """One (head, loss path, head dtype) of a size: model, optimizer, step and evaluation
    forward exactly as train.py builds them, one micro-batch per step."""

    def __init__(self, args, size, head, impl, head_dtype, batch):
        self.targs = train.parse_args(
            ["--size", size, "--head", head, "--device", args.device, "--dtype", args.dtype,
             "--micro_batch", str(args.micro_batch), "--batch_size", str(args.micro_batch),
             "--seq_len", str(args.seq_len), "--vocab_size", str(args.vocab_size),
             "--seed", str(SEED), "--compile" if args.compile else "--no-compile",
             *["--tf32"] * args.tf32, *{"plain": ["--loss_chunk", "0"], "default": [],
                                         "chunked": ["--loss_chunk", str(args.chunk_size)]}[impl],
             *["--head_dtype", head_dtype] * (head_dtype != "auto")])
        self.device = torch.device(args.device)
        self.raw = train.build_model(self.targs).to(self.device)
        self.optimizer = train.make_optimizer(self.raw, self.targs)
        self.model = torch.compile(self.raw) if self.targs.compile else self.raw
        self.amp = train.autocast(self.device, self.targs.dtype)
        self.batch, self.step = batch, 0

    def run_step(self):
        self.result = train.train_step(self.model, self.optimizer, lambda: self.batch,
                                       train.lr_at(self.step, self.targs), 1, self.amp)
        self.step += 1

    def run_eval(self):
        """One batch of train.evaluate: the compiled model, no grad, eval mode."""
        train.evaluate(self.model, self.targs, runs.Dist(0, 0, 1, self.device), self.amp,
                       batches=[self.batch])

    def warm_up(self, n):
        """Seconds of n steps, and of one evaluation forward (the first of each compiles)."""
        return (sum(timed(self.device, self.run_step) for _ in range(n)),
                timed(self.device, self.run_eval))


def synthetic_batch(args, device):
    """(x, y) of uniformly random token ids, already on the device: no data loading is timed."""
    gen = torch.Generator().manual_seed(SEED)
    tokens = torch.randint(0, args.vocab_size, (args.micro_batch, args.seq_len + 1), generator=gen)
    return tokens[:, :-1].to(device), tokens[:, 1:].to(device)


def bench_size(args, size, publish):
    """Rows for one size, every head × loss path: each variant timed alone as soon as it is
    built (publish(rows so far) after each), then all of them in turns (publish(final rows))."""
    device = torch.device(args.device)
    print(f"{size}, training step: building, {args.warmup} warm-up step(s) each …", flush=True)
    batch = synthetic_batch(args, device)
    variants, alone, extra = {}, {}, {}
    keys = [(h, i, "auto") for h in args.heads for i in args.impls]
    keys += [("baseline", i, "float32") for i in args.impls if args.float32_head]
    for key in keys:
        variant = variants[key] = Variant(args, size, *key, batch)
        warmup_s, eval_warmup_s = variant.warm_up(args.warmup)
        alone[key] = [timed(device, variant.run_step) for _ in range(args.steps)]
        extra[key] = {"peak_mem_bytes": peak_memory(device, variant.run_step),
                      "warmup_s": warmup_s, "eval_warmup_s": eval_warmup_s,
                      "eval_s": median_time(device, variant.run_eval, args.steps)}
        publish(train_rows(args, size, variants, alone, extra, "alone"))
    in_turns = round_robin(list(variants), lambda key: timed(device, variants[key].run_step),
                           args.steps)
    publish(train_rows(args, size, variants, in_turns, extra, "in turns"))
    del variants
    if device.type == "cuda":
        torch.cuda.empty_cache()


def train_rows(args, size, variants, samples, extra, timing):
    """One row per timed variant: median step time, tokens/s, MFU, the extra measurements of
    bench_size (peak memory, warm-up and evaluation times), and the overheads of add_relative."""
    peak = train.peak_flops(torch.device(args.device), args.dtype)
    tokens, rows = args.micro_batch * args.seq_len, []
    for (head, impl, head_dtype), timings in samples.items():
        seconds, model = statistics.median(timings), variants[head, impl, head_dtype].raw
        flops_per_token = model.flops_per_token(args.seq_len)
        rows.append({"size": size, "head": head, "loss_impl": impl, "head_dtype": head_dtype,
                     "params": model.num_params(), "flops_per_token": flops_per_token,
                     "step_s": seconds, "tokens_per_s": tokens / seconds,
                     "mfu": flops_per_token * tokens / seconds / peak if peak else None,
                     **extra[head, impl, head_dtype], "timing": timing})
    add_relative(rows, "step_s")
    return rows


def add_relative(rows, key):
    """Compare rows measured in the same process (same size):
        overhead      = key / key of the baseline with the same loss path (and the head in
                        autocast's dtype) − 1
        vs_plain      = key / key of the plain path with the same head − 1     (chunked rows)
        mem_reduction = peak memory of the plain path / this row's             (chunked rows)"""
    def find(row, **changes):
        want = {k: row.get(k) for k in ("size", "head", "loss_impl", "head_dtype")} | changes
        return next((r for r in rows if all(r.get(k) == v for k, v in want.items())), None)
    for row in rows:
        same_dtype = {"head_dtype": "auto"} if "head_dtype" in row else {}
        row["overhead"] = row[key] / find(row, head="baseline", **same_dtype)[key] - 1
        plain = find(row, loss_impl="plain") if row["loss_impl"] != "plain" else None
        row["vs_plain"] = row[key] / plain[key] - 1 if plain else None
        row["mem_reduction"] = (plain["peak_mem_bytes"] / row["peak_mem_bytes"]
                                if plain and plain["peak_mem_bytes"] and row["peak_mem_bytes"]
                                else None)


# ---------------------------------------------------------------------------------------------
# The run's measurements against its step (issue 29): train.py's own functions, baseline

def bench_measure(args, size, publish):
    """One row: a training step (step_s), a log step's statistics (log_step_s,
    train.step_metrics), one evaluation batch (eval_s), medians of --steps, and the final
    statistics over --stat_tokens tokens (final_stats_s, train.final_head_stats), timed once."""
    device = torch.device(args.device)
    print(f"{size}, measurements against the training step …", flush=True)
    batch = synthetic_batch(args, device)
    v = Variant(args, size, "baseline", "default", "auto", batch)
    v.warm_up(max(1, args.warmup))  # a step first: the log step measures its result
    batches = [batch] * -(-args.stat_tokens // batch[1].numel())
    ctx = runs.Dist(0, 0, 1, device)
    works = {"step_s": v.run_step,
             "log_step_s": lambda: train.step_metrics(v.raw, v.result, v.targs, v.amp),
             "eval_s": v.run_eval,
             "final_stats_s": lambda: train.final_head_stats(v.raw, v.targs, ctx, v.amp, batches)}
    row = {"size": size, "tokens": batch[1].numel(), "stat_tokens": batch[1].numel() *
           len(batches), **{k: median_time(device, w, 1 if k == "final_stats_s" else args.steps)
                            for k, w in works.items()}}
    publish([row])


# ---------------------------------------------------------------------------------------------
# The LM head alone: forward + backward of head(h, W, targets)

def loss_functions(name, args, device_type):
    """{path: f(h, W, targets) → loss} for head `name`: this project's paths (plain, default,
    chunked), then the anchors that can compute the same loss: F.cross_entropy(F.linear(·)) with
    the head's extra terms written out, torch's F.linear_cross_entropy (CE only: baseline, μ-loss,
    μ-centering), and on CUDA, where installed, Liger Kernel's and Apple's fused linear CE."""
    head = heads.build(name)

    def ours(path):
        variant = heads.build(name)
        variant.loss_path = path
        return lambda h, w, y: variant(h, w, y)[0]

    def plus_mu_loss(ce_fn):  # the anchors do CE (+ cap / z-loss where they can); μ-loss is added
        if name != "mu_loss":
            return ce_fn
        return lambda h, w, y: ce_fn(h, w, y) + head.regulariser(w, None, None)

    paths = {"plain": ours(None), "default": ours(fused_loss.loss_path(None, device_type)),
             "chunked": ours(functools.partial(fused_loss.chunked_loss, chunk_size=args.chunk_size,
                                               torch_op=False))}
    paths = {k: v for k, v in paths.items() if k in args.impls}
    paths["F.ce(F.linear)"] = plus_mu_loss(functools.partial(naive_loss, head))
    fused = {}
    if fused_loss.TORCH_OP and name in fused_loss.PLAIN_CE_HEADS:
        options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=args.chunk_size)
        fused["F.linear_ce"] = lambda h, w, y: F.linear_cross_entropy(
            h, w, y, ignore_index=heads.IGNORE, options=options)
    if device_type == "cuda":
        fused |= gpu_anchors(head)
    return paths | {k: plus_mu_loss(in_autocast_dtype(f)) for k, f in fused.items()}


def in_autocast_dtype(loss_fn):
    """loss_fn(h, W, y) fed h and W in autocast's dtype where autocast is on, as autocast feeds
    F.linear: the fused ops have no autocast rule and would otherwise run in float32, so that
    "ours against the best anchor" would compare a bf16 path with a float32 one."""
    def cast(h, weight, targets):
        if torch.is_autocast_enabled(h.device.type):
            dtype = torch.get_autocast_dtype(h.device.type)
            h, weight = h.to(dtype), weight.to(dtype)
        return loss_fn(h, weight, targets)
    return cast


def naive_loss(head, h, weight, targets):
    """The head's loss as one would write it with torch's ops on the full N × V logits."""
    logits = F.linear(h, weight).float()
    if head.cap is not None:
        logits = head.cap * torch.tanh(logits / head.cap)
    loss = F.cross_entropy(logits, targets, ignore_index=heads.IGNORE)
    if head.name == "z_loss":
        loss = loss + head.lam * torch.logsumexp(logits, dim=-1).square().mean()
    return loss


def gpu_anchors(head):
    """Liger Kernel's and Cut Cross-Entropy's fused linear CE for this head, where importable
    (optional, benchmark only; never a dependency of the project)."""
    anchors = {}
    with contextlib.suppress(ImportError, TypeError):  # not installed, or too old for softcap
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
        liger = LigerFusedLinearCrossEntropyLoss(
            ignore_index=heads.IGNORE, **({"softcap": head.cap} if head.cap else {}),
            **({"lse_square_scale": head.lam} if head.name == "z_loss" else {}))
        anchors["liger"] = lambda h, w, y: liger(w, h, y)
    with contextlib.suppress(ImportError):
        from cut_cross_entropy import linear_cross_entropy
        if head.name != "z_loss":  # CCE has a soft-cap but no z-loss
            anchors["cce"] = lambda h, w, y: linear_cross_entropy(
                h, w, y, ignore_index=heads.IGNORE, softcap=head.cap)
    return anchors


def errors_vs_float64(name, loss_fn, h, weight, targets, amp):
    """(|Δ loss|, max |Δ grad| / max |grad|) of loss_fn against heads.py's plain path in float64."""
    def loss_and_grads(fn, h, weight):
        h, weight = h.detach().requires_grad_(), weight.detach().requires_grad_()
        loss = fn(h, weight, targets)
        return loss.detach().double(), torch.autograd.grad(loss, (h, weight))
    ref_loss, ref_grads = loss_and_grads(lambda *a: heads.build(name)(*a)[0], h.double(),
                                         weight.double())
    with amp:
        loss, grads = loss_and_grads(loss_fn, h, weight)
    grad_err = max(float((g.double() - r).abs().max() / r.abs().max())
                   for g, r in zip(grads, ref_grads))
    return float((loss - ref_loss).abs()), grad_err


def bench_loss_path(args, size, publish):
    """publish(rows) for the head alone at this size's width: every head × loss path (ours and
    the anchors), timed in turns, with the errors of loss and gradients against float64."""
    device = torch.device(args.device)
    print(f"{size}, LM head alone: errors against float64, warming up …", flush=True)
    n, dim, vocab = args.loss_tokens, SIZES[size]["n_embd"], args.vocab_size
    gen = torch.Generator().manual_seed(SEED)
    weight = (torch.randn(vocab, dim, generator=gen) / dim ** 0.5).to(device).requires_grad_()
    h = torch.randn(n, dim, generator=gen).to(device).requires_grad_()
    targets = torch.randint(0, vocab, (n,), generator=gen).to(device)
    amp = train.autocast(device, args.dtype)

    def forward_backward(loss_fn):
        def work():
            with amp:
                loss = loss_fn(h, weight, targets)
            loss.backward()
            h.grad = weight.grad = None
        return work

    works, errors = {}, {}
    for name in args.heads:
        for path, loss_fn in loss_functions(name, args, device.type).items():
            errors[name, path] = errors_vs_float64(name, loss_fn, h, weight, targets, amp)
            work = works[name, path] = forward_backward(torch.compile(loss_fn) if args.compile
                                                        else loss_fn)
            for _ in range(args.warmup):
                work()
    samples = round_robin(list(works), lambda key: timed(device, works[key]), args.steps)
    peaks = {key: peak_memory(device, work) for key, work in works.items()}
    seconds = {key: statistics.median(timings) for key, timings in samples.items()}
    torch_op = seconds.get(("baseline", "F.linear_ce"))
    rows = [{"size": size, "tokens": n, "dim": dim, "vocab": vocab, "head": name,
             "loss_impl": path, "time_s": seconds[name, path], "peak_mem_bytes": peak_bytes,
             "vs_torch_op": seconds[name, path] / torch_op if torch_op else None,
             "loss_err": errors[name, path][0], "grad_err": errors[name, path][1]}
            for (name, path), peak_bytes in peaks.items()]
    add_relative(rows, "time_s")
    publish(rows)


# ---------------------------------------------------------------------------------------------
# Output

def fmt_bytes(n):
    return "n/a" if n is None else f"{n / 2**20:,.1f} MiB"


def fmt_memory(n):
    """Bytes in GiB or a larger binary unit, for what a machine holds."""
    exponent = min(max(3, int(math.log(max(n, 1), 1024))), 6)
    return f"{n / 1024 ** exponent:,.1f} {'GTPE'[exponent - 3]}iB"


def fmt_pct(x):
    return "" if x is None else f"{100 * x:+.1f}%"


def label(row):
    """The head's name, and its dtype where it is not autocast's: `baseline+f32`."""
    return row["head"] + ("+f32" if row.get("head_dtype") == "float32" else "")


def print_tables(result):
    args, rows = result["settings"], result["train"]
    setting = (f"{result['device_name']}, {args['dtype']}, "
               f"{'compiled' if args['compile'] else 'eager'}, median of {args['steps']}")
    if rows:
        print(f"\nAdditional training time relative to baseline (cf. the paper's Table 2 iii); "
              f"{setting}, micro-batch {args['micro_batch']} × seq {args['seq_len']}")
        columns = args["heads"] + ["baseline+f32"] * args["float32_head"]
        for impl in args["impls"]:
            print(f"loss path: {impl}\n{'size':>6} " + " ".join(f"{h:>10}" for h in columns))
            for size in args["sizes"]:
                cells = {label(r): r for r in rows if (r["size"], r["loss_impl"]) == (size, impl)}
                print(f"{size:>6} " + " ".join(f"{fmt_pct(cells[h]['overhead']):>10}"
                                               for h in columns))
        print(f"\n{'size':>6} {'head':>12} {'loss':>8} {'step ms':>9} {'eval ms':>8} "
              f"{'tokens/s':>10} {'MFU':>6} {'peak mem':>10} {'vs plain':>9} {'mem ÷':>6}")
        for r in rows:
            mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
            ratio = "" if r["mem_reduction"] is None else f"{r['mem_reduction']:.1f}×"
            print(f"{r['size']:>6} {label(r):>12} {r['loss_impl']:>8} {1e3 * r['step_s']:>9.1f} "
                  f"{1e3 * r['eval_s']:>8.1f} {r['tokens_per_s']:>10,.0f} {mfu:>6} "
                  f"{fmt_bytes(r['peak_mem_bytes']):>10} {fmt_pct(r['vs_plain']):>9} {ratio:>6}")
    if result["loss_path"]:
        print(f"\nLM head alone, forward + backward; {setting}; peak memory: "
              f"{result['memory_measure']}; × torch op: time / F.linear_cross_entropy's on "
              f"baseline; errors against heads.py's plain path in float64 (grad: max |Δ| / max "
              f"|grad|)\n{'tokens':>7} {'V':>6} {'D':>5} {'head':>10} {'path':>15} {'ms':>8} "
              f"{'× torch op':>10} {'peak mem':>10} {'|Δ loss|':>9} {'Δ grad':>9}")
        for r in result["loss_path"]:
            ratio = "" if r["vs_torch_op"] is None else f"{r['vs_torch_op']:.2f}"
            print(f"{r['tokens']:>7} {r['vocab']:>6} {r['dim']:>5} {r['head']:>10} "
                  f"{r['loss_impl']:>15} {1e3 * r['time_s']:>8.1f} {ratio:>10} "
                  f"{fmt_bytes(r['peak_mem_bytes']):>10} {r['loss_err']:>9.1e} "
                  f"{r['grad_err']:>9.1e}")
    if result["measure"]:
        print(f"\nMeasurements against a training step (baseline); {setting}; log share: a log "
              f"step over train.py's default --log_every 10 steps")
        print(f"{'size':>6} {'step ms':>9} {'log step ms':>12} {'log share':>10} {'eval ms':>8} "
              f"{'final stats s':>14} {'over tokens':>12}")
        for r in result["measure"]:
            print(f"{r['size']:>6} {1e3 * r['step_s']:>9.1f} {1e3 * r['log_step_s']:>12.1f} "
                  f"{r['log_step_s'] / (10 * r['step_s']):>10.1%} {1e3 * r['eval_s']:>8.1f} "
                  f"{r['final_stats_s']:>14.2f} {r['stat_tokens']:>12,}")


def device_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({torch.get_num_threads()} threads)"


def allow_recompiles(config, limit=64):
    """Every head and loss path is its own compiled graph of GPT.forward; beyond torch's default
    limit of 8 per function the rest would silently run uncompiled. cache_size_limit is the
    name in every torch ≥ 2.0 (recompile_limit, from 2.7 on, is the same setting)."""
    config.cache_size_limit = max(config.cache_size_limit, limit)


def save(path, result):
    if path is not None:
        store.make_folder(path.parent)
        train.write_json(path, result)


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    torch.set_float32_matmul_precision("high" if args.tf32 else "highest")  # as train.py
    allow_recompiles(torch._dynamo.config)
    result = {"device_name": device_name(device), "torch": torch.__version__,
              "peak_flops": train.peak_flops(device, args.dtype),
              "memory_measure": ("torch.cuda.max_memory_allocated above the start"
                                 if device.type == "cuda" else "peak RSS growth (VmHWM)"),
              "settings": {k: v for k, v in vars(args).items() if k != "json"},
              "train": [], "loss_path": [], "measure": []}

    def publish(part):
        """Where the size being measured hands its rows: after the earlier sizes' rows."""
        done = list(result[part])

        def rows_so_far(rows):
            result[part] = done + rows
            save(args.json, result)
        return rows_so_far

    parts = {"train": (not args.no_train, bench_size),
             "loss_path": (args.loss_tokens, bench_loss_path),
             "measure": (args.measure, bench_measure)}
    size = args.sizes[0]
    try:
        save(args.json, result)  # at once: a --json that cannot be written ends before any work
        for size in args.sizes:
            for part, (wanted, bench) in parts.items():
                if wanted:
                    bench(args, size, publish(part))
    except store.WriteError as err:  # store.py's sentence, and what to do where it has none
        advice = ("" if ";" in str(err) else "; free space or write elsewhere"
                  if isinstance(err, store.DiskFullError) else "; give --json a file you can write")
        raise SystemExit(f"bench.py: error: --json: {err}{advice}") from None
    except RuntimeError as err:
        if not (isinstance(err, torch.cuda.OutOfMemoryError)
                or "can't allocate memory" in str(err)):
            raise
        kept = f"; {args.json} holds what was measured before" if args.json else ""
        raise SystemExit(f"bench.py: error: {size} ran out of {device.type} memory; lower "
                         f"--micro_batch, --seq_len or --loss_tokens{kept}") from None
    print_tables(result)
    return result


if __name__ == "__main__":
    main()

"""Speed and memory of train.py's training step, of its LM head alone, and of its measurements.

    python bench.py --device cpu --sizes tiny --steps 10                  # seconds, on a laptop
    python bench.py --sizes 16M 221M --loss_paths plain default chunked --json out/bench.json
    python bench.py --device cpu --no_train --loss_tokens 1024 --loss_paths plain default chunked

Each variant (size × head × loss path), built as train.py does, is timed on random tokens between
device syncs: warm-up steps (the first compiles), --steps steps alone, then in turns with the
size's others, the order rotating; peak memory in one more run. Busy CPU: OMP_NUM_THREADS=1.
"""
import argparse
import contextlib
import ctypes
import functools
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
LOSS_PATHS = {"plain": "heads.py's (--loss_chunk 0)", "default": "train.py's (DEFAULT_CHUNK)",
              "chunked": "fused_loss.chunked_loss, --chunk_size tokens at a time"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="bench.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:1, …")
    a("--sizes", nargs="+", default=["tiny"], choices=tuple(SIZES), metavar="SIZE",
      help=", ".join(SIZES))
    a("--heads", nargs="+", default=list(heads.HEADS), choices=heads.HEADS, metavar="HEAD",
      help=", ".join(heads.HEADS) + " (the baseline is always added: overheads are relative to it)")
    a("--loss_paths", nargs="+", default=["plain", "default"], choices=LOSS_PATHS, metavar="PATH",
      help="; ".join(f"{k}: {v}" for k, v in LOSS_PATHS.items()))
    a("--chunk_size", type=store.positive_int, default=fused_loss.CHUNK_SIZE, help="for chunked")
    a("--steps", type=store.positive_int, default=STEPS, help="timed steps per variant")
    a("--warmup", type=store.non_negative_int, default=WARMUP, help="untimed steps first")
    a("--micro_batch", type=store.positive_int, help="sequences per step (CUDA: 16, CPU: 4)")
    a("--seq_len", type=store.positive_int, help="tokens per sequence (CUDA: 2048, CPU: 256)")
    a("--vocab_size", type=store.positive_int, default=VOCAB_SIZE, help="V")
    a("--dtype", default="auto", choices=("auto", "bfloat16", "float32"), help="as train.py")
    a("--compile", action=argparse.BooleanOptionalAction, help="torch.compile (None: CUDA only)")
    a("--backend", default="inductor", help="torch.compile's (aot_eager: traced, no code made)")
    a("--tf32", action="store_true", help="TensorFloat-32 for float32 matmuls, as train.py")
    a("--float32_head", action="store_true", help="also time the baseline's --head_dtype float32")
    a("--loss_tokens", type=store.non_negative_int, default=0, help="also time the head alone")
    a("--measure", action="store_true", help="also time a log step, an evaluation, final stats")
    a("--stat_tokens", type=store.positive_int, default=8192, help="tokens of --measure's stats")
    a("--no_train", action="store_true", help="skip the training step (--loss_tokens, --measure)")
    a("--no_eval", action="store_true", help="skip timing the evaluation (a graph of its own)")
    a("--json", type=Path, help="write the results here, anew (atomically): once before any "
      "work, after every training variant and each size's round in turns, and after each size's "
      "head-alone and --measure rows")
    args = p.parse_args(argv)
    device_type = runs.resolve_device(args, p.error)  # cpu or cuda, or one sentence
    for key, value in SHAPES[device_type].items():
        setattr(args, key, getattr(args, key) or value)
    if args.no_train and not (args.loss_tokens or args.measure):
        p.error("--no_train leaves nothing to measure; add --loss_tokens N or --measure")
    if args.json and args.json.is_dir():
        p.error(f"--json {args.json} is a folder; give a file in it, e.g. "
                f"{args.json / 'bench.json'}")
    args.heads = ["baseline"] + [h for h in dict.fromkeys(args.heads) if h != "baseline"]
    args.impls = list(dict.fromkeys(args.loss_paths))
    same = {0: "plain", args.chunk_size: "chunked"}.get(fused_loss.DEFAULT_CHUNK[device_type])
    if "default" in args.impls and same in args.impls:  # one path: timed once
        print(f"bench.py: the default loss path on {device_type} is the {same} one; timed once")
        args.impls.remove("default")
    for size in args.sizes:
        refuse_what_cannot_fit(args, size, device_type, p.error)
    return args


def refuse_what_cannot_fit(args, size, device_type, error):
    """error(one sentence) where a lower bound of the bytes a size needs exceeds the device's: per
    token, a step's ids and a float32 activation per layer; the head alone's h, grad, logits."""
    have, cfg = runs.device_memory(torch.device(args.device)), SIZES[size]
    tokens, dim = args.micro_batch * args.seq_len, cfg["n_embd"]
    for need, what, lower in [
            ((not args.no_train or args.measure) * tokens * (16 + 4 * dim * cfg["n_layer"]),
             f"--micro_batch {args.micro_batch} × --seq_len {args.seq_len} = {tokens:,} tokens "
             "per step", "--micro_batch or --seq_len"),
            (args.loss_tokens * (8 * dim + 8 + 8 * args.vocab_size), f"--loss_tokens "
             f"{args.loss_tokens:,} (V = {args.vocab_size}, D = {dim})", "--loss_tokens")]:
        if need > have:
            error(f"{what} at {size} would need at least {need / 2**30:,.1f} GiB of memory, but "
                  f"the {device_type} has {have / 2**30:,.1f} GiB; lower {lower}")


# ---- Peak memory of a piece of work, above what was held when it started --------------------
def _rss_kib(field):
    return int(re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)[1])


def peak_memory(device, work, reserved=False):
    """Peak bytes of one run of work() above what was held at its start (None on a CPU without
    /proc), apart from timed runs (a CPU's free heap is released first). reserved: also CUDA's
    max_memory_reserved above the start (allocated + slack: what fits side by side), None on CPU."""
    runs.sync(device)
    peak = held = None
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
        work()
        runs.sync(device)
        peak = torch.cuda.max_memory_allocated(device) - start[0]
        held = torch.cuda.max_memory_reserved(device) - start[1]
    elif Path("/proc/self/clear_refs").exists():
        with contextlib.suppress(OSError, AttributeError):  # else its reuse reads as 0 B of RSS
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        start = _rss_kib("VmRSS")
        work()
        peak = 1024 * (_rss_kib("VmHWM") - start)
    return (peak, held) if reserved else peak


def timed(device, work, n=1):
    """The median over n runs of work()'s seconds, each between device syncs."""
    def once():
        runs.sync(device)
        start = time.perf_counter()
        work()
        runs.sync(device)
        return time.perf_counter() - start
    return statistics.median(once() for _ in range(n))


def round_robin(variants, run_once, steps):
    """{variant: [run_once(variant) of each of `steps` rounds]}, the order rotating every round."""
    results = {v: [] for v in variants}
    print(f"  {len(variants)} variants, timed rounds:", end="", flush=True)
    for r in range(steps):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            results[v].append(run_once(v))
        print(f" {r + 1}", end="" if r + 1 < steps else "\n", flush=True)
    return results


# ---- The training step of train.py, per size, head and loss path ---------------------------
class Variant:
    """A (head, loss path, head dtype) of a size as train.py builds it, on one random batch."""

    def __init__(self, args, size, head, impl, head_dtype):
        chunk = {"plain": ["--loss_chunk", "0"], "chunked": ["--loss_chunk", str(args.chunk_size)]}
        options = dict(size=size, head=head, head_dtype=head_dtype, device=args.device, seed=SEED,
                       dtype=args.dtype, micro_batch=args.micro_batch, batch_size=args.micro_batch,
                       seq_len=args.seq_len, vocab_size=args.vocab_size)
        self.targs = train.parse_args([x for k, v in options.items() for x in (f"--{k}", str(v))]
                                      + chunk.get(impl, []) + ["--tf32"] * args.tf32
                                      + ["--compile" if args.compile else "--no-compile"])
        self.device = torch.device(args.device)
        self.raw = train.build_model(self.targs).to(self.device)
        self.optimizer = train.make_optimizer(self.raw, self.targs)
        self.model = (torch.compile(self.raw, backend=args.backend) if self.targs.compile
                      else self.raw)
        self.amp = train.autocast(self.device, self.targs.dtype)
        self.ctx = runs.Dist(0, 0, 1, self.device)  # one process
        tokens = torch.randint(0, args.vocab_size, (args.micro_batch, args.seq_len + 1),
                               generator=torch.Generator().manual_seed(SEED))
        self.batch, self.step = (tokens[:, :-1].to(self.device), tokens[:, 1:].to(self.device)), 0

    def run_step(self):
        self.result = train.train_step(self.model, self.optimizer, lambda: self.batch,
                                       train.lr_at(self.step, self.targs), 1, self.amp)
        self.step += 1

    def run_eval(self):
        train.evaluate(self.model, self.targs, self.ctx, self.amp, batches=[self.batch])


def bench_size(args, size, publish):
    """publish(rows) after each variant is built and timed alone, then once all are in turns."""
    device = torch.device(args.device)
    print(f"{size}, training step: building, {args.warmup} warm-up step(s) each …", flush=True)
    peak, tokens = runs.peak_flops(device, args.dtype), args.micro_batch * args.seq_len
    variants, alone, extra = {}, {}, {}

    def rows(samples, timing):  # median step times, tokens/s and MFU beside extra[key]
        out = []
        for key, timings in samples.items():
            seconds, flops = statistics.median(timings), extra[key]["flops_per_token"] * tokens
            out.append({"size": size, **dict(zip(("head", "loss_impl", "head_dtype"), key)),
                        **extra[key], "step_s": seconds, "tokens_per_s": tokens / seconds,
                        "mfu": flops / seconds / peak if peak else None, "timing": timing})
        add_relative(out, "step_s")
        return out

    keys = [(h, i, "auto") for h in args.heads for i in args.impls]
    keys += [("baseline", i, "float32") for i in args.impls if args.float32_head]
    for key in keys:
        variant = variants[key] = Variant(args, size, *key)
        warmup_s = sum(timed(device, variant.run_step) for _ in range(args.warmup))
        alone[key] = [timed(device, variant.run_step) for _ in range(args.steps)]
        peak_bytes, reserved = peak_memory(device, variant.run_step, reserved=True)
        eval_warmup_s, eval_s = (None, None) if args.no_eval else (  # the first one compiles
            timed(device, variant.run_eval), timed(device, variant.run_eval, args.steps))
        extra[key] = {"params": variant.raw.num_params(),
                      "flops_per_token": variant.raw.flops_per_token(args.seq_len),
                      "peak_mem_bytes": peak_bytes, "peak_reserved_bytes": reserved,
                      "warmup_s": warmup_s, "eval_warmup_s": eval_warmup_s, "eval_s": eval_s}
        publish(rows(alone, "alone"))
    publish(rows(round_robin(keys, lambda key: timed(device, variants[key].run_step),
                             args.steps), "in turns"))


def add_relative(rows, key):
    """Compare rows measured in the same process (same size):
        overhead      = key / key of the baseline with the same loss path (head dtype: auto) − 1
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
        both = plain and plain["peak_mem_bytes"] and row["peak_mem_bytes"]
        row["mem_reduction"] = plain["peak_mem_bytes"] / row["peak_mem_bytes"] if both else None


def bench_measure(args, size, publish):
    """One row, the baseline's: medians of --steps steps, log steps and evaluations; final stats."""
    print(f"{size}, measurements against the training step …", flush=True)
    v = Variant(args, size, "baseline", "default", "auto")
    for warm_up in [v.run_step] * max(1, args.warmup) + [v.run_eval]:  # ≥ 1 step: the log reads it
        warm_up()
    tokens = v.batch[1].numel()
    batches = [v.batch] * -(-args.stat_tokens // tokens)
    works = {"step_s": v.run_step,
             "log_step_s": lambda: train.step_metrics(v.raw, v.result, v.targs, v.amp),
             "eval_s": v.run_eval,
             "final_stats_s": lambda: train.final_head_stats(v.raw, v.targs, v.ctx, v.amp, batches)}
    publish([{"size": size, "tokens": tokens, "stat_tokens": tokens * len(batches),
              **{k: timed(v.device, w, 1 if k == "final_stats_s" else args.steps)
                 for k, w in works.items()}}])


# ---- The LM head alone: forward + backward of head(h, W, targets), ours and the anchors ----
def loss_functions(name, args, device_type):
    """{path: f(h, W, targets) → loss} for head `name`: ours, then anchors that compute its loss:
    F.ce(F.linear) written out, F.linear_cross_entropy (CE heads), on CUDA Liger's and CCE."""
    head = heads.build(name)

    def ours(path):
        variant = heads.build(name)
        variant.loss_path = path
        return lambda h, w, y: variant(h, w, y)[0]

    def naive(h, weight, targets):  # as one would write it with torch's ops, by the head's hooks
        logits = head.cap_logits(F.linear(h, weight).float())
        loss = F.cross_entropy(logits, targets, ignore_index=heads.IGNORE)
        penalty = head.log_z_penalty(torch.logsumexp(logits, dim=-1))  # no target is ignored
        return loss if penalty is None else loss + penalty.mean()

    def anchor(loss_fn):
        """loss_fn fed h and W in autocast's dtype, as F.linear is (the fused ops have no autocast
        rule: they would run float32 against our bf16), plus μ-loss's term, which none has."""
        def loss(h, weight, targets):
            on = torch.is_autocast_enabled(h.device.type)
            dtype = torch.get_autocast_dtype(h.device.type) if on else h.dtype
            value, term = loss_fn(h.to(dtype), weight.to(dtype), targets), head.regulariser(weight)
            return value if term is None else value + term
        return loss

    paths = {"plain": None, "default": fused_loss.loss_path(None, device_type), "chunked":
             functools.partial(fused_loss.chunked_loss, chunk_size=args.chunk_size, torch_op=False)}
    fns = {k: ours(path) for k, path in paths.items() if k in args.impls}
    fns["F.ce(F.linear)"] = anchor(naive)
    if fused_loss.TORCH_OP and head.plain_softmax:
        options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=args.chunk_size)
        fns["F.linear_ce"] = anchor(lambda h, w, y: F.linear_cross_entropy(
            h, w, y, ignore_index=heads.IGNORE, options=options))
    if device_type != "cuda":  # the optional anchors below: never a dependency of the project
        return fns
    with contextlib.suppress(ImportError, TypeError):  # not installed, or too old for softcap
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
        liger = LigerFusedLinearCrossEntropyLoss(
            ignore_index=heads.IGNORE, **({"softcap": head.cap} if head.cap else {}),
            **({"lse_square_scale": head.lam} if name == "z_loss" else {}))
        fns["liger"] = anchor(lambda h, w, y: liger(w, h, y))
    with contextlib.suppress(ImportError):
        from cut_cross_entropy import linear_cross_entropy
        if name != "z_loss":  # CCE has a soft-cap but no z-loss
            fns["cce"] = anchor(lambda h, w, y: linear_cross_entropy(
                h, w, y, ignore_index=heads.IGNORE, softcap=head.cap))
    return fns


def bench_loss_path(args, size, publish):
    """publish(rows) of the head alone at the size's width: heads × paths in turns, their errors."""
    device = torch.device(args.device)
    print(f"{size}, LM head alone: errors against float64, warming up …", flush=True)
    n, dim, vocab = args.loss_tokens, SIZES[size]["n_embd"], args.vocab_size
    gen = torch.Generator().manual_seed(SEED)
    weight = (torch.randn(vocab, dim, generator=gen) / dim ** 0.5).to(device)
    h = torch.randn(n, dim, generator=gen).to(device)
    targets = torch.randint(0, vocab, (n,), generator=gen).to(device)
    amp = train.autocast(device, args.dtype)

    def loss_and_grads(fn, *inputs):  # under autocast, which leaves the float64 reference be
        inputs = [x.detach().requires_grad_() for x in inputs]
        with amp:
            loss = fn(*inputs, targets)
        return loss.detach().double(), torch.autograd.grad(loss, inputs)

    works, errs = {}, {}
    for name in args.heads:
        ref, ref_grads = loss_and_grads(lambda *a: heads.build(name)(*a)[0], h.double(),
                                        weight.double())
        for path, loss_fn in loss_functions(name, args, device.type).items():
            loss, grads = loss_and_grads(loss_fn, h, weight)
            grad_err = max(float((g.double() - r).abs().max() / r.abs().max())  # relative
                           for g, r in zip(grads, ref_grads))
            errs[name, path] = {"loss_err": float((loss - ref).abs()), "grad_err": grad_err}
            works[name, path] = functools.partial(
                loss_and_grads, torch.compile(loss_fn, backend=args.backend) if args.compile
                else loss_fn, h, weight)
            for _ in range(args.warmup):
                works[name, path]()
    samples = round_robin(list(works), lambda key: timed(device, works[key]), args.steps)
    seconds = {key: statistics.median(timings) for key, timings in samples.items()}
    torch_op = seconds.get(("baseline", "F.linear_ce"))
    rows = [{"size": size, "tokens": n, "dim": dim, "vocab": vocab, "head": name,
             "loss_impl": path, "time_s": seconds[name, path],
             "peak_mem_bytes": peak_memory(device, works[name, path]),
             "vs_torch_op": seconds[name, path] / torch_op if torch_op else None,
             **errs[name, path]} for name, path in works]
    add_relative(rows, "time_s")
    publish(rows)


def print_table(title, columns, rows):
    """title, then the rows right-aligned under columns of (header, key[, format[, unit]])."""
    cell = lambda x, spec="", unit=1: "n/a" if x is None else format(x * unit, spec)  # noqa: E731
    lines = [[c[0] for c in columns]] + [[cell(r[c[1]], *c[2:]) for c in columns] for r in rows]
    widths = [max(map(len, column)) for column in zip(*lines)]
    if rows:
        print(f"\n{title}", *(" ".join(map(str.rjust, line, widths)) for line in lines), sep="\n")


def print_tables(result):
    args, ms, pct, mib = result["settings"], (".1f", 1e3), ("+.1%",), (",.1f", 2**-20)
    rows = [r | {"label": r["head"] + "+f32" * (r["head_dtype"] == "float32")}
            for r in result["train"]]
    setting = (f"{result['device_name']}, {args['dtype']}, "
               f"{'compiled' if args['compile'] else 'eager'}, median of {args['steps']}")
    labels = args["heads"] + ["baseline+f32"] * args["float32_head"]
    for impl in args["impls"] if rows else []:
        overheads = {(r["size"], r["label"]): r["overhead"] for r in rows if r["loss_impl"] == impl}
        print_table(f"Additional training time relative to baseline (cf. the paper's Table 2 iii); "
                    f"{setting}, micro-batch {args['micro_batch']} × seq {args['seq_len']}; loss "
                    f"path: {impl}", [("size", "size"), *((h, h, *pct) for h in labels)],
                    [{"size": size} | {h: overheads[size, h] for h in labels}
                     for size in args["sizes"]])
    print_table(f"Training steps; {setting}", [
        ("size", "size"), ("head", "label"), ("loss", "loss_impl"), ("step ms", "step_s", *ms),
        ("eval ms", "eval_s", *ms), ("tokens/s", "tokens_per_s", ",.0f"), ("MFU", "mfu", ".1%"),
        ("peak MiB", "peak_mem_bytes", *mib), ("vs plain", "vs_plain", *pct),
        ("mem ÷", "mem_reduction", ".1f")], rows)
    print_table(f"LM head alone, forward + backward; {setting}; peak memory: "
                f"{result['memory_measure']}; × torch op: time / baseline's "
                f"F.linear_cross_entropy's; errors against heads.py's plain path in float64 "
                f"(grad: max |Δ| / max |grad|)", [
                    ("tokens", "tokens"), ("V", "vocab"), ("D", "dim"), ("head", "head"),
                    ("path", "loss_impl"), ("ms", "time_s", *ms), ("× torch op", "vs_torch_op",
                    ".2f"), ("peak MiB", "peak_mem_bytes", *mib), ("|Δ loss|", "loss_err", ".1e"),
                    ("Δ grad", "grad_err", ".1e")], result["loss_path"])
    print_table(f"Measurements against a training step (baseline); {setting}; log share: a log "
                f"step / 10 steps (--log_every)", [
                    ("size", "size"), ("step ms", "step_s", *ms), ("log step ms", "log_step_s",
                    *ms), ("log share", "log_share", ".1%"), ("eval ms", "eval_s", *ms),
                    ("final stats s", "final_stats_s", ".2f"), ("over tokens", "stat_tokens", ",")],
                [r | {"log_share": r["log_step_s"] / (10 * r["step_s"])}
                 for r in result["measure"]])


def allow_recompiles(config, limit=64):
    """Past torch's default of 8 graphs of GPT.forward (a head and path each) the rest run eager."""
    config.cache_size_limit = max(config.cache_size_limit, limit)  # every torch ≥ 2.0 has this name


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    torch.set_float32_matmul_precision("high" if args.tf32 else "highest")  # as train.py
    allow_recompiles(torch._dynamo.config)
    result = {"device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
              else f"CPU ({torch.get_num_threads()} threads)", "torch": torch.__version__,
              "peak_flops": runs.peak_flops(device, args.dtype),
              "memory_measure": ("torch.cuda.max_memory_allocated above the start"
                                 if device.type == "cuda" else "peak RSS growth (VmHWM)"),
              "settings": {k: v for k, v in vars(args).items() if k != "json"},
              "train": [], "loss_path": [], "measure": []}

    def publish(part, done, rows):  # a size's rows go after the earlier sizes' (`done`)
        result[part] = done + rows
        if args.json is not None:
            store.make_folder(args.json.parent)
            runs.write_json(args.json, result)

    try:
        publish("train", [], [])  # at once: a --json that cannot be written ends before any work
        for size in args.sizes:
            for part, wanted, bench in (("train", not args.no_train, bench_size),
                                        ("loss_path", args.loss_tokens, bench_loss_path),
                                        ("measure", args.measure, bench_measure)):
                if wanted:
                    bench(args, size, functools.partial(publish, part, list(result[part])))
                    torch.cuda.empty_cache()  # the finished part's GPU memory goes back
    except store.WriteError as err:  # store.py's sentence, and what to do where it has none
        advice = ("" if ";" in str(err) else "; free space or write elsewhere"
                  if isinstance(err, store.DiskFullError) else "; give --json a file you can write")
        raise SystemExit(f"bench.py: error: --json: {err}{advice}") from None
    except RuntimeError as err:
        if not isinstance(err, torch.cuda.OutOfMemoryError) and "can't allocate" not in str(err):
            raise
        kept = f"; {args.json} holds what was measured before" if args.json else ""
        raise SystemExit(f"bench.py: error: {size} ran out of {device.type} memory; lower "
                         f"--micro_batch, --seq_len or --loss_tokens{kept}") from None
    print_tables(result)
    return result


if __name__ == "__main__":
    main()

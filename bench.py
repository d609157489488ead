"""Speed and memory of train.py's training step, and of its LM head alone.

    python bench.py --device cpu                         # every head's step at tiny, on a CPU
    python bench.py --sizes 16M 221M --loss_paths plain chunked --json out/bench.json
    python bench.py --device cpu --no_train --loss_tokens 1024 --heads baseline z_loss

Each variant (size × head × loss path), built and stepped as train.py does on one random batch,
takes --warmup steps; then all take --steps rounds in turns, the order turning, so that a
machine that slows for a while slows all alike; a row holds the median. Peak memory: CUDA's
max_memory_allocated in a step (n/a on a CPU). The LM head alone runs on random h, W, targets,
beside torch's F.linear_cross_entropy where that computes the head's loss, with its error
against float64. On a busy CPU set OMP_NUM_THREADS=1.
"""
import argparse
import functools
import itertools
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import heads
import train
from model import SIZES

# CUDA: the paper's micro-batch; a CPU: small, a step in seconds
SHAPES = {"cuda": dict(micro_batch=16, seq_len=2048, chunk_size=4096),
          "cpu": dict(micro_batch=4, seq_len=256, chunk_size=train.CPU_LOSS_CHUNK)}
HOOKS = ("cap_logits", "log_z_penalty")  # a head that keeps Head's own has torch's op as anchor


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    a = p.add_argument
    a("--device", default="auto", help="auto (cuda if there is one), cpu, cuda, cuda:1, …")
    a("--sizes", nargs="+", default=["tiny"], choices=SIZES, help="model sizes; default tiny")
    a("--heads", nargs="+", default=list(heads.HEADS), choices=heads.HEADS,
      help="LM heads; default all (and always the baseline: overheads are relative to it)")
    a("--loss_paths", nargs="+", default=["default"], choices=("default", "plain", "chunked"),
      help="default: train.py's; plain: all N × V logits at once; chunked: --chunk_size tokens")
    a("--chunk_size", type=int, help="tokens a chunk (chunked, torch's op): CPU 64, CUDA 4096")
    a("--steps", type=int, default=10, help="timed rounds; default 10")
    a("--warmup", type=int, default=3, help="untimed steps of each variant first; default 3")
    a("--micro_batch", type=int, help="sequences per step (default: 16 on CUDA, 4 on a CPU)")
    a("--seq_len", type=int, help="tokens per sequence (default: 2048 on CUDA, 256 on a CPU)")
    a("--vocab_size", type=int, default=50304, help="V; default 50,304")
    a("--dtype", default="auto", choices=("auto", "bfloat16", "float32"), help="as train.py's")
    a("--compile", action=argparse.BooleanOptionalAction, help="torch.compile (default: on CUDA)")
    a("--backend", default="inductor", help="torch.compile's backend (aot_eager: traced only)")
    a("--float32_head", action="store_true", help="also the baseline with --head_dtype float32")
    a("--loss_tokens", type=int, default=0, help="tokens of the LM head alone (default 0: none)")
    a("--no_train", action="store_true", help="time the LM head alone only")
    a("--json", type=Path, help="also write the rows here, rewritten after each part")
    args = p.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = torch.device(args.device).type == "cuda"
    for key, value in SHAPES["cuda" if cuda else "cpu"].items():
        setattr(args, key, getattr(args, key) or value)
    args.dtype = {"auto": "bfloat16" if cuda else "float32"}.get(args.dtype, args.dtype)
    args.compile = cuda if args.compile is None else args.compile
    args.heads = ["baseline"] + [h for h in dict.fromkeys(args.heads) if h != "baseline"]
    return args


def timed(device, work):
    """(seconds, bytes) of one work(): its wall time between device syncs, and CUDA's peak of
    allocated memory during it above what was held before (None on a CPU)."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    held, start = torch.cuda.memory_allocated(device) if cuda else None, time.perf_counter()
    work()
    if cuda:
        torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - held if cuda else None
    return time.perf_counter() - start, peak


def in_turns(works, device, rounds):
    """{key: (median seconds, peak bytes of the first) of works[key]()} over `rounds` rounds that
    call every work once, the order turning by one each round."""
    keys, samples = list(works), {key: [] for key in works}
    for r in range(rounds):
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            samples[key].append(timed(device, works[key]))
    return {key: (statistics.median(s for s, _ in runs), runs[0][1])
            for key, runs in samples.items()}


# ---- The training step, as train.py builds and runs it -------------------------------------
def training_step(args, size, head, path, head_dtype):
    """(train.py's options, model, step) of a variant; step(): a train_step on one micro-batch."""
    options = dict(size=size, head=head, head_dtype=head_dtype, device=args.device,
                   dtype=args.dtype, vocab_size=args.vocab_size, seq_len=args.seq_len,
                   micro_batch=args.micro_batch, batch_size=args.micro_batch)
    argv = [x for key, value in options.items() for x in (f"--{key}", str(value))]
    chunk = {"plain": ["--loss_chunk", "0"], "chunked": ["--loss_chunk", str(args.chunk_size)]}
    targs, device = train.parse_args(argv + chunk.get(path, [])), torch.device(args.device)
    gpt = train.build_model(targs).to(device)  # seeds torch: the same batch for every variant
    ids = torch.randint(args.vocab_size, (args.micro_batch, args.seq_len + 1)).to(device)
    optimizer, amp = train.make_optimizer(gpt, targs), train.autocast(device, args.dtype)
    model = torch.compile(gpt, backend=args.backend) if args.compile else gpt

    def step():
        train.train_step(model, optimizer, lambda: (ids[:, :-1], ids[:, 1:]), targs.lr, 1, amp)
    return targs, gpt, step


def bench_steps(args, size):
    """A row per training step of `size`: each head × loss path (and the float32 LM head)."""
    device, tokens = torch.device(args.device), args.micro_batch * args.seq_len
    print(f"{size}: building and warming up the training steps …", flush=True)
    keys = [(head, path, "auto") for head in args.heads for path in args.loss_paths]
    keys += [("baseline", path, "float32") for path in args.loss_paths if args.float32_head]
    steps, rows = {}, {}
    for key in keys:
        targs, gpt, steps[key] = training_step(args, size, *key)
        rows[key] = {"size": size, "head": key[0], "head_dtype": key[2], "loss_path": key[1],
                     "loss_chunk": targs.loss_chunk, "params": gpt.num_params(),
                     "flops_per_token": gpt.flops_per_token(args.seq_len),
                     "warmup_s": sum(timed(device, steps[key])[0] for _ in range(args.warmup))}
    peak, times = train.peak_flops(device, args.dtype), in_turns(steps, device, args.steps)
    for (head, path, head_dtype), row in rows.items():
        step_s, memory = times[head, path, head_dtype]
        row |= {"step_s": step_s, "tokens_per_s": tokens / step_s, "peak_mem_bytes": memory,
                "mfu": row["flops_per_token"] * tokens / step_s / peak if peak else None,
                "overhead": step_s / times["baseline", path, "auto"][0] - 1}  # same loss path
    return list(rows.values())


# ---- The LM head alone: forward and backward of the loss of random h, W, targets -----------
def loss_functions(name, chunk_size, dtype):
    """{path: f(h, W, targets) → loss} of head `name`: heads.py's plain and chunked paths, and
    torch's op where torch has it and the head's loss is CE of the raw logits (cap_logits and
    log_z_penalty are Head's own) plus a term of W (mu_loss's), its matmul in `dtype`."""
    plain, chunked = heads.build(name), heads.build(name, chunk_size=chunk_size)
    fns = {"plain": lambda *a: plain(*a)[0], "chunked": lambda *a: chunked(*a)[0]}
    own = all(getattr(type(plain), k) is getattr(heads.Head, k) for k in HOOKS)
    if not own or not hasattr(F, "linear_cross_entropy"):
        return fns
    options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=chunk_size)

    def torch_op(h, weight, targets):  # given autocast's dtype, as F.linear is: it has no rule
        loss = F.linear_cross_entropy(h.to(dtype), weight.to(dtype), targets,
                                      ignore_index=heads.IGNORE, options=options)
        term = plain.regulariser(weight)
        return loss if term is None else loss + term
    return fns | {"torch op": torch_op}


def bench_head(args, size):
    """A row per head and path of the LM head alone at the width of `size`, with its error
    against heads.py in float64: |Δ loss|, and max |Δ grad| / max |grad| over h and W."""
    device, dim, n = torch.device(args.device), SIZES[size]["n_embd"], args.loss_tokens
    torch.manual_seed(0)
    weight = (torch.randn(args.vocab_size, dim) / dim ** 0.5).to(device)
    h, targets = torch.randn(n, dim).to(device), torch.randint(args.vocab_size, (n,)).to(device)

    def loss_and_grads(fn, *inputs):  # autocast leaves float64 inputs in float64
        inputs = [x.detach().requires_grad_() for x in inputs]
        with train.autocast(device, args.dtype):
            loss = fn(*inputs, targets)
        return loss.detach().double(), torch.autograd.grad(loss, inputs)

    works, rows = {}, {}
    for name in args.heads:
        fns = loss_functions(name, args.chunk_size, getattr(torch, args.dtype))
        ref, ref_grads = loss_and_grads(fns["plain"], h.double(), weight.double())
        for path, fn in fns.items():
            loss, grads = loss_and_grads(fn, h, weight)  # also its warm-up
            grad_err = max(float((g.double() - r).abs().max() / r.abs().max())
                           for g, r in zip(grads, ref_grads))
            rows[name, path] = {"size": size, "tokens": n, "dim": dim, "head": name,
                                "loss_path": path, "loss_err": float((loss - ref).abs()),
                                "grad_err": grad_err}
            works[name, path] = functools.partial(loss_and_grads, fn, h, weight)
    for key, (time_s, memory) in in_turns(works, device, args.steps).items():
        rows[key] |= {"time_s": time_s, "peak_mem_bytes": memory}
    return list(rows.values())


# ---- Tables and main -------------------------------------------------------------------------
def print_table(title, columns, rows):
    """title, then the rows right-aligned under columns of (header, key[, format[, scale]])."""
    def cell(row, key, spec="", scale=1):
        return "n/a" if row[key] is None else format(row[key] * scale, spec)
    lines = [[c[0] for c in columns]] + [[cell(row, *c[1:]) for c in columns] for row in rows]
    widths = [max(map(len, column)) for column in zip(*lines)]
    print(f"\n{title}")
    for line in lines:
        print("  ".join(text.rjust(width) for text, width in zip(line, widths)))


def print_tables(result):
    s, ms, mib = result["settings"], (".2f", 1e3), (",.0f", 2**-20)
    print(f"\n{result['device']}, {s['dtype']}, {'compiled' if s['compile'] else 'eager'}; "
          f"medians of {s['steps']} rounds in turns")
    if result["train"]:
        print_table(f"Training steps of {s['micro_batch']} × {s['seq_len']} tokens", [
            ("size", "size"), ("head", "head"), ("head dtype", "head_dtype"),
            ("loss path", "loss_path"), ("chunk", "loss_chunk"), ("ms", "step_s", *ms),
            ("tok/s", "tokens_per_s", ",.0f"), ("MFU", "mfu", ".1%"),
            ("peak MiB", "peak_mem_bytes", *mib), ("vs baseline", "overhead", "+.1%")],
            result["train"])
    if result["head_alone"]:
        print_table(f"LM head alone (V = {s['vocab_size']:,}), forward and backward; errors "
                    "against heads.py in float64 (grad: max |Δ| / max |grad|)", [
                        ("size", "size"), ("tokens", "tokens"), ("D", "dim"),
                        ("head", "head"), ("path", "loss_path"), ("ms", "time_s", *ms),
                        ("peak MiB", "peak_mem_bytes", *mib), ("|Δ loss|", "loss_err", ".1e"),
                        ("Δ grad", "grad_err", ".1e")], result["head_alone"])


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    torch._dynamo.config.cache_size_limit = 64  # a graph of GPT.forward per head and loss path
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else
              f"CPU ({torch.get_num_threads()} threads)", "torch": torch.__version__,
              "settings": {k: v for k, v in vars(args).items() if k != "json"},
              "train": [], "head_alone": []}
    parts = [("train", bench_steps)] * (not args.no_train)
    parts += [("head_alone", bench_head)] * (args.loss_tokens > 0)
    for size, (part, bench) in itertools.product(args.sizes, parts):
        result[part] += bench(args, size)
        if args.json:  # written whole: a temporary file, renamed
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.with_name(args.json.name + ".tmp").write_text(json.dumps(result))
            os.replace(args.json.with_name(args.json.name + ".tmp"), args.json)
    print_tables(result)
    return result


if __name__ == "__main__":
    main()

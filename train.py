"""One training run with the recipe of the paper's App. A, on one process or many (torchrun DDP).

A run folder holds config.json, log.jsonl (a line per log step), ckpt.pt (for --resume),
ckpt_step*.pt (with --keep_every) and, once the run is done, summary.json.
"""
import argparse
import contextlib
import json
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
import heads
import prepare
from model import GPT, SIZES, from_config, load_checkpoint

# ---- Options: the defaults are the paper's recipe on CUDA (float32 matmuls on a CPU) --------
EXAMPLE = """examples (a laptop on the bundled text; the paper's recipe on 4 GPUs):
  python train.py --size tiny --data tests/assets/paradise_regained.txt --steps 200 \\
      --batch_size 8 --seq_len 128
  torchrun --nproc_per_node=4 train.py --head mu_center --out_dir runs/mu_center"""
EVAL_TOKENS, STAT_TOKENS = 65_536_000, 2 ** 19  # the paper's: 2¹⁹ ≈ its 5·10⁵ logit vectors
CPU_LOSS_CHUNK = 64  # tokens per chunk of the LM-head loss on a CPU (bench.py times it)
# torchrun sets these for each process; a plain `python train.py` is process 0 of 1
RANK, LOCAL_RANK = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
WORLD_SIZE = int(os.environ.get("WORLD_SIZE", 1))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=EXAMPLE,
                                allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument_group("model").add_argument
    a("--size", default="16M", choices=SIZES, help="model size (model.SIZES); default 16M")
    a("--head", default="baseline", choices=heads.HEADS, help="LM head; default baseline")
    a("--tie", action="store_true", help="tie the input and output embeddings")
    a("--lam", type=float, help="λ of z_loss and mu_loss (default: heads.py's, 1e-4)")
    a("--cap", type=float, help="c of soft_cap (default: heads.py's, 30)")
    a("--vocab_size", type=int, default=50304, help="V; default GPT-2's 50,257 padded to 50,304")
    a("--seed", type=int, default=0, help="seed of the initial weights and of --data_order random")
    a = p.add_argument_group("optimisation").add_argument
    a("--lr", type=float, default=3e-3, help="peak learning rate η; default 3e-3")
    a("--steps", type=int, default=100_000, help="optimizer steps; default 100,000")
    a("--warmup", type=int, help="warmup steps (default: 5%% of --steps)")
    a("--min_lr", type=float, default=1e-5, help="end of the cosine decay; default 1e-5")
    a("--batch_size", type=int, default=64, help="sequences per step, all processes; default 64")
    a("--micro_batch", type=int, help="sequences per forward pass and process (default: the "
      "largest divisor ≤ 16 of a process's share of --batch_size)")
    a("--seq_len", type=int, default=2048, help="tokens per sequence; default 2048")
    a = p.add_argument_group("data and run folder").add_argument
    a("--data", nargs="+", default=[prepare.DEFAULT_DATA], help="a folder of shards, or text "
      "files; default: FineWeb100B, downloaded as far as the run reads it")
    a("--data_order", default="sequential", choices=data.ORDERS,
      help="sequential (default): the shards in order; random: windows drawn by --seed")
    a("--out_dir", default="out", help="run folder; default out")
    a("--resume", action="store_true", help="continue the run in --out_dir from its ckpt.pt")
    a("--save_every", type=int, help="steps between checkpoints (default: 1000, or a tenth of "
      "--steps if less)")
    a("--keep_every", type=int, default=0, help="keep ckpt_step*.pt every so many steps; 0: none")
    a("--stop_at", type=int, default=0, help="end after this step as if killed (tests); 0: no")
    a = p.add_argument_group("measurement").add_argument
    a("--log_every", type=int, default=10, help="steps between log lines; default 10")
    a("--eval_every", type=int, default=5000, help="steps between val losses; default 5000")
    a("--eval_tokens", type=int, help=f"val tokens per evaluation (default: {EVAL_TOKENS:,}, "
      "or the val split or a twentieth of the tokens trained on, if less)")
    a("--stat_tokens", type=int, help=f"val tokens of the final statistics (default: "
      f"{STAT_TOKENS:,}, or less by the rule of --eval_tokens)")
    a = p.add_argument_group("device").add_argument
    a("--device", default="auto", help="auto (cuda if there is one), cpu, cuda, cuda:1, …")
    a("--dtype", default="auto", choices=("auto", "bfloat16", "float32"),
      help="autocast dtype of the matmuls (auto: bfloat16 on CUDA, float32 on a CPU)")
    a("--head_dtype", default="auto", choices=("auto", "float32"),
      help="the LM head's matmul dtype (auto: as --dtype)")
    a("--compile", action=argparse.BooleanOptionalAction, help="torch.compile (default: on CUDA)")
    a("--tf32", action="store_true", help="TensorFloat-32 matmuls where float32 is asked (CUDA)")
    a("--loss_chunk", type=int, help=f"tokens a chunk of the head's loss; 0: all (default: "
      f"{CPU_LOSS_CHUNK} on a CPU, 0 on CUDA)")
    if RANK:  # under torchrun every rank parses: rank 0 alone says
        p.error = lambda message: sys.exit(2)
    args = p.parse_args(argv)
    args.warmup = args.steps // 20 if args.warmup is None else args.warmup
    args.save_every = args.save_every or min(1000, max(1, args.steps // 10))
    processes = WORLD_SIZE
    if args.micro_batch is None:
        share = max(1, args.batch_size // processes)
        args.micro_batch = max(n for n in range(1, 17) if share % n == 0)
    if args.batch_size % (args.micro_batch * processes):
        p.error(f"--batch_size {args.batch_size} must be a multiple of --micro_batch × processes"
                f" = {args.micro_batch} × {processes} = {args.micro_batch * processes}")
    try:
        heads.build(args.head, lam=args.lam, cap=args.cap)
    except ValueError as err:
        p.error(str(err))
    args.text = args.data if all(Path(path).is_file() for path in args.data) else None
    args.data = None if args.text else args.data[0]
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = args.device.startswith("cuda")
    if args.dtype == "auto":
        args.dtype = "bfloat16" if cuda else "float32"
    args.compile = cuda if args.compile is None else args.compile
    if args.loss_chunk is None:
        args.loss_chunk = 0 if cuda else CPU_LOSS_CHUNK
    return args


# ---- The recipe of the paper's App. A (Table 4) --------------------------------------------
GRAD_CLIP = 1.0  # the global gradient norm ‖g‖₂ is clipped to this


def build_model(args) -> GPT:
    """The GPT of --size with the head of --head; --seed fixes the initial weights."""
    torch.manual_seed(args.seed)
    return from_config(vars(args))


def make_optimizer(model: GPT, args) -> torch.optim.AdamW:
    """AdamW with β = (0.9, 0.95), ε = 1e-8, no weight decay (App. A); fused on CUDA."""
    return torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                             weight_decay=0.0, fused=next(model.parameters()).is_cuda)


def lr_at(step: int, args) -> float:
    """η(s) for optimizer step s = 0 … S−1 (S = --steps, W = --warmup):
        s < W:  η·(s+1)/W                                     linear warmup, never 0
        s ≥ W:  η_min + ½(η − η_min)(1 + cos(π·(s−W)/(S−W)))  cosine from η down to η_min."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * progress))


def autocast(device: torch.device, dtype: str):
    """bf16 matmuls with float32 weights, or plain float32."""
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, dtype))


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:  # Σ over processes, in place
    if dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor


# ---- One optimizer step ---------------------------------------------------------------------
@dataclass
class StepResult:
    loss: torch.Tensor       # mean cross-entropy over the global batch (0-dim, on the device)
    objective: torch.Tensor  # what was minimised: loss + the head's regulariser
    grad_norm: torch.Tensor  # ‖g‖₂ before clipping
    last_x: torch.Tensor     # this process's last micro-batch, for the logit statistics
    last_y: torch.Tensor


def train_step(model, optimizer, get_batch, lr: float, grad_accum: int, amp) -> StepResult:
    """grad_accum micro-batches, each backpropagated as objective / grad_accum (the gradient of
    the mean over the global batch); then clip, AdamW and head.after_step(W). DDP all-reduces
    in the last backward pass only. Nothing here waits for the device."""
    gpt = model.module if isinstance(model, DDP) else model
    gpt = getattr(gpt, "_orig_mod", gpt)  # the GPT inside torch.compile
    for group in optimizer.param_groups:
        group["lr"] = lr
    sums = torch.zeros(2, device=gpt.output_weight.device)  # Σ CE, Σ objective
    for micro in range(grad_accum):
        x, y = get_batch()
        if isinstance(model, DDP):
            model.require_backward_grad_sync = micro == grad_accum - 1
        with amp:
            objective, stats = model(x, y)  # GPT.forward, then its head: CE + regulariser
        (objective / grad_accum).backward()
        sums += torch.stack((stats["ce"], objective.detach()))
    grad_norm = torch.nn.utils.clip_grad_norm_(gpt.parameters(), GRAD_CLIP)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    gpt.head.after_step(gpt.output_weight)  # μ-centering: eᵢ ← eᵢ − μ, alike on every rank
    loss, objective = all_reduce_sum(sums) / (grad_accum * WORLD_SIZE)
    return StepResult(loss, objective, grad_norm, x, y)


# ---- The measurements -----------------------------------------------------------------------
LOG_STAT_TOKENS = 128   # tokens per process of a log step's statistics
PRECISION_STRIDE = 4    # the precision statistics (costly reference matmuls): every 4th token
HEAD_STATS = heads.LOGIT_STATS + heads.PRECISION_STATS


@torch.no_grad()
def evaluate(model, batches, amp) -> float:
    """Mean cross-entropy over the tokens of `batches`, summed over all processes."""
    model.eval()
    device = next(model.parameters()).device
    total = torch.zeros(2, dtype=torch.float64, device=device)  # Σ CE, tokens
    for x, y in batches:
        with amp:
            _, stats = model(x.to(device), y.to(device))
        kept = (y != heads.IGNORE).sum().double()
        total += torch.stack((stats["ce"].double() * kept, kept.to(device)))
    model.train()
    all_reduce_sum(total)
    return (total[0] / total[1]).item()


@torch.no_grad()
def stat_sums(model: GPT, x, y, args, amp, max_tokens=None) -> torch.Tensor:
    """Over the tokens whose target is not -1 (every k-th, to at most max_tokens): per statistic
    of HEAD_STATS its sum and sum of squares, each part's count, and Σ h (for the mean h̄)."""
    weight, head = model.output_weight, model.head
    y = y.to(weight.device).flatten()
    kept = y != heads.IGNORE
    with amp:
        h, y = model.hidden(x.to(weight.device)).flatten(0, -2)[kept], y[kept]
        if max_tokens and len(h) > max_tokens:
            stride = -(-len(h) // max_tokens)
            h, y = h[::stride], y[::stride]
        logit = torch.cat([heads.logit_stats(head.logits(c, weight)) for c in h.split(64)], 1)
    dtype = head.matmul_dtype or getattr(torch, args.dtype)
    precision = heads.precision_stats(head, h[::PRECISION_STRIDE], weight,
                                      y[::PRECISION_STRIDE], dtype)
    parts = []
    for rows in (logit, precision):
        parts += [rows.sum(1), rows.square().sum(1), rows.new_tensor([rows.shape[1]])]
    return torch.cat(parts + [h.double().sum(0)])


def head_stats(sums: torch.Tensor, model: GPT, with_se=False) -> dict:
    """The means of HEAD_STATS over the tokens of all processes, the mean hidden state h̄ along
    μ̂ (h_mu_proj, h_mu_cos) and, with_se, each mean's standard error (tokens as independent)."""
    sums = all_reduce_sum(sums)
    stats, errors, start = {}, {}, 0
    for names in (heads.LOGIT_STATS, heads.PRECISION_STATS):
        k = len(names)
        total, squares, n = sums[start:start + 2 * k + 1].split([k, k, 1])
        start += 2 * k + 1
        mean = total / n
        se = ((squares / n - mean.square()).clamp(min=0) / (n - 1)).sqrt()
        stats |= dict(zip(names, mean.tolist()))
        errors |= {f"{name}_se": value for name, value in zip(names, se.tolist())}
    h_mean = sums[start:] / sums[2 * len(heads.LOGIT_STATS)]
    proj, cos = heads.mean_state_alignment(h_mean, model.output_weight.detach())
    stats |= {"h_mu_proj": proj.item(), "h_mu_cos": cos.item()}
    return stats | errors if with_se else stats


def mu_norm(model: GPT) -> float:  # ‖μ‖, μ the mean output embedding (Eq. 7)
    return heads.mean_embedding(model.output_weight.detach()).norm().item()


PEAK_BF16_FLOPS = (("A100", 312e12), ("H100 PCIe", 756e12), ("H100 NVL", 835e12),
                   ("H200 NVL", 835e12), ("H100", 989e12), ("H200", 989e12))


def peak_flops(device: torch.device, dtype: str):
    """Dense bf16 FLOP/s of one GPU, the first name that matches; None where unknown."""
    if device.type != "cuda" or dtype != "bfloat16":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_FLOPS if key in name), None)


# ---- Processes, data and the run folder -----------------------------------------------------
# What a run computes: --resume refuses a folder whose run recorded other values.
RUN_DEFINING = ("size", "head", "lr", "tie", "lam", "cap", "vocab_size", "steps", "warmup",
                "min_lr", "batch_size", "seq_len", "seed", "dtype", "data", "data_order")
# What only changes the rounding: --resume takes new values and says so.
ROUNDING = ("micro_batch", "world_size", "loss_chunk", "head_dtype", "compile", "tf32")


def fail(message: str):
    """Exit 1; rank 0 says why in one sentence (every rank meets the same checks)."""
    raise SystemExit(1 if RANK else f"train.py: error: {message}")


def say(line: str):  # rank 0 alone prints
    if RANK == 0:
        print(line, flush=True)


def start_process(args) -> torch.device:
    """This process in torchrun's group (NCCL on GPUs, gloo on CPUs); its device."""
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            fail(f"--device {args.device} asks for a GPU, but none is visible; use --device cpu")
        if WORLD_SIZE > 1:  # torchrun: one GPU per process
            device = torch.device("cuda", LOCAL_RANK)
        torch.cuda.set_device(device)
    torch.set_float32_matmul_precision("high" if args.tf32 else "highest")
    if WORLD_SIZE > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


def ready_data(args):
    """The data made ready by each node's local rank 0 (text tokenized, or the FineWeb shards
    the run reads downloaded) while the others wait; then this process's train loader."""
    problem, trained = "", args.steps * args.batch_size * args.seq_len
    if LOCAL_RANK == 0:
        try:
            if args.text:
                args.data = str(prepare.text_dataset(args.text))
            elif args.data == prepare.DEFAULT_DATA and not any(Path(args.data).glob("*val*.bin")):
                shards = prepare.shards_needed(trained)
                print(f"downloading {prepare.DEFAULT_DATASET} into {args.data}: the val shard "
                      f"and {shards} train shards of {data.SHARD_TOKENS:,} tokens", flush=True)
                prepare.fetch_fineweb(args.data, train_shards=shards)
        except (OSError, RuntimeError, ValueError) as err:
            problem = f"{err}; or pass text files as --data" if args.data else str(err)
    if WORLD_SIZE > 1:  # the others wait here, in a group whose timeout allows a download
        failed = torch.tensor([float(bool(problem))])
        waiting = dist.new_group(backend="gloo", timeout=timedelta(hours=24))
        dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=waiting)
        if failed.item():
            fail(problem or "preparing the data failed on another process")
        if args.text and LOCAL_RANK:
            args.data = str(prepare.text_dataset(args.text))  # rank 0 made it: found
    elif problem:
        fail(problem)
    try:
        loader = data.ShardLoader(args.data, args.micro_batch, args.seq_len, RANK,
                                  WORLD_SIZE, "train", args.data_order, args.seed,
                                  step_rows=args.batch_size)
        step = WORLD_SIZE * args.micro_batch * args.seq_len  # val tokens per eval step
        held = step * data.val_steps_held(args.data, args.micro_batch, args.seq_len,
                                          WORLD_SIZE)
        val_shards = data.shard_paths(args.data, "val")
    except (FileNotFoundError, ValueError) as err:
        fail(f"{err}; make a dataset with `python prepare.py text FILES --out DIR` or "
             f"`python prepare.py fineweb --shards 8`")
    check_ids(max(map(data.max_token, val_shards)), args)  # the train split: batch by batch
    for name, default in (("eval_tokens", EVAL_TOKENS), ("stat_tokens", STAT_TOKENS)):
        asked = getattr(args, name)
        if asked and asked > held:
            say(f"--{name} {asked:,} is more than the val split holds: using its {held:,}")
        tokens = asked or min(default, max(step, trained // 20))
        setattr(args, name, min(held, max(step, tokens)))
    return loader


def check_ids(top: int, args):
    if top >= args.vocab_size:
        fail(f"{args.data} holds token id {top}, outside the model's vocabulary of "
             f"{args.vocab_size}; raise --vocab_size or use data made for it")


def val_batches(tokens: int, args):  # this process's share of the first tokens
    return data.val_batches(args.data, tokens, args.micro_batch, args.seq_len, RANK,
                            WORLD_SIZE)


def write_json(path: Path, record: dict):
    """record as JSON (a non-finite number as null), written whole: a temporary file, renamed."""
    text = json.dumps({k: v if not isinstance(v, float) or math.isfinite(v) else None
                       for k, v in record.items()}, indent=2)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text + "\n")
    os.replace(temporary, path)


def check_run_folder(args, out: Path, config: dict) -> bool:
    """False when --resume finds the run finished; refuses a folder that holds a run without
    --resume, or, with it, a run of other settings."""
    files = sorted(path.name for path in out.iterdir()) if out.is_dir() else []
    finished = "summary.json" in files
    if files and not args.resume:
        fail(f"{out} already holds a {'finished run' if finished else 'run'} "
             f"({', '.join(files[:4])}); " + ("" if finished else "pass --resume to continue "
             "it, or ") + "choose another --out_dir")
    if files:
        if "config.json" not in files:
            fail(f"{out} holds {', '.join(files[:4])} but no config.json: it is not a run to "
                 f"resume; choose another --out_dir")
        recorded = json.loads((out / "config.json").read_text())
        if keys := [key for key in RUN_DEFINING if recorded.get(key) != config[key]]:
            fail(f"--resume: the run in {out} was trained with "
                 f"{' '.join(f'--{k} {recorded.get(k)}' for k in keys)}, not "
                 f"{' '.join(f'--{k} {config[k]}' for k in keys)}; resume with its settings or "
                 f"choose another --out_dir")
    if finished:
        say(f"the run in {out} is finished (summary.json); to train longer, start a new run "
            f"with a larger --steps")
        return False
    return True


def resume(out: Path, config: dict, model: GPT, optimizer, loader) -> dict:
    """Weights, optimizer, loader and RNG from ckpt.pt, on every process; the progress it
    records (step, init_loss, train_time_s); log.jsonl cut back to the checkpoint's step."""
    path = out / "ckpt.pt"
    progress = {"step": 0, "init_loss": None, "train_time_s": 0.0}
    if path.exists():
        ckpt = load_checkpoint(path)
        if changed := [k for k in ROUNDING if ckpt["config"].get(k) != config[k]]:
            say(f"--resume with {', '.join(f'{k} {config[k]}' for k in changed)}, not the run's "
                f"{', '.join(str(ckpt['config'].get(k)) for k in changed)}: the same run, "
                f"rounded otherwise")
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])
        torch.set_rng_state(ckpt["rng"])
        progress = {key: ckpt[key] for key in progress}
    elif config["resume"]:
        say(f"{out} holds no ckpt.pt: the run starts at step 0")
    if RANK == 0:
        out.mkdir(parents=True, exist_ok=True)
        log = out / "log.jsonl"
        lines = log.read_text().splitlines(keepends=True) if log.exists() else []
        kept = [line for line in lines if line.endswith("\n")
                and json.loads(line)["step"] <= progress["step"]]  # a line a kill cut off goes too
        log.write_text("".join(kept))
    return progress


def save_checkpoint(out: Path, name: str, model: GPT, optimizer, loader, config, progress):
    """What --resume needs (optimizer None: the weights alone), written whole."""
    state = {"model": model.state_dict(), "config": config, **progress}
    if optimizer is not None:
        state |= {"optimizer": optimizer.state_dict(), "loader": loader.state_dict(),
                  "rng": torch.get_rng_state()}
    temporary = out / (name + ".tmp")
    torch.save(state, temporary)
    os.replace(temporary, out / name)


# ---- The loop -------------------------------------------------------------------------------
def training_loop(model: GPT, optimizer, loader, progress: dict, config: dict, args,
                  device: torch.device) -> dict | None:
    """Steps until --steps (or --stop_at), logging, evaluating and saving on the way; then the
    summary. A loss that turns non-finite ends the run, diverged (summary.json says so)."""
    out = Path(args.out_dir)
    grad_accum = args.batch_size // (args.micro_batch * WORLD_SIZE)  # parse_args made it whole
    amp = autocast(device, args.dtype)
    compiled = torch.compile(model) if args.compile else model
    wrapped = DDP(compiled) if WORLD_SIZE > 1 else compiled
    tokens_per_step = args.batch_size * args.seq_len
    resuming = f"resuming after step {progress['step']} of " if progress["step"] else ""
    say(f"{args.size} ({model.num_params() / 1e6:.2f}M parameters without the input embedding), "
        f"head {args.head}, lr {args.lr:g}, tie {args.tie}; {WORLD_SIZE} process(es) × "
        f"{grad_accum} micro-batch(es) of {args.micro_batch}×{args.seq_len} = "
        f"{tokens_per_step:,} tokens per step; {device} {args.dtype}"
        f"{' compiled' if args.compile else ''}; {resuming}{args.steps} steps")
    if progress["init_loss"] is None:
        progress["init_loss"] = evaluate(compiled, val_batches(args.eval_tokens, args), amp)
        say(f"step 0: val loss {progress['init_loss']:.4f} "
            f"(ln V = {math.log(args.vocab_size):.4f})")
        if args.keep_every and RANK == 0:  # the curves of analyze.py start here
            save_checkpoint(out, "ckpt_step0000000.pt", model, None, None, config, {"step": 0})
    peak, flops_per_token = peak_flops(device, args.dtype), model.flops_per_token(args.seq_len)

    def get_batch():  # the loader's next (x, y) on the device, its ids checked on the CPU
        x, y = loader.next_batch()
        check_ids(int(max(x.max(), y.max())), args)
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    first_bad = torch.zeros((), dtype=torch.long, device=device)  # first non-finite step
    last_val, start, first_step = None, time.perf_counter(), progress["step"] + 1
    time_before, window = progress["train_time_s"], (time.perf_counter(), progress["step"])
    while progress["step"] < args.steps:
        step = progress["step"] = progress["step"] + 1
        result = train_step(wrapped, optimizer, get_batch, lr_at(step - 1, args), grad_accum,
                            amp)
        first_bad = torch.where((first_bad == 0) & ~result.objective.isfinite(), step, first_bad)
        is_eval = step == args.steps or (args.eval_every and step % args.eval_every == 0)
        is_log = is_eval or step % args.log_every == 0
        is_save = step == args.steps or step % args.save_every == 0
        if (is_log or is_save) and first_bad.item():  # .item() waits for the device
            say(f"step {first_bad.item()}: the loss is not finite; the run diverged and stops")
            break
        if is_log:
            now, tok_per_s = time.perf_counter(), None
            if window[1] >= first_step:  # the first step compiles or warms up: not timed
                tok_per_s = (step - window[1]) * tokens_per_step / (now - window[0])
            sums = stat_sums(model, result.last_x, result.last_y, args, amp, LOG_STAT_TOKENS)
            record = {"step": step, "tokens": step * tokens_per_step, "lr": lr_at(step - 1, args),
                      "loss": result.loss.item(), "objective": result.objective.item(),
                      "grad_norm": result.grad_norm.item(), "mu_norm": mu_norm(model),
                      **head_stats(sums, model), "tok_per_s": tok_per_s,
                      "mfu": tok_per_s * flops_per_token / (peak * WORLD_SIZE)
                      if peak and tok_per_s else None}
            if is_eval:
                last_val = evaluate(compiled, val_batches(args.eval_tokens, args), amp)
                record["val_loss"] = last_val
            say(log_line(record, args.steps, tok_per_s and (args.steps - step) *
                         tokens_per_step / tok_per_s))
            if RANK == 0:
                with open(out / "log.jsonl", "a") as f:
                    f.write(json.dumps(record) + "\n")
        progress["train_time_s"] = time_before + time.perf_counter() - start
        if is_save and RANK == 0:
            save_checkpoint(out, "ckpt.pt", model, optimizer, loader, config, progress)
        if args.keep_every and step % args.keep_every == 0 and RANK == 0:
            save_checkpoint(out, f"ckpt_step{step:07d}.pt", model, None, None, config,
                            {"step": step})
        if step == args.stop_at:
            say(f"stopping after step {step} as --stop_at asks; continue with --resume")
            return None
        if is_log or step == first_step:  # the next speed window starts here
            if device.type == "cuda":
                torch.cuda.synchronize()
            window = (time.perf_counter(), step)
    return summary(model, compiled, progress, first_bad.item() or None, last_val, args, device)


def summary(model, compiled, progress, diverged_at, last_val, args, device) -> dict:
    """summary.json: the run's settings, final val loss, head statistics over --stat_tokens
    (None for a diverged run), ‖μ‖ and times."""
    amp, start = autocast(device, args.dtype), time.perf_counter()
    record = {"head": args.head, "size": args.size, "lr": args.lr, "tie": args.tie,
              "lam": model.head.lam, "cap": model.head.cap, "steps": args.steps,
              "tokens": (diverged_at or progress["step"]) * args.batch_size * args.seq_len}
    if diverged_at is None:
        if last_val is None:
            last_val = evaluate(compiled, val_batches(args.eval_tokens, args), amp)
        batches = val_batches(args.stat_tokens, args)
        stats = head_stats(sum(stat_sums(model, x, y, args, amp) for x, y in batches), model,
                           with_se=True)
    else:
        stats = dict.fromkeys(HEAD_STATS + ("h_mu_proj", "h_mu_cos")
                              + tuple(f"{s}_se" for s in HEAD_STATS))
    return record | {"val_loss": last_val, "diverged": diverged_at is not None
                     or not math.isfinite(last_val), "init_loss": progress["init_loss"],
                     **stats, "mu_norm": mu_norm(model), "train_time_s": progress["train_time_s"],
                     "measure_time_s": time.perf_counter() - start}


def log_line(record: dict, steps: int, eta: float | None) -> str:
    """step, loss, lr, then tok/s, MFU, ETA and val loss where measured."""
    line = f"step {record['step']:>{len(str(steps))}}/{steps} | loss {record['loss']:.4f} | " \
           f"lr {record['lr']:.2e}"
    if record.get("tok_per_s"):
        line += f" | {record['tok_per_s']:,.0f} tok/s"
    if record.get("mfu"):
        line += f" | MFU {record['mfu']:.1%}"
    if eta is not None:
        line += f" | ETA {int(eta) // 3600}h{int(eta) % 3600 // 60:02d}m" if eta >= 3600 else \
            f" | ETA {int(eta) // 60}m{int(eta) % 60:02d}s"
    if "val_loss" in record:
        line += f" | val {record['val_loss']:.4f}"
    return line


def main(argv=None) -> GPT | None:
    """One run: the model (None when --resume finds the run finished)."""
    args = parse_args(argv)
    device = start_process(args)
    try:
        out = Path(args.out_dir)
        if RANK == 0 and not args.resume:  # a run in the folder: refused before any download
            check_run_folder(args, out, {})
        loader = ready_data(args)
        config = dict(vars(args), world_size=WORLD_SIZE)
        going_on = torch.tensor(float(RANK != 0 or check_run_folder(args, out, config)))
        if dist.is_initialized():  # rank 0 decides
            dist.all_reduce(going_on, op=dist.ReduceOp.MIN)
        if not going_on.item():
            return None
        model = build_model(args).to(device)
        optimizer = make_optimizer(model, args)
        progress = resume(out, config, model, optimizer, loader)
        if RANK == 0:
            write_json(out / "config.json", config)
        record = training_loop(model, optimizer, loader, progress, config, args, device)
        if record is not None and RANK == 0:
            write_json(out / "summary.json", record)
            outcome = "diverged" if record["diverged"] else f"val loss {record['val_loss']:.4f}"
            say(f"done: {outcome}, ‖μ‖ {record['mu_norm']:.4g}; the statistics are in "
                     f"{out / 'summary.json'}")
        return model
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()

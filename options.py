"""train.py's command line: its options, whose defaults are the paper's recipe (App. A) on CUDA
but for the data order (sequential, not the paper's code's random draw: README says why); on CPU
the matmuls default to float32. Their checks too; `python train.py --help` lists them."""
import argparse
import math
import os
import sys
from pathlib import Path

import torch

import data
import heads
import prepare
from model import SIZES
from runs import STAT_TOKENS, TEXT_CACHE, device_memory, resolve_device
from store import non_negative_float, non_negative_int, positive_float, positive_int

EXAMPLE = """examples (a laptop on the bundled text; the paper's recipe on 4 GPUs):
  python train.py --size tiny --data tests/assets/paradise_regained.txt --steps 200 \\
      --batch_size 8 --seq_len 128
  torchrun --nproc_per_node=4 train.py --head mu_center --out_dir runs/mu_center"""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows a default only where there is one (not None or False); keeps the epilog's lines."""
    def _get_help_string(self, action):
        unset = action.default is None or action.default is False
        return action.help if unset else super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="One training run with the recipe of the paper's "
                                "App. A, on one process or many (torchrun DDP).",
                                formatter_class=HelpFormatter, epilog=EXAMPLE)
    a = p.add_argument_group("model").add_argument
    a("--size", default="16M", choices=tuple(SIZES), help="model size preset (model.SIZES)")
    a("--head", default="baseline", choices=heads.HEADS, help="LM-head variant (heads.py)")
    a("--tie", action="store_true", help="tie the input and output embeddings")
    a("--lam", type=float, default=None, help="λ of z_loss and mu_loss (default: heads.py's)")
    a("--cap", type=float, default=None, help="c of soft_cap (default: heads.py's)")
    a("--vocab_size", type=positive_int, default=50304, help="V (GPT-2's 50257, padded)")
    a("--seed", type=non_negative_int, default=0, help="seed of the initial weights and of the "
      "random data order")
    a = p.add_argument_group("optimisation").add_argument
    a("--lr", type=positive_float, default=3e-3, help="peak learning rate η (paper: 3e-4 … 3e-1)")
    a("--steps", type=positive_int, default=100_000, help="optimizer steps")
    a("--warmup", type=non_negative_int, default=None, help="warmup steps (default: 5%% of them)")
    a("--min_lr", type=non_negative_float, default=1e-5, help="end of the cosine decay")
    a("--batch_size", type=positive_int, default=64, help="sequences per step, all processes")
    a("--micro_batch", type=positive_int, default=None, help="sequences per forward, process "
      "(default: the largest divisor ≤ 16 of the process's share of --batch_size)")
    a("--seq_len", type=positive_int, default=2048, help="tokens per sequence")
    a = (group := p.add_argument_group("data and run folder")).add_argument
    a("--data", nargs="+", default=[prepare.DEFAULT_DATA], help="a folder of *train*.bin and "
      f"*val*.bin shards (the default is downloaded), or text files (tokenized into {TEXT_CACHE})")
    a("--data_order", default="sequential", choices=data.ORDERS, help="sequential: each token at "
      "most once per epoch (a shard's tail shorter than a step is skipped); random: each row a "
      "random window of the split, by --seed (the paper's code draws at random too; data.py)")
    a("--out_dir", default="out", help="run folder")
    a("--resume", action="store_true", help="continue from OUT_DIR/ckpt.pt (step 0 if none)")
    a("--save_every", type=positive_int, default=1000, help="steps between checkpoints")
    a("--keep_every", type=non_negative_int, default=0, help="keep ckpt_step*.pt; 0 = never")
    a("--stop_at", type=non_negative_int, default=0, help="end after this step as if killed")
    a = p.add_argument_group("measurement").add_argument
    a("--eval_every", type=non_negative_int, default=5000, help="steps between val losses")
    a("--eval_tokens", type=positive_int, default=65_536_000, help="val tokens per evaluation")
    a("--stat_tokens", type=positive_int, default=STAT_TOKENS, help="val tokens of the stats")
    a("--log_every", type=positive_int, default=10, help="steps between log lines")
    a = p.add_argument_group("device").add_argument
    a("--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:1, …")
    a("--dtype", default="auto", choices=("auto", "bfloat16", "float32"),
      help="autocast dtype of the matmuls (auto: bfloat16 on CUDA, float32 elsewhere)")
    a("--head_dtype", default="auto", choices=("auto", "float32"), help="the LM head's matmul")
    a("--compile", action=argparse.BooleanOptionalAction, help="torch.compile (default: CUDA)")
    a("--tf32", action="store_true", help="TensorFloat-32 matmuls for what stays float32 (CUDA)")
    a("--loss_chunk", type=non_negative_int, default=None, help="tokens per chunk of the fused "
      "LM-head loss (fused_loss.py); 0 = heads.py's plain path (default: fused_loss.DEFAULT_CHUNK, "
      "64 on CPU, the plain path on CUDA)")
    tokens = math.prod(map(p.get_default, ("steps", "batch_size", "seq_len")))
    gb = ((prepare.shards_needed(tokens) + 1)  # and the val shard
          * (2 * data.SHARD_TOKENS + data.HEADER_BYTES) / 1e9)
    group.description = (f"The default --data downloads the {prepare.DEFAULT_DATASET} shards the "
                         f"run reads: {gb:.1f} GB\nfor the default --steps, fewer for fewer.")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """The command line, checked and resolved; bad input ends in parser.error's one sentence."""
    parser = build_parser()
    if int(os.environ.get("RANK", 0)):  # every rank of torchrun parses it: rank 0 alone says so
        parser.error = lambda message: sys.exit(2)
    args = parser.parse_args(argv)
    args.warmup = args.steps // 20 if args.warmup is None else args.warmup  # 5,000 of 100,000
    if args.warmup > args.steps:
        parser.error(f"--warmup {args.warmup} exceeds --steps {args.steps}; lower --warmup")
    if args.seed >= 2 ** 64:
        parser.error(f"--seed {args.seed} is too large; give an integer from 0 to {2**64 - 1}")
    if args.min_lr > args.lr:
        parser.error(f"--min_lr {args.min_lr:g} exceeds --lr {args.lr:g}; lower --min_lr")
    try:
        heads.build(args.head, lam=args.lam, cap=args.cap)
    except ValueError as err:
        parser.error(str(err))
    processes = int(os.environ.get("WORLD_SIZE", 1))
    if args.micro_batch is None:
        per_process = max(1, args.batch_size // processes)
        args.micro_batch = max(n for n in range(1, 17) if per_process % n == 0)
    if args.batch_size % (args.micro_batch * processes):
        parser.error(f"--batch_size {args.batch_size} must be a multiple of --micro_batch × "
                     f"processes = {args.micro_batch} × {processes} = "
                     f"{args.micro_batch * processes}; change --batch_size or --micro_batch")
    files = [Path(path).is_file() for path in args.data]
    if len(args.data) > 1 and not all(files):
        parser.error(f"--data takes one folder of shards or text files, not both; "
                     f"{args.data[files.index(False)]} is not a file")
    args.text = args.data if all(files) else None  # tokenized into a folder by runs.make_ready
    args.data = None if args.text else args.data[0]
    resolve_device(args, parser.error)
    # The embeddings alone: V·D numbers (twice untied) with gradient and AdamW's 2 moments, 16 B.
    needed = 16 * args.vocab_size * SIZES[args.size]["n_embd"] * (1 if args.tie else 2)
    total = device_memory(torch.device(args.device))
    where = "the GPU's" if args.device.startswith("cuda") else "this machine's"
    if needed > total:  # one sentence, not the allocator's traceback
        k = min(5, max(1, int(math.log(needed, 1024))))  # KiB … PiB
        parser.error(f"--vocab_size {args.vocab_size:,} needs {needed / 1024 ** k:,.1f} "
                     f"{'KMGTP'[k - 1]}iB for the embeddings alone, more than {where} "
                     f"{total / 1024 ** 3:,.1f} GiB of memory; lower --vocab_size")
    return args

"""Continuations of a prompt from a trained run: what the model you just trained writes.

    python sample.py --run out --prompt "Satan, now first inflamed with rage" --num_samples 3

Texts start after <|endoftext|>, as in training, drawn from the head's own logits, never from
padding ids (≥ 50257); a run on a synthetic vocabulary (V < 50257) takes and prints token ids."""
import argparse
import sys
from pathlib import Path

import torch

from data import EOT
from model import load_model

GPT2_VOCAB = 50257  # tokens of tiktoken's GPT-2 encoding; ids at or above it are padding


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a = p.add_argument
    a("--run", default="out", help="run folder of train.py (its ckpt.pt is read)")
    a("--ckpt", default=None, help="a checkpoint file instead (e.g. RUN/ckpt_step0000100.pt)")
    a("--prompt", default="", help="text to continue (a synthetic vocabulary's: token ids)")
    a("--num_samples", type=int, default=3, help="continuations to print")
    a("--max_new_tokens", type=int, default=60, help="tokens per continuation")
    a("--temperature", type=float, default=0.8, help="T; 0 = always the likeliest")
    a("--top_k", type=int, default=50, help="draw among the k likeliest; 0 = all")
    a("--seed", type=int, default=0, help="seed of the draws")
    a("--device", default="cpu", help="cpu, cuda, cuda:1, …")
    return p


def next_token_probs(logits: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    """P(next token) (B, V) from the head's last-position logits (B, V): softmax(l / T) over
    the top_k largest (all where top_k is 0 or ≥ V); T = 0 puts all mass on the largest."""
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.size(-1)).float()
    if 0 < top_k < logits.size(-1):
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.softmax(logits / temperature, dim=-1)


@torch.no_grad()
def generate(gpt, prompt: list[int], args, drawable: int) -> torch.Tensor:
    """(num_samples, max_new_tokens) ids < drawable after `prompt`; no cache (small models)."""
    generator = torch.Generator(args.device).manual_seed(args.seed)
    idx = torch.tensor([prompt] * args.num_samples, device=args.device)
    for _ in range(args.max_new_tokens):
        logits = gpt(idx[:, -gpt.config.block_size:])[:, -1, :drawable]
        probs = next_token_probs(logits, args.temperature, args.top_k)
        idx = torch.cat((idx, torch.multinomial(probs, 1, generator=generator)), dim=1)
    return idx[:, len(prompt):]


def text_codec(vocab_size: int):
    """(encode, decode, drawable ids) for the run's vocabulary: GPT-2's, else token ids."""
    if vocab_size >= GPT2_VOCAB:
        import prepare  # tiktoken, with the offline fall-back to the shipped vocabulary
        enc = prepare.gpt2_encoding()
        return (lambda text: [EOT] + enc.encode_ordinary(text)), enc.decode, GPT2_VOCAB
    ids = lambda text: [int(word) for word in text.split()]  # a synthetic vocabulary's prompt
    return ids, lambda ids: "".join(f" {i}" for i in ids), vocab_size


def main(argv=None) -> list[str]:
    """Print --num_samples continuations of --prompt; returns them."""
    args = build_parser().parse_args(argv)
    path = Path(args.ckpt or Path(args.run) / "ckpt.pt")
    if not path.is_file():
        sys.exit(f"sample.py: error: {path} is not a checkpoint; pass --run the folder of a "
                 f"train.py run (its --out_dir), or --ckpt FILE")
    print(f"loading {path} …", flush=True)  # it and the vocabulary may take seconds
    gpt, config, step = load_model(path, args.device)
    encode, decode, drawable = text_codec(gpt.config.vocab_size)
    prompt = encode(args.prompt)
    print(f"{config['size']} {config['head']}, step {step} of {config.get('steps')}; T = "
          f"{args.temperature:g}, top-k {args.top_k or 'all'}, seed {args.seed} …", flush=True)
    samples = [args.prompt + decode(row.tolist()) for row in generate(gpt, prompt, args, drawable)]
    print("".join(f"--- sample {n}\n{text}\n" for n, text in enumerate(samples, 1)), end="")
    return samples


if __name__ == "__main__":
    main()

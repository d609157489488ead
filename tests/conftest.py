"""Shared test setup: an offline GPT-2 tokenizer and the repository root on sys.path.

tiktoken downloads the GPT-2 vocabulary on first use and caches it under
TIKTOKEN_CACHE_DIR, keyed by the sha1 of the download URL. We seed such a cache from the
byte-identical copies in tests/assets/gpt2, so no test ever needs the network; tiktoken still
checks their sha256 against the hashes it expects.
"""
import hashlib
import os
import shutil
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ASSETS = Path(__file__).resolve().parent / "assets"
sys.path.insert(0, str(ROOT))

GPT2_URL = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"


def _seed_tiktoken_cache() -> None:
    cache = ROOT / ".pytest_cache" / "tiktoken"
    cache.mkdir(parents=True, exist_ok=True)
    for name in ("vocab.bpe", "encoder.json"):
        target = cache / hashlib.sha1((GPT2_URL + name).encode()).hexdigest()
        if not target.exists():
            shutil.copyfile(ASSETS / "gpt2" / name, target)
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)  # inherited by subprocesses too


_seed_tiktoken_cache()


# A suite started with SIGINT ignored (a background job of a non-interactive shell, as CI may
# run it) hands that on to every process it starts, and the Ctrl-C tests could not interrupt
# their runs. A caught signal is reset to the default in a child, an ignored one is not.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# ---- Run folders that tests/test_analyze.py and the experiments' tests measure ----
import json  # noqa: E402 (appended after the setup above)

import pytest  # noqa: E402

MARKOV_VOCAB = 64  # the synthetic language's vocabulary


@pytest.fixture(scope="session")
def markov_dir(tmp_path_factory):
    """Shards of a synthetic Markov language of 64 tokens (prepare.py synthetic)."""
    import prepare
    out = tmp_path_factory.mktemp("markov")
    prepare.prepare_synthetic(MARKOV_VOCAB, 120_000, out, seed=0)
    return out


def write_run(run_dir, data_dir, tie, steps=(0, 10)):
    """A run folder in train.py's format (config.json, ckpt_step*.pt, ckpt.pt) of a tiny model
    whose output rows drift by a common shift, and a little per token, at each step."""
    import model
    import torch
    cfg = dict(size="tiny", head="baseline", tie=tie, lam=None, cap=None,
               vocab_size=MARKOV_VOCAB, seq_len=64, data=str(data_dir), lr=1e-3, steps=steps[-1])
    torch.manual_seed(0)
    gpt = model.from_config(cfg)
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(cfg))
    generator = torch.Generator().manual_seed(2)
    direction = torch.randn(gpt.config.n_embd, generator=generator)
    for i, step in enumerate(steps):
        with torch.no_grad():
            move = direction + 0.1 * torch.randn(gpt.output_weight.shape, generator=generator)
            gpt.output_weight.add_(0.5 * (i > 0) * move)
        name = "ckpt.pt" if step == steps[-1] else f"ckpt_step{step:07d}.pt"
        torch.save(dict(model=gpt.state_dict(), step=step, config=cfg), run_dir / name)
    return run_dir


@pytest.fixture(scope="session")
def runs(markov_dir, tmp_path_factory):
    """Run folders on markov_dir: "untied", with a snapshot at step 0 and ckpt.pt at step 10."""
    return dict(untied=write_run(tmp_path_factory.mktemp("runs") / "untied", markov_dir, False))

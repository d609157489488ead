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

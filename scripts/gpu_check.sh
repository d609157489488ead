#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py says what it runs); PYTHON names the Python that has torch.
exec "${PYTHON:-python3}" "$(dirname "$0")/gpu_check.py" "$@"

#!/usr/bin/env bash
# Theorem 4's exact audit, the search over small integer matrices and the random scan, into
# experiments/theorem4/results/ (audit.md, search.md, scan.md). About 5 s on an idle CPU core.
#   bash experiments/theorem4/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
python experiments/theorem4/theorem4.py --out experiments/theorem4/results

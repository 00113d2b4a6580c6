#!/usr/bin/env bash
# posenc's GPU checks in one call (benchmarks/gpu/run.py): run from the repository root on the lent GPU,
#   bash benchmarks/gpu/run.sh --out "$OUT"
# The device's python3 holds torch, transformers and Triton; posenc is imported from this working tree.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" -m benchmarks.gpu.run "$@"

#!/usr/bin/env bash
# Install as scripts/test.sh does, then run the side-by-side benchmark against PyTorch.
#   bash scripts/bench.sh                  full S2 size, 1 s and 10 s, 1 and 2 threads
#   bash scripts/bench.sh --quick          a short run
# Writes bench_out/bench.json and bench_out/bench.md.
set -euo pipefail
. "$(dirname "$0")/setup.sh"
python benchmarks/bench_codec.py "$@"

#!/usr/bin/env bash
# Install as scripts/test.sh does, then run the side-by-side benchmark against PyTorch and write
# this machine kind's tables to docs/performance.md (other kinds' tables are kept).
#   bash scripts/bench.sh                  full S2 size, 1.4 s and 10 s, 1 and 2 threads
#   bash scripts/bench.sh --quick          a short run (1.4 s, 2 threads)
#   bash scripts/bench.sh --quick --streams 16 --no-rss   with the streaming targets per byte read
# Writes bench_out/bench.json, bench_out/bench.md and the page's section of this machine kind.
set -euo pipefail
. "$(dirname "$0")/setup.sh"
python benchmarks/bench_codec.py --page docs/performance.md --command "bash scripts/bench.sh $*" "$@"

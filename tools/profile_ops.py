"""Per-op time of a decode or encode: which ggml ops dominate, at what rate, and how far each is from
the GEMM floor, on any model file.

    python tools/profile_ops.py -m MODEL.gguf [--what decode|encode] [--seconds 1]
        [--precision f32|s2cpp] [--threads 2] [--backend cpu] [--top 15] [--no-floor]

Runs the call once (building and caching its graphs), then recomputes every cached graph
one node at a time (``backend.ggml_graph.Graph.profile``) and sums the time per op and input shape.
Each node's operations are counted as executed (``backend.flops``), so every op gets a rate; unless
``--no-floor``, numpy's SGEMM is timed at the same thread count (``benchmarks/limits.py``) and each op
gets its excess over the floor (its time minus its operations at the SGEMM rate) and that excess's
share of the whole call's.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import numpy as np

import pyggml_codec
from pyggml_codec.backend import binding, flops


def sgemm_rate(threads: int) -> float:
    """numpy's SGEMM GFLOP/s at ``threads`` BLAS threads (benchmarks/limits.py's reference shape)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import limits

    return max(limits.sgemm_gflops(threads).values())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--what", choices=["decode", "encode"], default="decode")
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--precision", choices=["f32", "s2cpp"], default="f32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--backend", default="cpu")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--no-floor", action="store_true", help="skip the SGEMM timing and the excess columns")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    with pyggml_codec.load(args.model, backend=args.backend, n_threads=args.threads, precision=args.precision) as c:
        n = int(args.seconds * c.sample_rate)
        if args.what == "decode":
            frames = -(-n // c.config.samples_per_frame)
            c.decode(np.stack([rng.integers(0, s, frames) for s in c.config.quantizer.codebook_sizes]))
        else:
            c.encode((0.3 * rng.standard_normal(n)).astype(np.float32))
        by_shape: dict = collections.defaultdict(lambda: [0.0, 0, 0])  # (op, ne) -> seconds, nodes, operations
        by_op: dict = collections.defaultdict(lambda: [0.0, 0])  # op -> seconds, operations
        uncounted: collections.Counter = collections.Counter()  # ops with no counting rule: 0 operations
        for graph in c.engine.cached_graphs().values():
            for i, (op, ne, seconds) in enumerate(graph.profile()):
                count = flops.FlopCount()
                flops.count_node(binding.lib.ggml_graph_node(graph.gf, i), count)
                uncounted.update(count.uncounted)
                row = by_shape[(op, ne)]
                row[0] += seconds
                row[1] += 1
                row[2] += count.total
                by_op[op][0] += seconds
                by_op[op][1] += count.total
    total = sum(s for s, _ in by_op.values())
    work = sum(f for _, f in by_op.values())
    on_cpu = args.backend == "cpu"  # the floor is the CPU's SGEMM: no floor for another backend's nodes
    rate = None if args.no_floor or not on_cpu else sgemm_rate(args.threads)
    print(f"{args.what} of {args.seconds:g} s, precision {args.precision}, {args.threads} threads: "
          f"{total * 1000:.1f} ms summed over nodes, {work / 1e9:.2f} GFLOP")
    if uncounted:
        print("not counted (no rule: 0 operations, the floor too low): "
              + ", ".join(f"{op} x{n}" for op, n in sorted(uncounted.items())))
    if not on_cpu and not args.no_floor:
        print(f"no floor: the SGEMM floor is the CPU's, and these nodes ran on {args.backend}")
    excess_all = 0.0
    if rate:
        floor = work / (rate * 1e9)
        print(f"SGEMM {rate:.0f} GFLOP/s: floor {floor * 1000:.1f} ms, {total / floor:.2f}x the floor")
        excess_all = total - floor
        if excess_all <= 0:
            print("the nodes' sum is at or below the floor: no excess to share out")

    def columns(seconds: float, ops: float) -> str:
        out = f"{seconds * 1000:8.1f} ms {100 * seconds / total:5.1f} %  {ops / seconds / 1e9 if seconds else 0:6.0f} GFLOP/s"
        if rate and excess_all > 0:
            excess = seconds - ops / (rate * 1e9)
            out += f"  excess {excess * 1000:7.1f} ms ({100 * excess / excess_all:5.1f} % of all)"
        return out

    print("\nby op:")
    for op, (seconds, ops) in sorted(by_op.items(), key=lambda kv: -kv[1][0]):
        print(f"  {op:26s} {columns(seconds, ops)}")
    print(f"\ntop {args.top} (op, output ne):")
    for (op, ne), (seconds, count, ops) in sorted(by_shape.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"  {op:26s} {str(list(ne)):18s} x{count:<3d} {columns(seconds, ops)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

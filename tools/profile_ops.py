"""Per-op time of a decode or encode: which ggml ops dominate, on any model file.

    python tools/profile_ops.py -m MODEL.gguf [--what decode|encode] [--seconds 1]
        [--precision f32|s2cpp] [--threads 2] [--backend cpu] [--top 15]

Runs the call once (building and caching its graphs), then recomputes every cached graph
one node at a time (``backend.ggml_graph.Graph.profile``) and sums the time per op and input shape.
"""

from __future__ import annotations

import argparse
import collections
import sys

import numpy as np

import pyggml_codec
from pyggml_codec.backend import binding


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--what", choices=["decode", "encode"], default="decode")
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--precision", choices=["f32", "s2cpp"], default="f32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--backend", default="cpu")
    p.add_argument("--top", type=int, default=15)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    with pyggml_codec.load(args.model, backend=args.backend, n_threads=args.threads, precision=args.precision) as c:
        n = int(args.seconds * c.sample_rate)
        if args.what == "decode":
            frames = -(-n // c.config.samples_per_frame)
            c.decode(np.stack([rng.integers(0, s, frames) for s in c.config.quantizer.codebook_sizes]))
        else:
            c.encode((0.3 * rng.standard_normal(n)).astype(np.float32))
        by_op: dict = collections.defaultdict(lambda: [0.0, 0])
        by_kind: dict = collections.defaultdict(float)
        total = 0.0
        flops = 0.0
        matmul_s = 0.0
        for key, graph in c.engine.cached_graphs().items():
            for i, (op, ne, seconds) in enumerate(graph.profile()):
                if op == "MUL_MAT":
                    node = binding.lib.ggml_graph_node(graph.gf, i)
                    k = int(node.contents.src[0].contents.ne[0])
                    flops += 2.0 * k * np.prod([int(node.contents.ne[d]) for d in range(4)])
                    matmul_s += seconds
                by_op[(op, ne)][0] += seconds
                by_op[(op, ne)][1] += 1
                by_kind[op] += seconds
                total += seconds
    print(f"{args.what} of {args.seconds:g} s, precision {args.precision}, {args.threads} threads: "
          f"{total * 1000:.0f} ms summed over nodes")
    if matmul_s:
        print(f"MUL_MAT: {flops / 1e9:.1f} GFLOP in {matmul_s * 1000:.0f} ms = {flops / matmul_s / 1e9:.0f} GFLOP/s")
    print("\nby op:")
    for op, seconds in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"  {op:18s} {seconds * 1000:8.1f} ms  {100 * seconds / total:5.1f} %")
    print(f"\ntop {args.top} (op, output ne):")
    for (op, ne), (seconds, count) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"  {op:18s} {str(list(ne)):24s} x{count:<3d} {seconds * 1000:8.1f} ms  {100 * seconds / total:5.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())

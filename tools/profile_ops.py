"""Per-op time of a decode or encode: which ggml ops dominate, at what rate, and how far each is from
the GEMM floor, on any model file.

    python tools/profile_ops.py -m MODEL.gguf [--what decode|encode|stream] [--seconds 1]
        [--precision f32|s2cpp] [--threads 2] [--backend cpu] [--top 15] [--no-floor]
        [--timeline [RUNS]]

Runs the call once (building and caching its graphs), then recomputes every cached graph
one node at a time (``backend.ggml_graph.Graph.profile``) and sums the time per op and input shape.
With ``--timeline``, each graph is computed whole RUNS times (default 5) with the compiled kernels'
calls timed per thread inside it (``Graph.timeline``): each kernel's node gets the median of its
times, and ggml's own ops, with the barriers between ops, one row of their own (``(between)``), the
rest of each compute. Node by node overstates what a whole compute spends (each node's inputs
come back from memory, its threads start afresh); the timeline does not, but it splits no time
among ggml's own ops.
Each node's operations are counted as executed (``backend.flops``), so every op gets a rate; unless
``--no-floor``, numpy's SGEMM is timed at the same thread count (``benchmarks/limits.py``) and each op
gets its excess over the floor (its time minus its operations at the SGEMM rate) and that excess's
share of the whole call's.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
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


BETWEEN = "(between)"  # --timeline: the time outside the timed ops


def timeline_rows(graph, runs: int) -> tuple[list[tuple[int, str, tuple, float]], float]:
    """(node index, op, ne, seconds) of each node from ``runs`` timed computes of ``graph``: a
    timed node's median time; ggml's own ops as (between) rows of 0 s (their operations go there),
    whose median time together (with the barriers) comes as one more row with index -1; and the
    median summed spread of the timed ops."""
    timelines = [graph.timeline() for _ in range(runs)]
    rows = [(node.index, node.op, node.ne, float(np.median([t.nodes[node.index].seconds for t in timelines])))
            if node.enter else (node.index, BETWEEN, (), 0.0) for node in timelines[0].nodes]
    rows.append((-1, BETWEEN, (), float(np.median([t.between for t in timelines]))))
    return rows, float(np.median([sum(n.spread for n in t.nodes) for t in timelines]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--what", choices=["decode", "encode", "stream"], default="decode",
                   help="stream: the graphs of a stream decoder's pushes of one frame each (over --seconds of "
                        "codes, at least 2 frames)")
    p.add_argument("--seconds", type=float, default=1.0)
    p.add_argument("--precision", choices=["f32", "s2cpp"], default="f32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--backend", default="cpu")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--no-floor", action="store_true", help="skip the SGEMM timing and the excess columns")
    p.add_argument("--timeline", type=int, nargs="?", const=5, default=None, metavar="RUNS",
                   help="time the compiled kernels inside RUNS whole computes of each graph (default 5) "
                        "instead of node by node (CPU backend)")
    args = p.parse_args(argv)
    if args.timeline is not None and args.timeline < 1:
        p.error(f"--timeline takes a count of runs of at least 1, not {args.timeline}")
    rng = np.random.default_rng(0)
    with (pyggml_codec.load(args.model, backend=args.backend, n_threads=args.threads, precision=args.precision) as c,
          contextlib.ExitStack() as stream):
        n = int(args.seconds * c.sample_rate)
        frames = -(-n // c.config.samples_per_frame)
        codes = np.stack([rng.integers(0, s, max(frames, 2)) for s in c.config.quantizer.codebook_sizes])
        if args.what == "decode":
            c.decode(codes[:, :frames])
        elif args.what == "stream":  # one frame at a time: the graphs of a stream's steady pushes
            decoder = stream.enter_context(c.stream_decoder())
            for i in range(codes.shape[1]):
                decoder.push(codes[:, i:i + 1])
        else:
            c.encode((0.3 * rng.standard_normal(n)).astype(np.float32))
        by_shape: dict = collections.defaultdict(lambda: [0.0, 0, 0])  # (op, ne) -> seconds, nodes, operations
        by_op: dict = collections.defaultdict(lambda: [0.0, 0])  # op -> seconds, operations
        uncounted: collections.Counter = collections.Counter()  # ops with no counting rule: 0 operations
        waits = 0.0  # --timeline: the threads' spread at the timed ops' ends, summed
        for graph in c.engine.cached_graphs().values():
            if args.timeline:
                rows, spread = timeline_rows(graph, args.timeline)
                waits += spread
            else:
                rows = [(i, op, ne, seconds) for i, (op, ne, seconds) in enumerate(graph.profile())]
            for i, op, ne, seconds in rows:
                if i < 0:  # --timeline's (between) time: its nodes' work comes with them below
                    by_shape[(op, ne)][0] += seconds
                    by_op[op][0] += seconds
                    continue
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
    how = f"medians of {args.timeline} whole computes" if args.timeline else "summed over nodes"
    print(f"{args.what} of {args.seconds:g} s, precision {args.precision}, {args.threads} threads: "
          f"{total * 1000:.1f} ms {how}, {work / 1e9:.2f} GFLOP")
    if args.timeline:
        print(f"{BETWEEN}: ggml's own ops and the barriers between ops, {by_op[BETWEEN][0] * 1000:.1f} ms; "
              f"the first thread out of a timed op waiting for the last: {waits * 1000:.1f} ms in all")
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

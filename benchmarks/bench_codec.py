"""Side-by-side speed of pyggml_codec and the upstream PyTorch codec, same cores, same run.

    python benchmarks/bench_codec.py                 # full S2 size, 1 s and 10 s, 1 and 2 threads
    python benchmarks/bench_codec.py --quick         # 1 s only, 2 threads, one precision
    python benchmarks/bench_codec.py --seconds 1 10 60 --variants --windowed 4 16

Builds the full-size random-weight model once (upstream classes from the oracle wheels,
converted with this project's converter to F32 and F16 files), then runs the oracle and
this library ALTERNATELY on identical inputs after a warm-up, several repetitions each,
and reports medians and the ratio oracle_time / our_time per row (> 1 means faster than
PyTorch). Peak RSS is measured per engine in a child process. Writes JSON and a markdown
table to --out. Needs the test extra (torch, einops) and PYGGML_ORACLE_WHEELS.

Every row also stands against the machine's own limits (limits.py), measured in the same run at
the row's thread count: the graph's operations as executed (pyggml_codec.backend.flops: products,
Winograd transforms, elementwise, counted over every graph the call computed), numpy's SGEMM
rate (1024^3 and the codec's three heaviest product shapes, best of 5), the floor = operations /
the 1024^3 rate measured just before and just after each timed run, and each engine's time / floor (the
median over its runs of each run's time over its own floor). --streams adds the chunk-1 streaming targets per
byte read on the F16 file and on its Q8_0 quantization. --page writes the tables as this machine
kind's section of the performance page (docs/performance.md), keeping other kinds' sections.
With --s2cpp TREE the s2cpp rows are also timed against s2.cpp itself (its harness is built first).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


HERE = Path(__file__).resolve().parent
WINDOWED_STRIDES: list[int] = []  # set by --windowed: re-decoding windows is 19-145x a decode
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, nargs="+", default=[1.4, 10])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--dtypes", nargs="+", default=["f32", "f16"], choices=["f32", "f16"])
    p.add_argument("--precisions", nargs="+", default=["f32", "s2cpp"], choices=["f32", "s2cpp"])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("bench_out"))
    p.add_argument("--quick", action="store_true", help="1.4 s, 2 threads, f16 file, s2cpp and f32; with --streams, "
                                                        "32 frames for the one-stream rows")
    p.add_argument("--page", type=Path, default=None,
                   help="write the tables as this machine kind's section of this page (docs/performance.md)")
    p.add_argument("--command", default=None, help="the command line the page shows (default: this one)")
    p.add_argument("--bandwidth-mib", type=int, default=None,
                   help="buffer of the bandwidth read (MiB; default 512, or twice the last-level cache)")
    p.add_argument("--size", choices=["full", "tiny"], default="full",
                   help="the random-weight model: full (S2 Pro size) or tiny (a smoke run of this script)")
    p.add_argument("--s2cpp", type=Path, default=None, metavar="TREE",
                   help="an s2.cpp source tree: also time s2.cpp on the s2cpp rows (builds its harness)")
    p.add_argument("--no-rss", action="store_true", help="skip the peak-RSS child processes")
    p.add_argument("--rss-only", action="store_true", help="only the peak-RSS child processes")
    p.add_argument("--variants", action="store_true",
                   help="also time the default lowering plan against plain ggml ops and ggml_conv_transpose_1d")
    p.add_argument("--windowed", type=int, nargs="*", default=None, metavar="STRIDE",
                   help="also time the C++ engine's windowed decode at these strides (default 4 16)")
    p.add_argument("--scaling", type=float, nargs="*", default=None, metavar="SECONDS",
                   help="also time ours alone per second of audio at these lengths (default 1 10 60; F16 file, "
                        "s2cpp, 2 threads): the flatness check")
    p.add_argument("--no-streaming", action="store_true", help="skip the streaming rows")
    p.add_argument("--streams", type=int, nargs="?", const=64, default=None, metavar="FRAMES",
                   help="also the streams and batches rows of bench_streams.py (F16 file, f32 precision, "
                        "FRAMES frames per stream of 8, default 64; one stream: 10 s) and the peak RSS of 8 "
                        "live streams")
    p.add_argument("--streams-only", action="store_true",
                   help="only the rows of --streams (default 64 frames) and their peak RSS: no PyTorch rows")
    p.add_argument("--rss-child", nargs=4, metavar=("ENGINE", "MODEL", "SECONDS", "MODE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.windowed is not None:
        WINDOWED_STRIDES[:] = args.windowed or [4, 16]
    if args.quick:
        args.seconds, args.threads, args.dtypes, args.reps = [1.4], [2], ["f16"], 2
    if args.streams_only:
        args.streams, args.dtypes, args.no_rss = args.streams or 64, [], True
    args.frames_one = 32 if args.quick else 216
    if args.bandwidth_mib is None:
        import limits
        args.bandwidth_mib = limits.bandwidth_mib()
    return args


def page_command(command: str, s2cpp: Path | None) -> str:
    """The command line as the page shows it: the s2.cpp tree as S2CPP_TREE, not where it lies here."""
    if s2cpp is None:
        return command
    return " ".join("S2CPP_TREE" if word in (str(s2cpp), f"{s2cpp}/") else word for word in command.split(" "))


def build_models(tmp: Path, size: str = "full"):
    import models
    import oracle

    t0 = time.perf_counter()
    model = oracle.build_model(oracle.FULL if size == "full" else oracle.TINY, seed=0)
    paths = {d: models.make_gguf(model, tmp / f"s2_full_{d}.gguf", d) for d in ("f32", "f16")}
    print(f"built {size} model and GGUF files in {time.perf_counter() - t0:.1f} s", flush=True)
    return model, paths


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


SETTLE_S = 0.5  # pause before each timed run: both engines' OpenMP workers spin-wait after a
# parallel region, and a run started right after the other engine's loses its cores to them
# (measured: our 1 s decode 1.9-2.1 s right after PyTorch's, 1.4-1.9 s on its own).


def timed_settled(fn) -> float:
    time.sleep(SETTLE_S)
    return timed(fn)


def alternate(ours, theirs, reps: int) -> tuple[float, float]:
    """Median seconds of each, run alternately after one warm-up of each."""
    ours(), theirs()
    a, b = [], []
    for _ in range(reps):
        a.append(timed_settled(ours))
        b.append(timed_settled(theirs))
    return statistics.median(a), statistics.median(b)


def alternate_bracketed(ours, theirs, reps: int, threads: int) -> tuple[list, list]:
    """Both run alternately after one warm-up of each, as :func:`alternate`, with the reference
    SGEMM rate sampled between every two runs: each run's (seconds, rate just before, rate just
    after), ours then theirs."""
    ours(), theirs()
    a, b = [], []
    rates = [paired_sgemm_gflops(threads)]
    for _ in range(reps):
        for fn, runs in ((ours, a), (theirs, b)):
            t = timed_settled(fn)
            rates.append(paired_sgemm_gflops(threads))
            runs.append((t, rates[-2], rates[-1]))
    return a, b


def bench_pair(codec, model, seconds: float, reps: int, torch_threads: int, streaming: bool = True,
               s2cpp: tuple | None = None) -> list[dict]:
    """``s2cpp``: (harness executable, model path) to time s2.cpp on the same input as well."""
    import limits
    import oracle
    import torch
    from parity import random_codes, signal

    torch.set_num_threads(torch_threads)
    n = int(seconds * 44100)
    x = signal(n, seed=1)
    codes = random_codes(codec.config.quantizer.codebook_sizes, -(-n // 2048), seed=2)
    rows = []
    for task, ours, theirs in (
        ("decode", lambda: codec.decode(codes), lambda: oracle.decode(model, codes)),
        ("encode", lambda: codec.encode(x), lambda: oracle.encode(model, x)),
    ):
        codec.clear_cache()
        with limits.FlopMeter() as meter:  # the first call computes the graphs every warm call runs
            cold = timed(ours)
        runs_ours, runs_theirs = alternate_bracketed(ours, theirs, reps, torch_threads)
        t_ours, t_theirs = (statistics.median(t for t, _, _ in runs) for runs in (runs_ours, runs_theirs))
        wall = timed_settled(ours)
        overhead = max(wall - codec.last_compute_s, 0.0) / wall
        count = meter.total()
        rows.append(dict(task=task, seconds=seconds, ours_s=t_ours, oracle_s=t_theirs, ratio=t_theirs / t_ours,
                         cold_s=cold, build_s=max(cold - t_ours, 0.0), python_overhead=overhead,
                         flops=count.total, flops_products=count.products, flops_transforms=count.transforms,
                         flops_elementwise=count.elementwise, flops_uncounted=count.uncounted,
                         flops_by_op=count.by_op,
                         gemm_shapes=[list(s) for s in count.top_shapes()],
                         runs_ours=runs_ours, runs_oracle=runs_theirs))
        if s2cpp is not None:
            import bench_s2cpp

            exe, path = s2cpp
            data = codes if task == "decode" else x
            rows[-1]["s2cpp_s"] = bench_s2cpp.s2cpp_time(exe, task, path, data, torch_threads, reps,
                                                         statistic=statistics.median)  # as ours_s
    chunk = codec.decode_chunk_frames
    if chunk and codes.shape[1] > chunk:  # decode() streamed in chunks above; here the one graph
        codec.clear_cache()
        codec.decode_chunk_frames = None
        try:
            t_one, _ = alternate(lambda: codec.decode(codes), lambda: None, reps)
        finally:
            codec.decode_chunk_frames = chunk
        rows.append(dict(task="decode-one-shot", seconds=seconds, ours_s=t_one,
                         oracle_s=rows[0]["oracle_s"], ratio=rows[0]["oracle_s"] / t_one))
    if seconds <= 10:  # the fused path (what GPU backends run), forced on the CPU
        codec.clear_cache()
        t_fused, _ = alternate(lambda: codec.decode(codes, decode_path="fused"), lambda: None, reps)
        rows.append(dict(task="decode-fused", seconds=seconds, ours_s=t_fused,
                         oracle_s=rows[0]["oracle_s"], ratio=rows[0]["oracle_s"] / t_fused))
    if streaming:
        rows += bench_streaming(codec, codes, seconds, reps)
    return rows


def bench_scaling(path: Path, lengths: list[float]) -> list[dict]:
    """Ours alone: seconds of compute per second of audio, decode and encode, 1 s to 60 s."""
    import pyggml_codec
    from parity import random_codes, signal

    rows = []
    with pyggml_codec.load(path, backend="cpu", precision="s2cpp", n_threads=2) as c:
        for seconds in lengths:
            n = int(seconds * 44100)
            x = signal(n, seed=1)
            codes = random_codes(c.config.quantizer.codebook_sizes, -(-n // 2048), seed=2)
            for task, fn in (("decode", lambda: c.decode(codes)), ("encode", lambda: c.encode(x))):
                fn()
                t = min(timed_settled(fn) for _ in range(2 if seconds <= 10 else 1))
                rows.append(dict(task=f"scaling-{task}", seconds=seconds, ours_s=t, per_audio_s=t / seconds))
                print(json.dumps(rows[-1]), flush=True)
    return rows


def bench_streaming(codec, codes, seconds: float, reps: int) -> list[dict]:
    if not hasattr(codec, "stream_decoder") or seconds < 2:
        return []
    one_shot = statistics.median(timed_settled(lambda: codec.decode(codes)) for _ in range(reps))
    per_frame_one_shot = one_shot / codes.shape[1]
    rows = []
    for chunk in (1, 4, 16):
        def run():
            with codec.stream_decoder() as sd:
                for i in range(0, codes.shape[1], chunk):
                    sd.push(codes[:, i:i + chunk])
        run()
        t = statistics.median(timed_settled(run) for _ in range(max(1, reps - 1)))
        rows.append(dict(task=f"stream-chunk{chunk}", seconds=seconds, ours_s=t, per_frame_s=t / codes.shape[1],
                         cost_vs_one_shot=(t / codes.shape[1]) / per_frame_one_shot))
    for stride in WINDOWED_STRIDES:  # the C++ engine's re-decoded windows (--windowed)
        t = timed_settled(lambda: codec.decode_windowed(codes, stride=stride))
        rows.append(dict(task=f"windowed-stride{stride}", seconds=seconds, ours_s=t, per_frame_s=t / codes.shape[1],
                         cost_vs_one_shot=(t / codes.shape[1]) / per_frame_one_shot))
    return rows


VARIANTS = {"plain-ggml-ops": {"kernels": False}, "conv_transpose_1d": {"conv_transpose": "ggml"},
            "no-blas": {"matmul": "ggml", "conv": "im2col"}, "im2col-conv": {"conv": "im2col"},
            "per-tap-conv": {"conv": "taps"}, "blocked-attention": {"attention": "blocked"}}


def bench_variants(path: Path, dtype: str, precision: str, threads: int, reps: int) -> list[dict]:
    """What each optimization moves: the default plan against each alternative, alternately."""
    import pyggml_codec
    from parity import random_codes, signal

    x = signal(44100, seed=1)
    rows = []
    with pyggml_codec.load(path, backend="cpu", precision=precision, n_threads=threads) as base:
        codes = random_codes(base.config.quantizer.codebook_sizes, 22, seed=2)
        for name, plan in VARIANTS.items():
            with pyggml_codec.load(path, backend="cpu", precision=precision, n_threads=threads,
                                   lowerings=plan) as alt:
                for task, a, b in (("decode", lambda: base.decode(codes), lambda: alt.decode(codes)),
                                   ("encode", lambda: base.encode(x), lambda: alt.encode(x))):
                    t_base, t_alt = alternate(a, b, reps)
                    rows.append(dict(task=f"{task} default vs {name}", seconds=1, ours_s=t_base, variant_s=t_alt,
                                     gain=t_alt / t_base, dtype=dtype, precision=precision, threads=threads))
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def rss_child(engine: str, model_path: str, seconds: float, mode: str) -> None:
    """Runs in a child: one engine, one task; prints peak RSS in MB as JSON."""
    from parity import random_codes, signal

    n = int(seconds * 44100)
    if engine == "ours":
        import pyggml_codec

        parts = "decode" if mode.startswith("decode") else "all"
        precision = "f32" if mode.endswith("-f32") else "s2cpp"  # s2cpp keeps the F16 file's conv weights in F16
        with pyggml_codec.load(model_path, backend="cpu", n_threads=2, precision=precision, parts=parts) as c:
            codes = random_codes(c.config.quantizer.codebook_sizes, -(-n // 2048), seed=2)
            if mode == "decode-one-shot":
                c.decode_chunk_frames = None
            if mode.startswith("decode"):
                c.decode(codes)
            elif mode == "encode":
                c.encode(signal(n, seed=1))
            else:
                c.encode_chunked(signal(n, seed=1))
    else:
        import oracle
        import torch

        torch.set_num_threads(2)
        model = oracle.build_model(oracle.FULL, seed=0)
        codes = random_codes((4096,) + (1024,) * 9, -(-n // 2048), seed=2)
        oracle.decode(model, codes) if mode == "decode" else oracle.encode(model, signal(n, seed=1))
    print(json.dumps({"peak_rss_mb": peak_rss_mb()}))


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM). Not ru_maxrss: Linux keeps that across
    fork + exec, so a child would report its parent's peak."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_rss(engine: str, model_path: Path, seconds: float, mode: str) -> float:
    out = subprocess.run([sys.executable, __file__, "--rss-child", engine, str(model_path), str(seconds), mode],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_mb"]


def _row(r: dict) -> str:
    extra = f"{r['build_s']:.3f}" if "build_s" in r else ""
    share = f"{100 * r['python_overhead']:.1f} %" if "python_overhead" in r else ""
    return (f"| {r['dtype']} | {r['precision']} | {r['threads']} | {r['task']} | {r['seconds']:g} | "
            f"{r['ours_s']:.3f} | {r['oracle_s']:.3f} | {r['ratio']:.2f}x | {extra} | {share} |")


def paired_sgemm_gflops(threads: int) -> float:
    """The reference SGEMM rate now (a short measure: best of 3 timings of 0.1 s), taken between
    every two timed runs of a row (:func:`alternate_bracketed`)."""
    import limits

    return limits.sgemm_gflops(threads, reps=3, min_s=0.1)[limits.REFERENCE_SHAPE]


# The most the SGEMM rate measured just before and just after a run may differ (max over min) for the
# run's ratio to the floor to stand: past it the machine's speed changed while the run ran (on one
# contended 2-core VM two samples around a row read 283 and 200 GFLOP/s, and the row's ratio to the
# floor read 1.36x for code that measured 1.93x on a quiet machine).
SGEMM_SWING = 1.15


def run_ratios(runs: list, flops: float) -> tuple[float, float, float | None]:
    """Of timed runs ``(seconds, rate before, rate after)``: the median of each run's time over its
    own floor (at the mean of its two rates), the median of those rates, and None where at least
    one run's two rates agree within SGEMM_SWING (only those runs count), else the smallest swing
    of any (every run counts, and the ratio does not stand)."""
    import limits

    each = [(t / limits.floor_s(flops, 0.5 * (before + after)), 0.5 * (before + after),
             max(before, after) / min(before, after)) for t, before, after in runs]
    steady = [e for e in each if e[2] <= SGEMM_SWING]
    use = steady or each
    return (statistics.median(e[0] for e in use), statistics.median(e[1] for e in use),
            None if steady else min(e[2] for e in each))


def add_limits(rows: list[dict], machine_limits: dict) -> None:
    """Each row with operations counted: its floor, and each engine's time against it, in place.
    Where a row has its runs' SGEMM brackets (``runs_ours``, ``runs_oracle``: see
    :func:`alternate_bracketed`), each engine's ratio is the median over its runs of each run's
    time over the floor at the rate measured just before and just after that run, and the floor
    shown is at the median of ours' rates: on a VM whose speed drifts within seconds, a rate
    measured a minute from the run it divides is off by as much as the machine drifts (one 2-core
    VM's reference rate read 155 and 353 GFLOP/s within an hour). Else its thread count's rate
    from ``machine_limits`` (threads -> limits measured after the rows)."""
    import limits

    for r in rows:
        lim = machine_limits.get(r.get("threads"))
        if not r.get("flops") or (lim is None and "runs_ours" not in r):
            continue
        if "runs_ours" in r:
            ours, rate, swing_ours = run_ratios(r["runs_ours"], r["flops"])
            oracle, _, swing_oracle = run_ratios(r["runs_oracle"], r["flops"])
            swings = [w for w in (swing_ours, swing_oracle) if w is not None]
            if swings:
                r["floor_unsteady"] = max(swings)
        else:
            rate = lim["sgemm_gflops"]
            ours = limits.ratio_to_floor(r["ours_s"], r["flops"], rate)
            oracle = limits.ratio_to_floor(r["oracle_s"], r["flops"], rate)
        r.update(sgemm_gflops=rate, floor_s=limits.floor_s(r["flops"], rate), ours_vs_floor=ours,
                 oracle_vs_floor=oracle)
        if "s2cpp_s" in r:
            r["s2cpp_vs_ours"] = r["s2cpp_s"] / r["ours_s"]


def limits_table(rows: list[dict]) -> str:
    """Every row with a floor: operations, the SGEMM rate and floor, ours and PyTorch against it. A row
    none of whose runs (of ours, or of PyTorch's) had SGEMM samples around it within SGEMM_SWING has
    its ratios marked unsteady, and a note under the table says by how much."""
    have = [r for r in rows if "floor_s" in r]
    if not have:
        return ""
    s2 = any("s2cpp_s" in r for r in have)
    lines = ["| file | precision | threads | task | audio s | GFLOP (products / transforms / elementwise) | "
             "SGEMM GFLOP/s | floor s | ours s | ours / floor | PyTorch s | PyTorch / floor |"
             + (" s2.cpp s | s2.cpp / ours |" if s2 else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if s2 else "")]
    for r in have:
        uncounted = r.get("flops_uncounted") or {}  # ops without a rule: the floor is too low, said so
        missing = f", not counted: {', '.join(f'{k} x{v}' for k, v in sorted(uncounted.items()))}" if uncounted else ""
        mark = " (unsteady)" if "floor_unsteady" in r else ""
        line = (f"| {r['dtype']} | {r['precision']} | {r['threads']} | {r['task']} | {r['seconds']:g} | "
                f"{r['flops'] / 1e9:.1f} ({r['flops_products'] / 1e9:.1f} / {r['flops_transforms'] / 1e9:.1f} / "
                f"{r['flops_elementwise'] / 1e9:.1f}{missing}) | {r['sgemm_gflops']:.0f} | {r['floor_s']:.3f} | "
                f"{r['ours_s']:.3f} | {r['ours_vs_floor']:.2f}x{mark} | {r['oracle_s']:.3f} | "
                f"{r['oracle_vs_floor']:.2f}x{mark} |")
        if s2:
            line += (f" {r['s2cpp_s']:.3f} | {r['s2cpp_vs_ours']:.2f}x |" if "s2cpp_s" in r else " | |")
        lines.append(line)
    unsteady = [r for r in have if "floor_unsteady" in r]
    if unsteady:
        worst = max(r["floor_unsteady"] for r in unsteady)
        lines.append(f"\nUnsteady: in {len(unsteady)} of these rows the SGEMM rate measured just before and just after "
                     f"each run of one engine differed by more than {100 * (SGEMM_SWING - 1):.0f} % (in the worst row, by "
                     f"{100 * (worst - 1):.0f} % around its steadiest run): the machine's speed changed while they "
                     "ran, and their ratios to the floor do not stand.")
    return "\n".join(lines)


def limits_lines(machine_limits: dict) -> str:
    """The measured limits per thread count, one line each."""
    out = []
    for threads, lim in sorted(machine_limits.items()):
        shapes = ", ".join(f"{m}x{k}x{n} {g:.1f}" for (m, k, n), g in lim["sgemm_by_shape"].items())
        out.append(f"- {threads} threads: SGEMM (numpy's BLAS, M x K x N: GFLOP/s, best of 5) {shapes}; "
                   f"memory read {lim['bandwidth_gbs']:.1f} GB/s ({lim['bandwidth_mib']} MiB buffer, best of 5)")
    return "\n".join(out)


def measure_limits(threads_list, rows: list[dict], bandwidth_mib: int) -> dict:
    """SGEMM rates (1024^3, then the heaviest product shapes the rows computed, N capped at 4096)
    and the memory read rate, per thread count."""
    import limits

    shapes: dict = {}
    for r in rows:
        for rank, shape in enumerate(r.get("gemm_shapes", [])):
            m, k, n = shape
            key = (m, k, min(n, 4096))
            shapes[key] = min(shapes.get(key, rank), rank)
    codec_shapes = sorted(shapes, key=lambda s: shapes[s])[:3]
    out = {}
    for threads in threads_list:
        rates = limits.sgemm_gflops(threads, [limits.REFERENCE_SHAPE] + [s for s in codec_shapes
                                                                         if s != limits.REFERENCE_SHAPE])
        out[threads] = {"sgemm_gflops": rates[limits.REFERENCE_SHAPE], "sgemm_by_shape": rates,
                        "bandwidth_gbs": limits.bandwidth_gbs(threads, bandwidth_mib), "bandwidth_mib": bandwidth_mib}
        print(f"limits at {threads} threads: {limits_lines({threads: out[threads]})}", flush=True)
    return out


def table(rows: list[dict]) -> str:
    pairs = [_row(r) for r in rows if "ratio" in r]
    lines = ["| file | precision | threads | task | audio s | ours s | PyTorch s | speed-up | first-call extra s "
             "| Python share |", "|---|---|---|---|---|---|---|---|---|---|"] + pairs if pairs else []
    variants = [r for r in rows if "gain" in r]
    if variants:
        lines += ["", "| file | precision | threads | comparison (1 s) | default s | variant s | default faster by |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['dtype']} | {r['precision']} | {r['threads']} | {r['task']} | {r['ours_s']:.3f} | "
                  f"{r['variant_s']:.3f} | {r['gain']:.2f}x |" for r in variants]
    scaling = [r for r in rows if "per_audio_s" in r]
    if scaling:
        lines += ["", "| scaling (F16 file, s2cpp, 2 threads) | audio s | ours s | s per s of audio |", "|---|---|---|---|"]
        lines += [f"| {r['task'][8:]} | {r['seconds']:g} | {r['ours_s']:.2f} | {r['per_audio_s']:.3f} |" for r in scaling]
    streams = [r for r in rows if r.get("streams_row")]
    if streams:
        import bench_streams

        lines += ["", "Streams and batches (f32 precision; per frame against decode() of the same "
                  "codes, one item at a time, in the same run):", ""]
        for file in dict.fromkeys(r["dtype"] for r in streams):
            for threads in sorted({r["threads"] for r in streams}):
                same = [r for r in streams if r["threads"] == threads and r["dtype"] == file]
                lines += [f"{file.upper()} file, {threads} threads:", "", bench_streams.table(same), ""]
    stream = [r for r in rows if "cost_vs_one_shot" in r]
    if stream:
        lines += ["", "| file | precision | threads | streaming | audio s | ms per frame | vs one-shot per frame |",
                  "|---|---|---|---|---|---|---|"]
        for r in stream:
            lines.append(f"| {r['dtype']} | {r['precision']} | {r['threads']} | {r['task']} | {r['seconds']:g} | "
                         f"{1000 * r['per_frame_s']:.2f} | {r['cost_vs_one_shot']:.2f}x |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.rss_child:
        engine, path, seconds, mode = args.rss_child
        rss_child(engine, path, float(seconds), mode)
        return 0
    import limits
    import pyggml_codec

    command = page_command(args.command or " ".join(["python", "benchmarks/bench_codec.py",
                                                     *(sys.argv[1:] if argv is None else argv)]), args.s2cpp)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    others = limits.OthersWatch().start()
    with tempfile.TemporaryDirectory() as tmp:
        model, paths = build_models(Path(tmp), args.size)
        exe = None
        if args.s2cpp is not None:
            from pyggml_codec.diagnostics import s2cpp

            exe = s2cpp.build_harness(args.s2cpp)
        for dtype in [] if args.rss_only else args.dtypes:
            for precision in args.precisions:
                for threads in args.threads:
                    with pyggml_codec.load(paths[dtype], backend="cpu", precision=precision, n_threads=threads) as c:
                        for seconds in args.seconds:
                            stream = not args.no_streaming and dtype == "f16"
                            versus = (exe, paths[dtype]) if exe is not None and precision == "s2cpp" else None
                            for r in bench_pair(c, model, seconds, args.reps, threads, stream, versus):
                                rows.append(dict(r, dtype=dtype, precision=precision, threads=threads))
                                print(json.dumps(rows[-1]), flush=True)
        machine_limits = {} if args.rss_only else measure_limits(args.threads, rows, args.bandwidth_mib)
        add_limits(rows, machine_limits)
        if args.streams:
            import bench_streams
            from pyggml_codec.model.quantize import quantize_file

            paths["q8_0"] = Path(tmp) / "s2_full_q8_0.gguf"
            quantize_file(paths["f16"], paths["q8_0"], "q8_0")
            for threads in args.threads:
                bandwidth = machine_limits[threads]["bandwidth_gbs"]
                for file in ("f16", "q8_0"):
                    with pyggml_codec.load(paths[file], backend="cpu", precision="f32", n_threads=threads,
                                           parts="decode") as c:
                        measure = functools.partial(limits.bandwidth_gbs, threads, args.bandwidth_mib)
                        for r in bench_streams.bench_streams(c, args.streams, args.reps, args.frames_one, bandwidth,
                                                             measure_bandwidth=measure,
                                                             measure_round_trip=limits.core_round_trip_ns):
                            rows.append(dict(r, dtype=file, file=file.upper(), precision="f32", threads=threads,
                                             streams_row=True))
                            print(json.dumps(rows[-1]), flush=True)
        if args.scaling is not None:
            rows += bench_scaling(paths["f16"], args.scaling or [1, 10, 60])
        if args.variants:
            for dtype in args.dtypes:
                for precision in args.precisions:
                    rows += bench_variants(paths[dtype], dtype, precision, max(args.threads), args.reps)
        rss = {}
        if args.streams:  # with --no-rss too: one child, the row this option adds
            out = subprocess.run([sys.executable, str(HERE / "bench_streams.py"), "--rss-child", "-m",
                                  str(paths["f16"]), "--threads", str(max(args.threads)), "--frames", "16"],
                                 capture_output=True, text=True, check=True)
            rss["ours-decode-8-live-streams-f32"] = json.loads(out.stdout.splitlines()[-1])["peak_rss_mb"]
            print(f"peak RSS of 8 live streams: {rss['ours-decode-8-live-streams-f32']:.0f} MB", flush=True)
        if not args.no_rss:
            runs = [("ours", "decode", 10), ("ours", "decode-one-shot", 10), ("ours", "decode", 60), ("ours", "decode-f32", 10),
                    ("oracle", "decode", 10), ("ours", "encode", 10), ("oracle", "encode", 10),
                    ("ours", "encode-chunked", 10), ("ours", "encode-chunked", 60)]
            for engine, mode, seconds in runs:
                key = f"{engine}-{mode}-{seconds}s"
                rss[key] = measure_rss(engine, paths["f16"], float(seconds), mode)
                print(f"peak RSS {key}: {rss[key]:.0f} MB", flush=True)

    import bench_streams

    about = limits.machine()
    machine = limits.machine_line(about, others=others.share())
    jsonable = {t: dict(v, sgemm_by_shape={"x".join(map(str, k)): g for k, g in v["sgemm_by_shape"].items()})
                for t, v in machine_limits.items()}
    report = {"machine": machine, "kind": about["kind"], "command": command, "limits": jsonable, "rows": rows,
              "peak_rss_mb": rss}
    (args.out / "bench.json").write_text(json.dumps(report, indent=2))
    rss_lines = "\n".join(f"| {k} | {v:.0f} |" for k, v in rss.items())
    stream_targets = bench_streams.targets_table([r for r in rows if r.get("streams_row")])
    has_targets = any("target_ms" in r for r in rows)
    md = (f"Machine: {machine}\n\nCommand: `{command}`\n\nLimits measured in this run:\n\n"
          f"{limits_lines(machine_limits)}\n\n{limits_table(rows)}\n\n{table(rows)}\n\n"
          + (f"Streaming at chunk 1 against its targets per byte read:\n\n{stream_targets}\n\n" if has_targets else "")
          + f"Peak RSS (F16 file; ours: s2cpp precision but the live streams' "
          f"f32, decode rows load parts='decode'):\n\n| run | MB |\n|---|---|\n{rss_lines}\n")
    (args.out / "bench.md").write_text(md)
    print(md)
    if args.page is not None:
        body = f"Limits measured in the same run:\n\n{limits_lines(machine_limits)}\n\n{limits_table(rows)}\n"
        if has_targets:
            body += f"\nStreaming at chunk 1 against its targets per byte read:\n\n{stream_targets}\n"
        limits.write_page(args.page, about["kind"], limits.section(about["kind"], f"Machine: {machine}", command, body),
                          PAGE_INTRO)
        print(f"wrote the {about['kind']} section of {args.page}")
    return 0


PAGE_INTRO = "# Performance\n\nTables written by `scripts/bench.sh`, one per machine kind.\n"


if __name__ == "__main__":
    sys.exit(main())

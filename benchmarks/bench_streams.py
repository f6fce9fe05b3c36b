"""Streams and batches, side by side in one run: cost per frame against a one-shot decode.

    python benchmarks/bench_streams.py -m MODEL.gguf [--threads 2] [--frames 32] [--reps 3]

Rows (all against ``decode()`` of the same codes, one item at a time, timed in the same run):

* ``stream-chunkN``: one stream pushed N frames at a time (``stream_decoder``);
* ``streams8-chunkN``: 8 streams in one ``batch_stream_decoder``, every stream pushing N
  frames per step; cost per stream and frame;
* ``decode_batch-K``: ``decode_batch`` of K items against K sequential decodes;
* ``latency-first-frame``: from ``push`` of a new stream's first frame to its PCM, for one
  stream and for 8 joining at once (graphs already built: a server's steady state).

``bench_codec.py --streams`` runs the same on the full-size model it builds, and peak RSS of
8 live streams in a child process (``--rss-child``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent))
SETTLE_S = 0.3
N_STREAMS = 8


def _timed(fn) -> float:
    time.sleep(SETTLE_S)
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _medians(fns: dict, reps: int) -> dict:
    """Median seconds of each function, the functions run in turn each repetition (after a warm-up)."""
    for fn in fns.values():
        fn()
    times: dict = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            times[name].append(_timed(fn))
    return {name: statistics.median(t) for name, t in times.items()}


def _stream(codec, codes, chunk: int) -> None:
    with codec.stream_decoder() as sd:
        for i in range(0, codes.shape[1], chunk):
            sd.push(codes[:, i:i + chunk])


def _streams(codec, items, chunk: int) -> None:
    with codec.batch_stream_decoder(len(items)) as bsd:
        sids = [bsd.join() for _ in items]
        for i in range(0, items[0].shape[1], chunk):
            bsd.push({sid: x[:, i:i + chunk] for sid, x in zip(sids, items)})


def _first_frame_latency(codec, items, reps: int) -> float:
    """Median seconds from a push of the first frame of len(items) new streams to their PCM."""
    times = []
    for _ in range(reps + 1):  # the first builds the graphs
        with codec.batch_stream_decoder(len(items)) as bsd:
            sids = [bsd.join() for _ in items]
            time.sleep(SETTLE_S)
            t0 = time.perf_counter()
            bsd.push({sid: x[:, :1] for sid, x in zip(sids, items)})
            times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def bench_streams(codec, frames: int, reps: int) -> list[dict]:
    from parity import random_codes

    sizes = codec.config.quantizer.codebook_sizes
    items = [random_codes(sizes, frames, seed=20 + i) for i in range(N_STREAMS)]
    rows = []
    one = _medians({"one": lambda: codec.decode(items[0])}, reps)["one"] / frames
    fns = {f"stream-chunk{c}": (lambda c=c: _stream(codec, items[0], c)) for c in (1, 4, 16)}
    for name, t in _medians(fns, reps).items():
        rows.append(dict(task=name, streams=1, ms_per_frame=1e3 * t / frames, vs_one_shot=t / frames / one))
    # one-shot again, in the same turns as the batched runs, so the ratio shares their conditions
    fns = {"one-shot": lambda: [codec.decode(x) for x in items]}
    fns.update({f"streams8-chunk{c}": (lambda c=c: _streams(codec, items, c)) for c in (1, 4, 16)})
    t = _medians(fns, reps)
    one8 = t.pop("one-shot") / (N_STREAMS * frames)
    for name, s in t.items():
        rows.append(dict(task=name, streams=N_STREAMS, ms_per_frame=1e3 * s / (N_STREAMS * frames),
                         vs_one_shot=s / (N_STREAMS * frames) / one8))
    for k in (1, 4, 8):
        sub = items[:k]
        t = _medians({"seq": lambda: [codec.decode(x) for x in sub], "batch": lambda: codec.decode_batch(sub)}, reps)
        rows.append(dict(task=f"decode_batch-{k}", streams=k, ms_per_frame=1e3 * t["batch"] / (k * frames),
                         vs_one_shot=t["batch"] / t["seq"], sequential_s=t["seq"], batch_s=t["batch"]))
    for k in (1, N_STREAMS):
        lat = _first_frame_latency(codec, items[:k], reps)
        rows.append(dict(task="latency-first-frame", streams=k, latency_ms=1e3 * lat,
                         audio_ms=1e3 * codec.config.samples_per_frame / codec.sample_rate))
    for r in rows:
        r["one_shot_ms_per_frame"] = 1e3 * one
    return rows


def rss_streams(model_path: str, threads: int, frames: int) -> float:
    """Peak RSS (MB) of a process holding 8 live streams pushed one frame at a time."""
    import pyggml_codec
    from parity import random_codes

    with pyggml_codec.load(model_path, backend="cpu", n_threads=threads, parts="decode") as c:
        items = [random_codes(c.config.quantizer.codebook_sizes, frames, seed=20 + i) for i in range(N_STREAMS)]
        _streams(c, items, 1)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))


def table(rows: list[dict]) -> str:
    lines = ["| run | streams | ms per frame | vs one-shot decode per frame | first-frame latency ms |",
             "|---|---|---|---|---|"]
    for r in rows:
        if "latency_ms" in r:
            lines.append(f"| {r['task']} | {r['streams']} | | | {r['latency_ms']:.0f} "
                         f"(one frame = {r['audio_ms']:.1f} ms of audio) |")
        else:
            what = "vs sequential decodes" if r["task"].startswith("decode_batch") else ""
            lines.append(f"| {r['task']} | {r['streams']} | {r['ms_per_frame']:.1f} | "
                         f"{r['vs_one_shot']:.2f}x {what} | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--frames", type=int, default=32)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--precision", default="f32")
    p.add_argument("--no-rss", action="store_true")
    p.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rss_child:
        print(json.dumps({"peak_rss_mb": rss_streams(args.model, args.threads, args.frames)}))
        return 0
    import pyggml_codec

    with pyggml_codec.load(args.model, backend="cpu", n_threads=args.threads, precision=args.precision,
                           parts="decode") as c:
        rows = bench_streams(c, args.frames, args.reps)
    for r in rows:
        print(json.dumps(r), flush=True)
    print(table(rows))
    if not args.no_rss:
        import subprocess

        out = subprocess.run([sys.executable, __file__, "--rss-child", "-m", args.model, "--threads",
                              str(args.threads), "--frames", "16"], capture_output=True, text=True, check=True)
        print(f"peak RSS, 8 live streams: {json.loads(out.stdout.splitlines()[-1])['peak_rss_mb']:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

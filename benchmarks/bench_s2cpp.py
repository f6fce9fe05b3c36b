"""precision="s2cpp" against s2.cpp itself, side by side on the same cores, in one run.

    python benchmarks/bench_s2cpp.py --s2cpp S2CPP_TREE -m MODEL.gguf [--frames 108] [--threads 1,2]

s2.cpp runs through this package's harness (``s2cpp_dump time``: its own AudioCodec::decode /
encode, warm, best of --repeats); this library runs in this process, warm, best of --repeats;
the two alternate per measurement so that machine load affects both alike. Prints one row per
direction and thread count with both times and the ratio (s2.cpp time / ours: > 1 is faster),
checks that the outputs are identical, and writes JSON with --json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import pyggml_codec as pc
from pyggml_codec.backend import buildinfo
from pyggml_codec.diagnostics import s2cpp


def s2cpp_time(exe: Path, kind: str, model: Path, data: np.ndarray, threads: int, repeats: int,
               statistic=min) -> float:
    """s2.cpp's warm time of ``kind`` on ``data``: ``statistic`` (min: best; bench_codec takes the
    median, as it does of its own runs) of ``repeats`` runs in one harness process."""
    # the harness reads int32 codes or float32 audio (numpy's default integers are int64)
    data = data.astype(np.int32 if np.issubdtype(data.dtype, np.integer) else np.float32, copy=False)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "in.npy"
        np.save(src, data)
        out = subprocess.run([str(exe), "time", kind, str(model), str(src), str(threads), str(repeats)],
                             capture_output=True, text=True, check=True).stdout
    return float(statistic(json.loads(out.strip().splitlines()[-1])["wall_s"]))


def ours_time(codec, kind: str, data: np.ndarray, repeats: int) -> float:
    call = (lambda: codec.decode(data)) if kind == "decode" else (
        lambda: codec.encode(data, sample_rate=codec.sample_rate, pad_to="frame_length"))
    call()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--s2cpp", required=True, type=Path)
    ap.add_argument("-m", "--model", required=True, type=Path, help="an F16 codec GGUF")
    ap.add_argument("--frames", type=int, default=108, help="input length in code frames (default 108, 5 s)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--build-dir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    exe = s2cpp.build_harness(args.s2cpp, args.build_dir)
    rng = np.random.default_rng(0)
    rows = []
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; ggml build "
          f"{buildinfo.s2cpp_exactness()['isa']}, llamafile {'on' if buildinfo.binding.has_llamafile() else 'off'}; "
          f"harness {s2cpp.harness_info(exe)}")
    for threads in (int(t) for t in args.threads.split(",")):
        with pc.load(args.model, backend="cpu", precision="s2cpp", n_threads=threads) as codec:
            codes = np.stack([rng.integers(0, s, args.frames) for s in codec.config.quantizer.codebook_sizes]
                             ).astype(np.int32)
            t = np.arange(args.frames * codec.config.samples_per_frame) / codec.sample_rate
            audio = (0.3 * np.sin(2 * np.pi * 180 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
            same = np.array_equal(codec.decode(codes), s2cpp.run_harness(exe, "decode", args.model, codes, threads)
                                  .stages["audio"])
            for kind, data in (("decode", codes), ("encode", audio)):
                theirs = s2cpp_time(exe, kind, args.model, data, threads, args.repeats)
                ours = ours_time(codec, kind, data, args.repeats)
                rows.append({"kind": kind, "threads": threads, "frames": args.frames, "s2cpp_s": theirs,
                             "ours_s": ours, "speedup": theirs / ours, "decode_identical": bool(same)})
                r = rows[-1]
                print(f"{kind:<7} {threads} thr  s2.cpp {theirs:7.2f} s   pyggml_codec s2cpp {ours:7.2f} s   "
                      f"{r['speedup']:.2f}x   (decode identical: {same})")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

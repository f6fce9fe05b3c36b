"""Evidence for the lavapipe abort: decode on a Vulkan device, free the codec's graphs
(``clear_cache()``, which frees their compute buffers), decode again, in fresh processes.

    GGML_VK_VISIBLE_DEVICES=0 python tools/vulkan_free_repro.py MODEL.gguf [--runs 4] [--mode clear|keep]

``clear`` frees the graphs between calls; ``keep`` makes the same calls with the graphs kept
(cached). Each run is a child process; the script prints how each ended (exit status, signal, or
hung) and glibc's last line. Measured with Mesa 22.3.6 lavapipe and ggml 0.15.3 on the
tiny test model, in two sessions of 4 runs per mode: clear 2 of 4 and 3 of 4 runs aborted (SIGABRT,
glibc heap-corruption messages, mostly within the first calls); keep 0 of 4 in one session, and in
the other 3 of 4 completed and 1 passed the time limit on a machine starved by other jobs. Graphs
of one op each (add, mul_mat, im2col, soft_max, rope, permuted products) built, computed and freed
the same way did not abort in 30 iterations.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys

CHILD = """
import sys
import numpy as np
import pyggml_codec
rng = np.random.default_rng(0)
with pyggml_codec.load(sys.argv[1], backend="vulkan", strict_backend=True, decode_path="split") as c:
    sizes = c.config.quantizer.codebook_sizes
    for i in range(10):
        if sys.argv[2] == "clear":
            c.clear_cache()
        n = 8 + i % 3
        codes = np.stack([rng.integers(0, s, n) for s in sizes])
        c.decode(codes)
        print("call", i, flush=True)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--mode", choices=("clear", "keep"), default="clear")
    ap.add_argument("--timeout", type=float, default=180, help="seconds per run before it counts as hung")
    args = ap.parse_args()
    died = 0
    for run in range(args.runs):
        try:
            p = subprocess.run([sys.executable, "-c", CHILD, args.model, args.mode], capture_output=True, text=True,
                               timeout=args.timeout)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as exc:  # a corrupted heap can also deadlock in malloc
            rc, out, err = None, exc.stdout or "", "hung"
            out = out.decode() if isinstance(out, bytes) else out
        calls = out.count("call ")
        how = ("hung" if rc is None else f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}")
        last = (err.strip().splitlines() or [""])[0][:120]
        died += rc != 0
        print(f"run {run}: {how} after {calls} calls {last}")
    print(f"{args.mode}: {died} of {args.runs} runs died")
    return 0


if __name__ == "__main__":
    sys.exit(main())

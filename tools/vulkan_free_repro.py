"""Evidence for the lavapipe abort: decode on a Vulkan device, free the codec's graphs
(``clear_cache()``, which frees their compute buffers), decode again, in fresh processes.

    GGML_VK_VISIBLE_DEVICES=0 python tools/vulkan_free_repro.py MODEL.gguf [--runs 4] [--mode clear|keep|evict]

``clear`` frees the graphs between calls; ``keep`` makes the same calls with the graphs kept
(cached); ``evict`` decodes 10 distinct lengths, so the graph cache (4 per kind) evicts. Each run
is a child process; the script prints how each ended (exit status, signal, or hung) and glibc's
last line.

The cause (Mesa 22.3.6 lavapipe, ggml 0.15.3): lavapipe's descriptor sets keep a bare
``pipe_resource`` pointer per binding (``lvp_UpdateDescriptorSets``), and binding a set copies
every binding of its layout into the llvmpipe state, taking a reference on each
(``handle_set_stage`` -> ``set_shader_buffers`` -> ``pipe_resource_reference``), used by the
shader or not. ggml-vulkan has one layout of 12 storage buffers for all shaders, reuses its
descriptor sets from compute to compute (index reset per graph) and writes only the first
``parameter_count`` bindings (``ggml_vk_dispatch_pipeline``), which the Vulkan spec allows. So
after a compute buffer is destroyed, a set that held it in a binding the next shader does not
write still names it, and the next bind of that set increments and later drops the count of
freed memory: glibc's tcache pointer there is corrupted (``malloc(): unaligned tcache chunk``,
``corrupted double-linked list``) or the resource is freed twice. At the same length the same
dispatch sequence rewrites the same bindings, and kept graphs keep the buffers alive, which is
why only frees followed by other lengths aborted. ``tests/vulkan/test_free.py`` triggers it with
two ops (two soft_max, freed; then soft_max and scale): 7 of 7 runs aborted within 1-7
iterations; the same with the graphs kept, or the same ops each time, never did.

The library's fix (``Backend.release``): on lavapipe, compute buffers are freed only after the
backend's ggml context (its descriptor pools) is gone: ``clear_cache()`` starts the context
again, ``close()`` frees it, evictions park their buffers until then.

Measured on the tiny test model (10 split decodes per run). Before the fix: clear 2 of 4, 3 of 4,
2 of 4 and 4 of 4 runs aborted in four rounds of 4 (SIGABRT, mostly within the first calls); keep 0 of
4 in one round, and in another 3 of 4 completed and 1 passed the time limit on a machine starved
by other jobs; evict 2 of 4 (both on the 9th call). With it: clear 0 of 12, evict 0 of 8. Under valgrind (the two-op test),
the block read and freed again by a lavapipe thread was the 496-byte resource ``vkCreateBuffer``
made for a graph's compute buffer in ``ggml_gallocr_alloc_graph``.
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
        n = 8 + i if sys.argv[2] == "evict" else 8 + i % 3
        codes = np.stack([rng.integers(0, s, n) for s in sizes])
        c.decode(codes)
        print("call", i, flush=True)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--mode", choices=("clear", "keep", "evict"), default="clear")
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

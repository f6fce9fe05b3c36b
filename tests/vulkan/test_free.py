"""Freeing compute buffers and computing again (README, "Known problem on lavapipe").

Mesa 22.3's lavapipe references every binding of a descriptor set when the set is bound, and
ggml-vulkan reuses its sets, writing only the bindings each shader uses: a buffer freed while
the backend's ggml context lives was referenced again after its free, and the heap broke
within a few computes (glibc aborts). ``Backend.release`` parks such frees on lavapipe until
the context is gone. Each check runs in a child process: the bug kills the interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]

# Two soft_max (4 bindings each) fill descriptor sets 0 and 1; freed; then a soft_max and a
# scale (2 bindings): set 1's bindings 2 and 3 still name the freed buffer. Without the
# parking this aborted in each of 7 runs, within 1-7 iterations; with the graphs kept, or
# the same two ops every time, it did not (50 iterations, 2 runs each).
GRAPHS = """
import sys, types
import numpy as np
from pyggml_codec.backend import binding, runtime
from pyggml_codec.backend.ggml_graph import Graph

lib = binding.lib
backend = runtime.start_backend(sys.argv[1], 0, strict=True)
print("parks_frees", backend.parks_frees, flush=True)
for i in range(40):
    n = 16 + i
    graph = Graph(backend, 1 << 20, n_nodes=64)

    def build(b):
        x = binding.new_tensor(graph.ctx, binding.TYPE_F32, (n, 4))
        binding.set_name(x, "x")
        b.inputs.append((x, np.ones((4, n), np.float32)))
        y = lib.ggml_soft_max(graph.ctx, x)
        return {"out": lib.ggml_scale(graph.ctx, y, 2.0) if i % 2 else lib.ggml_soft_max(graph.ctx, y)}

    graph.build(build, types.SimpleNamespace(stages={}, inputs=[], lowerings={}))
    out = graph.run()["out"]
    graph.free()
    assert np.allclose(out, (2.0 if i % 2 else 1.0) / n), (i, out.ravel()[:4])
backend.free()
print("ok")
"""

# The codec: clear_cache() between decodes of 8-10 frames (the repro of tools/vulkan_free_repro.py),
# then six distinct lengths with the graphs kept (per-kind evictions), then clear_cache() again.
CODEC = """
import sys
import numpy as np
import pyggml_codec

rng = np.random.default_rng(0)
with pyggml_codec.load(sys.argv[2], backend=sys.argv[1], strict_backend=True, decode_path="split") as c:
    sizes = c.config.quantizer.codebook_sizes
    backend = c.engine.model.backend
    codes = {n: np.stack([rng.integers(0, s, n) for s in sizes]) for n in range(8, 14)}
    first = {}
    for n in (8, 9, 10, 8, 9, 10):
        c.clear_cache()
        audio = c.decode(codes[n])
        assert np.array_equal(audio, first.setdefault(n, audio)), n
        assert not backend._parked
    for n in range(8, 14):
        c.decode(codes[n])
    print("parked after evictions", len(backend._parked), flush=True)
    assert bool(backend._parked) == backend.parks_frees
    c.clear_cache()
    assert not backend._parked
    assert np.array_equal(c.decode(codes[9]), first[9])
print("ok")
"""


def _child(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          timeout=900, check=False)
    print(proc.stdout)
    return proc


def test_graphs_freed_between_computes_of_different_shaders(gpu_backend):
    """Freed graphs whose shaders bind different numbers of buffers: 40 iterations, each
    output checked (softmax of ones is 1/n), and the child exits cleanly."""
    proc = _child(GRAPHS, gpu_backend)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("ok"), (proc.returncode, proc.stderr[-2000:])


def test_codec_clear_cache_and_evictions(gpu_backend, tiny_model):
    """clear_cache() between decodes of other lengths, and evictions: same audio each time
    (bit-equal: same graph, same device), nothing parked after clear_cache()."""
    proc = _child(CODEC, gpu_backend, str(tiny_model.f32_path))
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("ok"), (proc.returncode, proc.stderr[-2000:])

"""One graph built and computed on a fresh CPU backend: the kernel tests' runner."""

from __future__ import annotations

from pyggml_codec.backend import runtime
from pyggml_codec.backend.ggml_graph import Graph
from pyggml_codec.graphs import ops


def run_cpu_graph(build, n_threads: int = 2, **options) -> dict:
    """``build(builder) -> {name: tensor}`` computed with ``n_threads`` threads: {name: array}.
    ``options``: the Builder's (``snake_kernel=True``, ``exact_kernels=True``, ...)."""
    backend = runtime.start_backend("cpu")
    backend.set_threads(n_threads)
    graph = Graph(backend, 64 << 20)
    try:
        graph.build(build, ops.Builder(ctx=graph.ctx, **options))
        return graph.run()
    finally:
        graph.free()
        backend.free()

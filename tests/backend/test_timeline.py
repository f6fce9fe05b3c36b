"""Graph.timeline: one compute of a whole graph with the compiled kernels' calls timed per thread.
Checked: every kernel's node is timed on every thread, in graph order behind ggml's barriers
(each timed op starts after the one before it ended on every thread), the callbacks are restored
afterwards (the next decode gives the same bits), and the refusals name their cause."""

from __future__ import annotations

import numpy as np
import pytest

import pyggml_codec
from parity import random_codes
from pyggml_codec.backend import kernels
from pyggml_codec.backend.binding import lib
from pyggml_codec.errors import GraphError

pytestmark = pytest.mark.skipif(not kernels.AVAILABLE, reason=f"no compiled kernels: {kernels.UNAVAILABLE_REASON}")

CODES = random_codes((64,) + (32,) * 9, 10, seed=6)


def kernel_names(graph) -> list:
    return [kernels.kernel_name(lib.ggml_graph_node(graph.gf, i)) for i in range(lib.ggml_graph_n_nodes(graph.gf))]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_every_kernel_timed_in_graph_order(tiny_model, threads):
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", n_threads=threads) as codec:
        want = codec.decode(CODES)
        graphs = list(codec.engine.cached_graphs().values())
        names = [kernel_names(g) for g in graphs]
        for graph in graphs:
            timeline = graph.timeline()
            timed = [n for n in timeline.nodes if n.enter]
            kernel_nodes = [n for n, name in zip(timeline.nodes, kernel_names(graph)) if name]
            print(f"{len(timeline.nodes)} nodes, {len(timed)} timed: {1e3 * timeline.seconds:.2f} ms, "
                  f"{1e3 * timeline.between:.2f} ms between the timed ops")
            assert [n.index for n in timed] == [n.index for n in kernel_nodes] and timed
            assert all(len(n.enter) == len(n.leave) == threads for n in timed)  # every thread ran each
            assert all(0 <= a <= b <= timeline.seconds for n in timed for a, b in zip(n.enter, n.leave))
            for before, after in zip(timed, timed[1:]):  # ggml's barrier after each node
                assert max(before.leave) <= min(after.enter), (before, after)
            assert 0 <= timeline.between <= timeline.seconds
            assert all(n.seconds >= n.spread >= 0 for n in timed)
        # the nodes run their own callbacks and userdata again
        assert [kernel_names(g) for g in graphs] == names
        np.testing.assert_array_equal(codec.decode(CODES), want)


def test_refusals(tiny_model, monkeypatch):
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu") as codec:
        codec.decode(CODES)
        graph = next(iter(codec.engine.cached_graphs().values()))
        monkeypatch.setattr(kernels, "AVAILABLE", False)
        with pytest.raises(GraphError, match="cannot time this graph's kernels: no compiled kernels"):
            graph.timeline()
        monkeypatch.undo()
        monkeypatch.setattr(kernels, "kernel_name", lambda node: None)  # as if no node ran a kernel
        with pytest.raises(GraphError, match="no node of this graph runs a compiled kernel"):
            graph.timeline()

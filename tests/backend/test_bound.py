"""Bound inputs: leaves whose memory the caller lends at every run (the key/value arena of
streamed attention), read and written in place, and refused when absent or ill-formed."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml_codec.backend import runtime
from pyggml_codec.backend.binding import lib
from pyggml_codec.backend.graph import BOUND_ALIGN, Graph
from pyggml_codec.errors import GraphError
from pyggml_codec.graphs import ops
from pyggml_codec.stream_state import aligned_zeros


@pytest.fixture()
def graph():
    backend = runtime.start_backend("cpu")
    backend.set_threads(2)
    g = Graph(backend, 16 << 20)

    def build(b):
        leaf = b.bound_input("rows", 8)
        new = b.input("new", np.full((3, 8), 7.0, np.float32))
        written = lib.ggml_set_rows(b.ctx, leaf, new, b.input("write", np.array([4, 5, 6], np.int64), ops.I64))
        return {"window": lib.ggml_get_rows(b.ctx, written, b.input("read", np.arange(2, 7, dtype=np.int32), ops.I32))}

    g.build(build, ops.Builder(ctx=g.ctx))
    yield g
    g.free()
    backend.free()


def test_bound_rows_are_written_and_read_in_place(graph):
    rows = aligned_zeros(10, 8)
    rows[:4] = np.arange(32).reshape(4, 8)
    out = graph.run({}, {"rows": rows})["window"]
    np.testing.assert_array_equal(out, np.concatenate([np.arange(16, 32).reshape(2, 8), np.full((3, 8), 7.0)]))
    np.testing.assert_array_equal(rows[4:7], 7.0)  # the chunk's rows landed in the lent memory
    other = aligned_zeros(10, 8)  # another run may lend other memory (another stream's)
    out = graph.run({"new": np.full((3, 8), 2.0, np.float32)}, {"rows": other})["window"]
    np.testing.assert_array_equal(out, np.concatenate([np.zeros((2, 8)), np.full((3, 8), 2.0)]))
    np.testing.assert_array_equal(rows[4:7], 7.0)
    assert [op for op, _, _ in graph.profile()]  # per node, on the memory last lent


def test_bound_inputs_refuse_missing_or_ill_formed_memory(graph):
    with pytest.raises(GraphError, match="without memory: rows"):
        graph.run({})
    with pytest.raises(GraphError, match="before any run"):
        graph.profile()
    rows = aligned_zeros(10, 8)
    raw = np.zeros(10 * 8 * 4 + BOUND_ALIGN + 4, np.uint8)
    start = (-raw.ctypes.data) % BOUND_ALIGN + 4
    misaligned = raw[start:start + 320].view(np.float32).reshape(10, 8)
    for bad in (rows.astype(np.float64), rows[:, :4], np.asfortranarray(rows), misaligned, rows.reshape(-1)):
        with pytest.raises(GraphError, match="bound input rows"):
            graph.run({}, {"rows": bad})

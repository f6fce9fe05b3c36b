"""Bound inputs: leaves whose memory the caller lends at every run (the key/value arena of
streamed attention), read and written in place, and refused when absent or ill-formed."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml_codec.backend import runtime
from pyggml_codec.backend.binding import lib
from pyggml_codec.backend.ggml_graph import Graph
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
    with pytest.raises(GraphError, match="before any run"):
        graph.timeline()
    rows = aligned_zeros(10, 8)
    for bad in (rows.astype(np.float64), rows[:, :4], np.asfortranarray(rows), rows.reshape(-1)):
        with pytest.raises(GraphError, match="bound input rows"):
            graph.run({}, {"rows": bad})


def test_a_bound_leaf_of_stated_rows_is_lent_a_window():
    """A leaf that states its rows (one stream's key/value window) takes a slice of a larger
    array, written in place, and refuses a shorter one."""
    backend = runtime.start_backend("cpu")
    g = Graph(backend, 16 << 20)
    try:
        def build(b):
            leaf = b.bound_input("window", 8, rows=5)
            new = b.input("new", np.full((2, 8), 3.0, np.float32))
            at = b.input("at", np.array([3, 4], np.int64), ops.I64)
            return {"w": lib.ggml_cont(b.ctx, lib.ggml_set_rows(b.ctx, leaf, new, at))}

        g.build(build, ops.Builder(ctx=g.ctx))
        arena = aligned_zeros(12, 8)
        arena[6:9] = 1.0
        out = g.run({}, {"window": arena[6:11]})["w"]
        np.testing.assert_array_equal(out, np.concatenate([np.ones((3, 8)), np.full((2, 8), 3.0)]))
        np.testing.assert_array_equal(arena[9:11], 3.0)
        assert not arena[11].any() and not arena[:6].any()
        with pytest.raises(GraphError, match="5 rows of 8"):
            g.run({}, {"window": arena[6:10]})
    finally:
        g.free()
        backend.free()


def test_an_output_in_lent_memory_is_read_from_this_runs_memory():
    """An output that is a bound leaf's memory itself (rows written in place) is read from the
    memory lent at this run, never through a view of the placeholder made at build time."""
    backend = runtime.start_backend("cpu")
    g = Graph(backend, 16 << 20)
    try:
        def build(b):
            leaf = b.bound_input("window", 8, rows=4)
            at = b.input("at", np.array([1], np.int64), ops.I64)
            return {"w": lib.ggml_set_rows(b.ctx, leaf, b.input("new", np.full((1, 8), 5.0, np.float32)), at)}

        g.build(build, ops.Builder(ctx=g.ctx))
        assert g._host_outputs["w"] is None
        for fill in (1.0, 2.0):
            lent = aligned_zeros(4, 8)
            lent[:] = fill
            out = g.run({}, {"window": lent})["w"]
            np.testing.assert_array_equal(out, np.stack([np.full(8, fill), np.full(8, 5.0), *[np.full(8, fill)] * 2]))
    finally:
        g.free()
        backend.free()

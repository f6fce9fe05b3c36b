"""A graph's inputs and outputs on the CPU: copied by numpy through views of the host memory
(``binding.host_view``), with the conversions and the size check of ``binding.upload``, and
outputs that are copies, never views of memory the next run overwrites."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml_codec.backend import runtime
from pyggml_codec.backend.binding import lib
from pyggml_codec.backend.ggml_graph import Graph
from pyggml_codec.graphs import ops


@pytest.fixture(params=["host views", "ggml calls"])
def graph(request):
    backend = runtime.start_backend("cpu")
    g = Graph(backend, 16 << 20)

    def build(b):
        x = b.input("x", np.zeros((3, 4), np.float32))
        idx = b.input("idx", np.zeros(2, np.int32), ops.I32)
        return {"y": lib.ggml_scale(b.ctx, lib.ggml_get_rows(b.ctx, x, idx), 2.0)}

    g.build(build, ops.Builder(ctx=g.ctx))
    assert all(v is not None for v in g._host_inputs) and g._host_outputs["y"] is not None
    if request.param == "ggml calls":  # the path of backends whose memory is not the host's
        g._host_inputs = [None] * len(g._host_inputs)
        g._host_outputs = {name: None for name in g._host_outputs}
    yield g
    g.free()
    backend.free()


def test_inputs_are_converted_and_outputs_copied(graph):
    x = np.arange(12, dtype=np.float64).reshape(3, 4)  # converted to float32, as an upload does
    first = graph.run({"x": x, "idx": np.array([2, 0], np.int64)})["y"]
    np.testing.assert_array_equal(first, 2 * x[[2, 0]])
    assert first.dtype == np.float32
    second = graph.run({"x": -x, "idx": np.array([1, 1])})["y"]
    np.testing.assert_array_equal(second, -2 * x[[1, 1]])
    np.testing.assert_array_equal(first, 2 * x[[2, 0]])  # the first result is the caller's own


def test_an_input_of_the_wrong_size_is_refused(graph):
    with pytest.raises(ValueError, match="upload of 44 bytes into a tensor of 48 bytes"):
        graph.run({"x": np.zeros(11, np.float32)})

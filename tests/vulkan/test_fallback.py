"""The CPU fallback on a real device: ops pinned to the CPU move alone, the rest stays on the
device (the weight buffer is marked GGML_BACKEND_BUFFER_USAGE_WEIGHTS), as the scheduler
itself reports (``ggml_backend_sched_get_tensor_backend``); and the remembered fused failure."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import pyggml_codec
from pyggml_codec import GraphError
from pyggml_codec.backend import binding, runtime
from pyggml_codec.backend.ggml_graph import LAYOUT_OPS
from parity import random_codes, report

pytestmark = pytest.mark.gpu

FRAMES = 16
CPU = "CPU (fallback)"


def _codes(n: int = FRAMES) -> np.ndarray:
    return random_codes((64,) + (32,) * 9, n, seed=8)


def _compute(ops: dict[str, int]) -> int:
    return sum(n for op, n in ops.items() if op != "(layout)")


def _weight_readers(graph, weights: int, pinned: set[str]) -> tuple[int, list[str]]:
    """(unpinned nodes that read a tensor of the weight buffer, those of them the scheduler put
    off the device). ggml's rule: such a node runs where its weight lives (ROPE excepted)."""
    n, off = 0, []
    for i in range(binding.lib.ggml_graph_n_nodes(graph.gf)):
        node = binding.lib.ggml_graph_node(graph.gf, i)
        op = runtime.op_name(node)
        srcs = [node.contents.src[j] for j in range(binding.lib.GGML_MAX_SRC) if node.contents.src[j]]
        if op in pinned or op == "ROPE" or op in LAYOUT_OPS or not any(t.contents.buffer == weights for t in srcs):
            continue
        n += 1
        if graph.node_backend(node) != graph.backend.device_name:
            off.append(op)
    return n, off


def _print_placement(label: str, graph) -> dict[str, dict[str, int]]:
    placement = graph.placement()
    for where, ops in sorted(placement.items()):
        print(f"{label}: {where}: {_compute(ops)} compute nodes, {ops.get('(layout)', 0)} layout nodes; "
              f"{dict(sorted(ops.items()))}")
    print(f"{label}: graph splits {graph.n_splits}")
    return placement


@pytest.fixture(scope="module")
def reference(gpu_backend, tiny_model):
    with pyggml_codec.load(tiny_model.f32_path, backend=gpu_backend, strict_backend=True) as plain:
        assert binding.buffer_is_weights(plain.engine.model.buffer.buffer)
        return plain.decode(_codes(), decode_path="fused"), plain.device_name


def test_pinned_ops_leave_the_rest_on_the_device(gpu_backend, tiny_model, reference):
    """COL2IM_1D and TANH pinned to the CPU in the fused decode: the scheduler must run
    exactly the pinned compute nodes on the CPU and every other compute node on the device;
    the audio equals the plain device decode to rel RMS <= 1e-6 (both compute in F32)."""
    want, device = reference
    pinned = {"COL2IM_1D", "TANH"}
    with pytest.warns(RuntimeWarning, match=r"runs these ops on the CPU \(COL2IM_1D x\d+, TANH x\d+\)"):
        with pyggml_codec.load(tiny_model.f32_path, backend=gpu_backend, strict_backend=True, cpu_ops=pinned) as c:
            got = c.decode(_codes(), decode_path="fused")
            graph = c.engine.cached_graphs()[("fused", FRAMES)]
            placement = _print_placement("fused decode, COL2IM_1D + TANH pinned", graph)
            readers, off = _weight_readers(graph, c.engine.model.buffer.buffer, pinned)
    on_cpu, on_device = placement.get(CPU, {}), placement.get(device, {})
    n_pinned = sum(graph.cpu_nodes.values())
    assert {op for op in on_cpu if op != "(layout)"} == pinned, on_cpu
    assert _compute(on_cpu) == n_pinned
    assert not pinned & set(on_device) and on_device.get("MUL_MAT", 0) > 0
    assert _compute(on_device) > 10 * n_pinned  # the graph stayed on the device
    print(f"weight-reading nodes: {readers}, off the device: {off}")
    assert readers > 0 and off == []
    r, _ = report("pinned-op fused decode vs plain device decode", got, want)
    assert r <= 1e-6


def test_pinned_products_in_the_split_path(gpu_backend, tiny_model, reference):
    """MUL_MAT pinned to the CPU in the split decode: every product runs on the CPU, every
    other node that reads a weight stays on the device (ops between two products may follow
    them to the CPU: the scheduler's choice); rel RMS <= 1e-6."""
    want, device = reference
    with pytest.warns(RuntimeWarning, match=r"runs these ops on the CPU \(MUL_MAT x\d+\)"):
        with pyggml_codec.load(tiny_model.f32_path, backend=gpu_backend, strict_backend=True,
                               cpu_ops={"MUL_MAT"}, decode_path="split") as c:
            got = c.decode(_codes())
            for kind in ("latent", "wave"):
                graph = c.engine.cached_graphs()[(kind, FRAMES)]
                placement = _print_placement(f"split decode ({kind}), MUL_MAT pinned", graph)
                on_cpu, on_device = placement.get(CPU, {}), placement.get(device, {})
                readers, off = _weight_readers(graph, c.engine.model.buffer.buffer, {"MUL_MAT"})
                print(f"split decode ({kind}): weight-reading nodes {readers}, off the device: {off}")
                assert on_cpu.get("MUL_MAT", 0) == graph.cpu_nodes["MUL_MAT"] and "MUL_MAT" not in on_device
                assert readers > 0 and off == []
    r, _ = report("MUL_MAT-on-CPU split decode vs plain device decode", got, want)
    assert r <= 1e-6


def test_a_failed_fused_graph_is_remembered(gpu_backend, tiny_model, caplog):
    """A frame count whose fused graph fails is served by the split path on the device from
    then on (no second attempt), other frame counts stay fused. No op of this model fails on
    the device, so the failure is injected in the fused graph's builder, inside the same
    handler that catches a real allocation or compute failure."""
    with pyggml_codec.load(tiny_model.f32_path, backend=gpu_backend, strict_backend=True) as c:
        split = c.decode(_codes(), decode_path="split")
        build, attempts = c.graphs.fused_decode, []

        def failing(codes):
            attempts.append(codes.shape[1])
            if codes.shape[1] == FRAMES:
                raise GraphError("could not allocate the graph's compute buffer (injected)")
            return build(codes)

        c.graphs.fused_decode = failing
        with caplog.at_level(logging.WARNING, logger="pyggml_codec"):
            first = c.decode(_codes())
        assert f"fused decode of {FRAMES} frames failed" in caplog.text
        assert c.failed_fused_frames == {FRAMES} and ("fused", FRAMES) not in c.engine.cached_graphs()
        again = c.decode(_codes())
        other = c.decode(_codes(FRAMES - 4))
        assert attempts == [FRAMES, FRAMES - 4]  # no second fused attempt at FRAMES
        assert ("fused", FRAMES - 4) in c.engine.cached_graphs()
        samples = c.config.samples_per_frame
    np.testing.assert_array_equal(first, split)
    np.testing.assert_array_equal(again, split)
    assert other.shape == ((FRAMES - 4) * samples,)

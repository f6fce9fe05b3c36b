"""Backend discovery, selection and the visible CPU fallback (on whatever this build has)."""

from __future__ import annotations

import warnings

import pytest

import pyggml_codec
from pyggml_codec import BackendError, Precision
from pyggml_codec.backend import binding, runtime


def test_discovery_lists_the_cpu():
    devs = pyggml_codec.devices()
    assert any(d.backend == "cpu" for d in devs)
    assert pyggml_codec.available_backends()[0] == "cpu"
    for d in devs:
        print(f"{d.index}: {d.backend} {d.name} ({d.description}) {d.kind} {d.memory_total >> 20} MB")


@pytest.mark.parametrize("name", ["cuda", "metal", "vulkan"])
def test_missing_gpu_backend_falls_back_visibly(tiny_model, name):
    if name in pyggml_codec.available_backends():
        pytest.skip(f"this build has {name}")
    with pytest.warns(RuntimeWarning, match=f"backend '{name}' unavailable"):
        codec = pyggml_codec.load(tiny_model.f32_path, backend=name)
    with codec:
        assert codec.backend_name == "cpu"
        assert name in codec.fallback_reason
    with pytest.raises(BackendError, match=f"backend '{name}' unavailable"):
        pyggml_codec.load(tiny_model.f32_path, backend=name, strict_backend=True)


def test_auto_on_a_cpu_only_build_takes_the_cpu_quietly(tiny_model, monkeypatch):
    """A build without GPU backends has nothing to fall back from: no warning, the reason recorded."""
    monkeypatch.setattr(runtime, "available_backends", lambda: ("cpu",))
    monkeypatch.setattr(binding, "compiled_backends", lambda: set())
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pyggml_codec.load(tiny_model.f32_path, backend="auto", strict_backend=True) as codec:
            assert codec.backend_name == "cpu" and codec.device_name == "CPU"
            assert codec.fallback_reason == "this ggml build has no GPU backend"


def test_auto_with_gpu_backends_but_no_device_warns(tiny_model, monkeypatch):
    """A GPU build whose devices are all unusable falls back to the CPU with a warning naming them."""
    monkeypatch.setattr(runtime, "available_backends", lambda: ("cpu",))
    monkeypatch.setattr(binding, "compiled_backends", lambda: {"vulkan"})
    with pytest.warns(RuntimeWarning, match="backend 'auto' found no GPU .*vulkan.*using CPU"):
        with pyggml_codec.load(tiny_model.f32_path, backend="auto", strict_backend=True) as codec:
            assert codec.backend_name == "cpu"
            assert "vulkan" in codec.fallback_reason


def test_unknown_backend_names_the_choices():
    with pytest.raises(BackendError, match="unknown backend 'tpu'.*cpu, cuda, metal, vulkan"):
        runtime.start_backend("tpu")


# --------------------------------------------------------------------------- ops a backend rejects


class _RejectingBackend(runtime.Backend):
    """A CPU backend posing as a GPU backend that lacks some ops: graph-level behavior of a
    backend whose ``ggml_backend_supports_op`` says no (the math still runs on the CPU)."""

    def __init__(self, rejected: set[str]):
        super().__init__(runtime.lib.ggml_backend_cpu_init(), "fakegpu", owned=True, requested="fakegpu",
                         fallback_reason=None)
        self.rejected = rejected

    def supports(self, tensor) -> bool:
        return runtime.op_name(tensor) not in self.rejected


def _codes(n: int):
    from parity import random_codes

    return random_codes((64,) + (32,) * 9, n, seed=8)


def _audio():
    from parity import signal

    return signal(44100 + 555, seed=9)


def test_rejected_ops_run_on_the_cpu_through_the_scheduler(tiny_model):
    """Nodes a backend rejects are pinned to a CPU backend by ggml_backend_sched, never sent to
    the backend (where ggml would abort); the result equals the plain CPU run."""
    import numpy as np

    from pyggml_codec.codec import Codec
    from pyggml_codec.model.loader import load_model

    codes, x = _codes(12), _audio()
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", n_threads=1) as ref:
        want, want_codes = ref.decode(codes), ref.encode(x)
    backend = _RejectingBackend({"COL2IM_1D", "PAD", "TANH", "ROPE"})
    model = load_model(tiny_model.f32_path, backend, "all", Precision.F32, None, {"conv_transpose": "col2im"})
    with Codec(model) as codec:
        assert codec.decode_path == "auto" and codec.decode_chunk_frames is None  # a "GPU": fused, one-shot
        with pytest.warns(RuntimeWarning, match=r"backend fakegpu runs these ops on the CPU \(COL2IM_1D x\d+"):
            got = codec.decode(codes)
        assert "COL2IM_1D" in codec.lowerings["cpu_ops"]  # what the last graph built ran on the CPU
        with pytest.warns(RuntimeWarning, match=r"runs these ops on the CPU \(ROPE x\d+"):
            got_codes = codec.encode(x)
        graphs = dict(codec.engine.cached_graphs())
        assert ("fused", 12) in graphs and not codec.failed_fused_frames
        fused = graphs[("fused", 12)]
        assert fused.sched and fused.cpu_nodes["COL2IM_1D"] >= 1 and fused.compute_bytes > 0
        # The scheduler's own assignment covers every node. ggml's scheduler moves a pinned node
        # back to a higher-priority backend with the same buffer type (its pass 3), so on this
        # fake (a CPU posing as a GPU) nothing stays on the helper; tests/vulkan/test_fallback.py
        # checks the placement on a device with its own buffers.
        placement = fused.placement()
        print(f"fused graph placement: {placement}")
        assert sum(sum(ops.values()) for ops in placement.values()) == runtime.lib.ggml_graph_n_nodes(fused.gf)
        assert "(unassigned)" not in placement and placement["CPU"].get("COL2IM_1D", 0) == fused.cpu_nodes["COL2IM_1D"]
        assert binding.buffer_is_weights(model.buffer.buffer)
        with pytest.raises(pyggml_codec.GraphError, match="per-node profile needs a graph on one backend"):
            fused.profile()
        with pytest.raises(pyggml_codec.GraphError, match="a timeline needs a graph on one backend"):
            fused.timeline()
        again = codec.decode(codes)  # cached scheduled graph, computed again
    err = float(np.abs(got - want).max())
    print(f"scheduled decode vs CPU: max abs {err:.2e}; encode codes equal: {np.array_equal(got_codes, want_codes)}")
    assert err <= 1e-6
    np.testing.assert_array_equal(again, got)
    np.testing.assert_array_equal(got_codes, want_codes)


def test_cpu_ops_pins_named_ops_and_checks_the_names(tiny_model):
    import numpy as np

    codes = _codes(10)
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", n_threads=1) as ref:
        want = ref.decode(codes)
    with pytest.warns(RuntimeWarning, match=r"MUL_MAT x\d+"):
        with pyggml_codec.load(tiny_model.f32_path, backend="cpu", n_threads=1, cpu_ops=["mul_mat", "col2im_1d"],
                               lowerings={"matmul": "ggml"}) as c:  # products as ggml MUL_MAT nodes
            got = c.decode(codes)
            assert all(g.sched for g in c.engine.cached_graphs().values())
            assert "MUL_MAT" in c.lowerings["cpu_ops"]
    assert float(np.abs(got - want).max()) <= 1e-6
    with pytest.raises(ValueError, match=r"unknown ggml op name\(s\) \['CONV_9D'\]"):
        pyggml_codec.load(tiny_model.f32_path, backend="cpu", cpu_ops={"conv_9d"})

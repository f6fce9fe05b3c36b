"""Embedding in a host ggml application: shared reader, backend and weight tensors; several codecs."""

from __future__ import annotations

import ctypes
import logging

import gguf
import numpy as np
import pytest

import pyggml_codec
from parity import random_codes, report, signal
from pyggml_codec.backend import binding
from pyggml_codec.backend.binding import lib
from pyggml_codec.model.convert import write_merged_fixture


@pytest.fixture(scope="module")
def merged(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("merged")
    return {d: write_merged_fixture(tiny_model.path(d), out / f"merged_{d}.gguf") for d in ("f32", "f16")}


class HostApp:
    """What a host does: one reader, its own backend, all c.* tensors in its own buffer."""

    def __init__(self, path):
        self.reader = gguf.GGUFReader(path)
        self.backend = lib.ggml_backend_cpu_init()
        codec_tensors = [t for t in self.reader.tensors if t.name.startswith("c.")]
        params = lib.ggml_init_params(mem_size=(len(codec_tensors) + 4) * lib.ggml_tensor_overhead(),
                                      mem_buffer=None, no_alloc=True)
        self.ctx = lib.ggml_init(params)
        self.tensors = {}
        for t in codec_tensors:
            ne = [int(d) for d in t.shape]
            self.tensors[t.name] = getattr(lib, f"ggml_new_tensor_{len(ne)}d")(self.ctx, int(t.tensor_type), *ne)
        self.buffer = lib.ggml_backend_alloc_ctx_tensors(self.ctx, self.backend)
        for t in codec_tensors:
            binding.upload(self.tensors[t.name], np.asarray(t.data).reshape(-1))

    def close(self):
        lib.ggml_backend_buffer_free(self.buffer)
        lib.ggml_free(self.ctx)
        lib.ggml_backend_free(self.backend)


def test_reader_loaded_codec_equals_path_loaded(merged, tiny_model):
    codes = random_codes((64,) + (32,) * 9, 12, seed=1)
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu") as by_path:
        want = by_path.decode(codes)
    reader = gguf.GGUFReader(merged["f32"])
    with pyggml_codec.load(reader, backend="cpu") as by_reader:
        got = by_reader.decode(codes)
    report("merged reader vs codec-only path", got, want)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype,precision", [("f32", "f32"), ("f16", "s2cpp")])
def test_host_tensors_used_in_place(merged, dtype, precision):
    host = HostApp(merged[dtype])
    try:
        codes = random_codes((64,) + (32,) * 9, 12, seed=2)
        with pyggml_codec.load(merged[dtype], backend="cpu", precision=precision) as own:
            want = own.decode(codes)
            own_bytes = own.loaded_bytes
        with pyggml_codec.load(host.reader, backend=host.backend, precision=precision,
                               host_tensors=host.tensors) as shared:
            got = shared.decode(codes)
            n_shared, shared_bytes = len(shared.shared_tensors), shared.loaded_bytes
            assert shared.backend_name == "cpu"
        print(f"{dtype}/{precision}: {n_shared} tensors shared in place; own buffer {shared_bytes} "
              f"bytes vs {own_bytes} when loading alone")
        assert n_shared > 0 and shared_bytes < own_bytes
        np.testing.assert_array_equal(got, want)  # bit-identical on CPU
        # The host's backend and buffer survive codec.close(): read a weight back, run again.
        name = "c.decoder.model.0.conv.weight"
        np.testing.assert_array_equal(binding.download(host.tensors[name]).reshape(-1),
                                      np.asarray(host.reader.get_tensor(
                                          [t.name for t in host.reader.tensors].index(name)).data).reshape(-1))
        with pyggml_codec.load(host.reader, backend=host.backend, precision=precision,
                               host_tensors=host.tensors) as again:
            np.testing.assert_array_equal(again.decode(codes), want)
    finally:
        host.close()


def test_host_backend_not_freed(tiny_model):
    backend = lib.ggml_backend_cpu_init()
    try:
        for _ in range(2):
            with pyggml_codec.load(tiny_model.f32_path, backend=backend, n_threads=1) as codec:
                codec.decode(random_codes((64,) + (32,) * 9, 3, seed=3))
        assert lib.ggml_backend_name(backend) == b"CPU"
    finally:
        lib.ggml_backend_free(backend)


def test_two_codecs_side_by_side(tiny_model):
    """Different thread counts and precision modes, alive at once, each with its own result."""
    x = signal(3 * 44100, seed=4)
    codes = random_codes((64,) + (32,) * 9, 20, seed=5)
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", n_threads=1, precision="f32") as a:
        ref_a = a.decode(codes), a.encode(x)
    with pyggml_codec.load(tiny_model.f16_path, backend="cpu", n_threads=2, precision="s2cpp") as b:
        ref_b = b.decode(codes), b.encode(x)
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", n_threads=1, precision="f32") as a, \
            pyggml_codec.load(tiny_model.f16_path, backend="cpu", n_threads=2, precision="s2cpp") as b:
        for _ in range(2):
            np.testing.assert_array_equal(a.decode(codes), ref_a[0])
            np.testing.assert_array_equal(b.decode(codes), ref_b[0])
            np.testing.assert_array_equal(a.encode(x), ref_a[1])
            np.testing.assert_array_equal(b.encode(x), ref_b[1])
        assert (a.n_threads, b.n_threads) == (1, 2)
        b.n_threads = 1
        assert b.n_threads == 1
        np.testing.assert_array_equal(b.decode(codes), ref_b[0])
    report("f32 vs s2cpp decode (different on purpose)", ref_b[0], ref_a[0])
    assert not np.array_equal(ref_a[0], ref_b[0])


def test_logging_goes_to_logger_not_stdout(tiny_model, caplog, capfd):
    with caplog.at_level(logging.INFO, logger="pyggml_codec"):
        with pyggml_codec.load(tiny_model.f32_path, backend="cpu") as codec:
            codec.decode(random_codes((64,) + (32,) * 9, 2, seed=6))
    assert any("loaded" in r.getMessage() for r in caplog.records if r.name == "pyggml_codec")
    out, _ = capfd.readouterr()
    assert out == ""


@pytest.mark.parametrize("value, match", [(1, "got int"), ("w", "got str"), (np.zeros(4), "got ndarray"),
                                          (ctypes.POINTER(lib.ggml_tensor)(), "got NULL")])
def test_host_tensors_that_are_not_tensors_raise_type_error(tiny_model, value, match):
    """An int reached ggml's struct reads as a raw AttributeError."""
    with pytest.raises(TypeError, match=rf"host_tensors\['decoder.model.0.conv.weight'\] must be a ggml tensor.*{match}"):
        pyggml_codec.load(tiny_model.f32_path, backend="cpu", host_tensors={"decoder.model.0.conv.weight": value})
    with pytest.raises(TypeError, match="must map tensor names"):
        pyggml_codec.load(tiny_model.f32_path, backend="cpu", host_tensors=[value])

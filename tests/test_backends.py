"""Backend discovery, selection and the visible CPU fallback (on whatever this build has)."""

from __future__ import annotations

import warnings

import pytest

import pyggml_codec
from pyggml_codec import BackendError, runtime


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


def test_auto_without_gpu_is_cpu_without_warning(tiny_model):
    if len(pyggml_codec.available_backends()) > 1:
        pytest.skip("this build has a GPU backend")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pyggml_codec.load(tiny_model.f32_path, backend="auto") as codec:
            assert codec.backend_name == "cpu" and codec.fallback_reason is None
            assert codec.device_name == "CPU"


def test_unknown_backend_names_the_choices():
    with pytest.raises(BackendError, match="unknown backend 'tpu'.*cpu, cuda, metal, vulkan"):
        runtime.start_backend("tpu")

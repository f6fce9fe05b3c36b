"""The weight buffer advised to transparent huge pages (``binding.advise_huge_pages``): taken on
Linux for host memory, asked nowhere else, and never a change in any value."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import pyggml_codec
from pyggml_codec.backend import binding, runtime
from pyggml_codec.backend.ggml_graph import WeightBuffer

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _buffer(backend):
    buf = WeightBuffer(backend, 1)
    buf.new_tensor(binding.TYPE_F32, (1 << 20,))  # 4 MiB: holds a whole 2 MiB page
    buf.allocate()
    return buf


@pytest.mark.skipif(not (sys.platform.startswith("linux") and THP.exists()),
                    reason="needs Linux with transparent huge pages compiled in")
def test_a_fresh_host_weight_buffer_is_advised():
    backend = runtime.start_backend("cpu")
    buf = _buffer(backend)
    try:
        print(f"advised: {buf.huge_pages}; THP mode: {THP.read_text().strip()}")
        assert buf.huge_pages is True
        assert binding.advise_huge_pages(buf.buffer) is True  # advice again: harmless
    finally:
        buf.free()
        backend.free()


def test_nothing_is_asked_off_linux(monkeypatch):
    backend = runtime.start_backend("cpu")
    monkeypatch.setattr(sys, "platform", "darwin")
    buf = _buffer(backend)
    try:
        assert buf.huge_pages is False
    finally:
        buf.free()
        backend.free()


def test_the_advice_changes_no_value(tiny_model, monkeypatch):
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", n_threads=2) as c:
        codes = np.stack([np.random.default_rng(3).integers(0, s, 5) for s in c.config.quantizer.codebook_sizes])
        advised, want = c.info()["huge_pages"], c.decode(codes)
    monkeypatch.setattr(binding, "advise_huge_pages", lambda buffer: False)
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", n_threads=2) as c:
        assert c.info()["huge_pages"] is False
        got = c.decode(codes)
    print(f"advised {advised}, then not: max abs difference {float(np.abs(got - want).max())}")
    if sys.platform.startswith("linux") and THP.exists():
        assert advised is True
    np.testing.assert_array_equal(got, want)

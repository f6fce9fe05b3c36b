"""Long calls report their progress to a callback: decode per chunk in frames, a one-shot encode
per stage, a chunked encode per chunk in seconds of audio; the results are the same with or
without a callback."""

from __future__ import annotations

import numpy as np
import pytest

import pyggml_codec
from parity import random_codes, signal


@pytest.fixture(scope="module")
def codec(tiny_model):
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", n_threads=2) as c:
        yield c


def test_decode_reports_each_chunk_in_frames(codec):
    codes = random_codes(codec.config.quantizer.codebook_sizes, 70, seed=3)
    seen = []
    audio = codec.decode(codes, progress=seen.append)
    assert codec.decode_chunk_frames == 32
    assert [(p.task, p.done, p.total, p.unit) for p in seen] == [
        ("decode", 32, 70, "frames"), ("decode", 64, 70, "frames"), ("decode", 70, 70, "frames")]
    np.testing.assert_array_equal(audio, codec.decode(codes))
    seen.clear()
    codec.decode(codes[:, :9], progress=seen.append)  # one graph: one report
    assert [(p.done, p.total) for p in seen] == [(9, 9)]


def test_encode_reports_its_stages(codec):
    x = signal(5000, seed=2)
    seen = []
    codes = codec.encode(x, progress=seen.append)
    assert [(p.task, p.done, p.total, p.unit) for p in seen] == [
        ("encode", 1, 3, "stages"), ("encode", 2, 3, "stages"), ("encode", 3, 3, "stages")]
    np.testing.assert_array_equal(codes, codec.encode(x))


def test_encode_chunked_reports_seconds_of_audio(codec):
    rate = codec.sample_rate
    x = signal(int(2.5 * rate), seed=5)
    seen = []
    codes = codec.encode_chunked(x, chunk_seconds=1.0, progress=seen.append)
    assert [p.unit for p in seen] == ["s"] * 3 and all(p.task == "encode" for p in seen)
    done = [p.done for p in seen]
    assert done == sorted(done) and done[-1] == pytest.approx(2.5, abs=1 / rate)
    assert all(p.total == pytest.approx(2.5, abs=1 / rate) for p in seen)
    np.testing.assert_array_equal(codes, codec.encode_chunked(x, chunk_seconds=1.0))

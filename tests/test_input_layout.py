"""Audio arrays as users hold them: ``(n,)``, ``(channels, n)`` and soundfile's ``(n, channels)``,
read back from real files with ``soundfile.read``; shapes the layout rule cannot tell apart are
refused with both readings named; ``encode_chunked`` takes the same layouts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import soundfile as sf

import pyggml_codec
from pyggml_codec.errors import InputError
from pyggml_codec.inputs import MAX_CHANNELS, channel_axis, check_chunk_seconds

SR = 44100
SPF = 2048


@pytest.fixture(scope="module")
def codec(tiny_model):
    with pyggml_codec.load(tiny_model.f32_path, "cpu") as c:
        yield c


def _stereo(n: int) -> np.ndarray:
    t = np.arange(n) / SR
    return np.stack([0.4 * np.sin(2 * np.pi * 440 * t), 0.2 * np.sin(2 * np.pi * 1000 * t)], axis=1)


@pytest.mark.parametrize("ext, subtype", [("wav", "FLOAT"), ("flac", "PCM_16")])
def test_soundfile_stereo_encodes_as_the_mean_of_its_channels(codec, tmp_path, ext, subtype):
    n = 3 * SPF + 700
    sf.write(tmp_path / f"s.{ext}", _stereo(n), SR, subtype=subtype)
    x, rate = sf.read(tmp_path / f"s.{ext}", dtype="float32")
    assert x.shape == (n, 2)  # soundfile's layout: (frames, channels)
    codes = codec.encode(x, rate, mix="mean")
    assert codes.shape == (10, math.ceil(n / SPF))
    np.testing.assert_array_equal(codes, codec.encode(x.mean(axis=1)))
    np.testing.assert_array_equal(codes, codec.encode(np.ascontiguousarray(x.T), mix="mean"))
    with pytest.raises(InputError, match=rf"audio has 2 channels \(shape \({n}, 2\), read as \(n, channels\)\)"):
        codec.encode(x, rate)


@pytest.mark.parametrize("ext", ["wav", "flac"])
def test_soundfile_mono_encodes_in_each_layout(codec, tmp_path, ext):
    n = 2 * SPF + 33
    sf.write(tmp_path / f"m.{ext}", _stereo(n)[:, 0], SR)
    flat, _ = sf.read(tmp_path / f"m.{ext}", dtype="float32")
    column, _ = sf.read(tmp_path / f"m.{ext}", dtype="float32", always_2d=True)
    assert flat.shape == (n,) and column.shape == (n, 1)
    want = codec.encode(flat)
    assert want.shape == (10, math.ceil(n / SPF))
    for layout in (column, column.T, flat[None, :]):
        np.testing.assert_array_equal(codec.encode(layout), want)
    pcm, _ = sf.read(tmp_path / f"m.{ext}", dtype="int16", always_2d=True)
    np.testing.assert_array_equal(codec.encode(pcm), codec.encode(pcm[:, 0]))


def test_the_mix_averages_the_channel_axis_only(codec):
    """12.7 s of soundfile stereo with mix='mean' once gave (10, 1) codes: the mean ran over time."""
    n = int(12.7 * SR)
    x = _stereo(n).astype(np.float32)
    codes = codec.encode(x, mix="mean")
    assert codes.shape == (10, math.ceil(n / SPF))
    np.testing.assert_array_equal(codes, codec.encode(x.mean(axis=1)))


def test_chunked_encode_takes_soundfile_layout(codec):
    n = 5 * SPF + 100
    x = _stereo(n).astype(np.float32)
    got = codec.encode_chunked(x, chunk_seconds=2 * SPF / SR, mix="mean")
    np.testing.assert_array_equal(got, codec.encode_chunked(np.ascontiguousarray(x.T), chunk_seconds=2 * SPF / SR,
                                                            mix="mean"))
    assert got.shape == (10, math.ceil(n / SPF))
    with pytest.raises(InputError, match=r"read as \(n, channels\)"):
        codec.encode_chunked(x)


@pytest.mark.parametrize("shape", [(2, 3), (3, 2), (MAX_CHANNELS, MAX_CHANNELS), (100, 200), (200, 200)])
def test_shapes_the_rule_cannot_tell_name_both_readings(codec, shape):
    a, b = shape
    with pytest.raises(InputError) as info:
        codec.encode(np.zeros(shape, np.float32), mix="mean")
    text = str(info.value)
    assert f"{a} channels of {b} samples" in text and f"{a} samples of {b} channels" in text
    assert "(channels, n)" in text and "(n, channels)" in text
    with pytest.raises(InputError, match="cannot be read"):
        codec.encode_chunked(np.zeros(shape, np.float32), mix="mean")


@pytest.mark.parametrize("shape, axis", [((7,), None), ((1, 7), 0), ((7, 1), 1), ((1, 1), 0),
                                         ((2, MAX_CHANNELS + 1), 0), ((MAX_CHANNELS + 1, 2), 1),
                                         ((MAX_CHANNELS, 10**6), 0), ((10**6, MAX_CHANNELS), 1)])
def test_channel_axis_rule(shape, axis):
    assert channel_axis(shape) == axis


@pytest.mark.parametrize("value", [0, 0.0, -1.0, float("nan"), float("inf"), "10", None, True])
def test_chunk_seconds_must_be_a_positive_number(codec, value):
    with pytest.raises(InputError, match="chunk_seconds"):
        codec.encode_chunked(np.zeros(3000, np.float32), chunk_seconds=value)
    with pytest.raises(InputError):
        check_chunk_seconds(value)


def test_chunk_seconds_below_one_frame_is_one_frame():
    assert check_chunk_seconds(0.001) == 0.001 and check_chunk_seconds(np.float32(2)) == 2.0

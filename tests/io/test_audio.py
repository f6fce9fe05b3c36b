"""Audio I/O and resampling: downmix, the C++ linear resampler, soxr, atomic writes.

Frequency checks use the FFT peak of a 1 s sine; the bin width is 1 Hz, so a surviving
frequency lands within 1 Hz (the tolerance).
"""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from pyggml_codec.io.audio import AudioFileError, read_audio, resample, resample_linear, write_audio
from pyggml_codec.errors import CodecError


def sine(freq: float, rate: int, seconds: float = 1.0) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * freq * np.arange(int(seconds * rate)) / rate)).astype(np.float32)


def peak_hz(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum) * rate / len(x))


def linear_reference(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    """The C++ engine's loop, written out literally."""
    ratio = dst / src
    n = len(x)
    out = np.zeros(math.ceil(n * ratio), dtype=np.float64)
    for i in range(len(out)):
        p = i / ratio
        idx = math.floor(p)
        frac = p - idx
        if idx + 1 < n:
            out[i] = float(x[idx]) * (1 - frac) + float(x[idx + 1]) * frac
        elif idx < n:
            out[i] = float(x[idx])
    return out.astype(np.float32)


@pytest.mark.parametrize("src, dst", [(16000, 44100), (48000, 44100), (44100, 22050), (8000, 44100), (44100, 44101)])
def test_linear_equals_the_cpp_formula(src, dst):
    x = np.random.default_rng(src).standard_normal(997).astype(np.float32)
    got = resample_linear(x, src, dst)
    assert got.shape == (math.ceil(997 * dst / src),) and got.dtype == np.float32
    np.testing.assert_array_equal(got, linear_reference(x, src, dst))


@pytest.mark.parametrize("method", ["linear", "soxr"])
@pytest.mark.parametrize("src", [16000, 48000])
def test_stereo_file_resampled_keeps_length_and_frequency(tmp_path, src, method):
    left, right = sine(1000, src), sine(1000, src)
    sf.write(tmp_path / "in.wav", np.stack([left, right], axis=1), src, subtype="FLOAT")
    x, rate, channels = read_audio(tmp_path / "in.wav")
    assert (rate, channels, x.shape) == (src, 2, (src,))
    np.testing.assert_allclose(x, (left + right) / 2, atol=1e-7)
    y = resample(x, src, 44100, method)
    assert abs(len(y) - 44100) <= 1
    if method == "linear":
        assert len(y) == math.ceil(src * 44100 / src)
    assert abs(peak_hz(y[:44100], 44100) - 1000) <= 1.0


def test_downmix_is_the_channel_mean(tmp_path):
    data = np.stack([np.full(100, 0.5), np.full(100, -0.1), np.full(100, 0.2)], axis=1)
    sf.write(tmp_path / "three.flac", data, 8000)
    x, rate, channels = read_audio(tmp_path / "three.flac")
    assert channels == 3 and rate == 8000
    np.testing.assert_allclose(x, 0.2, atol=1e-4)  # 16-bit FLAC quantization


def test_read_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_audio(tmp_path / "missing.wav")
    (tmp_path / "bad.wav").write_bytes(b"RIFF not really")
    with pytest.raises(AudioFileError, match="cannot decode"):
        read_audio(tmp_path / "bad.wav")
    assert issubclass(AudioFileError, CodecError)


def test_soxr_missing_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "soxr", None)
    with pytest.raises(ImportError, match=r"pip install soxr"):
        resample(np.zeros(10, np.float32), 16000, 44100, "soxr")
    assert resample(np.zeros(10, np.float32), 16000, 44100, "linear").shape == (28,)


def test_resample_validates():
    with pytest.raises(ValueError, match="method"):
        resample(np.zeros(4), 1, 2, "cubic")
    with pytest.raises(ValueError, match="mono"):
        resample(np.zeros((2, 4)), 1, 2, "linear")
    same = resample(np.arange(4, dtype=np.float64), 44100, 44100)
    assert same.dtype == np.float32 and same.tolist() == [0, 1, 2, 3]


def test_write_is_atomic_and_warns_on_clipping(tmp_path):
    path = tmp_path / "out.wav"
    write_audio(path, sine(440, 8000), 8000)
    before = path.read_bytes()
    with pytest.raises(ValueError):
        write_audio(path, sine(440, 8000), 8000, subtype="ULAW")
    with pytest.raises(ValueError, match="sample rate"):
        write_audio(path, sine(440, 8000), -5)
    (tmp_path / "x.ogg").write_bytes(b"old")
    with pytest.raises(AudioFileError, match="OGG files cannot hold PCM_16"):  # libsndfile refuses the pair
        write_audio(tmp_path / "x.ogg", sine(440, 8000), 8000, subtype="PCM_16")
    assert path.read_bytes() == before and (tmp_path / "x.ogg").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.wav", "x.ogg"]
    loud = np.array([0.0, 1.5, -2.0, 0.5], np.float32)
    with pytest.warns(UserWarning, match="2 samples exceed"):
        write_audio(path, loud, 8000, subtype="PCM_16")
    assert np.abs(sf.read(path)[0]).max() <= 1.0
    with pytest.warns(UserWarning):
        write_audio(tmp_path / "f.wav", loud, 8000, subtype="FLOAT")
    np.testing.assert_array_equal(sf.read(tmp_path / "f.wav", dtype="float32")[0], loud)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_audio(tmp_path / "quiet.flac", np.zeros(16, np.float32), 8000, subtype="pcm16")
    assert sf.info(tmp_path / "quiet.flac").subtype == "PCM_16"


def test_write_and_resample_take_mono_finite_audio(tmp_path):
    x = sine(440, 8000)[:1000]
    for stereo in (np.stack([x, -x], 1), np.stack([x, -x])):  # was written as one interleaved track
        with pytest.raises(ValueError, match=r"mono audio of shape \(n,\), got \(.*\); downmix first"):
            write_audio(tmp_path / "s.wav", stereo, 8000)
        with pytest.raises(ValueError, match="mono audio"):
            resample(stereo, 8000, 16000)
    for bad in (np.nan, np.inf):  # NaN was written as -1.0 in PCM_16 files
        y = x.copy()
        y[3] = bad
        with pytest.raises(ValueError, match="1 NaN or Inf samples"):
            write_audio(tmp_path / "n.wav", y, 8000, subtype="PCM_16")
    assert not (tmp_path / "s.wav").exists() and not (tmp_path / "n.wav").exists()  # nothing written
    for column in (x[:, None], x[None, :]):  # one channel with its axis: written as (n,)
        write_audio(tmp_path / "c.wav", column, 8000)
        np.testing.assert_array_equal(sf.read(tmp_path / "c.wav", dtype="float32")[0], x)
    pcm = (x * 16384).astype(np.int16)  # int16 PCM reads as samples / 32768, as encode reads it
    write_audio(tmp_path / "i.wav", pcm, 8000)
    np.testing.assert_array_equal(sf.read(tmp_path / "i.wav", dtype="float32")[0], pcm / np.float32(32768))
    np.testing.assert_array_equal(resample(pcm, 8000, 16000, "linear"),
                                  resample(pcm.astype(np.float32) / 32768, 8000, 16000, "linear"))


def test_a_failing_write_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "out.wav"
    write_audio(path, sine(440, 8000), 8000)
    before = path.read_bytes()

    def broken_write(file, *args, **kwargs):
        Path(file).write_bytes(b"half a file")
        raise RuntimeError("disk full")

    monkeypatch.setattr(sf, "write", broken_write)
    with pytest.raises(AudioFileError, match="disk full"):
        write_audio(path, sine(220, 8000), 8000)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["out.wav"]


def _truncated(tmp_path: Path, name: str, keep: int | float, **write) -> Path:
    full = tmp_path / f"full_{name}"
    sf.write(full, sine(440, 44100), 44100, **write)
    data = full.read_bytes()
    cut = tmp_path / name
    cut.write_bytes(data[:keep] if isinstance(keep, int) else data[:int(len(data) * keep)])
    return cut


@pytest.mark.parametrize("name, keep, write", [
    ("first1000.wav", 1000, {"subtype": "PCM_16"}),
    ("half.wav", 0.5, {"subtype": "FLOAT"}),
    ("half.aiff", 0.5, {"subtype": "PCM_16"}),
])
def test_a_truncated_file_is_refused_unless_allowed(tmp_path, name, keep, write):
    path = _truncated(tmp_path, name, keep, **write)
    with pytest.raises(AudioFileError, match=r"truncated: the header declares 1\.00 s \(44100 frames\), the file holds 0\.\d+ s"):
        read_audio(path)
    with pytest.warns(UserWarning, match="truncated"):
        x, rate, _ = read_audio(path, allow_truncated=True)
    assert rate == 44100 and 0 < x.shape[0] < 44100


@pytest.mark.parametrize("ext, write", [("wav", {"subtype": "PCM_16"}), ("wav", {"subtype": "FLOAT"}), ("aiff", {}),
                                        ("flac", {}), ("ogg", {})])
def test_whole_files_read_without_a_warning(tmp_path, ext, write):
    sf.write(tmp_path / f"a.{ext}", np.stack([sine(440, 44100)] * 2, axis=1), 44100, **write)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x, rate, channels = read_audio(tmp_path / f"a.{ext}")
    assert x.shape == (44100,) and (rate, channels) == (44100, 2)


def test_a_streamed_wav_of_unknown_length_reads_whole(tmp_path):
    """A WAV written to a pipe carries 0xFFFFFFFF sizes: not a truncation."""
    sf.write(tmp_path / "s.wav", sine(440, 8000), 8000, subtype="PCM_16")
    data = bytearray((tmp_path / "s.wav").read_bytes())
    at = data.index(b"data")
    data[at + 4:at + 8] = b"\xff\xff\xff\xff"
    data[4:8] = b"\xff\xff\xff\xff"
    (tmp_path / "s.wav").write_bytes(bytes(data))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        x, _, _ = read_audio(tmp_path / "s.wav")
    assert x.shape == (8000,)

"""Audio files and resampling: soundfile read/write, downmix, two resamplers.

Arrays are float32, mono, shape ``(n,)``. Reading accepts any format the installed
libsndfile opens (WAV, FLAC, OGG/Vorbis, MP3 with libsndfile >= 1.1, AIFF, ...); stereo
and multichannel files are averaged to mono, as both upstream and the C++ engine do.

Two resamplers (S2_CODEC.md section 8.2):

* ``"soxr"`` - libsoxr, high quality (a dependency: a small wheel);
  close to upstream's windowed-sinc resampling;
* ``"linear"`` - the C++ engine's linear interpolation, reproduced exactly (see
  :func:`resample_linear`), for bit-level comparisons against that engine.
"""

from __future__ import annotations

import math
import os
import struct
import warnings
from pathlib import Path

import numpy as np

from .fileio import atomic_path
from ..errors import AudioFileError

RESAMPLE_METHODS = ("soxr", "linear")
SUBTYPES = {"FLOAT": "FLOAT", "PCM_16": "PCM_16", "float": "FLOAT", "pcm16": "PCM_16"}
SHORT_READ_SLACK = 4608  # frames (four MP3 frames) a libsndfile frame count may overstate without truncation
_WAV_PLAIN_FORMATS = (1, 3, 6, 7, 0xFFFE)  # PCM, IEEE float, A-law, mu-law, extensible: bytes = frames * block align
_UNKNOWN_SIZES = (0, 0xFFFFFFFF)  # written by a stream that could not seek back


def read_audio(path: str | os.PathLike, *, allow_truncated: bool = False) -> tuple[np.ndarray, int, int]:
    """``(mono float32 (n,), original sample rate, original channel count)`` of a file.

    Multichannel audio is downmixed by the mean of the channels (the file's ``(n, channels)``
    frames averaged over channels, never over time). A missing file raises
    ``FileNotFoundError``; one libsndfile cannot decode raises :class:`AudioFileError`, and so
    does a truncated file: one holding fewer frames than its header declares (a WAV ``data``
    chunk or an AIFF ``COMM`` count past the end of the file, an MP3 shorter than its Xing
    header says). ``allow_truncated=True`` reads what is there with a ``UserWarning`` instead.
    """
    import soundfile as sf

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such audio file")
    try:
        with sf.SoundFile(str(path)) as f:
            declared = f.frames
            data = f.read(dtype="float32", always_2d=True)  # (n, channels)
            rate = f.samplerate
    except (sf.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
        raise AudioFileError(f"{path}: cannot decode audio ({exc})") from None
    if data.shape[0] == 0:
        raise AudioFileError(f"{path}: the file holds no samples")
    header = header_frames(path)
    if header is not None:  # exact: a WAV data chunk or an AIFF frame count
        declared = max(declared, header)
    elif declared - data.shape[0] <= max(SHORT_READ_SLACK, declared // 100):
        declared = data.shape[0]  # libsndfile's count may be an estimate (an MP3 without a Xing header)
    if data.shape[0] < declared:
        text = (f"{path}: truncated: the header declares {declared / rate:.2f} s ({declared} frames), "
                f"the file holds {data.shape[0] / rate:.2f} s")
        if not allow_truncated:
            raise AudioFileError(text + " (allow_truncated=True, or --allow-truncated, reads what is there)")
        warnings.warn(f"pyggml_codec: {text}; reading what is there", UserWarning, stacklevel=2)
    channels = int(data.shape[1])
    mono = data[:, 0] if channels == 1 else data.mean(axis=1, dtype=np.float64)
    return np.ascontiguousarray(mono, dtype=np.float32), int(rate), channels


def header_frames(path: str | os.PathLike) -> int | None:
    """The frame count a WAV or AIFF header declares (WAV: ``data`` chunk size over block align,
    uncompressed formats only; AIFF: the ``COMM`` chunk's count); None for other files or when
    the header does not say (a streamed WAV's 0 or 0xFFFFFFFF size)."""
    with open(path, "rb") as f:
        head = f.read(12)
        if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
            order = "<"
        elif head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
            order = ">"
        else:
            return None
        fmt = None
        for _ in range(64):  # chunks before the audio: fmt, fact, LIST, PEAK, ...
            chunk = f.read(8)
            if len(chunk) < 8:
                return None
            cid, size = chunk[:4], struct.unpack(order + "I", chunk[4:])[0]
            if cid in (b"fmt ", b"COMM"):
                body = f.read(size + (size & 1))
                if cid == b"COMM" and len(body) >= 6:
                    return struct.unpack(">I", body[2:6])[0]
                if cid == b"fmt " and len(body) >= 14:
                    fmt = struct.unpack("<HHIIH", body[:14])
                continue
            if cid == b"data":
                if fmt is None or fmt[0] not in _WAV_PLAIN_FORMATS or not fmt[4] or size in _UNKNOWN_SIZES:
                    return None
                return size // fmt[4]
            f.seek(size + (size & 1), os.SEEK_CUR)
    return None


def resample(x: np.ndarray, src: int, dst: int, method: str = "soxr") -> np.ndarray:
    """Resample mono ``x`` ``(n,)`` from ``src`` Hz to ``dst`` Hz; float32 out (int16 PCM is read as
    samples / 32768, as ``encode`` reads it).

    ``method="soxr"`` (high quality, the default) or
    ``"linear"`` (the C++ engine's interpolation, exact). Equal rates return a float32 copy.
    """
    if method not in RESAMPLE_METHODS:
        raise ValueError(f"method must be one of {RESAMPLE_METHODS}, got {method!r}")
    if int(src) < 1 or int(dst) < 1:
        raise ValueError(f"sample rates must be positive, got {src} -> {dst}")
    x = _mono(x, "resample")
    if int(src) == int(dst):
        return np.array(x, dtype=np.float32)
    if method == "linear":
        return resample_linear(x, int(src), int(dst))
    return _soxr().resample(np.asarray(x, dtype=np.float32), int(src), int(dst), quality="HQ").astype(np.float32)


def _mono(x, what: str) -> np.ndarray:
    """Mono audio ``(n,)`` (or ``(n, 1)``, ``(1, n)``), int16 PCM scaled to float32 by 1 / 32768 (as
    ``encode`` and soundfile read it); ValueError for more channels (a multi-channel array would be
    written or resampled as one interleaved track)."""
    x = np.asarray(x)
    if x.ndim == 2 and 1 in x.shape:
        x = x.reshape(-1)
    if x.ndim != 1:
        raise ValueError(f"{what} expects mono audio of shape (n,), got {x.shape}; downmix first")
    if x.dtype == np.int16:
        return x.astype(np.float32) / np.float32(32768.0)
    return x


def _soxr():
    try:
        import soxr
    except ImportError as exc:
        raise ImportError(
            "resampling with method='soxr' needs the soxr package, a dependency of pyggml_codec that is "
            "missing here: pip install soxr "
            "(or use method='linear', the C++ engine's interpolation)"
        ) from exc
    return soxr


def resample_linear(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    """The C++ engine's linear resampler, vectorized, in float64 like the original.

    ratio = dst / src; out_len = ceil(n * ratio); output sample i reads position
    p = i / ratio, idx = floor(p), frac = p - idx, and takes
    ``x[idx] * (1 - frac) + x[idx + 1] * frac`` when idx + 1 < n, ``x[idx]`` when
    idx < n, else 0.
    """
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    ratio = float(dst) / float(src)
    out_len = math.ceil(n * ratio)
    p = np.arange(out_len, dtype=np.float64) / ratio
    idx = np.floor(p).astype(np.int64)
    frac = p - idx
    padded = np.concatenate([x, np.zeros(2)])  # x[idx + 1] for idx = n - 1 reads a 0, masked below
    safe = np.minimum(idx, n)
    interp = padded[safe] * (1.0 - frac) + padded[safe + 1] * frac
    out = np.where(idx + 1 < n, interp, np.where(idx < n, padded[safe], 0.0))
    return out.astype(np.float32)


def write_audio(path: str | os.PathLike, x: np.ndarray, rate: int, subtype: str = "FLOAT") -> Path:
    """Write mono ``x`` ``(n,)`` atomically (temp file in the same folder, then ``os.replace``).

    The container follows the extension (``.wav``, ``.flac``, ...). ``subtype``: "FLOAT"
    (32-bit float, lossless for the decoder's output) or "PCM_16" (also spelled "float",
    "pcm16"). Samples outside [-1, 1] are kept as they are in FLOAT files and clipped in
    PCM_16 files; either way a ``UserWarning`` gives their count. int16 PCM is read as samples / 32768.
    ValueError for another shape than ``(n,)`` or for NaN or Inf samples.
    """
    import soundfile as sf

    if subtype not in SUBTYPES:
        raise ValueError(f"subtype must be one of {sorted(set(SUBTYPES.values()))}, got {subtype!r}")
    subtype = SUBTYPES[subtype]
    if int(rate) < 1:
        raise ValueError(f"sample rate must be positive, got {rate}")
    path = Path(path)
    fmt = audio_format(path)
    if not sf.check_format(fmt, subtype):
        raise AudioFileError(f"{path}: {fmt} files cannot hold {subtype} samples")
    x = np.asarray(_mono(x, "write_audio"), dtype=np.float32)
    bad = int(np.count_nonzero(~np.isfinite(x)))
    if bad:
        raise ValueError(f"{path}: {bad} NaN or Inf samples; audio files hold finite samples")
    over = int(np.count_nonzero(np.abs(x) > 1.0))
    if over:
        warnings.warn(f"pyggml_codec: {over} samples exceed [-1, 1] and will clip", UserWarning, stacklevel=2)
        if subtype != "FLOAT":
            x = np.clip(x, -1.0, 1.0)
    try:
        with atomic_path(path) as tmp:
            sf.write(str(tmp), x, int(rate), subtype=subtype, format=fmt)
    except (sf.LibsndfileError, RuntimeError, TypeError) as exc:
        raise AudioFileError(f"{path}: cannot write {fmt} {subtype} audio ({exc})") from None
    return path


def audio_format(path: str | os.PathLike) -> str:
    """The libsndfile major format an extension names (``.wav`` -> "WAV"); ValueError if none."""
    import soundfile as sf

    ext = Path(path).suffix.lower().lstrip(".")
    formats = {k.lower(): k for k in sf.available_formats()}
    formats.setdefault("aif", "AIFF")
    formats.setdefault("oga", "OGG")
    if ext not in formats:
        raise ValueError(f"{path}: unknown audio extension {Path(path).suffix!r} (try .wav or .flac)")
    return formats[ext]

"""What callers pass to encode/decode and get back: the option values, the validation that runs
before any ggml call, and :class:`EncodeResult`.

Each check raises :class:`InputError` naming the problem, so that nothing malformed ever
reaches a ggml assertion (which would abort the interpreter).
"""

from __future__ import annotations

import operator
import warnings
from dataclasses import dataclass, field

import numpy as np

from .errors import InputError
from .model.config import CodecConfig

PAD_POLICIES = ("code_frame", "frame_length")

# Refuse work whose activations would not fit in memory. The largest one-shot buffers
# grow linearly with length (decoder im2col columns) and quadratically in the encoder
# transformer's dense attention; these limits keep a one-shot graph under a few GB.
MAX_DECODE_FRAMES = 2048  # about 95 s of audio at 21.5 frames/s
MAX_ENCODE_SECONDS = 120.0


@dataclass
class EncodeResult:
    """What :meth:`Codec.encode_details` (codes, margins) and :meth:`Codec.encode_stages` (and stages) give."""

    codes: np.ndarray  # (n_codebooks, T) int32
    margins: np.ndarray  # (n_codebooks, T) float32: best minus second-best cosine
    stages: dict[str, np.ndarray] = field(default_factory=dict)


def _as_array(value, what: str) -> np.ndarray:
    """``np.asarray(value)``; ragged or unconvertible input is an InputError, not a bare ValueError."""
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise InputError(f"{what} cannot be read as an array ({exc})") from None


def check_codes(codes, cfg: CodecConfig, on_invalid: str = "clamp", max_frames: int | None = MAX_DECODE_FRAMES) -> np.ndarray:
    """Codes as int32 ``(n_codebooks, T)``; out-of-range values clamped (warned) or refused.

    ``max_frames=None`` lifts the one-shot length limit (windowed and streamed decodes).
    """
    if on_invalid not in ("clamp", "raise"):
        raise ValueError(f"on_invalid_codes must be 'clamp' or 'raise', got {on_invalid!r}")
    arr = _as_array(codes, "codes")
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise InputError(f"codes must be integers, got dtype {arr.dtype}")
    if arr.ndim == 3 and arr.shape[0] == 1:
        arr = arr[0]
    n_cb = cfg.n_codebooks
    if arr.ndim != 2 or arr.shape[0] != n_cb:
        raise InputError(f"codes must have shape ({n_cb}, T) or (1, {n_cb}, T), got {arr.shape}")
    if arr.shape[1] == 0:
        raise InputError("codes are empty (T = 0)")
    if max_frames is not None and arr.shape[1] > max_frames:
        raise InputError(
            f"{arr.shape[1]} frames exceed the one-shot decode limit of {max_frames}; "
            "decode in chunks with codec.stream_decoder()"
        )
    if arr.dtype == np.uint64:  # values past int64 stay "too large" instead of wrapping negative
        arr = np.minimum(arr, np.iinfo(np.int64).max)
    return _clamp(arr.astype(np.int64), cfg, on_invalid)


def _clamp(arr: np.ndarray, cfg: CodecConfig, on_invalid: str) -> np.ndarray:
    sizes = np.asarray(cfg.quantizer.codebook_sizes, dtype=np.int64)[:, None]
    bad = np.count_nonzero((arr < 0) | (arr >= sizes), axis=1)
    counts = {cb: int(n) for cb, n in enumerate(bad) if n}
    out = np.clip(arr, 0, sizes - 1).astype(np.int32)
    if counts:
        detail = ", ".join(f"codebook {cb}: {n}" for cb, n in counts.items())
        if on_invalid == "raise":
            raise InputError(f"codes out of range ({detail}); sizes are {list(cfg.quantizer.codebook_sizes)}")
        warnings.warn(f"pyggml_codec: clamped out-of-range codes ({detail})", RuntimeWarning, stacklevel=4)
    return out


def _check_rate(sample_rate, cfg: CodecConfig) -> None:
    if sample_rate is None:
        return
    try:
        rate = operator.index(sample_rate)  # int and numpy integers
    except TypeError:
        if not (isinstance(sample_rate, float) and sample_rate.is_integer()):
            raise InputError(f"sample_rate must be a whole number of Hz, got {sample_rate!r}") from None
        rate = int(sample_rate)
    if rate != cfg.sample_rate:
        raise InputError(
            f"sample rate {sample_rate} Hz differs from the model's {cfg.sample_rate} Hz; "
            "resample first (pyggml_codec.io.audio.resample)"
        )


def check_audio(audio, cfg: CodecConfig, sample_rate: int | None, mix: str | None,
                max_seconds: float | None = MAX_ENCODE_SECONDS) -> np.ndarray:
    """Audio as contiguous float32 ``(n,)``: dtype, rank, channels, rate and values checked.

    Every check that needs no copy (dtype, rank, channels, length) comes before the first
    conversion, so a huge or malformed array is refused without allocating anything.
    """
    if mix not in (None, "mean"):
        raise ValueError(f"mix must be None or 'mean', got {mix!r}")
    _check_rate(sample_rate, cfg)
    arr = _as_array(audio, "audio")
    if arr.dtype not in (np.float32, np.float64, np.int16):
        raise InputError(f"audio must be float32, float64 or int16, got dtype {arr.dtype}")
    if arr.ndim not in (1, 2):
        raise InputError(f"audio must be 1-D (n,) or 2-D (channels, n), got shape {arr.shape}")
    if arr.ndim == 2 and (arr.shape[0] == 0 or (arr.shape[0] != 1 and mix != "mean")):
        raise InputError(f"audio has {arr.shape[0]} channels (shape {arr.shape}); downmix first or pass mix='mean'")
    n = arr.shape[-1]
    if n == 0:
        raise InputError("audio is empty")
    if max_seconds is not None and n > max_seconds * cfg.sample_rate:
        raise InputError(
            f"{n / cfg.sample_rate:.1f} s of audio exceeds the one-shot encode limit of "
            f"{max_seconds:.0f} s; encode it in chunks (codec.encode_chunked)"
        )
    if arr.dtype == np.int16:
        arr = arr.astype(np.float32) / np.float32(32768.0)
    if arr.ndim == 2:
        arr = arr[0] if arr.shape[0] == 1 else arr.mean(axis=0)
    if not np.all(np.isfinite(arr)):
        raise InputError(f"audio contains {int(np.count_nonzero(~np.isfinite(arr)))} NaN or Inf samples")
    return np.ascontiguousarray(arr, dtype=np.float32)

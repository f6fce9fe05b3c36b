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

from .checks import whole_number
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


def check_count(value, name: str, minimum: int) -> int:
    """``value`` as an int >= ``minimum`` (an integer type, or a float with no fraction), else ValueError
    naming ``name``: 1.9 frames would otherwise run as 1, and "x" fail inside int()."""
    count = whole_number(value)
    if count is None:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    if count < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return count


def check_invalid_policy(on_invalid: str) -> str:
    """``on_invalid_codes``: "clamp" or "raise", else ValueError."""
    if on_invalid not in ("clamp", "raise"):
        raise ValueError(f"on_invalid_codes must be 'clamp' or 'raise', got {on_invalid!r}")
    return on_invalid


def check_codes(codes, cfg: CodecConfig, on_invalid: str = "clamp", max_frames: int | None = MAX_DECODE_FRAMES,
                too_long: str = "the one-shot decode limit of {max}; decode in chunks with codec.stream_decoder()"
                ) -> np.ndarray:
    """Codes as int32 ``(n_codebooks, T)``; out-of-range values clamped (warned) or refused.

    ``max_frames=None`` lifts the one-shot length limit (windowed and streamed decodes); ``too_long``
    says what a longer T exceeds, and what to do instead.
    """
    check_invalid_policy(on_invalid)
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
        raise InputError(f"{arr.shape[1]} frames exceed {too_long.format(max=max_frames)}")
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


MAX_CHANNELS = 64  # a 2-D array's channel axis has at most this many entries

LAYOUT_RULE = (
    "a 2-D array is (channels, n) or (n, channels), as soundfile.read gives it: an axis of length 1 "
    f"is the channel axis (mono); otherwise the channel axis is the one of at most {MAX_CHANNELS} "
    "entries while the other is longer"
)


def channel_axis(shape: tuple[int, ...]) -> int | None:
    """The channel axis of audio of ``shape``: None for 1-D, 0 for ``(channels, n)``, 1 for
    ``(n, channels)``. The rule (``LAYOUT_RULE``): an axis of length 1 is the channel axis (mono);
    otherwise it is the axis of at most ``MAX_CHANNELS`` entries while the other is longer.
    A shape where both axes or neither fit is an InputError naming both readings.
    """
    if len(shape) == 1:
        return None
    a, b = shape
    if a == 1 or b == 1:
        return 0 if a == 1 else 1
    fits = [n <= MAX_CHANNELS for n in shape]
    if fits[0] != fits[1]:
        return 0 if fits[0] else 1
    why = (f"both have at most {MAX_CHANNELS} channels" if fits[0]
           else f"neither has at most {MAX_CHANNELS} channels")
    raise InputError(
        f"audio of shape {shape} cannot be read: as (channels, n) it is {a} channels of {b} samples, "
        f"as (n, channels) {a} samples of {b} channels, and {why}; pass mono (n,) audio, or more "
        f"than {MAX_CHANNELS} samples on one axis and at most {MAX_CHANNELS} channels on the other"
    )


def channels_first(audio, mix: str | None = None) -> np.ndarray:
    """``audio`` as an array ``(n,)`` or ``(channels, n)`` (a view, no copy) with its dtype, rank,
    emptiness and layout checked; ``(n, channels)`` input (soundfile's layout) is transposed.
    ``mix=None`` refuses more than one channel; ``mix="mean"`` accepts any count."""
    if mix not in (None, "mean"):
        raise ValueError(f"mix must be None or 'mean', got {mix!r}")
    arr = _as_array(audio, "audio")
    if arr.dtype.newbyteorder("=") not in (np.float32, np.float64, np.int16):  # either byte order
        raise InputError(f"audio must be float32, float64 or int16, got dtype {arr.dtype}")
    if arr.ndim not in (1, 2):
        raise InputError(f"audio must be 1-D (n,) or 2-D (channels, n) or (n, channels), got shape {arr.shape}")
    if arr.size == 0:
        if arr.ndim == 2 and arr.shape[0] == 0 and arr.shape[1] > 1:
            raise InputError(f"audio has 0 channels (shape {arr.shape})")
        raise InputError(f"audio is empty (shape {arr.shape})")
    shape, axis = arr.shape, channel_axis(arr.shape)
    if axis is None:
        return arr
    if axis == 1:
        arr = arr.T
    if arr.shape[0] != 1 and mix != "mean":
        layout = "(n, channels)" if axis == 1 else "(channels, n)"
        raise InputError(f"audio has {arr.shape[0]} channels (shape {shape}, read as {layout}); "
                         "downmix first or pass mix='mean'")
    return arr


def check_audio(audio, cfg: CodecConfig, sample_rate: int | None, mix: str | None,
                max_seconds: float | None = MAX_ENCODE_SECONDS, *, layout: str = "auto") -> np.ndarray:
    """Audio as contiguous float32 ``(n,)``: dtype, rank, channels, rate and values checked.

    Accepted layouts: ``(n,)``, ``(channels, n)`` and soundfile's ``(n, channels)``; the rule
    that tells the two 2-D layouts apart is ``LAYOUT_RULE`` (:func:`channel_axis`), and a
    shape it cannot tell is an InputError naming both readings. ``mix="mean"`` averages the
    channel axis only. ``layout="channels_first"``: ``audio`` is already ``(n,)`` or
    ``(channels, n)`` (a piece of :func:`channels_first`'s result), so no rule applies.

    Every check that needs no copy (dtype, rank, channels, length) comes before the first
    conversion, so a huge or malformed array is refused without allocating anything.
    """
    if mix not in (None, "mean"):
        raise ValueError(f"mix must be None or 'mean', got {mix!r}")
    _check_rate(sample_rate, cfg)
    if layout == "channels_first":
        arr = np.asarray(audio)
        if arr.ndim == 2 and arr.shape[0] != 1 and mix != "mean":
            raise InputError(f"audio has {arr.shape[0]} channels; downmix first or pass mix='mean'")
        if arr.size == 0:
            raise InputError("audio is empty")
    elif layout == "auto":
        arr = channels_first(audio, mix)
    else:
        raise ValueError(f"layout must be 'auto' or 'channels_first', got {layout!r}")
    n = arr.shape[-1]
    if max_seconds is not None and n > max_seconds * cfg.sample_rate:
        raise InputError(
            f"{n / cfg.sample_rate:.1f} s of audio exceeds the one-shot encode limit of "
            f"{max_seconds:.0f} s; encode it in chunks (codec.encode_chunked)"
        )
    if not arr.dtype.isnative:  # big-endian samples (a file's, read raw): the same values in this machine's order
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if arr.dtype == np.int16:
        arr = arr.astype(np.float32) / np.float32(32768.0)
    if arr.ndim == 2:
        arr = arr[0] if arr.shape[0] == 1 else arr.mean(axis=0)
    with np.errstate(over="ignore"):
        out = np.ascontiguousarray(arr, dtype=np.float32)
    if not np.all(np.isfinite(out)):  # one pass over the samples; which kind of sample, only to say so
        given = int(np.count_nonzero(~np.isfinite(arr)))
        if given:
            raise InputError(f"audio contains {given} NaN or Inf samples")
        raise InputError(f"audio has {int(np.count_nonzero(~np.isfinite(out)))} samples beyond float32's range "
                         f"(|x| > 3.4e38); samples are expected in about [-1, 1]")
    return out


def check_chunk_seconds(chunk_seconds) -> float:
    """``encode_chunked``'s ``chunk_seconds``: a finite number > 0 (it is rounded to whole code
    frames, at least one); InputError otherwise."""
    if isinstance(chunk_seconds, bool) or not isinstance(chunk_seconds, (int, float, np.integer, np.floating)):
        raise InputError(f"chunk_seconds must be a number of seconds > 0, got {chunk_seconds!r}")
    value = float(chunk_seconds)
    if not (value > 0 and np.isfinite(value)):
        raise InputError(f"chunk_seconds must be a finite number of seconds > 0, got {chunk_seconds!r}")
    return value

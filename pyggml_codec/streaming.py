"""Streaming: the exact stateful decoder, the C++ engine's windowed decode, chunked encode.

Every layer of the codec is causal, so decoding chunk by chunk with carried state equals
the one-shot decode (S2_CODEC.md section 7). The model builders are the one-shot ones,
built with a :class:`~pyggml_codec.graphs.ops.Carry` on the builder: each causal conv then takes
its left context, each conv-transpose its overlap tail and each attention layer its last
``window - 1`` keys and values from state inputs (on the CPU: from rows of a host arena the
graph reads and writes in place), and emits the next state as outputs. The state is
fixed-size from the first chunk (zeros = causal padding, masked key slots), so one graph per
chunk length serves a whole stream; ``stream_state.StreamStates`` keeps it and drives the graphs,
the engine (``engine.py``) makes it and runs the steps, and the decoders here own it.

:func:`decode_windowed` instead reproduces the C++ engine's schedule: re-decode a window
of ``history`` frames of context plus the new frames and keep only the new part
(approximate; about 20x to 150x the work of one pass).
"""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

from .engine import Engine
from .errors import InputError
from .inputs import (MAX_DECODE_FRAMES, PAD_POLICIES, EncodeResult, channels_first, check_audio,
                     check_chunk_seconds, check_codes, check_count, check_invalid_policy)
from .progress import ProgressCallback, report
from .stream_state import StreamSlot

Schedule = list[tuple[int, int, int, int]]  # (window start, window end, emit start, emit end), frames


# --------------------------------------------------------------------------- exact stream decode


class StreamDecoder:
    """Exact chunked decode: ``push(codes)`` gives the audio of exactly those frames.

    Concatenated pushes equal a one-shot :meth:`Codec.decode` of everything pushed (to
    float rounding: 1e-6 max abs in "f32" mode, tests/test_streaming.py). Use as a context
    manager or call :meth:`flush` at the end; both reset the stream. Graphs are cached per
    chunk length. Made by :meth:`Codec.stream_decoder`; it owns its stream's state
    (``Engine.new_streams``) and runs each push through ``Engine.decode_step``.
    """

    def __init__(self, engine: Engine, on_invalid_codes: str = "clamp", *, fused: bool = False, owner: object = None):
        if engine.check_open().parts == "encode":
            raise InputError("this codec was loaded with parts='encode'; decode needs parts='decode' or 'all'")
        self._engine = engine
        self._owner = owner  # the Codec that made it, kept alive while the decoder is (its finalizer closes the engine)
        self.on_invalid_codes = check_invalid_policy(on_invalid_codes)
        self.fused = fused
        self.last_compute_s = 0.0  # seconds inside ggml compute during the last push
        self._states = engine.new_streams(1)
        self._slot: StreamSlot | None = None
        self.reset()

    def reset(self) -> None:
        """Forget all carried state: the next push starts a new stream."""
        if self._slot is not None:
            self._states.free_slot(self._slot)
        self._slot = self._states.new_slot()
        self.frames_pushed = 0

    def push(self, codes) -> np.ndarray:
        """Codes ``(n_codebooks, n)``, any n >= 1 -> float32 audio of ``n * samples_per_frame``. A push
        of more than ``MAX_DECODE_FRAMES`` frames runs as pushes of at most that many, in turn; if one
        after the first fails, the stream is reset (the earlier pieces' state is not the caller's)."""
        engine = self._engine
        with engine.lock:
            engine.check_open()
            slot = self._slot
            codes = check_codes(codes, engine.config, self.on_invalid_codes, max_frames=None)
            pieces, self.last_compute_s = [], 0.0
            for start in range(0, codes.shape[1], MAX_DECODE_FRAMES):
                piece = codes[:, start:start + MAX_DECODE_FRAMES]
                try:
                    audio, pending, compute_s = engine.decode_step(self._states, [slot], piece, self.fused)
                except BaseException:
                    if pieces:
                        self.reset()
                    raise
                self._states.commit(slot, pending[0], piece.shape[1])
                self.frames_pushed += piece.shape[1]
                self.last_compute_s += compute_s
                pieces.append(audio.reshape(-1))
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def close(self) -> None:
        """End the stream (as :meth:`reset`, which the next push would start from) and give its
        key/value rows back to the engine, for the next new stream."""
        with self._engine.lock:  # not while a push on another thread still computes on the rows
            self._states.close()
            self._slot = None
            self.reset()

    def flush(self) -> np.ndarray:
        """The samples still held back (none: every layer is causal), then reset."""
        self.reset()
        return np.zeros(0, dtype=np.float32)

    def __enter__(self) -> "StreamDecoder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def stream_decode(decoder: StreamDecoder, chunks: Iterable) -> Iterator[np.ndarray]:
    """Yield the audio of each code chunk in turn through ``decoder`` (reset at the end)."""
    with decoder as sd:
        for chunk in chunks:
            yield sd.push(chunk)
        tail = sd.flush()
        if tail.size:
            yield tail


# --------------------------------------------------------------------------- C++ windowed decode


def windowed_schedule(n_frames: int, stride: int, history: int, holdback: int, live: bool = False) -> Schedule:
    """The C++ engine's decode windows for ``n_frames`` frames: (ws, we, emit_start, emit_end).

    Each step decodes frames [ws, we) with ws = max(0, committed - history) and emits
    [committed, stable), stable = we - holdback (all of it on the final flush).
    ``live=False`` is ``decode_codes_windowed`` (a step every ``stride`` frames, then a final
    flush); ``live=True`` is the live streaming loop: frames arrive one at a time and a step
    is tried whenever ``stride`` frames have arrived since the last decode that ran, so
    while nothing is stable every frame tries one.
    """
    schedule: Schedule = []
    committed = 0

    def step(avail: int, final: bool) -> bool:
        nonlocal committed
        if avail <= 0 or avail <= committed:
            return False
        stable = avail if final else max(0, avail - holdback)
        if not final and stable <= committed:
            return False
        ws = max(0, committed - history)
        schedule.append((ws, avail, committed, stable))
        committed = stable
        return True

    if live:
        last_decoded = 0
        for total in range(1, n_frames + 1):
            if total - last_decoded >= stride and step(total, False):
                last_decoded = total
        if n_frames > last_decoded or committed < n_frames:
            step(n_frames, True)
    else:
        avail = min(n_frames, stride)
        while avail < n_frames:
            step(avail, False)
            avail += stride
        step(n_frames, True)
    return schedule


def decode_windowed(codec, codes, stride: int | None = None, history: int | None = None,
                    holdback: int | None = None, low_latency: bool = False, live: bool = False,
                    return_schedule: bool = False, on_invalid_codes: str = "clamp"):
    """Decode like the C++ engine's windowed streaming (see :func:`windowed_schedule`).

    Defaults as in the engine: ``history`` = ``config.streaming_history_frames`` (144 for
    S2 Pro), ``holdback`` = ``history``, ``stride`` 16 offline and 4 live; ``low_latency``
    makes the defaults stride 1 and holdback 0. Returns the audio (T * samples_per_frame
    samples), or ``(audio, schedule)`` with ``return_schedule=True``.
    """
    cfg = codec.config
    codes = check_codes(codes, cfg, on_invalid_codes, max_frames=None)
    stride = (1 if low_latency else 4 if live else 16) if stride is None else check_count(stride, "stride", 1)
    history = cfg.streaming_history_frames if history is None else check_count(history, "history", 0)
    holdback = (0 if low_latency else history) if holdback is None else check_count(holdback, "holdback", 0)
    schedule = windowed_schedule(codes.shape[1], stride, history, holdback, live)
    spf = cfg.samples_per_frame
    pieces = []
    for ws, we, es, ee in schedule:
        pcm = codec.decode(codes[:, ws:we])
        pieces.append(pcm[(es - ws) * spf:(ee - ws) * spf])
    audio = np.concatenate(pieces)
    return (audio, schedule) if return_schedule else audio


# --------------------------------------------------------------------------- chunked encode


def encode_chunked(engine: Engine, audio, sample_rate: int | None = None, *, chunk_seconds: float = 10.0,
                   pad_to: str = "code_frame", mix: str | None = None, stages: bool = False,
                   progress: ProgressCallback | None = None) -> EncodeResult:
    """:meth:`Codec.encode` in chunks of about ``chunk_seconds`` with carried state.

    Memory stays flat with length (graphs are sized by the chunk, state by the windows);
    there is no length limit. Chunks are whole code frames, so every stride stays
    aligned; the last chunk is padded as ``pad_to`` says, so the codes are the one-shot
    encode's (up to near-ties). Gives the codes and margins; with ``stages=True`` also the
    concatenated "latent" (latent_dim, T_latent) and "pre_module" (T, dim). ``progress``
    receives ("encode", seconds done, seconds in all, "s") after each chunk.
    """
    if pad_to not in PAD_POLICIES:
        raise ValueError(f"pad_to must be one of {PAD_POLICIES}, got {pad_to!r}")
    cfg = engine.config
    chunk_seconds = check_chunk_seconds(chunk_seconds)
    arr = channels_first(audio, mix)  # (n,) or (channels, n), soundfile's (n, channels) transposed
    spf = cfg.samples_per_frame
    chunk = max(1, round(chunk_seconds * cfg.sample_rate / spf)) * spf
    unit = spf if pad_to == "code_frame" else cfg.frame_length
    total = -(-arr.shape[-1] // unit) * unit
    states = engine.new_streams(1)
    slot = states.new_slot()
    try:
        parts = _encode_chunks(engine, states, slot, arr, total, chunk, sample_rate, mix, stages, progress)
    finally:
        states.close()
    result = EncodeResult(codes=np.concatenate(parts["codes"], axis=1),
                          margins=np.concatenate(parts["margins"], axis=1))
    if stages:
        result.stages = {"latent": np.concatenate(parts["latent"], axis=1),
                         "pre_module": np.concatenate(parts["pre_module"])}
    return result


def _encode_chunks(engine, states, slot, arr, total: int, chunk: int, sample_rate, mix, stages: bool,
                   progress) -> dict[str, list]:
    """:func:`encode_chunked`'s chunks through one stream slot: each piece's codes and margins
    (and with ``stages`` its latent and pre-module frames), in order."""
    cfg = engine.config
    parts: dict[str, list] = {"codes": [], "margins": [], "latent": [], "pre_module": []}
    for start in range(0, total, chunk):
        stop = min(start + chunk, total)
        x = check_audio(arr[..., start:stop], cfg, sample_rate, mix, max_seconds=None, layout="channels_first")
        x = np.pad(x, (0, stop - start - x.shape[0]))
        with engine.lock:
            engine.check_open()
            latent, z = engine.encode_step(states, slot, x)
        codes, margins, _ = engine.quantize(z)
        parts["codes"].append(codes)
        parts["margins"].append(margins)
        if stages:
            parts["latent"].append(latent)
            parts["pre_module"].append(z)
        report(progress, "encode", min(stop, arr.shape[-1]) / cfg.sample_rate, arr.shape[-1] / cfg.sample_rate, "s")
    return parts

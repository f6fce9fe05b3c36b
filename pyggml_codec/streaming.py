"""Streaming: the exact stateful decoder, the C++ engine's windowed decode, chunked encode.

Every layer of the codec is causal, so decoding chunk by chunk with carried state equals
the one-shot decode (S2_CODEC.md section 7). The model builders are the one-shot ones,
built with a :class:`~pyggml_codec.graphs.ops.Carry` on the builder: each causal conv then takes
its left context, each conv-transpose its overlap tail and each attention layer its last
``window - 1`` keys and values from state inputs, and emits the next state as outputs.
The state is fixed-size from the first chunk (zeros = causal padding, masked key slots),
so one graph per chunk length serves a whole stream.

:func:`decode_windowed` instead reproduces the C++ engine's schedule: re-decode a window
of ``history`` frames of context plus the new frames and keep only the new part
(approximate; about 20x to 150x the work of one pass).
"""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

from .backend.graph import Graph
from .errors import InputError
from .graphs.build import ENCODER_CTX, FUSED_CTX, QUANTIZER_CTX, Build
from .graphs.transformer import history_mask
from .inputs import PAD_POLICIES, EncodeResult, check_audio, check_codes
from .model import vq

Schedule = list[tuple[int, int, int, int]]  # (window start, window end, emit start, emit end), frames


class _Stream:
    """One streamed graph kind and the state it carries between chunks.

    ``run`` computes one chunk; its new state is kept pending until ``commit``, so that a
    failure anywhere in a chain of graphs leaves every stage at the previous chunk.
    """

    def __init__(self, codec, kind: str, ctx_bytes: int):
        self.codec, self.kind, self.ctx_bytes = codec, kind, ctx_bytes
        self.arrays: dict[str, np.ndarray] = {}  # carried state by input name
        self.clock: dict[str, int] = {}  # positions input -> first position of the next chunk
        self._pending: tuple[dict, dict] | None = None
        self.graph: Graph | None = None  # the graph of the last chunk

    def run(self, n: int, build: Build, feed: dict[str, np.ndarray]) -> dict:
        graph = self.codec._graph((self.kind, n), self.ctx_bytes, build, streamed=True)
        self.graph = graph
        carry = graph.builder.stream
        inputs = {**feed, **self.arrays}
        clock = dict(self.clock)
        for pos, (mask, m, window) in carry.clocks.items():
            p0 = clock.get(pos, 0)
            inputs[pos] = np.arange(p0, p0 + m, dtype=np.int32)
            inputs[mask] = history_mask(m, window, p0)
            clock[pos] = p0 + m
        out = graph.run(inputs)
        states = {}
        for name in carry.outputs:
            states[name] = out.pop(name)
            if name in carry.appended:
                old = self.arrays.get(name, graph.input_array(name))
                states[name] = append_state(old, states[name], carry.appended[name])
        self._pending = (states, clock)
        return out

    def commit(self) -> None:
        if self._pending is not None:
            self.arrays, self.clock = self._pending
            self._pending = None


def append_state(old: np.ndarray, new: np.ndarray, axis: int) -> np.ndarray:
    """A carried history ``old`` with a chunk's ``new`` entries appended along ``axis``, cut to
    ``old``'s length (its last entries)."""
    new = new.reshape(old.shape[:axis] + (-1,) + old.shape[axis + 1:])
    n, length = new.shape[axis], old.shape[axis]

    def span(a: int, b: int) -> tuple:
        return (slice(None),) * axis + (slice(a, b),)

    out = np.empty_like(old)  # one copy: the kept entries of old, then new
    if n >= length:
        out[...] = new[span(n - length, n)]
    else:
        out[span(0, length - n)] = old[span(n, length)]
        out[span(length - n, length)] = new
    return out


# --------------------------------------------------------------------------- exact stream decode


class StreamDecoder:
    """Exact chunked decode: ``push(codes)`` gives the audio of exactly those frames.

    Concatenated pushes equal a one-shot :meth:`Codec.decode` of everything pushed (to
    float rounding: 1e-5 measured bound in "f32" mode). Use as a context manager or call
    :meth:`flush` at the end; both reset the stream. Graphs are cached per chunk length.
    """

    def __init__(self, codec, on_invalid_codes: str = "clamp", *, split: bool = False):
        if codec.parts == "encode":
            raise InputError("this codec was loaded with parts='encode'; decode needs parts='decode' or 'all'")
        self._codec = codec
        self.on_invalid_codes = on_invalid_codes
        self.fused = not split and codec._fused(codec.decode_path)
        self.last_compute_s = 0.0  # seconds inside ggml compute during the last push
        self.reset()

    def reset(self) -> None:
        """Forget all carried state: the next push starts a new stream."""
        self.frames_pushed = 0
        if self.fused:
            self._stages = [_Stream(self._codec, "stream-fused", FUSED_CTX)]
        else:
            self._stages = [_Stream(self._codec, "stream-latent", QUANTIZER_CTX),
                            _Stream(self._codec, "stream-wave", ENCODER_CTX)]

    def push(self, codes) -> np.ndarray:
        """Codes ``(n_codebooks, n)``, any n >= 1 -> float32 audio of ``n * samples_per_frame``."""
        codec = self._codec
        with codec._lock:
            codec._live()
            codes = check_codes(codes, codec.config, self.on_invalid_codes)
            feed = codec.graphs.codes_feed(codes)
            n = codes.shape[1]
            if self.fused:
                audio = self._stages[0].run(n, codec.graphs.fused_decode(codes), feed)["audio"]
            else:
                latent = self._stages[0].run(n, codec.graphs.latent_decode(codes), feed)["latent"]
                audio = self._stages[1].run(n, codec.graphs.wave_decode(latent.shape[1]), {"latent": latent})["audio"]
            for stage in self._stages:
                stage.commit()
            self.last_compute_s = sum(stage.graph.last_compute_s for stage in self._stages)
            self.frames_pushed += n
        return audio.reshape(-1)

    def flush(self) -> np.ndarray:
        """The samples still held back (none: every layer is causal), then reset."""
        self.reset()
        return np.zeros(0, dtype=np.float32)

    def __enter__(self) -> "StreamDecoder":
        return self

    def __exit__(self, *exc) -> None:
        self.reset()


def stream_decode(codec, chunks: Iterable, on_invalid_codes: str = "clamp") -> Iterator[np.ndarray]:
    """Yield the audio of each code chunk in turn (see :class:`StreamDecoder`)."""
    with StreamDecoder(codec, on_invalid_codes) as sd:
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
    stride = (1 if low_latency else 4 if live else 16) if stride is None else int(stride)
    history = cfg.streaming_history_frames if history is None else int(history)
    holdback = (0 if low_latency else history) if holdback is None else int(holdback)
    if stride < 1 or history < 0 or holdback < 0:
        raise ValueError(f"need stride >= 1, history >= 0, holdback >= 0; got {stride}, {history}, {holdback}")
    schedule = windowed_schedule(codes.shape[1], stride, history, holdback, live)
    spf = cfg.samples_per_frame
    pieces = []
    for ws, we, es, ee in schedule:
        pcm = codec.decode(codes[:, ws:we])
        pieces.append(pcm[(es - ws) * spf:(ee - ws) * spf])
    audio = np.concatenate(pieces)
    return (audio, schedule) if return_schedule else audio


# --------------------------------------------------------------------------- chunked encode


def encode_chunked(codec, audio, sample_rate: int | None = None, *, chunk_seconds: float = 10.0,
                   pad_to: str = "code_frame", mix: str | None = None, return_margins: bool = False,
                   return_stages: bool = False):
    """:meth:`Codec.encode` in chunks of about ``chunk_seconds`` with carried state.

    Memory stays flat with length (graphs are sized by the chunk, state by the windows);
    there is no length limit. Chunks are whole code frames, so every stride stays
    aligned; the last chunk is padded as ``pad_to`` says, so the codes are the one-shot
    encode's (up to near-ties). ``return_stages=True`` gives an :class:`EncodeResult` with
    the concatenated "latent" (latent_dim, T_latent) and "pre_module" (T, dim).
    """
    if pad_to not in PAD_POLICIES:
        raise ValueError(f"pad_to must be one of {PAD_POLICIES}, got {pad_to!r}")
    if codec.parts == "decode":
        raise InputError("this codec was loaded with parts='decode'; encode needs parts='encode' or 'all'")
    cfg = codec.config
    arr = np.asarray(audio)
    if arr.ndim not in (1, 2) or arr.shape[-1] == 0:
        check_audio(arr, cfg, sample_rate, mix)  # raises the one-shot error
    spf = cfg.samples_per_frame
    chunk = max(1, round(chunk_seconds * cfg.sample_rate / spf)) * spf
    unit = spf if pad_to == "code_frame" else cfg.frame_length
    total = -(-arr.shape[-1] // unit) * unit
    streams = (_Stream(codec, "stream-enc", ENCODER_CTX), _Stream(codec, "stream-enc2", QUANTIZER_CTX))
    parts: dict[str, list] = {"codes": [], "margins": [], "latent": [], "pre_module": []}
    for start in range(0, total, chunk):
        stop = min(start + chunk, total)
        x = check_audio(arr[..., start:stop], cfg, sample_rate, mix, max_seconds=None)
        x = np.pad(x, (0, stop - start - x.shape[0]))
        with codec._lock:
            codec._live()
            latent = streams[0].run(x.shape[0], codec.graphs.latent_encode(x), {"audio": x[None, :]})["latent"]
            latent = latent.reshape(cfg.encoder.latent_dim, -1)
            z = streams[1].run(latent.shape[1], codec.graphs.stage_encode(latent.shape[1]), {"latent": latent})
            for s in streams:
                s.commit()
        z = z["pre_module"].reshape(-1, cfg.quantizer.input_dim)
        codes, margins, _ = vq.residual_quantize(codec._model.vq_stages, z)
        parts["codes"].append(codes)
        parts["margins"].append(margins)
        if return_stages:
            parts["latent"].append(latent)
            parts["pre_module"].append(z)
    codes, margins = np.concatenate(parts["codes"], axis=1), np.concatenate(parts["margins"], axis=1)
    if return_stages:
        stages = {"latent": np.concatenate(parts["latent"], axis=1), "pre_module": np.concatenate(parts["pre_module"])}
        return EncodeResult(codes=codes, margins=margins, stages=stages)
    return (codes, margins) if return_margins else codes

"""The Codec: encode/decode orchestration, graph caches and fallbacks (no graph code: the
graphs come from ``graphs/build.py``).

The fused decode graph (non-CPU backends) is cached per frame count; a frame count whose
fused graph failed is remembered and served by the split path. Long CPU decodes run as an
exact stream of chunks (``streaming.py``).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Iterable, Iterator

import numpy as np

from .backend.graph import Graph, GraphCache
from .errors import ClosedError, GraphError, InputError
from .graphs.build import ENCODER_CTX, FUSED_CTX, QUANTIZER_CTX, Build, CodecGraphs
from .graphs.ops import Choices
from .inputs import DECODE_PATHS, MAX_DECODE_FRAMES, PAD_POLICIES, PRECISIONS, EncodeResult, check_audio, check_codes
from .model import vq
from .model.config import CodecConfig
from .model.loader import LoadedModel

if TYPE_CHECKING:
    from .batching import BatchStreamDecoder
    from .streaming import StreamDecoder

GRAPH_CACHE_SIZE = 4  # graphs kept in all on the CPU, per kind (distinct frame counts) elsewhere
BATCH_GRAPH_CACHE_SIZE = 12  # batched stream graphs: two stages x several (frames, streams) groups
DECODE_CHUNK_FRAMES = 32  # about 1.5 s: the split decode's chunk on CPU (Codec.decode_chunk_frames)


class Codec:
    """An S2 codec on one ggml backend. Create with :func:`pyggml_codec.load`.

    Thread safety: calls are serialized by a per-codec lock (ggml graphs and allocators
    are not reentrant); use one codec per thread for parallelism.
    """

    def __init__(self, model: LoadedModel, precision: str, decode_path: str = "auto"):
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        self._model = model
        self.precision = precision
        self.graphs = CodecGraphs(model, precision)
        self.decode_path = decode_path
        self._cache = GraphCache(GRAPH_CACHE_SIZE, per_kind=not model.backend.is_cpu)
        self._batch_cache = GraphCache(BATCH_GRAPH_CACHE_SIZE)  # batched stream steps, by (kind, n, streams)
        self.failed_fused_frames: set[int] = set()
        self._lock = threading.RLock()
        self.lowerings = Choices()  # every lowering the graphs built so far used (ops.Choices)
        # Compiled CPU kernels (kernels.py) where ggml is slow, when the lowering plan allows
        # them; set False (then clear_cache()) to run plain ggml ops, e.g. to compare the two.
        self.use_custom_kernels = True
        # Seconds inside ggml compute during the last encode/decode call (the rest of a call's
        # wall time is Python: validation, graph lookup, uploads, downloads, host VQ).
        self.last_compute_s = 0.0
        # Split-path decodes longer than this many frames run as an exact stream of chunks of
        # this length (streaming.StreamDecoder: same audio to float rounding), so the compute
        # buffer stays bounded by the chunk instead of growing with the input (one-shot: about
        # 4.3 MB per frame at full size). None decodes in one graph at any length (up to
        # inputs.MAX_DECODE_FRAMES), as the C++ engine does; the default on GPU backends and in
        # the s2cpp precision (whose point is the C++ engine's bits: its one graph per stage;
        # chunks move F16 roundings, 2e-4 rel RMS on the tiny model).
        self.decode_chunk_frames: int | None = (
            DECODE_CHUNK_FRAMES if model.backend.is_cpu and precision == "f32" else None)

    # ----------------------------------------------------------------- properties

    @property
    def config(self) -> CodecConfig:
        return self._live().config

    @property
    def backend_name(self) -> str:
        return self._live().backend.name

    @property
    def fallback_reason(self) -> str | None:
        return self._live().backend.fallback_reason

    @property
    def parts(self) -> str:
        return self._live().parts

    @property
    def loaded_bytes(self) -> int:
        return self._live().loaded_bytes

    @property
    def model_source(self) -> str:
        """The model file (or reader) this codec was loaded from."""
        return self._live().source

    @property
    def device_name(self) -> str:
        """ggml's name of the backend device, e.g. "CPU" or "CUDA0"."""
        return self._live().backend.device_name

    def compute_bytes(self) -> dict[str, int]:
        """Compute-buffer bytes of each cached graph, keyed by "kind/frames" (ggml's allocator)."""
        with self._lock:
            self._live()
            return {f"{key[0]}/{key[1]}": graph.compute_bytes for key, graph in self._cache.graphs.items()}

    @property
    def plan(self) -> dict:
        """The lowering chosen per op for this backend (see runtime.choose_lowerings)."""
        return dict(self._live().plan)

    @property
    def shared_tensors(self) -> frozenset[str]:
        """Weights used in place from the host (``load(host_tensors=...)``)."""
        return frozenset(self._live().shared)

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def n_threads(self) -> int:
        return self._live().backend.n_threads

    @n_threads.setter
    def n_threads(self, n: int) -> None:
        if int(n) < 1:
            raise ValueError(f"n_threads must be >= 1, got {n}")
        self._live().backend.set_threads(int(n))

    def _live(self) -> LoadedModel:
        if self._model is None or self._model.closed:
            raise ClosedError("this codec has been closed")
        return self._model

    # ----------------------------------------------------------------- lifetime

    def close(self) -> None:
        """Free graphs, weights and (if this codec started it) the backend. Idempotent."""
        with self._lock:
            if self._model is not None and not self._model.closed:
                self._cache.clear()
                self._batch_cache.clear()
                self._model.close()

    def __enter__(self) -> "Codec":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    def clear_cache(self) -> None:
        """Free cached graphs. Remembered fused-graph failures survive. On lavapipe the backend's
        ggml context is started again to free their buffers (``Backend.restart``)."""
        with self._lock:
            self._live()
            self._cache.clear()
            self._batch_cache.clear()
            self._model.backend.restart()

    # ----------------------------------------------------------------- graph building

    def _graph(self, key, ctx_bytes: int, build: Build, keep_stages: bool = False, streamed: bool = False,
               batch: int = 1) -> Graph:
        def make() -> Graph:
            self._live()
            graph = self.graphs.new_graph(ctx_bytes, build, keep_stages=keep_stages,
                                          custom_kernels=self.use_custom_kernels, streamed=streamed, batch=batch)
            self.lowerings.update(graph.builder.lowerings)
            return graph

        if keep_stages and self._model.backend.is_cpu:  # dumps are one-off on the CPU; cached elsewhere:
            return make()  # on lavapipe a freed graph's buffers stay parked to clear_cache() (Backend.release)
        if keep_stages:
            key = key + ("stages",)
        return (self._batch_cache if batch > 1 else self._cache).get(key, make)

    def _run(self, key, ctx_bytes: int, build: Build, feeds: dict,
             keep_stages: bool = False) -> dict[str, np.ndarray]:
        """Compute the (cached) graph ``key`` on ``feeds``; one-off stage graphs are freed after."""
        graph = self._graph(key, ctx_bytes, build, keep_stages)
        try:
            out = graph.run(feeds)
            self.last_compute_s += graph.last_compute_s
            return out
        finally:
            if keep_stages and self._model.backend.is_cpu:
                graph.free()

    # ----------------------------------------------------------------- decode

    def decode(self, codes, *, on_invalid_codes: str = "clamp", decode_path: str | None = None,
               return_stages: bool = False, dump: str | os.PathLike | None = None):
        """Codes ``(n_codebooks, T)`` (or ``(1, n_codebooks, T)``), any integer dtype ->
        float32 audio of ``T * samples_per_frame`` samples.

        Out-of-range codes are clamped per codebook with a warning giving the counts
        (``on_invalid_codes="raise"`` raises instead). ``decode_path`` forces "split" or
        "fused"; "auto" uses fused on GPU backends and split on CPU. With
        ``return_stages=True`` returns ``(audio, {stage name: array})``. ``dump=PATH`` also
        writes every stage to one ``.npz`` (see :mod:`pyggml_codec.diagnostics`).
        """
        if dump is not None:
            if return_stages:
                raise ValueError("dump= writes the stages; it does not combine with return_stages=True")
            from .io.dumps import dump_decode

            return dump_decode(self, codes, dump, on_invalid_codes=on_invalid_codes, decode_path=decode_path)
        path = decode_path or self.decode_path
        if path not in DECODE_PATHS:
            raise ValueError(f"decode_path must be one of {DECODE_PATHS}, got {path!r}")
        with self._lock:
            self.last_compute_s = 0.0
            model = self._live()
            if model.parts == "encode":
                raise InputError("this codec was loaded with parts='encode'; decode needs parts='decode' or 'all'")
            fused = self._fused(path)
            chunk = None if fused or return_stages else self._chunk_frames()
            codes = check_codes(codes, self.config, on_invalid_codes, max_frames=None if chunk else MAX_DECODE_FRAMES)
            n = codes.shape[1]
            if chunk and n > chunk:
                return self._decode_chunked(codes, chunk)
            if fused and n not in self.failed_fused_frames:
                try:
                    return self._decode_fused(codes, return_stages)
                except GraphError as exc:
                    self.failed_fused_frames.add(n)
                    self._cache.discard(("fused", n), ("fused", n, "stages"))
                    logging.getLogger("pyggml_codec").warning(
                        "fused decode of %d frames failed (%s); using the split path for this frame count", n, exc)
            return self._decode_split(codes, return_stages)

    def _decode_fused(self, codes: np.ndarray, stages: bool):
        n = codes.shape[1]
        out = self._run(("fused", n), FUSED_CTX, self.graphs.fused_decode(codes), self.graphs.codes_feed(codes), stages)
        audio = out.pop("audio").reshape(-1)
        return (audio, _stage_arrays(out)) if stages else audio

    def _decode_split(self, codes: np.ndarray, stages: bool):
        n = codes.shape[1]
        first = self._run(("latent", n), QUANTIZER_CTX, self.graphs.latent_decode(codes), self.graphs.codes_feed(codes),
                          stages)
        latent = first.pop("latent")
        second = self._run(("wave", n), ENCODER_CTX, self.graphs.wave_decode(latent.shape[1]), {"latent": latent},
                           stages)
        audio = second.pop("audio").reshape(-1)
        if not stages:
            return audio
        return audio, _stage_arrays({**first, "dec.latent": latent, **second})

    def _fused(self, path: str) -> bool:
        """Whether decode path ``path`` ("auto", "split", "fused") runs the fused graph here."""
        return path == "fused" or (path == "auto" and not self._live().backend.is_cpu)

    def _chunk_frames(self) -> int | None:
        chunk = self.decode_chunk_frames
        if chunk is None:
            return None
        if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
            raise ValueError(f"decode_chunk_frames must be None or an int >= 1, got {chunk!r}")
        return int(chunk)

    def _decode_chunked(self, codes: np.ndarray, chunk: int) -> np.ndarray:
        """The split decode as an exact stream of ``chunk``-frame pieces (bounded memory)."""
        from .streaming import StreamDecoder

        sd = StreamDecoder(self, split=True)
        pieces = []
        for start in range(0, codes.shape[1], chunk):
            pieces.append(sd.push(codes[:, start:start + chunk]))
            self.last_compute_s += sd.last_compute_s
        return np.concatenate(pieces)

    # ----------------------------------------------------------------- encode

    def encode(self, audio, sample_rate: int | None = None, *, pad_to: str = "code_frame", mix: str | None = None,
               return_margins: bool = False, return_stages: bool = False, dump: str | os.PathLike | None = None):
        """Mono audio -> int32 codes ``(n_codebooks, ceil(n / samples_per_frame))``.

        ``audio``: float32/float64 in [-1, 1] or int16 PCM (scaled by 1/32768), shape ``(n,)``
        or ``(1, n)``; ``(channels, n)`` needs ``mix="mean"``. ``sample_rate`` must equal the
        model's (resample first; see :mod:`pyggml_codec.audio`).

        ``pad_to="code_frame"`` (default) pads with zeros to a multiple of the code frame
        (2048 samples), as upstream does, so the codes are upstream's; ``"frame_length"``
        pads to a multiple of the file's ``frame_length`` (512), as the C++ engine does. The
        two differ only in the last frame, when ceil(n / 512) is not a multiple of 4.

        ``return_margins=True`` returns ``(codes, margins)``: per frame and codebook the gap
        between the best and second-best cosine score, to tell tie flips from bugs.
        ``return_stages=True`` returns an :class:`EncodeResult` with the stage tensors.
        ``dump=PATH`` also writes every stage to one ``.npz`` (see :mod:`pyggml_codec.diagnostics`).
        """
        if dump is not None:
            if return_stages or return_margins:
                raise ValueError("dump= writes the stages; it does not combine with return_stages/return_margins")
            from .io.dumps import dump_encode

            return dump_encode(self, audio, dump, sample_rate=sample_rate, pad_to=pad_to, mix=mix)
        if pad_to not in PAD_POLICIES:
            raise ValueError(f"pad_to must be one of {PAD_POLICIES}, got {pad_to!r}")
        with self._lock:
            self.last_compute_s = 0.0
            model = self._live()
            if model.parts == "decode":
                raise InputError("this codec was loaded with parts='decode'; encode needs parts='encode' or 'all'")
            x = check_audio(audio, self.config, sample_rate, mix)
            result = self._encode(x, pad_to, return_stages)
        if return_stages:
            return result
        return (result.codes, result.margins) if return_margins else result.codes

    def _pad(self, x: np.ndarray, pad_to: str) -> np.ndarray:
        unit = self.config.samples_per_frame if pad_to == "code_frame" else self.config.frame_length
        padded = -(-x.shape[0] // unit) * unit
        return np.pad(x, (0, padded - x.shape[0]))

    def _encode(self, x: np.ndarray, pad_to: str, stages: bool) -> EncodeResult:
        cfg = self.config
        wave = self._pad(x, pad_to)
        n_latent = wave.shape[0] // cfg.hop_length
        first = self._run(("enc", wave.shape[0]), ENCODER_CTX, self.graphs.latent_encode(wave),
                          {"audio": wave[None, :]}, stages)
        second = self._run(("enc2", n_latent), QUANTIZER_CTX, self.graphs.stage_encode(n_latent),
                           {"latent": first["latent"]}, stages)
        # download() drops trailing 1s of ne: one frame comes back as (dim,), not (1, dim)
        z = second["pre_module"].reshape(-1, cfg.quantizer.input_dim)
        codes, margins, residuals = vq.residual_quantize(self._model.vq_stages, z)
        result = EncodeResult(codes=codes, margins=margins)
        if stages:
            result.stages = _stage_arrays({**first, **second})
            for i, (r, c) in enumerate(zip(residuals, codes)):
                result.stages[f"enc.vq{i}.residual"] = r
                result.stages[f"enc.vq{i}.codes"] = c
        return result

    # ----------------------------------------------------------------- streaming (see streaming.py)

    def stream_decoder(self, *, on_invalid_codes: str = "clamp") -> "StreamDecoder":
        """An exact chunked decoder: ``with codec.stream_decoder() as sd: pcm = sd.push(codes)``."""
        from .streaming import StreamDecoder

        return StreamDecoder(self, on_invalid_codes)

    def batch_stream_decoder(self, max_streams: int = 8, *, on_invalid_codes: str = "clamp") -> "BatchStreamDecoder":
        """Exact decoders for up to ``max_streams`` streams, one graph per step for all of them:
        ``sid = bsd.join()``, ``bsd.push({sid: codes, ...})``, ``bsd.leave(sid)`` (see batching.py)."""
        from .batching import BatchStreamDecoder

        return BatchStreamDecoder(self, max_streams, on_invalid_codes=on_invalid_codes)

    def decode_batch(self, items, *, on_invalid_codes: str = "clamp", frames_per_step: int | None = None) -> list:
        """Decode code arrays ``(n_codebooks, T_i)`` together; one float32 audio each, equal to
        :meth:`decode` of each alone (see :func:`batching.decode_batch`)."""
        from .batching import decode_batch

        return decode_batch(self, items, on_invalid_codes=on_invalid_codes, frames_per_step=frames_per_step)

    def stream_decode(self, chunks: Iterable, *, on_invalid_codes: str = "clamp") -> Iterator[np.ndarray]:
        """Yield the audio of each code chunk in turn, decoded exactly with carried state."""
        from .streaming import stream_decode

        return stream_decode(self, chunks, on_invalid_codes)

    def decode_windowed(self, codes, stride: int | None = None, history: int | None = None,
                        holdback: int | None = None, low_latency: bool = False, *, live: bool = False,
                        return_schedule: bool = False, on_invalid_codes: str = "clamp"):
        """Decode with the C++ engine's re-decoded windows; see :func:`streaming.decode_windowed`."""
        from .streaming import decode_windowed

        return decode_windowed(self, codes, stride, history, holdback, low_latency, live=live,
                               return_schedule=return_schedule, on_invalid_codes=on_invalid_codes)

    def encode_chunked(self, audio, sample_rate: int | None = None, *, chunk_seconds: float = 10.0,
                       pad_to: str = "code_frame", mix: str | None = None, return_margins: bool = False,
                       return_stages: bool = False):
        """:meth:`encode` of any length in bounded memory; see :func:`streaming.encode_chunked`."""
        from .streaming import encode_chunked

        return encode_chunked(self, audio, sample_rate, chunk_seconds=chunk_seconds, pad_to=pad_to, mix=mix,
                              return_margins=return_margins, return_stages=return_stages)

def _stage_arrays(out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: np.asarray(a) for name, a in out.items()}


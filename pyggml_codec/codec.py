"""The Codec: the library's front. It checks what the caller passes, holds the engine's lock
over a call, and hands the work to the :class:`~pyggml_codec.engine.Engine` (graphs, caches,
runs) or to the stream decoders built on it (``streaming.py``, ``batching.py``).

Return types are fixed per method: :meth:`Codec.encode` gives the codes,
:meth:`Codec.encode_details` codes and margins, :meth:`Codec.encode_stages` every stage;
:meth:`Codec.decode` gives the audio, :meth:`Codec.decode_stages` the audio and every stage;
:meth:`Codec.dump_encode` / :meth:`Codec.dump_decode` write the stages to a dump file.
"""

from __future__ import annotations

import os
from typing import Iterable, Iterator

import numpy as np

from .batching import BatchStreamDecoder, decode_batch
from .engine import Engine
from .errors import InputError
from .graphs.build import CodecGraphs
from .graphs.ops import Choices
from .inputs import MAX_DECODE_FRAMES, PAD_POLICIES, EncodeResult, check_audio, check_codes
from .io import dumps
from .model.config import CodecConfig
from .model.loader import LoadedModel
from .plan import Plan, check_decode_path
from .progress import ProgressCallback
from .streaming import StreamDecoder, decode_windowed, encode_chunked, stream_decode


class Codec:
    """An S2 codec on one ggml backend. Create with :func:`pyggml_codec.load`.

    Thread safety: calls are serialized by a per-codec lock (ggml graphs and allocators
    are not reentrant); use one codec per thread for parallelism.
    """

    def __init__(self, model: LoadedModel, decode_path: str = "auto"):
        self.engine = Engine(model)
        self.decode_path = check_decode_path(decode_path)

    # ----------------------------------------------------------------- properties

    @property
    def plan(self) -> Plan:
        """How this codec computes: precision, lowerings, decode path (see :mod:`pyggml_codec.plan`)."""
        return self._engine().plan

    @property
    def precision(self) -> str:
        """"f32" or "s2cpp" (``plan.precision``)."""
        return self._engine().plan.precision.value

    @property
    def config(self) -> CodecConfig:
        return self.engine.check_open().config

    @property
    def backend_name(self) -> str:
        return self.engine.check_open().backend.name

    @property
    def fallback_reason(self) -> str | None:
        return self.engine.check_open().backend.fallback_reason

    @property
    def parts(self) -> str:
        return self.engine.check_open().parts

    @property
    def loaded_bytes(self) -> int:
        return self.engine.check_open().loaded_bytes

    @property
    def model_source(self) -> str:
        """The model file (or reader) this codec was loaded from."""
        return self.engine.check_open().source

    @property
    def device_name(self) -> str:
        """ggml's name of the backend device, e.g. "CPU" or "CUDA0"."""
        return self.engine.check_open().backend.device_name

    @property
    def shared_tensors(self) -> frozenset[str]:
        """Weights used in place from the host (``load(host_tensors=...)``)."""
        return frozenset(self.engine.check_open().shared)

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def n_threads(self) -> int:
        return self.engine.check_open().backend.n_threads

    @n_threads.setter
    def n_threads(self, n: int) -> None:
        self.engine.check_open().backend.set_threads(n)  # an integer in 1..512, else ValueError

    @property
    def graphs(self) -> CodecGraphs:
        """The graph builders (``graphs/build.py``) over this codec's model."""
        return self._engine().graphs

    @property
    def lowerings(self) -> Choices:
        """Every lowering the graphs built so far used, per op (``ops.Choices``)."""
        return self._engine().lowerings

    @property
    def failed_fused_frames(self) -> set[int]:
        """Frame counts whose fused decode graph failed; those decode by the split path."""
        return self._engine().failed_fused_frames

    @property
    def last_compute_s(self) -> float:
        """Seconds inside ggml compute during the last encode/decode call."""
        return self._engine().last_compute_s

    @property
    def use_custom_kernels(self) -> bool:
        """The compiled CPU kernels where the plan takes them; set False (then :meth:`clear_cache`)
        to run plain ggml ops, e.g. to compare the two."""
        return self._engine().use_custom_kernels

    @use_custom_kernels.setter
    def use_custom_kernels(self, on: bool) -> None:
        self._engine().use_custom_kernels = bool(on)

    @property
    def decode_chunk_frames(self) -> int | None:
        """Split-path decodes longer than this many frames run as an exact stream of chunks of this
        length (same audio to float rounding), so the compute buffer stays bounded by the chunk
        (one-shot: about 4.3 MB per frame at full size). None decodes in one graph at any length
        (up to ``inputs.MAX_DECODE_FRAMES``), as the C++ engine does. Default: ``plan.decode_chunk_frames``."""
        return self._engine().decode_chunk_frames

    @decode_chunk_frames.setter
    def decode_chunk_frames(self, frames: int | None) -> None:
        self._engine().decode_chunk_frames = frames

    def compute_bytes(self) -> dict[str, int]:
        """Compute-buffer bytes of each cached graph, keyed by "kind/frames" (ggml's allocator)."""
        with self.engine.lock:
            self.engine.check_open()
            return {f"{key[0]}/{key[1]}": graph.compute_bytes for key, graph in self.engine.cached_graphs().items()}

    def info(self) -> dict[str, object]:
        """What this codec is: model, backend, device, threads, parts, bytes and the plan's fields."""
        model = self.engine.check_open()
        return {"model": str(model.source), "backend": model.backend.name, "device": model.backend.device_name,
                "fallback_reason": model.backend.fallback_reason, "n_threads": model.backend.n_threads,
                "parts": model.parts, "loaded_bytes": model.loaded_bytes,
                "huge_pages": model.huge_pages, "decode_path": self.decode_path,
                "plan": self.plan.as_dict()}

    def _engine(self) -> Engine:
        """The engine, or :class:`ClosedError` once closed (every public member raises it then)."""
        self.engine.check_open()
        return self.engine

    # ----------------------------------------------------------------- lifetime

    def close(self) -> None:
        """Free graphs, weights and (if this codec started it) the backend. Idempotent."""
        self.engine.close()

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
        with self.engine.lock:
            self.engine.clear_cache()

    # ----------------------------------------------------------------- decode

    def decode(self, codes, *, on_invalid_codes: str = "clamp", decode_path: str | None = None,
               progress: ProgressCallback | None = None) -> np.ndarray:
        """Codes ``(n_codebooks, T)`` (or ``(1, n_codebooks, T)``), any integer dtype ->
        float32 audio of ``T * samples_per_frame`` samples.

        Out-of-range codes are clamped per codebook with a warning giving the counts
        (``on_invalid_codes="raise"`` raises instead). ``decode_path`` forces "split" or
        "fused"; "auto" uses fused on GPU backends and split on CPU (``plan.decode``).
        ``progress`` receives ("decode", frames done, frames in all, "frames") per chunk.

        Returns float32 audio ``(T * samples_per_frame,)`` at :attr:`sample_rate`. Raises
        InputError for codes it cannot take (shape, dtype, codebook count, too many frames, or
        out of range with ``on_invalid_codes="raise"``), ValueError for a bad ``decode_path``
        or ``on_invalid_codes``, ClosedError after :meth:`close`.
        """
        return self._decode(codes, on_invalid_codes, decode_path, False, progress)

    def decode_stages(self, codes, *, on_invalid_codes: str = "clamp",
                      decode_path: str | None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """:meth:`decode` in one graph with every stage kept: ``(audio, {stage name: array})``."""
        return self._decode(codes, on_invalid_codes, decode_path, True, None)

    def _decode(self, codes, on_invalid_codes: str, decode_path: str | None, stages: bool,
                progress: ProgressCallback | None):
        fused = self.plan.fused(check_decode_path(decode_path or self.decode_path))
        engine = self.engine
        with engine.lock:
            engine.last_compute_s = 0.0
            if engine.check_open().parts == "encode":
                raise InputError("this codec was loaded with parts='encode'; decode needs parts='decode' or 'all'")
            chunk = None if fused or stages else engine.chunk_frames()
            codes = check_codes(codes, self.config, on_invalid_codes, max_frames=None if chunk else MAX_DECODE_FRAMES)
            return engine.decode(codes, fused=fused, chunk=chunk, stages=stages, progress=progress)

    def dump_decode(self, codes, path: str | os.PathLike, *, on_invalid_codes: str = "clamp",
                    decode_path: str | None = None) -> np.ndarray:
        """Decode ``codes`` with every stage kept, write them to one ``.npz`` dump at ``path``
        (layout: :mod:`pyggml_codec.io.dumps`) and return the audio."""
        audio, stages = self.decode_stages(codes, on_invalid_codes=on_invalid_codes, decode_path=decode_path)
        out = dumps.decode_dump(stages, codes, audio, self.config)
        options = {"on_invalid_codes": on_invalid_codes, "decode_path": decode_path}
        dumps.save_dump(path, out, dumps.dump_meta("decode", out, self._run_facts({"decode_kwargs": options})))
        return out["audio"]

    # ----------------------------------------------------------------- encode

    def encode(self, audio, sample_rate: int | None = None, *, pad_to: str = "code_frame", mix: str | None = None,
               progress: ProgressCallback | None = None) -> np.ndarray:
        """Mono audio -> int32 codes ``(n_codebooks, ceil(n / samples_per_frame))``.

        ``audio``: float32/float64 in [-1, 1] or int16 PCM (scaled by 1/32768), shape ``(n,)``,
        ``(channels, n)`` or soundfile's ``(n, channels)``; more than one channel needs
        ``mix="mean"``, which averages the channels. ``sample_rate`` must equal the model's
        (resample first; see :mod:`pyggml_codec.io.audio`).

        ``pad_to="code_frame"`` (default) pads with zeros to a multiple of the code frame
        (2048 samples), as upstream does, so the codes are upstream's; ``"frame_length"``
        pads to a multiple of the file's ``frame_length`` (512), as the C++ engine does. The
        two differ only in the last frame, when ceil(n / 512) is not a multiple of 4.
        ``progress`` receives ("encode", stages done, 3, "stages"): encoder graph, quantizer graph, VQ.

        The margins come from :meth:`encode_details`, the stage tensors from :meth:`encode_stages`.

        Returns the int32 codes ``(n_codebooks, T)``. Raises InputError for audio it cannot take
        (dtype, rank, a 2-D shape whose channel axis is ambiguous, several channels without
        ``mix``, a wrong ``sample_rate``, non-finite values, too long), ValueError for a bad
        ``pad_to`` or ``mix``, ClosedError after :meth:`close`.
        """
        return self._encode(audio, sample_rate, pad_to, mix, False, progress).codes

    def encode_details(self, audio, sample_rate: int | None = None, *, pad_to: str = "code_frame",
                       mix: str | None = None, progress: ProgressCallback | None = None) -> EncodeResult:
        """:meth:`encode`, with the margins: per frame and codebook the gap between the best and
        second-best cosine score, to tell tie flips from bugs (``EncodeResult.codes``, ``.margins``)."""
        return self._encode(audio, sample_rate, pad_to, mix, False, progress)

    def encode_stages(self, audio, sample_rate: int | None = None, *, pad_to: str = "code_frame",
                      mix: str | None = None) -> EncodeResult:
        """:meth:`encode_details` with every stage tensor kept (``EncodeResult.stages``)."""
        return self._encode(audio, sample_rate, pad_to, mix, True, None)

    def _encode(self, audio, sample_rate, pad_to: str, mix, stages: bool,
                progress: ProgressCallback | None) -> EncodeResult:
        if pad_to not in PAD_POLICIES:
            raise ValueError(f"pad_to must be one of {PAD_POLICIES}, got {pad_to!r}")
        engine = self.engine
        with engine.lock:
            engine.last_compute_s = 0.0
            if engine.check_open().parts == "decode":
                raise InputError("this codec was loaded with parts='decode'; encode needs parts='encode' or 'all'")
            x = check_audio(audio, self.config, sample_rate, mix)
            return engine.encode(self._pad(x, pad_to), stages=stages, progress=progress)

    def _pad(self, x: np.ndarray, pad_to: str) -> np.ndarray:
        unit = self.config.samples_per_frame if pad_to == "code_frame" else self.config.frame_length
        padded = -(-x.shape[0] // unit) * unit
        return np.pad(x, (0, padded - x.shape[0]))

    def dump_encode(self, audio, path: str | os.PathLike, sample_rate: int | None = None, *,
                    pad_to: str = "code_frame", mix: str | None = None) -> np.ndarray:
        """Encode ``audio`` with every stage kept, write them to one ``.npz`` dump at ``path`` and
        return the codes; the dump's ``audio`` is the float32 mono signal encode saw, before padding."""
        x = check_audio(audio, self.config, sample_rate, mix)
        result = self.encode_stages(audio, sample_rate, pad_to=pad_to, mix=mix)
        out = dumps.encode_dump(result.stages, x, result.codes, self.config, pad_to)
        options = {"pad_to": pad_to, **({"sample_rate": sample_rate} if sample_rate is not None else {}),
                   **({"mix": mix} if mix is not None else {})}
        dumps.save_dump(path, out, dumps.dump_meta("encode", out, self._run_facts({"encode_kwargs": options})))
        return out["codes"]

    def _run_facts(self, extra: dict) -> dict:
        source = self.engine.check_open().source
        return {"backend": self.backend_name, "precision": self.precision,
                "model_file": str(source) if source is not None else None, "sample_rate": self.sample_rate,
                "samples_per_frame": self.config.samples_per_frame, "lowerings": dict(self.lowerings), **extra}

    # ----------------------------------------------------------------- streams and batches

    def stream_decoder(self, *, on_invalid_codes: str = "clamp") -> StreamDecoder:
        """An exact chunked decoder: ``with codec.stream_decoder() as sd: pcm = sd.push(codes)``."""
        return StreamDecoder(self.engine, on_invalid_codes, fused=self.plan.fused(self.decode_path), owner=self)

    def batch_stream_decoder(self, max_streams: int = 8, *, on_invalid_codes: str = "clamp") -> BatchStreamDecoder:
        """Exact decoders for up to ``max_streams`` streams, one graph per step for all of them:
        ``sid = bsd.join()``, ``bsd.push({sid: codes, ...})``, ``bsd.leave(sid)`` (see batching.py)."""
        return BatchStreamDecoder(self.engine, max_streams, on_invalid_codes=on_invalid_codes,
                                  fused=self.plan.fused(self.decode_path), owner=self)

    def decode_batch(self, items, *, on_invalid_codes: str = "clamp", frames_per_step: int | None = None) -> list:
        """Decode code arrays ``(n_codebooks, T_i)`` together; one float32 audio each, equal to
        :meth:`decode` of each alone (see :func:`batching.decode_batch`)."""
        return decode_batch(self.engine, items, on_invalid_codes=on_invalid_codes, frames_per_step=frames_per_step,
                            fused=self.plan.fused(self.decode_path))

    def stream_decode(self, chunks: Iterable, *, on_invalid_codes: str = "clamp") -> Iterator[np.ndarray]:
        """Yield the audio of each code chunk in turn, decoded exactly with carried state."""
        return stream_decode(self.stream_decoder(on_invalid_codes=on_invalid_codes), chunks)

    def decode_windowed(self, codes, stride: int | None = None, history: int | None = None,
                        holdback: int | None = None, low_latency: bool = False, *, live: bool = False,
                        return_schedule: bool = False, on_invalid_codes: str = "clamp"):
        """Decode with the C++ engine's re-decoded windows; see :func:`streaming.decode_windowed`."""
        return decode_windowed(self, codes, stride, history, holdback, low_latency, live=live,
                               return_schedule=return_schedule, on_invalid_codes=on_invalid_codes)

    def encode_chunked(self, audio, sample_rate: int | None = None, *, chunk_seconds: float = 10.0,
                       pad_to: str = "code_frame", mix: str | None = None,
                       progress: ProgressCallback | None = None) -> np.ndarray:
        """:meth:`encode` of any length in bounded memory; see :func:`streaming.encode_chunked`.
        ``progress`` receives ("encode", seconds of audio done, seconds in all, "s") per chunk."""
        return self.encode_chunked_details(audio, sample_rate, chunk_seconds=chunk_seconds, pad_to=pad_to, mix=mix,
                                           progress=progress).codes

    def encode_chunked_details(self, audio, sample_rate: int | None = None, *, chunk_seconds: float = 10.0,
                               pad_to: str = "code_frame", mix: str | None = None, stages: bool = False,
                               progress: ProgressCallback | None = None) -> EncodeResult:
        """:meth:`encode_chunked` with the margins, and with ``stages=True`` the concatenated
        "latent" (latent_dim, T_latent) and "pre_module" (T, dim)."""
        if self.parts == "decode":
            raise InputError("this codec was loaded with parts='decode'; encode needs parts='encode' or 'all'")
        return encode_chunked(self.engine, audio, sample_rate, chunk_seconds=chunk_seconds, pad_to=pad_to, mix=mix,
                              stages=stages, progress=progress)

"""The Codec: loading, encode/decode orchestration, graph caches and fallbacks.

Graph layout mirrors the C++ engine:

* encode: graph 1 (128 MB context) wave -> latent, graph 2 (96 MB) downsample ->
  pre_module, then the residual VQ on the host (numpy);
* decode, split path (CPU and the fallback): graph 1 (96 MB) VQ sum -> post_module ->
  upsample, graph 2 (128 MB) decoder -> wave;
* decode, fused path (non-CPU backends): one graph (256 MB) codes -> wave, cached per frame
  count; a frame count whose fused graph failed is remembered and served by the split path.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import ops, quantizer, seanet
from .config import CodecConfig
from .errors import ClosedError, GraphError, InputError
from .inputs import check_audio, check_codes
from .model import LoadedModel
from .runtime import Graph
from .transformer import transformer

MB = 1 << 20
ENCODER_CTX, QUANTIZER_CTX, FUSED_CTX = 128 * MB, 96 * MB, 256 * MB
PRECISIONS = ("f32", "s2cpp")
PAD_POLICIES = ("code_frame", "frame_length")
DECODE_PATHS = ("auto", "split", "fused")
GRAPH_CACHE_SIZE = 4  # graphs kept per kind (distinct frame counts)


@dataclass
class EncodeResult:
    """What ``encode(..., return_details=True)`` gives besides the codes."""

    codes: np.ndarray  # (n_codebooks, T) int32
    margins: np.ndarray  # (n_codebooks, T) float32: best minus second-best cosine
    stages: dict[str, np.ndarray] = field(default_factory=dict)


class _GraphCache:
    """Built graphs keyed by (kind, frame count), least recently used evicted."""

    def __init__(self, size: int):
        self.size = size
        self.graphs: OrderedDict = OrderedDict()

    def get(self, key, make: Callable[[], Graph]) -> Graph:
        if key in self.graphs:
            self.graphs.move_to_end(key)
            return self.graphs[key]
        graph = make()
        self.graphs[key] = graph
        while len(self.graphs) > self.size:
            self.graphs.popitem(last=False)[1].free()
        return graph

    def clear(self) -> None:
        for graph in self.graphs.values():
            graph.free()
        self.graphs.clear()


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
        self.decode_path = decode_path
        self._cache = _GraphCache(GRAPH_CACHE_SIZE)
        self.failed_fused_frames: set[int] = set()
        self._lock = threading.RLock()
        self.lowerings: dict[str, str] = {}

    # ----------------------------------------------------------------- properties

    @property
    def config(self) -> CodecConfig:
        return self._model.config

    @property
    def backend_name(self) -> str:
        return self._live().backend.name

    @property
    def fallback_reason(self) -> str | None:
        return self._live().backend.fallback_reason

    @property
    def parts(self) -> str:
        return self._model.parts

    @property
    def loaded_bytes(self) -> int:
        return self._live().loaded_bytes

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
        """Free cached graphs. Remembered fused-graph failures survive."""
        with self._lock:
            self._cache.clear()

    # ----------------------------------------------------------------- graph building

    def _builder(self, ctx, keep_stages: bool = False) -> ops.Builder:
        return ops.Builder(ctx=ctx, precision=self.precision,
                           explicit_causal_mask=self._live().backend.name == "metal", keep_stages=keep_stages)

    def _graph(self, key, ctx_bytes: int, build: Callable[[ops.Builder], dict], keep_stages: bool = False) -> Graph:
        def make() -> Graph:
            graph = Graph(self._live().backend, ctx_bytes)
            try:
                graph.build(build, self._builder(graph.ctx, keep_stages))
            except BaseException:
                graph.free()
                raise
            self.lowerings.update(graph.builder.lowerings)
            return graph

        if keep_stages:  # dumps are one-off: never cached
            return make()
        return self._cache.get(key, make)

    def _code_inputs(self, g: ops.Builder, codes: np.ndarray) -> list:
        return [g.input(f"codes.{i}", codes[i], ops.I32) for i in range(codes.shape[0])]

    def _build_latent_decode(self, codes: np.ndarray) -> Callable[[ops.Builder], dict]:
        w, cfg = self._model.weights, self.config

        def build(g: ops.Builder) -> dict:
            x = g.mark("dec.vq_sum", quantizer.vq_sum(g, self._code_inputs(g, codes), w, cfg))
            x = g.mark("dec.post_module", transformer(g, x, w, "quantizer.post_module", cfg.rvq_transformer,
                                                     cfg.rvq_transformer.n_layer))
            return {"latent": quantizer.upsample(g, x, w, cfg)}

        return build

    def _build_wave_decode(self, n_latent: int) -> Callable[[ops.Builder], dict]:
        w, cfg = self._model.weights, self.config

        def build(g: ops.Builder) -> dict:
            x = g.input("latent", np.zeros((cfg.quantizer.input_dim, n_latent), np.float32))
            return {"audio": seanet.decoder(g, x, w, cfg)}

        return build

    def _build_fused_decode(self, codes: np.ndarray) -> Callable[[ops.Builder], dict]:
        latent = self._build_latent_decode(codes)
        w, cfg = self._model.weights, self.config

        def build(g: ops.Builder) -> dict:
            x = latent(g)["latent"]
            g.mark("dec.latent", x)
            return {"audio": seanet.decoder(g, x, w, cfg)}

        return build

    # ----------------------------------------------------------------- decode

    def decode(self, codes, *, on_invalid_codes: str = "clamp", decode_path: str | None = None,
               return_stages: bool = False):
        """Codes ``(n_codebooks, T)`` (or ``(1, n_codebooks, T)``), any integer dtype ->
        float32 audio of ``T * samples_per_frame`` samples.

        Out-of-range codes are clamped per codebook with a warning giving the counts
        (``on_invalid_codes="raise"`` raises instead). ``decode_path`` forces "split" or
        "fused"; "auto" uses fused on GPU backends and split on CPU. With
        ``return_stages=True`` returns ``(audio, {stage name: array})``.
        """
        path = decode_path or self.decode_path
        if path not in DECODE_PATHS:
            raise ValueError(f"decode_path must be one of {DECODE_PATHS}, got {path!r}")
        with self._lock:
            model = self._live()
            if model.parts == "encode":
                raise InputError("this codec was loaded with parts='encode'; decode needs parts='decode' or 'all'")
            codes = check_codes(codes, self.config, on_invalid_codes)
            n = codes.shape[1]
            fused = path == "fused" or (path == "auto" and not model.backend.is_cpu)
            if fused and n not in self.failed_fused_frames:
                try:
                    return self._decode_fused(codes, return_stages)
                except GraphError as exc:
                    self.failed_fused_frames.add(n)
                    self._cache.graphs.pop(("fused", n), None)
                    logging.getLogger("pyggml_codec").warning(
                        "fused decode of %d frames failed (%s); using the split path for this frame count", n, exc)
            return self._decode_split(codes, return_stages)

    def _decode_fused(self, codes: np.ndarray, stages: bool):
        n = codes.shape[1]
        graph = self._graph(("fused", n), FUSED_CTX, self._build_fused_decode(codes), keep_stages=stages)
        try:
            out = graph.run(self._codes_feed(codes))
        finally:
            if stages:
                graph.free()
        audio = out.pop("audio").reshape(-1)
        return (audio, _stage_arrays(out)) if stages else audio

    def _decode_split(self, codes: np.ndarray, stages: bool):
        n = codes.shape[1]
        g1 = self._graph(("latent", n), QUANTIZER_CTX, self._build_latent_decode(codes), keep_stages=stages)
        try:
            first = g1.run(self._codes_feed(codes))
        finally:
            if stages:
                g1.free()
        latent = first.pop("latent")
        g2 = self._graph(("wave", n), ENCODER_CTX, self._build_wave_decode(latent.shape[1]), keep_stages=stages)
        try:
            second = g2.run({"latent": latent})
        finally:
            if stages:
                g2.free()
        audio = second.pop("audio").reshape(-1)
        if not stages:
            return audio
        return audio, _stage_arrays({**first, "dec.latent": latent, **second})

    @staticmethod
    def _codes_feed(codes: np.ndarray) -> dict[str, np.ndarray]:
        return {f"codes.{i}": codes[i] for i in range(codes.shape[0])}

    # ----------------------------------------------------------------- encode

    def encode(self, audio, sample_rate: int | None = None, *, pad_to: str = "code_frame", mix: str | None = None,
               return_margins: bool = False, return_stages: bool = False):
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
        """
        if pad_to not in PAD_POLICIES:
            raise ValueError(f"pad_to must be one of {PAD_POLICIES}, got {pad_to!r}")
        with self._lock:
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
        cfg, w = self.config, self._model.weights
        wave = self._pad(x, pad_to)
        n_latent = wave.shape[0] // cfg.hop_length

        def build_latent(g: ops.Builder) -> dict:
            return {"latent": seanet.encoder(g, g.input("audio", wave[None, :]), w, cfg)}

        def build_stage(g: ops.Builder) -> dict:
            z = quantizer.downsample(g, g.input("latent", np.zeros((cfg.encoder.latent_dim, n_latent), np.float32)), w, cfg)
            z = ops.transpose(g, z)
            return {"pre_module": transformer(g, z, w, "quantizer.pre_module", cfg.rvq_transformer,
                                              cfg.rvq_transformer.n_layer)}

        g1 = self._graph(("enc", wave.shape[0]), ENCODER_CTX, build_latent, keep_stages=stages)
        try:
            first = g1.run({"audio": wave[None, :]})
        finally:
            if stages:
                g1.free()
        g2 = self._graph(("enc2", n_latent), QUANTIZER_CTX, build_stage, keep_stages=stages)
        try:
            second = g2.run({"latent": first["latent"]})
        finally:
            if stages:
                g2.free()
        codes, margins, residuals = quantizer.residual_quantize(self._model.vq_stages, second["pre_module"])
        result = EncodeResult(codes=codes, margins=margins)
        if stages:
            result.stages = _stage_arrays({**first, **second})
            for i, (r, c) in enumerate(zip(residuals, codes)):
                result.stages[f"enc.vq{i}.residual"] = r
                result.stages[f"enc.vq{i}.codes"] = c
        return result


def _stage_arrays(out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: np.asarray(a) for name, a in out.items()}


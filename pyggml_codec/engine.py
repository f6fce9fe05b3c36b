"""The engine: one loaded model on one backend, its plan, its graphs, and the runs of them.

Every call of the library ends here: :class:`~pyggml_codec.codec.Codec` (the front), the
stream decoders (``streaming.py``, ``batching.py``), dumps and benchmarks use this typed API
and nothing below it:

* :meth:`Engine.graph` gets or builds a graph for a key; :meth:`Engine.run` computes one;
* :meth:`Engine.decode` / :meth:`Engine.encode` run the one-shot graphs (and the CPU's
  chunked decode) on checked inputs; :meth:`Engine.quantize` is the host VQ;
* :meth:`Engine.new_streams` makes the carried state of N streams, and
  :meth:`Engine.decode_step` / :meth:`Engine.encode_step` run one chunk of them;
* :meth:`Engine.close` frees what it owns, in reverse order of acquisition (an ``ExitStack``):
  the graph caches, then the weights and the backend (``LoadedModel.close``).

The engine holds one lock; its methods do not take it, their callers (the front and the
decoders) hold it over a whole call, so that ggml graphs and allocators are never entered
twice at once. Inputs are checked by the callers too (``inputs.py``).
"""

from __future__ import annotations

import logging
import threading
from contextlib import ExitStack

import numpy as np

from .backend.ggml_graph import Graph, GraphCache, blas_single_threaded
from .errors import ClosedError, GraphError, InputError
from .graphs.build import ENCODER_CTX, FUSED_CTX, QUANTIZER_CTX, Build, CodecGraphs
from .graphs.ops import Choices
from .inputs import EncodeResult
from .model import vq
from .model.config import CodecConfig
from .model.loader import LoadedModel
from .plan import Plan
from .progress import ProgressCallback, report
from .stream_state import RowPool, StreamSlot, StreamStates

GRAPH_CACHE_SIZE = 4  # graphs kept in all on the CPU, per kind (distinct frame counts) elsewhere
BATCH_GRAPH_CACHE_SIZE = 12  # batched stream graphs: two stages x several (frames, streams) groups
ROW_POOL_BYTES = 256 << 20  # key/value rows of closed streams kept for new ones (stream_state.RowPool)
log = logging.getLogger("pyggml_codec")


class Engine:
    """The owner of a loaded model's backend, weights, plan, graph caches and lock."""

    def __init__(self, model: LoadedModel):
        self.model = model
        self.plan: Plan = model.plan
        self.config: CodecConfig = model.config
        self.graphs = CodecGraphs(model)
        self.lock = threading.RLock()
        self.failed_fused_frames: set[int] = set()
        self.lowerings = Choices()  # every lowering the graphs built so far used (ops.Choices)
        # Compiled CPU kernels (kernels.py) where ggml is slow, when the plan allows them; set
        # False (then clear_cache()) to run plain ggml ops, e.g. to compare the two.
        self.use_custom_kernels = True
        # Seconds inside ggml compute during the last call (the rest of a call's wall time is
        # Python: validation, graph lookup, uploads, downloads, host VQ).
        self.last_compute_s = 0.0
        # Split-path decodes longer than this many frames run as an exact stream of chunks (see
        # Plan.decode_chunk_frames); None decodes in one graph at any length.
        self.decode_chunk_frames: int | None = self.plan.decode_chunk_frames
        self._cache = GraphCache(GRAPH_CACHE_SIZE, per_kind=model.backend.quirks.cache_per_kind)
        self._batch_cache = GraphCache(BATCH_GRAPH_CACHE_SIZE)  # batched stream steps, by (kind, n, streams)
        self.row_pool = RowPool(ROW_POOL_BYTES)  # closed streams' key/value rows, for the next new ones
        self._owned = ExitStack()  # closed in reverse: the caches' graphs first, then weights and backend
        self._owned.callback(model.close)
        self._owned.callback(self._cache.clear)
        self._owned.callback(self._batch_cache.clear)
        self._owned.callback(self.row_pool.close)

    # ----------------------------------------------------------------- lifetime

    @property
    def closed(self) -> bool:
        return self.model.closed

    def check_open(self) -> LoadedModel:
        """The loaded model; :class:`ClosedError` once :meth:`close` ran."""
        if self.model.closed:
            raise ClosedError("this codec has been closed")
        return self.model

    def close(self) -> None:
        """Free the graphs, the weights and (if this library started it) the backend. Idempotent."""
        with self.lock:
            self._owned.close()

    def clear_cache(self) -> None:
        """Free cached graphs (remembered fused-graph failures survive), the key/value rows kept
        for new streams, then the buffers the backend parked (``Backend.restart``: lavapipe)."""
        self.check_open()
        self._cache.clear()
        self._batch_cache.clear()
        self.row_pool.clear()
        self.model.backend.restart()

    def cached_graphs(self) -> dict:
        """The cached one-stream graphs by key, (kind, frames[, "stages"]), oldest first."""
        return dict(self._cache.graphs)

    def discard(self, *keys) -> None:
        """Free the cached graphs of these keys (absent keys are skipped)."""
        self._cache.discard(*keys)

    # ----------------------------------------------------------------- graphs

    def graph(self, key: tuple, ctx_bytes: int, build: Build, *, keep_stages: bool = False,
              streamed: bool = False, batch: int = 1) -> Graph:
        """The graph ``key`` from the cache, built by ``build`` if absent. A graph that keeps its
        stages on the CPU is built for one run and not cached (the caller frees it)."""
        def make() -> Graph:
            self.check_open()
            graph = self.graphs.new_graph(ctx_bytes, build, keep_stages=keep_stages,
                                          custom_kernels=self.use_custom_kernels, streamed=streamed, batch=batch)
            self.lowerings.update(graph.builder.lowerings)
            return graph

        if keep_stages and self.model.backend.is_cpu:  # dumps are one-off on the CPU; cached elsewhere:
            return make()  # on lavapipe a freed graph's buffers stay parked to clear_cache() (Backend.release)
        if keep_stages:
            key = key + ("stages",)
        return (self._batch_cache if batch > 1 else self._cache).get(key, make)

    def run(self, key: tuple, ctx_bytes: int, build: Build, feeds: dict,
            keep_stages: bool = False) -> dict[str, np.ndarray]:
        """Compute the (cached) graph ``key`` on ``feeds``; one-off stage graphs are freed after."""
        graph = self.graph(key, ctx_bytes, build, keep_stages=keep_stages)
        try:
            out = graph.run(feeds)
            self.last_compute_s += graph.last_compute_s
            return out
        finally:
            if keep_stages and self.model.backend.is_cpu:
                graph.free()

    # ----------------------------------------------------------------- decode

    def chunk_frames(self) -> int | None:
        """:attr:`decode_chunk_frames`, checked."""
        chunk = self.decode_chunk_frames
        if chunk is None:
            return None
        if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
            raise ValueError(f"decode_chunk_frames must be None or an int >= 1, got {chunk!r}")
        return int(chunk)

    def decode(self, codes: np.ndarray, *, fused: bool, chunk: int | None, stages: bool = False,
               progress: ProgressCallback | None = None):
        """Checked codes -> audio (and ``{stage: array}`` with ``stages``): the fused graph (a
        frame count whose fused graph fails is remembered and served by the split path), the
        split graphs in one go, or, past ``chunk`` frames, an exact stream of chunks."""
        n = codes.shape[1]
        if chunk and n > chunk:
            return self._decode_chunked(codes, chunk, progress)
        if fused and n not in self.failed_fused_frames:
            try:
                out = self._decode_fused(codes, stages)
                report(progress, "decode", n, n, "frames")
                return out
            except GraphError as exc:
                self.failed_fused_frames.add(n)
                self._cache.discard(("fused", n), ("fused", n, "stages"))
                log.warning("fused decode of %d frames failed (%s); using the split path for this frame count", n, exc)
        out = self._decode_split(codes, stages)
        report(progress, "decode", n, n, "frames")
        return out

    def _decode_fused(self, codes: np.ndarray, stages: bool):
        n = codes.shape[1]
        out = self.run(("fused", n), FUSED_CTX, self.graphs.fused_decode(codes), self.graphs.codes_feed(codes), stages)
        audio = out.pop("audio").reshape(-1)
        return (audio, _stage_arrays(out)) if stages else audio

    def _decode_split(self, codes: np.ndarray, stages: bool):
        n = codes.shape[1]
        first = self.run(("latent", n), QUANTIZER_CTX, self.graphs.latent_decode(codes), self.graphs.codes_feed(codes),
                         stages)
        latent = first.pop("latent")
        second = self.run(("wave", n), ENCODER_CTX, self.graphs.wave_decode(latent.shape[1]), {"latent": latent},
                          stages)
        audio = second.pop("audio").reshape(-1)
        if not stages:
            return audio
        return audio, _stage_arrays({**first, "dec.latent": latent, **second})

    def _decode_chunked(self, codes: np.ndarray, chunk: int, progress: ProgressCallback | None) -> np.ndarray:
        """The split decode as an exact stream of ``chunk``-frame pieces (bounded memory)."""
        states = self.new_streams(1)
        slot = states.new_slot()
        total, pieces = codes.shape[1], []
        try:
            for start in range(0, total, chunk):
                piece = codes[:, start:start + chunk]
                audio, pending, compute_s = self.decode_step(states, [slot], piece, fused=False)
                states.commit(slot, pending[0], piece.shape[1])
                pieces.append(audio.reshape(-1))
                self.last_compute_s += compute_s
                report(progress, "decode", start + piece.shape[1], total, "frames")
        finally:
            states.close()
        return np.concatenate(pieces)

    # ----------------------------------------------------------------- encode

    def encode(self, wave: np.ndarray, *, stages: bool = False,
               progress: ProgressCallback | None = None) -> EncodeResult:
        """A padded mono wave -> codes and margins (and the stage tensors with ``stages``): the
        encoder graph, the quantizer graph, the host VQ, each reported as one of 3 "stages"."""
        cfg = self.config
        n_latent = wave.shape[0] // cfg.hop_length
        first = self.run(("enc", wave.shape[0]), ENCODER_CTX, self.graphs.latent_encode(wave),
                         {"audio": wave[None, :]}, stages)
        report(progress, "encode", 1, 3, "stages")
        second = self.run(("enc2", n_latent), QUANTIZER_CTX, self.graphs.stage_encode(n_latent),
                          {"latent": first["latent"]}, stages)
        report(progress, "encode", 2, 3, "stages")
        # download() drops trailing 1s of ne: one frame comes back as (dim,), not (1, dim)
        z = second["pre_module"].reshape(-1, cfg.quantizer.input_dim)
        codes, margins, residuals = self.quantize(z)
        report(progress, "encode", 3, 3, "stages")
        result = EncodeResult(codes=codes, margins=margins)
        if stages:
            result.stages = _stage_arrays({**first, **second})
            for i, (r, c) in enumerate(zip(residuals, codes)):
                result.stages[f"enc.vq{i}.residual"] = r
                result.stages[f"enc.vq{i}.codes"] = c
        return result

    def quantize(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """The residual VQ on the host: pre-module frames (T, dim) -> codes, margins, residuals.
        InputError where the frames are not finite (audio loud enough to overflow the encoder:
        every distance would be NaN, and every code 0).

        Its products run on one BLAS thread: a threaded one leaves OpenBLAS's workers spinning
        for about 2^28 cycles after it returns, and the next compute (the next encode, or a
        stream's next push) then shares the cores with them. Encodes in a row took 0.84x the
        time this way at 1.4 s and 0.99x at 10 s (paired medians, 2 threads), a 10 s encode in
        1 s chunks 0.84-0.89x, and the products themselves the same time up to 216 frames."""
        bad = int(np.count_nonzero(~np.isfinite(z)))
        if bad:
            raise InputError(f"the encoder's output has {bad} NaN or Inf values of {z.size}: the audio overflows "
                             f"the model (samples are expected in about [-1, 1])")
        with blas_single_threaded():
            return vq.residual_quantize(self.model.vq_stages, z)

    # ----------------------------------------------------------------- streams

    def new_streams(self, capacity: int) -> StreamStates:
        """The carried state of up to ``capacity`` streams on this engine's streamed graphs, their
        key/value rows from :attr:`row_pool` (``StreamStates.close`` gives them back)."""
        return StreamStates(self.graph, capacity, self.row_pool)

    def decode_step(self, states: StreamStates, slots: list[StreamSlot], codes: np.ndarray,
                    fused: bool) -> tuple[np.ndarray, list, float]:
        """One decode step of ``slots``, each pushing ``n`` frames: ``codes`` (n_codebooks, n * streams),
        the streams' codes side by side. Returns the audio (streams * n * samples_per_frame), each
        slot's pending updates (``StreamStates.commit``) and the seconds inside ggml compute."""
        graphs, feed = self.graphs, self.graphs.codes_feed(codes)
        n = codes.shape[1] // len(slots)
        if fused:
            out, pending = states.run("stream-fused", FUSED_CTX, n, slots, graphs.fused_decode(codes), feed)
            return out["audio"], pending, states.last_graph.last_compute_s
        out, pending = states.run("stream-latent", QUANTIZER_CTX, n, slots, graphs.latent_decode(codes), feed)
        compute_s = states.last_graph.last_compute_s
        latent = out["latent"]
        out, more = states.run("stream-wave", ENCODER_CTX, n, slots, graphs.wave_decode(latent.shape[1]),
                               {"latent": latent})
        compute_s += states.last_graph.last_compute_s
        return out["audio"], [a + b for a, b in zip(pending, more)], compute_s

    def encode_step(self, states: StreamStates, slot: StreamSlot, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One chunk of a stream's encode, whole code frames of mono audio ``x``: its latent
        (latent_dim, T_latent) and pre-module frames (T, dim); the state is committed."""
        cfg = self.config
        out, pending = states.run("stream-enc", ENCODER_CTX, x.shape[0], [slot], self.graphs.latent_encode(x),
                                  {"audio": x[None, :]})
        latent = out["latent"].reshape(cfg.encoder.latent_dim, -1)
        z, more = states.run("stream-enc2", QUANTIZER_CTX, latent.shape[1], [slot],
                             self.graphs.stage_encode(latent.shape[1]), {"latent": latent})
        states.commit(slot, pending[0] + more[0], 0)
        return latent, z["pre_module"].reshape(-1, cfg.quantizer.input_dim)


def _stage_arrays(out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: np.asarray(a) for name, a in out.items()}

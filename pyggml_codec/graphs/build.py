"""The one place that assembles the codec's graphs from its stages, for one-shot calls
(``codec.py``) and streamed ones (``streaming.py``, with a :class:`~.ops.Carry` on the builder).

Graph layout mirrors the C++ engine:

* encode: graph 1 (128 MB context) wave -> latent, graph 2 (96 MB) downsample ->
  pre_module, then the residual VQ on the host (numpy, ``model/vq.py``);
* decode, split path (CPU and the fallback): graph 1 (96 MB) VQ sum -> post_module ->
  upsample, graph 2 (128 MB) decoder -> wave;
* decode, fused path (non-CPU backends): one graph (256 MB) codes -> wave.

Each ``CodecGraphs`` method returns ``build(g) -> {output name: tensor}`` for
:meth:`Graph.build <pyggml_codec.backend.ggml_graph.Graph.build>`; the inputs it declares are
fed by name at compute time ("codes.<i>", "latent", "audio").
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..backend import arena_attention, kernels
from ..backend.ggml_graph import Graph
from ..model.loader import LoadedModel
from ..plan import Plan
from . import ops, quantizer, seanet
from .transformer import transformer

MB = 1 << 20
ENCODER_CTX, QUANTIZER_CTX, FUSED_CTX = 128 * MB, 96 * MB, 256 * MB
Build = Callable[[ops.Builder], dict]


class CodecGraphs:
    """Graph builders over one loaded model, by its plan."""

    def __init__(self, model: LoadedModel):
        self.model = model
        self.plan: Plan = model.plan

    def builder(self, ctx, keep_stages: bool = False, custom_kernels: bool = True) -> ops.Builder:
        """An :class:`ops.Builder` for the model's plan; ``custom_kernels=False`` runs plain ggml
        ops where the plan would take the compiled CPU kernels."""
        plan = self.plan
        fast_cpu = custom_kernels and plan.kernels and kernels.AVAILABLE
        layout = plan.ru_weights  # plan "blas"/"taps"/"winograd" imply a BLAS was found
        # "s2cpp": the plan holds the C++ engine's lowerings (lowerings.S2CPP_LOWERINGS) and the
        # kernels run their exact build (ggml's op values, bit for bit).
        exact = plan.reproduces_s2cpp
        return ops.Builder(ctx=ctx, f16_convs=exact, explicit_causal_mask=plan.mask == "explicit",
                           keep_stages=keep_stages, snake_kernel=fast_cpu, im2col_kernel=fast_cpu,
                           exact_kernels=exact,
                           conv_transpose=plan.conv_transpose, left_pad=plan.left_pad,
                           attention="blocked" if plan.attention == "fused" and not fast_cpu else plan.attention,
                           matmul=plan.matmul if fast_cpu else "ggml",
                           conv=layout if layout != "conv" and fast_cpu else "im2col", ru_weights=layout,
                           quantized=plan.quantized, kv=plan.kv,
                           attention_kernel=fast_cpu and not exact and arena_attention.WINDOW_ATTENTION)

    @staticmethod
    def codes_feed(codes: np.ndarray) -> dict[str, np.ndarray]:
        """The inputs of a decode graph for ``codes`` (n_codebooks, T)."""
        return {f"codes.{i}": codes[i] for i in range(codes.shape[0])}

    def latent_decode(self, codes: np.ndarray) -> Build:
        """Codes -> VQ sum -> post_module -> upsample: "latent"."""
        w, cfg = self.model.weights, self.model.config

        def build(g: ops.Builder) -> dict:
            inputs = [g.input(f"codes.{i}", codes[i], ops.I32) for i in range(codes.shape[0])]
            x = g.mark("dec.vq_sum", quantizer.vq_sum(g, inputs, w, cfg))
            x = g.mark("dec.post_module", transformer(g, x, w, "quantizer.post_module", cfg.rvq_transformer,
                                                     cfg.rvq_transformer.n_layer))
            return {"latent": quantizer.upsample(g, x, w, cfg)}

        return build

    def wave_decode(self, n_latent: int) -> Build:
        """Latent (input_dim, n_latent) -> decoder: "audio"."""
        w, cfg = self.model.weights, self.model.config

        def build(g: ops.Builder) -> dict:
            x = g.input("latent", np.zeros((cfg.quantizer.input_dim, n_latent), np.float32))
            return {"audio": seanet.decoder(g, x, w, cfg)}

        return build

    def fused_decode(self, codes: np.ndarray) -> Build:
        """Both decode graphs in one: codes -> "audio"."""
        latent = self.latent_decode(codes)
        w, cfg = self.model.weights, self.model.config

        def build(g: ops.Builder) -> dict:
            x = g.mark("dec.latent", latent(g)["latent"])
            return {"audio": seanet.decoder(g, x, w, cfg)}

        return build

    def latent_encode(self, wave: np.ndarray) -> Build:
        """Padded wave -> encoder: "latent"."""
        w, cfg = self.model.weights, self.model.config
        return lambda g: {"latent": seanet.encoder(g, g.input("audio", wave[None, :]), w, cfg)}

    def stage_encode(self, n_latent: int) -> Build:
        """Latent -> downsample -> pre_module: "pre_module" (T, input_dim), for the host VQ."""
        w, cfg = self.model.weights, self.model.config

        def build(g: ops.Builder) -> dict:
            x = g.input("latent", np.zeros((cfg.encoder.latent_dim, n_latent), np.float32))
            z = ops.transpose(g, quantizer.downsample(g, x, w, cfg))
            rvq = cfg.rvq_transformer
            return {"pre_module": transformer(g, z, w, "quantizer.pre_module", rvq, rvq.n_layer)}

        return build

    def new_graph(self, ctx_bytes: int, build: Build, *, keep_stages: bool = False, custom_kernels: bool = True,
                  streamed: bool = False, batch: int = 1) -> Graph:
        """Build ``build`` into a new graph on the model's backend (freed again if building
        fails). ``streamed``: each causal op carries its state between calls (``ops.Carry``);
        ``batch``: that many streams in one graph, packed along time (``ops.Carry.batch``)."""
        graph = Graph(self.model.backend, ctx_bytes)
        try:
            g = self.builder(graph.ctx, keep_stages, custom_kernels)
            if streamed:
                g.stream = ops.Carry(batch=batch)
                graph.build(lambda b: _state_first(build(b), b.stream.outputs), g)
            else:
                graph.build(build, g)
        except BaseException:
            graph.free()
            raise
        return graph


def _state_first(main: dict, state: dict) -> dict:
    """Outputs with the carried state first: ggml orders a graph by the expansion order of
    its outputs, so each state copy then runs right after the tensor it copies, which can
    be freed at once (expanded last, every such tensor would stay alive to the end: 3.3x
    the one-shot graph's compute buffer per frame)."""
    return {**state, **main}

"""Lowering choices: which graph formulation of an op with alternatives a backend gets.

Probed per backend (``ggml_backend_supports_op`` on tiny tensors), then overridden by
``load(..., lowerings={...})``; ``plan.decide_plan`` makes them part of the plan (``Codec.plan``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

from . import binding, buildinfo, ggml_graph, kernels
from .binding import lib
from .runtime import Backend
from ..errors import BackendError, PerformanceWarning

LOWERING_CHOICES = {
    "mask": ("diag_mask_inf", "explicit"),
    "conv_transpose": ("col2im", "ggml"),
    "left_pad": ("pad_ext", "concat"),
    "kernels": (True, False),
    "attention": ("fused", "blocked", "full"),
    "matmul": ("blas", "ggml"),
    "conv": ("winograd", "taps", "im2col"),
    "quantized": ("native", "dequantize"),
    "matrices": ("stored", "f32"),
    "kv": ("arena", "concat"),
}


def probe_ops(backend: Backend) -> dict[str, bool]:
    """Which of the ops with alternative lowerings ``backend`` supports (tiny metadata graph)."""
    ctx = ggml_graph.new_context(32 * lib.ggml_tensor_overhead())
    try:
        sq = binding.new_tensor(ctx, binding.TYPE_F32, (4, 4))
        cols = binding.new_tensor(ctx, binding.TYPE_F32, (8, 4))
        kern = binding.new_tensor(ctx, binding.TYPE_F32, (4, 2, 4))
        probes = {
            "diag_mask_inf": lib.ggml_diag_mask_inf(ctx, sq, 0),
            "col2im_1d": lib.ggml_col2im_1d(ctx, cols, 2, 2, 0),
            "pad_left": lib.ggml_pad_ext(ctx, sq, 1, 0, 0, 0, 0, 0, 0, 0),
            "conv_transpose_1d": lib.ggml_conv_transpose_1d(ctx, kern, sq, 2, 0, 1),
        }
        return {name: backend.supports(t) for name, t in probes.items()}
    finally:
        lib.ggml_free(ctx)


# What the "s2cpp" precision computes: the C++ engine's formulations, whose sums it must
# reproduce bit for bit (ggml's mul_mat, not the BLAS; im2col convs; attention over full
# masked rows, since a softmax sums its row in SIMD lanes and shorter rows round otherwise).
S2CPP_LOWERINGS = {"matmul": "ggml", "conv": "im2col", "attention": "full", "matrices": "stored"}


def choose_lowerings(backend: Backend, overrides: dict | None = None, exact: bool = False) -> dict:
    """The graph-level lowering of each op with alternatives, for this backend and precision.

    What a backend supports is probed; what it needs besides is its row of ``quirks.QUIRKS``
    (Metal: explicit masks, as the C++ engine gives it). ``overrides`` forces a choice (tests run every
    lowering on the CPU backend against the reference). ``exact`` (the "s2cpp" precision) takes
    :data:`S2CPP_LOWERINGS` and refuses overrides against them. ``plan.decide_plan`` calls it.
    """
    if overrides is not None and not isinstance(overrides, Mapping):
        raise TypeError(f"lowerings must be a dict of lowering name -> choice, got {type(overrides).__name__}")
    if exact:
        clash = {k: v for k, v in (overrides or {}).items() if k in S2CPP_LOWERINGS and v != S2CPP_LOWERINGS[k]}
        if clash:
            raise ValueError(f"precision='s2cpp' reproduces the C++ engine's sums and runs {S2CPP_LOWERINGS}; "
                             f"the lowering(s) {clash} would change them (use precision='f32')")
        overrides = {**(overrides or {}), **S2CPP_LOWERINGS}
    support = probe_ops(backend)
    blas = backend.is_cpu and kernels.BLAS is not None
    plan = {
        "mask": "diag_mask_inf" if support["diag_mask_inf"] and not backend.quirks.explicit_masks else "explicit",
        "conv_transpose": "col2im" if support["col2im_1d"] else "ggml",
        "left_pad": "pad_ext" if support["pad_left"] else "concat",
        "kernels": backend.is_cpu,
        # The CPU: a whole sequence's sliding-window attention in one compiled op over the visible
        # scores alone ("fused", arena_attention.causal_attention); without the kernels, in query
        # blocks over overlapping strided key views ("blocked"); both linear in length. GPUs keep
        # the full masked form (cheap there).
        "attention": ("fused" if kernels.AVAILABLE else "blocked") if backend.is_cpu else "full",
        # F32 products through the BLAS numpy ships (kernels.py): 1.2-3.8x ggml's F32 mul_mat
        # on the CPU; F16 products stay with ggml.
        "matmul": "blas" if blas else "ggml",
        # The residual units' dilated convs (most of the FLOPs) by BLAS GEMMs over the signal
        # in place instead of im2col columns: Winograd F(4,7), 10 GEMMs per 4 outputs instead
        # of 28 ("taps": one per tap); f32 precision only.
        "conv": "winograd" if blas else "im2col",
        # Products with a quantized weight (pyggml-codec quantize): ggml's quantized kernels,
        # which quantize the activations too ("native"), or the weight dequantized in the graph
        # and an F32 product ("dequantize"). On the CPU dequantizing measured no slower at full
        # size (Q8_0 10 s decode 6.7 s against 6.9, encode 4.0 against 4.9), 25 % less decode
        # error (6.0e-4 against 8.1e-4 rel RMS), and keeps chunked and streamed decodes within
        # float rounding of one graph (an 8-bit activation rounding flips where chunking moves
        # it by an ulp: 1e-2 max abs on the demo model); GPUs keep their quantized kernels.
        "quantized": "dequantize" if backend.is_cpu else "native",
        # How an F16 file's transformer, ConvNeXt and conv-transpose matrices are held in "f32"
        # precision: as stored ("stored": F16, upcast to F32 exactly inside the CPU's row-product
        # kernel, kernels.mul_mat_rowdot; half the bytes to read per product and to hold) or
        # upcast at load ("f32": GPUs, whose F16 products round the activations to F16).
        "matrices": "stored" if blas and kernels.ROWDOT else "f32",
        # Streamed attention's keys and values: rows of a host arena that the graph writes and
        # reads in place ("arena", the CPU: graphs/transformer.py, ops.KVArena), or state inputs
        # and outputs that the host uploads, downloads and appends to, concatenated with the
        # chunk's in the graph ("concat": backends whose memory the host cannot lend).
        "kv": "arena" if backend.is_cpu else "concat",
        # Not a choice: how the backend computes products given F32 inputs (runtime.PRODUCTS);
        # ggml-vulkan's F16 path is turned off for a load in "f32" precision.
        "products": backend.products,
    }
    for key, value in (overrides or {}).items():
        if key not in LOWERING_CHOICES or value not in LOWERING_CHOICES[key]:
            choices = {k: list(v) for k, v in LOWERING_CHOICES.items()}
            raise ValueError(f"unknown lowering {key}={value!r}; choices: {choices}")
        if key == "kv" and value == "arena" and not backend.is_cpu:
            raise ValueError("kv='arena' lends host memory to the graph: the CPU backend only")
        if key == "kernels" and value and not backend.is_cpu:
            raise ValueError("custom kernels run on the CPU backend only")
        if key == "attention" and value == "fused":
            if not backend.is_cpu:
                raise ValueError("attention='fused' is a compiled kernel: the CPU backend only")
            if not kernels.AVAILABLE:
                raise ValueError(f"attention='fused' needs the compiled kernels: {kernels.UNAVAILABLE_REASON}")
        if key == "matrices" and value == "stored" and not exact and not (blas and kernels.ROWDOT):
            raise ValueError("matrices='stored' in f32 precision needs the CPU backend's row-product kernel")
        if key in ("matmul", "conv") and value in ("blas", "taps", "winograd"):
            if not backend.is_cpu:
                raise ValueError(f"{key}={value!r} runs on the CPU backend only (through the BLAS)")
            if kernels.BLAS is None:
                raise ValueError(f"BLAS matrix products unavailable: {kernels.BLAS_UNAVAILABLE_REASON}")
        plan[key] = value
    if not exact and plan["matmul"] != "blas" and plan["matrices"] == "stored":
        if (overrides or {}).get("matrices") == "stored":
            raise ValueError("matrices='stored' in f32 precision needs matmul='blas' (the row-product kernel)")
        plan["matrices"] = "f32"  # ggml's F16 product would round the activations to F16
    if not plan["kernels"]:  # the BLAS lowerings and the fused attention are compiled kernels too
        for key, plain in (("matmul", "ggml"), ("conv", "im2col")):
            if (overrides or {}).get(key, plain) != plain:
                raise ValueError(f"{key}={overrides[key]!r} needs the compiled kernels (kernels=True)")
            plan[key] = plain
        if plan["attention"] == "fused":
            if (overrides or {}).get("attention") == "fused":
                raise ValueError("attention='fused' needs the compiled kernels (kernels=True)")
            plan["attention"] = "blocked"
    if plan["conv_transpose"] == "ggml" and not support["conv_transpose_1d"]:
        raise BackendError(f"backend {backend.name} supports neither COL2IM_1D nor CONV_TRANSPOSE_1D")
    if backend.is_cpu and plan["kernels"]:  # kernels=False, or a plain matmul, is the user's choice
        warn_slow_path(blas=not {"matmul", "conv"} & set(overrides or {}))
    return plan


def warn_slow_path(blas: bool = True) -> None:
    """A PerformanceWarning when the CPU would run the slow path unasked."""
    reason = buildinfo.slow_path_reason(blas)
    if reason:
        warnings.warn(reason, PerformanceWarning, stacklevel=4)

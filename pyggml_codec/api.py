"""``load()``: the one entry point that opens a model file on a backend and returns a Codec."""

from __future__ import annotations

import ctypes
import os
import warnings
from typing import Any, Iterable, Mapping

from .backend.runtime import PRODUCTS, Backend, check_threads, default_threads, set_cpu_ops, start_backend
from .codec import Codec
from .model.loader import load_model
from .plan import Precision, check_decode_path


def load(
    source: str | os.PathLike | Any,
    backend: str | int = "auto",
    device: int = 0,
    n_threads: int | None = None,
    *,
    precision: str = "f32",
    parts: str = "all",
    strict_backend: bool = False,
    decode_path: str = "auto",
    host_tensors: Mapping[str, Any] | None = None,
    lowerings: dict | None = None,
    cpu_ops: Iterable[str] | None = None,
) -> Codec:
    """Load an S2 codec from a GGUF file onto a ggml backend.

    ``source``: a path to a ``fish-speech`` (merged, ``c.``-prefixed) or
    ``fish-speech-codec`` GGUF file, or an open ``gguf.GGUFReader`` the host already has.
    ``backend``: "auto" (a GPU if this ggml build has one, else CPU), "cpu", "cuda",
    "metal", "vulkan", or a ggml backend handle the host created (used, never freed; an int or
    ``c_void_p`` is taken as a ``ggml_backend_t`` as it is, and nothing can check a raw address:
    one that is not a backend crashes the process).
    An unavailable backend falls back to CPU with a ``RuntimeWarning`` (recorded in
    ``codec.fallback_reason``); ``strict_backend=True`` raises :class:`BackendError`.
    ``precision``: "f32" (default: F32 weights and convs, exact to ~1e-6, the reference
    for comparisons) or "s2cpp" (F16 conv inputs and weights, as the C++ engine computes;
    half the weight memory of an F16 file). ``parts``: "all", "encode" or "decode" (only
    the tensors that direction needs). ``n_threads`` defaults to the usable cores.

    Embedding (sharing with a host application that already holds the model):
    ``host_tensors`` maps file tensor names (e.g. ``"c.decoder.model.0.conv.weight"``) to
    ggml tensors the host allocated on ``backend``; each whose type and shape match what
    this codec needs is used in place, the rest are copied into the codec's own buffer
    (``codec.shared_tensors`` lists the shared ones). Ownership: the codec frees only what
    it created (its graphs, its weight buffer, a backend it started); the host's backend,
    buffers and tensors must outlive ``codec.close()`` and are never freed by it.

    ``lowerings`` overrides the per-backend choice of graph lowerings (``codec.plan``):
    ``mask`` ("diag_mask_inf"/"explicit"), ``conv_transpose`` ("col2im"/"ggml"),
    ``left_pad`` ("pad_ext"/"concat"), ``kernels`` (True/False: compiled CPU kernels),
    ``attention`` ("fused": window attention in one compiled op over the visible scores, the CPU
    default; "blocked": in query blocks through ggml's ops; "full"),
    ``matmul`` ("blas": F32 products by the OpenBLAS numpy ships, the CPU default where it is
    found; "ggml"), ``conv`` ("winograd": the residual units' dilated convs by Winograd F(4,7),
    10 BLAS GEMMs per 4 outputs, in "f32" precision, the CPU default with the BLAS; "taps":
    one BLAS GEMM per tap, the smallest rounding error; "im2col"), ``quantized`` (products with a
    quantized weight: "dequantize", an F32 product, the CPU default; "native", ggml's quantized kernels).

    Ops the backend rejects (``ggml_backend_supports_op``) run on the CPU through
    ``ggml_backend_sched``, with a ``RuntimeWarning`` naming them (``codec.lowerings["cpu_ops"]``).
    ``cpu_ops`` (ggml op names such as ``{"COL2IM_1D"}``) pins more ops to the CPU that way,
    to bisect a backend's op against the CPU's.

    Returns a :class:`Codec` (a context manager: ``with load(...) as codec``). Raises
    ModelFileError and its subclasses ConfigError and TensorError (a missing file, or one that
    is not a readable S2 codec GGUF, naming the key or tensor), BackendError (a backend or
    device that cannot start with ``strict_backend=True``, a forced lowering the backend cannot
    run), ValueError (a bad ``precision``, ``parts``, ``decode_path``, ``lowerings`` choice,
    ``cpu_ops`` name, or ``n_threads`` outside 1..512), TypeError (``lowerings`` that is not a mapping,
    a ``host_tensors`` value that is not a ggml tensor).
    """
    precision = Precision.parse(precision)
    check_decode_path(decode_path)
    if n_threads is not None:
        check_threads(n_threads)
    if isinstance(backend, ctypes.c_void_p):
        backend = backend.value or 0
    if isinstance(backend, int) and not isinstance(backend, bool):
        handle = Backend.wrap(backend)
    else:
        handle = start_backend(str(backend), device, strict_backend, f32_products=precision.f32_products)
    if precision.f32_products and handle.products == "f16-inputs":
        warnings.warn(f"pyggml_codec: precision 'f32' on {handle.device_name} is not F32: {PRODUCTS['f16-inputs']}. "
                      f"This device was first started in this process with F16 on; start it first with "
                      f"precision='f32', or set {handle.quirks.f16_switch}=1 before the first load", RuntimeWarning, stacklevel=2)
    handle.set_threads(n_threads or default_threads())
    try:
        set_cpu_ops(handle, cpu_ops)
    except ValueError:
        handle.free()
        raise
    model = load_model(source, handle, parts, precision, host_tensors, lowerings)
    return Codec(model, decode_path)

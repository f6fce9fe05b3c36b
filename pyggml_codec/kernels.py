"""Custom CPU kernels that ggml runs as custom ops (``ggml_map_custom2``, ``ggml_custom_4d``).

Built at install time by cffi (``_kernels_build.py``). Used only on the CPU backend, and only
after checking that the kernels' view of ``struct ggml_tensor`` matches the binding's; when
the compiled module is missing or does not match, graphs use plain ggml ops and
``Codec.lowerings`` says which ran, with the reason logged once.

* Snake: one pass with vectorized ``sinf`` instead of a 5-op chain whose ``sin`` is scalar.
* im2col (1-D) into F16 columns (the "s2cpp" precision): ggml 0.15.3's CPU im2col
  interleaves threads over input channels within every output column; this one gives each
  thread blocks of columns and skips bounds checks inside the signal: 2.7-4.5 GB/s against
  0.8-1.0 measured side by side. Same output, bit for bit.
"""

from __future__ import annotations

import ctypes
import logging

import numpy as np

from ._ggml import lib

log = logging.getLogger("pyggml_codec")
N_TASKS_MAX = -1  # GGML_N_TASKS_MAX: use every thread of the compute
MAX_KERNEL = 64  # larger kernels (none in S2, which uses <= 16) take ggml's im2col


def _load():
    try:
        from ._kernels import ffi, lib as klib
    except ImportError as exc:
        return None, f"compiled kernels not built ({exc})"
    offsets = ffi.new("int64_t[5]")
    klib.pg_tensor_layout(offsets)
    want = [getattr(lib.ggml_tensor, name).offset for name in ("type", "ne", "nb", "src", "data")]
    if list(offsets) != want:
        return None, f"struct ggml_tensor layout differs (kernels {list(offsets)}, binding {want})"

    def address(name: str) -> int:
        return int(ffi.cast("uintptr_t", ffi.addressof(klib, name)))

    symbols = {  # op -> (C function, ggml callback type)
        "snake": ("pg_snake", lib.ggml_custom2_op_t),
        "im2col": ("pg_im2col", lib.ggml_custom_op_t),
        "bias_snake": ("pg_bias_snake", lib.ggml_custom_op_t),
        "add_bias_residual": ("pg_add_bias_residual", lib.ggml_custom_op_t),
    }
    missing = [sym for sym, _ in symbols.values() if not hasattr(klib, sym)]
    if missing:
        return None, f"compiled kernels are from another version (missing {', '.join(missing)}; reinstall)"
    ops = {op: kind(address(sym)) for op, (sym, kind) in symbols.items()}
    ops["f16c"] = bool(klib.pg_has_f16c())
    return ops, None


_OPS, UNAVAILABLE_REASON = _load()
AVAILABLE = _OPS is not None
if not AVAILABLE:
    log.info("custom CPU kernels unavailable: %s; using plain ggml ops", UNAVAILABLE_REASON)


def snake(ctx, x, alpha):
    """x + sin(alpha x)^2 / alpha in one op (contiguous F32 x and alpha, alpha [1, C] or [C, 1])."""
    return lib.ggml_map_custom2(ctx, x, alpha, _OPS["snake"], N_TASKS_MAX, None)


def _custom(ctx, dst_type: int, like, srcs: list, op: str):
    args = (ctypes.POINTER(lib.ggml_tensor) * len(srcs))(*srcs)
    ne = [int(like.contents.ne[i]) for i in range(4)]
    return lib.ggml_custom_4d(ctx, dst_type, *ne, args, len(srcs), _OPS[op], N_TASKS_MAX, None)


def bias_snake(ctx, x, alpha, bias, dst_type: int):
    """snake(x + bias) in one pass; contiguous F32 x, alpha and bias shaped alike to broadcast
    (``[C, 1]`` for channels-last x, ``[1, C]`` for channels-first); F32 or F16 (type 1) out."""
    if dst_type == 1 and not _OPS["f16c"]:
        raise ValueError("F16 output needs the F16C build of the kernels")
    return _custom(ctx, dst_type, x, [x, alpha, bias], "bias_snake")


def add_bias_residual(ctx, h, bias, x):
    """(h + bias) + x in one pass; contiguous F32 h and x of one shape, bias broadcast as above."""
    return _custom(ctx, 0, h, [h, bias, x], "add_bias_residual")


def im2col_supported(dst_type: int, k: int, with_prev: bool = False) -> bool:
    """For F16 columns: there ggml's im2col ran at 0.8-1.0 GB/s and this one at 2.7-4.5
    (same run). For F32 the two are equal (3.4-6.3 GB/s), so F32 keeps ggml's op, except
    where the kernel reads a streamed conv's carried context in place (``with_prev``),
    which saves a concat (single-threaded in ggml) and its copy of the input."""
    if not AVAILABLE or k > MAX_KERNEL:
        return False
    return (dst_type == 1 and _OPS["f16c"]) or (dst_type == 0 and with_prev)


def im2col(ctx, x, k: int, stride: int, dilation: int, pad: int, n_out: int, dst_type: int, keep: list,
           prev=None):
    """Columns ``[IC*K, n_out]`` of contiguous F32 ``x [L, IC]`` (ggml_im2col's layout and values).

    ``prev`` (contiguous F32 ``[P, IC]``): the columns are those of ``prev`` followed by ``x``
    in time, read in place (a streamed conv's carried left context, with no concat).
    ``keep`` must outlive the graph: it holds the parameter block the kernel reads.
    """
    params = np.array([k, stride, dilation, pad], dtype=np.int64)
    keep.append(params)
    srcs = [x] if prev is None else [x, prev]
    args = (ctypes.POINTER(lib.ggml_tensor) * len(srcs))(*srcs)
    ic = int(x.contents.ne[1])
    return lib.ggml_custom_4d(ctx, dst_type, ic * k, n_out, 1, 1, args, len(srcs), _OPS["im2col"], N_TASKS_MAX,
                              params.ctypes.data_as(ctypes.c_void_p))

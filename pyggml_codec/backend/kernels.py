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
* F32 matrix products through a CBLAS ``sgemm`` (``BLAS``, below): ggml 0.15.3's F32
  ``mul_mat`` ran the codec's conv GEMMs at 80-100 GFLOP/s on the 2-core AVX2 machine, the
  OpenBLAS that numpy ships at 130-175 (side by side). Each ggml thread runs a
  single-threaded sgemm on its share of the product, so ggml's threads stay in charge.
* The residual units' dilated convs by Winograd F(4,7): their wrapper is winograd_conv.py.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
from typing import Callable

import numpy as np

from . import binding
from .binding import lib
from .blas import BLAS_ENV, Blas, find_blas  # noqa: F401  (BLAS_ENV, Blas: re-exported)

log = logging.getLogger("pyggml_codec")
N_TASKS_MAX = -1  # GGML_N_TASKS_MAX: use every thread of the compute
MAX_KERNEL = 64  # larger kernels (none in S2, which uses <= 16) take ggml's im2col


SYMBOLS = {  # op -> (C function, ggml callback type)
    "snake": ("pg_snake", lib.ggml_custom2_op_t),
    "im2col": ("pg_im2col", lib.ggml_custom_op_t),
    "bias_snake": ("pg_bias_snake", lib.ggml_custom_op_t),
    "add_bias_residual": ("pg_add_bias_residual", lib.ggml_custom_op_t),
    "mul_mat_blas": ("pg_mul_mat_blas", lib.ggml_custom_op_t),
    "conv_taps": ("pg_conv_taps", lib.ggml_custom_op_t),
    "conv_wino": ("pg_conv_wino", lib.ggml_custom_op_t),
    "conv_wino_input": ("pg_conv_wino_input", lib.ggml_custom_op_t),
    "col2im": ("pg_col2im", lib.ggml_custom_op_t),
    "transpose": ("pg_transpose", lib.ggml_custom_op_t),
    "mul_mat_rowdot": ("pg_mul_mat_rowdot", lib.ggml_custom_op_t),
    "conv_c1": ("pg_conv_c1", lib.ggml_custom_op_t),
    "window_attention": ("pg_window_attention", lib.ggml_custom_op_t),
    "causal_attention": ("pg_causal_attention", lib.ggml_custom_op_t),
    "mul_mat_f16dot": ("pg_mul_mat_f16dot", lib.ggml_custom_op_t),
}
# The exact build (_kernels_exact: no -ffast-math, no contraction) of the elementwise kernels and
# of ggml's F16 product, which the "s2cpp" precision runs: ggml's values, bit for bit.
EXACT_OPS = ("snake", "im2col", "bias_snake", "add_bias_residual", "col2im", "mul_mat_f16dot")
EXACT_ONLY_OPS = ("mul_mat_f16dot",)


def _load(module: str, ops: tuple[str, ...]):
    try:
        compiled = importlib.import_module(f".{module}", __package__)
        ffi, klib = compiled.ffi, compiled.lib
    except ImportError as exc:
        return None, f"compiled kernels not built ({exc})"
    offsets = ffi.new("int64_t[5]")
    klib.pg_tensor_layout(offsets)
    want = [getattr(lib.ggml_tensor, name).offset for name in ("type", "ne", "nb", "src", "data")]
    if list(offsets) != want:
        return None, f"struct ggml_tensor layout differs (kernels {list(offsets)}, binding {want})"

    def address(name: str) -> int:
        return int(ffi.cast("uintptr_t", ffi.addressof(klib, name)))

    symbols = {op: SYMBOLS[op] for op in ops}
    missing = [sym for sym, _ in symbols.values() if not hasattr(klib, sym)]
    if not hasattr(klib, "pg_scratch_failures"):  # read around every compute
        missing.append("pg_scratch_failures")
    if missing:
        return None, f"compiled kernels are from another version (missing {', '.join(missing)}; reinstall)"
    table = {op: kind(address(sym)) for op, (sym, kind) in symbols.items()}
    table["f16c"] = bool(klib.pg_has_f16c())
    table["rowdot"] = int(getattr(klib, "pg_rowdot_lanes", lambda: 0)())  # floats per vector; 0: none
    table["by_address"] = {address(sym): op for op, (sym, _) in symbols.items()}
    table["module"] = compiled
    return table, None


OPS, UNAVAILABLE_REASON = _load("_kernels", tuple(op for op in SYMBOLS if op not in EXACT_ONLY_OPS))
AVAILABLE = OPS is not None
if not AVAILABLE:
    log.info("custom CPU kernels unavailable: %s; using plain ggml ops", UNAVAILABLE_REASON)
_EXACT, EXACT_UNAVAILABLE_REASON = _load("_kernels_exact", EXACT_OPS) if AVAILABLE else (None, UNAVAILABLE_REASON)
EXACT_AVAILABLE = _EXACT is not None
if AVAILABLE and not EXACT_AVAILABLE:
    log.info("exact CPU kernels unavailable: %s; the s2cpp precision uses plain ggml ops", EXACT_UNAVAILABLE_REASON)


def _f16dot_check() -> tuple[int, int, str | None]:
    """(lanes, F32 mode, None) of the exact build's products (csrc/ggmldot.c) if its F16 product sums
    as this ggml build's ``vec_dot`` of F16 does, else (0, 0, why). The F32 mode is how ggml's
    compiler built the leftovers of its F32 ``vec_dot`` (gd_finish_f32's mode), 0 where none of
    them matches (F32 products then stay with ggml). Checked, not assumed: products of random rows
    (some of a large magnitude, lengths with and without leftovers past whole steps) against
    ggml's own functions, every output bit for bit."""
    if not EXACT_AVAILABLE:
        return 0, 0, EXACT_UNAVAILABLE_REASON
    if binding.has_llamafile():
        return 0, 0, "this ggml build has LLAMAFILE on: its products run tinyBLAS, not vec_dot"
    klib, ffi = _EXACT["module"].lib, _EXACT["module"].ffi
    lanes = int(klib.pg_f16dot_lanes())
    if not lanes:
        return 0, 0, "the exact kernels were built without AVX2 or AVX-512"
    k, differ = _f16dot_probe(klib, ffi, 0, lanes)
    if differ < 0:
        return 0, 0, f"its F16 product could not be checked: no memory for its scratch (K = {k})"
    if differ:
        return 0, 0, (f"its F16 product ({lanes} lanes) does not sum as this ggml build's vec_dot "
                      f"(K = {k}: {differ} outputs differ)")
    tail = next((mode for mode in (3, 4, 2, 1) if _f16dot_probe(klib, ffi, mode, lanes) == (0, 0)), 0)
    return lanes, tail, None


def _f16dot_probe(klib, ffi, mode: int, lanes: int) -> tuple[int, int]:
    """(K, outputs that differ) at the first K where ggmldot.c's products (F16 for ``mode`` 0, else
    F32 with that leftover mode) differ from ggml's vec_dot, else (0, 0); (K, -1) where a product could
    not be computed (its scratch refused)."""
    rng = np.random.default_rng(0)
    dtype = np.float32 if mode else np.float16
    # whole steps with and without leftovers, for the F16 product's lanes and for 16 float lanes (the
    # F32 product's in a half build, where the F16 product has 32)
    for k in sorted({1, 7, 9, 63, 64, 67, 87, 4 * lanes - 1, 4 * lanes, 4 * lanes + 3, 4 * lanes + 23, 640, 1001}):
        m, n = 5, 7
        a = (rng.standard_normal((m, k)) * rng.choice([1.0, 64.0], (m, 1))).astype(dtype)
        b = rng.standard_normal((n, k)).astype(dtype)
        c = np.empty((n, m), np.float32)
        if klib.pg_f16dot_product(mode, m, n, k, ffi.cast("void *", a.ctypes.data), ffi.cast("void *", b.ctypes.data),
                                  ffi.cast("float *", c.ctypes.data)) < 0:
            return k, -1  # no scratch memory: nothing computed, so nothing shown to agree
        want = np.array([[binding.vec_dot(a[i], b[j]) for i in range(m)] for j in range(n)], np.float32)
        if not np.array_equal(c.view(np.uint32), want.view(np.uint32)):
            return k, int((c.view(np.uint32) != want.view(np.uint32)).sum())
    return 0, 0


# Every 1999th float bit pattern, each with both signs: 2.1 M values, 10-25 ms at import.
SINF_CHECK_STEP = 1999


def _sinf_check() -> tuple[int, str | None]:
    """(lanes, None) where the exact build's vector replica of glibc's sinf (csrc/elementwise.c)
    gives this process's libm ``sinf`` bit for bit on every SINF_CHECK_STEP-th float, of both signs
    (the Snake of the "s2cpp" precision then runs it), else (0, why): that Snake keeps libm's scalar
    ``sinf``, the same values more slowly. Checked, not assumed: another libm (an older glibc, its
    variant without FMA, musl) computes other bits."""
    if not EXACT_AVAILABLE:
        return 0, EXACT_UNAVAILABLE_REASON
    klib = _EXACT["module"].lib
    if not hasattr(klib, "pg_sinf_exact_lanes"):
        return 0, "the exact kernels are from another version (reinstall)"
    lanes = int(klib.pg_sinf_exact_lanes())
    if not lanes:
        return 0, "the exact kernels were built without AVX2 and FMA"
    differ = int(klib.pg_sinf_exact_check(0, 1 << 31, SINF_CHECK_STEP))
    if differ:
        return 0, f"it differs from this process's libm sinf on {differ} of the floats checked"
    klib.pg_sinf_exact_use(1)
    return lanes, None


# libm's sinf in vectors for the exact Snake, where it reproduces this process's libm.
SINF_LANES, SINF_UNAVAILABLE_REASON = _sinf_check()
SINF = SINF_LANES > 0
if EXACT_AVAILABLE and not SINF:
    log.info("libm's sinf in vectors unavailable: %s; the s2cpp Snake calls libm per value", SINF_UNAVAILABLE_REASON)

# ggml's F16 and F32 products in register blocks (the "s2cpp" precision's matrix products), where
# they reproduce this ggml build's sums; else ggml's mul_mat runs them.
F16DOT_LANES, F16DOT_F32_TAIL, F16DOT_UNAVAILABLE_REASON = _f16dot_check()
F16DOT = F16DOT_LANES > 0
if EXACT_AVAILABLE and not F16DOT:
    log.info("ggml's products in blocks unavailable: %s; the s2cpp precision uses ggml's mul_mat",
             F16DOT_UNAVAILABLE_REASON)


def _table(exact: bool) -> dict:
    return _EXACT if exact else OPS


def scratch_failures() -> int:
    """Scratch takes refused so far (both builds): a kernel refused its scratch memory leaves its
    output unset, so a compute during which this grew must not return its outputs."""
    return sum(int(t["module"].lib.pg_scratch_failures()) for t in (OPS, _EXACT) if t is not None)


# ggml keeps a custom op's callback, thread count and userdata in its op parameters:
# {fun, int n_tasks, userdata}, the pointer after the int aligned to 8 bytes.
_CALLBACK, _N_TASKS, _USERDATA = 0, 8, 16


def _op_params(node) -> int:
    """The address of a node's op parameters."""
    return ctypes.addressof(node.contents) + lib.ggml_tensor.op_params.offset


def kernel_name(node) -> str | None:
    """Which of these kernels a CUSTOM / MAP_CUSTOM2 node runs (its callback is the first
    field of the op parameters ggml stores), or None."""
    if not AVAILABLE:
        return None
    address = ctypes.c_void_p.from_address(_op_params(node) + _CALLBACK).value
    exact = _EXACT["by_address"].get(address) if EXACT_AVAILABLE else None
    return f"{exact} (exact)" if exact else OPS["by_address"].get(address)


TIMED_THREADS = 64  # threads whose entry and exit a timed call records (Graph.timeline)


def timed_calls(nodes) -> tuple[list[tuple[int, np.ndarray]], Callable[[], None]]:
    """Route each node of ``nodes`` (``(index, node)``) that runs one of these kernels through the
    build's timed call (csrc/timeline.c), which reads the clock on each thread's entry and exit.
    Returns ``(index, stamps)`` for those nodes, ``stamps`` int64 ``[TIMED_THREADS, 2]`` (ns; -1
    where a thread did not run the op), and the function that restores every node's own callback
    and userdata. Nothing else changes: the kernel gets its own userdata and computes its values."""
    if not AVAILABLE:
        raise RuntimeError(f"no compiled kernels to time: {UNAVAILABLE_REASON}")
    klib, ffi = OPS["module"].lib, OPS["module"].ffi
    if not hasattr(klib, "pg_timed"):
        raise RuntimeError("the compiled kernels are from another version (no pg_timed; reinstall)")
    wrappers = {name: int(ffi.cast("uintptr_t", ffi.addressof(klib, name))) for name in ("pg_timed", "pg_timed2")}
    originals, timed = [], []
    try:
        for index, node in nodes:
            name = kernel_name(node)
            if name is None:
                continue
            at = _op_params(node)
            fun = ctypes.c_void_p.from_address(at + _CALLBACK).value
            userdata = ctypes.c_void_p.from_address(at + _USERDATA).value
            if ctypes.c_int32.from_address(at + _N_TASKS).value != N_TASKS_MAX:
                raise RuntimeError(f"node {index}: its op parameters are not laid out as this version expects")
            block = np.full(3 + 8 * TIMED_THREADS, -1, dtype=np.int64)
            block[:3] = fun, userdata or 0, TIMED_THREADS
            two = SYMBOLS[name.split(" ")[0]][1] is lib.ggml_custom2_op_t  # a MAP_CUSTOM2 op's callback
            originals.append((at, fun, userdata, block))
            ctypes.c_void_p.from_address(at + _USERDATA).value = block.ctypes.data
            ctypes.c_void_p.from_address(at + _CALLBACK).value = wrappers["pg_timed2" if two else "pg_timed"]
            timed.append((index, block[3:].reshape(TIMED_THREADS, 8)[:, :2]))
    except BaseException:
        _restore(originals)
        raise
    return timed, lambda: _restore(originals)


def _restore(originals) -> None:
    for at, fun, userdata, _ in originals:
        ctypes.c_void_p.from_address(at + _CALLBACK).value = fun
        ctypes.c_void_p.from_address(at + _USERDATA).value = userdata


def clock_ns() -> int:
    """The clock the timed calls read (CLOCK_MONOTONIC), in ns."""
    return int(OPS["module"].lib.pg_clock_ns())


# In place (``in_place=True``): the result is a view of the first source, written over it. The
# caller promises that nothing reads that source after this op. The values are those of the
# op with its own output: the kernels then compute each chunk of a row into a buffer before
# copying it over the inputs it came from. One buffer less to write: the output's cache lines are
# those just read, not new ones fetched from memory before they are written.


def snake(ctx, x, alpha, exact: bool = False, in_place: bool = False):
    """x + sin(alpha x)^2 / alpha in one op (contiguous F32 x and alpha, alpha [1, C] or [C, 1]);
    ``exact``: the exact build (ggml's values, bit for bit); ``in_place``: over x."""
    if in_place and not lib.ggml_is_contiguous(x):
        raise ValueError("snake in place needs a contiguous input")
    make = lib.ggml_map_custom2_inplace if in_place else lib.ggml_map_custom2
    return make(ctx, x, alpha, _table(exact)["snake"], N_TASKS_MAX, None)


def _custom(ctx, dst_type: int, like, srcs: list, op: str, exact: bool = False, in_place: bool = False):
    if in_place:  # over srcs[0], which ggml makes the op's first source
        if dst_type != int(srcs[0].contents.type) or not lib.ggml_is_contiguous(srcs[0]):
            raise ValueError(f"{op} in place needs a contiguous input of its output's type")
        args = (ctypes.POINTER(lib.ggml_tensor) * (len(srcs) - 1))(*srcs[1:])
        return lib.ggml_custom_inplace(ctx, srcs[0], args, len(srcs) - 1, _table(exact)[op], N_TASKS_MAX, None)
    args = (ctypes.POINTER(lib.ggml_tensor) * len(srcs))(*srcs)
    ne = [int(like.contents.ne[i]) for i in range(4)]
    return lib.ggml_custom_4d(ctx, dst_type, *ne, args, len(srcs), _table(exact)[op], N_TASKS_MAX, None)


def bias_snake(ctx, x, alpha, bias, dst_type: int, exact: bool = False, in_place: bool = False):
    """snake(x + bias) in one pass; contiguous F32 x, alpha and bias shaped alike to broadcast
    (``[C, 1]`` for channels-last x, ``[1, C]`` for channels-first); F32 or F16 (type 1) out;
    ``in_place``: over x (F32 out)."""
    return _custom(ctx, dst_type, x, [x, alpha, bias], "bias_snake", exact, in_place)


def add_bias_residual(ctx, h, bias, x, exact: bool = False, in_place: bool = False):
    """(h + bias) + x in one pass; contiguous F32 h and x of one shape, bias broadcast as above;
    ``in_place``: over h."""
    return _custom(ctx, 0, h, [h, bias, x], "add_bias_residual", exact, in_place)


def add_bias(ctx, h, bias, exact: bool = False):
    """h + bias (ggml_add's values), contiguous out; F32 h contiguous or 2-D with contiguous rows
    (read in place), bias broadcast as above: ggml's CPU add runs a scalar loop with a modulo per
    element for a bias of one value per row (a channels-first conv's)."""
    return _custom(ctx, 0, h, [h, bias], "add_bias_residual", exact)


def transpose(ctx, x):
    """``ggml_cont(ggml_transpose(x))`` for contiguous 2-D F32 ``x`` (a copy, in 8 x 8 blocks)."""
    args = (ctypes.POINTER(lib.ggml_tensor) * 1)(x)
    return lib.ggml_custom_4d(ctx, 0, int(x.contents.ne[1]), int(x.contents.ne[0]), 1, 1, args, 1, OPS["transpose"],
                              N_TASKS_MAX, None)


def col2im(ctx, cols, k: int, stride: int, keep: list, prev=None, segments: int = 1, bias=None,
           n_keep: int | None = None):
    """``ggml_col2im_1d(cols, stride, Cout, 0)`` for contiguous F32 ``cols`` ``[K*Cout, T]``:
    ``[(T-1)*stride + K, Cout]``, same values. ggml 0.15.3's CPU op ran the decoder's last
    conv-transpose (192 -> 96 channels, 1 s) in 105-203 ms on one thread. ``prev`` (F32
    ``[P, Cout]``, contiguous rows): a stream's overlap from its last chunk, the first P outputs'
    start (as the earlier columns would have summed there in one pass).

    ``segments`` S > 1: a batched step, S streams' ``T / S`` columns in turn, each overlap-added
    alone from its own ``prev`` (``[P, Cout, 1, S]``): each stream's ``T / S * stride`` samples in
    turn, then K - stride zeros (its next overlap, past them, is not kept; the rows keep ggml's
    length, which also keeps them off power-of-two strides).

    ``n_keep``: the first ``n_keep`` samples alone, ``[n_keep, Cout]`` (with segments, all of the
    streams' ``T * stride``, no zeros after them); ``bias`` (contiguous F32, Cout values): each
    sample plus its channel's bias. The values of ggml_add after a view of them, with no pass over
    the output after it."""
    t_in = int(cols.contents.ne[1])
    if segments > 1 and (t_in % segments or prev is None or int(prev.contents.ne[3]) != segments
                         or k - stride > t_in // segments * stride):
        raise ValueError(f"{segments} segments of a conv-transpose over {t_in} columns")
    cout = int(cols.contents.ne[0]) // k
    n_out = (t_in - 1) * stride + k
    if bias is not None and int(lib.ggml_nelements(bias)) != cout:
        raise ValueError(f"a conv-transpose's bias needs one value per channel ({cout}), "
                         f"got {int(lib.ggml_nelements(bias))}")
    if n_keep is not None and (not 0 < n_keep <= n_out or segments > 1 and n_keep != t_in * stride):
        want = f"{t_in * stride} (every stream's samples)" if segments > 1 else f"1 to {n_out}"
        raise ValueError(f"keep {want} samples of a conv-transpose, not {n_keep}")
    params = np.array([k, stride, segments, bias is not None], dtype=np.int64)
    keep.append(params)
    srcs = [cols] + ([] if prev is None else [prev]) + ([] if bias is None else [bias])
    args = (ctypes.POINTER(lib.ggml_tensor) * len(srcs))(*srcs)
    return lib.ggml_custom_4d(ctx, 0, n_out if n_keep is None else n_keep, cout, 1, 1, args, len(srcs),
                              OPS["col2im"], N_TASKS_MAX, params.ctypes.data_as(ctypes.c_void_p))


def im2col_supported(dst_type: int, k: int, with_prev: bool, dilation: int) -> bool:
    """For F16 columns: there ggml's im2col ran at 0.8-1.0 GB/s and this one at 2.7-4.5
    (same run). For F32 columns of an undilated conv (the encoder's strided convs), this one
    copies each channel's taps as whole vectors, a column at a time, with streaming stores:
    0.29-0.64x ggml's time on the encoder's four (64-512 channels, K 4-16, 28-226 MB of
    columns; 2 threads, paired). Dilated F32 columns ran at ggml's pace and keep ggml's op,
    except where the kernel reads a streamed conv's carried context in place (``with_prev``),
    which saves a concat (single-threaded in ggml) and its copy of the input."""
    if not AVAILABLE or k > MAX_KERNEL:
        return False
    return dst_type == 1 or (dst_type == 0 and (with_prev or dilation == 1))


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
    return lib.ggml_custom_4d(ctx, dst_type, ic * k, n_out, 1, 1, args, len(srcs), OPS["im2col"], N_TASKS_MAX,
                              params.ctypes.data_as(ctypes.c_void_p))


# --------------------------------------------------------------------------- BLAS

if AVAILABLE:
    BLAS, BLAS_UNAVAILABLE_REASON = find_blas()
else:
    BLAS, BLAS_UNAVAILABLE_REASON = None, UNAVAILABLE_REASON or "compiled kernels unavailable"
if BLAS is None:
    log.info("BLAS matrix products unavailable: %s; using ggml's mul_mat", BLAS_UNAVAILABLE_REASON)


BLAS_MIN_SIDE = 16  # a product with fewer rows or columns (a streamed transformer's one token)
# is a matrix-vector product: sgemm packs all of the weights for it, ggml's mul_mat reads them
# once (measured on a 1-token stream chunk: [3072 x 1024] . [1024] 22 ms in OpenBLAS, 11 in ggml)


def rows_contiguous(t) -> bool:
    """An F32 or F16 tensor whose rows' elements are adjacent, its rows a whole number of elements apart."""
    size = 2 if int(t.contents.type) == 1 else 4
    return int(t.contents.nb[0]) == size and int(t.contents.nb[1]) % size == 0


def _broadcasts(a, b) -> bool:
    """ggml_mul_mat's broadcast of ``a`` over ``b``'s batches."""
    return int(b.contents.ne[2]) % int(a.contents.ne[2]) == 0 and int(b.contents.ne[3]) % int(a.contents.ne[3]) == 0


def mul_mat_blas_supported(a, b) -> bool:
    """Both F32 with contiguous rows, ggml's broadcast of ``a`` over ``b``'s batches, and both
    sides of the product at least ``BLAS_MIN_SIDE``."""
    if BLAS is None or min(int(a.contents.ne[1]), int(b.contents.ne[1])) < BLAS_MIN_SIDE:
        return False
    return all(int(t.contents.type) == 0 and rows_contiguous(t) for t in (a, b)) and _broadcasts(a, b)


def mul_mat_blas(ctx, a, b):
    """``ggml_mul_mat(a, b)`` (F32) computed by the BLAS: ne ``[a.ne1, b.ne1, b.ne2, b.ne3]``."""
    args = (ctypes.POINTER(lib.ggml_tensor) * 2)(a, b)
    ne = (int(a.contents.ne[1]), int(b.contents.ne[1]), int(b.contents.ne[2]), int(b.contents.ne[3]))
    return lib.ggml_custom_4d(ctx, 0, *ne, args, 2, OPS["mul_mat_blas"], N_TASKS_MAX,
                              BLAS.params.ctypes.data_as(ctypes.c_void_p))


CONV_CHUNK_BYTES = 4 << 20  # a chunk's output (Cout x chunk F32): 4 MiB measured best of 0.25-4 MiB and unchunked
# Thread blocks of conv_taps: time blocks of >= CONV_MIN_COLUMNS (each packs a tap's weights);
# signals shorter than CONV_SPLIT_CHANNELS_BELOW split the output channels instead, in blocks
# of >= CONV_MIN_CHANNELS. Shape-only choices, so results never depend on the thread count.
CONV_MIN_COLUMNS, CONV_MIN_CHANNELS, CONV_SPLIT_CHANNELS_BELOW = 128, 64, 256


def check_context(prev, k: int, dilation: int, cin: int, segments: int = 1) -> None:
    """ValueError unless ``prev`` is a conv's carried context as the kernels read it: F32 ne
    ``[(K-1)*dilation, Cin]``, or ``[(K-1)*dilation, S, Cin]`` for S segments (the C reads that many
    samples per channel and stream, wherever the tensor ends)."""
    if prev is None:
        return
    ne = [int(prev.contents.ne[i]) for i in range(4)]
    want = [(k - 1) * dilation, cin, 1, 1] if segments == 1 else [(k - 1) * dilation, segments, cin, 1]
    if ne != want or binding.tensor_type(prev) != 0:
        raise ValueError(f"a conv's carried context must be F32 ne {want}, got type {binding.tensor_type(prev)} ne {ne}")


def conv_taps(ctx, w, x, k: int, dilation: int, keep: list, prev=None, segments: int = 1):
    """Causal stride-1 conv of CF ``x`` (F32 ne ``[L, Cin]``, contiguous rows) by per-tap
    matrices ``w`` (contiguous F32 ne ``[Cin, Cout, K]``): CF ``[L, Cout]``, one sgemm per tap
    and no im2col. ``prev`` (F32 ne ``[(K-1)*dilation, Cin]``): the carried left context,
    read in place where the zeros of causal padding stand. ``keep`` outlives the graph.

    ``segments`` S > 1: a batched step, S streams of L / S samples each in turn, each convolved
    after its own context, ``prev`` ne ``[(K-1)*dilation, S, Cin]`` (each read in place)."""
    cout = int(w.contents.ne[1])
    length = int(x.contents.ne[0])
    if segments > 1 and (length % segments or prev is None or int(prev.contents.ne[1]) != segments):
        raise ValueError(f"{segments} segments of a conv over {length} samples")
    check_context(prev, k, dilation, int(w.contents.ne[0]), segments)
    chunk = max(64, CONV_CHUNK_BYTES // (4 * cout) // 16 * 16)
    params = np.concatenate([BLAS.params, np.array([k, dilation, chunk, CONV_MIN_COLUMNS, CONV_MIN_CHANNELS,
                                                    CONV_SPLIT_CHANNELS_BELOW, segments], dtype=np.int64)])
    keep.append(params)
    srcs = [w, x] if prev is None else [w, x, prev]
    args = (ctypes.POINTER(lib.ggml_tensor) * len(srcs))(*srcs)
    return lib.ggml_custom_4d(ctx, 0, length, cout, 1, 1, args, len(srcs), OPS["conv_taps"],
                              N_TASKS_MAX, params.ctypes.data_as(ctypes.c_void_p))


# --------------------------------------------------------------------------- row products

# Products by row dot products (csrc/rowdot.c): the weights read once in their stored type, no
# packing; each output summed in one order whatever the column count. Against numpy's OpenBLAS
# sgemm, single-threaded, side by side, weights warm in cache ([3072 x 1024], [1024 x 4096],
# [768 x 768]): 4-6x faster at 4 columns, 2.1-2.4x at 16, equal at 32-64, 0.6-0.7x at 128; an F16
# matrix is read in half the bytes (a 1-column product 0.30 ms against 0.55; from memory such a
# product runs at the bandwidth, 13.6 GB/s on one core of the 2-core development VM).
# F32 matrices (an F32 file's, and an F16 file's codebook projections): with 8-float vectors the
# products of fewer than BLAS_MIN_SIDE columns, where ggml's matrix-vector product ran before (a
# streamed chunk of 1-3 frames), so that a one-shot decode's products (16 columns and more) keep
# the BLAS's sums: the f32 bound for streams, 1e-6 max abs against one graph at full size, sits at
# float32 rounding (9.2-9.7e-7 measured so; taking up to 48 columns moved a 16-frame-chunk stream
# of the F32 file to 1.06e-6). With 16-float vectors, at every column count, like F16 matrices:
# then every product of the decoder's latent stage sums each output in one order whatever the
# chunk, and a stream's latent is decode()'s bit for bit (OpenBLAS's sums change with the column
# count: a codebook's 8 x 1024 projection over 4 columns and over 32 differed).
# F16 matrices: up to ROWDOT_MAX_N_F16 columns (8-float vectors), then upcast block by block for the BLAS, whose
# upcast costs a read and a write of every weight per call (at 16 columns, a 16-frame chunk's
# transformer, that was 8-10 ms per frame more than the row products).
# With 16-float vectors (AVX-512) F16 matrices take the row products at every column count: against
# the upcast for the BLAS they ran two 64-frame decodes in 2.79-3.02 s against 3.10-3.14 (48
# columns at most), 8 streams of 16 frames in 8-frame steps in 2.97-3.22 against 3.43-3.45 (two
# codecs side by side in one process, 2 threads).
ROWDOT_MAX_N = BLAS_MIN_SIDE - 1
ROWDOT_MAX_N_F16 = 48
ROWDOT_MAX_N_F16_16 = 1 << 40
ROWDOT_MAX_N_F32_16 = 1 << 40
ROWDOT_PANEL_BYTES = 1 << 20  # the columns whose rows stay in L2 while the weights pass
ROWDOT = bool(AVAILABLE and OPS["rowdot"] and OPS["f16c"] and BLAS is not None)


ROWDOT_Q8_0 = int(lib.GGML_TYPE_Q8_0)  # its rows read by the row products, dequantized in registers


def mul_mat_rowdot_supported(a, b) -> bool:
    """F32, F16 or Q8_0 ``a`` and F32 ``b`` with contiguous rows, ggml's broadcast of ``a`` over ``b``'s
    batches, and either an F16 ``a`` or at most ``rowdot_max_columns(F32)`` columns (a Q8_0 ``a``
    is read as the F32 matrix it dequantizes to: the same values, and the same choice)."""
    ta = int(a.contents.type)
    if not ROWDOT or int(b.contents.type) != 0 or ta not in (0, 1, ROWDOT_Q8_0):
        return False
    k = int(a.contents.ne[0])
    a_rows = not k % 32 and int(a.contents.nb[1]) == k // 32 * 34 if ta == ROWDOT_Q8_0 else rows_contiguous(a)
    if not (a_rows and rows_contiguous(b)) or (ta != 1 and int(b.contents.ne[1]) > rowdot_max_columns(0)):
        return False
    return _broadcasts(a, b)


def rowdot_max_columns(a_type: int) -> int:
    """The most columns a product against a matrix of ``a_type`` (F32 0, F16 1) takes by rows."""
    if OPS["rowdot"] >= 16:
        return ROWDOT_MAX_N_F16_16 if a_type == 1 else ROWDOT_MAX_N_F32_16
    return ROWDOT_MAX_N_F16 if a_type == 1 else ROWDOT_MAX_N


def mul_mat_rowdot(ctx, a, b, keep: list):
    """``ggml_mul_mat(a, b)`` (F32, F16 or Q8_0 ``a``, F32 ``b``) by row dot products: ne
    ``[a.ne1, b.ne1, b.ne2, b.ne3]``. ``keep`` outlives the graph (the parameter block)."""
    k = int(a.contents.ne[0])
    max_n = rowdot_max_columns(int(a.contents.type))
    params = np.concatenate([np.array([max(4, ROWDOT_PANEL_BYTES // (4 * k)), max_n], dtype=np.int64), BLAS.params])
    keep.append(params)
    args = (ctypes.POINTER(lib.ggml_tensor) * 2)(a, b)
    ne = (int(a.contents.ne[1]), int(b.contents.ne[1]), int(b.contents.ne[2]), int(b.contents.ne[3]))
    return lib.ggml_custom_4d(ctx, 0, *ne, args, 2, OPS["mul_mat_rowdot"], N_TASKS_MAX,
                              params.ctypes.data_as(ctypes.c_void_p))


CONV_C1_MAX_K = 16  # taps of one vector: one lane class per tap, as the row products take them


def conv_c1_supported(w, x, b=None) -> bool:
    """Whether :func:`conv_c1` takes a causal stride-1 conv from one channel: F32 contiguous
    ``w [K, 1, Cout]`` (K <= CONV_C1_MAX_K), ``x [L, 1]`` and ``b`` (Cout values, or None), on the
    16-float row products whose sums it reproduces, and a ``Cout`` those row products would take (the
    im2col product it replaces: ``mul_mat_rowdot_supported`` of its columns and weights)."""
    if not (ROWDOT and OPS["rowdot"] >= 16):
        return False
    ne_w = [int(w.contents.ne[i]) for i in range(4)]
    ne_x = [int(x.contents.ne[i]) for i in range(4)]
    tensors = [w, x] + ([b] if b is not None else [])
    if any(int(t.contents.type) != 0 or not lib.ggml_is_contiguous(t) for t in tensors):
        return False
    if b is not None and int(lib.ggml_nelements(b)) != ne_w[2]:
        return False
    return (ne_w[1] == 1 and ne_w[3] == 1 and 0 < ne_w[0] <= CONV_C1_MAX_K and ne_x[1:] == [1, 1, 1]
            and ne_w[2] <= rowdot_max_columns(0))


def conv_c1(ctx, w, x, b=None):
    """The causal stride-1 conv of ``x [L, 1]`` by ``w [K, 1, Cout]``, plus ``b``: ne ``[L, Cout]``
    (channels-first), with the bits of ggml's im2col columns through :func:`mul_mat_rowdot` and
    then the bias (``conv_c1_supported`` says where)."""
    srcs = [w, x] + ([b] if b is not None else [])
    args = (ctypes.POINTER(lib.ggml_tensor) * len(srcs))(*srcs)
    return lib.ggml_custom_4d(ctx, 0, int(x.contents.ne[0]), int(w.contents.ne[2]), 1, 1, args, len(srcs),
                              OPS["conv_c1"], N_TASKS_MAX, None)


# --------------------------------------------------------------------------- ggml's F16 product

F16DOT_PANEL_BYTES = 512 << 10  # the columns (F16 rows) that stay in L2 while the other operand's rows pass


def mul_mat_f16dot_supported(a, b) -> bool:
    """F16 ``a`` and F16 or F32 ``b``, or both F32, with contiguous rows, ggml's broadcast of ``a``
    over ``b``'s batches, where the exact build's products reproduce this ggml build (:data:`F16DOT`)."""
    ta, tb = int(a.contents.type), int(b.contents.type)
    if not F16DOT or (ta, tb) not in ((1, 1), (1, 0), (0, 0)) or (ta == 0 and not F16DOT_F32_TAIL):
        return False
    return rows_contiguous(a) and rows_contiguous(b) and _broadcasts(a, b)


def mul_mat_f16dot(ctx, a, b, keep: list):
    """``ggml_mul_mat(a, b)`` with ggml's values bit for bit (each output is ggml_vec_dot_f16 of its
    two rows, an F32 ``b`` rounded to F16 first, or ggml_vec_dot_f32 where both are F32), computed in
    register blocks: ne ``[a.ne1, b.ne1, b.ne2, b.ne3]``. ``keep`` outlives the graph (the parameter
    block)."""
    k = int(a.contents.ne[0])
    size = 4 if int(a.contents.type) == 0 else 2
    params = np.array([max(8, F16DOT_PANEL_BYTES // (size * k)), F16DOT_F32_TAIL], dtype=np.int64)
    keep.append(params)
    args = (ctypes.POINTER(lib.ggml_tensor) * 2)(a, b)
    ne = (int(a.contents.ne[1]), int(b.contents.ne[1]), int(b.contents.ne[2]), int(b.contents.ne[3]))
    return lib.ggml_custom_4d(ctx, 0, *ne, args, 2, _EXACT["mul_mat_f16dot"], N_TASKS_MAX,
                              params.ctypes.data_as(ctypes.c_void_p))

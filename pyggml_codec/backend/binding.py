"""The one module that imports the ggml binding (``ggml-python``).

Everything else in the package reaches ggml through the names exported here, so that
the binding can be swapped or patched in one place. On import this module:

* checks that the binding wraps the ggml version this package was written for;
* repairs the return types that ``ggml-python`` 0.0.45 declares as ``NewType`` (which
  ctypes treats as a 32-bit C ``int``, truncating 64-bit pointers);
* routes ggml's log lines into the ``pyggml_codec.ggml`` logger;
* sets ``GGML_NO_BACKTRACE`` so that an abort never tries to attach a debugger.

Shape convention, written once: ggml's ``ne`` lists dimensions fastest first, numpy
lists them slowest first, so a ggml tensor with ``ne = [T, C]`` is a numpy array of shape
``(C, T)``. Helpers here convert between the two.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import mmap
import os
import sys
from typing import Any

import numpy as np

os.environ.setdefault("GGML_NO_BACKTRACE", "1")

import ggml as _binding  # noqa: E402  (the environment variable must be set first)
from ggml import ggml as lib  # noqa: E402

EXPECTED_GGML_VERSION = "0.15.3"
EXPECTED_BINDING_VERSION = "0.0.45"

if getattr(lib, "GGML_VERSION", None) != EXPECTED_GGML_VERSION:  # pragma: no cover
    raise ImportError(
        f"pyggml_codec needs ggml-python {EXPECTED_BINDING_VERSION} (ggml {EXPECTED_GGML_VERSION}); "
        f"found a binding for ggml {getattr(lib, 'GGML_VERSION', '?')}"
    )

BINDING_VERSION = getattr(_binding, "__version__", "?")

# Functions whose restype ggml-python declares as a NewType: the pointer would be cut
# to 32 bits. Repaired once, at import.
_POINTER_RETURNING = (
    "ggml_backend_alloc_buffer",
    "ggml_backend_cpu_buffer_from_ptr",
    "ggml_backend_cpu_buffer_type",
    "ggml_backend_sched_get_tensor_backend",
    "ggml_backend_vk_buffer_type",
    "ggml_backend_vk_host_buffer_type",
)
for _name in _POINTER_RETURNING:
    _fn = getattr(lib, _name, None)
    if _fn is not None and hasattr(_fn, "restype"):
        _fn.restype = ctypes.c_void_p

# --------------------------------------------------------------------------- logging

ggml_logger = logging.getLogger("pyggml_codec.ggml")
_LEVELS = {1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR, 5: logging.DEBUG}
_pending_line: list[str] = []


@lib.ggml_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:  # pragma: no cover - C callback
    try:
        message = text.decode("utf-8", "replace") if text else ""
        _pending_line.append(message)
        if message.endswith("\n"):
            line = "".join(_pending_line).rstrip("\n")
            _pending_line.clear()
            ggml_logger.log(_LEVELS.get(level, logging.INFO), "%s", line)
    except Exception:  # never let an exception cross the C boundary
        pass


lib.ggml_log_set(_log_callback, None)

# --------------------------------------------------------------------------- constants

TYPE_F32 = lib.GGML_TYPE_F32
TYPE_F16 = lib.GGML_TYPE_F16
TYPE_I32 = lib.GGML_TYPE_I32
TYPE_I64 = lib.GGML_TYPE_I64  # ggml_set_rows' row indices
TYPE_NAMES = {TYPE_F32: "F32", TYPE_F16: "F16", TYPE_I32: "I32", TYPE_I64: "I64"}
NP_DTYPES = {TYPE_F32: np.float32, TYPE_F16: np.float16, TYPE_I32: np.int32, TYPE_I64: np.int64}
MAX_NAME = lib.GGML_MAX_NAME
DEVICE_TYPE_NAMES = {
    lib.GGML_BACKEND_DEVICE_TYPE_CPU: "cpu",
    lib.GGML_BACKEND_DEVICE_TYPE_GPU: "gpu",
    lib.GGML_BACKEND_DEVICE_TYPE_IGPU: "igpu",
    lib.GGML_BACKEND_DEVICE_TYPE_ACCEL: "accel",
}


def ggml_version() -> str:
    return lib.ggml_version().decode()


def has_llamafile() -> bool:
    return bool(lib.ggml_cpu_has_llamafile())


class _Feature(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p)]


def cpu_features() -> dict[str, str]:
    """The CPU backend's compiled features (``ggml_backend_get_features``: ISA extensions such
    as AVX2 / AVX512, LLAMAFILE, OPENMP, REPACK), as ggml reports them; {} if it has none."""
    reg = lib.ggml_backend_reg_by_name(b"CPU")
    address = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_get_features") if reg else None
    if not address:
        return {}
    features = ctypes.CFUNCTYPE(ctypes.POINTER(_Feature), ctypes.c_void_p)(address)(reg)
    out, i = {}, 0
    while features[i].name:
        out[features[i].name.decode()] = features[i].value.decode() if features[i].value else ""
        i += 1
    return out


F16_DOT_PROBE_N = 128  # one step of ggml's AVX512-FP16 F16 loop (4 x 32 half lanes)


def f16_dot_sums_in_half() -> bool:
    """Whether ggml's F16 dot product (the CPU ``vec_dot`` of F16, which F16 matrix products
    run) adds in half precision, as a ggml built for AVX512-FP16 does (``__AVX512FP16__``:
    32 half lanes), rather than in single precision (16 or 8 float lanes). ggml's feature
    report does not say; measured instead: [2048, 1, 0, ...] . [1, 1, ...] over 128 elements
    is 2048 in half precision (2049 rounds to even) and 2049 in single."""
    x = np.zeros(F16_DOT_PROBE_N, np.float16)
    x[:2] = (2048, 1)
    value = vec_dot(x, np.ones(F16_DOT_PROBE_N, np.float16))
    if value not in (2048.0, 2049.0):  # pragma: no cover - neither order: a new kernel
        raise RuntimeError(f"ggml's F16 dot product gave {value} on its probe (2048 or 2049 expected)")
    return value == 2048.0


def vec_dot(x: np.ndarray, y: np.ndarray) -> float:
    """ggml's CPU ``vec_dot`` of F16 or F32 (by the arrays' dtype: what its matrix products of that
    type compute for each output) over two contiguous vectors of one length and type."""
    x, y = np.ascontiguousarray(x), np.ascontiguousarray(y)
    types = {np.dtype(np.float16): TYPE_F16, np.dtype(np.float32): TYPE_F32}
    if x.shape != y.shape or x.ndim != 1 or x.dtype != y.dtype or x.dtype not in types:
        raise ValueError(f"vec_dot of {x.dtype} {x.shape} and {y.dtype} {y.shape}: two float16 or float32 vectors")
    out = ctypes.c_float(0.0)
    _vec_dot_function(types[x.dtype])(x.size, ctypes.byref(out), 0, x.ctypes.data, 0, y.ctypes.data, 0, 1)
    return out.value


@functools.cache
def _vec_dot_function(ggml_type: int):
    """ggml's CPU vec_dot of ``ggml_type`` as a ctypes function (looked up once per type)."""
    lib.ggml_cpu_init()  # the leftover loop reads ggml's F16 table, filled here
    address = ctypes.cast(lib.ggml_get_type_traits_cpu(ggml_type).contents.vec_dot, ctypes.c_void_p).value
    return ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t, ctypes.c_void_p,
                            ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)(address)


def compiled_backends() -> set[str]:
    """GPU backends compiled into this ggml build, whether or not a device of theirs is usable."""
    inits = {"cuda": "ggml_backend_cuda_init", "metal": "ggml_backend_metal_init", "vulkan": "ggml_backend_vk_init"}
    return {name for name, fn in inits.items() if hasattr(lib.lib, fn)}


def binding_version() -> str:
    """The installed ggml-python's version."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("ggml-python")
    except PackageNotFoundError:  # pragma: no cover - an uninstalled checkout of the binding
        return getattr(_binding, "__version__", "unknown")


# --------------------------------------------------------------------------- tensor helpers


def ne(tensor) -> tuple[int, ...]:
    """The ggml shape of ``tensor`` (fastest dimension first), trailing 1s dropped."""
    dims = [int(tensor.contents.ne[i]) for i in range(4)]
    while len(dims) > 1 and dims[-1] == 1:
        dims.pop()
    return tuple(dims)


def numpy_shape(tensor) -> tuple[int, ...]:
    """The numpy shape of ``tensor``: its ``ne`` reversed."""
    return tuple(reversed(ne(tensor)))


def tensor_type(tensor) -> int:
    return int(tensor.contents.type)


def set_name(tensor, name: str) -> None:
    encoded = name.encode()
    if len(encoded) >= MAX_NAME:
        raise ValueError(f"tensor name {name!r} is {len(encoded)} bytes; ggml allows {MAX_NAME - 1}")
    lib.ggml_set_name(tensor, encoded)


# ggml's quantized types this library writes and loads (block-wise weights for matrix products)
QUANT_TYPES = {lib.GGML_TYPE_Q8_0: "Q8_0", lib.GGML_TYPE_Q6_K: "Q6_K", lib.GGML_TYPE_Q5_K: "Q5_K",
               lib.GGML_TYPE_Q4_K: "Q4_K"}


def block_size(ggml_type: int) -> int:
    """Elements per block of ``ggml_type`` (1 for F32 / F16, 32 or 256 for quantized types)."""
    return int(lib.ggml_blck_size(ggml_type))


def quantize_rows(rows: np.ndarray, ggml_type: int) -> np.ndarray:
    """``rows`` (float32, (n_rows, n_per_row), n_per_row a multiple of the block size) in
    ggml's ``ggml_type`` blocks, as raw bytes: what ``ggml_quantize_chunk`` writes, the same
    function llama.cpp's quantizer calls."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    n_rows, n_per_row = rows.shape
    if ggml_type not in QUANT_TYPES:
        raise ValueError(f"not a quantized type this library writes: {ggml_type}")
    if n_per_row % block_size(ggml_type):
        raise ValueError(f"rows of {n_per_row} are not a multiple of {QUANT_TYPES[ggml_type]}'s "
                         f"block of {block_size(ggml_type)}")
    if lib.ggml_quantize_requires_imatrix(ggml_type):  # pragma: no cover - none of QUANT_TYPES does
        raise ValueError(f"{QUANT_TYPES[ggml_type]} needs an importance matrix")
    out = np.empty(int(lib.ggml_row_size(ggml_type, n_per_row)) * n_rows, dtype=np.uint8)
    floats = ctypes.POINTER(ctypes.c_float)
    lib.ggml_quantize_init(ggml_type)
    written = lib.ggml_quantize_chunk(ggml_type, rows.ctypes.data_as(floats), out.ctypes.data_as(ctypes.c_void_p),
                                      0, n_rows, n_per_row, ctypes.cast(None, floats))
    if int(written) != out.nbytes:  # pragma: no cover - ggml's own size contract
        raise RuntimeError(f"ggml_quantize_chunk wrote {written} bytes, expected {out.nbytes}")
    return out


def mark_weights(buffer) -> None:
    """Mark a backend buffer as holding weights (``GGML_BACKEND_BUFFER_USAGE_WEIGHTS``)."""
    lib.ggml_backend_buffer_set_usage(buffer, lib.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)


def buffer_is_weights(buffer) -> bool:
    return int(lib.ggml_backend_buffer_get_usage(buffer)) == lib.GGML_BACKEND_BUFFER_USAGE_WEIGHTS


MADV_HUGEPAGE = 14  # Linux's <sys/mman.h>


def advise_huge_pages(buffer) -> bool:
    """Ask Linux to back a host buffer not yet written with transparent huge pages
    (``madvise(MADV_HUGEPAGE)``); whether the advice was taken. Values are untouched. A one-frame
    streamed step reads every weight once from memory, a page at a time per row block: with 4 KB
    pages its reads stalled on the TLB (one stream at chunk 1 1.05x faster with 2 MB pages; the
    row products over F16 weights from memory 1.1-1.17x). Elsewhere (other systems, device
    memory) nothing is asked and this returns False; so does a kernel without the feature."""
    if not sys.platform.startswith("linux") or not lib.ggml_backend_buffer_is_host(buffer):
        return False
    base, size = int(lib.ggml_backend_buffer_get_base(buffer) or 0), int(lib.ggml_backend_buffer_get_size(buffer))
    page = mmap.PAGESIZE  # madvise takes whole pages (4 KB on x86, up to 64 KB on some arm64 kernels)
    start, end = -(-base // page) * page, (base + size) // page * page
    if not base or end <= start:
        return False
    return _libc().madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_HUGEPAGE) == 0


@functools.lru_cache(maxsize=None)
def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise.restype = ctypes.c_int
    return libc


def upload(tensor, array: np.ndarray, layout: tuple | None = None) -> None:
    """Copy a numpy array into a backend tensor (any backend). Sizes are checked first;
    a quantized tensor takes its raw bytes (uint8). ``layout``: ``upload_layout(tensor)``, known
    already."""
    want, nbytes = upload_layout(tensor) if layout is None else layout
    data = np.ascontiguousarray(array, dtype=want)
    if data.nbytes != nbytes:
        raise ValueError(f"upload of {data.nbytes} bytes into a tensor of {nbytes} bytes")
    lib.ggml_backend_tensor_set(tensor, data.ctypes.data_as(ctypes.c_void_p), 0, nbytes)


def upload_layout(tensor) -> tuple[type, int]:
    """The numpy dtype an upload to ``tensor`` takes, and its size in bytes."""
    return NP_DTYPES.get(tensor_type(tensor), np.uint8), int(lib.ggml_nbytes(tensor))


def host_view(tensor) -> np.ndarray | None:
    """A flat numpy view of ``tensor``'s memory where it lives in host memory (a CPU buffer) and is
    contiguous, in the dtype :func:`upload` takes; None elsewhere. Valid while its buffer lives."""
    buffer = tensor.contents.buffer
    if not buffer or not tensor.contents.data or not lib.ggml_backend_buffer_is_host(buffer) \
            or not lib.ggml_is_contiguous(tensor):
        return None
    dtype, nbytes = upload_layout(tensor)
    raw = (ctypes.c_char * nbytes).from_address(tensor.contents.data)
    return np.frombuffer(raw, dtype=dtype)


def put(view: np.ndarray, array) -> None:
    """:func:`upload` into a :func:`host_view`: the same conversion and size check, one numpy copy."""
    data = np.asarray(array)
    if data.size != view.size:
        raise ValueError(f"upload of {data.size * view.itemsize} bytes into a tensor of {view.nbytes} bytes")
    view[...] = data.reshape(-1)


def download(tensor, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Copy a backend tensor into a new numpy array of shape ``numpy_shape(tensor)`` (``shape``:
    that shape, known already)."""
    dtype = NP_DTYPES[tensor_type(tensor)]
    out = np.empty(numpy_shape(tensor) if shape is None else shape, dtype=dtype)
    nbytes = int(lib.ggml_nbytes(tensor))
    if out.nbytes != nbytes:
        raise ValueError("download of a non-contiguous tensor")
    lib.ggml_backend_tensor_get(tensor, out.ctypes.data_as(ctypes.c_void_p), 0, nbytes)
    return out


def new_tensor(ctx: Any, ggml_type: int, ne: tuple[int, ...]) -> Any:
    ne = tuple(int(d) for d in ne)
    if not 1 <= len(ne) <= 4 or any(d <= 0 for d in ne):
        raise ValueError(f"bad tensor shape ne={list(ne)}")
    makers = (lib.ggml_new_tensor_1d, lib.ggml_new_tensor_2d, lib.ggml_new_tensor_3d, lib.ggml_new_tensor_4d)
    return makers[len(ne) - 1](ctx, ggml_type, *ne)

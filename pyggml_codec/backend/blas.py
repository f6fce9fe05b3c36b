"""The BLAS the compiled kernels call: a CBLAS ``sgemm`` found at run time (numpy's bundled
OpenBLAS by default), with OpenBLAS's thread control. No new dependency: numpy's wheels ship it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import glob
import os
import threading as threading_module

import numpy as np


class Blas:
    """A CBLAS ``sgemm`` the matrix-product kernels call, with OpenBLAS's thread control.

    Every sgemm of the kernels runs single-threaded inside OpenBLAS (ggml's threads split the
    work): OpenBLAS's threaded driver sums in another order on some of its kernels, and its
    direct AVX-512 path is chosen by the thread count too, so a call that went threaded gave
    other bits (3.8e-5 on an AVX-512 machine with ``OPENBLAS_CORETYPE=Haswell``). A pthreads
    OpenBLAS keeps one thread count for the process, even behind its ``_local`` setter; the
    kernels used to set and restore it in each ggml thread, and one thread's restore let
    another's next sgemm run threaded. Now ``single_threaded()`` holds that count at 1 around
    every compute (counted, so concurrent computes nest), and only an OpenMP OpenBLAS, whose
    count is per thread, is set by the kernels themselves (``params[1]``, pg_blas_enter).
    While a compute runs, numpy's own BLAS calls in other threads run single-threaded too.
    """

    def __init__(self, path: str, sgemm: str, ilp64: bool, params: np.ndarray, threading: str,
                 get_threads=None, set_threads=None, about: dict | None = None):
        self.path, self.sgemm, self.ilp64, self.threading = path, sgemm, ilp64, threading
        self.params = params  # int64 [sgemm address, per-thread setter or 0, ilp64]
        self._get, self._set = get_threads, set_threads
        self._lock = threading_module.Lock()
        self._depth, self._saved = 0, 1
        self._about = about or {}  # "config" / "corename" -> openblas_get_<what>

    def describe(self) -> dict:
        """What the library says of itself: config line (version, ILP64, build) and the kernel
        OpenBLAS chose for this CPU (``OPENBLAS_CORETYPE`` overrides it)."""
        info = {"path": self.path, "sgemm": self.sgemm, "ilp64": self.ilp64, "threading": self.threading}
        for key, fn in self._about.items():
            try:
                info[key] = fn().decode(errors="replace").strip()
            except (OSError, AttributeError):  # pragma: no cover - an odd library
                info[key] = None
        return info

    def __repr__(self) -> str:
        return f"Blas({self.path!r}, {self.sgemm}, {'ILP64' if self.ilp64 else 'LP64'}, {self.threading})"

    @contextlib.contextmanager
    def single_threaded(self):
        """OpenBLAS's process-wide thread count held at 1 for the duration (re-entrant and
        thread-safe: restored when the last concurrent holder leaves)."""
        if self._set is None:
            yield
            return
        with self._lock:
            if self._depth == 0:
                self._saved = int(self._get())
                if self._saved != 1:
                    self._set(1)
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0 and self._saved != 1:
                    self._set(self._saved)


_SGEMM_SYMBOLS = (("scipy_cblas_sgemm64_", True), ("cblas_sgemm64_", True), ("scipy_cblas_sgemm", False),
                  ("cblas_sgemm", False))
_PREFIXES = ("scipy_openblas_{}64_", "openblas_{}64_", "scipy_openblas_{}", "openblas_{}")
_PARALLEL = {0: "sequential", 1: "pthreads", 2: "openmp"}  # openblas_get_parallel()
BLAS_ENV = "PYGGML_CODEC_BLAS"  # "off", or the path of a CBLAS library (OpenBLAS >= 0.3.27)


def _symbol(dll, what: str):
    """OpenBLAS's ``openblas_<what>`` under the names numpy's and system builds export."""
    return next((getattr(dll, p.format(what)) for p in _PREFIXES if hasattr(dll, p.format(what))), None)


def _blas_candidates() -> list[str]:
    """numpy's bundled OpenBLAS (manylinux, macOS and Windows wheels), then a system one."""
    here = os.path.dirname(np.__file__)
    found = []
    for folder in (os.path.join(os.path.dirname(here), "numpy.libs"), os.path.join(here, ".dylibs")):
        found += sorted(glob.glob(os.path.join(folder, "*openblas*")))
    system = ctypes.util.find_library("openblas")
    return found + ([system] if system else [])


def _open_blas(path: str) -> tuple[Blas | None, str]:
    try:
        dll = ctypes.CDLL(path)
    except OSError as exc:
        return None, f"{path}: {exc}"
    for name, ilp64 in _SGEMM_SYMBOLS:
        if hasattr(dll, name):
            break
    else:
        return None, f"{path}: no cblas_sgemm"
    local, get_threads, set_threads, parallel = (_symbol(dll, w) for w in (
        "set_num_threads_local", "get_num_threads", "set_num_threads", "get_parallel"))
    if local is None or get_threads is None or set_threads is None:
        return None, f"{path}: no openblas_set_num_threads_local (OpenBLAS >= 0.3.27 needed)"
    threading = _PARALLEL.get(int(parallel()) if parallel is not None else 1, "pthreads")
    get_threads.restype, set_threads.argtypes = ctypes.c_int, [ctypes.c_int]  # int in every build
    per_thread = ctypes.cast(local, ctypes.c_void_p).value if threading == "openmp" else 0
    sgemm = ctypes.cast(getattr(dll, name), ctypes.c_void_p).value
    params = np.array([sgemm, per_thread, int(ilp64)], dtype=np.int64)
    about = {what: fn for what in ("config", "corename") if (fn := _symbol(dll, f"get_{what}")) is not None}
    for fn in about.values():
        fn.restype = ctypes.c_char_p
    if threading != "pthreads":  # the count is per thread (OpenMP) or there is none: no process-wide hold
        get_threads = set_threads = None
    return Blas(path, name, ilp64, params, threading, get_threads, set_threads, about), ""


def find_blas() -> tuple[Blas | None, str]:
    """The library the kernels call: ``PYGGML_CODEC_BLAS`` (a path, or "off"), else numpy's
    bundled OpenBLAS, else a system one; (None, why) when none qualifies."""
    choice = os.environ.get(BLAS_ENV, "")
    if choice.lower() in ("off", "0", "no", "none"):
        return None, f"disabled by {BLAS_ENV}={choice}"
    reasons = []
    for path in [choice] if choice else _blas_candidates():
        blas, why = _open_blas(path)
        if blas is not None:
            return blas, ""
        reasons.append(why)
    return None, "; ".join(reasons) or "no OpenBLAS found"

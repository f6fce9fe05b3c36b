"""Backends and devices: discovery, the backend a request gets (with the visible CPU fallback),
op names, and the ops pinned to the CPU.

Nothing here knows the model. A backend handed in by a host application is used, never freed.
"""

from __future__ import annotations

import ctypes
import logging
import os
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import binding, kernels
from .binding import lib
from .quirks import VK_DISABLE_F16, Quirks, quirks_of
from ..checks import whole_number
from ..errors import BackendError

log = logging.getLogger("pyggml_codec")

BACKEND_NAMES = ("auto", "cpu", "cuda", "metal", "vulkan")
# ggml registry names of the GPU backends this library knows.
_REGISTRY_NAMES = {"cuda": "CUDA", "metal": "Metal", "vulkan": "Vulkan"}
_loaded_dynamic = False


@dataclass(frozen=True)
class DeviceInfo:
    """One device of ggml's registry."""

    index: int
    backend: str  # registry name lower-cased: "cpu", "cuda", ...
    name: str
    description: str
    kind: str  # "cpu", "gpu", "igpu", "accel"
    memory_free: int
    memory_total: int


def _load_dynamic_backends() -> None:
    global _loaded_dynamic
    if not _loaded_dynamic:
        _loaded_dynamic = True
        try:
            lib.ggml_backend_load_all()
        except Exception as exc:  # pragma: no cover - depends on the build
            log.debug("ggml_backend_load_all failed: %s", exc)


def devices() -> list[DeviceInfo]:
    """Every device the loaded ggml build can run on."""
    _load_dynamic_backends()
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        reg = lib.ggml_backend_dev_backend_reg(dev)
        out.append(DeviceInfo(
            index=i,
            backend=lib.ggml_backend_reg_name(reg).decode().lower(),
            name=lib.ggml_backend_dev_name(dev).decode(),
            description=lib.ggml_backend_dev_description(dev).decode(),
            kind=binding.DEVICE_TYPE_NAMES.get(lib.ggml_backend_dev_type(dev), "other"),
            memory_free=int(free.value),
            memory_total=int(total.value),
        ))
    return out


def available_backends() -> list[str]:
    """Backend names usable with ``load(backend=...)`` in this ggml build ("cpu" always)."""
    names = {d.backend for d in devices()}
    return ["cpu"] + [n for n in ("cuda", "metal", "vulkan") if n in names]


class Backend:
    """A ggml backend handle, with the record of how it was chosen."""

    def __init__(self, handle: int, name: str, *, owned: bool, requested: str, fallback_reason: str | None):
        self.handle = handle
        self.name = name  # "cpu", "cuda", "metal", "vulkan"
        self.owned = owned
        self.requested = requested
        self.fallback_reason = fallback_reason
        self.n_threads = 1
        # ggml op names (e.g. "COL2IM_1D") run on the CPU through ggml_backend_sched even
        # where this backend supports them: load(cpu_ops=...), for bisecting a backend's op.
        self.cpu_ops: frozenset[str] = frozenset()
        # What this backend needs that others do not (quirks.py)
        self.quirks: Quirks = quirks_of(name, _device_description(handle))
        # How the backend computes products the graph gives F32 inputs (see PRODUCTS)
        self.products = self.quirks.products
        # e.g. Mesa's lavapipe: buffers are freed only once this ggml context is gone (see release)
        self.parks_frees = self.quirks.parks_frees
        self._parked: list[Callable[[], None]] = []

    @property
    def is_cpu(self) -> bool:
        return self.name == "cpu"

    @property
    def device_name(self) -> str:
        return lib.ggml_backend_name(self.handle).decode()

    def set_threads(self, n: int) -> None:
        n = check_threads(n)
        if self.is_cpu:
            lib.ggml_backend_cpu_set_n_threads(self.handle, n)
        self.n_threads = n

    def supports(self, tensor) -> bool:
        return bool(lib.ggml_backend_supports_op(self.handle, tensor))

    def runs(self, tensor) -> bool:
        """Whether a node of a graph for this backend runs on it (else: on the CPU)."""
        if self.cpu_ops and op_name(tensor) in self.cpu_ops:
            return False
        return self.is_cpu or self.supports(tensor)

    def release(self, free: Callable[[], None]) -> None:
        """Run ``free`` (it destroys buffers of this backend's device) now, or with
        ``parks_frees`` once this ggml context is gone (:meth:`restart`, :meth:`free`).

        Why (Mesa 22.3 lavapipe): a descriptor set keeps a bare pointer to each buffer written
        into it, and binding a set references every binding of it, used or not; ggml-vulkan
        reuses its sets from one compute to the next and writes only the bindings each shader
        uses. A buffer destroyed while the context lives is then referenced again from a stale
        binding after it was freed: heap corruption (README, "Known problem on lavapipe")."""
        if self.parks_frees and self.handle:
            self._parked.append(free)
        else:
            free()

    def restart(self) -> None:
        """Free the parked buffers; first start this backend's ggml context again on the same
        device (its descriptor sets go with the old one; pipelines and the F16 setting live in
        the device), if this library started it. No graph on this backend may be left: a
        scheduler holds the handle. A host's backend keeps them parked until :meth:`free`."""
        if not self._parked or not self.owned:
            return
        handle, self.handle = self.handle, 0
        device = lib.ggml_backend_get_device(handle)
        lib.ggml_backend_free(handle)
        self._free_parked()
        self.handle = lib.ggml_backend_dev_init(device, None)
        if not self.handle:
            raise BackendError(f"{self.name} backend failed to start again")

    def _free_parked(self) -> None:
        parked, self._parked = self._parked, []
        for free in parked:
            free()

    def free(self) -> None:
        """Free the backend (if this library started it), then the buffers parked for it."""
        handle, self.handle = self.handle, 0
        if self.owned and handle:
            lib.ggml_backend_free(handle)
        self._free_parked()

    @classmethod
    def wrap(cls, handle: int) -> "Backend":
        """A backend created by the host: used, never freed."""
        if not handle:
            raise BackendError("the host backend handle is NULL")
        name = lib.ggml_backend_name(handle).decode().lower()
        kind = "cpu" if name.startswith("cpu") else next((k for k, v in _REGISTRY_NAMES.items() if name.startswith(v.lower())), name)
        return cls(handle, kind, owned=False, requested=kind, fallback_reason=None)


def _device_description(handle: int) -> str:
    """ggml's description of the device ``handle`` runs on ("" where there is none)."""
    device = lib.ggml_backend_get_device(handle)
    return lib.ggml_backend_dev_description(device).decode() if device else ""


def op_name(tensor) -> str:
    """ggml's name of a node's op ("MUL_MAT", "COL2IM_1D"; unary ops by their own name)."""
    return lib.ggml_op_desc(tensor).decode()


def node_label(tensor) -> str:
    """:func:`op_name`, with a custom op's kernel added ("CUSTOM:conv_taps") for profiles."""
    name = op_name(tensor)
    kernel = kernels.kernel_name(tensor) if name in ("CUSTOM", "MAP_CUSTOM2") else None
    return f"{name}:{kernel}" if kernel else name


def op_names() -> frozenset[str]:
    """Every name :func:`op_name` can give in this ggml build."""
    names = {lib.ggml_op_name(i).decode() for i in range(lib.GGML_OP_COUNT)}
    names |= {lib.ggml_unary_op_name(i).decode() for i in range(lib.GGML_UNARY_OP_COUNT)}
    names |= {lib.ggml_glu_op_name(i).decode() for i in range(lib.GGML_GLU_OP_COUNT)}
    return frozenset(names)


def set_cpu_ops(backend: Backend, ops) -> None:
    """Pin these ggml ops to the CPU on ``backend`` (see :class:`Graph`); names are checked."""
    if isinstance(ops, str):  # one name: not its letters
        ops = [ops]
    wanted = frozenset(str(op).upper() for op in (ops or ()))
    unknown = sorted(wanted - op_names())
    if unknown:
        raise ValueError(f"unknown ggml op name(s) {unknown}; e.g. 'COL2IM_1D', 'MUL_MAT', 'PAD', 'TANH'")
    backend.cpu_ops = wanted


# What ``Backend.products`` (and ``codec.plan.products``) can say:
PRODUCTS = {
    "f32": "products in F32",
    "f16-inputs": ("ggml-vulkan's F16 path is on for this device: it rounds F32 inputs of products "
                   "(non-contiguous ones, converted for the shader) to F16: 3e-4 to 7e-4 relative RMS "
                   "error on a decode instead of 5e-7 (measured on Mesa's lavapipe)"),
    "unmeasured": "this backend's product precision has not been measured by this library",
}
# Vulkan devices this process started, by ggml device name, and whether F16 products are on:
# ggml-vulkan reads GGML_VK_DISABLE_F16 once per device, when the device first starts.
_vulkan_f16: dict[str, bool] = {}


def _start_vulkan(dev, name: str, f32_products: bool) -> tuple[int, str]:
    """Start a Vulkan device; with ``f32_products`` and the device not yet started in this
    process, with ggml-vulkan's F16 path off. Returns (handle, Backend.products)."""
    first = name not in _vulkan_f16
    set_here = first and f32_products and VK_DISABLE_F16 not in os.environ
    if set_here:
        os.environ[VK_DISABLE_F16] = "1"
    try:
        handle = lib.ggml_backend_dev_init(dev, None)
    finally:
        if set_here:
            del os.environ[VK_DISABLE_F16]
    if handle and first:
        _vulkan_f16[name] = not (set_here or VK_DISABLE_F16 in os.environ)
    return handle, "f16-inputs" if _vulkan_f16.get(name, True) else "f32"


MAX_THREADS = 512  # GGML_MAX_N_THREADS: ggml's thread pool holds masks of this many threads


def check_threads(n) -> int:
    """``n`` as a thread count: a whole number in 1..MAX_THREADS, else ValueError (more threads than
    ggml's pool holds crashed the process inside ggml; 1.5 would silently have been 1)."""
    count = whole_number(n)
    if count is None:
        raise ValueError(f"n_threads must be a whole number, got {n!r}")
    if not 1 <= count <= MAX_THREADS:
        raise ValueError(f"n_threads must be in 1..{MAX_THREADS} (ggml's most threads), got {n}")
    return count


def default_threads() -> int:
    try:
        return min(MAX_THREADS, max(1, len(os.sched_getaffinity(0))))
    except AttributeError:  # pragma: no cover - not Linux
        return min(MAX_THREADS, max(1, os.cpu_count() or 1))


def _init_device(backend: str, device: int, f32_products: bool) -> tuple[Backend | None, str | None]:
    """Start device ``device`` of a GPU backend; (Backend, None) or (None, reason)."""
    matches = [d for d in devices() if d.backend == _REGISTRY_NAMES[backend].lower()]
    if not matches and backend in binding.compiled_backends():
        hint = ("; ggml skips CPU-type devices such as llvmpipe unless GGML_VK_VISIBLE_DEVICES is set, and "
                "an index there that does not exist disables Vulkan" if backend == "vulkan" else "")
        visible = os.environ.get("GGML_VK_VISIBLE_DEVICES") if backend == "vulkan" else None
        return None, (f"this ggml build has {backend}, but ggml found no usable {backend} device"
                      f"{f' (GGML_VK_VISIBLE_DEVICES={visible})' if visible is not None else ''}{hint}")
    if not matches:
        return None, f"this ggml build has no {backend} backend (available: {', '.join(available_backends())})"
    if not 0 <= device < len(matches):
        return None, f"{backend} device {device} does not exist ({len(matches)} found)"
    dev = lib.ggml_backend_dev_get(matches[device].index)
    if backend == "vulkan":
        handle, products = _start_vulkan(dev, matches[device].name, f32_products)
    else:
        handle, products = lib.ggml_backend_dev_init(dev, None), "unmeasured"
    if not handle:
        return None, f"{backend} device {device} ({matches[device].description}) failed to start"
    started = Backend(handle, backend, owned=True, requested=backend, fallback_reason=None)
    started.products = products
    return started, None


def _by_device_name(name: str) -> tuple[str, int] | None:
    """(backend, index within it) of a registry device named ``name`` (e.g. "CUDA0"), if any."""
    for dev in devices():
        if dev.name.lower() == name and dev.backend != "cpu":
            same = [d for d in devices() if d.backend == dev.backend]
            return dev.backend, same.index(dev)
    return None


def start_backend(requested: str, device: int = 0, strict: bool = False, f32_products: bool = True) -> Backend:
    """Start the requested backend; fall back to CPU with a warning unless ``strict``. "auto"
    without a GPU backend in the build takes the CPU with a warning too (``strict`` or not).

    ``requested`` is a backend name (with ``device`` its index) or a registry device name
    such as "CUDA1" or "Vulkan0" (see :func:`devices`). ``f32_products`` asks for F32
    matrix products where the backend has a switch for it (ggml-vulkan's F16 path, set
    when a device first starts in the process); ``Backend.products`` says what it got.
    """
    if isinstance(device, bool) or not isinstance(device, (int, np.integer)) or device < 0:
        raise ValueError(f"device must be an int >= 0, got {device!r}")
    device = int(device)
    requested = requested.lower()
    named = _by_device_name(requested) if requested not in BACKEND_NAMES else None
    if named is not None:
        requested, device = named
    if requested not in BACKEND_NAMES:
        names = ", ".join(list(BACKEND_NAMES) + [d.name for d in devices() if d.backend != "cpu"])
        raise BackendError(f"unknown backend {requested!r}; choose one of {names}")
    if requested == "cpu":
        return cpu_backend(requested, None)
    if requested == "auto" and len(available_backends()) == 1:  # auto may take the CPU, even with strict
        # A build with GPU backends but no usable device is a fallback, said aloud; a CPU-only build
        # has nothing to fall back from, so 'auto' is the CPU there (fallback_reason still says why).
        compiled = sorted(binding.compiled_backends())
        if not compiled:
            return cpu_backend(requested, "this ggml build has no GPU backend")
        reason = f"ggml found no usable device of its GPU backend(s) {', '.join(compiled)}"
        warnings.warn(f"pyggml_codec: backend 'auto' found no GPU ({reason}); using CPU", RuntimeWarning, stacklevel=3)
        return cpu_backend(requested, reason)
    name = next(n for n in available_backends() if n != "cpu") if requested == "auto" else requested
    started, reason = _init_device(name, device, f32_products)
    if started is not None:
        started.requested = requested
        return started
    if strict:
        raise BackendError(f"backend {requested!r} unavailable: {reason}")
    warnings.warn(f"pyggml_codec: backend {requested!r} unavailable ({reason}); using CPU", RuntimeWarning, stacklevel=3)
    return cpu_backend(requested, reason)


def cpu_backend(requested: str, reason: str | None) -> Backend:
    handle = lib.ggml_backend_cpu_init()
    if not handle:
        raise BackendError("the ggml CPU backend failed to start")
    return Backend(handle, "cpu", owned=True, requested=requested, fallback_reason=reason)

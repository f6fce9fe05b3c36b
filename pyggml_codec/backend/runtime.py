"""The layer that owns ggml's C objects: backends, weight buffers, graphs and allocators.

Nothing here knows the model. Every object that frees something records whether it
created it: a backend or buffer handed in by a host application is used, never freed.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import _ggml, kernels
from ._ggml import lib
from .errors import BackendError, GraphError, PerformanceWarning

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
            kind=_ggml.DEVICE_TYPE_NAMES.get(lib.ggml_backend_dev_type(dev), "other"),
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

    @property
    def is_cpu(self) -> bool:
        return self.name == "cpu"

    @property
    def device_name(self) -> str:
        return lib.ggml_backend_name(self.handle).decode()

    def set_threads(self, n: int) -> None:
        if self.is_cpu:
            lib.ggml_backend_cpu_set_n_threads(self.handle, int(n))
        self.n_threads = int(n)

    def supports(self, tensor) -> bool:
        return bool(lib.ggml_backend_supports_op(self.handle, tensor))

    def runs(self, tensor) -> bool:
        """Whether a node of a graph for this backend runs on it (else: on the CPU)."""
        if self.cpu_ops and op_name(tensor) in self.cpu_ops:
            return False
        return self.is_cpu or self.supports(tensor)

    def free(self) -> None:
        handle, self.handle = self.handle, 0
        if self.owned and handle:
            lib.ggml_backend_free(handle)

    @classmethod
    def wrap(cls, handle: int) -> "Backend":
        """A backend created by the host: used, never freed."""
        if not handle:
            raise BackendError("the host backend handle is NULL")
        name = lib.ggml_backend_name(handle).decode().lower()
        kind = "cpu" if name.startswith("cpu") else next((k for k, v in _REGISTRY_NAMES.items() if name.startswith(v.lower())), name)
        return cls(handle, kind, owned=False, requested=kind, fallback_reason=None)


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
    wanted = frozenset(str(op).upper() for op in (ops or ()))
    unknown = sorted(wanted - op_names())
    if unknown:
        raise ValueError(f"unknown ggml op name(s) {unknown}; e.g. 'COL2IM_1D', 'MUL_MAT', 'PAD', 'TANH'")
    backend.cpu_ops = wanted


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _init_device(backend: str, device: int) -> tuple[int | None, str | None]:
    """Start device ``device`` of a GPU backend; (handle, None) or (None, reason)."""
    matches = [d for d in devices() if d.backend == _REGISTRY_NAMES[backend].lower()]
    if not matches:
        return None, f"this ggml build has no {backend} backend (available: {', '.join(available_backends())})"
    if not 0 <= device < len(matches):
        return None, f"{backend} device {device} does not exist ({len(matches)} found)"
    handle = lib.ggml_backend_dev_init(lib.ggml_backend_dev_get(matches[device].index), None)
    if not handle:
        return None, f"{backend} device {device} ({matches[device].description}) failed to start"
    return handle, None


def _by_device_name(name: str) -> tuple[str, int] | None:
    """(backend, index within it) of a registry device named ``name`` (e.g. "CUDA0"), if any."""
    for dev in devices():
        if dev.name.lower() == name and dev.backend != "cpu":
            same = [d for d in devices() if d.backend == dev.backend]
            return dev.backend, same.index(dev)
    return None


def start_backend(requested: str, device: int = 0, strict: bool = False) -> Backend:
    """Start the requested backend; fall back to CPU with a warning unless ``strict``.

    ``requested`` is a backend name (with ``device`` its index) or a registry device name
    such as "CUDA1" or "Vulkan0" (see :func:`devices`).
    """
    requested = requested.lower()
    named = _by_device_name(requested) if requested not in BACKEND_NAMES else None
    if named is not None:
        requested, device = named
    if requested not in BACKEND_NAMES:
        names = ", ".join(list(BACKEND_NAMES) + [d.name for d in devices() if d.backend != "cpu"])
        raise BackendError(f"unknown backend {requested!r}; choose one of {names}")
    reason = None
    if requested == "auto":
        gpus = [n for n in available_backends() if n != "cpu"]
        if gpus:
            handle, reason = _init_device(gpus[0], device)
            if handle:
                return Backend(handle, gpus[0], owned=True, requested=requested, fallback_reason=None)
        else:
            return _cpu(requested, None)
    elif requested != "cpu":
        handle, reason = _init_device(requested, device)
        if handle:
            return Backend(handle, requested, owned=True, requested=requested, fallback_reason=None)
    else:
        return _cpu(requested, None)
    if strict:
        raise BackendError(f"backend {requested!r} unavailable: {reason}")
    warnings.warn(f"pyggml_codec: backend {requested!r} unavailable ({reason}); using CPU", RuntimeWarning, stacklevel=3)
    return _cpu(requested, reason)


def _cpu(requested: str, reason: str | None) -> Backend:
    handle = lib.ggml_backend_cpu_init()
    if not handle:
        raise BackendError("the ggml CPU backend failed to start")
    return Backend(handle, "cpu", owned=True, requested=requested, fallback_reason=reason)


# --------------------------------------------------------------------------- lowerings

LOWERING_CHOICES = {
    "mask": ("diag_mask_inf", "explicit"),
    "conv_transpose": ("col2im", "ggml"),
    "left_pad": ("pad_ext", "concat"),
    "kernels": (True, False),
    "attention": ("blocked", "full"),
    "matmul": ("blas", "ggml"),
    "conv": ("winograd", "taps", "im2col"),
}


def probe_ops(backend: Backend) -> dict[str, bool]:
    """Which of the ops with alternative lowerings ``backend`` supports (tiny metadata graph)."""
    ctx = new_context(32 * lib.ggml_tensor_overhead())
    try:
        from .ops import new_tensor

        sq = new_tensor(ctx, _ggml.TYPE_F32, (4, 4))
        cols = new_tensor(ctx, _ggml.TYPE_F32, (8, 4))
        kern = new_tensor(ctx, _ggml.TYPE_F32, (4, 2, 4))
        probes = {
            "diag_mask_inf": lib.ggml_diag_mask_inf(ctx, sq, 0),
            "col2im_1d": lib.ggml_col2im_1d(ctx, cols, 2, 2, 0),
            "pad_left": lib.ggml_pad_ext(ctx, sq, 1, 0, 0, 0, 0, 0, 0, 0),
            "conv_transpose_1d": lib.ggml_conv_transpose_1d(ctx, kern, sq, 2, 0, 1),
        }
        return {name: backend.supports(t) for name, t in probes.items()}
    finally:
        lib.ggml_free(ctx)


def choose_lowerings(backend: Backend, overrides: dict | None = None) -> dict:
    """The graph-level lowering of each op with alternatives, for this backend.

    Metal in ggml 0.15.3 has no DIAG_MASK_INF, no left padding and no COL2IM_1D; the C++
    engine gives Metal explicit masks. ``overrides`` forces a choice (tests run every
    lowering on the CPU backend against the reference).
    """
    support = probe_ops(backend)
    blas = backend.is_cpu and kernels.BLAS is not None
    plan = {
        "mask": "diag_mask_inf" if support["diag_mask_inf"] and backend.name != "metal" else "explicit",
        "conv_transpose": "col2im" if support["col2im_1d"] else "ggml",
        "left_pad": "pad_ext" if support["pad_left"] else "concat",
        "kernels": backend.is_cpu,
        # Sliding-window attention in query blocks over overlapping strided key views: linear
        # in length. Verified on the CPU; GPUs keep the full masked form (cheap there).
        "attention": "blocked" if backend.is_cpu else "full",
        # F32 products through the BLAS numpy ships (kernels.py): 1.2-3.8x ggml's F32 mul_mat
        # on the CPU; F16 products stay with ggml.
        "matmul": "blas" if blas else "ggml",
        # The residual units' dilated convs (most of the FLOPs) by BLAS GEMMs over the signal
        # in place instead of im2col columns: Winograd F(4,7), 10 GEMMs per 4 outputs instead
        # of 28 ("taps": one per tap); f32 precision only.
        "conv": "winograd" if blas else "im2col",
    }
    for key, value in (overrides or {}).items():
        if key not in LOWERING_CHOICES or value not in LOWERING_CHOICES[key]:
            choices = {k: list(v) for k, v in LOWERING_CHOICES.items()}
            raise ValueError(f"unknown lowering {key}={value!r}; choices: {choices}")
        if key == "kernels" and value and not backend.is_cpu:
            raise ValueError("custom kernels run on the CPU backend only")
        if key in ("matmul", "conv") and value in ("blas", "taps", "winograd"):
            if not backend.is_cpu:
                raise ValueError(f"{key}={value!r} runs on the CPU backend only (through the BLAS)")
            if kernels.BLAS is None:
                raise ValueError(f"BLAS matrix products unavailable: {kernels.BLAS_UNAVAILABLE_REASON}")
        plan[key] = value
    if not plan["kernels"]:  # the BLAS lowerings are compiled kernels too
        for key, plain in (("matmul", "ggml"), ("conv", "im2col")):
            if (overrides or {}).get(key, plain) != plain:
                raise ValueError(f"{key}={overrides[key]!r} needs the compiled kernels (kernels=True)")
            plan[key] = plain
    if plan["conv_transpose"] == "ggml" and not support["conv_transpose_1d"]:
        raise BackendError(f"backend {backend.name} supports neither COL2IM_1D nor CONV_TRANSPOSE_1D")
    if backend.is_cpu and plan["kernels"]:  # kernels=False, or a plain matmul, is the user's choice
        warn_slow_path(blas=not {"matmul", "conv"} & set(overrides or {}))
    return plan


def warn_slow_path(blas: bool = True) -> None:
    """A PerformanceWarning when the CPU would run the slow path unasked."""
    reason = kernels.slow_path_reason(blas)
    if reason:
        warnings.warn(reason, PerformanceWarning, stacklevel=4)


# --------------------------------------------------------------------------- contexts and buffers


def new_context(mem_bytes: int) -> int:
    """A metadata-only ggml context (tensor data lives in backend buffers)."""
    params = lib.ggml_init_params(mem_size=int(mem_bytes), mem_buffer=None, no_alloc=True)
    ctx = lib.ggml_init(params)
    if not ctx:
        raise GraphError(f"ggml_init failed for a {mem_bytes >> 20} MB context")
    return ctx


class WeightBuffer:
    """A context of weight tensors and the one backend buffer that holds their data."""

    def __init__(self, backend: Backend, n_tensors: int):
        self.ctx = new_context((n_tensors + 8) * lib.ggml_tensor_overhead())
        self.buffer = 0
        self.backend = backend

    def new_tensor(self, ggml_type: int, ne: tuple[int, ...]):
        from .ops import new_tensor

        return new_tensor(self.ctx, ggml_type, ne)

    def allocate(self) -> int:
        self.buffer = lib.ggml_backend_alloc_ctx_tensors(self.ctx, self.backend.handle)
        if not self.buffer:
            raise BackendError("could not allocate the weight buffer on the backend")
        return int(lib.ggml_backend_buffer_get_size(self.buffer))

    def free(self) -> None:
        """Idempotent; each handle is cleared before it is freed, so an interrupt between
        the two can never lead to a second free."""
        buffer, self.buffer = self.buffer, 0
        if buffer:
            lib.ggml_backend_buffer_free(buffer)
        ctx, self.ctx = self.ctx, 0
        if ctx:
            lib.ggml_free(ctx)


def blas_single_threaded():
    """Held around every compute: the BLAS kernels' sgemms must not go threaded (kernels.Blas)."""
    return kernels.BLAS.single_threaded() if kernels.BLAS is not None else contextlib.nullcontext()


class Graph:
    """One built graph: its metadata context, its own allocator, its inputs and outputs.

    Each Graph has its own ``gallocr``: an allocator shared between cached graphs would
    free memory that earlier graphs still point into when it grows.

    Nodes the backend cannot run (``ggml_backend_supports_op``, or named in
    ``backend.cpu_ops``) never reach the backend: the graph is then computed by a
    ``ggml_backend_sched`` over the backend and a CPU backend of its own, with those nodes
    pinned to the CPU (the scheduler copies their inputs across and their results back).
    ``cpu_nodes`` counts them by op; a RuntimeWarning names them when the graph is built.
    """

    def __init__(self, backend: Backend, ctx_bytes: int, n_nodes: int = 16384):
        self.backend = backend
        self.ctx = new_context(ctx_bytes + lib.ggml_graph_overhead_custom(n_nodes, False))
        self.gf = lib.ggml_new_graph_custom(self.ctx, n_nodes, False)
        self.n_nodes = n_nodes
        self.galloc = 0
        self.sched = 0
        self.cpu_helper: Backend | None = None
        self.cpu_nodes: dict[str, int] = {}
        self.builder = None
        self.outputs: dict[str, Any] = {}
        self.last_compute_s = 0.0  # time inside ggml compute on the last run

    def build(self, fn: Callable, builder) -> None:
        """Run ``fn(builder) -> {name: tensor}``, expand the graph and allocate it."""
        self.builder = builder
        outputs = fn(builder)
        outputs = {**builder.stages, **outputs}  # stage tensors kept for dumps, if any
        for name, t in outputs.items():
            lib.ggml_set_output(t)
            lib.ggml_build_forward_expand(self.gf, t)
        self.outputs = dict(outputs)
        if lib.ggml_graph_n_nodes(self.gf) >= self.n_nodes:
            raise GraphError(f"graph has more than {self.n_nodes} nodes")
        on_cpu = self._nodes_for_cpu()
        if on_cpu:
            self._allocate_scheduled(on_cpu)
        else:
            self.galloc = lib.ggml_gallocr_new(lib.ggml_backend_get_default_buffer_type(self.backend.handle))
            if not self.galloc or not lib.ggml_gallocr_alloc_graph(self.galloc, self.gf):
                raise GraphError("could not allocate the graph's compute buffer")
        # An input no op reads gets no memory: uploading to it would abort in ggml.
        builder.inputs[:] = [(t, a) for t, a in builder.inputs if t.contents.buffer]

    def _nodes_for_cpu(self) -> list:
        if self.backend.is_cpu and not self.backend.cpu_ops:
            return []
        nodes = (lib.ggml_graph_node(self.gf, i) for i in range(lib.ggml_graph_n_nodes(self.gf)))
        return [node for node in nodes if not self.backend.runs(node)]

    def _allocate_scheduled(self, on_cpu: list) -> None:
        for node in on_cpu:
            name = op_name(node)
            self.cpu_nodes[name] = self.cpu_nodes.get(name, 0) + 1
        summary = ", ".join(f"{op} x{n}" for op, n in sorted(self.cpu_nodes.items()))
        self.cpu_helper = _cpu(self.backend.requested, None)
        self.cpu_helper.set_threads(self.backend.n_threads if self.backend.is_cpu else default_threads())
        handles = (ctypes.c_void_p * 2)(self.backend.handle, self.cpu_helper.handle)
        # Hash-set size: nodes plus leafs (weights, inputs, views) of one graph, with room.
        self.sched = lib.ggml_backend_sched_new(handles, None, 2, 4 * self.n_nodes, False, False)
        if not self.sched:
            raise GraphError("ggml_backend_sched_new failed")
        for node in on_cpu:
            lib.ggml_backend_sched_set_tensor_backend(self.sched, node, self.cpu_helper.handle)
        if not lib.ggml_backend_sched_alloc_graph(self.sched, self.gf):
            raise GraphError("could not allocate the scheduled graph's buffers")
        warnings.warn(f"pyggml_codec: backend {self.backend.name} runs these ops on the CPU ({summary}); "
                      f"graph splits: {self.n_splits}", RuntimeWarning, stacklevel=2)
        self.builder.lowerings["cpu_ops"] = summary

    @property
    def n_splits(self) -> int:
        """Graph splits between backends (1: the whole graph runs on one)."""
        return int(lib.ggml_backend_sched_get_n_splits(self.sched)) if self.sched else 1

    def node_backend(self, node) -> str:
        """ggml's name of the backend that runs ``node``."""
        if not self.sched:
            return self.backend.device_name
        handle = lib.ggml_backend_sched_get_tensor_backend(self.sched, node)
        if handle and handle == self.cpu_helper.handle:
            return lib.ggml_backend_name(handle).decode() + " (fallback)"
        return lib.ggml_backend_name(handle).decode() if handle else self.backend.device_name

    @property
    def compute_bytes(self) -> int:
        if self.sched:
            return sum(int(lib.ggml_backend_sched_get_buffer_size(self.sched, b.handle))
                       for b in (self.backend, self.cpu_helper))
        return int(lib.ggml_gallocr_get_buffer_size(self.galloc, 0)) if self.galloc else 0

    def _upload_inputs(self, fresh_inputs: dict[str, np.ndarray]) -> None:
        for t, array in self.builder.inputs:
            name = lib.ggml_get_name(t).decode()
            _ggml.upload(t, fresh_inputs.get(name, array))

    def run(self, fresh_inputs: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Upload every input (``fresh_inputs`` replace stored ones by name), compute, download."""
        self._upload_inputs(fresh_inputs or {})
        start = time.perf_counter()
        with blas_single_threaded():
            if self.sched:
                status = lib.ggml_backend_sched_graph_compute(self.sched, self.gf)
                lib.ggml_backend_sched_synchronize(self.sched)
            else:
                status = lib.ggml_backend_graph_compute(self.backend.handle, self.gf)
        self.last_compute_s = time.perf_counter() - start
        if status != 0:
            raise GraphError(f"graph compute failed with ggml status {status}")
        return {name: _ggml.download(t) for name, t in self.outputs.items()}

    def profile(self) -> list[tuple[str, tuple[int, ...], float]]:
        """(op, ne, seconds) of each node, computing one node at a time through graph views,
        on the inputs the graph was built with (uploaded again first: the allocator reuses
        input memory). For finding the dominant ops; the sum is a little above one compute.
        Single-backend graphs only (a scheduled graph's nodes live on two backends)."""
        if self.sched:
            raise GraphError(f"per-node profile needs a graph on one backend; this one runs "
                             f"{', '.join(self.cpu_nodes)} on the CPU")
        self._upload_inputs({})
        out = []
        for i in range(lib.ggml_graph_n_nodes(self.gf)):
            view = lib.ggml_graph_view(self.gf, i, i + 1)
            node = lib.ggml_graph_node(self.gf, i)
            start = time.perf_counter()
            with blas_single_threaded():
                status = lib.ggml_backend_graph_compute(self.backend.handle, ctypes.byref(view))
            elapsed = time.perf_counter() - start
            if status != 0:
                raise GraphError(f"node {i} failed with ggml status {status}")
            out.append((node_label(node), _ggml.ne(node), elapsed))
        return out

    def free(self) -> None:
        """Idempotent; handles cleared before they are freed (see WeightBuffer.free)."""
        galloc, self.galloc = self.galloc, 0
        if galloc:
            lib.ggml_gallocr_free(galloc)
        sched, self.sched = self.sched, 0
        if sched:
            lib.ggml_backend_sched_free(sched)
        helper, self.cpu_helper = self.cpu_helper, None
        if helper is not None:
            helper.free()
        ctx, self.ctx = self.ctx, 0
        if ctx:
            lib.ggml_free(ctx)

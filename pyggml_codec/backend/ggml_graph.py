"""Graphs and buffers: metadata-only contexts, the weight buffer, and ``Graph`` (build, allocate,
compute, profile, free) on one backend or, with ops pinned to the CPU, a scheduler over two.

Every object that frees something records whether it created it: a buffer handed in by a
host application is used, never freed.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import binding, kernels
from .binding import lib
from .runtime import Backend, cpu_backend, default_threads, node_label, op_name
from ..errors import BackendError, GraphError


# ops that only describe memory (no kernel runs for them)
LAYOUT_OPS = frozenset({"NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"})
BOUND_ALIGN = 64  # bytes: the alignment of a bound leaf's placeholder (ggml's buffers need 32), and of arenas
BOUND_ROWS = 1 << 24  # the row count a bound leaf declares where the lent array's is the real one


def aligned_array(shape: tuple[int, ...], like: np.ndarray | None = None) -> np.ndarray:
    """A float32 array of ``shape`` at a BOUND_ALIGN-aligned address, as bound inputs need: zeros
    (mapped on first touch), or a copy of ``like``."""
    nbytes = 4 * int(np.prod(shape))
    raw = np.zeros(nbytes + BOUND_ALIGN, np.uint8)
    start = (-raw.ctypes.data) % BOUND_ALIGN
    out = raw[start:start + nbytes].view(np.float32).reshape(shape)
    if like is not None:
        out[...] = like
    return out


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
        self.huge_pages = False  # whether Linux took the advice to back it with huge pages (allocate)

    def new_tensor(self, ggml_type: int, ne: tuple[int, ...]):
        return binding.new_tensor(self.ctx, ggml_type, ne)

    def allocate(self) -> int:
        """Allocate every tensor of the context in one backend buffer, marked as weights:
        ``ggml_backend_sched`` keeps an op whose input lives in a weight buffer on that
        buffer's backend, so ops pinned to the CPU move alone, not the whole graph."""
        self.buffer = lib.ggml_backend_alloc_ctx_tensors(self.ctx, self.backend.handle)
        if not self.buffer:
            raise BackendError("could not allocate the weight buffer on the backend")
        binding.mark_weights(self.buffer)
        self.huge_pages = binding.advise_huge_pages(self.buffer)  # before any upload writes a page
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


def _check_scratch(before: int) -> None:
    """MemoryError where a compiled kernel was refused its scratch memory since ``before`` (its output
    was left unset: returning it would be silent wrong output). The count is the process's: a compute
    running at the same time in another thread can raise for a refusal that was not its own (both
    are then retried; only a machine out of memory refuses)."""
    refused = kernels.scratch_failures() - before
    if refused:
        raise MemoryError(f"a compiled CPU kernel could not allocate its scratch memory ({refused} refusals) "
                          f"during this compute; its output is incomplete, so none is returned")


def blas_single_threaded():
    """Held around every compute: the BLAS kernels' sgemms must not go threaded (kernels.Blas)."""
    return kernels.BLAS.single_threaded() if kernels.BLAS is not None else contextlib.nullcontext()


@dataclass(frozen=True)
class TimedNode:
    """A node of a timed compute (``Graph.timeline``): its op (``node_label``), output ne and, where
    it runs a compiled kernel, each thread's entry and exit in seconds from the compute's start
    (both empty for ggml's own ops, which run untimed between the kernels)."""

    index: int
    op: str
    ne: tuple[int, ...]
    enter: tuple[float, ...] = ()
    leave: tuple[float, ...] = ()

    @property
    def seconds(self) -> float:
        """From the first thread's entry to the last one's exit (0 where untimed)."""
        return max(self.leave) - min(self.enter) if self.enter else 0.0

    @property
    def spread(self) -> float:
        """How long the first thread out waited for the last: its share of the op's time that
        the barrier after it took (0 where untimed)."""
        return max(self.leave) - min(self.leave) if self.leave else 0.0


@dataclass(frozen=True)
class Timeline:
    """One compute of a whole graph with its compiled kernels timed (``Graph.timeline``)."""

    seconds: float  # the compute, on the clock the kernels read
    nodes: tuple[TimedNode, ...]  # every node, in order

    @property
    def between(self) -> float:
        """The compute's time outside every timed op: ggml's own ops, the barriers between ops,
        the threads' start and the compute's set-up."""
        return self.seconds - sum(n.seconds for n in self.nodes)


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
        # Leaves whose memory the caller lends at every run (``builder.bound``, CPU only): their
        # views, and the placeholder they point at between runs
        self.bound: dict[str, Any] = {}
        self.bound_views: dict[str, list] = {}
        self.bound_arrays: dict[str, np.ndarray] = {}
        self._placeholder: tuple[np.ndarray, int] | None = None
        self.ctx = new_context(ctx_bytes + lib.ggml_graph_overhead_custom(n_nodes, False))
        self.gf = lib.ggml_new_graph_custom(self.ctx, n_nodes, False)
        self.n_nodes = n_nodes
        self.galloc = 0
        self.sched = 0
        self.cpu_helper: Backend | None = None
        self.cpu_nodes: dict[str, int] = {}
        self.builder = None
        self.input_names: list[str] = []  # of builder.inputs, in order
        self._downloads: dict[str, tuple] = {}  # output name -> (tensor, numpy shape)
        self._upload_layouts: list[tuple] = []  # per input: numpy dtype, bytes
        self._host_inputs: list = []  # per input: binding.host_view of its memory, or None
        self._host_outputs: dict = {}  # per output: likewise
        self.outputs: dict[str, Any] = {}
        self.last_compute_s = 0.0  # time inside ggml compute on the last run

    def build(self, fn: Callable, builder) -> None:
        """Run ``fn(builder) -> {name: tensor}``, expand the graph and allocate it."""
        self.builder = builder
        outputs = fn(builder)
        outputs = {**builder.stages, **outputs}  # stage tensors kept for dumps, if any
        for name, t in outputs.items():
            lib.ggml_set_output(t)
            if t.contents.view_src:  # the allocator keeps an output's memory, not a view's source's:
                lib.ggml_set_output(t.contents.view_src)  # a stage written in place over it would be lost
            lib.ggml_build_forward_expand(self.gf, t)
        self.outputs = dict(outputs)
        if lib.ggml_graph_n_nodes(self.gf) >= self.n_nodes:
            raise GraphError(f"graph has more than {self.n_nodes} nodes")
        self.bound = dict(getattr(builder, "bound", {}))  # a builder without bound inputs may omit them
        self._place_bound(self.bound)
        on_cpu = self._nodes_for_cpu()
        if on_cpu:
            self._allocate_scheduled(on_cpu)
        else:
            self.galloc = lib.ggml_gallocr_new(lib.ggml_backend_get_default_buffer_type(self.backend.handle))
            if not self.galloc or not lib.ggml_gallocr_alloc_graph(self.galloc, self.gf):
                raise GraphError("could not allocate the graph's compute buffer")
        # An input no op reads gets no memory: uploading to it would abort in ggml.
        builder.inputs[:] = [(t, a) for t, a in builder.inputs if t.contents.buffer]
        self.input_names = [lib.ggml_get_name(t).decode() for t, _ in builder.inputs]
        self._downloads = {name: (t, binding.numpy_shape(t)) for name, t in self.outputs.items()}
        self._upload_layouts = [binding.upload_layout(t) for t, _ in builder.inputs]
        # host memory (the CPU backend): inputs and outputs copied by numpy through views of it,
        # without a ggml call each (a streamed step moves dozens of small states); not memory
        # that a bound leaf lends anew at every run
        lent = self._placeholder[1] if self._placeholder else None

        def host_view(t):
            return None if lent and t.contents.buffer == lent else binding.host_view(t)

        self._host_inputs = [host_view(t) for t, _ in builder.inputs]
        self._host_outputs = {name: host_view(t) for name, (t, _) in self._downloads.items()}
        self._find_bound_views(self.bound)

    def _place_bound(self, bound: dict) -> None:
        """Point every bound leaf at a placeholder before allocation, so that the allocator
        leaves it alone (and its views get a buffer); ``run`` lends the real memory."""
        if not bound:
            return
        if not self.backend.is_cpu or self.backend.cpu_ops:
            raise GraphError(f"bound inputs ({', '.join(bound)}) need the CPU backend, not {self.backend.name}")
        raw = np.zeros(2 * BOUND_ALIGN, np.uint8)
        address = raw.ctypes.data + (-raw.ctypes.data) % BOUND_ALIGN
        buffer = lib.ggml_backend_cpu_buffer_from_ptr(address, BOUND_ALIGN)
        if not buffer:
            raise GraphError("could not make the placeholder buffer of the bound inputs")
        self._placeholder = (raw, buffer)
        for t in bound.values():
            t.contents.buffer = buffer
            t.contents.data = address

    def _find_bound_views(self, bound: dict) -> None:
        by_address = {ctypes.addressof(t.contents): name for name, t in bound.items()}
        self.bound_views = {name: [] for name in bound}
        for i in range(lib.ggml_graph_n_nodes(self.gf)):
            node = lib.ggml_graph_node(self.gf, i)
            src = node.contents.view_src
            name = by_address.get(ctypes.addressof(src.contents)) if src else None
            if name is not None:
                self.bound_views[name].append(node)

    def _bind(self, arrays: dict[str, np.ndarray]) -> None:
        """Lend ``arrays`` (C-contiguous float32) to the bound leaves of the same names
        and to their views: the graph reads and writes them in place. Every bound leaf needs one;
        the last ones lent are kept (``bound_arrays``) for ``profile``. The caller guarantees that
        the graph's row indices stay inside them: ggml checks indices against the leaf's shape,
        which only states the row width."""
        tensors = self.bound
        missing = set(tensors) - set(arrays)
        if missing:
            raise GraphError(f"bound inputs without memory: {', '.join(sorted(missing))}")
        for name, array in arrays.items():
            t = tensors[name]
            width, rows = int(t.contents.ne[0]), int(t.contents.ne[1])
            if (array.dtype != np.float32 or not array.flags.c_contiguous or array.ndim != 2
                    or array.shape[1] != width or array.shape[0] < rows < BOUND_ROWS):
                want = f"rows of {width}" if rows >= BOUND_ROWS else f"{rows} rows of {width}"
                raise GraphError(f"bound input {name}: need a C-contiguous float32 array of {want}, "
                                 f"got {array.dtype} {array.shape}")
            t.contents.data = array.ctypes.data
            for view in self.bound_views[name]:
                view.contents.data = array.ctypes.data + int(view.contents.view_offs)
        self.bound_arrays = dict(arrays)

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
        self.cpu_helper = cpu_backend(self.backend.requested, None)
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
        return lib.ggml_backend_name(handle).decode() if handle else "(unassigned)"

    def placement(self) -> dict[str, dict[str, int]]:
        """Nodes per backend as the scheduler assigned them (``ggml_backend_sched_get_tensor_backend``
        after allocation), by op: ``{"Vulkan0": {"MUL_MAT": 40, ...}, "CPU (fallback)": {...}}``.
        Layout-only nodes (views, reshapes, permutes) are counted under ``"(layout)"`` ops."""
        out: dict[str, dict[str, int]] = {}
        for i in range(lib.ggml_graph_n_nodes(self.gf)):
            node = lib.ggml_graph_node(self.gf, i)
            op = op_name(node)
            ops = out.setdefault(self.node_backend(node), {})
            key = "(layout)" if op in LAYOUT_OPS else op
            ops[key] = ops.get(key, 0) + 1
        return out

    @property
    def compute_bytes(self) -> int:
        if self.sched:
            return sum(int(lib.ggml_backend_sched_get_buffer_size(self.sched, b.handle))
                       for b in (self.backend, self.cpu_helper))
        return int(lib.ggml_gallocr_get_buffer_size(self.galloc, 0)) if self.galloc else 0

    def _upload_inputs(self, fresh_inputs: dict[str, np.ndarray]) -> None:
        for name, (t, array), layout, view in zip(self.input_names, self.builder.inputs, self._upload_layouts,
                                                  self._host_inputs):
            if view is not None:
                binding.put(view, fresh_inputs.get(name, array))
            else:
                binding.upload(t, fresh_inputs.get(name, array), layout)

    def _download(self, name: str) -> np.ndarray:
        t, shape = self._downloads[name]
        view = self._host_outputs[name]
        return binding.download(t, shape) if view is None else view.reshape(shape).copy()

    def run(self, fresh_inputs: dict[str, np.ndarray] | None = None,
            bound: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Upload every input (``fresh_inputs`` replace stored ones by name), lend ``bound``
        arrays to the bound leaves (see ``_bind``), compute, download."""
        if self.bound:
            self._bind(bound or {})
        self._upload_inputs(fresh_inputs or {})
        start, failed = time.perf_counter(), kernels.scratch_failures()
        with blas_single_threaded():
            if self.sched:
                status = lib.ggml_backend_sched_graph_compute(self.sched, self.gf)
                lib.ggml_backend_sched_synchronize(self.sched)
            else:
                status = lib.ggml_backend_graph_compute(self.backend.handle, self.gf)
        self.last_compute_s = time.perf_counter() - start
        if status != 0:
            raise GraphError(f"graph compute failed with ggml status {status}")
        _check_scratch(failed)
        return {name: self._download(name) for name in self._downloads}

    def _inputs_again(self, needs: str, what: str) -> None:
        """Before ``profile`` or ``timeline``: the graph on one backend, its inputs uploaded again
        (the allocator reuses input memory) and copies of the bound arrays last lent bound."""
        if self.sched:
            raise GraphError(f"{needs} needs a graph on one backend; this one runs "
                             f"{', '.join(self.cpu_nodes)} on the CPU")
        self._upload_inputs({})
        if self.bound:
            if not self.bound_arrays:
                raise GraphError(f"{what} of a graph with bound inputs before any run lent them memory")
            self._bind({name: aligned_array(a.shape, a) for name, a in self.bound_arrays.items()})

    def profile(self) -> list[tuple[str, tuple[int, ...], float]]:
        """(op, ne, seconds) of each node, computing one node at a time through graph views,
        on the inputs the graph was built with (uploaded again first: the allocator reuses
        input memory) and on copies of the bound arrays last lent (the rows themselves may be
        another stream's by now). For finding the dominant ops; the sum is a little above one
        compute. Single-backend graphs only (a scheduled graph's nodes live on two backends)."""
        self._inputs_again("per-node profile", "profile")
        out = []
        for i in range(lib.ggml_graph_n_nodes(self.gf)):
            view = lib.ggml_graph_view(self.gf, i, i + 1)
            node = lib.ggml_graph_node(self.gf, i)
            start, failed = time.perf_counter(), kernels.scratch_failures()
            with blas_single_threaded():
                status = lib.ggml_backend_graph_compute(self.backend.handle, ctypes.byref(view))
            elapsed = time.perf_counter() - start
            if status != 0:
                raise GraphError(f"node {i} failed with ggml status {status}")
            _check_scratch(failed)
            out.append((node_label(node), binding.ne(node), elapsed))
        return out

    def timeline(self) -> Timeline:
        """One compute of the whole graph, as ``run`` makes it, with each compiled kernel's call
        timed on every thread (``kernels.timed_calls``), on the inputs ``profile`` uses. Unlike
        ``profile``, each op runs where it runs in a real compute: after the ops before it, on the
        caches and memory they left, behind ggml's barrier. ggml's own ops are not timed: they lie
        in the gaps, with the barriers. Graphs on the CPU backend alone, and not while another
        thread computes the same graph (its callbacks are routed through the timed call meanwhile)."""
        self._inputs_again("a timeline", "timeline")
        nodes = [lib.ggml_graph_node(self.gf, i) for i in range(lib.ggml_graph_n_nodes(self.gf))]
        try:
            timed, restore = kernels.timed_calls(list(enumerate(nodes)))
        except RuntimeError as exc:
            raise GraphError(f"cannot time this graph's kernels: {exc}") from None
        try:
            if not timed:
                raise GraphError("no node of this graph runs a compiled kernel: nothing to time")
            failed = kernels.scratch_failures()
            with blas_single_threaded():
                start = kernels.clock_ns()
                status = lib.ggml_backend_graph_compute(self.backend.handle, self.gf)
                end = kernels.clock_ns()
        finally:
            restore()
        if status != 0:
            raise GraphError(f"graph compute failed with ggml status {status}")
        _check_scratch(failed)
        stamps = dict(timed)
        out = []
        for i, node in enumerate(nodes):
            ran = stamps[i][stamps[i][:, 0] >= 0] if i in stamps else np.empty((0, 2), np.int64)
            out.append(TimedNode(i, node_label(node), binding.ne(node), tuple((ran[:, 0] - start) / 1e9),
                                 tuple((ran[:, 1] - start) / 1e9)))
        return Timeline((end - start) / 1e9, tuple(out))

    def free(self) -> None:
        """Idempotent; handles cleared before they are freed (see WeightBuffer.free). The
        compute buffers go through ``Backend.release``: on lavapipe they are parked until the
        backend's ggml context is gone."""
        galloc, self.galloc = self.galloc, 0
        if galloc:
            self.backend.release(lambda: lib.ggml_gallocr_free(galloc))
        sched, self.sched = self.sched, 0
        if sched:
            self.backend.release(lambda: lib.ggml_backend_sched_free(sched))
        helper, self.cpu_helper = self.cpu_helper, None
        if helper is not None:
            self.backend.release(helper.free)
        ctx, self.ctx = self.ctx, 0
        if ctx:
            lib.ggml_free(ctx)
        placeholder, self._placeholder = self._placeholder, None
        if placeholder is not None:
            lib.ggml_backend_buffer_free(placeholder[1])
        self.bound_arrays = {}
        self._host_inputs, self._host_outputs = [], {}


class GraphCache:
    """Built graphs keyed by (kind, frames[, ...]); past ``size`` (of a kind, if ``per_kind``), the
    least recently used is freed. Per kind off the CPU (a rule from before ``Backend.release``
    fixed the lavapipe abort, README, Vulkan); on lavapipe evicted buffers stay parked until
    ``clear_cache()``."""

    def __init__(self, size: int, per_kind: bool = False):
        self.size, self.per_kind = size, per_kind
        self.graphs: OrderedDict = OrderedDict()

    def get(self, key, make: Callable[[], Graph]) -> Graph:
        if key in self.graphs:
            self.graphs.move_to_end(key)
            return self.graphs[key]
        graph = make()
        self.graphs[key] = graph
        same = [k for k in self.graphs if not self.per_kind or k[:1] + k[2:] == key[:1] + key[2:]]  # oldest first
        for old in same[:-self.size]:
            self.graphs.pop(old).free()
        return graph

    def discard(self, *keys) -> None:
        for graph in filter(None, (self.graphs.pop(key, None) for key in keys)):
            graph.free()

    def clear(self) -> None:
        for graph in self.graphs.values():
            graph.free()
        self.graphs.clear()

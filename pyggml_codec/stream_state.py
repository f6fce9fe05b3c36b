"""Stream state on the host: what each stream carries between chunks, and the one driver of the
streamed graphs.

A streamed graph (``graphs/build.py`` with an ``ops.Carry``, ``graphs/carry.py``) reads each
causal op's carry from inputs and writes the next one as outputs; :class:`StreamStates` keeps it per stream
(:class:`StreamSlot`), stacks it for a group of streams pushing the same number of frames (one
batched graph), and commits the new state only once every graph of a step has run. In the
"arena" lowering (the CPU) the attention layers' keys and values are not state inputs: they
are rows of host arrays (:class:`KVRows`) that the graph writes and gathers in place, so a
chunk moves only its own new rows. :class:`~pyggml_codec.streaming.StreamDecoder`,
:func:`~pyggml_codec.streaming.encode_chunked` and
:class:`~pyggml_codec.batching.BatchStreamDecoder` each own one, made by ``Engine.new_streams``
and driven through ``Engine.decode_step`` / ``Engine.encode_step``.
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from .backend.ggml_graph import BOUND_ROWS, Graph, aligned_array
from .errors import InputError
from .graphs import ops
from .graphs.build import Build
from .graphs.transformer import history_mask


class StreamSlot:
    """One stream's carried state between chunks: per graph kind its state arrays by input
    name, its positions by clock, and its index among its :class:`StreamStates`' slots (its
    rows in their key/value arenas)."""

    def __init__(self, index: int):
        self.index = index
        self.states: dict[str, dict[str, np.ndarray]] = {}
        self.clocks: dict[tuple[str, str], int] = {}
        self.frames = 0

    def state(self, kind: str, name: str, shape: tuple[int, ...]) -> np.ndarray:
        st = self.states.get(kind, {}).get(name)
        return np.zeros(shape, np.float32) if st is None else st.reshape(shape)


ARENA_SLACK = 64  # rows past a window, at least: a window moves back once per 64 frames at one a chunk


def aligned_zeros(rows: int, width: int) -> np.ndarray:
    """Zeros ``(rows, width)`` float32 at an address aligned as bound graph inputs need."""
    return aligned_array((rows, width))


class RowPool:
    """Key/value row arrays that closed stream states gave back, kept for the next ones of the
    same shape, up to ``max_bytes`` in all (an engine owns one; ``Engine.new_streams``).

    Fresh arrays are zero pages until first written: the first chunk of a new stream's graph
    then page-faults on every row it reads or writes. On a 2-core VM, touching the 100 MB of 8
    streams' rows took 100-160 ms in fresh pages and 6 ms in reused ones, and the first step of 8
    new streams took 221-269 ms (medians) against 218-221 ms on kept rows. A taken array is
    zeroed in pages already mapped."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._kept: list[np.ndarray] = []  # oldest first
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays held now."""
        return self._bytes

    def take(self, rows: int, width: int) -> np.ndarray:
        """Zeros ``(rows, width)`` float32, aligned as ``aligned_zeros``: a kept array if one
        has that shape, else a new one."""
        a = None
        with self._lock:
            for i in range(len(self._kept) - 1, -1, -1):  # the newest of that shape
                if self._kept[i].shape == (rows, width):
                    a = self._kept.pop(i)
                    self._bytes -= a.nbytes
                    break
        if a is None:
            return aligned_zeros(rows, width)
        a.fill(0.0)
        return a

    def give(self, arrays) -> None:
        """Keep these arrays (from :meth:`take` or ``aligned_zeros``), dropping the oldest kept
        ones to make room (an array larger than the pool is not kept)."""
        with self._lock:
            for a in arrays:
                if a.nbytes > self.max_bytes:
                    continue
                while self._bytes + a.nbytes > self.max_bytes:
                    self._bytes -= self._kept.pop(0).nbytes
                self._kept.append(a)
                self._bytes += a.nbytes

    def clear(self) -> None:
        """Free every kept array."""
        with self._lock:
            self._kept.clear()
            self._bytes = 0

    def close(self) -> None:
        """Free every kept array and keep none from now on (the engine closed)."""
        with self._lock:
            self.max_bytes = 0
        self.clear()


class KVRows:
    """One streamed transformer's keys and values for the slots of a :class:`StreamStates`, in
    the layout its graphs read and write in place (``ops.KVArena``): per bound leaf ``slots * cap``
    rows; slot s owns rows ``[s cap, (s + 1) cap)``, its window (its last ``hist`` positions) at
    ``offset[s]`` onward, and each chunk's new rows go right after it."""

    def __init__(self, hist: int, width: int, slots: int, pool: RowPool):
        self.hist, self.width, self.slots = hist, width, slots
        self.pool = pool
        self.cap = 0
        self.arrays: dict[str, np.ndarray] = {}
        self.offset = np.zeros(slots, np.int64)

    def reserve(self, leaves: list[str], n: int) -> None:
        """Room for a chunk of ``n`` after every window (moving the windows if the rows grow)."""
        if self.hist + n <= self.cap and set(leaves) <= set(self.arrays):
            return
        cap = max(self.cap, self.hist + max(n, ARENA_SLACK))
        if self.slots * cap > BOUND_ROWS:
            raise InputError(f"{self.slots} streams of {cap} positions exceed a bound input's {BOUND_ROWS} rows")
        old = self.arrays
        self.arrays = {name: self.pool.take(self.slots * cap, self.width) for name in set(leaves) | set(old)}
        for name, a in old.items():  # each slot's rows from its window on, to the start of its new rows:
            for s in range(self.slots):  # the window and the rows an earlier group of this step wrote after it
                start, count = s * self.cap + int(self.offset[s]), self.cap - int(self.offset[s])
                self.arrays[name][s * cap:s * cap + count] = a[start:start + count]
        self.cap, self.offset[:] = cap, 0
        self.pool.give(list(old.values()))

    def release(self) -> None:
        """Give the rows back to the pool: every window is lost, and a later chunk takes rows again."""
        self.pool.give(list(self.arrays.values()))
        self.arrays = {}

    def _window_to_start(self, slot: int, a: np.ndarray) -> None:
        """Move ``slot``'s window in ``a`` to the start of its rows."""
        start = slot * self.cap + int(self.offset[slot])
        a[slot * self.cap:slot * self.cap + self.hist] = a[start:start + self.hist]

    def clear(self, slot: int) -> None:
        """A new stream in ``slot``: a window of zeros (masked, and finite whatever ran there before)."""
        for a in self.arrays.values():
            a[slot * self.cap:slot * self.cap + self.hist] = 0.0
        self.offset[slot] = 0

    def windows(self, slots: list[int], n: int) -> np.ndarray:
        """The first row of each slot's window, with room for a chunk of ``n`` after it: a window
        that would not leave it is moved back to its slot's start first (committed rows only: a
        failed chunk loses nothing)."""
        for s in slots:
            if self.offset[s] + self.hist + n > self.cap:
                for a in self.arrays.values():
                    self._window_to_start(s, a)
                self.offset[s] = 0
        return np.array([s * self.cap + int(self.offset[s]) for s in slots], np.int64)

    def lend(self, spec: ops.KVArena, slots: list[int]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """What a chunk's graph gets (``spec``, n new positions per stream): the bound arrays, and
        its row-index inputs. A batched graph writes the chunk's rows after each window and
        gathers each window with them (``spec.gather``); one stream's graph gets its window and the
        rows after it as the bound array itself, and writes its rows at the end of it. With the
        fused attention (``spec.first``) every graph gets the whole rows, and each window's first."""
        self.reserve(spec.leaves, spec.n)
        first = self.windows(slots, spec.n)
        if not spec.gather and not spec.first:
            start, stop = int(first[0]), int(first[0]) + self.hist + spec.n
            return ({name: self.arrays[name][start:stop] for name in spec.leaves},
                    {spec.write: np.arange(self.hist, self.hist + spec.n, dtype=np.int64)})
        arrays = {name: self.arrays[name] for name in spec.leaves}
        write = (first[:, None] + self.hist + np.arange(spec.n)).ravel()
        if spec.first:  # the fused op reads each window where it lies, from its first row
            return arrays, {spec.write: write, spec.first: first.astype(np.int32)}
        read = (first[:, None] + np.arange(self.hist + spec.n)).ravel().astype(np.int32)
        return arrays, {spec.write: write, spec.read: read}


class StreamStates:
    """The carried state of up to ``capacity`` streams of one codec's streamed graphs, and the
    one driver of those graphs: :meth:`run` computes one graph kind for a group of streams
    pushing the same number of frames, stacking their states (a batched graph for several,
    ``ops.Carry.batch``) and lending the key/value rows; the new states stay pending until
    :meth:`commit`, so that a failure anywhere in a step's graphs leaves every stream as it was."""

    def __init__(self, graph: Callable[..., Graph], capacity: int, pool: RowPool):
        """``graph``: the engine's get-or-build (``Engine.graph``); ``capacity``: the most streams;
        ``pool``: where the key/value rows come from and go back to (:meth:`close`)."""
        self._graph, self.capacity, self._pool = graph, capacity, pool
        self._free = list(range(capacity))
        self._kv: dict[tuple[str, str], KVRows] = {}
        # the last batched output of each state, by (kind, name): (slot indices, array, each slot's view of
        # it); a group that runs again as it was feeds it back as it is, without a split and a stack
        self._stacked: dict[tuple[str, str], tuple[tuple[int, ...], np.ndarray, list]] = {}
        self.last_graph = None  # the graph of the last run

    def new_slot(self) -> StreamSlot:
        slot = StreamSlot(self._free.pop(0))
        for rows in self._kv.values():
            rows.clear(slot.index)
        return slot

    def free_slot(self, slot: StreamSlot) -> None:
        self._free.append(slot.index)
        self._free.sort()

    def close(self) -> None:
        """End every slot and give the key/value rows back to the pool. The states serve new
        slots after, which take rows again."""
        self._free = list(range(self.capacity))
        for rows in self._kv.values():
            rows.release()
        self._kv.clear()
        self._stacked.clear()

    def run(self, kind: str, ctx_bytes: int, n: int, slots: list[StreamSlot], build: Build,
            feed: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list]:
        """One graph of kind ``kind`` for ``slots`` (n frames each): its outputs but the states,
        and per slot a list of pending updates for :meth:`commit` (add up a step's lists)."""
        b = len(slots)
        graph = self._graph((kind, n, b) if b > 1 else (kind, n), ctx_bytes, build, streamed=True, batch=b)
        carry = graph.builder.stream
        shapes = {name: a.shape for name, (_, a) in zip(graph.input_names, graph.builder.inputs)}
        inputs = dict(feed)
        ids = tuple(slot.index for slot in slots)
        for name in carry.inputs:
            if name not in shapes:  # an input no op reads
                continue
            if b == 1:
                inputs[name] = slots[0].state(kind, name, shapes[name])
                continue
            last = self._stacked.get((kind, name))
            if last is not None and last[0] == ids and all(
                    slot.states.get(kind, {}).get(name) is view for slot, view in zip(slots, last[2])):
                inputs[name] = last[1]  # these streams' states as the last step left them
                continue
            axis = carry.batch_axes[name]
            one = shapes[name][:axis] + shapes[name][axis + 1:]
            inputs[name] = np.stack([slot.state(kind, name, one) for slot in slots], axis=axis)
        for pos, (mask, m, window) in carry.clocks.items():
            starts = [slot.clocks.get((kind, pos), 0) for slot in slots]
            inputs[pos] = np.concatenate([np.arange(p, p + m, dtype=np.int32) for p in starts])
            masks = [history_mask(m, window, p) for p in starts]
            inputs[mask] = masks[0] if b == 1 else np.stack(masks)[:, None]
        bound, used = {}, []
        for pos, spec in carry.kv.items():
            rows = self._kv.get((kind, pos))
            if rows is None:
                rows = self._kv[(kind, pos)] = KVRows(spec.hist, spec.width, self.capacity, self._pool)
            arrays, indices = rows.lend(spec, [slot.index for slot in slots])
            bound.update(arrays)
            inputs.update(indices)
            used.append((rows, spec.n))
        out = graph.run(inputs, bound)
        self.last_graph = graph
        views = {}  # a batched state's output, split into each stream's view of it
        for name in carry.outputs:
            if b > 1 and name not in carry.appended:
                stacked = out[name].reshape(shapes[name])
                views[name] = list(np.moveaxis(stacked, carry.batch_axes[name], 0))
                self._stacked[(kind, name)] = (ids, stacked, views[name])
        pending = []
        for i, slot in enumerate(slots):
            states = {name: views[name][i] if name in views else
                      _new_state(slot.state, kind, name, carry, shapes[name], out[name], b, i)
                      for name in carry.outputs}
            clocks = {(kind, pos): slot.clocks.get((kind, pos), 0) + m for pos, (_, m, _) in carry.clocks.items()}
            pending.append([(kind, states, clocks, used)])
        return {name: a for name, a in out.items() if name not in carry.outputs}, pending

    @staticmethod
    def commit(slot: StreamSlot, pending: list, frames: int) -> None:
        """Apply a slot's pending updates (from :meth:`run`, every graph of a step) and count its frames."""
        for kind, states, clocks, used in pending:
            slot.states[kind] = states
            slot.clocks.update(clocks)
            for rows, n in used:
                rows.offset[slot.index] += n
        slot.frames += frames


def _new_state(state, kind: str, name: str, carry, shape: tuple, out: np.ndarray, b: int, i: int) -> np.ndarray:
    """Stream ``i``'s next state ``name`` from a graph output (``shape``: the state input's)."""
    axis = carry.batch_axes.get(name) if b > 1 else None
    one = shape if axis is None else shape[:axis] + shape[axis + 1:]
    if name in carry.appended:  # this chunk's entries only: append them to the stream's own
        new_shape = list(shape)
        new_shape[carry.appended[name] + (axis is not None and axis <= carry.appended[name])] = -1
        new = out.reshape(new_shape) if axis is None else np.take(out.reshape(new_shape), i, axis=axis)
        return append_state(state(kind, name, one), new, carry.appended[name])
    return out.reshape(shape) if axis is None else np.take(out.reshape(shape), i, axis=axis)


def append_state(old: np.ndarray, new: np.ndarray, axis: int) -> np.ndarray:
    """A carried history ``old`` with a chunk's ``new`` entries appended along ``axis``, cut to
    ``old``'s length (its last entries)."""
    new = new.reshape(old.shape[:axis] + (-1,) + old.shape[axis + 1:])
    n, length = new.shape[axis], old.shape[axis]

    def span(a: int, b: int) -> tuple:
        return (slice(None),) * axis + (slice(a, b),)

    out = np.empty_like(old)  # one copy: the kept entries of old, then new
    if n >= length:
        out[...] = new[span(n - length, n)]
    else:
        out[span(0, length - n)] = old[span(n, length)]
        out[span(length - n, length)] = new
    return out

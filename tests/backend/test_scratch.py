"""The compiled kernels' scratch slots (csrc/scratch.c): a slot whose buffer cannot grow is given back
by pg_scratch_take itself, so a failed take leaves no slot busy. Every kernel that takes scratch then
only returns on NULL; before, each caller had to give the slot back, and four did not."""

from __future__ import annotations

import pytest

from pyggml_codec.backend import kernels

SLOTS = 64  # PG_SCRATCH_SLOTS


@pytest.fixture
def klib(require):
    require("kernels", kernels.AVAILABLE, f"compiled kernels missing: {kernels.UNAVAILABLE_REASON}")
    from pyggml_codec.backend import _kernels

    return _kernels


def test_failed_takes_keep_no_slot_busy(klib):
    lib, ffi = klib.lib, klib.ffi
    slot = ffi.new("int *")
    huge = 1 << 60  # 4 EiB of floats: no allocator grants it
    for _ in range(SLOTS + 6):
        assert lib.pg_scratch_take(huge, slot) == ffi.NULL
        assert slot[0] == -1, "a failed take must hand back its slot"
    buf = lib.pg_scratch_take(16, slot)
    print(f"after {SLOTS + 6} failed takes a small take got slot {slot[0]}")
    assert buf != ffi.NULL and 0 <= slot[0] < SLOTS, "every slot was left busy"
    lib.pg_scratch_give(buf, slot[0])


def test_failed_takes_are_counted_and_zero_takes_granted(klib):
    """A failed take leaves some kernel's output unset: the count is what Graph.run checks."""
    lib, ffi = klib.lib, klib.ffi
    slot = ffi.new("int *")
    before = lib.pg_scratch_failures()
    for huge in (1 << 60, (1 << 64) - 1):  # the second wraps sizeof(float) * n in a size_t
        assert lib.pg_scratch_take(huge, slot) == ffi.NULL and slot[0] == -1
    assert lib.pg_scratch_failures() == before + 2
    buf = lib.pg_scratch_take(0, slot)  # a zero-size product's take: was NULL with its slot kept busy
    assert buf != ffi.NULL and 0 <= slot[0] < SLOTS
    lib.pg_scratch_give(buf, slot[0])
    assert lib.pg_scratch_failures() == before + 2


def test_a_compute_whose_kernel_was_refused_scratch_raises(monkeypatch, require):
    """An output a kernel left unset is not returned: Graph.run raises MemoryError."""
    import numpy as np

    from graphrun import run_cpu_graph
    from pyggml_codec.backend import ggml_graph

    require("kernels", kernels.AVAILABLE, f"compiled kernels missing: {kernels.UNAVAILABLE_REASON}")
    x = np.ones((4, 8), np.float32)
    build = lambda g: {"y": kernels.transpose(g.ctx, g.input("x", x))}  # noqa: E731
    np.testing.assert_array_equal(run_cpu_graph(build)["y"], x.T)
    counts = iter(range(100))  # every read one more refusal: as if a kernel failed during the compute
    monkeypatch.setattr(ggml_graph.kernels, "scratch_failures", lambda: next(counts))
    with pytest.raises(MemoryError, match=r"could not allocate its scratch memory \(1 refusals\)"):
        run_cpu_graph(build)


_OWN_SLOTS = r"""
import json
from concurrent.futures import ThreadPoolExecutor
from pyggml_codec.backend import _kernels
lib, ffi = _kernels.lib, _kernels.ffi

def take(n):
    slot = ffi.new("int *")
    buf = lib.pg_scratch_take(n, slot)
    assert buf != ffi.NULL
    lib.pg_scratch_give(buf, slot[0])
    return slot[0]

a, b = ThreadPoolExecutor(1), ThreadPoolExecutor(1)  # one thread each, kept
on = lambda pool, n: pool.submit(take, n).result()
print(json.dumps({"a": on(a, 1000), "b": on(b, 1000), "a_again": [on(a, 1000) for _ in range(3)],
                  "b_again": [on(b, 500) for _ in range(3)], "a_grown": on(a, 1 << 20)}))
"""


def test_each_thread_takes_back_its_own_slot(klib):
    """A slot freed by one thread goes back to that thread, not to the first thread that asks: its
    lines are still in that thread's caches (two cores on different dies otherwise pass every block's
    buffers between them). Taken first-come, the second thread got the first one's slot. Run in a
    fresh process, where no slot has been used yet."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _OWN_SLOTS], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    print(f"slots taken: {got}")
    assert got["a"] != got["b"], "the second thread took the first thread's slot"
    assert got["a_again"] == [got["a"]] * 3 and got["b_again"] == [got["b"]] * 3
    assert got["a_grown"] == got["a"], "a thread's own slot grows before another thread's is taken"

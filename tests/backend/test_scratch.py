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

"""ggml's F16 and F32 matrix products in register blocks (``kernels.mul_mat_f16dot``, csrc/ggmldot.c),
which the "s2cpp" precision runs in place of ggml's ``mul_mat``.

Metric: bit equality (``np.array_equal`` of the float32 bit patterns) with ggml's own ``mul_mat``
computed in the same process, over shapes with and without leftovers past whole steps of ggml's loop,
row and column tails of the blocks, an F16 first operand with F16 and F32 second operands (rounded to
F16 as ggml does) and two F32 operands (ggml's F32 dot product),
batches with a broadcast first operand, and 1 to 3 threads. The golden s2.cpp sets
(tests/tools/test_s2cpp.py) check the codec's stages with it in place. A negative control shows
the comparison sees a one-ulp change.
"""

from __future__ import annotations

import numpy as np
import pytest

from pyggml_codec.backend import binding, kernels
from pyggml_codec.backend.binding import lib
from pyggml_codec.graphs import ops
from graphrun import run_cpu_graph


@pytest.fixture(autouse=True)
def _f16dot(require):
    """Skipped where the exact build's product does not reproduce this ggml build (no AVX2, or a
    LLAMAFILE build), saying why; failed under PYGGML_REQUIRE=f16dot."""
    require("f16dot", kernels.F16DOT, f"ggml's F16 product in blocks unavailable: {kernels.F16DOT_UNAVAILABLE_REASON}")


def _products(a: np.ndarray, b: np.ndarray, b_type: int, threads: int,
              a_type: int = ops.F16) -> tuple[np.ndarray, np.ndarray]:
    """(ours, ggml's mul_mat) for a [.., m, k] held as a_type and b [.., n, k] held as b_type."""
    def build(g):
        ta, tb = g.input("a", a, a_type), g.input("b", b, b_type)
        assert kernels.mul_mat_f16dot_supported(ta, tb)
        return {"ours": kernels.mul_mat_f16dot(g.ctx, ta, tb, g.keep), "ggml": lib.ggml_mul_mat(g.ctx, ta, tb)}

    out = run_cpu_graph(build, threads)
    return out["ours"], out["ggml"]


def _bits_differ(x: np.ndarray, y: np.ndarray) -> int:
    return int((x.astype(np.float32).view(np.uint32) != y.astype(np.float32).view(np.uint32)).sum())


@pytest.mark.parametrize("a_type,b_type", [(ops.F16, ops.F16), (ops.F16, ops.F32), (ops.F32, ops.F32)])
@pytest.mark.parametrize("k,m,n,batch_a,batch_b,threads", [
    (5, 3, 1, 1, 1, 2), (63, 7, 9, 1, 1, 2), (87, 5, 7, 1, 1, 2), (64, 4, 6, 1, 1, 1), (65, 13, 11, 1, 1, 3),  # K below, at, past a step
    (127, 7, 9, 1, 1, 2), (128, 4, 6, 1, 1, 1),  # below and at a step of 32 half lanes (an AVX512-FP16 ggml)
    (672, 96, 200, 1, 1, 2), (1001, 33, 17, 1, 1, 2),  # a conv's K (96 x 7), the columns split
    (256, 300, 5, 1, 1, 2),  # rows split (fewer columns than rows)
    (130, 20, 12, 2, 2, 1), (130, 20, 12, 1, 3, 2),  # batches; a broadcast over three
])
def test_f16dot_is_ggml_mul_mat_bit_for_bit(a_type, b_type, k, m, n, batch_a, batch_b, threads):
    rng = np.random.default_rng(k * 7 + m + n)
    name = {ops.F16: "F16", ops.F32: "F32"}
    dtype = {ops.F16: np.float16, ops.F32: np.float32}
    a = (rng.standard_normal((batch_a, m, k)) * rng.choice([1.0, 300.0], (batch_a, m, 1))).astype(dtype[a_type])
    b = rng.standard_normal((batch_b, n, k)).astype(dtype[b_type])
    if a_type == ops.F32 and not kernels.F16DOT_F32_TAIL:
        pytest.skip("ggml's F32 dot product sums its leftovers in a way ggmldot.c does not reproduce here: "
                    "F32 products stay with ggml's mul_mat")
    ours, ggml = _products(a, b, b_type, threads, a_type)
    differ = _bits_differ(ours, ggml)
    print(f"f16dot k={k} m={m} n={n} a {name[a_type]} b {name[b_type]} batches {batch_a}/{batch_b}, "
          f"{threads} thread(s): {differ} of {ggml.size} outputs differ from ggml's mul_mat (bound 0)")
    assert ours.shape == ggml.shape and differ == 0


@pytest.mark.parametrize("b_type", [ops.F16, ops.F32])
def test_f16dot_paired_chains_keep_ggml_bits(b_type):
    """Short F16 products (at most ``pg_f16dot_pairs_max_steps`` whole steps of ggml's loop, 8 by
    default, no leftovers) run the loop's four chains two at a time in blocks of 4 x 3 outputs
    (AVX-512 builds without AVX512-FP16; elsewhere the setting changes nothing). Against ggml's own
    mul_mat with the paired blocks never (0), by default, and for every length (1 << 20): K of one
    to eight steps and past them, with leftovers (taken by the other blocks), row and column
    counts off the blocks, fewer than 8 outputs, rows or columns split between threads. That the
    paired blocks are faster is measured side by side (ggmldot.c). Metric: outputs whose bits
    differ from ggml's, bound 0."""
    klib = kernels._EXACT["module"].lib
    rng = np.random.default_rng(53)
    cases = [(64, 13, 11, 2), (128, 4, 3, 1), (192, 7, 5, 2), (256, 2, 1, 1), (448, 64, 300, 2), (512, 9, 7, 3),
             (1024, 5, 4, 2), (124, 6, 5, 2)]
    differ, outputs = 0, 0
    try:
        for steps in (0, 8, 1 << 20):
            klib.pg_f16dot_pairs_max_steps(steps)
            for k, m, n, threads in cases:
                a = (rng.standard_normal((m, k)) * rng.choice([1.0, 300.0], (m, 1))).astype(np.float16)
                b = rng.standard_normal((n, k)).astype(np.float16 if b_type == ops.F16 else np.float32)
                ours, ggml = _products(a, b, b_type, threads)
                differ += _bits_differ(ours, ggml)
                outputs += ggml.size
    finally:
        klib.pg_f16dot_pairs_max_steps(8)
    print(f"f16dot paired chains, b {'F16' if b_type == ops.F16 else 'F32'}: {differ} of {outputs} outputs "
          f"differ from ggml's mul_mat (bound 0)")
    assert differ == 0


def test_f16dot_comparison_sees_one_ulp():
    """Negative control: one output one float32 ulp off is seen."""
    rng = np.random.default_rng(1)
    ours, ggml = _products(rng.standard_normal((8, 96)).astype(np.float16),
                           rng.standard_normal((6, 96)).astype(np.float16), ops.F16, 2)
    bumped = ours.copy()
    bumped.flat[5] = np.nextafter(bumped.flat[5], np.float32(np.inf))
    assert _bits_differ(ours, ggml) == 0 and _bits_differ(bumped, ggml) == 1


def test_f16dot_probe_runs_against_ggml():
    """The import-time check compares with ggml's vec_dot itself, and its lanes match the ISA key."""
    lanes, tail, reason = kernels._f16dot_check()
    assert reason is None and lanes == kernels.F16DOT_LANES and tail == kernels.F16DOT_F32_TAIL
    assert binding.vec_dot(np.ones(3, np.float16), np.full(3, 2, np.float16)) == 6.0
    assert binding.vec_dot(np.ones(3, np.float32), np.full(3, 2, np.float32)) == 6.0
    with pytest.raises(ValueError, match="two float16 or float32"):
        binding.vec_dot(np.ones(3, np.float16), np.ones(3, np.float32))
    from pyggml_codec.backend import buildinfo
    assert {32: "avx512fp16", 16: "avx512", 8: "avx2"}[lanes] == buildinfo.build_isa_key()


def test_f16dot_refuses_what_it_cannot_read():
    def build(g):
        a16 = g.input("a", np.zeros((4, 64), np.float16), ops.F16)
        a32 = g.input("a32", np.zeros((4, 64), np.float32))
        b = g.input("b", np.zeros((3, 64), np.float32))
        assert not kernels.mul_mat_f16dot_supported(a32, g.input("b16", np.zeros((3, 64), np.float16), ops.F16))
        assert not kernels.mul_mat_f16dot_supported(a16, lib.ggml_transpose(g.ctx, b))  # strided rows
        return {"y": kernels.mul_mat_f16dot(g.ctx, a16, b, g.keep)}

    assert run_cpu_graph(build)["y"].shape == (3, 4)

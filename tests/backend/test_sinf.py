"""libm's ``sinf`` in vectors (csrc/elementwise.c, the exact build), which the "s2cpp" precision's
Snake runs in place of one libm call per value where it reproduces this process's libm.

Metric: bit equality with libm's ``sinf`` called from this process (through ctypes, and inside the C
check), over every 61st float (both signs throughout), windows of every float around the replica's branch
points and around multiples of pi/2 up to 120, and random floats of every magnitude; and bit
equality of the exact Snake and bias + Snake kernels with ggml's op chain (``ggml_sin``), with
inputs past the vector range, infinities, NaN and subnormals. A negative control shows the
comparison sees a one-ulp change.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
import pytest

from graphrun import run_cpu_graph
from pyggml_codec.backend import kernels
from pyggml_codec.graphs import ops


@pytest.fixture(name="replica")
def _replica(require):
    """The replica's tests: skipped where it is not built or does not match this libm, saying why;
    failed under PYGGML_REQUIRE=sinf."""
    require("sinf", kernels.SINF, f"libm's sinf in vectors unavailable: {kernels.SINF_UNAVAILABLE_REASON}")


def _klib():
    from pyggml_codec.backend import _kernels_exact  # the exact build's compiled module

    return _kernels_exact.lib, _kernels_exact.ffi


def _libm_sinf():
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.sinf.restype, libm.sinf.argtypes = ctypes.c_float, [ctypes.c_float]
    return libm.sinf


def _vector(x: np.ndarray) -> np.ndarray:
    klib, ffi = _klib()
    x = np.ascontiguousarray(x, np.float32)
    y = np.empty_like(x)
    klib.pg_sinf_exact(ffi.cast("float *", x.ctypes.data), ffi.cast("float *", y.ctypes.data), x.size)
    return y


def _differ(got: np.ndarray, want: np.ndarray) -> int:
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    return int((~same).sum())


def test_every_61st_float(replica):
    klib, _ = _klib()
    differ = int(klib.pg_sinf_exact_check(0, 1 << 31, 61))
    print(f"every 61st float, both signs ({2 * ((1 << 31) // 61)} values): {differ} differ from libm (bound 0)")
    assert differ == 0


def _bits(value: float) -> int:
    return int(np.array(value, np.float32).view(np.uint32))


@pytest.mark.parametrize("center", [0x39800000, 0x3F400000, 0x42F00000, 0x00800000, 0x7F800000],
                         ids=["2^-12", "0.75", "120", "smallest-normal", "infinity"])
def test_every_float_around_the_branch_points(center, replica):
    """The replica's branches switch on the top 12 bits of |y|: 0x398 (y returned), 0x3f4 (reduced
    or not), 0x42f (libm for the rest); 2^16 floats each side, both signs."""
    klib, _ = _klib()
    lo, hi = max(0, center - (1 << 16)), min(1 << 31, center + (1 << 16))
    differ = int(klib.pg_sinf_exact_check(lo, hi, 1))
    print(f"{hi - lo} floats of each sign around {center:#010x}: {differ} differ (bound 0)")
    assert differ == 0


def test_every_float_near_multiples_of_half_pi(replica):
    """Where the quadrant n changes (the reduction's rounding and the sign and cos choices)."""
    klib, _ = _klib()
    differ = 0
    for k in range(1, 77):  # k pi / 2 < 120
        b = _bits(k * np.pi / 2)
        differ += int(klib.pg_sinf_exact_check(b - 4096, b + 4096, 1))
    print(f"8192 floats of each sign around k pi/2, k = 1..76: {differ} differ (bound 0)")
    assert differ == 0


def test_random_floats_against_libm_through_ctypes(replica):
    """An oracle outside the C check: libm's sinf called one value at a time from Python."""
    rng = np.random.default_rng(3)
    mags = np.concatenate([10.0 ** rng.uniform(-8, 2.3, 40000), rng.uniform(0, 130, 20000)])
    x = (mags * rng.choice([-1.0, 1.0], mags.size)).astype(np.float32)
    x = np.concatenate([x, np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-40, 3e38], np.float32)])
    sinf = _libm_sinf()
    want = np.array([sinf(float(v)) for v in x], np.float32)
    got = _vector(x)
    differ = _differ(got, want)
    print(f"{x.size} random floats: {differ} differ from libm (bound 0)")
    assert differ == 0
    one_ulp = got.copy()
    one_ulp.view(np.uint32)[123] ^= 1
    assert _differ(one_ulp, want) == 1, "the comparison must see a one-ulp change"


@pytest.fixture(params=["replica", "libm"])
def sinf_path(request):
    """The exact Snake's sines by the replica (where it is on) or by libm's scalar sinf (the path of
    builds and machines without it), switched for the test and restored after."""
    klib = _klib()[0] if kernels.EXACT_AVAILABLE else None
    if request.param == "replica":
        request.getfixturevalue("replica")
    elif klib is not None:
        klib.pg_sinf_exact_use(0)
    yield request.param
    if klib is not None:
        klib.pg_sinf_exact_use(int(kernels.SINF))


@pytest.mark.parametrize("layout", ["CF", "CL"])
def test_exact_snake_kernels_equal_ggml_chain(layout, sinf_path):
    """x + sin(a x)^2 / a by the exact Snake and bias + Snake kernels against ggml's mul, sin, sqr,
    div and add, bit for bit; a x spans the vector range and beyond (libm for |a x| >= 120),
    with infinities, NaN, zeros and subnormals. Runs wherever the exact build does, with the
    replica or (where it is off) libm's scalar sinf."""
    if not kernels.EXACT_AVAILABLE:
        pytest.fail(f"exact kernels missing: {kernels.EXACT_UNAVAILABLE_REASON}")
    rng = np.random.default_rng(8)
    c, n = 5, 333
    x = (rng.standard_normal((c, n)) * 10.0 ** rng.uniform(-6, 2.5, (c, n))).astype(np.float32)
    x.flat[:6] = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-42]
    alpha = rng.uniform(0.2, 3.0, c).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32)
    if layout == "CL":
        x = np.ascontiguousarray(x.T)
    lowered = {}

    def build(g, kernel):
        g.snake_kernel = kernel
        xt = g.input("x", x)
        a, b = g.input("alpha", alpha), g.input("bias", bias)
        out = {"snake": ops.snake(g, xt, a, layout)}
        lowered[kernel] = g.lowerings["snake"]
        if kernel:
            out["bias_snake"] = ops.bias_snake(g, xt, b, a, layout)
        else:  # ggml's add of the bias, then the chain
            out["bias_snake"] = ops.snake(g, ops.add(g, xt, ops.channel_vector(g, b, layout)), a, layout)
        return out

    ours = run_cpu_graph(lambda g: build(g, True), 2, snake_kernel=True, exact_kernels=True)
    chain = run_cpu_graph(lambda g: build(g, False), 2, snake_kernel=True, exact_kernels=True)
    assert lowered == {True: "custom-exact", False: "chain"}
    for name in ("snake", "bias_snake"):
        differ = _differ(ours[name], chain[name])
        print(f"{layout} {name}, sines by {sinf_path}: {differ} of {x.size} values differ from ggml's chain (bound 0)")
        assert differ == 0

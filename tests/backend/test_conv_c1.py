"""The causal conv from one input channel in one op (``kernels.conv_c1``, csrc/rowdot.c): the
encoder's first conv without its im2col columns and bias pass.

Metrics: bit for bit (``np.array_equal`` of the float32 bits) against the path it replaces, ggml's
im2col columns through the row products then the bias pass, at several taps, channels and
lengths (tails, signals shorter than a vector, signed zeros), and across 1, 2 and 3 threads; max
abs error over max abs value against float64 numpy, bound 1e-6. At codec level every encoder
stage of the F32 file matches the replaced path bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

import pyggml_codec
from pyggml_codec.backend import kernels
from pyggml_codec.demo import build_demo_model
from pyggml_codec.graphs import convs
from graphrun import run_cpu_graph

REL_MAX = 1e-6  # measured 4.2e-8 to 1.3e-7 over the shapes below


@pytest.fixture(autouse=True)
def _sixteen_lanes(require):
    require("rowdot", kernels.ROWDOT, "no row-product kernel in this build")
    if kernels.OPS["rowdot"] < 16:
        pytest.skip("conv_c1 reproduces the 16-float row products; this build's are "
                    f"{kernels.OPS['rowdot']}-float, and its first conv keeps the im2col path")


OPTIONS = dict(snake_kernel=True, im2col_kernel=True, matmul="blas", conv="winograd")


def _conv(x, w, b, fused: bool, threads: int = 2):
    """convs.conv1d of x [L] by w [Cout, 1, K] (+ b): numpy [Cout, L], and the lowering it took;
    ``fused`` False: with conv_c1 refused, the im2col columns through the row products."""
    used = {}

    def build(g):
        tx, tw = g.input("x", x[None, :]), g.input("w", w)
        tb = g.input("b", b) if b is not None else None
        y = convs.conv1d(g, tx, tw, tb, out="CF")
        used.update(g.lowerings)
        return {"y": y}

    with pytest.MonkeyPatch.context() as patch:
        if not fused:
            patch.setattr(kernels, "conv_c1_supported", lambda *a, **k: False)
        y = run_cpu_graph(build, threads, **OPTIONS)["y"]
    return y.reshape(w.shape[0], x.shape[0]), used.get("conv1d")


def _reference(x, w, b) -> np.ndarray:
    k = w.shape[2]
    xp = np.concatenate([np.zeros(k - 1), x.astype(np.float64)])
    cols = np.stack([xp[i:i + x.shape[0]] for i in range(k)])  # [K, L]
    y = w[:, 0, :].astype(np.float64) @ cols
    return y + (b.astype(np.float64)[:, None] if b is not None else 0.0)


@pytest.mark.parametrize("k,cout,length,bias", [
    (7, 64, 5000, True),  # the encoder's first conv
    (7, 64, 2049, False), (7, 5, 15, True), (7, 17, 16, True),  # tails, a signal shorter than a vector
    (1, 3, 40, True), (3, 9, 100, False), (16, 4, 33, True),  # one tap, a few, a whole vector of them
])
def test_conv_c1_matches_the_im2col_product(k, cout, length, bias):
    rng = np.random.default_rng(k * 1000 + cout + length)
    x = rng.standard_normal(length).astype(np.float32)
    x[: length // 4] = 0.0  # silence, and signed zeros: products of -0 must add as the tree does
    x[length // 4: length // 3] = -0.0
    w = rng.standard_normal((cout, 1, k)).astype(np.float32)
    w[0] = -0.0
    b = rng.standard_normal(cout).astype(np.float32) if bias else None
    got, lowering = _conv(x, w, b, fused=True)
    want, old = _conv(x, w, b, fused=False)
    assert lowering == "one-channel" and old != "one-channel", (lowering, old)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    ref = _reference(x, w, b)
    rel = float(np.abs(got - ref).max() / np.abs(ref).max())
    print(f"conv_c1 K={k} Cout={cout} L={length}: bit-equal to the im2col product; rel max err {rel:.2e}")
    assert rel < REL_MAX


def test_conv_c1_bits_do_not_depend_on_the_thread_count():
    rng = np.random.default_rng(7)
    x = rng.standard_normal(3 * 2048 + 100).astype(np.float32)
    w = rng.standard_normal((64, 1, 7)).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    runs = [_conv(x, w, b, fused=True, threads=t)[0].view(np.uint32) for t in (1, 2, 3)]
    assert all(np.array_equal(runs[0], r) for r in runs[1:])


def test_conv_c1_is_refused_where_it_does_not_reproduce_the_product():
    def build(g):
        x16 = g.input("x", np.zeros((1, 64), np.float32))
        two = g.input("x2", np.zeros((2, 64), np.float32))  # two channels
        w = g.input("w", np.zeros((8, 1, 7), np.float32))
        wide = g.input("wk", np.zeros((8, 1, 17), np.float32))  # 17 taps: past one vector
        b_short = g.input("b", np.zeros(7, np.float32))
        assert kernels.conv_c1_supported(w, x16)
        assert not kernels.conv_c1_supported(w, two)
        assert not kernels.conv_c1_supported(wide, x16)
        assert not kernels.conv_c1_supported(w, x16, b_short)
        return {"y": x16}

    run_cpu_graph(build, 1, **OPTIONS)


@pytest.fixture(scope="module")
def demo_path(tmp_path_factory):
    return build_demo_model(tmp_path_factory.mktemp("demo"), seed=0)


def test_encoder_stages_match_the_im2col_product(demo_path, monkeypatch):
    """Every stage of an f32 encode, with the first conv in one op and through the columns."""
    x = np.random.default_rng(3).standard_normal(44100 + 333).astype(np.float32) * 0.3
    calls = []
    real = kernels.conv_c1
    monkeypatch.setattr(kernels, "conv_c1", lambda *a, **k: calls.append(1) or real(*a, **k))
    stages = {}
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(kernels, "conv_c1_supported", lambda *a, **k: False)
        with pyggml_codec.load(demo_path, backend="cpu", precision="f32", n_threads=2) as codec:
            stages[fused] = codec.encode_stages(x).stages
        if fused:
            assert calls, "the f32 encode did not take conv_c1"
    assert stages[True].keys() == stages[False].keys() and stages[True]
    for name, value in stages[True].items():
        a, b = np.asarray(value), np.asarray(stages[False][name])
        assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8)), name

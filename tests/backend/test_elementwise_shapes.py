"""The fused elementwise kernels on the shapes at their edges, against numpy: a channels-last tensor of one
channel (x ne [1, L], alpha and bias [1, 1]: the kernels took that for one value per row and read L of them)
and a batched x whose per-row alpha and bias repeat over the batches (ne [1, C] against x [n, C, B])."""

from __future__ import annotations

import numpy as np
import pytest

from graphrun import run_cpu_graph
from pyggml_codec.backend import kernels


@pytest.fixture(autouse=True)
def _kernels(require):
    require("kernels", kernels.AVAILABLE, f"compiled kernels missing: {kernels.UNAVAILABLE_REASON}")


def _snake(t, a):
    return t + np.sin(a * t) ** 2 / a


@pytest.mark.parametrize("exact", [False, True])
def test_one_channel_channels_last(exact, require):
    if exact:
        require("kernels", kernels.EXACT_AVAILABLE, f"exact kernels missing: {kernels.EXACT_UNAVAILABLE_REASON}")
    rng = np.random.default_rng(0)
    n = 4096
    x = rng.standard_normal((n, 1)).astype(np.float32)  # ne [1, L]: one channel, channels last
    alpha, bias = np.array([[0.7]], np.float32), np.array([[0.25]], np.float32)
    junk = np.full(n, 1e6, np.float32)  # what a read past alpha or bias would find

    def build(g):
        tx, _, ta, tb, _ = (g.input(k, v) for k, v in (("x", x), ("j1", junk), ("a", alpha), ("b", bias), ("j2", junk)))
        return {"bias_snake": kernels.bias_snake(g.ctx, tx, ta, tb, 0, exact),
                "add_bias_residual": kernels.add_bias_residual(g.ctx, tx, tb, tx, exact)}

    got = run_cpu_graph(build)
    want = {"bias_snake": _snake(x + np.float32(0.25), np.float32(0.7)), "add_bias_residual": (x + np.float32(0.25)) + x}
    for name, w in want.items():
        err = float(np.abs(got[name].reshape(w.shape) - w).max())
        print(f"{name}, one channel of {n} samples, exact={exact}: max abs {err:.2e} (bound 5e-6)")
        assert err < 5e-6  # measured 4.8e-7 (bias_snake) and 0


@pytest.mark.parametrize("exact", [False, True])
def test_per_row_values_repeat_over_batches(exact, require):
    if exact:
        require("kernels", kernels.EXACT_AVAILABLE, f"exact kernels missing: {kernels.EXACT_UNAVAILABLE_REASON}")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 64)).astype(np.float32)  # ne [64, 4, 3]: 3 batches of 4 rows
    alpha = rng.uniform(0.5, 1.5, (4, 1)).astype(np.float32)  # ne [1, 4]
    bias = rng.standard_normal((4, 1)).astype(np.float32)

    def build(g):
        tx, ta, tb = g.input("x", x), g.input("a", alpha), g.input("b", bias)
        return {"bias_snake": kernels.bias_snake(g.ctx, tx, ta, tb, 0, exact)}

    got = run_cpu_graph(build)["bias_snake"].reshape(x.shape)
    want = _snake(x + bias, alpha)
    err = float(np.abs(got - want).max())
    print(f"bias_snake over 3 batches, exact={exact}: max abs {err:.2e} (bound 3e-6)")
    assert err < 3e-6  # measured 2.4e-7

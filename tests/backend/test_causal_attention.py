"""A whole sequence's causal sliding-window attention in one op (``arena_attention.causal_attention``,
csrc/attention.c), the "fused" attention lowering of the one-shot graphs.

Metrics: max abs error over max abs value against float64 numpy, bound 2e-6 (measured 1e-7 to
4e-7); the kernel's claim that an output does not depend on the thread count is bit for bit
(``np.array_equal``).
"""

from __future__ import annotations

import numpy as np
import pytest

from graphrun import run_cpu_graph
from pyggml_codec.backend import arena_attention
from pyggml_codec.backend.ggml_graph import new_context
from pyggml_codec.backend.binding import lib
from pyggml_codec.graphs import ops

REL_MAX = 2e-6


@pytest.fixture(autouse=True)
def _kernels(require):
    require("kernels", arena_attention.WINDOW_ATTENTION, "compiled kernels not built")


def _attention(q, k, v, window, scale, threads=2):
    """q (T, H, hd), k and v (T, Hkv, hd): (T, H hd), laid out as the transformer lays them out."""
    def build(g):
        kt = lib.ggml_cont(g.ctx, lib.ggml_permute(g.ctx, g.input("k", k), 1, 2, 0, 3))  # [T, hd, Hkv]
        vh = lib.ggml_cont(g.ctx, lib.ggml_permute(g.ctx, g.input("v", v), 0, 2, 1, 3))  # [hd, T, Hkv]
        return {"y": arena_attention.causal_attention(g.ctx, g.input("q", q), kt, vh, window, scale, g.keep)}

    return run_cpu_graph(build, threads)["y"]


def _reference(q, k, v, window, scale):
    t, heads, hd = q.shape
    group = heads // k.shape[1]
    i, j = np.arange(t)[:, None], np.arange(t)[None, :]
    visible = (j <= i) & ((window == 0) | (j > i - window))
    out = np.zeros((t, heads * hd))
    for h in range(heads):
        s = q[:, h].astype(np.float64) @ k[:, h // group].astype(np.float64).T * scale
        s = np.where(visible, s, -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, h * hd:(h + 1) * hd] = (p / p.sum(axis=1, keepdims=True)) @ v[:, h // group].astype(np.float64)
    return out


def _case(seed, t, heads, kv_heads, hd):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((t, h, hd)).astype(np.float32) for h in (heads, kv_heads, kv_heads))


@pytest.mark.parametrize("t,heads,kv_heads,hd,window,threads", [
    (37, 4, 4, 16, 8, 2),  # windows from partial to full; a partial last block of queries
    (50, 4, 2, 24, 0, 3),  # plain causal, grouped heads, hd off the vector width
    (203, 8, 8, 64, 64, 2),  # the RVQ transformers' head size; spans of two and more key blocks
    (130, 6, 3, 80, 300, 1),  # a window past the sequence; hd 80 = 64 + 16
    (17, 2, 1, 64, 1, 2),  # each query sees itself alone
    (600, 4, 4, 64, 512, 2),  # the encoder's window at a length past it
])
def test_causal_attention_matches_numpy(t, heads, kv_heads, hd, window, threads):
    q, k, v = _case(t + hd, t, heads, kv_heads, hd)
    scale = 1.0 / np.sqrt(hd)
    got = _attention(q, k, v, window, scale, threads)
    want = _reference(q, k, v, window, scale)
    rel = float(np.abs(got - want).max() / np.abs(want).max())
    print(f"causal_attention T={t} H={heads}/{kv_heads} hd={hd} W={window}: rel max err {rel:.2e}")
    assert rel <= REL_MAX


def test_causal_attention_does_not_depend_on_the_thread_count():
    q, k, v = _case(7, 203, 4, 2, 64)
    one = _attention(q, k, v, 64, 0.125, 1)
    for threads in (2, 3, 4):
        assert np.array_equal(_attention(q, k, v, 64, 0.125, threads), one), f"{threads} threads"


def test_causal_attention_refuses_what_it_cannot_read():
    ctx = new_context(32 * ops.lib.ggml_tensor_overhead())
    try:
        q = ops.new_tensor(ctx, ops.F32, (16, 4, 6))  # hd 16, H 4, T 6
        kt = ops.new_tensor(ctx, ops.F32, (6, 16, 2))  # Hkv 2
        v = ops.new_tensor(ctx, ops.F32, (16, 6, 2))
        arena_attention.causal_attention(ctx, q, kt, v, 4, 0.25, [])  # accepted
        with pytest.raises(ValueError, match="F32"):
            arena_attention.causal_attention(ctx, q, ops.new_tensor(ctx, ops.F16, (6, 16, 2)), v, 4, 0.25, [])
        with pytest.raises(ValueError, match=r"kt \[T, hd, Hkv\]"):
            arena_attention.causal_attention(ctx, q, ops.new_tensor(ctx, ops.F32, (5, 16, 2)), v, 4, 0.25, [])
        with pytest.raises(ValueError, match="multiple"):
            arena_attention.causal_attention(ctx, q, ops.new_tensor(ctx, ops.F32, (6, 16, 3)),
                                             ops.new_tensor(ctx, ops.F32, (16, 6, 3)), 4, 0.25, [])
        with pytest.raises(ValueError, match="window"):
            arena_attention.causal_attention(ctx, q, kt, v, -1, 0.25, [])
    finally:
        ops.lib.ggml_free(ctx)

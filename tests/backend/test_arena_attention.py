"""The fused streamed attention over the key/value arena (``arena_attention.window_attention``,
csrc/attention.c).

Metrics: max abs error over max abs value against float64 numpy, bound 2e-6; the kernel's
order-invariance claim is bit for bit (``np.array_equal``): a query's output is the same whatever
the chunk it is computed in (its window's place in the arena, the other queries and streams
beside it) and the thread count.
"""

from __future__ import annotations

import numpy as np
import pytest

from graphrun import run_cpu_graph
from pyggml_codec.backend import arena_attention
from pyggml_codec.backend.ggml_graph import new_context
from pyggml_codec.graphs import ops

REL_MAX = 2e-6


@pytest.fixture(autouse=True)
def _kernels(require):
    require("kernels", arena_attention.WINDOW_ATTENTION, "compiled kernels not built")


def _attention(q, keys, values, first, mask, scale, threads=2, key_type=ops.F32):
    """q (n B, H, hd), keys/values (R, hd Hkv), first (B,), mask (B, 1, n, T): (n B, H hd)."""
    def build(g):
        return {"y": arena_attention.window_attention(
            g.ctx, g.input("q", q), g.input("k", keys, key_type), g.input("v", values),
            g.input("first", first, ops.I32), g.input("mask", mask), scale, g.keep)}

    return run_cpu_graph(build, threads)["y"]


def _reference(q, keys, values, first, mask, scale):
    nb, _, n, t = mask.shape
    heads, hd = q.shape[1], q.shape[2]
    group = heads // (keys.shape[1] // hd)
    out = np.zeros((q.shape[0], heads * hd))
    for b in range(nb):
        k = keys[first[b]:first[b] + t].astype(np.float64).reshape(t, -1, hd)
        v = values[first[b]:first[b] + t].astype(np.float64).reshape(t, -1, hd)
        for i in range(n):
            visible = mask[b, 0, i] > -1e9
            for h in range(heads):
                s = k[:, h // group] @ q[b * n + i, h].astype(np.float64) * scale + mask[b, 0, i]
                p = np.where(visible, np.exp(s - s[visible].max()), 0.0)
                out[b * n + i, h * hd:(h + 1) * hd] = (p / p.sum()) @ v[:, h // group]
    return out


def _case(rng, streams, n, hist, heads, kv_heads, hd, rows_per_stream=40):
    t = hist + n
    q = rng.standard_normal((n * streams, heads, hd)).astype(np.float32)
    keys = rng.standard_normal((streams * rows_per_stream, kv_heads * hd)).astype(np.float32)
    values = rng.standard_normal((streams * rows_per_stream, kv_heads * hd)).astype(np.float32)
    first = np.array([s * rows_per_stream + int(rng.integers(0, rows_per_stream - t + 1)) for s in range(streams)],
                     np.int32)
    # query i sits at position hist + i; keys [pos - hist, pos] visible, the first few masked
    # (carried slots before a stream's start), a finite bias on the others
    mask = np.full((streams, 1, n, t), ops.MASKED, np.float32)
    for s in range(streams):
        start = int(rng.integers(0, hist))
        for i in range(n):
            lo = max(i, start)
            mask[s, 0, i, lo:hist + i + 1] = rng.uniform(-0.5, 0.5, hist + i + 1 - lo)
    return q, keys, values, first, mask


@pytest.mark.parametrize("streams,n,hist,heads,kv_heads,hd,threads", [
    (1, 1, 7, 2, 2, 16, 1), (1, 5, 7, 4, 2, 16, 2), (3, 4, 15, 4, 4, 64, 2), (2, 3, 9, 6, 3, 12, 3),  # hd tail
    (4, 1, 31, 2, 1, 64, 2),
])
def test_window_attention_matches_numpy(streams, n, hist, heads, kv_heads, hd, threads):
    rng = np.random.default_rng(streams * 100 + n * 10 + hd)
    q, keys, values, first, mask = _case(rng, streams, n, hist, heads, kv_heads, hd)
    scale = 1.0 / np.sqrt(hd)
    got = _attention(q, keys, values, first, mask, scale, threads)
    want = _reference(q, keys, values, first, mask, scale)
    rel = float(np.abs(got - want).max() / np.abs(want).max())
    print(f"window_attention B={streams} n={n} hist={hist} H={heads}/{kv_heads} hd={hd}: rel max err {rel:.2e}")
    assert rel <= REL_MAX


def test_window_attention_query_does_not_depend_on_its_chunk():
    """The last query of a chunk of 6 (window at one place in the arena, beside another stream)
    against the same query alone in a chunk of 1 (window elsewhere, alone), 1 and 3 threads: the
    same bits."""
    rng = np.random.default_rng(5)
    hist, heads, hd, n = 9, 4, 64, 6
    q, keys, values, first, mask = _case(rng, 2, n, hist, heads, heads, hd)
    mask[:] = ops.MASKED
    for i in range(n):
        mask[:, 0, i, i:hist + i + 1] = 0.0  # a full window: keys [pos - hist, pos]
    scale = 1.0 / np.sqrt(hd)
    chunk = _attention(q, keys, values, first, mask, scale, 2)
    # stream 0's last query alone: its window (keys [n - 1, n - 1 + hist]) copied elsewhere
    alone_k = np.zeros((50, heads * hd), np.float32)
    alone_v = np.zeros((50, heads * hd), np.float32)
    rows = slice(first[0] + n - 1, first[0] + n + hist)
    alone_k[20:20 + hist + 1], alone_v[20:20 + hist + 1] = keys[rows], values[rows]
    for threads in (1, 3):
        one = _attention(q[n - 1:n], alone_k, alone_v, np.array([20], np.int32),
                         np.zeros((1, 1, 1, hist + 1), np.float32), scale, threads)
        assert np.array_equal(one.reshape(-1), chunk[n - 1]), f"{threads} threads"


def test_window_attention_refuses_what_it_cannot_read():
    ctx = new_context(32 * ops.lib.ggml_tensor_overhead())
    try:
        q = ops.new_tensor(ctx, ops.F32, (16, 4, 6))  # hd 16, H 4, 3 queries x 2 streams
        keys = ops.new_tensor(ctx, ops.F32, (32, 100))  # Hkv 2
        first = ops.new_tensor(ctx, ops.I32, (2,))
        mask = ops.new_tensor(ctx, ops.F32, (10, 3, 1, 2))
        arena_attention.window_attention(ctx, q, keys, keys, first, mask, 0.25, [])  # accepted
        with pytest.raises(ValueError, match="F32"):
            arena_attention.window_attention(ctx, q, ops.new_tensor(ctx, ops.F16, (32, 100)), keys, first, mask,
                                             0.25, [])
        with pytest.raises(ValueError, match="queries"):
            arena_attention.window_attention(ctx, q, keys, keys, ops.new_tensor(ctx, ops.I32, (3,)), mask, 0.25, [])
        with pytest.raises(ValueError, match="multiple"):
            arena_attention.window_attention(ctx, q, ops.new_tensor(ctx, ops.F32, (48, 100)), keys, first, mask,
                                             0.25, [])
    finally:
        ops.lib.ggml_free(ctx)

"""The FLOP counter (backend/flops.py) on small graphs, against counts made by hand from the
shapes: ggml's own ops, the BLAS and per-tap products, the Winograd conv and its transforms,
elementwise steps, data movement as 0, and the weight bytes a graph reads."""

from __future__ import annotations

import numpy as np
import pytest

from pyggml_codec.backend import arena_attention, binding, flops, kernels, winograd_conv, winograd_tables
from pyggml_codec.backend.binding import lib
from pyggml_codec.backend.ggml_graph import WeightBuffer, new_context
from pyggml_codec.backend.runtime import cpu_backend

F32 = 0


def _graph(ctx, *outputs):
    gf = lib.ggml_new_graph(ctx)
    for t in outputs:
        lib.ggml_build_forward_expand(gf, t)
    return gf


@pytest.fixture
def ctx():
    c = new_context(16 << 20)
    yield c
    lib.ggml_free(c)


def test_mul_mat_add_and_layout_ops(ctx):
    a = binding.new_tensor(ctx, F32, (64, 48))  # K = 64, M = 48
    b = binding.new_tensor(ctx, F32, (64, 10, 3))  # N = 10, batch 3
    y = lib.ggml_mul_mat(ctx, a, b)  # ne [48, 10, 3]
    z = lib.ggml_add(ctx, y, y)
    t = lib.ggml_cont(ctx, lib.ggml_transpose(ctx, lib.ggml_reshape_2d(ctx, z, 48, 30)))
    count = flops.count_graph(_graph(ctx, t))
    assert count.products == 2 * 64 * 48 * 10 * 3
    assert count.elementwise == 48 * 10 * 3
    assert count.transforms == 0
    assert count.total == 2 * 64 * 48 * 30 + 48 * 30
    assert count.by_op == {"MUL_MAT": 2 * 64 * 48 * 30, "ADD": 48 * 30}
    assert count.shapes == {(48, 64, 30): 2 * 64 * 48 * 30}
    assert count.uncounted == {}


def test_an_op_without_a_rule_is_listed_not_dropped(ctx):
    x = binding.new_tensor(ctx, F32, (8, 4))
    y = lib.ggml_argmax(ctx, x)
    count = flops.count_graph(_graph(ctx, y))
    assert count.total == 0
    assert count.uncounted == {"ARGMAX": 1}


def test_scaled_add_multiplies_every_field(ctx):
    a = binding.new_tensor(ctx, F32, (4, 2))
    b = binding.new_tensor(ctx, F32, (4, 3))
    one = flops.count_graph(_graph(ctx, lib.ggml_mul_mat(ctx, a, b)))
    total = flops.FlopCount().scaled_add(one, 5)
    total += one
    assert total.products == 6 * 2 * 4 * 2 * 3
    assert total.shapes == {(2, 4, 3): 6 * 2 * 4 * 2 * 3}


needs_kernels = pytest.mark.skipif(kernels.BLAS is None, reason="no compiled kernels or BLAS")


@needs_kernels
def test_blas_product_and_per_tap_conv(ctx):
    keep: list = []
    a = binding.new_tensor(ctx, F32, (32, 40))
    b = binding.new_tensor(ctx, F32, (32, 24))
    p = kernels.mul_mat_blas(ctx, a, b)
    w = binding.new_tensor(ctx, F32, (16, 20, 3))  # Cin 16, Cout 20, K 3
    x = binding.new_tensor(ctx, F32, (50, 16))  # L 50
    c = kernels.conv_taps(ctx, w, x, 3, 2, keep)
    s = kernels.snake(ctx, c, binding.new_tensor(ctx, F32, (1, 20)))
    count = flops.count_graph(_graph(ctx, p, s))
    assert count.by_op["CUSTOM:mul_mat_blas"] == 2 * 32 * 40 * 24
    assert count.by_op["CUSTOM:conv_taps"] == 2 * 16 * 20 * 3 * 50
    assert count.by_op["MAP_CUSTOM2:snake"] == 5 * 50 * 20
    assert count.products == 2 * 32 * 40 * 24 + 2 * 16 * 20 * 3 * 50


def test_every_compiled_kernel_has_a_rule():
    """A new kernel without a rule would drop out of the count (and the floor) unnoticed."""
    assert set(kernels.SYMBOLS) <= flops.COUNTED_KERNELS, set(kernels.SYMBOLS) - flops.COUNTED_KERNELS


@needs_kernels
@pytest.mark.parametrize("t,window,pairs", [
    (40, 0, 16 * 16 + 16 * 32 + 8 * 40),  # plain causal: each block of 16 queries against every key up to its last
    (40, 8, 16 * 16 + 16 * 23 + 8 * 15),  # block 1 reads keys 9..31, block 2 keys 25..39
    (40, 100, 16 * 16 + 16 * 32 + 8 * 40),  # a window past the sequence: plain causal
])
def test_causal_attention_counts_the_spans_it_reads(ctx, t, window, pairs):
    """4 hd per (query, key) pair of each query block's span, and 4 softmax steps per pair."""
    keep: list = []
    hd, heads, kv_heads = 16, 4, 2
    q = binding.new_tensor(ctx, F32, (hd, heads, t))
    kt = binding.new_tensor(ctx, F32, (t, hd, kv_heads))
    v = binding.new_tensor(ctx, F32, (hd, t, kv_heads))
    assert arena_attention.causal_pairs(t, window) == pairs
    count = flops.count_graph(_graph(ctx, arena_attention.causal_attention(ctx, q, kt, v, window, 0.25, keep)))
    assert count.products == 4 * hd * heads * pairs and count.elementwise == 4 * heads * pairs
    assert count.uncounted == {}


@needs_kernels
def test_exact_product_is_counted(ctx):
    if not kernels.F16DOT:
        pytest.skip(f"ggml's products in blocks unavailable: {kernels.F16DOT_UNAVAILABLE_REASON}")
    keep: list = []
    a = binding.new_tensor(ctx, binding.TYPE_F16, (64, 12))
    b = binding.new_tensor(ctx, F32, (64, 9))
    count = flops.count_graph(_graph(ctx, kernels.mul_mat_f16dot(ctx, a, b, keep)))
    assert count.by_op["CUSTOM:mul_mat_f16dot"] == count.products == 2 * 64 * 12 * 9 and count.uncounted == {}


@needs_kernels
@pytest.mark.parametrize("length,dilation", [(40, 1), (37, 3), (2000, 1)])
def test_winograd_conv_products_and_transforms(ctx, length, dilation):
    """F(m, 7) with n points: tiles = ceil(L / (m d)) d; products 2 n Cin Cout tiles; input
    transform 2 n n Cin tiles, output 2 m n Cout tiles (in one op or split over two)."""
    keep: list = []
    wino = winograd_tables.WINOGRAD
    cin, cout = 24, 32
    u = binding.new_tensor(ctx, F32, (cin, cout, wino.n))
    x = binding.new_tensor(ctx, F32, (length, cin))
    y = winograd_conv.conv_wino(ctx, u, x, dilation, keep)
    count = flops.count_graph(_graph(ctx, y))
    tiles = -(-length // (wino.m * dilation)) * dilation
    assert count.products == 2 * wino.n * cin * cout * tiles
    assert count.transforms == 2 * wino.n * wino.n * cin * tiles + 2 * wino.m * wino.n * cout * tiles
    assert count.shapes == {(cout, cin, tiles): count.products}


def test_weight_bytes_counts_each_byte_once():
    backend = cpu_backend("cpu", None)
    wb = WeightBuffer(backend, 4)
    ctx = new_context(1 << 20)
    try:
        w1 = wb.new_tensor(F32, (16, 8))  # 512 bytes
        w2 = wb.new_tensor(F32, (10, 4))  # 160 bytes, read through a view of its first 2 rows
        wb.allocate()
        x = binding.new_tensor(ctx, F32, (16, 3))
        y1 = lib.ggml_mul_mat(ctx, w1, x)
        y2 = lib.ggml_mul_mat(ctx, w1, lib.ggml_scale(ctx, x, 2.0))  # w1 read twice: counted once
        v = lib.ggml_view_2d(ctx, w2, 10, 2, w2.contents.nb[1], 0)
        y3 = lib.ggml_add(ctx, v, v)
        gf = _graph(ctx, y1, y2, y3)
        assert flops.weight_bytes(gf) == 16 * 8 * 4 + 10 * 2 * 4
    finally:
        lib.ggml_free(ctx)
        wb.free()
        backend.free()

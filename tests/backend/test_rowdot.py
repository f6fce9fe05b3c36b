"""The row-product kernel (``kernels.mul_mat_rowdot``, csrc/rowdot.c) and F16 matrices held as
stored in the "f32" precision.

Metrics: max abs error over max abs value against float64 numpy, bound 1e-6; the kernel's
order-invariance claims are bit for bit (``np.array_equal``): a column computed alone or among
others, by 1, 2 or 3 threads, from an F16 matrix or from its exact F32 upcast. At codec level: an
F16 file decoded with its matrices held as F16 against the same file upcast at load, max abs bound
1e-6 (the "f32" precision's chunking bound).
"""

from __future__ import annotations

import numpy as np
import pytest

import pyggml_codec
from pyggml_codec.backend import binding, kernels
from pyggml_codec.graphs import ops
from graphrun import run_cpu_graph
from parity import random_codes, report

REL_MAX = 1e-6  # measured 4.1e-8 to 1.7e-7 over the shapes below, F32 and F16 rows


@pytest.fixture(autouse=True)
def _rowdot(require):
    """Every test here needs the row-product kernel: skipped without it, failed under PYGGML_REQUIRE=rowdot."""
    require("rowdot", kernels.ROWDOT, "no row-product kernel in this build "
            "(needs the compiled kernels with AVX2+FMA+F16C or AVX-512, and a BLAS)")


_run = run_cpu_graph


def _product(a: np.ndarray, b: np.ndarray, threads: int = 2, a_type: int = ops.F32) -> np.ndarray:
    """mul_mat_rowdot of a [.., m, k] (held as a_type) and b [.., n, k]: numpy [.., n, m]."""
    def build(g):
        ta, tb = g.input("a", a, a_type), g.input("b", b)
        assert kernels.mul_mat_rowdot_supported(ta, tb)
        return {"y": kernels.mul_mat_rowdot(g.ctx, ta, tb, g.keep)}

    shape = b.shape[:-2] + (b.shape[-2], a.shape[-2])
    return _run(build, threads)["y"].reshape(shape)


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def _bits_differ(got: np.ndarray, want: np.ndarray) -> int:
    """Float32 values whose bits differ (signed zeros and NaN payloads count)."""
    return int(np.count_nonzero(got.view(np.uint32) != want.view(np.uint32)))


@pytest.mark.parametrize("a_type", [ops.F32, ops.F16])
@pytest.mark.parametrize("k,m,n,batch_a,batch_b,threads", [
    (5, 3, 1, 1, 1, 2), (37, 19, 3, 1, 1, 2), (64, 33, 4, 1, 1, 3),  # K and row tails, one column
    (1024, 70, 9, 1, 1, 2), (300, 40, 15, 2, 2, 1), (40, 24, 13, 1, 3, 2), (300, 40, 48, 2, 2, 1),
    (129, 50, 16, 1, 1, 3), (129, 50, 200, 1, 1, 2),  # batches, a broadcast; F16 past 48 columns
    (100, 37, 6, 1, 1, 2), (33, 21, 8, 1, 1, 3),  # five to eight columns, taken together
])
def test_rowdot_matches_numpy(a_type, k, m, n, batch_a, batch_b, threads):
    if a_type == ops.F32 and n > kernels.rowdot_max_columns(ops.F32):
        pytest.skip("F32 products past rowdot_max_columns(F32) columns go to the BLAS kernel")
    # F16 past ROWDOT_MAX_N_F16 columns (8-float vectors): upcast by blocks for the BLAS
    rng = np.random.default_rng(k + m + n)
    a = rng.standard_normal((batch_a, m, k)).astype(np.float16 if a_type == ops.F16 else np.float32)
    b = rng.standard_normal((batch_b, n, k)).astype(np.float32)
    got = _product(a, b, threads, a_type)
    a64 = np.broadcast_to(a.astype(np.float64), (batch_b, m, k))
    want = np.einsum("bmk,bnk->bnm", a64, b.astype(np.float64))
    rel = _rel(got.reshape(want.shape), want)
    print(f"rowdot {'F16' if a_type == ops.F16 else 'F32'} k={k} m={m} n={n} batches {batch_a}/{batch_b}: "
          f"rel max err {rel:.2e} (bound {REL_MAX:g})")
    assert rel <= REL_MAX


def test_rowdot_f16_past_its_columns_upcasts_for_the_blas(monkeypatch):
    """Past the most columns taken by rows (48 with 8-float vectors, none with 16), an F16 matrix
    is upcast block by block for the BLAS: the same product to float32 rounding."""
    monkeypatch.setattr(kernels, "ROWDOT_MAX_N_F16", 8)
    monkeypatch.setattr(kernels, "ROWDOT_MAX_N_F16_16", 8)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((1, 50, 129)).astype(np.float16)
    b = rng.standard_normal((1, 40, 129)).astype(np.float32)
    got = _product(a, b, 2, ops.F16)
    want = np.einsum("bmk,bnk->bnm", a.astype(np.float64), b.astype(np.float64))
    rel = _rel(got.reshape(want.shape), want)
    print(f"rowdot F16 upcast for the BLAS, 40 columns: rel max err {rel:.2e} (bound {REL_MAX:g})")
    assert rel <= REL_MAX


def test_rowdot_column_thread_and_type_invariant():
    """Each output is summed in one order: a column alone gives the bits it gets among the most
    columns the kernel takes, 1, 2 and 3 threads agree, and an F16 matrix gives the bits of its
    F32 upcast."""
    rng = np.random.default_rng(7)
    a16 = rng.standard_normal((200, 1000)).astype(np.float16)
    a32 = a16.astype(np.float32)  # exact
    n = kernels.ROWDOT_MAX_N_F16
    b = rng.standard_normal((n, 1000)).astype(np.float32)
    full = _product(a16, b, 2, ops.F16)
    for j in (0, 5, n - 1):
        assert np.array_equal(_product(a16, b[j:j + 1], 2, ops.F16).reshape(-1), full[j]), f"column {j} alone"
    for j0, j1 in ((0, 4), (1, 7), (3, 11)):
        assert np.array_equal(_product(a16, b[j0:j1], 2, ops.F16), full[j0:j1]), f"columns {j0}-{j1 - 1}"
    for threads in (1, 3):
        assert np.array_equal(_product(a16, b, threads, ops.F16), full), f"{threads} threads"
    few = kernels.ROWDOT_MAX_N
    assert np.array_equal(_product(a32, b[:few], 2, ops.F32), full[:few]), "F32 upcast"


def test_rowdot_refuses_what_it_cannot_read():
    from pyggml_codec.backend.ggml_graph import new_context

    ctx = new_context(16 * ops.lib.ggml_tensor_overhead())
    try:
        f32, f16 = ops.new_tensor(ctx, ops.F32, (32, 32)), ops.new_tensor(ctx, ops.F16, (32, 32))
        narrow = ops.new_tensor(ctx, ops.F32, (32, kernels.ROWDOT_MAX_N))
        wide = ops.new_tensor(ctx, ops.F32, (32, kernels.ROWDOT_MAX_N + 1))
        assert kernels.mul_mat_rowdot_supported(f16, narrow) and kernels.mul_mat_rowdot_supported(f32, narrow)
        assert kernels.mul_mat_rowdot_supported(f16, wide)  # F16: upcast for the BLAS past the limit
        # F32 that wide: the BLAS kernel with 8-float vectors, by rows with 16
        assert kernels.mul_mat_rowdot_supported(f32, wide) == (kernels.rowdot_max_columns(ops.F32) > 1000)
        assert not kernels.mul_mat_rowdot_supported(f32, ops.new_tensor(ctx, ops.F16, (32, 4)))
        assert not kernels.mul_mat_rowdot_supported(ops.lib.ggml_transpose(ctx, f32), narrow)
        q8 = ops.new_tensor(ctx, kernels.ROWDOT_Q8_0, (32, 32))  # read as the F32 matrix it dequantizes to
        assert kernels.mul_mat_rowdot_supported(q8, narrow)
        assert kernels.mul_mat_rowdot_supported(q8, wide) == kernels.mul_mat_rowdot_supported(f32, wide)
        assert not kernels.mul_mat_rowdot_supported(ops.new_tensor(ctx, ops.lib.GGML_TYPE_Q6_K, (32, 32)), narrow)
    finally:
        ops.lib.ggml_free(ctx)


def test_f16_matrices_held_as_stored_decode_like_upcast(tiny_model):
    """The F16 file's transformer, ConvNeXt, conv-transpose and stem matrices stay F16 on the CPU
    (half the bytes) and decode within 1e-6 of the same file upcast at load."""
    codes = random_codes(pyggml_codec.load(tiny_model.f16_path, backend="cpu").config.quantizer.codebook_sizes,
                         40, seed=5)
    out = {}
    for matrices in ("stored", "f32"):
        with pyggml_codec.load(tiny_model.f16_path, backend="cpu", lowerings={"matrices": matrices}) as codec:
            assert codec.plan.matrices == matrices
            held = {name for name, t in codec.engine.model.weights.items() if binding.tensor_type(t) == ops.F16}
            out[matrices] = codec.decode(codes)
            with codec.stream_decoder() as sd:
                streamed = np.concatenate([sd.push(codes[:, i:i + 1]) for i in range(codes.shape[1])])
            assert "rowdot" in codec.lowerings["matmul"]
        if matrices == "stored":
            assert any("post_module" in n and n.endswith("wqkv.weight") for n in held), sorted(held)[:5]
            assert "decoder.model.0.conv.weight" in held and "decoder.model.1.block.1.conv.weight" in held
            assert not any(".block.1.conv" in n and ".block.2." in n for n in held)  # residual convs stay F32
        else:
            assert not held, sorted(held)[:5]
        _, m = report(f"matrices={matrices}: one frame at a time vs one-shot", streamed, out[matrices])
        assert m <= 1e-6
    _, m = report("F16 matrices as stored vs upcast at load", out["stored"], out["f32"])
    assert m <= 1e-6


def test_f16_matrices_without_the_kernels_are_upcast_in_the_graph(tiny_model):
    """With the compiled kernels switched off after load, the F16 matrices held as stored are
    upcast in the graph (ggml's F16 product would round the activations to F16): bit for bit
    the decode of the same file upcast at load."""
    codes = random_codes(pyggml_codec.load(tiny_model.f16_path, backend="cpu").config.quantizer.codebook_sizes,
                         12, seed=6)
    out = {}
    for matrices in ("stored", "f32"):
        with pyggml_codec.load(tiny_model.f16_path, backend="cpu", lowerings={"matrices": matrices}) as codec:
            codec.use_custom_kernels = False
            out[matrices] = codec.decode(codes)
            if matrices == "stored":
                assert codec.lowerings["matrices"] == "stored-upcast"
    _, m = report("kernels off: F16 matrices upcast in the graph vs at load", out["stored"], out["f32"])
    assert m == 0.0


@pytest.mark.parametrize("n", [1, 3, 5, 7, 8, 40])
def test_q8_0_rows_give_the_bits_of_their_f32_dequantization(n):
    """A Q8_0 matrix read by the row products (dequantized in registers, ``ops.mul_mat`` with
    ``quantized="dequantize"``) gives the bits of the product of its F32 dequantization (ggml's
    cast), at a stream's column counts and a one-shot decode's; its lowering says so."""
    rng = np.random.default_rng(n)
    a = rng.standard_normal((70, 256)).astype(np.float32)
    b = rng.standard_normal((n, 256)).astype(np.float32)

    def build(g):
        g.matmul, g.quantized = "blas", "dequantize"
        q = ops.lib.ggml_cast(g.ctx, g.input("a", a), kernels.ROWDOT_Q8_0)
        tb = g.input("b", b)
        direct = ops.mul_mat(g, q, tb)
        assert (g.lowerings.get("matmul") == "rowdot") == kernels.mul_mat_rowdot_supported(q, tb)
        return {"direct": direct, "cast": ops.mul_mat(g, ops.lib.ggml_cast(g.ctx, q, ops.F32), tb)}

    out = _run(build, 2)
    differ = _bits_differ(out["direct"], out["cast"])
    print(f"Q8_0 rows, {n} column(s): {differ} of {out['cast'].size} outputs differ from the F32 dequantization's (bound 0)")
    assert differ == 0


def test_short_rows_summed_across_rows_give_the_bits_of_the_row_sums():
    """F32 rows of at most 128 values against output columns of contiguous rows are summed with the
    vector lanes across 16 rows ("vertically": no lanes added within a vector), in the float
    operations that the horizontal sums give each output. The horizontal sums run where an
    output row is not contiguous (C transposed), so the two layouts compare the two loops: bit for
    bit, signed zeros included (zero rows, -0 values), over K with and without a tail and row and
    column counts off the blocks. Where the build has 8-float vectors both layouts sum
    horizontally. Metric: values whose bits differ; bound 0."""
    lib, ffi = kernels.OPS["module"].lib, kernels.OPS["module"].ffi
    rng = np.random.default_rng(41)

    def product(a, b, transposed):
        (m, k), n = a.shape, b.shape[0]
        c = np.full((m, n) if transposed else (n, m), np.nan, np.float32)
        csi, csj = (n, 1) if transposed else (1, m)
        assert lib.pg_rowdot(m, n, k, ffi.cast("void *", a.ctypes.data), a.strides[0] // 4, 0,
                             ffi.cast("float *", b.ctypes.data), b.strides[0] // 4, 0.0,
                             ffi.cast("float *", c.ctypes.data), csi, csj, 64)
        return np.ascontiguousarray(c.T) if transposed else c

    differ, cases = 0, 0
    for k in (1, 7, 8, 15, 16, 17, 31, 64, 65, 100, 128):
        for m, n in ((1, 1), (5, 3), (16, 4), (17, 9), (40, 31)):
            a = rng.standard_normal((m, k + 3)).astype(np.float32)[:, :k]  # rows lda = k + 3 apart
            b = rng.standard_normal((n, k + 1)).astype(np.float32)[:, :k]
            a[rng.random(a.shape) < 0.2] = 0.0
            a[rng.random(a.shape) < 0.1] = -0.0
            b[rng.random(b.shape) < 0.1] = -0.0
            if m > 2:
                a[1], a[2] = 0.0, -0.0
            rows, cols = product(a, b, False), product(a, b, True)
            differ += _bits_differ(rows, cols)
            cases += 1
            want = (b.astype(np.float64) @ a.astype(np.float64).T)
            assert _rel(rows, want) < REL_MAX * max(1.0, k / 64)
    print(f"{cases} shapes: {differ} values whose bits differ between the two loops")
    assert differ == 0


def _tiles_built() -> None:
    """The register tiles are built with 16-float vectors only: a build with 8 (AVX2) has no such
    loop to test (its products are the row loops, tested above)."""
    if kernels.OPS["rowdot"] < 16:
        pytest.skip("the register tiles are built with 16-float vectors (AVX-512) only")


def _raw_rowdot(a, kind, b, transposed):
    """pg_rowdot of a [m, k] (held as ``kind``: 0 F32, 1 F16, 2 Q8_0 blocks) and F32 b [n, k]: C as
    [n, m] (csi 1) or [m, n] (transposed, csj 1), and pg_rowdot's return value."""
    lib, ffi = kernels.OPS["module"].lib, kernels.OPS["module"].ffi
    m, n, k = a.shape[0], b.shape[0], b.shape[1]
    c = np.full((m, n) if transposed else (n, m), np.nan, np.float32)
    csi, csj = (n, 1) if transposed else (1, m)
    lda = k + 3 if kind == 0 else k  # F32 rows a little apart
    if kind == 0:
        held = np.zeros((m, lda), np.float32)
        held[:, :k] = a
    else:
        held = a
    r = lib.pg_rowdot(m, n, k, ffi.cast("void *", held.ctypes.data), lda, kind, ffi.cast("float *", b.ctypes.data),
                      b.strides[0] // 4, 0.0, ffi.cast("float *", c.ctypes.data), csi, csj, 64)
    return c, r


def _q8_0(a):
    """a [m, k] (k a multiple of 32) as ggml's Q8_0 blocks, and the F32 values they hold."""
    import gguf

    held = binding.quantize_rows(a, kernels.ROWDOT_Q8_0).reshape(a.shape[0], -1)
    return held, gguf.quants.dequantize(held, gguf.GGMLQuantizationType.Q8_0).reshape(a.shape).astype(np.float32)


def test_narrow_row_loops_fetch_ahead_without_changing_a_bit():
    """Narrow products (up to 8 columns with AVX-512, 4 with AVX2) by the row loops fetch their
    rows a distance ahead (``pg_rowdot_pf_ahead_bytes``, 8192 by default), and take F16 rows in
    2-row blocks only where the columns fit ``pg_rowdot_two_rows_max_bytes`` (32768). Neither
    changes a value, so this fails only where a setting changes what is multiplied: against the
    next block alone (0) and a distance past every row (no fetch), and against 2-row blocks never
    (0) and always (1 << 30), bit for bit, F32, F16 and Q8_0 rows, K with and without a tail, row
    counts off the blocks; and against float64 numpy. That the fetches run ahead is a matter of
    time, measured side by side (docs/performance.md). Metric: values whose bits differ, bound 0;
    relative error, REL_MAX."""
    lib = kernels.OPS["module"].lib
    rng = np.random.default_rng(46)
    differ, cases, worst = 0, 0, 0.0
    try:
        for k, m, n in ((1024, 300, 1), (1024, 257, 2), (160, 500, 4), (1040, 130, 5), (3072, 64, 8), (1024, 70, 8),
                        (3104, 66, 6), (133, 90, 3)):
            a = rng.standard_normal((m, k)).astype(np.float32)
            b = rng.standard_normal((n, k)).astype(np.float32)
            for kind in (0, 1, 2):
                if kind == 2 and k % 32:
                    continue
                held, values = (a, a) if kind == 0 else (a.astype(np.float16), a.astype(np.float16).astype(np.float32)) \
                    if kind == 1 else _q8_0(a)
                runs = []
                for ahead, two_rows in ((8192, 32768), (0, 32768), (1 << 30, 32768), (8192, 0), (8192, 1 << 30)):
                    lib.pg_rowdot_pf_ahead_bytes(ahead)
                    lib.pg_rowdot_two_rows_max_bytes(two_rows)
                    got, r = _raw_rowdot(held, kind, b, False)
                    assert r == 1, f"k {k} m {m} n {n} kind {kind}: pg_rowdot returned {r}"
                    runs.append(got)
                differ += sum(_bits_differ(x, runs[0]) for x in runs[1:])
                cases += 1
                worst = max(worst, _rel(runs[0], b.astype(np.float64) @ values.astype(np.float64).T))
    finally:
        lib.pg_rowdot_pf_ahead_bytes(8192)
        lib.pg_rowdot_two_rows_max_bytes(32768)
    print(f"{cases} narrow products, 3 fetch distances and 3 block rules: {differ} values whose bits differ; "
          f"worst relative error {worst:.2e} (bound {REL_MAX:.0e})")
    assert differ == 0
    assert worst <= REL_MAX


def test_register_tiles_give_the_bits_of_the_row_products():
    """Long products (16-float vectors, at least 128 rows and 49 columns, at most 2048 values per
    row) run in register tiles that give each output the row products' float operations: the
    same lane classes, the same tree. Against the row loops (the tiles switched off), bit for bit,
    signed zeros included, F32, F16 and Q8_0 rows, C stored along either index, K with and without
    a tail, rows and columns off the tiles' 32 x 12; and against float64 numpy. pg_rowdot says
    which loop ran (2: the tiles), so a shape the tiles stopped taking fails here. Metric: values
    whose bits differ, bound 0; relative error, bound 1e-6."""
    _tiles_built()
    lib = kernels.OPS["module"].lib
    rng = np.random.default_rng(43)
    differ = cases = 0
    worst = 0.0
    try:
        for k, m, n in ((7, 128, 49), (64, 130, 61), (100, 161, 50), (192, 200, 100), (383, 129, 56),
                        (1024, 256, 53), (2048, 140, 64)):
            for kind in (0, 1, 2):
                if kind == 2 and k % 32:
                    continue
                a = rng.standard_normal((m, k)).astype(np.float32)
                a[rng.random(a.shape) < 0.1] = -0.0
                a[1], a[2] = 0.0, -0.0
                b = rng.standard_normal((n, k)).astype(np.float32)
                b[rng.random(b.shape) < 0.1] = -0.0
                b[3] = -0.0
                if kind == 1:
                    held = a.astype(np.float16)
                    values = held.astype(np.float32)
                elif kind == 2:
                    held, values = _q8_0(a)
                else:
                    held = values = a
                want = b.astype(np.float64) @ values.astype(np.float64).T  # [n, m]
                for transposed in (False, True):
                    lib.pg_rowdot_tiles_use(0)
                    rows, r_rows = _raw_rowdot(held, kind, b, transposed)
                    lib.pg_rowdot_tiles_use(1)
                    tiles, r_tiles = _raw_rowdot(held, kind, b, transposed)
                    # short F32 rows into contiguous output rows: the vertical loop first (returns 1)
                    tiled = 1 if kind == 0 and k <= 128 and not transposed else 2
                    assert (r_rows, r_tiles) == (1, tiled), f"k {k} m {m} n {n} kind {kind}: loops {r_rows}, {r_tiles}"
                    differ += _bits_differ(rows, tiles)
                    cases += 1
                    got = tiles.T if transposed else tiles
                    worst = max(worst, _rel(got, want))
    finally:
        lib.pg_rowdot_tiles_use(1)
    print(f"{cases} products: {differ} values whose bits differ between the tiles and the row loops; "
          f"worst relative error {worst:.2e} (bound {REL_MAX:.0e})")
    assert differ == 0
    assert worst <= REL_MAX


def test_register_tiles_decline_short_and_long_products():
    """Below 128 rows or 49 columns, or past 2048 values per row, pg_rowdot's row loops run (it
    returns 1), where the tiles cost more than they save (see rowdot.c); the Winograd products over
    their inputs as they lie (pg_rowdot_kx) take the tiles from 32 columns."""
    _tiles_built()
    lib = kernels.OPS["module"].lib
    rng = np.random.default_rng(44)
    for k, m, n in ((256, 127, 64), (256, 128, 31), (2049, 128, 64), (2080, 200, 40), (256, 128, 32),
                    (1024, 256, 48)):
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((n, k)).astype(np.float32)
        for kind, held in ((0, a), (1, a.astype(np.float16))):
            got, r = _raw_rowdot(held, kind, b, False)
            assert r == 1, f"k {k} m {m} n {n} kind {kind}: pg_rowdot returned {r}"
            want = b.astype(np.float64) @ held.astype(np.float64).T
            assert _rel(got, want) <= REL_MAX * max(1.0, k / 1024)
        assert bool(lib.pg_rowdot_kx_fits(m, n, k)) == (m >= 128 and n >= 32 and k <= 2048)
    b = rng.standard_normal((49, 1024)).astype(np.float32)
    assert _raw_rowdot(rng.standard_normal((128, 1024)).astype(np.float16), 1, b, False)[1] == 2  # the first tiled


def test_register_tiles_read_k_major_columns_as_the_row_products_read_rows():
    """pg_rowdot_kx (the Winograd products over their transformed inputs as they lie, B k-major)
    gives the row loops' bits over the same B stored by rows, and writes nothing past its
    columns. Metric: values whose bits differ, bound 0."""
    _tiles_built()
    lib, ffi = kernels.OPS["module"].lib, kernels.OPS["module"].ffi
    rng = np.random.default_rng(45)
    differ = 0
    for m, n, k in ((128, 32, 384), (384, 162, 384), (200, 45, 100), (768, 40, 768)):
        assert lib.pg_rowdot_kx_fits(m, n, k)
        ldv = (n + 15) // 16 * 16 + 16
        a = rng.standard_normal((m, k)).astype(np.float32)
        v = np.zeros((k, ldv), np.float32)
        v[:, :n] = rng.standard_normal((k, n))
        v[5, :] = -0.0
        lib.pg_rowdot_tiles_use(0)
        try:
            want, r = _raw_rowdot(a, 0, np.ascontiguousarray(v[:, :n].T), True)  # the row loops
        finally:
            lib.pg_rowdot_tiles_use(1)
        assert r == 1
        got = np.full((m, ldv), np.nan, np.float32)
        assert lib.pg_rowdot_kx(m, n, k, ffi.cast("float *", a.ctypes.data), k, ffi.cast("float *", v.ctypes.data),
                                ldv, ffi.cast("float *", got.ctypes.data), ldv)
        differ += _bits_differ(got[:, :n], want)
        assert np.isnan(got[:, n:]).all(), "wrote past its columns"
    assert not lib.pg_rowdot_kx_fits(127, 64, 64) and not lib.pg_rowdot_kx_fits(128, 31, 64)
    print(f"k-major columns: {differ} values whose bits differ from the row products' (bound 0)")
    assert differ == 0

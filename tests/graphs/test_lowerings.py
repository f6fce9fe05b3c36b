"""Every graph lowering agrees with the upstream reference, run on the CPU backend.

GPU backends pick other lowerings (Metal: explicit masks, no left padding, no col2im_1d;
GPUs: no custom kernels); the math is the same, so CI checks each on the CPU.
"""

from __future__ import annotations

import numpy as np
import pytest

import oracle
import pyggml_codec
from graphrun import run_cpu_graph
from parity import random_codes, report, signal
from pyggml_codec.backend import kernels, runtime
from pyggml_codec.backend.ggml_graph import Graph
from pyggml_codec.backend import lowerings

# f32 precision, rel RMS against PyTorch whatever the lowering: decode 1.8e-7 to 3.4e-7 (a 5-frame
# decode under the causal mask 1.7e-7, the blocked attention's decodes 3.2e-7 to 3.3e-7), encode latent
# 5.3e-7 to 5.7e-7 (tiny model; AVX512-FP16 Xeon, native kernels). The bounds sit 6-12x above.
F32_REL_RMS = 2e-6
F32_LATENT_REL_RMS = 5e-6

PLANS = {
    "stock-ops": {"kernels": False},
    "metal-like": {"mask": "explicit", "left_pad": "concat", "conv_transpose": "ggml", "kernels": False,
                   "attention": "full"},
    "concat-pad-blocked": {"left_pad": "concat", "kernels": False},
    "conv-transpose-op": {"conv_transpose": "ggml"},
    "cpu-kernels": {"kernels": True},
    "full-attention": {"attention": "full"},
    "blocked-attention": {"attention": "blocked"},
    "fused-attention": {"attention": "fused"},
    "ggml-matmul": {"matmul": "ggml"},
    "im2col-conv": {"conv": "im2col"},
    "blas": {"matmul": "blas", "conv": "taps"},
    "winograd": {"matmul": "blas", "conv": "winograd"},
}


@pytest.mark.parametrize("name", list(PLANS))
def test_lowering_matches_oracle(tiny_model, name, require):
    if PLANS[name].get("kernels") and not kernels.AVAILABLE:
        pytest.fail(f"compiled kernels missing: {kernels.UNAVAILABLE_REASON}")
    if "blas" in PLANS[name].values():
        require("blas", kernels.BLAS is not None, f"no BLAS here: {kernels.BLAS_UNAVAILABLE_REASON}")
    codes = random_codes((64,) + (32,) * 9, 20, seed=1)  # 20 > tiny window 8
    x = signal(2 * 44100 + 777, seed=2)
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", lowerings=PLANS[name]) as codec:
        audio = codec.decode(codes)
        fused = codec.decode(codes, decode_path="fused")
        enc = codec.encode_stages(x)
        used = dict(codec.lowerings)
    print(f"{name}: lowerings used {used}")
    rel, _ = report(f"{name} decode", audio, oracle.decode(tiny_model.model, codes))
    assert rel <= F32_REL_RMS
    np.testing.assert_array_equal(audio, fused)
    rel_lat, _ = report(f"{name} encode latent", enc.stages["latent"], oracle.latent(tiny_model.model, x))
    assert rel_lat <= F32_LATENT_REL_RMS
    np.testing.assert_array_equal(enc.codes, oracle.encode(tiny_model.model, x))
    for key, value in PLANS[name].items():
        if key == "mask":  # 20 frames exceed the window (a window mask); the causal mask needs a short input
            with pyggml_codec.load(tiny_model.f32_path, backend="cpu", lowerings=PLANS[name]) as codec:
                short = codec.decode(codes[:, :5])
                mask = codec.lowerings["quantizer.post_module.mask"]
            rel, _ = report(f"{name} decode of 5 frames (mask {mask})", short, oracle.decode(tiny_model.model, codes[:, :5]))
            assert rel <= F32_REL_RMS
            assert mask == ("causal-mask" if value == "explicit" else "diag_mask_inf"), mask
        elif key == "kernels":
            assert used["snake"] == ("custom" if value else "chain")
        elif key == "attention":
            want = {"full": "window-mask", "blocked": "blocked-window", "fused": "fused-window"}[value]
            assert used["quantizer.post_module.mask"] == want
        elif key == "matmul":  # "blas": the BLAS kernel or the row kernel (every F32 product with AVX-512)
            ran = set(used[key].split("+"))
            assert used[key] == value if value == "ggml" else ran & {"blas", "rowdot"}, used[key]
        else:
            assert used[key] == value
        if key == "conv" and value != "im2col":  # the small stride-1 convs (decoder head) per tap too, the
            # encoder's first (one input channel) in one op where it reproduces the 16-float row products
            one_channel = {"one-channel"} if kernels.ROWDOT and kernels.OPS["rowdot"] >= 16 else set()
            assert set(used["conv1d"].split("+")) == {"taps"} | one_channel, used


@pytest.mark.parametrize("attention", ["blocked", "fused"])
@pytest.mark.parametrize("frames", [17, 24, 41])  # > 2 windows (8): blocked; a partial last block
def test_window_attention_lowerings_equal_full(tiny_model, frames, attention):
    """The CPU's sliding-window attention, blocked (2W keys per block of W queries) or fused (one
    compiled op over the visible scores alone), against the full T x T masked form, decode and
    encode (the RVQ transformers, window 8)."""
    codes = random_codes((64,) + (32,) * 9, frames, seed=frames)
    x = signal(frames * 2048 - 999, seed=frames)
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", lowerings={"attention": attention}) as a, \
            pyggml_codec.load(tiny_model.f32_path, backend="cpu", lowerings={"attention": "full"}) as b:
        a.decode_chunk_frames = b.decode_chunk_frames = None  # one graph: the streamed one has its own mask
        ya, ea = a.decode(codes), a.encode_stages(x)
        assert a.lowerings["quantizer.post_module.mask"] == f"{attention}-window"
        assert a.lowerings["quantizer.pre_module.mask"] == f"{attention}-window"
        yb, eb = b.decode(codes), b.encode_stages(x)
        assert b.lowerings["quantizer.post_module.mask"] == "window-mask"
    report(f"{attention} vs full attention decode, {frames} frames", ya, yb)
    report(f"{attention} vs full attention pre_module, {frames} frames", ea.stages["pre_module"], eb.stages["pre_module"])
    np.testing.assert_allclose(ya, yb, rtol=0, atol=1e-6)
    # measured max abs: decode 2.4e-7 to 3.7e-7, pre_module 2.4e-7 to 7.2e-7 (17-41 frames, both lowerings)
    np.testing.assert_allclose(ea.stages["pre_module"], eb.stages["pre_module"], rtol=0, atol=3e-6)
    flips = ea.codes != eb.codes  # the pre_module differs by up to 7e-7: only a near-tie may flip
    print(f"{attention} vs full attention: {int(flips.sum())} of {flips.size} codes differ (bound: near-ties only)")
    assert np.all(eb.margins[flips] < 1e-4), "only near-ties may flip"
    rel, _ = report(f"{attention} attention decode vs oracle", ya, oracle.decode(tiny_model.model, codes))
    assert rel <= F32_REL_RMS


def test_explicit_causal_mask_used_when_window_covers_sequence(tiny_model):
    codes = random_codes((64,) + (32,) * 9, 6, seed=3)  # 6 <= window 8: plain causal
    masked = {"attention": "blocked"}  # the masked forms ("fused" takes no mask)
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", lowerings=masked) as a, \
            pyggml_codec.load(tiny_model.f32_path, backend="cpu", lowerings={**masked, "mask": "explicit"}) as b:
        ya, yb = a.decode(codes), b.decode(codes)
        assert a.lowerings["quantizer.post_module.mask"] == "diag_mask_inf"
        assert b.lowerings["quantizer.post_module.mask"] == "causal-mask"
    report("explicit causal mask vs diag_mask_inf", yb, ya)
    np.testing.assert_allclose(yb, ya, rtol=0, atol=1e-6)


def test_cpu_plan_and_bad_overrides(tiny_model):
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu") as codec:
        blas = kernels.BLAS is not None
        assert codec.plan.as_dict() == {"precision": "f32", "mask": "diag_mask_inf", "conv_transpose": "col2im", "left_pad": "pad_ext",
                              "kernels": True, "attention": "fused" if kernels.AVAILABLE else "blocked", "matmul": "blas" if blas else "ggml",
                              "conv": "winograd" if blas else "im2col", "quantized": "dequantize",
                              "matrices": "stored" if blas and kernels.ROWDOT else "f32", "kv": "arena",
                              "products": "f32", "decode": "split", "decode_chunk_frames": 32}
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", lowerings={"kernels": False}) as codec:
        assert (codec.plan.matmul, codec.plan.conv, codec.plan.attention) == ("ggml", "im2col", "blocked")
    with pytest.raises(ValueError, match="needs the compiled kernels"):
        pyggml_codec.load(tiny_model.f32_path, backend="cpu", lowerings={"kernels": False, "conv": "taps"})
    with pytest.raises(ValueError, match="attention='fused' needs the compiled kernels"):
        pyggml_codec.load(tiny_model.f32_path, backend="cpu", lowerings={"kernels": False, "attention": "fused"})
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu", precision="s2cpp") as codec:
        assert codec.plan.attention == "full"
    with pytest.raises(ValueError, match="matrices='stored' in f32 precision needs"):
        pyggml_codec.load(tiny_model.f32_path, backend="cpu", lowerings={"matmul": "ggml", "matrices": "stored"})
    with pytest.raises(ValueError, match="unknown lowering"):
        pyggml_codec.load(tiny_model.f32_path, backend="cpu", lowerings={"mask": "sometimes"})


def test_probe_reports_cpu_support():
    backend = runtime.start_backend("cpu")
    try:
        support = lowerings.probe_ops(backend)
    finally:
        backend.free()
    assert support == {"diag_mask_inf": True, "col2im_1d": True, "pad_left": True, "conv_transpose_1d": True}


def test_custom_kernels_match_ggml_ops(tiny_model):
    """Snake kernel vs op chain within float rounding (f32). In s2cpp mode a 1-ulp change
    from the vectorized sinf can flip an F16 rounding of a conv input, so there both are
    held to the s2cpp bound against the reference instead."""
    if not kernels.AVAILABLE:
        pytest.fail(f"compiled kernels missing: {kernels.UNAVAILABLE_REASON}")
    codes = random_codes((64,) + (32,) * 9, 12, seed=4)
    want = oracle.decode(tiny_model.model, codes)
    for path, precision in ((tiny_model.f32_path, "f32"), (tiny_model.f16_path, "s2cpp")):
        with pyggml_codec.load(path, backend="cpu", precision=precision) as codec:
            fast = codec.decode(codes)
            codec.use_custom_kernels = False
            codec.clear_cache()
            plain = codec.decode(codes)
        rel, _ = report(f"kernels vs plain ops ({precision})", fast, plain)
        if precision == "f32":
            assert rel <= 1e-6
        else:
            for label, got in (("kernels", fast), ("plain", plain)):
                assert report(f"s2cpp {label} vs oracle", got, want)[0] <= 2e-3


@pytest.mark.parametrize("stride,dilation,pad,length", [(1, 1, 6, 50), (1, 9, 54, 300), (1, 3, 18, 1003), (4, 1, 4, 97),
                                                     (2, 1, 0, 64)])
def test_f16_im2col_kernel_bit_identical(stride, dilation, pad, length):
    """The compiled F16 im2col against ggml's, bit for bit: stride-1 convs go 8 columns at a time
    (blocks of 64 columns per thread; the edges, and the channels within 8 slots of a column's end,
    one column at a time)."""
    if not kernels.AVAILABLE:
        pytest.fail(f"compiled kernels missing: {kernels.UNAVAILABLE_REASON}")
    from pyggml_codec.graphs import convs, ops

    backend = runtime.start_backend("cpu")
    backend.set_threads(2)
    x = np.random.default_rng(5).standard_normal((6, length)).astype(np.float32)
    k = 8 if stride == 4 else (2 if stride == 2 else 7)
    outs = []
    try:
        for use_kernel in (True, False):
            graph = Graph(backend, 16 << 20)

            def build(g):
                w = g.input("w", np.zeros((3, 6, k), np.float16), ops.F16)
                cols = convs.im2col(g, w, g.input("x", x), stride, pad, dilation)
                return {"cols": ops.lib.ggml_cast(g.ctx, cols, ops.F32), "w": ops.lib.ggml_cast(g.ctx, w, ops.F32)}

            graph.build(build, ops.Builder(ctx=graph.ctx, f16_convs=True, im2col_kernel=use_kernel))
            outs.append(graph.run()["cols"])
            assert graph.builder.lowerings["im2col"] == ("custom" if use_kernel else "ggml")
            graph.free()
    finally:
        backend.free()
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("stride,k,pad,length,channels", [(2, 4, 2, 97, 6), (4, 8, 4, 203, 5), (8, 16, 8, 1001, 3),
                                                          (3, 5, 2, 50, 7), (1, 7, 6, 40, 4), (2, 2, 0, 64, 2)])
def test_f32_im2col_kernel_bit_identical(stride, k, pad, length, channels, threads):
    """The compiled F32 im2col of an undilated conv against ggml's, bit for bit: a column at a time,
    each channel's taps copied as vectors (streaming stores where K is a multiple of 4), zeros at
    both padded edges; the columns shared by whole columns between threads. Metric: differing
    values; tolerance 0."""
    if not kernels.AVAILABLE:
        pytest.fail(f"compiled kernels missing: {kernels.UNAVAILABLE_REASON}")
    from pyggml_codec.graphs import convs, ops

    x = np.random.default_rng(11).standard_normal((channels, length)).astype(np.float32)
    outs, lowered = [], []
    for use_kernel in (True, False):
        def build(g):
            g.im2col_kernel = use_kernel
            w = g.input("w", np.zeros((3, channels, k), np.float32))
            cols = convs.im2col(g, w, g.input("x", x), stride, pad, 1)
            lowered.append(g.lowerings["im2col"])
            return {"cols": cols}

        outs.append(run_cpu_graph(build, threads)["cols"])
    assert lowered == ["custom", "ggml"]
    differing = int(np.count_nonzero(outs[0] != outs[1]))
    print(f"stride {stride}, K {k}, pad {pad}, {length} samples, {threads} threads: "
          f"{differing} of {outs[1].size} values differ")
    assert outs[0].shape == outs[1].shape and np.abs(outs[1]).max() > 0
    assert differing == 0


def test_f32_im2col_kernel_leaves_dilated_and_strided_inputs_to_ggml():
    """Dilated F32 columns, and an F32 input that is not contiguous (the kernel would first copy
    it), keep ggml's im2col."""
    from pyggml_codec.graphs import convs, ops

    x = np.random.default_rng(12).standard_normal((4, 60)).astype(np.float32)
    lowered = []

    def build(g):
        w = g.input("w", np.zeros((3, 4, 7), np.float32))
        xt = g.input("x", x)
        out = {"dilated": convs.im2col(g, w, xt, 1, 6, 3)}
        lowered.append(g.lowerings["im2col"])
        view = ops.lib.ggml_view_2d(g.ctx, xt, 50, 4, xt.contents.nb[1], 0)  # rows 60 apart: not contiguous
        out["view"] = convs.im2col(g, w, view, 2, 4, 1)
        lowered.append(g.lowerings["im2col"])
        return out

    run_cpu_graph(build, 2, im2col_kernel=True)
    assert lowered == ["ggml", "ggml"]


@pytest.mark.parametrize("precision", ["f32", "s2cpp"])
@pytest.mark.parametrize("stride,dilation,context,length", [(1, 1, 6, 50), (1, 9, 54, 300), (1, 3, 18, 18),
                                                            (4, 1, 4, 96)])
def test_im2col_kernel_reads_carried_context_in_place(precision, stride, dilation, context, length):
    """The streamed conv's im2col of (context, x) without a concat equals ggml's im2col of the
    concatenated signal, bit for bit, F32 and F16 columns."""
    if not kernels.AVAILABLE:
        pytest.fail(f"compiled kernels missing: {kernels.UNAVAILABLE_REASON}")
    from pyggml_codec.graphs import convs, ops

    backend = runtime.start_backend("cpu")
    backend.set_threads(2)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, length)).astype(np.float32)
    prev = rng.standard_normal((6, context)).astype(np.float32)
    k = 8 if stride == 4 else 7
    wtype = ops.F16 if precision == "s2cpp" else ops.F32
    outs = []
    try:
        for in_place in (True, False):
            graph = Graph(backend, 16 << 20)

            def build(g):
                w = g.input("w", np.zeros((3, 6, k), ops.binding.NP_DTYPES[wtype]), wtype)
                xt = g.input("x", x)
                if in_place:
                    cols = convs.im2col(g, w, xt, stride, 0, dilation, prev=g.input("prev", prev))
                else:
                    g.im2col_kernel = False
                    cols = convs.im2col(g, w, g.input("u", np.concatenate([prev, x], axis=1)), stride, 0, dilation)
                return {"cols": ops.lib.ggml_cast(g.ctx, cols, ops.F32) if precision == "s2cpp" else cols}

            graph.build(build, ops.Builder(ctx=graph.ctx, f16_convs=precision == "s2cpp", im2col_kernel=True))
            outs.append(graph.run()["cols"])
            assert graph.builder.lowerings["im2col"] == ("custom" if in_place else "ggml")
            graph.free()
    finally:
        backend.free()
    assert outs[0].shape == outs[1].shape and np.abs(outs[1]).max() > 0
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("layout", ["CF", "CL"])
@pytest.mark.parametrize("out_type", ["f32", "f16"])
def test_fused_bias_snake_and_residual_kernels_match_numpy(layout, out_type):
    """snake(x + b) (F32 or F16 out) and x + (h + b) against float64 numpy, both layouts."""
    if not kernels.AVAILABLE:
        pytest.fail(f"compiled kernels missing: {kernels.UNAVAILABLE_REASON}")
    from pyggml_codec.graphs import ops

    rng = np.random.default_rng(11)
    c, t = 24, 1003  # t not a multiple of the threads' split or the kernel's 256-value runs
    x, h = (rng.standard_normal((c, t)).astype(np.float32) for _ in range(2))
    alpha = rng.uniform(0.2, 2.0, c).astype(np.float32)
    bias = rng.standard_normal(c).astype(np.float32)
    arr = (lambda a: a) if layout == "CF" else (lambda a: np.ascontiguousarray(a.T))  # CL: numpy (T, C)
    backend = runtime.start_backend("cpu")
    backend.set_threads(2)
    graph = Graph(backend, 16 << 20)
    try:
        def build(g):
            xt, ht = g.input("x", arr(x)), g.input("h", arr(h))
            at, bt = g.input("alpha", alpha), g.input("bias", bias)
            kind = ops.F16 if out_type == "f16" else ops.F32
            y = ops.bias_snake(g, xt, bt, at, layout, kind)
            return {"snake": ops.lib.ggml_cast(g.ctx, y, ops.F32) if kind == ops.F16 else y,
                    "residual": ops.add_bias_residual(g, ht, bt, xt, layout)}

        graph.build(build, ops.Builder(ctx=graph.ctx, snake_kernel=True))
        assert graph.builder.lowerings == {"bias_snake": "custom", "add_bias_residual": "custom"}
        out = graph.run()
    finally:
        graph.free()
        backend.free()
    x64, b64, a64 = x.astype(np.float64), bias[:, None].astype(np.float64), alpha[:, None].astype(np.float64)
    want_snake = (x64 + b64) + np.sin(a64 * (x64 + b64)) ** 2 / a64
    want_res = x64 + (h.astype(np.float64) + b64)
    got_snake, got_res = (out[k] if layout == "CF" else out[k].T for k in ("snake", "residual"))
    err_snake = float(np.abs(got_snake - want_snake).max() / np.abs(want_snake).max())
    err_res = float(np.abs(got_res - want_res).max())
    print(f"{layout} {out_type}: bias+snake rel max err {err_snake:.2e}, bias+residual max abs {err_res:.2e}")
    assert err_snake <= (1e-3 if out_type == "f16" else 2e-6)
    assert err_res <= 1e-6


@pytest.mark.parametrize("layout", ["CF", "CL"])
@pytest.mark.parametrize("exact", [False, True])
def test_bias_kernel_is_ggml_add_bit_for_bit(layout, exact):
    """h + b by the compiled pass (ops.add_bias) against ggml's own add in the same graph: the same
    bits (one float add each), both layouts, both builds; shapes it cannot take keep ggml's add."""
    if not kernels.AVAILABLE or (exact and not kernels.EXACT_AVAILABLE):
        pytest.fail(f"compiled kernels missing: {kernels.UNAVAILABLE_REASON or kernels.EXACT_UNAVAILABLE_REASON}")
    from pyggml_codec.graphs import ops

    rng = np.random.default_rng(12)
    h = rng.standard_normal((24, 1003)).astype(np.float32)
    bias = rng.standard_normal(24).astype(np.float32)
    arr = (lambda a: a) if layout == "CF" else (lambda a: np.ascontiguousarray(a.T))

    def build(g):
        ht, bt = g.input("h", arr(h)), g.input("bias", bias)
        ours = ops.add_bias(g, ht, bt, layout)
        one = g.input("one", np.ones(1, np.float32))  # one channel: nothing to gain, ggml's add
        assert ops.add_bias(g, g.input("h1", np.zeros((1, 5), np.float32)), one, layout) is not None
        # the first columns of each row, a strided view (a conv-transpose's first samples): read in place
        n0 = int(ht.contents.ne[0]) - 7
        head = ops.lib.ggml_view_2d(g.ctx, ht, n0, int(ht.contents.ne[1]), ht.contents.nb[1], 0)
        assert not ops.lib.ggml_is_contiguous(head)
        view = ops.add_bias(g, head, bt, layout) if layout == "CF" else None
        custom_ops = {ops.lib.ggml_op_name(t.contents.op) for t in ([ours, view] if view is not None else [ours])}
        assert custom_ops == {b"CUSTOM"}, custom_ops
        out = {"ours": ours, "ggml": ops.lib.ggml_add(g.ctx, ht, ops.channel_vector(g, bt, layout))}
        if view is not None:
            out["view"] = view
            out["view_ggml"] = ops.lib.ggml_add(g.ctx, head, ops.channel_vector(g, bt, layout))
        assert g.lowerings["add_bias"] == ("custom-exact" if exact else "custom")
        return out

    out = run_cpu_graph(build, 2, snake_kernel=True, exact_kernels=exact)
    differ = int((out["ours"].view(np.uint32) != out["ggml"].view(np.uint32)).sum())
    print(f"{layout}, {'exact' if exact else 'default'} build: {differ} of {h.size} values differ from ggml_add (bound 0)")
    assert differ == 0
    if layout == "CF":
        got, want = out["view"], out["view_ggml"]
        assert got.shape == want.shape == (24, 1003 - 7)
        differ = int((got.view(np.uint32) != want.view(np.uint32)).sum())
        print(f"strided view of {want.size} values: {differ} differ from ggml_add (bound 0)")
        assert differ == 0


@pytest.mark.parametrize("shape", [(1003, 24), (24, 1003), (8, 8), (37, 5), (96, 4096), (1, 9)])
def test_transpose_kernel_is_ggml_cont_bit_for_bit(shape):
    """ops.transpose by the compiled blocked copy against ggml's copy of a transposed view in the
    same graph: the same values (a copy), tiles and 8 x 8 blocks with edges both ways, 1-3 threads
    (a split along either side). Metric: values that differ, bound 0."""
    if not kernels.AVAILABLE:
        pytest.fail(f"compiled kernels missing: {kernels.UNAVAILABLE_REASON}")
    from pyggml_codec.graphs import ops

    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)

    def build(g):
        xt = g.input("x", x)
        ours = ops.transpose(g, xt)
        assert ops.lib.ggml_op_name(ours.contents.op) == b"CUSTOM" and g.lowerings["transpose"] == "custom"
        return {"ours": ours, "ggml": ops.lib.ggml_cont(g.ctx, ops.lib.ggml_transpose(g.ctx, xt))}

    for threads in (1, 2, 3):
        out = run_cpu_graph(build, threads, snake_kernel=True)
        differ = int((out["ours"].view(np.uint32) != out["ggml"].view(np.uint32)).sum())
        print(f"transpose of {shape}, {threads} thread(s): {differ} of {x.size} values differ (bound 0)")
        assert out["ours"].shape == x.T.shape and differ == 0
        np.testing.assert_array_equal(out["ours"], x.T)


def test_software_f16_conversion_matches_numpy():
    """The F16 conversion of kernels built without F16C (PYGGML_CODEC_PORTABLE=1, macOS, ARM),
    pg_f16_soft, run in every build. Metric: bits against numpy's float16 cast (round to nearest
    even); tolerance 0. Over every 251st float32 bit pattern, all patterns near the edges (zero,
    the subnormal halves, the largest half, infinity) and the ties of the normal range; a NaN
    must stay a NaN of its sign (numpy does not set the quiet bit; F16C does)."""
    if not kernels.AVAILABLE:
        pytest.fail(f"compiled kernels missing: {kernels.UNAVAILABLE_REASON}")
    from pyggml_codec.backend import _kernels

    rng = np.random.default_rng(5)
    edges = np.array([0, 0x33000000, 0x38800000, 0x477FE000, 0x477FF000, 0x7F800000], np.int64)
    ties = (rng.integers(0x38800000 >> 13, 0x477FE000 >> 13, 4096) << 13)[:, None] + [0xFFF, 0x1000, 0x1001]
    bits = np.concatenate([np.arange(0, 1 << 32, 251), (edges[:, None] + np.arange(-4096, 4097)).ravel(),
                           ties.ravel()]) % (1 << 32)
    bits = np.concatenate([bits, bits | (1 << 31)]).astype(np.uint32)  # both signs
    x = bits.view(np.float32)
    got = np.empty(x.size, np.uint16)
    _kernels.lib.pg_f16_soft(_kernels.ffi.from_buffer("float[]", x), _kernels.ffi.from_buffer("uint16_t[]", got),
                             x.size)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    wrong = np.flatnonzero((got != want) & ~nan)
    assert wrong.size == 0, f"{wrong.size} differ, first {bits[wrong[0]]:#010x}: {got[wrong[0]]:#06x} != {want[wrong[0]]:#06x}"
    assert np.isnan(got[nan].view(np.float16)).all() and np.array_equal(got[nan] >> 15, bits[nan] >> 31)


def test_per_op_profile_runs_every_node(tiny_model):
    """Graph.profile (tools/profile_ops.py) recomputes each node alone, after re-uploading inputs."""
    codes = random_codes((64,) + (32,) * 9, 10, seed=6)
    with pyggml_codec.load(tiny_model.f32_path, backend="cpu") as codec:
        want = codec.decode(codes)
        rows = [row for graph in codec.engine.cached_graphs().values() for row in graph.profile()]
        np.testing.assert_array_equal(codec.decode(codes), want)
    ops_seen = {op for op, _, _ in rows}
    print(f"{len(rows)} nodes, {1000 * sum(t for _, _, t in rows):.1f} ms; ops: {sorted(ops_seen)}")
    assert {"CUSTOM:im2col", "CUSTOM:causal_attention", "CUSTOM:col2im"} <= ops_seen  # custom ops are named by kernel
    if kernels.BLAS is not None:
        assert {"CUSTOM:conv_taps", "MAP_CUSTOM2:snake"} <= ops_seen
        assert ops_seen & {"CUSTOM:mul_mat_blas", "CUSTOM:mul_mat_rowdot"}  # F32 products by rows with AVX-512
    else:
        assert "MUL_MAT" in ops_seen


# The last three span several of the kernel's tiles of columns (256 KB of columns each: 170, 102
# and 662 columns), the last with K < stride (samples no column reaches).
@pytest.mark.parametrize("k,stride,cout,length,threads", [(16, 8, 5, 9, 2), (4, 2, 96, 300, 2), (8, 4, 3, 1, 1),
                                                          (4, 4, 7, 33, 3), (3, 2, 17, 40, 4), (4, 2, 96, 3001, 2),
                                                          (16, 8, 40, 700, 3), (3, 4, 33, 2100, 2)])
def test_col2im_kernel_bit_identical(k, stride, cout, length, threads):
    """The compiled overlap-add of conv-transpose columns equals ggml_col2im_1d bit for bit
    (each output sums at most K / stride terms, in the same order)."""
    if not kernels.AVAILABLE:
        pytest.fail(f"compiled kernels missing: {kernels.UNAVAILABLE_REASON}")
    from pyggml_codec.graphs import ops

    cols = np.random.default_rng(k + length).standard_normal((length, k * cout)).astype(np.float32)

    def build(g):
        c = g.input("cols", cols)
        return {"ours": kernels.col2im(g.ctx, c, k, stride, g.keep),
                "ggml": ops.lib.ggml_col2im_1d(g.ctx, c, stride, cout, 0)}

    out = run_cpu_graph(build, threads)
    assert out["ours"].shape == out["ggml"].shape == (cout, (length - 1) * stride + k)
    np.testing.assert_array_equal(out["ours"], out["ggml"])


@pytest.mark.parametrize("k,stride,cout,length,threads", [(4, 2, 96, 3001, 2), (16, 8, 40, 700, 3), (3, 2, 17, 40, 2),
                                                          (4, 4, 7, 33, 1), (8, 4, 3, 1, 2)])
def test_col2im_kernel_with_bias_keeps_the_first_samples(k, stride, cout, length, threads):
    """With a bias and n_keep, the overlap-add gives ggml's col2im_1d, its first n_keep samples,
    plus ggml_add's bias, bit for bit (the one-shot conv-transpose's output, no pass after it).
    Metric: max abs difference; tolerance 0."""
    if not kernels.AVAILABLE:
        pytest.fail(f"compiled kernels missing: {kernels.UNAVAILABLE_REASON}")
    from pyggml_codec.graphs import ops

    rng = np.random.default_rng(k * length)
    cols = rng.standard_normal((length, k * cout)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    n_keep = length * stride

    def build(g):
        c, b = g.input("cols", cols), g.input("bias", bias)
        full = ops.lib.ggml_col2im_1d(g.ctx, c, stride, cout, 0)
        head = ops.lib.ggml_view_2d(g.ctx, full, n_keep, cout, full.contents.nb[1], 0)
        want = ops.lib.ggml_add(g.ctx, ops.lib.ggml_cont(g.ctx, head), ops.reshape_2d(g, b, 1, cout))
        with pytest.raises(ValueError, match="one value per channel"):
            kernels.col2im(g.ctx, c, k, stride, g.keep, bias=c)
        with pytest.raises(ValueError, match="keep 1 to"):
            kernels.col2im(g.ctx, c, k, stride, g.keep, bias=b, n_keep=(length - 1) * stride + k + 1)
        return {"ours": kernels.col2im(g.ctx, c, k, stride, g.keep, bias=b, n_keep=n_keep), "ggml": want}

    out = run_cpu_graph(build, threads)
    assert out["ours"].shape == out["ggml"].shape == (cout, n_keep)
    diff = float(np.max(np.abs(out["ours"] - out["ggml"])))
    print(f"col2im with bias, first {n_keep} samples: max abs {diff:.1e} against ggml (bound 0)")
    np.testing.assert_array_equal(out["ours"], out["ggml"])


@pytest.mark.parametrize("k,stride,cout,length,tail,threads", [(4, 2, 96, 3001, 2, 2), (16, 8, 40, 700, 8, 3),
                                                               (4, 2, 7, 50, 2, 1), (3, 2, 17, 1, 1, 2)])
def test_col2im_kernel_from_a_carried_tail(k, stride, cout, length, tail, threads):
    """With a stream's carried overlap (prev), each output starts from prev where it reaches, else
    from 0, and adds its columns' terms in the order of t: numpy's float32 sums in that order,
    bit for bit, over several tiles of columns; with the bias and the chunk's own samples kept
    (a stream's step), those plus the bias. Metric: max abs difference; tolerance 0."""
    if not kernels.AVAILABLE:
        pytest.fail(f"compiled kernels missing: {kernels.UNAVAILABLE_REASON}")
    from pyggml_codec.graphs import ops

    rng = np.random.default_rng(k + length)
    cols = rng.standard_normal((length, k * cout)).astype(np.float32)
    prev = rng.standard_normal((cout, tail)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    want = np.zeros((cout, (length - 1) * stride + k), dtype=np.float32)
    want[:, :tail] = prev
    for t in range(length):
        want[:, t * stride:t * stride + k] += cols[t].reshape(cout, k)

    def build(g):
        c, p = g.input("cols", cols), g.input("prev", prev)
        return {"ours": kernels.col2im(g.ctx, c, k, stride, g.keep, p),
                "kept": kernels.col2im(g.ctx, c, k, stride, g.keep, p, bias=g.input("bias", bias),
                                       n_keep=length * stride)}

    out = run_cpu_graph(build, threads)
    diff = float(np.max(np.abs(out["ours"] - want)))
    print(f"col2im from a carried tail: max abs {diff:.1e} (bound 0)")
    np.testing.assert_array_equal(out["ours"], want)
    np.testing.assert_array_equal(out["kept"], want[:, :length * stride] + bias[:, None])  # a stream's step


@pytest.mark.parametrize("k,stride,cout,n,segments,threads", [(16, 8, 5, 1, 3, 2), (4, 2, 96, 37, 8, 2),
                                                             (4, 2, 96, 400, 3, 2),
                                                             (8, 4, 3, 2, 2, 3), (3, 2, 17, 5, 4, 1)])
def test_col2im_segments_equal_each_stream_alone(k, stride, cout, n, segments, threads):
    """A batched step's overlap-add (segments S) gives each stream's samples bit for bit as the
    overlap-add of its own columns from its own carried tail, and zeros past the last stream's.
    Metric: max abs difference; tolerance 0."""
    if not kernels.AVAILABLE:
        pytest.fail(f"compiled kernels missing: {kernels.UNAVAILABLE_REASON}")
    from pyggml_codec.graphs import ops

    rng = np.random.default_rng(k + n + segments)
    cols = rng.standard_normal((n * segments, k * cout)).astype(np.float32)
    prev = rng.standard_normal((segments, 1, cout, k - stride)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)

    def build(g):
        c, p = g.input("cols", cols), g.input("prev", prev)
        out = {"all": kernels.col2im(g.ctx, c, k, stride, g.keep, p, segments=segments),
               "kept": kernels.col2im(g.ctx, c, k, stride, g.keep, p, segments=segments,
                                      bias=g.input("bias", bias), n_keep=n * segments * stride)}
        for s in range(segments):
            cs = g.input(f"cols{s}", np.ascontiguousarray(cols[s * n:(s + 1) * n]))
            ps = g.input(f"prev{s}", np.ascontiguousarray(prev[s, 0]))
            out[s] = kernels.col2im(g.ctx, cs, k, stride, g.keep, ps)
        return out

    out = run_cpu_graph(build, threads)
    seg = n * stride
    assert out["all"].shape == (cout, (n * segments - 1) * stride + k)
    err = max(float(np.abs(out["all"][:, s * seg:(s + 1) * seg] - out[s][:, :seg]).max()) for s in range(segments))
    print(f"col2im of {segments} segments vs each alone: max abs {err:.1e}")
    assert err == 0.0
    assert not out["all"][:, segments * seg:].any()
    # with the bias and the streams' samples alone: ggml_add's values on the same samples
    np.testing.assert_array_equal(out["kept"], out["all"][:, :segments * seg] + bias[:, None])


def test_col2im_segments_reject_uneven_columns():
    def build(g):
        c = g.input("cols", np.zeros((7, 4 * 3), np.float32))
        p = g.input("prev", np.zeros((2, 1, 3, 2), np.float32))
        return {"y": kernels.col2im(g.ctx, c, 4, 2, g.keep, p, segments=2)}

    with pytest.raises(ValueError, match="2 segments of a conv-transpose over 7 columns"):
        run_cpu_graph(build)


def _elementwise_inputs(n0: int, rows: int, per_column: bool, seed: int) -> tuple[np.ndarray, ...]:
    """x and h [rows, n0], alpha and bias per row ([rows, 1]) or per column ([1, n0])."""
    rng = np.random.default_rng(seed)
    x = (3 * rng.standard_normal((rows, n0))).astype(np.float32)
    h = (3 * rng.standard_normal((rows, n0))).astype(np.float32)
    shape = (1, n0) if per_column else (rows, 1)
    return x, h, (rng.random(shape) + 0.5).astype(np.float32), rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("n0, rows, per_column", [(1003, 64, False), (9000, 5, False), (17, 9, False),
                                                  (64, 33, True), (1001, 5, True)])
def test_elementwise_kernels_give_the_same_bits_at_any_thread_count(n0, rows, per_column):
    """Snake (libmvec's vector sinf and its narrower variants for a loop's last values differ in the
    last bit) and the bias-residual add (a vector loop and its tail may sum in different orders)
    compute each value as in its row's own loop, wherever the threads' shares fall. Split by element
    count, shares began inside rows, and each case here had 1 to 6 values differ from one thread's
    at some count from 2 to 7."""
    x, h, alpha, bias = _elementwise_inputs(n0, rows, per_column, n0 + rows)

    def build(g):
        xt, ht, at, bt = g.input("x", x), g.input("h", h), g.input("alpha", alpha), g.input("bias", bias)
        return {"snake": kernels.snake(g.ctx, xt, at), "bias_snake": kernels.bias_snake(g.ctx, xt, at, bt, 0),
                "add_bias_residual": kernels.add_bias_residual(g.ctx, ht, bt, xt)}

    one = run_cpu_graph(build, 1)
    for threads in (2, 3, 5, 7):
        out = run_cpu_graph(build, threads)
        differ = {name: int(np.count_nonzero(out[name] != one[name])) for name in one}
        print(f"[{n0}, {rows}], {threads} threads: values that differ from one thread's {differ}")
        assert not any(differ.values())


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("n0, rows, per_column", [(1003, 64, False), (63488, 4, False), (17, 9, False),
                                                  (64, 33, True), (1001, 5, True)])
def test_elementwise_kernels_in_place_give_the_values_of_fresh_outputs(n0, rows, per_column, exact):
    """Snake, Snake with its bias and the bias-residual add written over their first input: each
    chunk goes through a buffer, so the values are those of the op with an output of its own."""
    if exact and not kernels.EXACT_AVAILABLE:
        pytest.fail(f"exact kernels missing: {kernels.UNAVAILABLE_REASON}")
    from pyggml_codec.graphs import ops

    x, h, alpha, bias = _elementwise_inputs(n0, rows, per_column, 3 * n0 + rows)

    def build(g, in_place):
        xt, ht, at, bt = g.input("x", x), g.input("h", h), g.input("alpha", alpha), g.input("bias", bias)
        copy = lambda t: ops.lib.ggml_scale(g.ctx, t, 1.0)  # computed tensors to write over
        out = {"snake": kernels.snake(g.ctx, copy(xt), at, exact, in_place),
               "bias_snake": kernels.bias_snake(g.ctx, copy(xt), at, bt, 0, exact, in_place),
               "add_bias_residual": kernels.add_bias_residual(g.ctx, copy(ht), bt, xt, exact, in_place)}
        if in_place:
            assert all(t.contents.view_src for t in out.values())
        return out

    for threads in (1, 3):
        fresh = run_cpu_graph(lambda g: build(g, False), threads)
        over = run_cpu_graph(lambda g: build(g, True), threads)
        differ = {name: int(np.count_nonzero(over[name] != fresh[name])) for name in fresh}
        print(f"[{n0}, {rows}], exact {exact}, {threads} threads: values that differ in place {differ}")
        assert not any(differ.values()) and np.abs(fresh["snake"]).max() > 0

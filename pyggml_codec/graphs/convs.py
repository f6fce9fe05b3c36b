"""Convolutions as ggml graphs: causal im2col, conv, pointwise conv, conv-transpose, depthwise.

Layouts and precision as stated in ops.py. Each op also has a streamed form, used when the
builder carries a stream (``ops.Carry``): the left context of a causal conv and the overlap
tail of a conv-transpose come from carried inputs instead of zeros, and the state for the
next chunk is emitted as an output.
"""

from __future__ import annotations

import numpy as np

from ..backend import binding, kernels, winograd_conv
from ..backend.binding import lib
from . import batched as packed
from .carry import batched, carry_input, emit_carry  # noqa: F401  (carry_input, emit_carry: the streamed ops' helpers)
from .ops import F16, F32, Builder, Tensor, add, add_bias, first_columns, mul_mat, reshape_2d, shape, transpose
from ..backend.winograd_tables import WINOGRAD


def concat_time(g: Builder, a_cf: Tensor, b_cf: Tensor) -> Tensor:
    """CF ``[La, C]`` then ``[Lb, C]`` along time, as 3-D ``[L, 1, C]`` so CPU threads split C."""
    parts = []
    for t in (a_cf, b_cf):
        t = t if lib.ggml_is_contiguous(t) else lib.ggml_cont(g.ctx, t)
        parts.append(lib.ggml_reshape_3d(g.ctx, t, shape(t)[0], 1, shape(t)[1]))
    y = lib.ggml_concat(g.ctx, parts[0], parts[1], 0)
    return reshape_2d(g, y, shape(y)[0], shape(y)[2])


def context_in_place(g: Builder, x_cf: Tensor, n: int) -> Tensor:
    """The carried left context (CF ``[n, C]``) of a streamed conv whose kernel reads it in
    place, with no concat; emits ``x_cf``'s own last ``n`` samples (``L >= n``) as the next."""
    length, c = shape(x_cf)[:2]
    name, prev = carry_input(g, (n, c))
    emit_carry(g, name, lib.ggml_view_2d(g.ctx, x_cf, n, c, x_cf.contents.nb[1], (length - n) * x_cf.contents.nb[0]))
    return prev


def with_left_context(g: Builder, x_cf: Tensor, n: int) -> Tensor:
    """CF ``x_cf`` after the previous chunk's last ``n`` samples; emits this result's last ``n``.

    The carried samples stand where one-shot causal padding puts ``n`` zeros.
    """
    length, c = shape(x_cf)[:2]
    name, prev = carry_input(g, (n, c))
    xc = concat_time(g, prev, x_cf)  # [n + L, C]
    emit_carry(g, name, lib.ggml_view_2d(g.ctx, xc, n, c, xc.contents.nb[1], length * xc.contents.nb[0]))
    return xc


def _streamed_im2col(g: Builder, x_cf: Tensor, w: Tensor, stride: int, dilation: int, left: int,
                     extra: int) -> Tensor:
    """Causal conv columns of one chunk: carried inputs replace the left zero padding.

    Chunks must keep the stride aligned (L a multiple of ``stride``); only a stream's last
    chunk may be shorter, and gets one-shot's right padding (``extra`` zeros).
    """
    if batched(g):
        if stride != 1 or extra:
            raise ValueError(f"batched streams take stride-1 causal convs only (stride {stride})")
        return packed.conv_columns(g, x_cf, left, lambda x: im2col(g, w, x, 1, 0, dilation))
    length = shape(x_cf)[0]
    if left and length >= left and not extra and _kernel_im2col(g, w, x_cf, with_prev=True, dilation=dilation):
        x_cf = x_cf if lib.ggml_is_contiguous(x_cf) else lib.ggml_cont(g.ctx, x_cf)
        return im2col(g, w, x_cf, stride, 0, dilation, prev=context_in_place(g, x_cf, left))
    if left:
        x_cf = with_left_context(g, x_cf, left)
    if extra:
        x_cf = lib.ggml_pad_ext(g.ctx, x_cf, 0, extra, 0, 0, 0, 0, 0, 0)
    return im2col(g, w, x_cf, stride, 0, dilation)


def _conv_input_type(g: Builder) -> int:
    return F16 if g.f16_convs else F32


def _kernel_im2col(g: Builder, w: Tensor, x_cf: Tensor, with_prev: bool, dilation: int) -> bool:
    """Whether the compiled im2col takes these columns: F16 ones, and F32 ones where it reads a
    carried context in place or copies an undilated conv's contiguous input (kernels.im2col_supported);
    an F32 input it would first have to copy stays with ggml's op."""
    dst_type = _conv_input_type(g)
    if dst_type == F32 and not with_prev and not lib.ggml_is_contiguous(x_cf):
        return False
    return (g.im2col_kernel and binding.tensor_type(x_cf) == F32
            and kernels.im2col_supported(dst_type, shape(w)[0], with_prev, dilation))


def im2col(g: Builder, w: Tensor, x_cf: Tensor, stride: int, pad: int, dilation: int,
           prev: Tensor | None = None) -> Tensor:
    """1-D im2col of CF ``x_cf`` for kernel ``w`` (ne ``[K, Cin, ...]``), ``pad`` zeros each side:
    ne ``[K*Cin, OW]``. The compiled kernel on CPU (same values), ggml_im2col elsewhere.
    ``prev`` (CF ``[P, Cin]``, kernel only): the signal is ``prev`` then ``x_cf`` in time."""
    k, length = shape(w)[0], shape(x_cf)[0] + (shape(prev)[0] if prev is not None else 0)
    n_out = (length + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    if n_out < 1:
        raise ValueError(f"conv input of {length} samples is shorter than its kernel ({k}, dilation {dilation})")
    dst_type = _conv_input_type(g)
    if prev is not None or _kernel_im2col(g, w, x_cf, with_prev=False, dilation=dilation):
        x_cf = x_cf if lib.ggml_is_contiguous(x_cf) else lib.ggml_cont(g.ctx, x_cf)
        g.lowerings["im2col"] = "custom"
        return kernels.im2col(g.ctx, x_cf, k, stride, dilation, pad, n_out, dst_type, g.keep, prev)
    if dst_type == F16 and binding.tensor_type(w) != F16:
        raise ValueError("ggml's F16 im2col needs an F16 kernel tensor")
    g.lowerings["im2col"] = "ggml"
    return lib.ggml_im2col(g.ctx, w, x_cf, stride, 0, pad, 0, dilation, 0, False, dst_type)


def causal_im2col(g: Builder, x_cf: Tensor, w: Tensor, stride: int, dilation: int) -> Tensor:
    """Columns of a causal conv over ``x_cf``: ne ``[K*Cin, ceil(L/stride)]``.

    Causal padding puts ``ke - stride`` zeros on the left (ke = (K-1)*dilation + 1) and
    on the right just enough for ceil(L/stride) outputs::

        left pad          input x[0..L)                 right pad
        0 0 0 0 | x0 x1 x2 ... x(L-1) | 0 ..   (outputs = ceil(L / stride))

    im2col pads symmetrically, so with p0 = ke - stride the right side gets the same
    zeros, which covers the extra padding whenever ke - stride >= stride - 1; the first
    ceil(L/stride) columns are the causal conv's. When the left pad is 0 (kernel ==
    stride) the right pad is added explicitly.
    """
    k, cin = shape(w)[0], shape(w)[1]
    length = shape(x_cf)[0]
    if shape(x_cf)[1] != cin:
        raise ValueError(f"conv expects {cin} input channels, got {shape(x_cf)[1]}")
    ke = (k - 1) * dilation + 1
    left = ke - stride
    n_out = -(-length // stride)
    extra = n_out * stride - length
    if left < 0:
        raise ValueError(f"kernel {k} (dilation {dilation}) shorter than stride {stride}")
    if g.stream is not None:
        return _streamed_im2col(g, x_cf, w, stride, dilation, left, extra)
    if left < extra:
        x_cf = lib.ggml_pad_ext(g.ctx, x_cf, 0, extra, 0, 0, 0, 0, 0, 0)
    cols = im2col(g, w, x_cf, stride, left, dilation)
    return first_columns(g, cols, n_out)


TAPS_MAX_WEIGHTS = 1 << 16  # conv1d's per-tap path re-lays its weights in every compute


def conv1d(g: Builder, x_cf: Tensor, w: Tensor, b: Tensor | None, *, stride: int = 1,
           dilation: int = 1, out: str = "CF") -> Tensor:
    """Causal conv, weight ne ``[K, Cin, Cout]``; CF in, ``out`` layout out.

    Small stride-1 F32 kernels with a CF output (the decoder's 96 -> 1 head) take the
    per-tap BLAS kernel where the plan has it: no im2col columns (K*Cin rows over the whole
    signal: 27-35 ms for the head of a 1 s decode, against about 3 ms per tap)."""
    k, cin, cout = shape(w)[:3]
    if (g.conv in ("taps", "winograd") and stride == 1 and out == "CF" and binding.tensor_type(w) == F32
            and k * cin * cout <= TAPS_MAX_WEIGHTS and cin >= 16 and shape(x_cf)[1] == cin):
        g.lowerings["conv1d"] = "taps"
        wt = lib.ggml_cont(g.ctx, lib.ggml_permute(g.ctx, w, 2, 0, 1, 3))  # ne [Cin, Cout, K]: a copy per compute
        y = _in_place(g, x_cf, (k - 1) * dilation,
                      lambda x, prev, segments: kernels.conv_taps(g.ctx, wt, x, k, dilation, g.keep, prev, segments))
        return add_bias(g, y, b, out)
    if (cin == 1 and stride == 1 and dilation == 1 and out == "CF" and g.stream is None and g.snake_kernel
            and not g.exact_kernels and g.matmul == "blas" and kernels.conv_c1_supported(w, x_cf, b)):
        # one input channel (the encoder's first conv): the columns' product and the bias, in one op
        g.lowerings["conv1d"] = "one-channel"
        return kernels.conv_c1(g.ctx, w, x_cf, b)
    cols = causal_im2col(g, x_cf, w, stride, dilation)
    w2 = reshape_2d(g, w, k * cin, cout)
    y = mul_mat(g, cols, w2) if out == "CF" else mul_mat(g, w2, cols)
    return add_bias(g, y, b, out)


def residual_conv(g: Builder, x_cf: Tensor, w: Tensor, dilation: int) -> Tensor:
    """A residual unit's causal dilated conv (stride 1, no bias): CF in, CF out.

    With ``g.conv == "winograd"`` (weights ``[Cin, Cout, n]``): Winograd (winograd.WINOGRAD), with
    ``"taps"`` (weights ``[Cin, Cout, K]``) one GEMM per tap: BLAS GEMMs over the signal in
    place (kernels.py), reading a stream's carried context where causal padding puts zeros.
    Otherwise im2col and one GEMM (``conv1d``), CL out; weights held for those kernels
    (``g.ru_weights``) are first put back in the file's layout (when kernels were switched
    off after loading; from Winograd's, to float32 rounding).
    """
    if g.conv == "im2col":
        g.lowerings["conv"] = "im2col"
        if g.ru_weights == "winograd":
            w = taps_from_winograd(g, w)
        if g.ru_weights in ("taps", "winograd"):  # ne [Cin, Cout, K] -> [K, Cin, Cout]
            w = lib.ggml_cont(g.ctx, lib.ggml_permute(g.ctx, w, 1, 2, 0, 3))
        return conv1d(g, x_cf, w, None, dilation=dilation, out="CL")
    cin, _, k = shape(w)[:3]
    if shape(x_cf)[1] != cin:
        raise ValueError(f"conv expects {cin} input channels, got {shape(x_cf)[1]}")
    g.lowerings["conv"] = g.conv
    if g.conv == "winograd":
        k = WINOGRAD.k

        def conv(x, prev, segments):
            return winograd_conv.conv_wino(g.ctx, w, x, dilation, g.keep, prev, segments=segments)
    else:
        def conv(x, prev, segments):
            return kernels.conv_taps(g.ctx, w, x, k, dilation, g.keep, prev, segments)
    return _in_place(g, x_cf, (k - 1) * dilation, conv)


def taps_from_winograd(g: Builder, u: Tensor) -> Tensor:
    """Per-tap weights ``[Cin, Cout, K]`` from Winograd's ``[Cin, Cout, n]`` (one product by
    the pseudo-inverse of G; float32 rounding)."""
    cin, cout, n = shape(u)[:3]
    ut = lib.ggml_cont(g.ctx, lib.ggml_transpose(g.ctx, reshape_2d(g, u, cin * cout, n)))  # [n, Cin*Cout]
    pinv = g.input("winograd.g_pinv", WINOGRAD.g_pinv.astype(np.float32))  # ne [n, K]
    return lib.ggml_reshape_3d(g.ctx, lib.ggml_mul_mat(g.ctx, ut, pinv), cin, cout, WINOGRAD.k)


def _in_place(g: Builder, x_cf: Tensor, left: int, conv) -> Tensor:
    """``conv(x, prev, segments)`` over CF ``x_cf``: ``prev`` the carried left context of a stream
    (None in one-shot graphs), read in place where causal padding puts ``left`` zeros; in a batched
    step each stream's (``segments``: the streams)."""
    length, c = shape(x_cf)[:2]
    if g.stream is None or not left:
        return conv(x_cf, None, 1)
    if batched(g):  # each stream's context read in place: one conv over all of them
        x_cf = x_cf if lib.ggml_is_contiguous(x_cf) else lib.ggml_cont(g.ctx, x_cf)
        return conv(x_cf, packed.contexts_in_place(g, x_cf, left), g.stream.batch)
    if length >= left:
        return conv(x_cf, context_in_place(g, x_cf, left), 1)
    xc = with_left_context(g, x_cf, left)  # a chunk shorter than the context: concat first
    nb1 = xc.contents.nb[1]
    prev = lib.ggml_view_2d(g.ctx, xc, left, c, nb1, 0)
    return conv(lib.ggml_view_2d(g.ctx, xc, length, c, nb1, left * xc.contents.nb[0]), prev, 1)


def pointwise_taps(g: Builder, x_cf: Tensor, w: Tensor) -> Tensor:
    """Pointwise conv (weight ne ``[1, Cin, Cout]``) by the BLAS: CF in, CF out (with ``g.conv``
    "taps" or "winograd")."""
    cin = shape(x_cf)[1]
    n = int(lib.ggml_nelements(w))
    return kernels.conv_taps(g.ctx, lib.ggml_reshape_3d(g.ctx, w, cin, n // cin, 1), x_cf, 1, 1, g.keep)


def conv1x1(g: Builder, x_cl: Tensor, w: Tensor, b: Tensor | None, *, out: str = "CF") -> Tensor:
    """Pointwise conv, weight ne ``[1, Cin, Cout]`` (or ``[Cin, Cout]``); CL in, ``out`` out."""
    n = int(lib.ggml_nelements(w))
    cin = shape(x_cl)[0]
    w2 = reshape_2d(g, w, cin, n // cin)
    if g.f16_convs and binding.tensor_type(x_cl) != F16:
        x_cl = lib.ggml_cast(g.ctx, x_cl, F16)
    y = mul_mat(g, x_cl, w2) if out == "CF" else mul_mat(g, w2, x_cl)
    return add_bias(g, y, b, out)


def conv_transpose1d(g: Builder, x_cl: Tensor, w: Tensor, b: Tensor | None, *, stride: int) -> Tensor:
    """Causal transposed conv: CL in, CF out; ``K - stride`` samples cropped on the right,
    as upstream's CausalTransConvNet does. Two lowerings (``g.conv_transpose``):

    * ``"col2im"``: ``w`` re-laid at load time to ne ``[Cin, K, Cout]`` so that one GEMM
      gives the columns ``[K*Cout, T]`` (row ``oc*K + k``) that ``col2im_1d`` overlap-adds
      into ``[(T-1)*stride + K, Cout]`` (1.4x faster than ggml's op on CPU; fast on CUDA);
    * ``"ggml"``: ``ggml_conv_transpose_1d`` on the file's layout ne ``[K, Cout, Cin]``
      (for backends without COL2IM_1D, e.g. Metal in ggml 0.15.3).
    """
    if g.conv_transpose == "col2im":
        cin, k, cout = shape(w)[:3]
    else:
        k, cout, cin = shape(w)[:3]
    if shape(x_cl)[0] != cin:
        raise ValueError(f"conv-transpose expects {cin} input channels, got {shape(x_cl)[0]}")
    g.lowerings["conv_transpose"] = g.conv_transpose
    n_out = shape(x_cl)[1] * stride
    if batched(g) and k > stride:
        if g.conv_transpose != "col2im":
            raise ValueError("batched streams need the col2im conv-transpose lowering")
        cols = mul_mat(g, reshape_2d(g, w, cin, k * cout), x_cl)

        def streams(c: Tensor, prev: Tensor) -> Tensor:  # each stream's overlap-add from its own carried tail
            return _kept_overlap_add(g, c, k, stride, shape(c)[1] * stride, b, prev, segments=g.stream.batch)

        kernel = _col2im_kernel(g, cols)
        y = packed.overlap(g, cols, k, stride, cout, lambda c: _col2im(g, c, k, stride, cout),
                           streams if kernel else None)
        return y if kernel else _first_samples(g, y, shape(y)[0], b)
    if g.conv_transpose == "col2im":
        cols = mul_mat(g, reshape_2d(g, w, cin, k * cout), x_cl)
        if g.stream is not None and stride < k <= 2 * stride and _col2im_kernel(g, cols):
            # from the carried overlap (no pad and add of a whole chunk); the samples past n_out
            # are the last column's taps past the stride alone (K <= 2 s): the next chunk's overlap
            name, prev = carry_input(g, (k - stride, cout))
            es = cols.contents.nb[0]
            emit_carry(g, name, lib.ggml_view_2d(g.ctx, cols, k - stride, cout, k * es,
                                                 (stride + (shape(cols)[1] - 1) * shape(cols)[0]) * es))
            return _kept_overlap_add(g, cols, k, stride, n_out, b, prev)
        if g.stream is None and _col2im_kernel(g, cols):
            return _kept_overlap_add(g, cols, k, stride, n_out, b)
        y = _col2im(g, cols, k, stride, cout)
    else:
        y = lib.ggml_conv_transpose_1d(g.ctx, w, transpose(g, x_cl), stride, 0, 1)
    if g.stream is not None and k > stride:
        return add_bias(g, _overlap_tail(g, y, n_out, k - stride), b, "CF")
    return add_bias(g, y, b, "CF") if k == stride else _first_samples(g, y, n_out, b)


def _first_samples(g: Builder, y_cf: Tensor, n: int, b: Tensor | None) -> Tensor:
    """The first ``n`` samples of CF ``y_cf`` plus the bias, contiguous: the bias add reads
    the strided view (no copy of it first)."""
    head = lib.ggml_view_2d(g.ctx, y_cf, n, shape(y_cf)[1], y_cf.contents.nb[1], 0)
    return lib.ggml_cont(g.ctx, head) if b is None else add_bias(g, head, b, "CF")


def _kept_overlap_add(g: Builder, cols: Tensor, k: int, stride: int, n_keep: int, b: Tensor | None,
                      prev: Tensor | None = None, segments: int = 1) -> Tensor:
    """The compiled overlap-add's first ``n_keep`` samples plus the bias, contiguous: the bias
    added in the kernel (no crop or bias pass after it) where it is contiguous F32, else by
    ``add_bias`` after it. ``prev``, ``segments``: as ``kernels.col2im``'s."""
    g.lowerings["col2im"] = "custom"
    in_kernel = b is None or binding.tensor_type(b) == F32 and lib.ggml_is_contiguous(b)
    y = kernels.col2im(g.ctx, cols, k, stride, g.keep, prev, segments=segments, bias=b if in_kernel else None,
                       n_keep=n_keep)
    return y if in_kernel else add_bias(g, y, b, "CF")


def _col2im_kernel(g: Builder, cols: Tensor) -> bool:
    return g.snake_kernel and binding.tensor_type(cols) == F32


def _col2im(g: Builder, cols: Tensor, k: int, stride: int, cout: int) -> Tensor:
    if _col2im_kernel(g, cols):  # the compiled overlap-add (CPU)
        g.lowerings["col2im"] = "custom"
        return kernels.col2im(g.ctx, cols, k, stride, g.keep)
    g.lowerings["col2im"] = "ggml"
    return lib.ggml_col2im_1d(g.ctx, cols, stride, cout, 0)


def left_pad(g: Builder, x_cf: Tensor, n: int) -> Tensor:
    """``n`` zeros before CF ``x_cf`` in time: ``ggml_pad_ext``, or where a backend cannot pad
    on the left (Metal), a concat after a zero input (``g.left_pad == "concat"``)."""
    g.lowerings["left_pad"] = g.left_pad
    if g.left_pad == "pad_ext":
        return lib.ggml_pad_ext(g.ctx, x_cf, n, 0, 0, 0, 0, 0, 0, 0)
    zeros = g.input(f"zeros.{len(g.inputs)}", np.zeros((shape(x_cf)[1], n), np.float32))
    return concat_time(g, zeros, x_cf)


def _overlap_tail(g: Builder, y_cf: Tensor, n_out: int, tail: int) -> Tensor:
    """Streamed conv-transpose: add the previous chunk's overlap tail to this chunk's first
    ``tail`` samples; emit the ``tail`` samples past ``n_out`` (before bias) for the next."""
    cout, nb1 = shape(y_cf)[1], y_cf.contents.nb[1]
    if tail > n_out:
        raise ValueError(f"conv-transpose overlap of {tail} samples exceeds a chunk of {n_out}")
    name, prev = carry_input(g, (tail, cout))
    emit_carry(g, name, lib.ggml_view_2d(g.ctx, y_cf, tail, cout, nb1, n_out * y_cf.contents.nb[0]))
    head = lib.ggml_cont(g.ctx, lib.ggml_view_2d(g.ctx, y_cf, n_out, cout, nb1, 0))
    if tail < n_out:
        prev = lib.ggml_pad_ext(g.ctx, prev, 0, n_out - tail, 0, 0, 0, 0, 0, 0)
    return add(g, head, prev)


def depthwise_conv1d(g: Builder, x_cf: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """Causal depthwise conv (stride 1), weight ne ``[K, 1, C]``: CF in, CL out. ``ggml_ssm_conv``
    in f32; in s2cpp ``ggml_conv_1d_dw`` on the F16 kernel, as the C++ engine (its sums differ)."""
    k = shape(w)[0]
    c = shape(x_cf)[1]
    if g.stream is not None and k > 1:
        padded = with_left_context(g, x_cf, k - 1)
    else:
        padded = left_pad(g, x_cf, k - 1)
    if g.f16_convs:  # the C++ engine's op: F16 im2col columns . the F16 kernel, per channel
        g.lowerings["depthwise"] = "conv_1d_dw"
        padded = padded if lib.ggml_is_contiguous(padded) else lib.ggml_cont(g.ctx, padded)
        y_cf = lib.ggml_conv_1d_dw(g.ctx, w, padded, 1, 0, 1)  # ne [L, C, 1]
        y_cf = reshape_2d(g, y_cf, shape(x_cf)[0], c)
        return transpose(g, add_bias(g, y_cf, b, "CF"))
    g.lowerings["depthwise"] = "ssm_conv"
    padded = lib.ggml_reshape_3d(g.ctx, padded, shape(padded)[0], c, 1)
    y = lib.ggml_ssm_conv(g.ctx, padded, reshape_2d(g, w, k, c))
    y = reshape_2d(g, y, c, shape(x_cf)[0])
    return add_bias(g, y, b, "CL")

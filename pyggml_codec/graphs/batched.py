"""The streamed ops of a batched step (``ops.Carry.batch``): several streams in turn along time,
CF ``[n * B, C]``, each with its own carried context, overlap tail and outputs (``convs.py``
calls these where a batched graph differs from one stream's)."""

from __future__ import annotations

from ..backend import binding
from ..backend.binding import lib
from .carry import carry_input, emit_carry
from .ops import F16, F32, Builder, Tensor, add, add_bias, reshape_2d, shape


def context(g: Builder, x_cf: Tensor, left: int) -> Tensor:
    """Batched streams: each stream's carried ``left`` samples before its own, ``[left + n, B, C]``
    from packed CF ``x_cf`` ``[n * B, C]``; emits each stream's last ``left`` as its next."""
    b, (length, c) = g.stream.batch, shape(x_cf)[:2]
    x_cf = x_cf if lib.ggml_is_contiguous(x_cf) else lib.ggml_cont(g.ctx, x_cf)
    x3 = lib.ggml_reshape_3d(g.ctx, x_cf, length // b, b, c)
    name, prev = carry_input(g, (left, b, c), stream_dim=1)
    xc = lib.ggml_concat(g.ctx, prev, x3, 0)  # threads split ne2 = C
    nb = xc.contents.nb
    emit_carry(g, name, lib.ggml_view_3d(g.ctx, xc, left, b, c, nb[1], nb[2], (length // b) * nb[0]))
    return xc


def contexts_in_place(g: Builder, x_cf: Tensor, left: int) -> Tensor:
    """Batched streams: the carried ``left`` samples of each stream, ``[left, B, C]``, for a kernel
    that reads them in place (the signal is not copied); emits each stream's last ``left`` samples
    of context-then-signal as its next context (its own last ``left`` when ``n >= left``)."""
    b, (length, c) = g.stream.batch, shape(x_cf)[:2]
    n = length // b
    x3 = lib.ggml_reshape_3d(g.ctx, x_cf, n, b, c)
    name, prev = carry_input(g, (left, b, c), stream_dim=1)
    nb = x3.contents.nb
    if n >= left:
        emit_carry(g, name, lib.ggml_view_3d(g.ctx, x3, left, b, c, nb[1], nb[2], (n - left) * nb[0]))
    else:  # the older context's last left - n samples, then the whole chunk
        pb = prev.contents.nb
        kept = lib.ggml_view_3d(g.ctx, prev, left - n, b, c, pb[1], pb[2], n * pb[0])
        emit_carry(g, name, lib.ggml_concat(g.ctx, kept, x3, 0))
    return prev


def columns(g: Builder, cols: Tensor, seg: int, n: int) -> Tensor:
    """Of ``cols`` ``[R, (B - 1) * seg + n]``, each segment of ``seg``'s first ``n``: ``[R, n * B]``."""
    b, rows, nb = g.stream.batch, shape(cols)[0], cols.contents.nb
    v = lib.ggml_view_3d(g.ctx, cols, rows, n, b, nb[1], seg * nb[1], 0)
    return reshape_2d(g, lib.ggml_cont(g.ctx, v), rows, n * b)


def conv_columns(g: Builder, x_cf: Tensor, left: int, im2col) -> Tensor:
    """Columns of a stride-1 causal conv in a batched step: ``im2col(x)`` (no padding) over each
    stream's carried context then its own samples; only each stream's own outputs are kept."""
    if not left:
        return im2col(x_cf)
    b, (length, c) = g.stream.batch, shape(x_cf)[:2]
    seg = left + length // b
    return columns(g, im2col(reshape_2d(g, context(g, x_cf, left), seg * b, c)), seg, length // b)


def overlap(g: Builder, cols: Tensor, k: int, stride: int, cout: int, col2im, col2im_streams=None) -> Tensor:
    """Overlap-add of a batched step's conv-transpose columns ``[K*Cout, n * B]``, CF
    ``[n * stride * B, Cout]``: ``col2im_streams(cols, prev)`` where given (each stream's columns
    overlap-added alone from its carried tail ``prev``, ``[K - stride, Cout, 1, B]``; a view of its
    rows, not copied); else col2im of all, then each stream's first K - stride samples (holding the
    previous stream's overlap) set to its own first taps plus its carried tail, as
    ``convs._overlap_tail`` adds."""
    b, (rows, t) = g.stream.batch, shape(cols)[:2]
    n, tail, es = t // b, k - stride, cols.contents.nb[0]
    if tail > stride:
        raise ValueError(f"batched conv-transpose needs kernel <= 2 x stride, got {k} and {stride}")

    def taps(first: int, col: int) -> Tensor:  # taps first..first+tail of each stream's column col
        return lib.ggml_view_4d(g.ctx, cols, tail, cout, 1, b, k * es, rows * es, n * rows * es,
                                (first + col * rows) * es)

    name, prev = carry_input(g, (tail, cout, 1, b), stream_dim=3)
    emit_carry(g, name, taps(stride, n - 1))
    if col2im_streams is not None:
        y = col2im_streams(cols, prev)
        return lib.ggml_view_2d(g.ctx, y, n * stride * b, cout, y.contents.nb[1], 0)
    y = col2im(cols)  # [(n B - 1) stride + K, Cout]
    first = lib.ggml_permute(g.ctx, add(g, taps(0, 0), prev), 0, 2, 3, 1)  # [tail, B, Cout]
    y = lib.ggml_set_inplace(g.ctx, y, first, n * stride * y.contents.nb[0], y.contents.nb[1], y.contents.nb[2], 0)
    return lib.ggml_cont(g.ctx, lib.ggml_view_2d(g.ctx, y, n * stride * b, cout, y.contents.nb[1], 0))


def depthwise_conv1d(g: Builder, x_cf: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """:func:`depthwise_conv1d` of a batched step, each stream after its carried context:
    ``ggml_ssm_conv`` with the streams as its sequences; in "s2cpp" ``ggml_conv_1d_dw`` over the
    streams' channels side by side (the kernel repeated per stream), as one stream computes it."""
    k, c = shape(w)[0], shape(x_cf)[1]
    n_b = g.stream.batch
    padded = lib.ggml_cont(g.ctx, lib.ggml_permute(g.ctx, context(g, x_cf, k - 1), 0, 2, 1, 3))  # [k-1+n, C, B]
    if g.f16_convs:
        length = shape(padded)[0]
        w_rep = lib.ggml_repeat(g.ctx, w, lib.ggml_new_tensor_3d(g.ctx, binding.tensor_type(w), k, 1, c * n_b))
        y = lib.ggml_conv_1d_dw(g.ctx, w_rep, reshape_2d(g, padded, length, c * n_b), 1, 0, 1)  # [n, C*B]
        y = lib.ggml_reshape_3d(g.ctx, y, length - k + 1, c, n_b)
        y = lib.ggml_cont(g.ctx, lib.ggml_permute(g.ctx, y, 1, 0, 2, 3))  # [C, n, B]
        return add_bias(g, reshape_2d(g, y, c, shape(x_cf)[0]), b, "CL")
    if binding.tensor_type(w) != F32:  # ssm_conv reads an F32 kernel (an F16 one upcasts exactly)
        w = lib.ggml_cast(g.ctx, w, F32)
    y = lib.ggml_ssm_conv(g.ctx, padded, reshape_2d(g, w, k, c))  # [C, n, B]
    return add_bias(g, reshape_2d(g, y, c, shape(x_cf)[0]), b, "CL")

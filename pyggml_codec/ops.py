"""Typed graph helpers: the few ggml ops the codec is made of.

Layouts. Activations are 2-D and live in one of two layouts, named in numpy order:

* ``CF`` (channels first): numpy ``(C, T)``, ggml ``ne = [T, C]``; time is contiguous.
  What ``im2col`` reads and ``col2im_1d`` writes; the layout of the conv stacks.
* ``CL`` (channels last): numpy ``(T, C)``, ggml ``ne = [C, T]``; channels contiguous.
  What ``mul_mat`` against a weight matrix reads and writes; the transformers' layout.

A GEMM picks its output layout by operand order: ``mul_mat(W, cols)`` gives CL,
``mul_mat(cols, W)`` gives CF. Helpers say in their names and docstrings which layout
they take and give, so that a transpose is only ever written on purpose.

Precision. In ``"f32"`` mode every conv reads an F32 im2col and F32 weights (exact to
about 1e-7). In ``"s2cpp"`` mode conv inputs are rounded to F16 and conv weights are F16,
as ``ggml_conv_1d``/``ggml_conv_1d_dw`` compute in the C++ engine; conv-transposes stay F32
there too. Argument orders below follow ``ggml.h``, not the binding's docstrings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _ggml, kernels
from ._ggml import lib

F32, F16, I32 = _ggml.TYPE_F32, _ggml.TYPE_F16, _ggml.TYPE_I32
MASKED = -1e9  # the C++ engine's fill value for masked attention scores

Tensor = Any  # a ggml tensor pointer


@dataclass
class Carry:
    """What a graph built for one chunk of a stream carries from chunk to chunk.

    Every stateful op reads its state from an input named ``carry.N`` (N in build order,
    so the same model built for any chunk length names its states alike) and writes the
    state for the next chunk to the output of the same name. The build-time value, zeros,
    is the causal zero padding: a stream's first chunk needs no special case.
    ``clocks`` maps each transformer's positions input to ``(mask input, n, window)``: the
    driver feeds positions p0..p0+n-1 and :func:`history_mask` for each chunk.
    """

    inputs: dict[str, Tensor] = field(default_factory=dict)
    outputs: dict[str, Tensor] = field(default_factory=dict)
    clocks: dict[str, tuple[str, int, int]] = field(default_factory=dict)


@dataclass
class Builder:
    """The state of one graph under construction: its context, its inputs, its choices.

    ``inputs`` pairs every input tensor with the host array uploaded before each compute
    (the allocator may reuse an input's memory once consumed, so all are re-uploaded).
    """

    ctx: Any
    precision: str = "f32"
    explicit_causal_mask: bool = False
    keep_stages: bool = False
    inputs: list[tuple[Tensor, np.ndarray]] = field(default_factory=list)
    stages: dict[str, Tensor] = field(default_factory=dict)
    lowerings: dict[str, str] = field(default_factory=dict)
    stream: Carry | None = None  # set: build one chunk of a stream (see Carry)
    snake_kernel: bool = False  # use the compiled Snake custom op (CPU backend only)
    im2col_kernel: bool = False  # use the compiled im2col custom op (CPU backend only)
    keep: list = field(default_factory=list)  # host memory custom ops read while the graph lives
    conv_transpose: str = "col2im"  # or "ggml" (ggml_conv_transpose_1d on the file's layout)
    left_pad: str = "pad_ext"  # or "concat" (backends without left padding)

    @property
    def f16_convs(self) -> bool:
        return self.precision == "s2cpp"

    def input(self, name: str, array: np.ndarray, ggml_type: int = F32) -> Tensor:
        """A graph input holding ``array`` (numpy order), uploaded before every compute."""
        array = np.ascontiguousarray(array, dtype=_ggml.NP_DTYPES[ggml_type])
        t = new_tensor(self.ctx, ggml_type, tuple(reversed(array.shape)))
        _ggml.set_name(t, name)
        lib.ggml_set_input(t)
        self.inputs.append((t, array))
        return t

    def mark(self, name: str, t: Tensor) -> Tensor:
        """Name a stage-boundary tensor; with ``keep_stages`` keep it as an output (dumps).

        Kept stages cannot share memory with later tensors, so graphs built for normal
        calls keep none.
        """
        if self.keep_stages:
            _ggml.set_name(t, name)
            lib.ggml_set_output(t)
            self.stages[name] = t
        return t


def new_tensor(ctx: Any, ggml_type: int, ne: tuple[int, ...]) -> Tensor:
    ne = tuple(int(d) for d in ne)
    if not 1 <= len(ne) <= 4 or any(d <= 0 for d in ne):
        raise ValueError(f"bad tensor shape ne={list(ne)}")
    makers = (lib.ggml_new_tensor_1d, lib.ggml_new_tensor_2d, lib.ggml_new_tensor_3d, lib.ggml_new_tensor_4d)
    return makers[len(ne) - 1](ctx, ggml_type, *ne)


def shape(t: Tensor) -> tuple[int, ...]:
    """ggml ``ne`` of ``t`` (always 4 entries)."""
    return tuple(int(t.contents.ne[i]) for i in range(4))


def reshape_2d(g: Builder, t: Tensor, n0: int, n1: int) -> Tensor:
    if n0 * n1 != int(lib.ggml_nelements(t)):
        raise ValueError(f"reshape of {list(shape(t))} to [{n0}, {n1}]")
    return lib.ggml_reshape_2d(g.ctx, t, n0, n1)


def mul_mat(g: Builder, a: Tensor, b: Tensor) -> Tensor:
    """ggml_mul_mat(a, b) -> ne [a.ne1, b.ne1, ...], contracting ne0; shapes checked first."""
    sa, sb = shape(a), shape(b)
    if sa[0] != sb[0] or sb[2] % sa[2] or sb[3] % sa[3]:
        raise ValueError(f"mul_mat of ne {list(sa)} and {list(sb)}")
    if _ggml.tensor_type(a) == F32 and _ggml.tensor_type(b) == F16:
        raise ValueError("mul_mat with F32 src0 and F16 src1 is not supported by ggml")
    return lib.ggml_mul_mat(g.ctx, a, b)


def _check_broadcast(op: str, a: Tensor, b: Tensor) -> None:
    sa, sb = shape(a), shape(b)
    if any(x % y for x, y in zip(sa, sb)):
        raise ValueError(f"{op} cannot broadcast ne {list(sb)} onto {list(sa)}")


def transpose(g: Builder, x: Tensor) -> Tensor:
    """CF <-> CL (a real copy)."""
    return lib.ggml_cont(g.ctx, lib.ggml_transpose(g.ctx, x))


def first_columns(g: Builder, x: Tensor, n: int) -> Tensor:
    """View of the first ``n`` entries along ne1 of a 2-D tensor (contiguous prefix)."""
    ne0, ne1 = shape(x)[:2]
    if n > ne1:
        raise ValueError(f"view of {n} columns from a tensor of {ne1}")
    return lib.ggml_view_2d(g.ctx, x, ne0, n, x.contents.nb[1], 0)


def channel_vector(g: Builder, v: Tensor, layout: str) -> Tensor:
    """A per-channel weight (any shape with C elements) shaped to broadcast in ``layout``."""
    n = int(lib.ggml_nelements(v))
    return reshape_2d(g, v, 1, n) if layout == "CF" else reshape_2d(g, v, n, 1)


def add_bias(g: Builder, x: Tensor, b: Tensor | None, layout: str) -> Tensor:
    if b is None:
        return x
    return add(g, x, channel_vector(g, b, layout))


def snake(g: Builder, x: Tensor, alpha: Tensor, layout: str) -> Tensor:
    """Snake: x + sin(alpha x)^2 / alpha, alpha per channel (the C++ engine's form: no 1e-9).

    On the CPU backend one custom op (kernels.py) when available; elsewhere the 5-op chain
    (CUDA and Vulkan fuse it).
    """
    a = channel_vector(g, alpha, layout)
    if g.snake_kernel and _ggml.tensor_type(x) == F32 == _ggml.tensor_type(a) and lib.ggml_is_contiguous(x):
        g.lowerings["snake"] = "custom"
        return kernels.snake(g.ctx, x, a)
    g.lowerings["snake"] = "chain"
    s = lib.ggml_sqr(g.ctx, lib.ggml_sin(g.ctx, mul(g, x, a)))
    return lib.ggml_add(g.ctx, x, lib.ggml_div(g.ctx, s, a))


def carry_input(g: Builder, ne: tuple[int, ...]) -> tuple[str, Tensor]:
    """The next carried-state input of a streamed graph, ggml shape ``ne`` (zeros at build)."""
    name = f"carry.{len(g.stream.inputs)}"
    t = g.input(name, np.zeros(tuple(reversed(ne)), np.float32))
    g.stream.inputs[name] = t
    return name, t


def emit_carry(g: Builder, name: str, t: Tensor) -> None:
    """Make (a copy of) ``t`` the output holding state ``name`` for the next chunk."""
    g.stream.outputs[name] = lib.ggml_cont(g.ctx, t)


def concat_time(g: Builder, a_cf: Tensor, b_cf: Tensor) -> Tensor:
    """CF ``[La, C]`` then ``[Lb, C]`` along time, as 3-D ``[L, 1, C]`` so CPU threads split C."""
    parts = []
    for t in (a_cf, b_cf):
        t = t if lib.ggml_is_contiguous(t) else lib.ggml_cont(g.ctx, t)
        parts.append(lib.ggml_reshape_3d(g.ctx, t, shape(t)[0], 1, shape(t)[1]))
    y = lib.ggml_concat(g.ctx, parts[0], parts[1], 0)
    return reshape_2d(g, y, shape(y)[0], shape(y)[2])


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
    if left:
        x_cf = with_left_context(g, x_cf, left)
    if extra:
        x_cf = lib.ggml_pad_ext(g.ctx, x_cf, 0, extra, 0, 0, 0, 0, 0, 0)
    return im2col(g, w, x_cf, stride, 0, dilation)


def _conv_input_type(g: Builder) -> int:
    return F16 if g.f16_convs else F32


def im2col(g: Builder, w: Tensor, x_cf: Tensor, stride: int, pad: int, dilation: int) -> Tensor:
    """1-D im2col of CF ``x_cf`` for kernel ``w`` (ne ``[K, Cin, ...]``), ``pad`` zeros each side:
    ne ``[K*Cin, OW]``. The compiled kernel on CPU (same values), ggml_im2col elsewhere."""
    k, length = shape(w)[0], shape(x_cf)[0]
    n_out = (length + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    if n_out < 1:
        raise ValueError(f"conv input of {length} samples is shorter than its kernel ({k}, dilation {dilation})")
    dst_type = _conv_input_type(g)
    if g.im2col_kernel and kernels.im2col_supported(dst_type, k) and _ggml.tensor_type(x_cf) == F32:
        x_cf = x_cf if lib.ggml_is_contiguous(x_cf) else lib.ggml_cont(g.ctx, x_cf)
        g.lowerings["im2col"] = "custom"
        return kernels.im2col(g.ctx, x_cf, k, stride, dilation, pad, n_out, dst_type, g.keep)
    if dst_type == F16 and _ggml.tensor_type(w) != F16:
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


def conv1d(g: Builder, x_cf: Tensor, w: Tensor, b: Tensor | None, *, stride: int = 1,
           dilation: int = 1, out: str = "CF") -> Tensor:
    """Causal conv, weight ne ``[K, Cin, Cout]``; CF in, ``out`` layout out."""
    k, cin, cout = shape(w)[:3]
    cols = causal_im2col(g, x_cf, w, stride, dilation)
    w2 = reshape_2d(g, w, k * cin, cout)
    y = mul_mat(g, cols, w2) if out == "CF" else mul_mat(g, w2, cols)
    return add_bias(g, y, b, out)


def conv1x1(g: Builder, x_cl: Tensor, w: Tensor, b: Tensor | None, *, out: str = "CF") -> Tensor:
    """Pointwise conv, weight ne ``[1, Cin, Cout]`` (or ``[Cin, Cout]``); CL in, ``out`` out."""
    n = int(lib.ggml_nelements(w))
    cin = shape(x_cl)[0]
    w2 = reshape_2d(g, w, cin, n // cin)
    if g.f16_convs:
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
    if g.conv_transpose == "col2im":
        cols = mul_mat(g, reshape_2d(g, w, cin, k * cout), x_cl)
        y = lib.ggml_col2im_1d(g.ctx, cols, stride, cout, 0)
    else:
        y = lib.ggml_conv_transpose_1d(g.ctx, w, transpose(g, x_cl), stride, 0, 1)
    n_out = shape(x_cl)[1] * stride
    if g.stream is not None and k > stride:
        y = _overlap_tail(g, y, n_out, k - stride)
    else:
        y = y if k == stride else lib.ggml_cont(g.ctx, lib.ggml_view_2d(g.ctx, y, n_out, cout, y.contents.nb[1], 0))
    return add_bias(g, y, b, "CF")


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
    """Causal depthwise conv (stride 1), weight ne ``[K, 1, C]``: CF in, CL out (ssm_conv)."""
    k = shape(w)[0]
    c = shape(x_cf)[1]
    if g.f16_convs:  # ggml_conv_1d_dw rounds its input to F16
        x_cf = lib.ggml_cast(g.ctx, lib.ggml_cast(g.ctx, x_cf, F16), F32)
    if g.stream is not None and k > 1:
        padded = with_left_context(g, x_cf, k - 1)
    else:
        padded = left_pad(g, x_cf, k - 1)
    padded = lib.ggml_reshape_3d(g.ctx, padded, shape(padded)[0], c, 1)
    y = lib.ggml_ssm_conv(g.ctx, padded, reshape_2d(g, w, k, c))
    y = reshape_2d(g, y, c, shape(x_cf)[0])
    return add_bias(g, y, b, "CL")


def linear(g: Builder, x_cl: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """x @ W.T (+ b), weight ne ``[in, out]``: CL in, CL out."""
    return add_bias(g, mul_mat(g, w, x_cl), b, "CL")


def layer_norm(g: Builder, x_cl: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
    y = mul(g, lib.ggml_norm(g.ctx, x_cl, eps), channel_vector(g, w, "CL"))
    return add(g, y, channel_vector(g, b, "CL"))


def rms_norm(g: Builder, x_cl: Tensor, w: Tensor, eps: float) -> Tensor:
    return mul(g, lib.ggml_rms_norm(g.ctx, x_cl, eps), channel_vector(g, w, "CL"))


def scale_channels(g: Builder, x_cl: Tensor, gamma: Tensor) -> Tensor:
    return mul(g, x_cl, channel_vector(g, gamma, "CL"))


def add(g: Builder, a: Tensor, b: Tensor) -> Tensor:
    _check_broadcast("add", a, b)
    return lib.ggml_add(g.ctx, a, b)


def mul(g: Builder, a: Tensor, b: Tensor) -> Tensor:
    _check_broadcast("mul", a, b)
    return lib.ggml_mul(g.ctx, a, b)


def gelu(g: Builder, x: Tensor) -> Tensor:
    return lib.ggml_gelu_erf(g.ctx, x)


def silu_mul(g: Builder, gate: Tensor, up: Tensor) -> Tensor:
    return mul(g, lib.ggml_silu(g.ctx, gate), up)


def tanh(g: Builder, x: Tensor) -> Tensor:
    return lib.ggml_tanh(g.ctx, x)


def get_rows(g: Builder, table: Tensor, ids: Tensor) -> Tensor:
    return lib.ggml_get_rows(g.ctx, table, ids)


def window_mask(n_query: int, n_key: int, window: int, offset: int = 0) -> np.ndarray:
    """Attention mask, numpy ``(n_query, n_key)``: 0 where query q may see key k, else -1e9.

    Query q sits at absolute position ``offset + q`` and key k at position k; it sees keys
    in ``[pos - window + 1, pos]`` (all earlier keys when ``window`` <= 0).
    """
    q = np.arange(n_query)[:, None] + offset
    k = np.arange(n_key)[None, :]
    visible = k <= q
    if window > 0:
        visible &= k >= q - window + 1
    return np.where(visible, 0.0, MASKED).astype(np.float32)

"""Typed graph helpers: the graph builder and the few ggml ops the codec is made of
(the convolutions are in convs.py).

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

from ..backend import binding, kernels
from ..backend.binding import lib, new_tensor  # noqa: F401  (new_tensor: part of the op helpers)
from ..backend.ggml_graph import BOUND_ROWS

F32, F16, I32, I64 = binding.TYPE_F32, binding.TYPE_F16, binding.TYPE_I32, binding.TYPE_I64
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
    # Streams in one graph (a batched step, batching.py): each stream's n steps packed
    # in turn along time, CF ``[n * batch, C]`` / CL ``[C, n * batch]``; state inputs carry a
    # stream axis, ``batch_axes`` (numpy axis by input name).
    batch: int = 1
    batch_axes: dict[str, int] = field(default_factory=dict)
    # States whose output holds only the chunk's new entries (attention keys and values): the
    # driver appends them along this numpy axis of one stream's state and keeps its length.
    appended: dict[str, int] = field(default_factory=dict)
    # Streamed attention in the "arena" lowering (``Builder.kv``): per transformer, by its
    # positions input, where its layers' keys and values live (see KVArena)
    kv: dict[str, "KVArena"] = field(default_factory=dict)


@dataclass
class KVArena:
    """The keys and values of one streamed transformer's layers, kept by the driver in host
    memory that the graph reads and writes in place (``Builder.bound``): per leaf, rows of
    ``width`` floats, one row per position of a stream. Each chunk the graph writes its
    ``n`` new rows per stream at the rows the ``write`` input lists (``ggml_set_rows``), then
    gathers each stream's ``window - 1`` carried rows and its new ones, in time order, from the
    rows the ``read`` input lists (``ggml_get_rows``). One stream's graph (``gather`` False) is
    lent just its window and the rows after it, in which it writes its rows at the end: no gather.
    With ``first`` (the CPU kernels, ``f32``), one op reads every stream's window where it lies,
    from the row the ``first`` input gives: no gather either."""

    write: str
    read: str | None
    n: int  # new positions per stream
    hist: int  # carried positions per stream: window - 1
    width: int
    gather: bool  # several streams (a batched step): gather each one's window
    first: str | None = None  # fused attention (arena_attention.window_attention): the input of each stream's first row
    leaves: list[str] = field(default_factory=list)  # bound inputs (Builder.bound_input), one per layer and k / v
    indices: tuple = ()  # the write and read input tensors


class Choices(dict):
    """Lowerings used, op -> choice: a second, different choice for an op is kept beside the
    first ("blas+ggml"), so that a report over several graphs (or several convs of one) shows
    every formulation that ran, not the last one. Non-string values (summaries) are replaced."""

    def __setitem__(self, key, value) -> None:
        old = self.get(key)
        if isinstance(old, str) and isinstance(value, str) and old != value:
            value = "+".join(sorted(set(old.split("+")) | set(value.split("+"))))
        super().__setitem__(key, value)

    def update(self, other=(), **kw) -> None:  # type: ignore[override]
        for key, value in dict(other, **kw).items():
            self[key] = value


@dataclass
class Builder:
    """The state of one graph under construction: its context, its inputs, its choices.

    ``inputs`` pairs every input tensor with the host array uploaded before each compute
    (the allocator may reuse an input's memory once consumed, so all are re-uploaded).
    """

    ctx: Any
    f16_convs: bool = False  # "s2cpp": conv inputs rounded to F16 and conv weights F16, as the C++ engine
    explicit_causal_mask: bool = False
    keep_stages: bool = False
    inputs: list[tuple[Tensor, np.ndarray]] = field(default_factory=list)
    stages: dict[str, Tensor] = field(default_factory=dict)
    lowerings: Choices = field(default_factory=Choices)
    stream: Carry | None = None  # set: build one chunk of a stream (see Carry)
    snake_kernel: bool = False  # use the compiled Snake custom op (CPU backend only)
    exact_kernels: bool = False  # "s2cpp": the kernels' exact build (ggml's values), else ggml's ops
    im2col_kernel: bool = False  # use the compiled im2col custom op (CPU backend only)
    keep: list = field(default_factory=list)  # host memory custom ops read while the graph lives
    conv_transpose: str = "col2im"  # or "ggml" (ggml_conv_transpose_1d on the file's layout)
    left_pad: str = "pad_ext"  # or "concat" (backends without left padding)
    attention: str = "full"  # or "blocked": windowed attention in blocks; "fused": one compiled op (transformer.py)
    matmul: str = "ggml"  # or "blas": F32 products by the BLAS kernel (CPU backend only)
    conv: str = "im2col"  # residual-unit convs as a BLAS GEMM per tap ("taps") or by Winograd
    # F(4,7) ("winograd"), over the signal in place (CPU, f32)
    ru_weights: str = "conv"  # layout of the residual-unit conv weights: "conv", "taps", "winograd"
    quantized: str = "native"  # products with a quantized weight: ggml's quantized kernel ("native",
    # activations quantized too) or the weight dequantized in the graph, an F32 product ("dequantize")
    kv: str = "concat"  # streamed attention's keys and values: state inputs concatenated with the
    # chunk's ("concat") or rows of a host arena read and written in place ("arena", CPU; KVArena)
    bound: dict[str, Tensor] = field(default_factory=dict)  # leaves whose memory a run lends (CPU)
    attention_kernel: bool = False  # "arena" attention in one compiled op (arena_attention.py)

    def input(self, name: str, array: np.ndarray, ggml_type: int = F32) -> Tensor:
        """A graph input holding ``array`` (numpy order), uploaded before every compute."""
        array = np.ascontiguousarray(array, dtype=binding.NP_DTYPES[ggml_type])
        t = new_tensor(self.ctx, ggml_type, tuple(reversed(array.shape)))
        binding.set_name(t, name)
        lib.ggml_set_input(t)
        self.inputs.append((t, array))
        return t

    def bound_input(self, name: str, width: int, rows: int = BOUND_ROWS) -> Tensor:
        """A leaf of ``rows`` F32 rows of ``width`` whose memory each run lends
        (``Graph.run(bound=...)``), read and written in place. Where the row count is the lent
        array's, the shape says :data:`BOUND_ROWS`, and row indices are checked by the driver,
        not by ggml."""
        t = new_tensor(self.ctx, F32, (width, rows))
        binding.set_name(t, name)
        self.bound[name] = t
        return t

    def mark(self, name: str, t: Tensor) -> Tensor:
        """Name a stage-boundary tensor; with ``keep_stages`` keep it as an output (dumps).

        Kept stages cannot share memory with later tensors, so graphs built for normal
        calls keep none.
        """
        if self.keep_stages:
            binding.set_name(t, name)
            lib.ggml_set_output(t)
            self.stages[name] = t
        return t


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
    if binding.tensor_type(a) == F32 and binding.tensor_type(b) == F16:
        raise ValueError("mul_mat with F32 src0 and F16 src1 is not supported by ggml")
    kind = None
    rowdot = g.matmul == "blas" and kernels.mul_mat_rowdot_supported(a, b)
    if binding.tensor_type(a) in binding.QUANT_TYPES:
        kind = binding.QUANT_TYPES[binding.tensor_type(a)]
        if g.quantized != "dequantize":
            rowdot = False  # "native": ggml's quantized kernel, below
        else:
            kind = f"{kind}-dequantized"
            # Q8_0 rows are dequantized in the row products' registers: the values of an F32 copy, the
            # same sums, without writing and reading that copy (a streamed chunk's whole cost). Else a
            # transient F32 copy: F32 activations, the BLAS on the CPU.
            if not rowdot:
                a = lib.ggml_cast(g.ctx, a, F32)
                rowdot = g.matmul == "blas" and kernels.mul_mat_rowdot_supported(a, b)
    if kind is not None:
        g.lowerings["quantized"] = kind
    if rowdot:
        g.lowerings["matmul"] = "rowdot"  # Choices keeps every choice that ran
        return kernels.mul_mat_rowdot(g.ctx, a, b, g.keep)
    if not g.f16_convs and binding.tensor_type(a) == F16 and binding.tensor_type(b) == F32:
        # an F16 matrix held as stored (plan "matrices") without the row-product kernel, e.g. with the
        # compiled kernels switched off: upcast in the graph (exact), since ggml's F16 product would
        # round the activations to F16
        a = lib.ggml_cast(g.ctx, a, F32)
        g.lowerings["matrices"] = "stored-upcast"
    if g.exact_kernels and g.snake_kernel and kernels.mul_mat_f16dot_supported(a, b):
        g.lowerings["matmul"] = "f16dot"  # ggml's F16 product, its values, in register blocks
        return kernels.mul_mat_f16dot(g.ctx, a, b, g.keep)
    blas = g.matmul == "blas" and kernels.mul_mat_blas_supported(a, b)
    g.lowerings["matmul"] = "blas" if blas else "ggml"
    return kernels.mul_mat_blas(g.ctx, a, b) if blas else lib.ggml_mul_mat(g.ctx, a, b)


def _check_broadcast(op: str, a: Tensor, b: Tensor) -> None:
    sa, sb = shape(a), shape(b)
    if any(x % y for x, y in zip(sa, sb)):
        raise ValueError(f"{op} cannot broadcast ne {list(sb)} onto {list(sa)}")


def transpose(g: Builder, x: Tensor) -> Tensor:
    """CF <-> CL (a real copy); a compiled blocked copy on the CPU (same values)."""
    if _kernel_ready(g, x) and shape(x)[2:] == (1, 1):
        g.lowerings["transpose"] = "custom"
        return kernels.transpose(g.ctx, x)
    g.lowerings["transpose"] = "ggml"
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
    """x plus a per-channel bias; one compiled pass on the CPU (same values)."""
    if b is None:
        return x
    bv = channel_vector(g, b, layout)
    sx, sb = tuple(shape(x)), tuple(shape(bv))
    per_row = sb == (1, sx[1], 1, 1) and sx[1] > 1 and sx[2:] == (1, 1)  # CF: one value per row
    per_column = sb == (sx[0], 1, 1, 1) and sx[0] > 1  # CL: one per column of each row
    if (per_row or per_column) and _kernel_ready(g, bv) and _kernel_ready_rows(g, x):
        g.lowerings["add_bias"] = "custom-exact" if g.exact_kernels else "custom"
        return kernels.add_bias(g.ctx, x, bv, g.exact_kernels)
    return add(g, x, bv)


_NOT_OVERWRITTEN = (lib.GGML_OP_NONE, lib.GGML_OP_VIEW, lib.GGML_OP_RESHAPE, lib.GGML_OP_PERMUTE, lib.GGML_OP_TRANSPOSE)


def may_overwrite(t: Tensor) -> bool:
    """Whether an op may write its result over ``t``, given that the caller reads ``t`` no more:
    a tensor that an op computed, not a leaf (weights, inputs, carried states), not a view of
    another tensor, and not a graph input or output (a kept stage)."""
    flags = lib.GGML_TENSOR_FLAG_INPUT | lib.GGML_TENSOR_FLAG_OUTPUT
    return int(t.contents.op) not in _NOT_OVERWRITTEN and not int(t.contents.flags) & flags


def snake(g: Builder, x: Tensor, alpha: Tensor, layout: str, last_use: bool = False) -> Tensor:
    """Snake: x + sin(alpha x)^2 / alpha, alpha per channel (the C++ engine's form: no 1e-9).

    On the CPU backend one custom op (kernels.py) when available; elsewhere the 5-op chain
    (CUDA and Vulkan fuse it). ``last_use``: nothing reads ``x`` after this op, so the kernel
    may write over it (``may_overwrite``; the same values).
    """
    a = channel_vector(g, alpha, layout)
    if _kernel_ready(g, x, a):
        g.lowerings["snake"] = "custom-exact" if g.exact_kernels else "custom"
        return kernels.snake(g.ctx, x, a, g.exact_kernels, last_use and may_overwrite(x))
    g.lowerings["snake"] = "chain"
    s = lib.ggml_sqr(g.ctx, lib.ggml_sin(g.ctx, mul(g, x, a)))
    return lib.ggml_add(g.ctx, x, lib.ggml_div(g.ctx, s, a))


def _kernel_ready(g: Builder, *tensors: Tensor) -> bool:
    usable = g.snake_kernel and (kernels.EXACT_AVAILABLE or not g.exact_kernels)
    return usable and all(binding.tensor_type(t) == F32 and lib.ggml_is_contiguous(t) for t in tensors)


def _kernel_ready_rows(g: Builder, x: Tensor) -> bool:
    """``_kernel_ready`` for a contiguous ``x``, or a 2-D one whose rows are contiguous (a view of
    some columns of each row, read in place by the kernels that take a row stride)."""
    if lib.ggml_is_contiguous(x):
        return _kernel_ready(g, x)
    return (_kernel_ready(g) and binding.tensor_type(x) == F32 and kernels.rows_contiguous(x)
            and shape(x)[2:] == (1, 1))


def bias_snake(g: Builder, x: Tensor, b: Tensor, alpha: Tensor, layout: str, out_type: int = F32,
               last_use: bool = False) -> Tensor:
    """snake(x + b), as ``out_type`` (F16: the input of an F16 conv). One compiled pass on the
    CPU backend (bias add, Snake and cast fused, same float operations); else the ops.
    ``last_use``: as for ``snake`` (an F32 result only)."""
    a, bv = channel_vector(g, alpha, layout), channel_vector(g, b, layout)
    if _kernel_ready(g, x, a, bv):
        g.lowerings["bias_snake"] = "custom-exact" if g.exact_kernels else "custom"
        over = last_use and out_type == F32 and may_overwrite(x)
        return kernels.bias_snake(g.ctx, x, a, bv, out_type, g.exact_kernels, over)
    g.lowerings["bias_snake"] = "ops"
    y = snake(g, add(g, x, bv), alpha, layout)
    return y if out_type == F32 else lib.ggml_cast(g.ctx, y, out_type)


def add_bias_residual(g: Builder, h: Tensor, b: Tensor, x: Tensor, layout: str, last_use: bool = False) -> Tensor:
    """x + (h + b): a conv's bias and a residual connection; one compiled pass on the CPU.
    ``last_use``: nothing reads ``h`` after this op (as for ``snake``)."""
    bv = channel_vector(g, b, layout)
    _check_broadcast("add", h, bv)
    _check_broadcast("add", x, h)
    if _kernel_ready(g, h, bv, x) and shape(h) == shape(x):
        g.lowerings["add_bias_residual"] = "custom-exact" if g.exact_kernels else "custom"
        return kernels.add_bias_residual(g.ctx, h, bv, x, g.exact_kernels, last_use and may_overwrite(h))
    g.lowerings["add_bias_residual"] = "ops"
    return add(g, x, add(g, h, bv))


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

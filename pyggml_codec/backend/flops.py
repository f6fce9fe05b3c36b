"""Floating-point operations of a ggml graph as it executes, counted from its nodes.

What is counted (a multiply-add is 2 operations):

* products: ``MUL_MAT`` and the BLAS / row-product custom ops ``2 K M N`` (times the batch),
  ``OUT_PROD`` ``2 M P N``, the per-tap convs (``conv_taps``) ``2 Cin Cout K L`` (``conv_c1``, one
  input channel: ``2 Cout K L``, and an add per output for its bias), the Winograd
  convs' products ``2 n Cin Cout tiles`` (n points, ``tiles`` as the kernel lays them out, padded
  rows included), ``CONV_TRANSPOSE_1D`` ``2 K Cin Cout L``, the depthwise ``SSM_CONV`` ``2 K C L``
  and attention (``window_attention``, ``FLASH_ATTN_EXT``) ``4 D Nq Nk`` per head, with every
  key of the mask's width counted (``causal_attention``: the keys of each query block's span, as
  the kernel reads them, and 4 softmax steps per score);
* transforms: Winograd's input ``2 n n Cin tiles`` and output ``2 m n Cout tiles`` (dense
  tables, as the kernel applies them);
* elementwise: output elements times a per-op step count (Snake 5, bias + Snake 6, norms 4,
  softmax 4, sin and erf as one step each), and ``col2im`` one add per column element (and one
  per output element where it adds the bias).

Data movement (views, copies, ``IM2COL``, ``GET_ROWS``, concat, pad) is 0. An op with no rule
here is listed in :attr:`FlopCount.uncounted`, never silently dropped.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

from .binding import buffer_is_weights, lib
from .runtime import op_name
from . import arena_attention, kernels

MOVE_OPS = frozenset({"NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "CONT", "CPY", "DUP", "CONCAT", "PAD",
                      "GET_ROWS", "SET_ROWS", "IM2COL", "DIAG_MASK_INF", "DIAG_MASK_ZERO", "REPEAT", "ARGSORT"})
ELEMENTWISE_STEPS = {  # ggml op -> operations per output element
    "ADD": 1, "ADD1": 1, "SUB": 1, "MUL": 1, "DIV": 1, "SCALE": 1, "SQR": 1, "SQRT": 1, "SIN": 1, "COS": 1,
    "LOG": 1, "EXP": 1, "ABS": 1, "NEG": 1, "TANH": 1, "SIGMOID": 2, "SILU": 3, "GELU": 4, "GELU_ERF": 4,
    "RELU": 1, "CLAMP": 1, "NORM": 4, "RMS_NORM": 3, "SOFT_MAX": 4, "ROPE": 3, "SUM_ROWS": 1, "MEAN": 1,
    "ACC": 1, "ADD_REL_POS": 1,
}
KERNEL_STEPS = {"snake": 5, "bias_snake": 6, "add_bias_residual": 2}
MOVE_KERNELS = frozenset({"im2col", "transpose"})
PRODUCT_KERNELS = frozenset({"mul_mat_blas", "mul_mat_rowdot", "mul_mat_f16dot"})  # ggml_mul_mat's shapes
COUNTED_KERNELS = (KERNEL_STEPS.keys() | MOVE_KERNELS | PRODUCT_KERNELS
                   | {"col2im", "conv_taps", "conv_c1", "conv_wino", "conv_wino_input", "window_attention", "causal_attention"})
CATEGORIES = ("products", "transforms", "elementwise")


@dataclass
class FlopCount:
    """Operations by category and by node label ("MUL_MAT", "CUSTOM:conv_wino")."""

    products: int = 0
    transforms: int = 0
    elementwise: int = 0
    by_op: dict[str, int] = field(default_factory=dict)
    uncounted: dict[str, int] = field(default_factory=dict)  # op -> nodes with no rule
    shapes: dict[tuple[int, int, int], int] = field(default_factory=dict)  # GEMM (M, K, N) -> its operations

    @property
    def total(self) -> int:
        return self.products + self.transforms + self.elementwise

    def add(self, label: str, category: str, n: int, gemm: tuple[int, int, int] | None = None) -> None:
        """``gemm``: the (M, K, N) of the products counted, for measuring the SGEMM on them."""
        setattr(self, category, getattr(self, category) + int(n))
        self.by_op[label] = self.by_op.get(label, 0) + int(n)
        if gemm is not None:
            self.shapes[gemm] = self.shapes.get(gemm, 0) + int(n)

    def top_shapes(self, n: int = 3) -> list[tuple[int, int, int]]:
        """The ``n`` GEMM shapes (M, K, N) that carry the most operations."""
        return [s for s, _ in sorted(self.shapes.items(), key=lambda kv: -kv[1])[:n]]

    def __iadd__(self, other: "FlopCount") -> "FlopCount":
        return self.scaled_add(other, 1)

    def scaled_add(self, other: "FlopCount", times: int) -> "FlopCount":
        for c in CATEGORIES:
            setattr(self, c, getattr(self, c) + times * getattr(other, c))
        for k, v in other.by_op.items():
            self.by_op[k] = self.by_op.get(k, 0) + times * v
        for k, v in other.uncounted.items():
            self.uncounted[k] = self.uncounted.get(k, 0) + times * v
        for k, v in other.shapes.items():
            self.shapes[k] = self.shapes.get(k, 0) + times * v
        return self


def _ne(t) -> list[int]:
    return [int(t.contents.ne[i]) for i in range(4)]


def _elements(t) -> int:
    a, b, c, d = _ne(t)
    return a * b * c * d


def _src(node, i: int):
    s = node.contents.src[i]
    return s if s else None


def _params(node, n: int, ctype=ctypes.c_int64) -> list:
    """The first ``n`` values (int64, or ``ctype``) of the parameter block a custom op of
    ``kernels`` was made with: ggml stores {callback, n_tasks, userdata} in the node's op parameters."""
    base = ctypes.addressof(node.contents) + lib.ggml_tensor.op_params.offset
    address = ctypes.c_void_p.from_address(base + 2 * ctypes.sizeof(ctypes.c_void_p)).value
    if not address:
        raise ValueError("custom op without its parameter block")
    return list((ctype * n).from_address(address))


def _product(a, b) -> tuple[int, tuple[int, int, int]]:
    """Operations of ``ggml_mul_mat(a, b)`` and its GEMM shape (M, K, N), batches in N."""
    k, m = _ne(a)[:2]
    _, n, b2, b3 = _ne(b)
    return 2 * k * m * n * b2 * b3, (m, k, n * b2 * b3)


def _wino_geometry(node) -> dict:
    """Dilation, m, n and segments from a Winograd op's parameter block (winograd_conv.conv_wino:
    the BLAS's parameters, then [dilation, block, split, min channels, m, n, tables, rowdot
    tiles, segments, input-op flag])."""
    nb = len(kernels.BLAS.params)
    p = _params(node, nb + 10)[nb:]
    return {"dilation": p[0], "m": p[4], "n": p[5], "segments": p[8], "input_op": bool(p[9])}


def _wino_tiles(length_all: int, g: dict) -> int:
    length = length_all // g["segments"]
    return g["segments"] * -(-length // (g["m"] * g["dilation"])) * g["dilation"]


def count_node(node, out: FlopCount) -> None:
    """Add one node's operations to ``out``."""
    op = op_name(node)
    if op in MOVE_OPS:
        return
    if op in ("MUL_MAT", "MUL_MAT_ID"):
        out.add(op, "products", *_product(_src(node, 0), _src(node, 1)))
    elif op == "OUT_PROD":
        a, b = _src(node, 0), _src(node, 1)
        m, n = _ne(a)[:2]
        p = _ne(b)[0]
        out.add(op, "products", 2 * m * p * n * _ne(node)[2] * _ne(node)[3])
    elif op == "SSM_CONV":  # depthwise: src1 ne [K, C], out ne [C, L, B]
        k = _ne(_src(node, 1))[0]
        out.add(op, "products", 2 * k * _elements(node))
    elif op == "CONV_TRANSPOSE_1D":  # src0 kernel ne [K, Cout, Cin], src1 ne [L, Cin]
        k, cout, cin = _ne(_src(node, 0))[:3]
        out.add(op, "products", 2 * k * cout * cin * _ne(_src(node, 1))[0])
    elif op == "FLASH_ATTN_EXT":  # q ne [D, Nq, H, B], k ne [D, Nk, Hkv, B]
        d, nq, h, b = _ne(_src(node, 0))
        nk = _ne(_src(node, 1))[1]
        out.add(op, "products", 4 * d * nq * nk * h * b)
    elif op in ("CUSTOM", "MAP_CUSTOM2"):
        _count_custom(node, op, out)
    elif op in ELEMENTWISE_STEPS:
        out.add(op, "elementwise", ELEMENTWISE_STEPS[op] * _elements(node))
    else:
        out.uncounted[op] = out.uncounted.get(op, 0) + 1


def _count_custom(node, op: str, out: FlopCount) -> None:
    name = kernels.kernel_name(node)
    if name is None:
        out.uncounted[op] = out.uncounted.get(op, 0) + 1
        return
    kernel = name.split(" ")[0]  # "snake (exact)" -> "snake"
    label = f"{op}:{kernel}"
    if kernel in MOVE_KERNELS:
        return
    if kernel in KERNEL_STEPS:
        out.add(label, "elementwise", KERNEL_STEPS[kernel] * _elements(node))
    elif kernel == "col2im":  # an add per column element, and per output element with the bias in it
        out.add(label, "elementwise", _elements(_src(node, 0)) + (_elements(node) if _params(node, 4)[3] else 0))
    elif kernel in PRODUCT_KERNELS:
        out.add(label, "products", *_product(_src(node, 0), _src(node, 1)))
    elif kernel == "conv_taps":  # w ne [Cin, Cout, K], out ne [L, Cout]
        cin, cout, k = _ne(_src(node, 0))[:3]
        out.add(label, "products", 2 * cin * cout * k * _ne(node)[0], (cout, cin, _ne(node)[0]))
    elif kernel == "conv_c1":  # w ne [K, 1, Cout], out ne [L, Cout]; src2: the bias
        k, _, cout = _ne(_src(node, 0))[:3]
        out.add(label, "products", 2 * k * cout * _ne(node)[0], (cout, k, _ne(node)[0]))
        if _src(node, 2):
            out.add(label, "elementwise", _elements(node))
    elif kernel == "conv_wino":  # u ne [Cin, Cout, n], out ne [L, Cout]
        g = _wino_geometry(node)
        cin, cout, n = _ne(_src(node, 0))[:3]
        tiles = _wino_tiles(_ne(node)[0], g)
        out.add(label, "products", 2 * n * cin * cout * tiles, (cout, cin, tiles))
        transforms = 2 * g["m"] * n * cout * tiles
        if not g["input_op"]:
            transforms += 2 * n * n * cin * tiles
        out.add(label, "transforms", transforms)
    elif kernel == "conv_wino_input":  # src0: x ne [L, Cin]
        g = _wino_geometry(node)
        length, cin = _ne(_src(node, 0))[:2]
        out.add(label, "transforms", 2 * g["n"] * g["n"] * cin * _wino_tiles(length, g))
    elif kernel == "causal_attention":  # q ne [hd, H, T]; userdata float [scale, window]
        hd, h, t = _ne(_src(node, 0))[:3]
        pairs = arena_attention.causal_pairs(t, int(_params(node, 2, ctypes.c_float)[1]))
        out.add(label, "products", 4 * hd * h * pairs)
        out.add(label, "elementwise", 4 * h * pairs)  # the softmax
    elif kernel == "window_attention":  # q ne [hd, H, Nq], mask ne [T, n, 1, B]
        hd, h, nq = _ne(_src(node, 0))[:3]
        t = _ne(_src(node, 4))[0] if _src(node, 4) is not None else _ne(_src(node, 1))[1]
        out.add(label, "products", 4 * hd * h * nq * t)
    else:
        out.uncounted[label] = out.uncounted.get(label, 0) + 1


def count_graph(gf) -> FlopCount:
    """The operations one compute of the ggml graph ``gf`` (a ``ggml_cgraph`` pointer) executes."""
    out = FlopCount()
    for i in range(lib.ggml_graph_n_nodes(gf)):
        count_node(lib.ggml_graph_node(gf, i), out)
    return out


def weight_bytes(gf) -> int:
    """Bytes of weights one compute of ``gf`` reads: the union of the byte ranges of every
    source an op reads (layout-only nodes read nothing) that lives in a weight buffer
    (``binding.mark_weights``), a view as the range it covers, each byte once."""
    layout = {"NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}
    ranges = set()
    for i in range(lib.ggml_graph_n_nodes(gf)):
        node = lib.ggml_graph_node(gf, i)
        if op_name(node) in layout:
            continue
        for j in range(len(node.contents.src)):
            s = _src(node, j)
            if s is None:
                continue
            base = s.contents.view_src if s.contents.view_src else s
            if not base.contents.buffer or not base.contents.data or not buffer_is_weights(base.contents.buffer):
                continue
            start = int(base.contents.data) + (int(s.contents.view_offs) if s.contents.view_src else 0)
            ranges.add((start, start + int(lib.ggml_nbytes(s))))
    total, end = 0, 0
    for lo, hi in sorted(ranges):
        lo = max(lo, end)
        if hi > lo:
            total += hi - lo
            end = hi
    return total

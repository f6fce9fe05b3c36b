"""Streamed attention over the key/value arena in one compiled op (csrc/attention.c): the fused
form of the "arena" lowering's scores, mask, softmax and weighted values (graphs/transformer.py),
which reads every stream's window where it lies in the arena instead of gathering it."""

from __future__ import annotations

import ctypes

import numpy as np

from . import binding
from .binding import lib
from .kernels import OPS, AVAILABLE, N_TASKS_MAX  # the kernels' table: one build, one check

WINDOW_ATTENTION = AVAILABLE  # in every build of the kernels (AVX2 code where the compiler has it)


def window_attention(ctx, q, keys, values, first, mask, scale: float, keep: list):
    """Streamed attention read in place from a key/value arena, in one op (csrc/attention.c):
    ``q`` F32 ne ``[hd, H, n * B]`` (rows along hd contiguous), ``keys`` and ``values`` F32 ne
    ``[hd * Hkv, R]`` with contiguous rows (the arena's rows; H a multiple of Hkv), ``first`` I32
    ne ``[B]`` (the row of each stream's first key), ``mask`` contiguous F32 ne ``[T, n, 1, B]``
    (stream b's query i sees key k, row ``first[b] + k``, unless its mask is -1e9 or below; the
    mask is added to the visible keys' scaled scores). Returns F32 ``[hd * H, n * B]``. A query's
    output depends on its visible keys alone, summed in time order: the same bits in a chunk of
    any length. The caller keeps ``first[b] + T`` within ``R``."""
    hd, nh, tq = (int(q.contents.ne[i]) for i in range(3))
    width, t, n, b = int(keys.contents.ne[0]), *(int(mask.contents.ne[i]) for i in (0, 1, 3))
    problems = []
    if any(int(x.contents.type) != 0 for x in (q, keys, values, mask)) or int(first.contents.type) != binding.TYPE_I32:
        problems.append("q, keys, values and mask F32, first I32")
    if int(q.contents.nb[0]) != 4 or int(keys.contents.nb[0]) != 4 or int(values.contents.nb[0]) != 4:
        problems.append("contiguous rows")
    if width % hd or nh % max(1, width // hd) or int(values.contents.ne[0]) != width:
        problems.append(f"keys and values of hd * Hkv columns with H a multiple of Hkv (hd {hd}, H {nh}, {width})")
    if tq != n * b or int(first.contents.ne[0]) != b or int(mask.contents.ne[2]) != 1 or int(q.contents.ne[3]) != 1:
        problems.append(f"{n} queries for each of {b} streams (q has {tq}, first {int(first.contents.ne[0])})")
    if int(mask.contents.nb[1]) != 4 * t or int(mask.contents.nb[0]) != 4:
        problems.append("a contiguous mask")
    if problems:
        raise ValueError(f"window_attention needs {'; '.join(problems)}")
    params = np.array([scale], dtype=np.float32)
    keep.append(params)
    srcs = [q, keys, values, first, mask]
    args = (ctypes.POINTER(lib.ggml_tensor) * len(srcs))(*srcs)
    return lib.ggml_custom_4d(ctx, 0, hd * nh, tq, 1, 1, args, len(srcs), OPS["window_attention"], N_TASKS_MAX,
                              params.ctypes.data_as(ctypes.c_void_p))

"""Attention in one compiled op (csrc/attention.c).

* :func:`window_attention`: streamed attention over the key/value arena, the fused form of the
  "arena" lowering's scores, mask, softmax and weighted values (graphs/transformer.py), which reads
  every stream's window where it lies in the arena instead of gathering it.
* :func:`causal_attention`: a whole sequence's causal sliding-window attention (the "fused"
  attention lowering of the one-shot graphs), over the visible scores alone."""

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


CAUSAL_QUERY_BLOCK = 16  # csrc/attention.c's CA_QB: queries per work item, which share one span of keys


def causal_pairs(t: int, window: int) -> int:
    """(query, key) pairs :func:`causal_attention` computes over a sequence of ``t``: each block of
    :data:`CAUSAL_QUERY_BLOCK` queries against the keys its span reads (its visible ones and the
    few its first queries do not see)."""
    pairs = 0
    for qa in range(0, t, CAUSAL_QUERY_BLOCK):
        qb = min(qa + CAUSAL_QUERY_BLOCK, t)
        j0 = max(qa - window + 1, 0) if window > 0 else 0
        pairs += (qb - qa) * (qb - j0)
    return pairs


def causal_attention(ctx, q, kt, v, window: int, scale: float, keep: list):
    """Causal sliding-window attention of a whole sequence in one op (csrc/attention.c): query i
    sees keys ``max(0, i - window + 1) .. i`` (``window`` 0: every key up to i); each block of
    :data:`CAUSAL_QUERY_BLOCK` queries is scored against its span of keys alone (:func:`causal_pairs`). ``q`` F32 ne ``[hd, H, T]`` and ``v`` F32 ne ``[hd, T, Hkv]`` (each
    head's values in time order) with rows along hd contiguous, ``kt`` contiguous F32 ne
    ``[T, hd, Hkv]`` (the keys transposed: one row of T per head dimension); H a multiple of Hkv.
    Returns contiguous F32 ``[hd * H, T]``, the output projection's input. Each output is summed
    over its visible keys by arithmetic fixed by the shape: the same bits at any thread count."""
    hd, nh, t = (int(q.contents.ne[i]) for i in range(3))
    nkv = int(kt.contents.ne[2])
    problems = []
    if any(int(x.contents.type) != 0 for x in (q, kt, v)):
        problems.append("F32 q, kt and v")
    if any(int(x.contents.nb[0]) != 4 for x in (q, kt, v)) or not lib.ggml_is_contiguous(kt):
        problems.append("rows along hd contiguous and kt contiguous")
    if tuple(int(kt.contents.ne[i]) for i in range(2)) != (t, hd) or \
            tuple(int(v.contents.ne[i]) for i in range(3)) != (hd, t, nkv):
        problems.append(f"kt [T, hd, Hkv] and v [hd, T, Hkv] of q's T = {t} and hd = {hd}")
    if nkv < 1 or nh % nkv or int(q.contents.ne[3]) != 1:
        problems.append(f"H = {nh} a multiple of Hkv = {nkv}, one sequence")
    if window < 0 or window >= 1 << 24:
        problems.append(f"a window in [0, 2^24), got {window}")
    if problems:
        raise ValueError(f"causal_attention needs {'; '.join(problems)}")
    params = np.array([scale, window], dtype=np.float32)
    keep.append(params)
    srcs = [q, kt, v]
    args = (ctypes.POINTER(lib.ggml_tensor) * len(srcs))(*srcs)
    return lib.ggml_custom_4d(ctx, 0, hd * nh, t, 1, 1, args, len(srcs), OPS["causal_attention"], N_TASKS_MAX,
                              params.ctypes.data_as(ctypes.c_void_p))

"""The residual units' dilated convs by Winograd F(4,7) in compiled ops (csrc/winograd.c):
``conv_wino`` and the input transform it may run before (``conv_wino_input``), tables in
winograd.py. 10 of the BLAS's (or the row products') GEMMs per 4 outputs instead of 28, the
transforms in C over cache-sized blocks of tiles; 0.44-0.79x the per-tap GEMMs' time at 64-768
channels. The blocking constants below are shape-only choices, as for ``kernels.conv_taps``."""

from __future__ import annotations

import ctypes

import numpy as np

from .binding import lib
from .kernels import OPS, BLAS, CONV_MIN_CHANNELS, N_TASKS_MAX, ROWDOT, check_context  # the kernels' table: one build, one check
from .winograd_tables import WINOGRAD, Winograd

WINO_CHUNK_BYTES = 8 << 20  # a thread block's working set (transformed input + products)
# Threads take blocks of tile rows (m d outputs each): at least WINO_MIN_TILES tiles, and
# at least WINO_MIN_BLOCKS blocks where that allows; signals shorter than
# WINO_SPLIT_CHANNELS_BELOW split the output channels instead (after an op that transforms the
# input, WINO_INPUT_OP), in blocks of >= CONV_MIN_CHANNELS. Shape-only choices, as for conv_taps.
WINO_MIN_TILES, WINO_MIN_BLOCKS, WINO_SPLIT_CHANNELS_BELOW = 128, 2, 1024
# Convs whose products all go by rows split channels below this (the input op shares the transform):
# 384 and 768 channels, 1024-2048 samples, 0.77-0.99x the time by blocks of tile rows; even at 4096-8192.
# Not in a batched step (segments > 1), where they split below WINO_SPLIT_CHANNELS_BELOW: each
# stream's few tile rows go through the input op's short-piece gathers, and 384 channels (2 threads,
# the three convs of decoder block 2) took 24.3 ms by blocks of tile rows against 26.5 split at
# 8 streams of 256 samples, 12.1 against 13.1 at 4; at 2 (512 samples) 11.9 against 6.7 split.
WINO_SPLIT_CHANNELS_BELOW_ROWS = 4096
# At most this many tiles per thread block (a streamed chunk: 8-9 in decoder block 1 at one
# frame), the n products are row products (pg_rowdot): OpenBLAS packs every transformed matrix
# for them (3.8 ms for one 768-channel conv of 32 samples, against 0.9 to read its weights).
# With 16-float vectors (AVX-512) up to WINO_ROWDOT_MAX_TILES_16: the row products ran decoder
# block 1's three convs of a 4-frame chunk (32-36 tiles) in 7.9-8.0 ms against OpenBLAS's 10.4,
# 8 streams at one frame (64-72 tiles) in 17.6 against 20.2, block 2 at one frame in 4.1 against
# 4.5 (2 threads, interleaved, minimum of 21); with 8-float vectors (AVX2) they lost to the BLAS
# there (107 GFLOP/s against 138-171 at 36-72 tiles). With 16-float vectors, convs of at least
# WINO_ROWDOT_MIN_CHANNELS_16 input channels take row products at every tile count: a one-shot
# decode's blocks (128-280 tiles) ran as fast as OpenBLAS's (768 channels: 14.2-16.3 ms against
# 15.7-18.0; 384: 34.2-37.1 against 33.7-37.0), and streamed chunks then sum those convs' products
# as the one-shot decode does (a stream's max abs from decode() fell from 7.5-8.8e-7 to 4.3e-7,
# the same at every chunk). Below (192 and 96 channels: K of 192 or 96 values per row) the BLAS
# was 20-50 % faster on long signals.
WINO_ROWDOT_MAX_TILES = 16
WINO_ROWDOT_MAX_TILES_16 = 80
WINO_ROWDOT_MIN_CHANNELS_16 = 384


def wino_rowdot_tiles(cin: int) -> int:
    """The most tiles a Winograd product over ``cin`` input channels takes by row products in
    this build (0: none)."""
    if not ROWDOT:
        return 0
    if OPS["rowdot"] >= 16:
        return 1 << 40 if cin >= WINO_ROWDOT_MIN_CHANNELS_16 else WINO_ROWDOT_MAX_TILES_16
    return WINO_ROWDOT_MAX_TILES


WINO_BALANCE = 12  # block counts rounded up to a multiple of this (11 blocks left one of 2 threads 9 % idle)
# In a batched step (segments > 1) to a multiple of WINO_BALANCE_BATCHED: 12 blocks cut 8 streams'
# 192- and 96-channel convs (2048-4104 tiles) into blocks of 171-342 tiles, each of which packs every
# transformed weight again for the BLAS, and 2 blocks left each of 2 threads one 384-channel block of
# 256-288 tiles whose transformed input (10 planes of 384 channels) no longer sat in L2. Decoder
# blocks 2-4 at 8 streams of one frame (2 threads): 59.8 -> 56.0 ms per step, same tiles' sums.
WINO_BALANCE_BATCHED = 4
# And with working sets of WINO_CHUNK_BYTES_BATCHED: 8 streams of one frame (2 threads) then take the
# 96- and 192-channel convs in blocks of one stream's tiles (256-513) instead of two (512-1026):
# 0.89-0.95x those convs' time (per node, best of 5, three runs at 8 and 16 streams; the one-shot
# decode's blocks were no faster so), about 1 % of a step. Where that leaves an odd block count that
# no multiple reaches, one block fewer: 5 blocks of a 384-channel conv at d = 9 ran 1.24x the time of 4.
WINO_CHUNK_BYTES_BATCHED = 4 << 20
WINO_INPUT_OP = True  # split-channel convs transform their input in an op of its own (False: in each thread)


def wino_block_rows(rows: int, dilation: int, cin: int, cout: int, segments: int, wino: Winograd = WINOGRAD) -> int:
    """Tile rows per thread block of a conv over ``rows`` tile rows (counted over its segments in
    turn) when its threads split time: blocks of about WINO_CHUNK_BYTES (WINO_CHUNK_BYTES_BATCHED
    in a batched step) and at least WINO_MIN_TILES tiles, their count rounded for the threads."""
    chunk = WINO_CHUNK_BYTES if segments == 1 else WINO_CHUNK_BYTES_BATCHED
    max_tiles = max(WINO_MIN_TILES, chunk // (4 * wino.n * (cin + cout)))
    max_rows = max(1, max_tiles // dilation)
    n_blocks = max(-(-rows // max_rows), min(WINO_MIN_BLOCKS, rows * dilation // WINO_MIN_TILES), 1)
    balance = WINO_BALANCE if segments == 1 else WINO_BALANCE_BATCHED
    for multiple in (balance, 2):  # whole shares for 2, 3, 4 and 6 threads (one-shot) where blocks allow
        balanced = -(-n_blocks // multiple) * multiple
        if n_blocks > 1 and rows * dilation // balanced >= WINO_MIN_TILES:
            n_blocks = balanced
            break
    else:
        if segments > 1 and n_blocks > 2 and n_blocks % 2:
            n_blocks -= 1
    return -(-rows // n_blocks)


def conv_wino(ctx, u, x, dilation: int, keep: list, prev=None, wino: Winograd = WINOGRAD, segments: int = 1):
    """The causal dilated conv of ``conv_taps`` by Winograd F(m, K): ``u`` the transformed
    weights (contiguous F32 ne ``[Cin, Cout, n]``, ``Winograd.weights``), CF ``x`` (F32 ne
    ``[L, Cin]``, contiguous rows), ``prev`` (F32 ne ``[(K-1) * dilation, Cin]``) the carried
    context read in place; CF ``[L, Cout]``. n GEMMs per m outputs instead of m K.

    ``segments`` S > 1: a batched step, S streams of L / S samples each packed in turn along
    time, each convolved after its own carried context, ``prev`` ne ``[(K-1) * dilation, S, Cin]``;
    every stream's tiles go through one product (the weights read once for all of them), and
    each stream's outputs are the ones it gets alone. A conv split by output channels (shorter
    than WINO_SPLIT_CHANNELS_BELOW) transforms its input in an op before (``conv_wino_input``),
    its threads taking shares of the input channels: same values, each transformed once."""
    cin, cout = int(u.contents.ne[0]), int(u.contents.ne[1])
    if int(u.contents.ne[2]) != wino.n:
        raise ValueError(f"Winograd F({wino.m},{wino.k}) weights need {wino.n} planes, got {int(u.contents.ne[2])}")
    if int(x.contents.ne[0]) % segments or (prev is not None and segments > 1
                                             and int(prev.contents.ne[1]) != segments):
        raise ValueError(f"{segments} segments of a conv over {int(x.contents.ne[0])} samples")
    check_context(prev, wino.k, dilation, cin, segments)
    length = int(x.contents.ne[0]) // segments
    rows = segments * -(-length // (wino.m * dilation))  # tile rows, counted over the segments in turn
    block = wino_block_rows(rows, dilation, cin, cout, segments, wino)
    by_rows = rows * dilation <= wino_rowdot_tiles(cin)
    split_below = WINO_SPLIT_CHANNELS_BELOW_ROWS if by_rows and segments == 1 else WINO_SPLIT_CHANNELS_BELOW
    keep.append(wino.tables)
    params = np.concatenate([BLAS.params, np.array([dilation, block, split_below, CONV_MIN_CHANNELS,
                                                    wino.m, wino.n, wino.tables.ctypes.data,
                                                    wino_rowdot_tiles(cin), segments, 0],
                                                   dtype=np.int64)])
    keep.append(params)
    srcs = [u, x] if prev is None else [u, x, prev]
    if WINO_INPUT_OP and length * segments < split_below:  # the input transformed by an op before
        nt = rows * dilation  # its tiles; floats for v's planes (rows padded) or for vt, whichever the C lays out
        floats = wino.n * max(nt * cin, cin * (-(-nt // 16) * 16 + 16) + 32)
        given = (ctypes.POINTER(lib.ggml_tensor) * (len(srcs) - 1))(*srcs[1:])
        srcs = [u, lib.ggml_custom_4d(ctx, 0, floats, 1, 1, 1, given, len(srcs) - 1, OPS["conv_wino_input"],
                                      N_TASKS_MAX, params.ctypes.data_as(ctypes.c_void_p))]
        params = params.copy()
        params[-1] = 1
        keep.append(params)
    args = (ctypes.POINTER(lib.ggml_tensor) * len(srcs))(*srcs)
    return lib.ggml_custom_4d(ctx, 0, length * segments, cout, 1, 1, args, len(srcs), OPS["conv_wino"],
                              N_TASKS_MAX, params.ctypes.data_as(ctypes.c_void_p))


"""The windowed causal transformer of the encoder's last block and of the RVQ pre/post modules.

Pre-norm layers (RMSNorm), fused ``wqkv`` (rows ordered q | k | v), interleaved-pair RoPE
(ggml mode 0) at positions 0..T-1, scale 1/sqrt(head_dim), LayerScale on both branches,
SiLU-gated FFN ``w2(silu(w1 n) * w3 n)``, and a final RMSNorm. Activations are CL
(ggml ``ne = [dim, T]``). Query q sees keys [q - window + 1, q].
"""

from __future__ import annotations

import numpy as np

from . import convs, ops
from ..backend import arena_attention
from ..backend.binding import lib
from ..model.config import TransformerConfig
from ..model.weights import LAYER_TENSORS
from .ops import Builder, Tensor

def mask_input(g: Builder, n: int, window: int, name: str) -> Tensor | None:
    """The attention mask input for a sequence of ``n``, or None where diag_mask_inf serves.

    A sliding-window mask when window < n; otherwise plain causal masking, which is
    ``ggml_diag_mask_inf`` except on backends without it (Metal), which get an explicit
    causal mask. Masked scores are -1e9, as in the C++ engine.
    """
    if 0 < window < n:
        g.lowerings[name] = "window-mask"
        return g.input(name, ops.window_mask(n, n, window))
    if g.explicit_causal_mask:
        g.lowerings[name] = "causal-mask"
        return g.input(name, ops.window_mask(n, n, 0))
    g.lowerings[name] = "diag_mask_inf"
    return None


def history_mask(n_query: int, window: int, p0: int) -> np.ndarray:
    """Mask, numpy ``(n_query, window - 1 + n_query)``, of a streamed chunk at positions p0...

    Keys are the ``window - 1`` carried ones (positions p0 - window + 1 .. p0 - 1) then the
    chunk's own; carried slots before position 0 (the first ``window - 1 - p0``) are masked.
    """
    hist = window - 1
    mask = ops.window_mask(n_query, hist + n_query, window, offset=hist)
    mask[:, : max(0, hist - p0)] = ops.MASKED
    return mask


def positions_input(g: Builder, n: int, name: str) -> Tensor:
    return g.input(name, np.arange(n, dtype=np.int32), ops.I32)


def _rope(g: Builder, x: Tensor, pos: Tensor, cfg: TransformerConfig) -> Tensor:
    return lib.ggml_rope_ext(g.ctx, x, pos, None, cfg.head_dim, 0, cfg.block_size,
                             cfg.rope_base, 1.0, 0.0, 1.0, 0.0, 0.0)


def _split_heads(g: Builder, qkv: Tensor, cfg: TransformerConfig, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """Views of q [hd, H, T], k and v [hd, Hkv, T] inside the fused projection."""
    es = qkv.contents.nb[0]
    row = qkv.contents.nb[1]
    hd, nh, nkv = cfg.head_dim, cfg.n_head, cfg.n_kv_head

    def view(heads: int, start_head: int) -> Tensor:
        return lib.ggml_view_3d(g.ctx, qkv, hd, heads, n, hd * es, row, start_head * hd * es)

    return view(nh, 0), view(nkv, nh), view(nkv, nh + nkv)


def stream_inputs(g: Builder, n: int, window: int, prefix: str,
                  width: int) -> tuple[Tensor, Tensor, ops.KVArena | None]:
    """Positions and mask inputs of a streamed chunk, which the driver feeds per chunk, and in
    the "arena" lowering the spec of where the layers' keys and values (rows of ``width``) live."""
    if window < 1:
        raise ValueError("streaming needs a bounded attention window")
    pos_name, mask_name = f"{prefix}.pos"[-60:], f"{prefix}.mask"[-60:]
    b = g.stream.batch  # batched: n // b tokens per stream; positions and a mask per stream
    g.stream.clocks[pos_name] = (mask_name, n // b, window)
    g.lowerings[mask_name] = "history-mask"
    mask = history_mask(n // b, window, 0)
    if b > 1:
        mask = np.ascontiguousarray(np.broadcast_to(mask, (b, 1, *mask.shape)))  # ne [T_k, n, 1, B]
    arena = None
    if g.kv == "arena" and window > 1:
        g.lowerings["kv"] = "arena"
        hist, n_one = window - 1, n // b
        fused = g.attention_kernel
        g.lowerings["arena_attention"] = "kernel" if fused else "ggml"
        arena = ops.KVArena(f"{prefix}.kv_write"[-60:], f"{prefix}.kv_read"[-60:] if b > 1 and not fused else None,
                            n_one, hist, width, gather=b > 1 and not fused,
                            first=f"{prefix}.kv_first"[-60:] if fused else None)
        write = g.input(arena.write, np.arange(hist, hist + n, dtype=np.int64), ops.I64)  # fed per chunk
        read = g.input(arena.read, np.arange((hist + n_one) * b, dtype=np.int32), ops.I32) if arena.read else None
        first = g.input(arena.first, np.zeros(b, np.int32), ops.I32) if fused else None
        arena.indices = (write, read, first)
        g.stream.kv[pos_name] = arena
    elif window > 1:
        g.lowerings["kv"] = "concat"
    return positions_input(g, n, pos_name), g.input(mask_name, mask), arena


def _with_history(g: Builder, k: Tensor, v: Tensor, hist: int) -> tuple[Tensor, Tensor]:
    """Streamed chunk: the carried last ``hist`` keys (post-RoPE) before this chunk's, [hd, Hkv,
    hist + T], and values, transposed as the product reads them, [hist + T, hd, Hkv]. Emits
    this chunk's own, which the driver appends to the carried ones (``Carry.appended``)."""
    hd, nkv, n = ops.shape(k)[:3]
    v_t = lib.ggml_cont(g.ctx, lib.ggml_permute(g.ctx, v, 1, 2, 0, 3))  # [T, hd, Hkv]
    return _history(g, k, (hd, nkv, hist), 2), _history(g, v_t, (hist, hd, nkv), 0)


def _history(g: Builder, x: Tensor, ne: tuple[int, ...], dim: int, stream_dim: int | None = None) -> Tensor:
    """The carried entries (ggml shape ``ne``) then ``x``'s, along ggml dimension ``dim``."""
    name, prev = convs.carry_input(g, ne, stream_dim)
    convs.emit_carry(g, name, x)
    g.stream.appended[name] = len(ne) - 1 - dim - (stream_dim is not None)  # numpy axis of one stream's
    return lib.ggml_concat(g.ctx, prev, x, dim)


def _batched_stream_attention(g: Builder, q: Tensor, k: Tensor, v: Tensor, cfg: TransformerConfig,
                              mask: Tensor) -> Tensor:
    """One batched step (``ops.Carry.batch`` streams of n tokens in turn): each stream's queries
    against its own carried keys then its own, the streams as ggml's fourth dimension.
    Returns [hd * H, n * B]."""
    b, (hd, nh, t) = g.stream.batch, ops.shape(q)[:3]
    n, hist, nkv = t // b, cfg.window - 1, cfg.n_kv_head
    k = _history(g, lib.ggml_reshape_4d(g.ctx, k, hd, nkv, n, b), (hd, nkv, hist, b), 2, 3)  # [hd, Hkv, hist + n, B]
    v = lib.ggml_reshape_4d(g.ctx, lib.ggml_cont(g.ctx, v), hd, nkv, n, b)
    v_t = _history(g, lib.ggml_cont(g.ctx, lib.ggml_permute(g.ctx, v, 1, 2, 0, 3)), (hist, hd, nkv, b), 0, 3)
    q = lib.ggml_permute(g.ctx, lib.ggml_reshape_4d(g.ctx, q, hd, nh, n, b), 0, 2, 1, 3)  # [hd, n, H, B]
    scores = ops.mul_mat(g, lib.ggml_permute(g.ctx, k, 0, 2, 1, 3), q)  # [T_k, n, H, B]
    probs = lib.ggml_soft_max_ext(g.ctx, scores, mask, 1.0 / float(np.sqrt(cfg.head_dim)), 0.0)
    out = lib.ggml_cont(g.ctx, lib.ggml_permute(g.ctx, ops.mul_mat(g, v_t, probs), 0, 2, 1, 3))  # [hd, H, n, B]
    return ops.reshape_2d(g, out, hd * nh, t)


def _arena_rows(g: Builder, arena: ops.KVArena, x: Tensor) -> Tensor:
    """This chunk's rows ``x`` [hd, Hkv, n * B] written into a new bound leaf of ``arena`` at the
    ``write`` rows, then every stream's window, its carried rows then its new ones, gathered from
    it (one stream's graph: the leaf is that window): [hd, Hkv, hist + n, B], time order."""
    hd, nkv, t = ops.shape(x)[:3]
    name = f"arena.{sum(len(a.leaves) for a in g.stream.kv.values())}"
    arena.leaves.append(name)
    write, read, _ = arena.indices
    if arena.gather or arena.first:
        leaf = g.bound_input(name, arena.width)
    else:  # one stream: lent its window and the rows after it
        leaf = g.bound_input(name, arena.width, arena.hist + arena.n)
    rows = lib.ggml_set_rows(g.ctx, leaf, ops.reshape_2d(g, lib.ggml_cont(g.ctx, x), hd * nkv, t), write)
    if arena.first:  # read in place by the fused op: [hd * Hkv, rows]
        return rows
    if arena.gather:
        rows = lib.ggml_get_rows(g.ctx, rows, read)  # [hd * Hkv, (hist + n) * B]
    return lib.ggml_reshape_4d(g.ctx, rows, hd, nkv, arena.hist + arena.n, g.stream.batch)


def _arena_attention(g: Builder, q: Tensor, k: Tensor, v: Tensor, cfg: TransformerConfig, mask: Tensor,
                     arena: ops.KVArena) -> Tensor:
    """Streamed attention in the "arena" lowering (``ops.KVArena``), for one stream or a batched
    step (``ops.Carry.batch`` streams of n tokens in turn): each stream's queries against its
    carried keys then its own, read in place from the driver's arena, the streams as ggml's
    fourth dimension. Values stay in time order: the product over keys is ``ggml_out_prod``
    against the transposed probabilities (a view), so no window is copied or transposed but by
    the one gather. Returns [hd * H, n * B]."""
    b, (hd, nh, t) = g.stream.batch, ops.shape(q)[:3]
    n = t // b
    scale = 1.0 / float(np.sqrt(cfg.head_dim))
    if arena.first:  # one op over the arena's rows (arena_attention.window_attention)
        return arena_attention.window_attention(g.ctx, q, _arena_rows(g, arena, k), _arena_rows(g, arena, v),
                                        arena.indices[2], mask, scale, g.keep)
    keys = lib.ggml_permute(g.ctx, _arena_rows(g, arena, k), 0, 2, 1, 3)  # [hd, T_k, Hkv, B]
    values = lib.ggml_permute(g.ctx, _arena_rows(g, arena, v), 0, 2, 1, 3)  # [hd, T_k, Hkv, B]
    q = lib.ggml_permute(g.ctx, lib.ggml_reshape_4d(g.ctx, q, hd, nh, n, b), 0, 2, 1, 3)  # [hd, n, H, B]
    scores = ops.mul_mat(g, keys, q)  # [T_k, n, H, B]
    probs = lib.ggml_soft_max_ext(g.ctx, scores, mask, scale, 0.0)
    out = lib.ggml_out_prod(g.ctx, values, lib.ggml_transpose(g.ctx, probs))  # [hd, n, H, B]
    out = lib.ggml_cont(g.ctx, lib.ggml_permute(g.ctx, out, 0, 2, 1, 3))  # [hd, H, n, B]
    return ops.reshape_2d(g, out, hd * nh, t)


def blocked_mask(n: int, window: int) -> np.ndarray:
    """Mask, numpy ``(n_blocks, window, 2 * window)``, of :func:`_blocked_attention`: block j's
    query i (position j*W + i) against its key slots s (position j*W - W + s)."""
    n_blocks = -(-n // window)
    i = np.arange(window)[:, None]
    s = np.arange(2 * window)[None, :]
    visible = (s >= i + 1) & (s <= i + window)  # [p - W + 1, p]
    out = np.broadcast_to(np.where(visible, 0.0, ops.MASKED), (n_blocks, window, 2 * window)).copy()
    out[0, :, :window] = ops.MASKED  # block 0's first W slots are before position 0
    return out.astype(np.float32)


def _pad_time(g: Builder, t: Tensor, front: int, back: int) -> Tensor:
    """Zeros before and after ``t`` [hd, heads, T] along T (dim 2)."""
    if not front and not back:
        return t
    if g.left_pad == "pad_ext" or not front:
        return lib.ggml_pad_ext(g.ctx, t, 0, 0, 0, 0, front, back, 0, 0)
    hd, heads, n = ops.shape(t)[:3]
    zeros = g.input(f"zeros.{len(g.inputs)}", np.zeros((front, heads, hd), np.float32))
    t = lib.ggml_concat(g.ctx, zeros, lib.ggml_cont(g.ctx, t), 2)
    return lib.ggml_pad_ext(g.ctx, t, 0, 0, 0, 0, 0, back, 0, 0) if back else t


def _blocked_attention(g: Builder, q: Tensor, k: Tensor, v: Tensor, cfg: TransformerConfig, mask: Tensor) -> Tensor:
    """Sliding-window attention in blocks of W = window queries, each against its 2W keys:
    T * 2W scores instead of T * T (the full form's cost grows with the square of the length).

    Keys and values are padded with W zeros in front (masked) and queries at the back to a
    whole number of blocks; the key windows are overlapping strided views (no copies).
    Not streamed (the stream's history mask serves there).
    Returns [hd, T, H].
    """
    hd, nh, n = ops.shape(q)[:3]
    nkv, wdw = cfg.n_kv_head, cfg.window
    n_blocks = -(-n // wdw)
    tail = n_blocks * wdw - n
    es = q.contents.nb[0]  # F32 after RoPE
    qp = lib.ggml_cont(g.ctx, lib.ggml_permute(g.ctx, _pad_time(g, q, 0, tail), 0, 2, 1, 3))  # [hd, Tp, H]
    qb = lib.ggml_reshape_4d(g.ctx, qp, hd, wdw, n_blocks, nh)
    # ggml sizes a view as if it were contiguous, so the key buffer holds 2W per block (the
    # back half of the last windows' span is zeros nothing reads unmasked).
    nk = 2 * wdw * n_blocks
    kv_back = nk - wdw - n
    kp = lib.ggml_cont(g.ctx, lib.ggml_permute(g.ctx, _pad_time(g, k, wdw, kv_back), 0, 2, 1, 3))  # [hd, Tk, Hkv]
    kb = lib.ggml_view_4d(g.ctx, kp, hd, 2 * wdw, n_blocks, nkv, hd * es, wdw * hd * es, nk * hd * es, 0)
    scores = ops.mul_mat(g, kb, qb)  # [2W, W, blocks, H]
    probs = lib.ggml_soft_max_ext(g.ctx, scores, mask, 1.0 / float(np.sqrt(hd)), 0.0)
    vp = lib.ggml_cont(g.ctx, lib.ggml_permute(g.ctx, _pad_time(g, lib.ggml_cont(g.ctx, v), wdw, kv_back),
                                               1, 2, 0, 3))  # [Tk, hd, Hkv]
    vb = lib.ggml_view_4d(g.ctx, vp, 2 * wdw, hd, n_blocks, nkv, nk * es, wdw * es, nk * hd * es, 0)
    out = ops.mul_mat(g, vb, probs)  # [hd, W, blocks, H]
    out = lib.ggml_reshape_3d(g.ctx, out, hd, n_blocks * wdw, nh)
    return lib.ggml_view_3d(g.ctx, out, hd, n, nh, out.contents.nb[1], out.contents.nb[2], 0)


def uses_blocked_attention(g: Builder, n: int, window: int) -> bool:
    return g.attention == "blocked" and g.stream is None and 0 < window and n > 2 * window


def uses_fused_attention(g: Builder) -> bool:
    """The "fused" lowering: a whole sequence's attention in one compiled op (CPU, "f32")."""
    return g.attention == "fused" and g.stream is None


def _fused_attention(g: Builder, q: Tensor, k: Tensor, v: Tensor, cfg: TransformerConfig) -> Tensor:
    """Causal window attention over the visible scores alone (arena_attention.causal_attention):
    the keys transposed and the values gathered by head once, q read where it lies. Returns
    [hd * H, T]."""
    kt = lib.ggml_cont(g.ctx, lib.ggml_permute(g.ctx, k, 1, 2, 0, 3))  # [T, hd, Hkv]
    vh = lib.ggml_cont(g.ctx, lib.ggml_permute(g.ctx, v, 0, 2, 1, 3))  # [hd, T, Hkv]
    return arena_attention.causal_attention(g.ctx, q, kt, vh, max(cfg.window, 0), 1.0 / float(np.sqrt(cfg.head_dim)),
                                            g.keep)


def attention(g: Builder, x: Tensor, w: dict, cfg: TransformerConfig, pos: Tensor, mask: Tensor | None,
              arena: ops.KVArena | None = None) -> Tensor:
    """Multi-head causal self-attention of CL ``x`` [dim, T] (after carried keys when streamed;
    ``arena``: where they live in the "arena" lowering)."""
    n = ops.shape(x)[1]
    q, k, v = _split_heads(g, ops.mul_mat(g, w["attention.wqkv.weight"], x), cfg, n)
    q, k = _rope(g, q, pos, cfg), _rope(g, k, pos, cfg)
    if arena is not None:
        return ops.mul_mat(g, w["attention.wo.weight"], _arena_attention(g, q, k, v, cfg, mask, arena))
    if uses_fused_attention(g):
        return ops.mul_mat(g, w["attention.wo.weight"], _fused_attention(g, q, k, v, cfg))
    if uses_blocked_attention(g, n, cfg.window):
        out = _blocked_attention(g, q, k, v, cfg, mask)
        out = lib.ggml_cont(g.ctx, lib.ggml_permute(g.ctx, out, 0, 2, 1, 3))  # [hd, H, T]
        return ops.mul_mat(g, w["attention.wo.weight"], ops.reshape_2d(g, out, cfg.head_dim * cfg.n_head, n))
    if g.stream is not None and g.stream.batch > 1:
        if cfg.window < 2:
            raise ValueError("batched streams need an attention window of 2 or more")
        return ops.mul_mat(g, w["attention.wo.weight"], _batched_stream_attention(g, q, k, v, cfg, mask))
    if g.stream is not None and cfg.window > 1:
        k, v_t = _with_history(g, k, v, cfg.window - 1)
    else:
        v_t = lib.ggml_cont(g.ctx, lib.ggml_permute(g.ctx, v, 1, 2, 0, 3))  # [T_k, hd, Hkv]
    q = lib.ggml_permute(g.ctx, q, 0, 2, 1, 3)  # [hd, T, H]
    k = lib.ggml_permute(g.ctx, k, 0, 2, 1, 3)  # [hd, T_k, Hkv]
    scores = ops.mul_mat(g, k, q)  # [T_k, T_q, H]
    scale = 1.0 / float(np.sqrt(cfg.head_dim))
    if mask is None:
        scores = lib.ggml_diag_mask_inf(g.ctx, scores, 0)
    probs = lib.ggml_soft_max_ext(g.ctx, scores, mask, scale, 0.0)
    out = ops.mul_mat(g, v_t, probs)  # [hd, T_q, H]
    out = lib.ggml_cont(g.ctx, lib.ggml_permute(g.ctx, out, 0, 2, 1, 3))  # [hd, H, T]
    out = ops.reshape_2d(g, out, cfg.head_dim * cfg.n_head, n)
    return ops.mul_mat(g, w["attention.wo.weight"], out)


def feed_forward(g: Builder, x: Tensor, w: dict) -> Tensor:
    gate = ops.mul_mat(g, w["feed_forward.w1.weight"], x)
    up = ops.mul_mat(g, w["feed_forward.w3.weight"], x)
    return ops.mul_mat(g, w["feed_forward.w2.weight"], ops.silu_mul(g, gate, up))


def layer(g: Builder, x: Tensor, w: dict, cfg: TransformerConfig, pos: Tensor, mask: Tensor | None,
          arena: ops.KVArena | None = None) -> Tensor:
    h = ops.rms_norm(g, x, w["attention_norm.weight"], cfg.norm_eps)
    attn = attention(g, h, w, cfg, pos, mask, arena)
    x = ops.add(g, x, ops.scale_channels(g, attn, w["attention_layer_scale.gamma"]))
    h = ops.rms_norm(g, x, w["ffn_norm.weight"], cfg.norm_eps)
    return ops.add(g, x, ops.scale_channels(g, feed_forward(g, h, w), w["ffn_layer_scale.gamma"]))


def transformer(g: Builder, x: Tensor, weights, prefix: str, cfg: TransformerConfig, n_layer: int) -> Tensor:
    """``n_layer`` layers named ``{prefix}.layers.N.*`` and ``{prefix}.norm.weight``; CL in and out."""
    n = ops.shape(x)[1]
    arena = None
    if g.stream is not None:
        pos, mask, arena = stream_inputs(g, n, cfg.window, prefix, cfg.head_dim * cfg.n_kv_head)
    else:
        pos = positions_input(g, n, f"{prefix}.pos"[-60:])
        mask_name = f"{prefix}.mask"[-60:]
        if uses_fused_attention(g):
            g.lowerings[mask_name] = "fused-window"
            mask = None
        elif uses_blocked_attention(g, n, cfg.window):
            g.lowerings[mask_name] = "blocked-window"
            mask = g.input(mask_name, blocked_mask(n, cfg.window))
        else:
            mask = mask_input(g, n, cfg.window, mask_name)
    for i in range(n_layer):
        w = {name: weights[f"{prefix}.layers.{i}.{name}"] for name in LAYER_TENSORS}
        x = layer(g, x, w, cfg, pos, mask, arena)
    return ops.rms_norm(g, x, weights[f"{prefix}.norm.weight"], cfg.norm_eps)

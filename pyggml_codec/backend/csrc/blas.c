/* Matrix products and per-tap convs through the BLAS. */
#include "pg_kernels.h"

/* ggml_mul_mat through a CBLAS sgemm found at run time (kernels.py: numpy's bundled
 * OpenBLAS, or a library named by PYGGML_CODEC_BLAS). userdata: int64 [3] = the sgemm's
 * address, openblas_set_num_threads_local or 0 (pg_blas_enter), 1 for a 64-bit-integer interface.
 * src0 a: F32 ne [K, M, A2, A3], src1 b: F32 ne [K, N, B2, B3] (B2 % A2 == 0, B3 % A3 == 0),
 * both with contiguous rows; dst: contiguous F32 ne [M, N, B2, B3], dst[n][m] = a[m] . b[n].
 * Each ggml thread runs single-threaded sgemms on its blocks of the larger of M and N. */
void pg_mul_mat_blas(void * dst_, int ith, int nth, void * userdata) {
    const int64_t * p = userdata;
    struct pg_tensor * dst = dst_;
    const struct pg_tensor * a = dst->src[0], * b = dst->src[1];
    const int64_t k = a->ne[0], m = a->ne[1], n = b->ne[1];
    const int64_t lda = (int64_t)(a->nb[1] / sizeof(float)), ldb = (int64_t)(b->nb[1] / sizeof(float));
    const int64_t r2 = b->ne[2] / a->ne[2], r3 = b->ne[3] / a->ne[3];
    const int split_n = n >= m;
    const int64_t len = split_n ? n : m;
    int64_t i0, i1, block;
    pg_blocks(len, 16, len, ith, nth, &i0, &i1, &block);
    if (i0 >= i1) return;
    const int prev = pg_blas_enter(p);
    for (int64_t i3 = 0; i3 < b->ne[3]; i3++) {
        for (int64_t i2 = 0; i2 < b->ne[2]; i2++) {
            const float * ap = (const float *)((const char *)a->data + (i2 / r2) * a->nb[2] + (i3 / r3) * a->nb[3]);
            const float * bp = (const float *)((const char *)b->data + i2 * b->nb[2] + i3 * b->nb[3]);
            float * cp = (float *)((char *)dst->data + i2 * dst->nb[2] + i3 * dst->nb[3]);
            for (int64_t j0 = i0; j0 < i1; j0 += block) {  /* one call per block: see pg_blocks */
                const int64_t j1 = j0 + block < i1 ? j0 + block : i1;
                if (split_n) pg_sgemm(p, 1, j1 - j0, m, k, bp + j0 * ldb, ldb, ap, lda, 0.0f, cp + j0 * m, m);
                else pg_sgemm(p, 1, n, j1 - j0, k, bp, ldb, ap + j0 * lda, lda, 0.0f, cp + j0, m);
            }
        }
    }
    pg_blas_leave(p, prev);
}

/* Causal stride-1 conv of a channels-first signal as one GEMM per tap, through the BLAS
 * (no im2col): y[:, t] = sum_k W_k . xpad[:, t + k d], xpad = (prev or P zeros) then x,
 * P = (K - 1) d. userdata: int64 [10] = BLAS block (3, as pg_mul_mat_blas), K, d, chunk,
 * min_cols, min_chans, split_below (see below), S.
 * src0 w: contiguous F32 ne [Cin, Cout, K] (tap k: row-major Cout x Cin); src1 x: F32
 * ne [L, Cin] with contiguous rows; src2 (optional) prev: F32 ne [P, Cin], likewise;
 * dst: contiguous F32 ne [L, Cout]. Threads take blocks of time (at most `chunk` columns,
 * whose output stays in cache across the K taps) or, for short signals, of output channels.
 * S > 1 segments (a batched step): S streams of L / S samples in turn, each convolved after its
 * own context, prev ne [P, S, Cin]; a block of time that spans streams runs in one piece per stream. */

/* y[o0:o1, a:b] of pg_conv_taps: every tap, the last one (shift 0, which covers every
 * column) first so that it initialises the block */
static void taps_block(const int64_t * p, int64_t kk, int64_t d, int64_t cin, int64_t cout, const float * wp,
                       const float * xp, int64_t ldx, const float * pp, int64_t ldp, float * yp, int64_t ldy,
                       int64_t o0, int64_t o1, int64_t a, int64_t b) {
    const int64_t pad = (kk - 1) * d;
    for (int64_t k = kk - 1; k >= 0; k--) {
        const int64_t shift = pad - k * d;  /* output t reads x[t - shift] */
        const float * wk = wp + (k * cout + o0) * cin;
        const float beta = k == kk - 1 ? 0.0f : 1.0f;
        const int64_t s0 = a > shift ? a : shift;  /* columns fed by x */
        if (s0 < b)
            pg_sgemm(p, 0, o1 - o0, b - s0, cin, wk, cin, xp + (s0 - shift), ldx, beta, yp + o0 * ldy + s0, ldy);
        if (pp && a < shift) {  /* columns fed by the carried context: prev[t + k d] */
            const int64_t e = b < shift ? b : shift;
            pg_sgemm(p, 0, o1 - o0, e - a, cin, wk, cin, pp + (a + k * d), ldp, beta, yp + o0 * ldy + a, ldy);
        }
    }
}

void pg_conv_taps(void * dst_, int ith, int nth, void * userdata) {
    const int64_t * p = userdata;
    struct pg_tensor * dst = dst_;
    const struct pg_tensor * w = dst->src[0], * x = dst->src[1], * pv = dst->src[2];
    const int64_t kk = p[3], d = p[4], chunk = p[5], segs = p[9] > 1 ? p[9] : 1;
    const int64_t cin = w->ne[0], cout = w->ne[1], len = x->ne[1] == cin ? x->ne[0] : 0, seg = len / segs;
    const int64_t ldx = (int64_t)(x->nb[1] / sizeof(float)), ldy = dst->ne[0];
    const float * wp = w->data, * xp = x->data;
    const float * pp = pv ? pv->data : NULL;
    const int64_t ldp = pv ? (int64_t)(pv->nb[segs > 1 ? 2 : 1] / sizeof(float)) : 0;
    const int64_t seg_p = pv && segs > 1 ? (int64_t)(pv->nb[1] / sizeof(float)) : 0;
    float * yp = dst->data;
    /* Long signals: threads split time, in blocks of at least min_cols columns (every
     * block's sgemm packs all the weights of a tap: narrower blocks spend more on that than
     * on the products). Short ones (len < split_below, a streamed chunk): threads split the
     * output channels, in blocks of at least min_chans, so the weights are packed once in
     * all. Chosen by shape alone. */
    const int64_t min_cols = p[6], min_chans = p[7], split_below = p[8];
    const int by_time = len >= split_below;
    int64_t i0, i1, block;
    if (by_time) pg_blocks(len, min_cols, chunk > min_cols ? chunk : min_cols, ith, nth, &i0, &i1, &block);
    else pg_blocks(cout, min_chans, cout, ith, nth, &i0, &i1, &block);
    if (i0 >= i1) return;
    const int prev_threads = pg_blas_enter(p);
    for (int64_t a = i0; a < i1; a += block) {
        const int64_t b = a + block < i1 ? a + block : i1;
        /* the block's output channels and time ([a, b) of either), in one piece per stream */
        const int64_t o0 = by_time ? 0 : a, o1 = by_time ? cout : b, t_end = by_time ? b : len;
        for (int64_t t = by_time ? a : 0, t1; t < t_end; t = t1) {
            const int64_t s = t / seg;
            t1 = (s + 1) * seg < t_end ? (s + 1) * seg : t_end;
            taps_block(p, kk, d, cin, cout, wp, xp + s * seg, ldx, pp ? pp + s * seg_p : NULL, ldp, yp + s * seg, ldy,
                       o0, o1, t - s * seg, t1 - s * seg);
        }
    }
    pg_blas_leave(p, prev_threads);
}

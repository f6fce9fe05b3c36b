"""cffi build script for the small C kernels ggml runs as custom ops on the CPU backend.

Built at install time (``setup.py`` lists it in ``cffi_modules``) into
``pyggml_codec._kernels``. The kernels read ggml tensors through a mirror of the first
fields of ``struct ggml_tensor`` (ggml 0.15.3); ``kernels.py`` checks those offsets
against the binding's own struct before using them.

Snake: ggml's ``sin`` is a scalar loop, so the 5-op chain runs at a fraction of PyTorch's
speed; one pass with glibc's vectorized ``sinf`` (libmvec, enabled by -ffast-math) was
measured 16-20x faster than the chain on this project's machines (PERF_NOTES.md).
"""

import os
import sys

from cffi import FFI

CDEF = """
void pg_snake(void * dst, void * x, void * alpha, int ith, int nth, void * userdata);
void pg_im2col(void * dst, int ith, int nth, void * userdata);
void pg_bias_snake(void * dst, int ith, int nth, void * userdata);
void pg_add_bias_residual(void * dst, int ith, int nth, void * userdata);
void pg_mul_mat_blas(void * dst, int ith, int nth, void * userdata);
void pg_conv_taps(void * dst, int ith, int nth, void * userdata);
void pg_conv_wino(void * dst, int ith, int nth, void * userdata);
void pg_col2im(void * dst, int ith, int nth, void * userdata);
int pg_has_f16c(void);
int pg_tensor_layout(int64_t * offsets);
"""

SOURCE = r"""
#include <math.h>
#include <string.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <pthread.h>
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

struct pg_tensor {            /* mirrors struct ggml_tensor up to `data` (ggml 0.15.3) */
    int type;
    void * buffer;
    int64_t ne[4];
    size_t nb[4];
    int op;
    int32_t op_params[16];
    int32_t flags;
    void * src[10];
    void * view_src;
    size_t view_offs;
    void * data;
};

int pg_tensor_layout(int64_t * offsets) {
    offsets[0] = offsetof(struct pg_tensor, type);
    offsets[1] = offsetof(struct pg_tensor, ne);
    offsets[2] = offsetof(struct pg_tensor, nb);
    offsets[3] = offsetof(struct pg_tensor, src);
    offsets[4] = offsetof(struct pg_tensor, data);
    return 5;
}

/* Thread ith's share [i0, i1) of total elements split evenly over nth threads. */
static inline void pg_share(int64_t total, int ith, int nth, int64_t * i0, int64_t * i1) {
    const int64_t per = (total + nth - 1) / nth;
    *i0 = per * ith < total ? per * ith : total;
    *i1 = *i0 + per < total ? *i0 + per : total;
}

/* y = x + sin(a x)^2 / a over [n] values sharing one alpha */
static void snake_run(float * restrict y, const float * restrict x, int64_t n, float a) {
    const float inv = 1.0f / a;
    for (int64_t i = 0; i < n; i++) {
        const float s = sinf(a * x[i]);
        y[i] = x[i] + s * s * inv;
    }
}

/* alpha per element of a row (channels-last rows) */
static void snake_vec(float * restrict y, const float * restrict x, const float * restrict a, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float s = sinf(a[i] * x[i]);
        y[i] = x[i] + s * s / a[i];
    }
}

/* im2col of a 1-D conv, the same output as ggml_im2col (1-D): dst [IC*K, OW] with element
   (ic*K + k, t) = u[ic, t*s + k*d - p] (0 outside), where u is contiguous F32 x [L, IC] =
   dst->src[0], or, when dst->src[1] (contiguous F32 [P, IC]) is given, that carried left
   context followed by x: u = concat(src[1], x) along time, without building u.
   userdata: int64 {K, s, d, p}. Threads take blocks of output columns t; within a block the
   reads of one input channel stay in cache and the block of columns stays in L2. dst is
   F32 (type 0) or F16 (type 1, rounded to nearest even as ggml's F16C conversion does). */
#define PG_BLOCK 64
static inline uint16_t pg_to_f16(float v) {
#if defined(__F16C__)
    return _cvtss_sh(v, 0);
#else
    (void) v;
    return 0; /* not built: kernels.py refuses F16 without F16C */
#endif
}

/* n floats to F16 (round to nearest even), 8 at a time where F16C allows */
static inline void pg_store_f16(uint16_t * restrict o, const float * restrict v, int64_t n) {
    int64_t k = 0;
#if defined(__F16C__) && defined(__AVX__)
    for (; k + 8 <= n; k += 8)
        _mm_storeu_si128((__m128i *) (o + k), _mm256_cvtps_ph(_mm256_loadu_ps(v + k), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; k < n; k++) o[k] = pg_to_f16(v[k]);
}

void pg_im2col(void * dst_, int ith, int nth, void * userdata) {
    struct pg_tensor * dst = dst_;
    const struct pg_tensor * x = dst->src[0];
    const struct pg_tensor * prev = dst->src[1];
    const int64_t * prm = userdata;
    const int64_t K = prm[0], s = prm[1], d = prm[2], p = prm[3];
    const int64_t L = x->ne[0], IC = x->ne[1], OW = dst->ne[1], row = IC * K;
    const int64_t P = prev ? prev->ne[0] : 0, U = P + L;
    const int f16 = dst->type != 0;
    const float * xs = x->data;
    const float * ps = prev ? (const float *) prev->data : 0;
    const int64_t nblocks = (OW + PG_BLOCK - 1) / PG_BLOCK;
    for (int64_t b = ith; b < nblocks; b += nth) {
        const int64_t t0 = b * PG_BLOCK, t1 = t0 + PG_BLOCK < OW ? t0 + PG_BLOCK : OW;
        for (int64_t ic = 0; ic < IC; ic++) {
            const float * src = xs + ic * L - P;   /* src[j] = x[ic, j - P] for j >= P */
            const float * pre = ps ? ps + ic * P : 0;
            for (int64_t t = t0; t < t1; t++) {
                const int64_t base = t * s - p;
                const int interior = base >= P && base + (K - 1) * d < U;
                if (f16) {
                    uint16_t * o = (uint16_t *) dst->data + t * row + ic * K;
#if defined(__F16C__) && defined(__AVX2__)
                    /* 8 wide: values past K land on the next channels' first slots of this
                       column, which is written after this one (never for the last channel) */
                    if (K <= 8 && d == 1 && ic * K + 8 <= row && base >= P && base + 7 * d < U) {
                        const __m256 v = d == 1 ? _mm256_loadu_ps(src + base)
                                                : _mm256_i32gather_ps(src + base, _mm256_mullo_epi32(
                                                      _mm256_set1_epi32((int) d), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)), 4);
                        _mm_storeu_si128((__m128i *) o, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
                        continue;
                    }
#endif
                    if (interior) {
                        for (int64_t k = 0; k < K; k++) o[k] = pg_to_f16(src[base + k * d]);
                    } else {
                        for (int64_t k = 0; k < K; k++) {
                            const int64_t j = base + k * d;
                            o[k] = pg_to_f16(j < 0 || j >= U ? 0.0f : j < P ? pre[j] : src[j]);
                        }
                    }
                } else {
                    float * o = (float *) dst->data + t * row + ic * K;
                    if (interior) {
                        for (int64_t k = 0; k < K; k++) o[k] = src[base + k * d];
                    } else {
                        for (int64_t k = 0; k < K; k++) {
                            const int64_t j = base + k * d;
                            o[k] = j < 0 || j >= U ? 0.0f : j < P ? pre[j] : src[j];
                        }
                    }
                }
            }
        }
    }
}

/* The elements [i0, i1) of a contiguous [n0, rows] tensor, as runs within one row: calls
   fn(i, len, r, c) for each run starting at flat index i, row r, column c. */
#define PG_RUNS(i0, i1, n0, ...)                                                        \
    for (int64_t i = (i0); i < (i1);) {                                                  \
        const int64_t r = i / (n0), c = i - r * (n0);                                   \
        const int64_t len = ((n0) - c) < ((i1) - i) ? ((n0) - c) : ((i1) - i);           \
        __VA_ARGS__                                                                      \
        i += len;                                                                        \
    }

/* dst = snake(x + b): a conv's bias and the Snake after it in one pass (the same float
   operations as ggml_add then pg_snake). src0 x: contiguous F32 [n0, rows]; src1 alpha and
   src2 bias: F32, [n0, 1] (per column: channels-last) or [1, rows] (per row). dst: F32, or
   F16 (type 1: the input of an F16 conv, so no separate cast). */
void pg_bias_snake(void * dst_, int ith, int nth, void * userdata) {
    (void) userdata;
    struct pg_tensor * dst = dst_;
    const struct pg_tensor * x = dst->src[0], * alpha = dst->src[1], * bias = dst->src[2];
    const int64_t n0 = x->ne[0], rows = x->ne[1] * x->ne[2] * x->ne[3], total = n0 * rows;
    int64_t i0, i1;
    pg_share(total, ith, nth, &i0, &i1);
    const float * xs = x->data, * al = alpha->data, * bs = bias->data;
    const int per_row = alpha->ne[0] == 1, f16 = dst->type != 0;
    float tmp[256];
    PG_RUNS(i0, i1, n0, {
        for (int64_t j0 = 0; j0 < len; j0 += 256) {
            const int64_t m = len - j0 < 256 ? len - j0 : 256;
            const float * xi = xs + i + j0;
            float * y = f16 ? tmp : (float *) dst->data + i + j0;
            if (per_row) {
                const float a = al[r], b = bs[r], inv = 1.0f / a;
                for (int64_t k = 0; k < m; k++) {
                    const float t = xi[k] + b;
                    const float sn = sinf(a * t);
                    y[k] = t + sn * sn * inv;
                }
            } else {
                const float * a = al + c + j0, * b = bs + c + j0;
                for (int64_t k = 0; k < m; k++) {
                    const float t = xi[k] + b[k];
                    const float sn = sinf(a[k] * t);
                    y[k] = t + sn * sn / a[k];
                }
            }
            if (f16) pg_store_f16((uint16_t *) dst->data + i + j0, tmp, m);
        }
    })
}

/* dst = (h + b) + x: a conv's bias and the residual add after it in one pass (the order of
   ggml_add(ggml_add(h, b), x)). src0 h, src2 x: contiguous F32 [n0, rows]; src1 bias: F32
   [n0, 1] or [1, rows]. */
void pg_add_bias_residual(void * dst_, int ith, int nth, void * userdata) {
    (void) userdata;
    struct pg_tensor * dst = dst_;
    const struct pg_tensor * h = dst->src[0], * bias = dst->src[1], * x = dst->src[2];
    const int64_t n0 = h->ne[0], rows = h->ne[1] * h->ne[2] * h->ne[3], total = n0 * rows;
    int64_t i0, i1;
    pg_share(total, ith, nth, &i0, &i1);
    const float * hs = h->data, * bs = bias->data, * xs = x->data;
    float * ys = dst->data;
    const int per_row = bias->ne[0] == 1;
    PG_RUNS(i0, i1, n0, {
        if (per_row) {
            const float b = bs[r];
            for (int64_t k = 0; k < len; k++) ys[i + k] = (hs[i + k] + b) + xs[i + k];
        } else {
            for (int64_t k = 0; k < len; k++) ys[i + k] = (hs[i + k] + bs[c + k]) + xs[i + k];
        }
    })
}

/* ggml_mul_mat through a CBLAS sgemm found at run time (kernels.py: numpy's bundled
 * OpenBLAS, or a library named by PYGGML_CODEC_BLAS). userdata: int64 [3] = the sgemm's
 * address, the address of openblas_set_num_threads_local, 1 for a 64-bit-integer interface.
 * src0 a: F32 ne [K, M, A2, A3], src1 b: F32 ne [K, N, B2, B3] (B2 % A2 == 0, B3 % A3 == 0),
 * both with contiguous rows; dst: contiguous F32 ne [M, N, B2, B3], dst[n][m] = a[m] . b[n].
 * Each ggml thread runs single-threaded sgemms on its blocks of the larger of M and N. */
typedef void (*pg_sgemm32_t)(int, int, int, int32_t, int32_t, int32_t, float, const float *, int32_t,
                             const float *, int32_t, float, float *, int32_t);
typedef void (*pg_sgemm64_t)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t,
                             const float *, int64_t, float, float *, int64_t);
typedef int (*pg_set_threads_t)(int);
enum { PG_ROW_MAJOR = 101, PG_NO_TRANS = 111, PG_TRANS = 112 };

/* c[rows x cols] = b[rows x k] . op(a) + beta c, row-major; op(a) = a^T ([cols x k]) or a ([k x cols]) */
static void pg_sgemm(const int64_t * p, int trans_a, int64_t rows, int64_t cols, int64_t k, const float * b,
                     int64_t ldb, const float * a, int64_t lda, float beta, float * c, int64_t ldc) {
    const int ta = trans_a ? PG_TRANS : PG_NO_TRANS;
    if (p[2]) ((pg_sgemm64_t)(uintptr_t)p[0])(PG_ROW_MAJOR, PG_NO_TRANS, ta, rows, cols, k, 1.0f,
                                               b, ldb, a, lda, beta, c, ldc);
    else ((pg_sgemm32_t)(uintptr_t)p[0])(PG_ROW_MAJOR, PG_NO_TRANS, ta, (int32_t)rows, (int32_t)cols,
                                         (int32_t)k, 1.0f, b, (int32_t)ldb, a, (int32_t)lda, beta, c,
                                         (int32_t)ldc);
}

/* Thread ith's range [i0, i1) of whole blocks of [0, len). The blocks (about len / 16, at
 * least min_block, at most max_block, multiples of 16) depend on the shape alone, never on
 * nth: every output element is computed by the same sgemm call whatever the thread count,
 * so results do not change with it. */
static void pg_blocks(int64_t len, int64_t min_block, int64_t max_block, int ith, int nth, int64_t * i0,
                      int64_t * i1, int64_t * block) {
    int64_t b = ((len + 15) / 16 + 15) / 16 * 16;
    if (b < min_block) b = min_block;
    if (b > max_block) b = max_block / 16 * 16 > 16 ? max_block / 16 * 16 : 16;
    const int64_t nb = (len + b - 1) / b;
    const int64_t b0 = nb * ith / nth, b1 = nb * (ith + 1) / nth;
    *i0 = b0 * b < len ? b0 * b : len;
    *i1 = b1 * b < len ? b1 * b : len;
    *block = b;
}

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
    const int prev = ((pg_set_threads_t)(uintptr_t)p[1])(1);
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
    ((pg_set_threads_t)(uintptr_t)p[1])(prev);
}

/* Causal stride-1 conv of a channels-first signal as one GEMM per tap, through the BLAS
 * (no im2col): y[:, t] = sum_k W_k . xpad[:, t + k d], xpad = (prev or P zeros) then x,
 * P = (K - 1) d. userdata: int64 [9] = BLAS block (3, as pg_mul_mat_blas), K, d, chunk,
 * min_cols, min_chans, split_below (see below).
 * src0 w: contiguous F32 ne [Cin, Cout, K] (tap k: row-major Cout x Cin); src1 x: F32
 * ne [L, Cin] with contiguous rows; src2 (optional) prev: F32 ne [P, Cin], likewise;
 * dst: contiguous F32 ne [L, Cout]. Threads take blocks of time (at most `chunk` columns,
 * whose output stays in cache across the K taps) or, for short signals, of output channels. */

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
    const int64_t kk = p[3], d = p[4], chunk = p[5];
    const int64_t cin = w->ne[0], cout = w->ne[1], len = x->ne[1] == cin ? x->ne[0] : 0;
    const int64_t ldx = (int64_t)(x->nb[1] / sizeof(float)), ldy = dst->ne[0];
    const float * wp = w->data, * xp = x->data;
    const float * pp = pv ? pv->data : NULL;
    const int64_t ldp = pv ? (int64_t)(pv->nb[1] / sizeof(float)) : 0;
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
    const int prev_threads = ((pg_set_threads_t)(uintptr_t)p[1])(1);
    for (int64_t a = i0; a < i1; a += block) {
        const int64_t b = a + block < i1 ? a + block : i1;
        if (by_time) taps_block(p, kk, d, cin, cout, wp, xp, ldx, pp, ldp, yp, ldy, 0, cout, a, b);
        else taps_block(p, kk, d, cin, cout, wp, xp, ldx, pp, ldp, yp, ldy, a, b, 0, len);
    }
    ((pg_set_threads_t)(uintptr_t)p[1])(prev_threads);
}

/* Causal dilated conv by Winograd F(m, K) (no im2col): the same y as pg_conv_taps with
 * n = m + K - 1 GEMMs per m outputs instead of m K (F(2,7): 8 for 14; F(4,7): 10 for 28).
 * Tile (b, j) of dilation d holds the outputs t = j + d (m b + i), i < m, j < d; its n
 * inputs are xpad at j + d (m b - (K - 1) + r), r < n (the causal context: prev or zeros;
 * past the end: zeros, which only reach outputs past the end, dropped). Per tile:
 * v = BT . inputs, m_p = U_p . v_p for the n points p (U_p = G_p . W, made on the host:
 * kernels.winograd_weights), y_i = sum_p A[i][p] m_p. userdata: int64 [10] = BLAS block (3),
 * d, block (tile rows of m outputs per thread block), split_below, min_chans, m, n, the
 * address of the F32 tables BT (n x n) then A (m x n). src0 u: contiguous F32 ne
 * [Cin, Cout, n]; src1 x: F32 ne [L, Cin] with contiguous rows; src2 (optional) prev: F32
 * ne [(K - 1) d, Cin], likewise; dst: contiguous F32 ne [L, Cout]. Threads split blocks of
 * tile rows or, for short signals, the output channels; chosen by shape alone, as in
 * pg_conv_taps, so results do not depend on the thread count. */
enum { PG_WINO_MAX_N = 16 };

/* Scratch buffers kept between calls: a fresh multi-MB malloc per call came back as fresh
 * pages, and clearing them took 15 % of a 64-channel conv's time. Slots are taken under a
 * lock (graphs may compute in several threads at once) and grown when too small; they
 * live as long as the process (a few MB per compute thread). */
#define PG_SCRATCH_SLOTS 64
static pthread_mutex_t pg_scratch_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { float * data; size_t n; int busy; } pg_scratch[PG_SCRATCH_SLOTS];

static float * scratch_take(size_t n, int * slot) {
    int pick = -1;
    pthread_mutex_lock(&pg_scratch_lock);
    for (int i = 0; i < PG_SCRATCH_SLOTS; i++) {  /* a free slot large enough, else any free one */
        if (pg_scratch[i].busy) continue;
        if (pg_scratch[i].n >= n) { pick = i; break; }
        if (pick < 0) pick = i;
    }
    if (pick >= 0) pg_scratch[pick].busy = 1;
    pthread_mutex_unlock(&pg_scratch_lock);
    *slot = pick;
    if (pick < 0) return malloc(sizeof(float) * n);  /* more threads than slots: uncached */
    if (pg_scratch[pick].n < n) {
        free(pg_scratch[pick].data);
        pg_scratch[pick].data = malloc(sizeof(float) * n);
        pg_scratch[pick].n = pg_scratch[pick].data ? n : 0;
    }
    return pg_scratch[pick].data;
}

static void scratch_give(float * data, int slot) {
    if (slot < 0) { free(data); return; }
    pthread_mutex_lock(&pg_scratch_lock);
    pg_scratch[slot].busy = 0;
    pthread_mutex_unlock(&pg_scratch_lock);
}

struct wino {
    int64_t m, n, kk, d, len, cin, cout;
    const float * bt, * at;  /* BT n x n, A m x n */
    const float * x, * prev, * u;
    int64_t ldx, ldp;
    float * y;
    int64_t ldy;
};

/* v_p[q] = sum_r BT[p][r] e_{r % m}[q + r / m] for q < nb, p < n: 8 tiles at a time with
 * the n inputs in registers (n and m constant where inlined), the rest one by one. */
static inline __attribute__((always_inline)) void wino_bt_n(const float * restrict bt, const int64_t n,
        const int64_t m, const float * restrict e, int64_t ng, int64_t nb, float * restrict v, int64_t plane) {
    int64_t q = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; q + 8 <= nb; q += 8) {
        __m256 in[PG_WINO_MAX_N];
        for (int64_t r = 0; r < n; r++) in[r] = _mm256_loadu_ps(e + (r % m) * ng + r / m + q);
        for (int64_t p = 0; p < n; p++) {
            __m256 acc = _mm256_mul_ps(_mm256_set1_ps(bt[p * n]), in[0]);
            for (int64_t r = 1; r < n; r++) acc = _mm256_fmadd_ps(_mm256_set1_ps(bt[p * n + r]), in[r], acc);
            _mm256_storeu_ps(v + p * plane + q, acc);
        }
    }
#endif
    for (; q < nb; q++)
        for (int64_t p = 0; p < n; p++) {
            float acc = 0.0f;
            for (int64_t r = 0; r < n; r++) acc += bt[p * n + r] * e[(r % m) * ng + r / m + q];
            v[p * plane + q] = acc;
        }
}

static void wino_bt(const float * bt, int64_t n, int64_t m, const float * e, int64_t ng, int64_t nb, float * v,
                    int64_t plane) {
    if (n == 10 && m == 4) wino_bt_n(bt, 10, 4, e, ng, nb, v, plane);
    else if (n == 8 && m == 2) wino_bt_n(bt, 8, 2, e, ng, nb, v, plane);
    else wino_bt_n(bt, n, m, e, ng, nb, v, plane);
}

/* y[t0 + m d k] (i-th output of tile k) = sum_p A[i][p] m_p[k] for k < nq_i, i < m, where
 * m_p = mr + p * mplane: 8 tiles at a time with the n products in registers. */
static inline __attribute__((always_inline)) void wino_at_n(const float * restrict at, const int64_t n,
        const int64_t m, const float * restrict mr, int64_t mplane, int64_t nb, const int64_t * nq, float * yr,
        const int64_t * t0, int64_t step) {
    int64_t q = 0;
    const int64_t full = nq[m - 1] < nb ? nq[m - 1] : nb;  /* tiles whose m outputs all fall before len */
#if defined(__AVX2__) && defined(__FMA__)
    for (; q + 8 <= full; q += 8) {
        __m256 mv[PG_WINO_MAX_N];
        for (int64_t p = 0; p < n; p++) mv[p] = _mm256_loadu_ps(mr + p * mplane + q);
        for (int64_t i = 0; i < m; i++) {
            __m256 acc = _mm256_mul_ps(_mm256_set1_ps(at[i * n]), mv[0]);
            for (int64_t p = 1; p < n; p++) acc = _mm256_fmadd_ps(_mm256_set1_ps(at[i * n + p]), mv[p], acc);
            float out[8];
            _mm256_storeu_ps(out, acc);
            float * yo = yr + t0[i] + step * q;
            for (int k = 0; k < 8; k++) yo[step * k] = out[k];
        }
    }
#endif
    for (int64_t i = 0; i < m; i++)
        for (int64_t k = q; k < nq[i]; k++) {
            float acc = 0.0f;
            for (int64_t p = 0; p < n; p++) acc += at[i * n + p] * mr[p * mplane + k];
            yr[t0[i] + step * k] = acc;
        }
}

static void wino_at(const float * at, int64_t n, int64_t m, const float * mr, int64_t mplane, int64_t nb,
                    const int64_t * nq, float * yr, const int64_t * t0, int64_t step) {
    if (n == 10 && m == 4) wino_at_n(at, 10, 4, mr, mplane, nb, nq, yr, t0, step);
    else if (n == 8 && m == 2) wino_at_n(at, 8, 2, mr, mplane, nb, nq, yr, t0, step);
    else wino_at_n(at, n, m, mr, mplane, nb, nq, yr, t0, step);
}

/* Input transform of tile rows [b0, b0 + nb) for every input channel: v[p][ci][j nb + q].
 * The inputs of channel ci, residue j are first gathered (strided by d) and split by phase:
 * e_i[q] = xpad(j + d (m (b0 + q) - (K - 1) + i)), so that input r of tile q is
 * e_{r % m}[q + r / m]. */
static void wino_input(const struct wino * w, int64_t b0, int64_t nb, float * restrict gbuf, float * restrict v,
                       int64_t ldv, int64_t plane) {
    const int64_t m = w->m, n = w->n, d = w->d, ng = nb + (n - 1) / m;
    for (int64_t ci = 0; ci < w->cin; ci++) {
        const float * xr = w->x + ci * w->ldx;
        const float * pr = w->prev ? w->prev + ci * w->ldp : NULL;
        for (int64_t j = 0; j < d; j++) {
            const int64_t c0 = j + d * (m * b0 - (w->kk - 1));  /* column of e_0[0] */
            const int inside = c0 >= 0 && c0 + d * (m * ng - 1) < w->len;
            for (int64_t i = 0; i < m; i++) {
                float * restrict e = gbuf + i * ng;
                if (inside) {
                    const float * s = xr + c0 + i * d;
                    for (int64_t q = 0; q < ng; q++) e[q] = s[m * d * q];
                } else {
                    for (int64_t q = 0; q < ng; q++) {
                        const int64_t c = c0 + d * (m * q + i);
                        e[q] = c < 0 ? (pr ? pr[(w->kk - 1) * d + c] : 0.0f) : (c < w->len ? xr[c] : 0.0f);
                    }
                }
            }
            wino_bt(w->bt, n, m, gbuf, ng, nb, v + ci * ldv + j * nb, plane);
        }
    }
}

/* Rows [o0, o1) of the tile rows whose transform is v: the n products, then the output
 * transform straight into y (outputs before len). */
static void wino_rows(const int64_t * p, const struct wino * w, int64_t b0, int64_t nb, const float * v,
                      int64_t ldv, int64_t plane, float * restrict mbuf, int64_t mplane, int64_t o0, int64_t o1) {
    const int64_t m = w->m, n = w->n, d = w->d, nt = nb * d, rows = o1 - o0;
    for (int64_t q = 0; q < n; q++)
        pg_sgemm(p, 0, rows, nt, w->cin, w->u + (q * w->cout + o0) * w->cin, w->cin, v + q * plane, ldv, 0.0f,
                 mbuf + q * mplane, ldv);
    for (int64_t r = 0; r < rows; r++) {
        float * yr = w->y + (o0 + r) * w->ldy;
        for (int64_t j = 0; j < d; j++) {
            const float * mr = mbuf + r * ldv + j * nb;
            int64_t t0[PG_WINO_MAX_N], nq[PG_WINO_MAX_N];
            for (int64_t i = 0; i < m; i++) {
                t0[i] = j + d * (m * b0 + i);  /* output of tile q: t0 + m d q */
                const int64_t cnt = t0[i] < w->len ? (w->len - t0[i] + m * d - 1) / (m * d) : 0;
                nq[i] = cnt < nb ? cnt : nb;
            }
            wino_at(w->at, n, m, mr, mplane, nb, nq, yr, t0, m * d);
        }
    }
}

void pg_conv_wino(void * dst_, int ith, int nth, void * userdata) {
    const int64_t * p = userdata;
    struct pg_tensor * dst = dst_;
    const struct pg_tensor * u = dst->src[0], * x = dst->src[1], * pv = dst->src[2];
    const float * tables = (const float *)(uintptr_t)p[9];
    struct wino w = {
        .m = p[7], .n = p[8], .kk = p[8] - p[7] + 1, .d = p[3], .len = x->ne[0], .cin = u->ne[0],
        .cout = u->ne[1], .bt = tables, .at = tables + p[8] * p[8], .x = x->data, .prev = pv ? pv->data : NULL,
        .u = u->data, .ldx = (int64_t)(x->nb[1] / sizeof(float)),
        .ldp = pv ? (int64_t)(pv->nb[1] / sizeof(float)) : 0, .y = dst->data, .ldy = dst->ne[0],
    };
    const int64_t block_rows = p[4], split_below = p[5], min_chans = p[6];
    if (w.n > PG_WINO_MAX_N || w.m < 1 || w.kk < 1) return;
    const int64_t nrows = (w.len + w.m * w.d - 1) / (w.m * w.d);  /* tile rows: m d outputs each */
    const int by_time = w.len >= split_below;
    int64_t i0, i1, block;
    if (by_time) {  /* whole blocks of block_rows tile rows */
        const int64_t nb = (nrows + block_rows - 1) / block_rows;
        const int64_t b0 = nb * ith / nth, b1 = nb * (ith + 1) / nth;
        block = block_rows;
        i0 = b0 * block < nrows ? b0 * block : nrows;
        i1 = b1 * block < nrows ? b1 * block : nrows;
    } else pg_blocks(w.cout, min_chans, w.cout, ith, nth, &i0, &i1, &block);
    if (i0 >= i1) return;
    const int64_t nb = by_time ? (block < i1 - i0 ? block : i1 - i0) : nrows;
    const int64_t nt = nb * w.d, rows = by_time ? w.cout : (block < i1 - i0 ? block : i1 - i0);
    /* Row strides off multiples of 1 KiB and planes staggered by 128 B: the transform
     * streams and the GEMM panels would otherwise fall on the same cache sets (measured: a
     * 64-channel conv at d = 1 took 1.9x the per-tap time, 1.0x with the padding) */
    int64_t ldv = (nt + 15) / 16 * 16;
    if (ldv % 256 == 0) ldv += 16;
    const int64_t ng = nb + (w.n - 1) / w.m;
    const int64_t plane = w.cin * ldv + 32, mplane = rows * ldv + 32;
    const size_t floats = (size_t)(w.m * ng + w.n * plane + w.n * mplane);
    int slot;
    float * buf = scratch_take(floats, &slot);
    if (!buf) { scratch_give(buf, slot); return; }  /* out of memory: the output is left unset */
    float * gbuf = buf, * v = gbuf + w.m * ng, * mbuf = v + w.n * plane;
    const int prev_threads = ((pg_set_threads_t)(uintptr_t)p[1])(1);
    if (by_time) {
        for (int64_t b0 = i0; b0 < i1; b0 += block) {
            const int64_t cnt = b0 + block < i1 ? block : i1 - b0;
            wino_input(&w, b0, cnt, gbuf, v, ldv, plane);
            wino_rows(p, &w, b0, cnt, v, ldv, plane, mbuf, mplane, 0, w.cout);
        }
    } else {
        wino_input(&w, 0, nrows, gbuf, v, ldv, plane);
        for (int64_t a = i0; a < i1; a += block) {
            const int64_t b = a + block < i1 ? a + block : i1;
            wino_rows(p, &w, 0, nrows, v, ldv, plane, mbuf, mplane, a, b);
        }
    }
    ((pg_set_threads_t)(uintptr_t)p[1])(prev_threads);
    scratch_give(buf, slot);
}

/* Overlap-add of conv-transpose columns (ggml_col2im_1d's layout and values, padding 0):
 * src0 cols: contiguous F32 ne [K*Cout, T], row oc*K + k of column t; dst: contiguous F32
 * ne [(T-1)*s + K, Cout], y[oc][t*s + k] += cols[t][oc*K + k]. Threads split the output
 * channels; time runs outermost, so the columns are read in order and each channel's
 * output is written as one forward stream. userdata: int64 [2] = K, s. */
void pg_col2im(void * dst_, int ith, int nth, void * userdata) {
    const int64_t * p = userdata;
    struct pg_tensor * dst = dst_;
    const struct pg_tensor * cols = dst->src[0];
    const int64_t kk = p[0], st = p[1];
    const int64_t lout = dst->ne[0], cout = dst->ne[1], t_in = cols->ne[1], row = cols->ne[0];
    int64_t o0, o1;
    pg_share(cout, ith, nth, &o0, &o1);
    float * y = dst->data;
    const float * c = cols->data;
    for (int64_t oc = o0; oc < o1; oc++) memset(y + oc * lout, 0, sizeof(float) * (size_t)lout);
    for (int64_t t = 0; t < t_in; t++) {
        const float * ct = c + t * row;
        for (int64_t oc = o0; oc < o1; oc++) {
            float * restrict yo = y + oc * lout + t * st;
            const float * restrict co = ct + oc * kk;
            for (int64_t k = 0; k < kk; k++) yo[k] += co[k];
        }
    }
}

int pg_has_f16c(void) {
#if defined(__F16C__)
    return 1;
#else
    return 0;
#endif
}

/* dst, x: contiguous F32 [n0, rows]; alpha: F32, [1, rows] (one per row) or [n0, 1] (one per column). */
void pg_snake(void * dst_, void * x_, void * alpha_, int ith, int nth, void * userdata) {
    (void) userdata;
    struct pg_tensor * dst = dst_, * x = x_, * alpha = alpha_;
    const int64_t n0 = x->ne[0];
    const int64_t rows = x->ne[1] * x->ne[2] * x->ne[3];
    const int64_t total = n0 * rows;
    int64_t i0, i1;
    pg_share(total, ith, nth, &i0, &i1);
    const float * xs = x->data;
    const float * al = alpha->data;
    float * ys = dst->data;
    const int per_row = alpha->ne[0] == 1;
    for (int64_t i = i0; i < i1;) {
        const int64_t r = i / n0, c = i - r * n0;
        const int64_t len = (n0 - c) < (i1 - i) ? (n0 - c) : (i1 - i);
        if (per_row) snake_run(ys + i, xs + i, len, al[r % alpha->ne[1]]);
        else snake_vec(ys + i, xs + i, al + c, len);
        i += len;
    }
}
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
_flags = ["-O3", "-ffast-math"]  # -ffast-math (with finite-math) makes glibc declare the SIMD sinf
if os.environ.get("PYGGML_CODEC_PORTABLE") != "1" and sys.platform != "darwin":
    _flags.append("-march=native")
ffibuilder.set_source(
    "pyggml_codec._kernels",
    SOURCE,
    extra_compile_args=_flags,
    libraries=["m", "mvec"] if sys.platform.startswith("linux") else ["m"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)

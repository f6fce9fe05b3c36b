/* Shared by the compiled CPU kernels (built by _kernels_build.py into pyggml_codec._kernels):
 * the view of struct ggml_tensor they read, thread shares, and the CBLAS sgemm they call. */
#ifndef PG_KERNELS_H
#define PG_KERNELS_H

#include <math.h>
#include <string.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <pthread.h>
#if defined(__F16C__) || defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif

#if defined(__AVX__)
/* The 8 lanes of v added by one fixed tree: lanes k and k + 4, then k and k + 2, then the pair
 * (the row products' and the fused attention's sums). */
static inline float pg_hsum8(__m256 v) {
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 p = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(p, _mm_movehdup_ps(p)));
}
#endif

#if defined(__AVX512F__)
/* The 16 lanes of v added by the tree of pg_hsum8 after lanes k and k + 8 (the tree of GCC's
 * _mm512_reduce_add_ps too) */
static inline float pg_hsum16(__m512 v) {
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return pg_hsum8(_mm256_add_ps(_mm512_castps512_ps256(v), hi));
}

/* pg_hsum16 of each of v[0..16), as one vector: lane 4 L + c holds pg_hsum16(v[4 c + L]). The
 * same adds (lanes l and l + 8, then l and l + 4, l and l + 2, the pair), four outputs at a time
 * per shuffle instead of one. */
static inline __attribute__((always_inline)) __m512 pg_sum16(const __m512 * v) {
    __m512 t[8], u[4], w[2];
    for (int p = 0; p < 8; p++)
        t[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], 0xEE));
    for (int p = 0; p < 4; p++)
        u[p] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * p], t[2 * p + 1], 0x88),
                             _mm512_shuffle_f32x4(t[2 * p], t[2 * p + 1], 0xDD));
    for (int p = 0; p < 2; p++)
        w[p] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * p], u[2 * p + 1], 0x44), _mm512_shuffle_ps(u[2 * p], u[2 * p + 1], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));
}

/* pg_sum16 with lane i holding pg_hsum16(v[i]) */
static inline __attribute__((always_inline)) __m512 pg_sum16_in_order(const __m512 * v) {
    /* lane 4 L + c of pg_sum16 is output 4 c + L */
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, pg_sum16(v));
}

/* out[i] = pg_hsum16(v[i]) for i < n (n <= 24): fewer than 8 one at a time, else 16 at a time */
static inline __attribute__((always_inline)) void pg_sums16(const __m512 * v, int n, float * out) {
    if (n < 8) {
        for (int i = 0; i < n; i++) out[i] = pg_hsum16(v[i]);
        return;
    }
    for (int i0 = 0; i0 < n; i0 += 16) {
        __m512 g[16];
        for (int i = 0; i < 16; i++) g[i] = i0 + i < n ? v[i0 + i] : _mm512_setzero_ps();
        const __m512 s = pg_sum16_in_order(g);
        if (n - i0 >= 16) _mm512_storeu_ps(out + i0, s);
        else _mm512_mask_storeu_ps(out + i0, (__mmask16)((1u << (n - i0)) - 1), s);
    }
}
#endif

#if defined(__AVX2__)
/* dst[t * ldd + c] = src[c * lds + t] for c, t < 8 */
static inline void pg_transpose8(const float * restrict src, int64_t lds, float * restrict dst, int64_t ldd) {
    __m256 r[8], a[8], b[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + i * lds);
    for (int i = 0; i < 8; i += 2) {
        a[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        a[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        b[i] = _mm256_shuffle_ps(a[i], a[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        b[i + 1] = _mm256_shuffle_ps(a[i], a[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        b[i + 2] = _mm256_shuffle_ps(a[i + 1], a[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        b[i + 3] = _mm256_shuffle_ps(a[i + 1], a[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(b[i], b[i + 4], 0x20));
        _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(b[i], b[i + 4], 0x31));
    }
}
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

/* Thread ith's share [i0, i1) of total elements split evenly over nth threads. */
static inline void pg_share(int64_t total, int ith, int nth, int64_t * i0, int64_t * i1) {
    const int64_t per = (total + nth - 1) / nth;
    *i0 = per * ith < total ? per * ith : total;
    *i1 = *i0 + per < total ? *i0 + per : total;
}

/* The CBLAS sgemm found at run time (kernels.py): userdata int64 [3] = its address, the
 * address of openblas_set_num_threads_local, 1 for a 64-bit-integer interface. */
typedef void (*pg_sgemm32_t)(int, int, int, int32_t, int32_t, int32_t, float, const float *, int32_t,
                             const float *, int32_t, float, float *, int32_t);
typedef void (*pg_sgemm64_t)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t,
                             const float *, int64_t, float, float *, int64_t);
typedef int (*pg_set_threads_t)(int);

/* Every sgemm must run single-threaded inside OpenBLAS: its threaded driver sums in another
 * order on some kernels (Haswell's: 2.7e-5 apart on a 96 x 256 . 256 x 64 product), and the
 * direct AVX-512 path is chosen by the thread count too. p[1] is openblas_set_num_threads_local
 * where that count is per thread (an OpenMP OpenBLAS), else 0: a pthreads OpenBLAS has one
 * count for the process (its "_local" setter sets that), which Python holds at 1 around every
 * compute (kernels.Blas.single_threaded). Setting and restoring it here raced between ggml's
 * threads: one thread's restore let another's next sgemm run threaded. */
static inline int pg_blas_enter(const int64_t * p) { return p[1] ? ((pg_set_threads_t)(uintptr_t)p[1])(1) : 0; }
static inline void pg_blas_leave(const int64_t * p, int prev) { if (p[1]) ((pg_set_threads_t)(uintptr_t)p[1])(prev); }
enum { PG_ROW_MAJOR = 101, PG_NO_TRANS = 111, PG_TRANS = 112 };

/* c[rows x cols] = b[rows x k] . op(a) + beta c, row-major; op(a) = a^T ([cols x k]) or a ([k x cols]) */
static inline void pg_sgemm(const int64_t * p, int trans_a, int64_t rows, int64_t cols, int64_t k, const float * b,
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
static inline void pg_blocks(int64_t len, int64_t min_block, int64_t max_block, int ith, int nth, int64_t * i0,
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

/* The functions exported to Python: _kernels_build.py hands this block to cffi's cdef. */
/* cffi exports: begin */
/* Scratch buffers kept between calls (scratch.c): take a slot of at least n floats, give it back. Where
   the buffer cannot grow, take returns NULL with *slot -1 and keeps nothing busy: nothing to give. */
float * pg_scratch_take(size_t n, int * slot);
void pg_scratch_give(float * data, int slot);
int64_t pg_scratch_failures(void);  /* takes refused so far in this build's module: outputs left unset */
void pg_snake(void * dst, void * x, void * alpha, int ith, int nth, void * userdata);
void pg_im2col(void * dst, int ith, int nth, void * userdata);
void pg_bias_snake(void * dst, int ith, int nth, void * userdata);
void pg_add_bias_residual(void * dst, int ith, int nth, void * userdata);
void pg_mul_mat_blas(void * dst, int ith, int nth, void * userdata);
void pg_conv_taps(void * dst, int ith, int nth, void * userdata);
void pg_conv_wino(void * dst, int ith, int nth, void * userdata);
void pg_conv_wino_input(void * dst, int ith, int nth, void * userdata);
void pg_col2im(void * dst, int ith, int nth, void * userdata);
void pg_transpose(void * dst, int ith, int nth, void * userdata);
void pg_mul_mat_rowdot(void * dst, int ith, int nth, void * userdata);
void pg_conv_c1(void * dst, int ith, int nth, void * userdata);
void pg_window_attention(void * dst, int ith, int nth, void * userdata);
void pg_causal_attention(void * dst, int ith, int nth, void * userdata);
int pg_rowdot(int64_t m, int64_t n, int64_t k, const void * a, int64_t lda, int a_kind, const float * b, int64_t ldb,
              float beta, float * c, int64_t csi, int64_t csj, int64_t panel);
int pg_rowdot_lanes(void);  /* floats per vector of the row products; 0: not built */
int pg_rowdot_kx_fits(int64_t m, int64_t n, int64_t k);  /* whether pg_rowdot_kx takes the shape (register tiles) */
int pg_rowdot_kx(int64_t m, int64_t n, int64_t k, const float * a, int64_t lda, const float * bk, int64_t ldbk,
                 float * c, int64_t csi);  /* pg_rowdot's sums, B given k-major: B[j][k] = bk[k ldbk + j]; 0: not taken */
void pg_rowdot_tiles_use(int on);  /* long products in register tiles (1, the default) or as row products (0): the same sums; not while a compute runs */
void pg_rowdot_pf_ahead_bytes(int64_t n);  /* narrow row loops fetch blocks of rows this many bytes ahead (8192, the default; 0: the next block): the same sums; not while a compute runs */
void pg_rowdot_two_rows_max_bytes(int64_t n);  /* narrow products of F16 rows in 2-row blocks only where their columns fit this many bytes as F32 (32768, the default): the same sums; not while a compute runs */
int pg_has_f16c(void);
void pg_f16_soft(const float * x, uint16_t * out, int64_t n);  /* F16 without F16C (tested in every build) */
int pg_tensor_layout(int64_t * offsets);
/* Graph.timeline (timeline.c): a kernel's call timed per thread; the clock they read */
void pg_timed(void * dst, int ith, int nth, void * userdata);
void pg_timed2(void * dst, void * a, void * b, int ith, int nth, void * userdata);
int64_t pg_clock_ns(void);
/* the exact build's only (ggmldot.c; libm's sinf in vectors, elementwise.c) */
void pg_sinf_exact(const float * x, float * y, int64_t n);
int64_t pg_sinf_exact_check(uint32_t b0, uint32_t b1, uint32_t step);
void pg_sinf_exact_use(int on);
int pg_sinf_exact_lanes(void);  /* values per vector of the replica of libm's sinf; 0: not built */
void pg_mul_mat_f16dot(void * dst, int ith, int nth, void * userdata);
int pg_f16dot_product(int f32, int64_t m, int64_t n, int64_t k, const void * a, const void * b, float * c);
int pg_f16dot_lanes(void);  /* ggml's F16 dot product's lanes reproduced (16, 8); 0: not built */
void pg_f16dot_pairs_max_steps(int64_t n);  /* F16 products of at most n whole steps of ggml's loop (8, the default; 0: none) run its chains two at a time: the same sums; not while a compute runs */
/* cffi exports: end */

#endif

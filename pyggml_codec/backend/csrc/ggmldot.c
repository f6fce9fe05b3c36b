/* ggml's F16 and F32 matrix products, bit for bit, in register blocks (the "s2cpp" precision).
 *
 * ggml 0.15.3's CPU mul_mat of an F16 matrix computes every output by one ggml_vec_dot_f16
 * call over a row of each operand (an F32 src1 first rounded to F16), that of two F32 matrices by
 * one ggml_vec_dot_f32 call (the same loop over F32 lanes, summed in float): it reads two vectors per
 * multiply-add and leaves the FMA units idle most of the time. The value of each output is
 * fixed by that function's summation order, not by how the outputs are grouped, so here an
 * R x C block of outputs shares its loads (R + C vector loads per R C multiply-adds) and every
 * output is still summed exactly as ggml_vec_dot_f16 sums it on x86:
 *
 *   V lanes (16 floats with AVX-512, 8 with AVX2; 32 halves in a build for AVX512-FP16, where
 *   ggml multiplies and adds F16 values in half precision), STEP = 4 V, np = n rounded down to STEP;
 *   four accumulators x[j] (j < 4), lane l of x[j] the FMA chain over k = STEP s + V j + l;
 *   x[0] += x[2], x[1] += x[3], x[0] += x[1]; the lanes added by the same intrinsic ggml uses
 *   (_mm512_reduce_add_ps or _mm512_reduce_add_ph, or the 128-bit add and two hadds), widened
 *   to double; the k >= np leftovers added one by one in double, each product taken in float;
 *   the double rounded to float. (ggml_vec_dot_f32: 16 or 8 float lanes in every build, the
 *   reduction and the leftovers in float.)
 *
 * Each accumulator is its own chain, so the block runs the four one after another (one pass
 * per j over the whole vectors: R C accumulators in registers instead of 4 R C); short F16
 * products with AVX-512 run them two at a time in smaller blocks instead (gp_block).
 * This file is compiled in the exact build only: no -ffast-math, no FMA contraction (the C
 * arithmetic here must be the one written). kernels.py uses it only where its products of random
 * rows equal those of this ggml build's own vec_dot, bit for bit (pg_f16dot_product, at import). */
#include "pg_kernels.h"

#if defined(__AVX512F__) && defined(__F16C__)
#define GD_V 16
#define GD_R 4
#define GD_C 6
typedef __m512 gd_vf;
#define GD_ZERO() _mm512_setzero_ps()
#define GD_LOADH(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define GD_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define GD_ADD(a, b) _mm512_add_ps(a, b)
#define GD_STORE(p, v) _mm512_storeu_ps(p, v)
#define GD_LOAD(p) _mm512_loadu_ps(p)
static inline float gd_lanes(gd_vf x) { return _mm512_reduce_add_ps(x); }
#define GD_DL 8  /* doubles per vector: the leftovers of up to GD_C columns side by side */
typedef __m512d gd_vd;
#define GD_DLOAD(p) _mm512_loadu_pd(p)
#define GD_DSTORE(p, v) _mm512_storeu_pd(p, v)
#define GD_DFMA(a, b, c) _mm512_fmadd_pd(a, b, c)
#define GD_DSET1(x) _mm512_set1_pd(x)
#define GD_HLOAD(p) _mm256_loadu_ps(p)
#define GD_WIDEN(v) _mm512_cvtps_pd(v)
#define GD_BUILT 1
#if defined(__AVX512FP16__)
#define GD_HALF 1  /* ggml_vec_dot_f16 in half precision: GGML_F16x32, 32 lanes, steps of 128 */
#define GH_V 32
#endif
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(__AVX512F__)
#define GD_V 8
#define GD_R 3
#define GD_C 4
typedef __m256 gd_vf;
#define GD_ZERO() _mm256_setzero_ps()
#define GD_LOADH(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define GD_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define GD_ADD(a, b) _mm256_add_ps(a, b)
#define GD_STORE(p, v) _mm256_storeu_ps(p, v)
#define GD_LOAD(p) _mm256_loadu_ps(p)
static inline float gd_lanes(gd_vf x) {  /* GGML_F32x8_REDUCE's last steps */
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    return _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
}
#define GD_DL 4
typedef __m256d gd_vd;
#define GD_DLOAD(p) _mm256_loadu_pd(p)
#define GD_DSTORE(p, v) _mm256_storeu_pd(p, v)
#define GD_DFMA(a, b, c) _mm256_fmadd_pd(a, b, c)
#define GD_DSET1(x) _mm256_set1_pd(x)
#define GD_HLOAD(p) _mm_loadu_ps(p)
#define GD_WIDEN(v) _mm256_cvtps_pd(v)
#define GD_BUILT 1
#else
#define GD_BUILT 0
#endif
#ifndef GD_HALF
#define GD_HALF 0
#define GH_V GD_V
#endif

#if GD_BUILT
int pg_f16dot_lanes(void) { return GH_V; }  /* the F16 product's lanes */
#define GD_STEP (4 * GD_V)  /* ggml_vec_dot_f32's, and ggml_vec_dot_f16's outside a half build */
#define GH_STEP (4 * GH_V)  /* ggml_vec_dot_f16's */

/* Lane vector at k of an F16 row (f32 == 0) or of an F32 row */
static inline __attribute__((always_inline)) gd_vf gd_at(const void * row, const int f32, int64_t k) {
    return f32 ? GD_LOAD((const float *)row + k) : GD_LOADH((const uint16_t *)row + k);
}

/* The four accumulators of the r x c block at rows a[0..r), columns b[0..c) over the first np
 * values (np a multiple of GD_STEP): xs[(j R + i) C + q] lanes. r, c, f32 constant where inlined. */
static inline __attribute__((always_inline)) void gd_block(const int r, const int c, const int f32,
                                                          const void * const * a, const void * const * b,
                                                          int64_t np, float * xs) {
    for (int j = 0; j < 4; j++) {
        gd_vf acc[GD_R][GD_C];
        for (int i = 0; i < r; i++)
            for (int q = 0; q < c; q++) acc[i][q] = GD_ZERO();
        for (int64_t k = (int64_t)j * GD_V; k < np; k += GD_STEP) {
            gd_vf bv[GD_C];
            for (int q = 0; q < c; q++) bv[q] = gd_at(b[q], f32, k);
            for (int i = 0; i < r; i++) {
                const gd_vf av = gd_at(a[i], f32, k);
                for (int q = 0; q < c; q++) acc[i][q] = GD_FMA(av, bv[q], acc[i][q]);
            }
        }
        for (int i = 0; i < r; i++)
            for (int q = 0; q < c; q++) GD_STORE(xs + ((j * GD_R + i) * GD_C + q) * GD_V, acc[i][q]);
    }
}

#if GD_HALF
/* gd_block for F16 rows in a half build: the four accumulators of 32 half lanes, each lane an FMA chain
 * rounded to half at every step, as GGML_F16x32_FMA (_mm512_fmadd_ph) leaves it; stored in xs in the
 * place of a vector of GD_V floats (the same 64 bytes). np a multiple of GH_STEP. */
static inline __attribute__((always_inline)) void gh_block(const int r, const int c, const void * const * a,
                                                          const void * const * b, int64_t np, float * xs) {
    for (int j = 0; j < 4; j++) {
        __m512h acc[GD_R][GD_C];
        for (int i = 0; i < r; i++)
            for (int q = 0; q < c; q++) acc[i][q] = _mm512_setzero_ph();
        for (int64_t k = (int64_t)j * GH_V; k < np; k += GH_STEP) {
            __m512h bv[GD_C];
            for (int q = 0; q < c; q++) bv[q] = _mm512_loadu_ph((const uint16_t *)b[q] + k);
            for (int i = 0; i < r; i++) {
                const __m512h av = _mm512_loadu_ph((const uint16_t *)a[i] + k);
                for (int q = 0; q < c; q++) acc[i][q] = _mm512_fmadd_ph(av, bv[q], acc[i][q]);
            }
        }
        for (int i = 0; i < r; i++)
            for (int q = 0; q < c; q++) _mm512_storeu_ph(xs + ((j * GD_R + i) * GD_C + q) * GD_V, acc[i][q]);
    }
}
#define GD_F16_BLOCK(R, C) gh_block(R, C, a, b, np, xs)
#else
#define GD_F16_BLOCK(R, C) gd_block(R, C, 0, a, b, np, xs)
#endif

static void gd_dispatch(int r, int c, int f32, const void * const * a, const void * const * b, int64_t np, float * xs) {
#define GD_CASE(R, C) if (r == R && c == C) { if (f32) gd_block(R, C, 1, a, b, np, xs); else GD_F16_BLOCK(R, C); return; }
#if GD_R == 4
    GD_CASE(4, 6) GD_CASE(4, 5) GD_CASE(4, 4) GD_CASE(4, 3) GD_CASE(4, 2) GD_CASE(4, 1)
    GD_CASE(3, 6) GD_CASE(3, 5)
    GD_CASE(2, 6) GD_CASE(2, 5)
    GD_CASE(1, 6) GD_CASE(1, 5)
#endif
    GD_CASE(3, 4) GD_CASE(3, 3) GD_CASE(3, 2) GD_CASE(3, 1)
    GD_CASE(2, 4) GD_CASE(2, 3) GD_CASE(2, 2) GD_CASE(2, 1)
    GD_CASE(1, 4) GD_CASE(1, 3) GD_CASE(1, 2) GD_CASE(1, 1)
#undef GD_CASE
}

/* x[0] += x[2], x[1] += x[3], x[0] += x[1], then its lanes: GGML_F32x*_REDUCE */
static inline float gd_reduce(const float * x0p, const float * x1p, const float * x2p, const float * x3p) {
    gd_vf x0 = GD_LOAD(x0p), x1 = GD_LOAD(x1p);
    x0 = GD_ADD(x0, GD_LOAD(x2p));
    x1 = GD_ADD(x1, GD_LOAD(x3p));
    x0 = GD_ADD(x0, x1);
    return gd_lanes(x0);
}

#if GD_HALF
/* GGML_F16x32_REDUCE: the same tree in half precision, then the lanes by _mm512_reduce_add_ph */
static inline double gh_reduce(const float * x0p, const float * x1p, const float * x2p, const float * x3p) {
    __m512h x0 = _mm512_loadu_ph(x0p), x1 = _mm512_loadu_ph(x1p);
    x0 = _mm512_add_ph(x0, _mm512_loadu_ph(x2p));
    x1 = _mm512_add_ph(x1, _mm512_loadu_ph(x3p));
    x0 = _mm512_add_ph(x0, x1);
    return (double)_mm512_reduce_add_ph(x0);
}
#define GD_REDUCE_F16(x0, x1, x2, x3) gh_reduce(x0, x1, x2, x3)
#else
#define GD_REDUCE_F16(x0, x1, x2, x3) ((double)gd_reduce(x0, x1, x2, x3))
#endif

/* The r x c outputs of a block of F16 rows from their accumulators, as ggml_vec_dot_f16 ends before
 * its leftovers: the reduction widened to double. sums[i][q] (0 past r or c). */
static void gd_reduce_block_f16(int r, int c, const float * xs, int64_t np, double sums[GD_R][GD_DL]) {
    const int64_t js = GD_R * GD_C * GD_V;
    for (int i = 0; i < GD_R; i++)
        for (int q = 0; q < GD_DL; q++) {
            const float * x = xs + (i * GD_C + q) * GD_V;
            sums[i][q] = np && i < r && q < c ? GD_REDUCE_F16(x, x + js, x + 2 * js, x + 3 * js) : 0.0;
        }
}

#if GD_V == 16 && !GD_HALF
/* Short F16 products (at most gd_pairs_max steps of GH_STEP, no leftovers) go in blocks of GD_R x
 * GP_C outputs whose four chains run two at a time, j and j + 2 side by side in registers: x[0] +
 * x[2] and x[1] + x[3] come out of the registers, the lanes of the block's outputs are added
 * together (pg_sums16: the tree of _mm512_reduce_add_ps, four outputs per shuffle) and stored
 * straight from the register. gd_block stores every chain of its GD_R x GD_C outputs (4 stores and
 * 4 loads per output), and the outputs went through a buffer of doubles for the leftovers; over a
 * few steps that cost more than the products. Each output keeps ggml_vec_dot_f16's sum.
 * Graph products of the s2cpp encoder's shapes (F16 x F16, 2 threads, AMD EPYC Zen 4 VM), paired
 * against gd_block: K = 64 (63488 x 64 outputs) 0.50x, K = 128 0.64x, K = 256 0.80-0.85x,
 * K = 448 0.95x, K = 512 0.99x; at 16 steps (K = 1024) 1.06x, hence the limit of 8. The s2cpp
 * encode 0.95x at 1.4 s and at 10 s, the decode 0.99-1.00x. */
#define GD_PAIRS 1
#define GP_C 3
static int64_t gd_pairs_max = 8;
void pg_f16dot_pairs_max_steps(int64_t n) { gd_pairs_max = n < 0 ? 0 : n; }

/* o[q ldc + i] = a[i] . b[q], ggml_vec_dot_f16's value where the rows have no leftovers (np = K,
 * a multiple of GH_STEP), for rows a[0..r) and columns b[0..c). r, c constant where inlined. */
static inline __attribute__((always_inline)) void gp_block(const int r, const int c, const void * const * a,
                                                          const void * const * b, int64_t np, float * o, int64_t ldc) {
    __m512 y[GD_R * GP_C], v[16];  /* v[q r + i]: output (i, q) before its lanes are added */
    for (int h = 0; h < 2; h++) {  /* chains h and h + 2 */
        __m512 acc[2][GD_R][GP_C];
        for (int e = 0; e < 2; e++)
            for (int i = 0; i < r; i++)
                for (int q = 0; q < c; q++) acc[e][i][q] = GD_ZERO();
        for (int64_t k = (int64_t)h * GD_V; k < np; k += GD_STEP) {
            __m512 bv[2][GP_C];
            for (int e = 0; e < 2; e++)
                for (int q = 0; q < c; q++) bv[e][q] = GD_LOADH((const uint16_t *)b[q] + k + 2 * e * GD_V);
            for (int i = 0; i < r; i++)
                for (int e = 0; e < 2; e++) {
                    const __m512 av = GD_LOADH((const uint16_t *)a[i] + k + 2 * e * GD_V);
                    for (int q = 0; q < c; q++) acc[e][i][q] = GD_FMA(av, bv[e][q], acc[e][i][q]);
                }
        }
        for (int i = 0; i < r; i++)
            for (int q = 0; q < c; q++) {
                const __m512 x = GD_ADD(acc[0][i][q], acc[1][i][q]);
                if (h == 0) y[q * r + i] = x;
                else v[q * r + i] = GD_ADD(y[q * r + i], x);
            }
    }
    const int n = r * c;
    float t[16];
    if (n < 8) {
        pg_sums16(v, n, t);
    } else {
        for (int i = n; i < 16; i++) v[i] = GD_ZERO();
        const __m512 sv = pg_sum16_in_order(v);  /* lane q r + i: output (i, q) */
        if (r == 4) {  /* column q's four rows are lanes 4 q .. 4 q + 3: stored from the register */
            _mm_storeu_ps(o, _mm512_castps512_ps128(sv));
            if (c > 1) _mm_storeu_ps(o + ldc, _mm512_extractf32x4_ps(sv, 1));
            if (c > 2) _mm_storeu_ps(o + 2 * ldc, _mm512_extractf32x4_ps(sv, 2));
            return;
        }
        _mm512_storeu_ps(t, sv);
    }
    for (int q = 0; q < c; q++)
        for (int i = 0; i < r; i++) o[q * ldc + i] = t[q * r + i];
}

static void gp_dispatch(int r, int c, const void * const * a, const void * const * b, int64_t np, float * o, int64_t ldc) {
#define GP_CASE(R, C) if (r == R && c == C) { gp_block(R, C, a, b, np, o, ldc); return; }
    GP_CASE(4, 3) GP_CASE(4, 2) GP_CASE(4, 1) GP_CASE(3, 3) GP_CASE(3, 2) GP_CASE(3, 1)
    GP_CASE(2, 3) GP_CASE(2, 2) GP_CASE(2, 1) GP_CASE(1, 3) GP_CASE(1, 2) GP_CASE(1, 1)
#undef GP_CASE
}
#else
#define GD_PAIRS 0
#define GP_C GD_C
static const int64_t gd_pairs_max = 0;
void pg_f16dot_pairs_max_steps(int64_t n) { (void) n; }
#endif

/* Then the leftovers, each product added in double, in order, for nb (1 or 2) blocks of the same
 * rows: the chains of a block's columns run side by side in the lanes of one vector of doubles
 * per row, the rows' and the blocks' vectors interleaved (2 GD_R independent chains: one after
 * another, each waited on its adds' latency). The leftovers come converted, shared by many
 * blocks: at[i GH_STEP + t] value np + t of row i (GD_R rows, rows past r any), bt[b][t GD_DL + q]
 * that of column q of block b (0 past its columns). */
static void gd_leftovers_f16(int nb, double sums[2][GD_R][GD_DL], const double * at, const float * const * bt,
                             int64_t left) {
    gd_vd acc[2][GD_R];
    const float * b1 = bt[nb > 1 ? 1 : 0];  /* one block: the second set of chains repeats the first */
    for (int i = 0; i < GD_R; i++) {
        acc[0][i] = GD_DLOAD(sums[0][i]);
        acc[1][i] = GD_DLOAD(sums[nb > 1 ? 1 : 0][i]);
    }
    /* ggml adds (double)(float)(x y). A product of two F16 values is exact in float (at most 22
       significant bits, within float's range) and in double, so one fused multiply-add in double
       rounds exactly as that add does: sum + x y rounded once either way */
    for (int64_t t = 0; t < left; t++) {
        const gd_vd v0 = GD_WIDEN(GD_HLOAD(bt[0] + t * GD_DL)), v1 = GD_WIDEN(GD_HLOAD(b1 + t * GD_DL));
        for (int i = 0; i < GD_R; i++) {
            const gd_vd x = GD_DSET1(at[i * GH_STEP + t]);
            acc[0][i] = GD_DFMA(x, v0, acc[0][i]);
            acc[1][i] = GD_DFMA(x, v1, acc[1][i]);
        }
    }
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < GD_R; i++) GD_DSTORE(sums[b][i], acc[b][i]);
}

/* ggml_vec_dot_f32's end: the reduction in float, then the L leftovers, `sumf += x[i]*y[i]`, as
 * ggml's compiler built that loop (the probe in kernels.py finds which):
 *   mode 1: a product then a sum each; mode 2: one FMA each;
 *   mode 3: GCC's vectorized loop: products in vectors of 16, then of 8, added in order, and the
 *   last L % 8 by FMA (one scalar iteration each);
 *   mode 4: the same down to vectors of 4 (GCC 12, -march=native on an AVX512-FP16 Xeon), the last
 *   L % 4 by FMA. */
static inline float gd_finish_f32(const float * x, int64_t js, const float * a, const float * b, int64_t np,
                                  int64_t n, int mode) {
    float sum = x ? gd_reduce(x, x + js, x + 2 * js, x + 3 * js) : 0.0f;
    const int64_t fused = mode == 2 ? np : mode == 3 ? n - (n - np) % 8 : mode == 4 ? n - (n - np) % 4 : n;  /* FMA from here */
    int64_t k = np;
    for (; k < fused; k++) {
        const float prod = a[k] * b[k];
        sum += prod;
    }
    for (; k < n; k++) sum = __builtin_fmaf(a[k], b[k], sum);
    return sum;
}

/* F32 values rounded to F16 as ggml_cpu_fp32_to_fp16 does (to nearest even) */
static void gd_round_f16(const float * x, uint16_t * h, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) h[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

/* c[q * ldc + i] = a[i] . b[q] (ggml_vec_dot_f16's value, or with f32 ggml_vec_dot_f32's) for rows
 * i in [m0, m1) of a and columns q in [c0, c1) of b: rows of k values, F16 (f32 == 0), or F32 with
 * f32 the leftovers' mode of gd_finish_f32, a row i
 * at a + i lda, b's q at b + q ldb (elements). Column panels of `panel` (their rows stay in L2
 * while the rows of a pass), blocks of GD_R x GD_C (GD_R x GP_C where `pairs`: gp_block). */
static void gd_product(const int f32, const void * a, int64_t lda, const void * b, int64_t ldb, int64_t m0, int64_t m1,
                       int64_t c0, int64_t c1, int64_t k, int64_t panel, float * c, int64_t ldc) {
    const int64_t step = f32 ? GD_STEP : GH_STEP, np = k / step * step;
    const int64_t js = GD_R * GD_C * GD_V;  /* from accumulator j to j + 1 in xs */
    const size_t esz = f32 ? 4 : 2;
    float xs[4 * GD_R * GD_C * GD_V];
    panel = panel > GD_C ? panel / GD_C * GD_C : GD_C;
    /* columns per block: GP_C where the chains go two at a time (gp_block), else GD_C */
    const int pairs = GD_PAIRS && !f32 && np && np == k && np / GH_STEP <= gd_pairs_max;
    const int64_t width = pairs ? GP_C : GD_C;
    /* F16 leftovers (k past np) converted: the panel's columns to floats, block by block (bt,
       [t][GD_DL] per block of `width` columns), once for all its row blocks; a row block's to doubles
       (at, the FMAs' broadcast operand) once for all the panel's column blocks */
    const int64_t left = k - np, bt_block = left * GD_DL;
    int slot = -1;
    float * bt = NULL;
    double at[GD_R * GH_STEP];
    if (!f32 && left > 0) {
        bt = pg_scratch_take((size_t)((panel / width) * bt_block), &slot);
        if (!bt) return;  /* out of memory: counted (pg_scratch_failures), c left unset */
    }
    for (int64_t j0 = c0; j0 < c1; j0 += panel) {
        const int64_t j1 = j0 + panel < c1 ? j0 + panel : c1;
        if (bt)
            for (int64_t jb = j0; jb < j1; jb += width) {
                float * bb = bt + (jb - j0) / width * bt_block;
                const int cc = (int)(j1 - jb < width ? j1 - jb : width);
                for (int q = 0; q < GD_DL; q++) {
                    const uint16_t * col = q < cc ? (const uint16_t *)b + (jb + q) * ldb + np : NULL;
                    for (int64_t t = 0; t < left; t++) bb[t * GD_DL + q] = col ? _cvtsh_ss(col[t]) : 0.0f;
                }
            }
        for (int64_t ib = m0; ib < m1; ib += GD_R) {
            const int r = (int)(m1 - ib < GD_R ? m1 - ib : GD_R);
            const void * ar[GD_R];
            for (int i = 0; i < r; i++) ar[i] = (const char *)a + (size_t)((ib + i) * lda) * esz;
            if (bt)
                for (int i = 0; i < GD_R; i++)
                    for (int64_t t = 0; t < left; t++)
                        at[i * GH_STEP + t] = (double)_cvtsh_ss(((const uint16_t *)ar[i < r ? i : 0])[np + t]);
            double sums[2][GD_R][GD_DL];  /* F16: up to two blocks' sums, their leftovers added together */
            int pend = 0;
            int64_t pjb[2];
            int pcc[2];
            for (int64_t jb = j0; jb < j1; jb += width) {
                const int cc = (int)(j1 - jb < width ? j1 - jb : width);
                const void * br[GD_C];
                for (int q = 0; q < cc; q++) br[q] = (const char *)b + (size_t)((jb + q) * ldb) * esz;
#if GD_PAIRS
                if (pairs) {  /* no leftovers: the outputs as they come */
                    gp_dispatch(r, cc, ar, br, np, c + jb * ldc + ib, ldc);
                    continue;
                }
#endif
                if (np) gd_dispatch(r, cc, f32, ar, br, np, xs);
                if (!f32) {
                    gd_reduce_block_f16(r, cc, xs, np, sums[pend]);
                    pjb[pend] = jb, pcc[pend] = cc;
                    if (++pend < 2 && jb + width < j1) continue;
                    if (bt) {
                        const float * bts[2] = {bt + (pjb[0] - j0) / width * bt_block, bt + (pjb[pend - 1] - j0) / width * bt_block};
                        gd_leftovers_f16(pend, sums, at, bts, left);
                    }
                    for (int e = 0; e < pend; e++)
                        for (int i = 0; i < r; i++)
                            for (int q = 0; q < pcc[e]; q++) c[(pjb[e] + q) * ldc + ib + i] = (float)sums[e][i][q];
                    pend = 0;
                    continue;
                }
                for (int i = 0; i < r; i++)
                    for (int q = 0; q < cc; q++) {
                        const float * x = np ? xs + (i * GD_C + q) * GD_V : NULL;
                        c[(jb + q) * ldc + ib + i] =
                            gd_finish_f32(x, js, (const float *)ar[i], (const float *)br[q], np, k, f32);
                    }
            }
        }
    }
    if (bt) pg_scratch_give(bt, slot);
}

/* The probe kernels.py checks this file against ggml's own vec_dot with: contiguous a [m][k],
 * b [n][k], F16 (F32 with f32, as gd_product); c [n][m]. Returns 0 where not built, -1 where its scratch could not be had (c then unset). */
int pg_f16dot_product(int f32, int64_t m, int64_t n, int64_t k, const void * a, const void * b, float * c) {
    const int64_t failed = pg_scratch_failures();
    gd_product(f32, a, k, b, k, 0, m, 0, n, k, 64, c, m);
    return pg_scratch_failures() == failed ? 1 : -1;  /* -1: out of memory, c not computed */
}

/* ggml_mul_mat(a, b) with ggml's values: src0 a F16 ne [K, M, A2, A3] and src1 b F16 or F32 ne
 * [K, N, B2, B3] (ggml_vec_dot_f16's), or both F32 (ggml_vec_dot_f32's); B2 % A2 == 0, B3 % A3 == 0,
 * contiguous rows; dst contiguous F32 ne [M, N, B2, B3], dst[n][m] = a[m] . b[n]. userdata:
 * int64 [2] = the column panel, the F32 leftovers' mode (gd_finish_f32). Threads
 * take blocks of the larger of M and N (each output is one sum wherever it is computed); an F32 b
 * is first rounded to F16 (as ggml does, into its work buffer) into scratch, the columns each
 * thread reads. */
void pg_mul_mat_f16dot(void * dst_, int ith, int nth, void * userdata) {
    const int64_t * p = userdata;
    struct pg_tensor * dst = dst_;
    const struct pg_tensor * a = dst->src[0], * b = dst->src[1];
    const int64_t k = a->ne[0], m = a->ne[1], n = b->ne[1];
    const int f32 = a->type == 0 ? (int)p[1] : 0;  /* F32 a (and b): ggml_vec_dot_f32 */
    const int b_f32 = b->type == 0 && !f32;  /* rounded to F16 first */
    const int64_t r2 = b->ne[2] / a->ne[2], r3 = b->ne[3] / a->ne[3];
    const int split_n = n >= m;
    int64_t i0, i1, block;
    pg_blocks(split_n ? n : m, 16, split_n ? n : m, ith, nth, &i0, &i1, &block);
    if (i0 >= i1) return;
    const int64_t c0 = split_n ? i0 : 0, c1 = split_n ? i1 : n;  /* this thread's columns */
    const int64_t m0 = split_n ? 0 : i0, m1 = split_n ? m : i1;  /* and rows */
    int slot = -1;
    uint16_t * hb = NULL;
    if (b_f32) {
        hb = (uint16_t *)pg_scratch_take((size_t)((c1 - c0) * k + 1) / 2 + 1, &slot);
        if (!hb) return;  /* out of memory: counted (pg_scratch_failures), dst left unset */
    }
    for (int64_t i3 = 0; i3 < b->ne[3]; i3++) {
        for (int64_t i2 = 0; i2 < b->ne[2]; i2++) {
            const char * ap = (const char *)a->data + (i2 / r2) * a->nb[2] + (i3 / r3) * a->nb[3];
            const char * bp = (const char *)b->data + i2 * b->nb[2] + i3 * b->nb[3];
            float * cp = (float *)((char *)dst->data + i2 * dst->nb[2] + i3 * dst->nb[3]);
            const int64_t esz = f32 ? 4 : 2, lda = (int64_t)(a->nb[1] / esz);
            if (b_f32) {  /* hb: columns c0 .. c1 of this batch, rounded */
                for (int64_t q = c0; q < c1; q++)
                    gd_round_f16((const float *)(bp + q * b->nb[1]), hb + (q - c0) * k, k);
                gd_product(0, ap, lda, hb, k, m0, m1, 0, c1 - c0, k, p[0], cp + c0 * m, m);
            } else {
                gd_product(f32, ap, lda, bp, (int64_t)(b->nb[1] / esz), m0, m1, c0, c1, k, p[0], cp, m);
            }
        }
    }
    if (b_f32) pg_scratch_give((float *)hb, slot);
}
#else
int pg_f16dot_lanes(void) { return 0; }  /* a build without AVX2 or F16C: ggml's products stay with ggml */
void pg_f16dot_pairs_max_steps(int64_t n) { (void) n; }
int pg_f16dot_product(int f32, int64_t m, int64_t n, int64_t k, const void * a, const void * b, float * c) {
    (void) f32; (void) m; (void) n; (void) k; (void) a; (void) b; (void) c;
    return 0;
}
void pg_mul_mat_f16dot(void * dst, int ith, int nth, void * userdata) { (void) dst; (void) ith; (void) nth; (void) userdata; }
#endif

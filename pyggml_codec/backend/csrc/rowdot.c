/* Products as row dot products: C[i][j] = sum_k A[i][k] B[j][k], A F32, F16 or Q8_0 (the weights,
 * upcast or dequantized to F32 exactly: ggml's dequantized value q d is exact in float), B F32 (the
 * activations), F32 sums; no packing.
 *
 * Why: OpenBLAS's sgemm packs the whole weight matrix for every call, which is most of the
 * time of a product with a few columns (a streamed chunk's: 1 to 32), and ggml's own F16
 * product rounds the activations to F16. Here the weights are read once, in their stored
 * type (half the bytes of F32 for an F16 file), in blocks of PG_RD_R rows (or fewer: see
 * PG_RD_R_F16_1) kept in L1 while the columns stream past in blocks of PG_RD_C (F32 rows) or
 * PG_RD_C_NARROW (F16 and Q8_0 rows converted per vector; up to PG_RD_C_NARROW_2R against 2-row
 * blocks). Against a panel of PG_RD_UP_COLS columns or more, a block of F16 or Q8_0
 * rows is converted once into F32 (the same values) and taken as F32 rows: each vector converted
 * once per panel instead of once per block of columns, and PG_RD_C columns at a time (F16 rows,
 * one thread, 1.2-1.35x at 100-2048 columns; Q8_0 rows 1.5-1.9x).
 *
 * Every C[i][j] is summed in one order whatever the shape, the blocking, the column count and
 * the thread count: lane l of a vector accumulates k = l, l + V, l + 2 V, ... with fused
 * multiply-adds, the K tail is zero-padded to a whole vector, then the lanes are added by one
 * fixed tree. So a product over 1 column gives the bits of the same column in a product over
 * 32, and a stream decoded frame by frame gets the one-shot decode's values from it. */
#include "pg_kernels.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__FMA__) && defined(__F16C__)
#define PG_RD_V 16
#define PG_RD_R 4
#define PG_RD_C 6
#define PG_RD_C_NARROW 4
#define PG_RD_R_F16_1 2
#define PG_RD_R_Q8_0 3
#define PG_RD_C_NARROW_2R 8
typedef __m512 pg_vf;
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VLOADH(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define VLOADQ(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p))))
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VSET1(x) _mm512_set1_ps(x)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
static inline float vsum(pg_vf v) { return pg_hsum16(v); }
#define PG_RD_VECTOR 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PG_RD_V 8
#define PG_RD_R 3
#define PG_RD_C 4
#define PG_RD_C_NARROW 4
#define PG_RD_R_F16_1 PG_RD_R  /* not measured on a CPU without AVX-512 */
#define PG_RD_R_Q8_0 PG_RD_R
#define PG_RD_C_NARROW_2R PG_RD_C_NARROW  /* 2 x 8 accumulators and 8 columns: more than 16 registers */
typedef __m256 pg_vf;
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VLOADH(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define VLOADQ(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VSET1(x) _mm256_set1_ps(x)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
static inline float vsum(pg_vf v) { return pg_hsum8(v); }
#define PG_RD_VECTOR 1
#else
#define PG_RD_VECTOR 0
#endif
#if PG_RD_VECTOR
#define PG_RD_C_MAX (PG_RD_C > PG_RD_C_NARROW_2R ? PG_RD_C : PG_RD_C_NARROW_2R)
#endif
/* F16 and Q8_0 rows against PG_RD_UP_COLS columns or more are converted to F32 first (pg_rowdot);
   outside the blocked loops, rows of at most PG_RD_UP_MAX_K values (PG_RD_R of them stay in L1) */
#define PG_RD_UP_COLS 12
#define PG_RD_UP_MAX_K 2048
/* Rows per block of the few-column loops, where the weights are read as stored: PG_RD_R, except
 * F16 rows against one column (PG_RD_R_F16_1) and Q8_0 rows against at most PG_RD_C_NARROW
 * columns (PG_RD_R_Q8_0). AVX-512, 2 threads, 3072 x 1024 and 1024 x 3072 rows from memory:
 * F16 against one column, 2 rows 30-34 GB/s, 4 rows 26-29; Q8_0 against one column, 3 rows 24-27,
 * 4 rows 20-25, against four 19 and 17; against eight, or F16 against two to eight, no better
 * than 4 rows. Against five to PG_RD_C_NARROW_2R columns, blocks of 2 rows take them all at once
 * (F16 rows where the columns fit pg_rd_two_rows_max),
 * each vector of weights converted once instead of once per PG_RD_C_NARROW columns: against
 * eight, F16 21.3-22.8 -> 23.1-24.5 GB/s, Q8_0 9.2-9.8 -> 11.2-12.1. Each output's sum is the same
 * whatever the block. */
/* the cache budgets of the blocked loops (pg_rowdot) */
#define PG_RD_L1_BYTES (24 << 10)
#define PG_RD_L2_BYTES (512 << 10)
#define PG_RD_BLOCK_COLS 64
#define PG_RD_PF_SPREAD 8

static int pg_rd_tiles_on = 1;  /* rd_tiles for long products (pg_rowdot_tiles_use) */
void pg_rowdot_tiles_use(int on) { pg_rd_tiles_on = on; }
/* Narrow products (at most PG_RD_C_NARROW_2R columns, 8 with AVX-512 and 4 with AVX2: a stream's few frames) by the row loops fetch
 * whole blocks of rows at least this many bytes ahead of the block they multiply, not the next block
 * alone: a block of 2 F16 rows of 1024 values (4 KB) or 3 Q8_0 rows (3.3 KB) ahead left a stream's
 * transformer projections at 21-28 GB/s where longer rows read at 34. Full-size files, 2 threads,
 * 2-core AMD EPYC (Zen 4) VM, paired medians against the next block alone: the one-frame latent
 * graph 0.84-0.95x (F16) and 0.91x (Q8_0), a one-frame push 0.986-0.994x (F16) and 0.983x (Q8_0),
 * an 8-stream step 0.99-1.005x, a 32-frame decode 0.996-0.997x. Values are untouched
 * (pg_rowdot_pf_ahead_bytes: 0 fetches the next block alone). */
static int64_t pg_rd_pf_ahead = 8192;
void pg_rowdot_pf_ahead_bytes(int64_t n) { pg_rd_pf_ahead = n < 0 ? 0 : n > (1 << 30) ? (1 << 30) : n; }
/* F16 rows go in 2-row blocks (PG_RD_C_NARROW_2R) only where all the columns fit this many bytes
 * as F32 (columns x K x 4, an L1's worth): each block of 2 rows reads every column once, from L1
 * where they fit, else from L2 at 10 loads per 16 multiply-adds. Past it, blocks of PG_RD_R rows
 * take PG_RD_C_NARROW columns at a time, each column read once per 4 rows. 8 streams' step, F16
 * file, 2 threads, AMD EPYC (Zen 4) VM, paired against 2-row blocks at any K: the feed-forward
 * output projections (K = 3072) 0.46 -> 0.25 ms, the latent graph 0.91x (5 streams 0.95x).
 * Q8_0 rows keep the 2-row blocks: converting each vector of them twice costs more (the same
 * graph 1.02x). Each output's sum is the same whatever the block. */
static int64_t pg_rd_two_rows_max = 32 << 10;
void pg_rowdot_two_rows_max_bytes(int64_t n) { pg_rd_two_rows_max = n < 0 ? 0 : n; }

#if PG_RD_VECTOR
int pg_rowdot_lanes(void) { return PG_RD_V; }
#else
int pg_rowdot_lanes(void) { return 0; }  /* a build without AVX2 (PYGGML_CODEC_PORTABLE=1): the BLAS does it */
#endif

/* n F16 values upcast to F32 (exact) */
static void pg_f16_to_f32(const uint16_t * restrict h, float * restrict f, int64_t n) {
#if defined(__F16C__)
    int64_t i = 0;
#endif
#if defined(__F16C__) && defined(__AVX__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
#if defined(__F16C__)
    for (; i < n; i++) f[i] = _cvtsh_ss(h[i]);
#else
    (void) h; (void) f; (void) n;  /* not built: kernels.py refuses F16 weights without F16C */
#endif
}

/* The weights' types (pg_rowdot's a_kind): ggml's F32, F16 and Q8_0 (blocks of 32 values: an F16
 * scale d, then 32 int8 q; value q d) */
enum { PG_RD_F32 = 0, PG_RD_F16 = 1, PG_RD_Q8_0 = 2 };
#define PG_Q8_0_BLOCK 34

/* bytes of a row of lda values of kind */
static inline int64_t pg_rd_row_bytes(int kind, int64_t lda) {
    return kind == PG_RD_Q8_0 ? lda / 32 * PG_Q8_0_BLOCK : lda * (kind == PG_RD_F16 ? 2 : 4);
}

#if defined(__F16C__)
/* The scale d of the Q8_0 block holding value k of row a, and that block's quants */
static inline float pg_q8_0_scale(const void * a, int64_t k, const int8_t ** q) {
    const uint8_t * blk = (const uint8_t *)a + k / 32 * PG_Q8_0_BLOCK;
    uint16_t d;
    memcpy(&d, blk, 2);
    *q = (const int8_t *)(blk + 2);
    return _cvtsh_ss(d);
}
#endif

/* n values (whole blocks) of a Q8_0 row as F32: q d, exact, each block's scale read once */
static void pg_q8_0_to_f32(const void * a, float * restrict f, int64_t n) {
#if defined(__F16C__)
    for (int64_t k = 0; k < n; k += 32) {
        const int8_t * q;
        const float d = pg_q8_0_scale(a, k, &q);
        for (int e = 0; e < 32; e++) f[k + e] = (float)q[e] * d;
    }
#else
    (void) a; (void) f; (void) n;  /* not built: kernels.py refuses Q8_0 weights without F16C */
#endif
}

/* `rows` rows of kind F16 or Q8_0 (`row` bytes apart from a), n values each, as F32 rows n apart
 * in f (the same values) */
static void pg_rd_rows_to_f32(const char * a, int kind, int64_t row, int64_t rows, int64_t n, float * restrict f) {
    for (int64_t i = 0; i < rows; i++) {
        if (kind == PG_RD_F16) pg_f16_to_f32((const uint16_t *)(a + i * row), f + i * n, n);
        else pg_q8_0_to_f32(a + i * row, f + i * n, n);
    }
}

/* value k of a row of kind (F16 and Q8_0 need F16C: kernels.py takes neither without it) */
static inline float pg_rd_value(const void * a, int kind, int64_t k) {
#if defined(__F16C__)
    if (kind == PG_RD_Q8_0) {
        const int8_t * q;
        const float d = pg_q8_0_scale(a, k, &q);
        return (float)q[k % 32] * d;
    }
    if (kind == PG_RD_F16) return _cvtsh_ss(((const uint16_t *)a)[k]);
#endif
    return kind == PG_RD_F32 ? ((const float *)a)[k] : 0.0f;
}

#if PG_RD_VECTOR
/* Lane l of the vector at k of row a of kind h (k a multiple of the lanes, so within one Q8_0 block). */
static inline __attribute__((always_inline)) pg_vf load_a(const void * a, int h, int64_t k) {
    if (h == PG_RD_Q8_0) {
        const int8_t * q;
        const float d = pg_q8_0_scale(a, k, &q);
        return VMUL(VLOADQ(q + k % 32), VSET1(d));
    }
    return h ? VLOADH((const uint16_t *)a + k) : VLOAD((const float *)a + k);
}

#if PG_RD_V == 16
/* out[i] = vsum(v[i]) for i < n (n <= 24): pg_sums16 */
static inline __attribute__((always_inline)) void rd_sums(const __m512 * v, int n, float * out) { pg_sums16(v, n, out); }
#else
static inline __attribute__((always_inline)) void rd_sums(const pg_vf * v, int n, float * out) {
    for (int i = 0; i < n; i++) out[i] = vsum(v[i]);
}
#endif

/* The r x c block of C at rows a, a + arow, ... (arow bytes apart), columns b, b + ldb, ...: whole
 * vectors of K (kv of them), then the zero-padded tails (ta: r rows of V values, tb: c columns).
 * r, c and the kind h constant where inlined. out[i * c + j].
 * pf (or NULL): the next block of rows, pf_step bytes of it fetched per vector of K, so that its
 * reads from memory overlap this block's products (the hardware prefetcher alone left a one-column
 * product of an F16 matrix at 19-24 GB/s where memory gives 40-45, and an 8-column one at half the
 * FMA rate: reads and products took turns). pf_l2: fetched into L2 (rows read once from memory:
 * one thread, one column of F16 rows from memory 10.4-11.0 -> 13.1-13.7 GB/s, 8 columns 10.3 ->
 * 11.2-11.5; a fetch into L1 holds a line fill buffer until the line arrives, and a core has few),
 * else into L1 (the cache-blocked loops: a block of rows, converted or as stored, stays in L2 for
 * all its column panels; an L2 fetch there lost 4-6 %). Values are untouched. */
/* the fetch of n bytes at p (pf_l2: into L2) */
static inline __attribute__((always_inline)) void rd_prefetch(const char * p, int64_t n, int pf_l2) {
    if (pf_l2)
        for (int64_t o = 0; o < n; o += 64) _mm_prefetch(p + o, _MM_HINT_T1);
    else
        for (int64_t o = 0; o < n; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
}

static inline __attribute__((always_inline)) void rd_block(const int r, const int c, const int h, const char * a,
        int64_t arow, const float * b, int64_t ldb, int64_t kv, const float * ta, const float * tb, int tail,
        float * out, const char * pf, int64_t pf_step, int pf_l2) {
    pg_vf acc[PG_RD_R * PG_RD_C];  /* acc[i * c + j]: r c <= PG_RD_R PG_RD_C in every case */
    for (int i = 0; i < r; i++)
        for (int j = 0; j < c; j++) acc[i * c + j] = VZERO();
    if (h == PG_RD_Q8_0) {  /* by whole blocks (kv = K, a multiple of 32): each row's scale read once per block */
        for (int64_t k = 0; k < kv; k += 32) {
            const int8_t * q[PG_RD_R];
            float d[PG_RD_R];
            for (int i = 0; i < r; i++) d[i] = pg_q8_0_scale(a + i * arow, k, &q[i]);
            for (int s = 0; s < 32; s += PG_RD_V) {
                pg_vf bv[PG_RD_C_MAX];
                for (int j = 0; j < c; j++) bv[j] = VLOAD(b + j * ldb + k + s);
                if (pf) {
                    const char * p = pf + (k + s) / PG_RD_V * pf_step;
                    rd_prefetch(p, pf_step, pf_l2);
                }
                for (int i = 0; i < r; i++) {
                    const pg_vf av = VMUL(VLOADQ(q[i] + s), VSET1(d[i]));
                    for (int j = 0; j < c; j++) acc[i * c + j] = VFMA(av, bv[j], acc[i * c + j]);
                }
            }
        }
        kv = 0;  /* no tail either: K is whole blocks */
    }
    if (pf) {
        for (int64_t k = 0; k < kv; k += PG_RD_V) {
            pg_vf bv[PG_RD_C_MAX];
            for (int j = 0; j < c; j++) bv[j] = VLOAD(b + j * ldb + k);
            const char * q = pf + k / PG_RD_V * pf_step;
            rd_prefetch(q, pf_step, pf_l2);
            for (int i = 0; i < r; i++) {
                const pg_vf av = load_a(a + i * arow, h, k);
                for (int j = 0; j < c; j++) acc[i * c + j] = VFMA(av, bv[j], acc[i * c + j]);
            }
        }
    } else {
        for (int64_t k = 0; k < kv; k += PG_RD_V) {
            pg_vf bv[PG_RD_C_MAX];
            for (int j = 0; j < c; j++) bv[j] = VLOAD(b + j * ldb + k);
            for (int i = 0; i < r; i++) {
                const pg_vf av = load_a(a + i * arow, h, k);
                for (int j = 0; j < c; j++) acc[i * c + j] = VFMA(av, bv[j], acc[i * c + j]);
            }
        }
    }
    if (tail) {
        for (int i = 0; i < r; i++) {
            const pg_vf av = VLOAD(ta + i * PG_RD_V);
            for (int j = 0; j < c; j++) acc[i * c + j] = VFMA(av, VLOAD(tb + j * PG_RD_V), acc[i * c + j]);
        }
    }
    rd_sums(acc, r * c, out);
}

static void rd_dispatch(int r, int c, int h, const char * a, int64_t arow, const float * b, int64_t ldb, int64_t kv,
                        const float * ta, const float * tb, int tail, float * out, const char * pf, int64_t pf_step, int pf_l2) {
#define PG_RD_CASE(R, C) if (r == R && c == C) { \
        if (h == PG_RD_F32) rd_block(R, C, PG_RD_F32, a, arow, b, ldb, kv, ta, tb, tail, out, pf, pf_step, pf_l2); \
        else if (h == PG_RD_F16) rd_block(R, C, PG_RD_F16, a, arow, b, ldb, kv, ta, tb, tail, out, pf, pf_step, pf_l2); \
        else rd_block(R, C, PG_RD_Q8_0, a, arow, b, ldb, kv, ta, tb, tail, out, pf, pf_step, pf_l2); \
        return; }
#if PG_RD_C_NARROW_2R == 8
    PG_RD_CASE(2, 8) PG_RD_CASE(2, 7) PG_RD_CASE(1, 8) PG_RD_CASE(1, 7)
#endif
#if PG_RD_C == 6
    PG_RD_CASE(4, 6) PG_RD_CASE(4, 5) PG_RD_CASE(3, 6) PG_RD_CASE(3, 5) PG_RD_CASE(2, 6) PG_RD_CASE(2, 5)
    PG_RD_CASE(1, 6) PG_RD_CASE(1, 5)
#endif
#if PG_RD_R == 4
    PG_RD_CASE(4, 4) PG_RD_CASE(4, 3) PG_RD_CASE(4, 2) PG_RD_CASE(4, 1)
#endif
    PG_RD_CASE(3, 4) PG_RD_CASE(3, 3) PG_RD_CASE(3, 2) PG_RD_CASE(3, 1)
    PG_RD_CASE(2, 4) PG_RD_CASE(2, 3) PG_RD_CASE(2, 2) PG_RD_CASE(2, 1)
    PG_RD_CASE(1, 4) PG_RD_CASE(1, 3) PG_RD_CASE(1, 2) PG_RD_CASE(1, 1)
#undef PG_RD_CASE
}
#endif

#if PG_RD_VECTOR && PG_RD_V == 16
/* Short rows (K <= PG_RD_VERT_MAX_K) "vertically": the vector lanes hold 16 rows of A (one output
 * each) instead of 16 values of one row, so no output's lanes are added across a vector. Each
 * output gets the same float operations as rd_block and vsum give it: for each lane class l < 16,
 * from 0, fused multiply-adds over k = l, l + 16, ... in order (nothing where no k < K: 0, which is
 * what the zero-padded tail adds), then the classes added by vsum's tree, (l, l + 8), (l, l + 4),
 * (l, l + 2), (0, 1). Against the row products' horizontal sums (per output: K / 16 fused multiply-adds,
 * then about 3 shuffles and adds), this spends one add per output and none across lanes. The 16
 * rows are first transposed into at (K x 16 floats), which every column then reads. Compiled
 * without reassociation, and from a 0 the compiler cannot fold (a product's -0 plus 0 is +0, as in
 * rd_block). */
#define PG_RD_VERT_MAX_K 128
#define PG_RD_VERT_COLS 4
static volatile float pg_rd_zero = 0.0f;
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-associative-math")
#endif
/* lane class l's sums for nc columns: from 0, fused multiply-adds over k = l, l + 16, ... < K */
static inline __attribute__((always_inline)) void rd_vertical_class(const int nc, const int l, const float * at,
        int64_t k, const float * b, int64_t ldb, __m512 z, __m512 * acc) {
    for (int j = 0; j < nc; j++) acc[j] = z;
    for (int64_t kk = l; kk < k; kk += 16) {
        const __m512 av = _mm512_loadu_ps(at + kk * 16);
        for (int j = 0; j < nc; j++) acc[j] = _mm512_fmadd_ps(av, _mm512_set1_ps(b[j * ldb + kk]), acc[j]);
    }
}

/* y[j] = (class l + class l + 8) + ... by vsum's tree, written out: pair(l) = l + (l + 8),
 * four(l) = pair(l) + pair(l + 4), eight(l) = four(l) + four(l + 2), y = eight(0) + eight(1). */
static inline __attribute__((always_inline)) void rd_vertical_cols(const int nc, const float * at, int64_t k,
        const float * b, int64_t ldb, __m512 * y) {
#ifdef __clang__
#pragma clang fp reassociate(off)
#endif
    const __m512 z = _mm512_set1_ps(pg_rd_zero);
    __m512 eight[2][PG_RD_VERT_COLS];
    for (int h = 0; h < 2; h++) {
        __m512 four[2][PG_RD_VERT_COLS];
        for (int f = 0; f < 2; f++) {
            __m512 pair[2][PG_RD_VERT_COLS];
            for (int e = 0; e < 2; e++) {
                __m512 lo[PG_RD_VERT_COLS], hi[PG_RD_VERT_COLS];
                const int l = h + 2 * f + 4 * e;
                rd_vertical_class(nc, l, at, k, b, ldb, z, lo);
                rd_vertical_class(nc, l + 8, at, k, b, ldb, z, hi);
                for (int j = 0; j < nc; j++) pair[e][j] = _mm512_add_ps(lo[j], hi[j]);
            }
            for (int j = 0; j < nc; j++) four[f][j] = _mm512_add_ps(pair[0][j], pair[1][j]);
        }
        for (int j = 0; j < nc; j++) eight[h][j] = _mm512_add_ps(four[0][j], four[1][j]);
    }
    for (int j = 0; j < nc; j++) y[j] = _mm512_add_ps(eight[0][j], eight[1][j]);
}
/* Long products in register tiles ("tiles"): 32 lanes of X (2 vectors, an output in each lane)
 * against PG_RD_T_NR values of Y broadcast, 2 PG_RD_T_NR accumulators. Each output gets rd_block's
 * float operations, so the bits of the row products: the 16 lane classes in turn, each from 0 by
 * fused multiply-adds over k = l, l + 16, ... (+ 0 where the zero-padded tail has no value), then
 * vsum's tree, ((c0 + c8) + (c4 + c12)) + ((c2 + c10) + (c6 + c14)) + ..., its partial sums
 * taken as the classes arrive (`order`) and kept in a stack. No add across lanes, so nothing of
 * the row products' horizontal sums, and each operand packed once per block: X per tile of 32,
 * xp[l][t][32] = X[x][l + 16 t], Y per panel, yp[l][t][PG_RD_T_NR] = Y[y][l + 16 t] (F32, F16 and
 * Q8_0 values converted exactly, zero-padded). One thread, F16 A, against the row products and
 * numpy's sgemm on F32 A (GFLOP/s): 384 x 31744 x 192 79 -> 112-127 (sgemm 144-160), 1536 x 7936
 * x 384 115 -> 138-162 (157-194), 6144 x 992 x 768 114 -> 142-183 (160-187). */
#define PG_RD_T_NR 12
#if defined(__clang__)
#define PG_RD_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define PG_RD_UNROLL _Pragma("GCC unroll 32")  /* whole, so that the accumulators stay in registers */
#else
#define PG_RD_UNROLL
#endif
/* The shapes the tiles take. Each operand is packed before its products (X per block, Y once per
   block of X, at about 8 fused multiply-adds' time per value), and the packing reads the weights
   from memory without overlapping the products, where the row products fetch the next rows while
   they compute. Measured per op in a 1.4 s encode and decode (2 threads, alternating with the row
   products): products of 64 output rows over 248 columns and 768 values 1.2x the row products'
   time, so at least PG_RD_T_MIN_M rows; 31 columns of 1536 F16 rows over 1024 values 1.4x (1 thread
   from cache: 0.84x), so at least PG_RD_T_MIN_N columns; 512 columns over 4096 values (the
   encoder's im2col product: one tile per block, Y packed again for each) 1.8x, so at most
   PG_RD_T_MAX_K values. */
#define PG_RD_T_MIN_N 32
/* pg_rowdot's products (the weights as stored) take the tiles from more columns than the row loops
   spread their fetches over (PG_RD_PF_SPREAD blocks of PG_RD_C): up to there the row loops read the
   next rows while every block computes. AVX-512, 2 threads, interleaved, best of 21: F16 rows of
   1024-1536 values, 1536-12288 of them, against 32-48 columns ran 1.07-1.30x faster by rows than by
   tiles (512 values: even), F32 rows 1.06-1.41x; against 56, the fetches in the first block only,
   the tiles were 1.05-1.39x faster. The Winograd products (pg_rowdot_kx) keep PG_RD_T_MIN_N: by
   rows they would need their inputs transposed first. */
#define PG_RD_T_MIN_N_W (PG_RD_C * PG_RD_PF_SPREAD + 1)
#define PG_RD_T_MIN_M 128
#define PG_RD_T_MAX_K 2048
#define PG_RD_T_Y_ONCE_BYTES (4 << 20)  /* Y packed once where it is this small and X takes several blocks */

/* whether the tiles take m rows of A against n columns over k values, from min_n columns
   (pg_rowdot: PG_RD_T_MIN_N_W, pg_rowdot_kx: PG_RD_T_MIN_N) */
static inline int rd_tiles_fit(int64_t m, int64_t n, int64_t k, int64_t min_n) {
    return pg_rd_tiles_on && n >= min_n && m >= PG_RD_T_MIN_M && k > 0 && k <= PG_RD_T_MAX_K;
}

/* tile x panel: out[j * ldo + lane] for j < nc, the lanes kept by m0 and m1 */
static inline __attribute__((always_inline)) void rd_tile(const int nc, const float * xp, const float * yp,
        int64_t nt, int64_t k, float * out, int64_t ldo, __mmask16 m0, __mmask16 m1) {
#ifdef __clang__
#pragma clang fp reassociate(off)
#endif
    static const int order[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
    const __m512 z = _mm512_set1_ps(pg_rd_zero);
    float st[4 * 2 * PG_RD_T_NR * 16] __attribute__((aligned(64)));  /* the tree's partial sums, by level */
    for (int idx = 0; idx < 16; idx++) {
        const int l = order[idx];
        __m512 acc[2 * PG_RD_T_NR];
        PG_RD_UNROLL
        for (int j = 0; j < 2 * nc; j++) acc[j] = z;
        const float * xq = xp + (int64_t)l * nt * 32;
        const float * yq = yp + (int64_t)l * nt * PG_RD_T_NR;
        const int64_t tn = l + 16 * (nt - 1) < k ? nt : nt - 1;  /* the steps with a value */
        for (int64_t t = 0; t < tn; t++) {
            const __m512 x0 = _mm512_loadu_ps(xq + t * 32), x1 = _mm512_loadu_ps(xq + t * 32 + 16);
            PG_RD_UNROLL
            for (int j = 0; j < nc; j++) {
                const __m512 b = _mm512_set1_ps(yq[t * PG_RD_T_NR + j]);
                acc[2 * j] = _mm512_fmadd_ps(x0, b, acc[2 * j]);
                acc[2 * j + 1] = _mm512_fmadd_ps(x1, b, acc[2 * j + 1]);
            }
        }
        if (tn < nt)  /* the zero-padded tail: fma(0, 0, acc) */
            PG_RD_UNROLL
            for (int j = 0; j < 2 * nc; j++) acc[j] = _mm512_add_ps(acc[j], z);
        int lvl = 0;
        for (; idx >> lvl & 1; lvl++) {
            const float * sp = st + lvl * 2 * PG_RD_T_NR * 16;
            PG_RD_UNROLL
            for (int j = 0; j < 2 * nc; j++) acc[j] = _mm512_add_ps(_mm512_load_ps(sp + 16 * j), acc[j]);
        }
        if (idx < 15) {
            float * sp = st + lvl * 2 * PG_RD_T_NR * 16;
            PG_RD_UNROLL
            for (int j = 0; j < 2 * nc; j++) _mm512_store_ps(sp + 16 * j, acc[j]);
        } else
            PG_RD_UNROLL
            for (int j = 0; j < nc; j++) {
                _mm512_mask_storeu_ps(out + j * ldo, m0, acc[2 * j]);
                _mm512_mask_storeu_ps(out + j * ldo + 16, m1, acc[2 * j + 1]);
            }
    }
}

/* A causal conv from one input channel (the encoder's first conv: 7 taps, 64 outputs), straight
 * from the signal: each output gets the float operations the row products give it through ggml's
 * im2col columns (rd_tile, rd_vertical): lane class l < K holds fma(x[t + l - (K - 1)], w_l, 0), the
 * classes from K on hold 0, vsum's tree adds them, then the bias is added (ggml_add's value). The
 * columns (K floats per output), their packing and the bias pass go; the 16 outputs' K inputs are
 * K unaligned loads shared by every output channel. */
static inline __attribute__((always_inline)) __m512 rd_c1_tree(const __m512 * xv, const float * w, int64_t k, __m512 z) {
#ifdef __clang__
#pragma clang fp reassociate(off)
#endif
    __m512 c[16], pair[8], four[4];
    for (int l = 0; l < 16; l++) c[l] = l < k ? _mm512_fmadd_ps(xv[l], _mm512_set1_ps(w[l]), z) : z;
    for (int l = 0; l < 8; l++) pair[l] = _mm512_add_ps(c[l], c[l + 8]);
    for (int l = 0; l < 4; l++) four[l] = _mm512_add_ps(pair[l], pair[l + 4]);
    return _mm512_add_ps(_mm512_add_ps(four[0], four[2]), _mm512_add_ps(four[1], four[3]));
}

/* x[i0 + lane] for 0 <= i0 + lane < len, else 0 */
static inline __m512 rd_c1_load(const float * x, int64_t len, int64_t i0) {
    if (i0 >= 0 && i0 + 16 <= len) return _mm512_loadu_ps(x + i0);
    float v[16];
    for (int i = 0; i < 16; i++) v[i] = i0 + i >= 0 && i0 + i < len ? x[i0 + i] : 0.0f;
    return _mm512_loadu_ps(v);
}

#define PG_C1_CHUNK 2048  /* outputs per unit of work (threads take whole units) */
static void rd_conv_c1(const float * x, int64_t len, const float * w, int64_t k, const float * bias, int64_t cout,
                       float * y, int ith, int nth) {
    const __m512 z = _mm512_set1_ps(pg_rd_zero);
    const int64_t units = (len + PG_C1_CHUNK - 1) / PG_C1_CHUNK;
    for (int64_t u = units * ith / nth; u < units * (ith + 1) / nth; u++) {
        const int64_t t1 = (u + 1) * PG_C1_CHUNK < len ? (u + 1) * PG_C1_CHUNK : len;
        for (int64_t t = u * PG_C1_CHUNK; t < t1; t += 16) {
            __m512 xv[16];
            for (int l = 0; l < 16; l++) xv[l] = z;
            for (int64_t l = 0; l < k; l++) xv[l] = rd_c1_load(x, len, t + l - (k - 1));
            const __mmask16 keep = t + 16 <= len ? (__mmask16) 0xFFFF : (__mmask16)((1u << (len - t)) - 1u);
            for (int64_t o = 0; o < cout; o++) {  /* the 16 outputs' inputs loaded once for every channel */
                __m512 v = rd_c1_tree(xv, w + o * k, k, z);
                if (bias) v = _mm512_add_ps(v, _mm512_set1_ps(bias[o]));
                _mm512_mask_storeu_ps(y + o * len + t, keep, v);
            }
        }
    }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

static void rd_tile_dispatch(int nc, const float * xp, const float * yp, int64_t nt, int64_t k, float * out,
                             int64_t ldo, __mmask16 m0, __mmask16 m1) {
    switch (nc) {
#define PG_RD_T_CASE(N) case N: rd_tile(N, xp, yp, nt, k, out, ldo, m0, m1); return;
    PG_RD_T_CASE(12) PG_RD_T_CASE(11) PG_RD_T_CASE(10) PG_RD_T_CASE(9) PG_RD_T_CASE(8) PG_RD_T_CASE(7)
    PG_RD_T_CASE(6) PG_RD_T_CASE(5) PG_RD_T_CASE(4) PG_RD_T_CASE(3) PG_RD_T_CASE(2) PG_RD_T_CASE(1)
#undef PG_RD_T_CASE
    default: return;
    }
}

/* v[0..16) transposed in place: lane r of v[l] becomes lane l of v[r] */
static inline __attribute__((always_inline)) void rd_transpose16(__m512 * v) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(v[i], v[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(v[i], v[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        v[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        v[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
        v[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        v[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(v[i], v[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(v[i], v[i + 4], 0xDD);
        t[i + 8] = _mm512_shuffle_f32x4(v[i + 8], v[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(v[i + 8], v[i + 12], 0xDD);
    }
    for (int i = 0; i < 4; i++) {
        v[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        v[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
        v[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
        v[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xDD);
    }
}

static inline __mmask16 rd_mask(int64_t n) { return (__mmask16)(n >= 16 ? 0xFFFF : n <= 0 ? 0 : (1u << n) - 1u); }

/* An operand of rd_tiles: rows of `kind` values, `row` bytes apart (kstep 0), or F32 given k-major,
 * value k of row r at p[k kstep + r]. */
struct rd_opnd { const char * p; int kind; int64_t row, kstep; };

/* values 16 t .. 16 t + 16 of row r of o (k values, past k: 0), as F32 (exact) */
static inline __attribute__((always_inline)) __m512 rd_load16(const struct rd_opnd * o, int64_t r, int64_t t, int64_t k) {
    const char * row = o->p + r * o->row;
    const int64_t q = 16 * t;
    if (q + 16 <= k) return load_a(row, o->kind, q);
    float v[16];
    for (int e = 0; e < 16; e++) v[e] = q + e < k ? pg_rd_value(row, o->kind, q + e) : 0.0f;
    return VLOAD(v);
}

/* rows r0 .. r0 + nr (nr <= w, w 32 or PG_RD_T_NR) of o, k values, as out[l][t][w] = o[r0 + i][l + 16 t]
 * (zero-padded to w and to nt vectors of k) */
static void rd_tile_pack(const struct rd_opnd * o, int64_t r0, int64_t nr, int64_t k, int64_t nt, int w, float * out) {
    if (o->kstep) {  /* k-major: each vector of the packed form is a piece of one row of the given */
        const float * x = (const float *)o->p + r0;
        for (int h = 0; h < w; h += 16) {
            const __mmask16 m = rd_mask(nr - h), keep = rd_mask(w - h);
            for (int64_t q = 0; q < nt * 16; q++) {
                const __m512 v = q < k ? _mm512_maskz_loadu_ps(m, x + q * o->kstep + h) : _mm512_setzero_ps();
                _mm512_mask_storeu_ps(out + ((q & 15) * nt + (q >> 4)) * w + h, keep, v);
            }
        }
        return;
    }
    for (int h = 0; h < w; h += 16) {  /* rows: 16 x 16 blocks transposed */
        const __mmask16 keep = rd_mask(w - h);
        for (int64_t t = 0; t < nt; t++) {
            __m512 v[16];
            for (int i = 0; i < 16; i++) v[i] = h + i < nr ? rd_load16(o, r0 + h + i, t, k) : _mm512_setzero_ps();
            rd_transpose16(v);
            for (int l = 0; l < 16; l++) _mm512_mask_storeu_ps(out + ((int64_t)l * nt + t) * w + h, keep, v[l]);
        }
    }
}

/* out[y][x] = tile[y][x] for y < nc, x < nr (tile: PG_RD_T_NR rows of 32), out rows ldc apart, as
 * c[x ldc + y]: transposed by 16 x 16 blocks */
static void rd_tile_store_t(const float * tile, int nc, int64_t nr, float * c, int64_t ldc) {
    const __mmask16 keep = rd_mask(nc);
    for (int h = 0; h < 32 && h < nr; h += 16) {
        __m512 v[16];
        for (int j = 0; j < 16; j++) v[j] = j < nc ? _mm512_loadu_ps(tile + j * 32 + h) : _mm512_setzero_ps();
        rd_transpose16(v);
        for (int i = 0; i < 16 && h + i < nr; i++) _mm512_mask_storeu_ps(c + (h + i) * ldc, keep, v[i]);
    }
}

/* C[x + y ldc] (trans 0) or C[x ldc + y] (trans 1) = sum_k X[x][k] Y[y][k] for x < nx, y < ny, with
 * the row products' sums. X in blocks of tiles within PG_RD_L2_BYTES, each crossed by every panel of
 * Y in turn. Returns 0 where scratch is refused (counted). */
static int rd_tiles(int64_t nx, int64_t ny, int64_t k, const struct rd_opnd * x, const struct rd_opnd * y,
                    float * c, int64_t ldc, int trans) {
    const int64_t nt = (k + 15) / 16, tile = nt * 16 * 32, ypanel = nt * 16 * PG_RD_T_NR;
    const int64_t ntiles = (nx + 31) / 32, npanels = (ny + PG_RD_T_NR - 1) / PG_RD_T_NR;
    int64_t per_block = PG_RD_L2_BYTES / (tile * (int64_t)sizeof(float));
    per_block = per_block < 1 ? 1 : per_block > ntiles ? ntiles : per_block;
    const int y_once = per_block < ntiles && npanels * ypanel * (int64_t)sizeof(float) <= PG_RD_T_Y_ONCE_BYTES;
    int slot;
    float * buf = pg_scratch_take((size_t)(per_block * tile + (y_once ? npanels : 1) * ypanel + PG_RD_T_NR * 32), &slot);
    if (!buf) return 0;
    float * yp = buf + per_block * tile, * tout = yp + (y_once ? npanels : 1) * ypanel;
    for (int64_t p = 0; y_once && p < npanels; p++) {
        const int64_t y0 = p * PG_RD_T_NR;
        rd_tile_pack(y, y0, ny - y0 < PG_RD_T_NR ? ny - y0 : PG_RD_T_NR, k, nt, PG_RD_T_NR, yp + p * ypanel);
    }
    for (int64_t b0 = 0; b0 < ntiles; b0 += per_block) {
        const int64_t b1 = b0 + per_block < ntiles ? b0 + per_block : ntiles;
        for (int64_t t = b0; t < b1; t++)
            rd_tile_pack(x, 32 * t, nx - 32 * t < 32 ? nx - 32 * t : 32, k, nt, 32, buf + (t - b0) * tile);
        for (int64_t p = 0; p < npanels; p++) {
            const int64_t y0 = p * PG_RD_T_NR;
            const int nc = (int)(ny - y0 < PG_RD_T_NR ? ny - y0 : PG_RD_T_NR);
            const float * ypp = y_once ? yp + p * ypanel : yp;
            if (!y_once) {
                rd_tile_pack(y, y0, nc, k, nt, PG_RD_T_NR, yp);
                /* the next panel's rows, fetched from memory while this one's products run (a k-major Y
                   is a Winograd block's transformed input, just written and in cache) */
                if (!y->kstep && p + 1 < npanels)
                    for (int64_t j = y0 + PG_RD_T_NR; j < y0 + 2 * PG_RD_T_NR && j < ny; j++)
                        rd_prefetch(y->p + j * y->row, pg_rd_row_bytes(y->kind, k), 1);
            }
            for (int64_t t = b0; t < b1; t++) {
                const int64_t nr = nx - 32 * t < 32 ? nx - 32 * t : 32;
                const float * xp = buf + (t - b0) * tile;
                if (trans) {
                    rd_tile_dispatch(nc, xp, ypp, nt, k, tout, 32, 0xFFFF, 0xFFFF);
                    rd_tile_store_t(tout, nc, nr, c + 32 * t * ldc + y0, ldc);
                } else
                    rd_tile_dispatch(nc, xp, ypp, nt, k, c + 32 * t + y0 * ldc, ldc, rd_mask(nr), rd_mask(nr - 16));
            }
        }
    }
    pg_scratch_give(buf, slot);
    return 1;
}

/* C[i + j * csj] = sum_k A[i][k] B[j][k] (F32 A, K <= PG_RD_VERT_MAX_K) by rd_vertical_cols: rows in
 * blocks of 16, columns PG_RD_VERT_COLS at a time. at: scratch of K x 16 floats. */
static void rd_vertical(int64_t m, int64_t n, int64_t k, const float * a, int64_t lda, const float * b, int64_t ldb,
                        float * c, int64_t csj, float * at) {
    for (int64_t i0 = 0; i0 < m; i0 += 16) {
        const int64_t rows = m - i0 < 16 ? m - i0 : 16;
        const __mmask16 keep = (__mmask16)((1u << rows) - 1u);
        for (int64_t kk = 0; kk < k; kk++)
            for (int64_t q = 0; q < 16; q++) at[kk * 16 + q] = q < rows ? a[(i0 + q) * lda + kk] : 0.0f;
        for (int64_t j0 = 0; j0 < n; j0 += PG_RD_VERT_COLS) {
            const int64_t nc = n - j0 < PG_RD_VERT_COLS ? n - j0 : PG_RD_VERT_COLS;
            __m512 y[PG_RD_VERT_COLS];
            const float * bj = b + j0 * ldb;
            if (nc == PG_RD_VERT_COLS) rd_vertical_cols(PG_RD_VERT_COLS, at, k, bj, ldb, y);
            else if (nc == 3) rd_vertical_cols(3, at, k, bj, ldb, y);
            else if (nc == 2) rd_vertical_cols(2, at, k, bj, ldb, y);
            else rd_vertical_cols(1, at, k, bj, ldb, y);
            for (int64_t j = 0; j < nc; j++) _mm512_mask_storeu_ps(c + i0 + (j0 + j) * csj, keep, y[j]);
        }
    }
}
#endif

/* C[i * csi + j * csj] = beta C + sum_k A[i][k] B[j][k] for i < m, j < n: A rows of lda values of
 * a_kind (PG_RD_F32, PG_RD_F16 or PG_RD_Q8_0; K a multiple of 32 for Q8_0) from a, B rows at b + j
 * ldb (F32). Returns 0 where this build has no vector code (the callers then use the BLAS) or
 * scratch is refused (counted), 2 where the register tiles computed it, else 1.
 *
 * The loops, by shape (none changes a sum):
 * - with 16-float vectors, beta 0, C stored along either index (csi or csj 1), at least
 *   PG_RD_T_MIN_N_W columns and PG_RD_T_MIN_M rows over at most PG_RD_T_MAX_K values: rd_tiles,
 *   A's rows across the lanes;
 * - F32 rows of at most PG_RD_VERT_MAX_K values, into contiguous output rows (csi 1), beta 0, with
 *   16-float vectors: rd_vertical, 16 rows across the lanes (single thread, a 864 x 864 product
 *   over K = 64: 57 -> 98 GFLOP/s; K = 32: 33 -> 72; K = 7, the encoder's first conv: 6 -> 18;
 *   K = 192 lost, 95 -> 83);
 * - fewer than PG_RD_UP_COLS columns (a streamed chunk): each block of PG_RD_R rows once, the
 *   columns PG_RD_C_NARROW at a time past it (F16 and Q8_0 rows converted per vector);
 * - PG_RD_BLOCK_COLS or more, with PG_RD_C columns of K values within PG_RD_L1_BYTES: blocks of rows of at most
 *   PG_RD_L2_BYTES as F32 (F16 and Q8_0 rows converted once per block), each crossed by panels
 *   of columns of at most PG_RD_L1_BYTES: the panel stays in L1 while the rows stream from L2.
 *   Rows in L1 and columns from L2, the other way round, ran 384-channel products at 0.8x;
 * - else: columns in panels of at most `panel` (their B rows stay in L2 while every row
 *   of A passes once per panel), F16 and Q8_0 rows of at most PG_RD_UP_MAX_K values converted
 *   once per block of PG_RD_R rows and panel. */
int pg_rowdot(int64_t m, int64_t n, int64_t k, const void * a, int64_t lda, int a_kind, const float * b, int64_t ldb,
              float beta, float * c, int64_t csi, int64_t csj, int64_t panel) {
#if PG_RD_VECTOR
#if PG_RD_V == 16
    if (a_kind == PG_RD_F32 && k <= PG_RD_VERT_MAX_K && k > 0 && csi == 1 && beta == 0.0f) {
        int vslot;
        float * at = pg_scratch_take((size_t)(k * 16), &vslot);
        if (!at) return 0;  /* out of memory: counted (pg_scratch_failures), the compute raises */
        rd_vertical(m, n, k, a, lda, b, ldb, c, csj, at);
        pg_scratch_give(at, vslot);
        return 1;
    }
    if (beta == 0.0f && (csi == 1 || csj == 1) && rd_tiles_fit(m, n, k, PG_RD_T_MIN_N_W)) {
        /* the register tiles, lanes along A's rows: C stored whole along them (csi 1) or transposed */
        const struct rd_opnd x = {(const char *)a, a_kind, pg_rd_row_bytes(a_kind, lda), 0};
        const struct rd_opnd y = {(const char *)b, PG_RD_F32, ldb * (int64_t)sizeof(float), 0};
        return rd_tiles(m, n, k, &x, &y, c, csi == 1 ? csj : csi, csi != 1) ? 2 : 0;
    }
#endif
    const int64_t kv = k / PG_RD_V * PG_RD_V;
    const int tail = k > kv;
    const int64_t row = pg_rd_row_bytes(a_kind, lda);
    float ta[PG_RD_R * PG_RD_V], out[PG_RD_R * PG_RD_C];
    if (panel < PG_RD_C) panel = PG_RD_C;
    const int wide = n >= PG_RD_UP_COLS && kv > 0;
    const int blocked = n >= PG_RD_BLOCK_COLS && kv > 0 && k * (int64_t)sizeof(float) * PG_RD_C <= PG_RD_L1_BYTES;
    int64_t mc = m;  /* rows per block */
    if (blocked) {
        mc = PG_RD_L2_BYTES / (kv * (int64_t)sizeof(float)) / PG_RD_R * PG_RD_R;
        mc = mc < PG_RD_R ? PG_RD_R : mc > m ? m : mc;
        const int64_t np = PG_RD_L1_BYTES / (k * (int64_t)sizeof(float)) / PG_RD_C * PG_RD_C;
        panel = np < panel ? np : panel;
    }
    /* converted rows: a block's (blocked), else a block of PG_RD_R rows' */
    const int up_block = blocked && a_kind != PG_RD_F32;
    const int up_rows = !blocked && wide && a_kind != PG_RD_F32 && kv <= PG_RD_UP_MAX_K;
    float * af = NULL;
    int slot = -1;
    if (up_block || up_rows) {
        af = pg_scratch_take((size_t)((up_block ? mc : PG_RD_R) * kv), &slot);
        if (!af) return 0;  /* out of memory: counted (pg_scratch_failures), the compute raises */
    }
    const int kind = af ? PG_RD_F32 : a_kind;
    /* F16 and Q8_0 rows as read against PG_RD_C_NARROW columns at a time, or all of them in
       blocks of 2 rows up to PG_RD_C_NARROW_2R */
    const int two_rows = kind != PG_RD_F32 && n > PG_RD_C_NARROW && n <= PG_RD_C_NARROW_2R
                         && (kind != PG_RD_F16 || n * k * (int64_t)sizeof(float) <= pg_rd_two_rows_max);
    const int64_t width = kind == PG_RD_F32 ? PG_RD_C : two_rows ? PG_RD_C_NARROW_2R : PG_RD_C_NARROW;
    /* rows per block as read (see PG_RD_R_F16_1) */
    const int64_t rb = two_rows ? 2 : kind == PG_RD_Q8_0 && n <= PG_RD_C_NARROW ? PG_RD_R_Q8_0
                     : kind == PG_RD_F16 && n == 1 ? PG_RD_R_F16_1 : PG_RD_R;
    const int64_t arow = up_block ? kv * (int64_t)sizeof(float) : row;  /* bytes between the rows read */
    /* the K tails of a panel's columns, zero-padded to V values, made once per panel */
    const int64_t most = n < panel ? n : panel;
    float * tbp = NULL;
    int tslot = -1;
    if (tail && !(tbp = pg_scratch_take((size_t)(most * PG_RD_V), &tslot))) {
        if (af) pg_scratch_give(af, slot);
        return 0;  /* out of memory: counted (pg_scratch_failures), the compute raises */
    }
    for (int64_t ib0 = 0; ib0 < m; ib0 += mc) {
        const int64_t ib1 = ib0 + mc < m ? ib0 + mc : m;
        const char * ab = (const char *)a + (size_t)(ib0 * row);  /* the block's rows, as read */
        if (up_block) {
            pg_rd_rows_to_f32(ab, a_kind, row, ib1 - ib0, kv, af);
            ab = (const char *)af;
        }
        for (int64_t j0 = 0; j0 < n; j0 += panel) {
            const int64_t j1 = j0 + panel < n ? j0 + panel : n;
            if (tail)
                for (int64_t j = j0; j < j1; j++)
                    for (int64_t q = 0; q < PG_RD_V; q++)
                        tbp[(j - j0) * PG_RD_V + q] = kv + q < k ? b[j * ldb + kv + q] : 0.0f;
            /* few column blocks (a streamed chunk's): the fetches spread over all of them, so that
               reads from memory go on through every block's products */
            const int64_t nblk = (j1 - j0 + width - 1) / width;
            const int64_t spread = nblk <= PG_RD_PF_SPREAD ? nblk : 1;
            const int64_t share = (rb * arow / spread + 63) / 64 * 64;
            /* a share spread over a block's kv / V vectors, in whole cache lines */
            const int64_t pf_share = kv > 0 ? (share / (kv / PG_RD_V) + 63) / 64 * 64 : 0;
            /* blocks ahead that the fetches run (pg_rd_pf_ahead) */
            const int64_t ahead = !blocked && n <= PG_RD_C_NARROW_2R && pg_rd_pf_ahead > rb * arow
                                  ? (pg_rd_pf_ahead + rb * arow - 1) / (rb * arow) : 1;
            for (int64_t i0 = ib0; i0 < ib1; i0 += rb) {
                const int r = (int)(ib1 - i0 < rb ? ib1 - i0 : rb);
                const char * src = (const char *)a + (size_t)(i0 * row);  /* the rows as stored */
                const char * ar = ab + (size_t)((i0 - ib0) * arow);
                int64_t ra = arow;
                if (tail)
                    for (int i = 0; i < r; i++)
                        for (int64_t q = 0; q < PG_RD_V; q++)
                            ta[i * PG_RD_V + q] = kv + q < k ? pg_rd_value(src + i * row, a_kind, kv + q) : 0.0f;
                if (up_rows) {
                    pg_rd_rows_to_f32(src, a_kind, row, r, kv, af);
                    ar = (const char *)af, ra = kv * (int64_t)sizeof(float);
                }
                for (int64_t jb = j0; jb < j1; jb += width) {
                    const int cc = (int)(j1 - jb < width ? j1 - jb : width);
                    const float * br = b + jb * ldb;
                    const float * tb = tail ? tbp + (jb - j0) * PG_RD_V : NULL;
                    /* the full block of rows `ahead` blocks on, as read (rows converted per block: as
                       stored, which the conversion reads), is fetched by the first `spread` column
                       blocks, a share each */
                    const int64_t t = (jb - j0) / width;
                    const int fetch = t < spread && kv > 0 && i0 + (ahead + 1) * rb <= ib1;
                    const char * pf = !fetch ? NULL
                        : (up_rows ? src + (size_t)(ahead * rb * row) : ar + (size_t)(ahead * rb * arow)) + t * share;
                    rd_dispatch(r, cc, kind, ar, ra, br, ldb, kv, ta, tb, tail, out, pf, pf_share, !blocked);
                    for (int i = 0; i < r; i++)
                        for (int j = 0; j < cc; j++) {
                            float * o = c + (i0 + i) * csi + (jb + j) * csj;
                            *o = beta == 0.0f ? out[i * cc + j] : beta * *o + out[i * cc + j];
                        }
                }
            }
        }
    }
    if (af) pg_scratch_give(af, slot);
    if (tbp) pg_scratch_give(tbp, tslot);
    return 1;
#else
    (void) m; (void) n; (void) k; (void) a; (void) lda; (void) a_kind; (void) b; (void) ldb; (void) beta; (void) c;
    (void) csi; (void) csj; (void) panel;
    return 0;
#endif
}

/* pg_rowdot's C[i csi + j] = sum_k A[i][k] B[j][k] (beta 0, the same sums) with F32 A (rows lda apart)
 * and B given k-major, B[j][k] = bk[k ldbk + j], by the register tiles (the Winograd products over
 * their transformed inputs as they lie). pg_rowdot_kx_fits: whether they take the shape (pg_rowdot's
 * rule); else, and where scratch is refused (counted), pg_rowdot_kx returns 0. */
int pg_rowdot_kx_fits(int64_t m, int64_t n, int64_t k) {
#if PG_RD_VECTOR && PG_RD_V == 16
    return rd_tiles_fit(m, n, k, PG_RD_T_MIN_N);
#else
    (void) m; (void) n; (void) k;
    return 0;
#endif
}

int pg_rowdot_kx(int64_t m, int64_t n, int64_t k, const float * a, int64_t lda, const float * bk, int64_t ldbk,
                 float * c, int64_t csi) {
#if PG_RD_VECTOR && PG_RD_V == 16
    if (!pg_rowdot_kx_fits(m, n, k)) return 0;
    const struct rd_opnd x = {(const char *)a, PG_RD_F32, lda * (int64_t)sizeof(float), 0};
    const struct rd_opnd y = {(const char *)bk, PG_RD_F32, 0, ldbk};
    return rd_tiles(m, n, k, &x, &y, c, csi, 1);
#else
    (void) m; (void) n; (void) k; (void) a; (void) lda; (void) bk; (void) ldbk; (void) c; (void) csi;
    return 0;
#endif
}

/* ggml_mul_mat(a, b) by pg_rowdot: src0 a F32, F16 or Q8_0 ne [K, M, A2, A3] with contiguous rows,
 * src1 b F32 ne [K, N, B2, B3] (B2 % A2 == 0, B3 % A3 == 0) with contiguous rows; dst contiguous
 * F32 ne [M, N, B2, B3]. userdata: int64 [5] = the column panel, the most columns taken by
 * rows (max_n), then the BLAS block (pg_sgemm). Past max_n columns (a one-shot decode's longer
 * products, where a packed GEMM is faster) an F16 a is upcast block by block into scratch and
 * multiplied by the BLAS. Threads take whole blocks of rows of a (pg_blocks: by shape alone),
 * so each thread reads only its share of the weights. */
void pg_mul_mat_rowdot(void * dst_, int ith, int nth, void * userdata) {
    const int64_t * p = userdata;
    struct pg_tensor * dst = dst_;
    const struct pg_tensor * a = dst->src[0], * b = dst->src[1];
    const int64_t k = a->ne[0], m = a->ne[1], n = b->ne[1];
    const int kind = a->type == 1 ? PG_RD_F16 : a->type == 8 ? PG_RD_Q8_0 : PG_RD_F32;
    const int up_rows = kind != PG_RD_F32;  /* upcast or dequantized into scratch for the BLAS */
    const int64_t row = (int64_t)a->nb[1];  /* bytes */
    const int64_t lda = kind == PG_RD_Q8_0 ? row / PG_Q8_0_BLOCK * 32 : row / (kind == PG_RD_F16 ? 2 : 4);
    const int64_t ldb = (int64_t)(b->nb[1] / sizeof(float));
    const int64_t r2 = b->ne[2] / a->ne[2], r3 = b->ne[3] / a->ne[3];
    const int by_rows = n <= p[1] && pg_rowdot_lanes();
    int64_t i0, i1, block;
    pg_blocks(m, 16, m, ith, nth, &i0, &i1, &block);
    if (i0 >= i1) return;
    float * up = NULL;
    int slot = -1, prev = 0;
    if (!by_rows) {
        if (up_rows && !(up = pg_scratch_take((size_t)(block * k), &slot))) return;  /* out of memory: output unset */
        prev = pg_blas_enter(p + 2);
    }
    for (int64_t i3 = 0; i3 < b->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < b->ne[2]; i2++) {
            const char * ap = (const char *)a->data + (i2 / r2) * a->nb[2] + (i3 / r3) * a->nb[3];
            const float * bp = (const float *)((const char *)b->data + i2 * b->nb[2] + i3 * b->nb[3]);
            float * cp = (float *)((char *)dst->data + i2 * dst->nb[2] + i3 * dst->nb[3]);
            if (by_rows) {
                pg_rowdot(i1 - i0, n, k, ap + i0 * row, lda, kind, bp, ldb, 0.0f, cp + i0, 1, m, p[0]);
                continue;
            }
            for (int64_t j0 = i0; j0 < i1; j0 += block) {
                const int64_t j1 = j0 + block < i1 ? j0 + block : i1;
                const float * w = (const float *)(ap + j0 * row);
                int64_t ldw = lda;
                if (up_rows) {
                    pg_rd_rows_to_f32(ap + j0 * row, kind, row, j1 - j0, k, up);
                    w = up, ldw = k;
                }
                pg_sgemm(p + 2, 1, n, j1 - j0, k, bp, ldb, w, ldw, 0.0f, cp + j0, m);
            }
        }
    if (!by_rows) {
        pg_blas_leave(p + 2, prev);
        if (up_rows) pg_scratch_give(up, slot);
    }
}

/* A causal stride-1 conv from one input channel (rd_conv_c1; 16-float builds only, kernels.py
 * checks pg_rowdot_lanes): src0 w F32 contiguous ne [K, 1, Cout] (K <= 16), src1 x F32 contiguous
 * ne [L, 1], src2 (optional) bias F32 of Cout values; dst F32 contiguous ne [L, Cout]. Threads take
 * pieces of time; every output's sums are the same whatever the thread count. */
void pg_conv_c1(void * dst_, int ith, int nth, void * userdata) {
    (void) userdata;
    struct pg_tensor * dst = dst_;
    const struct pg_tensor * w = dst->src[0], * x = dst->src[1], * b = dst->src[2];
#if PG_RD_VECTOR && PG_RD_V == 16
    rd_conv_c1(x->data, x->ne[0], w->data, w->ne[0], b ? b->data : NULL, dst->ne[1], dst->data, ith, nth);
#else
    (void) w; (void) x; (void) b; (void) ith; (void) nth;
#endif
}

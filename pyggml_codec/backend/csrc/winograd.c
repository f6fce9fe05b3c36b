#include "pg_kernels.h"

/* Causal dilated conv by Winograd F(m, K) (no im2col): the same y as pg_conv_taps with
 * n = m + K - 1 GEMMs per m outputs instead of m K (F(2,7): 8 for 14; F(4,7): 10 for 28).
 * Tile (b, j) of dilation d holds the outputs t = j + d (m b + i), i < m, j < d; its n
 * inputs are xpad at j + d (m b - (K - 1) + r), r < n (the causal context: prev or zeros;
 * past the end: zeros, which only reach outputs past the end, dropped). Per tile:
 * v = BT . inputs, m_p = U_p . v_p for the n points p (U_p = G_p . W, made on the host:
 * winograd.Winograd.weights), y_i = sum_p A[i][p] m_p. userdata: int64 [13] = BLAS block (3),
 * d, block (tile rows of m outputs per thread block), split_below, min_chans, m, n, the
 * address of the F32 tables BT (n x n) then A (m x n), the most tiles taken by row products
 * (pg_rowdot; 0: never), the number of segments S (a batched step: S streams of L / S samples
 * packed in turn along time, each its own conv; prev then ne [(K - 1) d, S, Cin]), and 1 where the
 * input comes transformed (pg_conv_wino_input; split channels only). src0 u: contiguous F32 ne
 * [Cin, Cout, n]; src1 x: F32 ne [L, Cin] with contiguous rows; src2 (optional) prev: F32
 * ne [(K - 1) d, Cin], likewise; dst: contiguous F32 ne [L, Cout]. Threads split blocks of
 * tile rows (counted over the segments in turn: a block may hold the end of one stream and the
 * start of the next, its pieces side by side in one product) or, for short signals, the output
 * channels; chosen by shape alone, as in pg_conv_taps, so results do not depend on the thread
 * count. A tile's outputs do not depend on which other tiles share its product (the row products
 * sum each column alone; tests/test_batching.py holds streams bit for bit apart through the
 * BLAS's products too). */
enum { PG_WINO_MAX_N = 16 };

struct wino {
    int64_t m, n, kk, d, len, cin, cout;
    const float * bt, * at;  /* BT n x n, A m x n */
    const float * x, * prev, * u;
    int64_t ldx, ldp;
    float * y;
    int64_t ldy;
};

/* The transforms' vectors: WV tiles at a time, each lane the scalar loop's sums (a product, then
 * fused multiply-adds in order), so the width changes no value: 16 with AVX-512 (the 8-lane
 * transforms of a one-shot decode took 10 % of its time), else 8 with AVX2. wino_lanes(k): the
 * first k lanes, for a masked load or store (k < WV). */
#if defined(__AVX512F__) && defined(__FMA__)
#define WV 16
typedef __m512 wvec;
typedef __mmask16 wmask;
static inline wmask wino_lanes(int64_t k) { return (wmask)((1u << (k < WV ? k : WV)) - 1u); }
#define WLOAD(p) _mm512_loadu_ps(p)
#define WLOADM(p, k) _mm512_maskz_loadu_ps(k, p)
#define WSTORE(p, v) _mm512_storeu_ps(p, v)
#define WSTOREM(p, k, v) _mm512_mask_storeu_ps(p, k, v)
#define WMUL(a, b) _mm512_mul_ps(a, b)
#define WFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define WSET1(x) _mm512_set1_ps(x)
#define WINO_VECTOR 1
#elif defined(__AVX2__) && defined(__FMA__)
#define WV 8
typedef __m256 wvec;
typedef __m256i wmask;
static inline wmask wino_lanes(int64_t k) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#define WLOAD(p) _mm256_loadu_ps(p)
#define WLOADM(p, k) _mm256_maskload_ps(p, k)
#define WSTORE(p, v) _mm256_storeu_ps(p, v)
#define WSTOREM(p, k, v) _mm256_maskstore_ps(p, k, v)
#define WMUL(a, b) _mm256_mul_ps(a, b)
#define WFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define WSET1(x) _mm256_set1_ps(x)
#define WINO_VECTOR 1
#else
#define WINO_VECTOR 0
#endif

/* v_p[q] = sum_r BT[p][r] e_{r % m}[q + r / m] for q < nb, p < n: WV tiles at a time with
 * the n inputs in registers (n and m constant where inlined), the last ones through masked
 * loads and stores. Each lane sums a product, then fused multiply-adds in order: the scalar
 * loop's sums (builds without AVX2), so every tile gets the same bits wherever it lies. */
static inline __attribute__((always_inline)) void wino_bt_n(const float * restrict bt, const int64_t n,
        const int64_t m, const float * restrict e, int64_t ng, int64_t nb, float * restrict v, int64_t plane) {
    int64_t q = 0;
#if WINO_VECTOR
    for (; q < nb; q += WV) {
        const int whole = q + WV <= nb;
        const wmask lanes = wino_lanes(nb - q);
        wvec in[PG_WINO_MAX_N];
        for (int64_t r = 0; r < n; r++) {
            const float * src = e + (r % m) * ng + r / m + q;
            in[r] = whole ? WLOAD(src) : WLOADM(src, lanes);
        }
        for (int64_t p = 0; p < n; p++) {
            wvec acc = WMUL(WSET1(bt[p * n]), in[0]);
            for (int64_t r = 1; r < n; r++) acc = WFMA(WSET1(bt[p * n + r]), in[r], acc);
            if (whole) WSTORE(v + p * plane + q, acc);
            else WSTOREM(v + p * plane + q, lanes, acc);
        }
    }
#endif
    for (; q < nb; q++)
        for (int64_t p = 0; p < n; p++) {
            float acc = bt[p * n] * e[q];
            for (int64_t r = 1; r < n; r++) acc = fmaf(bt[p * n + r], e[(r % m) * ng + r / m + q], acc);
            v[p * plane + q] = acc;
        }
}

static void wino_bt(const float * bt, int64_t n, int64_t m, const float * e, int64_t ng, int64_t nb, float * v,
                    int64_t plane) {
    if (n == 10 && m == 4) wino_bt_n(bt, 10, 4, e, ng, nb, v, plane);
    else if (n == 8 && m == 2) wino_bt_n(bt, 8, 2, e, ng, nb, v, plane);
    else if (n == 10 && m == 10) wino_bt_n(bt, 10, 10, e, ng, nb, v, plane);  /* rows of whole tiles (wino_input_short) */
    else if (n == 8 && m == 8) wino_bt_n(bt, 8, 8, e, ng, nb, v, plane);
    else wino_bt_n(bt, n, m, e, ng, nb, v, plane);
}

#if WV == 16
/* The first steps of a 4 x 16 transpose of a[i][k] (i < 4, k < 16): u[t] holds tiles t, t + 4, t + 8,
 * t + 12, each tile's four values a[0..3][k] in one 128-bit lane */
static inline void wino_tiles4(const __m512 * a, __m512 * u) {
    const __m512 t0 = _mm512_unpacklo_ps(a[0], a[1]), t1 = _mm512_unpackhi_ps(a[0], a[1]);
    const __m512 t2 = _mm512_unpacklo_ps(a[2], a[3]), t3 = _mm512_unpackhi_ps(a[2], a[3]);
    u[0] = _mm512_shuffle_ps(t0, t2, 0x44);
    u[1] = _mm512_shuffle_ps(t0, t2, 0xEE);
    u[2] = _mm512_shuffle_ps(t1, t3, 0x44);
    u[3] = _mm512_shuffle_ps(t1, t3, 0xEE);
}

/* y[4 k + i] = a[i][k] for k < 16, i < 4: the four vectors interleaved, in four whole stores */
static inline void wino_store4x16(float * y, const __m512 * a) {
    __m512 u[4];
    wino_tiles4(a, u);
    const __m512 v0 = _mm512_shuffle_f32x4(u[0], u[1], 0x44), v1 = _mm512_shuffle_f32x4(u[0], u[1], 0xEE);
    const __m512 v2 = _mm512_shuffle_f32x4(u[2], u[3], 0x44), v3 = _mm512_shuffle_f32x4(u[2], u[3], 0xEE);
    _mm512_storeu_ps(y, _mm512_shuffle_f32x4(v0, v2, 0x88));
    _mm512_storeu_ps(y + 16, _mm512_shuffle_f32x4(v0, v2, 0xDD));
    _mm512_storeu_ps(y + 32, _mm512_shuffle_f32x4(v1, v3, 0x88));
    _mm512_storeu_ps(y + 48, _mm512_shuffle_f32x4(v1, v3, 0xDD));
}

/* y[stride k + i] = a[i][k] for k < 16, i < 4: each tile's four values stored at its own place */
static inline void wino_scatter4x16(float * y, int64_t stride, const __m512 * a) {
    __m512 u[4];
    wino_tiles4(a, u);
    for (int t = 0; t < 4; t++) {
        _mm_storeu_ps(y + stride * t, _mm512_castps512_ps128(u[t]));
        _mm_storeu_ps(y + stride * (t + 4), _mm512_extractf32x4_ps(u[t], 1));
        _mm_storeu_ps(y + stride * (t + 8), _mm512_extractf32x4_ps(u[t], 2));
        _mm_storeu_ps(y + stride * (t + 12), _mm512_extractf32x4_ps(u[t], 3));
    }
}
#endif

#if WINO_VECTOR
/* sum_p A[i][p] mv[p], the output transform's sums: a product, then fused multiply-adds in order */
static inline __attribute__((always_inline)) wvec wino_at_sum(const float * at, int64_t n, int64_t i, const wvec * mv) {
    wvec acc = WMUL(WSET1(at[i * n]), mv[0]);
    for (int64_t p = 1; p < n; p++) acc = WFMA(WSET1(at[i * n + p]), mv[p], acc);
    return acc;
}
#endif

/* y[t0 + m d k] (i-th output of tile k) = sum_p A[i][p] m_p[k] for k < nq_i, i < m, where
 * m_p = mr + p * mplane: WV tiles at a time with the n products in registers, the last ones
 * through masked loads (the same sums in every lane, as in wino_bt_n), stored one by one. */
static inline __attribute__((always_inline)) void wino_at_n(const float * restrict at, const int64_t n,
        const int64_t m, const float * restrict mr, int64_t mplane, int64_t nb, const int64_t * nq, float * yr,
        const int64_t * t0, int64_t step) {
    int64_t q = 0;
#if WINO_VECTOR
    for (; q < nb; q += WV) {  /* outputs at or past len (k >= nq[i]: the last tiles') not stored */
        const int whole = q + WV <= nb;
        const wmask lanes = wino_lanes(nb - q);
        wvec mv[PG_WINO_MAX_N];
        for (int64_t p = 0; p < n; p++)
            mv[p] = whole ? WLOAD(mr + p * mplane + q) : WLOADM(mr + p * mplane + q, lanes);
        for (int64_t i = 0; i < m; i++) {
            const int64_t kn = nq[i] - q < WV ? nq[i] - q : WV;
            if (kn <= 0) continue;
            const wvec acc = wino_at_sum(at, n, i, mv);
            float * yo = yr + t0[i] + step * q;
            if (step == 1 && kn == WV) {
                WSTORE(yo, acc);
                continue;
            }
            float out[WV];
            WSTORE(out, acc);
            for (int64_t k = 0; k < kn; k++) yo[step * k] = out[k];
        }
    }
#endif
    for (int64_t i = 0; i < m; i++)
        for (int64_t k = q; k < nq[i]; k++) {  /* the vector sums */
            float acc = at[i * n] * mr[k];
            for (int64_t p = 1; p < n; p++) acc = fmaf(at[i * n + p], mr[p * mplane + k], acc);
            yr[t0[i] + step * k] = acc;
        }
}

static void wino_at(const float * at, int64_t n, int64_t m, const float * mr, int64_t mplane, int64_t nb,
                    const int64_t * nq, float * yr, const int64_t * t0, int64_t step) {
    if (n == 10 && m == 4) wino_at_n(at, 10, 4, mr, mplane, nb, nq, yr, t0, step);
    else if (n == 8 && m == 2) wino_at_n(at, 8, 2, mr, mplane, nb, nq, yr, t0, step);
    else wino_at_n(at, n, m, mr, mplane, nb, nq, yr, t0, step);
}

/* For wino_input: of the ng inputs e_i[q] = xpad(c + m d q) of residue j, phase i (c = j + d (m b0 -
 * (K - 1) + i)), the first inside x (lh[0]) and the first past its end (lh[1]). */
static void wino_inside(const struct wino * w, int64_t b0, int64_t ng, int64_t j, int64_t i, int64_t * lh) {
    const int64_t step = w->m * w->d, c = j + w->d * (w->m * b0 - (w->kk - 1) + i);
    int64_t lo = c >= 0 ? 0 : (-c + step - 1) / step, hi = c >= w->len ? 0 : (w->len - c + step - 1) / step;
    lo = lo < ng ? lo : ng;
    lh[0] = lo;
    lh[1] = hi < lo ? lo : hi < ng ? hi : ng;
}

/* Input transform of tile rows [b0, b0 + nb) for every input channel: v[p][ci][j nb + q].
 * The inputs of channel ci, residue j are first gathered (strided by d) and split by phase:
 * e_i[q] = xpad(j + d (m (b0 + q) - (K - 1) + i)), so that input r of tile q is
 * e_{r % m}[q + r / m]. */
static void wino_input(const struct wino * w, int64_t b0, int64_t nb, float * restrict gbuf, float * restrict v,
                       int64_t ldv, int64_t plane) {
    const int64_t m = w->m, n = w->n, d = w->d, ng = nb + (n - 1) / m, step = m * d;
    /* per residue j and phase i, the same for every channel: the context before lh[0], x to lh[1], zeros after */
    enum { KEPT = 64 };
    int64_t lohi[2 * KEPT];
    const int kept = d * m <= KEPT;
    for (int64_t k = 0; k < (kept ? d * m : 0); k++) wino_inside(w, b0, ng, k / m, k % m, lohi + 2 * k);
    for (int64_t ci = 0; ci < w->cin; ci++) {
        const float * xr = w->x + ci * w->ldx;
        const float * pr = w->prev ? w->prev + ci * w->ldp : NULL;
#if WV == 16
        if (m == 4 && kept) {
            /* The 4 d phase rows E_r[q] = xpad[c + r + 4 d q] (r = i d + j: phase i of residue j)
             * at once, E_r at gbuf + r ng (4 d ng floats: the callers' gbuf holds n nb d >= that
             * for the by-residue pieces of 8 d rows and more). Where every row lies inside x
             * (q in [qa, qv)) 16 tiles' 4-float runs r0..r0 + 3 (64 consecutive samples at d = 1)
             * are split into their four rows by permutes, the rest one by one as below; the same
             * values. A conv's time, 64 to 384 channels: 0.91-0.96x at d = 1 with the transpose
             * in wino_at_n; at d = 3 and 9 0.94-0.96x at 64 to 128 channels, 0.98-1.00x above. */
            const int64_t c = d * (m * b0 - (w->kk - 1)), rows = 4 * d;
            int64_t qa = 0, qb = ng;
            for (int64_t k = 0; k < rows; k++) {
                qa = lohi[2 * k] > qa ? lohi[2 * k] : qa;
                qb = lohi[2 * k + 1] < qb ? lohi[2 * k + 1] : qb;
            }
            if (qb < qa) qb = qa;
            const int64_t qv = qa + (qb - qa) / 16 * 16;
            for (int64_t r = 0; r < rows; r++) {
                float * restrict e = gbuf + r * ng;
                const int64_t * lh = lohi + 2 * ((r % d) * m + r / d);
                for (int64_t q = 0; q < ng; q++) {  /* outside [qa, qv): the context, x, or zeros */
                    if (q == qa) q = qv;
                    if (q >= ng) break;
                    e[q] = q < lh[0] ? (pr ? pr[(w->kk - 1) * d + c + r + rows * q] : 0.0f)
                                     : q < lh[1] ? xr[c + r + rows * q] : 0.0f;
                }
            }
            const __m512i idx0 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
            for (int64_t q = qa; q < qv; q += 16) {
                const float * src = xr + c + rows * q;
                for (int64_t r0 = 0; r0 < rows; r0 += 4) {
                    __m512 x[4];
                    if (d == 1)
                        for (int k = 0; k < 4; k++) x[k] = _mm512_loadu_ps(src + 16 * k);
                    else
                        for (int k = 0; k < 4; k++) {  /* tiles 4 k .. 4 k + 3: their runs r0..r0 + 3 */
                            const float * t = src + r0 + rows * 4 * k;
                            x[k] = _mm512_insertf32x4(_mm512_castps128_ps512(_mm_loadu_ps(t)), _mm_loadu_ps(t + rows), 1);
                            x[k] = _mm512_insertf32x4(x[k], _mm_loadu_ps(t + 2 * rows), 2);
                            x[k] = _mm512_insertf32x4(x[k], _mm_loadu_ps(t + 3 * rows), 3);
                        }
                    for (int i = 0; i < 4; i++) {
                        const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(i), idx0);
                        const __m512 lo = _mm512_permutex2var_ps(x[0], idx, x[1]), hi = _mm512_permutex2var_ps(x[2], idx, x[3]);
                        _mm512_storeu_ps(gbuf + (r0 + i) * ng + q, _mm512_shuffle_f32x4(lo, hi, 0x44));
                    }
                }
            }
            for (int64_t j = 0; j < d; j++)  /* residue j's phases: rows j, d + j, 2 d + j, 3 d + j */
                wino_bt(w->bt, n, m, gbuf + j * ng, d * ng, nb, v + ci * ldv + j * nb, plane);
            continue;
        }
#endif
        for (int64_t j = 0; j < d; j++) {
            for (int64_t i = 0; i < m; i++) {
                float * restrict e = gbuf + i * ng;
                const int64_t c = j + d * (m * b0 - (w->kk - 1)) + i * d;  /* the sample of e_i[0] */
                int64_t own[2];
                const int64_t * lh = kept ? lohi + 2 * (j * m + i) : own;
                if (!kept) wino_inside(w, b0, ng, j, i, own);
                int64_t q = 0;
                for (; q < lh[0]; q++) e[q] = pr ? pr[(w->kk - 1) * d + c + step * q] : 0.0f;  /* the context */
                for (; q < lh[1]; q++) e[q] = xr[c + step * q];
                for (; q < ng; q++) e[q] = 0.0f;
            }
            wino_bt(w->bt, n, m, gbuf, ng, nb, v + ci * ldv + j * nb, plane);
        }
    }
}

/* Pieces of fewer than PG_WINO_SHORT d tile rows take the transforms by channel (wino_input_span,
 * wino_output_span), longer ones by residue. The by-residue ones vectorize over a residue's tile
 * rows, 8 at a time, in d passes per channel: they ran a streamed chunk's few rows (1 to 3 in
 * decoder block 1 at one frame) one scalar tile at a time, and short pieces at large d in d short
 * passes. With the bound scaled by d (the same values either way), paired against a bound of 8 rows
 * at 2 threads: 8 streams of 256 samples at 384 channels 0.87x the time at d = 9 and 0.94x at d = 3;
 * one-shot blocks at d = 9 0.95x (192 channels) and 0.97x (384); the other shapes within 1.5 %. */
enum { PG_WINO_SHORT = 8 };
static inline int wino_short(int64_t cnt, int64_t d) { return cnt < PG_WINO_SHORT * d; }

/* Segment s of a batched step (p[11] = S streams packed in turn along time, each of len
 * samples, with its own carried context: prev ne [(K - 1) d, S, Cin]). */
static struct wino wino_segment(const struct wino * all, int64_t s) {
    struct wino w = *all;
    w.x = all->x + s * all->len;
    w.y = all->y + s * all->len;
    if (all->prev) w.prev = all->prev + s * ((all->kk - 1) * all->d);
    return w;
}

/* The part of tile rows [r, b1) (counted over the segments in turn) that lies in one segment:
 * that segment (*s), its first row there (*lr); returns its row count. */
static int64_t wino_piece(int64_t r, int64_t b1, int64_t nrows, int64_t * s, int64_t * lr) {
    *s = r / nrows;
    *lr = r - *s * nrows;
    return ((*s + 1) * nrows < b1 ? (*s + 1) * nrows : b1) - r;
}

/* The input transform of tile rows [r0, r1) (counted over the segments in turn, each piece
 * short) for every input channel, as wino_input's: the n inputs of each tile (column col + j cnt + q
 * of a piece of cnt rows at column col: residue j, row q) gathered into rows
 * tin[r][col] = xpad(j + d (m (lr + q) - (K - 1) + r)) of its segment, then one transform over
 * every piece's columns at once, 8 at a time (the same sums as wino_input's for each tile). */
static void wino_input_span(const struct wino * w, int64_t r0, int64_t r1, int64_t nrows, float * restrict tin,
                            float * restrict v, int64_t ldv, int64_t plane) {
    const int64_t m = w->m, n = w->n, d = w->d, cols = d * (r1 - r0);
    for (int64_t ci = 0; ci < w->cin; ci++) {
        int64_t s, lr, cnt, col = 0;
        for (int64_t r0p = r0; r0p < r1; r0p += cnt, col += cnt * d) {
            cnt = wino_piece(r0p, r1, nrows, &s, &lr);
            const struct wino ws = wino_segment(w, s);
            const float * xr = ws.x + ci * ws.ldx;
            const float * pr = ws.prev ? ws.prev + ci * ws.ldp : NULL;
            const int64_t c0 = d * (m * lr - (w->kk - 1));  /* sample of input 0 of the piece's tile (0, 0) */
            for (int64_t r = 0; r < n; r++)
                for (int64_t q = 0; q < cnt; q++) {
                    const int64_t base = c0 + d * (m * q + r);  /* residue j's input: base + j */
                    float * restrict t = tin + r * cols + col + q;
                    if (base >= 0 && base + d <= w->len) {
                        for (int64_t j = 0; j < d; j++) t[j * cnt] = xr[base + j];
                    } else {
                        for (int64_t j = 0; j < d; j++) {
                            const int64_t c = base + j;
                            t[j * cnt] = c < 0 ? (pr ? pr[(w->kk - 1) * d + c] : 0.0f) : (c < w->len ? xr[c] : 0.0f);
                        }
                    }
                }
        }
        wino_bt(w->bt, n, n, tin, cols, cols, v + ci * ldv, plane);
    }
}

/* Whether the products over nt tiles are row products (pg_rowdot): a few tiles (a streamed
 * chunk), where the BLAS would pack every U_q to read it once, or any count where p[10] says so. */
static int wino_by_rows(const int64_t * p, int64_t nt) { return nt <= p[10] && pg_rowdot_lanes(); }

/* vt[q nt ldt + t ldt + ci] = v[q plane + ci ldv + t] for the w->cin channels and nt tiles
 * (8 x 8 blocks in registers, pg_transpose8) */
static void wino_transpose(const struct wino * w, int64_t nt, const float * v, int64_t ldv, int64_t plane,
                           float * vt, int64_t ldt) {
    const int64_t cin = w->cin;
    for (int64_t q = 0; q < w->n; q++) {
        const float * vq = v + q * plane;
        float * tq = vt + q * nt * ldt;
        int64_t c0 = 0, t0 = 0;
#if defined(__AVX2__)
        for (; c0 + 8 <= cin; c0 += 8)  /* whole 8 x 8 blocks in registers */
            for (t0 = 0; t0 + 8 <= nt; t0 += 8) pg_transpose8(vq + c0 * ldv + t0, ldv, tq + t0 * ldt + c0, ldt);
#endif
        for (int64_t c = 0; c < cin; c++)  /* the rest: channels past c0, tiles past t0 of the others */
            for (int64_t t = c < c0 ? t0 : 0; t < nt; t++) tq[t * ldt + c] = vq[c * ldv + t];
    }
}

/* The row products' operand: the nt tiles' inputs of every plane transposed, vt[q][t][ci], in a
 * scratch slot (*slot). */
static float * wino_transposed(const struct wino * w, int64_t nt, const float * v, int64_t ldv, int64_t plane,
                               int * slot) {
    float * vt = pg_scratch_take((size_t)(w->n * nt * w->cin), slot);
    if (vt) wino_transpose(w, nt, v, ldv, plane, vt, w->cin);
    return vt;
}

/* The n products m_q = U_q . v_q for output rows [o0, o1) over nt columns of v; by rows
 * (wino_by_rows) from vt, the transposed inputs (wino_transposed), which read each weight once,
 * or with vt NULL from v as it lies, by pg_rowdot_kx's register tiles (the same sums). */
static void wino_products(const int64_t * p, const struct wino * w, int64_t nt, const float * v, int64_t ldv,
                          int64_t plane, const float * vt, float * restrict mbuf, int64_t mplane, int64_t o0,
                          int64_t o1) {
    const int64_t n = w->n, rows = o1 - o0;
    if (!vt && wino_by_rows(p, nt)) {  /* by rows from v as it lies (pg_rowdot_kx_fits) */
        for (int64_t q = 0; q < n; q++)
            if (!pg_rowdot_kx(rows, nt, w->cin, w->u + (q * w->cout + o0) * w->cin, w->cin, v + q * plane, ldv,
                              mbuf + q * mplane, ldv)) return;  /* out of memory: counted, the compute raises */
        return;
    }
    if (vt) {
        const int64_t panel = nt < (1 << 18) / w->cin ? nt : (1 << 18) / w->cin;  /* B rows of a panel: 1 MB */
        for (int64_t q = 0; q < n; q++)
            pg_rowdot(rows, nt, w->cin, w->u + (q * w->cout + o0) * w->cin, w->cin, 0, vt + q * nt * w->cin,
                      w->cin, 0.0f, mbuf + q * mplane, ldv, 1, panel);
        return;
    }
    for (int64_t q = 0; q < n; q++)
        pg_sgemm(p, 0, rows, nt, w->cin, w->u + (q * w->cout + o0) * w->cin, w->cin, v + q * plane, ldv, 0.0f,
                 mbuf + q * mplane, ldv);
}

/* The output transform of tile rows [b0, b0 + nb) from their products (mbuf, columns j nb + q),
 * straight into y (outputs before len), for output rows [o0, o1). */
static void wino_output(const struct wino * w, int64_t b0, int64_t nb, const float * mbuf, int64_t ldv,
                        int64_t mplane, int64_t o0, int64_t o1) {
    const int64_t m = w->m, n = w->n, d = w->d;
    int64_t full = 0;  /* tiles [0, full) have all their outputs before len, in whole groups of 16 */
#if WV == 16
    if (m == 4 && d <= 4) {  /* at d = 9 no faster (0.99-1.02x) */
        const int64_t last = d * (m * b0 + m) - 1;  /* the last output of tile 0 */
        full = last < w->len ? (w->len - 1 - last) / (m * d) + 1 : 0;
        full = (full < nb ? full : nb) / 16 * 16;
    }
#endif
    /* row by row, its d residues in turn: the d passes of strided stores then fill the same
     * lines of y while they are in L1 (residue by residue, every row's, they came back from L2
     * or L3 d times: a 64-channel conv at d = 9 took 1.19x the time, 1.05x at d = 3) */
    for (int64_t r = 0; r < o1 - o0; r++) {
        const float * mr = mbuf + r * ldv;
        float * yr = w->y + (o0 + r) * w->ldy;
#if WV == 16
        for (int64_t q = 0; q < full; q += 16) {
            /* 16 tiles of every residue: their 4 d outputs each side by side (r = i d + j), by
             * transposes of 4 x 16: at d = 1 64 consecutive samples in 4 stores, else 4-float runs
             * 4 d apart; wino_at_sum's sums. A conv's time with the strided stores: 0.91-0.96x at
             * d = 1 (with the input permutes, 64 to 384 channels), 0.96-0.99x at d = 3 (64 to 192). */
            __m512 t[16];
            for (int64_t j = 0; j < d; j++) {
                __m512 mv[PG_WINO_MAX_N];
                for (int64_t p = 0; p < n; p++) mv[p] = _mm512_loadu_ps(mr + j * nb + p * mplane + q);
                for (int64_t i = 0; i < 4; i++) t[i * d + j] = wino_at_sum(w->at, n, i, mv);
            }
            if (d == 1) wino_store4x16(yr + m * (b0 + q), t);
            else
                for (int64_t r0 = 0; r0 < 4 * d; r0 += 4)
                    wino_scatter4x16(yr + d * m * (b0 + q) + r0, 4 * d, t + r0);
        }
#endif
        for (int64_t j = 0; j < d; j++) {  /* the rest (every tile where full is 0) */
            int64_t t0[PG_WINO_MAX_N], nq[PG_WINO_MAX_N];
            for (int64_t i = 0; i < m; i++) {
                t0[i] = j + d * (m * (b0 + full) + i);  /* output of tile full + q: t0 + m d q */
                const int64_t cnt = t0[i] < w->len ? (w->len - t0[i] + m * d - 1) / (m * d) : 0;
                nq[i] = cnt < nb - full ? cnt : nb - full;
            }
            wino_at(w->at, n, m, mr + j * nb + full, mplane, nb - full, nq, yr, t0, m * d);
        }
    }
}

/* The output transform of tile rows [r0, r1) (counted over the segments in turn, each piece short),
 * as wino_output's: for each output row, every column at once, 8 at a time (the same sums as
 * wino_at's), into tout[i][col], then each output before len to its sample j + d (m (lr + q) + i)
 * of its segment (wino_input_span's columns). */
static void wino_output_span(const struct wino * w, int64_t r0, int64_t r1, int64_t nrows, const float * mbuf,
                             int64_t ldv, int64_t mplane, int64_t o0, int64_t o1, float * restrict tout) {
    const int64_t m = w->m, n = w->n, d = w->d, cols = d * (r1 - r0);
    int64_t t0[PG_WINO_MAX_N], nq[PG_WINO_MAX_N];
    for (int64_t i = 0; i < m; i++) {  /* wino_at's outputs i of columns [0, cols): cols of them, stored in turn */
        t0[i] = i * cols;
        nq[i] = cols;
    }
    for (int64_t r = 0; r < o1 - o0; r++) {
        wino_at(w->at, n, m, mbuf + r * ldv, mplane, cols, nq, tout, t0, 1);
        int64_t s, lr, cnt, col = 0;
        for (int64_t r0p = r0; r0p < r1; r0p += cnt, col += cnt * d) {
            cnt = wino_piece(r0p, r1, nrows, &s, &lr);
            float * yr = wino_segment(w, s).y + (o0 + r) * w->ldy;
            for (int64_t i = 0; i < m; i++)
                for (int64_t q = 0; q < cnt; q++) {
                    const int64_t t = d * (m * (lr + q) + i);
                    const float * o = tout + i * cols + col + q;
                    const int64_t nj = w->len - t < d ? w->len - t : d;
                    for (int64_t j = 0; j < nj; j++) yr[t + j] = o[j * cnt];
                }
        }
    }
}

/* The transforms of tile rows [r0, r1), counted over the segments in turn: a piece of PG_WINO_SHORT d
 * rows or more in one segment by residue (wino_input, wino_output), each run of shorter pieces at
 * once by channel (the spans); the columns of the pieces in turn from v (mbuf) on. wino_run: from
 * row r, the end of that piece or run; *cnt, *s, *lr: its first piece's rows, segment, first row. */
static int64_t wino_run(int64_t r, int64_t r1, int64_t nrows, int64_t d, int64_t * cnt, int64_t * s, int64_t * lr) {
    *cnt = wino_piece(r, r1, nrows, s, lr);
    int64_t end = r + *cnt, ns, nlr;
    while (wino_short(*cnt, d) && end < r1) {
        const int64_t c = wino_piece(end, r1, nrows, &ns, &nlr);
        if (!wino_short(c, d)) break;
        end += c;
    }
    return end;
}

static void wino_input_rows(const struct wino * w, int64_t r0, int64_t r1, int64_t nrows, float * gbuf, float * v,
                            int64_t ldv, int64_t plane) {
    int64_t cnt, s, lr, end;
    for (int64_t r = r0; r < r1; v += (end - r) * w->d, r = end) {
        end = wino_run(r, r1, nrows, w->d, &cnt, &s, &lr);
        if (!wino_short(cnt, w->d)) {
            const struct wino ws = wino_segment(w, s);
            wino_input(&ws, lr, cnt, gbuf, v, ldv, plane);
        } else wino_input_span(w, r, end, nrows, gbuf, v, ldv, plane);
    }
}

static void wino_output_rows(const struct wino * w, int64_t r0, int64_t r1, int64_t nrows, const float * mbuf,
                             int64_t ldv, int64_t mplane, int64_t o0, int64_t o1, float * tout) {
    int64_t cnt, s, lr, end;
    for (int64_t r = r0; r < r1; mbuf += (end - r) * w->d, r = end) {
        end = wino_run(r, r1, nrows, w->d, &cnt, &s, &lr);
        if (!wino_short(cnt, w->d)) {
            const struct wino ws = wino_segment(w, s);
            wino_output(&ws, lr, cnt, mbuf, ldv, mplane, o0, o1);
        } else wino_output_span(w, r, end, nrows, mbuf, ldv, mplane, o0, o1, tout);
    }
}

/* The tile layout of a conv over len samples per segment: its tile rows per segment, and for the
 * split-channels product over every tile (nt of them) the row stride and plane of v. Row strides
 * off multiples of 1 KiB and planes staggered by 128 B: the transform streams and the GEMM panels
 * would otherwise fall on the same cache sets (measured: a 64-channel conv at d = 1 took 1.9x the
 * per-tap time, 1.0x with the padding). */
static int64_t wino_ld(int64_t nt) {
    const int64_t ld = (nt + 15) / 16 * 16;
    return ld % 256 == 0 ? ld + 16 : ld;
}

static struct wino wino_params(const int64_t * p, const struct pg_tensor * x, const struct pg_tensor * pv,
                               int64_t len, int64_t cin) {
    const int64_t segments = p[11] > 1 ? p[11] : 1;
    const float * tables = (const float *)(uintptr_t)p[9];
    struct wino w = {
        .m = p[7], .n = p[8], .kk = p[8] - p[7] + 1, .d = p[3], .len = len, .cin = cin,
        .bt = tables, .at = tables + p[8] * p[8], .x = x ? x->data : NULL, .prev = pv ? pv->data : NULL,
        .ldx = x ? (int64_t)(x->nb[1] / sizeof(float)) : 0,
        .ldp = pv ? (int64_t)(pv->nb[segments > 1 ? 2 : 1] / sizeof(float)) : 0,
    };
    return w;
}

/* The input transform of a split-channels conv as an op of its own (before pg_conv_wino with p[12]
 * set): every segment's tiles of the thread's share of the input channels, so that no thread
 * transforms the whole input. userdata: pg_conv_wino's. src0 x, src1 (optional) prev as there; dst:
 * F32, the n planes of v (plane = cin ldv + 32 floats) or, for row products, vt[q][t][ci]. */
void pg_conv_wino_input(void * dst_, int ith, int nth, void * userdata) {
    const int64_t * p = userdata;
    struct pg_tensor * dst = dst_;
    const struct pg_tensor * x = dst->src[0], * pv = dst->src[1];
    const int64_t segments = p[11] > 1 ? p[11] : 1;
    struct wino w = wino_params(p, x, pv, x->ne[0] / segments, x->ne[1]);
    if (w.n > PG_WINO_MAX_N || w.m < 1 || w.kk < 1) return;
    const int64_t nrows = (w.len + w.m * w.d - 1) / (w.m * w.d), nt = nrows * w.d * segments, ldv = wino_ld(nt);
    int64_t c0, c1;
    pg_share(w.cin, ith, nth, &c0, &c1);
    if (c0 >= c1) return;
    const int64_t cin = w.cin, by_rows = wino_by_rows(p, nt), ng = nrows + (w.n - 1) / w.m;
    w.x += c0 * w.ldx;
    if (w.prev) w.prev += c0 * w.ldp;
    w.cin = c1 - c0;
    const int64_t gfloats = w.m * ng > w.n * nt ? w.m * ng : w.n * nt, part = w.cin * ldv + 32;
    int slot;
    float * buf = pg_scratch_take((size_t)(gfloats + (by_rows ? w.n * part : 0)), &slot);
    if (!buf) return;  /* out of memory: the output is left unset */
    float * out = dst->data;
    if (by_rows) {  /* this share's planes, then its channels of vt */
        wino_input_rows(&w, 0, nrows * segments, nrows, buf, buf + gfloats, ldv, part);
        wino_transpose(&w, nt, buf + gfloats, ldv, part, out + c0, cin);
    } else wino_input_rows(&w, 0, nrows * segments, nrows, buf, out + c0 * ldv, ldv, cin * ldv + 32);
    pg_scratch_give(buf, slot);
}

/* With p[12] set, src1 is pg_conv_wino_input's output (no samples: the length is dst's). */
void pg_conv_wino(void * dst_, int ith, int nth, void * userdata) {
    const int64_t * p = userdata;
    struct pg_tensor * dst = dst_;
    const struct pg_tensor * u = dst->src[0], * x = dst->src[1], * pv = dst->src[2];
    const int64_t segments = p[11] > 1 ? p[11] : 1, given = p[12];
    struct wino w = wino_params(p, given ? NULL : x, given ? NULL : pv, dst->ne[0] / segments, u->ne[0]);
    w.cout = u->ne[1];
    w.u = u->data;
    w.y = dst->data;
    w.ldy = dst->ne[0];
    const int64_t block_rows = p[4], split_below = p[5], min_chans = p[6];
    if (w.n > PG_WINO_MAX_N || w.m < 1 || w.kk < 1) return;
    const int64_t nrows = (w.len + w.m * w.d - 1) / (w.m * w.d);  /* tile rows of a segment: m d outputs each */
    const int by_time = w.len * segments >= split_below;
    if (given && by_time) return;  /* Python never builds this: the output is left unset */
    int64_t i0, i1, block;
    if (by_time) {  /* whole blocks of block_rows tile rows, counted over the segments in turn */
        const int64_t nb = (nrows * segments + block_rows - 1) / block_rows;
        const int64_t b0 = nb * ith / nth, b1 = nb * (ith + 1) / nth;
        block = block_rows;
        i0 = b0 * block < nrows * segments ? b0 * block : nrows * segments;
        i1 = b1 * block < nrows * segments ? b1 * block : nrows * segments;
    } else pg_blocks(w.cout, min_chans, w.cout, ith, nth, &i0, &i1, &block);
    if (i0 >= i1) return;
    const int64_t nb = by_time ? (block < i1 - i0 ? block : i1 - i0) : nrows;
    /* split channels: every segment's tiles side by side, one product over all of them */
    const int64_t nt = nb * w.d * (by_time ? 1 : segments), rows = by_time ? w.cout : (block < i1 - i0 ? block : i1 - i0);
    const int64_t ldv = wino_ld(nt), ng = nb + (w.n - 1) / w.m;
    const int64_t plane = w.cin * ldv + 32, mplane = rows * ldv + 32;
    /* gbuf: wino_input's gathered inputs or wino_input_span's tile rows; tout: wino_output_span's */
    const int64_t gfloats = w.m * ng > w.n * nt ? w.m * ng : w.n * nt, tfloats = w.m * nt;
    const size_t floats = (size_t)(gfloats + tfloats + (given ? 0 : w.n * plane) + w.n * mplane);
    int slot;
    float * buf = pg_scratch_take(floats, &slot);
    if (!buf) return;  /* out of memory: the output is left unset */
    float * gbuf = buf, * tout = gbuf + gfloats, * v = given ? x->data : tout + tfloats;
    float * mbuf = tout + tfloats + (given ? 0 : w.n * plane);
    const int prev_threads = pg_blas_enter(p);
    if (by_time) {  /* blocks of the segments' tile rows in turn, a block's pieces side by side in one product */
        for (int64_t b0 = i0; b0 < i1; b0 += block) {
            const int64_t b1 = b0 + block < i1 ? b0 + block : i1;
            wino_input_rows(&w, b0, b1, nrows, gbuf, v, ldv, plane);
            const int64_t col = (b1 - b0) * w.d;
            int tslot = -1;
            const int transposed = wino_by_rows(p, col) && !pg_rowdot_kx_fits(w.cout, col, w.cin);
            float * vt = transposed ? wino_transposed(&w, col, v, ldv, plane, &tslot) : NULL;
            if (transposed && !vt) break;  /* out of memory: the output is left unset */
            wino_products(p, &w, col, v, ldv, plane, vt, mbuf, mplane, 0, w.cout);
            if (vt) pg_scratch_give(vt, tslot);
            wino_output_rows(&w, b0, b1, nrows, mbuf, ldv, mplane, 0, w.cout, tout);
        }
    } else {
        int tslot = -1;
        const int by_rows = wino_by_rows(p, nt);
        float * vt = NULL;
        if (given) vt = by_rows ? v : NULL;  /* pg_conv_wino_input's output: v or, by rows, vt */
        else {
            wino_input_rows(&w, 0, nrows * segments, nrows, gbuf, v, ldv, plane);
            vt = by_rows ? wino_transposed(&w, nt, v, ldv, plane, &tslot) : NULL;
        }
        for (int64_t a = i0; a < i1 && (vt || !by_rows); a += block) {
            const int64_t b = a + block < i1 ? a + block : i1;
            wino_products(p, &w, nt, v, ldv, plane, vt, mbuf, mplane, a, b);
            wino_output_rows(&w, 0, nrows * segments, nrows, mbuf, ldv, mplane, a, b, tout);
        }
        if (vt && !given) pg_scratch_give(vt, tslot);
    }
    pg_blas_leave(p, prev_threads);
    pg_scratch_give(buf, slot);
}

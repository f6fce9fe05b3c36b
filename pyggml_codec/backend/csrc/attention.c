/* Streamed attention read in place from a key/value arena (the "arena" lowering,
 * arena_attention.window_attention): for each stream b, head h and query i, the scores against the keys of the
 * stream's window (rows first[b], first[b] + 1, ... of the arena), the mask added, a softmax and
 * the values' weighted sum, in one op: no window is gathered, permuted or transposed.
 *
 * Every output is computed over its visible keys alone (a mask value at or below PG_ATT_MASKED
 * hides a key), in time order, by the same arithmetic whatever the window's place in the arena,
 * the number of queries per chunk, the streams beside it and the thread count: a query's output
 * is the same bits in a chunk of one frame and in one of 32. The exponentials are glibc's scalar
 * expf (never a vector variant, whose results would depend on a key's lane), the sums run in key
 * order, a score is one dot product of fixed order.
 *
 * src0 q: F32 ne [hd, H, n B], rows along hd contiguous; src1 keys, src2 values: F32 ne
 * [hd Hkv, R], contiguous rows (the arena leaves, written this chunk by ggml_set_rows); src3
 * first: I32 ne [B]; src4 mask: contiguous F32 ne [T, n, 1, B] (T keys per stream); dst:
 * contiguous F32 ne [hd H, n B]. userdata: float [1] = the scale of the scores. Head h reads key
 * head h / (H / Hkv). Threads take (stream, query, head) triples in contiguous shares. */
#include "pg_kernels.h"

#define PG_ATT_MASKED (-1e9f)

static __attribute__((noinline)) float att_exp(float x) { return expf(x); }

/* sum_d a[d] b[d]: 8 lanes (lane l: d = l, l + 8, ...), then the lanes by a fixed tree, then the tail */
static inline float att_dot(const float * restrict a, const float * restrict b, int64_t n) {
    int64_t d = 0;
    float s = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
    if (n >= 8) {
        __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(b));
        for (d = 8; d + 8 <= n; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
        s = pg_hsum8(acc);
    }
#endif
    for (; d < n; d++) s = fmaf(a[d], b[d], s);
    return s;
}

/* acc[d] += p v[d] for d < n, each lane by one fused multiply-add */
static inline void att_axpy(float * restrict acc, float p, const float * restrict v, int64_t n) {
    int64_t d = 0;
#if defined(__AVX2__) && defined(__FMA__)
    const __m256 pv = _mm256_set1_ps(p);
    for (; d + 8 <= n; d += 8)
        _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + d), _mm256_loadu_ps(acc + d)));
#endif
    for (; d < n; d++) acc[d] = fmaf(p, v[d], acc[d]);
}

void pg_window_attention(void * dst_, int ith, int nth, void * userdata) {
    struct pg_tensor * dst = dst_;
    const struct pg_tensor * q = dst->src[0], * kr = dst->src[1], * vr = dst->src[2], * fr = dst->src[3],
                           * mk = dst->src[4];
    const float scale = *(const float *)userdata;
    const int64_t hd = q->ne[0], nh = q->ne[1], t = mk->ne[0], n = mk->ne[1], nb = mk->ne[3];
    const int64_t group = nh / (kr->ne[0] / hd);  /* query heads per key head */
    const int32_t * first = fr->data;
    const float * mask = mk->data;
    int64_t i0, i1;
    pg_share(nb * n * nh, ith, nth, &i0, &i1);
    if (i0 >= i1) return;
    int slot;
    float * w = pg_scratch_take((size_t)(t + hd), &slot);  /* per key: score, then weight; the output row */
    if (!w) return;  /* out of memory: the output is left unset */
    float * acc = w + t;
    for (int64_t item = i0; item < i1; item++) {
        const int64_t h = item % nh, i = item / nh % n, b = item / nh / n;
        const float * qv = (const float *)((const char *)q->data + (b * n + i) * q->nb[2] + h * q->nb[1]);
        const float * mr = mask + (b * n + i) * t;
        const int64_t col = h / group * hd;
        const char * keys = (const char *)kr->data + (int64_t)first[b] * kr->nb[1];
        const char * values = (const char *)vr->data + (int64_t)first[b] * vr->nb[1];
        float mx = -INFINITY;
        for (int64_t k = 0; k < t; k++) {
            if (mr[k] <= PG_ATT_MASKED) continue;
            w[k] = att_dot(qv, (const float *)(keys + k * kr->nb[1]) + col, hd) * scale + mr[k];
            mx = w[k] > mx ? w[k] : mx;
        }
        float sum = 0.0f;
        for (int64_t k = 0; k < t; k++) {
            if (mr[k] <= PG_ATT_MASKED) continue;
            w[k] = att_exp(w[k] - mx);
            sum += w[k];
        }
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        for (int64_t d = 0; d < hd; d++) acc[d] = 0.0f;
        for (int64_t k = 0; k < t; k++) {
            if (mr[k] <= PG_ATT_MASKED) continue;
            att_axpy(acc, w[k] * inv, (const float *)(values + k * vr->nb[1]) + col, hd);
        }
        float * out = (float *)((char *)dst->data + (b * n + i) * dst->nb[1]) + h * hd;
        memcpy(out, acc, (size_t)hd * sizeof(float));
    }
    pg_scratch_give(w, slot);
}

/* Causal sliding-window attention of a whole sequence in one op (the "fused" attention lowering,
 * arena_attention.causal_attention): query i sees keys max(0, i - W + 1) .. i (W = 0: every key
 * up to i). The scores of each block of queries against its span of keys (its queries' visible
 * keys: at most W + CA_QB - 1), a softmax over each query's visible ones, and the values' weighted
 * sum, written straight into the rows the output projection reads: no T x T score matrix and no
 * mask. For the one-shot "f32" graphs; the streamed ones keep pg_window_attention.
 *
 * Work items are (head, block of CA_QB queries); an item reads the keys of its block's span,
 * transposed (kt, one row of T keys per head dimension), so that a vector holds consecutive keys'
 * scores. The keys a query does not see get weight 0 (their products add nothing).
 * Every output is its own visible keys' sum in time order by arithmetic fixed by the shape (the
 * default build's expf and sum vectorized by the compiler in a fixed pattern from the span's
 * start): the same bits whatever the thread count.
 *
 * src0 q: F32 ne [hd, H, T], rows along hd contiguous; src1 kt: contiguous F32 ne [T, hd, Hkv];
 * src2 v: F32 ne [hd, T, Hkv], rows along hd contiguous (a head's values read in time order: in
 * the projection's rows, 12 KB apart at full size, the weighted sums waited on memory); dst:
 * contiguous F32 ne [hd H, T].
 * userdata: float [2] = the scale of the scores, the window W. Head h reads key head
 * h / (H / Hkv). Threads take items in contiguous shares. */
enum { CA_QB = 16 };

/* The vectors of the two products: 16 floats with AVX-512, 8 with AVX2 (CA_VECTOR 0: plain loops).
 * ca_lanes(k): the first k lanes (all where k >= CA_V, none where k <= 0), for masked loads and stores. */
#if defined(__AVX512F__)
#define CA_V 16
#define CA_VECTOR 1
typedef __m512 ca_vec;
typedef __mmask16 ca_mask;
static inline ca_mask ca_lanes(int64_t k) { return (ca_mask)(k >= 16 ? 0xffff : k <= 0 ? 0 : (1u << k) - 1u); }
#define CA_LOAD(p) _mm512_loadu_ps(p)
#define CA_LOADM(p, m) _mm512_maskz_loadu_ps(m, p)
#define CA_STORE(p, v) _mm512_storeu_ps(p, v)
#define CA_STOREM(p, m, v) _mm512_mask_storeu_ps(p, m, v)
#define CA_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define CA_SET1(x) _mm512_set1_ps(x)
#define CA_ZERO() _mm512_setzero_ps()
#elif defined(__AVX2__) && defined(__FMA__)
#define CA_V 8
#define CA_VECTOR 1
typedef __m256 ca_vec;
typedef __m256i ca_mask;
static inline ca_mask ca_lanes(int64_t k) {
    const int n = k >= 8 ? 8 : k <= 0 ? 0 : (int)k;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#define CA_LOAD(p) _mm256_loadu_ps(p)
#define CA_LOADM(p, m) _mm256_maskload_ps(p, m)
#define CA_STORE(p, v) _mm256_storeu_ps(p, v)
#define CA_STOREM(p, m, v) _mm256_maskstore_ps(p, m, v)
#define CA_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define CA_SET1(x) _mm256_set1_ps(x)
#define CA_ZERO() _mm256_setzero_ps()
#else
#define CA_V 16
#define CA_VECTOR 0
#endif
enum { CA_KB = 4 * CA_V };  /* keys per block of the scores, floats per block of a value row */

/* s[r * lds + j] = q_r . kt[., j0 + j] for r < nq, j < nk (blocks of 4 queries by CA_KB keys in
 * registers; masked lanes past nk, so s holds whole blocks) */
static void ca_scores(const float * const * qr, int64_t nq, const float * kt, int64_t ldk, int64_t hd, int64_t j0,
                      int64_t nk, float * s, int64_t lds) {
    int64_t r = 0;
#if CA_VECTOR
    const int64_t nq4 = nq / 4 * 4;
    for (int64_t j = 0; j < nk; j += CA_KB) {  /* a block of keys (hd rows of CA_KB floats) stays in L1 for every query */
        ca_mask m[4];
        for (int c = 0; c < 4; c++) m[c] = ca_lanes(nk - j - CA_V * c);
        for (r = 0; r < nq4; r += 4) {
            ca_vec a[4][4];
            for (int i = 0; i < 4; i++)
                for (int c = 0; c < 4; c++) a[i][c] = CA_ZERO();
            const float * k = kt + j0 + j;
            for (int64_t d = 0; d < hd; d++, k += ldk) {
                ca_vec kv[4];
                for (int c = 0; c < 4; c++) kv[c] = CA_LOADM(k + CA_V * c, m[c]);
                for (int i = 0; i < 4; i++) {
                    const ca_vec qd = CA_SET1(qr[r + i][d]);
                    for (int c = 0; c < 4; c++) a[i][c] = CA_FMA(qd, kv[c], a[i][c]);
                }
            }
            for (int i = 0; i < 4; i++)
                for (int c = 0; c < 4; c++) CA_STOREM(s + (r + i) * lds + j + CA_V * c, m[c], a[i][c]);
        }
    }
    r = nq4;
#endif
    for (; r < nq; r++) {
        float * o = s + r * lds;
        for (int64_t j = 0; j < nk; j++) o[j] = 0.0f;
        for (int64_t d = 0; d < hd; d++) {
            const float qd = qr[r][d], * k = kt + d * ldk + j0;
            for (int64_t j = 0; j < nk; j++) o[j] += qd * k[j];
        }
    }
}

/* out_r = sum_j p[r * ldp + j] v_{j0 + j} for r < nq, over the rows j of v (stride ldv floats):
 * blocks of 4 queries by CA_KB floats of the rows in registers where hd is whole vectors */
static void ca_values(const float * p, int64_t ldp, int64_t nq, const float * v, int64_t ldv, int64_t hd, int64_t nk,
                      float * const * out) {
    int64_t r = 0;
#if CA_VECTOR
    if (hd % CA_V == 0)
        for (; r + 4 <= nq; r += 4)
            for (int64_t d0 = 0; d0 < hd; d0 += CA_KB) {
                const int nv = hd - d0 >= CA_KB ? 4 : (int)((hd - d0) / CA_V);
                ca_vec a[4][4];
                for (int i = 0; i < 4; i++)
                    for (int c = 0; c < 4; c++) a[i][c] = CA_ZERO();
                if (nv == 4)
                    for (int64_t j = 0; j < nk; j++) {
                        const float * vj = v + j * ldv + d0;
                        ca_vec vv[4];
                        for (int c = 0; c < 4; c++) vv[c] = CA_LOAD(vj + CA_V * c);
                        for (int i = 0; i < 4; i++) {
                            const ca_vec pj = CA_SET1(p[(r + i) * ldp + j]);
                            for (int c = 0; c < 4; c++) a[i][c] = CA_FMA(pj, vv[c], a[i][c]);
                        }
                    }
                else
                    for (int64_t j = 0; j < nk; j++) {
                        const float * vj = v + j * ldv + d0;
                        for (int c = 0; c < nv; c++) {
                            const ca_vec vc = CA_LOAD(vj + CA_V * c);
                            for (int i = 0; i < 4; i++) a[i][c] = CA_FMA(CA_SET1(p[(r + i) * ldp + j]), vc, a[i][c]);
                        }
                    }
                for (int i = 0; i < 4; i++)
                    for (int c = 0; c < nv; c++) CA_STORE(out[r + i] + d0 + CA_V * c, a[i][c]);
            }
#endif
    for (; r < nq; r++) {
        float * o = out[r];
        for (int64_t d = 0; d < hd; d++) o[d] = 0.0f;
        for (int64_t j = 0; j < nk; j++) {
            const float pj = p[r * ldp + j], * vj = v + j * ldv;
            for (int64_t d = 0; d < hd; d++) o[d] += pj * vj[d];
        }
    }
}

/* p[j] = exp(s[j] scale - max) / sum over j in [a, b), 0 elsewhere in [0, n) */
static void ca_softmax(float * s, int64_t n, int64_t a, int64_t b, float scale) {
    float mx = -INFINITY;
    for (int64_t j = a; j < b; j++) {
        s[j] *= scale;
        mx = s[j] > mx ? s[j] : mx;
    }
    float sum = 0.0f;
    for (int64_t j = a; j < b; j++) {
        s[j] = expf(s[j] - mx);
        sum += s[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < a; j++) s[j] = 0.0f;
    for (int64_t j = a; j < b; j++) s[j] *= inv;
    for (int64_t j = b; j < n; j++) s[j] = 0.0f;
}

void pg_causal_attention(void * dst_, int ith, int nth, void * userdata) {
    struct pg_tensor * dst = dst_;
    const struct pg_tensor * q = dst->src[0], * kt = dst->src[1], * v = dst->src[2];
    const float scale = ((const float *)userdata)[0];
    const int64_t window = (int64_t)((const float *)userdata)[1];
    const int64_t hd = q->ne[0], nh = q->ne[1], t = q->ne[2], nkv = kt->ne[2];
    const int64_t group = nh / nkv, nqb = (t + CA_QB - 1) / CA_QB;
    const int64_t span = window > 0 && window < t ? window - 1 + CA_QB : t;  /* most keys an item reads */
    int64_t i0, i1;
    pg_share(nh * nqb, ith, nth, &i0, &i1);
    if (i0 >= i1) return;
    const int64_t lds = (span + 15) / 16 * 16;  /* score rows 64 bytes apart: each starts on a cache line, as the scratch does */
    int slot;
    float * s = pg_scratch_take((size_t)(CA_QB * lds), &slot);
    if (!s) return;  /* out of memory: the output is left unset */
    const int64_t ldk = kt->nb[1] / sizeof(float), ldv = v->nb[1] / sizeof(float);
    for (int64_t item = i0; item < i1; item++) {
        const int64_t h = item / nqb, qa = item % nqb * CA_QB, qb = qa + CA_QB < t ? qa + CA_QB : t;
        const int64_t nq = qb - qa, hk = h / group;
        const int64_t j0 = window > 0 && qa - window + 1 > 0 ? qa - window + 1 : 0, nk = qb - j0;
        const float * qr[CA_QB];
        float * out[CA_QB];
        for (int64_t r = 0; r < nq; r++) {
            qr[r] = (const float *)((const char *)q->data + (qa + r) * q->nb[2] + h * q->nb[1]);
            out[r] = (float *)((char *)dst->data + (qa + r) * dst->nb[1]) + h * hd;
        }
        const float * kh = (const float *)((const char *)kt->data + hk * kt->nb[2]);
        ca_scores(qr, nq, kh, ldk, hd, j0, nk, s, lds);
        for (int64_t r = 0; r < nq; r++) {
            const int64_t i = qa + r, first = window > 0 && i - window + 1 > j0 ? i - window + 1 : j0;
            ca_softmax(s + r * lds, nk, first - j0, i + 1 - j0, scale);
        }
        const float * vh = (const float *)((const char *)v->data + j0 * v->nb[1] + hk * v->nb[2]);
        ca_values(s, lds, nq, vh, ldv, hd, nk, out);
    }
    pg_scratch_give(s, slot);
}

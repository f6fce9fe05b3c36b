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

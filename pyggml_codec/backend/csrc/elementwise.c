/* Elementwise and layout kernels: Snake, the fused bias passes, im2col into F16 columns,
 * the conv-transpose overlap-add. */
#include "pg_kernels.h"

int pg_tensor_layout(int64_t * offsets) {
    offsets[0] = offsetof(struct pg_tensor, type);
    offsets[1] = offsetof(struct pg_tensor, ne);
    offsets[2] = offsetof(struct pg_tensor, nb);
    offsets[3] = offsetof(struct pg_tensor, src);
    offsets[4] = offsetof(struct pg_tensor, data);
    return 5;
}

/* PG_EXACT (the second build, _kernels_exact: no -ffast-math, no FMA contraction) computes
 * every value with the float operations of ggml's op chain, in its order: x + (sin(a x)^2 / a),
 * with libm's scalar sinf, a true division, and x + (h + b); so the "s2cpp" precision gets
 * ggml's bits. The default build multiplies by 1/a and lets the compiler vectorize sinf
 * (libmvec) and reassociate the sums: faster, within float rounding of the same values. */
#ifdef PG_EXACT
#define PG_OVER(num, a, inv) ((num) / (a))
#else
#define PG_OVER(num, a, inv) ((num) * (inv))
#endif

#if defined(PG_EXACT) && defined(__AVX2__) && defined(__FMA__)
/* glibc's sinf (2.28 and later, the x86-64 FMA variant that its dispatch picks on FMA machines), 4
 * values at a time: the same double operations in the same order, so the same floats, for
 * |y| < 120; larger, infinite and NaN inputs go to libm's sinf. Its steps: t = top 12 bits of |y|
 * below the sign; t < 0x398 (|y| < 2^-12): y itself; t < 0x3f4 (|y| < pi/4): n = 0, r = y; else
 * n = (trunc(y * 2^24 2/pi) + 2^23) >> 24 and r = fma(-n, pi/2, y); then sin(r) for even n, cos(r)
 * for odd n (the polynomials below, in double), negated where n & 2 (glibc negates the sign or its
 * cos table there: the same float, as every step is odd in the negated inputs), rounded to float.
 * Not assumed: pg_sinf_exact_check compares it with the libm in this process before it is used. */
#define PG_SINF_LANES 4
static inline __m128i pg_sinf_top(__m128 yf) {  /* the top 12 bits of |y| below the sign */
    return _mm_and_si128(_mm_srli_epi32(_mm_castps_si128(yf), 20), _mm_set1_epi32(0x7ff));
}

static inline __m128 pg_sinf4(__m128 yf, __m128i top) {
    const __m256d x = _mm256_cvtps_pd(yf);
    __m128i n = _mm256_cvttpd_epi32(_mm256_mul_pd(x, _mm256_set1_pd(0x1.45f306dc9c883p+23)));
    n = _mm_srai_epi32(_mm_add_epi32(n, _mm_set1_epi32(0x800000)), 24);
    n = _mm_andnot_si128(_mm_cmplt_epi32(top, _mm_set1_epi32(0x3f4)), n);  /* |y| < pi/4: n = 0, so r = y */
    const __m256d r = _mm256_fnmadd_pd(_mm256_cvtepi32_pd(n), _mm256_set1_pd(0x1.921fb54442d18p+0), x);
    const __m256d r2 = _mm256_mul_pd(r, r);
    /* sin: r + r^3 s1 + r^5 (s2 + r^2 s3) */
    const __m256d r3 = _mm256_mul_pd(r2, r);
    const __m256d sa = _mm256_fmadd_pd(r2, _mm256_set1_pd(-0x1.994eb3774cf24p-13), _mm256_set1_pd(0x1.1107605230bc4p-7));
    const __m256d r5 = _mm256_mul_pd(r2, r3);
    const __m256d st = _mm256_fmadd_pd(r3, _mm256_set1_pd(-0x1.555545995a603p-3), r);
    const __m256d sn = _mm256_fmadd_pd(sa, r5, st);
    /* cos: (c0 + r^2 c1) + r^4 c2 + r^6 (c3 + r^2 c4) */
    const __m256d r4 = _mm256_mul_pd(r2, r2);
    const __m256d cb = _mm256_fmadd_pd(r2, _mm256_set1_pd(-0x1.ffffffd0c621cp-2), _mm256_set1_pd(1.0));
    const __m256d cc = _mm256_fmadd_pd(r2, _mm256_set1_pd(0x1.99343027bf8c3p-16), _mm256_set1_pd(-0x1.6c087e89a359dp-10));
    const __m256d r6 = _mm256_mul_pd(r2, r4);
    const __m256d cd = _mm256_fmadd_pd(r4, _mm256_set1_pd(0x1.55553e1068f19p-5), cb);
    const __m256d cs = _mm256_fmadd_pd(cc, r6, cd);
    const __m256i n64 = _mm256_cvtepi32_epi64(n);
    const __m256d odd = _mm256_castsi256_pd(_mm256_slli_epi64(n64, 63));  /* sign bit: n odd */
    const __m256d flip = _mm256_castsi256_pd(_mm256_slli_epi64(_mm256_srli_epi64(n64, 1), 63));  /* n & 2 */
    const __m256d v = _mm256_xor_pd(_mm256_blendv_pd(sn, cs, odd), flip);
    const __m128 out = _mm256_cvtpd_ps(v);
    return _mm_blendv_ps(out, yf, _mm_castsi128_ps(_mm_cmplt_epi32(top, _mm_set1_epi32(0x398))));
}

static void pg_sinf_vector(const float * x, float * y, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m128 v = _mm_loadu_ps(x + i);
        const __m128i top = pg_sinf_top(v);
        const int big = _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpgt_epi32(top, _mm_set1_epi32(0x42e))));
        const __m128 out = pg_sinf4(v, top);
        if (!big) {
            _mm_storeu_ps(y + i, out);
            continue;
        }
        float in[4], o[4];  /* libm for the lanes past the replica's range (v holds the inputs: y may be x) */
        _mm_storeu_ps(in, v);
        _mm_storeu_ps(o, out);
        for (int j = 0; j < 4; j++)
            if (big >> j & 1) o[j] = sinf(in[j]);
        memcpy(y + i, o, sizeof o);
    }
    for (; i < n; i++) y[i] = sinf(x[i]);
}
#else
#define PG_SINF_LANES 0
#endif

#ifdef PG_EXACT
static int pg_sinf_vector_on = 0;  /* set by pg_sinf_exact_use once pg_sinf_exact_check found no difference */

int pg_sinf_exact_lanes(void) { return PG_SINF_LANES; }

void pg_sinf_exact_use(int on) { pg_sinf_vector_on = on && PG_SINF_LANES; }

/* y[i] = libm's sinf(x[i]) (y may be x): by pg_sinf4 where enabled, else by libm */
void pg_sinf_exact(const float * x, float * y, int64_t n) {
#if PG_SINF_LANES
    if (pg_sinf_vector_on) {
        pg_sinf_vector(x, y, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) y[i] = sinf(x[i]);
}

/* Floats whose vector sinf differs from libm's sinf, over the bit patterns b0, b0 + step, ... below
 * b1 (at most 2^31), each with both signs (bitwise, NaN results compared as NaN); -1 where there is
 * no vector code or step is 0. */
int64_t pg_sinf_exact_check(uint32_t b0, uint32_t b1, uint32_t step) {
#if PG_SINF_LANES
    if (!step) return -1;
    enum { N = 1024 };
    float x[N], got[N];
    int64_t differ = 0;
    for (uint64_t b = b0; b < b1;) {
        int m = 0;
        for (; m + 2 <= N && b < b1; m += 2, b += step) {
            const uint32_t pos = (uint32_t) b, neg = pos | 0x80000000u;
            memcpy(x + m, &pos, 4);
            memcpy(x + m + 1, &neg, 4);
        }
        pg_sinf_vector(x, got, m);
        for (int i = 0; i < m; i++) {
            const float want = sinf(x[i]);
            differ += memcmp(&want, got + i, 4) != 0 && !(want != want && got[i] != got[i]);
        }
    }
    return differ;
#else
    (void) b0; (void) b1; (void) step;
    return -1;
#endif
}

/* y = t + sin(a t)^2 / a with t = x + b (x itself without b), in ggml's float operations, over n
 * values in chunks of 256 whose sines go through pg_sinf_exact: alpha and bias one value each
 * (a_step, b_step 0: a row's) or one per value (1: a channels-last row's). */
static inline __attribute__((always_inline)) void snake_exact(float * restrict y, const float * restrict x, const float * a, int64_t a_step,
                        const float * b, int64_t b_step, int64_t n) {
    float t[256], s[256];
    for (int64_t i0 = 0; i0 < n; i0 += 256) {
        const int64_t m = n - i0 < 256 ? n - i0 : 256;
        for (int64_t i = 0; i < m; i++) {
            t[i] = b ? x[i0 + i] + b[(i0 + i) * b_step] : x[i0 + i];
            s[i] = a[(i0 + i) * a_step] * t[i];
        }
        pg_sinf_exact(s, s, m);
        for (int64_t i = 0; i < m; i++) y[i0 + i] = t[i] + s[i] * s[i] / a[(i0 + i) * a_step];
    }
}
#endif

/* y = x + sin(a x)^2 / a over [n] values sharing one alpha */
static void snake_run(float * restrict y, const float * restrict x, int64_t n, float a) {
#ifdef PG_EXACT
    snake_exact(y, x, &a, 0, NULL, 0, n);
#else
    const float inv = 1.0f / a;
    for (int64_t i = 0; i < n; i++) {
        const float s = sinf(a * x[i]);
        y[i] = x[i] + PG_OVER(s * s, a, inv);
    }
#endif
}

/* alpha per element of a row (channels-last rows) */
static void snake_vec(float * restrict y, const float * restrict x, const float * restrict a, int64_t n) {
#ifdef PG_EXACT
    snake_exact(y, x, a, 1, NULL, 0, n);
#else
    for (int64_t i = 0; i < n; i++) {
        const float s = sinf(a[i] * x[i]);
        y[i] = x[i] + s * s / a[i];
    }
#endif
}

/* im2col of a 1-D conv, the same output as ggml_im2col (1-D): dst [IC*K, OW] with element
   (ic*K + k, t) = u[ic, t*s + k*d - p] (0 outside), where u is contiguous F32 x [L, IC] =
   dst->src[0], or, when dst->src[1] (contiguous F32 [P, IC]) is given, that carried left
   context followed by x: u = concat(src[1], x) along time, without building u.
   userdata: int64 {K, s, d, p}. Threads take blocks of output columns t; within a block the
   reads of one input channel stay in cache and the block of columns stays in L2. dst is
   F32 (type 0) or F16 (type 1, rounded to nearest even as ggml's F16C conversion does). */
#define PG_BLOCK 64

/* v to F16 by integer operations (builds without F16C: PYGGML_CODEC_PORTABLE=1, macOS, ARM):
 * the bits of F16C's _cvtss_sh(v, 0) for every float, so immune to -ffast-math. Round to
 * nearest even; past the largest half (65520 and up) infinity; below 2^-14 a subnormal half
 * (2^-25 and less round to zero); a NaN stays a NaN, quiet, with its top payload bits. */
static inline uint16_t pg_to_f16_soft(float v) {
    uint32_t x;
    memcpy(&x, &v, sizeof x);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00u | (uint16_t)((ax >> 13) & 0x1ffu);  /* NaN */
    if (ax >= 0x477ff000u) return sign | 0x7c00u;                                   /* infinity */
    if (ax >= 0x38800000u) {  /* a normal half: rebias the exponent (127 -> 15), round off 13 bits */
        const uint32_t r = ax - 0x38000000u;
        return sign | (uint16_t)((r + 0xfffu + ((r >> 13) & 1u)) >> 13);
    }
    const uint32_t shift = 126u - (ax >> 23);  /* a subnormal half: the value in units of 2^-24 */
    if (shift > 24u) return sign;
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u, q = m >> shift, rest = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    return sign | (uint16_t)(q + (rest > half || (rest == half && (q & 1u))));
}

/* pg_to_f16_soft over n values, exported so that every build tests it (test_lowerings.py) */
void pg_f16_soft(const float * x, uint16_t * out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = pg_to_f16_soft(x[i]);
}

static inline uint16_t pg_to_f16(float v) {
#if defined(__F16C__)
    return _cvtss_sh(v, 0);
#else
    return pg_to_f16_soft(v);
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

#if defined(__F16C__) && defined(__AVX2__)
/* Columns t..t+7 of a stride-1 im2col as F16: o[j row + k] = x[j + k d] for j < 8, k < K <= 8
   (slots k >= K of each column get don't-care values: the next channels' first slots, written after) */
static inline void pg_im2col_f16_8(const float * x, int64_t d, int64_t K, uint16_t * o, int64_t row) {
    __m128i h[8];
    for (int64_t k = 0; k < 8; k++)
        h[k] = k < K ? _mm256_cvtps_ph(_mm256_loadu_ps(x + k * d), _MM_FROUND_TO_NEAREST_INT) : _mm_setzero_si128();
    const __m128i a0 = _mm_unpacklo_epi16(h[0], h[1]), a1 = _mm_unpackhi_epi16(h[0], h[1]);
    const __m128i a2 = _mm_unpacklo_epi16(h[2], h[3]), a3 = _mm_unpackhi_epi16(h[2], h[3]);
    const __m128i a4 = _mm_unpacklo_epi16(h[4], h[5]), a5 = _mm_unpackhi_epi16(h[4], h[5]);
    const __m128i a6 = _mm_unpacklo_epi16(h[6], h[7]), a7 = _mm_unpackhi_epi16(h[6], h[7]);
    const __m128i b0 = _mm_unpacklo_epi32(a0, a2), b1 = _mm_unpackhi_epi32(a0, a2);
    const __m128i b2 = _mm_unpacklo_epi32(a1, a3), b3 = _mm_unpackhi_epi32(a1, a3);
    const __m128i b4 = _mm_unpacklo_epi32(a4, a6), b5 = _mm_unpackhi_epi32(a4, a6);
    const __m128i b6 = _mm_unpacklo_epi32(a5, a7), b7 = _mm_unpackhi_epi32(a5, a7);
    const __m128i r[8] = {_mm_unpacklo_epi64(b0, b4), _mm_unpackhi_epi64(b0, b4), _mm_unpacklo_epi64(b1, b5),
                          _mm_unpackhi_epi64(b1, b5), _mm_unpacklo_epi64(b2, b6), _mm_unpackhi_epi64(b2, b6),
                          _mm_unpacklo_epi64(b3, b7), _mm_unpackhi_epi64(b3, b7)};
    for (int j = 0; j < 8; j++) _mm_storeu_si128((__m128i *) (o + j * row), r[j]);
}
#endif

/* F32 columns [t0, t1) of an undilated im2col without carried context, a column at a time: each
   channel's K taps are K consecutive inputs, copied as whole vectors; where every column is whole
   vectors of 16-byte-aligned slots (K a multiple of 4), by streaming stores, so that columns far
   larger than the caches are written without first being read. Edge taps are zeros. */
static void pg_im2col_f32_d1(const float * xs, int64_t L, int64_t IC, int64_t K, int64_t s, int64_t p,
                             float * out, int64_t row, int64_t t0, int64_t t1) {
#if defined(__SSE2__)
    const int stream = K % 4 == 0 && ((uintptr_t) out) % 16 == 0;
#endif
    for (int64_t t = t0; t < t1; t++) {
        const int64_t base = t * s - p;
        float * o = out + t * row;
        if (base < 0 || base + K > L) {
            for (int64_t ic = 0; ic < IC; ic++)
                for (int64_t k = 0; k < K; k++) {
                    const int64_t j = base + k;
                    o[ic * K + k] = j < 0 || j >= L ? 0.0f : xs[ic * L + j];
                }
            continue;
        }
        const float * src = xs + base;
#if defined(__SSE2__)
        if (stream) {
            for (int64_t ic = 0; ic < IC; ic++, src += L, o += K)
                for (int64_t k = 0; k < K; k += 4) _mm_stream_ps(o + k, _mm_loadu_ps(src + k));
            continue;
        }
#endif
        for (int64_t ic = 0; ic < IC; ic++, src += L, o += K) {
            int64_t k = 0;
#if defined(__AVX__)
            for (; k + 8 <= K; k += 8) _mm256_storeu_ps(o + k, _mm256_loadu_ps(src + k));
#endif
#if defined(__SSE2__)
            for (; k + 4 <= K; k += 4) _mm_storeu_ps(o + k, _mm_loadu_ps(src + k));
#endif
            for (; k < K; k++) o[k] = src[k];
        }
    }
#if defined(__SSE2__)
    if (stream) _mm_sfence();
#endif
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
    if (!f16 && d == 1 && !prev) {  /* contiguous shares of whole columns */
        int64_t t0, t1;
        pg_share(OW, ith, nth, &t0, &t1);
        pg_im2col_f32_d1(xs, L, IC, K, s, p, dst->data, row, t0, t1);
        return;
    }
    for (int64_t b = ith; b < nblocks; b += nth) {
        const int64_t t0 = b * PG_BLOCK, t1 = t0 + PG_BLOCK < OW ? t0 + PG_BLOCK : OW;
        for (int64_t ic = 0; ic < IC; ic++) {
            const float * src = xs + ic * L - P;   /* src[j] = x[ic, j - P] for j >= P */
            const float * pre = ps ? ps + ic * P : 0;
            for (int64_t t = t0; t < t1; t++) {
                const int64_t base = t * s - p;
                const int interior = base >= P && base + (K - 1) * d < U;
#if defined(__F16C__) && defined(__AVX2__)
                /* stride 1, 8 columns at once: tap k of columns t..t+7 is 8 consecutive inputs, one
                   load and conversion; an 8 x 8 transpose gives each column its K taps (written 8
                   wide as below; the channels within 8 slots of a column's end go one by one) */
                if (f16 && s == 1 && K <= 8 && ic * K + 8 <= row && t + 8 <= t1 && base >= P
                    && base + 7 + (K - 1) * d < U) {
                    pg_im2col_f16_8(src + base, d, K, (uint16_t *) dst->data + t * row + ic * K, row);
                    t += 7;
                    continue;
                }
#endif
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

/* Thread ith's share [i0, i1) of a contiguous [n0, rows] tensor's elements for the passes whose
   values depend on where a call's loop starts: whole pieces of PG_PIECE values of a row (its last
   one shorter), counted over the rows in turn. In the default build the compiler vectorizes sinf
   (libmvec) with narrower and scalar variants for a loop's last values, whose results differ in the
   last bit, and it may reassociate sums differently in a vector loop and its scalar tail. An even
   split of the elements began a thread's loop anywhere in a row (3 threads over 64 rows: a third
   of the way into row 21), so the f32 results depended on the thread count. Pieces start at
   multiples of PG_PIECE (a multiple of the widest vector and of pg_bias_snake's chunk), so every
   value is computed as in its row's own loop, whatever the thread count. */
#define PG_PIECE 4096
static inline void pg_share_pieces(int64_t n0, int64_t rows, int ith, int nth, int64_t * i0, int64_t * i1) {
    const int64_t per_row = (n0 + PG_PIECE - 1) / PG_PIECE, units = per_row * rows;
    int64_t u[2];
    pg_share(units, ith, nth, &u[0], &u[1]);
    for (int e = 0; e < 2 && per_row; e++) {
        const int64_t r = u[e] / per_row, piece = u[e] - r * per_row;
        u[e] = r * n0 + piece * PG_PIECE;
    }
    *i0 = u[0];
    *i1 = u[1];
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
   F16 (type 1: the input of an F16 conv, so no separate cast). dst may be x itself (in place):
   each chunk is then computed into a buffer and copied over the values it was computed from. */
void pg_bias_snake(void * dst_, int ith, int nth, void * userdata) {
    (void) userdata;
    struct pg_tensor * dst = dst_;
    const struct pg_tensor * x = dst->src[0], * alpha = dst->src[1], * bias = dst->src[2];
    const int64_t n0 = x->ne[0], rows = x->ne[1] * x->ne[2] * x->ne[3];
    int64_t i0, i1;
    pg_share_pieces(n0, rows, ith, nth, &i0, &i1);
    const float * xs = x->data, * al = alpha->data, * bs = bias->data;
    /* per row: alpha [1, rows] (or [1, rows / batches], repeated over the batches); else one per column. A
       channels-last x of one channel ([1, L]) takes its [1, 1] alpha as the column's (al[r] read past it) */
    const int per_row = alpha->ne[0] == 1 && (n0 > 1 || alpha->ne[1] > 1), f16 = dst->type != 0,
              in_place = dst->data == x->data;
    const int64_t na = alpha->ne[1], nbias = bias->ne[1];
    float tmp[256];
    PG_RUNS(i0, i1, n0, {
        for (int64_t j0 = 0; j0 < len; j0 += 256) {
            const int64_t m = len - j0 < 256 ? len - j0 : 256;
            const float * xi = xs + i + j0;
            float * y = f16 || in_place ? tmp : (float *) dst->data + i + j0;
#ifdef PG_EXACT
            if (per_row) snake_exact(y, xi, al + r % na, 0, bs + r % nbias, 0, m);
            else snake_exact(y, xi, al + c + j0, 1, bs + c + j0, 1, m);
#else
            if (per_row) {
                const float a = al[r % na], b = bs[r % nbias], inv = 1.0f / a;
                (void) inv;
                for (int64_t k = 0; k < m; k++) {
                    const float t = xi[k] + b;
                    const float sn = sinf(a * t);
                    y[k] = t + PG_OVER(sn * sn, a, inv);
                }
            } else {
                const float * a = al + c + j0, * b = bs + c + j0;
                for (int64_t k = 0; k < m; k++) {
                    const float t = xi[k] + b[k];
                    const float sn = sinf(a[k] * t);
                    y[k] = t + sn * sn / a[k];
                }
            }
#endif
            if (f16) pg_store_f16((uint16_t *) dst->data + i + j0, tmp, m);
            else if (in_place) memcpy((float *) dst->data + i + j0, tmp, (size_t) m * sizeof(float));
        }
    })
}

/* dst = (h + b) + x: a conv's bias and the residual add after it in one pass, the values of
   ggml_add(x, ggml_add(h, b)) in the exact build (the default build may reassociate them, and its
   vector loop and scalar tail do so differently: threads take pg_share_pieces); without x (two
   sources), dst = h + b, ggml_add(h, b)'s values in either build (one add each).
   src0 h, src2 x: F32 [n0, rows], x contiguous, h contiguous or (without x, 2-D) rows of n0
   contiguous values nb1 bytes apart (a view of a conv-transpose's first samples: read in place);
   src1 bias: F32 [n0, 1] or [1, rows]; dst contiguous, or h or x itself (in place: chunks
   through a buffer, as in pg_bias_snake). */
/* y[k] = (h[k] + b) + x[k] (h[k] + b without x) for k < n: b one value (per_row) or one per k */
static inline __attribute__((always_inline)) void abr_run(float * y, const float * h, const float * x,
                                                          const float * b, int per_row, int64_t n) {
    if (!x && per_row) {  /* ggml's add takes a scalar loop for this broadcast: 8x slower */
        const float bv = b[0];
        for (int64_t k = 0; k < n; k++) y[k] = h[k] + bv;
    } else if (!x) {
        for (int64_t k = 0; k < n; k++) y[k] = h[k] + b[k];
    } else if (per_row) {
        const float bv = b[0];
        for (int64_t k = 0; k < n; k++) y[k] = (h[k] + bv) + x[k];
    } else {
        for (int64_t k = 0; k < n; k++) y[k] = (h[k] + b[k]) + x[k];
    }
}

void pg_add_bias_residual(void * dst_, int ith, int nth, void * userdata) {
    (void) userdata;
    struct pg_tensor * dst = dst_;
    const struct pg_tensor * h = dst->src[0], * bias = dst->src[1], * x = dst->src[2];
    const int64_t n0 = h->ne[0], rows = h->ne[1] * h->ne[2] * h->ne[3];
    /* rows nb1 apart only for a 2-D h without x (a tensor with ne1 1 may carry any nb1) */
    const int64_t ldh = !x && h->ne[1] > 1 && h->ne[2] == 1 && h->ne[3] == 1 ? (int64_t)(h->nb[1] / sizeof(float)) : n0;
    int64_t i0, i1;
    pg_share_pieces(n0, rows, ith, nth, &i0, &i1);
    const float * hs = h->data, * bs = bias->data, * xs = x ? x->data : NULL;
    float * ys = dst->data;
    /* per row as in pg_bias_snake: [1, rows] (repeated over batches), not a one-channel channels-last h's [1, 1] */
    const int per_row = bias->ne[0] == 1 && (n0 > 1 || bias->ne[1] > 1);
    const int in_place = dst->data == h->data || (xs && dst->data == x->data);
    const int64_t nbias = bias->ne[1];
    float tmp[256];
    PG_RUNS(i0, i1, n0, {
        const float * hr = hs + r * ldh + c;
        for (int64_t j0 = 0; j0 < len; j0 += in_place ? 256 : len) {
            const int64_t m = !in_place ? len : len - j0 < 256 ? len - j0 : 256;
            float * y = in_place ? tmp : ys + i;
            abr_run(y, hr + j0, xs ? xs + i + j0 : NULL, per_row ? bs + r % nbias : bs + c + j0, per_row, m);
            if (in_place) memcpy(ys + i + j0, tmp, (size_t) m * sizeof(float));
        }
    })
}

/* Overlap-add of conv-transpose columns (ggml_col2im_1d's layout and values, padding 0):
 * src0 cols: contiguous F32 ne [K*Cout, T], row oc*K + k of column t; dst: contiguous F32
 * ne [(T-1)*s + K, Cout], y[oc][t*s + k] += cols[t][oc*K + k]: each output from 0 (or prev),
 * then its terms in the order of t. Threads split the output channels. Each output is summed
 * in a register and stored once, a channel's samples in tiles of PG_COL2IM_TILE_BYTES of columns
 * (which stay in L2 while the thread's channels read them). (Adding column after column into
 * every channel's row went at 5-11 GB/s: a chain of loads, adds and stores through each sample
 * the columns overlap.) userdata: int64 [4] = K, s, S, B.
 * src1 (optional) prev: a stream's overlap from its last chunk, where each segment starts.
 * S > 1 segments (a batched step): S streams' T / S columns in turn, each overlap-added on its
 * own into its T / S * s samples of dst, in turn, starting from its own prev (ne [P, Cout, 1, S]);
 * the samples past a stream's (its next overlap) are not added, and dst's last K - s stay 0.
 * B = 1: the last src is a bias, F32 [1, Cout], added to each finished sum (ggml_add's values
 * after the op). dst may be shorter (one segment: ne0 <= (T-1)*s + K; S > 1: ne0 = T s): its
 * first samples alone, the conv-transpose's kept output with no copy or bias pass after it.
 * The sums' order is written out (no reassociation), and their 0 is one the compiler cannot fold
 * (fast math would drop 0 + -0, which ggml's op computes). */
enum { PG_COL2IM_TILE_BYTES = 256 << 10 };
static volatile float pg_col2im_zero = 0.0f;

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-associative-math")
#endif

/* Sample block v (samples v s + j, j < jn) of one channel from its columns co (co[t row + k]):
 * z or the carried prev below tail, then the terms of columns v - q, q from the last that reaches
 * it down to 0, then the bias where has_bias. */
static inline void col2im_block(float * restrict yo, const float * restrict co, const float * restrict po, int64_t v,
                                int64_t jn, int64_t st, int64_t kk, int64_t qn, int64_t row, int64_t t_seg,
                                int64_t tail, float z, int has_bias, float bias) {
#ifdef __clang__
#pragma clang fp reassociate(off)
#endif
    for (int64_t j = 0; j < jn; j++) {
        const int64_t at = v * st + j;
        float acc = at < tail ? po[at] : z;
        for (int64_t q = qn - 1; q >= 0; q--) {
            const int64_t t = v - q, k = q * st + j;
            if (t >= 0 && t < t_seg && k < kk) acc += co[t * row + k];
        }
        yo[at] = has_bias ? acc + bias : acc;
    }
}

/* Blocks [v0, v1) of one channel where K = 2 s, each block whole, past the carried tail, with
 * both of its columns: (0 + the second half of column v - 1) + the first half of column v
 * (+ the bias). */
#ifdef __clang__
#define PG_NO_REASSOC _Pragma("clang fp reassociate(off)")
#else
#define PG_NO_REASSOC
#endif
#define PG_COL2IM_PAIRS(ST)                                                                               \
static void col2im_pairs_##ST(float * restrict yo, const float * restrict co, int64_t v0, int64_t v1,        \
                              int64_t row, float z, int has_bias, float bias) {                          \
    PG_NO_REASSOC                                                                                        \
    for (int64_t v = v0; v < v1; v++) {                                                                  \
        const float * restrict a = co + v * row, * restrict b = co + (v - 1) * row + (ST);               \
        if (has_bias)                                                                                    \
            for (int64_t j = 0; j < (ST); j++) yo[v * (ST) + j] = ((z + b[j]) + a[j]) + bias;            \
        else                                                                                             \
            for (int64_t j = 0; j < (ST); j++) yo[v * (ST) + j] = (z + b[j]) + a[j];                     \
    }                                                                                                    \
}
PG_COL2IM_PAIRS(2)
PG_COL2IM_PAIRS(4)
PG_COL2IM_PAIRS(8)

void pg_col2im(void * dst_, int ith, int nth, void * userdata) {
    const int64_t * p = userdata;
    struct pg_tensor * dst = dst_;
    const int has_bias = p[3] == 1;
    const struct pg_tensor * cols = dst->src[0], * prev = has_bias && !dst->src[2] ? NULL : dst->src[1];
    const float * bv = has_bias ? ((const struct pg_tensor *) dst->src[prev ? 2 : 1])->data : NULL;
    const int64_t kk = p[0], st = p[1], segs = p[2] > 1 ? p[2] : 1;
    const int64_t lout = dst->ne[0], cout = dst->ne[1], row = cols->ne[0];
    const int64_t t_seg = cols->ne[1] / segs, lseg = segs > 1 ? t_seg * st : lout;
    const int64_t nv = (lseg + st - 1) / st;  /* sample blocks [v s, v s + s) of a segment */
    const int64_t qn = (kk + st - 1) / st;    /* the columns that reach one sample: at most qn */
    void (*pairs)(float *, const float *, int64_t, int64_t, int64_t, float, int, float) =
        kk != 2 * st ? NULL : st == 2 ? col2im_pairs_2 : st == 4 ? col2im_pairs_4 : st == 8 ? col2im_pairs_8 : NULL;
    int64_t tile = PG_COL2IM_TILE_BYTES / (int64_t) sizeof(float) / row;
    tile = tile > 1 ? tile : 1;
    const float z = pg_col2im_zero;
    int64_t o0, o1;
    pg_share(cout, ith, nth, &o0, &o1);
    float * y = dst->data;
    const float * c = cols->data;
    for (int64_t oc = o0; oc < o1; oc++)  /* past the segments (S > 1): zeros */
        memset(y + oc * lout + segs * lseg, 0, sizeof(float) * (size_t)(lout - segs * lseg));
    for (int64_t sg = 0; sg < segs; sg++) {
        float * ys = y + sg * lseg;
        const float * cs = c + sg * t_seg * row;
        const float * ps = prev ? (const float *)((const char *)prev->data + sg * prev->nb[3]) : NULL;
        const int64_t tail = prev ? (prev->ne[0] < lseg ? prev->ne[0] : lseg) : 0;
        const int64_t ldp = prev ? (int64_t)(prev->nb[1] / sizeof(float)) : 0;
        /* the blocks that pairs() takes: past the tail and block 0, with column v, whole */
        const int64_t f0 = (tail + st - 1) / st > 1 ? (tail + st - 1) / st : 1;
        const int64_t f1 = t_seg < lseg / st ? t_seg : lseg / st;
        for (int64_t v0 = 0; v0 < nv; v0 += tile) {
            const int64_t v1 = v0 + tile < nv ? v0 + tile : nv;
            const int64_t a = pairs ? (v0 > f0 ? v0 : f0) : v1, b = pairs ? (v1 < f1 ? v1 : f1) : v1;
            for (int64_t oc = o0; oc < o1; oc++) {
                float * restrict yo = ys + oc * lout;
                const float * po = ps ? ps + oc * ldp : NULL;
                const float * co = cs + oc * kk;
                const float bias = has_bias ? bv[oc] : 0.0f;
                int64_t v = v0;
                if (a < b) {
                    for (; v < a; v++) col2im_block(yo, co, po, v, st, st, kk, qn, row, t_seg, tail, z, has_bias, bias);
                    pairs(yo, co, a, b, row, z, has_bias, bias);
                    v = b;
                }
                for (; v < v1; v++) {
                    const int64_t jn = lseg - v * st < st ? lseg - v * st : st;
                    col2im_block(yo, co, po, v, jn, st, kk, qn, row, t_seg, tail, z, has_bias, bias);
                }
            }
        }
    }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

/* dst = src0 transposed (ggml_cont(ggml_transpose(x))'s values: a copy): contiguous F32 src
 * [n0, n1], contiguous dst [n1, n0], dst[c n1 + r] = src[r n0 + c]. In tiles of 32 x 32 by 8 x 8
 * blocks in registers; ggml's copy of a transposed view reads or writes one value at a time,
 * strided (4.8 GB/s for a decoder block's output). Threads take bands of 32 along the longer
 * side. */
void pg_transpose(void * dst_, int ith, int nth, void * userdata) {
    (void) userdata;
    struct pg_tensor * dst = dst_;
    const struct pg_tensor * x = dst->src[0];
    const int64_t n0 = x->ne[0], n1 = x->ne[1], T = 32;
    const float * s = x->data;
    float * d = dst->data;
    const int by_rows = n1 > n0;  /* threads split the src rows r (else its columns c) */
    int64_t b0, b1;
    pg_share(((by_rows ? n1 : n0) + T - 1) / T, ith, nth, &b0, &b1);
    const int64_t r_lo = by_rows ? b0 * T : 0, r_hi = by_rows ? (b1 * T < n1 ? b1 * T : n1) : n1;
    const int64_t c_lo = by_rows ? 0 : b0 * T, c_hi = by_rows ? n0 : (b1 * T < n0 ? b1 * T : n0);
    for (int64_t r0 = r_lo; r0 < r_hi; r0 += T)
        for (int64_t c0 = c_lo; c0 < c_hi; c0 += T) {
            const int64_t r1 = r0 + T < r_hi ? r0 + T : r_hi, c1 = c0 + T < c_hi ? c0 + T : c_hi;
            int64_t r = r0;
#if defined(__AVX2__)
            for (; r + 8 <= r1; r += 8) {
                int64_t c = c0;
                for (; c + 8 <= c1; c += 8) pg_transpose8(s + r * n0 + c, n0, d + c * n1 + r, n1);
                for (; c < c1; c++)
                    for (int64_t i = 0; i < 8; i++) d[c * n1 + r + i] = s[(r + i) * n0 + c];
            }
#endif
            for (; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) d[c * n1 + r] = s[r * n0 + c];
        }
}

/* Whether the F16 conversions are F16C's instructions (else pg_to_f16_soft: the same bits). */
int pg_has_f16c(void) {
#if defined(__F16C__)
    return 1;
#else
    return 0;
#endif
}

/* dst, x: contiguous F32 [n0, rows]; alpha: F32, [1, rows] (one per row) or [n0, 1] (one per column).
   dst may be x itself (in place: chunks through a buffer, as in pg_bias_snake). */
void pg_snake(void * dst_, void * x_, void * alpha_, int ith, int nth, void * userdata) {
    (void) userdata;
    struct pg_tensor * dst = dst_, * x = x_, * alpha = alpha_;
    const int64_t n0 = x->ne[0];
    const int64_t rows = x->ne[1] * x->ne[2] * x->ne[3];
    int64_t i0, i1;
    pg_share_pieces(n0, rows, ith, nth, &i0, &i1);
    const float * xs = x->data;
    const float * al = alpha->data;
    float * ys = dst->data;
    const int per_row = alpha->ne[0] == 1, in_place = dst->data == x->data;
    float tmp[256];
    for (int64_t i = i0; i < i1;) {
        const int64_t r = i / n0, c = i - r * n0;
        const int64_t len = (n0 - c) < (i1 - i) ? (n0 - c) : (i1 - i);
        for (int64_t j0 = 0; j0 < len; j0 += in_place ? 256 : len) {
            const int64_t m = !in_place ? len : len - j0 < 256 ? len - j0 : 256;
            float * y = in_place ? tmp : ys + i;
            if (per_row) snake_run(y, xs + i + j0, m, al[r % alpha->ne[1]]);
            else snake_vec(y, xs + i + j0, al + c + j0, m);
            if (in_place) memcpy(ys + i + j0, tmp, (size_t) m * sizeof(float));
        }
        i += len;
    }
}


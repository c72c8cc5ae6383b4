/*
 * x8_avx2_body.h -- the 256-bit 8-bit-activation row dots, included by kernels_x8_avx2.c
 * (X8_DPBUSD from maddubs + madd) and kernels_x8_avxvnni.c (vpdpbusd) under their own
 * target pragmas, which define X8_DPBUSD(acc, u, s) (acc plus, per int32 lane, the sum
 * of four unsigned-by-signed byte products) and X8_TABLE (the table's name).
 *
 * One block per vector: its 32 weights as bytes, signed products through the sign trick
 * (|w| times x with w's sign), x's q plane then its r plane, 256 * w.q + w.r as 8 int32
 * lane sums (each <= 257 * 4 * 128 * 127 in magnitude) converted to float and multiplied
 * by the block's two scales into one of two float accumulators (even and odd blocks);
 * q4_1's m * s terms go into a third sum.
 * Private to engine/src/kernels/.
 */
#include "kernels/x8_blocks.h"

static inline float x8_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Block x's two planes times weights u (unsigned) as 8 lanes of int32 sums, q's
 * shifted up 8 bits before r's are added (sq, sr: the planes, signs already applied). */
static inline __m256i x8_planes(__m256i u, __m256i sq, __m256i sr)
{
    return X8_DPBUSD(_mm256_slli_epi32(X8_DPBUSD(_mm256_setzero_si256(), u, sq), 8), u, sr);
}

static inline __m256i x8_q(const wpi_xq *x)
{
    return _mm256_loadu_si256((const __m256i *)x->q);
}

static inline __m256i x8_r(const wpi_xq *x)
{
    return _mm256_loadu_si256((const __m256i *)x->r);
}

/* Signed w times block x. */
static inline __m256i x8_dot_ss(__m256i w, const wpi_xq *x)
{
    return x8_planes(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x8_q(x), w),
                     _mm256_sign_epi8(x8_r(x), w));
}

/* Unsigned w times block x. */
static inline __m256i x8_dot_us(__m256i w, const wpi_xq *x)
{
    return x8_planes(w, x8_q(x), x8_r(x));
}

static inline __m256 x8_scaled(__m256i s, float d, __m256 acc)
{
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d), acc);
}

/* One block's lane sums: W(p) is block p's weights as 32 bytes, DOT the product. */
#define X8_BLOCK(W, DOT, p, x) DOT(W(p), (x))

/* The loop over blocks, even and odd blocks into two accumulators; D(p, b) is block b's
 * weight scale times x's, EXTRA(p, b) a per-block float added to a third sum. */
#define X8_ROW(name, bytes, W, D, EXTRA, DOT)                                            \
    static float name(const uint8_t *row, const wpi_xq *xq, size_t nb)                   \
    {                                                                                    \
        __m256 e = _mm256_setzero_ps(), o = e;                                           \
        float extra = 0.0f;                                                              \
        size_t b = 0;                                                                    \
        for (; b + 2 <= nb; b += 2) {                                                    \
            const uint8_t *p0 = row + b * (bytes), *p1 = p0 + (bytes);                   \
            e = x8_scaled(X8_BLOCK(W, DOT, p0, xq + b), D(p0, b), e);                    \
            o = x8_scaled(X8_BLOCK(W, DOT, p1, xq + b + 1), D(p1, b + 1), o);            \
            extra += EXTRA(p0, b) + EXTRA(p1, b + 1);                                    \
        }                                                                                \
        if (b < nb) {                                                                    \
            const uint8_t *p0 = row + b * (bytes);                                       \
            e = x8_scaled(X8_BLOCK(W, DOT, p0, xq + b), D(p0, b), e);                    \
            extra += EXTRA(p0, b);                                                       \
        }                                                                                \
        return x8_hsum(_mm256_add_ps(e, o)) + extra;                                     \
    }

#define X8_DOT_US x8_dot_us

X8_ROWS

/*
 * x8_avx2_body.h -- the 256-bit 8-bit-activation row dots, included by kernels_x8_avx2.c
 * (X8_DPBUSD from maddubs + madd) and kernels_x8_avxvnni.c (vpdpbusd) under their own
 * target pragmas, which define X8_DPBUSD(acc, u, s) (acc plus, per int32 lane, the sum
 * of four unsigned-by-signed byte products) and X8_TABLE (the table's name).
 *
 * One block per vector: its 32 weights as bytes, signed products through the sign trick
 * (|w| times x with w's sign), 8 int32 lane sums converted to float and multiplied by
 * the block's two scales into one of two float accumulators (even and odd blocks);
 * q4_1's m * s terms go into a third sum.
 * Private to engine/src/kernels/.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static inline float x8_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float x8_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* Signed w times signed x, 8 lanes of int32 sums. */
static inline __m256i x8_dot_ss(__m256i w, __m256i x)
{
    return X8_DPBUSD(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

/* 16 bytes of nibbles as 32 bytes: low nibbles (weights 0..15), then high (16..31). */
static inline __m256i x8_nibbles(const uint8_t *q)
{
    __m128i v = _mm_loadu_si128((const __m128i *)q);
    __m256i n = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
    return _mm256_and_si256(n, _mm256_set1_epi8(15));
}

static inline __m256 x8_scaled(__m256i s, float d, __m256 acc)
{
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d), acc);
}

/* One block's lane sums: W(p) is block p's weights as 32 bytes, DOT the product. */
#define X8_BLOCK(W, DOT, p, x) DOT(W(p), _mm256_loadu_si256((const __m256i *)(x)->q))

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

#define X8_NONE(p, b) 0.0f
#define X8_DOT_US(w, x) X8_DPBUSD(_mm256_setzero_si256(), (w), (x))

#define W_Q8_0(p) _mm256_loadu_si256((const __m256i *)((p) + 2))
#define D_Q8_0(p, b) (x8_f16(p) * xq[b].d)
X8_ROW(x8_q8_0, 34, W_Q8_0, D_Q8_0, X8_NONE, x8_dot_ss)

#define W_Q4_0(p) _mm256_sub_epi8(x8_nibbles((p) + 2), _mm256_set1_epi8(8))
X8_ROW(x8_q4_0, 18, W_Q4_0, D_Q8_0, X8_NONE, x8_dot_ss)

#define W_Q4_1(p) x8_nibbles((p) + 4)
#define M_Q4_1(p, b) (x8_f16((p) + 2) * xq[b].s)
X8_ROW(x8_q4_1, 20, W_Q4_1, D_Q8_0, M_Q4_1, X8_DOT_US)

#define W_MXFP4(p) _mm256_shuffle_epi8(_mm256_setr_epi8(WPI_MXFP4_X2, WPI_MXFP4_X2),      \
                                       x8_nibbles((p) + 1))
#define D_MXFP4(p, b) (wpi_e8m0_half((p)[0]) * xq[b].d)
X8_ROW(x8_mxfp4, WPI_MXFP4_BYTES, W_MXFP4, D_MXFP4, X8_NONE, x8_dot_ss)

const wpi_blocks_x8 X8_TABLE = {
    .name = X8_NAME,
    .row_dot = {x8_q8_0, x8_q4_0, x8_q4_1, x8_mxfp4},
};

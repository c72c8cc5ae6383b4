/*
 * x8_avx2_body.h -- the 256-bit 8-bit-activation row dots, included by kernels_x8_avx2.c
 * (X8_DPBUSD from maddubs + madd) and kernels_x8_avxvnni.c (vpdpbusd) under their own
 * target pragmas, which define X8_DPBUSD(acc, u, s) (acc plus, per int32 lane, the sum
 * of four unsigned-by-signed byte products) and X8_TABLE (the table's name).
 *
 * One block per vector: its 32 weights as bytes, signed products through the sign trick
 * (|w| times x with w's sign), 8 int32 lane sums converted to float and multiplied by
 * the block's two scales into a float accumulator; q4_1's m * s terms go into a second.
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

static inline __m256i x8_load_x(const wpi_xq *x)
{
    return _mm256_loadu_si256((const __m256i *)x->q);
}

static inline __m256 x8_scaled(__m256i s, float d, __m256 acc)
{
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d), acc);
}

static float x8_q8_0(const uint8_t *row, const wpi_xq *xq, size_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; b++, row += 34) {
        __m256i w = _mm256_loadu_si256((const __m256i *)(row + 2));
        acc = x8_scaled(x8_dot_ss(w, x8_load_x(xq + b)), x8_f16(row) * xq[b].d, acc);
    }
    return x8_hsum(acc);
}

static float x8_q4_0(const uint8_t *row, const wpi_xq *xq, size_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; b++, row += 18) {
        __m256i w = _mm256_sub_epi8(x8_nibbles(row + 2), _mm256_set1_epi8(8));
        acc = x8_scaled(x8_dot_ss(w, x8_load_x(xq + b)), x8_f16(row) * xq[b].d, acc);
    }
    return x8_hsum(acc);
}

static float x8_q4_1(const uint8_t *row, const wpi_xq *xq, size_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    float ms = 0.0f;
    for (size_t b = 0; b < nb; b++, row += 20) {
        __m256i s = X8_DPBUSD(_mm256_setzero_si256(), x8_nibbles(row + 4), x8_load_x(xq + b));
        acc = x8_scaled(s, x8_f16(row) * xq[b].d, acc);
        ms += x8_f16(row + 2) * xq[b].s;
    }
    return x8_hsum(acc) + ms;
}

static float x8_mxfp4(const uint8_t *row, const wpi_xq *xq, size_t nb)
{
    const __m256i lut = _mm256_setr_epi8(WPI_MXFP4_X2, WPI_MXFP4_X2);
    __m256 acc = _mm256_setzero_ps();
    for (size_t b = 0; b < nb; b++, row += WPI_MXFP4_BYTES) {
        __m256i w = _mm256_shuffle_epi8(lut, x8_nibbles(row + 1));
        acc = x8_scaled(x8_dot_ss(w, x8_load_x(xq + b)), wpi_e8m0_half(row[0]) * xq[b].d, acc);
    }
    return x8_hsum(acc);
}

const wpi_blocks_x8 X8_TABLE = {
    .name = X8_NAME,
    .row_dot = {x8_q8_0, x8_q4_0, x8_q4_1, x8_mxfp4},
};

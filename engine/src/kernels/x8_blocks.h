/*
 * x8_blocks.h -- what the 256- and 512-bit 8-bit-activation bodies (x8_avx2_body.h,
 * x8_avx512_body.h) share: a block's f16 scale, its nibbles as bytes, each dtype's
 * weights as 32 bytes W_*(p) (a __m256i), its weight scale times x's and 1/256 D_*(p, b)
 * (a block's integer sum counts x in steps of d / 256: 256 * w.q + w.r), q4_1's
 * offset term M_Q4_1, and X8_ROWS, which defines the four row dots and the table X8_TABLE
 * from the body's X8_ROW(name, bytes, W, D, EXTRA, DOT), x8_dot_ss (signed weights) and
 * X8_DOT_US (unsigned weights). Included once per body, under the file's target pragma.
 * Private to engine/src/kernels/.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static inline float x8_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 16 bytes of nibbles as 32 bytes: low nibbles (weights 0..15), then high (16..31). */
static inline __m256i x8_nibbles(const uint8_t *q)
{
    __m128i v = _mm_loadu_si128((const __m128i *)q);
    __m256i n = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
    return _mm256_and_si256(n, _mm256_set1_epi8(15));
}

#define X8_NONE(p, b) 0.0f
#define W_Q8_0(p) _mm256_loadu_si256((const __m256i *)((p) + 2))
#define D_Q8_0(p, b) (x8_f16(p) * xq[b].d * WPI_X8_R)
#define W_Q4_0(p) _mm256_sub_epi8(x8_nibbles((p) + 2), _mm256_set1_epi8(8))
#define W_Q4_1(p) x8_nibbles((p) + 4)
#define M_Q4_1(p, b) (x8_f16((p) + 2) * xq[b].s)
#define W_MXFP4(p) _mm256_shuffle_epi8(_mm256_setr_epi8(WPI_MXFP4_X2, WPI_MXFP4_X2),      \
                                       x8_nibbles((p) + 1))
#define D_MXFP4(p, b) (wpi_e8m0_half((p)[0]) * xq[b].d * WPI_X8_R)

#define X8_ROWS                                                                          \
    X8_ROW(x8_q8_0, 34, W_Q8_0, D_Q8_0, X8_NONE, x8_dot_ss)                              \
    X8_ROW(x8_q4_0, 18, W_Q4_0, D_Q8_0, X8_NONE, x8_dot_ss)                              \
    X8_ROW(x8_q4_1, 20, W_Q4_1, D_Q8_0, M_Q4_1, X8_DOT_US)                               \
    X8_ROW(x8_mxfp4, WPI_MXFP4_BYTES, W_MXFP4, D_MXFP4, X8_NONE, x8_dot_ss)              \
    X8_ROWS4                                                                             \
    const wpi_blocks_x8 X8_TABLE = {                                                     \
        .name = X8_NAME,                                                                 \
        .row_dot = {x8_q8_0, x8_q4_0, x8_q4_1, x8_mxfp4},                                \
        .row_dot4 = {X8_ROW4_FNS},                                                       \
    };

/* The 4-token row dots, where the body has X8_ROW4 (X8_HAVE_ROW4); else none. */
#if defined(X8_HAVE_ROW4)
#define X8_ROWS4                                                                         \
    X8_ROW4(x8_q8_0_4, 34, W_Q8_0, D_Q8_0, X8_NONE, x8_dot_ss)                           \
    X8_ROW4(x8_q4_0_4, 18, W_Q4_0, D_Q8_0, X8_NONE, x8_dot_ss)                           \
    X8_ROW4(x8_q4_1_4, 20, W_Q4_1, D_Q8_0, M_Q4_1, X8_DOT_US)                            \
    X8_ROW4(x8_mxfp4_4, WPI_MXFP4_BYTES, W_MXFP4, D_MXFP4, X8_NONE, x8_dot_ss)
#define X8_ROW4_FNS x8_q8_0_4, x8_q4_0_4, x8_q4_1_4, x8_mxfp4_4
#else
#define X8_ROWS4
#define X8_ROW4_FNS NULL
#endif

/*
 * x8_tile_w256.h -- the 256-bit vectors of the 8-bit-activation tile kernels: one block
 * per vector (8 int32 lanes), tiles of 2 rows x 4 tokens (X8T_R1 rows x 1 for a lone
 * token: 2 unless the ISA file sets it). Included by kernels_x8_avx2.c
 * and kernels_x8_avxvnni.c under their target pragmas, after x8_blocks.h; includes x8_tile_body.h.
 * Private to engine/src/kernels/.
 */
typedef __m256i xt_i;
typedef __m256 xt_f;

#define X8T_G 1
#define X8T_R 2
#define X8T_T 4
#ifndef X8T_R1
#define X8T_R1 2 /* rows per tile of a lone token (the ISA file may set its own) */
#endif
#define X8T_GATHER 0 /* the scales row by row */

#define xt_add _mm256_add_epi32
#define xt_sub _mm256_sub_epi32
#define xt_xor _mm256_xor_si256
#define xt_set1_i8 _mm256_set1_epi8
#define xt_zero_i _mm256_setzero_si256
#define xt_zero_f _mm256_setzero_ps
#define xt_cvt _mm256_cvtepi32_ps
#define xt_mul _mm256_mul_ps
#define xt_fma _mm256_fmadd_ps
static inline float x8_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#define xt_reduce x8_hsum
#define xt_abs8 _mm256_abs_epi8
#define xt_shl8(v) _mm256_slli_epi32((v), 8)
#define xt_sign8 _mm256_sign_epi8

static inline xt_f xt_seg(float a0, float a1)
{
    (void)a1;
    return _mm256_set1_ps(a0);
}

static inline xt_i xt_bytes(const void *p0, const void *p1)
{
    (void)p1;
    return _mm256_loadu_si256((const __m256i *)p0);
}

static inline xt_i xt_nibbles(const uint8_t *n0, const uint8_t *n1)
{
    (void)n1;
    return x8_nibbles(n0);
}

/* A block's f16 at p0 in all 8 lanes (p1 is never set: one block per vector). */
static inline xt_f xt_seg_h(const uint8_t *p0, const uint8_t *p1)
{
    uint16_t h0;
    (void)p1;
    memcpy(&h0, p0, 2);
    return _mm256_cvtph_ps(_mm_set1_epi16((short)h0));
}

/* A block's 16 nibble bytes as 32, in the order of x8_nibbles, the high nibbles left in
 * place (16 times the weight). */
static inline xt_i xt_nib16(const uint8_t *n0, const uint8_t *n1)
{
    (void)n1;
    __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)n0));
    return _mm256_and_si256(v, _mm256_setr_epi64x(0x0f0f0f0f0f0f0f0f, 0x0f0f0f0f0f0f0f0f,
                                                  (long long)0xf0f0f0f0f0f0f0f0ull,
                                                  (long long)0xf0f0f0f0f0f0f0f0ull));
}

/* Per lane of xt_nib16's layout: 1 / 256, or 1 / 4096 in the high nibbles' lanes. */
static inline xt_f xt_lane_scale16(void)
{
    const float a = 1.0f / 256.0f, b = 1.0f / 4096.0f;
    return _mm256_setr_ps(a, a, a, a, b, b, b, b);
}

/* The bytes 8, or 128 in the high nibbles' lanes: q4_0's -8 in xt_nib16's layout. */
static inline xt_i xt_eight16(void)
{
    return _mm256_setr_epi64x(0x0808080808080808, 0x0808080808080808,
                              (long long)0x8080808080808080ull, (long long)0x8080808080808080ull);
}

#define xt_set1_f _mm256_set1_ps

/* An mxfp4 block's scale 2^(e - 127) (twice wpi_e8m0_half: e = 0 the subnormal 2^-127)
 * in all 8 lanes, from the byte at p0. */
static inline xt_f xt_seg_e8m0(const uint8_t *p0, const uint8_t *p1)
{
    (void)p1;
    __m256i e = _mm256_slli_epi32(_mm256_set1_epi32(p0[0]), 23);
    return _mm256_castsi256_ps(_mm256_max_epu32(e, _mm256_set1_epi32(0x00400000)));
}

static inline xt_i xt_mxfp4(xt_i nibbles)
{
    return _mm256_shuffle_epi8(_mm256_setr_epi8(WPI_MXFP4_X2, WPI_MXFP4_X2), nibbles);
}

static inline xt_i xt_mxfp4u(xt_i nibbles)
{
    return _mm256_shuffle_epi8(_mm256_setr_epi8(X8_MXFP4_X2_U12, X8_MXFP4_X2_U12), nibbles);
}

#include "kernels/x8_tile_body.h"

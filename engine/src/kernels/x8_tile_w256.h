/*
 * x8_tile_w256.h -- the 256-bit vectors of the 8-bit-activation tile kernels: one block
 * per vector (8 int32 lanes), tiles of 2 rows x 4 tokens. Included by kernels_x8_avx2.c
 * and kernels_x8_avxvnni.c under their target pragmas, after x8_blocks.h; includes x8_tile_body.h.
 * Private to engine/src/kernels/.
 */
typedef __m256i xt_i;
typedef __m256 xt_f;

#define X8T_G 1
#define X8T_R 2
#define X8T_T 4
#define X8T_R1 2 /* rows per tile of a lone token */

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

static inline xt_i xt_mxfp4(xt_i nibbles)
{
    return _mm256_shuffle_epi8(_mm256_setr_epi8(WPI_MXFP4_X2, WPI_MXFP4_X2), nibbles);
}

#include "kernels/x8_tile_body.h"

/*
 * x8_tile_w512.h -- the 512-bit vectors of the 8-bit-activation tile kernels: a group of
 * two blocks per vector (int32 lanes 0..7 the first block, 8..15 the second; a last odd
 * block is paired with zeros), tiles of 4 rows x 4 tokens (8 rows x 1 for a lone token,
 * whose activations are then loaded once per 8 rows). Included by
 * kernels_x8_avx512bw.c and kernels_x8_avx512vnni.c under their target pragmas, after x8_blocks.h; includes x8_tile_body.h.
 * Private to engine/src/kernels/.
 */
typedef __m512i xt_i;
typedef __m512 xt_f;

#define X8T_G 2 /* blocks per vector */
#define X8T_R 4 /* rows per tile */
#define X8T_T 4 /* tokens per tile */
#define X8T_R1 8 /* rows per tile of a lone token */

#define xt_add _mm512_add_epi32
#define xt_sub _mm512_sub_epi32
#define xt_xor _mm512_xor_si512
#define xt_set1_i8 _mm512_set1_epi8
#define xt_zero_i _mm512_setzero_si512
#define xt_zero_f _mm512_setzero_ps
#define xt_cvt _mm512_cvtepi32_ps
#define xt_mul _mm512_mul_ps
#define xt_fma _mm512_fmadd_ps
#define xt_reduce _mm512_reduce_add_ps
#define xt_abs8 _mm512_abs_epi8
#define xt_shl8(v) _mm512_slli_epi32((v), 8)

/* x negated where w < 0 (the sign trick of byte products without VNNI). */
static inline xt_i xt_sign8(xt_i x, xt_i w)
{
    return _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
}

/* A float per block, in that block's 8 lanes. */
static inline xt_f xt_seg(float a0, float a1)
{
    return _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(a0), _mm512_set1_ps(a1));
}

/* 32 bytes at p0, then 32 at p1 (zeros where p1 is NULL). */
static inline xt_i xt_bytes(const void *p0, const void *p1)
{
    __m256i lo = _mm256_loadu_si256((const __m256i *)p0);
    __m256i hi = p1 ? _mm256_loadu_si256((const __m256i *)p1) : _mm256_setzero_si256();
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* Two blocks' 16 nibble bytes (n1 NULL: zeros) as 64 bytes: each block's low nibbles
 * (weights 0..15) then its high ones (16..31). */
static inline xt_i xt_nibbles(const uint8_t *n0, const uint8_t *n1)
{
    __m128i lo = _mm_loadu_si128((const __m128i *)n0);
    __m128i hi = n1 ? _mm_loadu_si128((const __m128i *)n1) : _mm_setzero_si128();
    __m512i v = _mm512_castsi256_si512(_mm256_set_m128i(hi, lo));
    v = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), v);
    v = _mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
    return _mm512_and_si512(v, _mm512_set1_epi8(15));
}

static inline xt_i xt_mxfp4(xt_i nibbles)
{
    __m128i t = _mm_setr_epi8(WPI_MXFP4_X2);
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(t), nibbles);
}

#include "kernels/x8_tile_body.h"

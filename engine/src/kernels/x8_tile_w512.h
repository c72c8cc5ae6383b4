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
#define X8T_GATHER 1 /* mxfp4's scales of a lone token's 8 rows by one gather (x8_tile_body.h) */

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
    __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)n0));
    if (n1)
        v = _mm512_mask_broadcast_i32x4(v, 0xff00, _mm_loadu_si128((const __m128i *)n1));
    else
        v = _mm512_maskz_mov_epi32(0x00ff, v);
    v = _mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
    return _mm512_and_si512(v, _mm512_set1_epi8(15));
}

/* Two blocks' f16 at p0 and p1 (p1 NULL: zeros), each in its block's 8 lanes. */
static inline xt_f xt_seg_h(const uint8_t *p0, const uint8_t *p1)
{
    uint16_t h0, h1 = 0;
    memcpy(&h0, p0, 2);
    if (p1)
        memcpy(&h1, p1, 2);
    return _mm512_cvtph_ps(_mm256_set_m128i(_mm_set1_epi16((short)h1), _mm_set1_epi16((short)h0)));
}

/* Two blocks' 16 nibble bytes (n1 NULL: zeros) as 64 bytes, in the order of
 * xt_nibbles, the high nibbles left in place (16 times the weight). */
static inline xt_i xt_nib16(const uint8_t *n0, const uint8_t *n1)
{
    __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)n0));
    if (n1)
        v = _mm512_mask_broadcast_i32x4(v, 0xff00, _mm_loadu_si128((const __m128i *)n1));
    else
        v = _mm512_maskz_mov_epi32(0x00ff, v);
    const long long lo = 0x0f0f0f0f0f0f0f0f, hi = (long long)0xf0f0f0f0f0f0f0f0ull;
    return _mm512_and_si512(v, _mm512_setr_epi64(lo, lo, hi, hi, lo, lo, hi, hi));
}

/* Per lane of xt_nib16's layout: 1 / 256, or 1 / 4096 in the high nibbles' lanes. */
static inline xt_f xt_lane_scale16(void)
{
    const float a = 1.0f / 256.0f, b = 1.0f / 4096.0f;
    return _mm512_setr_ps(a, a, a, a, b, b, b, b, a, a, a, a, b, b, b, b);
}

/* The bytes 8, or 128 in the high nibbles' lanes: q4_0's -8 in xt_nib16's layout. */
static inline xt_i xt_eight16(void)
{
    const long long lo = 0x0808080808080808, hi = (long long)0x8080808080808080ull;
    return _mm512_setr_epi64(lo, lo, hi, hi, lo, lo, hi, hi);
}

#define xt_set1_f _mm512_set1_ps

/* Two mxfp4 blocks' scales 2^(e - 127) (twice wpi_e8m0_half: e = 0 the subnormal
 * 2^-127), each in its block's 8 lanes, from the bytes at p0 and p1 (p1 NULL: zeros). */
static inline xt_f xt_seg_e8m0(const uint8_t *p0, const uint8_t *p1)
{
    __m512i e = _mm512_mask_blend_epi32(0xff00, _mm512_set1_epi32(p0[0]),
                                        _mm512_set1_epi32(p1 ? p1[0] : 0));
    e = _mm512_max_epu32(_mm512_slli_epi32(e, 23), _mm512_set1_epi32(0x00400000));
    if (!p1)
        e = _mm512_maskz_mov_epi32(0x00ff, e);
    return _mm512_castsi512_ps(e);
}

static inline xt_i xt_mxfp4(xt_i nibbles)
{
    __m128i t = _mm_setr_epi8(WPI_MXFP4_X2);
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(t), nibbles);
}

static inline xt_i xt_mxfp4u(xt_i nibbles)
{
    __m128i t = _mm_setr_epi8(X8_MXFP4_X2_U12);
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(t), nibbles);
}

/* Gather offsets of two blocks `bytes` apart in each of 8 rows rb apart: lane 2i + j at
 * i * rb + j * bytes. */
static inline xt_i xt_gather_index(size_t rb, size_t bytes)
{
    return _mm512_add_epi32(
        _mm512_mullo_epi32(_mm512_set1_epi32((int)rb),
                           _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7)),
        _mm512_mullo_epi32(_mm512_set1_epi32((int)bytes),
                           _mm512_setr_epi32(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1)));
}

/* 2^(e - 127) for the byte e at base + gi in each lane of m (as xt_seg_e8m0), zeros
 * elsewhere. */
static inline xt_f xt_gather_e8m0(const uint8_t *base, xt_i gi, __mmask16 m)
{
    __m512i e = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, gi, base, 1);
    e = _mm512_slli_epi32(_mm512_and_si512(e, _mm512_set1_epi32(255)), 23);
    e = _mm512_maskz_max_epu32(m, e, _mm512_set1_epi32(0x00400000));
    return _mm512_castsi512_ps(e);
}

/* a0 in the even lanes, a1 in the odd ones (a block pair per row, as the gathers). */
static inline xt_f xt_pairs(float a0, float a1)
{
    return _mm512_mask_blend_ps(0xaaaa, _mm512_set1_ps(a0), _mm512_set1_ps(a1));
}

/* Row i's two blocks' values in their 8 lanes each. */
static inline xt_f xt_row_pair(xt_f a, int i)
{
    const __m512i base = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    return _mm512_permutexvar_ps(_mm512_add_epi32(base, _mm512_set1_epi32(2 * i)), a);
}

#include "kernels/x8_tile_body.h"

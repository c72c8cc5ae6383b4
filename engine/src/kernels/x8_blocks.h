/*
 * x8_blocks.h -- what the 256- and 512-bit 8-bit-activation tile kernels (x8_tile_w256.h,
 * x8_tile_w512.h) share: a block's f16 scale and its nibbles as bytes. Included once per
 * ISA file, under its target pragma.
 * Private to engine/src/kernels/.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* WPI_MXFP4_X2 plus 12: twice an e2m1 code's value as an unsigned byte. */
#define X8_MXFP4_X2_U12 12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0

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

/*
 * kernels_avx2.c -- AVX2 + FMA + F16C block kernels for the matmul, and dot and axpy.
 *
 * Compiled with plain flags: the target pragma below enables the instruction sets for
 * this file only, and dispatch.c calls into it only when the CPU has them.
 *
 * Block kernels for matmul.c's driver (blocks.h): a row dot per dtype for one token
 * (each 32-weight block widened to float in registers, int8/nibbles -> int32 -> float,
 * dotted with x, scaled by the block's d and added to one of two accumulators, even and
 * odd blocks), a multi kernel per dtype for 2..8 tokens (each block decoded once into
 * registers and FMA'd against every token), and for more tokens a chunk dequantizer per
 * dtype and tiles of 4 rows x 3 tokens and 2 rows x 4 tokens.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/blocks.h"

#if defined(__x86_64__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#include <immintrin.h>

/* Keeps a loaded vector in a register. Without it GCC folds the load into both FMAs
 * that use it, and the 2x4 tile becomes load-bound: prefill (n_tok 16..64) ran 1.1x to
 * 1.4x slower on an AMD EPYC (Zen 3) with GCC 12. */
#if defined(__GNUC__)
#define KEEP_IN_REGISTER(v) __asm__("" : "+x"(v))
#else
#define KEEP_IN_REGISTER(v) ((void)0)
#endif

/* ---- helpers --------------------------------------------------------------------- */

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* hsum of four vectors at once, v_k's into lane k, each sum formed in hsum's order
 * (halves added, then lanes 0 + 2 and 1 + 3, then those two): the same bits as four
 * hsum calls, with the shuffles shared. */
static inline __m128 hsum4(__m256 v0, __m256 v1, __m256 v2, __m256 v3)
{
    __m128 s0 = _mm_add_ps(_mm256_castps256_ps128(v0), _mm256_extractf128_ps(v0, 1));
    __m128 s1 = _mm_add_ps(_mm256_castps256_ps128(v1), _mm256_extractf128_ps(v1, 1));
    __m128 s2 = _mm_add_ps(_mm256_castps256_ps128(v2), _mm256_extractf128_ps(v2, 1));
    __m128 s3 = _mm_add_ps(_mm256_castps256_ps128(v3), _mm256_extractf128_ps(v3, 1));
    /* [s0[0] + s0[2], s1[0] + s1[2], s0[1] + s0[3], s1[1] + s1[3]], and for s2, s3 */
    __m128 u01 = _mm_add_ps(_mm_unpacklo_ps(s0, s1), _mm_unpackhi_ps(s0, s1));
    __m128 u23 = _mm_add_ps(_mm_unpacklo_ps(s2, s3), _mm_unpackhi_ps(s2, s3));
    return _mm_add_ps(_mm_movelh_ps(u01, u23), _mm_movehl_ps(u23, u01));
}

/* Lanes [0, n) set, n in 0..8. */
static inline __m256i tail_mask(size_t n)
{
    static const int32_t m[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i *)(m + 8 - n));
}

static inline float load_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 8 halves (f16 or bf16) at p as floats; n < 8 reads only n of them, the rest are 0. */
static inline __m256 load8_f16(const uint16_t *p, size_t n)
{
    if (n >= 8)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    uint16_t tmp[8] = {0};
    memcpy(tmp, p, n * 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)tmp));
}

static inline __m256 load8_bf16(const uint16_t *p, size_t n)
{
    __m128i h;
    if (n >= 8) {
        h = _mm_loadu_si128((const __m128i *)p);
    } else {
        uint16_t tmp[8] = {0};
        memcpy(tmp, p, n * 2);
        h = _mm_loadu_si128((const __m128i *)tmp);
    }
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* The 32 signed int8 weights of a q8_0 block as four float vectors. */
static inline void widen_q8(const uint8_t *q, __m256 w[4])
{
    w[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
    w[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8))));
    w[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 16))));
    w[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 24))));
}

/*
 * The 32 nibbles of a q4 block (16 bytes; low nibbles = weights 0..15, high = 16..31)
 * minus bias, as four float vectors. Both 128-bit lanes hold the 16 bytes and one
 * in-lane byte shuffle spreads 8 of them into 32-bit lanes: the low nibble gives weight
 * j, the high nibble weight j + 16. This uses a third of the cross-lane shuffles of
 * widening each 8 bytes with vpmovsxbd (28% faster q4_0 matvec on an AMD EPYC).
 */
static inline void widen_q4(const uint8_t *q, int bias, __m256 w[4])
{
    const __m256i spread_lo = _mm256_setr_epi8(0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1,
                                               3, -1, -1, -1, 4, -1, -1, -1, 5, -1, -1, -1,
                                               6, -1, -1, -1, 7, -1, -1, -1);
    const __m256i spread_hi = _mm256_setr_epi8(8, -1, -1, -1, 9, -1, -1, -1, 10, -1, -1, -1,
                                               11, -1, -1, -1, 12, -1, -1, -1, 13, -1, -1, -1,
                                               14, -1, -1, -1, 15, -1, -1, -1);
    const __m256i m4 = _mm256_set1_epi32(15), b = _mm256_set1_epi32(bias);
    __m256i raw = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q));
    __m256i b0 = _mm256_shuffle_epi8(raw, spread_lo); /* bytes 0..7, one per lane */
    __m256i b1 = _mm256_shuffle_epi8(raw, spread_hi); /* bytes 8..15 */
    w[0] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(b0, m4), b));
    w[1] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(b1, m4), b));
    w[2] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b0, 4), b));
    w[3] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b1, 4), b));
}

/*
 * The 32 nibbles of a q4_0 block as (q - 8) * 2^28, four float vectors: the caller scales
 * by d * 2^-28 (exact: a power of two), so products and sums equal those of (q - 8) * d
 * bit for bit. XOR with 8 turns each nibble q into the 4-bit two's complement of q - 8;
 * the byte shuffle puts byte j at the top of 32-bit lane j, where a left shift by 4 (low
 * nibble) or a mask (high nibble) leaves a sign-correct int32 with nothing below it. Four
 * integer operations instead of widen_q4's eight (no subtraction, no separate nibble
 * extraction): 12% fewer vector micro-ops per block.
 */
static inline void widen_q4_0_top(const uint8_t *q, __m256 w[4])
{
    const __m256i top_lo = _mm256_setr_epi8(-1, -1, -1, 0, -1, -1, -1, 1, -1, -1, -1, 2,
                                            -1, -1, -1, 3, -1, -1, -1, 4, -1, -1, -1, 5,
                                            -1, -1, -1, 6, -1, -1, -1, 7);
    const __m256i top_hi = _mm256_setr_epi8(-1, -1, -1, 8, -1, -1, -1, 9, -1, -1, -1, 10,
                                            -1, -1, -1, 11, -1, -1, -1, 12, -1, -1, -1, 13,
                                            -1, -1, -1, 14, -1, -1, -1, 15);
    const __m256i hi_mask = _mm256_set1_epi32((int32_t)0xF0000000u);
    __m256i raw = _mm256_xor_si256(
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q)),
        _mm256_set1_epi8((char)0x88));
    __m256i b0 = _mm256_shuffle_epi8(raw, top_lo); /* bytes 0..7 at the top of each lane */
    __m256i b1 = _mm256_shuffle_epi8(raw, top_hi); /* bytes 8..15 */
    w[0] = _mm256_cvtepi32_ps(_mm256_slli_epi32(b0, 4));
    w[1] = _mm256_cvtepi32_ps(_mm256_slli_epi32(b1, 4));
    w[2] = _mm256_cvtepi32_ps(_mm256_and_si256(b0, hi_mask));
    w[3] = _mm256_cvtepi32_ps(_mm256_and_si256(b1, hi_mask));
}

/* The 32 weights of an mxfp4 block (blocks.h) as four float vectors: each code's
 * doubled value from a byte table (low nibbles = weights 0..15, high = 16..31), widened
 * to float and times half the scale (exact). */
static inline void widen_mxfp4(const uint8_t *blk, __m256 w[4])
{
    const __m128i lut = _mm_setr_epi8(WPI_MXFP4_X2), m4 = _mm_set1_epi8(15);
    __m128i raw = _mm_loadu_si128((const __m128i *)(blk + 1));
    __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(raw, m4));
    __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(raw, 4), m4));
    __m256 dh = _mm256_set1_ps(wpi_e8m0_half(blk[0]));
    w[0] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), dh);
    w[1] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), dh);
    w[2] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), dh);
    w[3] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), dh);
}

/* sum over the block of w[k] * x[8k..8k+8), as a vector. */
static inline __m256 block_dot(const __m256 w[4], const float *x)
{
    __m256 s01 = _mm256_mul_ps(w[0], _mm256_loadu_ps(x));
    __m256 s23 = _mm256_mul_ps(w[2], _mm256_loadu_ps(x + 16));
    s01 = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), s01);
    s23 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), s23);
    return _mm256_add_ps(s01, s23);
}

/* ---- dot, axpy ------------------------------------------------------------------- */

static float dot_f32_avx2(const float *a, const float *b, size_t n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    if (i < n) {
        __m256i m = tail_mask(n - i);
        s1 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), s1);
    }
    return hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

static void axpy_f32_avx2(float a, const float *x, float *y, size_t n)
{
    __m256 va = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 y0 = _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i));
        __m256 y1 = _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8));
        _mm256_storeu_ps(y + i, y0);
        _mm256_storeu_ps(y + i + 8, y1);
    }
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    if (i < n) {
        __m256i m = tail_mask(n - i);
        __m256 v = _mm256_fmadd_ps(va, _mm256_maskload_ps(x + i, m), _mm256_maskload_ps(y + i, m));
        _mm256_maskstore_ps(y + i, m, v);
    }
}

/* ---- one token: one row against one x, straight from the stored weights --------- */

static float row_f32(const uint8_t *row, const float *x, size_t n)
{
    return dot_f32_avx2((const float *)row, x, n);
}

static float row_f16(const uint8_t *row, const float *x, size_t n)
{
    const uint16_t *w = (const uint16_t *)row;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(load8_f16(w + i, 8), _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(load8_f16(w + i + 8, 8), _mm256_loadu_ps(x + i + 8), s1);
        s2 = _mm256_fmadd_ps(load8_f16(w + i + 16, 8), _mm256_loadu_ps(x + i + 16), s2);
        s3 = _mm256_fmadd_ps(load8_f16(w + i + 24, 8), _mm256_loadu_ps(x + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(load8_f16(w + i, 8), _mm256_loadu_ps(x + i), s0);
    if (i < n)
        s1 = _mm256_fmadd_ps(load8_f16(w + i, n - i), _mm256_maskload_ps(x + i, tail_mask(n - i)), s1);
    return hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

static float row_bf16(const uint8_t *row, const float *x, size_t n)
{
    const uint16_t *w = (const uint16_t *)row;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(load8_bf16(w + i, 8), _mm256_loadu_ps(x + i), s0);
        s1 = _mm256_fmadd_ps(load8_bf16(w + i + 8, 8), _mm256_loadu_ps(x + i + 8), s1);
        s2 = _mm256_fmadd_ps(load8_bf16(w + i + 16, 8), _mm256_loadu_ps(x + i + 16), s2);
        s3 = _mm256_fmadd_ps(load8_bf16(w + i + 24, 8), _mm256_loadu_ps(x + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(load8_bf16(w + i, 8), _mm256_loadu_ps(x + i), s0);
    if (i < n)
        s1 = _mm256_fmadd_ps(load8_bf16(w + i, n - i), _mm256_maskload_ps(x + i, tail_mask(n - i)), s1);
    return hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

/* acc + one block's d * sum(w*x), for q8_0 and q4_0. */
static inline __m256 block_q8_0(const uint8_t *blk, const float *x, __m256 acc)
{
    __m256 w[4];
    widen_q8(blk + 2, w);
    return _mm256_fmadd_ps(_mm256_set1_ps(load_f16(blk)), block_dot(w, x), acc);
}

static inline __m256 block_q4_0(const uint8_t *blk, const float *x, __m256 acc)
{
    __m256 w[4];
    widen_q4_0_top(blk + 2, w);
    return _mm256_fmadd_ps(_mm256_set1_ps(load_f16(blk) * 0x1p-28f), block_dot(w, x), acc);
}

/* acc + one mxfp4 block's sum(w*x), the weights already scaled. */
static inline __m256 block_mxfp4(const uint8_t *blk, const float *x, __m256 acc)
{
    __m256 w[4];
    widen_mxfp4(blk, w);
    return _mm256_add_ps(acc, block_dot(w, x));
}

/* The lane-wise sum of a 32-float block of x, as block_q4_1 needs it. */
static inline __m256 block_xsum(const float *x)
{
    return _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)),
                         _mm256_add_ps(_mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24)));
}

/* q4_1 weights are d*q + m, so a block adds d*sum(q*x) + m*sum(x); sx is the block's
 * block_xsum, computed once per call for all rows (row_q4_1_sx). */
static inline __m256 block_q4_1_sx(const uint8_t *blk, const float *x, __m256 sx, __m256 acc)
{
    __m256 w[4];
    widen_q4(blk + 4, 0, w);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(load_f16(blk + 2)), sx, acc);
    return _mm256_fmadd_ps(_mm256_set1_ps(load_f16(blk)), block_dot(w, x), acc);
}

static inline __m256 block_q4_1(const uint8_t *blk, const float *x, __m256 acc)
{
    return block_q4_1_sx(blk, x, block_xsum(x), acc);
}

/* Blocks of x whose sums a q4_1 matvec keeps on the stack (16 KiB: cols <= 16384). */
#define XSUM_BLOCKS 512

/* row_q4_1 with the block sums of x precomputed: the same operations in the same order,
 * so the same result bit for bit, with 4 loads and 3 adds per block fewer. */
static float row_q4_1_sx(const uint8_t *row, const float *x, const __m256 *sx, size_t nb)
{
    __m256 e = _mm256_setzero_ps(), o = e;
    size_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        e = block_q4_1_sx(row + b * 20, x + b * 32, sx[b], e);
        o = block_q4_1_sx(row + (b + 1) * 20, x + (b + 1) * 32, sx[b + 1], o);
    }
    if (b < nb)
        e = block_q4_1_sx(row + b * 20, x + b * 32, sx[b], e);
    return hsum(_mm256_add_ps(e, o));
}

/* blocks.h's even/odd row loop over this file's vectors. */
#define ROW_QUANT(name, block_fn, bytes) \
    WPI_ROW_QUANT(name, block_fn, bytes, __m256, _mm256_setzero_ps(), _mm256_add_ps, hsum)

ROW_QUANT(row_q8_0, block_q8_0, 34)
ROW_QUANT(row_q4_0, block_q4_0, 18)
ROW_QUANT(row_q4_1, block_q4_1, 20)
ROW_QUANT(row_mxfp4, block_mxfp4, WPI_MXFP4_BYTES)

/* q4_1 rows against one x: with two rows or more, the block sums of x are formed once
 * for all of them. */
static void rows_q4_1(const uint8_t *w, size_t rb, size_t n_rows, const float *x,
                      size_t cols, float *y)
{
    size_t nb = cols / 32;
    if (nb <= XSUM_BLOCKS && n_rows > 1) {
        __m256 sx[XSUM_BLOCKS];
        for (size_t b = 0; b < nb; b++)
            sx[b] = block_xsum(x + b * 32);
        for (size_t r = 0; r < n_rows; r++)
            y[r] = row_q4_1_sx(w + r * rb, x, sx, nb);
        return;
    }
    for (size_t r = 0; r < n_rows; r++)
        y[r] = row_q4_1(w + r * rb, x, cols);
}

/* ---- several tokens: dequantize a chunk once, apply it to every token ------------- */

/* Half-precision columns [c, c + n) as floats; out has room for a whole last vector. */
static void dequant_f16(const uint8_t *row, size_t c, size_t n, float *out)
{
    const uint16_t *h = (const uint16_t *)row + c;
    for (size_t i = 0; i < n; i += 8)
        _mm256_store_ps(out + i, load8_f16(h + i, n - i < 8 ? n - i : 8));
}

static void dequant_bf16(const uint8_t *row, size_t c, size_t n, float *out)
{
    const uint16_t *h = (const uint16_t *)row + c;
    for (size_t i = 0; i < n; i += 8)
        _mm256_store_ps(out + i, load8_bf16(h + i, n - i < 8 ? n - i : 8));
}

/* d * w + m for the four vectors of a block, at out; then one block of each dtype. */
static inline void store_block(float *out, __m256 d, __m256 m, const __m256 w[4])
{
    _mm256_store_ps(out, _mm256_fmadd_ps(d, w[0], m));
    _mm256_store_ps(out + 8, _mm256_fmadd_ps(d, w[1], m));
    _mm256_store_ps(out + 16, _mm256_fmadd_ps(d, w[2], m));
    _mm256_store_ps(out + 24, _mm256_fmadd_ps(d, w[3], m));
}

static inline void dequant_block_q8_0(const uint8_t *blk, float *out)
{
    __m256 w[4];
    widen_q8(blk + 2, w);
    store_block(out, _mm256_set1_ps(load_f16(blk)), _mm256_setzero_ps(), w);
}

static inline void dequant_block_q4_0(const uint8_t *blk, float *out)
{
    __m256 w[4];
    widen_q4_0_top(blk + 2, w);
    store_block(out, _mm256_set1_ps(load_f16(blk) * 0x1p-28f), _mm256_setzero_ps(), w);
}

static inline void dequant_block_q4_1(const uint8_t *blk, float *out)
{
    __m256 w[4];
    widen_q4(blk + 4, 0, w);
    __m256 d = _mm256_set1_ps(load_f16(blk)), m = _mm256_set1_ps(load_f16(blk + 2));
    store_block(out, d, m, w);
}

WPI_DEQUANT_QUANT(dequant_q8_0, dequant_block_q8_0, 34)
WPI_DEQUANT_QUANT(dequant_q4_0, dequant_block_q4_0, 18)
static inline void dequant_block_mxfp4(const uint8_t *blk, float *out)
{
    __m256 w[4];
    widen_mxfp4(blk, w);
    for (int k = 0; k < 4; k++)
        _mm256_store_ps(out + 8 * k, w[k]);
}

WPI_DEQUANT_QUANT(dequant_q4_1, dequant_block_q4_1, 20)
WPI_DEQUANT_QUANT(dequant_mxfp4, dequant_block_mxfp4, WPI_MXFP4_BYTES)

/*
 * The tile: sums of w_i[0..n) * x_t[0..n) for 2 rows x 4 tokens, one accumulator per
 * (row, token): 8 independent FMA chains, 6 loads per 8 FMAs. Every (row, token) sum is
 * formed in the same order whatever its neighbours.
 */
static void tile_2x4(const float *w0, const float *w1, const float *const xt[4], size_t n,
                     float out[2][4])
{
    const float *x0 = xt[0], *x1 = xt[1], *x2 = xt[2], *x3 = xt[3];
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
    __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 u = _mm256_loadu_ps(w0 + i), v = _mm256_loadu_ps(w1 + i), xv;
        xv = _mm256_loadu_ps(x0 + i);
        KEEP_IN_REGISTER(xv);
        a00 = _mm256_fmadd_ps(u, xv, a00);
        a10 = _mm256_fmadd_ps(v, xv, a10);
        xv = _mm256_loadu_ps(x1 + i);
        KEEP_IN_REGISTER(xv);
        a01 = _mm256_fmadd_ps(u, xv, a01);
        a11 = _mm256_fmadd_ps(v, xv, a11);
        xv = _mm256_loadu_ps(x2 + i);
        KEEP_IN_REGISTER(xv);
        a02 = _mm256_fmadd_ps(u, xv, a02);
        a12 = _mm256_fmadd_ps(v, xv, a12);
        xv = _mm256_loadu_ps(x3 + i);
        KEEP_IN_REGISTER(xv);
        a03 = _mm256_fmadd_ps(u, xv, a03);
        a13 = _mm256_fmadd_ps(v, xv, a13);
    }
    if (i < n) {
        __m256i m = tail_mask(n - i);
        __m256 u = _mm256_maskload_ps(w0 + i, m), v = _mm256_maskload_ps(w1 + i, m), xv;
        xv = _mm256_maskload_ps(x0 + i, m);
        a00 = _mm256_fmadd_ps(u, xv, a00);
        a10 = _mm256_fmadd_ps(v, xv, a10);
        xv = _mm256_maskload_ps(x1 + i, m);
        a01 = _mm256_fmadd_ps(u, xv, a01);
        a11 = _mm256_fmadd_ps(v, xv, a11);
        xv = _mm256_maskload_ps(x2 + i, m);
        a02 = _mm256_fmadd_ps(u, xv, a02);
        a12 = _mm256_fmadd_ps(v, xv, a12);
        xv = _mm256_maskload_ps(x3 + i, m);
        a03 = _mm256_fmadd_ps(u, xv, a03);
        a13 = _mm256_fmadd_ps(v, xv, a13);
    }
    out[0][0] = hsum(a00);
    out[0][1] = hsum(a01);
    out[0][2] = hsum(a02);
    out[0][3] = hsum(a03);
    out[1][0] = hsum(a10);
    out[1][1] = hsum(a11);
    out[1][2] = hsum(a12);
    out[1][3] = hsum(a13);
}

WPI_APPLY_TILES(apply_tiles, tile_2x4)

/*
 * The wider tile: 4 rows x 3 tokens, 12 independent FMA chains (enough to keep both FMA
 * pipes busy, where the 2 x 4 tile's 8 are not) and 7 loads per 12 FMAs, in the 16
 * vector registers with the three activation vectors held across the four rows. Each
 * (row, token) sum is one accumulator over j in order, then hsum, exactly as tile_2x4
 * forms it, so the two tiles give the same bits for the same (row, token) and may be
 * mixed in one call. out[t] holds token t's four row sums (hsum4).
 */
static void tile_4x3(const float *const w[4], const float *const xt[3], size_t n,
                     __m128 out[3])
{
    const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
    const float *x0 = xt[0], *x1 = xt[1], *x2 = xt[2];
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00;
    __m256 a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 p = _mm256_loadu_ps(x0 + i), q = _mm256_loadu_ps(x1 + i);
        __m256 r = _mm256_loadu_ps(x2 + i), u;
        KEEP_IN_REGISTER(p);
        KEEP_IN_REGISTER(q);
        KEEP_IN_REGISTER(r);
        u = _mm256_loadu_ps(w0 + i);
        KEEP_IN_REGISTER(u);
        a00 = _mm256_fmadd_ps(u, p, a00);
        a01 = _mm256_fmadd_ps(u, q, a01);
        a02 = _mm256_fmadd_ps(u, r, a02);
        u = _mm256_loadu_ps(w1 + i);
        KEEP_IN_REGISTER(u);
        a10 = _mm256_fmadd_ps(u, p, a10);
        a11 = _mm256_fmadd_ps(u, q, a11);
        a12 = _mm256_fmadd_ps(u, r, a12);
        u = _mm256_loadu_ps(w2 + i);
        KEEP_IN_REGISTER(u);
        a20 = _mm256_fmadd_ps(u, p, a20);
        a21 = _mm256_fmadd_ps(u, q, a21);
        a22 = _mm256_fmadd_ps(u, r, a22);
        u = _mm256_loadu_ps(w3 + i);
        KEEP_IN_REGISTER(u);
        a30 = _mm256_fmadd_ps(u, p, a30);
        a31 = _mm256_fmadd_ps(u, q, a31);
        a32 = _mm256_fmadd_ps(u, r, a32);
    }
    if (i < n) {
        __m256i m = tail_mask(n - i);
        __m256 p = _mm256_maskload_ps(x0 + i, m), q = _mm256_maskload_ps(x1 + i, m);
        __m256 r = _mm256_maskload_ps(x2 + i, m), u;
        u = _mm256_maskload_ps(w0 + i, m);
        a00 = _mm256_fmadd_ps(u, p, a00);
        a01 = _mm256_fmadd_ps(u, q, a01);
        a02 = _mm256_fmadd_ps(u, r, a02);
        u = _mm256_maskload_ps(w1 + i, m);
        a10 = _mm256_fmadd_ps(u, p, a10);
        a11 = _mm256_fmadd_ps(u, q, a11);
        a12 = _mm256_fmadd_ps(u, r, a12);
        u = _mm256_maskload_ps(w2 + i, m);
        a20 = _mm256_fmadd_ps(u, p, a20);
        a21 = _mm256_fmadd_ps(u, q, a21);
        a22 = _mm256_fmadd_ps(u, r, a22);
        u = _mm256_maskload_ps(w3 + i, m);
        a30 = _mm256_fmadd_ps(u, p, a30);
        a31 = _mm256_fmadd_ps(u, q, a31);
        a32 = _mm256_fmadd_ps(u, r, a32);
    }
    out[0] = hsum4(a00, a10, a20, a30);
    out[1] = hsum4(a01, a11, a21, a31);
    out[2] = hsum4(a02, a12, a22, a32);
}

/*
 * The table's apply (a wpi_apply_fn): tokens in groups of 3 through 4 x 3 tiles (a ragged
 * tile repeats a row or token pointer and drops those sums), and when n_tok % 3 == 1 the
 * last 4 tokens through the 2 x 4 tiles instead, so that no group wastes two thirds of
 * its work. Both tiles form a sum alike, so a (row, token) result is the same whichever
 * tile or group it falls in: it depends on nc only.
 */
static void apply_avx2(const float *const wr[], size_t nr, const float *x, size_t ldx,
                       size_t n_tok, size_t nc, float *y, size_t ldy)
{
    size_t n3 = n_tok % 3 == 1 && n_tok >= 4 ? n_tok - 4 : n_tok;
    for (size_t t = 0; t < n3; t += 3) {
        size_t nt = n3 - t < 3 ? n3 - t : 3;
        const float *xt[3];
        for (size_t k = 0; k < 3; k++)
            xt[k] = x + (t + (k < nt ? k : 0)) * ldx;
        for (size_t i = 0; i < nr; i += 4) {
            size_t ni = nr - i < 4 ? nr - i : 4;
            const float *w4[4];
            __m128 s[3];
            for (size_t k = 0; k < 4; k++)
                w4[k] = wr[i + (k < ni ? k : 0)];
            tile_4x3(w4, xt, nc, s);
            for (size_t k = 0; k < nt; k++) {
                float *yk = y + (t + k) * ldy + i;
                if (ni == 4) {
                    _mm_storeu_ps(yk, _mm_add_ps(_mm_loadu_ps(yk), s[k]));
                } else {
                    float v[4];
                    _mm_storeu_ps(v, s[k]);
                    for (size_t r = 0; r < ni; r++)
                        yk[r] += v[r];
                }
            }
        }
    }
    if (n3 < n_tok)
        apply_tiles(wr, nr, x + n3 * ldx, ldx, n_tok - n3, nc, y + n3 * ldy, ldy);
}

/* ---- a few tokens: each block decoded once into registers, applied to each token ---- */

#define UNROLL4 _Pragma("GCC unroll 4")

/* Block b of a row as its 32 final float weights, four vectors (the scale folded in:
 * q4_0's (q - 8) * 2^28 times d * 2^-28 is (q - 8) * d rounded once, as the reference's
 * dequantization; q4_1's d * q + m is one fused rounding where the reference has two). */
static inline void dec_f16(const uint8_t *row, size_t b, __m256 w[4])
{
    const uint16_t *p = (const uint16_t *)row + b * 32;
    UNROLL4 for (int k = 0; k < 4; k++)
        w[k] = load8_f16(p + 8 * k, 8);
}

static inline void dec_bf16(const uint8_t *row, size_t b, __m256 w[4])
{
    const uint16_t *p = (const uint16_t *)row + b * 32;
    UNROLL4 for (int k = 0; k < 4; k++)
        w[k] = load8_bf16(p + 8 * k, 8);
}

static inline void dec_q8_0(const uint8_t *row, size_t b, __m256 w[4])
{
    const uint8_t *blk = row + b * 34;
    widen_q8(blk + 2, w);
    __m256 d = _mm256_set1_ps(load_f16(blk));
    UNROLL4 for (int k = 0; k < 4; k++)
        w[k] = _mm256_mul_ps(w[k], d);
}

static inline void dec_q4_0(const uint8_t *row, size_t b, __m256 w[4])
{
    const uint8_t *blk = row + b * 18;
    widen_q4_0_top(blk + 2, w);
    __m256 d = _mm256_set1_ps(load_f16(blk) * 0x1p-28f);
    UNROLL4 for (int k = 0; k < 4; k++)
        w[k] = _mm256_mul_ps(w[k], d);
}

static inline void dec_q4_1(const uint8_t *row, size_t b, __m256 w[4])
{
    const uint8_t *blk = row + b * 20;
    widen_q4(blk + 4, 0, w);
    __m256 d = _mm256_set1_ps(load_f16(blk)), m = _mm256_set1_ps(load_f16(blk + 2));
    UNROLL4 for (int k = 0; k < 4; k++)
        w[k] = _mm256_fmadd_ps(d, w[k], m);
}

static inline void dec_mxfp4(const uint8_t *row, size_t b, __m256 w[4])
{
    widen_mxfp4(row + b * WPI_MXFP4_BYTES, w);
}

/* The last n < 32 weights of a half-precision row, from column c, zero past n (tails
 * exist only for the float dtypes: quantized rows are whole blocks). */
static inline void tail_f16(const uint8_t *row, size_t c, size_t n, __m256 w[4])
{
    const uint16_t *p = (const uint16_t *)row + c;
    for (size_t k = 0; k < 4; k++)
        w[k] = load8_f16(p + 8 * k, n > 8 * k ? (n - 8 * k > 8 ? 8 : n - 8 * k) : 0);
}

static inline void tail_bf16(const uint8_t *row, size_t c, size_t n, __m256 w[4])
{
    const uint16_t *p = (const uint16_t *)row + c;
    for (size_t k = 0; k < 4; k++)
        w[k] = load8_bf16(p + 8 * k, n > 8 * k ? (n - 8 * k > 8 ? 8 : n - 8 * k) : 0);
}

/* Quantized rows have no tail: never called with n > 0 (floaty = 0 below). */
static inline void tail_none(const uint8_t *row, size_t c, size_t n, __m256 w[4])
{
    for (int k = 0; k < 4; k++)
        w[k] = _mm256_setzero_ps();
}

/*
 * MULTI_T defines name(row, x, ldx, b0, b1, rem, acc): blocks [b0, b1) of one row (and,
 * if rem, the rem weights after block b1 of a float row) against T tokens, added into
 * the row's accumulators acc (A per token, token t's at acc[t * A]). Each block is decoded
 * once (dec) and its four vectors are FMA'd into the token's accumulators, vector k into
 * accumulator k % A, with A chosen so that T * A independent chains keep both FMA pipes
 * busy. The accumulators live in memory between calls, so splitting the columns into
 * chunks never changes a sum.
 */
#define MULTI_T(name, dec, tail, floaty, T, A)                                           \
    static void name(const uint8_t *row, const float *x, size_t ldx, size_t b0,         \
                     size_t b1, size_t rem, __m256 *acc_io)                             \
    {                                                                                   \
        __m256 acc[T][A];                                                               \
        const float *xp[T];                                                             \
        for (int t = 0; t < T; t++) {                                                   \
            xp[t] = x + t * ldx;                                                        \
            for (int a = 0; a < A; a++)                                                 \
                acc[t][a] = acc_io[t * A + a];                                          \
        }                                                                               \
        size_t n = b1 - b0;                                                             \
        for (size_t j = 0; j < n; j++) {                                                \
            __m256 w[4];                                                                \
            dec(row, b0 + j, w);                                                        \
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)                         \
                _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++)                     \
                    acc[t][k % A] = _mm256_fmadd_ps(                                    \
                        w[k], _mm256_loadu_ps(xp[t] + j * 32 + 8 * k), acc[t][k % A]);  \
        }                                                                               \
        if (floaty && rem) {                                                            \
            __m256 w[4];                                                                \
            __m256i m[4];                                                               \
            tail(row, b1 * 32, rem, w);                                                 \
            for (size_t k = 0; k < 4; k++)                                              \
                m[k] = tail_mask(rem > 8 * k ? (rem - 8 * k > 8 ? 8 : rem - 8 * k) : 0); \
            for (int t = 0; t < T; t++)                                                 \
                for (int k = 0; k < 4; k++)                                             \
                    acc[t][k % A] = _mm256_fmadd_ps(                                    \
                        w[k], _mm256_maskload_ps(xp[t] + n * 32 + 8 * k, m[k]),         \
                        acc[t][k % A]);                                                 \
        }                                                                               \
        for (int t = 0; t < T; t++)                                                     \
            for (int a = 0; a < A; a++)                                                 \
                acc_io[t * A + a] = acc[t][a];                                          \
    }

typedef void (*multi_row_fn)(const uint8_t *row, const float *x, size_t ldx, size_t b0,
                             size_t b1, size_t rem, __m256 *acc);

/* Accumulators per token of the T-token kernel (index T); T * A <= MULTI_ACC. The
 * chains, not the FMA pipes, bound these kernels: 3 and 4 tokens with one accumulator
 * each cost 1.3x to 1.6x their two-accumulator time, and 5 tokens with two cost 0.8x
 * their one-accumulator time (q4_0 and q8_0, AMD EPYC Zen 2); 6 with two (12 of the 16
 * registers) were no faster. Blocking two rows per call (each activation vector loaded
 * once for both rows' FMAs) was slower at every token count there: GCC spilled the
 * accumulators of the 2 x 4 kernel. */
static const int multi_acc[WPI_MULTI_TOK + 1] = {0, 4, 4, 2, 2, 2, 1, 1, 1};
#define MULTI_ACC 10
WPI_MULTI_ROWS(multi_rows, multi_row_fn, __m256, _mm256_setzero_ps(), _mm256_add_ps, hsum,
               multi_acc, MULTI_ACC)

/* The multi kernel of a dtype (a wpi_rows_multi_fn), with its T-token kernels. */
#define MULTI_DTYPE(sfx, tail, floaty)                                                  \
    MULTI_T(multi1_##sfx, dec_##sfx, tail, floaty, 1, 4)                                \
    MULTI_T(multi2_##sfx, dec_##sfx, tail, floaty, 2, 4)                                \
    MULTI_T(multi3_##sfx, dec_##sfx, tail, floaty, 3, 2)                                \
    MULTI_T(multi4_##sfx, dec_##sfx, tail, floaty, 4, 2)                                \
    MULTI_T(multi5_##sfx, dec_##sfx, tail, floaty, 5, 2)                                \
    MULTI_T(multi6_##sfx, dec_##sfx, tail, floaty, 6, 1)                                \
    MULTI_T(multi7_##sfx, dec_##sfx, tail, floaty, 7, 1)                                \
    MULTI_T(multi8_##sfx, dec_##sfx, tail, floaty, 8, 1)                                \
    WPI_MULTI_ENTRY(sfx, multi_row_fn, multi_rows)

MULTI_DTYPE(f16, tail_f16, 1)
MULTI_DTYPE(bf16, tail_bf16, 1)
MULTI_DTYPE(q8_0, tail_none, 0)
MULTI_DTYPE(q4_0, tail_none, 0)
MULTI_DTYPE(q4_1, tail_none, 0)
MULTI_DTYPE(mxfp4, tail_none, 0)

/* None for f32: its rows are read in place by the tiled path, whose 2 x 4 tile needs 6
 * loads per 8 FMAs against 1 per FMA here, with nothing to decode (4 tokens cost 1.9
 * single-token calls there, 2.4 here, on 64 rows in cache, AMD EPYC Zen 2). */
static const wpi_rows_multi_fn multi_avx2[WPI_SLOTS] = {
    [WPI_SLOT_F16] = multi_f16, [WPI_SLOT_BF16] = multi_bf16,
    [WPI_SLOT_Q8_0] = multi_q8_0, [WPI_SLOT_Q4_0] = multi_q4_0, [WPI_SLOT_Q4_1] = multi_q4_1,
    [WPI_SLOT_MXFP4] = multi_mxfp4,
};

#if defined(__clang__)
#pragma clang attribute pop
#endif

/* The most tokens this table sends to the multi kernels. From 6 tokens on the tiled
 * path with its 4 x 3 tile was faster for every dtype with a multi kernel: 6 tokens
 * took 0.79x-0.93x the multi kernels' time, 8 tokens 0.87x-0.92x on q4_0 and q8_0 and
 * 0.93x-1.04x on q4_1, mxfp4 and f16; bf16 alone was slower at 7-8 (1.05x-1.25x). AMD
 * EPYC Zen 2, benchmarks/kernels.c --ntok, two alternated runs. */
#define AVX2_MULTI_MAX 5

const wpi_blocks wpi_blocks_avx2 = {
    .name = "avx2",
    .chunk = WPI_CHUNK_MAX,
    .row_dot = {
        [WPI_SLOT_F32] = row_f32, [WPI_SLOT_F16] = row_f16, [WPI_SLOT_BF16] = row_bf16,
        [WPI_SLOT_Q8_0] = row_q8_0, [WPI_SLOT_Q4_0] = row_q4_0, [WPI_SLOT_Q4_1] = row_q4_1,
        [WPI_SLOT_MXFP4] = row_mxfp4,
    },
    .rows_dot = {[WPI_SLOT_Q4_1] = rows_q4_1},
    .dequant = {
        [WPI_SLOT_F16] = dequant_f16, [WPI_SLOT_BF16] = dequant_bf16,
        [WPI_SLOT_Q8_0] = dequant_q8_0, [WPI_SLOT_Q4_0] = dequant_q4_0,
        [WPI_SLOT_Q4_1] = dequant_q4_1, [WPI_SLOT_MXFP4] = dequant_mxfp4,
    },
    .apply = apply_avx2,
    .multi = multi_avx2,
    .multi_max = WPI_EACH_SLOT(AVX2_MULTI_MAX),
    .dot_f32 = dot_f32_avx2,
    .axpy_f32 = axpy_f32_avx2,
};

#endif /* __x86_64__ */

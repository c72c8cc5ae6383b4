/*
 * kernels_avx2.c -- AVX2 + FMA + F16C variants of the matmul, dot and axpy kernels.
 *
 * Compiled with plain flags: the target pragma below enables the instruction sets for
 * this file only, and dispatch.c calls into it only when the CPU has them.
 *
 * Two matmul paths, both with float32 activations (weights are never requantized, nor
 * are activations):
 *   n_tok == 1 (decode): per row, each 32-weight block is widened to float in registers
 *     (int8/nibbles -> int32 -> float), dotted with x, scaled by the block's d and added
 *     to one of two accumulators (even and odd blocks).
 *   n_tok >= 2 (prefill): a tile of up to TILE_ROWS rows is dequantized CHUNK columns
 *     at a time into a stack buffer, then every token is applied to it, 2 rows x 4
 *     tokens per register tile, so each weight is decoded once per call.
 * Each row's arithmetic is the same whatever row range it sits in, so splitting rows
 * across threads never changes a result.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"

#if defined(__x86_64__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#include <immintrin.h>

#define CHUNK 512    /* columns dequantized at a time: 2 KiB of floats per row */
#define TILE_ROWS 8  /* rows sharing one pass over the tokens' x chunk */

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

/* ---- n_tok == 1: one row against one x, straight from the stored weights --------- */

static float row_f16(const uint16_t *w, const float *x, size_t n)
{
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

static float row_bf16(const uint16_t *w, const float *x, size_t n)
{
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

/* Even blocks into one accumulator, odd into another: two independent add chains. */
#define ROW_QUANT(name, block_fn, bytes)                                                 \
    static float name(const uint8_t *row, const float *x, size_t nb)                     \
    {                                                                                    \
        __m256 e = _mm256_setzero_ps(), o = e;                                           \
        size_t b = 0;                                                                    \
        for (; b + 2 <= nb; b += 2) {                                                    \
            e = block_fn(row + b * (bytes), x + b * 32, e);                              \
            o = block_fn(row + (b + 1) * (bytes), x + (b + 1) * 32, o);                  \
        }                                                                                \
        if (b < nb)                                                                      \
            e = block_fn(row + b * (bytes), x + b * 32, e);                              \
        return hsum(_mm256_add_ps(e, o));                                                \
    }

ROW_QUANT(row_q8_0, block_q8_0, 34)
ROW_QUANT(row_q4_0, block_q4_0, 18)
ROW_QUANT(row_q4_1, block_q4_1, 20)

static void matvec(int dtype, const void *w, size_t cols, size_t r0, size_t r1,
                   const float *x, float *y)
{
    size_t rb = wpi_row_bytes(dtype, cols);
    if (dtype == WPI_Q4_1 && cols / 32 <= XSUM_BLOCKS && r1 > r0 + 1) {
        __m256 sx[XSUM_BLOCKS];
        for (size_t b = 0; b < cols / 32; b++) sx[b] = block_xsum(x + b * 32);
        for (size_t r = r0; r < r1; r++)
            y[r] = row_q4_1_sx((const uint8_t *)w + r * rb, x, sx, cols / 32);
        return;
    }
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w + r * rb;
        switch (dtype) {
        case WPI_F32: y[r] = dot_f32_avx2((const float *)row, x, cols); break;
        case WPI_F16: y[r] = row_f16((const uint16_t *)row, x, cols); break;
        case WPI_BF16: y[r] = row_bf16((const uint16_t *)row, x, cols); break;
        case WPI_Q8_0: y[r] = row_q8_0(row, x, cols / 32); break;
        case WPI_Q4_0: y[r] = row_q4_0(row, x, cols / 32); break;
        case WPI_Q4_1: y[r] = row_q4_1(row, x, cols / 32); break;
        default: break;
        }
    }
}

/* ---- n_tok >= 2: dequantize a chunk once, apply it to every token ----------------- */

/* Columns [c, c + n) of a row as floats into out (n <= CHUNK; quantized: c, n % 32 == 0). */
static void dequant_chunk(int dtype, const uint8_t *row, size_t c, size_t n, float *out)
{
    switch (dtype) {
    case WPI_F16:
    case WPI_BF16: {
        const uint16_t *h = (const uint16_t *)row + c;
        for (size_t i = 0; i < n; i += 8) {
            size_t k = n - i < 8 ? n - i : 8;
            __m256 v = dtype == WPI_F16 ? load8_f16(h + i, k) : load8_bf16(h + i, k);
            _mm256_store_ps(out + i, v); /* out has room for a whole last vector */
        }
        return;
    }
    case WPI_Q8_0:
    case WPI_Q4_0:
    case WPI_Q4_1:
        for (size_t i = 0; i < n; i += 32) {
            size_t b = (c + i) / 32;
            __m256 w[4];
            __m256 d, m = _mm256_setzero_ps();
            if (dtype == WPI_Q8_0) {
                widen_q8(row + b * 34 + 2, w);
                d = _mm256_set1_ps(load_f16(row + b * 34));
            } else if (dtype == WPI_Q4_0) {
                widen_q4_0_top(row + b * 18 + 2, w);
                d = _mm256_set1_ps(load_f16(row + b * 18) * 0x1p-28f);
            } else {
                widen_q4(row + b * 20 + 4, 0, w);
                d = _mm256_set1_ps(load_f16(row + b * 20));
                m = _mm256_set1_ps(load_f16(row + b * 20 + 2));
            }
            _mm256_store_ps(out + i, _mm256_fmadd_ps(d, w[0], m));
            _mm256_store_ps(out + i + 8, _mm256_fmadd_ps(d, w[1], m));
            _mm256_store_ps(out + i + 16, _mm256_fmadd_ps(d, w[2], m));
            _mm256_store_ps(out + i + 24, _mm256_fmadd_ps(d, w[3], m));
        }
        return;
    default:
        return;
    }
}

/*
 * The micro-kernel: sums of w_i[0..n) * x_t[0..n) for 2 rows x 4 tokens, one
 * accumulator per (row, token): 8 independent FMA chains, 6 loads per 8 FMAs. Callers
 * fill a ragged tile by repeating a row or token pointer and dropping those sums; every
 * (row, token) sum is formed in the same order whatever its neighbours, so results
 * never depend on how rows or tokens were grouped.
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

static void matmul_tiled(int dtype, const void *w, size_t cols, size_t r0, size_t r1,
                         const float *x, size_t ldx, size_t n_tok, float *y, size_t ldy)
{
    _Alignas(32) float buf[TILE_ROWS][CHUNK];
    size_t rb = wpi_row_bytes(dtype, cols);
    for (size_t rt = r0; rt < r1; rt += TILE_ROWS) {
        size_t nr = r1 - rt < TILE_ROWS ? r1 - rt : TILE_ROWS;
        for (size_t t = 0; t < n_tok; t++)
            for (size_t i = 0; i < nr; i++)
                y[t * ldy + rt + i] = 0.0f;
        for (size_t c = 0; c < cols; c += CHUNK) {
            size_t nc = cols - c < CHUNK ? cols - c : CHUNK;
            const float *wr[TILE_ROWS];
            for (size_t i = 0; i < nr; i++) {
                const uint8_t *row = (const uint8_t *)w + (rt + i) * rb;
                if (dtype == WPI_F32) {
                    wr[i] = (const float *)row + c;
                } else {
                    dequant_chunk(dtype, row, c, nc, buf[i]);
                    wr[i] = buf[i];
                }
            }
            for (size_t t = 0; t < n_tok; t += 4) {
                size_t nt = n_tok - t < 4 ? n_tok - t : 4;
                const float *xt[4];
                for (size_t k = 0; k < 4; k++)
                    xt[k] = x + (t + (k < nt ? k : 0)) * ldx + c;
                for (size_t i = 0; i < nr; i += 2) {
                    float s[2][4];
                    size_t i1 = i + 1 < nr ? i + 1 : i;
                    tile_2x4(wr[i], wr[i1], xt, nc, s);
                    for (size_t k = 0; k < nt; k++) {
                        y[(t + k) * ldy + rt + i] += s[0][k];
                        if (i1 != i)
                            y[(t + k) * ldy + rt + i1] += s[1][k];
                    }
                }
            }
        }
    }
}

static void matmul_any(int dtype, const void *w, size_t cols, size_t r0, size_t r1,
                       const float *x, size_t ldx, size_t n_tok, float *y, size_t ldy)
{
    if (wpi_row_bytes(dtype, cols) == 0 && cols != 0)
        return;
    if (n_tok == 1)
        matvec(dtype, w, cols, r0, r1, x, y);
    else
        matmul_tiled(dtype, w, cols, r0, r1, x, ldx, n_tok, y, ldy);
}

#define AVX2_MATMUL(name, dtype)                                                         \
    static void name(const void *w, size_t cols, size_t r0, size_t r1, const float *x,  \
                     size_t ldx, size_t n_tok, float *y, size_t ldy)                      \
    {                                                                                    \
        matmul_any(dtype, w, cols, r0, r1, x, ldx, n_tok, y, ldy);                      \
    }

AVX2_MATMUL(matmul_f32_avx2, WPI_F32)
AVX2_MATMUL(matmul_f16_avx2, WPI_F16)
AVX2_MATMUL(matmul_bf16_avx2, WPI_BF16)
AVX2_MATMUL(matmul_q8_0_avx2, WPI_Q8_0)
AVX2_MATMUL(matmul_q4_0_avx2, WPI_Q4_0)
AVX2_MATMUL(matmul_q4_1_avx2, WPI_Q4_1)

#if defined(__clang__)
#pragma clang attribute pop
#endif

const wpi_kernels wpi_kernels_avx2 = {
    .name = "avx2",
    .matmul_f32 = matmul_f32_avx2,
    .matmul_f16 = matmul_f16_avx2,
    .matmul_bf16 = matmul_bf16_avx2,
    .matmul_q8_0 = matmul_q8_0_avx2,
    .matmul_q4_0 = matmul_q4_0_avx2,
    .matmul_q4_1 = matmul_q4_1_avx2,
    .dot_f32 = dot_f32_avx2,
    .axpy_f32 = axpy_f32_avx2,
};

#endif /* __x86_64__ */

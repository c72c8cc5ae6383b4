/*
 * kernels_avx512.c -- AVX-512 (F, BW, VL) block kernels for the matmul, and dot and axpy.
 *
 * The same kinds of block kernel as kernels_avx2.c, for matmul.c's driver (blocks.h),
 * 16 lanes wide with mask registers for tails. For one token a 32-weight block is two
 * vectors (q4: low nibbles = weights 0..15, high = 16..31), dotted with x, scaled by d
 * and added to an even or odd accumulator; for a few, a multi kernel per dtype but f32
 * (each block decoded once into two registers and FMA'd against 1..8 tokens); for many,
 * a chunk dequantizer per dtype and tiles of 4 rows x 1..4 tokens using 32 registers.
 * Activations stay float32, so VNNI (int8 dot products) has nothing to do here.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/blocks.h"

#if defined(__x86_64__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#endif

#include <immintrin.h>

/* Keeps a loaded vector in a register, so it is not reloaded by each FMA that uses it
 * (as kernels_avx2.c, where that cost 1.1x to 1.4x in prefill). */
#if defined(__GNUC__)
#define KEEP_IN_REGISTER(v) __asm__("" : "+v"(v))
#else
#define KEEP_IN_REGISTER(v) ((void)0)
#endif

/* Fully unrolls a loop over the registers of a tile (GCC does not at -O2, and the tile's
 * accumulators then live in memory). */
#define UNROLL4 _Pragma("GCC unroll 4")

/* ---- helpers --------------------------------------------------------------------- */

/* Lanes [0, n) set, n in 0..16. */
static inline __mmask16 tail_mask(size_t n)
{
    return (__mmask16)((1u << n) - 1u);
}

static inline float load_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* A block's float16 scale in every lane: broadcast as a half and widened (fewer shuffles
 * than widening one half and broadcasting the float). */
static inline __m512 bcast_f16(const uint8_t *p)
{
    int16_t h;
    memcpy(&h, p, 2);
    return _mm512_cvtph_ps(_mm256_set1_epi16(h));
}

/* 16 halves at p as floats; n < 16 reads only n of them, the rest are 0. */
static inline __m512 load16_f16(const uint16_t *p, size_t n)
{
    __m256i h = n >= 16 ? _mm256_loadu_si256((const __m256i *)p)
                        : _mm256_maskz_loadu_epi16(tail_mask(n), p);
    return _mm512_cvtph_ps(h);
}

static inline __m512 load16_bf16(const uint16_t *p, size_t n)
{
    __m256i h = n >= 16 ? _mm256_loadu_si256((const __m256i *)p)
                        : _mm256_maskz_loadu_epi16(tail_mask(n), p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The 32 signed int8 weights of a q8_0 block as two float vectors. */
static inline void widen_q8(const uint8_t *q, __m512 *w0, __m512 *w1)
{
    *w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)));
    *w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16))));
}

/* The 32 nibbles of a q4 block minus bias: w0 = low nibbles (weights 0..15), w1 = high. */
static inline void widen_q4(const uint8_t *q, int bias, __m512 *w0, __m512 *w1)
{
    const __m128i m4 = _mm_set1_epi8(15), b = _mm_set1_epi8((char)bias);
    __m128i raw = _mm_loadu_si128((const __m128i *)q);
    __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, m4), b);
    __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), b);
    *w0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo));
    *w1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi));
}

/* The 32 weights of an mxfp4 block (blocks.h): w0 = weights 0..15 (low nibbles), w1 =
 * 16..31, each code's doubled value from a byte table, widened and times half the scale. */
static inline void widen_mxfp4(const uint8_t *blk, __m512 *w0, __m512 *w1)
{
    const __m128i lut = _mm_setr_epi8(WPI_MXFP4_X2), m4 = _mm_set1_epi8(15);
    __m128i raw = _mm_loadu_si128((const __m128i *)(blk + 1));
    __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(raw, m4));
    __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(raw, 4), m4));
    __m512 dh = _mm512_set1_ps(wpi_e8m0_half(blk[0]));
    *w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), dh);
    *w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi)), dh);
}

static inline __m512 block_dot(__m512 w0, __m512 w1, const float *x)
{
    return _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + 16), _mm512_mul_ps(w0, _mm512_loadu_ps(x)));
}

/* ---- dot, axpy ------------------------------------------------------------------- */

static float dot_f32_avx512(const float *a, const float *b, size_t n)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16)
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

static void axpy_f32_avx512(float a, const float *x, float *y, size_t n)
{
    __m512 va = _mm512_set1_ps(a);
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(va, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m512 v = _mm512_fmadd_ps(va, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

/* ---- one token: one row against one x, straight from the stored weights --------- */

static float row_f32(const uint8_t *row, const float *x, size_t n)
{
    return dot_f32_avx512((const float *)row, x, n);
}

static inline float row_half(const uint16_t *w, const float *x, size_t n, int bf16)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 w0 = bf16 ? load16_bf16(w + i, 16) : load16_f16(w + i, 16);
        __m512 w1 = bf16 ? load16_bf16(w + i + 16, 16) : load16_f16(w + i + 16, 16);
        s0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + i), s0);
        s1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + i + 16), s1);
    }
    for (; i < n; i += 16) {
        size_t k = n - i < 16 ? n - i : 16;
        __m512 wv = bf16 ? load16_bf16(w + i, k) : load16_f16(w + i, k);
        s0 = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(tail_mask(k), x + i), s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

static inline __m512 block_q8_0(const uint8_t *blk, const float *x, __m512 acc)
{
    __m512 w0, w1;
    widen_q8(blk + 2, &w0, &w1);
    return _mm512_fmadd_ps(_mm512_set1_ps(load_f16(blk)), block_dot(w0, w1, x), acc);
}

static inline __m512 block_q4_0(const uint8_t *blk, const float *x, __m512 acc)
{
    __m512 w0, w1;
    widen_q4(blk + 2, 8, &w0, &w1);
    return _mm512_fmadd_ps(_mm512_set1_ps(load_f16(blk)), block_dot(w0, w1, x), acc);
}

/* q4_1 weights are d*q + m, so a block adds d*sum(q*x) + m*sum(x). */
static inline __m512 block_q4_1(const uint8_t *blk, const float *x, __m512 acc)
{
    __m512 w0, w1;
    widen_q4(blk + 4, 0, &w0, &w1);
    __m512 sx = _mm512_add_ps(_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16));
    acc = _mm512_fmadd_ps(_mm512_set1_ps(load_f16(blk + 2)), sx, acc);
    return _mm512_fmadd_ps(_mm512_set1_ps(load_f16(blk)), block_dot(w0, w1, x), acc);
}

/* acc + one mxfp4 block's sum(w*x), the weights already scaled. */
static inline __m512 block_mxfp4(const uint8_t *blk, const float *x, __m512 acc)
{
    __m512 w0, w1;
    widen_mxfp4(blk, &w0, &w1);
    return _mm512_add_ps(acc, block_dot(w0, w1, x));
}

/* blocks.h's even/odd row loop over this file's vectors. */
#define ROW_QUANT(name, block_fn, bytes) \
    WPI_ROW_QUANT(name, block_fn, bytes, __m512, _mm512_setzero_ps(), _mm512_add_ps,    \
                  _mm512_reduce_add_ps)

ROW_QUANT(row_q8_0, block_q8_0, 34)
ROW_QUANT(row_q4_0, block_q4_0, 18)
ROW_QUANT(row_q4_1, block_q4_1, 20)
ROW_QUANT(row_mxfp4, block_mxfp4, WPI_MXFP4_BYTES)

static float row_f16(const uint8_t *row, const float *x, size_t n)
{
    return row_half((const uint16_t *)row, x, n, 0);
}

static float row_bf16(const uint8_t *row, const float *x, size_t n)
{
    return row_half((const uint16_t *)row, x, n, 1);
}

/* ---- several tokens: dequantize a chunk once, apply it to every token ------------- */

/* Half-precision columns [c, c + n) as floats; out has room for a whole last vector. */
static void dequant_f16(const uint8_t *row, size_t c, size_t n, float *out)
{
    const uint16_t *h = (const uint16_t *)row + c;
    for (size_t i = 0; i < n; i += 16)
        _mm512_store_ps(out + i, load16_f16(h + i, n - i < 16 ? n - i : 16));
}

static void dequant_bf16(const uint8_t *row, size_t c, size_t n, float *out)
{
    const uint16_t *h = (const uint16_t *)row + c;
    for (size_t i = 0; i < n; i += 16)
        _mm512_store_ps(out + i, load16_bf16(h + i, n - i < 16 ? n - i : 16));
}

/* d * w + m for the two vectors of a block, at out; then one block of each dtype. */
static inline void store_block(float *out, __m512 d, __m512 m, __m512 w0, __m512 w1)
{
    _mm512_store_ps(out, _mm512_fmadd_ps(d, w0, m));
    _mm512_store_ps(out + 16, _mm512_fmadd_ps(d, w1, m));
}

static inline void dequant_block_q8_0(const uint8_t *blk, float *out)
{
    __m512 w0, w1;
    widen_q8(blk + 2, &w0, &w1);
    store_block(out, bcast_f16(blk), _mm512_setzero_ps(), w0, w1);
}

static inline void dequant_block_q4_0(const uint8_t *blk, float *out)
{
    __m512 w0, w1;
    widen_q4(blk + 2, 8, &w0, &w1);
    store_block(out, bcast_f16(blk), _mm512_setzero_ps(), w0, w1);
}

static inline void dequant_block_q4_1(const uint8_t *blk, float *out)
{
    __m512 w0, w1;
    widen_q4(blk + 4, 0, &w0, &w1);
    __m512 d = _mm512_set1_ps(load_f16(blk)), m = _mm512_set1_ps(load_f16(blk + 2));
    store_block(out, d, m, w0, w1);
}

WPI_DEQUANT_QUANT(dequant_q8_0, dequant_block_q8_0, 34)
WPI_DEQUANT_QUANT(dequant_q4_0, dequant_block_q4_0, 18)
static inline void dequant_block_mxfp4(const uint8_t *blk, float *out)
{
    __m512 w0, w1;
    widen_mxfp4(blk, &w0, &w1);
    _mm512_store_ps(out, w0);
    _mm512_store_ps(out + 16, w1);
}

WPI_DEQUANT_QUANT(dequant_q4_1, dequant_block_q4_1, 20)
WPI_DEQUANT_QUANT(dequant_mxfp4, dequant_block_mxfp4, WPI_MXFP4_BYTES)

/* ---- lane sums: one order for every tile -------------------------------------- */

/* The upper 256 bits of v (AVX-512F: no DQ needed). */
static inline __m256 upper_half(__m512 v)
{
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

/* The lane sum of v: the two 256-bit halves added, then the two 128-bit halves, then
 * lanes 0 + 2 and 1 + 3, then those two. */
static inline float hsum(__m512 v)
{
    __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), upper_half(v));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* hsum of v[0..3] into lanes 0..3, each sum formed in hsum's order, so the same bits
 * as four hsum calls with the shuffles shared. */
static inline __m128 hsum4(const __m512 v[4])
{
    __m128 s[4];
    UNROLL4 for (int k = 0; k < 4; k++) {
        __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v[k]), upper_half(v[k]));
        s[k] = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    }
    /* [s0[0] + s0[2], s1[0] + s1[2], s0[1] + s0[3], s1[1] + s1[3]], and for s2, s3 */
    __m128 u01 = _mm_add_ps(_mm_unpacklo_ps(s[0], s[1]), _mm_unpackhi_ps(s[0], s[1]));
    __m128 u23 = _mm_add_ps(_mm_unpacklo_ps(s[2], s[3]), _mm_unpackhi_ps(s[2], s[3]));
    return _mm_add_ps(_mm_movelh_ps(u01, u23), _mm_movehl_ps(u23, u01));
}

/* ---- many tokens: tiles of 4 rows x 1..4 tokens over dequantized (or f32) rows ---- */

/*
 * Sums of w_r[0..n) * x_t[0..n) for 4 rows x nt tokens (nt a constant 1..4 in each
 * caller) into out[t] (lane r): one accumulator per (row, token) over j in order, then
 * hsum's order, so a sum depends on n only, never on the other rows, the other tokens or
 * nt, and a ragged tile may repeat a row pointer. At nt = 4: 16 independent FMA chains
 * and 8 loads per 16 FMAs, in 21 of the 32 vector registers (the 2 x 4 tile it replaced
 * needed 6 loads per 8 FMAs and a whole lane sum per (row, token), where this one shares
 * the shuffles of four).
 */
static inline __attribute__((always_inline)) void
tile_4xn(const float *const w[4], const float *const xt[4], size_t n, __m128 out[4],
         const int nt)
{
    __m512 a[4][4];
    UNROLL4 for (int r = 0; r < 4; r++)
        UNROLL4 for (int t = 0; t < nt; t++)
            a[r][t] = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 xv[4];
        UNROLL4 for (int t = 0; t < nt; t++) {
            xv[t] = _mm512_loadu_ps(xt[t] + i);
            KEEP_IN_REGISTER(xv[t]);
        }
        UNROLL4 for (int r = 0; r < 4; r++) {
            __m512 u = _mm512_loadu_ps(w[r] + i);
            UNROLL4 for (int t = 0; t < nt; t++)
                a[r][t] = _mm512_fmadd_ps(u, xv[t], a[r][t]);
        }
    }
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m512 xv[4];
        UNROLL4 for (int t = 0; t < nt; t++)
            xv[t] = _mm512_maskz_loadu_ps(m, xt[t] + i);
        UNROLL4 for (int r = 0; r < 4; r++) {
            __m512 u = _mm512_maskz_loadu_ps(m, w[r] + i);
            UNROLL4 for (int t = 0; t < nt; t++)
                a[r][t] = _mm512_fmadd_ps(u, xv[t], a[r][t]);
        }
    }
    UNROLL4 for (int t = 0; t < nt; t++) {
        __m512 col[4] = {a[0][t], a[1][t], a[2][t], a[3][t]};
        out[t] = hsum4(col);
    }
}

typedef void (*tile_fn)(const float *const w[4], const float *const xt[4], size_t n,
                        __m128 out[4]);

#define TILE_4XN(nt)                                                                     \
    static void tile_4x##nt(const float *const w[4], const float *const xt[4], size_t n, \
                            __m128 out[4])                                               \
    {                                                                                    \
        tile_4xn(w, xt, n, out, nt);                                                     \
    }
TILE_4XN(1)
TILE_4XN(2)
TILE_4XN(3)
TILE_4XN(4)

/* The table's apply (a wpi_apply_fn): tokens 4 at a time, the last 1..3 through the
 * tile of that width, rows 4 at a time (a ragged row tile repeats its first row pointer
 * and drops those sums). Every tile forms a sum alike, so a (row, token) result depends
 * on nc only. */
static void apply_4x4(const float *const wr[], size_t nr, const float *x, size_t ldx,
                      size_t n_tok, size_t nc, float *y, size_t ldy)
{
    static const tile_fn tiles[5] = {NULL, tile_4x1, tile_4x2, tile_4x3, tile_4x4};
    for (size_t t = 0; t < n_tok; t += 4) {
        size_t nt = n_tok - t < 4 ? n_tok - t : 4;
        const float *xt[4];
        for (size_t k = 0; k < nt; k++)
            xt[k] = x + (t + k) * ldx;
        for (size_t i = 0; i < nr; i += 4) {
            size_t ni = nr - i < 4 ? nr - i : 4;
            const float *w4[4];
            __m128 s[4];
            for (size_t k = 0; k < 4; k++)
                w4[k] = wr[i + (k < ni ? k : 0)];
            tiles[nt](w4, xt, nc, s);
            __mmask8 m = (__mmask8)((1u << ni) - 1u);
            for (size_t k = 0; k < nt; k++) {
                float *yk = y + (t + k) * ldy + i;
                _mm_mask_storeu_ps(yk, m, _mm_add_ps(_mm_maskz_loadu_ps(m, yk), s[k]));
            }
        }
    }
}

/* ---- a few tokens: each block decoded once into registers, applied to each token ---- */

/* Block b of a row as its 32 final float weights, two vectors (weights 0..15, 16..31).
 * The quantized ones fold the scale in (one rounding of q * d, as the reference's
 * dequantization; q4_1's d * q + m is one fused rounding where the reference has two). */
static inline void dec_f16(const uint8_t *row, size_t b, __m512 w[2])
{
    const uint16_t *p = (const uint16_t *)row + b * 32;
    w[0] = load16_f16(p, 16);
    w[1] = load16_f16(p + 16, 16);
}

static inline void dec_bf16(const uint8_t *row, size_t b, __m512 w[2])
{
    const uint16_t *p = (const uint16_t *)row + b * 32;
    w[0] = load16_bf16(p, 16);
    w[1] = load16_bf16(p + 16, 16);
}

static inline void dec_q8_0(const uint8_t *row, size_t b, __m512 w[2])
{
    const uint8_t *blk = row + b * 34;
    __m512 d = bcast_f16(blk);
    widen_q8(blk + 2, &w[0], &w[1]);
    w[0] = _mm512_mul_ps(w[0], d);
    w[1] = _mm512_mul_ps(w[1], d);
}

static inline void dec_q4_0(const uint8_t *row, size_t b, __m512 w[2])
{
    const uint8_t *blk = row + b * 18;
    __m512 d = bcast_f16(blk);
    widen_q4(blk + 2, 8, &w[0], &w[1]);
    w[0] = _mm512_mul_ps(w[0], d);
    w[1] = _mm512_mul_ps(w[1], d);
}

static inline void dec_q4_1(const uint8_t *row, size_t b, __m512 w[2])
{
    const uint8_t *blk = row + b * 20;
    __m512 d = _mm512_set1_ps(load_f16(blk)), m = _mm512_set1_ps(load_f16(blk + 2));
    widen_q4(blk + 4, 0, &w[0], &w[1]);
    w[0] = _mm512_fmadd_ps(d, w[0], m);
    w[1] = _mm512_fmadd_ps(d, w[1], m);
}

static inline void dec_mxfp4(const uint8_t *row, size_t b, __m512 w[2])
{
    widen_mxfp4(row + b * WPI_MXFP4_BYTES, &w[0], &w[1]);
}

/* The last n < 32 weights of a half-precision row from column c, zero past n (quantized
 * rows are whole blocks: their kernels never take this branch). */
static inline void tail_row(int slot, const uint8_t *row, size_t c, size_t n, __m512 w[2])
{
    size_t n0 = n < 16 ? n : 16, n1 = n - n0;
    if (slot == WPI_SLOT_F16) {
        w[0] = load16_f16((const uint16_t *)row + c, n0);
        w[1] = load16_f16((const uint16_t *)row + c + 16, n1);
    } else {
        w[0] = load16_bf16((const uint16_t *)row + c, n0);
        w[1] = load16_bf16((const uint16_t *)row + c + 16, n1);
    }
}

/*
 * MULTI_T defines name(row, x, ldx, b0, b1, rem, acc): blocks [b0, b1) of one row (and,
 * for f16 and bf16, the rem < 32 weights after block b1) against T tokens, added into
 * the row's accumulators acc_io (A per token, token t's at acc_io[t * A]): each block
 * is decoded once and vector k of it FMA'd into accumulator k % A of every token. The
 * accumulators live in memory between calls, so the column chunks never change a sum.
 */
#define MULTI_T(name, sfx, slot, T, A)                                                   \
    static void name(const uint8_t *row, const float *x, size_t ldx, size_t b0,         \
                     size_t b1, size_t rem, __m512 *acc_io)                             \
    {                                                                                   \
        __m512 acc[T][A];                                                               \
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)                             \
            _Pragma("GCC unroll 2") for (int a = 0; a < A; a++)                         \
                acc[t][a] = acc_io[t * A + a];                                          \
        for (size_t j = 0; j < b1 - b0; j++) {                                          \
            __m512 w[2];                                                                \
            dec_##sfx(row, b0 + j, w);                                                  \
            const float *xj = x + j * 32;                                               \
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)                         \
                _Pragma("GCC unroll 2") for (int k = 0; k < 2; k++)                     \
                    acc[t][k % A] = _mm512_fmadd_ps(                                    \
                        w[k], _mm512_loadu_ps(xj + t * ldx + 16 * k), acc[t][k % A]);   \
        }                                                                               \
        if (slot <= WPI_SLOT_BF16 && rem) {                                             \
            __m512 w[2];                                                                \
            const float *xj = x + (b1 - b0) * 32;                                       \
            size_t n0 = rem < 16 ? rem : 16;                                            \
            __mmask16 m[2] = {tail_mask(n0), tail_mask(rem - n0)};                      \
            tail_row(slot, row, b1 * 32, rem, w);                                       \
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)                         \
                _Pragma("GCC unroll 2") for (int k = 0; k < 2; k++)                     \
                    acc[t][k % A] = _mm512_fmadd_ps(                                    \
                        w[k], _mm512_maskz_loadu_ps(m[k], xj + t * ldx + 16 * k),       \
                        acc[t][k % A]);                                                 \
        }                                                                               \
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)                             \
            _Pragma("GCC unroll 2") for (int a = 0; a < A; a++)                         \
                acc_io[t * A + a] = acc[t][a];                                          \
    }

typedef void (*multi_row_fn)(const uint8_t *row, const float *x, size_t ldx, size_t b0,
                             size_t b1, size_t rem, __m512 *acc);

/* Accumulators per token of the T-token kernel (index T): two (one per half-block
 * vector) keep 2 * T chains; T * A <= MULTI_ACC. */
static const int multi_acc[WPI_MULTI_TOK + 1] = {0, 2, 2, 2, 2, 2, 2, 2, 2};
#define MULTI_ACC 16
WPI_MULTI_ROWS(multi_rows, multi_row_fn, __m512, _mm512_setzero_ps(), _mm512_add_ps, hsum,
               multi_acc, MULTI_ACC)

/* The multi kernel of a dtype (a wpi_rows_multi_fn), with its T-token kernels. */
#define MULTI_DTYPE(sfx, slot)                                                          \
    MULTI_T(multi1_##sfx, sfx, slot, 1, 2)                                              \
    MULTI_T(multi2_##sfx, sfx, slot, 2, 2)                                              \
    MULTI_T(multi3_##sfx, sfx, slot, 3, 2)                                              \
    MULTI_T(multi4_##sfx, sfx, slot, 4, 2)                                              \
    MULTI_T(multi5_##sfx, sfx, slot, 5, 2)                                              \
    MULTI_T(multi6_##sfx, sfx, slot, 6, 2)                                              \
    MULTI_T(multi7_##sfx, sfx, slot, 7, 2)                                              \
    MULTI_T(multi8_##sfx, sfx, slot, 8, 2)                                              \
    WPI_MULTI_ENTRY(sfx, multi_row_fn, multi_rows)

MULTI_DTYPE(f16, WPI_SLOT_F16)
MULTI_DTYPE(bf16, WPI_SLOT_BF16)
MULTI_DTYPE(q8_0, WPI_SLOT_Q8_0)
MULTI_DTYPE(q4_0, WPI_SLOT_Q4_0)
MULTI_DTYPE(q4_1, WPI_SLOT_Q4_1)
MULTI_DTYPE(mxfp4, WPI_SLOT_MXFP4)

/*
 * Pairs of rows: PAIR_T defines name(w, rb, n_rows, x, ldx, cols, y, ldy), rows [0,
 * n_rows) of a quantized matrix against T tokens (2 <= T <= 8) straight from the stored
 * weights: each 32-weight block of two rows is decoded once into registers and applied
 * to every token, so each activation vector loaded serves both rows (half a load per
 * FMA, where the one-row kernels above load one per FMA), nothing is dequantized to
 * memory and the 2 x T sums stay in registers over the whole row (no per-chunk lane
 * sums). One accumulator per (row, token), both halves of a block FMA'd into it in
 * order, then hsum's order: a sum depends on cols only, never on T, n_rows or the
 * other row (a ragged last pair repeats its row and drops those sums). The rows
 * PAIR_AHEAD pairs on are prefetched a line per block, as WPI_MULTI_ROWS does.
 */
#define PAIR_AHEAD 4
#define PAIR_XLD (1024 + 16)
#define MULTIQ_MAX 32 /* the multi path's reach for quantized dtypes */
#define PAIR_T(name, sfx, bytes, T)                                                     \
    static void name(const uint8_t *w, size_t rb, size_t n_rows, const float *x,        \
                     size_t ldx, size_t cols, float *y, size_t ldy)                     \
    {                                                                                   \
        const size_t nb = cols / 32;                                                    \
        _Alignas(WPI_BUF_ALIGN) float buf[(T) * PAIR_XLD];                              \
        const float *xs = x;                                                            \
        size_t xld = ldx;                                                               \
        if (cols <= PAIR_XLD - 16) {                                                    \
            for (int t = 0; t < T; t++)                                                 \
                memcpy(buf + t * PAIR_XLD, x + t * ldx, cols * sizeof(float));          \
            xs = buf;                                                                   \
            xld = PAIR_XLD;                                                             \
        }                                                                               \
        for (size_t r = 0; r < n_rows; r += 2) {                                        \
            const uint8_t *w0 = w + r * rb, *w1 = r + 1 < n_rows ? w0 + rb : w0;        \
            const uint8_t *pf = r + 2 * PAIR_AHEAD + 1 < n_rows ? w0 + 2 * PAIR_AHEAD * rb \
                                                                : NULL;                 \
            __m512 acc[2][T];                                                           \
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {                       \
                acc[0][t] = _mm512_setzero_ps();                                        \
                acc[1][t] = _mm512_setzero_ps();                                        \
            }                                                                           \
            for (size_t b = 0; b < nb; b++) {                                           \
                if (pf && (b * (bytes)) % 64 < (bytes)) {                               \
                    __builtin_prefetch(pf + b * (bytes));                               \
                    __builtin_prefetch(pf + rb + b * (bytes));                          \
                }                                                                       \
                __m512 a[2], c[2];                                                      \
                dec_##sfx(w0, b, a);                                                    \
                dec_##sfx(w1, b, c);                                                    \
                const float *xb = xs + b * 32;                                          \
                _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {                   \
                    __m512 x0 = _mm512_loadu_ps(xb + t * xld);                          \
                    __m512 x1 = _mm512_loadu_ps(xb + t * xld + 16);                     \
                    KEEP_IN_REGISTER(x0);                                               \
                    KEEP_IN_REGISTER(x1);                                               \
                    acc[0][t] = _mm512_fmadd_ps(a[1], x1, _mm512_fmadd_ps(a[0], x0, acc[0][t])); \
                    acc[1][t] = _mm512_fmadd_ps(c[1], x1, _mm512_fmadd_ps(c[0], x0, acc[1][t])); \
                }                                                                       \
            }                                                                           \
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {                       \
                y[t * ldy + r] = hsum(acc[0][t]);                                       \
                if (w1 != w0)                                                           \
                    y[t * ldy + r + 1] = hsum(acc[1][t]);                               \
            }                                                                           \
        }                                                                               \
    }

typedef void (*pair_fn)(const uint8_t *w, size_t rb, size_t n_rows, const float *x,
                        size_t ldx, size_t cols, float *y, size_t ldy);

/* The multi kernel of a quantized dtype: pairs of rows from 2 tokens (the one-row kernel
 * for a single token, which the driver sends to the row dots instead). */
#define PAIR_DTYPE(sfx, bytes)                                                          \
    PAIR_T(pair2_##sfx, sfx, bytes, 2)                                                  \
    PAIR_T(pair3_##sfx, sfx, bytes, 3)                                                  \
    PAIR_T(pair4_##sfx, sfx, bytes, 4)                                                  \
    PAIR_T(pair5_##sfx, sfx, bytes, 5)                                                  \
    PAIR_T(pair6_##sfx, sfx, bytes, 6)                                                  \
    PAIR_T(pair7_##sfx, sfx, bytes, 7)                                                  \
    PAIR_T(pair8_##sfx, sfx, bytes, 8)                                                  \
    static void multiq_##sfx(const uint8_t *w, size_t rb, size_t n_rows, const float *x, \
                             size_t ldx, size_t n_tok, size_t cols, float *y, size_t ldy) \
    {                                                                                   \
        static const pair_fn fns[7] = {pair2_##sfx, pair3_##sfx, pair4_##sfx,           \
                                       pair5_##sfx, pair6_##sfx, pair7_##sfx,           \
                                       pair8_##sfx};                                    \
        if (n_tok < 2)                                                                  \
            multi_##sfx(w, rb, n_rows, x, ldx, n_tok, cols, y, ldy);                    \
        else                                                                            \
            fns[n_tok - 2](w, rb, n_rows, x, ldx, cols, y, ldy);                        \
    }

PAIR_DTYPE(q8_0, 34)
PAIR_DTYPE(q4_0, 18)
PAIR_DTYPE(q4_1, 20)
PAIR_DTYPE(mxfp4, WPI_MXFP4_BYTES)

/* None for f32: its rows are read in place by the tiles, with no decode to share and 8
 * loads per 16 FMAs against one per FMA here (2..8 tokens cost 1.9x-3.1x single-token
 * calls here, 1.3x-2.7x tiled; AMD EPYC, 2048 x 2048, benchmarks/kernels.c --ntok). */
static const wpi_rows_multi_fn multi_avx512[WPI_SLOTS] = {
    [WPI_SLOT_F16] = multi_f16, [WPI_SLOT_BF16] = multi_bf16,
    [WPI_SLOT_Q8_0] = multiq_q8_0, [WPI_SLOT_Q4_0] = multiq_q4_0,
    [WPI_SLOT_Q4_1] = multiq_q4_1, [WPI_SLOT_MXFP4] = multiq_mxfp4,
};

#if defined(__clang__)
#pragma clang attribute pop
#endif

const wpi_blocks wpi_blocks_avx512 = {
    .name = "avx512",
    .chunk = WPI_CHUNK_MAX,
    .row_dot = {
        [WPI_SLOT_F32] = row_f32, [WPI_SLOT_F16] = row_f16, [WPI_SLOT_BF16] = row_bf16,
        [WPI_SLOT_Q8_0] = row_q8_0, [WPI_SLOT_Q4_0] = row_q4_0, [WPI_SLOT_Q4_1] = row_q4_1,
        [WPI_SLOT_MXFP4] = row_mxfp4,
    },
    .dequant = {
        [WPI_SLOT_F16] = dequant_f16, [WPI_SLOT_BF16] = dequant_bf16,
        [WPI_SLOT_Q8_0] = dequant_q8_0, [WPI_SLOT_Q4_0] = dequant_q4_0,
        [WPI_SLOT_Q4_1] = dequant_q4_1, [WPI_SLOT_MXFP4] = dequant_mxfp4,
    },
    .apply = apply_4x4,
    .multi = multi_avx512,
    /* The multi kernels' time over the tiles' (the table rebuilt with multi_max 1, 4
     * and 8, benchmarks/kernels.c --ntok --cpu on 2048 x 2048, and the two paths timed
     * interleaved in one process on 2048 x 2048, 512 x 1024 and 1024 x 512; AMD EPYC,
     * shared, load 3 to 9, so +-15%): 2 and 3 tokens 0.6x-1.05x for every dtype (most
     * near 0.75x), 4 to 6 tokens 0.8x-1.1x, 8 tokens 1.2x-1.4x on the quantized dtypes
     * and 1.0x-1.3x on f16 and bf16, which stay ahead up to 6 (0.8x-1.0x). */
    /* Quantized dtypes: the pair kernels up to MULTIQ_MAX tokens (groups of up to 8).
     * Against the kernels they replace, on a 768 x 1024 q8_0, q4_0 and mxfp4 matrix
     * (an expert's gate of a generated MoE; Intel Xeon with AVX-512, thread CPU
     * clock, the matrix in cache / one of 200 from memory): 2 to 4 tokens (the one-row
     * multi kernels) 0.73x-0.92x / 0.76x-0.86x, 5 to 16 tokens (the tiles) 0.73x-0.94x /
     * 0.5x-0.8x, 24 and 32 tokens 0.92x / 0.8x-0.88x, 64 even (left to the tiles). */
    .multi_max = {[WPI_SLOT_F16] = 6, [WPI_SLOT_BF16] = 6, [WPI_SLOT_Q8_0] = MULTIQ_MAX,
                  [WPI_SLOT_Q4_0] = MULTIQ_MAX, [WPI_SLOT_Q4_1] = MULTIQ_MAX,
                  [WPI_SLOT_MXFP4] = MULTIQ_MAX},
    .dot_f32 = dot_f32_avx512,
    .axpy_f32 = axpy_f32_avx512,
};

#endif /* __x86_64__ */

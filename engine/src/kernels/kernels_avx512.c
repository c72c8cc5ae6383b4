/*
 * kernels_avx512.c -- AVX-512 (F, BW, VL) block kernels for the matmul, and dot and axpy.
 *
 * The same block kernels as kernels_avx2.c, for matmul.c's driver (blocks.h), 16 lanes
 * wide with mask registers for tails: for one token a 32-weight block is two vectors
 * (q4: low nibbles = weights 0..15, high = 16..31), dotted with x, scaled by d and added
 * to an even or odd accumulator; for several, a chunk dequantizer per dtype and a
 * 2 rows x 4 tokens tile.
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
    store_block(out, _mm512_set1_ps(load_f16(blk)), _mm512_setzero_ps(), w0, w1);
}

static inline void dequant_block_q4_0(const uint8_t *blk, float *out)
{
    __m512 w0, w1;
    widen_q4(blk + 2, 8, &w0, &w1);
    store_block(out, _mm512_set1_ps(load_f16(blk)), _mm512_setzero_ps(), w0, w1);
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

/*
 * The tile: sums of w_i[0..n) * x_t[0..n) for 2 rows x 4 tokens, one accumulator per
 * (row, token). Every (row, token) sum is formed in the same order whatever its
 * neighbours.
 */
static void tile_2x4(const float *w0, const float *w1, const float *const xt[4], size_t n,
                     float out[2][4])
{
    const float *x0 = xt[0], *x1 = xt[1], *x2 = xt[2], *x3 = xt[3];
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
    __m512 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 u = _mm512_loadu_ps(w0 + i), v = _mm512_loadu_ps(w1 + i), xv;
        xv = _mm512_loadu_ps(x0 + i);
        KEEP_IN_REGISTER(xv);
        a00 = _mm512_fmadd_ps(u, xv, a00);
        a10 = _mm512_fmadd_ps(v, xv, a10);
        xv = _mm512_loadu_ps(x1 + i);
        KEEP_IN_REGISTER(xv);
        a01 = _mm512_fmadd_ps(u, xv, a01);
        a11 = _mm512_fmadd_ps(v, xv, a11);
        xv = _mm512_loadu_ps(x2 + i);
        KEEP_IN_REGISTER(xv);
        a02 = _mm512_fmadd_ps(u, xv, a02);
        a12 = _mm512_fmadd_ps(v, xv, a12);
        xv = _mm512_loadu_ps(x3 + i);
        KEEP_IN_REGISTER(xv);
        a03 = _mm512_fmadd_ps(u, xv, a03);
        a13 = _mm512_fmadd_ps(v, xv, a13);
    }
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        __m512 u = _mm512_maskz_loadu_ps(m, w0 + i), v = _mm512_maskz_loadu_ps(m, w1 + i), xv;
        xv = _mm512_maskz_loadu_ps(m, x0 + i);
        a00 = _mm512_fmadd_ps(u, xv, a00);
        a10 = _mm512_fmadd_ps(v, xv, a10);
        xv = _mm512_maskz_loadu_ps(m, x1 + i);
        a01 = _mm512_fmadd_ps(u, xv, a01);
        a11 = _mm512_fmadd_ps(v, xv, a11);
        xv = _mm512_maskz_loadu_ps(m, x2 + i);
        a02 = _mm512_fmadd_ps(u, xv, a02);
        a12 = _mm512_fmadd_ps(v, xv, a12);
        xv = _mm512_maskz_loadu_ps(m, x3 + i);
        a03 = _mm512_fmadd_ps(u, xv, a03);
        a13 = _mm512_fmadd_ps(v, xv, a13);
    }
    out[0][0] = _mm512_reduce_add_ps(a00);
    out[0][1] = _mm512_reduce_add_ps(a01);
    out[0][2] = _mm512_reduce_add_ps(a02);
    out[0][3] = _mm512_reduce_add_ps(a03);
    out[1][0] = _mm512_reduce_add_ps(a10);
    out[1][1] = _mm512_reduce_add_ps(a11);
    out[1][2] = _mm512_reduce_add_ps(a12);
    out[1][3] = _mm512_reduce_add_ps(a13);
}

WPI_APPLY_TILES(apply_tiles, tile_2x4)

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
    .apply = apply_tiles,
    .multi = wpi_avx2_multi, /* kernels_avx2.c's: AVX-512 CPUs run AVX2 */
    .multi_max = WPI_AVX2_MULTI_MAX,
    .dot_f32 = dot_f32_avx512,
    .axpy_f32 = axpy_f32_avx512,
};

#endif /* __x86_64__ */

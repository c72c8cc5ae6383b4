/*
 * kernels_avx512.c -- AVX-512 (F, BW, VL) variants of the matmul, dot and axpy kernels.
 *
 * The same two paths as kernels_avx2.c, 16 lanes wide, with mask registers for tails:
 *   n_tok == 1: a 32-weight block is two vectors (q4: low nibbles = weights 0..15,
 *     high = 16..31), dotted with x, scaled by d, added to an even or odd accumulator.
 *   n_tok >= 2: rows are dequantized CHUNK columns at a time into a stack buffer and
 *     applied 2 rows x 4 tokens per register tile.
 * Activations stay float32, so VNNI (int8 dot products) has nothing to do here.
 * Each row's arithmetic is the same whatever row range it sits in.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"

#if defined(__x86_64__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#endif

#include <immintrin.h>

#define CHUNK 512    /* columns dequantized at a time: 2 KiB of floats per row */
#define TILE_ROWS 8  /* rows sharing one pass over the tokens' x chunk */

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

/* ---- n_tok == 1: one row against one x, straight from the stored weights --------- */

static float row_f16(const uint16_t *w, const float *x, size_t n, int bf16)
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

/* Even blocks into one accumulator, odd into another: two independent add chains. */
#define ROW_QUANT(name, block_fn, bytes)                                                 \
    static float name(const uint8_t *row, const float *x, size_t nb)                     \
    {                                                                                    \
        __m512 e = _mm512_setzero_ps(), o = e;                                           \
        size_t b = 0;                                                                    \
        for (; b + 2 <= nb; b += 2) {                                                    \
            e = block_fn(row + b * (bytes), x + b * 32, e);                              \
            o = block_fn(row + (b + 1) * (bytes), x + (b + 1) * 32, o);                  \
        }                                                                                \
        if (b < nb)                                                                      \
            e = block_fn(row + b * (bytes), x + b * 32, e);                              \
        return _mm512_reduce_add_ps(_mm512_add_ps(e, o));                                \
    }

ROW_QUANT(row_q8_0, block_q8_0, 34)
ROW_QUANT(row_q4_0, block_q4_0, 18)
ROW_QUANT(row_q4_1, block_q4_1, 20)

static void matvec(int dtype, const void *w, size_t cols, size_t r0, size_t r1,
                   const float *x, float *y)
{
    size_t rb = wpi_row_bytes(dtype, cols);
    for (size_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w + r * rb;
        switch (dtype) {
        case WPI_F32: y[r] = dot_f32_avx512((const float *)row, x, cols); break;
        case WPI_F16: y[r] = row_f16((const uint16_t *)row, x, cols, 0); break;
        case WPI_BF16: y[r] = row_f16((const uint16_t *)row, x, cols, 1); break;
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
        for (size_t i = 0; i < n; i += 16) {
            size_t k = n - i < 16 ? n - i : 16;
            __m512 v = dtype == WPI_F16 ? load16_f16(h + i, k) : load16_bf16(h + i, k);
            _mm512_store_ps(out + i, v); /* out has room for a whole last vector */
        }
        return;
    }
    case WPI_Q8_0:
    case WPI_Q4_0:
    case WPI_Q4_1:
        for (size_t i = 0; i < n; i += 32) {
            size_t b = (c + i) / 32;
            __m512 w0, w1, d, m = _mm512_setzero_ps();
            if (dtype == WPI_Q8_0) {
                widen_q8(row + b * 34 + 2, &w0, &w1);
                d = _mm512_set1_ps(load_f16(row + b * 34));
            } else if (dtype == WPI_Q4_0) {
                widen_q4(row + b * 18 + 2, 8, &w0, &w1);
                d = _mm512_set1_ps(load_f16(row + b * 18));
            } else {
                widen_q4(row + b * 20 + 4, 0, &w0, &w1);
                d = _mm512_set1_ps(load_f16(row + b * 20));
                m = _mm512_set1_ps(load_f16(row + b * 20 + 2));
            }
            _mm512_store_ps(out + i, _mm512_fmadd_ps(d, w0, m));
            _mm512_store_ps(out + i + 16, _mm512_fmadd_ps(d, w1, m));
        }
        return;
    default:
        return;
    }
}

/*
 * The micro-kernel: sums of w_i[0..n) * x_t[0..n) for 2 rows x 4 tokens, one
 * accumulator per (row, token). Callers fill a ragged tile by repeating a row or token
 * pointer and dropping those sums; every (row, token) sum is formed in the same order
 * whatever its neighbours, so results never depend on how rows or tokens were grouped.
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

static void matmul_tiled(int dtype, const void *w, size_t cols, size_t r0, size_t r1,
                         const float *x, size_t ldx, size_t n_tok, float *y, size_t ldy)
{
    _Alignas(64) float buf[TILE_ROWS][CHUNK];
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

#define AVX512_MATMUL(name, dtype)                                                       \
    static void name(const void *w, size_t cols, size_t r0, size_t r1, const float *x,  \
                     size_t ldx, size_t n_tok, float *y, size_t ldy)                      \
    {                                                                                    \
        matmul_any(dtype, w, cols, r0, r1, x, ldx, n_tok, y, ldy);                      \
    }

AVX512_MATMUL(matmul_f32_avx512, WPI_F32)
AVX512_MATMUL(matmul_f16_avx512, WPI_F16)
AVX512_MATMUL(matmul_bf16_avx512, WPI_BF16)
AVX512_MATMUL(matmul_q8_0_avx512, WPI_Q8_0)
AVX512_MATMUL(matmul_q4_0_avx512, WPI_Q4_0)
AVX512_MATMUL(matmul_q4_1_avx512, WPI_Q4_1)

#if defined(__clang__)
#pragma clang attribute pop
#endif

const wpi_kernels wpi_kernels_avx512 = {
    .name = "avx512",
    .matmul_f32 = matmul_f32_avx512,
    .matmul_f16 = matmul_f16_avx512,
    .matmul_bf16 = matmul_bf16_avx512,
    .matmul_q8_0 = matmul_q8_0_avx512,
    .matmul_q4_0 = matmul_q4_0_avx512,
    .matmul_q4_1 = matmul_q4_1_avx512,
    .dot_f32 = dot_f32_avx512,
    .axpy_f32 = axpy_f32_avx512,
};

#endif /* __x86_64__ */

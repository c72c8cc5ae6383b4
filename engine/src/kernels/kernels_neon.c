/*
 * kernels_neon.c -- AArch64 Advanced SIMD (NEON) block kernels for the matmul, and dot
 * and axpy.
 *
 * ASIMD is part of the AArch64 base architecture, so this file needs no target
 * attribute: it compiles on every AArch64 build and to an empty table-less unit
 * elsewhere. The same block kernels as kernels_avx2.c, for matmul.c's driver
 * (blocks.h), 4 lanes wide: for one token, per row, each 32-weight block is widened to
 * float in registers (int8/nibbles -> int16 -> int32 -> float), dotted with x, scaled by
 * the block's d and added to one of two accumulators (even and odd blocks); for several,
 * a chunk dequantizer per dtype and a 2 rows x 4 tokens tile.
 * Activations stay float32 and weights are never requantized, so the dot-product
 * instructions (SDOT/UDOT, int8 x int8) have nothing to do here; the 8-bit-activation
 * kernels that use them are kernels_x8_neondot.c's.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/blocks.h"

#if defined(__aarch64__)

#include <arm_neon.h>

/* ---- helpers --------------------------------------------------------------------- */

/* n < 4 floats at p, the other lanes 0; reads exactly n floats. */
static inline float32x4_t load4_part(const float *p, size_t n)
{
    float tmp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    memcpy(tmp, p, n * sizeof(float));
    return vld1q_f32(tmp);
}

static inline float load_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

/* 4 halves at p as floats; n < 4 reads only n of them, the rest are 0. */
static inline uint16x4_t load4_u16(const uint16_t *p, size_t n)
{
    if (n >= 4)
        return vld1_u16(p);
    uint16_t tmp[4] = {0, 0, 0, 0};
    memcpy(tmp, p, n * 2);
    return vld1_u16(tmp);
}

static inline float32x4_t cvt_f16(uint16x4_t h)
{
    return vcvt_f32_f16(vreinterpret_f16_u16(h));
}

static inline float32x4_t cvt_bf16(uint16x4_t h)
{
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

/* 16 signed bytes as four float vectors, in order. */
static inline void widen16(int8x16_t v, float32x4_t w[4])
{
    int16x8_t a = vmovl_s8(vget_low_s8(v)), b = vmovl_high_s8(v);
    w[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(a)));
    w[1] = vcvtq_f32_s32(vmovl_high_s16(a));
    w[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(b)));
    w[3] = vcvtq_f32_s32(vmovl_high_s16(b));
}

/* The 32 signed int8 weights of a q8_0 block as eight float vectors. */
static inline void widen_q8(const uint8_t *q, float32x4_t w[8])
{
    widen16(vld1q_s8((const int8_t *)q), w);
    widen16(vld1q_s8((const int8_t *)q + 16), w + 4);
}

/* The 32 nibbles of a q4 block (16 bytes; low nibbles = weights 0..15, high = 16..31)
 * minus bias, as eight float vectors. */
static inline void widen_q4(const uint8_t *q, int bias, float32x4_t w[8])
{
    uint8x16_t raw = vld1q_u8(q);
    int8x16_t b = vdupq_n_s8((int8_t)bias);
    int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(15))), b);
    int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), b);
    widen16(lo, w);
    widen16(hi, w + 4);
}

/* The 32 weights of an mxfp4 block (blocks.h) as eight float vectors: each code's doubled
 * value from a byte table (low nibbles = weights 0..15, high = 16..31), widened and times
 * half the scale (exact). */
static inline void widen_mxfp4(const uint8_t *blk, float32x4_t w[8])
{
    static const int8_t lut_b[16] = {WPI_MXFP4_X2};
    int8x16_t lut = vld1q_s8(lut_b);
    uint8x16_t raw = vld1q_u8(blk + 1);
    widen16(vqtbl1q_s8(lut, vandq_u8(raw, vdupq_n_u8(15))), w);
    widen16(vqtbl1q_s8(lut, vshrq_n_u8(raw, 4)), w + 4);
    float dh = wpi_e8m0_half(blk[0]);
    for (int k = 0; k < 8; k++)
        w[k] = vmulq_n_f32(w[k], dh);
}

/* sum over the block of w[k] * x[4k..4k+4), as a vector. */
static inline float32x4_t block_dot(const float32x4_t w[8], const float *x)
{
    float32x4_t s0 = vmulq_f32(w[0], vld1q_f32(x));
    float32x4_t s1 = vmulq_f32(w[1], vld1q_f32(x + 4));
    s0 = vfmaq_f32(s0, w[2], vld1q_f32(x + 8));
    s1 = vfmaq_f32(s1, w[3], vld1q_f32(x + 12));
    s0 = vfmaq_f32(s0, w[4], vld1q_f32(x + 16));
    s1 = vfmaq_f32(s1, w[5], vld1q_f32(x + 20));
    s0 = vfmaq_f32(s0, w[6], vld1q_f32(x + 24));
    s1 = vfmaq_f32(s1, w[7], vld1q_f32(x + 28));
    return vaddq_f32(s0, s1);
}

/* ---- dot, axpy ------------------------------------------------------------------- */

static float dot_f32_neon(const float *a, const float *b, size_t n)
{
    float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
        s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    for (; i + 4 <= n; i += 4)
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    if (i < n)
        s1 = vfmaq_f32(s1, load4_part(a + i, n - i), load4_part(b + i, n - i));
    return vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
}

static void axpy_f32_neon(float a, const float *x, float *y, size_t n)
{
    float32x4_t va = vdupq_n_f32(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float32x4_t y0 = vfmaq_f32(vld1q_f32(y + i), va, vld1q_f32(x + i));
        float32x4_t y1 = vfmaq_f32(vld1q_f32(y + i + 4), va, vld1q_f32(x + i + 4));
        vst1q_f32(y + i, y0);
        vst1q_f32(y + i + 4, y1);
    }
    for (; i + 4 <= n; i += 4)
        vst1q_f32(y + i, vfmaq_f32(vld1q_f32(y + i), va, vld1q_f32(x + i)));
    if (i < n) {
        float tmp[4];
        vst1q_f32(tmp, vfmaq_f32(load4_part(y + i, n - i), va, load4_part(x + i, n - i)));
        memcpy(y + i, tmp, (n - i) * sizeof(float));
    }
}

/* ---- one token: one row against one x, straight from the stored weights --------- */

static float row_f32(const uint8_t *row, const float *x, size_t n)
{
    return dot_f32_neon((const float *)row, x, n);
}

/* A row of halves (f16 or bf16) dotted with x: 8 halves per step, 2 accumulators. */
#define ROW_HALF(name, cvt)                                                              \
    static float name(const uint8_t *row, const float *x, size_t n)                      \
    {                                                                                    \
        const uint16_t *w = (const uint16_t *)row;                                       \
        float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0, s2 = s0, s3 = s0;                   \
        size_t i = 0;                                                                    \
        for (; i + 16 <= n; i += 16) {                                                   \
            s0 = vfmaq_f32(s0, cvt(vld1_u16(w + i)), vld1q_f32(x + i));                  \
            s1 = vfmaq_f32(s1, cvt(vld1_u16(w + i + 4)), vld1q_f32(x + i + 4));          \
            s2 = vfmaq_f32(s2, cvt(vld1_u16(w + i + 8)), vld1q_f32(x + i + 8));          \
            s3 = vfmaq_f32(s3, cvt(vld1_u16(w + i + 12)), vld1q_f32(x + i + 12));        \
        }                                                                                \
        for (; i + 4 <= n; i += 4)                                                       \
            s0 = vfmaq_f32(s0, cvt(vld1_u16(w + i)), vld1q_f32(x + i));                  \
        if (i < n)                                                                       \
            s1 = vfmaq_f32(s1, cvt(load4_u16(w + i, n - i)), load4_part(x + i, n - i));  \
        return vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));              \
    }

ROW_HALF(row_f16, cvt_f16)
ROW_HALF(row_bf16, cvt_bf16)

/* acc + one block's d * sum(w*x), for q8_0 and q4_0. */
static inline float32x4_t block_q8_0(const uint8_t *blk, const float *x, float32x4_t acc)
{
    float32x4_t w[8];
    widen_q8(blk + 2, w);
    return vfmaq_n_f32(acc, block_dot(w, x), load_f16(blk));
}

static inline float32x4_t block_q4_0(const uint8_t *blk, const float *x, float32x4_t acc)
{
    float32x4_t w[8];
    widen_q4(blk + 2, 8, w);
    return vfmaq_n_f32(acc, block_dot(w, x), load_f16(blk));
}

/* q4_1 weights are d*q + m, so a block adds d*sum(q*x) + m*sum(x). */
static inline float32x4_t block_q4_1(const uint8_t *blk, const float *x, float32x4_t acc)
{
    float32x4_t w[8];
    widen_q4(blk + 4, 0, w);
    float32x4_t sx = vaddq_f32(vaddq_f32(vld1q_f32(x), vld1q_f32(x + 4)),
                               vaddq_f32(vld1q_f32(x + 8), vld1q_f32(x + 12)));
    sx = vaddq_f32(sx, vaddq_f32(vaddq_f32(vld1q_f32(x + 16), vld1q_f32(x + 20)),
                                 vaddq_f32(vld1q_f32(x + 24), vld1q_f32(x + 28))));
    acc = vfmaq_n_f32(acc, sx, load_f16(blk + 2));
    return vfmaq_n_f32(acc, block_dot(w, x), load_f16(blk));
}

/* acc + one mxfp4 block's sum(w*x), the weights already scaled. */
static inline float32x4_t block_mxfp4(const uint8_t *blk, const float *x, float32x4_t acc)
{
    float32x4_t w[8];
    widen_mxfp4(blk, w);
    return vaddq_f32(acc, block_dot(w, x));
}

/* blocks.h's even/odd row loop over this file's vectors. */
#define ROW_QUANT(name, block_fn, bytes) \
    WPI_ROW_QUANT(name, block_fn, bytes, float32x4_t, vdupq_n_f32(0.0f), vaddq_f32, vaddvq_f32)

ROW_QUANT(row_q8_0, block_q8_0, 34)
ROW_QUANT(row_q4_0, block_q4_0, 18)
ROW_QUANT(row_q4_1, block_q4_1, 20)
ROW_QUANT(row_mxfp4, block_mxfp4, WPI_MXFP4_BYTES)

/* ---- several tokens: dequantize a chunk once, apply it to every token ------------- */

/* Half-precision columns [c, c + n) as floats; out has room for a whole last vector. */
#define DEQUANT_HALF(name, cvt)                                                          \
    static void name(const uint8_t *row, size_t c, size_t n, float *out)                 \
    {                                                                                    \
        const uint16_t *h = (const uint16_t *)row + c;                                   \
        for (size_t i = 0; i < n; i += 4)                                                \
            vst1q_f32(out + i, cvt(load4_u16(h + i, n - i)));                            \
    }

DEQUANT_HALF(dequant_f16, cvt_f16)
DEQUANT_HALF(dequant_bf16, cvt_bf16)

/* d * w + m for the eight vectors of a block, at out; then one block of each dtype. */
static inline void store_block(float *out, float d, float m, const float32x4_t w[8])
{
    float32x4_t vm = vdupq_n_f32(m);
    for (int k = 0; k < 8; k++)
        vst1q_f32(out + 4 * k, vfmaq_n_f32(vm, w[k], d));
}

static inline void dequant_block_q8_0(const uint8_t *blk, float *out)
{
    float32x4_t w[8];
    widen_q8(blk + 2, w);
    store_block(out, load_f16(blk), 0.0f, w);
}

static inline void dequant_block_q4_0(const uint8_t *blk, float *out)
{
    float32x4_t w[8];
    widen_q4(blk + 2, 8, w);
    store_block(out, load_f16(blk), 0.0f, w);
}

static inline void dequant_block_q4_1(const uint8_t *blk, float *out)
{
    float32x4_t w[8];
    widen_q4(blk + 4, 0, w);
    store_block(out, load_f16(blk), load_f16(blk + 2), w);
}

WPI_DEQUANT_QUANT(dequant_q8_0, dequant_block_q8_0, 34)
WPI_DEQUANT_QUANT(dequant_q4_0, dequant_block_q4_0, 18)
static inline void dequant_block_mxfp4(const uint8_t *blk, float *out)
{
    float32x4_t w[8];
    widen_mxfp4(blk, w);
    for (int k = 0; k < 8; k++)
        vst1q_f32(out + 4 * k, w[k]);
}

WPI_DEQUANT_QUANT(dequant_q4_1, dequant_block_q4_1, 20)
WPI_DEQUANT_QUANT(dequant_mxfp4, dequant_block_mxfp4, WPI_MXFP4_BYTES)

/*
 * The tile: sums of w_i[0..n) * x_t[0..n) for 2 rows x 4 tokens, one accumulator per
 * (row, token): 8 independent FMA chains. Every (row, token) sum is formed in the same
 * order whatever its neighbours.
 */
static void tile_2x4(const float *w0, const float *w1, const float *const xt[4], size_t n,
                     float out[2][4])
{
    float32x4_t a[2][4];
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 4; t++)
            a[r][t] = vdupq_n_f32(0.0f);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float32x4_t u = vld1q_f32(w0 + i), v = vld1q_f32(w1 + i);
        for (int t = 0; t < 4; t++) {
            float32x4_t xv = vld1q_f32(xt[t] + i);
            a[0][t] = vfmaq_f32(a[0][t], u, xv);
            a[1][t] = vfmaq_f32(a[1][t], v, xv);
        }
    }
    if (i < n) {
        float32x4_t u = load4_part(w0 + i, n - i), v = load4_part(w1 + i, n - i);
        for (int t = 0; t < 4; t++) {
            float32x4_t xv = load4_part(xt[t] + i, n - i);
            a[0][t] = vfmaq_f32(a[0][t], u, xv);
            a[1][t] = vfmaq_f32(a[1][t], v, xv);
        }
    }
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 4; t++)
            out[r][t] = vaddvq_f32(a[r][t]);
}

WPI_APPLY_TILES(apply_tiles, tile_2x4)

const wpi_blocks wpi_blocks_neon = {
    .name = "neon",
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
    .dot_f32 = dot_f32_neon,
    .axpy_f32 = axpy_f32_neon,
};

#endif /* __aarch64__ */

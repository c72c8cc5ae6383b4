/*
 * kernels_x8_ref.c -- the activation quantizer and the reference 8-bit dot products.
 *
 * Plain scalar C, the twin the SIMD x8 tables are tested against. Per block the integer
 * sum 256 * sum(w q) + sum(w r) is exact in int32: |w| <= 128 (q8_0's int8; q4_0 -8..7,
 * q4_1 0..15, mxfp4 -12..12) and |q|, |r| <= 127, so |sum| <= 257 * 32 * 128 * 127 =
 * 133,689,344 < 2^31. It converts to float rounded (it can pass 2^24), then one float
 * multiply by the two scales and 1/256, added to the row's sum in block order. Weights
 * decode as the float path decodes them (blocks.h, kernels_ref.c): q8_0 q; q4_0 nibble
 * - 8; q4_1 nibble, plus m * s for the offset; mxfp4 twice the code's value, with half
 * the scale.
 */
#include <math.h>
#include <stdint.h>

#include "kernels/blocks.h"
#include "kernels/kernels.h"

static int8_t clamp127(float v)
{
    return (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
}

void wpi_quant_x8(const float *x, size_t cols, wpi_xq *out)
{
    for (size_t b = 0; b < cols / WPI_QK; b++, x += WPI_QK) {
        float amax = 0.0f;
        int finite = 1;
        for (int j = 0; j < WPI_QK; j++) {
            finite &= isfinite(x[j]) != 0;
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        }
        float d = amax / 127.0f;
        float id = d != 0.0f && finite ? 1.0f / d : 0.0f;
        int32_t sum = 0; /* 256 * sum(q) + sum(r): |sum| <= 32 * 127 * 257 < 2^24 */
        for (int j = 0; j < WPI_QK; j++) {
            float v = finite ? x[j] * id : 0.0f;
            out[b].q[j] = clamp127(roundf(v));
            /* v - q is exact (|v - q| <= 1/2 and v, q within a factor 2, or q == 0) */
            out[b].r[j] = clamp127(roundf((v - (float)out[b].q[j]) * 256.0f));
            sum += 256 * out[b].q[j] + out[b].r[j];
        }
        out[b].d = finite ? d : NAN;
        out[b].s = out[b].d * ((float)sum * (1.0f / 256.0f));
    }
}

static float f16(const uint8_t *p)
{
    return wpi_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

/* One block's integer sum: 32 decoded weights times x's two planes. */
static int32_t block_sum(const int8_t w[32], const wpi_xq *x)
{
    int32_t s = 0;
    for (int j = 0; j < 32; j++)
        s += w[j] * (256 * x->q[j] + x->r[j]);
    return s;
}

/* 16 bytes of nibbles as 32 weights through lut: low nibbles first, then high. */
static void nibbles(const uint8_t *p, const int8_t lut[16], int8_t w[32])
{
    for (int j = 0; j < 16; j++) {
        w[j] = lut[p[j] & 15];
        w[j + 16] = lut[p[j] >> 4];
    }
}

static const int8_t q4_0_w[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
static const int8_t q4_1_w[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
static const int8_t mxfp4_x2[16] = {WPI_MXFP4_X2};

/* Block b's weight scale dw times x's, per unit of its integer sum. */
static float scale(float dw, const wpi_xq *xq, size_t b)
{
    return dw * xq[b].d * WPI_X8_R;
}

static float dot_q8_0(const uint8_t *row, const wpi_xq *xq, size_t nb)
{
    float y = 0.0f;
    for (size_t b = 0; b < nb; b++, row += 34)
        y += (float)block_sum((const int8_t *)row + 2, xq + b) * scale(f16(row), xq, b);
    return y;
}

static float dot_q4_0(const uint8_t *row, const wpi_xq *xq, size_t nb)
{
    float y = 0.0f;
    int8_t w[32];
    for (size_t b = 0; b < nb; b++, row += 18) {
        nibbles(row + 2, q4_0_w, w);
        y += (float)block_sum(w, xq + b) * scale(f16(row), xq, b);
    }
    return y;
}

static float dot_q4_1(const uint8_t *row, const wpi_xq *xq, size_t nb)
{
    float y = 0.0f;
    int8_t w[32];
    for (size_t b = 0; b < nb; b++, row += 20) {
        nibbles(row + 4, q4_1_w, w);
        y += (float)block_sum(w, xq + b) * scale(f16(row), xq, b) +
             f16(row + 2) * xq[b].s;
    }
    return y;
}

static float dot_mxfp4(const uint8_t *row, const wpi_xq *xq, size_t nb)
{
    float y = 0.0f;
    int8_t w[32];
    for (size_t b = 0; b < nb; b++, row += WPI_MXFP4_BYTES) {
        nibbles(row + 1, mxfp4_x2, w);
        y += (float)block_sum(w, xq + b) * scale(wpi_e8m0_half(row[0]), xq, b);
    }
    return y;
}

const wpi_blocks_x8 wpi_x8_ref = {
    .name = "scalar",
    .row_dot = {dot_q8_0, dot_q4_0, dot_q4_1, dot_mxfp4},
};

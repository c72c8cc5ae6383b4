/*
 * kernels_x8_ref.c -- the activation quantizer and the reference 8-bit dot products.
 *
 * Plain scalar C, the twin the SIMD x8 tables are tested against. Per block the integer
 * sum of products is exact (|sum| <= 32 * 128 * 127 < 2^24, so it converts to float
 * exactly too); then one float multiply by the two scales, added to the row's sum in
 * block order. Weights decode as the float path decodes them (blocks.h, kernels_ref.c):
 * q8_0 q; q4_0 nibble - 8; q4_1 nibble, plus m * s for the offset; mxfp4 twice the
 * code's value, with half the scale.
 */
#include <math.h>
#include <stdint.h>

#include "kernels/blocks.h"
#include "kernels/kernels.h"

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
        int sum = 0, sum_r = 0;
        for (int j = 0; j < WPI_QK; j++) {
            float u = finite ? x[j] * id : 0.0f;
            float v = roundf(u);
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
            float e = roundf((u - v) * 256.0f);
            e = e > 127.0f ? 127.0f : e < -127.0f ? -127.0f : e;
            out[b].q[j] = (int8_t)v;
            out[b].r[j] = (int8_t)e;
            sum += out[b].q[j];
            sum_r += out[b].r[j];
        }
        out[b].d = finite ? d : NAN;
        out[b].s = out[b].d * ((float)sum + (float)sum_r / 256.0f);
    }
}

static float f16(const uint8_t *p)
{
    return wpi_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

static float dot_q8_0(const uint8_t *row, const wpi_xq *xq, size_t nb)
{
    float y = 0.0f;
    for (size_t b = 0; b < nb; b++, row += 34) {
        int32_t s = 0;
        for (int j = 0; j < 32; j++)
            s += (int8_t)row[2 + j] * xq[b].q[j];
        y += (float)s * (f16(row) * xq[b].d);
    }
    return y;
}

static float dot_q4_0(const uint8_t *row, const wpi_xq *xq, size_t nb)
{
    float y = 0.0f;
    for (size_t b = 0; b < nb; b++, row += 18) {
        int32_t s = 0;
        for (int j = 0; j < 16; j++)
            s += ((row[2 + j] & 15) - 8) * xq[b].q[j] + ((row[2 + j] >> 4) - 8) * xq[b].q[j + 16];
        y += (float)s * (f16(row) * xq[b].d);
    }
    return y;
}

static float dot_q4_1(const uint8_t *row, const wpi_xq *xq, size_t nb)
{
    float y = 0.0f;
    for (size_t b = 0; b < nb; b++, row += 20) {
        int32_t s = 0;
        for (int j = 0; j < 16; j++)
            s += (row[4 + j] & 15) * xq[b].q[j] + (row[4 + j] >> 4) * xq[b].q[j + 16];
        y += (float)s * (f16(row) * xq[b].d) + f16(row + 2) * xq[b].s;
    }
    return y;
}

static const int8_t mxfp4_x2[16] = {WPI_MXFP4_X2};

static float dot_mxfp4(const uint8_t *row, const wpi_xq *xq, size_t nb)
{
    float y = 0.0f;
    for (size_t b = 0; b < nb; b++, row += WPI_MXFP4_BYTES) {
        int32_t s = 0;
        for (int j = 0; j < 16; j++)
            s += mxfp4_x2[row[1 + j] & 15] * xq[b].q[j] +
                 mxfp4_x2[row[1 + j] >> 4] * xq[b].q[j + 16];
        y += (float)s * (wpi_e8m0_half(row[0]) * xq[b].d);
    }
    return y;
}

const wpi_blocks_x8 wpi_x8_ref = {
    .name = "scalar",
    .row_dot = {dot_q8_0, dot_q4_0, dot_q4_1, dot_mxfp4},
};

/*
 * kernels_x8_tile_ref.c -- the scalar twin of the 8-bit-activation tile kernels
 * (x8_tile.h), one (row, token) at a time.
 *
 * Weights decode to integers as kernels_x8_ref.c's do (q8_0 q; q4_0 nibble - 8; q4_1
 * nibble; mxfp4 twice the code's value, with half the scale). Per block the integer
 * 256 * sum(w q) + sum(w r) is exact in int32 (|.| <= 257 * 32 * 128 * 127 < 2^31); it is
 * converted to float, multiplied by (d_w / 256) * d and added to the sum in block order,
 * then q4_1's m * s.
 */
#include <stdint.h>

#include "kernels/blocks.h"
#include "kernels/kernels.h"
#include "kernels/x8_tile.h"

static float f16(const uint8_t *p)
{
    return wpi_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

static const int8_t mxfp4_x2[16] = {WPI_MXFP4_X2};

/* Weight j of block p as an integer, for slot index k (q8_0, q4_0, q4_1, mxfp4). */
static int weight(int k, const uint8_t *p, int j)
{
    int n = j < 16 ? j : j - 16, shift = j < 16 ? 0 : 4;
    switch (k) {
    case 0: return (int8_t)p[2 + j];
    case 1: return ((p[2 + n] >> shift) & 15) - 8;
    case 2: return (p[4 + n] >> shift) & 15;
    default: return mxfp4_x2[(p[1 + n] >> shift) & 15];
    }
}

static float dot(int k, size_t bytes, const uint8_t *row, const wpi_xq *xq, size_t nb)
{
    float y = 0.0f;
    for (size_t b = 0; b < nb; b++, row += bytes) {
        int32_t s = 0;
        for (int j = 0; j < 32; j++) {
            int w = weight(k, row, j);
            s += 256 * w * xq[b].q[j] + w * xq[b].r[j];
        }
        float dw = k == 3 ? wpi_e8m0_half(row[0]) : f16(row);
        y += (float)s * (dw / 256.0f * xq[b].d);
        if (k == 2)
            y += f16(row + 2) * xq[b].s;
    }
    return y;
}

#define TILE_REF(name, k, bytes)                                                         \
    static void name(const uint8_t *w, size_t rb, size_t nr, const wpi_xq *xq, size_t ldq, \
                     size_t nt, size_t nb, float *y, size_t ldy)                         \
    {                                                                                    \
        for (size_t t = 0; t < nt; t++)                                                  \
            for (size_t i = 0; i < nr; i++)                                              \
                y[t * ldy + i] = dot(k, bytes, w + i * rb, xq + t * ldq, nb);            \
    }

WPI_X8_TILE_TABLE(TILE_REF, tile, wpi_x8t_ref, "scalar", 0)

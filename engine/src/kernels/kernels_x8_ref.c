/*
 * kernels_x8_ref.c -- the activation quantizer of the 8-bit path (both planes, q and the
 * residual r; kernels.h): the scalar twin wpi_quant_x8_ref, and wpi_quant_x8, which runs
 * the AVX2 version where the CPU has it (kernels_x8_avx2.c; AVX-512 CPUs too). Every version writes the same bytes, so which one runs never
 * changes a result. The scalar twin of the tile kernels is kernels_x8_tile_ref.c.
 */
#include <math.h>
#include <stdint.h>

#include "wp.h"
#include "kernels/blocks.h"
#include "kernels/kernels.h"

/* NaN (x * id where 1 / d overflows: see below) to 0, as x86 and AArch64 convert it. */
static int8_t clamp127(float v)
{
    return v != v ? 0 : (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
}

void wpi_quant_x8_ref(const float *x, size_t cols, wpi_xq *out)
{
    for (size_t b = 0; b < cols / WPI_QK; b++, x += WPI_QK) {
        float amax = 0.0f;
        int finite = 1;
        for (int j = 0; j < WPI_QK; j++) {
            finite &= isfinite(x[j]) != 0;
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        }
        float d = amax / 127.0f;
        /* infinite where d < 2^-128 (amax below about 3.7e-37): then q = r = +-127 for
         * every x != 0 and q = r = 0 for x == 0 */
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

void wpi_quant_x8(const float *x, size_t cols, wpi_xq *out)
{
#if defined(__x86_64__)
    if (wp_isa_supported() & (1u << WP_ISA_AVX2)) {
        wpi_quant_x8_avx2(x, cols, out);
        return;
    }
#endif
    wpi_quant_x8_ref(x, cols, out);
}

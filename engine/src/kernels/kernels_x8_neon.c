/*
 * kernels_x8_neon.c -- AArch64 8-bit-activation tile kernels (x8_tile_neon.h) in base
 * Advanced SIMD: each plane's 32 byte products by SMULL/SMLAL, two products per int16 lane
 * (exact: |w| <= 128, |q|, |r| <= 127, so |sum| <= 32512), then added pairwise into the
 * int32 lanes by SADALP. For CPUs without the dot-product instructions (dispatch.c
 * prefers kernels_x8_neondot.c where the OS reports them); compiles to nothing off
 * AArch64.
 */
#include "kernels/blocks.h"

#if defined(__aarch64__)

#include <arm_neon.h>

/* acc plus, per int32 lane, four products of a0 * b0 and four of a1 * b1 (bytes 4l..4l+3
 * of each vector go to lane l, or other bytes of the same vectors: only the lanes' total
 * is used). */
static inline __attribute__((always_inline)) int32x4_t x8n_dot(int32x4_t acc, int8x16_t a0,
                                                               int8x16_t a1, int8x16_t b0,
                                                               int8x16_t b1)
{
    int16x8_t lo = vmlal_s8(vmull_s8(vget_low_s8(a0), vget_low_s8(b0)), vget_low_s8(a1),
                            vget_low_s8(b1));
    int16x8_t hi = vmlal_high_s8(vmull_high_s8(a0, b0), a1, b1);
    return vpadalq_s16(vpadalq_s16(acc, lo), hi);
}

#define X8N_NAME "neon"
#define X8N_TABLE wpi_x8t_neon
#include "kernels/x8_tile_neon.h"

#endif

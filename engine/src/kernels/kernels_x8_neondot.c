/*
 * kernels_x8_neondot.c -- AArch64 8-bit-activation tile kernels (x8_tile_neon.h) with the
 * dot-product instructions (FEAT_DotProd): each plane's 32 byte products summed into the
 * int32 lanes by two SDOT. Compiled for armv8.2-a+dotprod by a target pragma (no global
 * -march flag); dispatch.c calls it only where wpi_cpu_has_dotprod() (platform.c) says the
 * CPU has them. Compiles to nothing off AArch64.
 */
#include "kernels/blocks.h"

#if defined(__aarch64__)

#include <arm_neon.h>

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("dotprod"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
#endif

/* acc plus, per int32 lane l, the products of bytes 4l..4l+3 of a0 * b0 and of a1 * b1.
 * clang's <arm_neon.h> (14) declares vdotq_s32 only when the whole build targets
 * dotprod, so clang gets the instruction by inline assembly in these dotprod functions;
 * GCC's declares it for any function that targets it. */
static inline __attribute__((always_inline)) int32x4_t x8n_dot(int32x4_t acc, int8x16_t a0,
                                                               int8x16_t a1, int8x16_t b0,
                                                               int8x16_t b1)
{
#if defined(__clang__)
    __asm__("sdot %0.4s, %1.16b, %2.16b\n\t"
            "sdot %0.4s, %3.16b, %4.16b"
            : "+w"(acc)
            : "w"(a0), "w"(b0), "w"(a1), "w"(b1));
    return acc;
#else
    return vdotq_s32(vdotq_s32(acc, a0, b0), a1, b1);
#endif
}

#define X8N_NAME "neon-dotprod"
#define X8N_TABLE wpi_x8t_neondot
#include "kernels/x8_tile_neon.h"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif

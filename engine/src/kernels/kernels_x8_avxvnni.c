/*
 * kernels_x8_avxvnni.c -- AVX-VNNI 8-bit-activation tile kernels (x8_tile_w256.h), the byte
 * products summed into int32 lanes by one vpdpbusd. dispatch.c calls it only on CPUs
 * with AVX2, FMA, F16C and AVX-VNNI; compiles to nothing off x86-64.
 */
#include "kernels/blocks.h"

#if defined(__x86_64__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c,avxvnni"))), \
                             apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c,avxvnni")
#endif

#define X8_DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32((acc), (u), (s))
#define X8_NAME "avxvnni"
#include "kernels/x8_blocks.h"
/* The tile kernels (x8_tile.h), signed weights by x ^ 0x80. */
#define X8T_FLIP 1
#define X8T_TABLE wpi_x8t_avxvnni
#include "kernels/x8_tile_w256.h"

#if defined(__clang__)
#pragma clang attribute pop
#endif

#endif

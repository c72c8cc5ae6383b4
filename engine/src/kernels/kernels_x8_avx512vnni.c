/*
 * kernels_x8_avx512vnni.c -- AVX-512 VNNI 8-bit-activation tile kernels (x8_tile_w512.h),
 * the byte products summed into int32 lanes by one vpdpbusd. dispatch.c calls it only
 * where the AVX-512 set runs and the CPU has AVX512-VNNI; compiles to nothing off x86-64.
 */
#include "kernels/blocks.h"

#if defined(__x86_64__)

#if defined(__clang__)
#pragma clang attribute push(                                                            \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"))),      \
    apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#endif

#define X8_DPBUSD(acc, u, s) _mm512_dpbusd_epi32((acc), (u), (s))
#define X8_NAME "avx512vnni"
#include "kernels/x8_blocks.h"
/* The tile kernels (x8_tile.h), signed weights by x ^ 0x80. */
#define X8T_FLIP 1
#define X8T_TABLE wpi_x8t_avx512vnni
#include "kernels/x8_tile_w512.h"

#if defined(__clang__)
#pragma clang attribute pop
#endif

#endif

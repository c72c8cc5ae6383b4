/*
 * kernels_x8_avx512bw.c -- AVX-512 BW 8-bit-activation tile kernels (x8_tile_w512.h), the
 * byte products summed by maddubs (pairs into int16, which cannot saturate: |w| <= 128
 * and |x| <= 127) then madd with ones. dispatch.c calls it only where the AVX-512 set
 * runs (F, BW, VL with AVX2, FMA, F16C); compiles to nothing off x86-64.
 */
#include "kernels/blocks.h"

#if defined(__x86_64__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#endif

#define X8_DPBUSD(acc, u, s)                                                             \
    _mm512_add_epi32((acc), _mm512_madd_epi16(_mm512_maddubs_epi16((u), (s)),           \
                                              _mm512_set1_epi16(1)))
#define X8_NAME "avx512bw"
#include "kernels/x8_blocks.h"
/* The tile kernels (x8_tile.h), signed weights by the sign trick. */
#define X8T_FLIP 0
/* Each plane's int16 pair sums widened by one madd, the q plane's times 256. */
#define X8T_MADD(u, s, k)                                                                \
    _mm512_madd_epi16(_mm512_maddubs_epi16((u), (s)), _mm512_set1_epi16(k))
#define X8T_DOT2(start, u, q, r)                                                         \
    _mm512_add_epi32(_mm512_add_epi32((start), X8T_MADD(u, q, 256)), X8T_MADD(u, r, 1))
#define X8T_TABLE wpi_x8t_avx512bw
#include "kernels/x8_tile_w512.h"

#if defined(__clang__)
#pragma clang attribute pop
#endif

#endif

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

/* roundf (half away from zero) of each lane, then clamped to [-127, 127]: the truncation
 * t, plus +-1 where |v - t| >= 1/2 (v - t is exact, and so is t +- 1 for |v| < 2^24). */
static inline __m512 x8q_round(__m512 v)
{
    __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m512 frac = _mm512_abs_ps(_mm512_sub_ps(v, t));
    __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    __m512 one = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
        _mm512_castps_si512(v), _mm512_set1_epi32((int)0x80000000u),
        _mm512_set1_epi32(0x3f800000), 0xea)); /* (v & sign) | 1.0f */
    t = _mm512_mask_add_ps(t, up, t, one);
    return _mm512_min_ps(_mm512_max_ps(t, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
}

/* wpi_quant_x8_ref's operations lane by lane (the largest |x| and 256 * sum(q) + sum(r)
 * are exact in any order), so the same bytes; a block with a NaN or infinity, or whose
 * 1 / d overflows, goes to wpi_quant_x8_ref itself. */
void wpi_quant_x8_avx512(const float *x, size_t cols, wpi_xq *out)
{
    for (size_t b = 0; b < cols / WPI_QK; b++, x += WPI_QK) {
        __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        __m512 a0 = _mm512_abs_ps(v0), a1 = _mm512_abs_ps(v1);
        const __m512 big = _mm512_set1_ps(3.40282347e38f);
        __mmask16 fin = _mm512_cmp_ps_mask(a0, big, _CMP_LE_OQ) &
                        _mm512_cmp_ps_mask(a1, big, _CMP_LE_OQ);
        float d = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1)) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        if (fin != 0xffff || id > 3.40282347e38f) {
            wpi_quant_x8_ref(x, WPI_QK, out + b);
            continue;
        }
        __m512 vid = _mm512_set1_ps(id), k256 = _mm512_set1_ps(256.0f);
        __m512 u0 = _mm512_mul_ps(v0, vid), u1 = _mm512_mul_ps(v1, vid);
        __m512 q0 = x8q_round(u0), q1 = x8q_round(u1);
        __m512 r0 = x8q_round(_mm512_mul_ps(_mm512_sub_ps(u0, q0), k256));
        __m512 r1 = x8q_round(_mm512_mul_ps(_mm512_sub_ps(u1, q1), k256));
        __m512i qi0 = _mm512_cvttps_epi32(q0), qi1 = _mm512_cvttps_epi32(q1);
        __m512i ri0 = _mm512_cvttps_epi32(r0), ri1 = _mm512_cvttps_epi32(r1);
        _mm_storeu_si128((__m128i *)out[b].q, _mm512_cvtepi32_epi8(qi0));
        _mm_storeu_si128((__m128i *)(out[b].q + 16), _mm512_cvtepi32_epi8(qi1));
        _mm_storeu_si128((__m128i *)out[b].r, _mm512_cvtepi32_epi8(ri0));
        _mm_storeu_si128((__m128i *)(out[b].r + 16), _mm512_cvtepi32_epi8(ri1));
        __m512i sum = _mm512_add_epi32(_mm512_slli_epi32(_mm512_add_epi32(qi0, qi1), 8),
                                       _mm512_add_epi32(ri0, ri1));
        out[b].d = d;
        out[b].s = d * ((float)_mm512_reduce_add_epi32(sum) * (1.0f / 256.0f));
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#endif

#endif

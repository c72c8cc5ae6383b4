/*
 * kernels_x8_avx2.c -- AVX2 8-bit-activation tile kernels (x8_tile_w256.h), the byte
 * products summed by maddubs (pairs into int16, which cannot saturate: |w| <= 128 and
 * |x| <= 127) then madd with ones (pairs into int32). dispatch.c calls it only on CPUs
 * with AVX2, FMA and F16C; compiles to nothing off x86-64.
 */
#include "kernels/blocks.h"

#if defined(__x86_64__)

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif

#define X8_DPBUSD(acc, u, s)                                                             \
    _mm256_add_epi32((acc), _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)),           \
                                              _mm256_set1_epi16(1)))
#define X8_NAME "avx2"
#include "kernels/x8_blocks.h"
/* The tile kernels (x8_tile.h), signed weights by the sign trick. */
#define X8T_FLIP 0
/* Each plane's int16 pair sums widened by one madd, the q plane's times 256. */
#define X8T_MADD(u, s, k)                                                                \
    _mm256_madd_epi16(_mm256_maddubs_epi16((u), (s)), _mm256_set1_epi16(k))
#define X8T_DOT2(start, u, q, r)                                                         \
    _mm256_add_epi32(_mm256_add_epi32((start), X8T_MADD(u, q, 256)), X8T_MADD(u, r, 1))
#define X8T_TABLE wpi_x8t_avx2
/* A lone token's tiles of 8 rows, not 2: its activations loaded once per 8 rows (AMD
 * EPYC, AVX2, one token: [2048 x 2048] q4_0 274 -> 235 us, [768 x 2048] 105 -> 92 us,
 * [2048 x 768] mxfp4 131 -> 111 us, medians of 5 alternated runs; 4 rows measured
 * between the two). */
#define X8T_R1 8
/* mxfp4's lone token on biased unsigned weights (x8_tile_body.h) */
#define X8T_MXFP4_BIASED 1
#include "kernels/x8_tile_w256.h"

/* roundf (half away from zero) of each lane, then clamped to [-127, 127]: the truncation
 * t, plus +-1 where |v - t| >= 1/2 (v - t is exact, and so is t +- 1 for |v| < 2^24). */
static inline __m256 x8q_round(__m256 v)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 up = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(v, t)),
                              _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    __m256 one = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
    t = _mm256_add_ps(t, _mm256_and_ps(up, one));
    return _mm256_min_ps(_mm256_max_ps(t, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
}

/* Four vectors of int32 in [-127, 127] as 32 bytes, in order. */
static inline __m256i x8q_bytes(const __m256i v[4])
{
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]),
                                   _mm256_packs_epi32(v[2], v[3]));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* wpi_quant_x8_ref's operations lane by lane (the largest |x| and 256 * sum(q) + sum(r)
 * are exact in any order), so the same bytes; a block with a NaN or infinity, or whose
 * 1 / d overflows, goes to wpi_quant_x8_ref itself. */
void wpi_quant_x8_avx2(const float *x, size_t cols, wpi_xq *out)
{
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(3.40282347e38f);
    for (size_t b = 0; b < cols / WPI_QK; b++, x += WPI_QK) {
        __m256 v[4], amax = _mm256_setzero_ps();
        __m256 fin = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + 8 * i);
            __m256 a = _mm256_andnot_ps(sign, v[i]);
            amax = _mm256_max_ps(amax, a);
            fin = _mm256_and_ps(fin, _mm256_cmp_ps(a, big, _CMP_LE_OQ));
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        float d = _mm_cvtss_f32(m) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        if (_mm256_movemask_ps(fin) != 0xff || id > 3.40282347e38f) {
            wpi_quant_x8_ref(x, WPI_QK, out + b);
            continue;
        }
        __m256 vid = _mm256_set1_ps(id), k256 = _mm256_set1_ps(256.0f);
        __m256i q[4], r[4], sum = _mm256_setzero_si256();
        for (int i = 0; i < 4; i++) {
            __m256 u = _mm256_mul_ps(v[i], vid);
            __m256 qf = x8q_round(u);
            __m256 rf = x8q_round(_mm256_mul_ps(_mm256_sub_ps(u, qf), k256));
            q[i] = _mm256_cvttps_epi32(qf);
            r[i] = _mm256_cvttps_epi32(rf);
            sum = _mm256_add_epi32(sum, _mm256_add_epi32(_mm256_slli_epi32(q[i], 8), r[i]));
        }
        _mm256_storeu_si256((__m256i *)out[b].q, x8q_bytes(q));
        _mm256_storeu_si256((__m256i *)out[b].r, x8q_bytes(r));
        __m128i s = _mm_add_epi32(_mm256_castsi256_si128(sum),
                                  _mm256_extracti128_si256(sum, 1));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
        s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
        out[b].d = d;
        out[b].s = d * ((float)_mm_cvtsi128_si32(s) * (1.0f / 256.0f));
    }
}

#if defined(__clang__)
#pragma clang attribute pop
#endif

#endif

/*
 * x8_avx512_body.h -- the 512-bit 8-bit-activation row dots, included by
 * kernels_x8_avx512bw.c (X8_DPBUSD from maddubs + madd) and kernels_x8_avx512vnni.c
 * (vpdpbusd) under their own target pragmas, which define X8_DPBUSD(acc, u, s) and
 * X8_TABLE / X8_NAME.
 *
 * Two blocks per vector (lanes 0..7 the even block, 8..15 the odd one; a last odd block
 * is paired with zeros), signed products through the sign trick (|w| times x negated
 * where w < 0), x's q plane then its r plane, 256 * w.q + w.r as 16 int32 lane sums
 * (each <= 257 * 4 * 128 * 127 in magnitude) converted to float and multiplied by each
 * half's scales into one of two float accumulators (alternate pairs); q4_1's m * s terms
 * go into a third sum.
 * Private to engine/src/kernels/.
 */
#define X8_HAVE_ROW4 1 /* this body defines X8_ROW4 */
#include "kernels/x8_blocks.h"

static inline __m512i x8_pair(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* Two blocks' two planes, lanes 0..7 block b, 8..15 block b + 1 (or zeros). */
typedef struct x8_xv {
    __m512i q, r;
} x8_xv;

/* The two planes times weights u (unsigned) as 16 lanes of int32 sums, q's shifted up 8
 * bits before r's are added (sq, sr: the planes, signs already applied). */
static inline __m512i x8_planes(__m512i u, __m512i sq, __m512i sr)
{
    return X8_DPBUSD(_mm512_slli_epi32(X8_DPBUSD(_mm512_setzero_si512(), u, sq), 8), u, sr);
}

/* Signed w times x: |w| times x negated where w < 0. */
static inline __m512i x8_dot_ss(__m512i w, x8_xv x)
{
    __mmask64 neg = _mm512_movepi8_mask(w);
    __m512i z = _mm512_setzero_si512();
    return x8_planes(_mm512_abs_epi8(w), _mm512_mask_sub_epi8(x.q, neg, z, x.q),
                     _mm512_mask_sub_epi8(x.r, neg, z, x.r));
}

/* Unsigned w times x. */
static inline __m512i x8_dot_us(__m512i w, x8_xv x)
{
    return x8_planes(w, x.q, x.r);
}

static inline __m512i x8_load2(const int8_t *lo, const int8_t *hi)
{
    return x8_pair(_mm256_loadu_si256((const __m256i *)lo),
                   hi ? _mm256_loadu_si256((const __m256i *)hi) : _mm256_setzero_si256());
}

/* Blocks b and b + 1 of x (b + 1 only if odd_too; else zeros). */
static inline x8_xv x8_load_x(const wpi_xq *xq, size_t b, int odd_too)
{
    x8_xv v = {x8_load2(xq[b].q, odd_too ? xq[b + 1].q : NULL),
               x8_load2(xq[b].r, odd_too ? xq[b + 1].r : NULL)};
    return v;
}

static inline __m512 x8_scaled(__m512i s, float d0, float d1, __m512 acc)
{
    __m512 d = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(d0), _mm512_set1_ps(d1));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d, acc);
}

/* Blocks b and b + 1 (b + 1 only if two) dotted and scaled into acc. W(p) is block p's
 * weights as 32 bytes (a __m256i), D(p, b) its scale times x's, DOT the product kernel. */
#define X8_PAIR(acc, bytes, W, D, DOT, b, two)                                           \
    do {                                                                                 \
        const uint8_t *p0 = row + (b) * (bytes), *p1 = p0 + (bytes);                     \
        __m512i w = x8_pair(W(p0), (two) ? W(p1) : _mm256_setzero_si256());              \
        acc = x8_scaled(DOT(w, x8_load_x(xq, (b), (two))), D(p0, (b)),                   \
                        (two) ? D(p1, (b) + 1) : 0.0f, acc);                             \
    } while (0)

/* The loop over block pairs, alternate pairs into two accumulators; EXTRA(p, b) is a
 * per-block float added to a third sum. */
#define X8_ROW(name, bytes, W, D, EXTRA, DOT)                                            \
    static float name(const uint8_t *row, const wpi_xq *xq, size_t nb)                   \
    {                                                                                    \
        __m512 e = _mm512_setzero_ps(), o = e;                                           \
        float extra = 0.0f;                                                              \
        size_t b = 0;                                                                    \
        for (; b + 4 <= nb; b += 4) {                                                    \
            X8_PAIR(e, bytes, W, D, DOT, b, 1);                                          \
            X8_PAIR(o, bytes, W, D, DOT, b + 2, 1);                                      \
        }                                                                                \
        for (; b < nb; b += 2)                                                           \
            X8_PAIR(e, bytes, W, D, DOT, b, b + 1 < nb);                                 \
        for (b = 0; b < nb; b++)                                                         \
            extra += EXTRA(row + b * (bytes), b);                                        \
        return _mm512_reduce_add_ps(_mm512_add_ps(e, o)) + extra;                        \
    }

/* The same for 4 tokens (wpi_row_dot4_x8_fn), each weight pair decoded once: every
 * token's sums are formed in X8_ROW's order, so each out[k] equals X8_ROW's result. */
#define X8_ROW4(name, bytes, W, D, EXTRA, DOT)                                           \
    static void name(const uint8_t *row, const wpi_xq *const xt[4], size_t nb,           \
                     float out[4])                                                       \
    {                                                                                    \
        __m512 e[4], o[4];                                                               \
        for (int k = 0; k < 4; k++)                                                      \
            e[k] = o[k] = _mm512_setzero_ps();                                           \
        size_t b = 0;                                                                    \
        for (; b + 4 <= nb; b += 4) {                                                    \
            const uint8_t *p0 = row + b * (bytes), *p1 = p0 + (bytes);                   \
            const uint8_t *p2 = p1 + (bytes), *p3 = p2 + (bytes);                        \
            __m512i w01 = x8_pair(W(p0), W(p1)), w23 = x8_pair(W(p2), W(p3));            \
            for (int k = 0; k < 4; k++) {                                                \
                const wpi_xq *xq = xt[k];                                                \
                e[k] = x8_scaled(DOT(w01, x8_load_x(xq, b, 1)), D(p0, b), D(p1, b + 1),  \
                                 e[k]);                                                  \
                o[k] = x8_scaled(DOT(w23, x8_load_x(xq, b + 2, 1)), D(p2, b + 2),        \
                                 D(p3, b + 3), o[k]);                                    \
            }                                                                            \
        }                                                                                \
        for (; b < nb; b += 2) {                                                         \
            int two = b + 1 < nb;                                                        \
            const uint8_t *p0 = row + b * (bytes), *p1 = p0 + (bytes);                   \
            __m512i w = x8_pair(W(p0), two ? W(p1) : _mm256_setzero_si256());            \
            for (int k = 0; k < 4; k++) {                                                \
                const wpi_xq *xq = xt[k];                                                \
                e[k] = x8_scaled(DOT(w, x8_load_x(xq, b, two)), D(p0, b),                \
                                 two ? D(p1, b + 1) : 0.0f, e[k]);                       \
            }                                                                            \
        }                                                                                \
        for (int k = 0; k < 4; k++) {                                                    \
            const wpi_xq *xq = xt[k];                                                    \
            float extra = 0.0f;                                                          \
            (void)xq; /* read by EXTRA only where there is one */                        \
            for (b = 0; b < nb; b++)                                                     \
                extra += EXTRA(row + b * (bytes), b);                                    \
            out[k] = _mm512_reduce_add_ps(_mm512_add_ps(e[k], o[k])) + extra;            \
        }                                                                                \
    }

#define X8_DOT_US x8_dot_us

X8_ROWS

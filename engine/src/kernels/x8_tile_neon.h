/*
 * x8_tile_neon.h -- the 8-bit-activation tile kernels (x8_tile.h) on AArch64 Advanced
 * SIMD, tiles of 4 rows x X8N_T (4) tokens. Included by kernels_x8_neon.c and
 * kernels_x8_neondot.c, which define x8n_dot(acc, a0, a1, b0, b1) (acc plus, per int32
 * lane, the products of four signed byte pairs of a0 * b0 and four of a1 * b1: SDOT, or
 * SMULL/SMLAL pairs into int16 and SADALP), X8N_NAME and X8N_TABLE.
 *
 * Every weight is a signed byte as the scalar twin decodes it (kernels_x8_tile_ref.c:
 * q8_0 q; q4_0 nibble - 8; q4_1 nibble; mxfp4 twice the code's value by the byte table),
 * low nibbles weights 0..15, high 16..31, so the activations are used as stored. Per block
 * and (row, token) the lanes hold 256 * sum(w q) + sum(w r) (the q plane's dot, shifted
 * by 8, is the r plane's starting value), and three pairwise adds make the 4 rows'
 * integers, exact, one per float lane. Then, row by row in lanes, the twin's operations
 * in its order: the integer to float, times (d_w / 256) * d, added to the sum (block by
 * block from 0), then q4_1's m * s. A result therefore depends on its (row, token) alone
 * (the rows of a ragged last tile repeat its last row and are not stored), the two
 * including files' tables are equal bit for bit, and both equal the twin bit for bit
 * where the compiler keeps the twin's multiply and add apart (gcc -std=c11; clang fuses
 * them, within x8_tile.h's contract).
 * Private to engine/src/kernels/.
 */
#include <arm_neon.h>
#include <stdint.h>
#include <string.h>

#include "kernels/blocks.h"
#include "kernels/x8_tile.h"

#define X8N_INLINE static inline __attribute__((always_inline))
#define X8N_R 4 /* rows per tile: one float lane each */
#ifndef X8N_T
/* tokens per tile: each block's decode (loads, nibbles, scales) serves 4 tokens; the 4 x 4
 * tile's 8 weight, 4 activation and 4 sum vectors fit the 32 registers without spills
 * (gcc 12 and clang 14 -O2, both variants) */
#define X8N_T 4
#endif

/* The 32 weights of block p of slot index k (q8_0, q4_0, q4_1, mxfp4) as signed bytes:
 * weights 0..15 in w[0], 16..31 in w[1]. */
X8N_INLINE void x8n_weights(int k, const uint8_t *p, int8x16_t w[2])
{
    static const int8_t mxfp4_x2[16] = {WPI_MXFP4_X2};
    if (k == 0) {
        w[0] = vld1q_s8((const int8_t *)p + 2);
        w[1] = vld1q_s8((const int8_t *)p + 18);
        return;
    }
    uint8x16_t v = vld1q_u8(p + (k == 1 ? 2 : k == 2 ? 4 : 1));
    uint8x16_t lo = vandq_u8(v, vdupq_n_u8(15)), hi = vshrq_n_u8(v, 4);
    if (k == 3) {
        int8x16_t lut = vld1q_s8(mxfp4_x2);
        w[0] = vqtbl1q_s8(lut, lo);
        w[1] = vqtbl1q_s8(lut, hi);
    } else if (k == 1) {
        w[0] = vsubq_s8(vreinterpretq_s8_u8(lo), vdupq_n_s8(8));
        w[1] = vsubq_s8(vreinterpretq_s8_u8(hi), vdupq_n_s8(8));
    } else {
        w[0] = vreinterpretq_s8_u8(lo);
        w[1] = vreinterpretq_s8_u8(hi);
    }
}

/* The f16 at offset o of each of the 4 blocks, as floats (exact). */
X8N_INLINE float32x4_t x8n_f16(const uint8_t *const p[X8N_R], size_t o)
{
    uint16_t h[X8N_R];
    for (int i = 0; i < X8N_R; i++)
        memcpy(&h[i], p[i] + o, 2);
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}

/* The 4 blocks' weight scales over 256: d_w / 256 (the twin's dw / 256.0f: both exact
 * powers-of-two scalings of the same value, so equal). */
X8N_INLINE float32x4_t x8n_dw256(int k, const uint8_t *const p[X8N_R])
{
    float32x4_t dw;
    if (k == 3) {
        float e[X8N_R];
        for (int i = 0; i < X8N_R; i++)
            e[i] = wpi_e8m0_half(p[i][0]);
        dw = vld1q_f32(e);
    } else {
        dw = x8n_f16(p, 0);
    }
    return vmulq_n_f32(dw, 1.0f / 256.0f);
}

/* 4 rows (row i at p[i]) times T tokens, block by block; y[t * ldy + i] for i < nr. */
X8N_INLINE void x8n_tile(const int k, const size_t bytes, const int T,
                         const uint8_t *const p0[X8N_R], size_t rb, size_t nr,
                         const wpi_xq *xq, size_t ldq, size_t nb, float *y, size_t ldy)
{
    float32x4_t acc[X8N_T];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        acc[t] = vdupq_n_f32(0.0f);
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *p[X8N_R];
        int8x16_t w[X8N_R][2];
#pragma GCC unroll 4
        for (int i = 0; i < X8N_R; i++) {
            p[i] = p0[i] + b * bytes;
            /* the next tile's rows: rows read side by side defeat a stride prefetcher */
            __builtin_prefetch(p[i] + X8N_R * rb + 64);
            x8n_weights(k, p[i], w[i]);
        }
        float32x4_t dw = x8n_dw256(k, p);
        float32x4_t m = vdupq_n_f32(0.0f);
        if (k == 2)
            m = x8n_f16(p, 2);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const wpi_xq *x = xq + t * ldq + b;
            int8x16_t q0 = vld1q_s8(x->q), q1 = vld1q_s8(x->q + 16);
            int8x16_t r0 = vld1q_s8(x->r), r1 = vld1q_s8(x->r + 16);
            int32x4_t s[X8N_R];
#pragma GCC unroll 4
            for (int i = 0; i < X8N_R; i++) {
                int32x4_t sq = x8n_dot(vdupq_n_s32(0), w[i][0], w[i][1], q0, q1);
                s[i] = x8n_dot(vshlq_n_s32(sq, 8), w[i][0], w[i][1], r0, r1);
            }
            /* lane i: row i's 256 * sum(w q) + sum(w r), exact in int32 */
            int32x4_t si = vpaddq_s32(vpaddq_s32(s[0], s[1]), vpaddq_s32(s[2], s[3]));
            acc[t] = vaddq_f32(acc[t], vmulq_f32(vcvtq_f32_s32(si), vmulq_n_f32(dw, x->d)));
            if (k == 2)
                acc[t] = vaddq_f32(acc[t], vmulq_n_f32(m, x->s));
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        float out[X8N_R];
        vst1q_f32(out, acc[t]);
        for (size_t i = 0; i < nr; i++)
            y[t * ldy + i] = out[i];
    }
}

_Static_assert(X8N_T >= 1 && X8N_T <= 4, "x8n_tokens has cases for 1..4 tokens");

/* Rows [i, i + nr) (nr <= 4; a ragged tile repeats its last row) times nt <= X8N_T
 * tokens. */
X8N_INLINE void x8n_tokens(const int k, const size_t bytes, const uint8_t *w, size_t rb,
                           size_t nr, size_t nt, const wpi_xq *xq, size_t ldq, size_t nb,
                           float *y, size_t ldy)
{
    const uint8_t *p[X8N_R];
    for (size_t i = 0; i < X8N_R; i++)
        p[i] = w + (i < nr ? i : nr - 1) * rb;
    switch (nt) {
    case 1: x8n_tile(k, bytes, 1, p, rb, nr, xq, ldq, nb, y, ldy); break;
    case 2: x8n_tile(k, bytes, 2 <= X8N_T ? 2 : 1, p, rb, nr, xq, ldq, nb, y, ldy); break;
    case 3: x8n_tile(k, bytes, 3 <= X8N_T ? 3 : 1, p, rb, nr, xq, ldq, nb, y, ldy); break;
    default: x8n_tile(k, bytes, X8N_T, p, rb, nr, xq, ldq, nb, y, ldy); break;
    }
}

/* The tile kernel of slot index k: tokens in groups of X8N_T (the activations of a group
 * stay in L1 while every row passes), rows in tiles of 4. */
#define X8N_FN(name, k, bytes)                                                           \
    static void name(const uint8_t *w, size_t rb, size_t nr, const wpi_xq *xq, size_t ldq, \
                     size_t nt, size_t nb, float *y, size_t ldy)                         \
    {                                                                                    \
        for (size_t t = 0; t < nt; t += X8N_T) {                                         \
            size_t n = nt - t < X8N_T ? nt - t : X8N_T;                                  \
            for (size_t i = 0; i < nr; i += X8N_R)                                       \
                x8n_tokens(k, bytes, w + i * rb, rb, nr - i < X8N_R ? nr - i : X8N_R, n, \
                           xq + t * ldq, ldq, nb, y + t * ldy + i, ldy);                 \
        }                                                                                \
    }

WPI_X8_TILE_TABLE(X8N_FN, x8n, X8N_TABLE, X8N_NAME, 0)

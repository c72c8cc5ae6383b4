/*
 * x8_tile_body.h -- the 8-bit-activation tile kernels (x8_tile.h) over a vector width
 * that x8_tile_w512.h or x8_tile_w256.h defines (xt_i / xt_f, X8T_G blocks per vector,
 * tiles of X8T_R rows x X8T_T tokens). The ISA file defines X8_DPBUSD(acc, u, s) (acc plus,
 * per int32 lane, four unsigned-by-signed byte products), X8T_FLIP (1 where X8_DPBUSD is
 * vpdpbusd, which cannot saturate; 0 for maddubs, whose int16 pairs can), X8T_TABLE and
 * optionally X8T_DOT2.
 *
 * Per block group (X8T_G blocks) and (row, token), the two activation planes give
 * 256 * sum(w q) + sum(w r) in int32 lanes:
 *   weights held as unsigned bytes u = w + bias (q4_0: the nibble, bias 8; with X8T_FLIP
 *     in one-token tiles also q8_0: w ^ 0x80, bias 128, and mxfp4: twice the code's
 *     value plus 12 by the byte table, bias 12) times the signed q and r; the bias times
 *     the token's block, the same for every row, is formed once per token as the lanes'
 *     starting value;
 *   q8_0, mxfp4 in tiles of 2..4 tokens, X8T_FLIP: q + 128 and r + 128 (once per token)
 *     times w, each plane's lanes starting at -128 * sum(w) (once per row);
 *   q4_1: the unsigned nibbles, no bias;
 *   with X8T_NIB16 (X8T_FLIP) a q4 block's high nibbles stay in place, 16 times the
 *     weight, in the lanes of weights 16..31 (exact: those lanes are multiples of 16);
 *   q8_0, mxfp4 without X8T_FLIP: |w| times q and r negated where w < 0 (but mxfp4's
 *     lone token biased as above where the ISA file sets X8T_MXFP4_BIASED).
 * The lanes are converted to float and added to the (row, token) accumulator times
 * d_w * (d * f): f = 1 / 256 (1 / 4096 in the high nibbles' lanes; mxfp4's d_w is twice
 * the half scale, f = 1 / 512), one multiply of the row's and the token's per-lane
 * scales; the f16 scales are converted as vectors, mxfp4's built from their bits (for a
 * lone token's 8 rows, 16 at a time by one gather). q4_1 adds m * (s / 8) in each of its
 * block's 8 lanes. The accumulator's lanes are summed once at the end. Every step is per
 * (row, token), so a tile's shape never changes a result.
 * Private to engine/src/kernels/.
 */
#include "kernels/x8_tile.h"

#define X8T_INLINE static inline __attribute__((always_inline))
#define X8T_RMAX (X8T_R1 > X8T_R ? X8T_R1 : X8T_R)
#define X8T_SIGNED(k) ((k) == 0 || (k) == 3) /* slot index k: q8_0, q4_0, q4_1, mxfp4 */
/* Nibbles kept in place (xt_nib16: a block's high nibble as 16 times its value, scaled
 * back by the float factor of those lanes) where the byte products sum in int32
 * (vpdpbusd); maddubs' int16 pairs would saturate on 240 * 127 * 2. */
#ifndef X8T_NIB16
#define X8T_NIB16 X8T_FLIP
#endif
/* Weights held as unsigned bytes w + bias, the bias times the token's block subtracted
 * once per token: q4_0 (bias 8), and in tiles of one token with X8T_FLIP q8_0 (128) and
 * mxfp4 (12, on twice the code's value). In tiles of T > 1 tokens these two take the
 * activations + 128 instead (X8T_XFLIP: the correction -128 * sum(w) once per row, as T
 * per-token corrections over the few rows would cost more). The int32 sums are exact
 * either way, so a token's outputs do not depend on the tile. */
/* Without X8T_FLIP, an ISA file may set X8T_MXFP4_BIASED: mxfp4's lone token then
 * takes the biased weights too (maddubs cannot saturate on 24 * 127 * 2), in place of
 * the sign trick's three byte operations per row. */
#ifndef X8T_MXFP4_BIASED
#define X8T_MXFP4_BIASED 0
#endif
#define X8T_BIASED(k, T)                                                                 \
    ((k) == 1 ||                                                                         \
     (X8T_SIGNED(k) && (T) == 1 && (X8T_FLIP || (X8T_MXFP4_BIASED && (k) == 3))))
#define X8T_XFLIP(k, T) (X8T_FLIP && X8T_SIGNED(k) && (T) > 1)
/* Signed weights by the sign trick: |w| times q and r negated where w < 0. */
#define X8T_SIGNTRICK(k, T) (X8T_SIGNED(k) && !X8T_FLIP && !X8T_BIASED(k, T))

/* The bias of slot index k as bytes, in the weights' lane layout. */
X8T_INLINE xt_i xt_bias(int k)
{
    switch (k) {
    case 0: return xt_set1_i8(-128);
    case 1: return X8T_NIB16 ? xt_eight16() : xt_set1_i8(8);
    default: return xt_set1_i8(12);
    }
}

/* 256 * sum(u q) + sum(u r) + start, per lane: u unsigned, q and r signed bytes (the ISA
 * file may define its own). */
#ifndef X8T_DOT2
#define X8T_DOT2(start, u, q, r)                                                         \
    xt_add(xt_shl8(X8_DPBUSD(xt_zero_i(), (u), (q))), X8_DPBUSD((start), (u), (r)))
#endif

/* The weights of the group at p (and p1, or none where p1 is NULL), for slot index k. */
X8T_INLINE xt_i xt_weights(int k, int biased, const uint8_t *p, const uint8_t *p1)
{
    switch (k) {
    case 0:
        if (biased) /* w + 128, unsigned */
            return xt_xor(xt_bytes(p + 2, p1 ? p1 + 2 : NULL), xt_set1_i8(-128));
        return xt_bytes(p + 2, p1 ? p1 + 2 : NULL);
    case 1: return X8T_NIB16 ? xt_nib16(p + 2, p1 ? p1 + 2 : NULL)
                             : xt_nibbles(p + 2, p1 ? p1 + 2 : NULL);
    case 2: return X8T_NIB16 ? xt_nib16(p + 4, p1 ? p1 + 4 : NULL)
                             : xt_nibbles(p + 4, p1 ? p1 + 4 : NULL);
    default: /* with X8T_FLIP, twice the code's value plus 12, unsigned */
        return biased ? xt_mxfp4u(xt_nibbles(p + 1, p1 ? p1 + 1 : NULL))
                        : xt_mxfp4(xt_nibbles(p + 1, p1 ? p1 + 1 : NULL));
    }
}

/* The weight scales of the group at p (and p1), each in its block's lanes: f16 ones
 * converted as a vector, mxfp4's 2^(e - 127) built from its bits. */
X8T_INLINE xt_f xt_dw(int k, const uint8_t *p, const uint8_t *p1)
{
    if (k == 3) /* twice the half scale; the token's factor halves it */
        return xt_seg_e8m0(p, p1);
    return xt_seg_h(p, p1);
}

/* Block group b (X8T_G blocks, or one where two is 0) of R rows (row i at w + i * rb)
 * times T tokens, added to acc. */
X8T_INLINE void xt_group(const int k, const size_t bytes, const int R, const int T,
                         const uint8_t *w, size_t rb, const wpi_xq *xq, size_t ldq, size_t b,
                         const int two, xt_f acc[X8T_RMAX][X8T_T])
{
    xt_i wv[X8T_RMAX], wk[X8T_RMAX]; /* wk: |w| (signed weights without X8T_FLIP) */
    xt_f dw[X8T_RMAX], mw[X8T_RMAX];
#if X8T_GATHER
    /* mxfp4's lone token: the weight scales of the tile's 2R blocks, row i's pair in
     * lanes 2i and 2i + 1, in one gather (2.5x fewer instructions than row by row; a loss
     * for the other dtypes and the 4-row tiles) */
    const int gather = k == 3 && R == X8T_R1 && T == 1;
    xt_f ds = xt_zero_f();
    if (gather) {
        const __mmask16 gm = (__mmask16)(((1u << (2 * R)) - 1) & (two ? 0xffffu : 0x5555u));
        ds = xt_gather_e8m0(w + b * bytes, xt_gather_index(rb, bytes), gm);
    }
#else
    const int gather = 0;
#endif
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        const uint8_t *p = w + i * rb + b * bytes, *p1 = two ? p + bytes : NULL;
        /* the next tile's rows into L1, and the fourth tile ahead into L2: R rows read side
         * by side defeat the hardware prefetch of weights streamed from DRAM (1.4x slower
         * at n_tok = 1 on [32768 x 1024] q8_0 without the first; the second, one token on
         * [500000 x 2048] (1.1 GB, past the last-level cache), AVX-512 VNNI: q8_0 10.6 ->
         * 12.0 GB/s, q4_0 9.8 -> 13.2, docs/BENCHMARKS.md); a step of more than a line
         * (q8_0's two blocks, 68 bytes) prefetches the next line too, else every
         * sixteenth line came from DRAM on demand (q8_0 on that shape 11.6 -> 12.5) */
        _mm_prefetch((const char *)(p + R * rb + 64), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + 4 * R * rb + 64), _MM_HINT_T1);
        if ((two ? 2 : 1) * bytes > 64) {
            _mm_prefetch((const char *)(p + R * rb + 128), _MM_HINT_T0);
            _mm_prefetch((const char *)(p + 4 * R * rb + 128), _MM_HINT_T1);
        }
        wv[i] = xt_weights(k, X8T_BIASED(k, T), p, p1);
        if (!gather)
            dw[i] = xt_dw(k, p, p1);
        if (k == 2)
            mw[i] = xt_seg_h(p + 2, p1 ? p1 + 2 : NULL);
        if (X8T_XFLIP(k, T)) /* each plane's start: -128 * sum(w) */
            wk[i] = xt_sub(xt_zero_i(), X8_DPBUSD(xt_zero_i(), xt_set1_i8(-128), wv[i]));
        else if (X8T_SIGNTRICK(k, T))
            wk[i] = xt_abs8(wv[i]);
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++) {
        const wpi_xq *x = xq + t * ldq + b;
        xt_i q = xt_bytes(x[0].q, two ? x[1].q : NULL);
        xt_i r = xt_bytes(x[0].r, two ? x[1].r : NULL);
        /* the token's scale over 256 (over 4096 in the lanes of 16 times the nibble) */
        xt_f dx = xt_mul(xt_seg(x[0].d, two ? x[1].d : 0.0f),
                         (k == 1 || k == 2) && X8T_NIB16 ? xt_lane_scale16()
                         : k == 3                        ? xt_set1_f(1.0f / 512.0f)
                                                         : xt_set1_f(1.0f / 256.0f));
#if X8T_GATHER
        /* gathered: d_w * (d / 512) per block, the same products as dw[i] * dx */
        xt_f dd = xt_zero_f();
        if (gather)
            dd = xt_mul(ds, xt_pairs(x[0].d / 512.0f, two ? x[1].d / 512.0f : 0.0f));
#endif
        xt_f sx = xt_zero_f();
        xt_i start = xt_zero_i();
        if (X8T_BIASED(k, T)) /* the weights' bias times the token's block, once per token */
            start = xt_sub(xt_zero_i(), X8T_DOT2(xt_zero_i(), xt_bias(k), q, r));
        if (X8T_XFLIP(k, T)) { /* q + 128, r + 128 */
            q = xt_xor(q, xt_set1_i8(-128));
            r = xt_xor(r, xt_set1_i8(-128));
        }
        if (k == 2)
            sx = xt_seg(x[0].s / 8.0f, two ? x[1].s / 8.0f : 0.0f);
#pragma GCC unroll 8
        for (int i = 0; i < R; i++) {
            xt_i s;
            if (X8T_XFLIP(k, T))
                s = xt_add(xt_shl8(X8_DPBUSD(wk[i], q, wv[i])), X8_DPBUSD(wk[i], r, wv[i]));
            else if (X8T_SIGNTRICK(k, T))
                s = X8T_DOT2(xt_zero_i(), wk[i], xt_sign8(q, wv[i]), xt_sign8(r, wv[i]));
            else
                s = X8T_DOT2(start, wv[i], q, r);
#if X8T_GATHER
            if (gather)
                acc[i][t] = xt_fma(xt_cvt(s), xt_row_pair(dd, i), acc[i][t]);
            else
#endif
                acc[i][t] = xt_fma(xt_cvt(s), xt_mul(dw[i], dx), acc[i][t]);
            if (k == 2)
                acc[i][t] = xt_fma(mw[i], sx, acc[i][t]);
        }
    }
}

/* R rows times T tokens: the whole groups, then a last lone block. */
X8T_INLINE void xt_tile(const int k, const size_t bytes, const int R, const int T,
                        const uint8_t *w, size_t rb, const wpi_xq *xq, size_t ldq, size_t nb,
                        float *y, size_t ldy)
{
    xt_f acc[X8T_RMAX][X8T_T];
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            acc[i][t] = xt_zero_f();
    size_t b = 0;
    for (; b + X8T_G <= nb; b += X8T_G)
        xt_group(k, bytes, R, T, w, rb, xq, ldq, b, X8T_G == 2, acc);
    if (b < nb)
        xt_group(k, bytes, R, T, w, rb, xq, ldq, b, 0, acc);
#pragma GCC unroll 8
    for (int i = 0; i < R; i++)
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            y[t * ldy + i] = xt_reduce(acc[i][t]);
}

_Static_assert(X8T_T >= 1 && X8T_T <= 4, "xt_tokens has cases for 1..4 tokens");

/* R rows times nt <= X8T_T tokens. */
X8T_INLINE void xt_tokens(const int k, const size_t bytes, const int R, size_t nt,
                          const uint8_t *w, size_t rb, const wpi_xq *xq, size_t ldq, size_t nb,
                          float *y, size_t ldy)
{
    switch (nt) {
    case 1: xt_tile(k, bytes, R, 1, w, rb, xq, ldq, nb, y, ldy); break;
    case 2: xt_tile(k, bytes, R, 2 <= X8T_T ? 2 : 1, w, rb, xq, ldq, nb, y, ldy); break;
    case 3: xt_tile(k, bytes, R, 3 <= X8T_T ? 3 : 1, w, rb, xq, ldq, nb, y, ldy); break;
    default: xt_tile(k, bytes, R, X8T_T, w, rb, xq, ldq, nb, y, ldy); break;
    }
}

/* The tile kernel of slot index k: tokens in groups of X8T_T (the activations of a group
 * stay in L1 while every row passes), rows in tiles of X8T_R, a ragged last few rows one
 * at a time. */
#define X8T_FN(name, k, bytes)                                                           \
    static void name(const uint8_t *w, size_t rb, size_t nr, const wpi_xq *xq, size_t ldq, \
                     size_t nt, size_t nb, float *y, size_t ldy)                         \
    {                                                                                    \
        for (size_t t = 0; t < nt; t += X8T_T) {                                         \
            size_t n = nt - t < X8T_T ? nt - t : X8T_T;                                  \
            const wpi_xq *x = xq + t * ldq;                                              \
            size_t i = 0;                                                                \
            for (; n == 1 && i + X8T_R1 <= nr; i += X8T_R1)                              \
                xt_tile(k, bytes, X8T_R1, 1, w + i * rb, rb, x, ldq, nb, y + t * ldy + i, \
                        ldy);                                                            \
            for (; i + X8T_R <= nr; i += X8T_R)                                          \
                xt_tokens(k, bytes, X8T_R, n, w + i * rb, rb, x, ldq, nb, y + t * ldy + i, \
                          ldy);                                                          \
            for (; i < nr; i++)                                                          \
                xt_tokens(k, bytes, 1, n, w + i * rb, rb, x, ldq, nb, y + t * ldy + i,   \
                          ldy);                                                          \
        }                                                                                \
    }

WPI_X8_TILE_TABLE(X8T_FN, x8t, X8T_TABLE, X8_NAME, 0)

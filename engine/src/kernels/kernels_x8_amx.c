/*
 * kernels_x8_amx.c -- 8-bit-activation tile kernels (x8_tile.h) on AMX-INT8 tiles.
 *
 * One TDPBSSD multiplies a block (K = 32 bytes) of up to 16 tokens by the same block of
 * 16 weight rows into int32 sums, exact; the two activation planes take one each:
 *   A (tokens x 32 bytes): the q or r bytes of the tokens' block b, loaded in place from
 *     the wpi_xq array (row stride ldq * sizeof(wpi_xq));
 *   B (8 x 64 bytes): the rows' weights of block b as signed bytes (q8_0 q, q4_0 nibble
 *     - 8, q4_1 nibble, mxfp4 twice the code's value), four consecutive weights of a row
 *     per dword, rows in dword order: 16 rows x 32 bytes transposed by dwords in
 *     registers;
 *   C (tokens x 16 int32): sum(w q) and sum(w r), stored per block.
 * Per (token, row) the block's 256 * sum(w q) + sum(w r) is formed in int32 (exact, as in
 * the scalar twin), converted to float and added to the sum times (d_w / 256) * d, then
 * q4_1's m * s: the scalar twin's operations, the last two fused. Every step is per
 * (row, token) and in block order, so a token's outputs do not depend on the rows, the
 * tokens or the tile it shares a call with.
 *
 * Rows go in groups of 16, a ragged last group with zero weights in its missing rows,
 * masked on store. A group's blocks are packed (B's layout and the scales) up to
 * AMX_PACK at a time and read by every group of 16 tokens: a group's token count is the
 * tiles' height (the A and C tiles are configured for it), while the float side runs 4,
 * 8 or 16 rows, the unused ones on a clamped token and never stored.
 *
 * dispatch.c offers this table only where the CPU has AMX-TILE and AMX-INT8, the OS
 * lets the process use the tile data (platform.c) and the AVX-512 VNNI set runs; the set
 * sends steps of fewer than WPI_AMX_MIN_TOK tokens to the AVX-512 VNNI tiles (matmul.c).
 * Compiles to nothing off x86-64.
 */
#include "kernels/blocks.h"

#if defined(__x86_64__)

#if defined(__clang__)
#pragma clang attribute push(                                                            \
    __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx2,fma,f16c"))), \
    apply_to = function)
#else
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#endif

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/x8_tile.h"

#define AMX_INLINE static inline __attribute__((always_inline))

/* The tile registers: C of the q and r planes, A of the q and r planes, B. (The tile
 * intrinsics take the register's number as a literal, so the wrappers expand these
 * first.) */
#define T_CQ 0
#define T_CR 1
#define T_AQ 2
#define T_AR 3
#define T_B 4
#define AMX_ZERO(t) _tile_zero(t)
#define AMX_LOAD(t, p, stride) _tile_loadd(t, p, stride)
#define AMX_STORE(t, p, stride) _tile_stored(t, p, stride)
#define AMX_DPBSSD(c, a, b) _tile_dpbssd(c, a, b)

/* LDTILECFG's 64-byte operand (palette 1). */
typedef struct amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* A and C tiles of n token rows (1..16), B of 8 rows of 64 bytes. */
static void amx_config(unsigned n)
{
    _Alignas(64) amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    c.rows[T_CQ] = c.rows[T_CR] = (uint8_t)n;
    c.colsb[T_CQ] = c.colsb[T_CR] = 64;
    c.rows[T_AQ] = c.rows[T_AR] = (uint8_t)n;
    c.colsb[T_AQ] = c.colsb[T_AR] = 32;
    c.rows[T_B] = 8;
    c.colsb[T_B] = 64;
    /* in asm with the whole struct as its operand: gcc 12 drops the stores ahead of
     * _tile_loadconfig as dead */
    __asm__ volatile("ldtilecfg %0" : : "m"(c));
}

/* Block b's 16 nibble bytes of two rows (n1 NULL: zeros) as 64 bytes: row 0's weights
 * 0..15 (low nibbles), 16..31 (high), then row 1's. */
AMX_INLINE __m512i amx_nibbles(const uint8_t *n0, const uint8_t *n1)
{
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)n0));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)n0), 1);
    if (n1) {
        __m128i h = _mm_loadu_si128((const __m128i *)n1);
        v = _mm512_inserti32x4(_mm512_inserti32x4(v, h, 2), h, 3);
    }
    v = _mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4));
    v = _mm512_and_si512(v, _mm512_set1_epi8(15));
    return n1 ? v : _mm512_maskz_mov_epi64(0x0f, v);
}

/* Two rows' block (p0, and p1 or zeros where NULL) as 32 signed bytes each, for slot
 * index k (q8_0, q4_0, q4_1, mxfp4). */
AMX_INLINE __m512i amx_rows(int k, const uint8_t *p0, const uint8_t *p1)
{
    switch (k) {
    case 0: {
        __m256i a = _mm256_loadu_si256((const __m256i *)(p0 + 2));
        __m256i b = p1 ? _mm256_loadu_si256((const __m256i *)(p1 + 2)) : _mm256_setzero_si256();
        return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
    }
    case 1: {
        __m512i v = amx_nibbles(p0 + 2, p1 ? p1 + 2 : NULL);
        v = _mm512_sub_epi8(v, _mm512_set1_epi8(8));
        return p1 ? v : _mm512_maskz_mov_epi64(0x0f, v);
    }
    case 2: return amx_nibbles(p0 + 4, p1 ? p1 + 4 : NULL);
    default: {
        __m512i t = _mm512_broadcast_i32x4(_mm_setr_epi8(WPI_MXFP4_X2));
        return _mm512_shuffle_epi8(t, amx_nibbles(p0 + 1, p1 ? p1 + 1 : NULL)); /* 0 -> 0 */
    }
    }
}

/* Block b of 16 rows (row i at p + i * rb; rows >= nr zero) into B's layout at out:
 * out dword [kr][i] = row i's weights 4 kr .. 4 kr + 3. */
AMX_INLINE void amx_pack_b(int k, const uint8_t *p, size_t rb, size_t nr, int32_t *out)
{
    __m512i z[8], t[8], u[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) /* rows i and i + 8, 8 dwords each */
        z[i] = (size_t)i < nr ? amx_rows(k, p + i * rb, (size_t)i + 8 < nr ? p + (i + 8) * rb : NULL)
                              : _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm512_unpacklo_epi32(z[i], z[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(z[i], z[i + 1]);
    }
#pragma GCC unroll 2
    for (int h = 0; h < 8; h += 4) {
        u[h + 0] = _mm512_unpacklo_epi64(t[h + 0], t[h + 2]);
        u[h + 1] = _mm512_unpackhi_epi64(t[h + 0], t[h + 2]);
        u[h + 2] = _mm512_unpacklo_epi64(t[h + 1], t[h + 3]);
        u[h + 3] = _mm512_unpackhi_epi64(t[h + 1], t[h + 3]);
    }
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        _mm512_store_si512(out + 16 * c, _mm512_permutex2var_epi64(u[c], lo, u[c + 4]));
        _mm512_store_si512(out + 16 * (c + 4), _mm512_permutex2var_epi64(u[c], hi, u[c + 4]));
    }
}

/* The 16 rows' first four bytes of block b (rows >= nr: zeros). */
AMX_INLINE __m512i amx_heads(const uint8_t *p, size_t rb, __mmask16 m)
{
    const __m512i idx = _mm512_mullo_epi32(_mm512_set1_epi32((int)rb),
                                           _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9,
                                                             10, 11, 12, 13, 14, 15));
    return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, p, 1);
}

/* The low f16 of each dword as float. */
AMX_INLINE __m512 amx_h16(__m512i v)
{
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
}

/* wpi_e8m0_half of the low byte of each dword: 2^(e - 128), e = 0 and 1 subnormal. */
AMX_INLINE __m512 amx_e8m0_half(__m512i v)
{
    __m512i e = _mm512_and_si512(v, _mm512_set1_epi32(255));
    __m512i big = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    __m512i small = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    __mmask16 lt2 = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(lt2, big, small));
}

/* Block b's scales of the 16 rows, d_w / 256 (exact), and q4_1's m (else zeros). */
AMX_INLINE void amx_scales(const int k, const uint8_t *p, size_t rb, __mmask16 rows,
                           __m512 *dw, __m512 *mw)
{
    __m512i head = amx_heads(p, rb, rows);
    *dw = _mm512_mul_ps(k == 3 ? amx_e8m0_half(head) : amx_h16(head),
                        _mm512_set1_ps(1.0f / 256.0f));
    *mw = k == 2 ? amx_h16(_mm512_srli_epi32(head, 16)) : _mm512_setzero_ps();
}

/* Block b's products (B packed at bt) into the C buffers cq, cr. */
AMX_INLINE void amx_block(const wpi_xq *x, size_t b, size_t stride, const int32_t *bt,
                          int32_t *cq, int32_t *cr)
{
    AMX_ZERO(T_CQ);
    AMX_ZERO(T_CR);
    AMX_LOAD(T_AQ, x[b].q, stride);
    AMX_LOAD(T_AR, x[b].r, stride);
    AMX_LOAD(T_B, bt, 64);
    AMX_DPBSSD(T_CQ, T_AQ, T_B);
    AMX_DPBSSD(T_CR, T_AR, T_B);
    AMX_STORE(T_CQ, cq, 64);
    AMX_STORE(T_CR, cr, 64);
}

/* Block b's sums in cq, cr (token t's row t) scaled into acc. */
AMX_INLINE void amx_scale(const int k, const int T, const wpi_xq *const *px, size_t b,
                          const int32_t *cq, const int32_t *cr, __m512 dw, __m512 mw,
                          __m512 *acc)
{
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) {
        __m512i s = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(cq + 16 * t), 8),
                                     _mm512_load_si512(cr + 16 * t));
        __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(px[t][b].d));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), scale, acc[t]);
        if (k == 2)
            acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(px[t][b].s), acc[t]);
    }
}

/* A block of 16 rows in B's layout, and its scales (amx_scales). */
typedef struct amx_pk {
    int32_t bt[128];
    __m512 dw, mw;
} amx_pk;

/* Blocks per packing: 40 KiB, which stay in L1 or L2 while every token group reads them. */
#define AMX_PACK 64

/* The rows of one group and its packed blocks (w NULL once packed). */
typedef struct amx_rows_pk {
    const uint8_t *w; /* row i at w + i * rb, nr of them (up to 16); NULL: pk is filled */
    size_t rb, nr;
    __mmask16 rows;
    amx_pk *pk;
} amx_rows_pk;

/* One group: blocks b0 .. b0 + nbc - 1 of up to 16 rows times n <= T tokens (token t's
 * blocks at x + t * ldq), the A and C tiles configured for n rows, into y (token t's row
 * at y + t * ldy), added to what y holds when `more` (the sums of the blocks before b0:
 * the float side goes on in block order, exactly as in one pass). The first group of a
 * pass packs each block just before its product (the packing overlaps the tiles' work);
 * the others read the packed blocks. Two C buffers: block j's tiles are stored while
 * block j - 1's sums are scaled. */
AMX_INLINE void amx_group(const int k, const size_t bytes, const int T, const amx_rows_pk *g,
                          size_t b0, size_t nbc, const wpi_xq *x, size_t ldq, size_t n,
                          int more, float *y, size_t ldy)
{
    amx_pk *pk = g->pk;
    const __mmask16 rows = g->rows;
    _Alignas(64) int32_t cq[2][256], cr[2][256];
    const wpi_xq *px[16];
    __m512 acc[16];
    const size_t stride = ldq * sizeof(wpi_xq);
#pragma GCC unroll 16
    for (int t = 0; t < T; t++) {
        px[t] = x + ((size_t)t < n ? (size_t)t : n - 1) * ldq;
        acc[t] = more && (size_t)t < n ? _mm512_maskz_loadu_ps(rows, y + (size_t)t * ldy)
                                       : _mm512_setzero_ps();
    }
    memset(cq, 0, sizeof cq); /* the rows >= n of the float side read them, unused */
    memset(cr, 0, sizeof cr);
    for (size_t j = 0; j <= nbc; j++) {
        if (j < nbc) {
            if (g->w) {
                const uint8_t *p = g->w + (b0 + j) * bytes;
                amx_pack_b(k, p, g->rb, g->nr, pk[j].bt);
                amx_scales(k, p, g->rb, rows, &pk[j].dw, &pk[j].mw);
            }
            amx_block(x, b0 + j, stride, pk[j].bt, cq[j & 1], cr[j & 1]);
        }
        if (j > 0)
            amx_scale(k, T, px, b0 + j - 1, cq[(j - 1) & 1], cr[(j - 1) & 1], pk[j - 1].dw,
                      pk[j - 1].mw, acc);
    }
#pragma GCC unroll 16
    for (int t = 0; t < T; t++)
        if ((size_t)t < n)
            _mm512_mask_storeu_ps(y + (size_t)t * ldy, rows, acc[t]);
}

/* Every row and token: rows in groups of 16, each group's blocks packed AMX_PACK at a
 * time and then run by every group of 16 tokens (the tiles reconfigured for a smaller
 * last group), so a weight is decoded once per call whatever the token count. */
AMX_INLINE void amx_tile(const int k, const size_t bytes, const uint8_t *w, size_t rb,
                         size_t nr, const wpi_xq *xq, size_t ldq, size_t nt, size_t nb,
                         float *y, size_t ldy)
{
    _Alignas(64) amx_pk pk[AMX_PACK];
    unsigned configured = 0;
    for (size_t i = 0; i < nr; i += 16) {
        const size_t m = nr - i < 16 ? nr - i : 16;
        for (size_t b0 = 0; b0 < nb || b0 == 0; b0 += AMX_PACK) {
            const size_t nbc = nb - b0 < AMX_PACK ? nb - b0 : AMX_PACK;
            amx_rows_pk g = {w + i * rb, rb, m,
                             (__mmask16)(m >= 16 ? 0xffffu : (1u << m) - 1), pk};
            for (size_t t = 0; t < nt; t += 16, g.w = NULL) {
                const size_t n = nt - t < 16 ? nt - t : 16;
                if (n != configured)
                    amx_config((unsigned)(configured = (unsigned)n));
                const wpi_xq *x = xq + t * ldq;
                float *yo = y + t * ldy + i;
                if (n > 8)
                    amx_group(k, bytes, 16, &g, b0, nbc, x, ldq, n, b0 > 0, yo, ldy);
                else if (n > 4)
                    amx_group(k, bytes, 8, &g, b0, nbc, x, ldq, n, b0 > 0, yo, ldy);
                else
                    amx_group(k, bytes, 4, &g, b0, nbc, x, ldq, n, b0 > 0, yo, ldy);
            }
        }
    }
    _tile_release();
}

#define AMX_FN(name, k, bytes)                                                           \
    static void name(const uint8_t *w, size_t rb, size_t nr, const wpi_xq *xq, size_t ldq, \
                     size_t nt, size_t nb, float *y, size_t ldy)                         \
    {                                                                                    \
        if (nt && nr)                                                                    \
            amx_tile(k, bytes, w, rb, nr, xq, ldq, nt, nb, y, ldy);                      \
    }

/* 16-row groups: a call of a multiple of 16 rows leaves no group part empty */
WPI_X8_TILE_TABLE(AMX_FN, amx, wpi_x8t_amx, "amx", 16)

#if defined(__clang__)
#pragma clang attribute pop
#endif

#endif

/*
 * blocks.h -- the block kernels an ISA file supplies to the matmul driver (matmul.c).
 *
 * The driver owns every loop of a matmul: the row range, the split between one token
 * (a matrix-vector product straight from the stored weights), a few (each row's blocks
 * decoded once into registers and applied to a group of up to WPI_MULTI_TOK tokens, the
 * table's multi kernels, up to a per-dtype multi_max) and many (rows dequantized a
 * chunk at a time into a stack buffer, f32 rows read in place, then applied to the
 * tokens by the table's apply: tiles of 2 rows x 4 tokens in the scalar and NEON
 * tables, 4 x 3 and 2 x 4 in the AVX2 one, 4 rows x 1..4 tokens in the AVX-512 one),
 * the row tiles, the token groups and the column chunks. An ISA file
 * (kernels_ref.c, kernels_avx2.c, kernels_avx512.c, kernels_neon.c) only fills one
 * wpi_blocks table with the kernels below, compiled under its own target pragma.
 * Private to engine/src/kernels/.
 */
#ifndef WP_KERNELS_BLOCKS_H
#define WP_KERNELS_BLOCKS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kernels.h"

/* Dense slot of each dtype in the per-dtype arrays of a table. */
enum {
    WPI_SLOT_F32, WPI_SLOT_F16, WPI_SLOT_BF16, WPI_SLOT_Q8_0, WPI_SLOT_Q4_0, WPI_SLOT_Q4_1,
    WPI_SLOT_MXFP4, WPI_SLOTS
};

#define WPI_TILE_ROWS 8    /* rows dequantized together and sharing one pass over x */
#define WPI_CHUNK_MAX 512  /* the largest chunk of a table: the driver's buffer width */
#define WPI_BUF_ALIGN 64   /* the buffer's alignment: a whole AVX-512 vector */
#define WPI_MULTI_TOK 8    /* the most tokens one multi-kernel call takes */
/* An initializer giving every slot of a per-dtype array the value n. */
#define WPI_EACH_SLOT(n) {n, n, n, n, n, n, n}

/*
 * MXFP4 (docs/FORMAT.md section 1): a 17-byte block is the E8M0 scale byte e, then 16
 * bytes of E2M1 codes (low nibble = weight j, high nibble = weight j + 16, as q4_0). Each
 * file maps a code to twice its value with a byte table (WPI_MXFP4_X2: 0, 0.5, 1, 1.5, 2,
 * 3, 4, 6 doubled, then their negatives; bit 3 is the sign) and multiplies by half the
 * scale, 2^(e - 128): both factors are exact, so a weight is code * 2^(e - 127) in
 * binary32 exactly, inf where that overflows (e >= 253 with large codes). Every kernel
 * multiplies each weight by half the scale before its product with x, as the reference
 * does, so all of them overflow on the same weights.
 */
#define WPI_MXFP4_BYTES 17
#define WPI_MXFP4_X2 0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12

/* 2^(e - 128) as a float, exactly (a subnormal for e < 2); e = 255 is refused at open. */
static inline float wpi_e8m0_half(uint8_t e)
{
    union { uint32_t u; float f; } v;
    v.u = e < 2 ? (uint32_t)0x00200000u << e : (uint32_t)(e - 1) << 23;
    return v.f;
}

/* One weight row (cols weights) dotted with one token's activations. */
typedef float (*wpi_row_dot_fn)(const uint8_t *row, const float *x, size_t cols);
/* n_rows rows, row_bytes apart from w, dotted with one x: y[i] for row i. */
typedef void (*wpi_rows_dot_fn)(const uint8_t *w, size_t row_bytes, size_t n_rows,
                                const float *x, size_t cols, float *y);
/* Weights [c, c + n) of a row as floats into out (n <= the table's chunk; quantized:
 * c % 32 == 0 and n % 32 == 0). out is WPI_BUF_ALIGN-aligned with room for a whole
 * last vector. */
typedef void (*wpi_dequant_fn)(const uint8_t *row, size_t c, size_t n, float *out);
/* nr rows wr (nc floats each, dequantized) applied to every token of x (token t at
 * x + t * ldx): each row's sums over the nc columns are added into y (token t, row i at
 * y[t * ldy + i]); a sum depends on nc only, never on nr, n_tok or the other rows and
 * tokens. Made by WPI_APPLY_TILES from a 2 rows x 4 tokens tile kernel, or by the ISA
 * file around its own tiles. */
typedef void (*wpi_apply_fn)(const float *const wr[], size_t nr, const float *x, size_t ldx,
                             size_t n_tok, size_t nc, float *y, size_t ldy);

/* Several tokens straight from the stored weights: rows [0, n_rows) of w (row_bytes
 * apart, cols weights each) against n_tok tokens (1 <= n_tok <= WPI_MULTI_TOK, token t
 * at x + t * ldx); each 32-weight block of a row is decoded once and applied to every
 * token; y[t * ldy + i] = row i dot token t. Each (row, token) sum is formed in an order
 * that depends on n_tok and cols only, never on n_rows or on the other rows. */
typedef void (*wpi_rows_multi_fn)(const uint8_t *w, size_t row_bytes, size_t n_rows,
                                  const float *x, size_t ldx, size_t n_tok, size_t cols,
                                  float *y, size_t ldy);

typedef struct wpi_blocks {
    const char *name;                      /* "scalar", "avx2", "avx512", "neon" */
    size_t chunk;                          /* columns dequantized at a time (<= max) */
    wpi_row_dot_fn row_dot[WPI_SLOTS];     /* one token: every dtype */
    wpi_rows_dot_fn rows_dot[WPI_SLOTS];   /* optional: replaces the driver's row loop */
    wpi_dequant_fn dequant[WPI_SLOTS];     /* not called for f32: read in place */
    wpi_apply_fn apply;                    /* many tokens */
    /* Optional (NULL: the driver's tiled path): a multi kernel per dtype, used for
     * 2 <= n_tok <= multi_max[slot] (0 or 1: never); a pointer so that a table may share
     * another's. */
    const wpi_rows_multi_fn *multi;
    size_t multi_max[WPI_SLOTS];
    float (*dot_f32)(const float *a, const float *b, size_t n);
    void (*axpy_f32)(float a, const float *x, float *y, size_t n);
} wpi_blocks;

/*
 * Loops over the 32-weight blocks of a row, written once for the ISA files: each file
 * expands them around its own block kernels, under its own target pragma, so the block
 * kernel is inlined.
 *
 * WPI_ROW_QUANT defines `static float name(const uint8_t *row, const float *x,
 * size_t cols)` (a wpi_row_dot_fn) for blocks of `bytes` bytes: block_fn(blk, x, acc)
 * returns acc plus one block's dot with x; even blocks go into one accumulator and odd
 * ones into another (two independent add chains), summed at the end. vec, zero, add and
 * hsum are the ISA's float vector type, its zero, its lane-wise add and its lane sum.
 */
#define WPI_ROW_QUANT(name, block_fn, bytes, vec, zero, add, hsum)                       \
    static float name(const uint8_t *row, const float *x, size_t cols)                   \
    {                                                                                    \
        size_t nb = cols / 32;                                                           \
        vec e = zero, o = e;                                                             \
        size_t b = 0;                                                                    \
        for (; b + 2 <= nb; b += 2) {                                                    \
            e = block_fn(row + b * (bytes), x + b * 32, e);                              \
            o = block_fn(row + (b + 1) * (bytes), x + (b + 1) * 32, o);                  \
        }                                                                                \
        if (b < nb)                                                                      \
            e = block_fn(row + b * (bytes), x + b * 32, e);                              \
        return hsum(add(e, o));                                                          \
    }

/* WPI_DEQUANT_QUANT defines `static void name(const uint8_t *row, size_t c, size_t n,
 * float *out)` (a wpi_dequant_fn) for blocks of `bytes` bytes: block_fn(blk, out)
 * writes one block's 32 weights as floats. */
#define WPI_DEQUANT_QUANT(name, block_fn, bytes)                                         \
    static void name(const uint8_t *row, size_t c, size_t n, float *out)                 \
    {                                                                                    \
        for (size_t i = 0; i < n; i += 32)                                               \
            block_fn(row + (c + i) / 32 * (bytes), out + i);                             \
    }

/* WPI_APPLY_TILES defines `static void name(...)` (a wpi_apply_fn) over a tile kernel
 * `void tile_fn(const float *w0, const float *w1, const float *const xt[4], size_t n,
 * float out[2][4])` that sets out[i][t] = sum over j < n of w_i[j] * x_t[j] for 2 rows x
 * 4 tokens. A ragged tile repeats a row or token pointer and drops those sums, so
 * tile_fn must form each sum in the same order whatever its neighbours. */
#define WPI_APPLY_TILES(name, tile_fn)                                                   \
    static void name(const float *const wr[], size_t nr, const float *x, size_t ldx,     \
                     size_t n_tok, size_t nc, float *y, size_t ldy)                      \
    {                                                                                    \
        for (size_t t = 0; t < n_tok; t += 4) {                                          \
            size_t nt = n_tok - t < 4 ? n_tok - t : 4;                                   \
            const float *xt[4];                                                          \
            for (size_t k = 0; k < 4; k++)                                               \
                xt[k] = x + (t + (k < nt ? k : 0)) * ldx;                                \
            for (size_t i = 0; i < nr; i += 2) {                                         \
                float s[2][4];                                                           \
                size_t i1 = i + 1 < nr ? i + 1 : i;                                      \
                tile_fn(wr[i], wr[i1], xt, nc, s);                                       \
                for (size_t k = 0; k < nt; k++) {                                        \
                    y[(t + k) * ldy + i] += s[0][k];                                     \
                    if (i1 != i)                                                         \
                        y[(t + k) * ldy + i1] += s[1][k];                                \
                }                                                                        \
            }                                                                            \
        }                                                                                \
    }

/*
 * WPI_MULTI_ROWS defines `static void name(row_fn fn, const uint8_t *w, size_t rb,
 * size_t n_rows, const float *x, size_t ldx, size_t n_tok, size_t cols, float *y,
 * size_t ldy)`, the row loop of an ISA file's multi kernels: rows [0, n_rows) against
 * n_tok tokens through fn(row, xs, xs_ld, b0, b1, rem, acc), the file's kernel for one
 * row and n_tok tokens (blocks [b0, b1) of the row and, for a float dtype, the rem
 * weights after block b1, FMA'd into the row's n_tok * A accumulators acc, A =
 * acc_per_tok[n_tok] <= acc_max / n_tok, token t's at acc[t * A]); then each token's A
 * accumulators added in order (add) and summed (hsum) into y. WPI_MULTI_ROW_TILE rows
 * at a time, column chunk by column chunk (WPI_MULTI_CHUNK blocks): the chunk of the
 * tokens' activations (at most 16 KiB) is copied into a buffer, one token every
 * chunk * 32 + 48 floats (a stride that spreads the tokens over the L1 sets, where a
 * power-of-two ldx would put them all in the same ones), and stays in L1 while the chunk
 * of each row of the tile is applied to it: read in place, 8 tokens cost 5 single-token
 * calls on an AMD EPYC (Zen 2, AVX2), and 4.05 from the buffer (weights in cache). Only
 * the accumulators a row uses are touched, so the stack the loop keeps hot stays small,
 * and the chunk of the row WPI_MULTI_AHEAD rows on is prefetched.
 */
#define WPI_MULTI_ROW_TILE 16
/* How many rows ahead the loop prefetches: without it a 2-token call on a 49152 x 576
 * q8_0 matrix (30 MB, from DRAM: SmolLM2's output matrix) cost 2.4-3.2 single-token
 * calls, with it 1.8-2.0 (AMD EPYC, AVX-512 table), in-cache shapes within the noise;
 * with the decode work between its loads the hardware prefetcher fell behind. */
#define WPI_MULTI_AHEAD 8

/* Bytes [b, e) of p fetched into cache, a line at a time. */
static inline void wpi_prefetch_range(const uint8_t *p, size_t b, size_t e)
{
    for (size_t o = b; o < e; o += 64)
        __builtin_prefetch(p + o);
}
#define WPI_MULTI_CHUNK(n_tok) ((size_t)((n_tok) <= 4 ? 32 : 16))
#define WPI_MULTI_XS (WPI_MULTI_TOK * (16 * 32 + 48))
#define WPI_MULTI_ROWS(name, row_fn, vec, zero, add, hsum, acc_per_tok, acc_max)         \
    static void name(row_fn fn, const uint8_t *w, size_t rb, size_t n_rows,              \
                     const float *x, size_t ldx, size_t n_tok, size_t cols, float *y,    \
                     size_t ldy)                                                         \
    {                                                                                    \
        _Alignas(WPI_BUF_ALIGN) float xs[WPI_MULTI_XS];                                  \
        size_t nb = cols / 32, rem = cols % 32, bb = nb ? rb / nb : 0; /* bytes/block */ \
        size_t chunk = WPI_MULTI_CHUNK(n_tok), xs_ld = chunk * 32 + 48;                  \
        int A = acc_per_tok[n_tok], n_acc = (int)n_tok * A;                              \
        for (size_t r0 = 0; r0 < n_rows; r0 += WPI_MULTI_ROW_TILE) {                     \
            size_t nr = n_rows - r0;                                                     \
            nr = nr < WPI_MULTI_ROW_TILE ? nr : WPI_MULTI_ROW_TILE;                      \
            vec acc[WPI_MULTI_ROW_TILE][acc_max];                                        \
            for (size_t i = 0; i < nr; i++)                                              \
                for (int a = 0; a < n_acc; a++)                                          \
                    acc[i][a] = zero;                                                    \
            for (size_t cb = 0;; cb += chunk) {                                          \
                size_t ce = nb - cb < chunk ? nb : cb + chunk;                           \
                size_t r = ce == nb ? rem : 0, nc = (ce - cb) * 32 + r;                  \
                for (size_t t = 0; t < n_tok; t++)                                       \
                    memcpy(xs + t * xs_ld, x + t * ldx + cb * 32, nc * sizeof(float));   \
                for (size_t i = 0; i < nr; i++) {                                        \
                    if (r0 + i + WPI_MULTI_AHEAD < n_rows)                               \
                        wpi_prefetch_range(w + (r0 + i + WPI_MULTI_AHEAD) * rb,          \
                                           cb * bb, ce * bb);                            \
                    fn(w + (r0 + i) * rb, xs, xs_ld, cb, ce, r, acc[i]);                 \
                }                                                                        \
                if (ce >= nb)                                                            \
                    break;                                                               \
            }                                                                            \
            for (size_t i = 0; i < nr; i++)                                              \
                for (size_t t = 0; t < n_tok; t++) {                                     \
                    vec s = acc[i][t * A];                                               \
                    for (int a = 1; a < A; a++)                                          \
                        s = add(s, acc[i][t * A + a]);                                   \
                    y[t * ldy + r0 + i] = hsum(s);                                       \
                }                                                                        \
        }                                                                                \
    }

/* WPI_MULTI_ENTRY defines `static void multi_<sfx>(...)`, a wpi_rows_multi_fn, over
 * the file's T-token kernels multi1_<sfx> .. multi8_<sfx> and its WPI_MULTI_ROWS loop
 * rows_fn. */
#define WPI_MULTI_ENTRY(sfx, row_fn, rows_fn)                                            \
    static void multi_##sfx(const uint8_t *w, size_t rb, size_t n_rows, const float *x,  \
                            size_t ldx, size_t n_tok, size_t cols, float *y, size_t ldy) \
    {                                                                                    \
        static const row_fn fns[WPI_MULTI_TOK + 1] = {                                   \
            NULL, multi1_##sfx, multi2_##sfx, multi3_##sfx, multi4_##sfx,                \
            multi5_##sfx, multi6_##sfx, multi7_##sfx, multi8_##sfx,                      \
        };                                                                               \
        rows_fn(fns[n_tok], w, rb, n_rows, x, ldx, n_tok, cols, y, ldy);                 \
    }

/* 8-bit activations: tables are indexed by slot - WPI_SLOT_Q8_0 (q8_0, q4_0, q4_1,
 * mxfp4); the tile kernels are in x8_tile.h. */
#define WPI_X8_SLOTS 4
#define WPI_X8_R (1.0f / 256.0f) /* the r plane's step: sum 256 w.q + w.r counts d / 256 */

/* The block tables; the AVX ones exist only in x86-64 builds, the NEON one only in
 * AArch64 builds. */
extern const wpi_blocks wpi_blocks_ref;
extern const wpi_blocks wpi_blocks_avx2;
extern const wpi_blocks wpi_blocks_avx512;
extern const wpi_blocks wpi_blocks_neon;

#endif /* WP_KERNELS_BLOCKS_H */

/*
 * blocks.h -- the block kernels an ISA file supplies to the matmul driver (matmul.c).
 *
 * The driver owns every loop of a matmul: the row range, the split between one token
 * (a matrix-vector product straight from the stored weights), a few (each row's blocks
 * decoded once into registers and applied to a group of up to WPI_MULTI_TOK tokens, the
 * table's multi kernels) and many (rows dequantized a chunk at a time into a stack
 * buffer, then applied to the tokens by the table's apply: tiles of 2 rows x 4 tokens,
 * and in the AVX2 table also 4 rows x 3 tokens), the row tiles, the
 * token groups and the column chunks. An ISA file
 * (kernels_ref.c, kernels_avx2.c, kernels_avx512.c, kernels_neon.c) only fills one
 * wpi_blocks table with the kernels below, compiled under its own target pragma.
 * Private to engine/src/kernels/.
 */
#ifndef WP_KERNELS_BLOCKS_H
#define WP_KERNELS_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

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
 * y[t * ldy + i]). Made by WPI_APPLY_TILES from a 2 rows x 4 tokens tile kernel. */
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
     * 2 <= n_tok <= multi_max; a pointer so that a table may share another's. */
    const wpi_rows_multi_fn *multi;
    size_t multi_max;
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

/* 8-bit activations: one quantized row (nb blocks) dotted with nb activation blocks.
 * Tables are indexed by slot - WPI_SLOT_Q8_0 (q8_0, q4_0, q4_1, mxfp4). */
typedef float (*wpi_row_dot_x8_fn)(const uint8_t *row, const wpi_xq *xq, size_t nb);
#define WPI_X8_SLOTS 4
#define WPI_X8_R (1.0f / 256.0f) /* the r plane's step: sum 256 w.q + w.r counts d / 256 */

/* Optional: one row dotted with 4 tokens' blocks (xt[k], repeated for a ragged group),
 * the weights decoded once; out[k] must equal row_dot's result for xt[k] bit for bit. */
typedef void (*wpi_row_dot4_x8_fn)(const uint8_t *row, const wpi_xq *const xt[4], size_t nb,
                                   float out[4]);

typedef struct wpi_blocks_x8 {
    const char *name;
    wpi_row_dot_x8_fn row_dot[WPI_X8_SLOTS];
    wpi_row_dot4_x8_fn row_dot4[WPI_X8_SLOTS]; /* several tokens (prefill) */
} wpi_blocks_x8;

extern const wpi_blocks_x8 wpi_x8_ref;
extern const wpi_blocks_x8 wpi_x8_avx2;
extern const wpi_blocks_x8 wpi_x8_avxvnni;
extern const wpi_blocks_x8 wpi_x8_avx512bw;
extern const wpi_blocks_x8 wpi_x8_avx512vnni;

/* The block tables; the AVX ones exist only in x86-64 builds, the NEON one only in
 * AArch64 builds. */
extern const wpi_blocks wpi_blocks_ref;
extern const wpi_blocks wpi_blocks_avx2;
extern const wpi_blocks wpi_blocks_avx512;
extern const wpi_blocks wpi_blocks_neon;

/* The AVX2 multi kernels, which the AVX-512 table shares (x86-64 builds only), and the
 * largest n_tok they take and the AVX-512 table sends to them: at 16 tokens and more
 * the tiled path, whose 2 x 4 tile needs fewer loads per FMA, was as fast or faster
 * (AMD EPYC, Zen 2). The AVX2 table itself stops at 5 (kernels_avx2.c: its tiled path
 * has a 4 x 3 tile). */
extern const wpi_rows_multi_fn wpi_avx2_multi[WPI_SLOTS];
#define WPI_AVX2_MULTI_MAX 8

#endif /* WP_KERNELS_BLOCKS_H */

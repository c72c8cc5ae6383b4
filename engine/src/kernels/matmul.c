/*
 * matmul.c -- the one matmul driver, and the kernel sets of kernels.h built on it.
 *
 * ISA-neutral: every loop of Y = X * W^T lives here, and the arithmetic comes from a
 * block-kernel table (blocks.h) that an ISA file fills. Weights are never requantized.
 * With 8-bit activations (quantized once per call by the caller, wpi_quant_x8) each
 * row is read once and dotted with every token's blocks by the x8 table's row kernel.
 * Three paths with float32 activations:
 *   n_tok == 1 (decode): each row of [r0, r1) is dotted with x straight from the stored
 *     weights by the table's row kernel of the dtype.
 *   2 <= n_tok <= the table's multi_max for the dtype (batched decode, short prefill:
 *     in the AVX-512 table up to 32 tokens on quantized rows (pairs of rows, each block
 *     decoded once for both) and 6 on f16/bf16, in the AVX2 one 5; neither has one for
 *     f32, whose rows the tiles read in place): the
 *     tokens are split into groups of at most WPI_MULTI_TOK, as even as possible
 *     (9 = 4 + 5), and for each tile of WPI_TILE_ROWS rows the table's multi kernel
 *     applies every block of a row, decoded once into registers, to each group in turn
 *     (a tile of about 64 KiB of weights, which stay in cache between groups). No token
 *     is padded and nothing is dequantized to memory.
 *   more tokens (prefill): a tile of up to WPI_TILE_ROWS rows is dequantized `chunk`
 *     columns at a time into a stack buffer (f32 rows are read in place), then the
 *     table's apply kernel adds every token's chunk sums into y (register tiles: 2 rows
 *     x 4 tokens, AVX2 also 4 x 3, AVX-512 4 rows x 1..4 tokens), so each weight is
 *     decoded once per call.
 * Each row's arithmetic is the same whatever row range or tile it sits in, so splitting
 * rows across threads never changes a result.
 */
#include <stddef.h>
#include <stdint.h>

#include "kernels/blocks.h"
#include "kernels/kernels.h"
#include "kernels/x8_tile.h"

static void matvec(const wpi_blocks *b, int slot, const uint8_t *w, size_t rb, size_t cols,
                   size_t r0, size_t r1, const float *x, float *y)
{
    if (b->rows_dot[slot]) {
        b->rows_dot[slot](w + r0 * rb, rb, r1 - r0, x, cols, y + r0);
        return;
    }
    wpi_row_dot_fn dot = b->row_dot[slot];
    for (size_t r = r0; r < r1; r++)
        y[r] = dot(w + r * rb, x, cols);
}

static void matmul_tiled(const wpi_blocks *b, int slot, const uint8_t *w, size_t rb,
                         size_t cols, size_t r0, size_t r1, const float *x, size_t ldx,
                         size_t n_tok, float *y, size_t ldy)
{
    _Alignas(WPI_BUF_ALIGN) float buf[WPI_TILE_ROWS][WPI_CHUNK_MAX];
    wpi_dequant_fn dequant = b->dequant[slot];
    size_t chunk = b->chunk;
    for (size_t rt = r0; rt < r1; rt += WPI_TILE_ROWS) {
        size_t nr = r1 - rt < WPI_TILE_ROWS ? r1 - rt : WPI_TILE_ROWS;
        for (size_t t = 0; t < n_tok; t++)
            for (size_t i = 0; i < nr; i++)
                y[t * ldy + rt + i] = 0.0f;
        for (size_t c = 0; c < cols; c += chunk) {
            size_t nc = cols - c < chunk ? cols - c : chunk;
            const float *wr[WPI_TILE_ROWS];
            for (size_t i = 0; i < nr; i++) {
                const uint8_t *row = w + (rt + i) * rb;
                if (slot == WPI_SLOT_F32) {
                    wr[i] = (const float *)row + c;
                } else {
                    dequant(row, c, nc, buf[i]);
                    wr[i] = buf[i];
                }
            }
            b->apply(wr, nr, x + c, ldx, n_tok, nc, y + rt, ldy);
        }
    }
}

static void matmul_multi(const wpi_blocks *b, int slot, const uint8_t *w, size_t rb,
                         size_t cols, size_t r0, size_t r1, const float *x, size_t ldx,
                         size_t n_tok, float *y, size_t ldy)
{
    wpi_rows_multi_fn multi = b->multi[slot];
    size_t n_groups = (n_tok + WPI_MULTI_TOK - 1) / WPI_MULTI_TOK;
    /* rows per tile: about 64 KiB of weights, which stay in cache between the groups */
    size_t tile = rb ? (size_t)65536 / rb : WPI_TILE_ROWS;
    tile = tile < WPI_TILE_ROWS ? WPI_TILE_ROWS : tile;
    for (size_t rt = r0; rt < r1; rt += tile) {
        size_t nr = r1 - rt < tile ? r1 - rt : tile;
        for (size_t g = 0, t = 0; g < n_groups; g++) {
            size_t nt = (n_tok - t) / (n_groups - g);
            multi(w + rt * rb, rb, nr, x + t * ldx, ldx, nt, cols, y + t * ldy + rt, ldy);
            t += nt;
        }
    }
}

static void matmul(const wpi_blocks *b, int slot, int dtype, const void *w, size_t cols,
                   size_t r0, size_t r1, const float *x, size_t ldx, size_t n_tok, float *y,
                   size_t ldy)
{
    size_t rb = wpi_row_bytes(dtype, cols);
    if (rb == 0 && cols != 0)
        return;
    if (n_tok == 1)
        matvec(b, slot, w, rb, cols, r0, r1, x, y);
    else if (b->multi && b->multi[slot] && n_tok <= b->multi_max[slot])
        matmul_multi(b, slot, w, rb, cols, r0, r1, x, ldx, n_tok, y, ldy);
    else
        matmul_tiled(b, slot, w, rb, cols, r0, r1, x, ldx, n_tok, y, ldy);
}

/* Rows per call of an 8-bit tile kernel: about this many bytes of weights, which stay in
 * L2 while each group of tokens passes over them. */
#define X8_TILE_BYTES 65536

/* 8-bit activations: tiles of rows times every token (x8_tile.h). */
static void matmul_x8(const wpi_tiles_x8 *tt, int slot, int dtype, const void *w,
                      size_t cols, size_t r0, size_t r1, const wpi_xq *xq, size_t ldq,
                      size_t n_tok, float *y, size_t ldy)
{
    size_t rb = wpi_row_bytes(dtype, cols);
    if (rb == 0 && cols != 0)
        return;
    wpi_tile_x8_fn tile = tt->tile[slot - WPI_SLOT_Q8_0];
    size_t step = rb && rb < X8_TILE_BYTES ? X8_TILE_BYTES / rb : 1;
    if (tt->row_group)
        step = (step + tt->row_group - 1) / tt->row_group * tt->row_group;
    for (size_t r = r0; r < r1; r += step) {
        size_t nr = r1 - r < step ? r1 - r : step;
        tile((const uint8_t *)w + r * rb, rb, nr, xq, ldq, n_tok, cols / WPI_QK, y + r, ldy);
    }
}

#define MATMUL_X8_ENTRY(x8, sfx, slot, dtype)                                            \
    static void matmul_x8_##sfx##_##x8(const void *w, size_t cols, size_t r0, size_t r1, \
                                       const wpi_xq *xq, size_t ldq, size_t n_tok,        \
                                       float *y, size_t ldy)                              \
    {                                                                                    \
        matmul_x8(&wpi_x8t_##x8, slot, dtype, w, cols, r0, r1, xq, ldq, n_tok, y, ldy);   \
    }

#define X8_SET(x8)                                                                       \
    MATMUL_X8_ENTRY(x8, q8_0, WPI_SLOT_Q8_0, WPI_Q8_0)                                   \
    MATMUL_X8_ENTRY(x8, q4_0, WPI_SLOT_Q4_0, WPI_Q4_0)                                   \
    MATMUL_X8_ENTRY(x8, q4_1, WPI_SLOT_Q4_1, WPI_Q4_1)                                   \
    MATMUL_X8_ENTRY(x8, mxfp4, WPI_SLOT_MXFP4, WPI_MXFP4)

X8_SET(ref)
#if defined(__x86_64__)
X8_SET(avx2)
X8_SET(avxvnni)
X8_SET(avx512bw)
X8_SET(avx512vnni)

/* AMX: steps of at least WPI_AMX_MIN_TOK tokens on its tiles, fewer (a lone token would
 * fill one row of sixteen) on the AVX-512 VNNI ones. */
#define MATMUL_X8_AMX_ENTRY(sfx, slot, dtype)                                            \
    static void matmul_x8_##sfx##_amx(const void *w, size_t cols, size_t r0, size_t r1,  \
                                      const wpi_xq *xq, size_t ldq, size_t n_tok,         \
                                      float *y, size_t ldy)                               \
    {                                                                                    \
        matmul_x8(n_tok >= WPI_AMX_MIN_TOK ? &wpi_x8t_amx : &wpi_x8t_avx512vnni, slot,    \
                  dtype, w, cols, r0, r1, xq, ldq, n_tok, y, ldy);                        \
    }
MATMUL_X8_AMX_ENTRY(q8_0, WPI_SLOT_Q8_0, WPI_Q8_0)
MATMUL_X8_AMX_ENTRY(q4_0, WPI_SLOT_Q4_0, WPI_Q4_0)
MATMUL_X8_AMX_ENTRY(q4_1, WPI_SLOT_Q4_1, WPI_Q4_1)
MATMUL_X8_AMX_ENTRY(mxfp4, WPI_SLOT_MXFP4, WPI_MXFP4)
#endif
#if defined(__aarch64__)
X8_SET(neon)
X8_SET(neondot)
#endif

/* The kernels.h set wpi_kernels_<set>, named label, over the block table
 * wpi_blocks_<isa> (whose entries KERNEL_SET_F32 makes: one matmul per dtype, and dot
 * and axpy passed through) and the 8-bit table wpi_x8_<x8>. */
#define MATMUL_ENTRY(isa, sfx, slot, dtype)                                              \
    static void matmul_##sfx##_##isa(const void *w, size_t cols, size_t r0, size_t r1,  \
                                     const float *x, size_t ldx, size_t n_tok, float *y, \
                                     size_t ldy)                                         \
    {                                                                                    \
        matmul(&wpi_blocks_##isa, slot, dtype, w, cols, r0, r1, x, ldx, n_tok, y, ldy);  \
    }

#define KERNEL_SET(set, isa, x8, label)                                                  \
    const wpi_kernels wpi_kernels_##set = {                                              \
        .name = label,                                                                   \
        .matmul_f32 = matmul_f32_##isa,                                                  \
        .matmul_f16 = matmul_f16_##isa,                                                  \
        .matmul_bf16 = matmul_bf16_##isa,                                                \
        .matmul_q8_0 = matmul_q8_0_##isa,                                                \
        .matmul_q4_0 = matmul_q4_0_##isa,                                                \
        .matmul_q4_1 = matmul_q4_1_##isa,                                                \
        .matmul_mxfp4 = matmul_mxfp4_##isa,                                              \
        .matmul_x8_q8_0 = matmul_x8_q8_0_##x8,                                           \
        .matmul_x8_q4_0 = matmul_x8_q4_0_##x8,                                           \
        .matmul_x8_q4_1 = matmul_x8_q4_1_##x8,                                           \
        .matmul_x8_mxfp4 = matmul_x8_mxfp4_##x8,                                         \
        .x8_name = wpi_x8_##x8##_name,                                                   \
        .dot_f32 = dot_f32_##isa,                                                        \
        .axpy_f32 = axpy_f32_##isa,                                                      \
    };

#define KERNEL_SET_F32(isa)                                                              \
    MATMUL_ENTRY(isa, f32, WPI_SLOT_F32, WPI_F32)                                        \
    MATMUL_ENTRY(isa, f16, WPI_SLOT_F16, WPI_F16)                                        \
    MATMUL_ENTRY(isa, bf16, WPI_SLOT_BF16, WPI_BF16)                                     \
    MATMUL_ENTRY(isa, q8_0, WPI_SLOT_Q8_0, WPI_Q8_0)                                     \
    MATMUL_ENTRY(isa, q4_0, WPI_SLOT_Q4_0, WPI_Q4_0)                                     \
    MATMUL_ENTRY(isa, q4_1, WPI_SLOT_Q4_1, WPI_Q4_1)                                     \
    MATMUL_ENTRY(isa, mxfp4, WPI_SLOT_MXFP4, WPI_MXFP4)                                  \
    static float dot_f32_##isa(const float *a, const float *b, size_t n)                 \
    {                                                                                    \
        return wpi_blocks_##isa.dot_f32(a, b, n);                                        \
    }                                                                                    \
    static void axpy_f32_##isa(float a, const float *x, float *y, size_t n)              \
    {                                                                                    \
        wpi_blocks_##isa.axpy_f32(a, x, y, n);                                           \
    }

#define wpi_x8_ref_name "scalar"
#define wpi_x8_avx2_name "avx2"
#define wpi_x8_avxvnni_name "avxvnni"
#define wpi_x8_avx512bw_name "avx512bw"
#define wpi_x8_avx512vnni_name "avx512vnni"
#define wpi_x8_amx_name "amx"
#define wpi_x8_neon_name "neon"
#define wpi_x8_neondot_name "neon-dotprod"

KERNEL_SET_F32(ref)
KERNEL_SET(ref, ref, ref, "scalar")
#if defined(__x86_64__)
KERNEL_SET_F32(avx2)
KERNEL_SET_F32(avx512)
KERNEL_SET(avx2, avx2, avx2, "avx2")
KERNEL_SET(avx512, avx512, avx512bw, "avx512")
/* The AVX sets again with VNNI integer dot products (dispatch.c picks them). */
KERNEL_SET(avxvnni, avx2, avxvnni, "avx2")
KERNEL_SET(avx512vnni, avx512, avx512vnni, "avx512")
KERNEL_SET(avx512amx, avx512, amx, "avx512")
#endif
#if defined(__aarch64__)
KERNEL_SET_F32(neon)
KERNEL_SET(neon, neon, neon, "neon")
/* The NEON set again with SDOT integer dot products (dispatch.c picks it). */
KERNEL_SET(neondot, neon, neondot, "neon")
#endif

/*
 * x8_tile.h -- the 8-bit-activation GEMM: nr weight rows times nt tokens in one call.
 *
 * A tile kernel computes y[t * ldy + i] = row i . token t for rows 0 <= i < nr (row i at
 * w + i * rb, nb blocks of the dtype) and tokens 0 <= t < nt (token t's blocks at
 * xq + t * ldq), all of them. Per block, the integer sum 256 * sum(w q) + sum(w r) of the
 * two activation planes (kernels.h, wpi_xq), times d_w * d / 256, is added to the
 * (row, token) sum; q4_1 adds m * s.
 *
 * The SIMD kernels (x8_tile_body.h) work on register tiles of X8T_R rows x X8T_T tokens,
 * each weight block decoded once per tile and used for its X8T_T tokens, each activation
 * block loaded once per tile and used for its X8T_R rows. Each (row, token) sum is formed
 * by the same operations in the same order whatever nr, nt, the tile it falls in or the
 * other tokens of the call, so a token's outputs equal, bit for bit, those of a call
 * with that token alone (nt = 1). The kernels are not bit-equal to the row dots of
 * wpi_blocks_x8 (another accumulation order); matmul.c sends every token count here.
 * Contract against the scalar twin (kernels_x8_tile_ref.c): within 1e-6 * mag per output,
 * mag = sum_j (|w_j| + |m_b|) |x~_j| + sum_b |m_b s_b| (x~ = d (q + r / 256)).
 * Private to engine/src/kernels/.
 */
#ifndef WP_KERNELS_X8_TILE_H
#define WP_KERNELS_X8_TILE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/blocks.h"

typedef void (*wpi_tile_x8_fn)(const uint8_t *w, size_t rb, size_t nr, const wpi_xq *xq,
                               size_t ldq, size_t nt, size_t nb, float *y, size_t ldy);

/* Tables indexed by slot - WPI_SLOT_Q8_0, as wpi_blocks_x8. */
typedef struct wpi_tiles_x8 {
    const char *name;
    size_t row_group;          /* rows per call best a multiple of this (0: any) */
    wpi_tile_x8_fn tile[WPI_X8_SLOTS];
} wpi_tiles_x8;

/* A table's four tile kernels, FN(name, slot index k, block bytes) each, named
 * prefix_q8_0, prefix_q4_0, prefix_q4_1, prefix_mxfp4, and the table TABLE over them. */
#define WPI_X8_TILE_TABLE(FN, prefix, TABLE, label, group)                               \
    FN(prefix##_q8_0, 0, 34)                                                             \
    FN(prefix##_q4_0, 1, 18)                                                             \
    FN(prefix##_q4_1, 2, 20)                                                             \
    FN(prefix##_mxfp4, 3, WPI_MXFP4_BYTES)                                               \
    const wpi_tiles_x8 TABLE = {                                                         \
        .name = label,                                                                   \
        .row_group = group,                                                              \
        .tile = {prefix##_q8_0, prefix##_q4_0, prefix##_q4_1, prefix##_mxfp4},           \
    };

extern const wpi_tiles_x8 wpi_x8t_ref;
extern const wpi_tiles_x8 wpi_x8t_avx2;
extern const wpi_tiles_x8 wpi_x8t_avxvnni;
extern const wpi_tiles_x8 wpi_x8t_avx512bw;
extern const wpi_tiles_x8 wpi_x8t_avx512vnni;
extern const wpi_tiles_x8 wpi_x8t_amx;     /* x86-64 builds only (kernels_x8_amx.c) */
extern const wpi_tiles_x8 wpi_x8t_neon;    /* AArch64 builds only */
extern const wpi_tiles_x8 wpi_x8t_neondot;

#endif /* WP_KERNELS_X8_TILE_H */

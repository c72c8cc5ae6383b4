/*
 * kernels.h -- numeric kernels on quantized blocks, with runtime ISA dispatch.
 *
 * One ISA-neutral driver (matmul.c) owns the loops of every matmul and builds each
 * kernel set below from a table of block kernels (blocks.h). The portable reference
 * table (kernels_ref.c) is always compiled; SIMD tables (kernels_avx2.c,
 * kernels_avx512.c on x86-64, with per-file target pragmas so no global -m flag is
 * needed; kernels_neon.c on AArch64, whose ASIMD is baseline) are chosen in dispatch.c
 * from the CPU's flags. Each SIMD file compiles to nothing on other architectures.
 * Contract of a SIMD variant: equal to the reference within 1e-6 * sum_i |w_i * x_i|
 * per output (accumulation order differs); thread count never changes a result
 * (callers split work by rows).
 */
#ifndef WP_KERNELS_H
#define WP_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* Data type ids: GGUF's ggml_type numbering (docs/FORMAT.md section 1). */
enum {
    WPI_F32 = 0,
    WPI_F16 = 1,
    WPI_Q4_0 = 2,
    WPI_Q4_1 = 3,
    WPI_Q8_0 = 8,
    WPI_BF16 = 30,
    WPI_MXFP4 = 39
};

#define WPI_QK 32 /* weights per quantized block */

/* Bytes of one row of `cols` weights of dtype (0 for an unknown dtype or a quantized
 * dtype with cols % 32 != 0). */
size_t wpi_row_bytes(int dtype, size_t cols);
int wpi_dtype_valid(int dtype);
const char *wpi_dtype_name(int dtype);

/*
 * Y = X * W^T for a row range of W.
 *   w:    the whole matrix [rows, cols] in dtype layout (row-major)
 *   rows r0 <= r < r1 are computed
 *   x:    n_tok activations, token t at x + t*ldx (cols floats each)
 *   y:    output, token t row r at y[t*ldy + r]
 * Weights of a row are read once for all n_tok tokens.
 */
typedef void (*wpi_matmul_fn)(const void *w, size_t cols, size_t r0, size_t r1,
                              const float *x, size_t ldx, size_t n_tok,
                              float *y, size_t ldy);

/*
 * 8-bit activations (wp_cfg.exact = 0, or WP_EXACT_AUTO for short steps; exact = 1
 * selects the float32 path above): a
 * token's activations are quantized once per call in blocks of 32 into two int8 planes,
 * q as q8_0 weights are (d = amax / 127, q = round(x / d), half away from zero) and r the
 * residual x / d - q in steps of 1/256, so x is held to about 16 bits while every
 * product is a byte by a byte. Quantized weight rows are dotted with both planes in
 * integer arithmetic, 256 * sum(w q) + sum(w r), one float multiply per block. s is
 * q4_1's offset term. A block holding a NaN or infinity gets d = NaN, so the outputs it
 * touches are NaN, as on the float32 path.
 */
typedef struct wpi_xq {
    float d;       /* x[j] ~= d * (q[j] + r[j] / 256.0f) */
    float s;       /* d * (sum of q + sum of r / 256): q4_1's offset term */
    int8_t q[32];  /* round(x / d), d = amax / 127, clamped to [-127, 127] */
    int8_t r[32];  /* round((x / d - q) * 256), clamped to [-127, 127] */
} wpi_xq;

/* Quantizes cols (a multiple of 32) activations into cols / 32 blocks, by the fastest
 * of the versions below that this CPU runs (whatever wp_cfg.isa says: all of them write
 * the same bytes). */
void wpi_quant_x8(const float *x, size_t cols, wpi_xq *out);
/* The versions, for tests and benchmarks: the scalar twin (kernels_x8_ref.c), and on
 * x86-64 builds the AVX2 one (CPUs of the AVX2 set, which AVX-512 CPUs also run). */
void wpi_quant_x8_ref(const float *x, size_t cols, wpi_xq *out);
void wpi_quant_x8_avx2(const float *x, size_t cols, wpi_xq *out);

/* As wpi_matmul_fn, with token t's blocks at xq + t * ldq. */
typedef void (*wpi_matmul_x8_fn)(const void *w, size_t cols, size_t r0, size_t r1,
                                 const wpi_xq *xq, size_t ldq, size_t n_tok,
                                 float *y, size_t ldy);

typedef struct wpi_kernels {
    const char *name;            /* "scalar", "avx2", "avx512", "neon" */
    wpi_matmul_fn matmul_f32;
    wpi_matmul_fn matmul_f16;
    wpi_matmul_fn matmul_bf16;
    wpi_matmul_fn matmul_q8_0;
    wpi_matmul_fn matmul_q4_0;
    wpi_matmul_fn matmul_q4_1;
    wpi_matmul_fn matmul_mxfp4;
    wpi_matmul_x8_fn matmul_x8_q8_0; /* 8-bit activations against quantized weights */
    wpi_matmul_x8_fn matmul_x8_q4_0;
    wpi_matmul_x8_fn matmul_x8_q4_1;
    wpi_matmul_x8_fn matmul_x8_mxfp4;
    const char *x8_name;         /* the integer dot product: "scalar", "avx2", "avxvnni",
                                  * "avx512bw", "avx512vnni", "amx",
                                  * "neon", "neon-dotprod" */
    float (*dot_f32)(const float *a, const float *b, size_t n);
    void (*axpy_f32)(float a, const float *x, float *y, size_t n); /* y += a*x */
} wpi_kernels;

/* The kernel sets (matmul.c builds them, dispatch.c picks one). The AVX sets exist only
 * on x86-64 builds,
 * the NEON table only on AArch64 builds; use wpi_kernels_get() rather than naming them,
 * except in tests and benchmarks. */
extern const wpi_kernels wpi_kernels_ref;
extern const wpi_kernels wpi_kernels_avx2;
extern const wpi_kernels wpi_kernels_avx512;
extern const wpi_kernels wpi_kernels_neon;
/* The AVX sets with VNNI dot products (vpdpbusd) for 8-bit activations; wpi_kernels_get
 * returns them for WP_ISA_AVX2 / WP_ISA_AVX512 where the CPU has AVX-VNNI / AVX512-VNNI. */
extern const wpi_kernels wpi_kernels_avxvnni;
extern const wpi_kernels wpi_kernels_avx512vnni;
/* The AVX-512 VNNI set whose 8-bit activations take AMX-INT8 tiles (kernels_x8_amx.c)
 * on steps of at least WPI_AMX_MIN_TOK tokens (fewer: the AVX-512 VNNI tiles);
 * wpi_kernels_get returns it for WP_ISA_AVX512 where the CPU has AMX-TILE and AMX-INT8
 * and the OS grants the process the tile state (platform.c). */
extern const wpi_kernels wpi_kernels_avx512amx;
#define WPI_AMX_MIN_TOK 4
/* The NEON set with SDOT (FEAT_DotProd) for 8-bit activations; wpi_kernels_get returns it
 * for WP_ISA_NEON where the OS reports the dot-product instructions. */
extern const wpi_kernels wpi_kernels_neondot;

/* Kernel set for an ISA (wp_isa values); NULL if this CPU cannot run it.
 * WP_ISA_AUTO (0) returns the best supported set. */
const wpi_kernels *wpi_kernels_get(int isa);

/* The matmul of a dtype in a kernel set; NULL for an unknown dtype. */
wpi_matmul_fn wpi_kernels_matmul(const wpi_kernels *k, int dtype);

/* The 8-bit-activation matmul of a dtype; NULL where there is none (float dtypes). */
wpi_matmul_x8_fn wpi_kernels_matmul_x8(const wpi_kernels *k, int dtype);

/* The weight dtypes with an 8-bit-activation matmul, as a mask of 1 << dtype. */
#define WPI_X8_DTYPES \
    (1ull << WPI_Q8_0 | 1ull << WPI_Q4_0 | 1ull << WPI_Q4_1 | 1ull << WPI_MXFP4)

/* Whether dtype is in such a mask. */
static inline int wpi_x8_has(uint64_t mask, int dtype)
{
    return dtype >= 0 && dtype < 64 && (mask >> dtype & 1);
}

/* The weight dtypes (mask of 1 << dtype) whose one-token matmul is faster on the set's
 * 8-bit path than on its float32 one (what WP_EXACT_AUTO reads; docs/ENGINE.md): every
 * one with the VNNI byte dot products (about 2x on a Q4_0 MoE, AVX-512 VNNI); Q4_0 and
 * MXFP4 with maddubs + madd (avx2: 1.1-1.5x on an AVX2-only EPYC, Q8_0 and Q4_1 level or
 * slower there); none for the scalar twins, the NEON tables (not timed on ARM hardware)
 * and avx512bw (not measured). */
uint64_t wpi_kernels_x8_fast(const wpi_kernels *k);

/* The most rows of a step that WP_EXACT_AUTO sends to the 8-bit path: every step with
 * the AMX tiles (prefill included: docs/ENGINE.md), else one (decode). */
uint32_t wpi_kernels_x8_auto_rows(const wpi_kernels *k);

/* Reference-only helpers (kernels_ref.c). */
float wpi_f16_to_f32(uint16_t h);
uint16_t wpi_f32_to_f16(float f);
float wpi_bf16_to_f32(uint16_t h);
/* Round to nearest even; NaN stays NaN (quieted), as gguf-py's bf16 conversion. */
uint16_t wpi_f32_to_bf16(float f);
/* Dequantizes one row of cols weights into out (tests, embeddings rows, tools). */
void wpi_dequant_row(int dtype, const void *row, float *out, size_t cols);
/* Quantizes one row (cols % 32 == 0) into the dtype layout; returns bytes written. */
size_t wpi_quant_row(int dtype, const float *in, void *out, size_t cols);
/* Whether `bytes` bytes of whole dtype blocks hold only valid blocks: every dtype's are
 * but mxfp4's, whose scale byte 255 (NaN in E8M0) is refused. Returns 1 if valid; else 0
 * with *bad_block set to the index of the first invalid block. */
int wpi_blocks_valid(int dtype, const void *data, uint64_t bytes, uint64_t *bad_block);

/* Elementwise helpers used by the blocks (reference speed is fine at these sizes). */
/* out = x / sqrt(mean(x^2) + eps) * w; out may equal x; w NULL means all ones. */
void wpi_rmsnorm(float *out, const float *x, const float *w, size_t n, float eps);
/* In place; if every x is -inf the result is uniform 1/n. */
void wpi_softmax(float *x, size_t n);
float wpi_silu(float x);

#endif /* WP_KERNELS_H */

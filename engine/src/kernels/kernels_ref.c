/*
 * kernels_ref.c -- the portable reference block kernels (blocks.h), and the formats.
 *
 * Plain scalar C, written for reading, not speed: the SIMD variants are tested against
 * it, and it is the kernel set of last resort on any CPU. Also owns the block formats
 * (docs/FORMAT.md section 1): row sizes, f16/bf16 conversion, the q8_0/q4_0/q4_1/mxfp4
 * quantizers, which produce the same bytes as GGUF's reference quantizers (gguf-py's
 * numpy code and ggml's quantize_row_*_ref), so a row quantized here equals a row
 * the Python converter writes, and the one check of block contents (mxfp4's NaN scale).
 *
 * Multi-byte fields inside blocks are little-endian and read byte by byte, so this
 * file is correct on any host.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/blocks.h"
#include "kernels/kernels.h"

/* ---- data types ------------------------------------------------------------------ */

int wpi_dtype_valid(int dtype)
{
    switch (dtype) {
    case WPI_F32: case WPI_F16: case WPI_BF16:
    case WPI_Q8_0: case WPI_Q4_0: case WPI_Q4_1: case WPI_MXFP4:
        return 1;
    default:
        return 0;
    }
}

const char *wpi_dtype_name(int dtype)
{
    switch (dtype) {
    case WPI_F32: return "f32";
    case WPI_F16: return "f16";
    case WPI_BF16: return "bf16";
    case WPI_Q8_0: return "q8_0";
    case WPI_Q4_0: return "q4_0";
    case WPI_Q4_1: return "q4_1";
    case WPI_MXFP4: return "mxfp4";
    default: return "unknown";
    }
}

/* Bytes per 32-weight block of a quantized dtype; 0 for the others. */
static size_t block_bytes(int dtype)
{
    switch (dtype) {
    case WPI_Q8_0: return 2 + 32;
    case WPI_Q4_0: return 2 + 16;
    case WPI_Q4_1: return 2 + 2 + 16;
    case WPI_MXFP4: return WPI_MXFP4_BYTES;
    default: return 0;
    }
}

size_t wpi_row_bytes(int dtype, size_t cols)
{
    if (cols > SIZE_MAX / 4)
        return 0;
    switch (dtype) {
    case WPI_F32: return cols * 4;
    case WPI_F16: case WPI_BF16: return cols * 2;
    case WPI_Q8_0: case WPI_Q4_0: case WPI_Q4_1: case WPI_MXFP4:
        return cols % WPI_QK ? 0 : cols / WPI_QK * block_bytes(dtype);
    default:
        return 0;
    }
}

/* ---- f16 / bf16 ------------------------------------------------------------------ */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t load_u16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static void store_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

float wpi_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24, exact in binary32 */
        float v = (float)mant * 0x1p-24f;
        return sign ? -v : v;
    }
    if (exp == 31) /* inf, or NaN with its payload kept */
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

/* Round to nearest, ties to even; overflow gives inf; NaN stays NaN (quieted). */
uint16_t wpi_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) {
        if (x == 0x7f800000u)
            return sign | 0x7c00;
        return (uint16_t)(sign | 0x7e00 | ((x >> 13) & 0x3ff));
    }
    if (x >= 0x477ff000u) /* >= 65520, the midpoint between 65504 and 2^16: rounds to inf */
        return sign | 0x7c00;
    if (x < 0x38800000u) {
        /* below 2^-14: a half subnormal, in units of 2^-24 */
        if (x <= 0x33000000u) /* <= 2^-25, the midpoint to the smallest subnormal: 0 */
            return sign;
        uint32_t e = x >> 23;              /* 102..112 here */
        uint32_t mant = (x & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;          /* 14..24 */
        uint32_t h = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1)))
            h++;                           /* may carry into the smallest normal: right */
        return (uint16_t)(sign | h);
    }
    uint32_t h = (x >> 13) - (112u << 10);
    uint32_t rem = x & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++;                               /* may carry into the exponent: right */
    return (uint16_t)(sign | h);
}

float wpi_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

uint16_t wpi_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: keep the top payload, force quiet */
        return (uint16_t)((x >> 16) | 0x40);
    uint64_t r = (uint64_t)x + 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(r >> 16);
}

/* ---- dequantization ----------------------------------------------------------- */

/* Twice the value of each E2M1 code (blocks.h). */
static const int8_t mxfp4_x2[16] = {WPI_MXFP4_X2};

/* Weights [c, c + n) of a row into out. Quantized dtypes: c % 32 == 0 and n == 32. */
static void dequant_span(int dtype, const uint8_t *row, size_t c, size_t n, float *out)
{
    switch (dtype) {
    case WPI_F32:
        memcpy(out, row + c * 4, n * 4);
        return;
    case WPI_F16:
        for (size_t j = 0; j < n; j++)
            out[j] = wpi_f16_to_f32(load_u16(row + (c + j) * 2));
        return;
    case WPI_BF16:
        for (size_t j = 0; j < n; j++)
            out[j] = wpi_bf16_to_f32(load_u16(row + (c + j) * 2));
        return;
    case WPI_Q8_0: {
        const uint8_t *b = row + c / WPI_QK * 34;
        float d = wpi_f16_to_f32(load_u16(b));
        for (size_t j = 0; j < 32; j++)
            out[j] = d * (float)(int8_t)b[2 + j];
        return;
    }
    case WPI_Q4_0: {
        const uint8_t *b = row + c / WPI_QK * 18;
        float d = wpi_f16_to_f32(load_u16(b));
        for (size_t j = 0; j < 16; j++) {
            out[j] = d * (float)((b[2 + j] & 15) - 8);
            out[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
        return;
    }
    case WPI_Q4_1: {
        const uint8_t *b = row + c / WPI_QK * 20;
        float d = wpi_f16_to_f32(load_u16(b));
        float m = wpi_f16_to_f32(load_u16(b + 2));
        for (size_t j = 0; j < 16; j++) {
            out[j] = d * (float)(b[4 + j] & 15) + m;
            out[j + 16] = d * (float)(b[4 + j] >> 4) + m;
        }
        return;
    }
    case WPI_MXFP4: {
        const uint8_t *b = row + c / WPI_QK * WPI_MXFP4_BYTES;
        float dh = wpi_e8m0_half(b[0]);
        for (size_t j = 0; j < 16; j++) {
            out[j] = (float)mxfp4_x2[b[1 + j] & 15] * dh;
            out[j + 16] = (float)mxfp4_x2[b[1 + j] >> 4] * dh;
        }
        return;
    }
    default:
        return;
    }
}

void wpi_dequant_row(int dtype, const void *row, float *out, size_t cols)
{
    if (!wpi_dtype_valid(dtype) || (block_bytes(dtype) && cols % WPI_QK))
        return;
    for (size_t c = 0; c < cols; c += WPI_QK) {
        size_t n = cols - c < WPI_QK ? cols - c : WPI_QK;
        dequant_span(dtype, row, c, n, out + c);
    }
}

/* ---- quantization (GGUF's reference quantizers) ------------------------------- */

/* q8_0: d = amax / 127, q = round(x / d) (half away from zero). */
static void quant_q8_0(const float *x, uint8_t *b)
{
    float amax = 0.0f;
    for (int j = 0; j < 32; j++)
        amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(b, wpi_f32_to_f16(d));
    for (int j = 0; j < 32; j++)
        b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}

/* q4_0: d = (the weight of largest magnitude, with its sign) / -8, so that weight maps
 * to q = 0 exactly; q = min(15, trunc(x / d + 8.5)). */
static void quant_q4_0(const float *x, uint8_t *b)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    float d = max / -8.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(b, wpi_f32_to_f16(d));
    for (int j = 0; j < 16; j++) {
        /* separate statements: a fused multiply-add would change rounding and bytes */
        float s0 = x[j] * id;
        float s1 = x[j + 16] * id;
        int q0 = (int)(s0 + 8.5f);
        int q1 = (int)(s1 + 8.5f);
        q0 = q0 > 15 ? 15 : q0;
        q1 = q1 > 15 ? 15 : q1;
        b[2 + j] = (uint8_t)(q0 | (q1 << 4));
    }
}

/* q4_1: d = (max - min) / 15, m = min, q = min(15, trunc((x - min) / d + 0.5)). */
static void quant_q4_1(const float *x, uint8_t *b)
{
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < 32; j++) {
        if (x[j] < min)
            min = x[j];
        if (x[j] > max)
            max = x[j];
    }
    float d = (max - min) / 15.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_u16(b, wpi_f32_to_f16(d));
    store_u16(b + 2, wpi_f32_to_f16(min));
    for (int j = 0; j < 16; j++) {
        float s0 = (x[j] - min) * id;
        float s1 = (x[j + 16] - min) * id;
        int q0 = (int)(s0 + 0.5f);
        int q1 = (int)(s1 + 0.5f);
        q0 = q0 > 15 ? 15 : q0;
        q1 = q1 > 15 ? 15 : q1;
        b[4 + j] = (uint8_t)(q0 | (q1 << 4));
    }
}

/* mxfp4, as gguf-py's quantizer: e = floor(log2(amax)) - 2 + 127 (0 for an all-zero
 * block; clamped to 0..254, where gguf-py wraps around), and each weight takes the code
 * whose value times the scale is nearest, the first in code order on a tie (the smaller
 * magnitude, and +0 rather than -0). */
static void quant_mxfp4(const float *x, uint8_t *b)
{
    float amax = 0.0f;
    for (int j = 0; j < 32; j++)
        amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    int e = 0;
    if (amax > 0.0f) {
        int k;
        frexpf(amax, &k); /* amax = m * 2^k, m in [0.5, 1): floor(log2(amax)) = k - 1 */
        e = k - 1 - 2 + 127;
        e = e < 0 ? 0 : e > 254 ? 254 : e;
    }
    float dh = wpi_e8m0_half((uint8_t)e);
    uint8_t q[32];
    for (int j = 0; j < 32; j++) {
        int best = 0;
        float best_err = INFINITY;
        for (int i = 0; i < 16; i++) {
            float v = (float)mxfp4_x2[i] * dh;
            float err = fabsf(v - x[j]);
            if (err < best_err) {
                best_err = err;
                best = i;
            }
        }
        q[j] = (uint8_t)best;
    }
    b[0] = (uint8_t)e;
    for (int j = 0; j < 16; j++)
        b[1 + j] = (uint8_t)(q[j] | (q[j + 16] << 4));
}

size_t wpi_quant_row(int dtype, const float *in, void *out, size_t cols)
{
    size_t bytes = wpi_row_bytes(dtype, cols);
    uint8_t *o = out;
    if (bytes == 0)
        return 0;
    switch (dtype) {
    case WPI_F32:
        memcpy(o, in, cols * 4);
        break;
    case WPI_F16:
        for (size_t j = 0; j < cols; j++)
            store_u16(o + 2 * j, wpi_f32_to_f16(in[j]));
        break;
    case WPI_BF16:
        for (size_t j = 0; j < cols; j++)
            store_u16(o + 2 * j, wpi_f32_to_bf16(in[j]));
        break;
    case WPI_Q8_0:
        for (size_t c = 0; c < cols; c += WPI_QK)
            quant_q8_0(in + c, o + c / WPI_QK * 34);
        break;
    case WPI_Q4_0:
        for (size_t c = 0; c < cols; c += WPI_QK)
            quant_q4_0(in + c, o + c / WPI_QK * 18);
        break;
    case WPI_Q4_1:
        for (size_t c = 0; c < cols; c += WPI_QK)
            quant_q4_1(in + c, o + c / WPI_QK * 20);
        break;
    case WPI_MXFP4:
        for (size_t c = 0; c < cols; c += WPI_QK)
            quant_mxfp4(in + c, o + c / WPI_QK * WPI_MXFP4_BYTES);
        break;
    default:
        return 0;
    }
    return bytes;
}

int wpi_blocks_valid(int dtype, const void *data, uint64_t bytes, uint64_t *bad_block)
{
    if (dtype != WPI_MXFP4)
        return 1;
    const uint8_t *p = data;
    for (uint64_t b = 0; b < bytes / WPI_MXFP4_BYTES; b++) {
        if (p[b * WPI_MXFP4_BYTES] == 255) {
            if (bad_block)
                *bad_block = b;
            return 0;
        }
    }
    return 1;
}

/* ---- matmul blocks (matmul.c's driver) --------------------------------------- */

/* One row against one x: each 32-weight span is dequantized, its float sum formed in
 * order and added to the row's sum. */
static float row_dot(int dtype, const uint8_t *row, const float *x, size_t cols)
{
    float y = 0.0f;
    for (size_t c = 0; c < cols; c += WPI_QK) {
        float span[WPI_QK];
        size_t n = cols - c < WPI_QK ? cols - c : WPI_QK;
        dequant_span(dtype, row, c, n, span);
        float s = 0.0f;
        for (size_t j = 0; j < n; j++)
            s += span[j] * x[c + j];
        y += s;
    }
    return y;
}

/* The table's chunk is one span, so the driver's tiled path adds the same span sums in
 * the same order as row_dot: a row's result does not depend on the token count. */
static void tile_2x4_ref(const float *w0, const float *w1, const float *const xt[4],
                         size_t n, float out[2][4])
{
    for (int i = 0; i < 2; i++) {
        const float *wi = i ? w1 : w0;
        for (int t = 0; t < 4; t++) {
            float s = 0.0f;
            for (size_t j = 0; j < n; j++)
                s += wi[j] * xt[t][j];
            out[i][t] = s;
        }
    }
}

WPI_APPLY_TILES(apply_tiles, tile_2x4_ref)

/* Several tokens: each 32-weight span of a row is dequantized once, and every token's
 * span sum is formed and added as row_dot does, so each result equals row_dot's bit for
 * bit whatever the token count. */
static void rows_multi(int dtype, const uint8_t *w, size_t rb, size_t n_rows, const float *x,
                       size_t ldx, size_t n_tok, size_t cols, float *y, size_t ldy)
{
    for (size_t r = 0; r < n_rows; r++) {
        const uint8_t *row = w + r * rb;
        float acc[WPI_MULTI_TOK] = {0.0f};
        for (size_t c = 0; c < cols; c += WPI_QK) {
            float span[WPI_QK];
            size_t n = cols - c < WPI_QK ? cols - c : WPI_QK;
            dequant_span(dtype, row, c, n, span);
            for (size_t t = 0; t < n_tok; t++) {
                const float *xt = x + t * ldx + c;
                float s = 0.0f;
                for (size_t j = 0; j < n; j++)
                    s += span[j] * xt[j];
                acc[t] += s;
            }
        }
        for (size_t t = 0; t < n_tok; t++)
            y[t * ldy + r] = acc[t];
    }
}

#define REF_DTYPE(sfx, dtype)                                                            \
    static float row_dot_##sfx(const uint8_t *row, const float *x, size_t cols)          \
    {                                                                                    \
        return row_dot(dtype, row, x, cols);                                             \
    }                                                                                    \
    static void dequant_##sfx(const uint8_t *row, size_t c, size_t n, float *out)        \
    {                                                                                    \
        dequant_span(dtype, row, c, n, out);                                             \
    }                                                                                    \
    static void multi_##sfx(const uint8_t *w, size_t rb, size_t n_rows, const float *x,   \
                            size_t ldx, size_t n_tok, size_t cols, float *y, size_t ldy)  \
    {                                                                                    \
        rows_multi(dtype, w, rb, n_rows, x, ldx, n_tok, cols, y, ldy);                   \
    }

REF_DTYPE(f32, WPI_F32)
REF_DTYPE(f16, WPI_F16)
REF_DTYPE(bf16, WPI_BF16)
REF_DTYPE(q8_0, WPI_Q8_0)
REF_DTYPE(q4_0, WPI_Q4_0)
REF_DTYPE(q4_1, WPI_Q4_1)
REF_DTYPE(mxfp4, WPI_MXFP4)

static const wpi_rows_multi_fn multi_ref[WPI_SLOTS] = {
    [WPI_SLOT_F32] = multi_f32, [WPI_SLOT_F16] = multi_f16, [WPI_SLOT_BF16] = multi_bf16,
    [WPI_SLOT_Q8_0] = multi_q8_0, [WPI_SLOT_Q4_0] = multi_q4_0, [WPI_SLOT_Q4_1] = multi_q4_1,
    [WPI_SLOT_MXFP4] = multi_mxfp4,
};

static float dot_f32_ref(const float *a, const float *b, size_t n)
{
    float s = 0.0f;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static void axpy_f32_ref(float a, const float *x, float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

const wpi_blocks wpi_blocks_ref = {
    .name = "scalar",
    .chunk = WPI_QK,
    .row_dot = {
        [WPI_SLOT_F32] = row_dot_f32, [WPI_SLOT_F16] = row_dot_f16,
        [WPI_SLOT_BF16] = row_dot_bf16, [WPI_SLOT_Q8_0] = row_dot_q8_0,
        [WPI_SLOT_Q4_0] = row_dot_q4_0, [WPI_SLOT_Q4_1] = row_dot_q4_1,
        [WPI_SLOT_MXFP4] = row_dot_mxfp4,
    },
    .dequant = {
        [WPI_SLOT_F32] = dequant_f32, [WPI_SLOT_F16] = dequant_f16,
        [WPI_SLOT_BF16] = dequant_bf16, [WPI_SLOT_Q8_0] = dequant_q8_0,
        [WPI_SLOT_Q4_0] = dequant_q4_0, [WPI_SLOT_Q4_1] = dequant_q4_1,
        [WPI_SLOT_MXFP4] = dequant_mxfp4,
    },
    .apply = apply_tiles,
    .multi = multi_ref,
    .multi_max = WPI_EACH_SLOT(16),
    .dot_f32 = dot_f32_ref,
    .axpy_f32 = axpy_f32_ref,
};

/* ---- elementwise ----------------------------------------------------------------- */

void wpi_rmsnorm(float *out, const float *x, const float *w, size_t n, float eps)
{
    double ss = 0.0;
    for (size_t i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float scale = n ? (float)(1.0 / sqrt(ss / (double)n + eps)) : 0.0f;
    for (size_t i = 0; i < n; i++)
        out[i] = x[i] * scale * (w ? w[i] : 1.0f);
}

void wpi_softmax(float *x, size_t n)
{
    if (n == 0)
        return;
    float max = x[0];
    for (size_t i = 1; i < n; i++)
        max = x[i] > max ? x[i] : max;
    if (max == -INFINITY) {
        for (size_t i = 0; i < n; i++)
            x[i] = 1.0f / (float)n;
        return;
    }
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (size_t i = 0; i < n; i++)
        x[i] *= inv;
}

float wpi_silu(float x)
{
    return x / (1.0f + expf(-x));
}

/*
 * test_kernels_x8.c -- the 8-bit-activation path: the activation quantizer, every x8
 * table this CPU can run against the scalar twin, and the int8 results against the
 * float32 path within the error the quantization allows.
 *
 * Bounds, per output y = sum_j w_j x_j (w the dequantized weights, x~ = d_b q_j the
 * quantized activations of block b):
 *   mag = sum_j (|w_j| + |m_b|) |x~_j| + sum_b |m_b s_b| (m_b: q4_1's offset, else 0),
 *   x~_j = d_b (q_j + r_j / 256) (the two planes)
 *   scalar int8 vs sum_j w_j x~_j in double, and each SIMD table vs the scalar int8:
 *     <= 1e-6 * mag + 1e-30 (float accumulation order and the rounded scale products)
 *   scalar int8 vs the float32 path: <= sum_b d_b / 256 * sum_{j in b} |w_j| (each
 *     |x_j - x~_j| <= d_b / 256), plus 1e-5 * (mag + sum_j |w_j x_j|)
 * and neither splitting a row range in two nor computing one token at a time changes a
 * bit.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "wp.h"
#include "kernels/kernels.h"
#include "check.h"

static const int DTYPES[] = {WPI_Q8_0, WPI_Q4_0, WPI_Q4_1, WPI_MXFP4};

static void test_quantizer(void)
{
    enum { N = 32 * 40 };
    float x[N];
    wpi_xq q[N / 32];
    for (int i = 0; i < N; i++)
        x[i] = frand() * ldexpf(1.0f, i / 32 % 9 - 4);
    for (int j = 0; j < 32; j++)
        x[j] = 0.0f; /* an all-zero block */
    x[32 * 5 + 3] = NAN;
    x[32 * 6 + 7] = INFINITY;
    wpi_quant_x8(x, N, q);
    for (int b = 0; b < N / 32; b++) {
        if (b == 5 || b == 6) {
            CHECK(isnan(q[b].d) && isnan(q[b].s), "block %d with a non-finite x: d %g", b,
                  q[b].d);
            continue;
        }
        int sum = 0, sum_r = 0, amax = 0;
        for (int j = 0; j < 32; j++) {
            int v = q[b].q[j], e = q[b].r[j];
            sum += v;
            sum_r += e;
            amax = abs(v) > amax ? abs(v) : amax;
            double err = fabs((double)x[b * 32 + j] - (double)q[b].d * (v + e / 256.0));
            CHECK(v >= -127 && v <= 127 && e >= -127 && e <= 127 &&
                      err <= q[b].d * (1 / 256.0 + 1e-5),
                  "block %d x %g q %d r %d d %g", b, x[b * 32 + j], v, e, q[b].d);
        }
        CHECK(b == 0 ? (q[b].d == 0.0f && amax == 0) : amax == 127,
              "block %d: largest |q| %d, d %g", b, amax, q[b].d);
        float s = q[b].d * ((float)sum + (float)sum_r / 256.0f);
        CHECK(q[b].s == s, "block %d: s %g, d * (sum q + sum r / 256) %g", b, q[b].s, s);
    }
}

/* The offset m of q4_1 block b of a row; 0 for the other dtypes. */
static float offset(int dtype, const uint8_t *row, size_t b)
{
    if (dtype != WPI_Q4_1)
        return 0.0f;
    const uint8_t *p = row + b * 20 + 2;
    return wpi_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

typedef struct {
    double worst_twin, worst_quant; /* max |err| / bound */
    int bad_split, bad_untouched, bad_ntok, cases;
} x8_stats;

static void x8_case(const wpi_kernels *k, int dtype, size_t rows, size_t cols, size_t n_tok,
                    x8_stats *st)
{
    size_t rb = wpi_row_bytes(dtype, cols), nb = cols / 32;
    size_t ldx = cols + rng % 5, ldq = nb + rng % 3, ldy = rows + rng % 5;
    uint8_t *w = malloc(rows * rb);
    float *deq = malloc(rows * cols * sizeof(float)), *src = malloc(cols * sizeof(float));
    float *x = malloc(n_tok * ldx * sizeof(float));
    wpi_xq *xq = malloc(n_tok * ldq * sizeof(wpi_xq));
    float *y = malloc(n_tok * ldy * sizeof(float)), *y2 = malloc(n_tok * ldy * sizeof(float));
    float *yr = malloc(n_tok * ldy * sizeof(float)), *yf = malloc(n_tok * ldy * sizeof(float));
    for (size_t r = 0; r < rows; r++) {
        float scale = ldexpf(1.0f, (int)(rng % 12) - 6);
        for (size_t c = 0; c < cols; c++)
            src[c] = frand() * scale;
        wpi_quant_row(dtype, src, w + r * rb, cols);
        wpi_dequant_row(dtype, w + r * rb, deq + r * cols, cols);
    }
    for (size_t i = 0; i < n_tok * ldx; i++)
        x[i] = frand() * (i % 97 == 0 ? 20.0f : 1.0f); /* outliers, as activations have */
    for (size_t t = 0; t < n_tok; t++)
        wpi_quant_x8(x + t * ldx, cols, xq + t * ldq);
    size_t r0 = rows > 2 ? rng % (rows / 2) : 0;
    size_t r1 = rows - (rows > 4 ? rng % (rows / 4) : 0);
    for (size_t i = 0; i < n_tok * ldy; i++)
        y[i] = y2[i] = yr[i] = yf[i] = NAN;

    wpi_kernels_matmul_x8(&wpi_kernels_ref, dtype)(w, cols, r0, r1, xq, ldq, n_tok, yr, ldy);
    wpi_matmul_x8_fn fn = wpi_kernels_matmul_x8(k, dtype);
    fn(w, cols, r0, r1, xq, ldq, n_tok, y, ldy);
    size_t mid = r0 + (r1 - r0) / 3;
    fn(w, cols, r0, mid, xq, ldq, n_tok, y2, ldy);
    fn(w, cols, mid, r1, xq, ldq, n_tok, y2, ldy);
    for (size_t t = 0; t < n_tok; t++) { /* one token at a time: the same bits */
        fn(w, cols, r0, r1, xq + t * ldq, ldq, 1, yf + t * ldy, ldy);
        for (size_t r = r0; r < r1; r++)
            st->bad_ntok += memcmp(&yf[t * ldy + r], &y[t * ldy + r], 4) != 0;
        for (size_t r = r0; r < r1; r++)
            yf[t * ldy + r] = NAN;
    }

    wpi_kernels_matmul(&wpi_kernels_ref, dtype)(w, cols, r0, r1, x, ldx, n_tok, yf, ldy);
    for (size_t t = 0; t < n_tok; t++) {
        for (size_t r = 0; r < ldy; r++) {
            float v = y[t * ldy + r];
            if (r < r0 || r >= r1) {
                st->bad_untouched += !isnan(v);
                continue;
            }
            const wpi_xq *q = xq + t * ldq;
            double e8 = 0.0, mag = 0.0, qerr = 0.0, magf = 0.0;
            for (size_t b = 0; b < nb; b++) {
                double m = fabs(offset(dtype, w + r * rb, b)), wsum = 0.0;
                for (size_t j = 0; j < 32; j++) {
                    double wj = deq[r * cols + b * 32 + j];
                    double xj = (double)q[b].d * (q[b].q[j] + q[b].r[j] / 256.0);
                    e8 += wj * xj;
                    mag += (fabs(wj) + m) * fabs(xj);
                    magf += fabs(wj * x[t * ldx + b * 32 + j]);
                    wsum += fabs(wj);
                }
                mag += m * fabs(q[b].s);
                qerr += q[b].d / 256.0 * wsum;
            }
            double tol = 1e-6 * mag + 1e-30, ref = yr[t * ldy + r];
            double e1 = fabs(ref - e8) / tol, e2 = fabs((double)v - ref) / tol;
            double e3 = fabs(ref - yf[t * ldy + r]) / (qerr + 1e-5 * (mag + magf) + 1e-30);
            double e = e1 > e2 ? e1 : e2;
            st->worst_twin = e <= st->worst_twin ? st->worst_twin : isnan(e) ? INFINITY : e;
            st->worst_quant = e3 <= st->worst_quant ? st->worst_quant
                              : isnan(e3)           ? INFINITY
                                                    : e3;
            st->bad_split += memcmp(&v, &y2[t * ldy + r], 4) != 0;
        }
    }
    st->cases++;
    free(w); free(deq); free(src); free(x); free(xq); free(y); free(y2); free(yr); free(yf);
}

static void test_set(const wpi_kernels *k)
{
    static const size_t colss[] = {32, 64, 96, 160, 4096 + 32};
    static const size_t ntoks[] = {1, 2, 3, 5};
    static const size_t rowss[] = {1, 3, 13, 17};
    for (size_t di = 0; di < sizeof DTYPES / sizeof DTYPES[0]; di++) {
        int dt = DTYPES[di];
        x8_stats st = {0};
        for (size_t ci = 0; ci < sizeof colss / sizeof colss[0]; ci++)
            for (size_t ti = 0; ti < sizeof ntoks / sizeof ntoks[0]; ti++)
                for (size_t ri = 0; ri < sizeof rowss / sizeof rowss[0]; ri++)
                    x8_case(k, dt, rowss[ri], colss[ci], ntoks[ti], &st);
        int ok = st.worst_twin <= 1.0 && st.worst_quant <= 1.0 && !st.bad_split &&
                 !st.bad_untouched && !st.bad_ntok;
        CHECK(ok, "%s x8 %s: worst twin err/tol %.3f, quant err/bound %.3f, split %d, "
              "untouched %d, differing from one token at a time %d", k->x8_name,
              wpi_dtype_name(dt), st.worst_twin, st.worst_quant, st.bad_split,
              st.bad_untouched, st.bad_ntok);
        printf("%s %-10s x8 %-5s: %d shapes, worst twin err/tol %.3f, int8 vs f32 err/bound "
               "%.3f\n", ok ? "PASS" : "FAIL", k->x8_name, wpi_dtype_name(dt), st.cases,
               st.worst_twin, st.worst_quant);
    }
}

int main(void)
{
    test_quantizer();
    CHECK(wpi_kernels_matmul_x8(&wpi_kernels_ref, WPI_F32) == NULL &&
              wpi_kernels_matmul_x8(&wpi_kernels_ref, WPI_F16) == NULL &&
              wpi_kernels_matmul_x8(NULL, WPI_Q8_0) == NULL,
          "float dtypes have no 8-bit path");
    test_set(&wpi_kernels_ref);
#if defined(__x86_64__)
    unsigned a, b, c, d;
    __builtin_cpu_init();
    int avxvnni = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4));
    int vnni512 = __builtin_cpu_supports("avx512vnni");
    const wpi_kernels *k2 = wpi_kernels_get(WP_ISA_AVX2), *k5 = wpi_kernels_get(WP_ISA_AVX512);
    const struct { const wpi_kernels *set; int runs; const char *needs; } sets[] = {
        {&wpi_kernels_avx2, k2 != NULL, "AVX2"},
        {&wpi_kernels_avxvnni, k2 && avxvnni, "AVX-VNNI"},
        {&wpi_kernels_avx512, k5 != NULL, "AVX-512 F/BW/VL"},
        {&wpi_kernels_avx512vnni, k5 && vnni512, "AVX512-VNNI"},
    };
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) {
        if (sets[i].runs)
            test_set(sets[i].set);
        else
            printf("SKIP %s x8 kernels: this CPU lacks %s [not provided by CI]\n",
                   sets[i].set->x8_name, sets[i].needs);
    }
    CHECK(!k2 || k2 == (avxvnni ? &wpi_kernels_avxvnni : &wpi_kernels_avx2),
          "dispatch of the AVX2 set: %s", k2 ? k2->x8_name : "-");
    CHECK(!k5 || k5 == (vnni512 ? &wpi_kernels_avx512vnni : &wpi_kernels_avx512),
          "dispatch of the AVX-512 set: %s", k5 ? k5->x8_name : "-");
#endif
    printf("kernels x8: %d failed\n", failures);
    return failures ? 1 : 0;
}

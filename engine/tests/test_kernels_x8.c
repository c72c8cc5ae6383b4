/*
 * test_kernels_x8.c -- the 8-bit-activation path: the activation quantizer (two planes,
 * x ~= d (q + r / 256)) and its SIMD versions byte for byte against the scalar twin
 * (NaN, infinities, zeros, subnormals, huge values, ties of q and of r), every x8 table
 * this CPU can run against the scalar twin, and the int8 results against the float32
 * path within the error the quantization allows.
 *
 * Bounds, per output y = sum_j w_j x_j (w the dequantized weights, x~_j = d_b (q_j +
 * r_j / 256) the quantized activations of block b):
 *   mag = sum_j (|w_j| + |m_b|) |x~_j| + sum_b |m_b s_b| (m_b: q4_1's offset, else 0)
 *   scalar int8 vs sum_j w_j x~_j in double, and each SIMD table vs the scalar int8:
 *     <= 1e-6 * mag + 1e-30 (float accumulation order and the rounded scale products)
 *   scalar int8 vs the float32 path: <= sum_j e_j |w_j|, e_j = d_b / 512 (half the r
 *     plane's step; d_b / 256 where |r_j| is clamped at 127) plus d_b * 2^-15 (x / d
 *     rounded in float), plus 1e-5 * (mag + sum_j |w_j x_j|)
 * The residual plane is used: the rms error against the float32 path is under 1/64 of
 * the one with r zeroed (one plane, q alone; about 1/256 expected). Neither splitting a
 * row range in two nor computing one token at a time changes a bit; with the AMX set, a
 * step of WPI_AMX_MIN_TOK or more tokens (AMX tiles, where fewer take the AVX-512 VNNI
 * ones) is compared with each token alone among copies of itself, so that it is still
 * such a step.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "wp.h"
#include "kernels/kernels.h"
#include "check.h"
#include "x8_isas.h"

static const int DTYPES[] = {WPI_Q8_0, WPI_Q4_0, WPI_Q4_1, WPI_MXFP4};

/* The bound on |x - d (q + r / 256)| (file comment). */
static double x8_err_bound(const wpi_xq *b, int j)
{
    return (double)b->d * ((abs(b->r[j]) == 127 ? 1.0 / 256 : 1.0 / 512) + ldexp(1.0, -15));
}

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
    for (int j = 0; j < 32; j++) /* halfway between two q: r is clamped to 127 */
        x[32 * 7 + j] = (j == 0 ? 127.0f : (float)(j - 16) + 0.5f) / 64.0f;
    wpi_quant_x8(x, N, q);
    int clamped = 0;
    for (int b = 0; b < N / 32; b++) {
        if (b == 5 || b == 6) {
            CHECK(isnan(q[b].d) && isnan(q[b].s), "block %d with a non-finite x: d %g", b,
                  q[b].d);
            continue;
        }
        int sum = 0, amax = 0;
        for (int j = 0; j < 32; j++) {
            int v = q[b].q[j], r = q[b].r[j];
            sum += 256 * v + r;
            amax = abs(v) > amax ? abs(v) : amax;
            clamped += abs(r) == 127;
            double err = fabs((double)x[b * 32 + j] - (double)q[b].d * (v + r / 256.0));
            CHECK(v >= -127 && v <= 127 && r >= -127 && r <= 127 &&
                      err <= x8_err_bound(&q[b], j),
                  "block %d x %g q %d r %d d %g", b, x[b * 32 + j], v, r, q[b].d);
        }
        CHECK(b == 0 ? (q[b].d == 0.0f && amax == 0) : amax == 127,
              "block %d: largest |q| %d, d %g", b, amax, q[b].d);
        CHECK(q[b].s == q[b].d * ((float)sum / 256.0f), "block %d: s %g, d * sum %g", b,
              q[b].s, q[b].d * ((float)sum / 256.0f));
    }
    CHECK(clamped >= 31, "halfway values: %d residuals at 127", clamped);
}

/* Block kind k of the quantizer twin test: 32 floats at x. */
static void twin_block(float *x, int k)
{
    int e = (int)(rng % 260) - 140; /* scales 2^-140 .. 2^119 */
    int at = (int)(rng % 32);
    for (int j = 0; j < 32; j++)
        x[j] = frand() * ldexpf(1.0f, e);
    switch (k) {
    case 0: break;                                                  /* random, any scale */
    case 1: for (int j = 0; j < 32; j++) x[j] = j % 3 ? 0.0f : -0.0f; break; /* zeros */
    case 2: x[at] = NAN; break;
    case 3: x[at] = rng & 1 ? INFINITY : -INFINITY; break;
    case 4: /* x / d halfway between two q */
        for (int j = 0; j < 32; j++)
            x[j] = ldexpf((float)((int)(rng % 254) - 127) + 0.5f, e / 2);
        x[at] = ldexpf(rng & 1 ? 127.0f : -127.0f, e / 2);
        break;
    case 5: /* (x / d - q) * 256 halfway between two r */
        for (int j = 0; j < 32; j++)
            x[j] = ldexpf((float)((int)(rng % 254) - 127) +
                              ((float)((int)(rng % 256) - 128) + 0.5f) / 256.0f, e / 2);
        x[at] = ldexpf(127.0f, e / 2);
        break;
    case 6: /* one ulp either side of halfway */
        for (int j = 0; j < 32; j++) {
            float h = ldexpf((float)((int)(rng % 254) - 127) + 0.5f, e / 2);
            x[j] = nextafterf(h, rng & 1 ? INFINITY : -INFINITY);
        }
        x[at] = ldexpf(127.0f, e / 2);
        break;
    case 7: /* subnormals: 1 / d overflows */
        for (int j = 0; j < 32; j++)
            x[j] = frand() * ldexpf(1.0f, -127 - (int)(rng % 23));
        break;
    case 8: /* amax where d = amax / 127 is subnormal and 1 / d is finite, or just not */
        for (int j = 0; j < 32; j++) x[j] = frand() * ldexpf(1.0f, -122 + (int)(rng % 4));
        break;
    case 9: for (int j = 0; j < 32; j++) x[j] = frand() * 3.40282347e38f; /* huge */
        x[at] = rng & 1 ? 3.40282347e38f : -3.40282347e38f;
        break;
    case 10: for (int j = 0; j < 32; j++) x[j] = 0.0f; /* one value among zeros */
        break;
    default: /* one normal value among subnormals and zeros */
        for (int j = 0; j < 32; j++) x[j] = j % 2 ? 0.0f : frand() * ldexpf(1.0f, -140);
        break;
    }
}

/* Blocks of a quantizer that differ from the scalar twin's, byte for byte. */
static int twin_diff(void (*quant)(const float *, size_t, wpi_xq *), const char *name,
                     const float *x, size_t n, const wpi_xq *want)
{
    wpi_xq *got = malloc(n / 32 * sizeof(wpi_xq));
    memset(got, 0x5a, n / 32 * sizeof(wpi_xq));
    quant(x, n, got);
    int bad = 0;
    for (size_t b = 0; b < n / 32; b++) {
        if (memcmp(&got[b], &want[b], sizeof(wpi_xq)) == 0)
            continue;
        if (bad++ == 0)
            printf("%s quantizer: block %zu differs (x[0] %a, d %a vs %a, s %a vs %a)\n",
                   name, b, x[b * 32], got[b].d, want[b].d, got[b].s, want[b].s);
    }
    free(got);
    return bad;
}

/* Every quantizer this CPU runs writes the scalar twin's bytes: random blocks of every
 * kind above over ragged lengths, then a sweep of x / d over every 4099th float below 128
 * of either sign (d = 1: each block's first value is 127). */
static void test_quantizer_twins(void)
{
    typedef void (*quant_fn)(const float *, size_t, wpi_xq *);
    const char *names[] = {"dispatched", "avx2"};
    quant_fn fns[] = {wpi_quant_x8, NULL};
    const char *needs[] = {"", "AVX2"};
    int versions = 1; /* the AVX2 version exists only in x86-64 builds */
#if defined(__x86_64__)
    versions = 2;
    fns[1] = wp_isa_supported() & (1u << WP_ISA_AVX2) ? wpi_quant_x8_avx2 : NULL;
#endif
    enum { KINDS = 12, LEN = 32 * 61, SWEEP = 32 * 20000 };
    float *x = malloc(SWEEP * sizeof(float));
    wpi_xq *want = malloc(SWEEP / 32 * sizeof(wpi_xq));
    int bad[2] = {0}, blocks = 0;
    for (int round = 0; round < 400; round++) {
        size_t n = 32 * (1 + rng % (LEN / 32)), off = rng % 4; /* unaligned too */
        for (size_t b = 0; b < n / 32; b++)
            twin_block(x + off + b * 32, (int)(rng % KINDS));
        wpi_quant_x8_ref(x + off, n, want);
        blocks += (int)(n / 32);
        for (int i = 0; i < versions; i++)
            if (fns[i])
                bad[i] += twin_diff(fns[i], names[i], x + off, n, want);
    }
    size_t n = 0;
    for (uint32_t u = 0; u < 0x43000000u && n < SWEEP; u += 4099, n++) {
        float f;
        memcpy(&f, &u, 4);
        x[n] = n % 32 == 0 ? 127.0f : n % 2 ? -f : f;
    }
    n -= n % 32;
    wpi_quant_x8_ref(x, n, want);
    blocks += (int)(n / 32);
    for (int i = 0; i < versions; i++)
        if (fns[i])
            bad[i] += twin_diff(fns[i], names[i], x, n, want);
    for (int i = 0; i < versions; i++) {
        if (!fns[i]) {
            printf("SKIP %s quantizer: this CPU lacks %s [not provided by CI]\n", names[i],
                   needs[i]);
            continue;
        }
        CHECK(bad[i] == 0, "%s quantizer: %d of %d blocks differ from the scalar twin",
              names[i], bad[i], blocks);
        printf("%s %s quantizer: %d blocks, %d differing from the scalar twin\n",
               bad[i] ? "FAIL" : "PASS", names[i], blocks, bad[i]);
    }
    free(x);
    free(want);
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
    double sq2, sq1;                /* sum of squared errors against float32: two planes,
                                     * r zeroed */
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
    wpi_xq *x1 = malloc(n_tok * ldq * sizeof(wpi_xq)); /* xq with r zeroed: one plane */
    float *y1 = malloc(n_tok * ldy * sizeof(float));
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
    memcpy(x1, xq, n_tok * ldq * sizeof(wpi_xq));
    for (size_t i = 0; i < n_tok * ldq; i++) {
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            sum += x1[i].q[j];
            x1[i].r[j] = 0;
        }
        x1[i].s = x1[i].d * (float)sum;
    }
    size_t r0 = rows > 2 ? rng % (rows / 2) : 0;
    size_t r1 = rows - (rows > 4 ? rng % (rows / 4) : 0);
    for (size_t i = 0; i < n_tok * ldy; i++)
        y[i] = y2[i] = yr[i] = yf[i] = NAN;

    wpi_kernels_matmul_x8(&wpi_kernels_ref, dtype)(w, cols, r0, r1, xq, ldq, n_tok, yr, ldy);
    wpi_matmul_x8_fn fn = wpi_kernels_matmul_x8(k, dtype);
    fn(w, cols, r0, r1, xq, ldq, n_tok, y, ldy);
    fn(w, cols, r0, r1, x1, ldq, n_tok, y1, ldy);
    size_t mid = r0 + (r1 - r0) / 3;
    fn(w, cols, r0, mid, xq, ldq, n_tok, y2, ldy);
    fn(w, cols, mid, r1, xq, ldq, n_tok, y2, ldy);
#if defined(__x86_64__)
    size_t alone = k == &wpi_kernels_avx512amx && n_tok >= WPI_AMX_MIN_TOK ? WPI_AMX_MIN_TOK : 1;
#else
    size_t alone = 1;
#endif
    wpi_xq *xa = malloc(alone * ldq * sizeof(wpi_xq));
    float *ya = malloc(alone * ldy * sizeof(float));
    for (size_t t = 0; t < n_tok; t++) { /* one token at a time: the same bits */
        for (size_t i = 0; i < alone; i++)
            memcpy(xa + i * ldq, xq + t * ldq, ldq * sizeof(wpi_xq));
        fn(w, cols, r0, r1, xa, ldq, alone, ya, ldy);
        memcpy(yf + t * ldy + r0, ya + r0, (r1 - r0) * sizeof(float));
        for (size_t r = r0; r < r1; r++)
            st->bad_ntok += memcmp(&yf[t * ldy + r], &y[t * ldy + r], 4) != 0;
        for (size_t r = r0; r < r1; r++)
            yf[t * ldy + r] = NAN;
    }
    free(xa);
    free(ya);

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
                for (int j = 0; j < 32; j++) {
                    double wj = deq[r * cols + b * 32 + j];
                    double xj = (double)q[b].d * (q[b].q[j] + q[b].r[j] / 256.0);
                    e8 += wj * xj;
                    mag += (fabs(wj) + m) * fabs(xj);
                    magf += fabs(wj * x[t * ldx + b * 32 + j]);
                    wsum += fabs(wj) * x8_err_bound(&q[b], j);
                }
                mag += m * fabs(q[b].s);
                qerr += wsum;
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
            double f = yf[t * ldy + r];
            st->sq2 += (v - f) * (v - f);
            st->sq1 += (y1[t * ldy + r] - f) * (y1[t * ldy + r] - f);
        }
    }
    st->cases++;
    free(w); free(deq); free(src); free(x); free(xq); free(y); free(y2); free(yr); free(yf);
    free(x1); free(y1);
}

static void test_set(const wpi_kernels *k)
{
    static const size_t colss[] = {32, 64, 96, 160, 4096 + 32};
    static const size_t ntoks[] = {1, 2, 3, 4, 5, 9};
    static const size_t rowss[] = {1, 3, 13, 17};
    for (size_t di = 0; di < sizeof DTYPES / sizeof DTYPES[0]; di++) {
        int dt = DTYPES[di];
        x8_stats st = {0};
        for (size_t ci = 0; ci < sizeof colss / sizeof colss[0]; ci++)
            for (size_t ti = 0; ti < sizeof ntoks / sizeof ntoks[0]; ti++)
                for (size_t ri = 0; ri < sizeof rowss / sizeof rowss[0]; ri++)
                    x8_case(k, dt, rowss[ri], colss[ci], ntoks[ti], &st);
        double planes = sqrt(st.sq2 / st.sq1); /* rms error, two planes / one */
        int ok = st.worst_twin <= 1.0 && st.worst_quant <= 1.0 && !st.bad_split &&
                 !st.bad_untouched && !st.bad_ntok && planes < 1.0 / 64;
        CHECK(ok, "%s x8 %s: worst twin err/tol %.3f, quant err/bound %.3f, split %d, "
              "untouched %d, differing from one token at a time %d, rms err two planes / "
              "one %.4f", k->x8_name, wpi_dtype_name(dt), st.worst_twin, st.worst_quant,
              st.bad_split, st.bad_untouched, st.bad_ntok, planes);
        printf("%s %-10s x8 %-5s: %d shapes, worst twin err/tol %.3f, int8 vs f32 err/bound "
               "%.3f, rms err two planes / one %.4f\n", ok ? "PASS" : "FAIL", k->x8_name,
               wpi_dtype_name(dt), st.cases, st.worst_twin, st.worst_quant, planes);
    }
}

int main(void)
{
    test_quantizer();
    test_quantizer_twins();
    CHECK(wpi_kernels_matmul_x8(&wpi_kernels_ref, WPI_F32) == NULL &&
              wpi_kernels_matmul_x8(&wpi_kernels_ref, WPI_F16) == NULL &&
              wpi_kernels_matmul_x8(NULL, WPI_Q8_0) == NULL,
          "float dtypes have no 8-bit path");
    test_set(&wpi_kernels_ref);
#if defined(__x86_64__) || defined(__aarch64__)
    x8_isas isa = x8_isas_detect();
#if defined(__x86_64__)
    const wpi_kernels *sets[X8_ISAS] = {&wpi_kernels_avx2, &wpi_kernels_avxvnni,
                                        &wpi_kernels_avx512, &wpi_kernels_avx512vnni,
                                        &wpi_kernels_avx512amx};
#else
    const wpi_kernels *sets[X8_ISAS] = {&wpi_kernels_neon, &wpi_kernels_neondot};
#endif
    for (int i = 0; i < X8_ISAS; i++) {
        if (isa.runs[i])
            test_set(sets[i]);
        else
            printf("SKIP %s x8 kernels: this CPU lacks %s [not provided by CI]\n",
                   sets[i]->x8_name, x8_isa_needs[i]);
    }
#endif
#if defined(__x86_64__)
    CHECK(!isa.k2 || isa.k2 == (isa.avxvnni ? &wpi_kernels_avxvnni : &wpi_kernels_avx2),
          "dispatch of the AVX2 set: %s", isa.k2 ? isa.k2->x8_name : "-");
    CHECK(!isa.k5 || isa.k5 == (isa.runs[4]   ? &wpi_kernels_avx512amx
                                : isa.runs[3] ? &wpi_kernels_avx512vnni
                                              : &wpi_kernels_avx512),
          "dispatch of the AVX-512 set: %s", isa.k5 ? isa.k5->x8_name : "-");
#elif defined(__aarch64__)
    CHECK(isa.expect < 0 || isa.dotprod == isa.expect,
          "dot-product detection %d, WP_TEST_EXPECT_DOTPROD %d", isa.dotprod, isa.expect);
    CHECK(isa.kn == (isa.dotprod ? &wpi_kernels_neondot : &wpi_kernels_neon) &&
              wpi_kernels_get(WP_ISA_AUTO) == isa.kn,
          "dispatch of the NEON set: %s", isa.kn ? isa.kn->x8_name : "-");
    printf("NEON x8 kernels in use: %s (FEAT_DotProd %d, expected %d)\n",
           isa.kn ? isa.kn->x8_name : "-", isa.dotprod, isa.expect);
#endif
    printf("kernels x8: %d failed\n", failures);
    return failures ? 1 : 0;
}

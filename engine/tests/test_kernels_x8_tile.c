/*
 * test_kernels_x8_tile.c -- the 8-bit-activation tile kernels (x8_tile.h): every table
 * this CPU can run against the scalar twin, and the twin against the exact sum.
 *
 * Per output y = sum_j w_j x~_j (w the dequantized weights, x~ = d_b (q_j + r_j / 256) the
 * two-plane activations of block b), with
 *   mag = sum_j (|w_j| + |m_b|) |x~_j| + sum_b |m_b s_b| (m_b: q4_1's offset, else 0):
 *   the twin vs y in double, and each table vs the twin: <= 1e-6 * mag + 1e-30;
 *   an output is NaN exactly where its token has a NaN block.
 * Every fourth mxfp4 row has scale bytes 0..2 (subnormal scales) or 90..169.
 * Shapes: random rows (ragged against every tile height), 1..17, 31 and 64 tokens,
 * block counts even and odd, padded strides. A token's outputs must equal, bit for bit,
 * those of the token alone and those of a call where it sits among other tokens.
 * On AArch64 the two NEON tables must also equal each other bit for bit.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "wp.h"
#include "kernels/kernels.h"
#include "kernels/x8_tile.h"
#include "check.h"
#include "x8_isas.h"

static const int DTYPES[] = {WPI_Q8_0, WPI_Q4_0, WPI_Q4_1, WPI_MXFP4};

static float f16at(const uint8_t *p)
{
    return wpi_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

typedef struct {
    double worst_twin, worst_exact; /* max |err| / tol */
    int bad_nan, bad_alone, bad_mixed, bad_untouched, cases;
} tile_stats;

typedef struct {
    int dtype;
    size_t rows, cols, nb, rb, n_tok, ldq, ldy;
    uint8_t *w;
    float *deq;
    wpi_xq *xq;
    int *nan_tok; /* token t has a NaN block */
} tile_case;

static void case_make(tile_case *c, int dtype, size_t rows, size_t cols, size_t n_tok)
{
    c->dtype = dtype;
    c->rows = rows;
    c->cols = cols;
    c->nb = cols / 32;
    c->rb = wpi_row_bytes(dtype, cols);
    c->n_tok = n_tok;
    c->ldq = c->nb + rng % 3;
    c->ldy = rows + rng % 5;
    c->w = malloc(rows * c->rb);
    c->deq = malloc(rows * cols * sizeof(float));
    c->xq = malloc(n_tok * c->ldq * sizeof(wpi_xq));
    c->nan_tok = calloc(n_tok, sizeof(int));
    float *src = malloc(cols * sizeof(float));
    for (size_t r = 0; r < rows; r++) {
        float scale = ldexpf(1.0f, (int)(rng % 12) - 6);
        for (size_t j = 0; j < cols; j++)
            src[j] = frand() * scale;
        wpi_quant_row(dtype, src, c->w + r * c->rb, cols);
        if (dtype == WPI_MXFP4 && r % 4 == 3) /* scale bytes far from 127, and 0..2 */
            for (size_t b = 0; b < c->nb; b++) {
                uint32_t u = (uint32_t)((frand() + 1.0f) * 32768.0f);
                c->w[r * c->rb + b * WPI_MXFP4_BYTES] = (uint8_t)(u % 5 == 0 ? u % 3 : 90 + u % 80);
            }
        wpi_dequant_row(dtype, c->w + r * c->rb, c->deq + r * cols, cols);
    }
    for (size_t t = 0; t < n_tok; t++) {
        for (size_t j = 0; j < cols; j++)
            src[j] = frand() * (j % 97 == 0 ? 20.0f : 1.0f); /* outliers, as activations have */
        if (n_tok > 2 && t % 7 == 3) { /* a NaN block in some tokens */
            src[rng % cols] = NAN;
            c->nan_tok[t] = 1;
        }
        wpi_quant_x8(src, cols, c->xq + t * c->ldq);
    }
    free(src);
}

static void case_free(tile_case *c)
{
    free(c->w); free(c->deq); free(c->xq); free(c->nan_tok);
}

/* Runs fn on all of c's rows and tokens into a fresh y (NaN outside the outputs). */
static float *run(const tile_case *c, wpi_tile_x8_fn fn)
{
    float *y = malloc(c->n_tok * c->ldy * sizeof(float));
    for (size_t i = 0; i < c->n_tok * c->ldy; i++)
        y[i] = NAN;
    fn(c->w, c->rb, c->rows, c->xq, c->ldq, c->n_tok, c->nb, y, c->ldy);
    return y;
}

/* Row r's exact sum with token t in double, and its mag. */
static double exact(const tile_case *c, size_t r, size_t t, double *mag)
{
    const wpi_xq *q = c->xq + t * c->ldq;
    double e = 0.0;
    *mag = 0.0;
    for (size_t b = 0; b < c->nb; b++) {
        double m = c->dtype == WPI_Q4_1 ? fabs(f16at(c->w + r * c->rb + b * 20 + 2)) : 0.0;
        for (size_t j = 0; j < 32; j++) {
            double xj = (double)q[b].d * (q[b].q[j] + q[b].r[j] / 256.0);
            double wj = c->deq[r * c->cols + b * 32 + j];
            e += wj * xj;
            *mag += (fabs(wj) + m) * fabs(xj);
        }
        *mag += m * fabs(q[b].s);
    }
    return e;
}

static int same_bits(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* Token t alone, and token t among others (a shuffled copy of the tokens, t at a random
 * place): both must give its outputs of the full call bit for bit. */
static void check_independence(const tile_case *c, wpi_tile_x8_fn fn, const float *y,
                               tile_stats *st)
{
    size_t n = c->n_tok, ldq = c->ldq, ldy = c->ldy;
    float *y1 = malloc(ldy * sizeof(float));
    wpi_xq *mix = malloc(n * ldq * sizeof(wpi_xq));
    float *ym = malloc(n * ldy * sizeof(float));
    size_t *perm = malloc(n * sizeof(size_t));
    for (size_t t = 0; t < n; t++)
        perm[t] = t;
    for (size_t t = n; t > 1; t--) {
        size_t j = rng % t, v = perm[t - 1];
        perm[t - 1] = perm[j];
        perm[j] = v;
    }
    for (size_t t = 0; t < n; t++)
        memcpy(mix + t * ldq, c->xq + perm[t] * ldq, ldq * sizeof(wpi_xq));
    fn(c->w, c->rb, c->rows, mix, ldq, n, c->nb, ym, ldy);
    for (size_t t = 0; t < n; t++) {
        fn(c->w, c->rb, c->rows, c->xq + t * ldq, ldq, 1, c->nb, y1, ldy);
        for (size_t r = 0; r < c->rows; r++) {
            st->bad_alone += !same_bits(y1[r], y[t * ldy + r]);
            st->bad_mixed += !same_bits(ym[t * ldy + r], y[perm[t] * ldy + r]);
        }
    }
    free(y1); free(mix); free(ym); free(perm);
}

static void tile_case_run(const wpi_tiles_x8 *k, int dtype, size_t rows, size_t cols,
                          size_t n_tok, tile_stats *st)
{
    tile_case c;
    case_make(&c, dtype, rows, cols, n_tok);
    wpi_tile_x8_fn fn = k->tile[dtype == WPI_Q8_0 ? 0 : dtype == WPI_Q4_0 ? 1
                                : dtype == WPI_Q4_1 ? 2 : 3];
    wpi_tile_x8_fn twin = wpi_x8t_ref.tile[dtype == WPI_Q8_0 ? 0 : dtype == WPI_Q4_0 ? 1
                                           : dtype == WPI_Q4_1 ? 2 : 3];
    float *y = run(&c, fn), *yr = run(&c, twin);
    for (size_t t = 0; t < n_tok; t++) {
        for (size_t r = 0; r < c.ldy; r++) {
            float v = y[t * c.ldy + r];
            if (r >= rows) {
                st->bad_untouched += !isnan(v);
                continue;
            }
            if (c.nan_tok[t]) {
                st->bad_nan += !isnan(v) || !isnan(yr[t * c.ldy + r]);
                continue;
            }
            double mag, e = exact(&c, r, t, &mag), ref = yr[t * c.ldy + r];
            double tol = 1e-6 * mag + 1e-30;
            double e1 = fabs(ref - e) / tol, e2 = fabs((double)v - ref) / tol;
            st->worst_exact = e1 <= st->worst_exact ? st->worst_exact : isnan(e1) ? INFINITY : e1;
            st->worst_twin = e2 <= st->worst_twin ? st->worst_twin : isnan(e2) ? INFINITY : e2;
        }
    }
    check_independence(&c, fn, y, st);
    st->cases++;
    free(y);
    free(yr);
    case_free(&c);
}

static void test_table(const wpi_tiles_x8 *k)
{
    /* 4096 + 64: more blocks than a table may take in one pass (AMX packs 64 at a time) */
    static const size_t colss[] = {32, 64, 96, 160, 1024 + 32, 4096 + 64};
    static const size_t ntoks[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
                                   17, 31, 64};
    for (size_t di = 0; di < sizeof DTYPES / sizeof DTYPES[0]; di++) {
        int dt = DTYPES[di];
        tile_stats st = {0};
        for (size_t ci = 0; ci < sizeof colss / sizeof colss[0]; ci++)
            for (size_t ti = 0; ti < sizeof ntoks / sizeof ntoks[0]; ti++) {
                if ((colss[ci] > 160 && ntoks[ti] > 17) ||
                    (colss[ci] > 1024 + 32 && ntoks[ti] % 4 != 1))
                    continue; /* the widest rows at fewer token counts: time */
                size_t rows = 1 + rng % 19;
                tile_case_run(k, dt, rows, colss[ci], ntoks[ti], &st);
            }
        int ok = st.worst_twin <= 1.0 && st.worst_exact <= 1.0 && !st.bad_nan &&
                 !st.bad_alone && !st.bad_mixed && !st.bad_untouched;
        CHECK(ok, "%s x8 tile %s: worst twin err/tol %.3f, twin vs exact %.3f, NaN %d, "
              "differing from the token alone %d, among others %d, untouched %d", k->name,
              wpi_dtype_name(dt), st.worst_twin, st.worst_exact, st.bad_nan, st.bad_alone,
              st.bad_mixed, st.bad_untouched);
        printf("%s %-10s x8 tile %-5s: %d shapes, worst twin err/tol %.3f, twin vs exact "
               "%.3f\n", ok ? "PASS" : "FAIL", k->name, wpi_dtype_name(dt), st.cases,
               st.worst_twin, st.worst_exact);
    }
}

#if defined(__aarch64__)
/* The two NEON tables form the same exact integers (SDOT, or SMULL/SMLAL + SADALP) and
 * then the same float operations, so their outputs must be equal bit for bit. */
static void test_neon_same_bits(void)
{
    static const size_t colss[] = {32, 96, 1024 + 32};
    static const size_t ntoks[] = {1, 2, 3, 4, 5, 9};
    int bad = 0, cases = 0;
    for (size_t di = 0; di < sizeof DTYPES / sizeof DTYPES[0]; di++)
        for (size_t ci = 0; ci < sizeof colss / sizeof colss[0]; ci++)
            for (size_t ti = 0; ti < sizeof ntoks / sizeof ntoks[0]; ti++) {
                tile_case c;
                int k = (int)di; /* DTYPES is in slot order */
                case_make(&c, DTYPES[di], 1 + rng % 19, colss[ci], ntoks[ti]);
                float *a = run(&c, wpi_x8t_neon.tile[k]), *b = run(&c, wpi_x8t_neondot.tile[k]);
                for (size_t i = 0; i < c.n_tok * c.ldy; i++)
                    bad += !same_bits(a[i], b[i]);
                cases++;
                free(a);
                free(b);
                case_free(&c);
            }
    CHECK(bad == 0, "neon-dotprod vs neon x8 tiles: %d outputs differ", bad);
    printf("%s neon-dotprod vs neon x8 tiles: %d shapes, %d outputs differing in a bit\n",
           bad ? "FAIL" : "PASS", cases, bad);
}
#endif

int main(void)
{
    test_table(&wpi_x8t_ref);
#if defined(__x86_64__) || defined(__aarch64__)
    x8_isas isa = x8_isas_detect();
#if defined(__x86_64__)
    const wpi_tiles_x8 *tables[X8_ISAS] = {&wpi_x8t_avx2, &wpi_x8t_avxvnni, &wpi_x8t_avx512bw,
                                           &wpi_x8t_avx512vnni, &wpi_x8t_amx};
#else
    const wpi_tiles_x8 *tables[X8_ISAS] = {&wpi_x8t_neon, &wpi_x8t_neondot};
#endif
    for (int i = 0; i < X8_ISAS; i++) {
        if (isa.runs[i])
            test_table(tables[i]);
        else
            printf("SKIP %s x8 tile kernels: this CPU lacks %s [not provided by CI]\n",
                   tables[i]->name, x8_isa_needs[i]);
    }
#endif
#if defined(__aarch64__)
    if (isa.runs[1])
        test_neon_same_bits();
    else
        printf("SKIP neon-dotprod vs neon x8 tiles bit for bit: this CPU lacks %s "
               "[not provided by CI]\n", x8_isa_needs[1]);
    CHECK(isa.expect < 0 || isa.dotprod == isa.expect,
          "dot-product detection %d, WP_TEST_EXPECT_DOTPROD %d", isa.dotprod, isa.expect);
#endif
    printf("kernels x8 tile: %d failed\n", failures);
    return failures ? 1 : 0;
}

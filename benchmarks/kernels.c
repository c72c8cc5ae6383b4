/*
 * kernels.c -- single-thread throughput of the matmul kernels, per dtype and ISA set.
 *
 * Reports GB/s of weight bytes (the bytes a decode step must stream) and the speedup
 * over the scalar reference, for shapes [2048 x 2048] and [576 x 1536] at n_tok = 1
 * (decode) and 16 (prefill). Not part of any test run. Build and run by hand:
 *
 *   gcc -std=c11 -D_GNU_SOURCE -O2 -Iengine/include -Iengine/src benchmarks/kernels.c \
 *       $(ls engine/src/kernels/[a-z]*.c) engine/src/platform.c -lm -o bench_kernels
 *   ./bench_kernels [seconds_per_case] [--cpu] [--dtype NAME]...
 *
 * (platform.c holds the OS's permission for AMX tiles, which dispatch.c asks for.)
 *
 * --dtype keeps only the named dtypes (repeatable), e.g. --dtype q4_0 --dtype mxfp4.
 * --x8 times the 8-bit-activation path instead (quantized dtypes only; each call
 * quantizes the n_tok activations first, as wpi_matmul does, and that time counts).
 *
 * --ntok times the best set this CPU runs (or --isa NAME) on [2048 x 2048] (or --shape
 * ROWSxCOLS, cols a multiple of 32 up to 2048) at n_tok = 1,
 * 2, 3, 4, 5, 8, 9, 12, 16, 32, 64 and prints, per dtype, GB/s of weights at one token
 * and the cost of n tokens in single-token calls (time(n) / time(1)): what one batched
 * decode step of n sequences, or a prefill chunk, costs against one decode step. The token counts
 * are timed interleaved, a slice of each in every one of 20 rounds, so that a change of
 * machine load shifts all of them alike.
 *
 * --quant times the activation quantizer of the 8-bit path (wpi_quant_x8) alone, each
 * version this CPU runs, on one row of 2048 and of 768 floats, the versions interleaved
 * in each of 20 rounds.
 *
 * Each figure is the fastest of 20 timed slices, so a shared or busy machine
 * understates the speed less than a mean would. --cpu times with this thread's CPU
 * clock instead of the wall clock: on an oversubscribed machine that leaves out the
 * time the thread waited for a core (but not the cache and core sharing).
 */
#if !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* clock_gettime, CLOCK_THREAD_CPUTIME_ID */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wp.h"
#include "kernels/kernels.h"

static clockid_t clock_id = CLOCK_MONOTONIC;

static double now(void)
{
    struct timespec ts;
    clock_gettime(clock_id, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void print_machine(void)
{
    char line[256], model[256] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *p = strchr(line, ':');
            if (p) {
                snprintf(model, sizeof model, "%s", p + 2);
                model[strcspn(model, "\n")] = 0;
            }
            break;
        }
    }
    if (f)
        fclose(f);
    printf("cpu: %s\ncompiler: %s, single thread\n", model,
#ifdef __VERSION__
           __VERSION__
#else
           "unknown"
#endif
    );
}

static wpi_matmul_x8_fn x8_fn; /* --x8: the call timed is quantize + this */
static wpi_xq x8_buf[64 * 2048 / 32];

static void call(wpi_matmul_fn fn, const void *w, size_t rows, size_t cols, const float *x,
                 size_t n_tok, float *y)
{
    if (!x8_fn) {
        fn(w, cols, 0, rows, x, cols, n_tok, y, rows);
        return;
    }
    for (size_t t = 0; t < n_tok; t++)
        wpi_quant_x8(x + t * cols, cols, x8_buf + t * (cols / 32));
    x8_fn(w, cols, 0, rows, x8_buf, cols / 32, n_tok, y, rows);
}

/* Seconds per call over one slice of about `slice` seconds (at least one call). */
static double time_slice(wpi_matmul_fn fn, const void *w, size_t rows, size_t cols,
                         const float *x, size_t n_tok, float *y, double slice)
{
    int reps = 0;
    double t0 = now(), t;
    call(fn, w, rows, cols, x, n_tok, y); /* warm the caches */
    t0 = now();
    do {
        call(fn, w, rows, cols, x, n_tok, y);
        reps++;
        t = now() - t0;
    } while (t < slice);
    return t / reps;
}

/* Seconds per call: the best of 20 slices, each repeating the call for budget/20 s. */
static double time_call(wpi_matmul_fn fn, const void *w, size_t rows, size_t cols,
                        const float *x, size_t n_tok, float *y, double budget)
{
    double best = 1e30;
    call(fn, w, rows, cols, x, n_tok, y); /* warm the caches */
    for (int run = 0; run < 20; run++) {
        int reps = 0;
        double t0 = now(), t;
        do {
            call(fn, w, rows, cols, x, n_tok, y);
            reps++;
            t = now() - t0;
        } while (t < budget / 20);
        if (t / reps < best)
            best = t / reps;
    }
    return best;
}

static const int DTYPES[] = {WPI_F32, WPI_F16, WPI_BF16, WPI_Q8_0, WPI_Q4_0, WPI_Q4_1,
                             WPI_MXFP4};
#define N_DTYPES (sizeof DTYPES / sizeof DTYPES[0])

static int dtype_wanted(int dt, const char *const *only, int n_only)
{
    int wanted = n_only == 0;
    for (int k = 0; k < n_only; k++)
        wanted |= strcmp(only[k], wpi_dtype_name(dt)) == 0;
    return wanted;
}

/* A rows x cols matrix of dtype with deterministic weights in [-1, 1]. */
static unsigned char *make_weights(int dt, size_t rows, size_t cols)
{
    size_t rb = wpi_row_bytes(dt, cols);
    unsigned char *w = malloc(rows * rb);
    float *src = malloc(cols * sizeof(float));
    for (size_t r = 0; r < rows; r++) {
        for (size_t c = 0; c < cols; c++)
            src[c] = (float)(((r * 31 + c) * 2654435761u) % 2001) / 1000.0f - 1.0f;
        wpi_quant_row(dt, src, w + r * rb, cols);
    }
    free(src);
    return w;
}

/* --ntok: the cost of n tokens in single-token calls, one set, [2048 x 2048]. */
static int run_ntok(const wpi_kernels *k, int x8, const char *const *only, int n_only,
                    size_t rows, size_t cols, double budget)
{
    static const size_t ntoks[] = {1, 2, 3, 4, 5, 8, 9, 12, 16, 32, 64};
    size_t nt_max = 64;
    float *x = malloc(nt_max * cols * sizeof(float));
    float *y = malloc(nt_max * rows * sizeof(float));
    for (size_t i = 0; i < nt_max * cols; i++)
        x[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    printf("kernel set: %s%s, shape %zux%zu\n", x8 ? k->x8_name : k->name,
           x8 ? " (8-bit activations)" : "", rows, cols);
    printf("cost of n tokens in single-token calls (time(n) / time(1))\n\n");
    printf("%-5s %10s %10s", "dtype", "GB/s n=1", "us n=1");
    for (size_t i = 1; i < sizeof ntoks / sizeof ntoks[0]; i++)
        printf("  n=%-4zu", ntoks[i]);
    printf("\n");
    for (size_t di = 0; di < N_DTYPES; di++) {
        int dt = DTYPES[di];
        if (!dtype_wanted(dt, only, n_only) || (x8 && !wpi_kernels_matmul_x8(k, dt)))
            continue;
        unsigned char *w = make_weights(dt, rows, cols);
        x8_fn = x8 ? wpi_kernels_matmul_x8(k, dt) : NULL;
        wpi_matmul_fn fn = wpi_kernels_matmul(k, dt);
        double tb[sizeof ntoks / sizeof ntoks[0]];
        for (size_t i = 0; i < sizeof ntoks / sizeof ntoks[0]; i++)
            tb[i] = 1e30;
        /* interleaved: every token count is timed in each of 20 rounds, so all of them
         * see the same machine load; each keeps its fastest slice */
        for (int round = 0; round < 20; round++)
            for (size_t i = 0; i < sizeof ntoks / sizeof ntoks[0]; i++) {
                double t = time_slice(fn, w, rows, cols, x, ntoks[i], y, budget / 20);
                tb[i] = t < tb[i] ? t : tb[i];
            }
        printf("%-5s %10.2f %10.1f", wpi_dtype_name(dt),
               (double)(rows * wpi_row_bytes(dt, cols)) / tb[0] / 1e9, tb[0] * 1e6);
        for (size_t i = 1; i < sizeof ntoks / sizeof ntoks[0]; i++)
            printf("  %6.2f", tb[i] / tb[0]);
        printf("\n");
        free(w);
    }
    free(x);
    free(y);
    return 0;
}

typedef void (*quant_fn)(const float *x, size_t cols, wpi_xq *out);

/* --quant: ns per call of each quantizer version on one row. */
static int run_quant(double budget)
{
    const char *names[2] = {"scalar", "avx2"};
    quant_fn fns[2] = {wpi_quant_x8_ref, NULL};
#if defined(__x86_64__)
    if (wp_isa_supported() & (1u << WP_ISA_AVX2))
        fns[1] = wpi_quant_x8_avx2;
#endif
    static const size_t colss[] = {2048, 768};
    static float x[2048];
    for (size_t i = 0; i < 2048; i++)
        x[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
    printf("activation quantizer, ns per row (best of 20 slices, versions interleaved)\n");
    for (size_t ci = 0; ci < 2; ci++) {
        double best[2] = {1e30, 1e30};
        for (int round = 0; round < 20; round++)
            for (int i = 0; i < 2; i++) {
                if (!fns[i])
                    continue;
                int reps = 0;
                double t0 = now(), t;
                do {
                    fns[i](x, colss[ci], x8_buf);
                    reps++;
                    t = now() - t0;
                } while (t < budget / 60);
                best[i] = t / reps < best[i] ? t / reps : best[i];
            }
        printf("cols %4zu:", colss[ci]);
        for (int i = 0; i < 2; i++)
            if (fns[i])
                printf("  %s %8.1f (x%4.1f)", names[i], best[i] * 1e9, best[0] / best[i]);
        printf("\n");
    }
    return 0;
}

int main(int argc, char **argv)
{
    double budget = 0.5;
    const char *only[8];
    const char *isa_name = NULL;
    int n_only = 0, x8 = 0, ntok = 0, quant = 0;
    size_t rows = 2048, cols = 2048;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--cpu") == 0)
            clock_id = CLOCK_THREAD_CPUTIME_ID;
        else if (strcmp(argv[i], "--x8") == 0)
            x8 = 1;
        else if (strcmp(argv[i], "--ntok") == 0)
            ntok = 1;
        else if (strcmp(argv[i], "--shape") == 0 && i + 1 < argc &&
                 sscanf(argv[i + 1], "%zux%zu", &rows, &cols) == 2 && rows > 0 &&
                 cols % 32 == 0 && cols > 0 && cols <= 2048)
            i++;
        else if (strcmp(argv[i], "--quant") == 0)
            quant = 1;
        else if (strcmp(argv[i], "--isa") == 0 && i + 1 < argc)
            isa_name = argv[++i];
        else if (strcmp(argv[i], "--dtype") == 0 && i + 1 < argc && n_only < 8)
            only[n_only++] = argv[++i];
        else
            budget = atof(argv[i]);
    }
    if (quant) {
        print_machine();
        printf("clock: %s\n", clock_id == CLOCK_MONOTONIC ? "wall" : "thread CPU time");
        return run_quant(budget);
    }
    if (ntok) {
        const wpi_kernels *k = wpi_kernels_get(WP_ISA_AUTO);
        for (int isa = WP_ISA_SCALAR; isa_name && isa <= WP_ISA_NEON; isa++)
            if (wpi_kernels_get(isa) && strcmp(wpi_kernels_get(isa)->name, isa_name) == 0)
                k = wpi_kernels_get(isa);
        print_machine();
        printf("clock: %s\n", clock_id == CLOCK_MONOTONIC ? "wall" : "thread CPU time");
        return run_ntok(k, x8, only, n_only, rows, cols, budget);
    }
    static const size_t shapes[][2] = {{2048, 2048}, {576, 1536}};
    static const size_t ntoks[] = {1, 16};
    const wpi_kernels *sets[3];
    int n_sets = 0;
    for (int isa = WP_ISA_SCALAR; isa <= WP_ISA_AVX512; isa++)
        if (wpi_kernels_get(isa))
            sets[n_sets++] = wpi_kernels_get(isa);

    print_machine();
    printf("kernel sets:");
    for (int i = 0; i < n_sets; i++)
        printf(" %s", sets[i]->name);
    printf("\nclock: %s\nGB/s of weight bytes (x speedup over scalar)\n\n",
           clock_id == CLOCK_MONOTONIC ? "wall" : "thread CPU time");
    printf("%-12s %-5s %5s", "shape", "dtype", "n_tok");
    for (int i = 0; i < n_sets; i++)
        printf(" %18s", x8 ? sets[i]->x8_name : sets[i]->name);
    printf("\n");

    for (size_t si = 0; si < 2; si++) {
        size_t rows = shapes[si][0], cols = shapes[si][1];
        float *x = malloc(16 * cols * sizeof(float));
        float *y = malloc(16 * rows * sizeof(float));
        for (size_t i = 0; i < 16 * cols; i++)
            x[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
        for (size_t di = 0; di < N_DTYPES; di++) {
            int dt = DTYPES[di];
            if (!dtype_wanted(dt, only, n_only) || (x8 && !wpi_kernels_matmul_x8(sets[0], dt)))
                continue;
            size_t rb = wpi_row_bytes(dt, cols);
            unsigned char *w = make_weights(dt, rows, cols);
            for (size_t ti = 0; ti < 2; ti++) {
                char shape[32];
                snprintf(shape, sizeof shape, "%zux%zu", rows, cols);
                printf("%-12s %-5s %5zu", shape, wpi_dtype_name(dt), ntoks[ti]);
                double base = 0.0;
                for (int i = 0; i < n_sets; i++) {
                    x8_fn = x8 ? wpi_kernels_matmul_x8(sets[i], dt) : NULL;
                    double s = time_call(wpi_kernels_matmul(sets[i], dt), w, rows, cols, x,
                                         ntoks[ti], y, budget);
                    double gbs = (double)(rows * rb) / s / 1e9;
                    if (i == 0)
                        base = s;
                    printf(" %9.2f (x%5.1f)", gbs, base / s);
                    fflush(stdout);
                }
                printf("\n");
            }
            free(w);
        }
        free(x);
        free(y);
    }
    return 0;
}

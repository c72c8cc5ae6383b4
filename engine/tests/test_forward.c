/*
 * test_forward.c -- forward-pass pieces without a model: the pool (row-parallel matmul
 * and SwiGLU are byte-identical at 1, 2 and 4 threads; dispatch cost), RoPE on known
 * values (full and partial, attention factor), router top-k order and ties.
 * Logits against PyTorch are checked by tests/differential on converted tiny models.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "arch.h"

/* Matmul and SwiGLU outputs at 1, 2 and 4 threads are byte-identical, per dtype. */
static void test_pool_determinism(void)
{
    enum { ROWS = 301, COLS = 256, NTOK = 5, INTER = 200 };
    const int dtypes[] = {WPI_F32, WPI_F16, WPI_BF16, WPI_Q8_0, WPI_Q4_0, WPI_Q4_1};
    float *wf = malloc(sizeof(float) * ROWS * COLS);
    float *x = malloc(sizeof(float) * NTOK * COLS);
    for (size_t i = 0; i < (size_t)ROWS * COLS; i++) wf[i] = frand();
    for (size_t i = 0; i < (size_t)NTOK * COLS; i++) x[i] = frand();
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
        int dt = dtypes[d];
        size_t rb = wpi_row_bytes(dt, COLS);
        char *w = malloc(rb * ROWS);
        for (size_t r = 0; r < ROWS; r++) wpi_quant_row(dt, wf + r * COLS, w + r * rb, COLS);
        /* SwiGLU weights: gate/up [INTER, COLS], down [COLS, INTER] reuse wf's values. */
        size_t rbi = wpi_row_bytes(dt, INTER);
        char *wd = malloc(rbi * COLS);
        for (size_t r = 0; r < COLS; r++) wpi_quant_row(dt, wf + r * INTER, wd + r * rbi, INTER);
        wpi_wmat W = {w, dt, ROWS, COLS};
        wpi_wmat G = {w, dt, INTER, COLS}, U = {w + rb * 7, dt, INTER, COLS};
        wpi_wmat D = {wd, dt, COLS, INTER};
        float *ref = NULL, *ref_s = NULL;
        const uint32_t threads[] = {1, 2, 4};
        for (int ti = 0; ti < 3; ti++) {
            wpi_model m;
            memset(&m, 0, sizeof m);
            m.k = wpi_kernels_get(WP_ISA_AUTO);
            CHECK(wpi_pool_open(threads[ti], &m.pool) == WP_OK, "pool open");
            float *y = calloc((size_t)NTOK * ROWS, sizeof(float));
            float *ys = calloc((size_t)NTOK * COLS, sizeof(float));
            m.ff_g = calloc((size_t)NTOK * INTER, sizeof(float));
            m.ff_u = calloc((size_t)NTOK * INTER, sizeof(float));
            wpi_mm job = {&W, y, ROWS};
            wpi_matmul(&m, &job, 1, x, COLS, NTOK);
            wpi_swiglu(&m, &G, &U, &D, x, COLS, NTOK, ys, COLS);
            if (!ref) {
                ref = y;
                ref_s = ys;
            } else {
                CHECK(memcmp(ref, y, sizeof(float) * NTOK * ROWS) == 0,
                      "%s matmul differs at %u threads", wpi_dtype_name(dt), threads[ti]);
                CHECK(memcmp(ref_s, ys, sizeof(float) * NTOK * COLS) == 0,
                      "%s swiglu differs at %u threads", wpi_dtype_name(dt), threads[ti]);
                free(y);
                free(ys);
            }
            free(m.ff_g);
            free(m.ff_u);
            wpi_pool_close(m.pool);
        }
        /* Spot-check the matmul against a plain dot product of the dequantized rows. */
        float row[COLS];
        for (size_t r = 0; r < ROWS; r += 37) {
            wpi_dequant_row(dt, w + r * rb, row, COLS);
            double s = 0, a = 0;
            for (size_t i = 0; i < COLS; i++) {
                s += (double)row[i] * x[2 * COLS + i];
                a += fabs((double)row[i] * x[2 * COLS + i]);
            }
            CHECK(fabs(ref[2 * ROWS + r] - s) <= 1e-4 * a + 1e-5, "%s row %zu: %g vs %g",
                  wpi_dtype_name(dt), r, ref[2 * ROWS + r], s);
        }
        free(ref);
        free(ref_s);
        free(w);
        free(wd);
    }
    free(wf);
    free(x);
}

static void count_task(void *arg, uint32_t i)
{
    __atomic_fetch_add((uint32_t *)arg + i, 1, __ATOMIC_RELAXED);
}

static uint32_t barrier_arrived;

static void barrier_task(void *arg, uint32_t i)
{
    uint32_t n = *(const uint32_t *)arg;
    __atomic_fetch_add(&barrier_arrived, 1, __ATOMIC_ACQ_REL);
    for (long k = 0; __atomic_load_n(&barrier_arrived, __ATOMIC_ACQUIRE) < n && k < 100000000; k++) {
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
    }
}

/* Every task runs exactly once, and the cost of one dispatch. Task counts grow by one per
 * call so that a straggler claiming past the end of its job (a task of the next, larger
 * job) shows up as a task run twice; random pauses let workers fall asleep and wake. */
static void test_pool_dispatch(void)
{
    wpi_pool *p;
    uint32_t nt = wpi_physical_cores();
    CHECK(nt >= 1, "physical cores");
    CHECK(wpi_pool_open(4, &p) == WP_OK, "pool open");
    uint32_t counts[64];
    for (int rep = 0; rep < 30000 && !failures; rep++) {
        uint32_t n = 1 + (uint32_t)rep % 64;
        memset(counts, 0, sizeof counts);
        wpi_parallel_for(p, n, count_task, counts);
        for (uint32_t i = 0; i < n; i++) CHECK(counts[i] == 1, "task %u of %u ran %u times", i, n, counts[i]);
        if (frand() > 0.9f) {
            double w0 = wpi_now(), d = (frand() + 1) * 200e-6;
            while (wpi_now() - w0 < d) {
            }
        }
    }
    wpi_pool_close(p);
    CHECK(wpi_pool_open(0, &p) == WP_OK, "pool open");
    nt = wpi_pool_threads(p);
    /* Each task waits until every thread has arrived, so every dispatch really wakes and
     * joins all workers: the time is the pool's fork-join latency. */
    int iters = 0;
    double t0 = wpi_now();
    for (; iters < 20000 && wpi_now() - t0 < 0.5; iters++) {
        barrier_arrived = 0;
        wpi_parallel_for(p, nt, barrier_task, &nt);
    }
    double hot = (wpi_now() - t0) / iters;
    /* After a pause the workers sleep: the cost of waking them. */
    double cold = 0;
    for (int i = 0; i < 20; i++) {
        double w0 = wpi_now();
        while (wpi_now() - w0 < 2e-3) {
        }
        barrier_arrived = 0;
        t0 = wpi_now();
        wpi_parallel_for(p, nt, barrier_task, &nt);
        cold += wpi_now() - t0;
    }
    printf("   pool: %u threads, fork-join %.2f us hot (%d calls), %.1f us after sleep "
           "(timing only; meaningless on a loaded machine)\n", nt, hot * 1e6, iters, cold / 20 * 1e6);
    wpi_pool_close(p);
}

static void test_rope(void)
{
    /* head_dim 6, rope_dim 4: pairs (0,2) and (1,3) rotate, dims 4 and 5 pass through. */
    wpi_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.rope_dim = 4;
    hp.rope_attn_factor = 1.5f;
    float freqs[2] = {1.0f, 0.01f};
    float cosb[2 * 2], sinb[2 * 2];
    wpi_model m;
    memset(&m, 0, sizeof m);
    m.hp = &hp;
    m.rope_freqs = freqs;
    m.rope_cos = cosb;
    m.rope_sin = sinb;
    wpi_rope_prepare(&m, 2, 7); /* positions 7 and 8 */
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 2; i++) {
            double a = (7 + t) * (double)freqs[i];
            CHECK(fabs(cosb[t * 2 + i] - 1.5 * cos(a)) < 1e-6, "cos t%d i%d", t, i);
            CHECK(fabs(sinb[t * 2 + i] - 1.5 * sin(a)) < 1e-6, "sin t%d i%d", t, i);
        }
    float v[12] = {1, 2, 3, 4, 5, 6, -1, 0.5f, 2, -3, 7, 8};
    float in[12];
    memcpy(in, v, sizeof v);
    wpi_rope_apply(v, 2, 6, 4, cosb + 2, sinb + 2); /* position 8 */
    for (int h = 0; h < 2; h++) {
        const float *x = in + 6 * h, *y = v + 6 * h;
        for (int i = 0; i < 2; i++) {
            double c = 1.5 * cos(8 * (double)freqs[i]), s = 1.5 * sin(8 * (double)freqs[i]);
            CHECK(fabs(y[i] - (x[i] * c - x[i + 2] * s)) < 1e-5, "rope h%d i%d", h, i);
            CHECK(fabs(y[i + 2] - (x[i + 2] * c + x[i] * s)) < 1e-5, "rope h%d i%d+2", h, i);
        }
        CHECK(y[4] == x[4] && y[5] == x[5], "partial rope touched pass-through dims");
    }
}

static void test_topk(void)
{
    const float p[6] = {0.1f, 0.3f, 0.3f, 0.05f, 0.3f, 0.2f};
    int32_t ids[5];
    float w[5];
    wpi_topk(p, 6, 2, ids, w);
    CHECK(ids[0] == 1 && ids[1] == 2, "ties -> lower id: got %d %d", ids[0], ids[1]);
    wpi_topk(p, 6, 4, ids, w);
    CHECK(ids[0] == 1 && ids[1] == 2 && ids[2] == 4 && ids[3] == 5,
          "order: got %d %d %d %d", ids[0], ids[1], ids[2], ids[3]);
    CHECK(w[0] == 0.3f && w[3] == 0.2f, "weights");
    const float q[5] = {0.5f, 0.1f, 0.9f, 0.7f, 0.0f};
    wpi_topk(q, 5, 5, ids, w);
    CHECK(ids[0] == 2 && ids[1] == 3 && ids[2] == 0 && ids[3] == 1 && ids[4] == 4,
          "full sort: got %d %d %d %d %d", ids[0], ids[1], ids[2], ids[3], ids[4]);
    const float z[3] = {0, 0, 0};
    wpi_topk(z, 3, 3, ids, w);
    CHECK(ids[0] == 0 && ids[1] == 1 && ids[2] == 2, "all equal");
}

static void test_sizes(void)
{
    wpi_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.n_layers = 2;
    hp.n_kv_heads = 2;
    hp.head_dim = 16;
    hp.hidden_size = 64;
    hp.n_heads = 4;
    hp.n_experts = 8;
    hp.top_k = 2;
    hp.rope_dim = 16;
    hp.moe_intermediate_size = 32;
    CHECK(wpi_kv_bytes(&hp, 100) == 2ull * 2 * 100 * 32 * 4, "kv bytes");
    uint64_t s1 = wpi_scratch_bytes(&hp, 1, 100), s64 = wpi_scratch_bytes(&hp, 64, 100);
    CHECK(s1 > 0 && s64 > s1, "scratch grows with the chunk (%llu, %llu)",
          (unsigned long long)s1, (unsigned long long)s64);
    CHECK(wpi_arch_find("qwen3_moe") != NULL && wpi_arch_find("nope") == NULL, "registry");
    CHECK(strstr(wpi_arch_names(), "llama") && strstr(wpi_arch_names(), "olmoe"), "names");
}

int main(void)
{
    test_pool_determinism();
    test_pool_dispatch();
    test_rope();
    test_topk();
    test_sizes();
    printf("%s test_forward (%d failures)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}

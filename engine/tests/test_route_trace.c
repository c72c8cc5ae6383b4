/* test_route_trace.c -- routing-trace files (route_trace.c): a valid trace reads back id for
 * id with wrap-around over tokens and MoE layers; a trace of another top_k or expert count
 * is refused naming both; damaged files (every truncation, random byte changes) are
 * refused or read back in range, never crash and leak nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "route_trace.h"
#include "tiny_container.h"

static uint32_t lcg = 777;
static uint32_t next_rand(void)
{
    lcg = lcg * 1664525u + 1013904223u;
    return lcg >> 8;
}

/* A trace file image: header + ids, id (tok, layer, j) = (tok * 3 + layer * 5 + j) % experts. */
static size_t trace_image(uint8_t *buf, uint32_t toks, uint32_t layers, uint32_t k, uint32_t e)
{
    memcpy(buf, WPI_TRACE_MAGIC, 4);
    put32(buf + 4, 1);
    put32(buf + 8, toks);
    put32(buf + 12, layers);
    put32(buf + 16, k);
    put32(buf + 20, e);
    size_t off = WPI_TRACE_HEADER_BYTES;
    for (uint32_t t = 0; t < toks; t++)
        for (uint32_t l = 0; l < layers; l++)
            for (uint32_t j = 0; j < k; j++, off += 2) {
                uint32_t id = (t * 3 + l * 5 + j) % e;
                buf[off] = (uint8_t)id;
                buf[off + 1] = (uint8_t)(id >> 8);
            }
    return off;
}

static void write_bytes(const char *path, const uint8_t *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) {
        perror(path);
        exit(2);
    }
    fclose(f);
}

static wp_status load(const char *path, const wpi_container *c, wpi_mem *mem,
                      wpi_route_trace **t, char *err)
{
    return wpi_route_trace_load(path, c, mem, t, err, WPI_ERR_CAP);
}

static void test_valid(const wpi_container *c, const char *path)
{
    uint8_t buf[4096];
    /* "dmm": model layers 1 and 2 are MoE layers 0 and 1; a one-layer trace wraps. */
    for (uint32_t layers = 1; layers <= 3; layers++) {
        write_bytes(path, buf, trace_image(buf, 5, layers, 2, 8));
        wpi_mem mem = {0};
        wpi_route_trace *t = NULL;
        char err[WPI_ERR_CAP];
        wp_status st = load(path, c, &mem, &t, err);
        report(st == WP_OK, "%u-layer trace loads (%s)", layers, st == WP_OK ? "ok" : err);
        if (st != WP_OK) continue;
        wpi_model m;
        memset(&m, 0, sizeof m);
        m.trace = t;
        int ok = 1;
        for (m.trace_cursor = 0; m.trace_cursor < 12; m.trace_cursor++)
            for (uint32_t l = 1; l <= 2; l++)
                for (uint32_t tok = 0; tok < 3; tok++) {
                    int32_t ids[2];
                    wpi_route_trace_ids(&m, l, tok, ids);
                    uint32_t tt = (uint32_t)(m.trace_cursor + tok) % 5, ml = (l - 1) % layers;
                    for (uint32_t j = 0; j < 2; j++)
                        ok &= ids[j] == (int32_t)((tt * 3 + ml * 5 + j) % 8);
                }
        report(ok, "%u-layer trace: ids wrap over tokens and MoE layers", layers);
        wpi_route_trace_free(t, &mem);
        report(mem.current == 0, "%u-layer trace: freed all %llu bytes", layers,
               (unsigned long long)mem.peak);
    }
}

static void test_mismatch(const wpi_container *c, const char *path)
{
    uint8_t buf[4096];
    const uint32_t shapes[2][2] = {{3, 8}, {2, 16}};
    for (int s = 0; s < 2; s++) {
        write_bytes(path, buf, trace_image(buf, 4, 2, shapes[s][0], shapes[s][1]));
        wpi_mem mem = {0};
        wpi_route_trace *t = NULL;
        char err[WPI_ERR_CAP], want[64];
        wp_status st = load(path, c, &mem, &t, err);
        snprintf(want, sizeof want, "top_k %u of %u experts; the model has top_k 2 of 8",
                 shapes[s][0], shapes[s][1]);
        report(st == WP_E_ARG && t == NULL && strstr(err, want) && mem.current == 0,
               "top_k %u of %u refused with WP_E_ARG naming both (%s)", shapes[s][0],
               shapes[s][1], err);
    }
}

static void test_damage(const wpi_container *c, const char *path)
{
    uint8_t good[4096], buf[4096];
    const size_t n = trace_image(good, 6, 2, 2, 8);
    int cases = 0, refused = 0, bad = 0;
    for (size_t cut = 0; cut < n; cut++) { /* every truncation */
        write_bytes(path, good, cut);
        wpi_mem mem = {0};
        wpi_route_trace *t = NULL;
        char err[WPI_ERR_CAP];
        wp_status st = load(path, c, &mem, &t, err);
        cases++;
        refused += st != WP_OK;
        bad += st == WP_OK || t != NULL || mem.current != 0 || !err[0];
    }
    for (int r = 0; r < 3000; r++) { /* random byte changes */
        memcpy(buf, good, n);
        int flips = 1 + (int)(next_rand() % 3);
        for (int f = 0; f < flips; f++) buf[next_rand() % n] = (uint8_t)next_rand();
        size_t len = next_rand() % 8 == 0 ? n + next_rand() % 5 : n;
        write_bytes(path, buf, len);
        wpi_mem mem = {0};
        wpi_route_trace *t = NULL;
        char err[WPI_ERR_CAP];
        err[0] = '\0';
        wp_status st = load(path, c, &mem, &t, err);
        cases++;
        if (st != WP_OK) {
            refused++;
            bad += t != NULL || mem.current != 0 || !err[0];
            continue;
        }
        wpi_model m;
        memset(&m, 0, sizeof m);
        m.trace = t;
        for (uint32_t tok = 0; tok < 6; tok++)
            for (uint32_t l = 1; l <= 2; l++) {
                int32_t ids[2];
                wpi_route_trace_ids(&m, l, tok, ids);
                bad += ids[0] < 0 || ids[0] >= 8 || ids[1] < 0 || ids[1] >= 8;
            }
        wpi_route_trace_free(t, &mem);
        bad += mem.current != 0;
    }
    report(bad == 0 && refused > (int)n, "damaged traces: %d cases, %d refused, %d wrong", cases,
           refused, bad);
    wpi_mem mem = {0};
    wpi_route_trace *t = NULL;
    char err[WPI_ERR_CAP];
    wp_status st = load("/nonexistent-dir/trace.bin", c, &mem, &t, err);
    report(st == WP_E_IO && t == NULL && mem.current == 0, "missing trace: WP_E_IO (%s)", err);
}

int main(void)
{
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    tspec a = {.kinds = "dmm", .vocab = 64, .hidden = 32, .n_experts = 8, .top_k = 2,
               .moe_inter = 64, .inter = 64, .tie = 0, .edtype = WPI_Q4_0,
               .model_type = "qwen3_moe"};
    tbuilt b;
    build(&b, &a, base);
    char err[WPI_ERR_CAP], path[512];
    wpi_container *c = NULL;
    if (wpi_container_open(b.dir, &c, err, sizeof err) != WP_OK) {
        printf("FAIL container: %s\n", err);
        destroy(&b);
        return 1;
    }
    snprintf(path, sizeof path, "%s/trace.bin", b.dir);
    test_valid(c, path);
    test_mismatch(c, path);
    test_damage(c, path);
    remove(path);
    wpi_mem cm = {0};
    wpi_container_close(c, &cm);
    destroy(&b);
    printf("test_route_trace: %d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}

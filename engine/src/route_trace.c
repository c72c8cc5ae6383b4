/*
 * route_trace.c -- loading and reading a routing trace (route_trace.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "route_trace.h"

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static wp_status check_header(const unsigned char *h, long size, const wpi_container *c,
                              wpi_route_trace *t, char *err, size_t cap)
{
    if (memcmp(h, WPI_TRACE_MAGIC, 4) != 0)
        return wpi_fail(err, cap, WP_E_FORMAT, "route trace: bad magic (not a WPRT file)");
    if (le32(h + 4) != 1)
        return wpi_fail(err, cap, WP_E_FORMAT, "route trace: version %u, expected 1",
                        le32(h + 4));
    t->n_tokens = le32(h + 8);
    t->n_layers = le32(h + 12);
    t->top_k = le32(h + 16);
    t->n_experts = le32(h + 20);
    if (t->n_tokens == 0 || t->n_tokens > WPI_TRACE_MAX_TOKENS)
        return wpi_fail(err, cap, WP_E_FORMAT, "route trace: n_tokens %u outside [1, %u]",
                        t->n_tokens, WPI_TRACE_MAX_TOKENS);
    if (t->n_layers == 0 || t->n_layers > WPI_MAX_LAYERS)
        return wpi_fail(err, cap, WP_E_FORMAT, "route trace: n_layers %u outside [1, %u]",
                        t->n_layers, WPI_MAX_LAYERS);
    if (t->n_experts == 0 || t->n_experts > 65535 || t->top_k == 0 || t->top_k > t->n_experts)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "route trace: top_k %u of %u experts (need 1 <= top_k <= experts <= 65535)",
                        t->top_k, t->n_experts);
    const wpi_hparams *hp = &c->hp;
    if (t->top_k != hp->top_k || t->n_experts != hp->n_experts)
        return wpi_fail(err, cap, WP_E_ARG,
                        "route trace has top_k %u of %u experts; the model has top_k %u of %u",
                        t->top_k, t->n_experts, hp->top_k, hp->n_experts);
    uint64_t want = WPI_TRACE_HEADER_BYTES +
                    2ull * t->n_tokens * t->n_layers * t->top_k;
    if ((uint64_t)size != want)
        return wpi_fail(err, cap, WP_E_FORMAT, "route trace: %ld bytes, the header implies %llu",
                        size, (unsigned long long)want);
    return WP_OK;
}

static wp_status read_trace(FILE *f, const wpi_container *c, wpi_mem *mem,
                            wpi_route_trace *t, char *err, size_t cap)
{
    unsigned char h[WPI_TRACE_HEADER_BYTES];
    if (fseek(f, 0, SEEK_END) != 0)
        return wpi_fail(err, cap, WP_E_IO, "route trace: cannot seek");
    long size = ftell(f);
    if (size < WPI_TRACE_HEADER_BYTES || fseek(f, 0, SEEK_SET) != 0 ||
        fread(h, 1, sizeof h, f) != sizeof h)
        return wpi_fail(err, cap, WP_E_FORMAT, "route trace: shorter than its %d-byte header",
                        WPI_TRACE_HEADER_BYTES);
    TRY(check_header(h, size, c, t, err, cap));
    const size_t n = (size_t)t->n_tokens * t->n_layers * t->top_k;
    t->ids = wpi_alloc(mem, 64, n * sizeof(uint16_t));
    if (!t->ids) return wpi_fail(err, cap, WP_E_OOM, "route trace of %zu ids", n);
    unsigned char buf[4096];
    for (size_t i = 0; i < n;) {
        size_t want = (n - i) * 2 < sizeof buf ? (n - i) * 2 : sizeof buf;
        if (fread(buf, 1, want, f) != want)
            return wpi_fail(err, cap, WP_E_IO, "route trace: short read at id %zu", i);
        for (size_t b = 0; b < want; b += 2, i++) {
            uint16_t id = (uint16_t)(buf[b] | buf[b + 1] << 8);
            if (id >= t->n_experts)
                return wpi_fail(err, cap, WP_E_FORMAT,
                                "route trace: token %zu layer %zu names expert %u of %u",
                                i / ((size_t)t->n_layers * t->top_k),
                                i / t->top_k % t->n_layers, id, t->n_experts);
            t->ids[i] = id;
        }
    }
    return WP_OK;
}

wp_status wpi_route_trace_load(const char *path, const wpi_container *c, wpi_mem *mem,
                               wpi_route_trace **out, char *err, size_t cap)
{
    *out = NULL;
    wpi_route_trace *t = wpi_alloc(mem, 64, sizeof *t);
    if (!t) return wpi_fail(err, cap, WP_E_OOM, "route trace");
    FILE *f = fopen(path, "rb");
    if (!f) {
        wpi_route_trace_free(t, mem);
        return wpi_fail(err, cap, WP_E_IO, "route trace: cannot open %s", path);
    }
    wp_status st = read_trace(f, c, mem, t, err, cap);
    fclose(f);
    if (st != WP_OK) {
        wpi_route_trace_free(t, mem);
        return st;
    }
    int32_t next = 0;
    for (uint32_t l = 0; l < WPI_MAX_LAYERS; l++)
        t->moe_of_layer[l] = l < c->hp.n_layers && c->bank_of_layer[l] >= 0 ? next++ : -1;
    *out = t;
    return WP_OK;
}

void wpi_route_trace_free(wpi_route_trace *t, wpi_mem *mem)
{
    if (!t) return;
    if (t->ids) wpi_free(mem, t->ids, (size_t)t->n_tokens * t->n_layers * t->top_k * 2);
    wpi_free(mem, t, sizeof *t);
}

void wpi_route_trace_ids(const wpi_model *m, uint32_t l, uint32_t t, int32_t *ids)
{
    const wpi_route_trace *tr = m->trace;
    const int32_t moe = tr->moe_of_layer[l] < 0 ? 0 : tr->moe_of_layer[l];
    const uint64_t tok = (m->trace_rows ? m->trace_rows[t] : m->trace_cursor + t) % tr->n_tokens;
    const uint16_t *row = tr->ids + (tok * tr->n_layers + (uint32_t)moe % tr->n_layers) * tr->top_k;
    for (uint32_t j = 0; j < tr->top_k; j++) ids[j] = row[j];
}

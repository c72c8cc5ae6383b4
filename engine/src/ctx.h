/*
 * ctx.h -- the context behind wp.h (core.c), shared with state.c.
 */
#ifndef WPI_CTX_H
#define WPI_CTX_H

#include "arch.h"

/* core.c: the context, shared with state.c. */
struct wp_ctx {
    wpi_mem mem;
    wpi_container *c;
    const wpi_arch *arch;
    wp_plan plan;
    wpi_experts *experts;
    wpi_pool *pool;
    wpi_model mdl;
    void *kv;
    uint64_t kv_bytes;
    void *scratch;
    uint64_t scratch_bytes;
    uint32_t pos;                /* tokens evaluated */
    uint64_t tokens;             /* stats since the last reset */
    double eval_seconds;
    uint64_t other_bytes_base;   /* c->bytes_read at the last stats reset */
    wpi_route_trace *trace;      /* cfg.route_trace_path, or NULL */
    char err[WPI_ERR_CAP];
};

/* core.c: formats ctx's error detail and returns st. */
wp_status wpi_ctx_fail(wp_ctx *ctx, wp_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* WPI_CTX_H */

/*
 * ctx.h -- the context behind wp.h (core.c), shared with state.c.
 */
#ifndef WPI_CTX_H
#define WPI_CTX_H

#include "arch.h"

/* A sequence: its state, and its model bound to that state and the context's scratch.
 * ctx->seqs[0] is the context's own (its state is ctx->kv, its layer table in the
 * scratch); every other owns one allocation of wpi_seq_bytes: state, then layer table. */
struct wp_seq {
    wp_ctx *ctx;
    wpi_model mdl;
    void *own;                   /* NULL for sequence 0 */
    uint32_t pos;                /* tokens evaluated */
    int open;                    /* taken by wp_seq_open (sequence 0: always) */
    float *emb;                  /* queued rows for placeholder tokens [emb_cap, hidden] */
    uint32_t emb_len, emb_cap;   /* rows queued, rows allocated */
};

/* core.c: the context, shared with state.c and seq.c. */
struct wp_ctx {
    wpi_mem mem;
    wpi_container *c;
    const wpi_arch *arch;
    wp_plan plan;
    wpi_experts *experts;
    wpi_pool *pool;
    wp_seq *seqs;                /* [n_seqs]: plan.sequences */
    uint32_t n_seqs;
    wpi_model batch;             /* the scratch's model of no sequence: a batch's FFN */
    void *batch_buf;             /* per-call arrays of wp_eval_batch (seq.c), n_seqs each */
    uint64_t seq_bytes;          /* each own allocation (wpi_seq_bytes) */
    void *kv;
    uint64_t kv_bytes;
    void *scratch;
    uint64_t scratch_bytes;
    uint64_t tokens;             /* stats since the last reset */
    double eval_seconds;
    uint64_t other_bytes_base;   /* c->bytes_read at the last stats reset */
    wpi_route_trace *trace;      /* cfg.route_trace_path, or NULL */
    uint64_t *trace_rows;        /* [chunk]: a batched step's rows' trace cursors */
    int vision;                  /* the image tower's tensors are loaded (cfg.vision) */
    char err[WPI_ERR_CAP];
};

/* core.c: formats ctx's error detail and returns st. */
wp_status wpi_ctx_fail(wp_ctx *ctx, wp_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* seq.c: the embedding queue of a sequence around one evaluation of tokens[0..n): the
 * check (more placeholders than queued rows: WP_E_ARG, nothing changes), the start (the
 * model reads the queue from its first row) and, after a successful evaluation, the
 * commit (the rows taken leave the queue); wpi_embeds_clear drops it. */
wp_status wpi_embeds_check(wp_seq *s, const int32_t *tokens, uint32_t n, uint32_t which);
void wpi_embeds_start(wp_seq *s);
void wpi_embeds_commit(wp_seq *s);
void wpi_embeds_clear(wp_seq *s);

/* seq.c: bytes per sequence of the per-call arrays of wp_eval_batch (ctx->batch_buf). */
size_t wpi_batch_buf_bytes(void);
/* state.c: a sequence's state saved bytes of layer l's part v at pos and where they are. */
size_t wpi_seq_part(const wp_seq *s, uint32_t l, int v, uint32_t pos, float **at);
wp_status wpi_seq_save(wp_seq *s, const char *path);
wp_status wpi_seq_load(wp_seq *s, const char *path);

#endif /* WPI_CTX_H */

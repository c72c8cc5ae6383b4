/*
 * seq.c -- many sequences on one context: positions, reset / truncate / copy of a
 * sequence, wp_seq_open / _close, and wp_eval_batch.
 *
 * Every sequence's model is bound to the context's one scratch, so sequences evaluate
 * one at a time, except inside a batched step (forward.c wpi_model_forward_batch) where
 * each one's rows are its slice of the scratch's rows. A step holds at most
 * prefill_chunk rows: longer batches are packed greedily, in order, into several steps
 * (a sequence's tokens may span steps), so the sequences whose last token is in a step
 * are consecutive and their logits rows are written in one pass of the LM head.
 * Architectures without the mixer / ffn split evaluate the batch's sequences one after
 * another, exactly as wp_eval would.
 */
#include <stdlib.h>
#include <string.h>

#include "ctx.h"

/* The per-call arrays of wp_eval_batch, n_seqs entries each, carved from ctx->batch_buf:
 * the batch's sequences, then one step's models, tokens, counts, positions, wants, and
 * the marks (by context index) of the duplicate check. */
typedef struct tables {
    wp_seq **seq;
    wpi_model **m;
    const int32_t **tok;
    uint32_t *n, *pos;
    uint8_t *want, *mark;
} tables;

size_t wpi_batch_buf_bytes(void)
{
    return sizeof(wp_seq *) + sizeof(wpi_model *) + sizeof(int32_t *) + 2 * sizeof(uint32_t) +
           2;
}

static tables carve_tables(wp_ctx *ctx)
{
    const size_t N = ctx->n_seqs;
    char *p = ctx->batch_buf; /* pointers first, then narrower types: all aligned */
    tables t;
    t.seq = (wp_seq **)p;
    p += N * sizeof(wp_seq *);
    t.m = (wpi_model **)p;
    p += N * sizeof(wpi_model *);
    t.tok = (const int32_t **)p;
    p += N * sizeof(int32_t *);
    t.n = (uint32_t *)p;
    p += N * sizeof(uint32_t);
    t.pos = (uint32_t *)p;
    p += N * sizeof(uint32_t);
    t.want = (uint8_t *)p;
    t.mark = t.want + N;
    return t;
}

/* ---- the embedding queue ---------------------------------------------------------- */

void wpi_embeds_clear(wp_seq *s)
{
    if (s->emb) wpi_free(&s->ctx->mem, s->emb, (size_t)s->emb_cap * s->ctx->c->hp.hidden_size * sizeof(float));
    s->emb = NULL;
    s->emb_len = s->emb_cap = 0;
    s->mdl.embed_next = NULL;
}

wp_status wpi_embeds_check(wp_seq *s, const int32_t *tokens, uint32_t n, uint32_t which)
{
    const int32_t id = s->ctx->c->placeholder_id;
    if (id < 0) return WP_OK;
    uint32_t k = 0;
    for (uint32_t t = 0; t < n; t++) k += tokens[t] == id;
    if (k > s->emb_len)
        return wpi_ctx_fail(s->ctx, WP_E_ARG,
                            "sequence %u: %u placeholder tokens (id %d) but %u rows are queued "
                            "(push the image's rows first)", which, k, id, s->emb_len);
    return WP_OK;
}

void wpi_embeds_start(wp_seq *s)
{
    s->mdl.embed_next = s->emb;
}

void wpi_embeds_commit(wp_seq *s)
{
    if (!s->emb) return;
    const size_t H = s->ctx->c->hp.hidden_size;
    const size_t used = (size_t)(s->mdl.embed_next - s->emb) / H;
    if (used) {
        memmove(s->emb, s->emb + used * H, (s->emb_len - used) * H * sizeof(float));
        s->emb_len -= (uint32_t)used;
    }
    s->mdl.embed_next = NULL;
}

static wp_status push(wp_seq *s, const float *rows, uint32_t n, uint32_t width)
{
    wp_ctx *ctx = s->ctx;
    const size_t H = ctx->c->hp.hidden_size;
    if (ctx->c->placeholder_id < 0)
        return wpi_ctx_fail(ctx, WP_E_UNSUPPORTED, "the model has no placeholder token for "
                            "embedding rows (no vision object in its container)");
    if (!rows || n == 0) return wpi_ctx_fail(ctx, WP_E_ARG, "no rows to push");
    if (width != H)
        return wpi_ctx_fail(ctx, WP_E_ARG, "rows are %u wide, hidden_size is %zu", width, H);
    if ((uint64_t)s->emb_len + n > s->mdl.ctx)
        return wpi_ctx_fail(ctx, WP_E_CONTEXT_FULL, "%u + %u queued rows exceed the context of %u",
                            s->emb_len, n, s->mdl.ctx);
    if (s->emb_len + n > s->emb_cap) {
        uint32_t cap = s->emb_len + n;
        float *e = wpi_alloc(&ctx->mem, 64, (size_t)cap * H * sizeof(float));
        if (!e) return wpi_ctx_fail(ctx, WP_E_OOM, "a queue of %u embedding rows", cap);
        if (s->emb_len) memcpy(e, s->emb, (size_t)s->emb_len * H * sizeof(float));
        const uint32_t len = s->emb_len;
        wpi_embeds_clear(s);
        s->emb = e;
        s->emb_cap = cap;
        s->emb_len = len;
    }
    memcpy(s->emb + (size_t)s->emb_len * H, rows, (size_t)n * H * sizeof(float));
    s->emb_len += n;
    return WP_OK;
}

wp_status wp_push_embeds(wp_ctx *ctx, const float *rows, uint32_t n, uint32_t width)
{
    if (!ctx) return WP_E_ARG;
    ctx->err[0] = '\0';
    return push(&ctx->seqs[0], rows, n, width);
}

uint32_t wp_pending_embeds(const wp_ctx *ctx)
{
    return ctx ? ctx->seqs[0].emb_len : 0;
}

/* ---- one sequence ------------------------------------------------------------------ */

static wp_status seq_truncate(wp_seq *s, uint32_t pos)
{
    wp_ctx *ctx = s->ctx;
    ctx->err[0] = '\0';
    if (pos > s->pos)
        return wpi_ctx_fail(ctx, WP_E_ARG, "truncate to %u beyond the position %u", pos, s->pos);
    const char *why = ctx->arch->no_truncate ? ctx->arch->no_truncate(&ctx->c->hp) : NULL;
    if (pos > 0 && pos < s->pos && why)
        return wpi_ctx_fail(ctx, WP_E_STATE, "%s cannot be truncated to %u of %u tokens; reset", why,
                            pos, s->pos);
    s->pos = pos;
    wpi_embeds_clear(s);
    return WP_OK;
}

/* A handed-out sequence still open (NULL and closed ones are WP_E_ARG). */
static wp_status live(const wp_seq *s)
{
    if (!s) return WP_E_ARG;
    if (!s->open) return wpi_ctx_fail(s->ctx, WP_E_ARG, "the sequence is closed");
    s->ctx->err[0] = '\0';
    return WP_OK;
}

uint32_t wp_position(const wp_ctx *ctx)
{
    return ctx ? ctx->seqs[0].pos : 0;
}

wp_status wp_state_reset(wp_ctx *ctx)
{
    if (!ctx) return WP_E_ARG;
    return seq_truncate(&ctx->seqs[0], 0);
}

wp_status wp_state_truncate(wp_ctx *ctx, uint32_t pos)
{
    if (!ctx) return WP_E_ARG;
    return seq_truncate(&ctx->seqs[0], pos);
}

wp_status wp_seq_open(wp_ctx *ctx, wp_seq **out)
{
    if (out) *out = NULL;
    if (!ctx || !out) return WP_E_ARG;
    ctx->err[0] = '\0';
    for (uint32_t i = 1; i < ctx->n_seqs; i++)
        if (!ctx->seqs[i].open) {
            ctx->seqs[i].open = 1;
            ctx->seqs[i].pos = 0;
            *out = &ctx->seqs[i];
            return WP_OK;
        }
    return wpi_ctx_fail(ctx, WP_E_BUDGET,
                        "all %u sequences are in use (max_sequences %u; sequence 0 is the "
                        "context's own)", ctx->n_seqs, ctx->n_seqs);
}

void wp_seq_close(wp_seq *s)
{
    if (!s || s == &s->ctx->seqs[0]) return;
    s->open = 0;
    s->pos = 0;
    wpi_embeds_clear(s);
}

wp_status wp_seq_push_embeds(wp_seq *s, const float *rows, uint32_t n, uint32_t width)
{
    wp_status st = live(s);
    return st != WP_OK ? st : push(s, rows, n, width);
}

uint32_t wp_seq_pending_embeds(const wp_seq *s)
{
    return s && s->open ? s->emb_len : 0;
}

uint32_t wp_seq_position(const wp_seq *s)
{
    return s && s->open ? s->pos : 0;
}

wp_status wp_seq_reset(wp_seq *s)
{
    wp_status st = live(s);
    return st != WP_OK ? st : seq_truncate(s, 0);
}

wp_status wp_seq_truncate(wp_seq *s, uint32_t pos)
{
    wp_status st = live(s);
    return st != WP_OK ? st : seq_truncate(s, pos);
}

wp_status wp_seq_save(wp_seq *s, const char *path)
{
    wp_status st = live(s);
    return st != WP_OK ? st : wpi_seq_save(s, path);
}

wp_status wp_seq_load(wp_seq *s, const char *path)
{
    wp_status st = live(s);
    return st != WP_OK ? st : wpi_seq_load(s, path);
}

wp_status wp_seq_copy(wp_seq *dst, const wp_seq *src)
{
    wp_status st = live(dst);
    if (st != WP_OK) return st;
    if ((st = live(src)) != WP_OK) return st;
    wp_ctx *ctx = dst->ctx;
    if (src->ctx != ctx)
        return wpi_ctx_fail(ctx, WP_E_ARG, "the sequences belong to different contexts");
    if (dst == src) return WP_OK;
    /* The saved parts at src's position are exactly the state that position needs. */
    for (uint32_t l = 0; l < ctx->c->hp.n_layers; l++)
        for (int v = 0; v < 2; v++) {
            float *from, *to;
            size_t bytes = wpi_seq_part(src, l, v, src->pos, &from);
            wpi_seq_part(dst, l, v, src->pos, &to);
            if (bytes) memcpy(to, from, bytes);
        }
    dst->pos = src->pos;
    wpi_embeds_clear(dst);
    return WP_OK;
}

/* ---- the batch --------------------------------------------------------------------- */

/* Resolves and checks every input; nothing is evaluated before all of it is fine. */
static wp_status check_batch(wp_ctx *ctx, const tables *tb, wp_seq *const *seqs,
                             const int32_t *const *tokens, const uint32_t *n_tokens,
                             uint32_t n_seqs, const float *logits, size_t logits_cap)
{
    const wpi_hparams *hp = &ctx->c->hp;
    if (!tokens || !n_tokens) return wpi_ctx_fail(ctx, WP_E_ARG, "tokens or n_tokens is NULL");
    if (n_seqs == 0) return wpi_ctx_fail(ctx, WP_E_ARG, "n_seqs must be at least 1");
    if (n_seqs > ctx->n_seqs)
        return wpi_ctx_fail(ctx, WP_E_ARG, "%u sequences in a batch, the context has %u",
                            n_seqs, ctx->n_seqs);
    memset(tb->mark, 0, ctx->n_seqs);
    for (uint32_t i = 0; i < n_seqs; i++) {
        wp_seq *s = seqs && seqs[i] ? seqs[i] : &ctx->seqs[0];
        /* compared as addresses: s may point anywhere */
        const uintptr_t at = (uintptr_t)s, first = (uintptr_t)ctx->seqs;
        if (at < first || at >= first + ctx->n_seqs * sizeof *s ||
            (at - first) % sizeof *s != 0 || !s->open)
            return wpi_ctx_fail(ctx, WP_E_ARG, "sequence %u is not an open sequence of this context", i);
        size_t k = (at - first) / sizeof *s;
        if (tb->mark[k])
            return wpi_ctx_fail(ctx, WP_E_ARG, "sequence %u is given twice in one batch", i);
        tb->mark[k] = 1;
        const uint32_t n = n_tokens[i];
        if (n == 0) return wpi_ctx_fail(ctx, WP_E_ARG, "n_tokens[%u] must be at least 1", i);
        if (!tokens[i]) return wpi_ctx_fail(ctx, WP_E_ARG, "tokens[%u] is NULL", i);
        if ((uint64_t)s->pos + n > s->mdl.ctx)
            return wpi_ctx_fail(ctx, WP_E_CONTEXT_FULL,
                                "sequence %u: position %u + %u tokens exceeds the context of %u",
                                i, s->pos, n, s->mdl.ctx);
        for (uint32_t t = 0; t < n; t++)
            if (tokens[i][t] < 0 || (uint32_t)tokens[i][t] >= hp->vocab_size)
                return wpi_ctx_fail(ctx, WP_E_ARG,
                                    "sequence %u: token %u is %d, outside the vocabulary [0, %u)",
                                    i, t, tokens[i][t], hp->vocab_size);
        wp_status st = wpi_embeds_check(s, tokens[i], n, i);
        if (st != WP_OK) return st;
        tb->seq[i] = s;
    }
    size_t need = (size_t)n_seqs * hp->vocab_size;
    if (!logits && logits_cap != 0)
        return wpi_ctx_fail(ctx, WP_E_ARG, "logits is NULL but logits_cap is %zu", logits_cap);
    if (logits && logits_cap < need)
        return wpi_ctx_fail(ctx, WP_E_ARG, "logits_cap %zu is short: %zu floats are needed",
                            logits_cap, need);
    return WP_OK;
}

/* Sequence i alone, chunk by chunk, as wp_eval does. */
static wp_status eval_one(wp_ctx *ctx, wp_seq *s, const int32_t *tok, uint32_t n, float *out)
{
    const uint32_t chunk = s->mdl.chunk;
    wp_status st = WP_OK;
    for (uint32_t i = 0; i < n && st == WP_OK; i += chunk) {
        uint32_t c = n - i < chunk ? n - i : chunk;
        st = wpi_model_forward(&s->mdl, ctx->arch, tok + i, c, s->pos + i,
                               i + c == n ? out : NULL, 0);
    }
    return st;
}

/* Steps of at most chunk rows, packed in order; see the head of the file. */
static wp_status eval_steps(wp_ctx *ctx, const tables *tb, const int32_t *const *tokens,
                            const uint32_t *n_tokens, uint32_t n_seqs, float *logits)
{
    const uint32_t chunk = ctx->batch.chunk, V = ctx->c->hp.vocab_size;
    uint32_t i = 0, done = 0;
    while (i < n_seqs) {
        uint32_t room = chunk, k = 0, first = n_seqs;
        while (i < n_seqs && room > 0) {
            const uint32_t left = n_tokens[i] - done, take = left < room ? left : room;
            tb->m[k] = &tb->seq[i]->mdl;
            tb->tok[k] = tokens[i] + done;
            tb->n[k] = take;
            tb->pos[k] = tb->seq[i]->pos + done;
            tb->want[k] = take == left;
            room -= take;
            k++;
            if (take == left) {
                if (first == n_seqs) first = i;
                i++;
                done = 0;
            } else {
                done += take;
            }
        }
        float *out = logits && first < n_seqs ? logits + (size_t)first * V : NULL;
        wp_status st = wpi_model_forward_batch(&ctx->batch, ctx->arch, tb->m, tb->tok, tb->n,
                                               tb->pos, k, out, tb->want);
        if (st != WP_OK) return st;
    }
    return WP_OK;
}

wp_status wp_eval_batch(wp_ctx *ctx, wp_seq *const *seqs, const int32_t *const *tokens,
                        const uint32_t *n_tokens, uint32_t n_seqs, float *logits,
                        size_t logits_cap)
{
    if (!ctx) return WP_E_ARG;
    ctx->err[0] = '\0';
    const tables tb = carve_tables(ctx);
    wp_status st = check_batch(ctx, &tb, seqs, tokens, n_tokens, n_seqs, logits, logits_cap);
    if (st != WP_OK) return st;
    const uint32_t V = ctx->c->hp.vocab_size;
    for (uint32_t i = 0; i < n_seqs; i++) wpi_embeds_start(tb.seq[i]);
    double t0 = wpi_now();
    if (n_seqs == 1 || !ctx->arch->mixer || !ctx->arch->ffn) {
        for (uint32_t i = 0; i < n_seqs && st == WP_OK; i++)
            st = eval_one(ctx, tb.seq[i], tokens[i], n_tokens[i],
                          logits ? logits + (size_t)i * V : NULL);
    } else {
        st = eval_steps(ctx, &tb, tokens, n_tokens, n_seqs, logits);
    }
    ctx->eval_seconds += wpi_now() - t0;
    if (st != WP_OK) { /* no position moves; rows past them are garbage */
        for (uint32_t i = 0; i < n_seqs; i++) tb.seq[i]->mdl.embed_next = NULL;
        return st;
    }
    for (uint32_t i = 0; i < n_seqs; i++) {
        wpi_embeds_commit(tb.seq[i]);
        tb.seq[i]->pos += n_tokens[i];
        ctx->tokens += n_tokens[i];
    }
    return WP_OK;
}

/*
 * core.c -- the context lifecycle behind wp.h: cfg defaults, open/close, eval, info,
 * stats, status names and error detail.
 *
 * Open order: container (manifest) -> architecture -> arch check -> memory plan (the
 * budget) -> trunk -> expert cache -> KV + scratch -> compute pool. Every failure undoes
 * what was built and leaves a detail naming the file, tensor or value at fault.
 * The forward pass itself lives in forward.c, blocks/ and arch/.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "route_trace.h"

#define STR2(x) #x
#define STR(x) STR2(x)

void wp_cfg_init(wp_cfg *cfg)
{
    if (!cfg) return;
    memset(cfg, 0, sizeof *cfg);
    cfg->cache_policy = WP_CACHE_LFRU;
    cfg->direct_io = 1;
    cfg->verify = 0;
    cfg->lookahead = 1;
    cfg->isa = WP_ISA_AUTO;
    cfg->exact = WP_EXACT_AUTO;
}

const char *wp_strerror(wp_status status)
{
    switch (status) {
    case WP_OK: return "ok";
    case WP_E_IO: return "I/O error";
    case WP_E_FORMAT: return "malformed container or state file";
    case WP_E_BUDGET: return "memory budget below the floor";
    case WP_E_OOM: return "out of memory";
    case WP_E_ARG: return "bad argument";
    case WP_E_UNSUPPORTED: return "unsupported model or feature";
    case WP_E_CANCELLED: return "cancelled";
    case WP_E_CONTEXT_FULL: return "context full";
    case WP_E_STATE: return "state file from another model or shape";
    }
    return "unknown status";
}

const char *wp_error_detail(const wp_ctx *ctx)
{
    return ctx ? ctx->err : "";
}

const char *wp_version(void)
{
    return STR(WP_VERSION_MAJOR) "." STR(WP_VERSION_MINOR) "." STR(WP_VERSION_PATCH);
}

int wp_version_number(void)
{
    return WP_VERSION_MAJOR * 10000 + WP_VERSION_MINOR * 100 + WP_VERSION_PATCH;
}

wp_status wpi_ctx_fail(wp_ctx *ctx, wp_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
    va_end(ap);
    return st;
}

static uint32_t resolved_chunk(const wp_cfg *cfg)
{
    return cfg->prefill_chunk ? cfg->prefill_chunk : 64;
}

void wp_close(wp_ctx *ctx)
{
    if (!ctx) return;
    wpi_pool_close(ctx->pool);
    if (ctx->experts) wpi_experts_close(ctx->experts, &ctx->mem);
    for (uint32_t i = 0; ctx->seqs && i < ctx->n_seqs; i++) {
        if (ctx->seqs[i].own) wpi_free(&ctx->mem, ctx->seqs[i].own, ctx->seq_bytes);
        if (ctx->seqs[i].ctx) wpi_embeds_clear(&ctx->seqs[i]);
    }
    free(ctx->seqs);
    free(ctx->batch_buf);
    if (ctx->scratch) wpi_free(&ctx->mem, ctx->scratch, ctx->scratch_bytes);
    if (ctx->kv) wpi_free(&ctx->mem, ctx->kv, ctx->kv_bytes);
    wpi_route_trace_free(ctx->trace, &ctx->mem);
    free(ctx->trace_rows);
    if (ctx->c) wpi_container_close(ctx->c, &ctx->mem);
    free(ctx);
}

/* Routing replay: sequence k starts at trace token offset + k * stride (stride 0 = the
 * trace's length spread over the sequences); a batched step's rows take their cursors
 * from trace_rows (forward.c). */
static wp_status open_trace(wp_ctx *ctx, const wp_cfg *cfg, uint32_t chunk)
{
    wp_status st = wpi_route_trace_load(cfg->route_trace_path, ctx->c, &ctx->mem, &ctx->trace,
                                        ctx->err, sizeof ctx->err);
    if (st != WP_OK) return st;
    const uint64_t len = ctx->trace->n_tokens;
    const uint64_t stride = cfg->route_trace_stride ? cfg->route_trace_stride : len / ctx->n_seqs;
    if (!(ctx->trace_rows = calloc(chunk, sizeof *ctx->trace_rows)))
        return wpi_ctx_fail(ctx, WP_E_OOM, "trace cursors of %u rows", chunk);
    for (uint32_t i = 0; i < ctx->n_seqs; i++) {
        wpi_model *m = &ctx->seqs[i].mdl;
        m->trace = ctx->trace;
        m->trace_cursor = (cfg->route_trace_offset % len + i * (stride % len)) % len;
    }
    return WP_OK;
}

/* The tower's work buffer at its patch limit, for the plan (0 without a tower). */
static void vision_reserve(const wpi_arch *arch, wpi_container *c)
{
    c->vision_reserve_bytes = c->has_vision && arch->vision
                                  ? arch->vision->work_bytes(&c->vhp, c->vhp.max_patches)
                                  : 0;
}

/* experts_per_token (wp.h): this open routes to N experts per token, the container's
 * top_k becoming N for everything sized or looped by it (routing, buffers, plan, cache). */
static wp_status apply_experts_per_token(wpi_container *c, const wp_cfg *cfg, char *err,
                                         size_t cap)
{
    const uint32_t n = cfg->experts_per_token;
    if (n == 0) return WP_OK;
    if (c->hp.n_experts == 0)
        return wpi_fail(err, cap, WP_E_ARG, "experts_per_token %u: the model has no routed experts",
                        n);
    if (n > c->hp.top_k_shipped)
        return wpi_fail(err, cap, WP_E_ARG,
                        "experts_per_token %u is out of range [1, the model's top_k %u]", n,
                        c->hp.top_k_shipped);
    c->hp.top_k = n;
    return WP_OK;
}

/* wp_cfg.exact as the rows of a step that may take the 8-bit path (wpi_model.x8_max_tok)
 * and the weight dtypes it takes it for (wpi_model.x8_dtypes). */
static void x8_policy(int32_t exact, const wpi_kernels *k, wpi_model *m)
{
    switch (exact) {
    case WP_EXACT_F32: m->x8_dtypes = 0; break;
    case WP_EXACT_X8: m->x8_dtypes = WPI_X8_DTYPES; break;
    default: m->x8_dtypes = wpi_kernels_x8_fast(k); break;
    }
    /* WP_EXACT_AUTO: steps of up to wpi_kernels_x8_auto_rows rows. One token where the
     * byte dot products are vector ones (VNNI: decode about 2x on a Q4_0 MoE; batched
     * decode steps of 2-8 rows measured no faster and a 64-token prefill 1.7-2x slower),
     * every step with AMX tiles (docs/ENGINE.md). */
    m->x8_max_tok = m->x8_dtypes == 0        ? 0
                    : exact == WP_EXACT_X8 ? UINT32_MAX
                                           : wpi_kernels_x8_auto_rows(k);
}

static wp_status open_ctx(wp_ctx *ctx, const char *path, const wp_cfg *cfg)
{
    char *err = ctx->err;
    const size_t cap = sizeof ctx->err;
    if (cfg->exact < WP_EXACT_AUTO || cfg->exact > WP_EXACT_F32)
        return wpi_ctx_fail(ctx, WP_E_ARG, "exact %d is not -1 (auto), 0 (8-bit) or 1 "
                            "(float32)", cfg->exact);
    wp_status st = wpi_container_open(path, &ctx->c, err, cap);
    if (st != WP_OK) return st;
    if ((st = apply_experts_per_token(ctx->c, cfg, err, cap)) != WP_OK) return st;
    const wpi_hparams *hp = &ctx->c->hp;
    ctx->arch = wpi_arch_find(hp->model_type);
    if (!ctx->arch)
        return wpi_ctx_fail(ctx, WP_E_UNSUPPORTED, "model_type '%s' is not supported; supported: %s",
                    hp->model_type, wpi_arch_names());
    if ((st = ctx->arch->check(ctx->c, err, cap)) != WP_OK) return st;
    vision_reserve(ctx->arch, ctx->c);
    if (cfg->vision && !ctx->c->has_vision)
        return wpi_ctx_fail(ctx, WP_E_UNSUPPORTED, "the vision option: %s has no image tower",
                            hp->model_type);
    if (cfg->vision && !ctx->arch->vision)
        return wpi_ctx_fail(ctx, WP_E_UNSUPPORTED, "the vision option: no image tower of %s "
                            "in this engine", hp->model_type);
    const wpi_kernels *k = wpi_kernels_get(cfg->isa);
    if (!k)
        return wpi_ctx_fail(ctx, WP_E_UNSUPPORTED, "isa %d is not supported by this CPU", cfg->isa);
    if ((st = wpi_plan(ctx->c, cfg, wpi_model_sizes, &ctx->plan, err, cap)) != WP_OK) return st;
    if ((st = wpi_container_load_trunk(ctx->c, &ctx->mem, err, cap)) != WP_OK) return st;
    if (cfg->vision && (st = wpi_container_load_vision(ctx->c, &ctx->mem, err, cap)) != WP_OK)
        return st;
    ctx->vision = cfg->vision != 0;
    /* Again with the tensors resident, for the checks of their values. */
    if ((st = ctx->arch->check(ctx->c, err, cap)) != WP_OK) return st;
    if ((st = wpi_experts_open(ctx->c, cfg, ctx->plan.cache_bytes, &ctx->mem, &ctx->experts,
                               err, cap)) != WP_OK)
        return st;

    const uint32_t n_ctx = ctx->plan.ctx_tokens, chunk = resolved_chunk(cfg);
    if (n_ctx == 0) return wpi_ctx_fail(ctx, WP_E_ARG, "context length resolved to 0");
    ctx->kv_bytes = wpi_kv_bytes(hp, n_ctx);
    ctx->scratch_bytes = wpi_scratch_bytes(hp, chunk, n_ctx);
    ctx->kv = wpi_alloc(&ctx->mem, WPI_BUF_ALIGN, ctx->kv_bytes);
    if (!ctx->kv)
        return wpi_ctx_fail(ctx, WP_E_OOM, "KV cache of %llu bytes",
                    (unsigned long long)ctx->kv_bytes);
    ctx->scratch = wpi_alloc(&ctx->mem, WPI_BUF_ALIGN, ctx->scratch_bytes);
    if (!ctx->scratch)
        return wpi_ctx_fail(ctx, WP_E_OOM, "scratch of %llu bytes",
                    (unsigned long long)ctx->scratch_bytes);
    if ((st = wpi_pool_open(cfg->n_threads, &ctx->pool)) != WP_OK)
        return wpi_ctx_fail(ctx, st, "could not start %u compute threads", cfg->n_threads);

    /* Sequences: 0 on kv and the scratch's layer table, the others on their own. */
    ctx->n_seqs = ctx->plan.sequences;
    ctx->seq_bytes = wpi_seq_bytes(hp, n_ctx);
    ctx->seqs = calloc(ctx->n_seqs, sizeof *ctx->seqs);
    ctx->batch_buf = calloc(ctx->n_seqs, wpi_batch_buf_bytes());
    if (!ctx->seqs || !ctx->batch_buf)
        return wpi_ctx_fail(ctx, WP_E_OOM, "tables of %u sequences", ctx->n_seqs);
    for (uint32_t i = 0; i < ctx->n_seqs; i++) {
        wp_seq *s = &ctx->seqs[i];
        s->ctx = ctx;
        if (i > 0 && !(s->own = wpi_alloc(&ctx->mem, WPI_BUF_ALIGN, ctx->seq_bytes)))
            return wpi_ctx_fail(ctx, WP_E_OOM, "state of sequence %u (%llu bytes)", i,
                                (unsigned long long)ctx->seq_bytes);
        wpi_model *m = &s->mdl;
        if ((st = wpi_model_init(m, ctx->arch, ctx->c, i ? s->own : ctx->kv, ctx->scratch,
                                 i ? wpi_seq_layers(hp, n_ctx, s->own) : NULL, n_ctx,
                                 chunk)) != WP_OK)
            return st;
        m->k = k;
        m->pool = ctx->pool;
        m->experts = ctx->experts;
        m->lookahead = cfg->lookahead != 0;
        x8_policy(cfg->exact, k, m);
        m->err = ctx->err;
        m->err_cap = sizeof ctx->err;
    }
    if (cfg->route_trace_path && (st = open_trace(ctx, cfg, chunk)) != WP_OK) return st;
    ctx->seqs[0].open = 1;
    ctx->batch = ctx->seqs[0].mdl;
    ctx->batch.trace_rows = ctx->trace_rows;
    return WP_OK;
}

wp_status wp_open(const char *path, const wp_cfg *cfg, wp_ctx **out, char *err, size_t err_cap)
{
    wp_cfg defaults;
    if (out) *out = NULL;
    if (!path || !out)
        return wpi_fail(err, err_cap, WP_E_ARG, "path and out must not be NULL");
    if (!cfg) {
        wp_cfg_init(&defaults);
        cfg = &defaults;
    }
    wp_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return wpi_fail(err, err_cap, WP_E_OOM, "context");
    wp_status st = open_ctx(ctx, path, cfg);
    if (st != WP_OK) {
        if (err && err_cap) snprintf(err, err_cap, "%s", ctx->err);
        wp_close(ctx);
        return st;
    }
    ctx->err[0] = '\0';
    if (err && err_cap) err[0] = '\0';
    *out = ctx;
    return WP_OK;
}

wp_status wp_get_info(const wp_ctx *ctx, wp_info *out)
{
    if (!ctx || !out) return WP_E_ARG;
    const wpi_hparams *hp = &ctx->c->hp;
    memset(out, 0, sizeof *out);
    snprintf(out->model_type, sizeof out->model_type, "%s", hp->model_type);
    snprintf(out->isa, sizeof out->isa, "%s", ctx->seqs[0].mdl.k->name);
    snprintf(out->x8_isa, sizeof out->x8_isa, "%s", ctx->seqs[0].mdl.k->x8_name);
    out->x8_max_tokens = ctx->seqs[0].mdl.x8_max_tok;
    static const struct { int dtype; const char *name; } x8_names[] = {
        {WPI_Q8_0, "q8_0"}, {WPI_Q4_0, "q4_0"}, {WPI_Q4_1, "q4_1"}, {WPI_MXFP4, "mxfp4"}};
    size_t used = 0;
    for (size_t d = 0; d < sizeof x8_names / sizeof x8_names[0]; d++)
        if (wpi_x8_has(ctx->seqs[0].mdl.x8_dtypes, x8_names[d].dtype))
            used += (size_t)snprintf(out->x8_dtypes + used, sizeof out->x8_dtypes - used,
                                     "%s%s", used ? "," : "", x8_names[d].name);
    out->vocab_size = hp->vocab_size;
    out->hidden_size = hp->hidden_size;
    out->n_layers = hp->n_layers;
    out->n_heads = hp->n_heads;
    out->n_kv_heads = hp->n_kv_heads;
    out->head_dim = hp->head_dim;
    out->n_experts = hp->n_experts;
    out->top_k = hp->top_k;
    out->n_moe_layers = ctx->c->n_banks;
    out->ctx_tokens = ctx->plan.ctx_tokens;
    out->max_position_embeddings = hp->max_position_embeddings;
    out->n_threads = wpi_pool_threads(ctx->pool);
    uint64_t trunk = 0, experts = 0, active = 0;
    for (uint32_t i = 0; i < ctx->c->n_tensors; i++)
        trunk += ctx->c->tensors[i].shape[0] * ctx->c->tensors[i].shape[1];
    for (uint32_t b = 0; b < ctx->c->n_banks; b++) {
        const wpi_bank *bk = &ctx->c->banks[b];
        uint64_t per = 3ull * bk->inter * bk->hidden;
        experts += per * bk->n_experts;
        active += per * (hp->top_k < bk->n_experts ? hp->top_k : bk->n_experts);
    }
    out->total_params = trunk + experts;
    out->active_params = trunk + active;
    out->plan = ctx->plan;
    return WP_OK;
}

wp_status wp_eval(wp_ctx *ctx, const int32_t *tokens, uint32_t n, int all_logits,
                  float *logits, size_t logits_cap)
{
    if (!ctx) return WP_E_ARG;
    ctx->err[0] = '\0';
    const wpi_hparams *hp = &ctx->c->hp;
    if (n == 0) return wpi_ctx_fail(ctx, WP_E_ARG, "n must be at least 1");
    if (!tokens) return wpi_ctx_fail(ctx, WP_E_ARG, "tokens is NULL");
    wp_seq *s = &ctx->seqs[0];
    if ((uint64_t)s->pos + n > s->mdl.ctx)
        return wpi_ctx_fail(ctx, WP_E_CONTEXT_FULL, "position %u + %u tokens exceeds the context of %u",
                    s->pos, n, s->mdl.ctx);
    for (uint32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= hp->vocab_size)
            return wpi_ctx_fail(ctx, WP_E_ARG, "token %u is %d, outside the vocabulary [0, %u)", i,
                        tokens[i], hp->vocab_size);
    size_t need = (size_t)(all_logits ? n : 1) * hp->vocab_size;
    if (!logits && logits_cap != 0)
        return wpi_ctx_fail(ctx, WP_E_ARG, "logits is NULL but logits_cap is %zu", logits_cap);
    if (logits && logits_cap < need)
        return wpi_ctx_fail(ctx, WP_E_ARG, "logits_cap %zu is short: %zu floats are needed",
                    logits_cap, need);
    wp_status cs = wpi_embeds_check(s, tokens, n, 0);
    if (cs != WP_OK) return cs;
    wpi_embeds_start(s);

    double t0 = wpi_now();
    const uint32_t chunk = s->mdl.chunk;
    wp_status st = WP_OK;
    for (uint32_t i = 0; i < n && st == WP_OK; i += chunk) {
        uint32_t c = n - i < chunk ? n - i : chunk;
        int last = i + c == n;
        float *out = NULL;
        if (logits && all_logits) out = logits + (size_t)i * hp->vocab_size;
        else if (logits && last) out = logits;
        st = wpi_model_forward(&s->mdl, ctx->arch, tokens + i, c, s->pos + i, out,
                               all_logits);
    }
    ctx->eval_seconds += wpi_now() - t0;
    if (st != WP_OK) { /* position unchanged; rows past it are garbage */
        s->mdl.embed_next = NULL;
        return st;
    }
    wpi_embeds_commit(s);
    s->pos += n;
    ctx->tokens += n;
    return WP_OK;
}

int32_t wp_placeholder_token(const wp_ctx *ctx)
{
    return ctx ? ctx->c->placeholder_id : -1;
}

wp_status wp_encode_image(wp_ctx *ctx, const float *pixels, uint32_t n_patches,
                          uint32_t patch_dim, const uint32_t grid_thw[3], float *out,
                          size_t out_cap, uint32_t *n_rows)
{
    if (!ctx) return WP_E_ARG;
    ctx->err[0] = '\0';
    if (n_rows) *n_rows = 0;
    const wpi_container *c = ctx->c;
    const wpi_vision_hp *v = &c->vhp;
    if (!c->has_vision || !ctx->arch->vision)
        return wpi_ctx_fail(ctx, WP_E_UNSUPPORTED, "%s has no image tower", c->hp.model_type);
    if (!ctx->vision)
        return wpi_ctx_fail(ctx, WP_E_UNSUPPORTED,
                            "the image tower is not loaded: open with the vision option");
    if (!pixels || !grid_thw) return wpi_ctx_fail(ctx, WP_E_ARG, "pixels or grid_thw is NULL");
    const uint64_t want_dim = (uint64_t)v->channels * v->temporal_patch_size * v->patch_size *
                              v->patch_size;
    if (patch_dim != want_dim)
        return wpi_ctx_fail(ctx, WP_E_ARG, "pixel rows are %u wide, the tower takes %llu",
                            patch_dim, (unsigned long long)want_dim);
    const uint64_t np = (uint64_t)grid_thw[0] * grid_thw[1] * grid_thw[2];
    if (np != n_patches)
        return wpi_ctx_fail(ctx, WP_E_ARG, "grid %u x %u x %u is %llu patches, pixels hold %u",
                            grid_thw[0], grid_thw[1], grid_thw[2], (unsigned long long)np,
                            n_patches);
    if (np > v->max_patches)
        return wpi_ctx_fail(ctx, WP_E_ARG, "%llu patches exceed the tower's limit of %u",
                            (unsigned long long)np, v->max_patches);
    const uint32_t rows = ctx->arch->vision->out_rows(v, grid_thw, ctx->err, sizeof ctx->err);
    if (!rows) return WP_E_ARG;
    const size_t need = (size_t)rows * c->hp.hidden_size;
    if (!out || out_cap < need)
        return wpi_ctx_fail(ctx, WP_E_ARG, "out_cap %zu is short: %zu floats are needed",
                            out_cap, need);
    const uint64_t wb = ctx->arch->vision->work_bytes(v, n_patches);
    void *work = wpi_alloc(&ctx->mem, WPI_BUF_ALIGN, (size_t)wb);
    if (!work)
        return wpi_ctx_fail(ctx, WP_E_OOM, "image work buffer of %llu bytes",
                            (unsigned long long)wb);
    wpi_model m = ctx->seqs[0].mdl;
    m.x8_max_tok = 0;
    m.x8_dtypes = 0; /* float32 activations: no 8-bit copy sized for the tower */
    m.x8 = 0;
    double t0 = wpi_now();
    ctx->arch->vision->encode(&m, c, pixels, grid_thw, out, work);
    ctx->eval_seconds += wpi_now() - t0;
    wpi_free(&ctx->mem, work, (size_t)wb);
    if (n_rows) *n_rows = rows;
    return WP_OK;
}

wp_status wp_get_stats(const wp_ctx *ctx, wp_stats *out)
{
    if (!ctx || !out) return WP_E_ARG;
    memset(out, 0, sizeof *out);
    out->tokens = ctx->tokens;
    out->eval_seconds = ctx->eval_seconds;
    out->peak_bytes = ctx->mem.peak;
    out->other_bytes_read = ctx->c->bytes_read - ctx->other_bytes_base;
    if (ctx->experts) wpi_experts_stats(ctx->experts, out);
    return WP_OK;
}

void wp_stats_reset(wp_ctx *ctx)
{
    if (!ctx) return;
    ctx->tokens = 0;
    ctx->eval_seconds = 0;
    ctx->mem.peak = ctx->mem.current;
    ctx->other_bytes_base = ctx->c->bytes_read;
    if (ctx->experts) wpi_experts_stats_reset(ctx->experts);
}

wp_status wp_hotlist_save(wp_ctx *ctx, const char *path)
{
    if (!ctx) return WP_E_ARG;
    ctx->err[0] = '\0';
    if (!path) return wpi_ctx_fail(ctx, WP_E_ARG, "path is NULL");
    if (!ctx->experts) return wpi_ctx_fail(ctx, WP_E_UNSUPPORTED, "the model has no experts");
    return wpi_experts_hotlist_save(ctx->experts, path, ctx->err, sizeof ctx->err);
}

/* The memory plan without opening: container, architecture check, then wpi_plan with the
 * architecture's sizes (wpi_model_sizes). */
wp_status wp_plan_memory(const char *path, const wp_cfg *cfg, wp_plan *out, char *err,
                         size_t err_cap)
{
    if (err && err_cap)
        err[0] = '\0';
    if (!path || !out)
        return wpi_fail(err, err_cap, WP_E_ARG, "wp_plan_memory: NULL argument");
    wp_cfg defaults;
    if (!cfg) {
        wp_cfg_init(&defaults);
        cfg = &defaults;
    }
    wpi_container *c = NULL;
    wp_status st = wpi_container_open(path, &c, err, err_cap);
    if (st != WP_OK)
        return st;
    if ((st = apply_experts_per_token(c, cfg, err, err_cap)) != WP_OK) {
        wpi_container_close(c, NULL);
        return st;
    }
    const wpi_arch *arch = wpi_arch_find(c->hp.model_type);
    if (!arch) {
        st = wpi_fail(err, err_cap, WP_E_UNSUPPORTED,
                      "model_type '%s' is not supported (supported: %s)", c->hp.model_type,
                      wpi_arch_names());
    } else if (!arch->check || (st = arch->check(c, err, err_cap)) == WP_OK) {
        vision_reserve(arch, c);
        st = wpi_plan(c, cfg, wpi_model_sizes, out, err, err_cap);
    }
    wpi_container_close(c, NULL);
    return st;
}

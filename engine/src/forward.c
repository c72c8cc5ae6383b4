/*
 * forward.c -- the model-level forward pass shared by every architecture.
 *
 * Owns: the KV and scratch sizes (also given to the plan), binding trunk tensors to a
 * wpi_model, the walk embedding -> arch layer_forward per layer -> final norm -> LM head,
 * and the row-parallel matmul used by every block. What an architecture adds (its state,
 * scratch, tensors) comes through its hooks (arch.h); the tensor checks arch files call
 * are in checks.c.
 * Refuses: anything architecture-specific (arch/) and any expert I/O (experts/).
 */
#include <stdio.h>
#include <string.h>

#include "arch.h"

#define ALIGN 64 /* every carved buffer starts on a cache line */
/* Below this many multiply-adds a matmul runs on the calling thread: a dispatch costs a
 * few microseconds, about what one core needs for this much work. */
#define WPI_PAR_MIN_WORK (1u << 16)
#define WPI_ROW_BLOCK 16 /* row blocks are multiples of this: results never depend on threads */

static uint32_t umax(uint32_t a, uint32_t b) { return a > b ? a : b; }

/* ---- sizes ----------------------------------------------------------------------- */

void *wpi_carve_take(wpi_carve *cv, uint64_t count, size_t size)
{
    void *p = cv->base ? cv->base + cv->off : NULL;
    cv->off += (count * size + ALIGN - 1) / ALIGN * ALIGN;
    return p;
}

void *wpi_carve_own(wpi_carve *cv, wpi_model *m, size_t size)
{
    void *p = wpi_carve_take(cv, 1, size);
    if (m) m->arch = p;
    return p;
}

void wpi_state_bytes(const wpi_hparams *hp, uint32_t ctx, uint64_t out[WP_STATE_KINDS])
{
    const wpi_arch *arch = wpi_arch_find(hp->model_type);
    memset(out, 0, WP_STATE_KINDS * sizeof out[0]);
    if (arch && arch->state_bytes) {
        arch->state_bytes(hp, ctx, out);
        return;
    }
    out[WP_STATE_KV] = 2ull * hp->n_layers * ctx * hp->n_kv_heads * hp->head_dim * sizeof(float);
}

uint64_t wpi_kv_bytes(const wpi_hparams *hp, uint32_t ctx)
{
    uint64_t by_kind[WP_STATE_KINDS], sum = 0;
    wpi_state_bytes(hp, ctx, by_kind);
    for (int k = 0; k < WP_STATE_KINDS; k++) sum += by_kind[k];
    return sum;
}

/* Blocks of the 8-bit copy of a matmul input: a chunk of the widest of the trunk's
 * inputs (a wider one, as some architectures' low-rank projections, runs float32), and
 * of the hidden state besides, so a SwiGLU's input and its silu(g) * u fit together
 * (ffn.c). */
static uint64_t xq_blocks(const wpi_hparams *hp, uint32_t chunk)
{
    uint32_t w = umax(hp->hidden_size,
                      umax(hp->n_heads * umax(hp->head_dim, hp->v_head_dim),
                           umax(hp->intermediate_size,
                                umax(hp->moe_intermediate_size,
                                     hp->shared_expert_intermediate_size))));
    return (uint64_t)chunk * (w / WPI_QK + hp->hidden_size / WPI_QK);
}

/* Walks the scratch layout: the shared buffers, then the architecture's (its scratch
 * hook); with base == NULL only measures (m may then be NULL). Returns total bytes. */
static uint64_t layout(const wpi_arch *arch, const wpi_hparams *hp, uint32_t chunk,
                       wpi_model *m, char *base)
{
    wpi_carve cv = {base, 0};
    const uint64_t C = chunk, H = hp->hidden_size, E = hp->n_experts, K = hp->top_k;
    const uint64_t QD = (uint64_t)hp->n_heads * hp->head_dim;
    /* MLA writes v_head_dim floats per head into att, which may exceed head_dim */
    const uint64_t AD = (uint64_t)hp->n_heads * umax(hp->head_dim, hp->v_head_dim);
    /* the rows a block projects before a sequence stores them: MLA's latent, else k|v */
    const uint64_t KVR = hp->kv_lora_rank ? (uint64_t)hp->kv_lora_rank + hp->rope_dim
                                          : 2ull * hp->n_kv_heads * hp->head_dim;
    const uint64_t FF = umax(hp->intermediate_size,
                             umax(hp->moe_intermediate_size,
                                  hp->shared_expert_intermediate_size));
#define CARVE(field, type, count) WPI_CARVE(&cv, m, field, type, count)
    CARVE(layers, wpi_layer, hp->n_layers);
    CARVE(x, float, C * H);
    CARVE(xn, float, C * H);
    CARVE(xq, wpi_xq, xq_blocks(hp, chunk));
    CARVE(q, float, C * QD);
    CARVE(att, float, C * AD);
    CARVE(kv_rows, float, C * KVR);
    CARVE(rope_cos, float, C * (hp->rope_dim / 2));
    CARVE(rope_sin, float, C * (hp->rope_dim / 2));
    CARVE(ff_g, float, C * FF);
    CARVE(ff_u, float, C * FF);
    CARVE(moe_out, float, C * H);
    CARVE(probs, float, C * E);
    CARVE(topk_id, int32_t, C * K);
    CARVE(topk_w, float, C * K);
    CARVE(eo, float, C * K * H);
    CARVE(xg, float, C * H);
    CARVE(yg, float, C * H);
    CARVE(ex_ids, int32_t, E);
    CARVE(ex_start, int32_t, E + 1);
    CARVE(ex_pick, int32_t, C * K);
    CARVE(ex_slot, int32_t, E);
    CARVE(sh_w, float, C);
    CARVE(la_probs, float, E);
    CARVE(la_ids, int32_t, K);
    CARVE(la_w, float, K);
    CARVE(route_tmp, float, 2 * E);
    CARVE(kda_buf, float, wpi_kda_scratch_floats(hp, chunk));
#undef CARVE
    wpi_mla_scratch(hp, chunk, m, &cv);
    if (arch && arch->scratch) arch->scratch(hp, chunk, m, &cv);
    return cv.off;
}

uint64_t wpi_scratch_bytes(const wpi_hparams *hp, uint32_t chunk, uint32_t ctx)
{
    (void)ctx; /* attention streams keys in fixed blocks: no ctx-sized buffer */
    return layout(wpi_arch_find(hp->model_type), hp, chunk ? chunk : 1, NULL, NULL);
}

void wpi_model_sizes(const wpi_hparams *hp, uint32_t ctx, uint32_t chunk,
                     uint64_t state_bytes[WP_STATE_KINDS], uint64_t *scratch_bytes,
                     uint64_t *sequence_bytes)
{
    wpi_state_bytes(hp, ctx, state_bytes);
    *scratch_bytes = wpi_scratch_bytes(hp, chunk, ctx);
    *sequence_bytes = wpi_seq_bytes(hp, ctx);
}

static uint64_t round_up(uint64_t v)
{
    return (v + ALIGN - 1) / ALIGN * ALIGN;
}

uint64_t wpi_seq_bytes(const wpi_hparams *hp, uint32_t ctx)
{
    return round_up(wpi_kv_bytes(hp, ctx)) + round_up((uint64_t)hp->n_layers * sizeof(wpi_layer));
}

wpi_layer *wpi_seq_layers(const wpi_hparams *hp, uint32_t ctx, void *own)
{
    return (wpi_layer *)((char *)own + round_up(wpi_kv_bytes(hp, ctx)));
}

/* ---- binding --------------------------------------------------------------------- */

static const wpi_tensor *find(const wpi_container *c, const char *fmt, uint32_t l)
{
    char name[96];
    snprintf(name, sizeof name, fmt, l);
    return wpi_container_tensor(c, name);
}

static wpi_wmat wmat(const wpi_tensor *t)
{
    wpi_wmat w = {0};
    if (t) {
        w.data = t->data;
        w.dtype = t->dtype;
        w.rows = (uint32_t)t->shape[0];
        w.cols = (uint32_t)t->shape[1];
    }
    return w;
}

static const float *vec(const wpi_tensor *t)
{
    return t ? (const float *)t->data : NULL;
}

wpi_wmat wpi_bind_mat(const wpi_container *c, const char *fmt, uint32_t l)
{
    return wmat(find(c, fmt, l));
}

const float *wpi_bind_vec(const wpi_container *c, const char *fmt, uint32_t l)
{
    return vec(find(c, fmt, l));
}

wp_status wpi_model_init(wpi_model *m, const wpi_arch *arch, const wpi_container *c,
                         void *kv, void *scratch, wpi_layer *layers, uint32_t ctx,
                         uint32_t chunk)
{
    const wpi_hparams *hp = &c->hp;
    m->hp = hp;
    m->ctx = ctx;
    m->chunk = chunk;
    layout(arch, hp, chunk, m, scratch);
    if (layers) m->layers = layers;
    memset(m->layers, 0, (size_t)hp->n_layers * sizeof(wpi_layer));
    m->xq_blocks = xq_blocks(hp, chunk);
    size_t half = (size_t)hp->n_layers * ctx * hp->n_kv_heads * hp->head_dim;
    m->kcache = kv;
    m->vcache = (float *)kv + half;
    uint32_t n_att = 0, n_kda = 0;
    m->tok_embd = wmat(wpi_container_tensor(c, "token_embd.weight"));
    m->embed_token = c->placeholder_id;
    m->embed_next = NULL;
    m->output = wmat(wpi_container_tensor(c, "output.weight"));
    m->lm_head = hp->tie_word_embeddings || !m->output.data ? &m->tok_embd : &m->output;
    m->out_norm = vec(wpi_container_tensor(c, "output_norm.weight"));
    m->rope_freqs = vec(wpi_container_tensor(c, "rope_freqs"));
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        wpi_layer *L = &m->layers[l];
        L->attn_norm = vec(find(c, "blk.%u.attn_norm.weight", l));
        L->ffn_norm = vec(find(c, "blk.%u.ffn_norm.weight", l));
        L->wq = wmat(find(c, "blk.%u.attn_q.weight", l));
        L->wk = wmat(find(c, "blk.%u.attn_k.weight", l));
        L->wv = wmat(find(c, "blk.%u.attn_v.weight", l));
        L->wo = wmat(find(c, "blk.%u.attn_output.weight", l));
        L->bq = vec(find(c, "blk.%u.attn_q.bias", l));
        L->bk = vec(find(c, "blk.%u.attn_k.bias", l));
        L->bv = vec(find(c, "blk.%u.attn_v.bias", l));
        L->bo = vec(find(c, "blk.%u.attn_output.bias", l));
        if (hp->qk_norm != WPI_QK_NONE) {
            L->q_norm = vec(find(c, "blk.%u.attn_q_norm.weight", l));
            L->k_norm = vec(find(c, "blk.%u.attn_k_norm.weight", l));
        }
        L->is_moe = hp->layer_is_moe[l];
        L->kv_slot = hp->layer_attn[l] == WPI_ATTN_KDA ? n_kda++ : n_att++;
        L->kda_f_a = wmat(find(c, "blk.%u.kda_f_a.weight", l));
        L->kda_f_b = wmat(find(c, "blk.%u.kda_f_b.weight", l));
        L->kda_b = wmat(find(c, "blk.%u.kda_b.weight", l));
        L->kda_g_a = wmat(find(c, "blk.%u.kda_g_a.weight", l));
        L->kda_g_b = wmat(find(c, "blk.%u.kda_g_b.weight", l));
        L->kda_conv = vec(find(c, "blk.%u.kda_conv.weight", l));
        L->kda_dt_bias = vec(find(c, "blk.%u.kda_dt_bias", l));
        L->kda_a_log = vec(find(c, "blk.%u.kda_a_log", l));
        L->kda_o_norm = vec(find(c, "blk.%u.kda_o_norm.weight", l));
        L->hc_attn_fn = vec(find(c, "blk.%u.hc_attn.fn", l));
        L->hc_attn_base = vec(find(c, "blk.%u.hc_attn.base", l));
        L->hc_attn_scale = vec(find(c, "blk.%u.hc_attn.scale", l));
        L->hc_ffn_fn = vec(find(c, "blk.%u.hc_ffn.fn", l));
        L->hc_ffn_base = vec(find(c, "blk.%u.hc_ffn.base", l));
        L->hc_ffn_scale = vec(find(c, "blk.%u.hc_ffn.scale", l));
        L->sinks = vec(find(c, "blk.%u.attn_sinks", l));
        L->wq_a = wmat(find(c, "blk.%u.attn_q_a.weight", l));
        L->wq_b = wmat(find(c, "blk.%u.attn_q_b.weight", l));
        L->wkv_a = wmat(find(c, "blk.%u.attn_kv_a_mqa.weight", l));
        L->wkv_b = wmat(find(c, "blk.%u.attn_kv_b.weight", l));
        L->q_a_norm = vec(find(c, "blk.%u.attn_q_a_norm.weight", l));
        L->kv_a_norm = vec(find(c, "blk.%u.attn_kv_a_norm.weight", l));
        L->bq_a = vec(find(c, "blk.%u.attn_q_a.bias", l));
        L->bkv_a = vec(find(c, "blk.%u.attn_kv_a_mqa.bias", l));
        if (L->is_moe) {
            L->router = vec(find(c, "blk.%u.ffn_gate_inp.weight", l));
            L->sh_gate = wmat(find(c, "blk.%u.ffn_gate_shexp.weight", l));
            L->sh_up = wmat(find(c, "blk.%u.ffn_up_shexp.weight", l));
            L->sh_down = wmat(find(c, "blk.%u.ffn_down_shexp.weight", l));
            if (hp->shared_expert_gate)
                L->sh_gate_inp = vec(find(c, "blk.%u.ffn_gate_inp_shexp.weight", l));
            L->exp_bias = vec(find(c, "blk.%u.exp_probs_b.bias", l));
        } else {
            L->ffn_gate = wmat(find(c, "blk.%u.ffn_gate.weight", l));
            L->ffn_up = wmat(find(c, "blk.%u.ffn_up.weight", l));
            L->ffn_down = wmat(find(c, "blk.%u.ffn_down.weight", l));
            L->ffn_gate_b = vec(find(c, "blk.%u.ffn_gate.bias", l));
            L->ffn_up_b = vec(find(c, "blk.%u.ffn_up.bias", l));
            L->ffn_down_b = vec(find(c, "blk.%u.ffn_down.bias", l));
        }
    }
    if (arch && arch->bind) arch->bind(m, c, kv);
    return WP_OK;
}

/* ---- parallel matmul ------------------------------------------------------------- */

uint32_t wpi_tasks_per_thread(uint32_t n_tok)
{
    return n_tok > 1 ? WPI_TASKS_MANY : WPI_TASKS_ONE;
}

#define MAX_JOBS 4

typedef struct mm_ctx {
    const wpi_mm *jobs;
    wpi_matmul_fn fn[MAX_JOBS];
    wpi_matmul_x8_fn fn8[MAX_JOBS]; /* the 8-bit path where non-NULL */
    const wpi_xq *xq;
    size_t ldq;
    uint32_t first[MAX_JOBS + 1]; /* first task of each job */
    uint32_t blk;
    const float *x;
    size_t ldx;
    uint32_t n_tok;
} mm_ctx;

static void mm_run(const mm_ctx *c, uint32_t j, size_t r0, size_t r1)
{
    const wpi_wmat *w = c->jobs[j].w;
    if (c->fn8[j])
        c->fn8[j](w->data, w->cols, r0, r1, c->xq, c->ldq, c->n_tok, c->jobs[j].y,
                  c->jobs[j].ldy);
    else
        c->fn[j](w->data, w->cols, r0, r1, c->x, c->ldx, c->n_tok, c->jobs[j].y,
                 c->jobs[j].ldy);
}

static void mm_task(void *arg, uint32_t t)
{
    const mm_ctx *c = arg;
    uint32_t j = 0;
    while (t >= c->first[j + 1]) j++;
    const wpi_wmat *w = c->jobs[j].w;
    size_t r0 = (size_t)(t - c->first[j]) * c->blk;
    size_t r1 = r0 + c->blk < w->rows ? r0 + c->blk : w->rows;
    mm_run(c, j, r0, r1);
}

/* Quantizes x once for the jobs whose weights have an 8-bit path (none if the step is
 * not an 8-bit one, or the input is wider than the scratch copy); sets c->fn8. */
static void mm_quantize(wpi_model *m, mm_ctx *c, uint32_t n_jobs)
{
    size_t nb = 0;
    for (uint32_t j = 0; j < n_jobs; j++) {
        const wpi_wmat *w = c->jobs[j].w;
        c->fn8[j] = !wpi_x8_has(m->x8, w->dtype) || w->cols % WPI_QK
                        ? NULL : wpi_kernels_matmul_x8(m->k, w->dtype);
        if (c->fn8[j] && w->cols / WPI_QK > nb)
            nb = w->cols / WPI_QK;
    }
    if (nb == 0)
        return;
    if ((uint64_t)nb * c->n_tok > m->xq_blocks) {
        for (uint32_t j = 0; j < n_jobs; j++)
            c->fn8[j] = NULL;
        return;
    }
    wpi_quant_rows(m, c->x, c->ldx, c->n_tok, nb * WPI_QK, m->xq, nb);
    c->xq = m->xq;
    c->ldq = nb;
}

/* The jobs of c (inputs and kernels set) over row blocks across the pool. */
static void mm_dispatch(wpi_model *m, mm_ctx *c, const wpi_mm *jobs, uint32_t n_jobs)
{
    uint64_t rows = 0, work = 0;
    uint32_t nt = wpi_pool_threads(m->pool);
    for (uint32_t j = 0; j < n_jobs; j++) {
        rows += jobs[j].w->rows;
        work += (uint64_t)jobs[j].w->rows * jobs[j].w->cols * c->n_tok;
    }
    if (nt <= 1 || work < WPI_PAR_MIN_WORK) {
        for (uint32_t j = 0; j < n_jobs; j++)
            mm_run(c, j, 0, jobs[j].w->rows);
        return;
    }
    uint64_t target = (uint64_t)nt * wpi_tasks_per_thread(c->n_tok);
    uint64_t blk = (rows + target - 1) / target;
    blk = (blk + WPI_ROW_BLOCK - 1) / WPI_ROW_BLOCK * WPI_ROW_BLOCK;
    c->blk = (uint32_t)blk;
    c->first[0] = 0;
    for (uint32_t j = 0; j < n_jobs; j++)
        c->first[j + 1] = c->first[j] + (uint32_t)((jobs[j].w->rows + blk - 1) / blk);
    wpi_parallel_for(m->pool, c->first[n_jobs], mm_task, c);
}

void wpi_matmul(wpi_model *m, const wpi_mm *jobs, uint32_t n_jobs,
                const float *x, size_t ldx, uint32_t n_tok)
{
    mm_ctx c;
    c.jobs = jobs;
    c.x = x;
    c.ldx = ldx;
    c.n_tok = n_tok;
    for (uint32_t j = 0; j < n_jobs; j++)
        c.fn[j] = wpi_kernels_matmul(m->k, jobs[j].w->dtype);
    mm_quantize(m, &c, n_jobs);
    mm_dispatch(m, &c, jobs, n_jobs);
}

void wpi_matmul_xq(wpi_model *m, const wpi_mm *jobs, uint32_t n_jobs, const wpi_xq *xq,
                   size_t ldq, uint32_t n_tok)
{
    mm_ctx c;
    c.jobs = jobs;
    c.x = NULL;
    c.ldx = 0;
    c.xq = xq;
    c.ldq = ldq;
    c.n_tok = n_tok;
    for (uint32_t j = 0; j < n_jobs; j++) {
        c.fn[j] = wpi_kernels_matmul(m->k, jobs[j].w->dtype);
        c.fn8[j] = wpi_kernels_matmul_x8(m->k, jobs[j].w->dtype);
    }
    mm_dispatch(m, &c, jobs, n_jobs);
}

/* ---- per-row work in parallel ---------------------------------------------------- */

/* Below this many elements (rows times row width) rows run on the calling thread. */
#define WPI_ROWS_MIN_WORK (1u << 14)

typedef struct rows_ctx {
    wpi_rows_fn fn;
    void *arg;
    uint32_t n, per;
} rows_ctx;

static void rows_task(void *arg, uint32_t task)
{
    const rows_ctx *c = arg;
    const uint32_t r0 = task * c->per, r1 = r0 + c->per < c->n ? r0 + c->per : c->n;
    c->fn(c->arg, r0, r1);
}

void wpi_parallel_rows(wpi_model *m, uint32_t n, size_t width, wpi_rows_fn fn, void *arg)
{
    const uint32_t nt = wpi_pool_threads(m->pool);
    if (nt < 2 || n < 2 || (uint64_t)n * width < WPI_ROWS_MIN_WORK) {
        fn(arg, 0, n);
        return;
    }
    /* rows cost alike: a few tasks per thread even out a preempted one */
    const uint32_t tasks = 2 * nt < n ? 2 * nt : n;
    rows_ctx c = {fn, arg, n, (n + tasks - 1) / tasks};
    wpi_parallel_for(m->pool, (n + c.per - 1) / c.per, rows_task, &c);
}

typedef struct quant_ctx {
    const float *x;
    size_t ldx, cols;
    wpi_xq *xq;
    size_t ldq;
} quant_ctx;

static void quant_rows_task(void *arg, uint32_t r0, uint32_t r1)
{
    const quant_ctx *c = arg;
    for (uint32_t t = r0; t < r1; t++)
        wpi_quant_x8(c->x + t * c->ldx, c->cols, c->xq + t * c->ldq);
}

void wpi_quant_rows(wpi_model *m, const float *x, size_t ldx, uint32_t n, size_t cols,
                    wpi_xq *xq, size_t ldq)
{
    quant_ctx c = {x, ldx, cols, xq, ldq};
    wpi_parallel_rows(m, n, cols, quant_rows_task, &c);
}

typedef struct norm_ctx {
    float *y;
    const float *x, *w;
    size_t n, ld;
    float eps;
} norm_ctx;

static void norm_rows_task(void *arg, uint32_t r0, uint32_t r1)
{
    const norm_ctx *c = arg;
    for (uint32_t t = r0; t < r1; t++)
        wpi_rmsnorm(c->y + t * c->ld, c->x + t * c->ld, c->w, c->n, c->eps);
}

void wpi_rmsnorm_rows(wpi_model *m, float *y, const float *x, const float *w, size_t n,
                      uint32_t rows, float eps)
{
    norm_ctx c = {y, x, w, n, n, eps};
    wpi_parallel_rows(m, rows, n, norm_rows_task, &c);
}

/* ---- the forward walk ------------------------------------------------------------ */

/* The input row of one token: its embedding, or for a placeholder token the next queued
 * row (the caller checked that enough are queued). */
static void embed_row(wpi_model *m, int32_t tok, size_t row_bytes, float *out)
{
    const size_t H = m->hp->hidden_size;
    if (tok == m->embed_token && m->embed_next) {
        memcpy(out, m->embed_next, H * sizeof(float));
        m->embed_next += H;
        return;
    }
    wpi_dequant_row(m->tok_embd.dtype, (const char *)m->tok_embd.data + (size_t)tok * row_bytes,
                    out, H);
}

wp_status wpi_model_forward(wpi_model *m, const wpi_arch *arch, const int32_t *tokens,
                            uint32_t n, uint32_t pos, float *logits, int all_logits)
{
    const wpi_hparams *hp = m->hp;
    const size_t H = hp->hidden_size;
    size_t row_bytes = wpi_row_bytes(m->tok_embd.dtype, H);
    m->tokens = tokens;
    m->x8 = n <= m->x8_max_tok ? m->x8_dtypes : 0;
    for (uint32_t t = 0; t < n; t++)
        embed_row(m, tokens[t], row_bytes, m->x + t * H);
    wpi_rope_prepare(m, n, pos);
    wp_status st = WP_OK;
    for (uint32_t l = 0; l < hp->n_layers && st == WP_OK; l++)
        st = arch->layer_forward(m, l, n, pos);
    m->trace_cursor += n; /* routing replay: this sequence's next trace token */
    if (st != WP_OK || !logits) return st;
    uint32_t t0 = all_logits ? 0 : n - 1;
    for (uint32_t t = t0; t < n; t++)
        wpi_rmsnorm(m->xn + t * H, m->x + t * H, m->out_norm, H, hp->rms_norm_eps);
    wpi_mm job = {m->lm_head, logits, hp->vocab_size};
    wpi_matmul(m, &job, 1, m->xn + t0 * H, H, n - t0);
    return WP_OK;
}

/* Last rows of the sequences with want[i] (their rows one after another from row 0 of
 * x): final norm into xn, then one pass of the LM head over all of them. */
static void batch_logits(wpi_model *b, const uint32_t *n, uint32_t n_seqs, float *logits,
                         const uint8_t *want)
{
    const wpi_hparams *hp = b->hp;
    const size_t H = hp->hidden_size;
    uint32_t row = 0, j = 0;
    for (uint32_t i = 0; i < n_seqs; i++) {
        row += n[i];
        if (want[i])
            wpi_rmsnorm(b->xn + (size_t)j++ * H, b->x + (size_t)(row - 1) * H, b->out_norm, H,
                        hp->rms_norm_eps);
    }
    if (!j) return;
    wpi_mm job = {b->lm_head, logits, hp->vocab_size};
    wpi_matmul(b, &job, 1, b->xn, H, j);
}

/* The per-row buffers a sequence's mixer reads and writes: its slice of base's, from
 * row r (r = 0 and m == base: the scratch's own). */
static void slice_rows(wpi_model *m, const wpi_model *b, uint32_t r)
{
    const wpi_hparams *hp = b->hp;
    const size_t H = hp->hidden_size, QD = (size_t)hp->n_heads * hp->head_dim;
    const size_t AD = (size_t)hp->n_heads * umax(hp->head_dim, hp->v_head_dim);
    const size_t NH = hp->n_heads, R = hp->kv_lora_rank, half = hp->rope_dim / 2;
    const size_t KVR = R ? R + hp->rope_dim : 2 * (size_t)hp->n_kv_heads * hp->head_dim;
    m->x = b->x + r * H;
    m->xn = b->xn + r * H;
    m->q = b->q + r * QD;
    m->att = b->att + r * AD;
    m->kv_rows = b->kv_rows + r * KVR;
    m->rope_cos = b->rope_cos + r * half;
    m->rope_sin = b->rope_sin + r * half;
    m->mla_q = b->mla_q + (R ? r * NH * (R + hp->rope_dim) : 0);
    m->mla_o = b->mla_o + r * NH * R;
    m->kda_buf = b->kda_buf + r * wpi_kda_scratch_floats(hp, 1);
}

wp_status wpi_model_forward_batch(wpi_model *b, const wpi_arch *arch, wpi_model *const *ms,
                                  const int32_t *const *tok, const uint32_t *n,
                                  const uint32_t *pos, uint32_t n_seqs, float *logits,
                                  const uint8_t *want)
{
    const wpi_hparams *hp = b->hp;
    const size_t H = hp->hidden_size;
    const size_t row_bytes = wpi_row_bytes(b->tok_embd.dtype, H);
    uint32_t rows = 0;
    /* Each sequence's rows and rope tables are its slice of the shared ones. */
    for (uint32_t i = 0; i < n_seqs; i++) {
        wpi_model *m = ms[i];
        slice_rows(m, b, rows);
        m->tokens = tok[i];
        for (uint32_t t = 0; t < n[i]; t++) embed_row(m, tok[i][t], row_bytes, m->x + t * H);
        wpi_rope_prepare(m, n[i], pos[i]);
        if (b->trace_rows) /* routing replay: each row at its own sequence's cursor */
            for (uint32_t t = 0; t < n[i]; t++)
                b->trace_rows[rows + t] = m->trace_cursor + t;
        rows += n[i];
    }
    b->tokens = NULL;
    /* One precision for the step: its rows over all the sequences decide. */
    b->x8 = rows <= b->x8_max_tok ? b->x8_dtypes : 0;
    for (uint32_t i = 0; i < n_seqs; i++) ms[i]->x8 = b->x8;
    b->la_rows = rows; /* a decode step (one row per sequence) looks ahead for each */
    for (uint32_t i = 0; i < n_seqs; i++)
        if (n[i] != 1) b->la_rows = 0;
    wp_status st = WP_OK;
    /* base's rope tables hold every row's own position: the sequences' slices */
    for (uint32_t l = 0; l < hp->n_layers && st == WP_OK; l++) {
        if (arch->mix_in) arch->mix_in(b, l, rows);
        if (arch->mixer_seqs)
            arch->mixer_seqs(ms, l, n, pos, n_seqs);
        else
            for (uint32_t i = 0; i < n_seqs; i++) arch->mixer(ms[i], l, n[i], pos[i]);
        if (arch->mix_out) arch->mix_out(b, l, rows);
        st = arch->ffn(b, l, rows);
    }
    for (uint32_t i = 0; i < n_seqs; i++) {
        slice_rows(ms[i], b, 0);
        ms[i]->trace_cursor += n[i];
    }
    if (st == WP_OK && logits) batch_logits(b, n, n_seqs, logits, want);
    return st;
}

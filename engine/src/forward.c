/*
 * forward.c -- the model-level forward pass shared by every architecture.
 *
 * Owns: the KV and scratch sizes (also used by plan.c), binding trunk tensors to a
 * wpi_model, the walk embedding -> arch layer_forward per layer -> final norm -> LM head,
 * the row-parallel matmul used by every block, and the tensor checks arch files call.
 * Refuses: anything architecture-specific (arch/) and any expert I/O (experts/).
 */
#include <stdio.h>
#include <string.h>

#include "arch.h"

#define ALIGN 64
/* Below this many multiply-adds a matmul runs on the calling thread: a dispatch costs a
 * few microseconds, about what one core needs for this much work. */
#define WPI_PAR_MIN_WORK (1u << 16)
#define WPI_ROW_BLOCK 16 /* row blocks are multiples of this: results never depend on threads */

static uint32_t umax(uint32_t a, uint32_t b) { return a > b ? a : b; }

void wpi_state_bytes(const wpi_hparams *hp, uint32_t ctx, uint64_t out[WP_STATE_KINDS])
{
    const uint64_t F = sizeof(float);
    memset(out, 0, WP_STATE_KINDS * sizeof out[0]);
    if (hp->v4_state) { /* deepseek_v4: per layer a window ring, then its compressor state */
        const uint64_t win = (uint64_t)hp->sliding_window * hp->head_dim;
        for (uint32_t l = 0; l < hp->n_layers; l++) {
            const uint64_t rest = wpi_v4_layer_state_floats(hp, l, ctx) - win;
            out[WP_STATE_WINDOW] += win * F;
            out[hp->layer_compress[l] == WPI_CMP_CSA   ? WP_STATE_CSA
                : hp->layer_compress[l] == WPI_CMP_HCA ? WP_STATE_HCA
                                                       : WP_STATE_WINDOW] += rest * F;
        }
        return;
    }
    if (hp->kv_lora_rank) { /* MLA latent rows; KDA layers a fixed recurrent state (kda.c);
                             * glm5_next's indexer layers a row per position (dsa.c) */
        const uint64_t kda = wpi_kda_layers(hp);
        out[WP_STATE_MLA_LATENT] = (hp->n_layers - kda) * ctx *
                                   (uint64_t)(hp->kv_lora_rank + hp->rope_dim) * F;
        out[WP_STATE_RECURRENT] = kda * wpi_kda_state_floats(hp) * F;
        out[WP_STATE_INDEXER] = (uint64_t)wpi_dsa_layers(hp) * ctx * wpi_dsa_row_floats(hp) * F;
        return;
    }
    out[WP_STATE_KV] = 2ull * hp->n_layers * ctx * hp->n_kv_heads * hp->head_dim * F;
}

uint64_t wpi_kv_bytes(const wpi_hparams *hp, uint32_t ctx)
{
    uint64_t by_kind[WP_STATE_KINDS], sum = 0;
    wpi_state_bytes(hp, ctx, by_kind);
    for (int k = 0; k < WP_STATE_KINDS; k++) sum += by_kind[k];
    return sum;
}

/* Walks the scratch layout: with base == NULL only measures. Returns total bytes. */
static uint64_t layout(const wpi_hparams *hp, uint32_t chunk, wpi_model *m, char *base)
{
    uint64_t off = 0;
    const uint64_t C = chunk, H = hp->hidden_size, E = hp->n_experts, K = hp->top_k;
    const uint64_t QD = (uint64_t)hp->n_heads * hp->head_dim;
    /* MLA writes v_head_dim floats per head into att, which may exceed head_dim */
    const uint64_t AD = (uint64_t)hp->n_heads * umax(hp->head_dim, hp->v_head_dim);
    const uint64_t FF = umax(hp->intermediate_size,
                             umax(hp->moe_intermediate_size,
                                  hp->shared_expert_intermediate_size));
#define CARVE(field, type, count)                                   \
    do {                                                            \
        if (base) m->field = (type *)(void *)(base + off);          \
        off += ((uint64_t)(count) * sizeof(type) + ALIGN - 1) / ALIGN * ALIGN; \
    } while (0)
    CARVE(layers, wpi_layer, hp->n_layers);
    CARVE(x, float, C * H);
    CARVE(xn, float, C * H);
    CARVE(q, float, C * QD);
    CARVE(att, float, C * AD);
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
    CARVE(mla_qa, float, C * hp->q_lora_rank);
    CARVE(mla_q, float, hp->kv_lora_rank ? C * hp->n_heads * (hp->kv_lora_rank + hp->rope_dim) : 0);
    CARVE(mla_o, float, C * hp->n_heads * hp->kv_lora_rank);
    CARVE(kda_buf, float, wpi_kda_scratch_floats(hp, chunk));
    CARVE(v4_buf, float, wpi_v4_scratch_floats(hp, chunk));
    /* glm5_next: hyper-connection streams and weights, the DSA indexer's chunk buffers
     * (deepseek_v4 keeps its own in v4_buf) */
    const uint64_t HC = hp->v4_state ? 0 : hp->hc_mult;
    const wpi_hc_dims hd = {hp->hc_mult, hp->hidden_size, hp->hc_sinkhorn_iters, 0, 0};
    const uint64_t NI = hp->index_kpool ? hp->index_heads : 0;
    const uint64_t SEL = hp->index_kpool ? hp->index_topk / hp->index_kpool : 0;
    CARVE(hc_x, float, C * HC * H);
    CARVE(hc_post, float, C * HC);
    CARVE(hc_comb, float, C * HC * HC);
    CARVE(hc_scr, float, HC ? wpi_hc_scratch_floats(&hd, chunk) : 0);
    CARVE(idx_q, float, C * NI * hp->index_head_dim);
    CARVE(idx_wt, float, C * NI);
    CARVE(idx_sel, int32_t, C * SEL);
    CARVE(idx_nsel, int32_t, SEL ? C : 0);
#undef CARVE
    return off;
}

uint64_t wpi_scratch_bytes(const wpi_hparams *hp, uint32_t chunk, uint32_t ctx)
{
    (void)ctx; /* attention streams keys in fixed blocks: no ctx-sized buffer */
    return layout(hp, chunk ? chunk : 1, NULL, NULL);
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

wp_status wpi_model_init(wpi_model *m, const wpi_container *c, void *kv, void *scratch,
                         uint32_t ctx, uint32_t chunk)
{
    const wpi_hparams *hp = &c->hp;
    m->hp = hp;
    m->ctx = ctx;
    m->chunk = chunk;
    layout(hp, chunk, m, scratch);
    size_t half = (size_t)hp->n_layers * ctx * hp->n_kv_heads * hp->head_dim;
    m->kcache = kv;
    m->vcache = (float *)kv + half;
    if (hp->kv_lora_rank) m->vcache = NULL; /* MLA: kcache holds the latent rows */
    if (hp->kv_lora_rank) /* then the KDA layers' recurrent states */
        m->kda_state = (float *)kv + (size_t)(hp->n_layers - wpi_kda_layers(hp)) * ctx *
                                         (hp->kv_lora_rank + hp->rope_dim);
    if (hp->kv_lora_rank) /* then the indexer rows (dsa.c) */
        m->idx_cache = m->kda_state + (size_t)wpi_kda_layers(hp) * wpi_kda_state_floats(hp);
    uint32_t n_att = 0, n_kda = 0, n_idx = 0;
    size_t v4_off = 0;
    m->rope_freqs_c = vec(wpi_container_tensor(c, "rope_freqs_compress"));
    m->hc_head_fn = vec(wpi_container_tensor(c, "hc_head.fn"));
    m->hc_head_base = vec(wpi_container_tensor(c, "hc_head.base"));
    m->hc_head_scale = vec(wpi_container_tensor(c, "hc_head.scale"));
    m->tok_embd = wmat(wpi_container_tensor(c, "token_embd.weight"));
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
        if (hp->layer_attn[l] == WPI_ATTN_KDA) {
            L->kda_f_a = wmat(find(c, "blk.%u.kda_f_a.weight", l));
            L->kda_f_b = wmat(find(c, "blk.%u.kda_f_b.weight", l));
            L->kda_b = wmat(find(c, "blk.%u.kda_b.weight", l));
            L->kda_g_a = wmat(find(c, "blk.%u.kda_g_a.weight", l));
            L->kda_g_b = wmat(find(c, "blk.%u.kda_g_b.weight", l));
            L->kda_conv = vec(find(c, "blk.%u.kda_conv.weight", l));
            L->kda_dt_bias = vec(find(c, "blk.%u.kda_dt_bias", l));
            L->kda_a_log = vec(find(c, "blk.%u.kda_a_log", l));
            L->kda_o_norm = vec(find(c, "blk.%u.kda_o_norm.weight", l));
        }
        L->hc_attn_fn = vec(find(c, "blk.%u.hc_attn.fn", l));
        L->hc_attn_base = vec(find(c, "blk.%u.hc_attn.base", l));
        L->hc_attn_scale = vec(find(c, "blk.%u.hc_attn.scale", l));
        L->hc_ffn_fn = vec(find(c, "blk.%u.hc_ffn.fn", l));
        L->hc_ffn_base = vec(find(c, "blk.%u.hc_ffn.base", l));
        L->hc_ffn_scale = vec(find(c, "blk.%u.hc_ffn.scale", l));
        if (hp->layer_index[l] == WPI_INDEX_FULL && hp->layer_attn[l] != WPI_ATTN_KDA) {
            L->idx_slot = n_idx++;
            L->idx_q = wmat(find(c, "blk.%u.attn_idx_q.weight", l));
            L->idx_k = wmat(find(c, "blk.%u.attn_idx_k.weight", l));
            L->idx_gate = wmat(find(c, "blk.%u.attn_idx_gate.weight", l));
            L->idx_w = wmat(find(c, "blk.%u.attn_idx_w.weight", l));
            L->idx_k_norm = vec(find(c, "blk.%u.attn_idx_k_norm.weight", l));
            L->idx_k_norm_b = vec(find(c, "blk.%u.attn_idx_k_norm.bias", l));
            L->idx_ape = vec(find(c, "blk.%u.attn_idx_ape", l));
        }
        L->sinks = vec(find(c, "blk.%u.attn_sinks", l));
        L->wq_a = wmat(find(c, "blk.%u.attn_q_a.weight", l));
        L->wq_b = wmat(find(c, "blk.%u.attn_q_b.weight", l));
        L->wkv_a = wmat(find(c, "blk.%u.attn_kv_a_mqa.weight", l));
        L->wkv_b = wmat(find(c, "blk.%u.attn_kv_b.weight", l));
        L->q_a_norm = vec(find(c, "blk.%u.attn_q_a_norm.weight", l));
        L->kv_a_norm = vec(find(c, "blk.%u.attn_kv_a_norm.weight", l));
        L->bq_a = vec(find(c, "blk.%u.attn_q_a.bias", l));
        L->bkv_a = vec(find(c, "blk.%u.attn_kv_a_mqa.bias", l));
        if (hp->v4_state) {
            L->wkv = wmat(find(c, "blk.%u.attn_kv.weight", l));
            L->kv_norm = vec(find(c, "blk.%u.attn_kv_norm.weight", l));
            L->wo_a = wmat(find(c, "blk.%u.attn_output_a.weight", l));
            L->wo_b = wmat(find(c, "blk.%u.attn_output_b.weight", l));
            L->cmp_kv = wmat(find(c, "blk.%u.attn_cmp_kv.weight", l));
            L->cmp_gate = wmat(find(c, "blk.%u.attn_cmp_gate.weight", l));
            L->cmp_bias = vec(find(c, "blk.%u.attn_cmp_bias", l));
            L->cmp_norm = vec(find(c, "blk.%u.attn_cmp_norm.weight", l));
            L->idx_kv = wmat(find(c, "blk.%u.attn_idx_kv.weight", l));
            L->idx_gate = wmat(find(c, "blk.%u.attn_idx_gate.weight", l));
            L->idx_q = wmat(find(c, "blk.%u.attn_idx_q.weight", l));
            L->idx_w = wmat(find(c, "blk.%u.attn_idx_w.weight", l));
            L->idx_bias = vec(find(c, "blk.%u.attn_idx_bias", l));
            L->idx_norm = vec(find(c, "blk.%u.attn_idx_norm.weight", l));
            L->hash_ids = hp->layer_hash[l] ? vec(find(c, "blk.%u.ffn_hash_ids", l)) : NULL;
            L->cstate = (float *)kv + v4_off;
            v4_off += wpi_v4_layer_state_floats(hp, l, ctx);
        }
        if (L->is_moe) {
            L->router_b = vec(find(c, "blk.%u.ffn_gate_inp.bias", l));
            L->exp_gate_b = vec(find(c, "blk.%u.ffn_gate_exps.bias", l));
            L->exp_up_b = vec(find(c, "blk.%u.ffn_up_exps.bias", l));
            L->exp_down_b = vec(find(c, "blk.%u.ffn_down_exps.bias", l));
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
    return WP_OK;
}

/* ---- parallel matmul ------------------------------------------------------------- */

#define MAX_JOBS 4

typedef struct mm_ctx {
    const wpi_mm *jobs;
    wpi_matmul_fn fn[MAX_JOBS];
    uint32_t first[MAX_JOBS + 1]; /* first task of each job */
    uint32_t blk;
    const float *x;
    size_t ldx;
    uint32_t n_tok;
} mm_ctx;

static void mm_task(void *arg, uint32_t t)
{
    const mm_ctx *c = arg;
    uint32_t j = 0;
    while (t >= c->first[j + 1]) j++;
    const wpi_wmat *w = c->jobs[j].w;
    size_t r0 = (size_t)(t - c->first[j]) * c->blk;
    size_t r1 = r0 + c->blk < w->rows ? r0 + c->blk : w->rows;
    c->fn[j](w->data, w->cols, r0, r1, c->x, c->ldx, c->n_tok, c->jobs[j].y, c->jobs[j].ldy);
}

void wpi_matmul(wpi_model *m, const wpi_mm *jobs, uint32_t n_jobs,
                const float *x, size_t ldx, uint32_t n_tok)
{
    mm_ctx c;
    uint64_t rows = 0, work = 0;
    uint32_t nt = wpi_pool_threads(m->pool);
    c.jobs = jobs;
    c.x = x;
    c.ldx = ldx;
    c.n_tok = n_tok;
    for (uint32_t j = 0; j < n_jobs; j++) {
        c.fn[j] = wpi_kernels_matmul(m->k, jobs[j].w->dtype);
        rows += jobs[j].w->rows;
        work += (uint64_t)jobs[j].w->rows * jobs[j].w->cols * n_tok;
    }
    if (nt <= 1 || work < WPI_PAR_MIN_WORK) {
        for (uint32_t j = 0; j < n_jobs; j++)
            c.fn[j](jobs[j].w->data, jobs[j].w->cols, 0, jobs[j].w->rows, x, ldx, n_tok,
                    jobs[j].y, jobs[j].ldy);
        return;
    }
    /* About four tasks per thread so that the dynamic claim balances uneven progress. */
    uint64_t target = (uint64_t)nt * 4;
    uint64_t blk = (rows + target - 1) / target;
    blk = (blk + WPI_ROW_BLOCK - 1) / WPI_ROW_BLOCK * WPI_ROW_BLOCK;
    c.blk = (uint32_t)blk;
    c.first[0] = 0;
    for (uint32_t j = 0; j < n_jobs; j++)
        c.first[j + 1] = c.first[j] + (uint32_t)((jobs[j].w->rows + blk - 1) / blk);
    wpi_parallel_for(m->pool, c.first[n_jobs], mm_task, &c);
}

/* ---- the forward walk ------------------------------------------------------------ */

wp_status wpi_model_forward(wpi_model *m, const wpi_arch *arch, const int32_t *tokens,
                            uint32_t n, uint32_t pos, float *logits, int all_logits)
{
    const wpi_hparams *hp = m->hp;
    const size_t H = hp->hidden_size;
    size_t row_bytes = wpi_row_bytes(m->tok_embd.dtype, H);
    m->tokens = tokens;
    for (uint32_t t = 0; t < n; t++)
        wpi_dequant_row(m->tok_embd.dtype,
                        (const char *)m->tok_embd.data + (size_t)tokens[t] * row_bytes,
                        m->x + t * H, H);
    wpi_rope_prepare(m, n, pos);
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        wp_status st = arch->layer_forward(m, l, n, pos);
        if (st != WP_OK) return st;
    }
    if (!logits) return WP_OK;
    uint32_t t0 = all_logits ? 0 : n - 1;
    for (uint32_t t = t0; t < n; t++)
        wpi_rmsnorm(m->xn + t * H, m->x + t * H, m->out_norm, H, hp->rms_norm_eps);
    wpi_mm job = {m->lm_head, logits, hp->vocab_size};
    wpi_matmul(m, &job, 1, m->xn + t0 * H, H, n - t0);
    return WP_OK;
}

/* ---- checks ---------------------------------------------------------------------- */

wp_status wpi_need_matrix(const wpi_container *c, const char *name, uint64_t rows,
                          uint64_t cols, char *err, size_t cap)
{
    const wpi_tensor *t = wpi_container_tensor(c, name);
    if (!t)
        return wpi_fail(err, cap, WP_E_FORMAT, "manifest.json: tensor '%s' is missing", name);
    if (t->n_dims != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "manifest.json: tensor '%s' has shape [%llu, %llu], hparams give "
                        "[%llu, %llu]", name,
                        (unsigned long long)t->shape[0], (unsigned long long)t->shape[1],
                        (unsigned long long)rows, (unsigned long long)cols);
    if (!wpi_dtype_valid(t->dtype) || wpi_row_bytes(t->dtype, cols) == 0)
        return wpi_fail(err, cap, WP_E_UNSUPPORTED, "tensor '%s' has unsupported dtype %d",
                        name, t->dtype);
    if (t->bytes != rows * wpi_row_bytes(t->dtype, cols))
        return wpi_fail(err, cap, WP_E_FORMAT, "tensor '%s' has %llu bytes for its shape",
                        name, (unsigned long long)t->bytes);
    return WP_OK;
}

wp_status wpi_opt_vector(const wpi_container *c, const char *name, uint64_t n,
                         char *err, size_t cap)
{
    const wpi_tensor *t = wpi_container_tensor(c, name);
    if (!t) return WP_OK;
    if (t->shape[0] * t->shape[1] != n || (t->n_dims == 2 && t->shape[0] != 1))
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "manifest.json: tensor '%s' has %llu elements, hparams give %llu", name,
                        (unsigned long long)(t->shape[0] * t->shape[1]),
                        (unsigned long long)n);
    if (t->dtype != WPI_F32)
        return wpi_fail(err, cap, WP_E_UNSUPPORTED, "tensor '%s' must be f32, not %s", name,
                        wpi_dtype_name(t->dtype));
    if (t->bytes != n * sizeof(float))
        return wpi_fail(err, cap, WP_E_FORMAT, "tensor '%s' has %llu bytes for its shape",
                        name, (unsigned long long)t->bytes);
    return WP_OK;
}

wp_status wpi_need_vector(const wpi_container *c, const char *name, uint64_t n,
                          char *err, size_t cap)
{
    if (!wpi_container_tensor(c, name))
        return wpi_fail(err, cap, WP_E_FORMAT, "manifest.json: tensor '%s' is missing", name);
    return wpi_opt_vector(c, name, n, err, cap);
}

static wp_status need_f32_matrix(const wpi_container *c, const char *name, uint64_t rows,
                                 uint64_t cols, char *err, size_t cap)
{
    wp_status st = wpi_need_matrix(c, name, rows, cols, err, cap);
    if (st != WP_OK) return st;
    if (wpi_container_tensor(c, name)->dtype != WPI_F32)
        return wpi_fail(err, cap, WP_E_UNSUPPORTED, "tensor '%s' must be f32", name);
    return WP_OK;
}

wp_status wpi_check_expert_bank(const wpi_container *c, uint32_t l, char *err, size_t cap)
{
    const wpi_hparams *hp = &c->hp;
    int32_t b = c->bank_of_layer[l];
    if (b < 0 || (uint32_t)b >= c->n_banks)
        return wpi_fail(err, cap, WP_E_FORMAT, "layer %u is MoE but has no expert bank", l);
    const wpi_bank *bk = &c->banks[b];
    if (bk->n_experts != hp->n_experts || bk->inter != hp->moe_intermediate_size ||
        bk->hidden != hp->hidden_size)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "manifest.json: expert bank of layer %u is %u x [%u, %u], hparams "
                        "give %u x [%u, %u]", l,
                        bk->n_experts, bk->inter, bk->hidden, hp->n_experts,
                        hp->moe_intermediate_size, hp->hidden_size);
    if (!wpi_dtype_valid(bk->dtype) || wpi_row_bytes(bk->dtype, bk->hidden) == 0 ||
        wpi_row_bytes(bk->dtype, bk->inter) == 0)
        return wpi_fail(err, cap, WP_E_UNSUPPORTED,
                        "expert bank of layer %u has unsupported dtype %d", l, bk->dtype);
    return WP_OK;
}

wp_status wpi_check_decoder(const wpi_container *c, char *err, size_t cap)
{
    const wpi_hparams *hp = &c->hp;
    const uint64_t H = hp->hidden_size, V = hp->vocab_size;
    const uint64_t QD = (uint64_t)hp->n_heads * hp->head_dim;
    const uint64_t KD = (uint64_t)hp->n_kv_heads * hp->head_dim;
    char n[96];
    TRY(wpi_hparams_check(hp, err, cap));
    TRY(wpi_need_matrix(c, "token_embd.weight", V, H, err, cap));
    TRY(wpi_need_vector(c, "output_norm.weight", H, err, cap));
    if (!hp->tie_word_embeddings) TRY(wpi_need_matrix(c, "output.weight", V, H, err, cap));
    if (hp->rope_dim > 0) TRY(wpi_need_vector(c, "rope_freqs", hp->rope_dim / 2, err, cap));
    for (uint32_t l = 0; l < hp->n_layers; l++) {
#define NAME(s) (snprintf(n, sizeof n, "blk.%u." s, l), n)
        TRY(wpi_need_vector(c, NAME("attn_norm.weight"), H, err, cap));
        TRY(wpi_need_vector(c, NAME("ffn_norm.weight"), H, err, cap));
        /* MLA layers (kv_lora_rank > 0) have no q/k/v: their arch checks them. */
        if (!hp->kv_lora_rank) {
            TRY(wpi_need_matrix(c, NAME("attn_q.weight"), QD, H, err, cap));
            TRY(wpi_need_matrix(c, NAME("attn_k.weight"), KD, H, err, cap));
            TRY(wpi_need_matrix(c, NAME("attn_v.weight"), KD, H, err, cap));
            TRY(wpi_need_matrix(c, NAME("attn_output.weight"), H, QD, err, cap));
            TRY(wpi_opt_vector(c, NAME("attn_q.bias"), QD, err, cap));
            TRY(wpi_opt_vector(c, NAME("attn_k.bias"), KD, err, cap));
            TRY(wpi_opt_vector(c, NAME("attn_v.bias"), KD, err, cap));
            TRY(wpi_opt_vector(c, NAME("attn_output.bias"), H, err, cap));
            if (hp->qk_norm != WPI_QK_NONE) {
                int full = hp->qk_norm == WPI_QK_FULL;
                TRY(wpi_need_vector(c, NAME("attn_q_norm.weight"), full ? QD : hp->head_dim,
                                    err, cap));
                TRY(wpi_need_vector(c, NAME("attn_k_norm.weight"), full ? KD : hp->head_dim,
                                    err, cap));
            }
        }
        if (!hp->layer_is_moe[l]) {
            uint64_t I = hp->intermediate_size;
            if (I == 0)
                return wpi_fail(err, cap, WP_E_FORMAT,
                                "layer %u is dense but intermediate_size is 0", l);
            TRY(wpi_need_matrix(c, NAME("ffn_gate.weight"), I, H, err, cap));
            TRY(wpi_need_matrix(c, NAME("ffn_up.weight"), I, H, err, cap));
            TRY(wpi_need_matrix(c, NAME("ffn_down.weight"), H, I, err, cap));
            TRY(wpi_opt_vector(c, NAME("ffn_gate.bias"), I, err, cap));
            TRY(wpi_opt_vector(c, NAME("ffn_up.bias"), I, err, cap));
            TRY(wpi_opt_vector(c, NAME("ffn_down.bias"), H, err, cap));
            continue;
        }
        TRY(need_f32_matrix(c, NAME("ffn_gate_inp.weight"), hp->n_experts, H, err, cap));
        TRY(wpi_check_expert_bank(c, l, err, cap));
        uint64_t S = hp->shared_expert_intermediate_size;
        if (S > 0) {
            TRY(wpi_need_matrix(c, NAME("ffn_gate_shexp.weight"), S, H, err, cap));
            TRY(wpi_need_matrix(c, NAME("ffn_up_shexp.weight"), S, H, err, cap));
            TRY(wpi_need_matrix(c, NAME("ffn_down_shexp.weight"), H, S, err, cap));
            if (hp->shared_expert_gate)
                TRY(wpi_need_vector(c, NAME("ffn_gate_inp_shexp.weight"), H, err, cap));
        }
#undef NAME
    }
    return WP_OK;
}

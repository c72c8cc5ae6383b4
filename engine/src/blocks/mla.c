/*
 * mla.c -- multi-head latent attention (DeepSeek-V2/V3, Kimi-K2) over a latent KV cache.
 *
 * One block: h = x + o(attn(rmsnorm(x))) over a chunk of tokens.
 *   q      = q_b(rmsnorm(q_a x)) per head [nope | rope]   (or q = wq x without q_lora)
 *   latent = kv_a x = [c (kv_lora_rank) | k_rope (rope_dim)], c = rmsnorm(c), k_rope
 *            rotated, written to the cache row of its position (the only KV state)
 * In three parts, so that a batched step runs the stateless two over every sequence's
 * rows at once: the projection (norms, q and the latent rows into kv_rows, RoPE, the
 * absorbed query); per sequence, its latent rows into its cache and the attention over
 * it; the output (W_uv, the gate, the output projection into the residual stream).
 *   kv_b   = [n_heads * (nope + v), kv_lora_rank]: per head, nope rows W_uk then v rows W_uv
 * Absorbed form, the same for prefill and decode (exact up to f32 reassociation):
 *   score(t, h, j) = (W_uk_h^T q_nope + q_rope) . [c_j | k_rope_j] * attn_scale
 *   out(t, h)      = W_uv_h (sum_j softmax_j c_j)
 * so no per-head key or value is ever expanded. The q/kv lora norms use eps 1e-6 (the
 * reference RMSNorm default) unless hparams give lora_norm_eps (glm5_next: rms_norm_eps).
 * RoPE: HF rotate_half pairing, or GPT-J pairs (2i, 2i+1) when rope_interleave; k is
 * rotated before it enters the cache, and cos/sin carry rope_attn_factor as in
 * attention.c. Sparse (glm5_next's DSA layers): a token attends only to the key pools its
 * indexer selected and its own incomplete pool (arch/glm5_next.c). An output gate (kimi_k3's
 * attn_gate, bound by its arch) multiplies the heads' output by sigmoid(gate x_normed)
 * before the output projection. Each (token, head) attention task
 * streams keys in fixed blocks with a running maximum, so thread count never changes
 * a result.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "blocks.h"

#define KEY_BLOCK 256
#define LORA_EPS 1e-6f
#define MAX_RANK WPI_MAX_LORA_RANK /* a row buffer on the task's stack */
#define MAX_RANGES (WPI_MLA_MAX_POOLS + 1) /* selected pools + the incomplete pool */

void wpi_rope_apply_interleaved(float *v, uint32_t n_heads, uint32_t head_dim,
                                uint32_t rope_dim, const float *cos_, const float *sin_)
{
    const uint32_t half = rope_dim / 2;
    for (uint32_t h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * head_dim;
        for (uint32_t i = 0; i < half; i++) {
            float a = x[2 * i], b = x[2 * i + 1];
            x[2 * i] = a * cos_[i] - b * sin_[i];
            x[2 * i + 1] = b * cos_[i] + a * sin_[i];
        }
    }
}

static void rope(const wpi_hparams *hp, float *v, uint32_t n_heads, uint32_t stride,
                 const float *c, const float *s)
{
    if (hp->rope_interleave)
        wpi_rope_apply_interleaved(v, n_heads, stride, hp->rope_dim, c, s);
    else
        wpi_rope_apply(v, n_heads, stride, hp->rope_dim, c, s);
}

static void add(float *y, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] += b[i];
}

typedef struct mla_ctx {
    wpi_model *m;
    const wpi_layer *L;
    const float *cache;  /* this layer's latent rows, row 0 */
    uint32_t n, pos;
    wpi_matmul_fn fn;    /* kv_b matmul */
    const wpi_mla_pools *pools; /* selected key pools, or NULL: every key */
} mla_ctx;

/* Task h: the absorbed query of head h for all n tokens. */
static void absorb_task(void *arg, uint32_t h)
{
    const mla_ctx *a = arg;
    const wpi_model *m = a->m;
    const wpi_hparams *hp = m->hp;
    const uint32_t R = hp->kv_lora_rank, RD = hp->rope_dim, NP = hp->qk_nope_head_dim;
    const size_t qd = (size_t)hp->n_heads * hp->head_dim, ld = (size_t)hp->n_heads * (R + RD);
    const wpi_wmat *kvb = &a->L->wkv_b;
    const size_t rb = wpi_row_bytes(kvb->dtype, R);
    const char *rows = (const char *)kvb->data + (size_t)h * (NP + hp->v_head_dim) * rb;
    float row[MAX_RANK];
    for (uint32_t t = 0; t < a->n; t++) {
        float *qa = m->mla_q + t * ld + (size_t)h * (R + RD);
        const float *q = m->q + t * qd + (size_t)h * hp->head_dim;
        memset(qa, 0, R * sizeof(float));
        memcpy(qa + R, q + NP, RD * sizeof(float));
    }
    for (uint32_t i = 0; i < NP; i++) {
        wpi_dequant_row(kvb->dtype, rows + (size_t)i * rb, row, R);
        for (uint32_t t = 0; t < a->n; t++) {
            float qi = m->q[t * qd + (size_t)h * hp->head_dim + i];
            m->k->axpy_f32(qi, row, m->mla_q + t * ld + (size_t)h * (R + RD), R);
        }
    }
}

/* The keys token t attends, as ranges [r0, r1) in ascending order: all of 0..pos+t, or
 * (sparse) its selected pools and then its incomplete pool (arch/glm5_next.c). */
static uint32_t key_ranges(const mla_ctx *a, uint32_t t, uint32_t *r0, uint32_t *r1)
{
    const wpi_mla_pools *ps = a->pools;
    const uint32_t npos = a->pos + t + 1;
    if (!ps) {
        r0[0] = 0;
        r1[0] = npos;
        return 1;
    }
    const uint32_t P = ps->pool;
    const int32_t *sel = ps->sel + (size_t)t * ps->per;
    uint32_t nr = 0, ns = (uint32_t)ps->nsel[t];
    for (uint32_t i = 0; i < ns; i++) {
        r0[nr] = (uint32_t)sel[i] * P;
        r1[nr++] = (uint32_t)sel[i] * P + P;
    }
    const uint32_t tail = npos / P * P;
    if (ps->tail && tail < npos) {
        r0[nr] = tail;
        r1[nr++] = npos;
    }
    return nr;
}

/* Task (t, h): softmax over the keys of token t of the latent output. */
static void attn_task(void *arg, uint32_t task)
{
    const mla_ctx *a = arg;
    const wpi_model *m = a->m;
    const wpi_hparams *hp = m->hp;
    const uint32_t H = hp->n_heads, t = task / H, h = task % H;
    const uint32_t R = hp->kv_lora_rank, W = R + hp->rope_dim;
    const float *q = m->mla_q + ((size_t)t * H + h) * W;
    float *out = m->mla_o + ((size_t)t * H + h) * R;
    const float scale = hp->attn_scale;
    float s[KEY_BLOCK];
    float mx = -INFINITY, sum = 0;
    uint32_t rs[MAX_RANGES], re[MAX_RANGES];
    const uint32_t nr = key_ranges(a, t, rs, re);
    memset(out, 0, R * sizeof(float));
    for (uint32_t r = 0; r < nr; r++)
    for (uint32_t j0 = rs[r]; j0 < re[r]; j0 += KEY_BLOCK) {
        uint32_t nb = re[r] - j0 < KEY_BLOCK ? re[r] - j0 : KEY_BLOCK;
        float bmax = -INFINITY;
        for (uint32_t j = 0; j < nb; j++) {
            s[j] = m->k->dot_f32(q, a->cache + (size_t)(j0 + j) * W, W) * scale;
            if (s[j] > bmax) bmax = s[j];
        }
        if (bmax > mx) {
            if (mx != -INFINITY) {
                float r = expf(mx - bmax);
                sum *= r;
                for (uint32_t i = 0; i < R; i++) out[i] *= r;
            }
            mx = bmax;
        }
        for (uint32_t j = 0; j < nb; j++) {
            float p = expf(s[j] - mx);
            sum += p;
            m->k->axpy_f32(p, a->cache + (size_t)(j0 + j) * W, out, R);
        }
    }
    const float inv = sum > 0 ? 1.0f / sum : 0.0f;
    for (uint32_t i = 0; i < R; i++) out[i] *= inv;
}

/* Task h: att[t, h*v..] = W_uv_h mla_o[t, h] for all n tokens. */
static void up_task(void *arg, uint32_t h)
{
    const mla_ctx *a = arg;
    const wpi_model *m = a->m;
    const wpi_hparams *hp = m->hp;
    const uint32_t R = hp->kv_lora_rank, NP = hp->qk_nope_head_dim, V = hp->v_head_dim;
    const size_t rb = wpi_row_bytes(a->L->wkv_b.dtype, R);
    const char *w = (const char *)a->L->wkv_b.data + ((size_t)h * (NP + V) + NP) * rb;
    a->fn(w, R, 0, V, m->mla_o + (size_t)h * R, (size_t)hp->n_heads * R, a->n,
          m->att + (size_t)h * V, (size_t)hp->n_heads * V);
}

static void run(wpi_model *m, uint32_t tasks, uint64_t work, wpi_task_fn fn, void *arg)
{
    if (work < (1u << 15) || wpi_pool_threads(m->pool) <= 1) {
        for (uint32_t i = 0; i < tasks; i++) fn(arg, i);
    } else {
        wpi_parallel_for(m->pool, tasks, fn, arg);
    }
}

void wpi_mla_project(wpi_model *m, uint32_t l, uint32_t n)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    const size_t H = hp->hidden_size, NH = hp->n_heads;
    const uint32_t R = hp->kv_lora_rank, RD = hp->rope_dim, QL = hp->q_lora_rank;
    const size_t W = (size_t)R + RD, qd = NH * hp->head_dim;
    float *lat = m->kv_rows; /* the latent rows, stored per sequence by wpi_mla_attend */
    const uint32_t half = RD / 2;
    const float eps = hp->lora_norm_eps > 0 ? hp->lora_norm_eps : LORA_EPS;

    for (uint32_t t = 0; t < n; t++)
        wpi_rmsnorm(m->xn + t * H, m->x + t * H, L->attn_norm, H, hp->rms_norm_eps);
    if (QL) {
        wpi_mm a[2] = {{&L->wq_a, m->mla_qa, QL}, {&L->wkv_a, lat, W}};
        wpi_matmul(m, a, 2, m->xn, H, n);
        for (uint32_t t = 0; t < n; t++) {
            float *qa = m->mla_qa + (size_t)t * QL;
            if (L->bq_a) add(qa, L->bq_a, QL);
            wpi_rmsnorm(qa, qa, L->q_a_norm, QL, eps);
        }
        wpi_mm b = {&L->wq_b, m->q, qd};
        wpi_matmul(m, &b, 1, m->mla_qa, QL, n);
    } else {
        wpi_mm a[2] = {{&L->wq, m->q, qd}, {&L->wkv_a, lat, W}};
        wpi_matmul(m, a, 2, m->xn, H, n);
    }
    for (uint32_t t = 0; t < n; t++) {
        float *c = lat + t * W;
        if (L->bkv_a) add(c, L->bkv_a, W);
        wpi_rmsnorm(c, c, L->kv_a_norm, R, eps);
        if (half) { /* each row at its own position */
            const float *cs = m->rope_cos + t * half, *sn = m->rope_sin + t * half;
            rope(hp, c + R, 1, (uint32_t)W, cs, sn);
            rope(hp, m->q + t * qd + hp->qk_nope_head_dim, hp->n_heads, hp->head_dim, cs, sn);
        }
    }
    mla_ctx a = {m, L, NULL, n, 0, NULL, NULL};
    run(m, hp->n_heads, (uint64_t)n * NH * hp->qk_nope_head_dim * R, absorb_task, &a);
}

void wpi_mla_attend(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos,
                    const wpi_mla_pools *pools)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    const size_t NH = hp->n_heads;
    const uint32_t R = hp->kv_lora_rank, RD = hp->rope_dim;
    const size_t W = (size_t)R + RD;
    /* kv_slot: the layer's block of latent rows (kimi_linear's KDA layers have none) */
    float *cache = m->kcache + (size_t)L->kv_slot * m->ctx * W;
    memcpy(cache + (size_t)pos * W, m->kv_rows, (size_t)n * W * sizeof(float));
    mla_ctx a = {m, L, cache, n, pos, NULL, pools};
    run(m, n * hp->n_heads, (uint64_t)n * NH * (pos + n) * (W + R), attn_task, &a);
}

void wpi_mla_output(wpi_model *m, uint32_t l, uint32_t n)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    const size_t H = hp->hidden_size, NH = hp->n_heads;
    const uint32_t R = hp->kv_lora_rank;
    const size_t od = NH * hp->v_head_dim;
    mla_ctx a = {m, L, NULL, n, 0, wpi_kernels_matmul(m->k, L->wkv_b.dtype), NULL};
    run(m, hp->n_heads, (uint64_t)n * NH * hp->v_head_dim * R, up_task, &a);
    if (L->attn_gate.data) { /* out *= sigmoid(gate xn), xn still the normed input; q is free */
        wpi_mm g = {&L->attn_gate, m->q, od};
        wpi_matmul(m, &g, 1, m->xn, H, n);
        for (size_t i = 0; i < (size_t)n * od; i++) m->att[i] *= 1.0f / (1.0f + expf(-m->q[i]));
    }

    wpi_mm o = {&L->wo, m->xn, H};
    wpi_matmul(m, &o, 1, m->att, od, n);
    for (uint32_t t = 0; t < n; t++) {
        if (L->bo) add(m->xn + t * H, L->bo, H);
        add(m->x + t * H, m->xn + t * H, H);
    }
}

void wpi_mla_block(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    wpi_mla_project(m, l, n);
    wpi_mla_attend(m, l, n, pos, NULL);
    wpi_mla_output(m, l, n);
}

/* The decoders whose layers are MLA or KDA by hparams.layer_attn: each part of the
 * layer's kind. */
void wpi_mla_kda_project(wpi_model *m, uint32_t l, uint32_t n)
{
    if (m->hp->layer_attn[l] == WPI_ATTN_KDA)
        wpi_kda_project(m, l, n);
    else
        wpi_mla_project(m, l, n);
}

void wpi_mla_kda_attend(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    if (m->hp->layer_attn[l] == WPI_ATTN_KDA)
        wpi_kda_attend(m, l, n, pos);
    else
        wpi_mla_attend(m, l, n, pos, NULL);
}

void wpi_mla_kda_output(wpi_model *m, uint32_t l, uint32_t n)
{
    if (m->hp->layer_attn[l] == WPI_ATTN_KDA)
        wpi_kda_output(m, l, n);
    else
        wpi_mla_output(m, l, n);
}

/* ---- buffers and state --------------------------------------------------------------- */

void wpi_mla_scratch(const wpi_hparams *hp, uint32_t chunk, wpi_model *m, wpi_carve *cv)
{
    const uint64_t C = chunk, NH = hp->n_heads, R = hp->kv_lora_rank;
    WPI_CARVE(cv, m, mla_qa, float, C * hp->q_lora_rank);
    WPI_CARVE(cv, m, mla_q, float, R ? C * NH * (R + hp->rope_dim) : 0);
    WPI_CARVE(cv, m, mla_o, float, C * NH * R);
}

void wpi_mla_state_bytes(const wpi_hparams *hp, uint32_t ctx, uint64_t out[WP_STATE_KINDS])
{
    const uint64_t F = sizeof(float), kda = wpi_kda_layers(hp);
    out[WP_STATE_MLA_LATENT] = (hp->n_layers - kda) * ctx *
                               (uint64_t)(hp->kv_lora_rank + hp->rope_dim) * F;
    out[WP_STATE_RECURRENT] = kda * wpi_kda_state_floats(hp) * F;
}

void wpi_mla_bind(wpi_model *m, const wpi_container *c, void *kv)
{
    const wpi_hparams *hp = m->hp;
    m->kcache = kv; /* the latent rows */
    m->vcache = NULL;
    m->kda_state = (float *)kv + (size_t)(hp->n_layers - wpi_kda_layers(hp)) * m->ctx *
                                     (hp->kv_lora_rank + hp->rope_dim);
}

size_t wpi_mla_state_part(const wpi_model *m, uint32_t l, int v, uint32_t pos, float **at)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    if (hp->layer_attn[l] == WPI_ATTN_KDA) {
        *at = m->kda_state + (size_t)L->kv_slot * wpi_kda_state_floats(hp);
        return v ? 0 : wpi_kda_state_floats(hp) * sizeof(float);
    }
    const size_t row = (size_t)hp->kv_lora_rank + hp->rope_dim;
    *at = m->kcache + (size_t)L->kv_slot * m->ctx * row;
    return v ? 0 : row * sizeof(float) * pos;
}

wp_status wpi_mla_check_layer(const wpi_container *c, uint32_t l, char *err, size_t cap)
{
    const wpi_hparams *hp = &c->hp;
    const uint64_t H = hp->hidden_size, NH = hp->n_heads, R = hp->kv_lora_rank;
    const uint64_t QL = hp->q_lora_rank, QD = NH * hp->head_dim;
    char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%u." s, l), n)
    if (QL) {
        TRY(wpi_need_matrix(c, NAME("attn_q_a.weight"), QL, H, err, cap));
        TRY(wpi_opt_vector(c, NAME("attn_q_a.bias"), QL, err, cap));
        TRY(wpi_need_vector(c, NAME("attn_q_a_norm.weight"), QL, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_q_b.weight"), QD, QL, err, cap));
    } else {
        TRY(wpi_need_matrix(c, NAME("attn_q.weight"), QD, H, err, cap));
    }
    TRY(wpi_need_matrix(c, NAME("attn_kv_a_mqa.weight"), R + hp->rope_dim, H, err, cap));
    TRY(wpi_opt_vector(c, NAME("attn_kv_a_mqa.bias"), R + hp->rope_dim, err, cap));
    TRY(wpi_need_vector(c, NAME("attn_kv_a_norm.weight"), R, err, cap));
    TRY(wpi_need_matrix(c, NAME("attn_kv_b.weight"),
                        NH * (hp->qk_nope_head_dim + hp->v_head_dim), R, err, cap));
    TRY(wpi_need_matrix(c, NAME("attn_output.weight"), H, NH * hp->v_head_dim, err, cap));
    TRY(wpi_opt_vector(c, NAME("attn_output.bias"), H, err, cap));
#undef NAME
    return WP_OK;
}

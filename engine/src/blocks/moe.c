/*
 * moe.c -- routed mixture-of-experts: router, top-k, expert application, shared expert.
 *
 * Flow over a chunk of tokens: softmax over all experts (f32), top-k with ties to the
 * lower id, optional renormalization (sigmoid scores, a selection bias, expert groups or
 * a routed scaling factor select through route_noaux.c instead); then the chunk's
 * distinct experts are requested
 * from the cache in groups of at most wpi_experts_max_pinned, each applied once to every
 * token that chose it. Each (token, choice) output is kept apart and summed per token in
 * router order at the end, so results do not depend on arrival order or cache state.
 * Decode only (one token, or one per sequence of a batched step): the next MoE layer's
 * router runs on this layer's output and its top-k is prefetched (timing only; the real
 * router still decides). With 2 threads or more a group's experts share parallel
 * sections: a decoded token's in two (apply_group_decode), a chunk's in two per batch of
 * experts whose picks fit a chunk of rows (apply_group_chunk).
 */
#include <math.h>
#include <string.h>

#include "blocks.h"
#include "route_trace.h"

void wpi_topk(const float *p, uint32_t n, uint32_t k, int32_t *ids, float *w)
{
    uint32_t filled = 0;
    for (uint32_t e = 0; e < n; e++) {
        if (filled == k && !(p[e] > w[k - 1])) continue;
        /* Insert after every weight >= p[e]: an equal weight keeps its lower id first. */
        uint32_t i = filled < k ? filled : k - 1;
        while (i > 0 && w[i - 1] < p[e]) {
            w[i] = w[i - 1];
            ids[i] = ids[i - 1];
            i--;
        }
        w[i] = p[e];
        ids[i] = (int32_t)e;
        if (filled < k) filled++;
    }
}

/* Router probabilities of n tokens (rows of xs, ldx apart) into probs [n, n_experts]. */
static void route(wpi_model *m, const float *router, const float *xs, size_t ldx, uint32_t n,
                  float *probs)
{
    const wpi_hparams *hp = m->hp;
    wpi_wmat r = {router, WPI_F32, hp->n_experts, hp->hidden_size};
    wpi_mm job = {&r, probs, hp->n_experts};
    wpi_matmul(m, &job, 1, xs, ldx, n);
    if (hp->scoring == WPI_SCORE_SIGMOID) {
        for (size_t i = 0; i < (size_t)n * hp->n_experts; i++)
            probs[i] = 1.0f / (1.0f + expf(-probs[i]));
        return;
    }
    for (uint32_t t = 0; t < n; t++) wpi_softmax(probs + (size_t)t * hp->n_experts, hp->n_experts);
}

static void select_topk(const wpi_hparams *hp, const float *probs, int32_t *ids, float *w)
{
    wpi_topk(probs, hp->n_experts, hp->top_k, ids, w);
    if (hp->norm_topk_prob) {
        float s = 0;
        for (uint32_t j = 0; j < hp->top_k; j++) s += w[j];
        for (uint32_t j = 0; j < hp->top_k; j++) w[j] /= s;
    }
}

/* Routing replay: the trace's experts, weighted by the router's scores for them (then
 * normalized and scaled as the router's own choice would be). */
static void traced_topk(wpi_model *m, uint32_t l, uint32_t n, int noaux)
{
    const wpi_hparams *hp = m->hp;
    const size_t K = hp->top_k, E = hp->n_experts;
    for (uint32_t t = 0; t < n; t++) {
        int32_t *ids = m->topk_id + t * K;
        float *w = m->topk_w + t * K, s = 0;
        wpi_route_trace_ids(m, l, t, ids);
        for (size_t j = 0; j < K; j++) s += (w[j] = m->probs[t * E + (size_t)ids[j]]);
        for (size_t j = 0; j < K; j++) {
            if (hp->norm_topk_prob) w[j] /= s + 1e-20f;
            if (noaux) w[j] *= hp->routed_scaling_factor;
        }
    }
}

/* Each of the n decode rows' likely experts of layer l + 1 (the cache skips the ones
 * already resident or on their way); a replayed trace names them exactly. */
static void lookahead(wpi_model *m, uint32_t l, uint32_t n)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *N = &m->layers[l + 1];
    const size_t H = hp->hidden_size;
    for (uint32_t t = 0; t < n; t++) {
        if (m->trace) {
            wpi_route_trace_ids(m, l + 1, t, m->la_ids);
        } else {
            wpi_rmsnorm(m->xg, m->x + t * H, N->ffn_norm, H, hp->rms_norm_eps);
            route(m, N->router, m->xg, H, 1, m->la_probs);
            if (wpi_route_noaux_used(hp, N))
                wpi_route_noaux(hp, m->la_probs, N->exp_bias, m->route_tmp, m->la_ids,
                                m->la_w);
            else
                wpi_topk(m->la_probs, hp->n_experts, hp->top_k, m->la_ids, m->la_w);
        }
        wpi_experts_prefetch(m->experts, l + 1, m->la_ids, hp->top_k);
    }
}

/* Applies expert `id` to the tokens of its picks [p0, p1), outputs into eo. */
static void apply_expert(wpi_model *m, const wpi_expert_view *v, int32_t p0, int32_t p1)
{
    const size_t H = m->hp->hidden_size, K = m->hp->top_k;
    wpi_wmat gate = {v->gate, v->dtype, v->inter, v->hidden};
    wpi_wmat up = {v->up, v->dtype, v->inter, v->hidden};
    wpi_wmat down = {v->down, v->dtype, v->hidden, v->inter};
    const uint32_t cnt = (uint32_t)(p1 - p0);
    if (cnt == 1) {
        int32_t pick = m->ex_pick[p0];
        wpi_swiglu(m, &gate, &up, &down, m->xn + (size_t)(pick / K) * H, H, 1,
                   m->eo + (size_t)pick * H, H);
        return;
    }
    for (uint32_t i = 0; i < cnt; i++)
        memcpy(m->xg + i * H, m->xn + (size_t)(m->ex_pick[p0 + i] / K) * H, H * sizeof(float));
    wpi_swiglu(m, &gate, &up, &down, m->xg, H, cnt, m->yg, H);
    for (uint32_t i = 0; i < cnt; i++)
        memcpy(m->eo + (size_t)m->ex_pick[p0 + i] * H, m->yg + i * H, H * sizeof(float));
}

/*
 * Decode (one token, so one pick per expert): all experts of a group in two parallel
 * sections, gate/up (+ silu * up) over row blocks of every expert, then down over row
 * blocks of every expert, instead of two sections per expert. On 2 cores a fork-join
 * costs about what a 16-row block of a small expert does, so 2*top_k sections per layer
 * were a large share of a token (ENGINE_LESSONS section 8). Every row is computed by
 * the same kernel call on the same inputs as apply_expert's, so results are identical
 * and do not depend on the thread count. On the 8-bit path (an 8-bit step,
 * quantized experts, widths a multiple of 32) the token is quantized once for every
 * expert's gate and up, and each gate/up task quantizes the 32-row blocks of silu(g) * u
 * it produced, so down reads 8-bit inputs with no serial step between the sections
 * (the same blocks wpi_swiglu's down would quantize).
 */
#define GROUP_MAX 64

/* Rows per task when `rows` rows (over all the experts of a section) are split into about
 * `target` tasks, rounded up to whole blocks of rb rows. */
static uint32_t task_rows(uint64_t rows, uint64_t target, uint64_t rb)
{
    const uint64_t blk = (rows + target - 1) / target;
    return (uint32_t)((blk + rb - 1) / rb * rb);
}

typedef struct group_ctx {
    wpi_model *m;
    const wpi_expert_view *v; /* [cnt] */
    const float *x;           /* the token's normed hidden state */
    float *g, *u;             /* [cnt, inter] */
    float *out[GROUP_MAX];    /* each expert's output row (H floats) */
    wpi_matmul_fn fn;
    wpi_matmul_x8_fn fn8;     /* the 8-bit path where non-NULL */
    const wpi_xq *xq;         /* x quantized (H / 32 blocks) */
    wpi_xq *gq;               /* [cnt, inter / 32] silu(g) * u quantized */
    uint32_t blk, tasks_gu, tasks_down; /* tasks per expert */
    float lim;                /* wpi_swiglu_clamp */
} group_ctx;

static void group_gu_task(void *arg, uint32_t t)
{
    const group_ctx *c = arg;
    const uint32_t e = t / c->tasks_gu, I = c->v[e].inter, H = c->v[e].hidden;
    size_t r0 = (size_t)(t % c->tasks_gu) * c->blk, r1 = r0 + c->blk < I ? r0 + c->blk : I;
    if (c->fn8) { /* r0 and r1 are whole 32-row blocks here */
        const wpi_wmat gate = {c->v[e].gate, c->v[e].dtype, I, H};
        const wpi_wmat up = {c->v[e].up, c->v[e].dtype, I, H};
        const wpi_gu8 f = {c->m->hp, c->fn8, c->fn8, &gate, &up, NULL, NULL, c->lim,
                           c->xq, H / WPI_QK, 1, c->gq + (size_t)e * I / WPI_QK};
        wpi_gu_fused(&f, r0, r1);
        return;
    }
    float *g = c->g + (size_t)e * I, *u = c->u + (size_t)e * I;
    c->fn(c->v[e].gate, H, r0, r1, c->x, H, 1, g, I);
    c->fn(c->v[e].up, H, r0, r1, c->x, H, 1, u, I);
    wpi_glu_rows(c->m->hp, c->lim, NULL, NULL, r0, r1 - r0, 1, g + r0, u + r0, I);
}

static void group_down_task(void *arg, uint32_t t)
{
    const group_ctx *c = arg;
    const uint32_t e = t / c->tasks_down, I = c->v[e].inter, H = c->v[e].hidden;
    size_t r0 = (size_t)(t % c->tasks_down) * c->blk, r1 = r0 + c->blk < H ? r0 + c->blk : H;
    if (c->fn8)
        c->fn8(c->v[e].down, I, r0, r1, c->gq + (size_t)e * I / WPI_QK, I / WPI_QK, 1,
               c->out[e], H);
    else
        c->fn(c->v[e].down, I, r0, r1, c->g + (size_t)e * I, I, 1, c->out[e], H);
}

/* Whether apply_group_decode can take this group: one token, views of one dtype and
 * shape, and room for cnt * inter floats in ff_g / ff_u. */
static int group_decode_ok(const wpi_model *m, const wpi_expert_view *v, uint32_t cnt)
{
    const wpi_hparams *hp = m->hp;
    uint32_t ff = hp->intermediate_size;
    if (hp->moe_intermediate_size > ff) ff = hp->moe_intermediate_size;
    if (hp->shared_expert_intermediate_size > ff) ff = hp->shared_expert_intermediate_size;
    if (cnt < 2 || cnt > GROUP_MAX || wpi_pool_threads(m->pool) < 2) return 0;
    if ((uint64_t)cnt * v[0].inter > (uint64_t)m->chunk * ff) return 0;
    for (uint32_t s = 1; s < cnt; s++)
        if (v[s].dtype != v[0].dtype || v[s].inter != v[0].inter ||
            v[s].hidden != v[0].hidden)
            return 0;
    return wpi_kernels_matmul(m->k, v[0].dtype) != NULL;
}

static void apply_group_decode(wpi_model *m, const wpi_expert_view *v, uint32_t s0,
                               uint32_t cnt)
{
    const size_t H = m->hp->hidden_size;
    const uint32_t I = v[0].inter, nt = wpi_pool_threads(m->pool);
    group_ctx c = {m, v, m->xn, m->ff_g, m->ff_u, {0}, wpi_kernels_matmul(m->k, v[0].dtype),
                   NULL, NULL, NULL, 0, 0, 0, wpi_swiglu_clamp(m->hp)};
    for (uint32_t s = 0; s < cnt; s++)
        c.out[s] = m->eo + (size_t)m->ex_pick[m->ex_start[s0 + s]] * H;
    /* The 8-bit path: x's blocks first in xq, then each expert's silu(g) * u blocks. */
    if (wpi_x8_has(m->x8, v[0].dtype) && H % WPI_QK == 0 && I % WPI_QK == 0 &&
        (uint64_t)(H + (size_t)cnt * I) / WPI_QK <= m->xq_blocks &&
        (c.fn8 = wpi_kernels_matmul_x8(m->k, v[0].dtype)) != NULL) {
        wpi_quant_x8(m->xn, H, m->xq);
        c.xq = m->xq;
        c.gq = m->xq + H / WPI_QK;
    }
    /* About four tasks per thread over all rows, in whole 16-row blocks (32 on the
     * 8-bit path, so each gate/up task quantizes whole blocks of its rows). */
    const uint64_t rb = c.fn8 ? WPI_QK : 16;
    uint64_t target = (uint64_t)nt * 4;
    c.blk = task_rows((uint64_t)cnt * I, target, rb);
    c.tasks_gu = (I + c.blk - 1) / c.blk;
    wpi_parallel_for(m->pool, cnt * c.tasks_gu, group_gu_task, &c);
    c.blk = task_rows((uint64_t)cnt * H, target, 16);
    c.tasks_down = (uint32_t)((H + c.blk - 1) / c.blk);
    wpi_parallel_for(m->pool, cnt * c.tasks_down, group_down_task, &c);
}

/*
 * A chunk of several tokens: consecutive experts of a group whose picks fit the gather
 * buffers (at most a chunk of rows) run as one batch in two parallel sections, gate/up
 * over (expert, row block) tasks and then down, instead of two sections per expert.
 * Each expert's rows go through the same kernel calls on the same gathered inputs as
 * apply_expert's (its picks in order, n_tok = its pick count), so results are identical.
 */
typedef struct batch_ctx {
    wpi_model *m;
    const wpi_expert_view *v; /* [cnt] */
    uint32_t row0[GROUP_MAX + 1]; /* expert e's gathered rows are [row0[e], row0[e + 1]) */
    wpi_matmul_fn fn;
    wpi_matmul_x8_fn fn8;     /* the 8-bit path where non-NULL */
    wpi_xq *xq, *gq;          /* the gathered rows and silu(g) * u, quantized */
    uint32_t blk, tasks_gu, tasks_down;
    float lim;
} batch_ctx;

static void batch_gu_task(void *arg, uint32_t t)
{
    const batch_ctx *c = arg;
    wpi_model *m = c->m;
    const uint32_t e = t / c->tasks_gu, I = c->v[e].inter, H = c->v[e].hidden;
    const uint32_t q0 = c->row0[e], nq = c->row0[e + 1] - q0;
    size_t r0 = (size_t)(t % c->tasks_gu) * c->blk, r1 = r0 + c->blk < I ? r0 + c->blk : I;
    if (c->fn8) { /* r0 and r1 are whole 32-row blocks here */
        const wpi_wmat gate = {c->v[e].gate, c->v[e].dtype, I, H};
        const wpi_wmat up = {c->v[e].up, c->v[e].dtype, I, H};
        const wpi_gu8 f = {m->hp, c->fn8, c->fn8, &gate, &up, NULL, NULL, c->lim,
                           c->xq + (size_t)q0 * (H / WPI_QK), H / WPI_QK, nq,
                           c->gq + (size_t)q0 * (I / WPI_QK)};
        wpi_gu_fused(&f, r0, r1);
        return;
    }
    float *g = m->ff_g + (size_t)q0 * I, *u = m->ff_u + (size_t)q0 * I;
    const float *x = m->xg + (size_t)q0 * H;
    c->fn(c->v[e].gate, H, r0, r1, x, H, nq, g, I);
    c->fn(c->v[e].up, H, r0, r1, x, H, nq, u, I);
    wpi_glu_rows(m->hp, c->lim, NULL, NULL, r0, r1 - r0, nq, g + r0, u + r0, I);
}

static void batch_down_task(void *arg, uint32_t t)
{
    const batch_ctx *c = arg;
    wpi_model *m = c->m;
    const uint32_t e = t / c->tasks_down, I = c->v[e].inter, H = c->v[e].hidden;
    const uint32_t q0 = c->row0[e], nq = c->row0[e + 1] - q0;
    size_t r0 = (size_t)(t % c->tasks_down) * c->blk, r1 = r0 + c->blk < H ? r0 + c->blk : H;
    if (c->fn8)
        c->fn8(c->v[e].down, I, r0, r1, c->gq + (size_t)q0 * (I / WPI_QK), I / WPI_QK, nq,
               m->yg + (size_t)q0 * H, H);
    else
        c->fn(c->v[e].down, I, r0, r1, m->ff_g + (size_t)q0 * I, I, nq,
              m->yg + (size_t)q0 * H, H);
}

typedef struct gather_ctx {
    wpi_model *m;
    const int32_t *pick; /* the batch's picks in order, one per gathered row */
    wpi_xq *xq;          /* the 8-bit path: rows quantized here, else copied into xg */
} gather_ctx;

static void gather_rows(void *arg, uint32_t r0, uint32_t r1)
{
    const gather_ctx *c = arg;
    const size_t H = c->m->hp->hidden_size, K = c->m->hp->top_k;
    for (uint32_t q = r0; q < r1; q++) {
        const float *x = c->m->xn + (size_t)(c->pick[q] / K) * H;
        if (c->xq)
            wpi_quant_x8(x, H, c->xq + (size_t)q * (H / WPI_QK));
        else
            memcpy(c->m->xg + (size_t)q * H, x, H * sizeof(float));
    }
}

/* Experts s0 .. s0 + cnt - 1 (views v, one dtype and shape), all picks within cap. */
static void apply_batch(wpi_model *m, const wpi_expert_view *v, uint32_t s0, uint32_t cnt,
                        int x8)
{
    const size_t H = m->hp->hidden_size;
    const uint32_t I = v[0].inter, nt = wpi_pool_threads(m->pool);
    batch_ctx c = {m, v, {0}, wpi_kernels_matmul(m->k, v[0].dtype),
                   x8 ? wpi_kernels_matmul_x8(m->k, v[0].dtype) : NULL, NULL, NULL, 0, 0, 0,
                   wpi_swiglu_clamp(m->hp)};
    uint32_t rows = 0;
    for (uint32_t s = 0; s < cnt; s++) {
        c.row0[s] = rows;
        rows += (uint32_t)(m->ex_start[s0 + s + 1] - m->ex_start[s0 + s]);
    }
    c.row0[cnt] = rows;
    /* the gathered rows: quantized straight from xn on the 8-bit path, else copied */
    gather_ctx gc = {m, m->ex_pick + m->ex_start[s0], NULL};
    if (c.fn8) {
        c.xq = gc.xq = m->xq;
        c.gq = m->xq + (size_t)rows * (H / WPI_QK);
    }
    wpi_parallel_rows(m, rows, H, gather_rows, &gc);
    const uint64_t rb = c.fn8 ? WPI_QK : 16, target = (uint64_t)nt * 4;
    c.blk = task_rows((uint64_t)cnt * I, target, rb);
    c.tasks_gu = (I + c.blk - 1) / c.blk;
    wpi_parallel_for(m->pool, cnt * c.tasks_gu, batch_gu_task, &c);
    c.blk = task_rows((uint64_t)cnt * H, target, 16);
    c.tasks_down = (uint32_t)((H + c.blk - 1) / c.blk);
    wpi_parallel_for(m->pool, cnt * c.tasks_down, batch_down_task, &c);
    rows = 0;
    for (uint32_t s = 0; s < cnt; s++)
        for (int32_t p = m->ex_start[s0 + s]; p < m->ex_start[s0 + s + 1]; p++, rows++)
            memcpy(m->eo + (size_t)m->ex_pick[p] * H, m->yg + (size_t)rows * H,
                   H * sizeof(float));
}

/* A group of a multi-token chunk: batches of consecutive experts through apply_batch
 * where the views allow it (one dtype and shape), one expert at a time otherwise. */
static void apply_group_chunk(wpi_model *m, const wpi_expert_view *v, uint32_t g0,
                              uint32_t cnt)
{
    const size_t H = m->hp->hidden_size;
    const uint32_t I = v[0].inter;
    int same = wpi_kernels_matmul(m->k, v[0].dtype) != NULL;
    for (uint32_t s = 1; same && s < cnt; s++)
        same = v[s].dtype == v[0].dtype && v[s].inter == I && v[s].hidden == v[0].hidden;
    const int x8 = same && wpi_x8_has(m->x8, v[0].dtype) && H % WPI_QK == 0 &&
                   I % WPI_QK == 0 && wpi_kernels_matmul_x8(m->k, v[0].dtype) != NULL;
    uint64_t cap = m->chunk; /* rows of xg, yg, ff_g and ff_u */
    if (x8 && (uint64_t)m->xq_blocks * WPI_QK / (H + I) < cap)
        cap = (uint64_t)m->xq_blocks * WPI_QK / (H + I);
    for (uint32_t s = 0; s < cnt;) {
        uint32_t e = s;
        uint64_t rows = 0;
        while (same && e < cnt) {
            const uint64_t picks = (uint64_t)(m->ex_start[g0 + e + 1] - m->ex_start[g0 + e]);
            if (rows + picks > cap) break;
            rows += picks;
            e++;
        }
        if (e - s >= 2) {
            apply_batch(m, v + s, g0 + s, e - s, x8);
            s = e;
        } else {
            apply_expert(m, &v[s], m->ex_start[g0 + s], m->ex_start[g0 + s + 1]);
            s++;
        }
    }
}

uint32_t wpi_moe_distinct_experts(wpi_model *m, uint32_t n)
{
    const size_t K = m->hp->top_k, E = m->hp->n_experts;
    uint32_t nd = 0, np = n * (uint32_t)K;
    for (size_t e = 0; e < E; e++) m->ex_slot[e] = -1;
    for (uint32_t p = 0; p < np; p++) {
        int32_t e = m->topk_id[p];
        if (m->ex_slot[e] < 0) {
            m->ex_slot[e] = (int32_t)nd;
            m->ex_ids[nd++] = e;
        }
    }
    int32_t cur = 0;
    for (uint32_t s = 0; s < nd; s++) {
        m->ex_start[s] = cur;
        for (uint32_t p = 0; p < np; p++)
            if (m->topk_id[p] == m->ex_ids[s]) m->ex_pick[cur++] = (int32_t)p;
    }
    m->ex_start[nd] = cur;
    return nd;
}

/* Expert s of the step (acquired) through fn, its picks a chunk of rows at a time. */
static wp_status run_expert(wpi_model *m, uint32_t l, const float *xs, uint32_t s,
                            wpi_expert_apply_fn fn, void *arg)
{
    const size_t H = m->hp->hidden_size, K = m->hp->top_k;
    wpi_expert_view v;
    wp_status st = wpi_experts_acquire(m->experts, l, m->ex_ids[s], &v, m->err, m->err_cap);
    if (st != WP_OK) return st;
    /* An expert has up to one pick per token and routing slot: more picks than the
     * chunk's tokens when a hash row names it twice. The gather buffers (and fn's) hold a
     * chunk's rows, so its picks go through them a chunk at a time. */
    for (int32_t q0 = m->ex_start[s]; q0 < m->ex_start[s + 1]; q0 += (int32_t)m->chunk) {
        const int32_t left = m->ex_start[s + 1] - q0;
        const uint32_t c = left < (int32_t)m->chunk ? (uint32_t)left : m->chunk;
        for (uint32_t i = 0; i < c; i++)
            memcpy(m->xg + i * H, xs + (size_t)(m->ex_pick[q0 + i] / K) * H,
                   H * sizeof(float));
        fn(arg, m, &v, m->ex_ids[s], m->xg, c, m->yg);
        for (uint32_t i = 0; i < c; i++)
            memcpy(m->eo + (size_t)m->ex_pick[q0 + i] * H, m->yg + i * H, H * sizeof(float));
    }
    return WP_OK;
}

wp_status wpi_moe_for_each_expert(wpi_model *m, uint32_t l, const float *xs, uint32_t nd,
                                  wpi_expert_apply_fn fn, void *arg)
{
    return wpi_moe_for_each_expert_requested(m, l, xs, nd, fn, arg, 0);
}

wp_status wpi_moe_request_first(wpi_model *m, uint32_t l, uint32_t nd)
{
    const uint32_t group = wpi_experts_max_pinned(m->experts);
    /* The routing is final: queued lookahead reads it did not pick give way to its misses. */
    wpi_experts_cancel_prefetch(m->experts, l, m->ex_ids, nd);
    return nd ? wpi_experts_request(m->experts, l, m->ex_ids, nd < group ? nd : group, m->err,
                                    m->err_cap)
              : WP_OK;
}

wp_status wpi_moe_for_each_expert_requested(wpi_model *m, uint32_t l, const float *xs,
                                            uint32_t nd, wpi_expert_apply_fn fn, void *arg,
                                            int first_requested)
{
    const uint32_t group = wpi_experts_max_pinned(m->experts);
    if (!first_requested && nd) {
        wp_status st = wpi_moe_request_first(m, l, nd);
        if (st != WP_OK) return st;
    }
    for (uint32_t g0 = 0; g0 < nd; g0 += group) {
        uint32_t cnt = nd - g0 < group ? nd - g0 : group;
        wp_status st = g0 == 0 ? WP_OK
                               : wpi_experts_request(m->experts, l, m->ex_ids + g0, cnt, m->err,
                                                     m->err_cap);
        if (st == WP_OK && cnt <= GROUP_MAX) {
            /* Experts whose records are present run first, while the misses are read: each
             * writes only its own rows of eo, and the weighted sum over them is taken in
             * router order afterwards, so the order changes timing, never the result. */
            uint8_t left[GROUP_MAX];
            uint32_t n_left = cnt;
            memset(left, 1, cnt);
            while (st == WP_OK && n_left) {
                uint32_t ran = 0, first = cnt;
                for (uint32_t s = 0; st == WP_OK && s < cnt; s++) {
                    if (!left[s]) continue;
                    if (!wpi_experts_ready(m->experts, l, m->ex_ids[g0 + s])) {
                        if (first == cnt) first = s;
                        continue;
                    }
                    st = run_expert(m, l, xs, g0 + s, fn, arg);
                    left[s] = 0;
                    n_left--;
                    ran++;
                }
                if (st == WP_OK && !ran && first < cnt) { /* all in flight: wait on the first */
                    st = run_expert(m, l, xs, g0 + first, fn, arg);
                    left[first] = 0;
                    n_left--;
                }
            }
        } else {
            for (uint32_t s = g0; st == WP_OK && s < g0 + cnt; s++)
                st = run_expert(m, l, xs, s, fn, arg);
        }
        wpi_experts_release(m->experts);
        if (st != WP_OK) return st;
    }
    return WP_OK;
}

typedef struct combine_ctx {
    wpi_model *m;
    int shared; /* the shared expert's output waits in yg */
} combine_ctx;

/* Tokens r0 .. r1 - 1: x += sum over its picks, in router order, of weight * output, plus
 * the gated shared expert. */
static void combine_rows(void *arg, uint32_t r0, uint32_t r1)
{
    const combine_ctx *c = arg;
    wpi_model *m = c->m;
    const size_t H = m->hp->hidden_size, K = m->hp->top_k;
    for (uint32_t t = r0; t < r1; t++) {
        float *acc = m->moe_out + t * H;
        memset(acc, 0, H * sizeof(float));
        for (size_t j = 0; j < K; j++)
            m->k->axpy_f32(m->topk_w[t * K + j], m->eo + (t * K + j) * H, acc, H);
        if (c->shared) m->k->axpy_f32(m->sh_w[t], m->yg + t * H, acc, H);
        float *x = m->x + t * H;
        for (size_t i = 0; i < H; i++) x[i] += acc[i];
    }
}

wp_status wpi_moe_block(wpi_model *m, uint32_t l, uint32_t n)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    const size_t H = hp->hidden_size, K = hp->top_k, E = hp->n_experts;

    wpi_rmsnorm_rows(m, m->xn, m->x, L->ffn_norm, H, n, hp->rms_norm_eps);
    route(m, L->router, m->xn, H, n, m->probs);
    for (uint32_t t = 0; t < n; t++)
        if (wpi_route_noaux_used(hp, L)) /* sigmoid, bias, groups, scaling */
            wpi_route_noaux(hp, m->probs + t * E, L->exp_bias, m->route_tmp,
                            m->topk_id + t * K, m->topk_w + t * K);
        else
            select_topk(hp, m->probs + t * E, m->topk_id + t * K, m->topk_w + t * K);
    if (m->trace) traced_topk(m, l, n, wpi_route_noaux_used(hp, L));

    const uint32_t nd = wpi_moe_distinct_experts(m, n);

    /* The first group's reads go out before the shared expert is computed, so the
     * disk works while the CPU does (the shared expert never waits on a read). Its
     * output waits in moe_out: apply_expert uses yg as scratch. */
    const uint32_t group = wpi_experts_max_pinned(m->experts);
    wpi_experts_cancel_prefetch(m->experts, l, m->ex_ids, nd);
    wp_status first = nd ? wpi_experts_request(m->experts, l, m->ex_ids, nd < group ? nd : group,
                                               m->err, m->err_cap)
                         : WP_OK;
    if (first != WP_OK) return first;
    int shared = L->sh_gate.data != NULL;
    if (shared) {
        wpi_swiglu(m, &L->sh_gate, &L->sh_up, &L->sh_down, m->xn, H, n, m->moe_out, H);
        for (uint32_t t = 0; t < n; t++)
            m->sh_w[t] = L->sh_gate_inp
                             ? 1.0f / (1.0f + expf(-m->k->dot_f32(L->sh_gate_inp,
                                                                   m->xn + t * H, H)))
                             : 1.0f;
    }
    for (uint32_t g0 = 0; g0 < nd; g0 += group) {
        uint32_t cnt = nd - g0 < group ? nd - g0 : group;
        wp_status st = g0 == 0 ? WP_OK
                               : wpi_experts_request(m->experts, l, m->ex_ids + g0, cnt, m->err,
                                                     m->err_cap);
        if (st == WP_OK && cnt >= 2 && cnt <= GROUP_MAX && wpi_pool_threads(m->pool) >= 2) {
            wpi_expert_view vs[GROUP_MAX];
            for (uint32_t s = 0; st == WP_OK && s < cnt; s++)
                st = wpi_experts_acquire(m->experts, l, m->ex_ids[g0 + s], &vs[s], m->err,
                                         m->err_cap);
            if (st == WP_OK && n == 1 && group_decode_ok(m, vs, cnt)) {
                apply_group_decode(m, vs, g0, cnt);
            } else if (st == WP_OK && n > 1) {
                apply_group_chunk(m, vs, g0, cnt);
            } else {
                for (uint32_t s = 0; st == WP_OK && s < cnt; s++)
                    apply_expert(m, &vs[s], m->ex_start[g0 + s], m->ex_start[g0 + s + 1]);
            }
            wpi_experts_release(m->experts);
            if (st != WP_OK) return st;
            continue;
        }
        for (uint32_t s = g0; st == WP_OK && s < g0 + cnt; s++) {
            wpi_expert_view v;
            st = wpi_experts_acquire(m->experts, l, m->ex_ids[s], &v, m->err, m->err_cap);
            if (st == WP_OK) apply_expert(m, &v, m->ex_start[s], m->ex_start[s + 1]);
        }
        wpi_experts_release(m->experts);
        if (st != WP_OK) return st;
    }

    if (shared) memcpy(m->yg, m->moe_out, (size_t)n * H * sizeof(float));
    combine_ctx cc = {m, shared};
    wpi_parallel_rows(m, n, (K + 1) * H, combine_rows, &cc);

    if (m->lookahead && (n == 1 || n == m->la_rows) && l + 1 < hp->n_layers &&
        m->layers[l + 1].is_moe)
        lookahead(m, l, n);
    return WP_OK;
}

void wpi_moe_decoder_mixer(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    /* a layer hparams.attn_kinds marks "sliding" (mixtral, qwen2_moe, qwen3_moe) sees
     * only the last sliding_window keys; no sinks there, so it is plain attention within */
    if (m->hp->layer_attn[l] == WPI_ATTN_SLIDING)
        wpi_attention_sw_attend(m, l, n, pos, m->hp->sliding_window);
    else
        wpi_attention_attend(m, l, n, pos);
}

void wpi_moe_decoder_mixer_seqs(wpi_model *const *ms, uint32_t l, const uint32_t *n,
                                const uint32_t *pos, uint32_t n_seqs)
{
    const wpi_hparams *hp = ms[0]->hp;
    if (hp->layer_attn[l] == WPI_ATTN_SLIDING)
        wpi_attention_attend_seqs(ms, l, n, pos, n_seqs, hp->sliding_window, 1);
    else
        wpi_attention_attend_seqs(ms, l, n, pos, n_seqs, 0, 0);
}

wp_status wpi_moe_decoder_ffn(wpi_model *m, uint32_t l, uint32_t n)
{
    if (!m->layers[l].is_moe) {
        wpi_ffn_block(m, l, n);
        return WP_OK;
    }
    return wpi_moe_block(m, l, n);
}

wp_status wpi_moe_decoder_layer(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    wpi_attention_project(m, l, n);
    wpi_moe_decoder_mixer(m, l, n, pos);
    wpi_attention_output(m, l, n);
    return wpi_moe_decoder_ffn(m, l, n);
}

void wpi_topk_insert(float *w, int32_t *ids, uint32_t k, uint32_t *filled, float s, int32_t id)
{
    if (*filled == k && !(s > w[k - 1])) return;
    uint32_t i = *filled < k ? *filled : k - 1;
    while (i > 0 && w[i - 1] < s) {
        w[i] = w[i - 1];
        ids[i] = ids[i - 1];
        i--;
    }
    w[i] = s;
    ids[i] = id;
    if (*filled < k) (*filled)++;
}

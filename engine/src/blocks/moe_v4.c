/*
 * moe_v4.c -- the deepseek_v4 mixture of experts on a block input x (normed):
 *   scores = sqrt(softplus(router x))                      [n_experts] (softplus(y) = y > 20)
 *   ids    = hash layer: the table hash_ids[token] (the token id picks its experts)
 *            else the top_k of scores + exp_probs_b (ties to the lower id)
 *   w      = scores[ids] / (sum + 1e-20) * routed_scaling_factor
 *   out    = sum_j w_j expert_ids[j](x) + shared(x)
 * Experts and the shared expert use the clamped SwiGLU
 *   down(silu(min(gate x, limit)) * clamp(up x, -limit, limit))   (limit = swiglu_limit).
 * Experts stream through wpi_experts_* as in moe.c (the chunk's distinct experts, each
 * read once; outputs summed per token in router order), so results never depend on the
 * cache state or the thread count. Decoding one token, the next layer's experts are
 * prefetched (timing only): a hash layer's exactly from the token id, a top-k layer's
 * as its router picks them on an approximation of its input (wpi_v4_lookahead).
 */
#include <math.h>
#include <string.h>

#include "blocks.h"

/* out = down(silu(min(g, lim)) * clamp(u, -lim, lim)) for cnt tokens (rows H apart). */
static void clamped_swiglu(wpi_model *m, const wpi_wmat *gate, const wpi_wmat *up,
                           const wpi_wmat *down, const float *xs, uint32_t cnt, float *out)
{
    const size_t H = m->hp->hidden_size, I = gate->rows;
    const float lim = m->hp->swiglu_limit;
    wpi_mm gu[2] = {{gate, m->ff_g, I}, {up, m->ff_u, I}};
    wpi_matmul(m, gu, 2, xs, H, cnt);
    for (uint32_t t = 0; t < cnt; t++) {
        float *g = m->ff_g + t * I;
        const float *u = m->ff_u + t * I;
        for (size_t r = 0; r < I; r++) {
            float a = g[r], b = u[r];
            if (lim > 0) {
                a = a > lim ? lim : a;
                b = b > lim ? lim : (b < -lim ? -lim : b);
            }
            g[r] = a / (1.0f + expf(-a)) * b;
        }
    }
    wpi_mm d = {down, out, H};
    wpi_matmul(m, &d, 1, m->ff_g, I, cnt);
}

/* wpi_expert_apply_fn over a streamed expert's record. */
static void routed_expert(void *arg, wpi_model *m, const wpi_expert_view *v, int32_t expert,
                          const float *rows, uint32_t cnt, float *out)
{
    wpi_wmat gate = {v->gate, v->dtype, v->inter, v->hidden};
    wpi_wmat up = {v->up, v->dtype, v->inter, v->hidden};
    wpi_wmat down = {v->down, v->dtype, v->hidden, v->inter};
    clamped_swiglu(m, &gate, &up, &down, rows, cnt, out);
}

static float sqrt_softplus(float y)
{
    float sp = y > 20.0f ? y : log1pf(expf(y));
    return sqrtf(sp);
}

wp_status wpi_v4_moe(wpi_model *m, uint32_t l, const float *x, uint32_t n, float *out)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    const size_t H = hp->hidden_size, K = hp->top_k, E = hp->n_experts;

    wpi_wmat r = {L->router, WPI_F32, hp->n_experts, hp->hidden_size};
    wpi_mm job = {&r, m->probs, E};
    wpi_matmul(m, &job, 1, x, H, n);
    for (uint32_t t = 0; t < n; t++) {
        float *sc = m->probs + t * E;
        for (size_t e = 0; e < E; e++) sc[e] = sqrt_softplus(sc[e]);
        int32_t *ids = m->topk_id + t * K;
        float *w = m->topk_w + t * K;
        if (L->hash_ids) {
            const float *row = L->hash_ids + (size_t)m->tokens[t] * K;
            for (size_t j = 0; j < K; j++) ids[j] = (int32_t)row[j];
        } else {
            float *ch = m->route_tmp;
            for (size_t e = 0; e < E; e++) ch[e] = sc[e] + (L->exp_bias ? L->exp_bias[e] : 0.0f);
            wpi_topk(ch, (uint32_t)E, (uint32_t)K, ids, w);
        }
        float s = 0;
        for (size_t j = 0; j < K; j++) s += (w[j] = sc[ids[j]]);
        s += 1e-20f;
        for (size_t j = 0; j < K; j++) w[j] = w[j] / s * hp->routed_scaling_factor;
    }

    const uint32_t nd = wpi_moe_distinct_experts(m, n);
    wp_status st = wpi_moe_for_each_expert(m, l, x, nd, routed_expert, NULL);
    if (st != WP_OK) return st;

    const int shared = L->sh_gate.data != NULL;
    if (shared) clamped_swiglu(m, &L->sh_gate, &L->sh_up, &L->sh_down, x, n, m->yg);
    for (uint32_t t = 0; t < n; t++) {
        float *acc = out + t * H;
        memset(acc, 0, H * sizeof(float));
        for (size_t j = 0; j < K; j++)
            m->k->axpy_f32(m->topk_w[t * K + j], m->eo + (t * K + j) * H, acc, H);
        if (shared) m->k->axpy_f32(1.0f, m->yg + t * H, acc, H);
    }
    return WP_OK;
}

void wpi_v4_lookahead(wpi_model *m, uint32_t l, const float *approx)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *N = &m->layers[l + 1];
    const size_t H = hp->hidden_size, E = hp->n_experts, K = hp->top_k;
    if (N->hash_ids) { /* the same token picks the next layer's experts: exact */
        const float *row = N->hash_ids + (size_t)m->tokens[0] * K;
        for (size_t j = 0; j < K; j++) m->la_ids[j] = (int32_t)row[j];
    } else {
        wpi_rmsnorm(m->xg, approx, N->ffn_norm, H, hp->rms_norm_eps);
        wpi_wmat r = {N->router, WPI_F32, hp->n_experts, hp->hidden_size};
        wpi_mm job = {&r, m->la_probs, E};
        wpi_matmul(m, &job, 1, m->xg, H, 1);
        for (size_t e = 0; e < E; e++)
            m->la_probs[e] = sqrt_softplus(m->la_probs[e]) + (N->exp_bias ? N->exp_bias[e] : 0.0f);
        wpi_topk(m->la_probs, (uint32_t)E, (uint32_t)K, m->la_ids, m->la_w);
    }
    wpi_experts_prefetch(m->experts, l + 1, m->la_ids, (uint32_t)K);
}

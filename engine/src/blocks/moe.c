/*
 * moe.c -- routed mixture-of-experts: router, top-k, expert application, shared expert.
 *
 * Flow over a chunk of tokens: softmax over all experts (f32), top-k with ties to the
 * lower id, optional renormalization; then the chunk's distinct experts are requested
 * from the cache in groups of at most wpi_experts_max_pinned, each applied once to every
 * token that chose it. Each (token, choice) output is kept apart and summed per token in
 * router order at the end, so results do not depend on arrival order or cache state.
 * Decode only: the next MoE layer's router runs on this layer's output and its top-k is
 * prefetched (timing only; the real router still decides).
 */
#include <math.h>
#include <string.h>

#include "internal.h"

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

static void lookahead(wpi_model *m, uint32_t l)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *N = &m->layers[l + 1];
    wpi_rmsnorm(m->xg, m->x, N->ffn_norm, hp->hidden_size, hp->rms_norm_eps);
    route(m, N->router, m->xg, hp->hidden_size, 1, m->la_probs);
    wpi_topk(m->la_probs, hp->n_experts, hp->top_k, m->la_ids, m->la_w);
    wpi_experts_prefetch(m->experts, l + 1, m->la_ids, hp->top_k);
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

wp_status wpi_moe_block(wpi_model *m, uint32_t l, uint32_t n)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    const size_t H = hp->hidden_size, K = hp->top_k, E = hp->n_experts;

    for (uint32_t t = 0; t < n; t++)
        wpi_rmsnorm(m->xn + t * H, m->x + t * H, L->ffn_norm, H, hp->rms_norm_eps);
    route(m, L->router, m->xn, H, n, m->probs);
    for (uint32_t t = 0; t < n; t++)
        select_topk(hp, m->probs + t * E, m->topk_id + t * K, m->topk_w + t * K);

    /* Distinct experts in order of first use (token-major, router order), and for each
     * the picks (token * K + slot) that chose it. */
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

    const uint32_t group = wpi_experts_max_pinned(m->experts);
    for (uint32_t g0 = 0; g0 < nd; g0 += group) {
        uint32_t cnt = nd - g0 < group ? nd - g0 : group;
        wp_status st = wpi_experts_request(m->experts, l, m->ex_ids + g0, cnt, m->err,
                                           m->err_cap);
        for (uint32_t s = g0; st == WP_OK && s < g0 + cnt; s++) {
            wpi_expert_view v;
            st = wpi_experts_acquire(m->experts, l, m->ex_ids[s], &v, m->err, m->err_cap);
            if (st == WP_OK) apply_expert(m, &v, m->ex_start[s], m->ex_start[s + 1]);
        }
        wpi_experts_release(m->experts);
        if (st != WP_OK) return st;
    }

    int shared = L->sh_gate.data != NULL;
    if (shared) {
        wpi_swiglu(m, &L->sh_gate, &L->sh_up, &L->sh_down, m->xn, H, n, m->yg, H);
        for (uint32_t t = 0; t < n; t++)
            m->sh_w[t] = L->sh_gate_inp
                             ? 1.0f / (1.0f + expf(-m->k->dot_f32(L->sh_gate_inp,
                                                                   m->xn + t * H, H)))
                             : 1.0f;
    }
    for (uint32_t t = 0; t < n; t++) {
        float *acc = m->moe_out + t * H;
        memset(acc, 0, H * sizeof(float));
        for (size_t j = 0; j < K; j++)
            m->k->axpy_f32(m->topk_w[t * K + j], m->eo + (t * K + j) * H, acc, H);
        if (shared) m->k->axpy_f32(m->sh_w[t], m->yg + t * H, acc, H);
        float *x = m->x + t * H;
        for (size_t i = 0; i < H; i++) x[i] += acc[i];
    }

    if (m->lookahead && n == 1 && l + 1 < hp->n_layers && m->layers[l + 1].is_moe)
        lookahead(m, l);
    return WP_OK;
}

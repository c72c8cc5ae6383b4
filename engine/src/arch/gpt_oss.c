/*
 * gpt_oss.c -- GptOssForCausalLM.
 *   Per layer: h = x + o(attn(rmsnorm(x))) + bo, attention with q/k/v/o biases, YaRN
 *   RoPE (cos/sin scaled by rope_attn_factor), one learned sink logit per head, and a
 *   sliding window on the layers hparams.attn_kinds marks "sliding"; then
 *   x = h + moe(rmsnorm(h)): router with bias, softmax over the top-k logits, experts with
 *   biases and the clamped SwiGLU (swiglu_alpha, swiglu_limit), below. Every layer is MoE.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "arch.h"
#include "route_trace.h"

/* Its tensors beyond the shared ones, per layer (m->arch, carved by scratch). */
typedef struct oss_layer {
    const float *router_b;                           /* ffn_gate_inp.bias [n_experts] */
    const float *exp_gate_b, *exp_up_b, *exp_down_b; /* ffn_*_exps.bias [n_experts, I|H] */
} oss_layer;
typedef struct oss_model {
    oss_layer *layers; /* [n_layers] */
} oss_model;
WPI_OWN_MODEL(oss_model)

/* ---- mixture of experts ---------------------------------------------------------------
 *
 * A router with a bias, softmax over the top-k router logits, and experts with biases
 * and a clamped SwiGLU:
 *   g = min(Wg x + bg, limit);  u = clamp(Wu x + bu, -limit, limit)
 *   y = Wd ((u + 1) * g * sigmoid(alpha * g)) + bd
 * Expert matrices stream through wpi_experts_* exactly as in moe.c (distinct experts of a
 * chunk, each read once and applied to every token that chose it; outputs summed per token
 * in router order, so results never depend on cache state). The biases are trunk tensors
 * (docs/FORMAT.md section 4), so expert records keep their three matrices.
 */

/* Router logits (with bias) of n tokens into out [n, n_experts]. */
static void route(wpi_model *m, uint32_t l, const float *xs, uint32_t n, float *out)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    const oss_layer *A = &own(m)->layers[l];
    wpi_wmat r = {L->router, WPI_F32, hp->n_experts, hp->hidden_size};
    wpi_mm job = {&r, out, hp->n_experts};
    wpi_matmul(m, &job, 1, xs, hp->hidden_size, n);
    if (A->router_b)
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t e = 0; e < hp->n_experts; e++)
                out[(size_t)t * hp->n_experts + e] += A->router_b[e];
}

/* Top-k of the logits (the replayed trace's experts when m has one, route_trace.h), then
 * softmax over the k selected values. */
static void select_topk(const wpi_model *m, uint32_t l, uint32_t t, const float *logits,
                        int32_t *ids, float *w)
{
    const wpi_hparams *hp = m->hp;
    wpi_topk(logits, hp->n_experts, hp->top_k, ids, w);
    if (m->trace) {
        wpi_route_trace_ids(m, l, t, ids);
        for (uint32_t j = 0; j < hp->top_k; j++) w[j] = logits[ids[j]];
    }
    float mx = w[0];
    for (uint32_t j = 1; j < hp->top_k; j++) mx = w[j] > mx ? w[j] : mx;
    float s = 0;
    for (uint32_t j = 0; j < hp->top_k; j++) {
        w[j] = expf(w[j] - mx);
        s += w[j];
    }
    for (uint32_t j = 0; j < hp->top_k; j++) w[j] /= s;
}

/* out[i] = expert(x_i) for cnt tokens (rows of xs, H apart). */
static void expert_ffn(wpi_model *m, const oss_layer *L, const wpi_expert_view *v, int32_t id,
                       const float *xs, uint32_t cnt, float *out)
{
    const wpi_hparams *hp = m->hp;
    const size_t H = hp->hidden_size, I = v->inter;
    const float alpha = hp->swiglu_alpha, lim = hp->swiglu_limit;
    wpi_wmat gate = {v->gate, v->dtype, v->inter, v->hidden};
    wpi_wmat up = {v->up, v->dtype, v->inter, v->hidden};
    wpi_wmat down = {v->down, v->dtype, v->hidden, v->inter};
    wpi_mm gu[2] = {{&gate, m->ff_g, I}, {&up, m->ff_u, I}};
    wpi_matmul(m, gu, 2, xs, H, cnt);
    const float *bg = L->exp_gate_b ? L->exp_gate_b + (size_t)id * I : NULL;
    const float *bu = L->exp_up_b ? L->exp_up_b + (size_t)id * I : NULL;
    for (uint32_t t = 0; t < cnt; t++) {
        float *g = m->ff_g + t * I;
        const float *u = m->ff_u + t * I;
        for (size_t r = 0; r < I; r++) {
            float a = g[r] + (bg ? bg[r] : 0.0f);
            float b = u[r] + (bu ? bu[r] : 0.0f);
            a = a > lim ? lim : a;
            b = b > lim ? lim : (b < -lim ? -lim : b);
            g[r] = (b + 1.0f) * (a / (1.0f + expf(-a * alpha)));
        }
    }
    wpi_mm d = {&down, out, H};
    wpi_matmul(m, &d, 1, m->ff_g, I, cnt);
    if (L->exp_down_b) {
        const float *bd = L->exp_down_b + (size_t)id * H;
        for (uint32_t t = 0; t < cnt; t++)
            for (size_t i = 0; i < H; i++) out[t * H + i] += bd[i];
    }
}

/* wpi_expert_apply_fn: arg is the layer's oss_layer (its expert biases). */
static void routed_expert(void *arg, wpi_model *m, const wpi_expert_view *v, int32_t expert,
                          const float *rows, uint32_t cnt, float *out)
{
    expert_ffn(m, (const oss_layer *)arg, v, expert, rows, cnt, out);
}

static void lookahead(wpi_model *m, uint32_t l, uint32_t n)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *N = &m->layers[l + 1];
    for (uint32_t t = 0; t < n; t++) {
        wpi_rmsnorm(m->xg, m->x + (size_t)t * hp->hidden_size, N->ffn_norm, hp->hidden_size,
                    hp->rms_norm_eps);
        route(m, l + 1, m->xg, 1, m->la_probs);
        wpi_topk(m->la_probs, hp->n_experts, hp->top_k, m->la_ids, m->la_w);
        wpi_experts_prefetch(m->experts, l + 1, m->la_ids, hp->top_k);
    }
}

static wp_status moe_block(wpi_model *m, uint32_t l, uint32_t n)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    const size_t H = hp->hidden_size, K = hp->top_k, E = hp->n_experts;

    for (uint32_t t = 0; t < n; t++)
        wpi_rmsnorm(m->xn + t * H, m->x + t * H, L->ffn_norm, H, hp->rms_norm_eps);
    route(m, l, m->xn, n, m->probs);
    for (uint32_t t = 0; t < n; t++)
        select_topk(m, l, t, m->probs + t * E, m->topk_id + t * K, m->topk_w + t * K);

    const uint32_t nd = wpi_moe_distinct_experts(m, n);
    wp_status st = wpi_moe_for_each_expert(m, l, m->xn, nd, routed_expert,
                                           (void *)&own(m)->layers[l]);
    if (st != WP_OK) return st;

    for (uint32_t t = 0; t < n; t++) {
        float *acc = m->moe_out + t * H;
        memset(acc, 0, H * sizeof(float));
        for (size_t j = 0; j < K; j++)
            m->k->axpy_f32(m->topk_w[t * K + j], m->eo + (t * K + j) * H, acc, H);
        float *x = m->x + t * H;
        for (size_t i = 0; i < H; i++) x[i] += acc[i];
    }

    if (m->lookahead && (n == 1 || n == m->la_rows) && l + 1 < hp->n_layers &&
        m->layers[l + 1].is_moe)
        lookahead(m, l, n);
    return WP_OK;
}

/* ---- checks and the layer ----------------------------------------------------------- */


static wp_status check(const wpi_container *c, char *err, size_t cap)
{
    const wpi_hparams *hp = &c->hp;
    if (hp->qk_norm != WPI_QK_NONE)
        return wpi_fail(err, cap, WP_E_FORMAT, "gpt_oss: qk_norm must be \"none\"");
    if (hp->shared_expert_intermediate_size != 0)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "gpt_oss: hparams.shared_expert_intermediate_size must be 0");
    if (!(hp->swiglu_alpha > 0) || !(hp->swiglu_limit > 0))
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "gpt_oss: hparams swiglu_alpha and swiglu_limit must be > 0");
    wp_status st = wpi_check_decoder(c, err, cap);
    if (st != WP_OK) return st;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        char n[96];
        if (hp->layer_attn[l] == WPI_ATTN_KDA)
            return wpi_fail(err, cap, WP_E_FORMAT, "gpt_oss: layer %u: kda attention", l);
        if (!hp->layer_is_moe[l])
            return wpi_fail(err, cap, WP_E_FORMAT, "gpt_oss: layer %u is not moe", l);
#define NAME(s) (snprintf(n, sizeof n, "blk.%u." s, l), n)
        if ((st = wpi_need_vector(c, NAME("attn_sinks"), hp->n_heads, err, cap)) != WP_OK ||
            (st = wpi_need_vector(c, NAME("ffn_gate_inp.bias"), hp->n_experts, err, cap)) != WP_OK ||
            (st = wpi_need_f32_matrix(c, NAME("ffn_gate_exps.bias"), hp->n_experts,
                           hp->moe_intermediate_size, err, cap)) != WP_OK ||
            (st = wpi_need_f32_matrix(c, NAME("ffn_up_exps.bias"), hp->n_experts,
                           hp->moe_intermediate_size, err, cap)) != WP_OK ||
            (st = wpi_need_f32_matrix(c, NAME("ffn_down_exps.bias"), hp->n_experts, hp->hidden_size, err,
                           cap)) != WP_OK)
            return st;
#undef NAME
    }
    return WP_OK;
}

static void mixer(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    const wpi_hparams *hp = m->hp;
    wpi_attention_sw_attend(m, l, n, pos,
                            hp->layer_attn[l] == WPI_ATTN_SLIDING ? hp->sliding_window : 0);
}

static void mixer_seqs(wpi_model *const *ms, uint32_t l, const uint32_t *n,
                       const uint32_t *pos, uint32_t n_seqs)
{
    const wpi_hparams *hp = ms[0]->hp;
    wpi_attention_attend_seqs(ms, l, n, pos, n_seqs,
                              hp->layer_attn[l] == WPI_ATTN_SLIDING ? hp->sliding_window : 0,
                              1);
}

static wp_status layer_forward(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    wpi_attention_project(m, l, n);
    mixer(m, l, n, pos);
    wpi_attention_output(m, l, n);
    return moe_block(m, l, n);
}

static void scratch(const wpi_hparams *hp, uint32_t chunk, wpi_model *m, wpi_carve *cv)
{
    oss_model *a = wpi_carve_own(cv, m, sizeof *a);
    WPI_CARVE(cv, a, layers, oss_layer, hp->n_layers);
}

/* The router bias and the experts' biases of every layer (all are MoE). */
static void bind(wpi_model *m, const wpi_container *c, void *kv)
{
    for (uint32_t l = 0; l < m->hp->n_layers; l++) {
        oss_layer *L = &own(m)->layers[l];
        if (!m->layers[l].is_moe) continue;
        L->router_b = wpi_bind_vec(c, "blk.%u.ffn_gate_inp.bias", l);
        L->exp_gate_b = wpi_bind_vec(c, "blk.%u.ffn_gate_exps.bias", l);
        L->exp_up_b = wpi_bind_vec(c, "blk.%u.ffn_up_exps.bias", l);
        L->exp_down_b = wpi_bind_vec(c, "blk.%u.ffn_down_exps.bias", l);
    }
}

const wpi_arch wpi_arch_gpt_oss = {
    .name = "gpt_oss",
    .check = check,
    .scratch = scratch,
    .bind = bind,
    .layer_forward = layer_forward,
    .mix_in = wpi_attention_project,
    .mixer = mixer,
    .mixer_seqs = mixer_seqs,
    .mix_out = wpi_attention_output,
    .ffn = moe_block,
};

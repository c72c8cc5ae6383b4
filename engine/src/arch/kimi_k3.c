/*
 * kimi_k3.c -- KimiK3ForConditionalGeneration's text model (Kimi K3): kimi_linear's layers
 * (KDA and NoPE MLA, sigmoid routing with a selection bias) with SiTU-GLU in every FFN
 * (ffn.c, situ_beta), KDA's full-rank output gate and bounded decay gate (kda.c), MLA with
 * q_lora_rank and its output gate (mla.c, attn_gate), and, static here, the latent MoE and
 * Attention Residuals. Per layer l, in the model's order (B = attn_res_block_size):
 *   ps = x; if blocks: x = res(ps, blocks; attn_res)       blocks: per token, start empty
 *   if l % B == 0: blocks += ps, ps = none
 *   att = kda or mla(rmsnorm(x)); ps = ps + att (or att); x = res(ps, blocks; ffn_res)
 *   ffn = dense or latent MoE(rmsnorm(x)); ps = ps + ffn; x = ps
 * and after the last layer x = res(x, blocks; output_res), then the final norm. With
 *   res(p, V; norm, proj) = sum_i softmax_i(s) V_i over V = [blocks..., p],
 *   s_i = sum_k rmsnorm(V_i)[k] * norm[k] * proj[k] (the key norm unweighted, rms_norm_eps).
 * Without attn_res_block_size the residuals are plain (x += att, x += ffn).
 * Latent MoE: xn = rmsnorm(x); routing on xn; the experts (SiTU-GLU, [moe_inter,
 * expert_hidden_size]) run on lat = ffn_lat_down xn; y = sum of weighted outputs in router
 * order, rmsnorm'd by ffn_lat_norm when latent_moe_norm; ffn = ffn_lat_up y + shared(xn),
 * the shared experts on the full hidden state.
 * A layer is its mixer part (AttnRes before attention and the attention's projections,
 * the attention over a sequence's state, the output projection and AttnRes before the
 * FFN), then its FFN part (the FFN, AttnRes bookkeeping, the output aggregation after the
 * last layer), set as the mix_in / mixer / mix_out / ffn hooks: ps and the blocks are kept
 * per row of the step (rows are offsets of x from the scratch's).
 * State: MLA's latent rows and KDA's recurrent state (mla.c); AttnRes keeps none across
 * tokens. Scratch (buf): ps, lat, shared output and the blocks, [chunk][hidden] each.
 * Images: the MoonViT tower as K3 ships it (wpi_kimi_k3_tower, arch/kimi_k25.c).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "arch.h"
#include "moonvit.h"

#define W "manifest.json: hparams"

/* Its own hparams (hp->arch), zero when absent. */
typedef struct k3_hp {
    uint32_t attn_res_block_size;         /* Attention Residuals: layers per block */
    int32_t latent_moe_norm, mla_output_gate; /* bools */
} k3_hp;
WPI_OWN_HPARAMS(k3_hp)

static const wpi_hp_bound bounds[] = {
    WPI_HP_U32(k3_hp, attn_res_block_size, 1, WPI_MAX_LAYERS),
};

/* Its own tensors (m->arch, carved by scratch): latent MoE and Attention Residuals, f32
 * vectors [hidden] unless noted. */
typedef struct k3_layer {
    wpi_wmat lat_down, lat_up;  /* [expert_hidden, hidden], [hidden, expert_hidden] */
    const float *lat_norm;      /* [expert_hidden_size] or NULL */
    const float *res_attn_norm, *res_attn_proj, *res_ffn_norm, *res_ffn_proj;
} k3_layer;
typedef struct k3_model {
    k3_layer *layers;                     /* [n_layers] */
    float *buf;                           /* ps, lat, sh, blocks: [chunk][hidden] each */
    const float *x0;                      /* the scratch's x: rows are offsets from it */
    const float *out_res_norm, *out_res_proj; /* the output aggregation */
} k3_model;
WPI_OWN_MODEL(k3_model)

/* Layers 0, B, 2B.. append a block: how many layer l finds (B = 0: none). */
static uint32_t blocks_before(const wpi_hparams *hp, uint32_t l)
{
    const uint32_t B = own_hp(hp)->attn_res_block_size;
    return B ? (l + B - 1) / B : 0;
}

static uint32_t expert_hidden(const wpi_hparams *hp)
{
    return hp->expert_hidden_size ? hp->expert_hidden_size : hp->hidden_size;
}

static wp_status hparams(const struct wpi_json *h, wpi_hparams *hp, char *err, size_t cap)
{
    k3_hp *o = own_hp(hp);
    TRY(wpi_hparams_shared(h, hp, err, cap));
    memset(o, 0, sizeof *o);
    TRY(wpi_hparams_bounds(h, bounds, sizeof bounds / sizeof bounds[0], o, err, cap));
    TRY(wpi_hparam_bool(h, "latent_moe_norm", &o->latent_moe_norm, err, cap));
    TRY(wpi_hparam_bool(h, "mla_output_gate", &o->mla_output_gate, err, cap));
    if (o->latent_moe_norm && !hp->expert_hidden_size)
        return wpi_fail(err, cap, WP_E_FORMAT, W ".latent_moe_norm: needs expert_hidden_size");
    if (o->mla_output_gate && hp->v_head_dim > hp->head_dim)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        W ".mla_output_gate: v_head_dim %u above head_dim %u", hp->v_head_dim,
                        hp->head_dim);
    return WP_OK;
}

static wp_status check(const wpi_container *c, char *err, size_t cap)
{
    const wpi_hparams *hp = &c->hp;
    const k3_hp *o = own_hp(hp);
    const uint64_t H = hp->hidden_size, LH = expert_hidden(hp);
    if (!hp->kv_lora_rank)
        return wpi_fail(err, cap, WP_E_FORMAT, "kimi_k3: kv_lora_rank is required (> 0)");
    if (hp->qk_norm != WPI_QK_NONE || hp->clip_qkv != 0 || hp->shared_expert_gate)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "kimi_k3: no qk_norm, clip_qkv or shared expert gate");
    if (!hp->kda_heads || !hp->kda_head_dim || !hp->kda_conv)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "kimi_k3: kda_heads, kda_head_dim and kda_conv are needed");
    if (hp->n_experts && hp->scoring != WPI_SCORE_SIGMOID)
        return wpi_fail(err, cap, WP_E_FORMAT, "kimi_k3: routing needs sigmoid scores");
    TRY(wpi_check_decoder(c, err, cap));
    if (o->attn_res_block_size) {
        TRY(wpi_need_vector(c, "output_res_norm.weight", H, err, cap));
        TRY(wpi_need_vector(c, "output_res_proj.weight", H, err, cap));
    }
    char n[96];
    for (uint32_t l = 0; l < hp->n_layers; l++) {
#define NAME(s) (snprintf(n, sizeof n, "blk.%u." s, l), n)
        if (hp->layer_attn[l] == WPI_ATTN_SLIDING)
            return wpi_fail(err, cap, WP_E_FORMAT, "kimi_k3: layer %u: sliding attention", l);
        if (o->attn_res_block_size) {
            TRY(wpi_need_vector(c, NAME("attn_res_norm.weight"), H, err, cap));
            TRY(wpi_need_vector(c, NAME("attn_res_proj.weight"), H, err, cap));
            TRY(wpi_need_vector(c, NAME("ffn_res_norm.weight"), H, err, cap));
            TRY(wpi_need_vector(c, NAME("ffn_res_proj.weight"), H, err, cap));
        }
        if (hp->layer_is_moe[l]) {
            TRY(wpi_opt_vector(c, NAME("exp_probs_b.bias"), hp->n_experts, err, cap));
            if (hp->expert_hidden_size) {
                TRY(wpi_need_matrix(c, NAME("ffn_lat_down.weight"), LH, H, err, cap));
                TRY(wpi_need_matrix(c, NAME("ffn_lat_up.weight"), H, LH, err, cap));
            }
            if (o->latent_moe_norm)
                TRY(wpi_need_vector(c, NAME("ffn_lat_norm.weight"), LH, err, cap));
        }
        if (hp->layer_attn[l] == WPI_ATTN_KDA) {
            TRY(wpi_kda_check_layer(c, l, err, cap));
            continue;
        }
        TRY(wpi_mla_check_layer(c, l, err, cap));
        if (o->mla_output_gate)
            TRY(wpi_need_matrix(c, NAME("attn_gate.weight"),
                                (uint64_t)hp->n_heads * hp->v_head_dim, H, err, cap));
#undef NAME
    }
    return c->has_vision ? wpi_kimi_k3_tower.check(c, err, cap) : WP_OK;
}

static void scratch(const wpi_hparams *hp, uint32_t chunk, wpi_model *m, wpi_carve *cv)
{
    k3_model *a = wpi_carve_own(cv, m, sizeof *a);
    WPI_CARVE(cv, a, layers, k3_layer, hp->n_layers);
    WPI_CARVE(cv, a, buf, float,
              (uint64_t)(3 + blocks_before(hp, hp->n_layers)) * chunk * hp->hidden_size);
}

static void bind(wpi_model *m, const wpi_container *c, void *kv)
{
    wpi_mla_bind(m, c, kv);
    const wpi_tensor *nt = wpi_container_tensor(c, "output_res_norm.weight");
    const wpi_tensor *pt = wpi_container_tensor(c, "output_res_proj.weight");
    k3_model *a = own(m);
    a->x0 = m->x;
    a->out_res_norm = nt ? nt->data : NULL;
    a->out_res_proj = pt ? pt->data : NULL;
    for (uint32_t l = 0; l < m->hp->n_layers; l++) {
        m->layers[l].kda_g = wpi_bind_mat(c, "blk.%u.kda_g.weight", l);
        m->layers[l].attn_gate = wpi_bind_mat(c, "blk.%u.attn_gate.weight", l);
        k3_layer *L = &a->layers[l];
        L->lat_down = wpi_bind_mat(c, "blk.%u.ffn_lat_down.weight", l);
        L->lat_up = wpi_bind_mat(c, "blk.%u.ffn_lat_up.weight", l);
        L->lat_norm = wpi_bind_vec(c, "blk.%u.ffn_lat_norm.weight", l);
        L->res_attn_norm = wpi_bind_vec(c, "blk.%u.attn_res_norm.weight", l);
        L->res_attn_proj = wpi_bind_vec(c, "blk.%u.attn_res_proj.weight", l);
        L->res_ffn_norm = wpi_bind_vec(c, "blk.%u.ffn_res_norm.weight", l);
        L->res_ffn_proj = wpi_bind_vec(c, "blk.%u.ffn_res_proj.weight", l);
    }
}

/* out[t] = res(prefix[t], blocks[0..nb)[t]; norm, proj) for n tokens; out is neither
 * prefix nor a block. The prefix term is written first, then the blocks' added. */
static void attn_res(const wpi_model *m, const float *prefix, const float *blocks, uint32_t nb,
                     uint32_t n, const float *norm, const float *proj, float *out)
{
    const size_t H = m->hp->hidden_size, CH = (size_t)m->chunk * H;
    const float eps = m->hp->rms_norm_eps;
    float s[WPI_MAX_LAYERS + 1];
    for (uint32_t t = 0; t < n; t++) {
        float mx = -INFINITY;
        for (uint32_t j = 0; j <= nb; j++) {
            const float *v = j < nb ? blocks + j * CH + t * H : prefix + t * H;
            float ss = 0, d = 0;
            for (size_t i = 0; i < H; i++) {
                ss += v[i] * v[i];
                d += v[i] * norm[i] * proj[i];
            }
            s[j] = d / sqrtf(ss / (float)H + eps);
            if (s[j] > mx) mx = s[j];
        }
        float sum = 0;
        for (uint32_t j = 0; j <= nb; j++) sum += s[j] = expf(s[j] - mx);
        float *o = out + t * H;
        const float *p = prefix + t * H;
        for (size_t i = 0; i < H; i++) o[i] = s[nb] / sum * p[i];
        for (uint32_t j = 0; j < nb; j++)
            m->k->axpy_f32(s[j] / sum, blocks + j * CH + t * H, o, H);
    }
}

/* One routed expert (SiTU-GLU on the latent rows, H floats apart). */
static void apply(void *arg, wpi_model *m, const wpi_expert_view *v, int32_t e,
                  const float *rows, uint32_t cnt, float *out)
{
    (void)arg;
    (void)e;
    const size_t H = m->hp->hidden_size;
    wpi_wmat gate = {v->gate, v->dtype, v->inter, v->hidden};
    wpi_wmat up = {v->up, v->dtype, v->inter, v->hidden};
    wpi_wmat down = {v->down, v->dtype, v->hidden, v->inter};
    wpi_swiglu(m, &gate, &up, &down, rows, H, cnt, out, H);
}

/* The latent MoE of layer l: its output into moe_out, added to x. */
static wp_status latent_moe(wpi_model *m, uint32_t l, uint32_t n)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    const k3_layer *A = &own(m)->layers[l];
    const size_t H = hp->hidden_size, K = hp->top_k, E = hp->n_experts, LH = expert_hidden(hp);
    const size_t CH = (size_t)m->chunk * H;
    float *lat = own(m)->buf + CH, *sh = lat + CH;
    for (uint32_t t = 0; t < n; t++)
        wpi_rmsnorm(m->xn + t * H, m->x + t * H, L->ffn_norm, H, hp->rms_norm_eps);
    wpi_wmat r = {L->router, WPI_F32, hp->n_experts, hp->hidden_size};
    wpi_mm job = {&r, m->probs, E};
    wpi_matmul(m, &job, 1, m->xn, H, n);
    for (size_t i = 0; i < (size_t)n * E; i++) m->probs[i] = 1.0f / (1.0f + expf(-m->probs[i]));
    for (uint32_t t = 0; t < n; t++)
        wpi_route_noaux(hp, m->probs + t * E, L->exp_bias, m->route_tmp, m->topk_id + t * K,
                        m->topk_w + t * K);
    const uint32_t nd = wpi_moe_distinct_experts(m, n);
    /* The misses' reads go out now and land while the latent projection and the shared
     * experts (resident, on xn) are computed. */
    TRY(wpi_moe_request_first(m, l, nd));
    const float *xs = m->xn;
    const int latent = A->lat_down.data != NULL; /* checked: with expert_hidden_size */
    if (latent) {
        wpi_mm down = {&A->lat_down, lat, H};
        wpi_matmul(m, &down, 1, m->xn, H, n);
        xs = lat;
    }
    if (L->sh_gate.data)
        wpi_swiglu(m, &L->sh_gate, &L->sh_up, &L->sh_down, m->xn, H, n, sh, H);
    TRY(wpi_moe_for_each_expert_requested(m, l, xs, nd, apply, NULL, 1));
    float *y = latent ? lat : m->moe_out; /* the weighted sum, H floats apart */
    for (uint32_t t = 0; t < n; t++) {
        float *acc = y + t * H;
        memset(acc, 0, LH * sizeof(float));
        for (size_t j = 0; j < K; j++)
            m->k->axpy_f32(m->topk_w[t * K + j], m->eo + (t * K + j) * H, acc, LH);
        if (A->lat_norm) wpi_rmsnorm(acc, acc, A->lat_norm, LH, hp->rms_norm_eps);
    }
    if (latent) {
        wpi_mm up = {&A->lat_up, m->moe_out, H};
        wpi_matmul(m, &up, 1, lat, H, n);
    }
    for (uint32_t t = 0; t < n; t++) {
        float *o = m->moe_out + t * H, *x = m->x + t * H;
        for (size_t i = 0; i < H; i++) {
            if (L->sh_gate.data) o[i] += sh[t * H + i];
            x[i] += o[i];
        }
    }
    return WP_OK;
}

/* Decode (one row, or one per sequence of a batched step): layer l + 1's likely experts,
 * routed as its latent MoE routes (sigmoid, biased top-k) on rmsnorm of this layer's output
 * (layer l + 1's attention and AttnRes not applied yet), prefetched. Timing only: the
 * router of layer l + 1 still decides, so results are unchanged. */
static void lookahead(wpi_model *m, uint32_t l, uint32_t n)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *N = &m->layers[l + 1];
    const size_t H = hp->hidden_size, E = hp->n_experts;
    for (uint32_t t = 0; t < n; t++) {
        wpi_rmsnorm(m->xg, m->x + t * H, N->ffn_norm, H, hp->rms_norm_eps);
        wpi_wmat r = {N->router, WPI_F32, hp->n_experts, hp->hidden_size};
        wpi_mm job = {&r, m->la_probs, E};
        wpi_matmul(m, &job, 1, m->xg, H, 1);
        for (size_t e = 0; e < E; e++) m->la_probs[e] = 1.0f / (1.0f + expf(-m->la_probs[e]));
        wpi_route_noaux(hp, m->la_probs, N->exp_bias, m->route_tmp, m->la_ids, m->la_w);
        wpi_experts_prefetch(m->experts, l + 1, m->la_ids, hp->top_k);
    }
}

/* The step's rows (those at x's offset in the scratch) of ps, and of the blocks in *blocks:
 * block b's rows are b * chunk * hidden floats after them. */
static float *step_rows(wpi_model *m, float **blocks)
{
    const k3_model *a = own(m);
    float *ps = a->buf + (size_t)(m->x - a->x0);
    *blocks = ps + 3 * (size_t)m->chunk * m->hp->hidden_size;
    return ps;
}

/* The mixer's stateless parts around the attention (arch.h mix_in / mix_out), on n rows
 * of x, their rows of ps and the blocks at the same offset: AttnRes before attention and
 * the block's projections; the block's output projection (into xn and x) and AttnRes
 * before the FFN. */
static void mix_in(wpi_model *m, uint32_t l, uint32_t n)
{
    const wpi_hparams *hp = m->hp;
    const k3_layer *A = &own(m)->layers[l];
    const size_t H = hp->hidden_size, CH = (size_t)m->chunk * H, NH = (size_t)n * H;
    const uint32_t B = own_hp(hp)->attn_res_block_size;
    float *blocks, *ps = step_rows(m, &blocks);
    const uint32_t nb = blocks_before(hp, l);
    if (B) {
        memcpy(ps, m->x, NH * sizeof(float));
        if (nb) attn_res(m, ps, blocks, nb, n, A->res_attn_norm, A->res_attn_proj, m->x);
        if (l % B == 0) memcpy(blocks + nb * CH, ps, NH * sizeof(float)); /* ps: none */
    }
    wpi_mla_kda_project(m, l, n);
}

static void mix_out(wpi_model *m, uint32_t l, uint32_t n)
{
    const wpi_hparams *hp = m->hp;
    const k3_layer *A = &own(m)->layers[l];
    const size_t NH = (size_t)n * hp->hidden_size;
    const uint32_t B = own_hp(hp)->attn_res_block_size;
    float *blocks, *ps = step_rows(m, &blocks);
    wpi_mla_kda_output(m, l, n);
    if (!B) return;
    const int fresh = l % B == 0; /* ps was none: the block's output starts it */
    const uint32_t nb = blocks_before(hp, l) + (uint32_t)fresh;
    for (size_t i = 0; i < NH; i++) ps[i] = fresh ? m->xn[i] : ps[i] + m->xn[i];
    attn_res(m, ps, blocks, nb, n, A->res_ffn_norm, A->res_ffn_proj, m->x);
}

/* The FFN (its output in moe_out), then ps += it and x = ps, or after the last layer the
 * output aggregation; on rows 0..n of the step. */
static wp_status ffn(wpi_model *m, uint32_t l, uint32_t n)
{
    const wpi_hparams *hp = m->hp;
    const k3_model *a = own(m);
    const size_t NH = (size_t)n * hp->hidden_size;
    if (m->layers[l].is_moe)
        TRY(latent_moe(m, l, n));
    else
        wpi_ffn_block(m, l, n);
    if (own_hp(hp)->attn_res_block_size) {
        float *blocks, *ps = step_rows(m, &blocks);
        for (size_t i = 0; i < NH; i++) ps[i] += m->moe_out[i];
        if (l + 1 < hp->n_layers)
            memcpy(m->x, ps, NH * sizeof(float));
        else
            attn_res(m, ps, blocks, blocks_before(hp, l + 1), n, a->out_res_norm,
                     a->out_res_proj, m->x);
    }
    /* a replayed trace is not applied by latent_moe, so there is nothing to prefetch */
    if (m->lookahead && !m->trace && (n == 1 || n == m->la_rows) && l + 1 < hp->n_layers &&
        m->layers[l + 1].is_moe)
        lookahead(m, l, n);
    return WP_OK;
}

static wp_status layer_forward(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    mix_in(m, l, n);
    wpi_mla_kda_attend(m, l, n, pos);
    mix_out(m, l, n);
    return ffn(m, l, n);
}

const wpi_arch wpi_arch_kimi_k3 = {
    .name = "kimi_k3",
    .hparams = hparams,
    .check = check,
    .scratch = scratch,
    .state_bytes = wpi_mla_state_bytes,
    .bind = bind,
    .state_part = wpi_mla_state_part,
    .no_truncate = wpi_kda_no_truncate,
    .layer_forward = layer_forward,
    .mix_in = mix_in,
    .mixer = wpi_mla_kda_attend,
    .mix_out = mix_out,
    .ffn = ffn,
    .vision = &wpi_kimi_k3_tower,
};

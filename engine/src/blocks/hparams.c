/*
 * hparams.c -- the optional hyperparameters of docs/FORMAT.md section 3 that the shared
 * blocks read, for every architecture (wpi_hparams_shared, the default hparams hook; an
 * architecture with keys of its own reads these first):
 *   mla.c, route_noaux.c  q_lora_rank, kv_lora_rank, qk_nope_head_dim, v_head_dim,
 *                         rope_interleave, lora_norm_eps; scoring_func, n_group,
 *                         topk_group, routed_scaling_factor
 *   hyper.c               hc_mult, hc_sinkhorn_iters, hc_eps
 *   indexers              index_heads, index_head_dim, index_topk (deepseek_v4's CSA and
 *                         glm5_next's DSA indexer)
 *   kda.c                 kda_heads, kda_head_dim, kda_conv, kda_lower_bound
 *   kda.c                 kda_full_gate
 *   attention_sw.c, ffn.c sliding_window and attn_kinds ("full", "sliding", "kda");
 *                         swiglu_alpha, swiglu_limit; situ_beta, situ_linear_beta
 *   moe.c, checks.c       expert_hidden_size (the experts' width, a latent MoE's)
 *
 * Every key is optional; absent means off (0, false, "softmax", 1.0). Present keys are
 * checked against the one bounds table (container.c); the architecture's check function
 * decides which it needs.
 */
#include <string.h>

#include "blocks.h"
#include "json.h"

#define W "manifest.json: hparams"

wp_status wpi_hparam_bool(const struct wpi_json *h, const char *key, int32_t *out, char *err,
                          size_t cap)
{
    *out = 0;
    const wpi_json *v = wpi_json_get(h, key);
    if (!v || v->type == WPI_JSON_NULL) return WP_OK;
    int b;
    if (!wpi_json_bool(v, &b))
        return wpi_fail(err, cap, WP_E_FORMAT, W ".%s: expected true or false", key);
    *out = b;
    return WP_OK;
}

static wp_status mla_keys(const wpi_json *h, wpi_hparams *hp, char *err, size_t cap)
{
    wp_status st;
    if ((st = wpi_hparam_u32(h, "q_lora_rank", hp, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "kv_lora_rank", hp, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "qk_nope_head_dim", hp, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "v_head_dim", hp, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "n_group", hp, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "topk_group", hp, err, cap)) != WP_OK)
        return st;
    if (hp->kv_lora_rank && hp->qk_nope_head_dim + hp->rope_dim != hp->head_dim)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        W ": qk_nope_head_dim %u + rope_dim %u must equal head_dim %u with "
                          "kv_lora_rank", hp->qk_nope_head_dim, hp->rope_dim, hp->head_dim);
    if (hp->kv_lora_rank && hp->v_head_dim == 0)
        return wpi_fail(err, cap, WP_E_FORMAT, W ": kv_lora_rank needs v_head_dim");

    hp->rope_interleave = 0;
    const wpi_json *v = wpi_json_get(h, "rope_interleave");
    if (v && v->type != WPI_JSON_NULL) {
        int b;
        if (!wpi_json_bool(v, &b))
            return wpi_fail(err, cap, WP_E_FORMAT, W ".rope_interleave: expected true or false");
        hp->rope_interleave = b;
    }

    hp->scoring = WPI_SCORE_SOFTMAX;
    v = wpi_json_get(h, "scoring_func");
    if (v && v->type != WPI_JSON_NULL) {
        const char *s = wpi_json_str(v);
        if (s && !strcmp(s, "sigmoid"))
            hp->scoring = WPI_SCORE_SIGMOID;
        else if (s && !strcmp(s, "sqrtsoftplus"))
            hp->scoring = WPI_SCORE_SQRTSOFTPLUS;
        else if (!s || strcmp(s, "softmax"))
            return wpi_fail(err, cap, WP_E_FORMAT,
                            W ".scoring_func: expected \"softmax\", \"sigmoid\" or \"sqrtsoftplus\"");
    }

    if (hp->n_group <= 1 && hp->topk_group > 1)
        return wpi_fail(err, cap, WP_E_FORMAT, W ".topk_group: %u with n_group %u",
                        hp->topk_group, hp->n_group);
    if (hp->n_group > 1) {
        if (hp->n_experts % hp->n_group || hp->n_experts / hp->n_group < 2)
            return wpi_fail(err, cap, WP_E_FORMAT,
                            W ".n_group: %u groups of %u experts need at least 2 experts each",
                            hp->n_group, hp->n_experts);
        if (hp->topk_group < 1 || hp->topk_group > hp->n_group)
            return wpi_fail(err, cap, WP_E_FORMAT, W ".topk_group: %u is out of range [1, %u]",
                            hp->topk_group, hp->n_group);
        if ((uint64_t)hp->topk_group * (hp->n_experts / hp->n_group) < hp->top_k)
            return wpi_fail(err, cap, WP_E_FORMAT,
                            W ".topk_group: %u groups hold fewer than top_k %u experts",
                            hp->topk_group, hp->top_k);
    }

    int scaled;
    TRY(wpi_hparam_f32(h, "routed_scaling_factor", hp, &scaled, err, cap));
    if (!scaled) hp->routed_scaling_factor = 1.0f;
    return WP_OK;
}

/* hyper-connections (hyper.c) and the indexers' shape */
static wp_status hyper_index_keys(const wpi_json *h, wpi_hparams *hp, char *err, size_t cap)
{
    wp_status st;
    if ((st = wpi_hparam_u32(h, "hc_mult", hp, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "hc_sinkhorn_iters", hp, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "index_heads", hp, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "index_head_dim", hp, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "index_topk", hp, err, cap)) != WP_OK ||
        (st = wpi_hparam_f32(h, "hc_eps", hp, NULL, err, cap)) != WP_OK)
        return st;
    return WP_OK;
}

/* the bounded KDA forget gate (kda.c) and the eps of the MLA lora norms (mla.c) */
static wp_status gate_eps_keys(const wpi_json *h, wpi_hparams *hp, char *err, size_t cap)
{
    wp_status st;
    int safe = 0;
    if ((st = wpi_hparam_f32(h, "kda_lower_bound", hp, &safe, err, cap)) != WP_OK ||
        (st = wpi_hparam_f32(h, "lora_norm_eps", hp, NULL, err, cap)) != WP_OK)
        return st;
    hp->kda_safe_gate = safe;
    if (hp->hc_mult && !hp->hc_sinkhorn_iters)
        return wpi_fail(err, cap, WP_E_FORMAT, W ": hc_mult needs hc_sinkhorn_iters");
    return WP_OK;
}

static wp_status layer_keys(const wpi_json *h, wpi_hparams *hp, char *err, size_t cap)
{
    wp_status st;
    memset(hp->layer_attn, WPI_ATTN_FULL, sizeof hp->layer_attn);
    if ((st = wpi_hparam_u32(h, "sliding_window", hp, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "expert_hidden_size", hp, err, cap)) != WP_OK ||
        (st = wpi_hparam_f32(h, "situ_beta", hp, NULL, err, cap)) != WP_OK ||
        (st = wpi_hparam_f32(h, "situ_linear_beta", hp, NULL, err, cap)) != WP_OK ||
        (st = wpi_hparam_f32(h, "swiglu_alpha", hp, NULL, err, cap)) != WP_OK ||
        (st = wpi_hparam_f32(h, "swiglu_limit", hp, NULL, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "kda_heads", hp, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "kda_head_dim", hp, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "kda_conv", hp, err, cap)) != WP_OK ||
        (st = wpi_hparam_bool(h, "kda_full_gate", &hp->kda_full_gate, err, cap)) != WP_OK)
        return st;
    if (hp->expert_hidden_size > hp->hidden_size)
        return wpi_fail(err, cap, WP_E_FORMAT, W ".expert_hidden_size: %u is above hidden_size %u",
                        hp->expert_hidden_size, hp->hidden_size);
    if (hp->situ_linear_beta > 0 && !(hp->situ_beta > 0))
        return wpi_fail(err, cap, WP_E_FORMAT, W ".situ_linear_beta: needs situ_beta");
    static const char *const kinds[] = {[WPI_ATTN_FULL] = "full",
                                        [WPI_ATTN_SLIDING] = "sliding",
                                        [WPI_ATTN_KDA] = "kda"};
    TRY(wpi_hparam_kinds(h, "attn_kinds", kinds, 3, hp->n_layers, hp->layer_attn, err, cap));
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        if (hp->layer_attn[l] == WPI_ATTN_SLIDING && !hp->sliding_window)
            return wpi_fail(err, cap, WP_E_FORMAT,
                            W ".attn_kinds[%u]: \"sliding\" needs sliding_window", l);
        if (hp->layer_attn[l] == WPI_ATTN_KDA &&
            !(hp->kda_heads && hp->kda_head_dim && hp->kda_conv))
            return wpi_fail(err, cap, WP_E_FORMAT,
                            W ".attn_kinds[%u]: \"kda\" needs kda_heads, kda_head_dim, kda_conv", l);
    }
    return WP_OK;
}

wp_status wpi_hparams_shared(const struct wpi_json *h, wpi_hparams *hp, char *err, size_t cap)
{
    TRY(mla_keys(h, hp, err, cap));
    TRY(hyper_index_keys(h, hp, err, cap));
    TRY(gate_eps_keys(h, hp, err, cap));
    return layer_keys(h, hp, err, cap);
}

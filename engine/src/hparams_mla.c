/*
 * hparams_mla.c -- the optional hyperparameters of docs/FORMAT.md section 3 for
 * multi-head latent attention (deepseek_v3 family) and for grouped, biased routing
 * (deepseek_v3, glm4_moe): q_lora_rank, kv_lora_rank, qk_nope_head_dim, v_head_dim,
 * rope_interleave, scoring_func, n_group, topk_group, routed_scaling_factor.
 *
 * Every key is optional; absent means off (0, false, "softmax", 1.0). Present keys are
 * bounds-checked; the architecture's check function decides which it needs.
 */
#include <float.h>
#include <string.h>

#include "container.h"
#include "json.h"

#define W "manifest.json: hparams"

wp_status wpi_hparams_mla(const struct wpi_json *h, wpi_hparams *hp, char *err, size_t cap)
{
    wp_status st;
    if ((st = wpi_hparam_u32(h, "q_lora_rank", 0, 1u << 16, &hp->q_lora_rank, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "kv_lora_rank", 0, 1u << 16, &hp->kv_lora_rank, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "qk_nope_head_dim", 0, 4096, &hp->qk_nope_head_dim, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "v_head_dim", 0, 4096, &hp->v_head_dim, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "n_group", 0, 4096, &hp->n_group, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "topk_group", 0, 4096, &hp->topk_group, err, cap)) != WP_OK)
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

    hp->routed_scaling_factor = 1.0f;
    v = wpi_json_get(h, "routed_scaling_factor");
    if (v && v->type != WPI_JSON_NULL) {
        double d;
        if (!wpi_json_num(v, &d) || !(d > 0 && d <= 1e6))
            return wpi_fail(err, cap, WP_E_FORMAT,
                            W ".routed_scaling_factor: expected a number in (0, 1e6]");
        hp->routed_scaling_factor = (float)d;
    }
    return WP_OK;
}

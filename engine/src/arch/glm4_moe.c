/*
 * glm4_moe.c -- Glm4MoeForCausalLM (GLM-4.5, GLM-4.6).
 *   Llama layout with q/k/v biases (attention_bias), optional per-head q/k RMSNorm
 *   (qk_norm "head") before a partial rotary (rope_dim < head_dim, rotate_half on the
 *   first rope_dim dims); the first first_k_dense_replace layers are dense, the others
 *   MoE with sigmoid scores, selection on scores + exp_probs_b (optionally within
 *   expert groups), weights renormalized and times routed_scaling_factor
 *   (route_noaux.c), plus an ungated shared expert.
 */
#include <stdio.h>

#include "arch.h"

static wp_status check(const wpi_container *c, char *err, size_t cap)
{
    const wpi_hparams *hp = &c->hp;
    if (hp->kv_lora_rank)
        return wpi_fail(err, cap, WP_E_FORMAT, "glm4_moe: has no latent attention");
    if (hp->qk_norm == WPI_QK_FULL)
        return wpi_fail(err, cap, WP_E_FORMAT, "glm4_moe: qk_norm must be \"none\" or \"head\"");
    if (hp->shared_expert_gate)
        return wpi_fail(err, cap, WP_E_FORMAT, "glm4_moe: the shared expert has no gate");
    wp_status st = wpi_check_decoder(c, err, cap);
    if (st != WP_OK) return st;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%u.exp_probs_b.bias", l);
        if (hp->layer_is_moe[l] &&
            (st = wpi_opt_vector(c, name, hp->n_experts, err, cap)) != WP_OK)
            return st;
    }
    return WP_OK;
}

const wpi_arch wpi_arch_glm4_moe = {
    .name = "glm4_moe",
    .check = check,
    WPI_MOE_DECODER_HOOKS,
};

/*
 * mixtral.c -- MixtralForCausalLM.
 *   Llama attention; every layer is MoE: softmax over all experts, top-k, weights
 *   renormalized to sum 1 (the converter sets norm_topk_prob).
 */
#include "arch.h"

static wp_status check(const wpi_container *c, char *err, size_t cap)
{
    const wpi_hparams *hp = &c->hp;
    if (hp->qk_norm != WPI_QK_NONE)
        return wpi_fail(err, cap, WP_E_FORMAT, "mixtral: qk_norm must be \"none\"");
    if (!hp->norm_topk_prob)
        return wpi_fail(err, cap, WP_E_FORMAT, "mixtral: norm_topk_prob must be true");
    if (hp->shared_expert_intermediate_size != 0)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "mixtral: hparams.shared_expert_intermediate_size must be 0");
    return wpi_check_decoder(c, err, cap);
}

const wpi_arch wpi_arch_mixtral = {
    .name = "mixtral",
    .check = check,
    WPI_MOE_DECODER_HOOKS,
};

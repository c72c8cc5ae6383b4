/*
 * mixtral.c -- MixtralForCausalLM.
 *   Llama attention; every layer is MoE: softmax over all experts, top-k, weights
 *   renormalized to sum 1 (the converter sets norm_topk_prob).
 */
#include "arch.h"

static wp_status check(const wpi_container *c, char *err, size_t cap)
{
    if (c->hp.qk_norm == WPI_QK_NONE && !c->hp.norm_topk_prob)
        return wpi_fail(err, cap, WP_E_FORMAT, "mixtral: norm_topk_prob must be true");
    return wpi_check_plain(c, "mixtral", WPI_QK_NONE, 0, err, cap);
}

const wpi_arch wpi_arch_mixtral = {
    .name = "mixtral",
    .check = check,
    WPI_MOE_DECODER_HOOKS,
};

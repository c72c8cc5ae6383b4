/*
 * olmoe.c -- OlmoeForCausalLM.
 *   Llama layout; q and k get one RMSNorm over all heads (qk_norm "full") right after
 *   projection, then q, k, v are clamped to +-clip_qkv when set, then RoPE; every layer
 *   is MoE with softmax top-k, renormalized only when norm_topk_prob.
 */
#include "arch.h"

static wp_status check(const wpi_container *c, char *err, size_t cap)
{
    if (c->hp.qk_norm != WPI_QK_FULL)
        return wpi_fail(err, cap, WP_E_FORMAT, "olmoe: qk_norm must be \"full\"");
    if (c->hp.shared_expert_intermediate_size != 0)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "olmoe: hparams.shared_expert_intermediate_size must be 0");
    return wpi_check_decoder(c, err, cap);
}

const wpi_arch wpi_arch_olmoe = {
    .name = "olmoe",
    .check = check,
    WPI_MOE_DECODER_HOOKS,
};

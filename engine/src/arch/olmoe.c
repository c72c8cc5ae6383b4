/*
 * olmoe.c -- OlmoeForCausalLM.
 *   Llama layout; q and k get one RMSNorm over all heads (qk_norm "full") right after
 *   projection, then q, k, v are clamped to +-clip_qkv when set, then RoPE; every layer
 *   is MoE with softmax top-k, renormalized only when norm_topk_prob.
 */
#include "arch.h"

static wp_status check(const wpi_container *c, char *err, size_t cap)
{
    return wpi_check_plain(c, "olmoe", WPI_QK_FULL, 0, err, cap);
}

const wpi_arch wpi_arch_olmoe = {
    .name = "olmoe",
    .check = check,
    WPI_MOE_DECODER_HOOKS,
};

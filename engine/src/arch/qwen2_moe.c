/*
 * qwen2_moe.c -- Qwen2MoeForCausalLM.
 *   Llama layout with q/k/v biases when qkv_bias (the default); MoE layers route softmax
 *   top-k (renormalized only when norm_topk_prob) and add a shared expert scaled by
 *   sigmoid(w . x); the layers hparams.attn_kinds marks "sliding" attend within
 *   sliding_window.
 */
#include "arch.h"

static wp_status check(const wpi_container *c, char *err, size_t cap)
{
    return wpi_check_plain(c, "qwen2_moe", WPI_QK_NONE, 1, err, cap);
}

const wpi_arch wpi_arch_qwen2_moe = {
    .name = "qwen2_moe",
    .check = check,
    WPI_MOE_DECODER_HOOKS,
};

/*
 * qwen3_moe.c -- Qwen3MoeForCausalLM.
 *   Llama layout; q and k get an RMSNorm per head (qk_norm "head") before RoPE; MoE
 *   layers (per layer_kinds) route softmax top-k, renormalized when norm_topk_prob;
 *   the other layers are dense SwiGLU.
 */
#include "arch.h"

static wp_status check(const wpi_container *c, char *err, size_t cap)
{
    return wpi_check_plain(c, "qwen3_moe", WPI_QK_HEAD, 0, err, cap);
}

const wpi_arch wpi_arch_qwen3_moe = {
    .name = "qwen3_moe",
    .check = check,
    WPI_MOE_DECODER_HOOKS,
};

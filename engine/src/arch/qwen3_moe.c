/*
 * qwen3_moe.c -- Qwen3MoeForCausalLM.
 *   Llama layout; q and k get an RMSNorm per head (qk_norm "head") before RoPE; MoE
 *   layers (per layer_kinds) route softmax top-k, renormalized when norm_topk_prob;
 *   the other layers are dense SwiGLU.
 */
#include "arch.h"

static wp_status check(const wpi_container *c, char *err, size_t cap)
{
    if (c->hp.qk_norm != WPI_QK_HEAD)
        return wpi_fail(err, cap, WP_E_FORMAT, "qwen3_moe: qk_norm must be \"head\"");
    if (c->hp.shared_expert_intermediate_size != 0)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "qwen3_moe: hparams.shared_expert_intermediate_size must be 0");
    return wpi_check_decoder(c, err, cap);
}

const wpi_arch wpi_arch_qwen3_moe = {
    .name = "qwen3_moe",
    .check = check,
    WPI_MOE_DECODER_HOOKS,
};

/*
 * gpt_oss.c -- GptOssForCausalLM.
 *   Per layer: h = x + o(attn(rmsnorm(x))) + bo, attention with q/k/v/o biases, YaRN
 *   RoPE (cos/sin scaled by rope_attn_factor), one learned sink logit per head, and a
 *   sliding window on the layers hparams.attn_kinds marks "sliding"; then
 *   x = h + moe(rmsnorm(h)): router with bias, softmax over the top-k logits, experts with
 *   biases and the clamped SwiGLU (swiglu_alpha, swiglu_limit). Every layer is MoE.
 */
#include <stdio.h>

#include "arch.h"

static wp_status need_f32(const wpi_container *c, const char *name, uint64_t rows,
                          uint64_t cols, char *err, size_t cap)
{
    wp_status st = wpi_need_matrix(c, name, rows, cols, err, cap);
    if (st != WP_OK) return st;
    if (wpi_container_tensor(c, name)->dtype != WPI_F32)
        return wpi_fail(err, cap, WP_E_UNSUPPORTED, "tensor '%s' must be f32", name);
    return WP_OK;
}

static wp_status check(const wpi_container *c, char *err, size_t cap)
{
    const wpi_hparams *hp = &c->hp;
    if (hp->qk_norm != WPI_QK_NONE)
        return wpi_fail(err, cap, WP_E_FORMAT, "gpt_oss: qk_norm must be \"none\"");
    if (hp->shared_expert_intermediate_size != 0)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "gpt_oss: hparams.shared_expert_intermediate_size must be 0");
    if (!(hp->swiglu_alpha > 0) || !(hp->swiglu_limit > 0))
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "gpt_oss: hparams swiglu_alpha and swiglu_limit must be > 0");
    wp_status st = wpi_check_decoder(c, err, cap);
    if (st != WP_OK) return st;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        char n[96];
        if (hp->layer_attn[l] == WPI_ATTN_KDA)
            return wpi_fail(err, cap, WP_E_FORMAT, "gpt_oss: layer %u: kda attention", l);
        if (!hp->layer_is_moe[l])
            return wpi_fail(err, cap, WP_E_FORMAT, "gpt_oss: layer %u is not moe", l);
#define NAME(s) (snprintf(n, sizeof n, "blk.%u." s, l), n)
        if ((st = wpi_need_vector(c, NAME("attn_sinks"), hp->n_heads, err, cap)) != WP_OK ||
            (st = wpi_need_vector(c, NAME("ffn_gate_inp.bias"), hp->n_experts, err, cap)) != WP_OK ||
            (st = need_f32(c, NAME("ffn_gate_exps.bias"), hp->n_experts,
                           hp->moe_intermediate_size, err, cap)) != WP_OK ||
            (st = need_f32(c, NAME("ffn_up_exps.bias"), hp->n_experts,
                           hp->moe_intermediate_size, err, cap)) != WP_OK ||
            (st = need_f32(c, NAME("ffn_down_exps.bias"), hp->n_experts, hp->hidden_size, err,
                           cap)) != WP_OK)
            return st;
#undef NAME
    }
    return WP_OK;
}

static wp_status layer_forward(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    const wpi_hparams *hp = m->hp;
    wpi_attention_sw_block(m, l, n, pos,
                           hp->layer_attn[l] == WPI_ATTN_SLIDING ? hp->sliding_window : 0);
    return wpi_moe_oss_block(m, l, n);
}

const wpi_arch wpi_arch_gpt_oss = {"gpt_oss", check, layer_forward};

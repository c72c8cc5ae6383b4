/*
 * kimi_linear.c -- KimiLinearForCausalLM (Kimi-Linear).
 *   Per layer (hparams.attn_kinds): "kda" layers are Kimi Delta Attention (blocks/kda.c,
 *   a recurrent state constant in context), "full" layers are MLA over the latent cache
 *   (blocks/mla.c) without positional encoding: the converter stores rope_freqs of zeros,
 *   so the rope part of q and k is carried unrotated, exactly as transformers does.
 *   Then x = h + ffn(rmsnorm(h)): dense for the first layers (layer_kinds), else MoE with
 *   sigmoid scores, e_score_correction_bias (exp_probs_b) for selection only, grouped
 *   selection, renormalized weights times routed_scaling_factor, and an ungated shared
 *   expert (blocks/moe.c, route_noaux.c).
 */
#include <stdio.h>

#include "arch.h"

static wp_status check(const wpi_container *c, char *err, size_t cap)
{
    const wpi_hparams *hp = &c->hp;
    if (!hp->kv_lora_rank)
        return wpi_fail(err, cap, WP_E_FORMAT, "kimi_linear: kv_lora_rank is required (> 0)");
    if (hp->qk_norm != WPI_QK_NONE || hp->clip_qkv != 0 || hp->shared_expert_gate)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "kimi_linear: no qk_norm, clip_qkv or shared expert gate");
    if (!hp->kda_heads || !hp->kda_head_dim || !hp->kda_conv)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "kimi_linear: kda_heads, kda_head_dim and kda_conv are needed");
    TRY(wpi_check_decoder(c, err, cap));
    char n[96];
    for (uint32_t l = 0; l < hp->n_layers; l++) {
#define NAME(s) (snprintf(n, sizeof n, "blk.%u." s, l), n)
        if (hp->layer_attn[l] == WPI_ATTN_SLIDING)
            return wpi_fail(err, cap, WP_E_FORMAT, "kimi_linear: layer %u: sliding attention", l);
        if (hp->layer_is_moe[l])
            TRY(wpi_opt_vector(c, NAME("exp_probs_b.bias"), hp->n_experts, err, cap));
        if (hp->layer_attn[l] == WPI_ATTN_KDA) {
            TRY(wpi_kda_check_layer(c, l, err, cap));
            continue;
        }
        TRY(wpi_mla_check_layer(c, l, err, cap));
#undef NAME
    }
    return WP_OK;
}

static wp_status layer_forward(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    wpi_mla_kda_project(m, l, n);
    wpi_mla_kda_attend(m, l, n, pos);
    wpi_mla_kda_output(m, l, n);
    return wpi_moe_decoder_ffn(m, l, n);
}

const wpi_arch wpi_arch_kimi_linear = {
    .name = "kimi_linear",
    .check = check,
    WPI_MLA_HOOKS,
    .layer_forward = layer_forward,
    WPI_MLA_KDA_MIXER_HOOKS,
    .ffn = wpi_moe_decoder_ffn,
};

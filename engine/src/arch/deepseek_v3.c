/*
 * deepseek_v3.c -- DeepseekV3ForCausalLM (also Kimi-K2 text and DeepSeek-R1).
 *   x = embed[tok]; per layer: h = x + mla(rmsnorm(x)); x = h + ffn(rmsnorm(h)), the ffn
 *   dense for the first first_k_dense_replace layers (layer_kinds), else MoE: sigmoid
 *   scores, selection on scores + exp_probs_b within the topk_group best of n_group
 *   groups, weights renormalized and times routed_scaling_factor (route_noaux.c), plus
 *   an ungated shared expert. Attention is MLA over the latent cache (blocks/mla.c),
 *   YaRN frequencies in rope_freqs, mscale_all_dim folded into attn_scale.
 */
#include <stdio.h>

#include "arch.h"

static wp_status check(const wpi_container *c, char *err, size_t cap)
{
    const wpi_hparams *hp = &c->hp;
    if (!hp->kv_lora_rank)
        return wpi_fail(err, cap, WP_E_FORMAT, "deepseek_v3: kv_lora_rank is required (> 0)");
    if (hp->qk_norm != WPI_QK_NONE || hp->clip_qkv != 0)
        return wpi_fail(err, cap, WP_E_FORMAT, "deepseek_v3: qk_norm must be \"none\", no clip_qkv");
    if (hp->shared_expert_gate)
        return wpi_fail(err, cap, WP_E_FORMAT, "deepseek_v3: the shared expert has no gate");
    TRY(wpi_check_decoder(c, err, cap));
    char n[96];
    for (uint32_t l = 0; l < hp->n_layers; l++) {
#define NAME(s) (snprintf(n, sizeof n, "blk.%u." s, l), n)
        TRY(wpi_mla_check_layer(c, l, err, cap));
        if (hp->layer_is_moe[l])
            TRY(wpi_opt_vector(c, NAME("exp_probs_b.bias"), hp->n_experts, err, cap));
#undef NAME
    }
    return WP_OK;
}

static wp_status layer_forward(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    wpi_mla_block(m, l, n, pos);
    return wpi_moe_decoder_ffn(m, l, n); /* MoE: noaux_tc routing + shared expert */
}

const wpi_arch wpi_arch_deepseek_v3 = {
    .name = "deepseek_v3",
    .check = check,
    WPI_MLA_HOOKS,
    .layer_forward = layer_forward,
    WPI_MLA_KDA_MIXER_HOOKS, /* every layer MLA */
    .ffn = wpi_moe_decoder_ffn,
};

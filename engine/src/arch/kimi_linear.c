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
    if (!hp->kv_lora_rank || hp->kv_lora_rank > 4096)
        return wpi_fail(err, cap, WP_E_FORMAT, "kimi_linear: kv_lora_rank %u must be in 1..4096",
                        hp->kv_lora_rank);
    if (hp->qk_nope_head_dim + hp->rope_dim != hp->head_dim || !hp->v_head_dim)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "kimi_linear: head_dim %u must be qk_nope_head_dim %u + rope_dim %u",
                        hp->head_dim, hp->qk_nope_head_dim, hp->rope_dim);
    if (hp->qk_norm != WPI_QK_NONE || hp->clip_qkv != 0 || hp->shared_expert_gate)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "kimi_linear: no qk_norm, clip_qkv or shared expert gate");
    if (!hp->kda_heads || !hp->kda_head_dim || hp->kda_head_dim > 1024 || !hp->kda_conv)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "kimi_linear: kda_heads, kda_head_dim (<= 1024) and kda_conv are needed");
    TRY(wpi_check_decoder(c, err, cap));
    const uint64_t H = hp->hidden_size, NH = hp->n_heads, R = hp->kv_lora_rank;
    const uint64_t QL = hp->q_lora_rank, QD = NH * hp->head_dim;
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
        if (QL) {
            TRY(wpi_need_matrix(c, NAME("attn_q_a.weight"), QL, H, err, cap));
            TRY(wpi_opt_vector(c, NAME("attn_q_a.bias"), QL, err, cap));
            TRY(wpi_need_vector(c, NAME("attn_q_a_norm.weight"), QL, err, cap));
            TRY(wpi_need_matrix(c, NAME("attn_q_b.weight"), QD, QL, err, cap));
        } else {
            TRY(wpi_need_matrix(c, NAME("attn_q.weight"), QD, H, err, cap));
        }
        TRY(wpi_need_matrix(c, NAME("attn_kv_a_mqa.weight"), R + hp->rope_dim, H, err, cap));
        TRY(wpi_opt_vector(c, NAME("attn_kv_a_mqa.bias"), R + hp->rope_dim, err, cap));
        TRY(wpi_need_vector(c, NAME("attn_kv_a_norm.weight"), R, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_kv_b.weight"),
                            NH * (hp->qk_nope_head_dim + hp->v_head_dim), R, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_output.weight"), H, NH * hp->v_head_dim, err, cap));
        TRY(wpi_opt_vector(c, NAME("attn_output.bias"), H, err, cap));
#undef NAME
    }
    return WP_OK;
}

static wp_status layer_forward(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    if (m->hp->layer_attn[l] == WPI_ATTN_KDA)
        wpi_kda_block(m, l, n, pos);
    else
        wpi_mla_block(m, l, n, pos);
    if (!m->layers[l].is_moe) {
        wpi_ffn_block(m, l, n);
        return WP_OK;
    }
    return wpi_moe_block(m, l, n);
}

const wpi_arch wpi_arch_kimi_linear = {"kimi_linear", check, layer_forward};

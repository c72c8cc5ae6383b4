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
    if (!hp->kv_lora_rank || hp->kv_lora_rank > 4096)
        return wpi_fail(err, cap, WP_E_FORMAT, "deepseek_v3: kv_lora_rank %u must be in 1..4096",
                        hp->kv_lora_rank);
    if (hp->qk_nope_head_dim + hp->rope_dim != hp->head_dim || !hp->v_head_dim)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "deepseek_v3: head_dim %u must be qk_nope_head_dim %u + rope_dim %u, "
                        "and v_head_dim > 0", hp->head_dim, hp->qk_nope_head_dim,
                        hp->rope_dim);
    if (hp->qk_norm != WPI_QK_NONE || hp->clip_qkv != 0)
        return wpi_fail(err, cap, WP_E_FORMAT, "deepseek_v3: qk_norm must be \"none\", no clip_qkv");
    if (hp->shared_expert_gate)
        return wpi_fail(err, cap, WP_E_FORMAT, "deepseek_v3: the shared expert has no gate");
    TRY(wpi_check_decoder(c, err, cap));
    const uint64_t H = hp->hidden_size, NH = hp->n_heads, R = hp->kv_lora_rank;
    const uint64_t QL = hp->q_lora_rank, QD = NH * hp->head_dim;
    char n[96];
    for (uint32_t l = 0; l < hp->n_layers; l++) {
#define NAME(s) (snprintf(n, sizeof n, "blk.%u." s, l), n)
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
        if (hp->layer_is_moe[l])
            TRY(wpi_opt_vector(c, NAME("exp_probs_b.bias"), hp->n_experts, err, cap));
#undef NAME
    }
    return WP_OK;
}

static wp_status layer_forward(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    wpi_mla_block(m, l, n, pos);
    if (!m->layers[l].is_moe) {
        wpi_ffn_block(m, l, n);
        return WP_OK;
    }
    return wpi_moe_block(m, l, n); /* noaux_tc routing + shared expert */
}

const wpi_arch wpi_arch_deepseek_v3 = {"deepseek_v3", check, layer_forward};

/*
 * qwen2_moe.c -- Qwen2MoeForCausalLM.
 *   Llama layout with q/k/v biases; MoE layers route softmax top-k (renormalized only
 *   when norm_topk_prob) and add a shared expert scaled by sigmoid(w . x).
 */
#include <stdio.h>

#include "internal.h"

static wp_status check(const wpi_container *c, char *err, size_t cap)
{
    const wpi_hparams *hp = &c->hp;
    if (hp->qk_norm != WPI_QK_NONE)
        return wpi_fail(err, cap, WP_E_FORMAT, "qwen2_moe: qk_norm must be \"none\"");
    wp_status st = wpi_check_decoder(c, err, cap);
    if (st != WP_OK) return st;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        static const char *const need[] = {"attn_q.bias", "attn_k.bias", "attn_v.bias"};
        for (int i = 0; i < 3; i++) {
            char name[96];
            snprintf(name, sizeof name, "blk.%u.%s", l, need[i]);
            if (!wpi_container_tensor(c, name))
                return wpi_fail(err, cap, WP_E_FORMAT, "manifest.json: tensor '%s' is missing",
                                name);
        }
    }
    return WP_OK;
}

static wp_status layer_forward(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    wpi_attention_block(m, l, n, pos);
    if (!m->layers[l].is_moe) {
        wpi_ffn_block(m, l, n);
        return WP_OK;
    }
    return wpi_moe_block(m, l, n); /* routed experts + gated shared expert */
}

const wpi_arch wpi_arch_qwen2_moe = {"qwen2_moe", check, layer_forward};

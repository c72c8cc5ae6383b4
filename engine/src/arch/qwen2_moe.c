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

const wpi_arch wpi_arch_qwen2_moe = {"qwen2_moe", check, wpi_moe_decoder_layer};

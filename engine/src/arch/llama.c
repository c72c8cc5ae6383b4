/*
 * llama.c -- LlamaForCausalLM: a dense decoder.
 *   x = embed[tok]; per layer: h = x + o(attn(rmsnorm(x))); x = h + mlp(rmsnorm(h));
 *   logits = lm_head(rmsnorm(x)). q/k/v/o biases when the checkpoint has attention_bias,
 *   gate/up/down biases when it has mlp_bias.
 */
#include "arch.h"

static wp_status check(const wpi_container *c, char *err, size_t cap)
{
    const wpi_hparams *hp = &c->hp;
    if (hp->qk_norm != WPI_QK_NONE)
        return wpi_fail(err, cap, WP_E_FORMAT, "llama: qk_norm must be \"none\"");
    for (uint32_t l = 0; l < hp->n_layers && l < WPI_MAX_LAYERS; l++)
        if (hp->layer_is_moe[l])
            return wpi_fail(err, cap, WP_E_FORMAT, "llama: layer %u is marked moe", l);
    return wpi_check_decoder(c, err, cap);
}

static wp_status ffn(wpi_model *m, uint32_t l, uint32_t n)
{
    wpi_ffn_block(m, l, n);
    return WP_OK;
}

static wp_status layer_forward(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    wpi_attention_block(m, l, n, pos);
    return ffn(m, l, n);
}

const wpi_arch wpi_arch_llama = {
    .name = "llama",
    .check = check,
    .layer_forward = layer_forward,
    .mix_in = wpi_attention_project,
    .mixer = wpi_attention_attend,
    .mixer_seqs = wpi_attention_mixer_seqs,
    .mix_out = wpi_attention_output,
    .ffn = ffn,
};

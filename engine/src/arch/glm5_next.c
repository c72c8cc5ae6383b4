/*
 * glm5_next.c -- Glm5NextForConditionalGeneration's text model (GLM-5.3-Flash).
 *   The residual is hc_mult streams per token (blocks/hyper.c): the embedding is copied
 *   into every stream, and each block runs on their collapse and is expanded back:
 *     x = pre-mix(streams); y = block(x); streams = post * y + comb^T streams
 *   for the attention block and again for the FFN block; after the last layer the streams'
 *   mean goes through the final norm. Attention per layer (attn_kinds): "kda" layers are
 *   Kimi Delta Attention, the forget gate bounded by kda_lower_bound when given
 *   (blocks/kda.c); "full" layers are MLA without positional encoding (blocks/mla.c,
 *   lora norms at rms_norm_eps) restricted to the key pools chosen by the DSA indexer
 *   (blocks/dsa.c): its own for an index_kinds "full" layer, the previous layer's for a
 *   "shared" one. FFN (layer_kinds): dense, or
 *   MoE with sigmoid grouped routing, exp_probs_b for selection only, renormalized weights
 *   times routed_scaling_factor (route_noaux.c) and an ungated shared expert; every SwiGLU
 *   clamps gate <= swiglu_limit and |up| <= swiglu_limit when the limit is > 0 (ffn.c).
 */
#include <stdio.h>
#include <string.h>

#include "arch.h"

static wp_status check_hparams(const wpi_hparams *hp, char *err, size_t cap)
{
#define HP(cond, ...) \
    if (!(cond)) return wpi_fail(err, cap, WP_E_FORMAT, "glm5_next: " __VA_ARGS__)
    HP(hp->kv_lora_rank && hp->kv_lora_rank <= 4096, "kv_lora_rank %u must be in 1..4096",
       hp->kv_lora_rank);
    HP(hp->q_lora_rank > 0, "q_lora_rank is required (the indexer reads the q lora)");
    HP(hp->rope_dim == 0 && hp->qk_nope_head_dim == hp->head_dim && hp->v_head_dim,
       "attention has no positional encoding: rope_dim 0, head_dim = qk_nope_head_dim");
    HP(hp->qk_norm == WPI_QK_NONE && hp->clip_qkv == 0 && !hp->shared_expert_gate,
       "no qk_norm, clip_qkv or shared expert gate");
    HP(hp->hc_mult >= 1 && hp->hc_sinkhorn_iters >= 1, "hc_mult and hc_sinkhorn_iters are needed");
    HP(hp->kda_heads && hp->kda_head_dim && hp->kda_head_dim <= 1024 && hp->kda_conv,
       "kda_heads, kda_head_dim (<= 1024) and kda_conv are needed");
    HP(hp->swiglu_alpha == 0, "no swiglu_alpha (the SwiGLU clamp is swiglu_limit alone)");
    HP(hp->index_kpool && hp->index_tail,
       "the DSA indexer (index_*) with index_tail is needed");
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        HP(hp->layer_attn[l] != WPI_ATTN_SLIDING, "layer %u: sliding attention", l);
        HP(hp->layer_attn[l] == WPI_ATTN_KDA || hp->layer_index[l] != WPI_INDEX_NONE,
           "layer %u: an MLA layer needs index_kinds \"full\" or \"shared\"", l);
        HP(hp->layer_attn[l] != WPI_ATTN_KDA || hp->layer_index[l] == WPI_INDEX_NONE,
           "layer %u: a KDA layer has no indexer (index_kinds \"none\")", l);
    }
#undef HP
    return WP_OK;
}

static wp_status check(const wpi_container *c, char *err, size_t cap)
{
    const wpi_hparams *hp = &c->hp;
    TRY(check_hparams(hp, err, cap));
    TRY(wpi_check_decoder(c, err, cap));
    const uint64_t H = hp->hidden_size, NH = hp->n_heads, R = hp->kv_lora_rank;
    const uint64_t QL = hp->q_lora_rank, QD = NH * hp->head_dim;
    const uint64_t HC = hp->hc_mult, MIX = (2 + HC) * HC;
    const uint64_t ID = hp->index_head_dim, NI = hp->index_heads;
    char n[96];
    for (uint32_t l = 0; l < hp->n_layers; l++) {
#define NAME(s) (snprintf(n, sizeof n, "blk.%u." s, l), n)
        TRY(wpi_need_vector(c, NAME("hc_attn.fn"), MIX * HC * H, err, cap));
        TRY(wpi_need_vector(c, NAME("hc_attn.base"), MIX, err, cap));
        TRY(wpi_need_vector(c, NAME("hc_attn.scale"), 3, err, cap));
        TRY(wpi_need_vector(c, NAME("hc_ffn.fn"), MIX * HC * H, err, cap));
        TRY(wpi_need_vector(c, NAME("hc_ffn.base"), MIX, err, cap));
        TRY(wpi_need_vector(c, NAME("hc_ffn.scale"), 3, err, cap));
        if (hp->layer_is_moe[l])
            TRY(wpi_opt_vector(c, NAME("exp_probs_b.bias"), hp->n_experts, err, cap));
        if (hp->layer_attn[l] == WPI_ATTN_KDA) {
            TRY(wpi_kda_check_layer(c, l, err, cap));
            continue;
        }
        TRY(wpi_need_matrix(c, NAME("attn_q_a.weight"), QL, H, err, cap));
        TRY(wpi_need_vector(c, NAME("attn_q_a_norm.weight"), QL, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_q_b.weight"), QD, QL, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_kv_a_mqa.weight"), R, H, err, cap));
        TRY(wpi_need_vector(c, NAME("attn_kv_a_norm.weight"), R, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_kv_b.weight"),
                            NH * (hp->qk_nope_head_dim + hp->v_head_dim), R, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_output.weight"), H, NH * hp->v_head_dim, err, cap));
        if (hp->layer_index[l] != WPI_INDEX_FULL) continue;
        TRY(wpi_need_matrix(c, NAME("attn_idx_q.weight"), NI * ID, QL, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_idx_k.weight"), ID, H, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_idx_gate.weight"), ID, H, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_idx_w.weight"), NI, H, err, cap));
        TRY(wpi_need_vector(c, NAME("attn_idx_k_norm.weight"), ID, err, cap));
        TRY(wpi_need_vector(c, NAME("attn_idx_k_norm.bias"), ID, err, cap));
        TRY(wpi_need_vector(c, NAME("attn_idx_ape"), (uint64_t)hp->index_kpool * ID, err, cap));
#undef NAME
    }
    return WP_OK;
}

static wp_status layer_forward(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    const size_t H = hp->hidden_size, S = (size_t)hp->hc_mult * H;
    const wpi_hc_dims d = {hp->hc_mult, hp->hidden_size, hp->hc_sinkhorn_iters, hp->hc_eps,
                           hp->rms_norm_eps};
    if (l == 0) /* the embedding into every stream */
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t s = 0; s < hp->hc_mult; s++)
                memcpy(m->hc_x + t * S + s * H, m->x + t * H, H * sizeof(float));

    /* attention: the block reads x and leaves its output in xn */
    wpi_hc_pre(m->k, m->pool, &d, L->hc_attn_fn, L->hc_attn_base, L->hc_attn_scale, m->hc_x,
               n, m->hc_post, m->hc_comb, m->x, H, m->hc_scr);
    if (hp->layer_attn[l] == WPI_ATTN_KDA) {
        wpi_kda_block(m, l, n, pos);
    } else {
        wpi_mla_project(m, l, n, pos);
        if (hp->layer_index[l] == WPI_INDEX_FULL) wpi_dsa_index(m, l, n, pos);
        wpi_mla_attend(m, l, n, pos, 1);
    }
    wpi_hc_post(m->pool, &d, m->hc_x, m->xn, H, m->hc_post, m->hc_comb, n);

    /* FFN: the block reads x and leaves its output in moe_out */
    wpi_hc_pre(m->k, m->pool, &d, L->hc_ffn_fn, L->hc_ffn_base, L->hc_ffn_scale, m->hc_x, n,
               m->hc_post, m->hc_comb, m->x, H, m->hc_scr);
    if (L->is_moe) {
        wp_status st = wpi_moe_block(m, l, n);
        if (st != WP_OK) return st;
    } else {
        wpi_ffn_block(m, l, n);
    }
    wpi_hc_post(m->pool, &d, m->hc_x, m->moe_out, H, m->hc_post, m->hc_comb, n);

    if (l + 1 == hp->n_layers) /* the final norm reads x: the streams' mean */
        wpi_hc_head(m->k, m->pool, &d, NULL, NULL, NULL, m->hc_x, n, m->x, H, NULL);
    return WP_OK;
}

const wpi_arch wpi_arch_glm5_next = {"glm5_next", check, layer_forward};

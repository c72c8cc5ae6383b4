/*
 * deepseek_v4.c -- DeepseekV4ForCausalLM (DeepSeek V4 / V4.1 Flash).
 *   The residual is hc_mult hyper-connection streams (blocks/hyper.c): the embedding is
 *   copied into every stream; per layer
 *     a = attention(rmsnorm(collapse_attn(h)))      blocks/attention_csa.c: sliding window,
 *     h = post_attn * a + comb_attn^T h              plus HCA or CSA compressed keys
 *     f = moe(rmsnorm(collapse_ffn(h)))              blocks/moe_v4.c: hash or top-k routing,
 *     h = post_ffn * f + comb_ffn^T h                sqrtsoftplus scores, shared expert
 *   and after the last layer the hyper head collapses the streams into x, which the common
 *   walk (forward.c) normalizes and projects to logits. Tensors: docs/FORMAT.md section 4.
 *   The multi-token-prediction head is not used.
 */
#include <stdio.h>
#include <string.h>

#include "arch.h"

/* attention_csa.c */
void wpi_v4_hc_buffers(wpi_model *m, float **streams, float **post, float **comb,
                       float **hcs, float **coll, float **y);

static wp_status need_f32(const wpi_container *c, const char *name, uint64_t rows,
                          uint64_t cols, char *err, size_t cap)
{
    TRY(wpi_need_matrix(c, name, rows, cols, err, cap));
    if (wpi_container_tensor(c, name)->dtype != WPI_F32)
        return wpi_fail(err, cap, WP_E_UNSUPPORTED, "tensor '%s' must be f32", name);
    return WP_OK;
}

static wp_status check(const wpi_container *c, char *err, size_t cap)
{
    const wpi_hparams *hp = &c->hp;
#define HP(cond, ...) \
    if (!(cond)) return wpi_fail(err, cap, WP_E_FORMAT, "deepseek_v4: " __VA_ARGS__)
    TRY(wpi_hparams_check(hp, err, cap));
    HP(hp->hc_mult >= 1 && hp->hc_mult <= WPI_HC_MAX && hp->hc_sinkhorn_iters >= 1,
       "hc_mult %u must be in 1..%u and hc_sinkhorn_iters >= 1", hp->hc_mult, WPI_HC_MAX);
    HP(hp->n_heads > 0 && hp->n_heads <= 4096 && hp->n_kv_heads == 1,
       "n_heads %u in 1..4096 sharing one key/value head (n_kv_heads %u)", hp->n_heads,
       hp->n_kv_heads);
    HP(hp->head_dim >= 2 && hp->head_dim <= 4096, "head_dim %u", hp->head_dim);
    HP(hp->rope_dim % 2 == 0 && hp->rope_dim <= hp->head_dim && hp->rope_dim <= 1024,
       "rope_dim %u must be even and <= head_dim %u", hp->rope_dim, hp->head_dim);
    HP(hp->q_lora_rank > 0, "q_lora_rank must be > 0");
    HP(hp->sliding_window >= 1, "sliding_window must be >= 1");
    HP(hp->o_groups >= 1 && (hp->n_heads * hp->head_dim) % hp->o_groups == 0 &&
           hp->o_lora_rank >= 1,
       "o_groups %u must divide n_heads * head_dim and o_lora_rank be >= 1", hp->o_groups);
    HP(hp->attn_scale > 0 && hp->rms_norm_eps >= 0, "attn_scale / rms_norm_eps");
    HP(hp->qk_norm == WPI_QK_NONE && hp->clip_qkv == 0 && !hp->shared_expert_gate,
       "no qk_norm, clip_qkv or shared expert gate");
    HP(hp->scoring == WPI_SCORE_SQRTSOFTPLUS, "scoring_func must be \"sqrtsoftplus\"");
    HP(hp->n_experts > 0 && hp->n_experts <= 4096 && hp->top_k > 0 &&
           hp->top_k <= hp->n_experts && hp->moe_intermediate_size > 0,
       "n_experts %u, top_k %u, moe_intermediate_size %u", hp->n_experts, hp->top_k,
       hp->moe_intermediate_size);
    HP(hp->compress_rate_csa <= 1024 && hp->compress_rate_hca <= 1024,
       "compression rates must be <= 1024");
    int any_csa = 0, any_cmp = 0;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        any_csa |= hp->layer_compress[l] == WPI_CMP_CSA;
        any_cmp |= hp->layer_compress[l] != WPI_CMP_NONE;
        HP(hp->layer_is_moe[l], "layer %u: every layer is MoE", l);
    }
    if (any_csa)
        HP(hp->index_heads >= 1 && hp->index_head_dim >= hp->rope_dim &&
               hp->index_head_dim <= 4096 && hp->index_topk >= 1,
           "CSA layers need index_heads, index_head_dim >= rope_dim and index_topk");
    const uint64_t H = hp->hidden_size, NH = hp->n_heads, hd = hp->head_dim;
    const uint64_t QL = hp->q_lora_rank, hc = hp->hc_mult, R = (2 + hc) * hc;
    const uint64_t ihd = hp->index_head_dim, ih = hp->index_heads;
    const uint64_t G = hp->o_groups, OR = hp->o_lora_rank, S = hp->shared_expert_intermediate_size;
    TRY(wpi_need_matrix(c, "token_embd.weight", hp->vocab_size, H, err, cap));
    TRY(wpi_need_vector(c, "output_norm.weight", H, err, cap));
    if (!hp->tie_word_embeddings)
        TRY(wpi_need_matrix(c, "output.weight", hp->vocab_size, H, err, cap));
    TRY(wpi_need_vector(c, "rope_freqs", hp->rope_dim / 2, err, cap));
    if (any_cmp) TRY(wpi_need_vector(c, "rope_freqs_compress", hp->rope_dim / 2, err, cap));
    TRY(need_f32(c, "hc_head.fn", hc, hc * H, err, cap));
    TRY(wpi_need_vector(c, "hc_head.base", hc, err, cap));
    TRY(wpi_need_vector(c, "hc_head.scale", 1, err, cap));
    char n[96];
    for (uint32_t l = 0; l < hp->n_layers; l++) {
#define NAME(s) (snprintf(n, sizeof n, "blk.%u." s, l), n)
        TRY(wpi_need_vector(c, NAME("attn_norm.weight"), H, err, cap));
        TRY(wpi_need_vector(c, NAME("ffn_norm.weight"), H, err, cap));
        TRY(need_f32(c, NAME("hc_attn.fn"), R, hc * H, err, cap));
        TRY(wpi_need_vector(c, NAME("hc_attn.base"), R, err, cap));
        TRY(wpi_need_vector(c, NAME("hc_attn.scale"), 3, err, cap));
        TRY(need_f32(c, NAME("hc_ffn.fn"), R, hc * H, err, cap));
        TRY(wpi_need_vector(c, NAME("hc_ffn.base"), R, err, cap));
        TRY(wpi_need_vector(c, NAME("hc_ffn.scale"), 3, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_q_a.weight"), QL, H, err, cap));
        TRY(wpi_need_vector(c, NAME("attn_q_a_norm.weight"), QL, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_q_b.weight"), NH * hd, QL, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_kv.weight"), hd, H, err, cap));
        TRY(wpi_need_vector(c, NAME("attn_kv_norm.weight"), hd, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_output_a.weight"), G * OR, NH * hd / G, err, cap));
        TRY(wpi_need_matrix(c, NAME("attn_output_b.weight"), H, G * OR, err, cap));
        TRY(wpi_need_vector(c, NAME("attn_sinks"), NH, err, cap));
        const int k = hp->layer_compress[l];
        if (k != WPI_CMP_NONE) {
            const uint64_t m = k == WPI_CMP_CSA ? hp->compress_rate_csa : hp->compress_rate_hca;
            const uint64_t w = k == WPI_CMP_CSA ? 2 * hd : hd;
            TRY(wpi_need_matrix(c, NAME("attn_cmp_kv.weight"), w, H, err, cap));
            TRY(wpi_need_matrix(c, NAME("attn_cmp_gate.weight"), w, H, err, cap));
            TRY(wpi_need_vector(c, NAME("attn_cmp_bias"), m * w, err, cap));
            TRY(wpi_need_vector(c, NAME("attn_cmp_norm.weight"), hd, err, cap));
            if (k == WPI_CMP_CSA) {
                TRY(wpi_need_matrix(c, NAME("attn_idx_kv.weight"), 2 * ihd, H, err, cap));
                TRY(wpi_need_matrix(c, NAME("attn_idx_gate.weight"), 2 * ihd, H, err, cap));
                TRY(wpi_need_vector(c, NAME("attn_idx_bias"), m * 2 * ihd, err, cap));
                TRY(wpi_need_vector(c, NAME("attn_idx_norm.weight"), ihd, err, cap));
                TRY(wpi_need_matrix(c, NAME("attn_idx_q.weight"), ih * ihd, QL, err, cap));
                TRY(wpi_need_matrix(c, NAME("attn_idx_w.weight"), ih, H, err, cap));
            }
        }
        TRY(need_f32(c, NAME("ffn_gate_inp.weight"), hp->n_experts, H, err, cap));
        if (hp->layer_hash[l]) {
            TRY(need_f32(c, NAME("ffn_hash_ids"), hp->vocab_size, hp->top_k, err, cap));
            const float *t = wpi_container_tensor(c, NAME("ffn_hash_ids"))->data;
            if (t) /* resident once loaded: every id names an expert */
                for (uint64_t i = 0; i < (uint64_t)hp->vocab_size * hp->top_k; i++)
                    if (!(t[i] >= 0 && t[i] < (float)hp->n_experts && t[i] == (float)(int32_t)t[i]))
                        return wpi_fail(err, cap, WP_E_FORMAT,
                                        "tensor '%s': entry %llu is not an expert id", n,
                                        (unsigned long long)i);
        } else {
            TRY(wpi_opt_vector(c, NAME("exp_probs_b.bias"), hp->n_experts, err, cap));
        }
        if (S) {
            TRY(wpi_need_matrix(c, NAME("ffn_gate_shexp.weight"), S, H, err, cap));
            TRY(wpi_need_matrix(c, NAME("ffn_up_shexp.weight"), S, H, err, cap));
            TRY(wpi_need_matrix(c, NAME("ffn_down_shexp.weight"), H, S, err, cap));
        }
        TRY(wpi_check_expert_bank(c, l, err, cap));
#undef NAME
    }
#undef HP
    return WP_OK;
}

static wpi_hc_dims dims(const wpi_hparams *hp)
{
    wpi_hc_dims d = {hp->hc_mult, hp->hidden_size, hp->hc_sinkhorn_iters, hp->hc_eps,
                     hp->rms_norm_eps};
    return d;
}

static wp_status layer_forward(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    const size_t H = hp->hidden_size, hc = hp->hc_mult;
    const wpi_hc_dims d = dims(hp);
    float *streams, *post, *comb, *hcs, *coll, *y;
    wpi_v4_hc_buffers(m, &streams, &post, &comb, &hcs, &coll, &y);
    if (l == 0)
        for (uint32_t t = 0; t < n; t++)
            for (size_t k = 0; k < hc; k++)
                memcpy(streams + (t * hc + k) * H, m->x + t * H, H * sizeof(float));

    wpi_hc_pre(m->k, m->pool, &d, L->hc_attn_fn, L->hc_attn_base, L->hc_attn_scale, streams,
               n, post, comb, coll, H, hcs);
    for (uint32_t t = 0; t < n; t++)
        wpi_rmsnorm(m->xn + t * H, coll + t * H, L->attn_norm, H, hp->rms_norm_eps);
    wpi_v4_attention(m, l, m->xn, n, pos, y);
    wpi_hc_post(m->pool, &d, streams, y, H, post, comb, n);

    wpi_hc_pre(m->k, m->pool, &d, L->hc_ffn_fn, L->hc_ffn_base, L->hc_ffn_scale, streams, n,
               post, comb, coll, H, hcs);
    for (uint32_t t = 0; t < n; t++)
        wpi_rmsnorm(m->xn + t * H, coll + t * H, L->ffn_norm, H, hp->rms_norm_eps);
    wp_status st = wpi_v4_moe(m, l, m->xn, n, y);
    if (st != WP_OK) return st;
    wpi_hc_post(m->pool, &d, streams, y, H, post, comb, n);
    if (m->lookahead && n == 1 && l + 1 < hp->n_layers && m->layers[l + 1].is_moe) {
        /* the next layer's FFN input, approximated by the streams' mean (its attention
         * and mixes skipped): enough for its router to name most of its experts */
        memset(y, 0, H * sizeof(float));
        for (size_t k = 0; k < hc; k++) m->k->axpy_f32(1.0f / (float)hc, streams + k * H, y, H);
        wpi_v4_lookahead(m, l, y);
    }

    if (l + 1 == hp->n_layers) {
        wpi_hc_head(m->k, m->pool, &d, m->hc_head_fn, m->hc_head_base, m->hc_head_scale,
                    streams, n, m->x, H, hcs);
    }
    return WP_OK;
}

const wpi_arch wpi_arch_deepseek_v4 = {"deepseek_v4", check, layer_forward};

/*
 * checks.c -- the tensor checks arch check functions call (model.h): one tensor's shape
 * and dtype, one layer's expert bank, and what every plain decoder shares.
 * err names the tensor, key or layer at fault; nothing is read but the manifest's index.
 */
#include <stdio.h>

#include "model.h"

wp_status wpi_need_matrix(const wpi_container *c, const char *name, uint64_t rows,
                          uint64_t cols, char *err, size_t cap)
{
    const wpi_tensor *t = wpi_container_tensor(c, name);
    if (!t)
        return wpi_fail(err, cap, WP_E_FORMAT, "manifest.json: tensor '%s' is missing", name);
    if (t->n_dims != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "manifest.json: tensor '%s' has shape [%llu, %llu], hparams give "
                        "[%llu, %llu]", name,
                        (unsigned long long)t->shape[0], (unsigned long long)t->shape[1],
                        (unsigned long long)rows, (unsigned long long)cols);
    if (!wpi_dtype_valid(t->dtype) || wpi_row_bytes(t->dtype, cols) == 0)
        return wpi_fail(err, cap, WP_E_UNSUPPORTED, "tensor '%s' has unsupported dtype %d",
                        name, t->dtype);
    if (t->bytes != rows * wpi_row_bytes(t->dtype, cols))
        return wpi_fail(err, cap, WP_E_FORMAT, "tensor '%s' has %llu bytes for its shape",
                        name, (unsigned long long)t->bytes);
    return WP_OK;
}

wp_status wpi_opt_vector(const wpi_container *c, const char *name, uint64_t n,
                         char *err, size_t cap)
{
    const wpi_tensor *t = wpi_container_tensor(c, name);
    if (!t) return WP_OK;
    if (t->shape[0] * t->shape[1] != n || (t->n_dims == 2 && t->shape[0] != 1))
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "manifest.json: tensor '%s' has %llu elements, hparams give %llu", name,
                        (unsigned long long)(t->shape[0] * t->shape[1]),
                        (unsigned long long)n);
    if (t->dtype != WPI_F32)
        return wpi_fail(err, cap, WP_E_UNSUPPORTED, "tensor '%s' must be f32, not %s", name,
                        wpi_dtype_name(t->dtype));
    if (t->bytes != n * sizeof(float))
        return wpi_fail(err, cap, WP_E_FORMAT, "tensor '%s' has %llu bytes for its shape",
                        name, (unsigned long long)t->bytes);
    return WP_OK;
}

wp_status wpi_need_vector(const wpi_container *c, const char *name, uint64_t n,
                          char *err, size_t cap)
{
    if (!wpi_container_tensor(c, name))
        return wpi_fail(err, cap, WP_E_FORMAT, "manifest.json: tensor '%s' is missing", name);
    return wpi_opt_vector(c, name, n, err, cap);
}

wp_status wpi_need_f32_matrix(const wpi_container *c, const char *name, uint64_t rows,
                              uint64_t cols, char *err, size_t cap)
{
    wp_status st = wpi_need_matrix(c, name, rows, cols, err, cap);
    if (st != WP_OK) return st;
    if (wpi_container_tensor(c, name)->dtype != WPI_F32)
        return wpi_fail(err, cap, WP_E_UNSUPPORTED, "tensor '%s' must be f32", name);
    return WP_OK;
}

wp_status wpi_check_expert_bank(const wpi_container *c, uint32_t l, char *err, size_t cap)
{
    const wpi_hparams *hp = &c->hp;
    int32_t b = c->bank_of_layer[l];
    if (b < 0 || (uint32_t)b >= c->n_banks)
        return wpi_fail(err, cap, WP_E_FORMAT, "layer %u is MoE but has no expert bank", l);
    const wpi_bank *bk = &c->banks[b];
    const uint32_t eh = hp->expert_hidden_size ? hp->expert_hidden_size : hp->hidden_size;
    if (bk->n_experts != hp->n_experts || bk->inter != hp->moe_intermediate_size ||
        bk->hidden != eh)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "manifest.json: expert bank of layer %u is %u x [%u, %u], hparams "
                        "give %u x [%u, %u]", l,
                        bk->n_experts, bk->inter, bk->hidden, hp->n_experts,
                        hp->moe_intermediate_size, eh);
    if (!wpi_dtype_valid(bk->dtype) || wpi_row_bytes(bk->dtype, bk->hidden) == 0 ||
        wpi_row_bytes(bk->dtype, bk->inter) == 0)
        return wpi_fail(err, cap, WP_E_UNSUPPORTED,
                        "expert bank of layer %u has unsupported dtype %d", l, bk->dtype);
    return WP_OK;
}

wp_status wpi_check_decoder(const wpi_container *c, char *err, size_t cap)
{
    const wpi_hparams *hp = &c->hp;
    const uint64_t H = hp->hidden_size, V = hp->vocab_size;
    const uint64_t QD = (uint64_t)hp->n_heads * hp->head_dim;
    const uint64_t KD = (uint64_t)hp->n_kv_heads * hp->head_dim;
    char n[96];
    TRY(wpi_hparams_check(hp, err, cap));
    TRY(wpi_need_matrix(c, "token_embd.weight", V, H, err, cap));
    TRY(wpi_need_vector(c, "output_norm.weight", H, err, cap));
    if (!hp->tie_word_embeddings) TRY(wpi_need_matrix(c, "output.weight", V, H, err, cap));
    if (hp->rope_dim > 0) TRY(wpi_need_vector(c, "rope_freqs", hp->rope_dim / 2, err, cap));
    for (uint32_t l = 0; l < hp->n_layers; l++) {
#define NAME(s) (snprintf(n, sizeof n, "blk.%u." s, l), n)
        TRY(wpi_need_vector(c, NAME("attn_norm.weight"), H, err, cap));
        TRY(wpi_need_vector(c, NAME("ffn_norm.weight"), H, err, cap));
        /* MLA layers (kv_lora_rank > 0) have no q/k/v: their arch checks them. */
        if (!hp->kv_lora_rank) {
            TRY(wpi_need_matrix(c, NAME("attn_q.weight"), QD, H, err, cap));
            TRY(wpi_need_matrix(c, NAME("attn_k.weight"), KD, H, err, cap));
            TRY(wpi_need_matrix(c, NAME("attn_v.weight"), KD, H, err, cap));
            TRY(wpi_need_matrix(c, NAME("attn_output.weight"), H, QD, err, cap));
            TRY(wpi_opt_vector(c, NAME("attn_q.bias"), QD, err, cap));
            TRY(wpi_opt_vector(c, NAME("attn_k.bias"), KD, err, cap));
            TRY(wpi_opt_vector(c, NAME("attn_v.bias"), KD, err, cap));
            TRY(wpi_opt_vector(c, NAME("attn_output.bias"), H, err, cap));
            if (hp->qk_norm != WPI_QK_NONE) {
                int full = hp->qk_norm == WPI_QK_FULL;
                TRY(wpi_need_vector(c, NAME("attn_q_norm.weight"), full ? QD : hp->head_dim,
                                    err, cap));
                TRY(wpi_need_vector(c, NAME("attn_k_norm.weight"), full ? KD : hp->head_dim,
                                    err, cap));
            }
        }
        if (!hp->layer_is_moe[l]) {
            uint64_t I = hp->intermediate_size;
            if (I == 0)
                return wpi_fail(err, cap, WP_E_FORMAT,
                                "layer %u is dense but intermediate_size is 0", l);
            TRY(wpi_need_matrix(c, NAME("ffn_gate.weight"), I, H, err, cap));
            TRY(wpi_need_matrix(c, NAME("ffn_up.weight"), I, H, err, cap));
            TRY(wpi_need_matrix(c, NAME("ffn_down.weight"), H, I, err, cap));
            TRY(wpi_opt_vector(c, NAME("ffn_gate.bias"), I, err, cap));
            TRY(wpi_opt_vector(c, NAME("ffn_up.bias"), I, err, cap));
            TRY(wpi_opt_vector(c, NAME("ffn_down.bias"), H, err, cap));
            continue;
        }
        TRY(wpi_need_f32_matrix(c, NAME("ffn_gate_inp.weight"), hp->n_experts, H, err, cap));
        TRY(wpi_check_expert_bank(c, l, err, cap));
        uint64_t S = hp->shared_expert_intermediate_size;
        if (S > 0) {
            TRY(wpi_need_matrix(c, NAME("ffn_gate_shexp.weight"), S, H, err, cap));
            TRY(wpi_need_matrix(c, NAME("ffn_up_shexp.weight"), S, H, err, cap));
            TRY(wpi_need_matrix(c, NAME("ffn_down_shexp.weight"), H, S, err, cap));
            if (hp->shared_expert_gate)
                TRY(wpi_need_vector(c, NAME("ffn_gate_inp_shexp.weight"), H, err, cap));
        }
#undef NAME
    }
    return WP_OK;
}

wp_status wpi_check_plain(const wpi_container *c, const char *arch, int qk_norm, int shared,
                          char *err, size_t cap)
{
    if (c->hp.qk_norm != qk_norm)
        return wpi_fail(err, cap, WP_E_FORMAT, "%s: qk_norm must be \"%s\"", arch,
                        wpi_qk_norm_names[qk_norm]);
    if (!shared && c->hp.shared_expert_intermediate_size != 0)
        return wpi_fail(err, cap, WP_E_FORMAT,
                        "%s: hparams.shared_expert_intermediate_size must be 0", arch);
    return wpi_check_decoder(c, err, cap);
}

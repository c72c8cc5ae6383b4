/*
 * hparams_dsv4.c -- the optional hyperparameters of docs/FORMAT.md section 3 for
 * deepseek_v4: hyper-connections (hc_mult, hc_sinkhorn_iters, hc_eps; glm5_next too, whose
 * own keys hparams_glm5.c reads after these), the grouped output
 * projection (o_groups, o_lora_rank), the CSA indexer (index_heads, index_head_dim,
 * index_topk), the compression rates (compress_rate_csa, compress_rate_hca), the per-layer
 * attention compression (compress_kinds: "none", "csa" or "hca") and hash-routed MoE
 * layers (hash_layers: booleans).
 *
 * Every key is optional; absent means zero (off). The architecture's check decides which
 * it needs.
 */
#include <string.h>

#include "blocks.h"
#include "json.h"

#define W "manifest.json: hparams"

wp_status wpi_hparams_dsv4(const struct wpi_json *h, wpi_hparams *hp, char *err, size_t cap)
{
    wp_status st;
    memset(hp->layer_compress, WPI_CMP_NONE, sizeof hp->layer_compress);
    memset(hp->layer_hash, 0, sizeof hp->layer_hash);
    hp->hc_eps = 0;
    /* deepseek_v4 keeps a state block per layer (attention_csa.c) instead of KV rows */
    hp->v4_state = strcmp(hp->model_type, "deepseek_v4") == 0;
    if ((st = wpi_hparam_u32(h, "hc_mult", 0, WPI_HC_MAX, &hp->hc_mult, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "hc_sinkhorn_iters", 0, 10000, &hp->hc_sinkhorn_iters, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "o_groups", 0, 4096, &hp->o_groups, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "o_lora_rank", 0, 1u << 16, &hp->o_lora_rank, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "index_heads", 0, 4096, &hp->index_heads, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "index_head_dim", 0, 4096, &hp->index_head_dim, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "index_topk", 0, 1u << 20, &hp->index_topk, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "compress_rate_csa", 0, 1u << 16, &hp->compress_rate_csa, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "compress_rate_hca", 0, 1u << 16, &hp->compress_rate_hca, err, cap)) != WP_OK)
        return st;
    const wpi_json *v = wpi_json_get(h, "hc_eps");
    if (v && v->type != WPI_JSON_NULL) {
        double d;
        if (!wpi_json_num(v, &d) || !(d >= 0 && d < 1))
            return wpi_fail(err, cap, WP_E_FORMAT, W ".hc_eps: expected a number in [0, 1)");
        hp->hc_eps = (float)d;
    }
    v = wpi_json_get(h, "compress_kinds");
    if (v && v->type != WPI_JSON_NULL) {
        if (v->type != WPI_JSON_ARRAY || v->len != hp->n_layers)
            return wpi_fail(err, cap, WP_E_FORMAT, W ".compress_kinds: expected %u strings",
                            hp->n_layers);
        for (uint32_t l = 0; l < hp->n_layers; l++) {
            const char *k = wpi_json_str(&v->items[l]);
            if (k && !strcmp(k, "none"))
                hp->layer_compress[l] = WPI_CMP_NONE;
            else if (k && !strcmp(k, "csa") && hp->compress_rate_csa)
                hp->layer_compress[l] = WPI_CMP_CSA;
            else if (k && !strcmp(k, "hca") && hp->compress_rate_hca)
                hp->layer_compress[l] = WPI_CMP_HCA;
            else
                return wpi_fail(err, cap, WP_E_FORMAT,
                                W ".compress_kinds[%u]: expected \"none\", \"csa\" (with "
                                  "compress_rate_csa) or \"hca\" (with compress_rate_hca)", l);
        }
    }
    v = wpi_json_get(h, "hash_layers");
    if (v && v->type != WPI_JSON_NULL) {
        if (v->type != WPI_JSON_ARRAY || v->len != hp->n_layers)
            return wpi_fail(err, cap, WP_E_FORMAT, W ".hash_layers: expected %u booleans",
                            hp->n_layers);
        for (uint32_t l = 0; l < hp->n_layers; l++) {
            int b;
            if (!wpi_json_bool(&v->items[l], &b))
                return wpi_fail(err, cap, WP_E_FORMAT, W ".hash_layers[%u]: expected a boolean", l);
            hp->layer_hash[l] = (uint8_t)b;
        }
    }
    return WP_OK;
}

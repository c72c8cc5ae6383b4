/*
 * hparams_glm5.c -- the optional hyperparameters of docs/FORMAT.md section 3 for glm5_next:
 * the bounded KDA forget gate (kda_lower_bound), the eps of the MLA lora norms
 * (lora_norm_eps) and the DSA indexer's pools (index_kpool, index_tail, index_kinds). The
 * keys it shares with deepseek_v4 (hc_mult, hc_sinkhorn_iters, hc_eps, index_heads,
 * index_head_dim, index_topk) are read by hparams_dsv4.c.
 *
 * Every key is optional; absent means off. Present keys are bounds-checked; the
 * architecture's check function decides which it needs.
 */
#include <string.h>

#include "container.h"
#include "json.h"

#define W "manifest.json: hparams"
#define MAX_SEL 1024 /* index_topk / index_kpool: pools one token may select */

static wp_status index_kinds(const wpi_json *h, wpi_hparams *hp, char *err, size_t cap)
{
    memset(hp->layer_index, WPI_INDEX_NONE, sizeof hp->layer_index);
    const wpi_json *v = wpi_json_get(h, "index_kinds");
    if (!v || v->type == WPI_JSON_NULL) return WP_OK;
    if (v->type != WPI_JSON_ARRAY || v->len != hp->n_layers)
        return wpi_fail(err, cap, WP_E_FORMAT, W ".index_kinds: expected %u strings",
                        hp->n_layers);
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const char *k = wpi_json_str(&v->items[l]);
        if (k && !strcmp(k, "none"))
            hp->layer_index[l] = WPI_INDEX_NONE;
        else if (k && !strcmp(k, "full"))
            hp->layer_index[l] = WPI_INDEX_FULL;
        else if (k && !strcmp(k, "shared"))
            hp->layer_index[l] = WPI_INDEX_SHARED;
        else
            return wpi_fail(err, cap, WP_E_FORMAT,
                            W ".index_kinds[%u]: expected \"none\", \"full\" or \"shared\"", l);
        if (hp->layer_index[l] != WPI_INDEX_NONE && !hp->index_heads)
            return wpi_fail(err, cap, WP_E_FORMAT,
                            W ".index_kinds[%u]: an indexer needs index_heads, index_head_dim, "
                              "index_topk and index_kpool", l);
        /* a shared layer reuses the selection of the layer right before it */
        if (hp->layer_index[l] == WPI_INDEX_SHARED &&
            (l == 0 || hp->layer_index[l - 1] != WPI_INDEX_FULL))
            return wpi_fail(err, cap, WP_E_FORMAT,
                            W ".index_kinds[%u]: \"shared\" must follow a \"full\" layer", l);
    }
    return WP_OK;
}

wp_status wpi_hparams_glm5(const struct wpi_json *h, wpi_hparams *hp, char *err, size_t cap)
{
    wp_status st;
    int safe = 0;
    float *lb = &hp->kda_lower_bound;
    /* hc_mult, hc_sinkhorn_iters, hc_eps and index_heads, index_head_dim, index_topk are
     * shared with deepseek_v4 and read by wpi_hparams_dsv4 (called before this) */
    if ((st = wpi_hparam_num(h, "kda_lower_bound", -1e6, 0, lb, &safe, err, cap)) != WP_OK ||
        (st = wpi_hparam_num(h, "lora_norm_eps", 0, 1, &hp->lora_norm_eps, NULL, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "index_kpool", 1, 4096, &hp->index_kpool, err, cap)) != WP_OK)
        return st;
    hp->kda_safe_gate = safe;
    if (hp->hc_mult && !hp->hc_sinkhorn_iters)
        return wpi_fail(err, cap, WP_E_FORMAT, W ": hc_mult needs hc_sinkhorn_iters");
    if (hp->index_kpool && (!hp->index_heads || !hp->index_head_dim || !hp->index_topk))
        return wpi_fail(err, cap, WP_E_FORMAT,
                        W ": index_kpool needs index_heads, index_head_dim and index_topk");
    if (hp->index_kpool) {
        if (hp->index_topk % hp->index_kpool)
            return wpi_fail(err, cap, WP_E_FORMAT,
                            W ".index_topk: %u is not a multiple of index_kpool %u",
                            hp->index_topk, hp->index_kpool);
        if (hp->index_topk / hp->index_kpool > MAX_SEL)
            return wpi_fail(err, cap, WP_E_FORMAT,
                            W ".index_topk: more than %u pools per token", MAX_SEL);
    }
    hp->index_tail = hp->index_kpool > 0;
    const wpi_json *v = wpi_json_get(h, "index_tail");
    if (v && v->type != WPI_JSON_NULL) {
        int b;
        if (!wpi_json_bool(v, &b))
            return wpi_fail(err, cap, WP_E_FORMAT, W ".index_tail: expected true or false");
        hp->index_tail = b;
    }
    return index_kinds(h, hp, err, cap);
}

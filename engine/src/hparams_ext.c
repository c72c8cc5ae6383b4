/*
 * hparams_ext.c -- the optional hyperparameters of docs/FORMAT.md section 3 that only some
 * architectures use: sliding-window attention and per-layer attention kinds (gpt_oss,
 * kimi_linear), the clamped SwiGLU of gpt_oss experts, the KDA shape of kimi_linear.
 *
 * Every key is optional; absent means zero (off). Present keys are bounds-checked like the
 * required ones, and the architecture's check function decides which it needs.
 */
#include <float.h>
#include <string.h>

#include "container.h"
#include "json.h"

#define W "manifest.json: hparams"

wp_status wpi_hparam_u32(const struct wpi_json *h, const char *key, uint32_t lo, uint32_t hi,
                         uint32_t *out, char *err, size_t cap)
{
    const wpi_json *v = wpi_json_get(h, key);
    int64_t x;
    *out = 0;
    if (!v || v->type == WPI_JSON_NULL) return WP_OK;
    if (!wpi_json_int(v, &x) || x < lo || x > hi)
        return wpi_fail(err, cap, WP_E_FORMAT, W ".%s: expected an integer in [%u, %u]", key,
                        lo, hi);
    *out = (uint32_t)x;
    return WP_OK;
}

wp_status wpi_hparam_num(const struct wpi_json *h, const char *key, double lo, double hi,
                         float *out, int *present, char *err, size_t cap)
{
    const wpi_json *v = wpi_json_get(h, key);
    double d;
    *out = 0;
    if (present) *present = 0;
    if (!v || v->type == WPI_JSON_NULL) return WP_OK;
    if (!wpi_json_num(v, &d) || !(d >= lo && d <= hi))
        return wpi_fail(err, cap, WP_E_FORMAT, W ".%s: expected a number in [%g, %g]", key,
                        lo, hi);
    *out = (float)d;
    if (present) *present = 1;
    return WP_OK;
}

wp_status wpi_hparams_ext(const struct wpi_json *h, wpi_hparams *hp, char *err, size_t cap)
{
    wp_status st;
    if ((st = wpi_hparams_mla(h, hp, err, cap)) != WP_OK) return st;
    if ((st = wpi_hparams_dsv4(h, hp, err, cap)) != WP_OK) return st;
    if ((st = wpi_hparams_glm5(h, hp, err, cap)) != WP_OK) return st;
    memset(hp->layer_attn, WPI_ATTN_FULL, sizeof hp->layer_attn);
    if ((st = wpi_hparam_u32(h, "sliding_window", 1, 1u << 30, &hp->sliding_window, err, cap)) != WP_OK ||
        (st = wpi_hparam_num(h, "swiglu_alpha", 0, 1e6, &hp->swiglu_alpha, NULL, err, cap)) != WP_OK ||
        (st = wpi_hparam_num(h, "swiglu_limit", 0, FLT_MAX, &hp->swiglu_limit, NULL, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "kda_heads", 1, 4096, &hp->kda_heads, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "kda_head_dim", 1, 1024, &hp->kda_head_dim, err, cap)) != WP_OK ||
        (st = wpi_hparam_u32(h, "kda_conv", 1, 64, &hp->kda_conv, err, cap)) != WP_OK)
        return st;
    const wpi_json *v = wpi_json_get(h, "attn_kinds");
    if (!v || v->type == WPI_JSON_NULL) return WP_OK;
    if (v->type != WPI_JSON_ARRAY || v->len != hp->n_layers)
        return wpi_fail(err, cap, WP_E_FORMAT, W ".attn_kinds: expected %u strings", hp->n_layers);
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const char *k = wpi_json_str(&v->items[l]);
        if (k && !strcmp(k, "full"))
            hp->layer_attn[l] = WPI_ATTN_FULL;
        else if (k && !strcmp(k, "sliding"))
            hp->layer_attn[l] = WPI_ATTN_SLIDING;
        else if (k && !strcmp(k, "kda"))
            hp->layer_attn[l] = WPI_ATTN_KDA;
        else
            return wpi_fail(err, cap, WP_E_FORMAT,
                            W ".attn_kinds[%u]: expected \"full\", \"sliding\" or \"kda\"", l);
        if (hp->layer_attn[l] == WPI_ATTN_SLIDING && !hp->sliding_window)
            return wpi_fail(err, cap, WP_E_FORMAT,
                            W ".attn_kinds[%u]: \"sliding\" needs sliding_window", l);
        if (hp->layer_attn[l] == WPI_ATTN_KDA &&
            !(hp->kda_heads && hp->kda_head_dim && hp->kda_conv))
            return wpi_fail(err, cap, WP_E_FORMAT,
                            W ".attn_kinds[%u]: \"kda\" needs kda_heads, kda_head_dim, kda_conv", l);
    }
    return WP_OK;
}

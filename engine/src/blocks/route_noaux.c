/*
 * route_noaux.c -- DeepSeek-V3 style expert selection ("noaux_tc"), also GLM-4.5's.
 *
 * The router's scores (sigmoid, or softmax) are not what selects: each expert's choice
 * value is its score plus the layer's correction bias (exp_probs_b). With n_group > 1
 * the experts form n_group equal groups; a group's value is the sum of its two best
 * choice values, and only the experts of the topk_group best groups compete. The top_k
 * by choice value (ties to the lower id) are taken, and their weights are the unbiased
 * scores, renormalized when norm_topk_prob (sum + 1e-20), times routed_scaling_factor.
 */
#include <math.h>

#include "blocks.h"

int wpi_route_noaux_used(const wpi_hparams *hp, const wpi_layer *L)
{
    return hp->scoring == WPI_SCORE_SIGMOID || hp->n_group > 1 || (L && L->exp_bias) ||
           (hp->routed_scaling_factor > 0 && hp->routed_scaling_factor != 1.0f);
}

void wpi_route_noaux(const wpi_hparams *hp, const float *scores, const float *bias,
                     float *tmp, int32_t *ids, float *w)
{
    const uint32_t E = hp->n_experts, K = hp->top_k;
    float *choice = tmp, *gs = tmp + E;
    for (uint32_t e = 0; e < E; e++) choice[e] = bias ? scores[e] + bias[e] : scores[e];
    if (hp->n_group > 1 && hp->topk_group < hp->n_group) {
        const uint32_t G = hp->n_group, per = E / G;
        for (uint32_t g = 0; g < G; g++) {
            float m1 = -INFINITY, m2 = -INFINITY;
            for (uint32_t i = 0; i < per; i++) {
                float x = choice[g * per + i];
                if (x > m1) {
                    m2 = m1;
                    m1 = x;
                } else if (x > m2) {
                    m2 = x;
                }
            }
            gs[g] = m1 + m2;
        }
        /* The topk_group best groups (ties to the lower index) are marked NaN. */
        for (uint32_t k = 0; k < hp->topk_group; k++) {
            int32_t best = -1;
            for (uint32_t g = 0; g < G; g++)
                if (!isnan(gs[g]) && (best < 0 || gs[g] > gs[best])) best = (int32_t)g;
            gs[best] = NAN;
        }
        for (uint32_t g = 0; g < G; g++)
            if (!isnan(gs[g]))
                for (uint32_t i = 0; i < per; i++) choice[g * per + i] = -INFINITY;
    }
    wpi_topk(choice, E, K, ids, w);
    for (uint32_t j = 0; j < K; j++) w[j] = scores[ids[j]];
    if (hp->norm_topk_prob) {
        float s = 0;
        for (uint32_t j = 0; j < K; j++) s += w[j];
        s += 1e-20f;
        for (uint32_t j = 0; j < K; j++) w[j] /= s;
    }
    const float r = hp->routed_scaling_factor > 0 ? hp->routed_scaling_factor : 1.0f;
    if (r != 1.0f)
        for (uint32_t j = 0; j < K; j++) w[j] *= r;
}
